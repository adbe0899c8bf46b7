"""Exact resume when an epoch is not a whole number of optimizer steps.

The shards here hold 80 and 112 samples: with micro batch 16 an NVIDIA epoch has 5 or 7 micro
batches, so with gradient accumulation 2 it would end in the middle of an optimizer step. An epoch
trains whole optimizer steps (the last micro batches that do not fill one are not trained in that
epoch), so every checkpoint sits on a step boundary and a resume from any of them, the epoch-end
ones included, reproduces the uninterrupted run's losses and final step: in this process on one
rank (every tag of a run checkpointed at every step), and through the launcher on one and two ranks
after a SIGKILL in the first epoch and another in the second.
"""
import os
import signal
import subprocess
import sys

import pytest

from testkit.synthetic import make_data_root
from tests.launch import (REPO, ds_config, event_files, launch, launch_env, new_event_losses, progress, start_held,
                          start_held_in_engine_write, tiny_argv, train_in_process, wait_for_line)
from turing.checkpoint_files import WRITING_MARKER, complete_tags
from turing.tb_events import read_run

MICRO, ACCUM = 16, 2


@pytest.fixture(scope="module")
def odd_root(tmp_path_factory):
    """Both formats, 2 training shards of 80 and 112 samples (not multiples of 16 x 2)."""
    root = tmp_path_factory.mktemp("odd_data")
    make_data_root(str(root), seq_lengths=(128,), shard_sizes=(80, 112), n_valid=16)
    return root


def accum_ds(folder):
    return ds_config(folder, gradient_accumulation_steps=ACCUM)


def run_losses(out):
    """[(samples seen, loss)] of every optimizer step a run (and its resumes) logged."""
    return read_run(os.path.join(out, "runs", "tiny_bert"))[0]["Train/Samples/train_loss"]


def epoch_tags(out):
    return sorted(t for t in os.listdir(os.path.join(out, "saved_models", "tiny_bert")) if t.startswith("epoch"))


def step_of(tag):
    return int(tag.split("step")[-1])


@pytest.fixture(scope="module")
def reference(odd_root, tmp_path_factory):
    """provider -> (output folder, losses) of an uninterrupted one-rank run checkpointed every step."""
    runs = {}
    for provider in ("nvidia", "bing"):
        out = tmp_path_factory.mktemp(f"ref_{provider}")
        train_in_process(odd_root, out, accum_ds(out), "--checkpoint_every_steps", 1, nvidia=provider == "nvidia")
        runs[provider] = out, run_losses(out)
    return runs


def test_an_epoch_trains_whole_optimizer_steps(reference):
    out, losses = reference["nvidia"]
    # epoch 1 reads one shard, epoch 2 the other: 5 and 7 micro batches, so 2 and 3 whole steps
    assert sorted(step_of(t) for t in epoch_tags(out)) in ([2, 5], [3, 5])
    assert len(losses) == 5
    assert [samples for samples, _ in losses] == [32 * (i + 1) for i in range(5)]
    # every step's loss is the mean over its two micro batches: none is a lone micro batch's half
    assert min(loss for _, loss in losses) > 0.75 * max(loss for _, loss in losses)


@pytest.mark.parametrize("provider", ["nvidia", "bing"])
def test_resume_from_any_checkpoint_reproduces_the_run(provider, reference, odd_root, tmp_path):
    """What a SIGKILL leaves is the newest complete checkpoint, whichever step it is: resume from
    the epoch-end one and from one inside each epoch."""
    ref_out, ref_losses = reference[provider]
    epoch1 = epoch_tags(ref_out)[0]
    resumed_from = [epoch1, "step1", f"step{step_of(epoch1) + 1}"]
    for tag in resumed_from:
        out = tmp_path / tag
        train_in_process(odd_root, out, accum_ds(out), "--load_training_checkpoint",
                         ref_out / "saved_models" / "tiny_bert", "--load_checkpoint_id", tag,
                         nvidia=provider == "nvidia")
        assert run_losses(out) == ref_losses[step_of(tag):], tag        # bit for bit, to the same last step
        assert epoch_tags(out)[-1] == epoch_tags(ref_out)[-1]


@pytest.mark.parametrize("provider, ranks", [("nvidia", 2), ("bing", 2), ("nvidia", 1)])
def test_sigkill_then_auto_resume(provider, ranks, odd_root, tmp_path):
    """SIGKILLed in epoch 1 while writing step 1's checkpoint (its engine files begun: no checkpoint,
    so the next start begins afresh) and, started again by the same command, while writing the
    last step's checkpoint at the end of epoch 2 (every file written, its completion marker not:
    the next start resumes from the step before, inside epoch 2); the third start trains the last
    step. The trainer is held at those points until killed (tests/held_trainer.py): a kill timed by
    the log landed a step later, after the run's last step on a fast machine. Two ranks, NVIDIA: the
    ranks' shards have 5 and 7 micro batches, both run 4 (two whole steps) in each epoch; Bing: one
    step per dataset and epoch on each rank. One rank, NVIDIA: the epochs have 5 and 7 micro batches
    (2 and 3 steps, in the order of the shards), so step 4 is inside epoch 2 either way. Every step
    any session logged is the uninterrupted run's, and the run ends at its step."""
    ds = accum_ds(tmp_path / "cfg")
    nvidia = provider == "nvidia"
    ref = launch(tiny_argv(odd_root, tmp_path / "ref", "--print_steps", 1, ds=ds, nvidia=nvidia), num_ranks=ranks)
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = progress(ref.stdout + ref.stderr)
    last = {1: 5, 2: 4}[ranks]
    assert [row[0] for row in reference] == list(range(1, last + 1))
    args = tiny_argv(odd_root, tmp_path / "out", "--print_steps", 1, "--checkpoint_every_steps", 1, "--auto_resume",
                     ds=ds, nvidia=nvidia)
    for session, (tag, at) in enumerate([("step1", "engine"), (f"epoch2_step{last}", "marker")]):
        log = tmp_path / f"killed{session}.log"
        proc = start_held(args, log, tag, at, num_ranks=ranks)
        wait_for_line(proc, log, "PAUSED")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        logged = progress(log.read_text())
        assert logged == reference[:step_of(tag)], log.read_text()[-3000:]    # each began at step 1
    ckpt = tmp_path / "out" / "saved_models" / "tiny_bert"
    assert complete_tags(str(ckpt))[-1] == f"step{last - 1}"
    again = launch(args, num_ranks=ranks)
    assert again.returncode == 0, again.stderr[-3000:]
    assert progress(again.stdout + again.stderr) == reference[last - 1:], (again.stdout + again.stderr)[-3000:]
    assert complete_tags(str(ckpt))[-1] == f"epoch2_step{last}"


def test_sigkill_in_the_first_checkpoint_write_then_auto_resume_starts_fresh(reference, odd_root, tmp_path):
    """SIGKILLed while the engine writes the run's first checkpoint (its model states file there and
    empty, no checkpoint complete): that folder is an unfinished write, no checkpoint, so the same
    command with --auto_resume says so in one warning, starts fresh and trains the uninterrupted
    run's losses to its last step (it refused: "no checkpoint there can be loaded")."""
    out = tmp_path / "out"
    args = tiny_argv(odd_root, out, "--print_steps", 1, "--checkpoint_every_steps", 1, "--auto_resume",
                     ds=accum_ds(tmp_path / "cfg"))
    log = tmp_path / "killed.log"
    proc = start_held_in_engine_write(args, log, "step1")
    wait_for_line(proc, log, "PAUSED")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    ckpt = out / "saved_models" / "tiny_bert"
    assert (ckpt / "step1" / WRITING_MARKER).is_file() and complete_tags(str(ckpt)) == []
    before = event_files(str(out))
    again = subprocess.run([sys.executable, os.path.join(REPO, "deepspeed_train.py"), *args], cwd=REPO,
                           env=launch_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "step1 was being written when its run ended" in again.stdout + again.stderr
    assert new_event_losses(str(out), before) == reference["nvidia"][1]
    assert not (ckpt / "step1" / WRITING_MARKER).exists() and "step1" in complete_tags(str(ckpt))

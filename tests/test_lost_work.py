"""Never lose work: inputs checked before the model is built, the epoch checkpoint before
validation, stop checkpoints with DataLoader workers and after the launcher is gone (the real
launcher), resuming from checkpoints without markers or with a cut-short file, one run per
job folder, durable checkpoints and a full disk."""
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import time

import psutil
import pytest
import torch

import deepspeed_train
import turing.checkpointer
from tests.launch import TINY_CFG, TINY_DS, start, tiny_args, train_in_process, wait_for_step
from testkit.launcher import REPO, launch_env, train_cmd
from turing.checkpoint_files import COMPLETE_MARKER, WRITING_MARKER, complete_tags, resume_candidates
from turing.errors import InputError
from turing.run_state import RunState
from turing.tb_events import read_run

JOB = "tiny_bert"


def ckpt_dir(out):
    return os.path.join(out, "saved_models", JOB)


def latest(out):
    with open(os.path.join(ckpt_dir(out), "latest")) as f:
        return f.read()


def losses(out):
    """{global step: loss} of every session logged under OUT/runs/JOB (x = samples, 16 a step)."""
    return {samples // 16: loss for samples, loss in read_run(os.path.join(out, "runs", JOB))[0]
            ["Train/Samples/train_loss"]}


def exit_code(*args, **kwargs):
    """train_in_process, returning the exit code (0 when main returns)."""
    try:
        train_in_process(*args, **kwargs)
    except SystemExit as e:
        return e.code
    return 0


def folder_snapshot(folder):
    """{relative path: (size, mtime_ns)} of every file under `folder` but the run lock."""
    snap = {}
    for root, _, files in os.walk(folder):
        for name in files:
            if name.endswith(".lock"):
                continue
            st = os.stat(os.path.join(root, name))
            snap[os.path.relpath(os.path.join(root, name), folder)] = (st.st_size, st.st_mtime_ns)
    return snap


def copy_run(source, out, tensorboard=False):
    """A copy of a run's output folder; without its TensorBoard files unless asked."""
    shutil.copytree(source, out)
    if not tensorboard:
        shutil.rmtree(out / "runs")


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


@pytest.fixture(scope="module")
def three_steps(data_root, tmp_path_factory):
    """A run stopped by --max_steps 3 with validation (step2 and step3 checkpoints), recording
    for each completion marker the checkpoint files that had not been fsync'ed when it was
    written, and the validation passes made."""
    out = tmp_path_factory.mktemp("three_steps")
    synced, unsynced, validations = set(), {}, []
    real_fsync, real_write, real_validation = os.fsync, turing.checkpointer.write_atomic, \
        deepspeed_train.validation_scores

    def fsync(fd):
        synced.add(os.fstat(fd).st_ino)
        real_fsync(fd)

    def write_atomic(path, text):
        if path.endswith(COMPLETE_MARKER):
            folder = os.path.dirname(path)
            unsynced[os.path.basename(folder)] = [
                os.path.relpath(os.path.join(r, f), folder) for r, _, files in os.walk(folder) for f in files
                if os.stat(os.path.join(r, f)).st_ino not in synced]
        real_write(path, text)

    def validation(*args):
        validations.append(sorted(os.listdir(ckpt_dir(out))))   # what was on disk when it ran
        return real_validation(*args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", fsync)
        mp.setattr(turing.checkpointer, "write_atomic", write_atomic)
        mp.setattr(deepspeed_train, "validation_scores", validation)
        train_in_process(data_root, out, TINY_DS, "--max_steps", 3, "--checkpoint_every_steps", 2,
                         "--validation_data_path_prefix", data_root / "nvidia" / "128")
    return out, unsynced, validations


# --- 1. inputs are checked before the model is built; the epoch checkpoint comes first


def _no_model(monkeypatch):
    def fail(args):
        raise AssertionError("the model was built before the bad input was found")
    monkeypatch.setattr(deepspeed_train, "prepare_model_optimizer", fail)


@pytest.mark.parametrize("case", ["missing", "empty", "truncated_hdf5", "truncated_bing", "bad_later_shard"])
def test_bad_input_stops_before_the_model_is_built(case, data_root, tmp_path, monkeypatch, capsys):
    nvidia, extra = True, []
    root = data_root
    if case == "missing":
        extra = ["--validation_data_path_prefix", tmp_path / "typo"]
        expected = "typo/validation: validation folder not found"
    elif case == "empty":
        (tmp_path / "valid" / "validation").mkdir(parents=True)
        extra = ["--validation_data_path_prefix", tmp_path / "valid"]
        expected = "holds no validation set of a known format (NVIDIA .hdf5 files, or Bing shard folders"
    elif case == "truncated_hdf5":
        shutil.copytree(data_root / "nvidia" / "128" / "validation", tmp_path / "valid" / "validation")
        truncate(tmp_path / "valid" / "validation" / "tiny_test_shard0.hdf5")
        extra = ["--validation_data_path_prefix", tmp_path / "valid"]
        expected = "tiny_test_shard0.hdf5: cannot read hdf5 shard"
    elif case == "truncated_bing":
        nvidia = False
        shutil.copytree(data_root / "bing" / "128" / "validation", tmp_path / "valid" / "validation")
        truncate(tmp_path / "valid" / "validation" / "shard_000" / "data.npy")
        extra = ["--validation_data_path_prefix", tmp_path / "valid"]
        expected = "shard_000: cannot read data.npy"
    else:  # the shard of epoch 2, not the first one, is broken
        nvidia, root = False, tmp_path / "data"
        shutil.copytree(data_root, root)
        os.remove(root / "bing" / "128" / "bc" / "shard_001" / "is_next.npy")
        expected = "shard_001: is_next.npy is missing"
    _no_model(monkeypatch)
    assert exit_code(root, tmp_path / "out", TINY_DS, *extra, nvidia=nvidia) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "out" / "runs")


def test_epoch_checkpoint_is_written_before_validation(data_root, tmp_path, monkeypatch, capsys):
    # The validation set breaks after the start-up check (a network file system going away):
    # the epoch's checkpoint must already be on disk when validation fails.
    def broken(*args, **kwargs):
        raise InputError("validation set unreadable")
    monkeypatch.setattr(deepspeed_train, "validation_scores", broken)
    code = exit_code(data_root, tmp_path, TINY_DS, "--max_steps", 4,
                     "--validation_data_path_prefix", data_root / "nvidia" / "128")
    assert code == 2 and "validation set unreadable" in capsys.readouterr().err
    assert latest(tmp_path) == "epoch1_step4"
    assert complete_tags(ckpt_dir(tmp_path)) == ["epoch1_step4"]


def test_max_steps_stop_validates_once_after_its_checkpoint(three_steps):
    out, _, validations = three_steps
    assert validations == [["latest", "step2", "step3"]]           # once, the checkpoint already there
    assert len(read_run(os.path.join(out, "runs", JOB))[0]["Validation/step/Loss"]) == 1


# --- 2, 5 (and 4). stop signals with DataLoader workers, a launcher that goes away (real launcher)


def _job_config(tmp_path, **training):
    with open(TINY_CFG) as f:
        config = json.load(f)
    config["mixed_seq_training"]["128"].update(training)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(config))
    return path


def _long_run_args(data_root, tmp_path, nvidia=True, *extra):
    """A launcher run that goes on for minutes (50 epochs) with 2 DataLoader workers."""
    cf = _job_config(tmp_path, num_workers=2, num_epochs=50)
    args = tiny_args(data_root, tmp_path / "out", 128, "--print_steps", 1, *extra, nvidia=nvidia)
    args[args.index(TINY_CFG)] = str(cf)
    return args


def _wait_for_workers(proc, timeout=120):
    """The run's process tree once it holds DataLoader worker processes."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        tree = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
        if any(_name(p) == "pt_data_worker" for p in tree):
            return tree
        assert proc.poll() is None, "the run ended before its DataLoader workers were seen"
        time.sleep(0.02)
    raise AssertionError(f"no DataLoader worker seen in {timeout} s")


def _name(process):
    try:
        return process.name()
    except psutil.NoSuchProcess:
        return None


def _wait_gone(processes, timeout=120):
    gone, alive = psutil.wait_procs(processes, timeout=timeout)
    assert not alive, f"still running: {alive}"


@pytest.mark.parametrize("provider, sig", [("nvidia", signal.SIGTERM), ("bing", signal.SIGINT)])
def test_stop_signal_with_dataloader_workers_writes_a_checkpoint(provider, sig, data_root, tmp_path):
    args = _long_run_args(data_root, tmp_path, provider == "nvidia",
                          "--validation_data_path_prefix", data_root / provider / "128")
    proc = start(args, tmp_path / "run.log")
    wait_for_step(proc, tmp_path / "run.log", 6)
    # Between epochs (checkpoint, validation) no loader and no worker is alive: signal the group
    # once the workers of an epoch are there, as Ctrl-C or a scheduler does.
    tree = _wait_for_workers(proc)
    os.killpg(proc.pid, sig)
    _wait_gone(tree)
    log = open(tmp_path / "run.log").read()
    assert f"stopped by {sig.name}; checkpoint of global step" in log, log[-3000:]
    assert "killed by signal" not in log
    tag = latest(tmp_path / "out")
    assert tag.startswith("step") and os.path.isfile(os.path.join(ckpt_dir(tmp_path / "out"), tag,
                                                                  COMPLETE_MARKER))
    # validation after each finished epoch, not after the stop by a signal
    assert log.count("Validation at step") == log.count("(end of epoch") == \
        (int(tag[4:]) - 1) // (4 if provider == "nvidia" else 8)


@pytest.mark.parametrize("wrapped", [True, False], ids=["run_launcher", "bare_deepspeed"])
def test_ctrl_c_of_a_launcher_run_ends_with_the_stop_line(wrapped, data_root, tmp_path):
    """Ctrl-C (SIGINT to the job's process group) through scripts/run_launcher.sh, as demo.sh and the
    GPU scripts start the launcher: the rank's stop line and checkpoint, no KeyboardInterrupt
    traceback from DeepSpeed's runner after it. Started bare, the runner may print its own traceback
    (DeepSpeed's; whether it does races the rank's exit: seen missing once on a loaded machine):
    the stop and its checkpoint are the same. The rank gets Ctrl-C's SIGINT itself and launch.py's
    SIGTERM (its answer to the same SIGINT) a moment later; a copy within two seconds of the first
    is not a second stop, so the stop line names whichever the rank handled first (SIGTERM first
    was seen once in six runs on a loaded machine)."""
    args = _long_run_args(data_root, tmp_path, True)
    log = tmp_path / "run.log"
    wrapper = ["bash", os.path.join(REPO, "scripts", "run_launcher.sh")] if wrapped else []
    proc = subprocess.Popen([*wrapper, *train_cmd(args)], cwd=REPO, env=launch_env(), stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    wait_for_step(proc, log, 2)
    tree = [proc, *psutil.Process(proc.pid).children(recursive=True)]
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) != 0
    _wait_gone(tree)
    text = log.read_text()
    assert re.search(r"stopped by SIG(INT|TERM); checkpoint of global step", text), text[-3000:]
    assert latest(tmp_path / "out").startswith("step")
    if wrapped:   # bare, DeepSpeed's runner prints its own KeyboardInterrupt traceback or not: a race
        assert "KeyboardInterrupt" not in text, text[-3000:]


def test_killing_the_deepspeed_command_stops_the_rank_and_a_second_run_waits_for_it(data_root, tmp_path, capsys):
    # Also the job-folder lock (item 4): refused while the run holds it, free once it has ended.
    # (A run killed with SIGKILL frees it too: test_sigkill_then_auto_resume in test_train_e2e.)
    proc = start(_long_run_args(data_root, tmp_path), tmp_path / "run.log")
    wait_for_step(proc, tmp_path / "run.log", 3)
    assert exit_code(data_root, tmp_path / "out", TINY_DS, "--auto_resume") == 2
    err = capsys.readouterr().err
    assert "is in use by another run (pid" in err and "--job_name" in err
    tree = psutil.Process(proc.pid).children(recursive=True)   # launch.py, the rank, its workers
    os.kill(proc.pid, signal.SIGTERM)         # the deepspeed command alone: it exits at once
    assert proc.wait(timeout=30) != 0
    _wait_gone(tree)
    log = open(tmp_path / "run.log").read()
    assert "stopped: the deepspeed launcher is gone (the deepspeed command" in log, log[-3000:]
    tag = latest(tmp_path / "out")
    assert tag.startswith("step")
    assert exit_code(data_root, tmp_path / "out", TINY_DS, "--auto_resume", "--max_steps", 1,
                     cf=tmp_path / "job.json") == 0
    assert latest(tmp_path / "out").endswith(f"step{int(tag[4:]) + 1}")


# --- 4. one run per job folder


def test_a_fresh_run_over_checkpoints_is_refused(three_steps, data_root, tmp_path, capsys):
    out = tmp_path / "out"
    copy_run(three_steps[0], out, tensorboard=True)
    before = folder_snapshot(out)
    assert exit_code(data_root, out, TINY_DS) == 2
    err = capsys.readouterr().err
    assert "already holds checkpoints (step2, step3)" in err and "--auto_resume" in err
    assert folder_snapshot(out) == before


# --- 3. checkpoints without completion markers


def test_auto_resume_from_checkpoints_without_markers(three_steps, data_root, tmp_path, capsys):
    out = tmp_path / "out"
    copy_run(three_steps[0], out)
    for tag in ("step2", "step3"):             # as the original program or a copy leaves them
        os.remove(os.path.join(ckpt_dir(out), tag, COMPLETE_MARKER))
    before = folder_snapshot(ckpt_dir(out))
    assert exit_code(data_root, out, TINY_DS, "--auto_resume", "--max_steps", 1) == 0
    assert "step3 has no checkpoint_complete.json" in capsys.readouterr().err
    assert sorted(losses(out)) == [4]                                 # went on from step 3
    after = folder_snapshot(ckpt_dir(out))
    assert all(after[f] == before[f] for f in before if f != "latest")  # nothing written over
    assert latest(out) == "epoch1_step4"


@pytest.mark.parametrize("damage", ["cut_short", "no_client_state"])
def test_auto_resume_refuses_checkpoints_without_markers_that_do_not_load(damage, three_steps, data_root,
                                                                           tmp_path, capsys):
    out = tmp_path / "out"
    copy_run(three_steps[0], out, tensorboard=True)
    for tag in ("step2", "step3"):
        os.remove(os.path.join(ckpt_dir(out), tag, COMPLETE_MARKER))
        model_file = os.path.join(ckpt_dir(out), tag, "mp_rank_00_model_states.pt")
        if damage == "cut_short":
            truncate(model_file)
        else:                                  # DeepSpeed's save_checkpoint without our client state
            state = torch.load(model_file, weights_only=False)
            for key in RunState.CLIENT_KEYS.values():
                del state[key]
            torch.save(state, model_file)
    before = folder_snapshot(out)
    assert exit_code(data_root, out, TINY_DS, "--auto_resume") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # files seen to be cut short, or files the engine reads without our client state: one wording, each reason
    why = {"cut_short": "mp_rank_00_model_states.pt is cut short or damaged",
           "no_client_state": "its client state lacks"}
    assert f"error: {ckpt_dir(out)}: no checkpoint there can be loaded (step3: {why[damage]}" in err
    assert f"; step2: {why[damage]}" in err and "move the folder away to start fresh" in err
    assert folder_snapshot(out) == before


# --- 6. a complete checkpoint with a damaged model file; files on disk before the marker


@pytest.mark.parametrize("damage", ["cut_short", "not_a_checkpoint"])
def test_auto_resume_falls_back_from_a_damaged_complete_checkpoint(damage, three_steps, data_root, tmp_path,
                                                                   capsys):
    out = tmp_path / "out"
    copy_run(three_steps[0], out)
    model_file = os.path.join(ckpt_dir(out), "step3", "mp_rank_00_model_states.pt")
    if damage == "cut_short":
        truncate(model_file)
    else:                                      # a whole zip file, but not what DeepSpeed wrote
        torch.save({"garbage": torch.zeros(3)}, model_file)
    assert exit_code(data_root, out, TINY_DS, "--auto_resume", "--max_steps", 1) == 0
    err = capsys.readouterr().err
    assert f"Checkpoint {os.path.join(ckpt_dir(out), 'step3')} cannot be loaded (" in err   # whichever the damage
    assert "Resuming from " + os.path.join(ckpt_dir(out), "step2") in err
    # from step 2, step 3 trained again, as the first run did
    assert losses(out) == {3: pytest.approx(losses(three_steps[0])[3], abs=1e-6)}


def test_checkpoint_files_are_on_disk_before_the_marker(three_steps):
    _, unsynced, _ = three_steps
    assert set(unsynced) == {"step2", "step3"}
    assert unsynced == {"step2": [], "step3": []}


# --- 7. a full disk during a checkpoint


def _check_disk_full_outcome(out, err):
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "step2 could not be written" in errors[0], err[-3000:]
    assert "the newest complete checkpoint is step1" in errors[0]
    assert "Traceback" not in err
    assert latest(out) == "step1" and complete_tags(ckpt_dir(out)) == ["step1"]
    assert not os.path.exists(os.path.join(ckpt_dir(out), "step2"))
    assert resume_candidates(ckpt_dir(out), "latest") == ["step1"]
    assert sorted(losses(out)) == [1, 2]                              # the session's curves kept


def test_full_disk_during_a_checkpoint_on_a_small_tmpfs(three_steps, data_root, tmp_path, capsys):
    mount = tmp_path / "disk"
    mount.mkdir()
    step_size = sum(size for size, _ in folder_snapshot(os.path.join(ckpt_dir(three_steps[0]), "step2")).values())
    # room for one checkpoint and the TensorBoard file, not for two checkpoints
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(step_size * 1.5)}", "tmpfs", str(mount)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the ENOSPC test covers the code path")
    try:
        code = exit_code(data_root, mount / "out", TINY_DS, "--checkpoint_every_steps", 1, "--max_steps", 3)
        assert code == 4
        _check_disk_full_outcome(mount / "out", capsys.readouterr().err)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_peer_lost_while_the_ranks_write_a_checkpoint_is_a_lost_peer(data_root, tmp_path, capsys, monkeypatch):
    """A collective inside the checkpoint write that fails as a dead or silent peer's does (here
    the barrier after the writing marker, on the second checkpoint) ends the run as any lost peer
    does: exit 5, "lost the other ranks", not exit 4's "could not be written ... Free some space".
    What it left is an unfinished write: the same command with --auto_resume resumes from step1."""
    real_barrier = turing.checkpointer.barrier
    step2 = os.path.join(ckpt_dir(tmp_path), "step2")

    def barrier():
        if os.path.isfile(os.path.join(step2, WRITING_MARKER)):      # step2's, after its marker
            raise torch.distributed.DistError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out "
                                              "waiting 10000ms for recv operation to complete")
        return real_barrier()
    monkeypatch.setattr(turing.checkpointer, "barrier", barrier)
    assert exit_code(data_root, tmp_path, TINY_DS, "--checkpoint_every_steps", 1, "--max_steps", 3) == 5
    err = capsys.readouterr().err
    assert "error: rank 0: lost the other ranks (DistError: [../third_party/gloo" in err, err[-3000:]
    assert "could not be written" not in err
    assert latest(tmp_path) == "step1" and complete_tags(ckpt_dir(tmp_path)) == ["step1"]
    monkeypatch.setattr(turing.checkpointer, "barrier", real_barrier)
    assert exit_code(data_root, tmp_path, TINY_DS, "--checkpoint_every_steps", 1, "--max_steps", 2,
                     "--auto_resume") == 0
    assert "step2 was being written when its run ended" in capsys.readouterr().err
    assert complete_tags(ckpt_dir(tmp_path)) == ["step1", "step2", "step3"]


def test_full_disk_during_a_checkpoint(data_root, tmp_path, capsys, monkeypatch):
    # Where a tmpfs cannot be mounted: the engine's file write fails as on a full disk, after
    # part of the file was written (the second checkpoint).
    real_save = torch.save
    calls = []

    def save(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            with open(path, "wb") as f:
                f.write(b"PK\x03\x04 partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_save(obj, path, *args, **kwargs)
    monkeypatch.setattr(torch, "save", save)
    assert exit_code(data_root, tmp_path, TINY_DS, "--checkpoint_every_steps", 1, "--max_steps", 3) == 4
    err = capsys.readouterr().err
    _check_disk_full_outcome(tmp_path, err)
    assert "No space left on device" in err

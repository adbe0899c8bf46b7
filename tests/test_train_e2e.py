"""End to end through the real `deepspeed` launcher on tiny hdf5 shards made here:
loss falls, per-epoch checkpoint tags, TensorBoard tags, resume, the two-phase recipe."""
import glob
import os
import re

import pytest

from tests.launch import launch, progress, start, start_held, tiny_args, wait_for_line, wait_for_step
from testkit.synthetic import make_data_root
from turing.tb_events import read_run


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    # 2 shards x 480 samples at micro batch 16: 30 optimizer steps per epoch, 2 epochs at seq 128.
    root = tmp_path_factory.mktemp("data")
    make_data_root(str(root), seq_lengths=(128,), n_train=960, shards=2, n_valid=32)
    make_data_root(str(root), seq_lengths=(512,), n_train=64, shards=1, n_valid=16, seed=1)
    return root


@pytest.fixture(scope="module")
def phase1(data_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("phase1")
    result = launch(tiny_args(data_root, out, 128, "--print_steps", 1,
                              "--validation_data_path_prefix", os.path.join(data_root, "nvidia", "128")))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, result.stdout + result.stderr


def test_loss_falls_and_steps_count(phase1):
    out, log = phase1
    rows = progress(log)
    steps = [r[0] for r in rows]
    assert steps == list(range(1, 61))
    losses = [r[1] for r in rows]
    # Starts near ln(96) + ln(2) = 5.26 (uniform guesses); the word frequencies alone are worth ~1 nat.
    assert sum(losses[:3]) / 3 > 5.0
    assert sum(losses[-5:]) / 5 < sum(losses[:3]) / 3 - 0.8, losses
    assert rows[-1][3] == 60 * 16  # samples seen
    assert "samples_per_s=" in log and "mfu=" in log


def test_checkpoint_per_epoch_with_run_files(phase1):
    out, _ = phase1
    ckpt = os.path.join(out, "saved_models", "tiny_bert")
    tags = sorted(d for d in os.listdir(ckpt) if os.path.isdir(os.path.join(ckpt, d)))
    assert tags == ["epoch1_step30", "epoch2_step60"]
    assert open(os.path.join(ckpt, "latest")).read().strip() == "epoch2_step60"
    for name in ("job_config.json", "args.json", "ds_config.json"):
        assert os.path.isfile(os.path.join(ckpt, "epoch2_step60", name))


def test_tensorboard_tags(phase1):
    out, _ = phase1
    scalars, others = read_run(os.path.join(out, "runs", "tiny_bert"))
    for tag in ("Train/lr", "Train/Samples/train_loss", "Train/Samples/lr", "Validation/Loss",
                "Validation/MLM_accuracy"):
        assert tag in scalars, sorted(scalars)
    assert [s for s, _ in scalars["Train/lr"]] == list(range(1, 61))
    assert [s for s, _ in scalars["Train/Samples/train_loss"]][:2] == [16, 32]
    assert [s for s, _ in scalars["Validation/Loss"]] == [1, 2]
    assert "config" in " ".join(others)


def test_resume_continues_step_count_and_epoch(phase1, data_root, tmp_path):
    out, _ = phase1
    ckpt = os.path.join(out, "saved_models", "tiny_bert")
    result = launch(tiny_args(data_root, tmp_path, 128, "--print_steps", 10,
                              "--load_training_checkpoint", ckpt, "--load_checkpoint_id", "epoch1_step30"))
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert [r[0] for r in progress(log)] == [40, 50, 60]
    assert os.listdir(os.path.join(tmp_path, "saved_models", "tiny_bert")) != []
    assert os.path.isdir(os.path.join(tmp_path, "saved_models", "tiny_bert", "epoch2_step60"))


def test_phase2_from_phase1_rewarms_lr_at_seq512(phase1, data_root, tmp_path):
    out, _ = phase1
    ckpt = os.path.join(out, "saved_models", "tiny_bert")
    result = launch(tiny_args(data_root, tmp_path, 512, "--print_steps", 1, "--rewarmup",
                              "--load_training_checkpoint", ckpt, "--load_checkpoint_id", "epoch2_step60",
                              "--validation_data_path_prefix", os.path.join(data_root, "nvidia", "512")))
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    rows = progress(log)
    assert [r[0] for r in rows] == [61, 62, 63, 64]  # 64 samples / 16: one epoch of 4 steps
    lrs = [r[2] for r in rows]
    # 512 config: lr 1e-3, warmup 0.1 of 200 steps -> step k of the new warmup has lr 1e-3 * k / 20
    assert lrs == pytest.approx([1e-3 * k / 20 for k in range(4)])
    assert os.path.isdir(os.path.join(tmp_path, "saved_models", "tiny_bert", "epoch3_step64"))


def test_missing_checkpoint_tag_is_one_line_error(phase1, data_root, tmp_path):
    out, _ = phase1
    ckpt = os.path.join(out, "saved_models", "tiny_bert")
    result = launch(tiny_args(data_root, tmp_path, 128, "--load_training_checkpoint", ckpt,
                              "--load_checkpoint_id", "epoch9_step999"))
    assert result.returncode != 0
    assert "checkpoint tag 'epoch9_step999' not found" in result.stderr
    assert "epoch1_step30" in result.stderr  # lists the tags that exist
    assert "Traceback" not in result.stderr


def test_sigkill_then_auto_resume_reproduces_the_uninterrupted_losses(phase1, data_root, tmp_path):
    import signal

    _, reference_log = phase1
    reference = {step: loss for step, loss, _, _ in progress(reference_log)}
    args = tiny_args(data_root, tmp_path / "out", 128, "--print_steps", 1, "--checkpoint_every_steps", 10,
                     "--auto_resume", "--validation_data_path_prefix", os.path.join(data_root, "nvidia", "128"))
    # held while it writes the end of epoch 1 (every file but the completion marker), whatever the
    # machine's speed: a kill timed by the log could land a checkpoint later
    proc = start_held(args, tmp_path / "killed.log", "epoch1_step30", "marker", num_ranks=1)
    wait_for_line(proc, tmp_path / "killed.log", "PAUSED")
    os.killpg(proc.pid, signal.SIGKILL)       # no chance to clean up, like a lost node
    proc.wait()
    latest = open(tmp_path / "out" / "saved_models" / "tiny_bert" / "latest").read()
    assert latest == "step20"
    result = launch(args)                     # the very same command
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    resumed = progress(log)
    assert resumed[0][0] == int(latest.split("step")[-1]) + 1 and resumed[-1][0] == 60
    assert all(loss == pytest.approx(reference[step], abs=1e-6) for step, loss, _, _ in resumed)


def test_sigterm_writes_a_checkpoint_and_exits_nonzero(data_root, tmp_path):
    import signal

    args = tiny_args(data_root, tmp_path / "out", 128, "--print_steps", 1)
    import time

    proc = start(args, tmp_path / "run.log")
    wait_for_step(proc, tmp_path / "run.log", 3)
    # As a scheduler does: SIGTERM to the whole job (launcher and rank; the launcher forwards it too)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) != 0
    deadline = time.time() + 120
    while time.time() < deadline:             # until every process of the job has ended
        try:
            os.killpg(proc.pid, 0)
            time.sleep(0.2)
        except ProcessLookupError:
            break
    log = open(tmp_path / "run.log").read()
    assert "stopped by SIGTERM; checkpoint of global step" in log
    folder = tmp_path / "out" / "saved_models" / "tiny_bert"
    tag = open(folder / "latest").read()
    assert tag.startswith("step") and (folder / tag / "checkpoint_complete.json").is_file()


def test_two_ranks_unequal_shards_with_validation(tmp_path):
    # rank 0 reads an 80-sample shard (5 micro-batches), rank 1 a 48-sample one (3): both run 3
    root = make_data_root(str(tmp_path / "data"), seq_lengths=(128,), shard_sizes=[80, 48], n_valid=32)
    result = launch(tiny_args(root, tmp_path / "out", 128, "--print_steps", 1,
                              "--validation_data_path_prefix", os.path.join(root, "nvidia", "128")),
                    num_ranks=2, timeout=400)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert [r[0] for r in progress(log)] == list(range(1, 7))
    assert "runs 3 like the shortest rank (32 samples unused)" in log
    assert log.count("Validation at step") == log.count("(end of epoch") == 2
    assert sorted(os.listdir(tmp_path / "out" / "saved_models" / "tiny_bert")) == \
        ["epoch1_step3", "epoch2_step6", "latest"]
    # DeepSpeed's CPU all-reduce buffers (67 MB of RAM per rank in /dev/shm) are not left behind
    port = re.search(r"--master_port[= ](\d+)", log).group(1)
    assert not glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_{port}_*")

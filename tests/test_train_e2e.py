"""End to end through the real `deepspeed` launcher on tiny hdf5 shards made here:
loss falls, per-epoch checkpoint tags, TensorBoard tags, resume, the two-phase recipe."""
import os

import pytest

from tests.launch import launch, progress, tiny_args
from tests.synthetic import make_data_root
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
    assert "samples/s" in log


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

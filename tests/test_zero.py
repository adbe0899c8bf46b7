"""ZeRO stages 1-3 through the DeepSpeed config, on 2 CPU ranks (gloo, fp32): each trains,
checkpoints and resumes with the losses of the uninterrupted run, also on another number of ranks
(2 -> 1 and 1 -> 2, through DeepSpeed's universal checkpoint, converted automatically), exports to
Hugging Face and starts a run with --use_pretrain. Dropout is off, so runs on other layouts of the
same global batch compare step by step."""
import json
import os

import pytest

import deepspeed_train
from tests.launch import expect_input_error, launch, progress, tiny_args, tiny_argv
from testkit.launcher import TINY_CFG, TINY_DS
from tools import export_hf
from turing.checkpoint_files import load_checkpoint_state
from turing.tb_events import read_run

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def no_dropout(tmp_path_factory):
    cf = json.load(open(TINY_CFG))
    cf["bert_model_config"].update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    path = tmp_path_factory.mktemp("cf") / "no_dropout.json"
    path.write_text(json.dumps(cf))
    return path


def ds(folder, stage, accum=1, **extra):
    """The tiny DeepSpeed config with ZeRO `stage` and gradient accumulation `accum`."""
    config = {**json.load(open(TINY_DS)), "gradient_accumulation_steps": accum, **extra}
    if stage and "zero_optimization" not in extra:
        config["zero_optimization"] = {"stage": stage}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"zero{stage}_accum{accum}.json"
    path.write_text(json.dumps(config))
    return path


def two_ranks(data_root, out, cf, ds_path, *extra):
    """A 2-rank launcher run; returns {step: loss}."""
    run = launch(tiny_args(data_root, out, 128, "--cf", cf, "--deepspeed_config", ds_path, "--print_steps", 1,
                           *extra), num_ranks=2)
    assert run.returncode == 0, run.stderr[-3000:]
    return {s: loss for s, loss, _, _ in progress(run.stdout + run.stderr)}


def one_rank(data_root, out, cf, ds_path, *extra):
    """A 1-rank run in this process; returns {step: loss} of the job's TensorBoard folder (every
    session's; x = samples, 32 a step)."""
    deepspeed_train.main(tiny_argv(data_root, out, "--print_steps", 1, "--log_level", "warning", *extra, cf=cf,
                                   ds=ds_path))
    losses = read_run(os.path.join(out, "runs", "tiny_bert"))[0]["Train/Samples/train_loss"]
    return {samples // 32: loss for samples, loss in losses}


def close(ours, theirs, tolerance=TOLERANCE):
    return all(abs(ours[s] - theirs[s]) < tolerance for s in ours)


@pytest.fixture(scope="module")
def reference(data_root, no_dropout, tmp_path_factory):
    """Uninterrupted runs without ZeRO, through epoch 1 (4 steps) and beyond: 2 ranks x micro 16,
    and 1 rank x micro 16 x accumulation 2 (whose epoch reads one shard: 2 steps). {ranks: (losses, output)}"""
    tmp = tmp_path_factory.mktemp("zero_ref")
    return {2: (two_ranks(data_root, tmp / "two", no_dropout, ds(tmp, 0), "--max_steps", 5), tmp / "two"),
            1: (one_rank(data_root, tmp / "one", no_dropout, ds(tmp, 0, accum=2), "--max_steps", 4), tmp / "one")}


def weights(out, tag):
    """The weights of a checkpoint (ZeRO stage 3's gathered from its ranks' partitions)."""
    state, _, _ = load_checkpoint_state(str(out / "saved_models" / "tiny_bert" / tag))
    return state


def same_weights(out, ref_out, tag):
    ours, theirs = weights(out, tag), weights(ref_out, tag)
    return max((ours[k] - theirs[k]).abs().max().item() for k in theirs if "pooler" not in k) < TOLERANCE


def export_and_start_from(data_root, out, cf, tmp_path):
    """Export the run's latest checkpoint to Hugging Face, then start a run from the export; returns
    its first loss."""
    assert export_hf.main(["--checkpoint_dir", str(out / "saved_models" / "tiny_bert"),
                           "--output_dir", str(tmp_path / "hf")]) == 0
    config = {**json.load(open(cf)), "bert_model_file": str(tmp_path / "hf")}
    (tmp_path / "pretrained.json").write_text(json.dumps(config))
    losses = one_rank(data_root, tmp_path / "from_hf", tmp_path / "pretrained.json", ds(tmp_path, 0, accum=2),
                      "--use_pretrain", "--max_steps", 1)
    return losses[1]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_resumes_exactly_and_exports(stage, data_root, no_dropout, reference, tmp_path):
    """Stage 1: 1 rank x accumulation 2 stops at step 1 of its 2-step epoch, 2 ranks finish it.
    Stage 2: 2 ranks stop at step 3, 1 rank x accumulation 2 finishes the epoch. Stage 3: 2 ranks
    stop at step 3, 2 ranks resume: the same losses. Each ends epoch 1 with the weights of the
    uninterrupted run. (Progress lines show rank 0's loss, so losses compare only on the same
    number of ranks.) ZeRO stage 3 on another number of ranks loads through the universal checkpoint
    too, but not exactly with DeepSpeed 0.19.8 (see docs/multinode.md), so it is not asserted here."""
    out = tmp_path / "out"
    if stage == 3:
        first = two_ranks(data_root, out, no_dropout, ds(tmp_path, 3), "--max_steps", 3)
        rest = two_ranks(data_root, out, no_dropout, ds(tmp_path, 3), "--auto_resume", "--max_steps", 2)
        # the logged loss is the mean over the ranks; after a ZeRO-3 resume rank 1's differs from the
        # uninterrupted run's by about 1e-5 (DeepSpeed re-partitions the weights and sums in another order)
        assert sorted(rest) == [4, 5] and close(rest, reference[2][0], tolerance=3e-5), f"{rest} {reference[2][0]}"
    elif stage == 2:
        first = two_ranks(data_root, out, no_dropout, ds(tmp_path, 2), "--max_steps", 3)
        one_rank(data_root, out, no_dropout, ds(tmp_path, 2, accum=2), "--auto_resume", "--max_steps", 1)
    else:
        first = one_rank(data_root, out, no_dropout, ds(tmp_path, 1, accum=2), "--max_steps", 1)
        two_ranks(data_root, out, no_dropout, ds(tmp_path, 1), "--auto_resume", "--max_steps", 1)
    ref_losses, ref_out = reference[1 if stage == 1 else 2]
    assert sorted(first) == list(range(1, max(first) + 1)) and close(first, ref_losses)
    files = os.listdir(out / "saved_models" / "tiny_bert" / f"step{max(first)}")
    assert sum("zero_pp_rank" in f and f.endswith("optim_states.pt") for f in files) == (1 if stage == 1 else 2)
    # the other number of ranks went through a universal checkpoint (the exact losses above say it
    # loaded), kept in the run's folder only until the resumed run saved a checkpoint of its own
    assert not os.path.exists(out / "saved_models" / "tiny_bert" / "universal")
    assert same_weights(out, ref_out, "epoch1_step2" if stage == 1 else "epoch1_step4")
    assert export_and_start_from(data_root, out, no_dropout, tmp_path) < ref_losses[1]  # trained weights


def test_offload_is_refused_off_cuda(data_root, tmp_path, capsys):
    offload = ds(tmp_path, 2, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}})
    line = expect_input_error(capsys, deepspeed_train.main, tiny_argv(data_root, tmp_path / "out", ds=offload))
    assert "zero_optimization.offload_optimizer (device 'cpu')" in line and "needs a CUDA GPU" in line

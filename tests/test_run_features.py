"""Engine and ecosystem features through the real entry point (in-process, one rank):
portable LAMB with bf16 and progressive layer drop, the time budget, --use_pretrain from
each source, and the metrics written to TensorBoard."""
import json
import math
import re
import time
import os
from types import SimpleNamespace

import pytest
import torch

from tests.launch import TINY_CFG, ds_config, plain_model_from_checkpoint, train_losses
from tests.launch import train_in_process as train
from turing.arch import training_flops
from turing.job_config import JobConfig
from turing.tb_events import read_run


def job_config(tmp_path, **extra):
    config = json.load(open(TINY_CFG))
    config.update(extra)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(config))
    return path


def scalars(out):
    return read_run(os.path.join(out, "runs", "tiny_bert"))


def test_lamb_on_cpu_with_bf16_and_progressive_layer_drop(data_root, tmp_path):
    lamb = {"type": "Lamb", "params": {"lr": 1e-2, "weight_decay": 0.01, "bias_correction": False,
                                       "max_coeff": 0.3, "min_coeff": 0.01}}
    ds = ds_config(tmp_path, optimizer=lamb, bf16={"enabled": True},
                   progressive_layer_drop={"enabled": True, "theta": 0.5, "gamma": 0.1})
    state = train(data_root, tmp_path / "out", ds, "--progressive_layer_drop")
    assert state.global_step == 8
    values, others = scalars(tmp_path / "out")
    assert others["Train/lamb_coeffs"] == list(range(1, 9))             # a histogram every step
    theta = [v for _, v in values["Train/pld_theta"]]
    assert theta[0] == pytest.approx(1.0) and theta[-1] == pytest.approx(0.5 * torch.exp(torch.tensor(-0.7)).item() + 0.5)
    assert all(a > b for a, b in zip(theta, theta[1:]))                  # theta falls every step
    losses = [v for _, v in values["Train/Samples/train_loss"]]
    assert losses[-1] < losses[0]


def test_time_budget_stops_cleanly_and_resume_keeps_elapsed(data_root, tmp_path):
    ds = ds_config(tmp_path)
    out = tmp_path / "out"
    valid = os.path.join(data_root, "nvidia", "128")
    state = train(data_root, out, ds, "--max_train_hours", 1e-9, "--validation_data_path_prefix", valid)
    assert state.global_step == 1                                        # stopped after the first step
    ckpt = out / "saved_models" / "tiny_bert"
    assert open(ckpt / "latest").read() == "step1"
    client = torch.load(ckpt / "step1" / "mp_rank_00_model_states.pt", weights_only=False)
    assert client["train_seconds"] > 0 and client["epoch_micro_step"] == 1
    assert [s for s, _ in scalars(out)[0]["Validation/step/Loss"]] == [1]   # validated before stopping
    # The budget is spent: a resumed run does one step and stops again, the elapsed time grows.
    state = train(data_root, out, ds, "--max_train_hours", 1e-9, "--auto_resume")
    assert state.global_step == 2
    again = torch.load(ckpt / "step2" / "mp_rank_00_model_states.pt", weights_only=False)
    assert again["train_seconds"] > client["train_seconds"]


def test_a_bf16_loss_is_printed_with_the_digits_it_holds(data_root, tmp_path, capsys):
    """Issue 43: a bf16 run printed loss=9.000000 for steps in a row, as if stuck (bf16's neighbours
    of 9.0 are 8.9375 and 9.0625). The progress lines give a bf16 loss its 3 significant digits and
    say once why; TensorBoard's Train/loss keeps the values as computed. fp32 keeps its 6 decimals."""
    from testkit.launcher import PROGRESS

    train(data_root, tmp_path / "out", ds_config(tmp_path, bf16={"enabled": True}), "--max_steps", 3,
          "--print_steps", 1, "--log_level", "info")
    err = capsys.readouterr().err
    printed = [loss for _, loss, _, _ in PROGRESS.findall(err)]
    assert len(printed) == 3 and all(re.fullmatch(r"\d\.\d\d|\d\d\.\d", p) for p in printed), printed
    assert err.count("The training loss is computed in bf16: the progress lines print the 3 significant digits "
                     "it holds") == 1, err
    logged = [v for _, v in scalars(tmp_path / "out")[0]["Train/loss"]]
    assert [float(p) for p in printed] == [float(f"{v:.3g}") for v in logged]
    assert any(len(repr(v)) > 5 for v in logged)        # TensorBoard's values are not rounded
    train(data_root, tmp_path / "fp32", ds_config(tmp_path / "fp32"), "--max_steps", 1, "--print_steps", 1,
          "--log_level", "info")
    err = capsys.readouterr().err
    assert re.search(r"bing_bert_progress: step=1, loss=\d+\.\d{6}, ", err) and "computed in" not in err


def test_metrics_in_tensorboard(data_root, tmp_path):
    train(data_root, tmp_path / "out", ds_config(tmp_path), "--validation_data_path_prefix",
          os.path.join(data_root, "nvidia", "128"), "--print_steps", 4)
    values, others = scalars(tmp_path / "out")
    for tag in ("Train/samples_per_s", "Train/tokens_per_s", "Train/MFU", "Train/data_wait_fraction"):
        assert [s for s, _ in values[tag]] == [4, 8], tag        # every --print_steps optimizer steps
    assert all(0 <= v < 1 for _, v in values["Train/data_wait_fraction"])
    assert [v * 128 for _, v in values["Train/samples_per_s"]] == [v for _, v in values["Train/tokens_per_s"]]
    # MFU = sequences/s x FLOPs per sequence (of this model: turing.flops) / peak of the device
    (_, peak), = values["Train/peak_TFLOPs_per_device"]
    (_, flops), = values["Train/FLOPs_per_sequence"]
    assert flops == training_flops(plain_model_from_checkpoint(tmp_path / "out").config, 128, 20)
    assert [v for _, v in values["Train/MFU"]] == pytest.approx([r * flops / (peak * 1e12)
                                                                 for _, r in values["Train/samples_per_s"]])
    for tag in ("Validation/Loss", "Validation/MLM_accuracy", "Validation/NSP_accuracy"):
        assert tag in values
    assert any(t.startswith("config") for t in others)


def test_validation_loss_is_the_models_loss_over_the_validation_set(data_root, tmp_path):
    import deepspeed_train

    valid = os.path.join(data_root, "nvidia", "128")
    train(data_root, tmp_path / "out", ds_config(tmp_path), "--validation_data_path_prefix", valid)
    model = plain_model_from_checkpoint(tmp_path / "out").eval()            # the weights after epoch 2
    args = SimpleNamespace(validation_data_path_prefix=valid, job=JobConfig.from_resolved(json.load(open(TINY_CFG))),
                           config_file=TINY_CFG, vocab_size=model.config.vocab_size,
                           train_micro_batch_size_per_gpu=16, seed=0, max_seq_length=128)
    loader = deepspeed_train.get_dataloader(args, deepspeed_train.open_validation_set(args), eval_set=True)
    with torch.no_grad():
        losses = [model(batch).item() for batch in loader]
    logged = dict(scalars(tmp_path / "out")[0]["Validation/Loss"])
    assert len(losses) == 2 and logged[2] == pytest.approx(sum(losses) / len(losses), abs=1e-5)


@pytest.fixture(scope="module")
def trained(data_root, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pretrained")
    train(data_root, tmp / "out", ds_config(tmp), "--max_steps", 4)
    return tmp / "out" / "saved_models" / "tiny_bert"


def _first_loss(data_root, tmp_path, bert_model_file):
    cf = job_config(tmp_path, bert_model_file=str(bert_model_file))
    train(data_root, tmp_path / "out", ds_config(tmp_path), "--max_steps", 1, "--use_pretrain", cf=cf)
    return scalars(tmp_path / "out")[0]["Train/Samples/train_loss"][0][1]


def test_use_pretrain_from_checkpoint_state_dict_and_hf_export(data_root, trained, tmp_path):
    from tools.export_hf import export

    from_ckpt = _first_loss(data_root, tmp_path / "ckpt", trained)
    module = torch.load(trained / "epoch1_step4" / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    torch.save(module, tmp_path / "weights.pt")
    from_file = _first_loss(data_root, tmp_path / "file", tmp_path / "weights.pt")
    export(str(trained), str(tmp_path / "hf"))
    from_hf = _first_loss(data_root, tmp_path / "hf_run", tmp_path / "hf")
    assert from_ckpt == from_file                         # the same weights either way
    assert from_hf == pytest.approx(from_ckpt, abs=0.02)  # pooler/NSP head re-initialised
    # a pretrained start has a clearly lower first loss than a fresh model (about 5.2)
    assert from_ckpt < 5.1


def test_use_pretrain_rejects_a_file_that_is_not_weights(data_root, tmp_path, capsys):
    junk = tmp_path / "junk.pt"
    junk.write_text("not a state dict")
    cf = job_config(tmp_path, bert_model_file=str(junk))
    with pytest.raises(SystemExit) as exit_info:
        train(data_root, tmp_path / "out", ds_config(tmp_path), "--use_pretrain", cf=cf)
    assert exit_info.value.code == 2
    assert "junk.pt: not a torch state dict" in capsys.readouterr().err


def test_export_of_a_bf16_zero2_checkpoint(data_root, tmp_path):
    from transformers import AutoModelForMaskedLM

    from tools.export_hf import export

    ds = ds_config(tmp_path, bf16={"enabled": True}, zero_optimization={"stage": 2})
    train(data_root, tmp_path / "out", ds, "--max_steps", 2)
    files = os.listdir(tmp_path / "out" / "saved_models" / "tiny_bert" / "step2")
    assert any(f.startswith("bf16_zero_pp_rank_0") for f in files)       # a real ZeRO-2 bf16 checkpoint
    # export() runs our model and the exported one on a padded batch and fails if logits differ
    export(str(tmp_path / "out" / "saved_models" / "tiny_bert"), str(tmp_path / "hf"))
    model = AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    assert model.config.model_type == "roberta-prelayernorm"


def test_max_steps_per_epoch_ends_each_epoch_early(data_root, tmp_path):
    state = train(data_root, tmp_path / "out", ds_config(tmp_path), "--max_steps_per_epoch", 2)
    assert (state.epoch, state.global_step) == (2, 4)
    assert sorted(os.listdir(tmp_path / "out" / "saved_models" / "tiny_bert")) == \
        ["epoch1_step2", "epoch2_step4", "latest"]


@pytest.fixture(scope="module")
def plain_losses(data_root, tmp_path_factory):
    """Per-step training losses of the tiny run without speed options."""
    tmp_path = tmp_path_factory.mktemp("plain")
    train(data_root, tmp_path / "out", ds_config(tmp_path))
    return train_losses(tmp_path / "out")


def test_unpad_trains_like_the_padded_model(data_root, tmp_path, plain_losses):
    train(data_root, tmp_path / "out", ds_config(tmp_path), "--unpad")
    losses = train_losses(tmp_path / "out")
    assert len(losses) == 8 and losses != plain_losses                  # other dropout draws ...
    assert losses == pytest.approx(plain_losses, abs=0.03)               # ... same model and data
    assert losses[-1] < losses[0]
    plain_model_from_checkpoint(tmp_path / "out")                      # strict load: the original's keys


def test_compile_trains_like_eager_and_keeps_the_checkpoint_keys(data_root, tmp_path, plain_losses):
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        train(data_root, tmp_path / "out", ds_config(tmp_path), "--compile")
        compiled_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert compiled_graphs > 0                                            # it really compiled
    assert torch._dynamo.config.suppress_errors is False                 # compiler errors are not hidden
    losses = train_losses(tmp_path / "out")
    assert losses == pytest.approx(plain_losses, abs=0.03)               # inductor draws its own dropout
    plain_model_from_checkpoint(tmp_path / "out")                      # strict load: the original's keys


def test_compile_that_cannot_be_set_up_trains_eagerly_with_a_warning(data_root, tmp_path, plain_losses,
                                                                      monkeypatch, capsys):
    def no_compiler(self, *args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch.nn.Module, "compile", no_compiler)
    train(data_root, tmp_path / "out", ds_config(tmp_path), "--compile")
    assert "WARNING bing_bert: --compile: torch.compile is not usable here (no C++ compiler found)" in \
        capsys.readouterr().err
    losses = train_losses(tmp_path / "out")
    assert losses == plain_losses                                         # eager: the plain run exactly


def test_training_time_leaves_out_validation_and_checkpoint_writes(data_root, tmp_path, monkeypatch):
    """The clock behind --max_train_hours, the budget schedule and Validation/train_minutes counts
    the step loop only: a validation that takes 4 s after epoch 1 (and the checkpoints) adds
    nothing to it, so 8 tiny steps stay well under 4 s of training time."""
    import deepspeed_train

    real = deepspeed_train.validation_scores

    def slow(*args):
        time.sleep(4)
        return real(*args)

    monkeypatch.setattr(deepspeed_train, "validation_scores", slow)
    out = tmp_path / "out"
    train(data_root, out, ds_config(tmp_path), "--validation_data_path_prefix", os.path.join(data_root, "nvidia", "128"))
    saved = torch.load(out / "saved_models" / "tiny_bert" / "epoch2_step8" / "mp_rank_00_model_states.pt",
                       weights_only=True)
    assert 0 < saved["train_seconds"] < 4
    minutes = scalars(out)[0]["Validation/train_minutes"]
    assert [s for s, _ in minutes] == [4, 8] and minutes[1][1] * 60 < 4


def test_a_finished_run_resumed_says_there_is_nothing_to_do(data_root, tmp_path, capsys):
    ds = ds_config(tmp_path)
    train(data_root, tmp_path / "out", ds)
    capsys.readouterr()
    state = train(data_root, tmp_path / "out", ds, "--auto_resume", "--log_level", "info")
    log = capsys.readouterr().err
    assert state.global_step == 8 and "Resumed a finished run (2 of 2 epochs, global step 8)" in log
    assert "Nothing to do: the run has finished its 2 epochs" in log
    assert "Done: global step 8, 128 samples, 2 of 2 epochs finished" in log


def test_metrics_are_on_disk_once_a_checkpoint_is(data_root, tmp_path):
    """tensorboardX's flush() leaves queued events in memory: a kill right after a checkpoint lost
    the curves' last steps. Before a checkpoint the reporter closes its writer, so every step up
    to it is in the event files on disk."""
    from turing.clock import TrainClock
    from turing.reporting import Reporter

    cfg = SimpleNamespace(ranks=SimpleNamespace(is_main=True, world=1), tensorboard_path=str(tmp_path / "tb"),
                          print_steps=1000, train_micro_batch_size_per_gpu=16, gradient_accumulation_steps=1,
                          max_seq_length=128)
    reporter = Reporter(cfg, TrainClock(), 1.0, lambda: (1.0, "test"))
    for step in range(1, 51):
        reporter.step(SimpleNamespace(global_step=step, global_data_samples=16 * step), 1e-3, torch.tensor(1.0 / step), 0.0)
    reporter.flush(to_disk=True)
    assert [s for s, _ in read_run(str(tmp_path / "tb"))[0]["Train/loss"]] == list(range(1, 51))
    reporter.close()


def test_the_ds_configs_progressive_layer_drop_block_is_honoured(data_root, tmp_path, capsys):
    """`enabled: true` alone turns PLD on (the engine's theta reaches the model); the flag with
    `enabled: false`, and a theta or gamma no schedule can mean, are one line before any work."""
    from tests.launch import expect_input_error

    on = ds_config(tmp_path / "on", progressive_layer_drop={"enabled": True, "theta": 0.5, "gamma": 0.1})
    train(data_root, tmp_path / "out", on, "--max_steps", 2)
    theta = [v for _, v in scalars(tmp_path / "out")[0]["Train/pld_theta"]]
    assert theta == pytest.approx([1.0, 0.5 * math.exp(-0.1) + 0.5])
    cases = [({"enabled": False}, ["--progressive_layer_drop"], "progressive_layer_drop.enabled is false but "
                                                                "--progressive_layer_drop is given"),
             ({"enabled": True, "theta": 1.5}, [], "progressive_layer_drop.theta must be > 0 and <= 1, got 1.5"),
             ({"enabled": True, "theta": 0}, [], "progressive_layer_drop.theta must be > 0 and <= 1, got 0"),
             ({"enabled": True, "gamma": -0.1}, [], "progressive_layer_drop.gamma must be >= 0, got -0.1"),
             ({"enabled": "yes"}, [], "progressive_layer_drop.enabled must be true or false, got 'yes'")]
    for i, (block, flags, expected) in enumerate(cases):
        ds = ds_config(tmp_path / f"bad{i}", progressive_layer_drop=block)
        line = expect_input_error(capsys, train, data_root, tmp_path / f"bad{i}" / "out", ds, *flags)
        assert expected in line, line


def test_local_rank_flag_and_the_launchers_must_agree(data_root, tmp_path, capsys, monkeypatch):
    from tests.launch import expect_input_error

    monkeypatch.setenv("LOCAL_RANK", "0")
    line = expect_input_error(capsys, train, data_root, tmp_path / "out", ds_config(tmp_path), "--local_rank", "1")
    assert "--local_rank 1 differs from the launcher's LOCAL_RANK 0" in line
    assert train(data_root, tmp_path / "same", ds_config(tmp_path), "--local_rank", "0", "--max_steps", 1).global_step == 1


def test_the_log_at_info_has_short_lines_and_says_what_an_epoch_took_after_a_resume(data_root, tmp_path, capsys):
    """The resolved run in one readable line (the full arguments and job config at debug level and
    beside each checkpoint); after a resume inside epoch 1, its time is this session's, said so."""
    out = tmp_path / "out"
    train(data_root, out, ds_config(tmp_path), "--max_steps", 3, "--log_level", "info")
    first = capsys.readouterr().err
    assert "Run tiny_bert: seq 128, global batch 16 (1 rank(s) x micro batch 16 x accumulation 1), 2 epoch(s)" in first
    assert max(len(line) for line in first.splitlines()) < 400
    train(data_root, out, ds_config(tmp_path), "--auto_resume", "--log_level", "info")
    resumed = capsys.readouterr().err
    assert re.search(r"Epoch 1 took [0-9.]+ s in this session \(resumed after 3 of its optimizer steps\)", resumed)
    assert re.search(r"Epoch 2 took [0-9.]+ s\n", resumed)
    assert max(len(line) for line in resumed.splitlines()) < 400


def test_adamw_off_cuda_is_torchs_unless_the_config_says_otherwise(data_root, tmp_path):
    """A DeepSpeed config asking for AdamW without `torch_adam` (the GPU recipes' way) trains on
    the CPU with torch's AdamW at once, instead of JIT-compiling DeepSpeed's FusedAdam for minutes."""
    import deepspeed_train
    from tests.launch import tiny_argv

    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
                              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}}))
    args = deepspeed_train.construct_arguments(tiny_argv(data_root, tmp_path / "out", ds=ds))
    _, optimizer = deepspeed_train.prepare_model_optimizer(args)
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.param_groups[0]["lr"] == 1e-3 and optimizer.param_groups[0]["weight_decay"] == 0.01

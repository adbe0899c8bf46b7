"""Recipe switches through the real entry point (in-process, one rank, tiny model): NSP off
(MLM loss only; checkpoints, validation and the Hugging Face export still work), validation
every N optimizer steps logged by step and training minutes, and the budget LR schedule (a
run stopped by its time budget ends annealed; a resumed run continues on the same curve).
Bad recipe keys give one error line."""
import json
import os
from argparse import Namespace

import pytest
import torch
import torch.nn.functional as F

from tests.launch import TINY_CFG, ds_config, plain_model_from_checkpoint, train_losses
from tests.launch import train_in_process as train
from turing.job_config import JobConfig
from turing.tb_events import read_run


def job_config(tmp_path, num_epochs=2, **training):
    """The tiny job config with `training` keys set in its seq-128 entry."""
    config = json.load(open(TINY_CFG))
    config["mixed_seq_training"]["128"].update(num_epochs=num_epochs, **training)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(config))
    return path


def scalars(out):
    return read_run(os.path.join(out, "runs", "tiny_bert"))[0]


def valid_prefix(data_root):
    return os.path.join(data_root, "nvidia", "128")


def test_nsp_off_trains_the_mlm_loss_only_in_bf16_and_exports(data_root, tmp_path):
    import deepspeed_train
    from tools.export_hf import export

    out = tmp_path / "out"
    cf = job_config(tmp_path, next_sentence_prediction=False)
    train(data_root, out, ds_config(tmp_path, bf16={"enabled": True}), "--validation_data_path_prefix",
          valid_prefix(data_root), cf=cf)
    values = scalars(out)
    assert "Validation/NSP_accuracy" not in values and "Validation/MLM_accuracy" in values
    # The NSP head gets no gradient: unchanged from epoch 1 to epoch 2, while the encoder learns.
    first, last = (plain_model_from_checkpoint(out, tag) for tag in ("epoch1_step4", "epoch2_step8"))
    assert torch.equal(first.cls.seq_relationship.weight, last.cls.seq_relationship.weight)
    assert not torch.equal(first.bert.encoder.layer[0].output.dense.weight,
                           last.bert.encoder.layer[0].output.dense.weight)
    # The logged validation loss is the MLM loss alone (with NSP it would be about 0.69 higher).
    mlm_only = plain_model_from_checkpoint(out).eval()
    mlm_only.next_sentence_prediction = False
    args = Namespace(validation_data_path_prefix=valid_prefix(data_root), job=JobConfig.from_resolved(json.load(open(cf))),
                     config_file=str(cf), vocab_size=mlm_only.config.vocab_size, train_micro_batch_size_per_gpu=16,
                     seed=0, max_seq_length=128)
    loader = deepspeed_train.get_dataloader(args, deepspeed_train.open_validation_set(args), eval_set=True)
    with torch.no_grad():
        batch = next(iter(loader))
        _, nsp_scores = mlm_only(batch._replace(masked_lm_labels=None))
        nsp = F.cross_entropy(nsp_scores, batch.next_sentence_labels, ignore_index=-1).item()
        mlm_only.next_sentence_prediction = True
        with_nsp = mlm_only(batch).item()
        mlm_only.next_sentence_prediction = False
        assert mlm_only(batch).item() == pytest.approx(with_nsp - nsp, abs=1e-5)
        losses = [mlm_only(b).item() for b in loader]
    assert dict(values["Validation/Loss"])[2] == pytest.approx(sum(losses) / len(losses), abs=0.02)
    export(str(out / "saved_models" / "tiny_bert"), str(tmp_path / "hf"))  # checks the logits itself
    assert os.path.isfile(tmp_path / "hf" / "config.json")


def test_validation_every_steps_logs_by_step_and_minutes_without_changing_training(data_root, tmp_path):
    train(data_root, tmp_path / "plain", ds_config(tmp_path))
    out = tmp_path / "out"
    train(data_root, out, ds_config(tmp_path), "--validation_every_steps", 3,
          "--validation_data_path_prefix", valid_prefix(data_root))
    values = scalars(out)
    # 2 epochs of 4 steps: inside the epochs at steps 3 and 6, at their ends at 4 and 8.
    for tag in ("Validation/step/MLM_accuracy", "Validation/step/Loss", "Validation/step/NSP_accuracy",
                "Validation/train_minutes"):
        assert [s for s, _ in values[tag]] == [3, 4, 6, 8], tag
    minutes = [v for _, v in values["Validation/train_minutes"]]
    assert all(0 < a < b for a, b in zip(minutes, minutes[1:])), minutes
    assert [s for s, _ in values["Validation/MLM_accuracy"]] == [1, 2]   # the per-epoch tags as before
    assert train_losses(out) == train_losses(tmp_path / "plain")        # validation leaves training alone


def test_budget_schedule_ends_annealed_when_the_budget_stops_the_run(data_root, tmp_path):
    cf = job_config(tmp_path, num_epochs=100, warmup_proportion=0.0, cooldown_proportion=1.0)
    state = train(data_root, tmp_path / "out", ds_config(tmp_path), "--lr_schedule", "budget",
                  "--max_train_hours", 1.5 / 3600, cf=cf)
    assert 1 <= state.global_step < 400                                  # stopped by the budget
    lrs = [v for _, v in scalars(tmp_path / "out")["Train/lr"]]
    assert lrs[-1] == 0.0                                                # the last step is fully annealed
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_budget_schedule_continues_on_the_same_curve_after_a_resume(data_root, tmp_path):
    cf = job_config(tmp_path, warmup_proportion=0.0, cooldown_proportion=1.0)
    out = tmp_path / "out"
    flags = ("--lr_schedule", "budget", "--max_train_hours", 0.01, "--max_steps", 3)
    train(data_root, out, ds_config(tmp_path), *flags, cf=cf)
    spent = torch.load(out / "saved_models" / "tiny_bert" / "step3" / "mp_rank_00_model_states.pt",
                       weights_only=False)["train_seconds"]
    train(data_root, out, ds_config(tmp_path), *flags, "--auto_resume", cf=cf)
    lrs = dict(scalars(out)["Train/lr"])
    assert sorted(lrs) == [1, 2, 3, 4, 5, 6]
    # Linear from 5e-3 to 0 over 36 s: the first step after the resume is at least `spent` along.
    assert lrs[4] <= 5e-3 * (1 - spent / 36) * (1 + 1e-6)
    assert all(lrs[s] > lrs[s + 1] for s in range(1, 6))


@pytest.mark.parametrize("keys, flags, message", [
    ({"masked_lm_prob": 0}, (), "masked_lm_prob must be a number in (0, 1]"),
    ({"mask_split": [0.8, 0.1]}, (), "mask_split must be [mask, random, keep] shares summing to 1"),
    ({"next_sentence_prediction": "no"}, (), "next_sentence_prediction must be true or false"),
    ({"cooldown_shape": "cosine"}, ("--lr_schedule", "WSD"), "cooldown_shape must be one of linear, 1-sqrt"),
    ({}, ("--lr_schedule", "budget"), "--lr_schedule budget follows the share of --max_train_hours spent"),
    ({}, ("--validation_every_steps", 5), "--validation_every_steps needs a validation set"),
])
def test_bad_recipe_keys_give_one_error_line(data_root, tmp_path, capsys, keys, flags, message):
    cf = job_config(tmp_path, **keys)
    with pytest.raises(SystemExit) as exit_info:
        train(data_root, tmp_path / "out", ds_config(tmp_path), *flags, cf=cf)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_the_demo_trains_the_recipe_that_bench_quality_measures():
    """scripts/demo.sh passes the "demo_modern" recipe's flags (bench/bench_quality.py) with its
    configs, and with DEMO_CONFIGS=configs/demo the "demo" recipe's (the original block), so the
    README's figures for the two recipes are the demo's."""
    from bench.bench_quality import RECIPES

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = open(os.path.join(repo, "scripts", "demo.sh")).read()
    assert "CONFIGS=${DEMO_CONFIGS:-configs/demo_modern}" in script
    command = " ".join(script.split("deepspeed_train.py", 1)[1].split("--auto_resume", 1)[0].split("\\\n"))
    for recipe_name, configs in (("demo", "configs/demo"), ("demo_modern", "configs/demo_modern")):
        flags = command.replace('"$CONFIGS', configs).replace('.json"', ".json").split()
        recipe = RECIPES[recipe_name]
        for config in ("cf", "ds"):
            assert recipe[config] in flags
        for name, value in zip(recipe["flags"][::2], recipe["flags"][1::2]):
            assert flags[flags.index(name) + 1] == value, name
        assert flags[flags.index("--validation_every_steps") + 1] == str(recipe["validation_every_steps"])


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["my_demo", "--max_steps", "5", "--help"]],
                         ids=["help", "h", "after_flags"])
def test_demo_help_prints_its_usage_and_does_nothing(tmp_path, argv):
    """`bash scripts/demo.sh --help` prints the demo's usage and exits 0; no step runs (the Python it
    would install into and train with is a stand-in that records any call)."""
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    calls = tmp_path / "calls.txt"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nexit 1\n")
    python.chmod(0o755)
    done = subprocess.run(["bash", os.path.join(repo, "scripts", "demo.sh"), *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(python), "PATH": f"{tmp_path}:{os.environ['PATH']}"},
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: bash scripts/demo.sh [WORK_DIR (default demo_run)] [training flags...]")
    assert "DEMO_CONFIGS=configs/demo" in done.stdout and not done.stderr
    assert not calls.exists(), calls.read_text()


def test_demo_says_what_each_quality_stage_does_before_it_runs(tmp_path):
    """The demo's zero-shot quality step (a couple of silent minutes on a CPU) prints a line before
    each of its stages, saying what it does and where eval_mlm's log goes. Every command is a
    stand-in (Python, the launcher) that appends what it was asked to the same file as the script's
    output, so the file shows each line before its command."""
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    log, work = tmp_path / "output.txt", tmp_path / "work"
    work.mkdir()  # scripts/prepare_demo_data.sh's stand-in makes nothing
    for name in ("python", "deepspeed"):
        (tmp_path / name).write_text(f"#!/bin/sh\necho \"RAN $*\" >> {log}\n")
        (tmp_path / name).chmod(0o755)
    done = subprocess.run(["bash", "-c", f"bash {repo}/scripts/demo.sh {work} >> {log} 2>&1"], timeout=60,
                          env={**os.environ, "PYTHON": str(tmp_path / "python"),
                               "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    lines = log.read_text().splitlines()
    assert done.returncode == 0, lines
    quality = lines[next(i for i, line in enumerate(lines) if line.startswith("zero-shot quality of")):]
    stages, said = [], None  # (the last line the script said, the command it then ran)
    for line in quality:
        if line.startswith("RAN "):
            stages.append((said, line.split()[2]))
        elif not line.startswith(" "):  # an indented line continues the one before
            said = line
    assert [command for _, command in stages] == ["tools.make_minimal_pairs", "tools.eval_mlm", "tools.eval_mlm",
                                                  "tools.quality_table"]
    assert [line.split(" ", 1)[0] for line, _ in stages] == ["1/4", "2/4", "3/4", "4/4"]
    assert stages[0][0].startswith("1/4 making minimal pairs") and stages[1][0].startswith("2/4 scoring the checkpoint")
    assert stages[2][0].startswith("3/4 scoring a randomly initialised twin")
    for init in ("pretrained", "random_init"):
        assert f"its log: {work}/quality_{init}.log" in "\n".join(quality)


def _demo_training_flags(tmp_path, configs):
    """The training flags scripts/demo.sh gives the launcher with DEMO_CONFIGS=`configs`: every other
    command is a stand-in that does nothing (Python runs its -c one-liners only), so the launcher's
    stand-in records what the script computed and passed."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp_path.mkdir(parents=True)
    calls = tmp_path / "launcher.txt"
    (tmp_path / "python").write_text(f"#!/bin/sh\nif [ \"$1\" = -c ]; then exec {sys.executable} \"$@\"; fi\n")
    (tmp_path / "deepspeed").write_text(f"#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done > {calls}\n")
    for name in ("python", "deepspeed"):
        (tmp_path / name).chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(["bash", os.path.join(repo, "scripts", "demo.sh"), str(work)], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PYTHON": str(tmp_path / "python"), "DEMO_CONFIGS": configs,
                               "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    flags = calls.read_text().splitlines()
    return {name: value for name, value in zip(flags, flags[1:]) if name.startswith("--")}


def test_the_demo_ends_where_its_schedule_ends_within_its_third_epoch(tmp_path):
    """Issue 43: the demo trained 3 epochs (1,275 steps) with a WSD schedule over the job config's
    total_training_steps (1,251): its last 24 steps at learning rate 0, and the trainer's warning
    about them. scripts/demo.sh now ends the run where the schedule ends (--stop_at_step, read from
    the job config), and on the demo's own data (scripts/prepare_demo_data.sh, deterministic) that
    step lies within the 3rd epoch: the run gets there (the learning rate reaches 0 as it ends, not
    before and not after) and trains about the 3 epochs the README describes."""
    import subprocess

    import h5py

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    stops = set()
    for configs in ("configs/demo_modern", "configs/demo"):
        job = json.load(open(os.path.join(repo, configs, "bert_config.json")))
        training = job["mixed_seq_training"]["128"]
        flags = _demo_training_flags(tmp_path / configs.replace("/", "_"), configs)
        assert flags["--lr_schedule"] == "WSD" and flags["--cf"] == f"{configs}/bert_config.json"
        assert int(flags["--stop_at_step"]) == training["total_training_steps"]
        ds = json.load(open(os.path.join(repo, configs, "ds_config.json")))
        step = ds["train_micro_batch_size_per_gpu"] * ds.get("gradient_accumulation_steps", 1)   # one rank
        stops.add((training["total_training_steps"], training["num_epochs"], step,
                   job["data"]["mixed_seq_datasets"]["128"]["pretrain_dataset"]))
    (stop, epochs, step, shards), = stops       # both recipes: the same data, batch and schedule
    work = tmp_path / "demo_data"
    subprocess.run(["bash", os.path.join(repo, "scripts", "prepare_demo_data.sh"), str(work)], cwd=repo, check=True,
                   capture_output=True, timeout=600)
    folder = work / shards
    steps = sorted(h5py.File(folder / name, "r")["input_ids"].shape[0] // step for name in os.listdir(folder))
    # an epoch reads one shard (one rank): the stop comes after epochs - 1 of the longest, within the last
    assert sum(steps[-1:] * (epochs - 1)) < stop <= epochs * steps[0], (steps, stop)

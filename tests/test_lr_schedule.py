"""The original's LR schedules at chosen steps, with offset and rewarmup."""
import argparse
import math

import pytest
import torch

from deepspeed_train import update_learning_rate
from turing.job_config import TrainingSection
from turing.lr_schedule import lr_factor
from tests.launch import ds_config, expect_input_error, train_in_process

TRAINING = {"learning_rate": 1e-3, "warmup_proportion": 0.1, "total_training_steps": 1000,
            "decay_rate": 0.9, "decay_step": 100}


def factor(schedule, step, training, budget_fraction=None):
    """lr_factor of a training section written as the job config's JSON."""
    return lr_factor(schedule, step, TrainingSection.from_dict({"num_epochs": 1, **training}), budget_fraction)


@pytest.mark.parametrize("schedule, step, expected", [
    ("LE", 0, 0.0),
    ("LE", 50, 0.5),                       # halfway through the 100 warmup steps
    ("LE", 100, 1.0),                      # warmup end: 0.9 ** 0
    ("LE", 300, 0.9 ** 2),                 # two decay periods after warmup
    ("EE", 50, 0.25),                      # (x / w) ** 2
    ("EE", 300, 0.9 ** 2),
    ("EP", 50, 0.5 ** 1.5),                # (x / w) ** 1.5
    ("EP", 500, (1 - 0.5) ** 2),           # (1 - x) ** 2 after warmup
    ("EP", 1000, 0.0),
])
def test_schedule_values(schedule, step, expected):
    assert factor(schedule, step, TRAINING) == pytest.approx(expected, abs=1e-12)


def test_no_warmup_gives_one_for_le_ee():
    training = dict(TRAINING, warmup_proportion=0.0)
    assert factor("LE", 0, training) == 1.0
    assert factor("EE", 500, training) == 1.0
    assert factor("EP", 500, training) == pytest.approx(0.25)


def _optimizer():
    p = torch.nn.Parameter(torch.zeros(2))
    return torch.optim.AdamW([{"params": [p]}, {"params": [], "weight_decay": 0.0}], lr=123.0)


def test_update_sets_every_group_with_offset():
    args = argparse.Namespace(lr_schedule="LE", lr_offset=1e-5)
    opt = _optimizer()
    lr = update_learning_rate(args, {"training": TRAINING}, 50, opt)
    assert lr == pytest.approx(1e-3 * 0.5 + 1e-5)
    assert all(g["lr"] == lr for g in opt.param_groups)


def test_rewarmup_restarts_warmup_from_the_restored_step():
    args = argparse.Namespace(lr_schedule="LE", lr_offset=0.0)
    opt = _optimizer()
    # Without rewarmup the schedule continues: step 1050 is deep in the decay.
    continued = update_learning_rate(args, {"training": TRAINING}, 1050, opt)
    assert continued == pytest.approx(1e-3 * 0.9 ** 9.5)
    # With rewarmup at step 1000, step 1050 is halfway through a fresh warmup.
    rewarmed = update_learning_rate(args, {"training": TRAINING}, 1050, opt, rewarmup_offset=1000)
    assert rewarmed == pytest.approx(0.5e-3)
    assert math.isclose(opt.param_groups[0]["lr"], rewarmed)


WSD = dict(TRAINING, warmup_proportion=0.1, cooldown_proportion=0.2)


@pytest.mark.parametrize("step, shape, expected", [
    (50, "linear", 0.5),                   # linear warmup
    (100, "linear", 1.0),                  # stable from the warmup's end ...
    (800, "linear", 1.0),                  # ... to the cool-down's start (last 20%)
    (900, "linear", 0.5),                  # halfway through the cool-down
    (900, "1-sqrt", 1 - math.sqrt(0.5)),
    (1000, "linear", 0.0),
    (1200, "1-sqrt", 0.0),                 # past the end: 0, not negative
])
def test_warmup_stable_decay(step, shape, expected):
    assert factor("WSD", step, dict(WSD, cooldown_shape=shape)) == pytest.approx(expected, abs=1e-12)


def test_budget_schedule_follows_the_share_of_the_time_budget_not_the_step():
    training = dict(TRAINING, warmup_proportion=0.0, cooldown_proportion=1.0)   # linear from 1 to 0
    for step in (0, 10, 5000):
        assert factor("budget", step, training, budget_fraction=0.25) == pytest.approx(0.75)
    assert factor("budget", 3, training, budget_fraction=1.0) == 0.0
    # warmup and cool-down are shares of the budget too
    assert factor("budget", 3, WSD, budget_fraction=0.05) == pytest.approx(0.5)
    assert factor("budget", 3, WSD, budget_fraction=0.5) == 1.0
    assert factor("budget", 3, WSD, budget_fraction=0.95) == pytest.approx(0.25)
    # the original's default cool-down share is 20%, linear
    assert factor("budget", 3, TRAINING, budget_fraction=0.9) == pytest.approx(0.5)


def test_cooldown_over_the_whole_run_starts_at_the_warmup_end():
    training = dict(WSD, cooldown_proportion=1.0)
    assert factor("WSD", 100, training) == pytest.approx(1.0)
    assert factor("WSD", 550, training) == pytest.approx(0.5)


def test_an_unknown_schedule_is_one_error_line(data_root, tmp_path, capsys):
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds_config(tmp_path),
                              "--lr_schedule", "cosine")
    assert "--lr_schedule 'cosine' is not a known schedule; expected one of LE, EE, EP, WSD, budget (LE: linear" in line


def test_every_schedule_is_named_once_in_the_table():
    """The help, the config check and the error read LR_SCHEDULES: a schedule added there is
    known everywhere, and each one is in --help."""
    from turing.lr_schedule import LR_SCHEDULES
    from utils import get_argument_parser

    help_text = get_argument_parser().format_help()
    assert all(f"{name}:" in help_text for name in LR_SCHEDULES)
    # each one callable from the table, at step 50 of 100 (warmup 10 steps, decay every 10) and half the budget
    training = {"total_training_steps": 100, "warmup_proportion": 0.1, "decay_rate": 0.9, "decay_step": 10}
    expected = {"LE": 0.9 ** 4, "EE": 0.9 ** 4, "EP": (1 - 0.5) ** 2, "WSD": 1.0, "budget": 1.0}
    assert {name: factor(name, 50, training, budget_fraction=0.5) for name in LR_SCHEDULES} == pytest.approx(expected)


def test_a_schedule_that_reached_zero_says_once_that_the_steps_after_it_do_not_train(data_root, tmp_path, capsys):
    """WSD over total_training_steps 5 in a run of 8 steps: steps 6-8 train at LR 0, said once, at step 5."""
    import json

    from tests.launch import TINY_CFG

    config = json.load(open(TINY_CFG))
    config["mixed_seq_training"]["128"]["total_training_steps"] = 5
    cf = tmp_path / "job.json"
    cf.write_text(json.dumps(config))
    train_in_process(data_root, tmp_path / "out", ds_config(tmp_path), "--lr_schedule", "WSD", cf=cf)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "the learning rate is 0" in line]
    assert len(warnings) == 1 and "step 5: the learning rate is 0 from here on" in warnings[0], warnings
    assert "--stop_at_step" in warnings[0]

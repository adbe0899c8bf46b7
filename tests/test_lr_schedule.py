"""LR schedules of SPEC 8 at chosen steps, with offset and rewarmup."""
import argparse
import math

import pytest
import torch

from deepspeed_train import lr_factor, update_learning_rate

TRAINING = {"learning_rate": 1e-3, "warmup_proportion": 0.1, "total_training_steps": 1000,
            "decay_rate": 0.9, "decay_step": 100}


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
    assert lr_factor(schedule, step, TRAINING) == pytest.approx(expected, abs=1e-12)


def test_no_warmup_gives_one_for_le_ee():
    training = dict(TRAINING, warmup_proportion=0.0)
    assert lr_factor("LE", 0, training) == 1.0
    assert lr_factor("EE", 500, training) == 1.0
    assert lr_factor("EP", 500, training) == pytest.approx(0.25)


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

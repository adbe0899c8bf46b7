"""The learning-rate schedules of --lr_schedule, each named once, in LR_SCHEDULES.

A schedule is a factor of the job config's base learning rate at optimizer step `step`
(counted from the warmup start), given the training section of the job config (`training`, a
turing.job_config.TrainingSection: total_training_steps, warmup_proportion, and the schedule's
own keys) and, for `budget`, the
share of --max_train_hours spent. LE/EE/EP are the original's schedules; WSD and budget are
warmup-stable-decay (linear warmup over warmup_proportion, 1.0, then a cool-down to 0 over the
final cooldown_proportion, `linear` (1 - t) or `1-sqrt` (1 - sqrt t) by cooldown_shape) over the
steps, or over the time budget, so a run stopped by its budget ends annealed whatever its speed.

Adding a schedule: a function (step, training, budget_fraction) -> factor, and one line in
LR_SCHEDULES (its help text and the training keys it needs); the command line, the config
checks and the error for an unknown name read the table.
"""
import dataclasses
import math
from typing import Callable, Tuple

COOLDOWN_PROPORTION = 0.2        # WSD / budget: final share of the run spent decaying
COOLDOWN_SHAPES = ("linear", "1-sqrt")


def _exponential_decay(step, training):
    return training.decay_rate ** ((step - training.warmup_proportion * training.total_training_steps)
                                      / training.decay_step)


def linear_warmup_exp_decay(step, training, budget_fraction=None):
    x, warmup = step / training.total_training_steps, training.warmup_proportion
    if warmup == 0:
        return 1.0
    return x / warmup if x < warmup else _exponential_decay(step, training)


def exp_warmup_exp_decay(step, training, budget_fraction=None):
    x, warmup = step / training.total_training_steps, training.warmup_proportion
    if warmup == 0:
        return 1.0
    return (x / warmup) ** 2 if x < warmup else _exponential_decay(step, training)


def exp_warmup_poly_decay(step, training, budget_fraction=None):
    x, warmup = step / training.total_training_steps, training.warmup_proportion
    if x < warmup:
        return (x / warmup) ** 1.5
    return max(0.0, 1.0 - x) ** 2


def warmup_stable_decay(x, warmup, cooldown, shape):
    """Factor at progress x (0 = start, 1 = end): x/warmup, then 1.0, then the cool-down over
    the final `cooldown` share (starting no earlier than the warmup's end), 0 from x = 1 on."""
    if x < warmup:
        return x / warmup
    start = max(warmup, 1.0 - cooldown)
    if x < start:
        return 1.0
    t = min(1.0, (x - start) / (1.0 - start)) if start < 1.0 else 1.0
    return 1.0 - t if shape == "linear" else 1.0 - math.sqrt(t)


def _wsd_at(x, training):
    return warmup_stable_decay(x, training.warmup_proportion, training.cooldown_proportion,
                               training.cooldown_shape)


def wsd_over_steps(step, training, budget_fraction=None):
    return _wsd_at(step / training.total_training_steps, training)


def wsd_over_time_budget(step, training, budget_fraction=None):
    return _wsd_at(budget_fraction, training)


@dataclasses.dataclass(frozen=True)
class Schedule:
    factor: Callable                 # (step, training, budget_fraction) -> factor of the base LR
    help: str
    needs: Tuple[str, ...] = ()      # keys of the training section it reads beyond the common ones
    cooldown: bool = False           # reads cooldown_proportion / cooldown_shape
    time_budget: bool = False        # follows the share of --max_train_hours spent


LR_SCHEDULES = {
    "LE": Schedule(linear_warmup_exp_decay, "linear warmup + exp decay", needs=("decay_rate", "decay_step")),
    "EE": Schedule(exp_warmup_exp_decay, "exp warmup + exp decay", needs=("decay_rate", "decay_step")),
    "EP": Schedule(exp_warmup_poly_decay, "exp warmup + poly decay"),
    "WSD": Schedule(wsd_over_steps, "warmup-stable-decay over total_training_steps", cooldown=True),
    "budget": Schedule(wsd_over_time_budget, "the WSD shape over the share of --max_train_hours spent",
                       cooldown=True, time_budget=True),
}


def schedule_help():
    return ", ".join(f"{name}: {s.help}" for name, s in LR_SCHEDULES.items())


def lr_factor(schedule, step, training, budget_fraction=None):
    """Multiplier of the base learning rate at `step` (counted from the warmup start) under the
    schedule named `schedule`; a ValueError naming the known ones for another name."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown --lr_schedule {schedule!r}; expected one of {', '.join(LR_SCHEDULES)}")
    return LR_SCHEDULES[schedule].factor(step, training, budget_fraction)

"""`RunState`: the run's progress (epochs, steps, samples, the LR warmup's start, training time, the
batch layout it was counted in), saved whole in every checkpoint's client state and restored whole
(turing.checkpointer).
"""
import dataclasses
import math
import numbers

from turing.epoch_plan import EpochPlan


@dataclasses.dataclass
class RunState:
    """Everything that counts progress, and the phase and batch layout it was counted in; saved
    in every checkpoint's client state (ints and floats only, so a checkpoint loads with
    torch.load(..., weights_only=True)) under the keys of CLIENT_KEYS, and read back by
    `from_client_state`. A new field is saved and restored once it has a line there."""
    epoch: int = 0                  # epochs finished (= index of the epoch in progress)
    epoch_micro_step: int = 0       # micro-batches of that epoch already trained on
    global_step: int = 0            # optimizer steps taken
    global_data_samples: int = 0    # samples seen (all ranks)
    rewarmup_offset: int = 0        # global step at which the LR warmup (re)started
    train_seconds: float = 0.0      # training wall time of earlier sessions (--max_train_hours)
    restore_step: int = 0           # not saved: the global step this session was restored at
    nonfinite_in_a_row: int = 0     # not saved: a run stopped by them resumes counting afresh
    nonfinite_total: int = 0
    seq_length: int = 0             # --max_seq_length trained at: the phase (0: not recorded)
    micro_batch: int = 0            # micro batch per rank epoch_micro_step counts in (0: not recorded)
    grad_accum: int = 0             # gradient accumulation steps, likewise
    world: int = 0                  # ranks, likewise
    # The layout (ranks, micro batch, accumulation) the epoch in progress began with, whose sample
    # order it follows to its end, when it differs from this run's (0: the same)
    plan_world: int = 0
    plan_micro_batch: int = 0
    plan_grad_accum: int = 0

    # field -> client-state key. The first three are the original's keys (and the only ones its
    # checkpoints have: the other fields keep their defaults when a checkpoint lacks them).
    CLIENT_KEYS = {"epoch": "epoch", "global_step": "last_global_step",
                   "global_data_samples": "last_global_data_samples",
                   "epoch_micro_step": "epoch_micro_step", "rewarmup_offset": "rewarmup_offset",
                   "train_seconds": "train_seconds", "nonfinite_total": "nonfinite_total",
                   "seq_length": "seq_length", "micro_batch": "micro_batch", "grad_accum": "grad_accum",
                   "world": "world_size", "plan_world": "epoch_plan_world",
                   "plan_micro_batch": "epoch_plan_micro_batch", "plan_grad_accum": "epoch_plan_grad_accum"}
    REQUIRED = ("epoch", "global_step", "global_data_samples")
    LAYOUT = ("seq_length", "micro_batch", "grad_accum", "world")  # this run's own, never taken from a checkpoint

    def to_client_state(self):
        return {key: getattr(self, name) for name, key in self.CLIENT_KEYS.items()}

    def layout(self):
        return EpochPlan(self.world, self.micro_batch, self.grad_accum)

    def epoch_plan(self):
        """The layout the epoch in progress began with, None when it is this run's."""
        plan = EpochPlan(self.plan_world, self.plan_micro_batch, self.plan_grad_accum)
        return None if not self.plan_world or plan == self.layout() else plan

    @classmethod
    def missing_keys(cls, client):
        """The required client-state keys `client` lacks (not written by this program or the original)."""
        return [cls.CLIENT_KEYS[name] for name in cls.REQUIRED if cls.CLIENT_KEYS[name] not in client]

    @classmethod
    def bad_value(cls, client):
        """The first client-state value that cannot be a run's position ('KEY V: expected ...'), or
        None: every count a whole number >= 0, train_seconds a finite number >= 0 (a checkpoint
        whose state says step -1000 or nan seconds would train at a negative LR or never stop)."""
        for name, key in cls.CLIENT_KEYS.items():
            if key not in client:
                continue
            value = client[key]
            if name == "train_seconds":
                if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
                    return f"{key} {value!r}: expected a finite number of seconds >= 0"
            elif isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                return f"{key} {value!r}: expected a whole number >= 0"
        return None

    @classmethod
    def from_client_state(cls, client):
        """The run state a checkpoint saved; fields it lacks (older or the original's
        checkpoints) keep their defaults."""
        return cls(**{name: client[key] for name, key in cls.CLIENT_KEYS.items() if key in client})

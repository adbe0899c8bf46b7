"""An epoch's batch layout and the rest of an epoch on another one: `EpochPlan` (ranks, micro
batch, accumulation: the layout an epoch's sample order is made for, saved in the run state) and
`remap_epoch` (the micro batches of an interrupted epoch dealt over another layout of the same
global batch, so a resume on another number of ranks trains every sample of the epoch's steps once).
Both providers and the checkpointer read them."""
from typing import NamedTuple

import numpy as np


class EpochPlan(NamedTuple):
    """A batch layout: ranks, micro batch per rank, gradient accumulation steps. An epoch's
    sample order is made for the layout the epoch started with (its plan); a run resumed inside
    the epoch with another layout of the same global batch finishes that plan (remap_epoch)."""
    world: int
    micro_batch: int
    grad_accum: int

    @property
    def global_batch(self):
        return self.world * self.micro_batch * self.grad_accum


def remap_epoch(rows_per_rank, plan, start_step, layout, rank):
    """This rank's micro batches (sample ids, shape [n, layout.micro_batch]) for the rest of an
    epoch whose order was made for `plan`, from optimizer step `start_step` of the epoch on,
    on `layout` (same global batch). Returns (rows, samples of the epoch's partial last step).

    rows_per_rank[r]: the micro batches plan rank r runs in the epoch ([n_r, plan.micro_batch]
    sample ids); like the step loop, every rank runs the shortest rank's count, in whole
    optimizer steps. Optimizer step s of the plan trains the samples of micro batches
    s*accum ... (s+1)*accum-1 of every plan rank; on `layout`, step s trains exactly those
    samples (in plan-rank order, rank `rank` taking its micro_batch x grad_accum slice), so an
    epoch interrupted and resumed on another number of ranks, micro batch or accumulation trains
    every sample of the epoch's steps once. The micro batches after the last whole step are not
    trained on any layout (an epoch trains whole steps); their sample count is returned."""
    if plan.global_batch != layout.global_batch:
        raise ValueError(f"global batch {layout.global_batch} differs from the epoch's {plan.global_batch}")
    total = min(len(rows) for rows in rows_per_rank)
    steps = total // plan.grad_accum
    rows = np.stack([np.asarray(r)[:total] for r in rows_per_rank])            # [plan ranks, total, micro]
    whole = rows[:, :steps * plan.grad_accum].reshape(plan.world, steps, -1)   # [plan ranks, steps, accum*micro]
    whole = whole.transpose(1, 0, 2).reshape(steps, -1)[start_step:]           # [steps left, global batch]
    share = layout.micro_batch * layout.grad_accum
    mine = whole[:, rank * share:(rank + 1) * share].reshape(-1, layout.micro_batch)
    return mine, rows[:, steps * plan.grad_accum:].size

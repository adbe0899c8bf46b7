"""The interface both pretraining data providers implement (NVIDIA hdf5, Bing numpy).

The training loop reads an epoch as an iterator of batches, from a position:

    with provider.epoch(index, start=micro_batches_done, plan=None) as batches:
        len(batches)                             # micro batches left for this rank
        for batch in batches:                    # turing.batch.Batch; the next epoch's shard
            ...                                  # is loading meanwhile, the prefetch window full

`epoch()` runs on the original's per-epoch calls, which stay for the original's callers:

    refs, total = provider.get_shard(index)      # iterable of batch references, its length
                                                 # (start_batch=N, keyword only: skip N micro batches;
                                                 # plan=EpochPlan: the epoch's order was made for
                                                 # another batch layout, see remap_epoch)
    provider.prefetch_shard(index + 1)           # start loading the next epoch's shard
    for ref in refs:
        batch = provider.get_batch(ref)          # a turing.batch.Batch
        provider.prefetch_batch()                # keep the prefetch window full
    provider.release_shard(index)

Also here: how the providers' helper processes (DataLoader workers, the shard-reading process)
treat the stop signals, which both providers share.
"""
import contextlib
import signal
from typing import NamedTuple

import numpy as np

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def ignore_stop_signals(*_):
    """Start of a helper process (DataLoader `worker_init_fn`, pool initializer): ignore
    SIGINT/SIGTERM, then take them off the blocked set `stop_signals_held` left.

    Ctrl-C and schedulers signal the whole process group, the deepspeed launcher the whole
    process tree. The rank answers with a checkpoint at the end of its optimizer step, which
    needs its workers: a worker that died of the signal would take the rank down with it first.
    A worker still ends with its rank: the rank closes its loaders on the way out, and a
    worker whose rank is gone exits on its own (torch's watchdog), as does the pool process.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)   # also drops a copy that arrived while blocked
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def stop_signals_held():
    """Block SIGINT/SIGTERM in this thread while helper processes are started.

    A child inherits the blocked set (across fork and exec), so a stop signal that arrives
    before its `ignore_stop_signals` runs waits, and is dropped there, instead of killing it.
    This process gets its own copy once the block ends (or at once, through another thread).
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


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
    on `layout` (same global batch). Returns (rows, samples left unused).

    rows_per_rank[r]: the micro batches plan rank r runs in the epoch ([n_r, plan.micro_batch]
    sample ids); like the step loop, every rank runs the shortest rank's count. Optimizer step s
    of the plan trains the samples of micro batches s*accum ... (s+1)*accum-1 of every plan
    rank; on `layout`, step s trains exactly those samples (in plan-rank order, rank `rank`
    taking its micro_batch x grad_accum slice), so an epoch interrupted and resumed on another
    number of ranks, micro batch or accumulation trains every sample of the epoch once. A last
    partial step (fewer micro batches than the accumulation) is dealt out in whole micro
    batches; what does not fill one on every rank is left unused (the count returned)."""
    if plan.global_batch != layout.global_batch:
        raise ValueError(f"global batch {layout.global_batch} differs from the epoch's {plan.global_batch}")
    total = min(len(rows) for rows in rows_per_rank)
    steps = total // plan.grad_accum
    rows = np.stack([np.asarray(r)[:total] for r in rows_per_rank])            # [plan ranks, total, micro]
    whole = rows[:, :steps * plan.grad_accum].reshape(plan.world, steps, -1)   # [plan ranks, steps, accum*micro]
    whole = whole.transpose(1, 0, 2).reshape(steps, -1)[start_step:]           # [steps left, global batch]
    share = layout.micro_batch * layout.grad_accum
    mine = whole[:, rank * share:(rank + 1) * share].reshape(-1, layout.micro_batch)
    tail = rows[:, steps * plan.grad_accum:].reshape(-1)                       # the partial last step
    per_rank = len(tail) // layout.world // layout.micro_batch * layout.micro_batch
    mine = np.concatenate([mine, tail[rank * per_rank:(rank + 1) * per_rank].reshape(-1, layout.micro_batch)])
    return mine, len(tail) - per_rank * layout.world


class BertDatasetProviderInterface:
    """A data format: its training shards (built as `Provider(args)`, then per epoch get_shard,
    get_batch, ...) and its validation set (`validation_dataset`). The formats the training
    script knows are listed in deepspeed_train.DATA_FORMATS."""

    @staticmethod
    def holds_validation_set(path):
        """Whether the folder `path` (validation.path under --validation_data_path_prefix) holds a
        validation set in this format."""
        raise NotImplementedError

    @staticmethod
    def validation_dataset(path, args):
        """The validation set in `path`, read and checked whole, as a map-style Dataset of per-sample
        Batches (args: the run's settings: sequence length, vocab, seed)."""
        raise NotImplementedError

    def check_shards(self):
        """Check every training shard the run may read (layout, not every value): a bad one
        is an error before the model is built, not in some later epoch."""
        raise NotImplementedError

    def training_folders(self):
        """The dataset folders the training shards are read from (the trainer checks its validation
        set's documents against the record beside them: turing/heldout.py); [] where unknown."""
        return []

    def epoch(self, index, *, start=0, plan=None):
        """The micro batches of epoch `index` for this rank, from micro batch `start` on (an
        EpochBatches: len() and iteration; a context manager that releases the epoch on exit);
        `plan`: the EpochPlan the epoch's order was made for, when not this run's layout. The
        next epoch's shard starts loading at once."""
        refs, count = self.get_shard(index, start_batch=start, **({"plan": plan} if plan else {}))
        self.prefetch_shard(index + 1)
        return EpochBatches(self, index, refs, count)

    def get_shard(self, index, *, start_batch=0, plan=None):
        """(batch references of epoch `index` from micro batch `start_batch` on, their count);
        `plan`: the EpochPlan the epoch's order was made for, when not this run's layout."""
        raise NotImplementedError

    def release_shard(self, index):
        raise NotImplementedError

    def prefetch_shard(self, index):
        raise NotImplementedError

    def get_batch(self, batch_iter):
        raise NotImplementedError

    def prefetch_batch(self):
        raise NotImplementedError


class EpochBatches:
    """One epoch's micro batches for this rank (BertDatasetProviderInterface.epoch): `len()` is
    their count; iterating fetches each (get_batch) and keeps the prefetch window full
    (prefetch_batch); leaving the `with` block, or close(), releases the epoch's loaders."""

    def __init__(self, provider, index, refs, count):
        self.provider, self.index, self.refs, self.count = provider, index, refs, count

    def __len__(self):
        return self.count

    def __iter__(self):
        for ref in self.refs:
            batch = self.provider.get_batch(ref)
            self.provider.prefetch_batch()
            yield batch

    def close(self):
        self.provider.release_shard(self.index)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

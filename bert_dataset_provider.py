"""The interface both pretraining data providers implement (NVIDIA hdf5, Bing numpy).

The training loop reads an epoch as an iterator of batches, from a position:

    with provider.epoch(index, start=micro_batches_done, plan=None) as batches:
        len(batches)                             # micro batches left for this rank
        for batch in batches:                    # turing.batch.Batch; the next epoch's shard
            ...                                  # is loading meanwhile, the prefetch window full

`epoch()` runs on the original's per-epoch calls, which stay for the original's callers:

    refs, total = provider.get_shard(index)      # iterable of batch references, its length
                                                 # (shuffle=False: the stored order;
                                                 # start_batch=N, keyword only: skip N micro batches;
                                                 # plan=EpochPlan: the epoch's order was made for
                                                 # another batch layout, see remap_epoch)
    provider.prefetch_shard(index + 1)           # start loading the next epoch's shard
    for ref in refs:
        batch = provider.get_batch(ref)          # a turing.batch.Batch
        provider.prefetch_batch()                # keep the prefetch window full
    provider.release_shard(index)

A provider is built as `Provider(args)`, the original's call, and reads the run through
`DataSettings.of(args)`. Also here: how the providers' helper processes (DataLoader workers, the
shard-reading process) treat the stop signals, which both providers share.
"""
import contextlib
import dataclasses
import numbers
import signal
from typing import Optional

from turing.epoch_plan import EpochPlan, remap_epoch  # noqa: F401 (the providers' names for them)
from turing.errors import InputValueError
from turing.job_config import JobConfig, job_config_of

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def ignore_stop_signals(*_):
    """Start of a helper process (DataLoader `worker_init_fn`; turing.shard_prefetch's reader does
    the same): ignore SIGINT/SIGTERM, then take them off the blocked set `stop_signals_held` left.

    Ctrl-C and schedulers signal the whole process group, the deepspeed launcher the whole
    process tree. The rank answers with a checkpoint at the end of its optimizer step, which
    needs its workers: a worker that died of the signal would take the rank down with it first.
    A worker still ends with its rank: the rank closes its loaders on the way out, and a
    worker whose rank is gone exits on its own (torch's watchdog), as does the shard reader.
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


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """What a provider reads of a run, typed, built once by `of` from the run's settings: the
    trainer's RunConfig, or the original's `args` (construct_arguments' after
    prepare_model_optimizer, or one its users build with the same attribute names). The one place
    the original's `args` is read on the data side; the providers read only these fields."""
    job: JobConfig                    # datasets (data.mixed_seq_datasets.<seq>) and the training section
    data_path_prefix: str
    max_seq_length: int
    max_predictions_per_seq: int
    seed: int
    local_rank: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    # what one format reads (an `args` built for the other may lack it)
    vocab_file: Optional[str] = None  # the tokenizer (Bing shards hold token strings)
    vocab_size: Optional[int] = None  # the model's rows: NVIDIA token ids are checked against it (None: not)
    refresh_bucket_size: int = 1      # the Bing provider's; the flag's default

    COUNTS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "refresh_bucket_size")

    def __post_init__(self):
        for name in self.COUNTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise InputValueError(f"args.{name} must be a positive int; got {value!r}")

    @classmethod
    def of(cls, run):
        """The settings of `run` (DataSettings: itself); an attribute it lacks is one error line."""
        if isinstance(run, cls):
            return run
        fields = [f for f in dataclasses.fields(cls) if f.name != "job"]
        missing = [f.name for f in fields if f.default is dataclasses.MISSING and not hasattr(run, f.name)]
        if missing:
            raise InputValueError(f"the run's settings lack {', '.join('args.' + n for n in missing)}: a provider "
                                  f"is built as Provider(args) from construct_arguments' args once "
                                  f"prepare_model_optimizer has run, or from the trainer's RunConfig")
        return cls(job=job_config_of(run), **{f.name: getattr(run, f.name) for f in fields if hasattr(run, f.name)})


@dataclasses.dataclass(frozen=True)
class ValidationSettings:
    """What a validation set is read with (`validation_dataset`'s `args`), for a caller without a
    run (tools/eval_mlm.py); the trainer passes its RunConfig, which has the same five."""
    max_seq_length: int
    max_predictions_per_seq: int
    seed: int                   # the Bing format's fixed validation masks
    vocab_file: str
    vocab_size: int             # token ids are checked against it


class BertDatasetProviderInterface:
    """A data format: its training shards (built as `Provider(args)`, then per epoch get_shard,
    get_batch, ...) and its validation set (`validation_dataset`). The formats the training
    script knows are listed in data_formats.DATA_FORMATS."""

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

    def get_shard(self, index, shuffle=True, *, start_batch=0, plan=None):
        """(batch references of epoch `index` from micro batch `start_batch` on, their count);
        `shuffle` (the original's parameter): False keeps the data in its stored order;
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

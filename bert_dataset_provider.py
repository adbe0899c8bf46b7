"""The interface both pretraining data providers implement (NVIDIA hdf5, Bing numpy).

The step loop drives a provider like this, once per epoch `index`:

    refs, total = provider.get_shard(index)      # iterable of batch references, its length
                                                 # (start_batch=N, keyword only: skip N micro batches)
    provider.prefetch_shard(index + 1)           # start loading the next epoch's shard
    for ref in refs:
        batch = provider.get_batch(ref)          # a turing.batch.Batch
        ...
        provider.prefetch_batch()                # keep the prefetch window full
    provider.release_shard(index)

Also here: how the providers' helper processes (DataLoader workers, the shard-reading process)
treat the stop signals, which both providers share.
"""
import contextlib
import signal

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

    def get_shard(self, index, *, start_batch=0):
        raise NotImplementedError

    def release_shard(self, index):
        raise NotImplementedError

    def prefetch_shard(self, index):
        raise NotImplementedError

    def get_batch(self, batch_iter):
        raise NotImplementedError

    def prefetch_batch(self):
        raise NotImplementedError

"""The reader process: reading the input, keeping documents and dealing them into chunks
(documents, filters) run in a process of their own, beside the workers, so that the main process
only coordinates (hands the chunks to the workers, writes what they give back, in order).

The reading stays one ordered stream: which documents a run keeps (one copy of each, this part's)
and where the chunks end depend on every document before, so the chunks, and so the shards, are
those of a run without it. What it costs runs beside the workers instead of before each chunk's
hand-over; a `.bz2` dump's streams are decompressed on threads of this process
(tools/prep/layouts.py). The document stages that read the text (decontamination, language,
quality: a few MB/s a core, more than reading costs) are decided by stage worker processes beside
it (StageWorkers), a few batches ahead, and applied here in input order, so that one process does
not bound a run on many cores.
"""
import collections
import concurrent.futures
import concurrent.futures.process
import ctypes
import multiprocessing.connection
import os
import pickle
import signal
import sys

from tools.prep import PrepareDataError
from tools.prep.documents import document_size
from tools.prep.workers import end_with_parent, how_it_ended, worker_context

POLL_SECONDS = 0.2          # how often the main process checks for a stop while it waits for a chunk
PROCESS_NAME = b"prepare_reader"   # the reader's name in ps and top (Linux: 15 bytes at most)
STAGE_PROCESS_NAME = b"prepare_stage"   # a stage worker's
PR_SET_NAME = 15                   # <linux/prctl.h>


def _reader_main(make_chunks, pipe, parent, inherited):
    """The reader process: sends ("chunk", chunk) for each chunk `make_chunks()` yields, then
    ("end", what it returned), or ("error", the exception that stopped it)."""
    end_with_parent(parent, inherited)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_NAME, PROCESS_NAME)
    try:
        chunks = make_chunks()
        while True:
            try:
                pipe.send(("chunk", next(chunks)))
            except StopIteration as end:
                pipe.send(("end", end.value))
                break
    except Exception as e:  # noqa: BLE001 - re-raised in the main process
        try:
            pickle.dumps(e)
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its message goes
            e = PrepareDataError(f"reading the input: {type(e).__name__}: {e}")
        pipe.send(("error", e))
    pipe.close()


class ChunkReader:
    """The chunks of `make_chunks()` (a generator function: picklable where processes are spawned)
    as made in a reader process; iterate over it. Once all are read, `outcome` is what the
    generator returned. The process ends with the main process however it ends (end_with_parent)
    and closes the descriptors `inherited` (the journal's lock); a reader that dies ends the wait
    in a PrepareDataError naming it."""

    def __init__(self, make_chunks, inherited=(), check_stop=lambda: None):
        ctx, inherited = worker_context(inherited)
        self.pipe, end = ctx.Pipe(duplex=False)
        # not daemonic: it starts processes of its own (StageWorkers); it ends with this process
        # however this one ends (end_with_parent), and `terminate` ends it on every way out of a run
        self.process = ctx.Process(target=_reader_main, args=(make_chunks, end, os.getpid(), inherited),
                                   daemon=False, name="prepare_data-reader")
        self.process.start()
        end.close()                    # the reader holds the only writing end
        self.check_stop = check_stop
        self.outcome = None

    def __iter__(self):
        while True:
            kind, value = self._receive()
            if kind == "chunk":
                yield value
                continue
            self.process.join()
            if kind == "error":
                raise value
            self.outcome = value
            return

    def _receive(self):
        while True:
            self.check_stop()
            ready = multiprocessing.connection.wait([self.pipe, self.process.sentinel], timeout=POLL_SECONDS)
            if self.pipe in ready:
                try:
                    return self.pipe.recv()
                except (EOFError, OSError):   # it died while sending
                    break
            elif ready:
                break
        self.process.join(timeout=1)
        how = how_it_ended(self.process.exitcode)
        raise PrepareDataError(f"the reader process {self.process.pid} ended ({how}) while reading the input "
                               "(SIGKILL is what the out-of-memory killer sends); no shard was written (the "
                               "finished chunks are kept: the same command continues from them)")

    def terminate(self):
        """Stop the reader now (an error or a signal in the main process)."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.pipe.close()


# ---------------------------------------------------------------------------------------------
# Stage workers: the decisions of the document stages, beside the reader

STAGE_BATCH_DOCUMENTS = 32          # documents a task, at most
STAGE_BATCH_BYTES = 1 << 20         # and about this much of them
_STAGES = None                      # in a stage worker: the run's DocumentStages


def _stage_worker_start(stages, parent):
    global _STAGES
    end_with_parent(parent)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_NAME, STAGE_PROCESS_NAME)
    _STAGES = stages


def _decide(batch):
    return [_STAGES.decide(name, number, document) for name, number, document in batch]


class StageWorkers:
    """`processes` processes beside the reader that make the stages' decisions
    (DocumentStages.decide) for batches of documents, a few batches a process ahead of the reader;
    the reader takes them back in input order and applies them (counts, --keep_filtered), so the
    run's output does not depend on who decided. Started before the reading (forked where the
    platform can: the stages and their models are inherited, not sent), they end with the reader
    however it ends; one that dies (the out-of-memory killer) is an error, never a wait."""

    def __init__(self, stages, processes):
        ctx, _ = worker_context(())
        self.stages = stages
        self.window = 2 * processes
        self.context = _KeepsProcesses(ctx)
        self.pool = concurrent.futures.ProcessPoolExecutor(processes, mp_context=self.context,
                                                           initializer=_stage_worker_start, initargs=(stages, os.getpid()))
        self.pool.submit(_decide, []).result()      # every process forked now, before any reading thread

    def staged(self, items):
        """`items`: (set name, document number, key, document or None, input bytes) in input order;
        yields them with each document as the stages leave it (None: dropped)."""
        in_flight = collections.deque()
        for batch in _batches(items):
            documents = [(name, number, document) for name, number, _, document, _ in batch if document is not None]
            in_flight.append((batch, self.pool.submit(_decide, documents)))
            if len(in_flight) > self.window:
                yield from self._applied(*in_flight.popleft())
        while in_flight:
            yield from self._applied(*in_flight.popleft())

    def _applied(self, batch, decided):
        try:
            decisions = iter(decided.result())
        except concurrent.futures.process.BrokenProcessPool:
            raise PrepareDataError(f"{self._which_ended()} while deciding (SIGKILL is what the out-of-memory killer "
                                   "sends); the finished chunks are kept: the same command continues from them") from None
        for name, number, key, document, nbytes in batch:
            if document is not None:
                document = self.stages.apply(name, number, next(decisions))
            yield name, number, key, document, nbytes

    def _which_ended(self):
        """Which stage worker ended, and how, the one that broke the pool (which then ends the others
        with SIGTERM)."""
        for process in self.context.processes:
            process.join(timeout=1)
        for process in self.context.processes:
            if process.exitcode not in (0, -signal.SIGTERM, None):
                return f"the stage worker process {process.pid} ended ({how_it_ended(process.exitcode)})"
        return "a stage worker process ended"

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)


class _KeepsProcesses:
    """A multiprocessing context that keeps the processes a ProcessPoolExecutor starts with it: the
    pool says that one of its workers ended, never which one or how."""

    def __init__(self, context):
        self._context = context
        self.processes = []

    def __getattr__(self, name):
        return getattr(self._context, name)

    def Process(self, *args, **kwargs):  # noqa: N802 - the context's own name
        process = self._context.Process(*args, **kwargs)
        self.processes.append(process)
        return process


def _batches(items):
    batch, documents, size = [], 0, 0
    for item in items:
        batch.append(item)
        if item[3] is not None:
            documents += 1
            size += document_size(item[3])
        if documents >= STAGE_BATCH_DOCUMENTS or size >= STAGE_BATCH_BYTES:
            yield batch
            batch, documents, size = [], 0, 0
    if batch:
        yield batch

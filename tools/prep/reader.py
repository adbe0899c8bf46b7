"""The reader process: reading the input, keeping documents and dealing them into chunks
(documents, filters) run in a process of their own, beside the workers, so that the main process
only coordinates (hands the chunks to the workers, writes what they give back, in order).

The reading stays one ordered stream: which documents a run keeps (one copy of each, this part's)
and where the chunks end depend on every document before, so the chunks, and so the shards, are
those of a run without it. What it costs runs beside the workers instead of before each chunk's
hand-over; a `.bz2` dump's streams are decompressed on threads of this process
(tools/prep/layouts.py).
"""
import ctypes
import multiprocessing.connection
import os
import pickle
import signal
import sys

from tools.prep import PrepareDataError
from tools.prep.workers import end_with_parent, worker_context

POLL_SECONDS = 0.2          # how often the main process checks for a stop while it waits for a chunk
PROCESS_NAME = b"prepare_reader"   # the reader's name in ps and top (Linux: 15 bytes at most)
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
        self.process = ctx.Process(target=_reader_main, args=(make_chunks, end, os.getpid(), inherited),
                                   daemon=True, name="prepare_data-reader")
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
        code = self.process.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
        raise PrepareDataError(f"the reader process {self.process.pid} ended ({how}) while reading the input "
                               "(SIGKILL is what the out-of-memory killer sends); no shard was written (the "
                               "finished chunks are kept: the same command continues from them)")

    def terminate(self):
        """Stop the reader now (an error or a signal in the main process)."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.pipe.close()

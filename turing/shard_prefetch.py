"""An NVIDIA shard read and checked in a process of its own while the epoch before it trains.

`ShardPrefetch(path, max_seq_length)` starts `python -m turing.shard_prefetch PATH MAX_SEQ`. The
process reads and checks the shard (turing.formats.read_hdf5_shard: the slow part, beside the
training) and writes its arrays to its stdout in .npy format (version 1.0), in HDF5_KEYS order;
`result()` reads them back into writable arrays. A shard that fails its checks raises the same
error as when read in this process (an InputValueError naming it); the process writes its type
and message to stderr as one JSON line.

The process imports numpy and h5py only (0.2 s). A multiprocessing child (spawn) would import
the trainer's main script again, torch and DeepSpeed with it: 2-3 s of CPU and about 400 MB of
memory for each rank's reader, for as long as the run lasts.

It ignores SIGINT and SIGTERM. Ctrl-C and schedulers signal the whole process group; the rank
answers with a checkpoint and ends the reader itself (`cancel`). The caller holds those signals
blocked while it starts the reader (the providers' `stop_signals_held`), so one that arrives
before the reader ignores them waits, and is dropped there. A rank that dies takes the reader
along at its first write: the pipe's reading end is gone.
"""
import json
import os
import signal
import subprocess
import sys

import numpy as np

from turing import errors
from turing.formats import HDF5_KEYS, read_hdf5_shard

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ShardPrefetch:
    """The shard at `path` being read by a process of its own; `result()` waits for its arrays."""

    def __init__(self, path, max_seq_length=None):
        self.path = path
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (REPO, os.environ.get("PYTHONPATH"))))}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "turing.shard_prefetch", path, str(max_seq_length or 0)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)

    def result(self):
        """The shard's arrays (a dict keyed by HDF5_KEYS), or the error that stopped the reader."""
        try:
            arrays = {key: read_npy(self.process.stdout) for key in HDF5_KEYS}
        except EOFError:
            arrays = None
        message = self.process.stderr.read().decode("utf-8", errors="replace").strip()
        code = self.process.wait()
        self._close_pipes()
        if code != 0 or arrays is None:
            raise reader_error(self.path, code, message)
        return arrays

    def cancel(self):
        """End the reader (the rank stops, or another epoch's shard is needed); never waits on it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._close_pipes()

    def _close_pipes(self):
        for pipe in (self.process.stdout, self.process.stderr):
            pipe.close()


def reader_error(path, code, message):
    """The exception of a reader that ended with `code` and `message` on stderr (its JSON line, or
    Python's own output where it crashed)."""
    lines = message.splitlines()
    try:
        report = json.loads(lines[-1])
        kind = getattr(errors, report["type"], None) if isinstance(report, dict) else None
    except (IndexError, ValueError, KeyError, TypeError):
        kind = None
    if isinstance(kind, type) and issubclass(kind, Exception):
        return kind(report["message"])
    last = lines[-1] if lines else "no output"
    return RuntimeError(f"{path}: the shard reader process ended with exit code {code} ({last})")


def read_npy(stream):
    """One array in .npy format (version 1.0) from a stream that cannot seek (a pipe), into a
    writable array; EOFError where the stream ends before a whole array."""
    if not stream.peek(1):
        raise EOFError("no array")
    np.lib.format.read_magic(stream)
    shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    array = np.empty(shape, dtype=dtype, order="F" if fortran_order else "C")
    view, filled = memoryview(array.reshape(-1, order="A")).cast("B"), 0
    while filled < len(view):
        got = stream.readinto(view[filled:])
        if not got:
            raise EOFError(f"an array cut short ({filled} of {len(view)} bytes)")
        filled += got
    return array


def write_npy(stream, array):
    array = np.ascontiguousarray(array)
    np.lib.format.write_array_header_1_0(stream, np.lib.format.header_data_from_array_1_0(array))
    stream.write(memoryview(array.reshape(-1)).cast("B"))


def _ignore_stop_signals():
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)       # also drops a copy that arrived while blocked
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))


def main(argv):
    _ignore_stop_signals()
    path, max_seq_length = argv[0], int(argv[1]) or None
    try:
        arrays = read_hdf5_shard(path, max_seq_length)
    except errors.InputError as e:
        sys.stderr.write(json.dumps({"type": type(e).__name__, "message": str(e)}) + "\n")
        return 2
    out = sys.stdout.buffer
    for key in HDF5_KEYS:
        write_npy(out, arrays[key])
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A chunk's work and the processes that do it: ChunkProcessor turns a chunk of documents into
the arrays of its sequences (sentences, tokens, instances) and records it in the journal
(save_chunk; load_chunk rebuilds it), and deflates the hdf5 blocks the shards are made of;
WorkerPool runs that in --workers processes that end with the main process however it ends, and
ordered_results gives the results back in chunk order, with progress. The main process only
coordinates: the documents come from a reader process (tools/prep/reader.py), the arrays from the
workers, and what it writes the workers have compressed."""
import collections
import ctypes
import fcntl
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import random
import selectors
import signal
import struct
import sys
import threading
import time
import zlib
from dataclasses import dataclass, replace

import numpy as np
import numpy.random  # noqa: F401  (numpy loads it lazily: load it once here, not in every worker)
from tqdm import tqdm

from tools.prep import TRAIN, PrepareDataError
from tools.prep.instances import VocabBytes, bing_arrays, create_instance_spans, nvidia_arrays
from tools.prep.neardup import sign_batch
from tools.prep.sentences import SPLITTER, SentenceSplitter, document_sentences
from tools.prep.summary import SetStats
from tools.prep.tokens import token_encoder

logger = logging.getLogger(__name__)

PROGRESS_SECONDS = 30                 # a plain progress line this often when stderr is not a terminal
PARENT_POLL_SECONDS = 1               # a worker checks this often that the main process still runs
PR_SET_PDEATHSIG = 1                  # <linux/prctl.h>: a signal the kernel sends when the parent ends
DEFLATE_BATCH = 8                     # hdf5 chunks (~256 KB each) a deflate task carries


@dataclass(frozen=True)
class Settings:
    """What a worker needs to turn a chunk of documents into arrays (picklable)."""
    fmt: str
    bing_layout: str
    max_seq_length: int
    max_predictions_per_seq: int
    masked_lm_prob: float
    validation_masked_lm_prob: float
    short_seq_prob: float
    dupe_factor: int
    seed: int
    vocab_size: int
    cls_id: int
    sep_id: int
    mask_id: int
    unk_id: int
    min_document_words: int = 0
    splitter: str = SPLITTER


class ChunkProcessor:
    """Turns one chunk of documents into the arrays of its sequences (runs in a worker)."""

    def __init__(self, settings, tokenizer, tokens_by_id):
        """`tokenizer`: a turing.tokenization.Tokenizer; `tokens_by_id`: its token strings (the Bing format's)."""
        self.settings = settings
        self.words = token_encoder(tokenizer)
        self.vocab_bytes = VocabBytes(tokens_by_id) if settings.fmt == "bing" else None
        self.splitter = SentenceSplitter(settings.splitter)

    def run(self, kind, *task):
        """A task of the pipeline: ("chunk", set name, chunk index, documents, shards, journal
        path) processes a chunk and records it in the journal; ("rebuild", set name, path) makes
        the same result again from a recorded chunk; ("deflate", blocks, level) are hdf5 chunks'
        bytes as the gzip filter stores them (tools/prep/shards.py); ("sign", seed, bands, rows,
        shingle words, documents) gives a batch's near-duplicate band hashes (tools/prep/neardup.py)."""
        if kind == "deflate":
            blocks, level = task
            return [zlib.compress(block, level) for block in blocks]
        if kind == "sign":
            return sign_batch(*task)
        return self.rebuild(*task) if kind == "rebuild" else self(*task)

    def rebuild(self, set_name, path):
        """The result of a chunk recorded by `save_chunk`: its arrays made again from its token
        ids and sequence spans (the costly part, markup to tokens to pairs, is not redone)."""
        stats, token_ids, spans, group_sizes, np_rng = load_chunk(path)
        return stats, (None if spans is None else self._arrays(set_name, token_ids, spans, np_rng)), group_sizes

    def _arrays(self, set_name, token_ids, spans, np_rng):
        s = self.settings
        if s.fmt == "nvidia":
            # The validation set keeps its own (the original's 15%) rate, so runs whose training
            # data is masked differently still validate on the same task.
            masking = s if set_name == TRAIN else replace(s, masked_lm_prob=s.validation_masked_lm_prob)
            return nvidia_arrays(token_ids, spans, masking, np_rng)
        return bing_arrays(token_ids, spans, s, self.vocab_bytes)

    def sentences(self, documents):
        """The documents as lists of sentences, those under --min_document_words left out."""
        documents = [document_sentences(doc, self.splitter) for doc in documents]
        least = self.settings.min_document_words
        if not least:
            return documents, 0
        kept = [doc for doc in documents if sum(len(line.split()) for line in doc) >= least]
        return kept, len(documents) - len(kept)

    def __call__(self, set_name, chunk_index, documents, num_shards, path=None):
        """(stats, arrays or None, sequences per shard group) of a chunk; recorded at `path` if given."""
        s = self.settings
        documents, too_short = self.sentences(documents)
        token_ids, per_line = self.words.encode_documents(documents)
        stats = SetStats(unk_tokens=int(np.count_nonzero(token_ids == s.unk_id)),
                         tokens=len(token_ids), too_short=too_short)
        # Documents as (first token, sentence lengths); sentences without tokens are dropped.
        docs, line, start = [], 0, 0
        for doc in documents:
            lens = per_line[line:line + len(doc)]
            line += len(doc)
            kept = lens[lens > 0].tolist()
            if kept:
                docs.append((start, kept))
                stats.documents += 1
                stats.sentences += len(kept)
            start += int(lens.sum())
        # Every (seed, set, chunk) has its own random streams, whichever worker runs it.
        seq = np.random.SeedSequence([s.seed, 0 if set_name == TRAIN else 1, chunk_index])
        py_seed, np_seed = seq.spawn(2)
        py_rng = random.Random(int.from_bytes(py_seed.generate_state(4).tobytes(), "little"))
        np_rng = np.random.default_rng(np_seed)
        if not docs:
            if path:
                save_chunk(path, stats, token_ids, None, [], np_rng)
            return stats, None, []
        spans = create_instance_spans(docs, s, py_rng)
        n = len(spans[0])
        # BERT shuffles its instances; then group them by shard (see ShardSet.add).
        residue = np.arange(n) % num_shards
        perm = np_rng.permutation(n)[np.argsort(residue, kind="stable")]
        spans = tuple(x[perm] for x in spans)
        stats.sequences = n
        group_sizes = np.bincount(residue, minlength=num_shards).tolist()
        if path:
            save_chunk(path, stats, token_ids, spans, group_sizes, np_rng)
        return stats, self._arrays(set_name, token_ids, spans, np_rng), group_sizes


def save_chunk(path, stats, token_ids, spans, group_sizes, np_rng):
    """Record a chunk in the resume journal: its counts, token ids, sequence spans and the state
    of the generator that masks them, about the size of its text (the arrays would be ~10x).
    Written under another name and renamed into place, so a file there is complete."""
    tmp = f"{path}.tmp{os.getpid()}.npz"
    counts = np.array([getattr(stats, k) for k in SetStats.COUNTS], dtype=np.int64)
    rng_state = np.frombuffer(json.dumps(np_rng.bit_generator.state).encode(), dtype=np.uint8)
    extra = {} if spans is None else dict(zip(("a_start", "a_len", "b_start", "b_len"),
                                              (x.astype(np.int32) for x in spans[:4])), is_random=spans[4])
    np.savez(tmp, counts=counts, group_sizes=np.array(group_sizes, dtype=np.int64), tokens=token_ids,
             rng=rng_state, **extra)
    os.replace(tmp, path)


def load_chunk(path):
    """(SetStats, token ids, spans or None, group sizes, masking generator) of a recorded chunk."""
    with np.load(path) as f:
        stats = SetStats(**dict(zip(SetStats.COUNTS, f["counts"].tolist())))
        spans = None
        if "a_start" in f.files:
            spans = tuple(f[k].astype(np.int64) for k in ("a_start", "a_len", "b_start", "b_len")) + (f["is_random"],)
        np_rng = np.random.default_rng()
        np_rng.bit_generator.state = json.loads(f["rng"].tobytes())
        return stats, f["tokens"], spans, f["group_sizes"].tolist(), np_rng


def how_it_ended(exitcode):
    """A child process's end as the error lines say it: "killed by SIGKILL", "exit code 3"."""
    return f"killed by {signal.Signals(-exitcode).name}" if exitcode and exitcode < 0 else f"exit code {exitcode}"


def worker_context(inherited):
    """(context, descriptors a worker closes): forked workers where the platform can (they inherit
    the set-up: no re-import, and the descriptors `inherited`), else spawned ones (which inherit no
    descriptor, so they close none)."""
    fork = "fork" in multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if fork else "spawn"), tuple(inherited) if fork else ()


def end_with_parent(parent, inherited=()):
    """In a worker process (forked): let go of the descriptors `inherited` that only the main
    process may hold (the journal's lock: a worker holding it keeps the lock after the main process
    is gone), leave SIGINT/SIGTERM to the main process, and end when the main process `parent`
    ends, however it ends (SIGKILL too): the kernel's parent-death signal on Linux, and everywhere
    a thread that sees the parent change (an orphan is adopted by another process)."""
    for fd in inherited:
        os.close(fd)
    # A forked worker inherits the main process's handler, which only records a stop: a pool's
    # terminate() (SIGTERM) would then never end it, and the pool would wait for it forever. The
    # main process stops the workers and removes its temporary folder.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watch", daemon=True).start()


def _watch_parent(parent):
    while os.getppid() == parent:   # checked first at once: the parent may have ended before the prctl
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)


def _worker_main(tasks, results, settings, tokenizer, tokens_by_id, parent, inherited):
    """A pool worker: runs the tasks from `tasks` (a queue; None ends; see ChunkProcessor.run) and
    sends their results on `results` (a pipe), in order, as (True, result) or (False, exception);
    it ends with the main process `parent` (see end_with_parent)."""
    end_with_parent(parent, inherited)
    processor = ChunkProcessor(settings, tokenizer, tokens_by_id)
    for task in iter(tasks.get, None):
        try:
            outcome = (True, processor.run(*task))
        except Exception as e:  # noqa: BLE001 - re-raised in the main process
            outcome = (False, e)
        send_result(results.fileno(), outcome)


def send_result(fd, obj):
    """Write `obj` to the pipe `fd` for receive_result: its arrays' bytes as they lie in memory
    (pickle's out-of-band buffers), the rest pickled; no copy of the arrays is made on either side
    but the pipe's own (a chunk's arrays are ~10x its text: multiprocessing's Connection copied
    them three times more in the main process)."""
    buffers = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    meta = pickle.dumps((head, [v.nbytes for v in views]), protocol=5)
    _write_all(fd, struct.pack("<Q", len(meta)) + meta)
    for view in views:
        _write_all(fd, view)


def receive_result(fd):
    """What send_result wrote to the pipe `fd`; EOFError where the writer ended first."""
    (size,) = struct.unpack("<Q", _read_exact(fd, 8))
    head, sizes = pickle.loads(_read_exact(fd, size))
    return pickle.loads(head, buffers=[_read_exact(fd, n) for n in sizes])


def _widen_pipe(fd, size=1 << 20):
    """Let the pipe hold `size` bytes (Linux: F_SETPIPE_SZ, at most /proc/sys/fs/pipe-max-size),
    so a chunk's arrays cross it in ~16x fewer reads and writes than through the default 64 KB;
    elsewhere, or where refused, the pipe stays as it is (the same bytes cross it either way)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    except (AttributeError, OSError):
        pass


def _write_all(fd, data):
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd, n):
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        read = os.readv(fd, [view[got:]])
        if not read:
            raise EOFError(f"the pipe ended after {got} of {n} bytes")
        got += read
    return buffer


class WorkerPool:
    """--workers processes, each holding a ChunkProcessor (forked where possible: no re-import).

    A task goes to the worker with the fewest tasks outstanding, and each worker answers on a
    pipe of its own in the order of its tasks, so every result is known by its ticket (what
    submit returns) whichever worker ran it. The pipe's only writer is its worker: a worker
    that dies (the out-of-memory killer, a signal), even in the middle of sending, is seen at once
    and the wait ends in a PrepareDataError naming it and how it ended, where a multiprocessing.Pool
    waits for its lost task forever. The other way round, the workers end with the main process
    (end_with_parent): a SIGKILLed run leaves none behind.
    """

    def __init__(self, workers, settings, tokenizer, tokens_by_id, inherited=()):
        """`inherited`: descriptors of the main process that a worker closes (the journal's lock)."""
        ctx, inherited = worker_context(inherited)
        # The workers are the parallelism: each one's tokenizer stays single-threaded (this also
        # keeps `tokenizers` quiet about forking after the vocab trainer used its thread pool).
        saved = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        self.workers = []            # (process, task queue, result pipe)
        try:
            for _ in range(workers):
                tasks = ctx.Queue()
                results, results_end = ctx.Pipe(duplex=False)
                _widen_pipe(results.fileno())
                process = ctx.Process(target=_worker_main, daemon=True,
                                      args=(tasks, results_end, settings, tokenizer, tokens_by_id, os.getpid(),
                                            inherited))
                process.start()
                results_end.close()  # the worker holds the only writing end
                self.workers.append((process, tasks, results))
        finally:
            if saved is None:
                del os.environ["TOKENIZERS_PARALLELISM"]
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = saved
        self.outstanding = [collections.deque() for _ in self.workers]   # each worker's tickets, in order
        self.done = {}               # ticket -> (ok, value), received but not yet taken
        self.submitted = 0
        self.deflates = None         # the _DeflateBatch being filled
        self.check_stop = lambda: None
        # What _receive waits on, registered once (multiprocessing.connection.wait makes a selector a call).
        self.selector = selectors.DefaultSelector()
        for i, (process, _, results) in enumerate(self.workers):
            self.selector.register(results.fileno(), selectors.EVENT_READ, i)
            self.selector.register(process.sentinel, selectors.EVENT_READ, None)

    def submit(self, *task):
        """Queue a task (ChunkProcessor.run's arguments; never blocks: the queue has a feeder
        thread); returns its ticket for result()."""
        i = min(range(len(self.workers)), key=lambda w: len(self.outstanding[w]))
        ticket = self.submitted
        self.workers[i][1].put(task)
        self.outstanding[i].append(ticket)
        self.submitted += 1
        return ticket

    def deflate(self, block, level):
        """A Future-like of zlib.compress(block, level) done by a worker (what Hdf5ShardWriter takes).
        Blocks go to the workers DEFLATE_BATCH at a time (one task, one answer: a task's round trip
        costs the main process more than the copy of a block), a batch sooner where one of its
        results is asked for."""
        batch = self.deflates
        if batch is None or batch.level != level:
            self.flush_deflates()
            batch = self.deflates = _DeflateBatch(level)
        batch.blocks.append(np.ascontiguousarray(block))
        future = _Deflated(self, batch, len(batch.blocks) - 1)
        if len(batch.blocks) >= DEFLATE_BATCH:
            self.flush_deflates()
        return future

    def flush_deflates(self):
        """Submit the blocks waiting for a batch."""
        batch, self.deflates = self.deflates, None
        if batch is not None and batch.blocks:
            batch.ticket = self.submit("deflate", batch.blocks, batch.level)
            batch.blocks = None

    def result(self, ticket, check_stop=None):
        """The result of task `ticket` (its exception raised); `check_stop()` runs every 0.2 s."""
        while ticket not in self.done:
            self._receive(0.2)
            (check_stop or self.check_stop)()
        ok, value = self.done.pop(ticket)
        if not ok:
            raise value
        return value

    def ready(self, ticket):
        """Whether task `ticket`'s result is in (without waiting)."""
        if ticket not in self.done:
            self._receive(0)
        return ticket in self.done

    def _receive(self, timeout):
        """Take in every result ready within `timeout` seconds; a dead worker raises."""
        ready = [key.data for key, _ in self.selector.select(timeout)]
        for i in sorted(i for i in ready if i is not None):
            if self.outstanding[i]:
                try:
                    outcome = receive_result(self.workers[i][2].fileno())
                except (EOFError, OSError):   # the worker died while sending
                    raise PrepareDataError(self._how_workers_ended()) from None
                self.done[self.outstanding[i].popleft()] = outcome
        if None in ready:   # a sentinel: a worker ends only once closed
            raise PrepareDataError(self._how_workers_ended())

    def _how_workers_ended(self):
        ended = []
        dead = multiprocessing.connection.wait([p.sentinel for p, _, _ in self.workers], timeout=1)
        for p, _, _ in self.workers:
            if p.sentinel in dead:
                p.join()
                ended.append(f"worker process {p.pid} {how_it_ended(p.exitcode)}")
        return (f"--workers: {', '.join(ended) or 'a worker process ended'} while preparing the shards "
                "(SIGKILL is what the out-of-memory killer sends: lower --workers or --chunk_size_mb); "
                "no shard was written (the finished chunks are kept: the same command continues from them)")

    def close(self):
        """Let the workers finish and exit (after the last result)."""
        for _, tasks, _ in self.workers:
            tasks.put(None)
        self._release()

    def terminate(self):
        """Stop the workers now (an error or a signal in the main process). SIGKILL: they write
        nothing, and one forked a moment ago may still have this process's SIGTERM handler."""
        for process, tasks, _ in self.workers:
            process.kill()
            tasks.cancel_join_thread()   # what is still queued for a dead worker is dropped
        self._release()

    def _release(self):
        self.selector.close()
        for process, tasks, results in self.workers:
            process.join()
            tasks.close()
            results.close()


class _DeflateBatch:
    """Blocks deflated by one task: waiting (blocks), then submitted (ticket), then answered (results)."""

    def __init__(self, level):
        self.level, self.blocks, self.ticket, self.results = level, [], None, None


class _Deflated:
    """A block's deflated bytes, as the part of a concurrent.futures.Future that Hdf5ShardWriter uses."""

    def __init__(self, pool, batch, index):
        self.pool, self.batch, self.index = pool, batch, index

    def done(self):
        batch = self.batch
        return batch.results is not None or (batch.ticket is not None and self.pool.ready(batch.ticket))

    def result(self):
        batch = self.batch
        if batch.results is None:
            if batch.ticket is None:
                self.pool.flush_deflates()
            batch.results = self.pool.result(batch.ticket)
        return batch.results[self.index]


def ordered_results(chunks, pool, workers, total_bytes, check_stop):
    """Process chunks in order on `pool`: yields (set name, result, input bytes, reused), with a
    progress bar on a terminal and a plain progress line every PROGRESS_SECONDS otherwise.

    Each chunk is recorded in the journal at its path; one recorded by an unfinished run is
    rebuilt from there (reused) instead. At most 2 chunks per worker are in flight, so memory
    stays bounded. `check_stop()` runs before each chunk and while waiting for a worker (it
    raises to stop).
    """
    in_flight = collections.deque()
    sequences = 0
    progress = _ProgressLines(total_bytes)
    with tqdm(total=total_bytes, unit="B", unit_scale=True, desc="prepare_data", disable=None,
              leave=False) as bar:
        def emit(name, ticket, nbytes, reused):
            nonlocal sequences
            result = pool.result(ticket, check_stop)
            sequences += result[0].sequences
            bar.update(nbytes)
            bar.set_postfix(sequences=sequences, refresh=False)
            if bar.disable:
                progress.update(nbytes, sequences)
            return name, result, nbytes, reused

        for *task, nbytes in chunks:
            name, path = task[0], task[-1]
            check_stop()
            reused = os.path.exists(path)
            task = ("rebuild", name, path) if reused else ("chunk", *task)
            in_flight.append((name, pool.submit(*task), nbytes, reused))
            if len(in_flight) >= 2 * workers:
                yield emit(*in_flight.popleft())
        while in_flight:
            yield emit(*in_flight.popleft())


class _ProgressLines:
    """Progress as log lines (for a log file, where a bar would be noise): input read, speed, ETA."""

    def __init__(self, total_bytes):
        self.total, self.done = total_bytes, 0
        self.start = self.last = time.perf_counter()

    def update(self, nbytes, sequences):
        self.done += nbytes
        now = time.perf_counter()
        if now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        rate = self.done / max(now - self.start, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 and self.total >= self.done else float("nan")
        logger.info("progress: %.1f of %.1f MB of input (%.0f%%), %.2f MB/s, %d sequences, about %.0f s left",
                    self.done / 1e6, self.total / 1e6, 100 * self.done / max(self.total, 1), rate / 1e6,
                    sequences, left)

"""Resuming: OUT/.prepare_data.work holds a run's finished chunks (tools/prep/workers.py's
save_chunk), its fingerprint (the flags the shards depend on, the inputs, the vocab) and its lock,
until the run ends; the same command after a kill, a crash or a signal continues from them."""
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket

from tools.prep import PrepareDataError

logger = logging.getLogger(__name__)

WORK_DIR = ".prepare_data.work"       # OUT/WORK_DIR[.partKofN]: finished chunks, kept until the run ends


# The flags whose values the shards depend on (--workers, --stage_workers, --overwrite and --debug change nothing).
OUTPUT_FLAGS = ("input_format", "text_field", "hf_split", "hf_config", "skip_bad_records", "format", "bing_layout",
                "build_vocab", "vocab_sample_mb", "do_lower_case", "max_seq_length", "max_predictions_per_seq",
                "masked_lm_prob", "validation_masked_lm_prob", "short_seq_prob", "dupe_factor", "num_shards",
                "validation_fraction", "seed", "chunk_size_mb", "prefix", "min_document_words", "keep_duplicates",
                "num_parts", "part", "near_dedup", "near_dedup_bands", "near_dedup_rows", "decontaminate",
                "decontaminate_ngram", "decontaminate_min_words", "decontaminate_action", "languages",
                "quality_filter", "quality_threshold")


def run_fingerprint(args, sources, evaluation_files=()):
    """What the finished chunks of a run depend on: the flags, the inputs (path, size, modification
    time), the vocab's content and that of the evaluation sets (--decontaminate's files)."""
    vocab = _sha256([args.vocab_file]) if args.vocab_file is not None else None
    inputs = []
    for source in sources:
        stamp = 0 if source.name else _modified(source.path)
        inputs.append([source.path if source.name else os.path.abspath(source.path), source.size, stamp])
    fingerprint = {"flags": {k: getattr(args, k) for k in OUTPUT_FLAGS}, "inputs": inputs, "vocab_sha256": vocab}
    if evaluation_files:
        fingerprint["evaluation_sha256"] = _sha256(evaluation_files)
    return fingerprint


def _sha256(paths):
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _modified(path):
    if os.path.isdir(path):
        return max((os.stat(os.path.join(root, n)).st_mtime_ns for root, _, names in os.walk(path) for n in names),
                   default=0)
    return os.stat(path).st_mtime_ns


class Journal:
    """OUT/.prepare_data.work (.partKofN with --num_parts): a run's finished chunks, one .npz file
    each (complete once renamed into place), its fingerprint, a built vocab, the temporary folder.

    It outlives a run that did not finish (a signal, SIGKILL, a crash), so that the same command
    continues from the chunks done; a run that finishes removes it. One run at a time holds it
    (an flock, which the operating system drops however the holder ends; the workers close their
    copy of its descriptor). The lock file names the holder ("PID HOST"): a lock still held although
    its holder on this host is gone (by a process that inherited the descriptor) is taken over.
    """

    def __init__(self, out, part_suffix=""):
        self.folder = os.path.join(out, WORK_DIR + part_suffix)
        self.chunks = os.path.join(self.folder, "chunks")
        self.tmp = os.path.join(self.folder, "tmp")
        self.vocab = os.path.join(self.folder, "vocab.txt")
        self.near_dedup = os.path.join(self.folder, "near_dedup")   # the signature pass's files
        self._lock = None

    def previous(self):
        """The fingerprint an unfinished earlier run left, or None."""
        try:
            with open(os.path.join(self.folder, "run.json"), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def open(self, fingerprint, overwrite):
        """Lock the journal and start or continue it; returns the number of chunks already done."""
        os.makedirs(self.folder, exist_ok=True)
        self._lock = self._take_lock(os.path.join(self.folder, "lock"))
        previous = self.previous()
        if previous is not None and previous != fingerprint:
            if not overwrite:
                raise PrepareDataError(f"--output_dir: {self.folder} holds the unfinished work of a run with "
                                       f"{_difference(previous, fingerprint)}; run that command again to finish it, "
                                       "or add --overwrite to start this one afresh")
            logger.warning("--overwrite: dropping the unfinished work of a run with %s",
                           _difference(previous, fingerprint))
        if previous != fingerprint:
            shutil.rmtree(self.chunks, ignore_errors=True)
            shutil.rmtree(self.near_dedup, ignore_errors=True)
            if os.path.exists(self.vocab):
                os.remove(self.vocab)
            tmp = os.path.join(self.folder, "run.json.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(fingerprint, f)
            os.replace(tmp, os.path.join(self.folder, "run.json"))
        shutil.rmtree(self.tmp, ignore_errors=True)
        os.makedirs(self.tmp)
        os.makedirs(self.chunks, exist_ok=True)
        self._remove_partial_chunks()  # of a run killed with its workers
        return len(self.done_chunks())

    def _take_lock(self, path):
        """The lock file, locked, naming this run; a live holder's lock is refused."""
        for _ in range(3):
            f = open(path, "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.seek(0)
                holder = f.read().strip()
                pid, _, host = holder.partition(" ")
                if not (pid.isdigit() and host == socket.gethostname() and not _running(int(pid))):
                    f.close()
                    raise PrepareDataError(f"{self.folder}: another prepare_data run (pid {pid or '?'}"
                                           f"{' on ' + host if host else ''}) is writing there; wait for it to "
                                           "end") from None
                logger.warning("%s: its lock names prepare_data run pid %s on %s, which is no longer running "
                               "(a process it started still holds the lock); taking it over", self.folder, pid, host)
                if _same_inode(f, path):
                    os.remove(path)   # the orphan keeps its lock on a file no run opens again
                f.close()
                continue
            if _same_inode(f, path):  # not replaced meanwhile by another run taking the lock over
                f.seek(0)
                f.truncate()
                f.write(f"{os.getpid()} {socket.gethostname()}")
                f.flush()
                return f
            f.close()
        raise PrepareDataError(f"{self.folder}: could not lock {path}: other runs keep replacing it")

    def descriptors(self):
        """What a worker process must not hold: the lock's descriptor (a forked worker has it)."""
        return (self._lock.fileno(),) if self._lock is not None else ()

    def done_chunks(self):
        return [n for n in os.listdir(self.chunks) if n.endswith(".npz") and ".tmp" not in n] \
            if os.path.isdir(self.chunks) else []

    def _remove_partial_chunks(self):
        """A worker stopped while writing a chunk leaves its temporary file (save_chunk): never a chunk
        (nor a signature file, written the same way)."""
        for folder in (self.chunks, self.near_dedup):
            for name in os.listdir(folder) if os.path.isdir(folder) else ():
                if ".tmp" in name:
                    os.remove(os.path.join(folder, name))

    def _work_held(self, stopped):
        """What the journal holds that the same command would otherwise do again, in words (none: []):
        finished chunks and a signature pass under way; after a stop also a finished signature pass
        and a trained vocab. With chunks or a signature pass under way, the vocab stays with them."""
        chunks = len(self.done_chunks())
        names = os.listdir(self.near_dedup) if os.path.isdir(self.near_dedup) else []
        signed, vocab = "removed.npy" in names, os.path.isfile(self.vocab)
        if not (chunks or (names and not signed) or (stopped and (names or vocab))):
            return []
        held = [f"{chunks} finished chunk{'s' if chunks > 1 else ''}"] if chunks else []
        if names:
            held.append("the near-duplicate signature pass" + ("" if signed else "'s finished blocks"))
        if vocab:
            held.append("the trained vocab")
        return held

    def chunk_path(self, set_name, index):
        return os.path.join(self.chunks, f"{set_name}_{index:07d}.npz")

    def close(self, finished, stopped=False):
        """Release the lock; remove everything once the run finished, else keep what the next run
        would otherwise redo: finished chunks and a signature pass under way, and, when a signal
        `stopped` the run (the same command is what continues it), also a finished signature pass and
        a trained vocab, so that a stop between them and the first chunk loses neither. After an
        error a journal of those alone is removed: the next command is often another one (the input
        or a setting put right), which a kept journal would make ask for --overwrite. (A SIGKILL
        keeps everything: nothing runs.) Returns what was kept, in words (_work_held)."""
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._remove_partial_chunks()  # the workers have ended: a temporary file left is a dead worker's
        kept = [] if finished else self._work_held(stopped)
        if not kept:
            shutil.rmtree(self.folder, ignore_errors=True)
        self._release()
        return kept

    def _release(self):
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process
        return True
    return True


def _same_inode(f, path):
    try:
        return os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
        return False


def _difference(previous, now):
    """What differs between two fingerprints, in words."""
    flags_then, flags_now = previous.get("flags", {}), now["flags"]
    for key in OUTPUT_FLAGS:
        if flags_then.get(key) != flags_now.get(key):
            return f"other settings (--{key} {flags_then.get(key)} then, {flags_now.get(key)} now)"
    if previous.get("vocab_sha256") != now["vocab_sha256"]:
        return "another vocab (--vocab_file's content changed)"
    if previous.get("evaluation_sha256") != now.get("evaluation_sha256"):
        return "other evaluation sets (--decontaminate's files changed)"
    then = {p: (size, stamp) for p, size, stamp in previous.get("inputs", [])}
    for path, size, stamp in now["inputs"]:
        if then.get(path) != (size, stamp):
            return f"another input ({path} {'changed' if path in then else 'was not an input'})"
    return "other inputs (a file is no longer an input)"

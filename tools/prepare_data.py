"""Raw text to pretraining shards: NVIDIA hdf5 or Bing numpy (docs/DESIGN.md, Data formats).

Owns the data preparation pipeline, importable (`prepare(args)`) and a command line:

    python -m tools.prepare_data --input corpus.txt --output_dir OUT --format nvidia \
        --build_vocab 8000 --max_seq_length 128 --num_shards 2 --validation_fraction 0.05

Input: the layouts of tools/corpora.py, told apart by name and content (--input_format to say):
text files (or folders of .txt files), one sentence per line, a blank line between documents,
the format Google's and NVIDIA's BERT tools read; one document per line (text_docs); MediaWiki
XML dumps; WikiExtractor output; JSON lines; parquet; Hugging Face datasets. All but the first
are split into sentences in the workers. The text must be UTF-8: a file with other bytes
(Latin-1, say) is refused naming its line, and a binary file (a NUL byte) is refused, rather
than decoded with losses. A document longer than --chunk_size_mb (text without blank lines is
one document) is cut into pieces of that size, with a warning and counts. Exact duplicates (the
same text up to case and whitespace) are read once; documents under --min_document_words are
dropped; both are counted in OUT/stats.json.

Output folder:
    OUT/vocab.txt                          the vocab the shards were made with
    OUT/train/                             the training set
        {prefix}_training_shard{i}.hdf5    --format nvidia (prefix: OUT's name)
        shard_{i:03d}/                     --format bing
    OUT/validation/                        the same for --validation_fraction > 0
        {prefix}_test_shard{i}.hdf5 | shard_{i:03d}/
    OUT/documents.json, OUT/heldout.jsonl, OUT/train_document_keys.npy
                                           which documents were held out (as read) and the training
                                           documents' keys (turing/heldout.py): the split's one record,
                                           which every later stage reads (with parts: one per part)

Pipeline. Documents are read in order and grouped into chunks of about --chunk_size_mb of text
(the training and validation documents separately). Each chunk is one unit of work for a pool
of --workers processes: tokenize (each distinct word once, through `tokenizers`' batch
encoder), cut documents into sequence pairs with BERT's `create_instances_from_document`
algorithm (--dupe_factor passes, random next sentences from another document of the same
chunk), shuffle, and for the NVIDIA format mask statically (vectorised over the chunk). The
main process writes the results in chunk order, dealing sequences round-robin over the
shards (hdf5 chunks are deflated by a few threads meanwhile), so shard sizes differ by at
most one, memory does not grow with the corpus, and the output depends only on the input
and --seed, never on --workers (the files are byte-identical). Every file is written
under a temporary folder and renamed into place at the end, so a crash never leaves a
half-written shard under a final name. A worker that dies (the out-of-memory killer) ends the
run at once with an error; SIGTERM/SIGINT stop the workers and remove the temporary folder.
train/ and validation/ end up holding only this run's shards: anything else there is refused.

Resuming. Every finished chunk is kept in OUT/.prepare_data.work (with the settings and a
fingerprint of the input and vocab) until the run ends; the same command after a kill, a
crash or a signal reuses them and writes the shards an uninterrupted run would have written.
Other settings or a changed input are refused, or started afresh with --overwrite. The workers
end with the main process however it ends (SIGKILL too) and never hold the journal's lock; a
lock left held after its run ended is taken over with a warning.

Parts. --num_parts N --part K makes machine K's share: the documents whose hash is K mod N
(duplicates land in the same part), written as shards named by part, so the parts written into
one folder are one dataset for training.

The shards are a function of the input, the vocab and --seed. One caveat: --build_vocab uses
the `tokenizers` WordPiece trainer, which breaks ties between equally frequent merges in
hash order, so two trainings on the same text may differ in a few dozen of 8,000 entries;
for bit-identical data, build the vocab once and pass it with --vocab_file.

Bing shards hold unmasked token strings of segments A and B (the reader adds [CLS]/[SEP] and
masks at load time); is_next.npy is 1 when B is a random sentence (the Bing format's meaning, the same
as NVIDIA's next_sentence_labels), 0 when B really follows A.
"""
import argparse
import array
import collections
import ctypes
import fcntl
import filecmp
import functools
import hashlib
import heapq
import itertools
import json
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import random
import re
import resource
import shutil
import signal
import socket
import sys
import threading
import time
import unicodedata
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import h5py
import numpy as np
import numpy.random  # noqa: F401  (numpy loads it lazily: load it once here, not in every worker)
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from tqdm import tqdm

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from tools import corpora
from turing import heldout
from turing.formats import BING_SEPARATOR, HDF5_DTYPES, HDF5_KEYS
from turing.signals import StopRequested, StopSignals
from turing.tokenization import SPECIAL_TOKENS, build_fast_tokenizer, load_vocab, special_token_ids, vocab_size

logger = logging.getLogger(__name__)

TRAIN, VALIDATION = "train", "validation"
SHARD_NAME = re.compile(r"^(part\d+_)?shard_\d+$|_(training|test)_shard\d+\.hdf5$")
# A shard's part tag where it stands: first in a Bing shard's name, right before "training"/"test"
# in an NVIDIA one (never inside the prefix, which may hold "_part001_" itself: OUT's name).
SHARD_PART = re.compile(r"^(part\d+_)shard_\d+$|_(part\d+_)(?:training|test)_shard\d+\.hdf5$")
WORK_DIR = ".prepare_data.work"       # OUT/WORK_DIR[.partKofN]: finished chunks, kept until the run ends
PROGRESS_SECONDS = 30                 # a plain progress line this often when stderr is not a terminal
PARENT_POLL_SECONDS = 1               # a worker checks this often that the main process still runs
PR_SET_PDEATHSIG = 1                  # <linux/prctl.h>: a signal the kernel sends when the parent ends
HDF5_CHUNK_BYTES = 1 << 18            # ~256 KB per hdf5 chunk: good gzip ratio, small reads
HDF5_GZIP_LEVEL = 4                   # h5py's (and so NVIDIA's) compression="gzip" level

# Whitespace to Python's str.split() that BERT's tokenizer deletes as control characters
# (category C), e.g. form feed: removed before splitting words so both agree.
_CONTROL_SPACES = "".join(c for c in map(chr, range(0x3001))
                          if c.isspace() and unicodedata.category(c).startswith("C")
                          and c not in "\t\n\r")
_DROP_CONTROL_SPACES = str.maketrans("", "", _CONTROL_SPACES)
_CONTROL_SPACES_RE = re.compile(f"[{_CONTROL_SPACES}]")


class PrepareDataError(ValueError):
    """Bad input or settings; the message names the file or flag and what was expected."""


class InputNotFoundError(PrepareDataError, FileNotFoundError):
    """An input path, or the vocab file, does not exist."""


# ----------------------------------------------------------------------------- settings

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
    splitter: str = corpora.SPLITTER


@dataclass
class SetStats:
    """Counts for one of the two sets (training, validation)."""
    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    unk_tokens: int = 0
    sequences: int = 0
    too_short: int = 0              # documents under --min_document_words, dropped
    shard_sizes: list = field(default_factory=list)

    COUNTS = ("documents", "sentences", "tokens", "unk_tokens", "sequences", "too_short")


@dataclass
class Summary:
    """What `prepare` did; printed at the end of the command line."""
    output_dir: str
    fmt: str
    input_bytes: int = 0
    seconds: float = 0.0            # reading, tokenizing, building and writing the shards
    setup_seconds: float = 0.0      # vocab training and tokenizer set-up before that
    peak_mb: float = 0.0            # peak resident memory of the main process
    peak_worker_mb: float = 0.0     # and of the largest pool worker (0: no pool)
    sets: dict = field(default_factory=dict)
    read: dict = field(default_factory=dict)     # documents read, duplicates, other parts, bad records, ...
    reused_chunks: int = 0          # chunks an interrupted run had finished, reused
    reused_bytes: int = 0           # and the input bytes they cover
    part: str = ""                  # "K of N" with --num_parts

    def stats(self):
        """What OUT/stats.json holds."""
        sets = {name: {k: getattr(s, k) for k in SetStats.COUNTS} | {"shard_sizes": s.shard_sizes}
                for name, s in self.sets.items()}
        tokens = sum(s.tokens for s in self.sets.values())
        unk = sum(s.unk_tokens for s in self.sets.values())
        kept = sum(s.documents for s in self.sets.values())
        return {"output_dir": self.output_dir, "format": self.fmt, "part": self.part or None,
                "input_bytes": self.input_bytes, **self.read, "documents_kept": kept,
                "too_short": sum(s.too_short for s in self.sets.values()),
                "sentences": sum(s.sentences for s in self.sets.values()), "tokens": tokens,
                "unk_tokens": unk, "unk_rate": unk / max(tokens, 1), "sequences": self.sequences,
                "sets": sets, "seconds": round(self.seconds, 3), "setup_seconds": round(self.setup_seconds, 3),
                "mb_per_s": self.input_bytes / 1e6 / max(self.seconds, 1e-9),
                "reused_chunks": self.reused_chunks, "reused_input_bytes": self.reused_bytes,
                "peak_mb": round(self.peak_mb, 1), "peak_worker_mb": round(self.peak_worker_mb, 1)}

    @property
    def sequences(self):
        return sum(s.sequences for s in self.sets.values())

    def lines(self):
        part = f" (part {self.part})" if self.part else ""
        out = [f"prepared {self.fmt} shards in {self.output_dir}{part} from {self.input_bytes / 1e6:.2f} MB of input"]
        r = self.read
        if r:
            too_short = sum(s.too_short for s in self.sets.values())
            extra = [f"{r['duplicates']} exact duplicates", f"{too_short} under --min_document_words"]
            extra += [f"{r[k]} {what}" for k, what in (("bad_records", "bad records skipped"),
                                                        ("redirects", "redirects"),
                                                        ("other_pages", "non-article pages"),
                                                        ("other_parts", "in other parts")) if r.get(k)]
            out.append(f"  input: {r['documents_read']} documents read ({', '.join(r['layouts'])}), "
                       f"{', '.join(extra)} left out")
        for name, s in self.sets.items():
            unk = s.unk_tokens / max(s.tokens, 1)
            sizes = s.shard_sizes
            per_shard = (", ".join(map(str, sizes)) if len(sizes) <= 8 else  # all of them are in stats.json
                         f"{min(sizes)} to {max(sizes)} over {len(sizes)} shards (each in stats.json)")
            out.append(f"  {name}: {s.documents} documents, {s.sentences} sentences, {s.tokens} tokens "
                       f"({unk:.2%} [UNK]), {s.sequences} sequences; per shard: {per_shard}")
        rate = self.sequences / max(self.seconds, 1e-9)
        mb_s = self.input_bytes / 1e6 / max(self.seconds, 1e-9)
        out.append(f"  time: {self.seconds:.2f} s ({rate:,.0f} sequences/s, {mb_s:.2f} MB/s of input) after "
                   f"{self.setup_seconds:.2f} s of vocab/tokenizer set-up")
        if self.reused_chunks:
            out.append(f"  reused {self.reused_chunks} chunks ({self.reused_bytes / 1e6:.2f} MB of input) "
                       "an interrupted run had finished")
        out.append(f"  peak memory: {self.peak_mb:.0f} MB (largest worker {self.peak_worker_mb:.0f} MB)"
                   if self.peak_worker_mb else f"  peak memory: {self.peak_mb:.0f} MB")
        return out


# ----------------------------------------------------------------------------- input

def list_input_files(paths, exclude=None):
    """The input files in order: each file as given, each folder's .txt files sorted (recursive).

    Files under the folder `exclude` (the output folder, whose vocab.txt is no input) are skipped.
    A binary file (a NUL byte in its first 64 KB, decompressed: .gz, .bz2, .xz, .zst are read) is refused.
    """
    files = []
    skip = os.path.join(os.path.realpath(exclude), "") if exclude else None
    for path in paths:
        if os.path.isfile(path):
            files.append(path)
        elif os.path.isdir(path):
            found = sorted(os.path.join(root, name) for root, _, names in os.walk(path)
                           for name in names if name.endswith(".txt"))
            if skip:
                found = [f for f in found if not os.path.realpath(f).startswith(skip)]
            if not found:
                raise InputNotFoundError(f"--input {path}: folder holds no .txt files")
            files.extend(found)
        else:
            raise InputNotFoundError(f"--input {path}: no such file or folder")
    for path in files:
        head = corpora.read_head(path, 1 << 16)
        if b"\0" in head:
            raise PrepareDataError(f"{path}: binary data (a NUL byte at offset {head.index(0)}), not text; "
                                   "give UTF-8 text files only")
    return files


def decode_line(raw, path, line_number):
    """A line of input as text. Input must be UTF-8: any other bytes are refused by file and
    line (decoding them anyway would silently turn accented letters into [UNK])."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PrepareDataError(f"{path}: line {line_number} is not UTF-8 (byte 0x{raw[e.start]:02x} at column "
                               f"{e.start + 1}); convert the file first, e.g. iconv -f latin1 -t utf-8") from None


def first_non_utf8(files):
    """The PrepareDataError of the first line of `files` that is not UTF-8, or None."""
    for path in files:
        with open(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    decode_line(raw, path, number)
                except PrepareDataError as e:
                    return e
    return None


class DocumentReader:
    """The documents of the input files, in order (iterate over it), and counts of what was read.

    A document is a run of non-blank lines (its sentences), ended by a blank line or the end of
    its file. A document reaching `max_document_bytes` of text is cut there, at a line end, and
    goes on as another one: a worker's memory then stays bounded whatever the input (text with
    no blank lines is one document). Cut documents are warned about when met, and counted.
    """

    def __init__(self, files, max_document_bytes=None):
        self.files, self.max_document_bytes = files, max_document_bytes
        self.documents = 0               # documents read (a cut one counts once)
        self.cut = 0                     # documents cut into pieces
        self.pieces = 0                  # the pieces they became
        self.longest = (0, 0, "")        # (text bytes, lines, file:line) of the longest cut one
        self.long_lines = 0              # lines longer than LONG_LINE_BYTES: no sentence is that long
        self.longest_line = (0, "")      # (bytes, file:line)

    def __iter__(self):
        """Yield (document, bytes read): a list of non-blank lines, and the input consumed since
        the previous yield (for the progress bar); the document may be empty."""
        for path in self.files:
            yield from self.read_file(path)

    def read_file(self, path):
        """The documents of one file (.gz, .bz2, .xz, .zst too), as __iter__ yields them."""
        try:
            yield from self._read_file(path)
        except (EOFError, OSError) as e:
            if not corpora.compression(path):
                raise
            raise corpora.corrupt_data_error(path, self._raw, e) from None

    def _read_file(self, path):
        lines, consumed = [], 0
        size = count = pieces = start = 0       # of the open document: text bytes, lines, cuts, first line
        with corpora.open_stream(path) as (f, self._raw):
            compressed = f is not self._raw
            last = 0
            for number, raw in enumerate(f, start=1):
                if compressed:                  # bytes of the file as stored, for the progress bar
                    position = self._raw.tell()
                    consumed += position - last
                    last = position
                else:
                    consumed += len(raw)
                line = decode_line(raw, path, number).strip()
                if not line:
                    if lines or pieces:
                        self._ended(size, count, pieces + bool(lines), f"{path}:{start}")
                        yield lines, consumed
                        lines, consumed, size, count, pieces = [], 0, 0, 0, 0
                    continue
                if not lines and not pieces:
                    start = number
                if pieces == 1 and not lines:  # a second piece begins
                    logger.warning("%s:%d: a document of more than %.2f MB of text (--chunk_size_mb): cut "
                                   "into pieces of that size. Are blank lines between documents missing?",
                                   path, start, self.max_document_bytes / 2**20)
                if len(line) > LONG_LINE_BYTES:
                    self.long_lines += 1
                    self.longest_line = max(self.longest_line, (len(line), f"{path}:{number}"))
                lines.append(line)
                size += len(line)
                count += 1
                if self.max_document_bytes and size >= (pieces + 1) * self.max_document_bytes:
                    pieces += 1
                    yield lines, consumed
                    lines, consumed = [], 0
        if lines or pieces:
            self._ended(size, count, pieces + bool(lines), f"{path}:{start}")
        if lines or consumed:
            yield lines, consumed

    def _ended(self, size, count, pieces, where):
        self.documents += 1
        if pieces > 1:
            self.cut += 1
            self.pieces += pieces
            self.longest = max(self.longest, (size, count, where))

    def warnings(self):
        """Lines to warn about once everything is read: cut documents, and a single document."""
        out = []
        if self.cut:
            size, count, where = self.longest
            out.append(f"{self.cut} document(s) longer than --chunk_size_mb were cut into {self.pieces} pieces "
                       f"(the longest: {size / 2**20:.1f} MB, {count} lines, from {where}); random next sentences "
                       f"of a piece mostly come from that piece. Separate documents by blank lines.")
        if self.long_lines:
            size, where = self.longest_line
            out.append(f"{self.long_lines} line(s) longer than {LONG_LINE_BYTES // 1024} KB (the longest: "
                       f"{size / 2**20:.1f} MB, {where}): in one-sentence-per-line text each is one sentence, which "
                       f"a sequence cuts to --max_seq_length tokens, dropping the rest. One document per line? "
                       f"--input_format text_docs splits documents into sentences")
        if self.documents == 1:
            out.append("the input is a single document (no blank line between documents): next-sentence "
                       "prediction's random sentences all come from that document")
        return out


LONG_LINE_BYTES = 64 * 1024  # no sentence is longer: a line beyond it is a document (or many) on one line


def input_sources(args):
    """The input sources of `args` (tools/corpora.py), text ones checked for binary data."""
    sources = corpora.find_sources(args.input, args.input_format, exclude=args.output_dir,
                                   options=read_options(args))
    for source in sources:
        if source.layout in ("text", "text_docs") and not corpora.compression(source.path):
            with open(source.path, "rb") as f:
                head = f.read(1 << 16)
            if b"\0" in head:
                raise PrepareDataError(f"{source.path}: binary data (a NUL byte at offset {head.index(0)}), not "
                                       "text; give UTF-8 text files only (or --input_format for another layout)")
    return sources


def read_options(args):
    return corpora.ReadOptions(text_field=args.text_field, hf_split=args.hf_split, hf_config=args.hf_config,
                               skip_bad_records=args.skip_bad_records)


class CorpusReader:
    """The documents of every source in order (iterate: (document, bytes consumed)), the text
    ones through a DocumentReader, and what was met. A document of more than `max_document_bytes`
    of text is cut into pieces of at most that size in every layout, warned about and counted."""

    def __init__(self, sources, options, max_document_bytes=None):
        self.sources, self.options = sources, options
        self.text = DocumentReader([], max_document_bytes)
        self.counts = corpora.ReadCounts()
        self.cut = self.pieces = 0         # records (of the other layouts) cut, and the pieces they became
        self.longest = (0, "")             # (characters, where) of the longest

    def __iter__(self):
        for source in self.sources:
            documents = corpora.read_documents(source, self.options, self.counts, self.text)
            yield from documents if source.layout == "text" else self._cut(source, documents)

    def _cut(self, source, documents):
        limit = self.text.max_document_bytes
        for number, (document, nbytes) in enumerate(documents, start=1):
            if not limit or not document or len(document) <= limit:
                yield document, nbytes
                continue
            where = f"{source.path}, {corpora.RECORDS.get(source.layout, 'record')} {number}"
            logger.warning("%s: a document of %.1f MB of text, more than --chunk_size_mb (%.2f MB): cut into pieces "
                           "of that size", where, len(document) / 2**20, limit / 2**20)
            self.cut += 1
            self.longest = max(self.longest, (len(document), where))
            for piece in corpora.cut_document(document, limit):
                self.pieces += 1
                yield piece, nbytes
                nbytes = 0

    def warnings(self):
        if all(s.layout == "text" for s in self.sources):
            out = self.text.warnings()
        else:                              # of the text files' warnings, the cut one holds for a mix of layouts
            out = self.text.warnings()[:1] if self.text.cut else []
        if self.cut:
            size, where = self.longest
            out.append(f"{self.cut} document(s) longer than --chunk_size_mb were cut into {self.pieces} pieces (the "
                       f"longest: {size / 2**20:.1f} MB, {where}); random next sentences of a piece mostly come from "
                       "that piece")
        return out


class DocumentFilter:
    """Which documents a run keeps: one copy of each (exact duplicates: the same corpora.document_key)
    and, with --num_parts, those of this part (key mod N, so all copies land in one part)."""

    def __init__(self, num_parts=1, part=0, dedup=True):
        self.num_parts, self.part, self.dedup = num_parts, part, dedup
        self.seen = set()              # 64-bit keys: ~70 bytes of memory per document kept
        self.read = self.duplicates = self.other_parts = 0

    def __call__(self, key):
        """Whether to keep the document of corpora.document_key `key`."""
        if self.num_parts > 1 and key % self.num_parts != self.part:
            self.other_parts += 1
            return False
        self.read += 1
        if self.dedup:
            if key in self.seen:
                self.duplicates += 1
                return False
            self.seen.add(key)
        return True


def is_validation_document(index, fraction):
    """Document `index` goes to validation when the running count floor(index*fraction) steps.

    Deterministic and evenly spread; exactly floor(n*fraction) of the first n documents.
    """
    return fraction > 0 and math.floor((index + 1) * fraction) > math.floor(index * fraction)


def iter_chunks(documents, chunk_bytes, validation_fraction, keep=None, record=None):
    """Group documents (a DocumentReader) into chunks of about `chunk_bytes` of text, per set.

    Yields (set name, chunk index within the set, documents, input bytes consumed). The
    grouping depends only on the input, so the output does not depend on --workers. `keep`
    (a DocumentFilter) decides which documents are kept; `record(set name, document number,
    key, document)` (a SplitRecord) is told where each kept one goes.
    """
    pending = {TRAIN: [[], 0, 0], VALIDATION: [[], 0, 0]}   # documents, text bytes, chunk index
    consumed = 0
    index = 0
    for doc, nbytes in documents:
        consumed += nbytes
        if not doc:
            continue
        # the split counts every document read, kept or not: a duplicate left out, or another
        # part's document, moves no other document between the sets (and the probe suite's
        # held-out documents, split by the same rule, stay the validation set's)
        name = VALIDATION if is_validation_document(index, validation_fraction) else TRAIN
        index += 1
        key = corpora.document_key(doc)
        if keep is not None and not keep(key):
            continue
        if record is not None:
            record(name, index - 1, key, doc)
        entry = pending[name]
        entry[0].append(doc)
        entry[1] += corpora.document_size(doc)
        if entry[1] >= chunk_bytes:
            yield name, entry[2], entry[0], consumed
            consumed = 0
            pending[name] = [[], 0, entry[2] + 1]
    for name, (docs, _, chunk_index) in pending.items():
        if docs:
            yield name, chunk_index, docs, consumed
            consumed = 0


class SplitRecord:
    """Which documents went to which set, written beside the shards for every later stage to read
    (turing/heldout.py's files): the held-out documents as read, their sentences split as the
    workers split them, and the training documents' keys. Made in the main process as documents
    are dealt (so a resumed run, which reads its input again, makes it again whole), written in
    the temporary folder and renamed into place with the shards; the shards never depend on it."""

    def __init__(self, tmp, part=None):
        self.tmp = tmp
        self.names = heldout.manifest_names(part)
        self.heldout = open(os.path.join(tmp, self.names[1]), "w", encoding="utf-8")
        self.train_keys = array.array("Q")          # 8 bytes a training document
        self.validation_documents = 0
        self.split = corpora.SentenceSplitter()     # the workers' (loaded only for a layout that needs it)

    def __call__(self, name, number, key, document):
        if name == TRAIN:
            self.train_keys.append(key)
            return
        sentences = corpora.document_sentences(document, self.split)
        self.heldout.write(json.dumps({"document": number, "key": key, "sentences": sentences}) + "\n")
        self.validation_documents += 1

    def finish(self, args, documents_read):
        """Write documents.json and the training keys (the held-out documents are written already)."""
        self.heldout.close()
        documents, heldout_file, keys_file = self.names
        np.save(os.path.join(self.tmp, keys_file), np.sort(np.frombuffer(self.train_keys, dtype=np.uint64)))
        reading = {k: getattr(args, k) for k in ("input_format", "text_field", "hf_split", "hf_config",
                                                  "skip_bad_records", "chunk_size_mb", "keep_duplicates")}
        inputs = [os.path.abspath(p) if os.path.exists(p) else p for p in args.input]
        record = {
            "split": "the documents read are numbered in input order from 0 (every one: kept, a duplicate or "
                     "another part's); document i is held out when floor((i + 1) * validation_fraction) > "
                     "floor(i * validation_fraction)",
            "validation_fraction": args.validation_fraction, "documents_read": documents_read,
            "num_parts": args.num_parts, "part": args.part if args.num_parts > 1 else None,
            "train": {"documents": len(self.train_keys), "keys": keys_file},
            "validation": {"documents": self.validation_documents, "documents_file": heldout_file},
            "key": "tools.corpora.document_key: blake2b (8 bytes, little-endian) of the text case-folded, "
                   "whitespace collapsed",
            "reading": {"input": inputs, **reading},
        }
        with open(os.path.join(self.tmp, documents), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)

    def install(self, out, parts):
        """Rename the files into OUT; a run without parts, which replaced every shard, removes every
        part's record too (a part's own files are replaced by the rename)."""
        if not parts:
            for name in heldout.manifest_files(out):
                if name not in self.names:
                    os.remove(os.path.join(out, name))
        for name in self.names:
            os.replace(os.path.join(self.tmp, name), os.path.join(out, name))

    def close(self):
        self.heldout.close()


@dataclass
class RecordedSplit:
    """The documents of a prepare_data output by its record, in input order, each a list of
    sentences (whitespace runs made one space)."""
    train: list
    heldout: list
    numbers: list          # the held-out documents' numbers in the input (from 0, as the split counts)


def recorded_split(out, inputs=None, flag="--heldout"):
    """The split the prepare_data output `out` recorded (SplitRecord): the held-out documents as
    its record holds them, the training ones read again from its input (`inputs`, default the one
    recorded) the same way and known by their keys; the input must still hold every one of them."""
    manifest = heldout.read_manifest(out, flag)
    held = list(manifest.heldout_documents())
    wanted = set(manifest.train_keys().tolist())
    reading = manifest.parts[0]["reading"]
    inputs = inputs or reading["input"]
    options = corpora.ReadOptions(text_field=reading["text_field"], hf_split=reading["hf_split"],
                                  hf_config=reading["hf_config"], skip_bad_records=reading["skip_bad_records"])
    sources = corpora.find_sources(inputs, reading["input_format"], exclude=out, options=options)
    split = corpora.SentenceSplitter()
    train = {}
    for doc, _ in CorpusReader(sources, options, max_document_bytes=int(reading["chunk_size_mb"] * 2**20)):
        key = corpora.document_key(doc) if doc else None
        if key in wanted and key not in train:
            train[key] = _one_space(corpora.document_sentences(doc, split))
    if len(train) < len(wanted):
        raise PrepareDataError(f"{flag} {out}: its input {' '.join(inputs)} holds {len(train)} of the {len(wanted)} "
                               f"training documents {manifest.paths[0]} lists (by key); give the corpus that "
                               "prepare_data read as --input")
    return RecordedSplit(list(train.values()), [_one_space(d["sentences"]) for d in held],
                         [d["document"] for d in held])


def _one_space(sentences):
    return [" ".join(s.split()) for s in sentences]


# ----------------------------------------------------------------------------- vocab

def train_vocab(files, vocab_size, do_lower_case, path):
    """Train a BERT WordPiece vocab of about `vocab_size` entries on `files`; write it to `path`.

    Special tokens come first ([PAD] = 0, [UNK] = 1, [CLS] = 2, [SEP] = 3, [MASK] = 4).
    """
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    # BERT's normalisation: clean text, split CJK, lower-case and strip accents when asked.
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case, lowercase=do_lower_case)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values()),
                                        continuing_subword_prefix="##", show_progress=False)
    try:
        tokenizer.train(files, trainer)
    except Exception:  # the Rust trainer raises a bare Exception; name the file and line if it is the text
        error = first_non_utf8(files)
        if error is not None:
            raise error from None
        raise
    tokens = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for token, _ in tokens:
            f.write(token + "\n")
    return len(tokens)


def sample_documents(documents, budget, seed):
    """A seeded sample of about `budget` characters of text from a stream of documents, in input
    order, uniform over documents, holding at most the budget (plus a document) at any time: the
    documents of the smallest random keys that fit (a bounded heap), whatever the corpus size."""
    rng = random.Random(seed)
    heap, total = [], 0                # (-key, index, document): the largest key on top
    for index, (doc, _) in enumerate(documents):
        if not doc:
            continue
        key = rng.random()
        if total >= budget and heap and key >= -heap[0][0]:
            continue
        heapq.heappush(heap, (-key, index, doc))
        total += corpora.document_size(doc)
        while total > budget and len(heap) > 1:
            total -= corpora.document_size(heapq.heappop(heap)[2])
    return [doc for _, _, doc in sorted(heap, key=lambda entry: entry[1])]


def _sentences_of(documents, splitter=corpora.SPLITTER):
    split = corpora.SentenceSplitter(splitter)
    return ["\n".join(corpora.document_sentences(doc, split)) for doc in documents]


def _worker_context(inherited):
    """(context, descriptors a worker closes): forked workers where the platform can (they inherit
    the set-up: no re-import, and the descriptors `inherited`), else spawned ones (which inherit no
    descriptor, so they close none)."""
    fork = "fork" in multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if fork else "spawn"), tuple(inherited) if fork else ()


def write_vocab_sample(reader, path, budget, seed, workers, inherited=()):
    """Write the sample `train_vocab` reads for a large or non-text corpus, one sentence per line:
    documents sampled by `sample_documents`, markup removed and split in `workers` processes
    (which close the descriptors `inherited` and end with this process: end_with_parent)."""
    sample = sample_documents(reader, budget, seed)
    batches = [sample[i:i + 64] for i in range(0, len(sample), 64)]
    with open(path, "w", encoding="utf-8") as f:
        if workers > 1 and len(batches) > 1:
            ctx, inherited = _worker_context(inherited)
            with ctx.Pool(workers, end_with_parent, (os.getpid(), inherited)) as pool:
                for texts in pool.imap(_sentences_of, batches):
                    f.writelines(t + "\n\n" for t in texts if t)
        else:
            for batch in batches:
                f.writelines(t + "\n\n" for t in _sentences_of(batch) if t)
    return len(sample), sum(map(corpora.document_size, sample))


def check_vocab(vocab_file, fmt, bing_layout):
    """Load and check a vocab.txt; returns (token -> id dict, special ids)."""
    if not os.path.isfile(vocab_file):
        raise InputNotFoundError(f"--vocab_file {vocab_file}: no such file")
    try:
        vocab = load_vocab(vocab_file)
    except UnicodeDecodeError as e:
        raise PrepareDataError(f"--vocab_file {vocab_file}: not utf-8 text ({e})") from None
    try:
        special = special_token_ids(vocab)
    except ValueError as e:
        raise PrepareDataError(f"--vocab_file {vocab_file}: {e}") from None
    if fmt == "bing" and bing_layout == "separator":
        bad = [t for t in vocab if chr(BING_SEPARATOR) in t]
        if bad:
            raise PrepareDataError(f"--vocab_file {vocab_file}: token {bad[0]!r} holds the separator "
                                   "byte 0x1f; use --bing_layout offsets")
    if len(vocab) < len(SPECIAL_TOKENS) + 1:
        raise PrepareDataError(f"--vocab_file {vocab_file}: only {len(vocab)} entries")
    return vocab, special


# ----------------------------------------------------------------------------- tokenization

class WordCacheTokenizer:
    """Token ids of many lines, tokenizing each distinct whitespace-separated word once.

    BERT's tokenizer splits on whitespace before anything can join characters across it, so
    the ids of a line are the ids of its words concatenated; words repeat a lot (Zipf), so
    encoding only the new distinct ones in one `encode_batch` call is several times faster.
    The cache only memoises (word -> its ids in one growing array), so results never depend
    on what a worker saw before; it is emptied when it holds MAX_CACHED_WORDS.
    """

    MAX_CACHED_WORDS = 1 << 19
    WORDS_PER_TEXT = 256

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._clear()

    def _clear(self):
        self.index = {}                                   # word -> row in start/length
        self.start = np.zeros(0, dtype=np.int64)
        self.length = np.zeros(0, dtype=np.int64)
        self.store = np.zeros(0, dtype=np.int32)          # the ids of all cached words

    def _add(self, words):
        """Tokenize new distinct words and append their ids to the store.

        The words go to the encoder joined by spaces, WORDS_PER_TEXT to a text: far cheaper
        than one text per word. Each token is given back to its word by its character offset.
        """
        n = self.WORDS_PER_TEXT
        texts = [" ".join(words[i:i + n]) for i in range(0, len(words), n)]
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int32)
        char = np.fromiter(itertools.chain.from_iterable(
            (start for start, _ in e.offsets) for e in encodings), dtype=np.int64, count=len(ids))
        # Offsets as if all texts were one string with a space between them.
        text_len = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        text_base = np.cumsum(text_len + 1) - (text_len + 1)
        tokens_per_text = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))
        char += np.repeat(text_base, tokens_per_text)
        word_len = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        word_start = np.cumsum(word_len + 1) - (word_len + 1)    # the same layout, word by word
        owner = np.searchsorted(word_start, char, side="right") - 1
        length = np.bincount(owner, minlength=len(words)).astype(np.int64)
        base = len(self.index)
        self.index.update(zip(words, range(base, base + len(words))))
        self.start = np.concatenate([self.start, len(self.store) + np.cumsum(length) - length])
        self.length = np.concatenate([self.length, length])
        self.store = np.concatenate([self.store, ids])

    def encode_lines(self, lines):
        """(flat token ids int32 (T,), tokens per line int64 (n_lines,))."""
        if _CONTROL_SPACES_RE.search("".join(lines)):
            lines = [line.translate(_DROP_CONTROL_SPACES) for line in lines]
        line_words = [line.split() for line in lines]
        words = list(itertools.chain.from_iterable(line_words))
        if len(self.index) > self.MAX_CACHED_WORDS:
            self._clear()
        new = [w for w in dict.fromkeys(words) if w not in self.index]
        if new:
            self._add(new)
        rows = np.fromiter(map(self.index.__getitem__, words), dtype=np.int64, count=len(words))
        lens = self.length[rows]                              # tokens per word occurrence
        token_ids = self.store[_ranges(self.start[rows], lens)]
        words_per_line = np.fromiter(map(len, line_words), dtype=np.int64, count=len(line_words))
        cum = np.concatenate([[0], np.cumsum(lens)])
        line_end = np.cumsum(words_per_line)
        tokens_per_line = cum[line_end] - cum[line_end - words_per_line]
        return token_ids, tokens_per_line


def _ranges(starts, lens):
    """Concatenation of arange(s, s + n) for each (s, n): int64 indices."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    out_start = np.cumsum(lens) - lens
    return np.repeat(starts - out_start, lens) + np.arange(total, dtype=np.int64)


# ----------------------------------------------------------------------------- instances

def truncation(len_a, len_b, max_num_tokens):
    """How many tokens BERT's truncate_seq_pair removes from A and from B.

    It removes one token at a time from the longer segment (B on a tie) until the pair fits;
    the counts follow in closed form: first the longer one down to the other's length, then
    alternately starting with B.
    """
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0
    remove_a = remove_b = 0
    if len_a > len_b:
        remove_a = min(excess, len_a - len_b)
    else:
        remove_b = min(excess, len_b - len_a)
    rest = excess - remove_a - remove_b
    return remove_a + rest // 2, remove_b + rest - rest // 2


def create_instance_spans(docs, settings, rng):
    """BERT's create_instances_from_document over a chunk's documents, on token spans.

    `docs`: per document (first token offset in the chunk's flat token array, list of
    sentence token counts). Returns int64 arrays a_start, a_len, b_start, b_len and int8
    is_random: segment A is tokens[a_start:a_start + a_len], B likewise. Sentences of a
    document are contiguous in the flat array, so every segment is one span.
    """
    max_num_tokens = settings.max_seq_length - 3
    # Per document, token offset of each sentence start (n + 1 entries, absolute).
    offsets = []
    for start, lens in docs:
        acc, cum = start, [start]
        for n in lens:
            acc += n
            cum.append(acc)
        offsets.append(cum)
    out = ([], [], [], [], [])
    a_starts, a_lens, b_starts, b_lens, randoms = out
    rand = rng.random

    def randint(low, high):
        # random.randint's distribution at a third of its cost (the ranges here are small).
        return low + int(rand() * (high - low + 1))

    num_docs = len(docs)
    for _ in range(settings.dupe_factor):
        for d in range(num_docs):
            cum = offsets[d]
            n_sent = len(cum) - 1
            # As BERT: one target length per document, sometimes shorter to match fine-tuning.
            target = max_num_tokens
            if rand() < settings.short_seq_prob:
                target = randint(2, max_num_tokens)
            first = 0            # first sentence of the current chunk of sentences
            i = 0
            while i < n_sent:
                if i == n_sent - 1 or cum[i + 1] - cum[first] >= target:
                    count = i + 1 - first
                    a_end = randint(1, count - 1) if count >= 2 else 1
                    a_start, a_len = cum[first], cum[first + a_end] - cum[first]
                    if count == 1 or rand() < 0.5:
                        is_random = 1
                        target_b = target - a_len
                        # Ten tries for another document, as BERT (a lone document gets itself).
                        for _ in range(10):
                            r = randint(0, num_docs - 1)
                            if r != d:
                                break
                        rcum = offsets[r]
                        r_n = len(rcum) - 1
                        r_start = randint(0, r_n - 1)
                        j = r_start
                        while j < r_n and rcum[j + 1] - rcum[r_start] < target_b:
                            j += 1
                        j = min(j, r_n - 1)
                        b_start, b_len = rcum[r_start], rcum[j + 1] - rcum[r_start]
                        # The unused sentences of this chunk start the next one.
                        i -= count - a_end
                    else:
                        is_random = 0
                        b_start, b_len = cum[first + a_end], cum[i + 1] - cum[first + a_end]
                    cut_a, cut_b = truncation(a_len, b_len, max_num_tokens)
                    if cut_a:
                        # Each removal is from the front or the back with even odds.
                        front = rng.getrandbits(cut_a).bit_count()
                        a_start += front
                        a_len -= cut_a
                    if cut_b:
                        front = rng.getrandbits(cut_b).bit_count()
                        b_start += front
                        b_len -= cut_b
                    a_starts.append(a_start)
                    a_lens.append(a_len)
                    b_starts.append(b_start)
                    b_lens.append(b_len)
                    randoms.append(is_random)
                    first = i + 1
                i += 1
    return tuple(np.array(x, dtype=np.int64) for x in out[:4]) + (np.array(randoms, dtype=np.int8),)


def nvidia_arrays(tokens, spans, settings, rng):
    """Statically masked NVIDIA arrays for instances given as spans into `tokens`.

    Sequence: [CLS] A [SEP] B [SEP], zero-padded to L. Masking as create_pretraining_data.py:
    num_to_predict = min(P, max(1, round(n_tokens * prob))) of the A/B positions in random
    order, each 80% [MASK], 10% kept, 10% a uniformly random vocab id; positions sorted,
    positions and ids right-padded with 0. Returns a dict of the six hdf5 datasets.
    """
    a_start, a_len, b_start, b_len, is_random = spans
    n, L, P = len(a_len), settings.max_seq_length, settings.max_predictions_per_seq
    pos = np.arange(L, dtype=np.int64)[None, :]                               # (1, L)
    la, lb = a_len[:, None], b_len[:, None]                                   # (n, 1)
    n_tokens = la + lb + 3
    in_a = (pos >= 1) & (pos <= la)
    in_b = (pos >= la + 2) & (pos < la + 2 + lb)
    src = np.where(in_a, a_start[:, None] + pos - 1, b_start[:, None] + pos - la - 2)
    src = np.where(in_a | in_b, src, 0)
    ids = np.where(in_a | in_b, tokens[src], 0).astype(np.int32)             # (n, L)
    rows = np.arange(n)
    ids[:, 0] = settings.cls_id
    ids[rows, a_len + 1] = settings.sep_id
    ids[rows, a_len + b_len + 2] = settings.sep_id
    input_mask = (pos < n_tokens).astype(np.int8)
    segment_ids = ((pos >= la + 2) & (pos < n_tokens)).astype(np.int8)

    # Python's round (half to even), as the original: np.rint rounds the same way.
    num_to_predict = np.minimum(P, np.maximum(1, np.rint(n_tokens[:, 0] * settings.masked_lm_prob)))
    num_to_predict = np.minimum(num_to_predict, a_len + b_len).astype(np.int64)   # (n,)
    # A random order of the candidates: sort random keys, non-candidates last.
    keys = rng.random((n, L))
    keys[~(in_a | in_b)] = 2.0
    k = P                                                                     # P <= L - 3 < L
    smallest = np.argpartition(keys, k - 1, axis=1)[:, :k]
    order = np.argsort(np.take_along_axis(keys, smallest, axis=1), axis=1)
    chosen = np.take_along_axis(smallest, order, axis=1)                      # (n, k) random order
    valid = np.arange(k)[None, :] < num_to_predict[:, None]
    positions = np.sort(np.where(valid, chosen, L), axis=1)                   # sorted, unused = L
    valid = positions < L
    positions = np.where(valid, positions, 0)
    original = np.take_along_axis(ids, positions, axis=1)
    masked_lm_ids = np.where(valid, original, 0).astype(np.int32)
    u = rng.random((n, k))
    random_ids = rng.integers(0, settings.vocab_size, size=(n, k))
    replacement = np.where(u < 0.8, settings.mask_id, np.where(u < 0.9, original, random_ids))
    r, c = np.nonzero(valid)
    ids[r, positions[r, c]] = replacement[r, c]
    return {
        "input_ids": ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": masked_lm_ids,
        "next_sentence_labels": is_random.astype(np.int8),
    }


class VocabBytes:
    """The utf-8 bytes of every vocab token, for vectorised string output.

    `table` row i is the separator byte then token i's bytes, padded (V, 1 + longest);
    a gather from it plus a mask is the fastest way to write millions of tokens. With very
    long tokens the table would be wasteful, and a flat gather is used instead.
    """

    MAX_TABLE_WIDTH = 64

    def __init__(self, tokens_by_id):
        encoded = [t.encode("utf-8") for t in tokens_by_id]
        self.blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        self.length = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        self.start = np.cumsum(self.length) - self.length
        width = 1 + int(self.length.max())
        self.table = None
        if width <= self.MAX_TABLE_WIDTH:
            self.table = np.full((len(encoded), width), BING_SEPARATOR, dtype=np.uint8)
            rows = np.repeat(np.arange(len(encoded)), self.length)
            cols = 1 + np.arange(len(self.blob)) - np.repeat(self.start, self.length)
            self.table[rows, cols] = self.blob

    def strings(self, ids, separator_before):
        """The bytes of tokens `ids` in order, each preceded by 0x1f where separator_before."""
        length = self.length[ids]
        if self.table is not None:
            width = 1 + int(length.max(initial=0))        # only the columns these tokens use
            col = np.arange(width)[None, :]
            keep = (col >= ~separator_before[:, None]) & (col <= length[:, None])
            return self.table[ids, :width][keep]
        out_len = length + separator_before
        data = np.full(int(out_len.sum()), BING_SEPARATOR, dtype=np.uint8)
        text_start = np.cumsum(out_len) - length
        data[_ranges(text_start, length)] = self.blob[_ranges(self.start[ids], length)]
        return data


def bing_arrays(tokens, spans, settings, vocab_bytes):
    """Bing shard arrays for instances given as spans: the token strings of A then B.

    Returns data (uint8), instance_lengths (bytes per instance), tokens_split (tokens in A),
    is_next, and for the offsets layout token_offsets (in-instance byte offset of every
    token but the first) with tokens_per_instance.
    """
    a_start, a_len, b_start, b_len, is_random = spans
    seg_start = np.stack([a_start, b_start], axis=1).ravel()                  # A0 B0 A1 B1 ...
    seg_len = np.stack([a_len, b_len], axis=1).ravel()
    ids = tokens[_ranges(seg_start, seg_len)]                                  # (T,) all tokens
    per_instance = a_len + b_len
    first = np.zeros(len(ids), dtype=bool)
    first[np.cumsum(per_instance) - per_instance] = True
    separators = settings.bing_layout == "separator"
    # Separator layout: a 0x1f before every token but an instance's first.
    separator_before = ~first if separators else np.zeros(len(ids), dtype=bool)
    data = vocab_bytes.strings(ids, separator_before)
    out_len = vocab_bytes.length[ids] + separator_before
    out_start = np.cumsum(out_len) - out_len
    instance_start = out_start[first]
    result = {
        "data": data,
        "instance_lengths": np.diff(np.append(instance_start, len(data))),
        "tokens_split": a_len.astype(np.int32),
        "is_next": is_random.astype(np.int8),
    }
    if not separators:
        owner = np.repeat(np.arange(len(a_len)), per_instance)
        result["token_offsets"] = (out_start - instance_start[owner])[~first].astype(np.int32)
        result["tokens_per_instance"] = per_instance
    return result


# ----------------------------------------------------------------------------- worker

class ChunkProcessor:
    """Turns one chunk of documents into the arrays of its sequences (runs in a worker)."""

    def __init__(self, settings, tokenizer, tokens_by_id):
        self.settings = settings
        self.words = WordCacheTokenizer(tokenizer)
        self.vocab_bytes = VocabBytes(tokens_by_id) if settings.fmt == "bing" else None
        self.splitter = corpora.SentenceSplitter(settings.splitter)

    def run(self, kind, *task):
        """A task of the pipeline: ("chunk", set name, chunk index, documents, shards, journal
        path) processes a chunk and records it in the journal; ("rebuild", set name, path) makes
        the same result again from a recorded chunk."""
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
        documents = [corpora.document_sentences(doc, self.splitter) for doc in documents]
        least = self.settings.min_document_words
        if not least:
            return documents, 0
        kept = [doc for doc in documents if sum(len(line.split()) for line in doc) >= least]
        return kept, len(documents) - len(kept)

    def __call__(self, set_name, chunk_index, documents, num_shards, path=None):
        """(stats, arrays or None, sequences per shard group) of a chunk; recorded at `path` if given."""
        s = self.settings
        documents, too_short = self.sentences(documents)
        lines = [line for doc in documents for line in doc]
        token_ids, per_line = self.words.encode_lines(lines)
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
        results.send(outcome)


# ----------------------------------------------------------------------------- writers

class NpyAppender:
    """A 1-D .npy file written by appending; the header's length is fixed when closed.

    numpy pads .npy headers so that the shape can grow in place; this relies on that.
    """

    def __init__(self, path, dtype):
        self.path, self.dtype, self.count = path, np.dtype(dtype), 0
        self.file = open(path, "wb")
        self._header(0)
        self.header_size = self.file.tell()

    def _header(self, n):
        np.lib.format.write_array_header_1_0(
            self.file, {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                        "shape": (n,)})

    def append(self, array):
        array = np.ascontiguousarray(array, dtype=self.dtype)
        self.file.write(array.tobytes())
        self.count += len(array)

    def close(self):
        if self.file.closed:
            return
        self.file.seek(0)
        self._header(self.count)
        if self.file.tell() != self.header_size:
            raise RuntimeError(f"{self.path}: .npy header changed size")
        self.file.close()


class Hdf5ShardWriter:
    """One NVIDIA shard: resizable gzip datasets, appended chunk by chunk.

    gzip is most of the cost of the NVIDIA format, so it does not run inside h5py in the
    main thread: rows are gathered into whole hdf5 chunks, deflated by `compress` (a thread
    pool: zlib releases the GIL) and stored with write_direct_chunk, in order, so the file is
    the same as h5py's own gzip filter would make (the deflate filter is zlib's format).
    """

    MAX_QUEUED = 64                # chunks in the compressor's queue (~16 MB)

    def __init__(self, path, max_seq_length, max_predictions, compress):
        self.path, self.compress = path, compress
        self.file = h5py.File(path, "w")
        self.count = 0
        widths = {"input_ids": max_seq_length, "input_mask": max_seq_length, "segment_ids": max_seq_length,
                  "masked_lm_positions": max_predictions, "masked_lm_ids": max_predictions, "next_sentence_labels": None}
        self.datasets = {}
        self.pending = {}          # key -> rows not yet making a whole chunk
        self.flushed = {}          # key -> rows already handed to the compressor
        self.writes = collections.deque()   # (dataset, chunk offset, future of deflated bytes)
        for key in HDF5_KEYS:
            width, dtype = widths[key], HDF5_DTYPES[key]
            shape = (0, width) if width else (0,)
            rows = max(1, HDF5_CHUNK_BYTES // (np.dtype(dtype).itemsize * (width or 1)))
            self.datasets[key] = self.file.create_dataset(
                key, shape=shape, maxshape=(None,) + shape[1:], dtype=dtype,
                chunks=(rows,) + shape[1:], compression="gzip")
            self.pending[key], self.flushed[key] = [], 0

    def append(self, arrays, first, stop):
        """Append rows first..stop-1 of a chunk's arrays."""
        n = stop - first
        if n <= 0:
            return
        self.count += n
        for key, ds in self.datasets.items():
            ds.resize(self.count, axis=0)
            self.pending[key].append(arrays[key][first:stop])
            self._flush(key, final=False)
        # Store what is compressed already; wait only if too much is queued (memory bound).
        while self.writes and (self.writes[0][2].done() or len(self.writes) > self.MAX_QUEUED):
            self._write_oldest()

    def _flush(self, key, final):
        """Hand the whole chunks of pending rows (and at the end the last part) to compress."""
        ds = self.datasets[key]
        rows = ds.chunks[0]
        pending = np.concatenate(self.pending[key]) if len(self.pending[key]) > 1 else self.pending[key][0]
        whole = len(pending) // rows * rows
        for start in range(0, whole, rows):
            self._submit(ds, self.flushed[key] + start, pending[start:start + rows])
        rest = pending[whole:]
        if final and len(rest):
            # The last chunk is stored whole; rows past the dataset's end are never read.
            padded = np.zeros((rows,) + rest.shape[1:], dtype=rest.dtype)
            padded[:len(rest)] = rest
            self._submit(ds, self.flushed[key] + whole, padded)
            rest = rest[:0]
        self.flushed[key] += whole
        self.pending[key] = [rest]

    def _submit(self, ds, row, block):
        offset = (row,) + (0,) * (block.ndim - 1)
        self.writes.append((ds, offset, self.compress(np.ascontiguousarray(block))))

    def _write_oldest(self):
        ds, offset, future = self.writes.popleft()
        ds.id.write_direct_chunk(offset, future.result())

    def finish(self):
        """Compress and store everything still pending (then close)."""
        for key in self.datasets:
            self._flush(key, final=True)
        while self.writes:
            self._write_oldest()
        self.close()

    def close(self):
        if self.file:
            self.file.close()
            self.file = None


class BingShardWriter:
    """One Bing shard folder, its .npy files appended chunk by chunk."""

    def __init__(self, folder, layout):
        os.makedirs(folder)
        self.folder, self.layout, self.count = folder, layout, 0
        self.bytes_written = self.tokens_written = 0
        j = lambda name: os.path.join(folder, name)  # noqa: E731
        self.data = NpyAppender(j("data.npy"), np.uint8)
        self.offsets = NpyAppender(j("instance_offsets.npy"), np.int64)
        self.split = NpyAppender(j("tokens_split.npy"), np.int32)
        self.is_next = NpyAppender(j("is_next.npy"), np.int8)
        self.files = [self.data, self.offsets, self.split, self.is_next]
        if layout == "offsets":
            self.token_offsets = NpyAppender(j("token_offsets.npy"), np.int32)
            self.instance_token_offsets = NpyAppender(j("instance_token_offsets.npy"), np.int64)
            self.files += [self.token_offsets, self.instance_token_offsets]

    def append(self, arrays, first, stop):
        """Append instances first..stop-1 of a chunk's arrays."""
        if stop <= first:
            return
        ends = np.concatenate([[0], np.cumsum(arrays["instance_lengths"])])
        self.data.append(arrays["data"][ends[first]:ends[stop]])
        self.offsets.append(self.bytes_written + ends[first:stop] - ends[first])
        self.bytes_written += int(ends[stop] - ends[first])
        self.split.append(arrays["tokens_split"][first:stop])
        self.is_next.append(arrays["is_next"][first:stop])
        if self.layout == "offsets":
            # An instance has an offset for each of its tokens but the first.
            t_ends = np.concatenate([[0], np.cumsum(arrays["tokens_per_instance"] - 1)])
            self.token_offsets.append(arrays["token_offsets"][t_ends[first]:t_ends[stop]])
            self.instance_token_offsets.append(self.tokens_written + t_ends[first:stop] - t_ends[first])
            self.tokens_written += int(t_ends[stop] - t_ends[first])
        self.count += stop - first

    def close(self):
        if self.offsets.file.closed:
            return
        # The N+1-th offsets close both offset arrays.
        self.offsets.append(np.array([self.bytes_written]))
        if self.layout == "offsets":
            self.instance_token_offsets.append(np.array([self.tokens_written]))
        for f in self.files:
            f.close()

    finish = close


class ShardSet:
    """The shards of one set, written in a temporary folder; sequences dealt round-robin.

    A shard's files are created when its first sequence arrives, so asking for more shards
    than there are sequences fails at the end without first creating thousands of files.
    """

    def __init__(self, name, tmp_folder, final_folder, num_shards, settings, prefix, compress=None, part_tag=""):
        self.name, self.tmp_folder, self.final_folder = name, tmp_folder, final_folder
        self.settings, self.prefix, self.compress = settings, prefix, compress
        self.part_tag = part_tag       # "part003_" for --part 3 of --num_parts N, else ""
        os.makedirs(tmp_folder)
        self.count = 0
        self.writers = [None] * num_shards

    def _final_name(self, i):
        if self.settings.fmt == "nvidia":
            return f"{self.prefix}_{self.part_tag}{'training' if self.name == TRAIN else 'test'}_shard{i}.hdf5"
        return f"{self.part_tag}shard_{i:03d}"

    def _writer(self, i):
        if self.writers[i] is None:
            tmp = os.path.join(self.tmp_folder, self._final_name(i))
            s = self.settings
            self.writers[i] = (Hdf5ShardWriter(tmp, s.max_seq_length, s.max_predictions_per_seq, self.compress)
                               if s.fmt == "nvidia" else BingShardWriter(tmp, s.bing_layout))
        return self.writers[i]

    def add(self, arrays, group_sizes):
        """Sequence j of this set (counting from the first chunk) goes to shard j % S.

        The worker ordered a chunk's sequences by their index modulo S (group r holds the
        chunk's sequences r, r + S, ...), so each shard gets one contiguous block.
        """
        shards = len(self.writers)
        first = 0
        for r, size in enumerate(group_sizes):
            if size:
                self._writer((self.count + r) % shards).append(arrays, first, first + size)
            first += size
        self.count += first

    @property
    def sizes(self):
        return [w.count if w else 0 for w in self.writers]

    def finish(self):
        """Write out everything (the NVIDIA writers' last compressed chunks) and close."""
        for w in self.writers:
            w.finish()

    def close(self):
        for w in self.writers:
            if w:
                w.close()

    def install(self):
        """Move the finished shards to their final names, replacing older shards there."""
        os.makedirs(self.final_folder, exist_ok=True)
        remove_shards(self.final_folder, self.part_tag or None)
        for i in range(len(self.writers)):
            name = self._final_name(i)
            os.replace(os.path.join(self.tmp_folder, name), os.path.join(self.final_folder, name))


def existing_shards(folder, part_tag=None):
    """The shard names in `folder` (those of one part with `part_tag`, e.g. "part003_")."""
    if not os.path.isdir(folder):
        return []
    return sorted(name for name in os.listdir(folder) if SHARD_NAME.search(name)
                  and (part_tag is None or shard_part_tag(name) == part_tag))


def shard_part_tag(name):
    """The part tag of a shard name ("part003_"), "" for a shard of a run without parts."""
    match = SHARD_PART.search(name)
    return match.group(1) or match.group(2) if match else ""


def remove_shards(folder, part_tag=None):
    """Delete the shard files/folders (by their names) a previous run left in `folder`."""
    for name in existing_shards(folder, part_tag):
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)  # a file, or a link (to a shard elsewhere, which stays)


# ----------------------------------------------------------------------------- resuming

# The flags whose values the shards depend on (--workers, --overwrite and --debug change nothing).
OUTPUT_FLAGS = ("input_format", "text_field", "hf_split", "hf_config", "skip_bad_records", "format", "bing_layout",
                "build_vocab", "vocab_sample_mb", "do_lower_case", "max_seq_length", "max_predictions_per_seq",
                "masked_lm_prob", "validation_masked_lm_prob", "short_seq_prob", "dupe_factor", "num_shards",
                "validation_fraction", "seed", "chunk_size_mb", "prefix", "min_document_words", "keep_duplicates",
                "num_parts", "part")


def run_fingerprint(args, sources):
    """What the finished chunks of a run depend on: the flags, the inputs (path, size, modification
    time) and the vocab's content."""
    vocab = None
    if args.vocab_file is not None:
        with open(args.vocab_file, "rb") as f:
            vocab = hashlib.sha256(f.read()).hexdigest()
    inputs = []
    for source in sources:
        stamp = 0 if source.name else _modified(source.path)
        inputs.append([source.path if source.name else os.path.abspath(source.path), source.size, stamp])
    return {"flags": {k: getattr(args, k) for k in OUTPUT_FLAGS}, "inputs": inputs, "vocab_sha256": vocab}


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
        """A worker stopped while writing a chunk leaves its temporary file (save_chunk): never a chunk."""
        for name in os.listdir(self.chunks) if os.path.isdir(self.chunks) else ():
            if ".tmp" in name:
                os.remove(os.path.join(self.chunks, name))

    def chunk_path(self, set_name, index):
        return os.path.join(self.chunks, f"{set_name}_{index:07d}.npz")

    def close(self, finished):
        """Release the lock; remove everything once the run finished, else keep the finished
        chunks (and nothing else) for the next run; returns how many were kept."""
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._remove_partial_chunks()  # the workers have ended: a temporary file left is a dead worker's
        kept = 0 if finished else len(self.done_chunks())
        if not kept:
            shutil.rmtree(self.folder, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        return kept


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
    then = {p: (size, stamp) for p, size, stamp in previous.get("inputs", [])}
    for path, size, stamp in now["inputs"]:
        if then.get(path) != (size, stamp):
            return f"another input ({path} {'changed' if path in then else 'was not an input'})"
    return "other inputs (a file is no longer an input)"


# ----------------------------------------------------------------------------- driver

def validate_args(args):
    """Check flag values before any work; raises PrepareDataError naming the flag."""
    L, P = args.max_seq_length, args.max_predictions_per_seq
    if L < 5:
        raise PrepareDataError(f"--max_seq_length {L}: must be at least 5 ([CLS] A [SEP] B [SEP])")
    if not 1 <= P <= L - 3:
        raise PrepareDataError(f"--max_predictions_per_seq {P}: must be between 1 and max_seq_length - 3 "
                               f"= {L - 3}, the number of maskable tokens in a sequence of {L}")
    for flag in ("masked_lm_prob", "validation_masked_lm_prob"):
        if not 0 < getattr(args, flag) <= 1:
            raise PrepareDataError(f"--{flag} {getattr(args, flag)}: must be in (0, 1]")
    if not 0 <= args.short_seq_prob <= 1:
        raise PrepareDataError(f"--short_seq_prob {args.short_seq_prob}: must be in [0, 1]")
    if not 0 <= args.validation_fraction < 1:
        raise PrepareDataError(f"--validation_fraction {args.validation_fraction}: must be in [0, 1)")
    for flag in ("dupe_factor", "num_shards", "workers"):
        if getattr(args, flag) < 1:
            raise PrepareDataError(f"--{flag} {getattr(args, flag)}: must be at least 1")
    if args.chunk_size_mb <= 0:
        raise PrepareDataError(f"--chunk_size_mb {args.chunk_size_mb}: must be positive")
    if (args.vocab_file is None) == (args.build_vocab is None):
        raise PrepareDataError("give exactly one of --vocab_file VOCAB and --build_vocab N")
    if args.build_vocab is not None and args.build_vocab <= len(SPECIAL_TOKENS):
        raise PrepareDataError(f"--build_vocab {args.build_vocab}: must be larger than {len(SPECIAL_TOKENS)}")
    if args.num_parts < 1 or not 0 <= args.part < args.num_parts:
        raise PrepareDataError(f"--num_parts {args.num_parts} --part {args.part}: need N >= 1 and 0 <= K < N")
    if args.num_parts > 1 and args.build_vocab is not None:
        raise PrepareDataError("--build_vocab with --num_parts: every part needs the same vocab; build it once "
                               "(a run with --build_vocab, or tools.prepare_data on a sample) and give --vocab_file")
    if args.min_document_words < 0:
        raise PrepareDataError(f"--min_document_words {args.min_document_words}: must be at least 0")
    if args.vocab_sample_mb <= 0:
        raise PrepareDataError(f"--vocab_sample_mb {args.vocab_sample_mb}: must be positive")
    if args.prefix is not None and (os.path.basename(args.prefix) != args.prefix or args.prefix in ("", ".", "..")):
        raise PrepareDataError(f"--prefix {args.prefix!r}: a file name prefix, not a path; the shards go in "
                               "--output_dir's train/ and validation/")


def check_output_dir(args, resuming=False, part_tag=None):
    """Refuse to mix with an earlier run's shards unless --overwrite, and refuse anything else
    in train/ and validation/ (training reads those folders whole: a foreign *training* file or
    sub-folder there would be read as a shard); so the sets hold only what this run writes.
    `resuming`: an unfinished run of the same command passed these checks already (shards there
    may be its own, from a stop while installing them). With parts, only this part's shards count."""
    out = args.output_dir
    if os.path.exists(out) and not os.path.isdir(out):
        raise PrepareDataError(f"--output_dir {out}: exists and is not a folder")
    for sub in (TRAIN, VALIDATION):
        folder = os.path.join(out, sub)
        foreign = sorted(set(os.listdir(folder)) - set(existing_shards(folder))) if os.path.isdir(folder) else []
        if foreign:
            raise PrepareDataError(f"--output_dir {out}: {sub}/{foreign[0]} was not written by prepare_data "
                                   f"({len(foreign)} such entr{'y' if len(foreign) == 1 else 'ies'} in {sub}/, "
                                   "which training reads whole); move them away or use another --output_dir")
    if args.overwrite or resuming:
        return
    found = [os.path.join(sub, name) for sub in (TRAIN, VALIDATION)
             for name in existing_shards(os.path.join(out, sub), part_tag)]
    if found:
        raise PrepareDataError(f"--output_dir {out} already holds shards ({found[0]}, ...); "
                               "pass --overwrite to replace them")
    vocab_out = os.path.join(out, "vocab.txt")
    if os.path.exists(vocab_out) and (
            args.build_vocab is not None or not (_same_file(args.vocab_file, vocab_out)
                                                 or filecmp.cmp(args.vocab_file, vocab_out, shallow=False))):
        raise PrepareDataError(f"--output_dir {out} already holds a different vocab.txt; "
                               "pass --overwrite to replace it")


def _same_file(a, b):
    return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


def prepare(args, signals=None):
    """Run the whole pipeline for parsed `args`; returns a Summary. Raises PrepareDataError, or
    StopRequested once `signals` (a StopSignals, installed by the caller) received one."""
    signals = signals or StopSignals()
    start = time.perf_counter()
    validate_args(args)
    sources = input_sources(args)
    if args.vocab_file is not None and not os.path.isfile(args.vocab_file):
        raise InputNotFoundError(f"--vocab_file {args.vocab_file}: no such file")
    out = args.output_dir
    parts = args.num_parts > 1
    part_tag = f"part{args.part:03d}_" if parts else ""
    journal = Journal(out, f".part{args.part}of{args.num_parts}" if parts else "")
    fingerprint = run_fingerprint(args, sources)
    check_output_dir(args, resuming=journal.previous() == fingerprint, part_tag=part_tag or None)
    os.makedirs(out, exist_ok=True)
    done = journal.open(fingerprint, args.overwrite)
    if done:
        logger.info("continuing an unfinished run: %d chunks are done (in %s) and are reused", done, journal.folder)
    tmp = journal.tmp
    pool = deflater = record = None
    shard_sets = {}
    finished = False
    try:
        chunk_bytes = int(args.chunk_size_mb * 2**20)
        options = read_options(args)
        vocab_file = build_vocab(args, sources, options, journal, signals) if args.build_vocab is not None else args.vocab_file
        vocab, special = check_vocab(vocab_file, args.format, args.bing_layout)
        # Id -> token from the file's lines (load_vocab's dict keeps one id per repeated line);
        # random replacement ids span every line, as the model's rows do (vocab_size).
        with open(vocab_file, encoding="utf-8") as f:
            tokens_by_id = [line.rstrip() for line in f]
        settings = worker_settings(args, vocab, special)
        # Built here, before the workers fork, so they inherit its one-time set-up.
        tokenizer = build_fast_tokenizer(vocab_file, do_lower_case=args.do_lower_case)
        summary = Summary(output_dir=out, fmt=args.format, input_bytes=sum(s.size for s in sources),
                          part=f"{args.part} of {args.num_parts}" if parts else "")
        summary.setup_seconds = time.perf_counter() - start
        t0 = time.perf_counter()
        if args.workers > 1:
            pool = WorkerPool(args.workers, settings, tokenizer, tokens_by_id, journal.descriptors())
        processor = None if pool else ChunkProcessor(settings, tokenizer, tokens_by_id)
        # Threads that deflate hdf5 chunks (zlib releases the GIL), beside the workers.
        deflater = ThreadPoolExecutor(max(2, args.workers), thread_name_prefix="deflate")
        compress = functools.partial(deflater.submit, zlib.compress, level=HDF5_GZIP_LEVEL)

        prefix = args.prefix or os.path.basename(os.path.abspath(out))
        sets = [TRAIN] + ([VALIDATION] if args.validation_fraction > 0 else [])
        for name in sets:
            shards = args.num_shards if name == TRAIN else 1
            shard_sets[name] = ShardSet(name, os.path.join(tmp, name), os.path.join(out, name),
                                        shards, settings, prefix, compress, part_tag)
            summary.sets[name] = SetStats()

        documents = CorpusReader(sources, options, max_document_bytes=chunk_bytes)
        keep = DocumentFilter(args.num_parts, args.part, dedup=not args.keep_duplicates)
        record = SplitRecord(tmp, args.part if parts else None)
        chunks = ((name, index, docs, len(shard_sets[name].writers), journal.chunk_path(name, index), nbytes)
                  for name, index, docs, nbytes in iter_chunks(documents, chunk_bytes, args.validation_fraction,
                                                               keep, record))
        _collect(_ordered_results(chunks, pool, processor, args.workers, summary.input_bytes, signals.check),
                 summary, shard_sets)
        if pool:
            pool.close()
            pool = None
        summary.read = read_counts(documents, keep)

        _finish_sets(summary, shard_sets, args.input, tokens_by_id, args.do_lower_case)
        for warning in documents.warnings():
            logger.warning("%s", warning)
        record.finish(args, keep.read + keep.other_parts)
        _install(out, tmp, vocab_file, shard_sets, part_tag, record)
        summary.seconds = time.perf_counter() - t0
        summary.peak_mb = _peak_rss_mb(resource.RUSAGE_SELF)
        summary.peak_worker_mb = _peak_rss_mb(resource.RUSAGE_CHILDREN) if args.workers > 1 else 0.0
        _write_stats(summary, tmp, out, f"stats.part{args.part:03d}.json" if parts else "stats.json")
        finished = True
        return summary
    finally:
        if pool:
            pool.terminate()
        if deflater:
            deflater.shutdown(cancel_futures=True)
        for shard_set in shard_sets.values():
            shard_set.close()
        if record:
            record.close()
        kept = journal.close(finished)
        if kept:
            logger.warning("%d finished chunks are kept in %s: the same command continues from them",
                           kept, journal.folder)


def _collect(results, summary, shard_sets):
    """Each chunk's counts into the summary and its arrays into its set's shards, in input order."""
    for name, (stats, arrays, group_sizes), nbytes, reused in results:
        total = summary.sets[name]
        for key in SetStats.COUNTS:
            setattr(total, key, getattr(total, key) + getattr(stats, key))
        if arrays is not None:
            shard_sets[name].add(arrays, group_sizes)
        if reused:
            summary.reused_chunks += 1
            summary.reused_bytes += nbytes


def worker_settings(args, vocab, special):
    """What the workers need of the flags and the vocab to make a chunk's arrays."""
    return Settings(
        fmt=args.format, bing_layout=args.bing_layout, max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq, masked_lm_prob=args.masked_lm_prob,
        validation_masked_lm_prob=args.validation_masked_lm_prob,
        short_seq_prob=args.short_seq_prob, dupe_factor=args.dupe_factor, seed=args.seed,
        vocab_size=vocab_size(vocab), cls_id=special["cls"], sep_id=special["sep"],
        mask_id=special["mask"], unk_id=special["unk"], min_document_words=args.min_document_words)


def read_counts(documents, keep):
    """The reading's counts for stats.json: documents read, left out (and why), layouts."""
    return {"documents_read": keep.read, "duplicates": keep.duplicates,
            "bad_records": documents.counts.bad_records, "redirects": documents.counts.redirects,
            "other_pages": documents.counts.other_pages, "other_parts": keep.other_parts,
            "layouts": documents.counts.layouts}


def _write_stats(summary, tmp, out, name):
    """OUT/NAME (stats.json), whole or not at all."""
    with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
        json.dump(summary.stats(), f, indent=1)
    os.replace(os.path.join(tmp, name), os.path.join(out, name))


def build_vocab(args, sources, options, journal, signals):
    """Train the --build_vocab vocab (or reuse the one an unfinished run of this command trained):
    on the text files themselves when they are small one-sentence-per-line text, else on a seeded
    sample of --vocab_sample_mb of text from any layout (memory bounded by the sample). A stop
    signal is answered while the trainer runs (it runs on a thread; Python's handlers only run
    between the main thread's bytecodes, never inside the Rust trainer)."""
    if os.path.isfile(journal.vocab):
        logger.info("reusing the vocab the unfinished run trained (%s)", journal.vocab)
        return journal.vocab
    budget = int(args.vocab_sample_mb * 2**20)
    plain = all(s.layout == "text" and not corpora.compression(s.path) for s in sources)
    if plain and sum(s.size for s in sources) <= budget:
        files = [s.path for s in sources]
    else:
        sample = os.path.join(journal.tmp, "vocab_sample.txt")
        reader = CorpusReader(sources, options, max_document_bytes=int(args.chunk_size_mb * 2**20))
        n, size = write_vocab_sample(reader, sample, budget, args.seed, args.workers, journal.descriptors())
        logger.info("training the vocab on a sample of %d documents (%.1f MB of text)", n, size / 1e6)
        files = [sample]
    tmp = journal.vocab + ".tmp"
    result = {}

    def train():
        try:
            result["size"] = train_vocab(files, args.build_vocab, args.do_lower_case, tmp)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            result["error"] = e

    trainer = threading.Thread(target=train, name="vocab-trainer", daemon=True)  # ends with the process
    trainer.start()
    while trainer.is_alive():
        trainer.join(0.1)
        signals.check()
    if "error" in result:
        raise result["error"]
    size = result["size"]
    os.replace(tmp, journal.vocab)
    logger.info("trained a WordPiece vocab of %d entries", size)
    return journal.vocab


def _finish_sets(summary, shard_sets, inputs, tokens_by_id=(), do_lower_case=True):
    """Check that every set and shard got sequences, then finish the shard files."""
    for name, shard_set in shard_sets.items():
        stats = summary.sets[name]
        stats.shard_sizes = shard_set.sizes
        skipped = summary.read.get("bad_records") if name == TRAIN else 0
        if stats.documents == 0 and skipped:
            raise PrepareDataError(f"--input {' '.join(inputs)}: no document with tokens, and {skipped} bad records "
                                   "skipped (--skip_bad_records); without that flag the first is named")
        if stats.documents == 0:
            what, hint = ("input", "") if name == TRAIN else ("validation set", "; raise --validation_fraction")
            raise PrepareDataError(f"--input {' '.join(inputs)}: the {what} has no document with tokens "
                                   f"(expected text: for .txt files one sentence per line, blank lines between "
                                   f"documents; --input_format names another layout{hint})")
        if min(stats.shard_sizes) == 0:
            raise PrepareDataError(f"{stats.sequences} {name} sequences cannot fill {len(stats.shard_sizes)} "
                                   "shards; lower --num_shards or add text")
    for shard_set in shard_sets.values():
        shard_set.finish()
    unk = summary.sets[TRAIN].unk_tokens / max(summary.sets[TRAIN].tokens, 1)
    if unk > UNK_WARNING:
        logger.warning("%.1f%% of the tokens are [UNK] (more than %g%%): %s", 100 * unk, 100 * UNK_WARNING,
                       unk_cause(tokens_by_id, do_lower_case))


UNK_WARNING = 0.01


def unk_cause(tokens_by_id, do_lower_case):
    """The likely reason for many [UNK]s, from the vocab's case and the lower-casing flag."""
    words = [t for t in tokens_by_id if t.isalpha()]
    cased = sum(t != t.lower() for t in words) > 0.05 * max(len(words), 1)
    if not do_lower_case and not cased:
        return "a cased corpus (--no_lower_case) with an uncased vocab: drop --no_lower_case"
    if do_lower_case and cased:
        return "a cased vocab with lower-casing on: add --no_lower_case"
    return ("the text is in another language or script than the vocab's, or the vocab is the wrong one "
            "(--vocab_file; --build_vocab trains one on this corpus)")


def _install(out, tmp, vocab_file, shard_sets, part_tag, record):
    """Everything is complete: move the vocab, the shards and the record of the split from `tmp`
    into place (with parts, only this part's shards are replaced)."""
    if not _same_file(vocab_file, os.path.join(out, "vocab.txt")):
        shutil.copyfile(vocab_file, os.path.join(tmp, "vocab.txt.final"))
        os.replace(os.path.join(tmp, "vocab.txt.final"), os.path.join(out, "vocab.txt"))
    for shard_set in shard_sets.values():
        shard_set.install()
    if VALIDATION not in shard_sets:   # this run's older validation shards (only with --overwrite)
        remove_shards(os.path.join(out, VALIDATION), part_tag or None)
    record.install(out, bool(part_tag))


def _peak_rss_mb(who):
    """Peak resident set size in MB (ru_maxrss is KB on Linux, bytes on macOS)."""
    peak = resource.getrusage(who).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


class WorkerPool:
    """--workers processes, each holding a ChunkProcessor (forked where possible: no re-import).

    Chunk k goes to worker k mod N, and each worker answers on a pipe of its own, so the
    results come back in order. The pipe's only writer is its worker: a worker that dies (the
    out-of-memory killer, a signal), even in the middle of sending, is seen at once and the
    wait ends in a PrepareDataError naming it and how it ended, where a multiprocessing.Pool
    waits for its lost task forever. The other way round, the workers end with the main process
    (end_with_parent): a SIGKILLed run leaves none behind.
    """

    def __init__(self, workers, settings, tokenizer, tokens_by_id, inherited=()):
        """`inherited`: descriptors of the main process that a worker closes (the journal's lock)."""
        ctx, inherited = _worker_context(inherited)
        # The workers are the parallelism: each one's tokenizer stays single-threaded (this also
        # keeps `tokenizers` quiet about forking after the vocab trainer used its thread pool).
        saved = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        self.workers = []            # (process, task queue, result pipe)
        try:
            for _ in range(workers):
                tasks = ctx.Queue()
                results, results_end = ctx.Pipe(duplex=False)
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
        self.submitted = 0
        self.received = 0

    def submit(self, *task):
        """Queue the next chunk (never blocks: the queue has a feeder thread)."""
        self.workers[self.submitted % len(self.workers)][1].put(task)
        self.submitted += 1

    def next_result(self, check_stop):
        """The result of the oldest chunk not yet returned; `check_stop()` runs every 0.2 s."""
        _, _, results = self.workers[self.received % len(self.workers)]
        sentinels = [p.sentinel for p, _, _ in self.workers]
        while True:
            check_stop()
            ready = multiprocessing.connection.wait([results] + sentinels, timeout=0.2)
            if results in ready:
                try:
                    ok, value = results.recv()
                except (EOFError, OSError):   # the worker died while sending
                    raise PrepareDataError(self._how_workers_ended()) from None
                break
            if ready:
                raise PrepareDataError(self._how_workers_ended())
        self.received += 1
        if not ok:
            raise value
        return value

    def _how_workers_ended(self):
        ended = []
        dead = multiprocessing.connection.wait([p.sentinel for p, _, _ in self.workers], timeout=1)
        for p, _, _ in self.workers:
            if p.sentinel in dead:
                p.join()
                ended.append(f"worker process {p.pid} " + (f"killed by {signal.Signals(-p.exitcode).name}"
                                                         if p.exitcode < 0 else f"exit code {p.exitcode}"))
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
        for process, tasks, results in self.workers:
            process.join()
            tasks.close()
            results.close()


def _ordered_results(chunks, pool, processor, workers, total_bytes, check_stop):
    """Process chunks in order: yields (set name, result, input bytes, reused), with a progress
    bar on a terminal and a plain progress line every PROGRESS_SECONDS otherwise.

    Each chunk is recorded in the journal at its path; one recorded by an unfinished run is
    rebuilt from there (reused) instead. With a pool, at most 2 chunks per worker are in flight,
    so memory stays bounded. `check_stop()` runs before each chunk and while waiting for a worker
    (it raises to stop).
    """
    in_flight = collections.deque()
    sequences = 0
    progress = _ProgressLines(total_bytes)
    with tqdm(total=total_bytes, unit="B", unit_scale=True, desc="prepare_data", disable=None,
              leave=False) as bar:
        def emit(name, result, nbytes, reused):
            nonlocal sequences
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
            if pool is None:
                yield emit(name, processor.run(*task), nbytes, reused)
                continue
            pool.submit(*task)
            in_flight.append((name, nbytes, reused))
            if len(in_flight) >= 2 * workers:
                n, b, r = in_flight.popleft()
                yield emit(n, pool.next_result(check_stop), b, r)
        while in_flight:
            n, b, r = in_flight.popleft()
            yield emit(n, pool.next_result(check_stop), b, r)


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


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line: `error: ...`, exit code 2."""

    def error(self, message):
        self.exit(2, f"error: {message} (see --help)\n")


def build_parser():
    p = _Parser(description="Turn a corpus (text, a Wikipedia dump, WikiExtractor output, JSON lines, parquet, "
                            "a Hugging Face dataset) into BERT pretraining shards: NVIDIA hdf5 or Bing numpy.",
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input", nargs="+", required=True,
                   help="files or folders (a folder's .txt files, or its files of the other layouts); with "
                        "--input_format hf also a dataset name in the local Hugging Face cache")
    p.add_argument("--input_format", choices=corpora.LAYOUTS, default=None,
                   help="the input's layout (default: told apart by file name and first bytes); text: one "
                        "sentence per line, blank lines between documents; text_docs: one document per line")
    p.add_argument("--text_field", default="text",
                   help="jsonl/parquet/hf: the field or column holding a document's text (a.b: nested)")
    p.add_argument("--hf_split", default="train", help="hf: the split of a dataset dict or cached dataset")
    p.add_argument("--hf_config", default=None, help="hf: the configuration of a cached dataset")
    p.add_argument("--skip_bad_records", action="store_true",
                   help="skip (and count) records that hold no text instead of stopping: JSON lines that are not "
                        "JSON or lack --text_field, rows whose column is binary data or a list, ...")
    p.add_argument("--min_document_words", type=int, default=0,
                   help="drop documents of fewer words (counted in the summary and stats.json)")
    p.add_argument("--keep_duplicates", action="store_true",
                   help="keep exact duplicate documents (default: one copy; same text up to case and whitespace)")
    p.add_argument("--num_parts", type=int, default=1, help="split the work over N machines (see --part)")
    p.add_argument("--part", type=int, default=0,
                   help="0-based: this machine's share of --num_parts, shards named by part in the same folders")
    p.add_argument("--output_dir", required=True,
                   help="writes vocab.txt, train/ and validation/ here")
    p.add_argument("--format", choices=["nvidia", "bing"], default="nvidia",
                   help="nvidia: hdf5 shards with static masking; bing: numpy token-string shards")
    p.add_argument("--bing_layout", choices=["separator", "offsets"], default="separator",
                   help="bing: tokens split by byte 0x1f, or located by token_offsets.npy")
    p.add_argument("--vocab_file", default=None, help="an existing BERT vocab.txt")
    p.add_argument("--build_vocab", type=int, default=None, metavar="N",
                   help="train a WordPiece vocab of about N entries on the input instead "
                        "(written to OUT/vocab.txt; may differ slightly between runs)")
    p.add_argument("--vocab_sample_mb", type=float, default=100,
                   help="--build_vocab trains on a seeded sample of this much text of a larger or non-text corpus")
    p.add_argument("--do_lower_case", dest="do_lower_case", action="store_true", default=True,
                   help="lower-case and strip accents (uncased vocab)")
    p.add_argument("--no_lower_case", dest="do_lower_case", action="store_false",
                   help="keep case and accents (cased vocab)")
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--max_predictions_per_seq", type=int, default=20,
                   help="cap on masked positions per sequence (nvidia)")
    p.add_argument("--masked_lm_prob", type=float, default=0.15,
                   help="share of tokens masked in the training set (nvidia)")
    p.add_argument("--validation_masked_lm_prob", type=float, default=0.15,
                   help="share of tokens masked in the validation set (nvidia); fixed so runs compare")
    p.add_argument("--short_seq_prob", type=float, default=0.1,
                   help="probability of a shorter target length for a document")
    p.add_argument("--dupe_factor", type=int, default=5,
                   help="passes over the documents, each cutting (and masking) them differently")
    p.add_argument("--num_shards", type=int, default=1, help="training shards (validation: one)")
    p.add_argument("--validation_fraction", type=float, default=0.0,
                   help="share of documents put in the validation set (0: none)")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--workers", type=int, default=1, help="worker processes")
    p.add_argument("--chunk_size_mb", type=float, default=0.25,
                   help="text per unit of work; random next sentences come from the same chunk")
    p.add_argument("--prefix", default=None,
                   help="nvidia file name prefix (default: the output folder's name)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace shards already in --output_dir, and an unfinished run's work made with other settings")
    p.add_argument("--debug", action="store_true", help="show tracebacks for input errors")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    signals = StopSignals(action="stopping the workers; finished chunks are kept")
    signals.install()
    try:
        summary = prepare(args, signals)
    except StopRequested as e:
        print(f"error: {e}; nothing was written to {args.output_dir}'s train/ and validation/ (finished chunks "
              "are kept for the same command to continue from)", file=sys.stderr)
        return 128 + e.signum
    except (PrepareDataError, corpora.CorpusError, OSError) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        signals.uninstall()
    for line in summary.lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

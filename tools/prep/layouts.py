"""Where documents come from: the input files and their layout, and a file's bytes as a stream.

Owns finding the inputs (files, folders, a Hugging Face dataset in the local cache), telling
their layout and opening a file as the bytes it holds (compressed ones decompressed as they are
read). tools/prep/documents.py reads documents out of them.

Layouts (`--input_format`, else told apart by file name and first bytes):
    text           one sentence per line, a blank line between documents (any other name: .txt)
    text_docs      one document per line (only when asked for: a line is also a sentence)
    mediawiki      a MediaWiki XML export, `*-pages-articles*.xml[.bz2]` (multistream too):
                   article pages (namespace 0) only, redirects skipped, wikitext to text
    wikiextractor  WikiExtractor's output: `wiki_NN` files of <doc ...> blocks, or its --json lines
    jsonl          JSON lines (.jsonl, .json; .gz, .bz2, .xz, .zst): the text in --text_field
    parquet        .parquet files or folders of them: the column --text_field, read by row group
    hf             Hugging Face `datasets`: a save_to_disk folder, .arrow files, local data files
                   (with --input_format hf), or a dataset name in the local cache (never downloaded)
"""
import bz2
import gzip
import importlib
import io
import json
import logging
import lzma
import os
import re
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tools.prep import CorpusError
from turing.jsonfile import json_kind  # noqa: F401 (tools/prep's readers take it from here)

logger = logging.getLogger(__name__)

LAYOUTS = ("text", "text_docs", "mediawiki", "wikiextractor", "jsonl", "parquet", "hf")
COMPRESSED = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd"}
OPTIONAL = "requirements-corpora.txt"
READ_BYTES = 1 << 20
WIKIEXTRACTOR_NAME = re.compile(r"^wiki_\d+(\.bz2|\.gz)?$")


def require(module, purpose, requirements=OPTIONAL):
    """Import an optional package, or raise one line naming the pip command that installs it (from
    the `requirements` file that lists it, None where none of the program's does)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        package = {"blingfire": "blingfire", "mwparserfromhell": "mwparserfromhell", "pyarrow.parquet": "pyarrow",
                   "zstandard": "zstandard", "datasets": "datasets"}.get(module, module)
        how = f"pip install -r {requirements} (or pip install {package})" if requirements else f"pip install {package}"
        raise CorpusError(f"{purpose} needs the Python package {package}: {how}") from None


@dataclass(frozen=True)
class Source:
    """One input: a file, a folder (hf save_to_disk), or a cached dataset name (hf)."""
    path: str
    layout: str
    size: int                       # bytes as stored (0 for a dataset name until opened)
    name: bool = False              # `path` is a Hugging Face dataset name, not a path


@dataclass(frozen=True)
class ReadOptions:
    text_field: str = "text"
    hf_split: str = "train"
    hf_config: str = None
    skip_bad_records: bool = False


def compression(path):
    """The compression of a file by its suffix: "gzip", "bzip2", "xz", "zstd", or None."""
    return COMPRESSED.get(os.path.splitext(path)[1].lower())


def _stem(path):
    """The file name without a compression suffix: wiki.xml.bz2 -> wiki.xml."""
    name = os.path.basename(path)
    return os.path.splitext(name)[0] if compression(name) else name


def is_hf_folder(path):
    return os.path.isdir(path) and (os.path.isfile(os.path.join(path, "dataset_dict.json"))
                                    or os.path.isfile(os.path.join(path, "state.json")))


HEAD_SPACE = b"\xef\xbb\xbf \t\r\n"    # what may come before a file's first byte of content: a BOM, white space


def sniff(path, head):
    """The layout of a file from its (decompressed) first bytes, or None."""
    text = head.lstrip(HEAD_SPACE)
    if text.startswith(b"<?xml") or text.startswith(b"<mediawiki"):
        return "mediawiki"
    if text.startswith(b"<doc "):
        return "wikiextractor"
    if text.startswith(b"{"):
        return "wikiextractor" if WIKIEXTRACTOR_NAME.match(os.path.basename(path)) else "jsonl"
    if head.startswith(b"PAR1"):
        return "parquet"
    return None


NAME_LAYOUTS = {".xml": "mediawiki", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
                ".arrow": "hf", ".txt": "text"}


def detect_layout(path):
    """The layout of one file: by its name (compression suffixes aside), else by its first bytes,
    else text when it is not compressed; CorpusError for a compressed file neither tells."""
    by_name = NAME_LAYOUTS.get(os.path.splitext(_stem(path).lower())[1])
    if by_name:
        return by_name
    found = sniff(path, read_head(path))
    if found:
        return found
    if compression(path):
        raise CorpusError(f"{path}: cannot tell the layout of this compressed file from its name or first "
                          f"bytes; give --input_format ({', '.join(LAYOUTS)})")
    return "text"                    # as before: a file given by name is text (binary data is refused there)


def read_head(path, n=4096):
    """The first `n` bytes of a file, decompressed (b'' where that fails: the reader says why)."""
    try:
        with open_stream(path) as (stream, _):
            return stream.read(n)
    except (OSError, EOFError, CorpusError):
        return b""


def find_sources(paths, input_format=None, exclude=None, options=ReadOptions()):
    """The inputs in order, each with its layout: a file as given, a folder's files sorted
    (recursive; text: its .txt files), a save_to_disk folder whole, a dataset name (hf only).

    Files under the folder `exclude` (the output folder) are skipped.
    """
    skip = os.path.join(os.path.realpath(exclude), "") if exclude else None
    sources = []
    for path in paths:
        if input_format == "hf" and not os.path.exists(path):
            sources.append(_hf_name_source(path, options))
        elif os.path.isfile(path):
            sources.append(Source(path, input_format or detect_layout(path), os.path.getsize(path)))
        elif is_hf_folder(path) and input_format in (None, "hf"):
            sources.append(Source(path, "hf", sum(map(os.path.getsize, hf_folder_files(path, options.hf_split)))))
        elif os.path.isdir(path):
            if skip and os.path.join(os.path.realpath(path), "") == skip:
                raise CorpusError(f"--input {path} is the --output_dir: give the corpus and the shards folders of "
                                  f"their own")
            found = _folder_sources(path, input_format, skip)
            if not found:
                wanted = "input files" if input_format not in (None, "text") else ".txt files"
                raise CorpusError(f"--input {path}: folder holds no {wanted}")
            sources.extend(found)
        elif os.path.exists(path):
            raise CorpusError(f"--input {path}: not a regular file or folder (a FIFO, socket or device, which reading "
                              f"could wait on for ever); give files or folders")
        else:
            looks_like_name = re.fullmatch(r"[\w.-]+(/[\w.-]+)?", path) and not os.path.splitext(path)[1]
            hint = " (a Hugging Face dataset name needs --input_format hf)" if looks_like_name else ""
            raise CorpusError(f"--input {path}: no such file or folder{hint}")
    for source in sources:
        if source.size == 0 and os.path.isfile(source.path):
            kind = compression(source.path)
            logger.warning("%s: an empty file (0 bytes)%s: it gives no documents", source.path,
                           f", so not even {kind} data (a download or copy that failed?)" if kind else "")
    return sources


def _folder_sources(path, input_format, skip):
    """The input files of a folder (recursive, sorted): .txt files as text, as before; also, unless
    --input_format says one layout, the files other layouts are named by (wiki_NN, .xml, .jsonl,
    .parquet, ...). Other files (notes, READMEs) are not input."""
    files = sorted(os.path.join(root, name) for root, _, names in os.walk(path) for name in names)
    if skip:
        files = [f for f in files if not os.path.realpath(f).startswith(skip)]
    irregular = [f for f in files if not os.path.isfile(f)]
    if irregular:  # a FIFO would block the reader for ever; a dangling link has nothing to read
        logger.warning("--input %s: skipping %d entries that are not regular files (FIFOs, sockets, dangling links): %s",
                       path, len(irregular), ", ".join(irregular[:3]))
        files = [f for f in files if os.path.isfile(f)]
    sources = []
    for f in files:
        name = os.path.basename(f)
        by_name = NAME_LAYOUTS.get(os.path.splitext(_stem(name).lower())[1])
        if WIKIEXTRACTOR_NAME.match(name):
            by_name = "wikiextractor"
        if input_format is None and by_name is not None and (by_name == "text" or not name.startswith(".")):
            layout = detect_layout(f) if by_name == "wikiextractor" else by_name
        elif input_format is not None and (by_name == input_format or (by_name == "text" and input_format == "text_docs")):
            layout = input_format
        else:
            continue
        sources.append(Source(f, layout, os.path.getsize(f)))
    return sources


def hf_folder_files(path, split):
    """The data files a save_to_disk folder is read from: those its state.json names (in a dataset
    dict, those of `split`, or of every split where it has none). Every split and file, symlinks
    resolved, must lie inside the folder: a crafted state.json or dataset_dict.json naming a path out
    of it is refused, so what is read is what the folder's size and modification times cover."""
    root = os.path.join(os.path.realpath(path), "")
    if not os.path.isfile(os.path.join(path, "dataset_dict.json")):
        return _split_files(path, root, path, "")
    splits = _saved_json(path, "dataset_dict.json").get("splits")
    if not isinstance(splits, list) or not all(isinstance(name, str) for name in splits):
        raise CorpusError(f"{path}: dataset_dict.json has no list of split names ('splits'), as save_to_disk writes")
    files = {}
    for name in splits:
        folder = os.path.join(path, name)
        _check_inside(root, folder, f"{path}: dataset_dict.json's split {name!r}")
        files[name] = _split_files(path, root, folder, f"{name}/")
    return files.get(split) or [f for split_files in files.values() for f in split_files]


def _split_files(path, root, folder, prefix):
    state = _saved_json(path, f"{prefix}state.json")
    entries = state.get("_data_files")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("filename"), str)
                                                for e in entries):
        raise CorpusError(f"{path}: {prefix}state.json has no list of data files ('_data_files'), as save_to_disk "
                          "writes")
    files = [os.path.join(folder, e["filename"]) for e in entries]
    for entry, f in zip(entries, files):
        what = f"{path}: {prefix}state.json's data file {entry['filename']!r}"
        _check_inside(root, f, what)
        if not os.path.isfile(f):
            raise CorpusError(f"{what} is missing")
    return files


def _saved_json(path, name):
    try:
        with open(os.path.join(path, name), encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise CorpusError(f"{path}: {name} is not readable JSON, as save_to_disk writes ({type(e).__name__}: "
                          f"{e})") from None
    if not isinstance(value, dict):
        raise CorpusError(f"{path}: {name} is {json_kind(value)}, not the object save_to_disk writes")
    return value


def _check_inside(root, path, what):
    real = os.path.realpath(path)
    if not real.startswith(root):
        raise CorpusError(f"{what} is {real}, outside the dataset folder: a folder is read from its own files only "
                          "(refused)")


def _hf_offline():
    """Import `datasets` with every download turned off."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    datasets = require("datasets", "reading a Hugging Face dataset")
    datasets.config.HF_DATASETS_OFFLINE = True
    try:
        import huggingface_hub.constants as hub
        hub.HF_HUB_OFFLINE = True
    except ImportError:
        pass
    datasets.logging.set_verbosity_error()
    return datasets


def _hf_name_source(name, options):
    ds = _open_hf_name(name, options)
    size = sum(os.path.getsize(f["filename"]) for f in ds.cache_files if os.path.exists(f["filename"]))
    return Source(name, "hf", size, name=True)


def _open_hf_name(name, options):
    datasets = _hf_offline()
    config = f", config {options.hf_config!r}" if options.hf_config else ""
    try:
        return datasets.load_dataset(name, options.hf_config, split=options.hf_split)
    except Exception as e:  # noqa: BLE001 - offline misses surface as several exception types
        args = ", ".join(repr(a) for a in (name, options.hf_config) if a)
        raise CorpusError(f"--input {name}: Hugging Face dataset{config}, split {options.hf_split!r} is not in "
                          f"the local cache ({datasets.config.HF_DATASETS_CACHE}; {type(e).__name__}) and this "
                          f"tool never downloads: fetch it where there is internet with python -c \"import datasets; "
                          f"datasets.load_dataset({args}, split={options.hf_split!r})\", or save_to_disk it and "
                          "give that folder") from None


def open_hf(source, options):
    datasets = _hf_offline()
    path = source.path
    if source.name:
        return _open_hf_name(path, options)
    try:
        if os.path.isdir(path):
            ds = datasets.load_from_disk(path)
            if isinstance(ds, datasets.DatasetDict):
                if options.hf_split not in ds:
                    raise CorpusError(f"{path}: no split {options.hf_split!r} (it has: {', '.join(ds)}); "
                                      "give --hf_split")
                ds = ds[options.hf_split]
            return ds
        if path.endswith(".arrow"):
            return datasets.Dataset.from_file(path)
        builder = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv",
                   ".txt": "text"}.get(os.path.splitext(_stem(path))[1].lower())
        if builder is None:
            raise CorpusError(f"{path}: not a data file `datasets` reads (.jsonl, .json, .parquet, .csv, .txt)")
        return datasets.load_dataset(builder, data_files=path, split="train", streaming=True)
    except CorpusError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many types for a bad folder
        raise CorpusError(f"{path}: not a Hugging Face dataset `datasets` can open ({type(e).__name__}: {e})") from None


class _ZstdReader(io.RawIOBase):
    """A .zst file decompressed as a stream (several frames too); a frame cut short is an EOFError
    (zstandard's own stream reader ends silently there)."""

    def __init__(self, raw):
        self.raw = raw
        self.zstd = require("zstandard", f"reading {getattr(raw, 'name', 'a .zst file')}")
        self.obj = self.zstd.ZstdDecompressor().decompressobj()
        self.buffer = b""
        self.fed = False             # bytes given to the current frame's decompressor

    def readable(self):
        return True

    def readinto(self, out):
        while not self.buffer:
            data = self.raw.read(READ_BYTES)
            if not data:
                if self.fed and not self.obj.eof:
                    raise EOFError("a zstd frame ended before its end mark")
                return 0
            while data:
                try:
                    self.buffer += self.obj.decompress(data)
                except self.zstd.ZstdError as e:
                    raise OSError(f"not zstd data ({e})") from None
                self.fed = True
                data = b""
                if self.obj.eof:
                    data = self.obj.unused_data
                    self.obj = self.zstd.ZstdDecompressor().decompressobj()
                    self.fed = False
        n = min(len(out), len(self.buffer))
        out[:n] = self.buffer[:n]
        self.buffer = self.buffer[n:]
        return n


# A bz2 stream starts with its header ("BZh" and the block size digit) and its first block's magic
# (pi's digits), byte-aligned; inside a stream blocks are not byte-aligned, so a match there is rare,
# and it is caught: the piece before it is then no complete stream.
BZ2_STREAM_START = re.compile(rb"BZh[1-9]1AY&SY")
BZ2_SCAN_BYTES = 1 << 15         # read this much of the file at a time to find the streams
BZ2_READ_AHEAD = 8 << 20         # compressed bytes being decompressed ahead of the reader, at most
BZ2_STREAM_LIMIT = 8 << 20       # a stream longer than this (a dump of one stream): read by a BZ2File from there
BZ2_THREADS = min(4, os.cpu_count() or 1)


def _bz2_streams(data):
    """(the decompressed bytes of `data`, whether it is whole bz2 streams: ends where one ends);
    OSError for data that is no bz2."""
    out = []
    while data:
        d = bz2.BZ2Decompressor()
        out.append(d.decompress(data))
        if not d.eof:
            return b"".join(out), False
        data = d.unused_data
    return b"".join(out), True


def _try_bz2_streams(data):
    try:
        return _bz2_streams(data)
    except OSError:            # a piece cut at a false match: the piece before it was no whole stream
        return None, False


class _Bz2Streams(io.RawIOBase):
    """A .bz2 file of many streams (Wikipedia's multistream dumps: 100 pages a stream) decompressed
    on BZ2_THREADS threads (bz2 lets go of the GIL), a few streams ahead of the reader (at most
    BZ2_READ_AHEAD compressed bytes, a sixteenth of a smaller file), in order: the bytes BZ2File
    gives, several times as fast. The file is read BZ2_SCAN_BYTES at a time, cut where a stream
    starts; a piece that is no whole stream (a false match) is decompressed again joined to the
    next ones. From a stream longer than BZ2_STREAM_LIMIT on, the file is read by a BZ2File."""

    def __init__(self, raw):
        self.raw = raw
        size = os.fstat(raw.fileno()).st_size if hasattr(raw, "fileno") else BZ2_READ_AHEAD
        self.ahead = min(BZ2_READ_AHEAD, max(size // 16, 1))
        self.pool = ThreadPoolExecutor(BZ2_THREADS, thread_name_prefix="bz2")
        self.pending = deque()       # (future of _try_bz2_streams, the piece)
        self.pending_bytes = 0
        self.scan, self.scan_start, self.eof = b"", raw.tell(), False
        self.rest = None             # the BZ2File reading on from a long stream, once needed
        self.rest_offset = None      # where it starts
        self.buffer, self.at = b"", 0

    def readable(self):
        return True

    def _next_piece(self):
        """The file's next piece (from one stream start to the next), or None at the end or for a
        stream too long (self.rest_offset is then where to read on with a BZ2File)."""
        searched = 1                 # where a stream start may begin that was not searched for yet
        while True:
            match = BZ2_STREAM_START.search(self.scan, searched)
            if match:
                piece, self.scan = self.scan[:match.start()], self.scan[match.start():]
                self.scan_start += len(piece)
                return piece
            if self.eof:
                piece, self.scan = self.scan, b""
                self.scan_start += len(piece)
                return piece or None
            if len(self.scan) > BZ2_STREAM_LIMIT:
                self.rest_offset, self.scan, self.eof = self.scan_start, b"", True
                return None
            data = self.raw.read(BZ2_SCAN_BYTES)
            self.eof = not data
            searched = max(1, len(self.scan) - len(b"BZh91AY&SY") + 1)
            self.scan += data

    def _fill(self):
        while self.rest_offset is None and (not self.pending or self.pending_bytes < self.ahead):
            piece = self._next_piece()
            if piece is None:
                return
            self.pending.append((self.pool.submit(_try_bz2_streams, piece), piece))
            self.pending_bytes += len(piece)

    def _take(self):
        """The next decompressed bytes (maybe b""), None at the end."""
        self._fill()
        if not self.pending:
            if self.rest_offset is None:
                return None
            if self.rest is None:
                self.raw.seek(self.rest_offset)
                self.rest = bz2.BZ2File(self.raw, "rb")
            return self.rest.read(READ_BYTES) or None
        future, piece = self.pending.popleft()
        self.pending_bytes -= len(piece)
        data, whole = future.result()
        while not whole:             # a false cut: join the next pieces until the streams end
            self._fill()
            if not self.pending:
                data, whole = _bz2_streams(piece)   # raises what BZ2File would: damaged, or cut short
                if not whole:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                break
            _, more = self.pending.popleft()
            self.pending_bytes -= len(more)
            piece += more
            data, whole = _try_bz2_streams(piece)
        return data

    def readinto(self, out):
        while self.at >= len(self.buffer):
            data = self._take()
            if data is None:
                return 0
            self.buffer, self.at = data, 0
        n = min(len(out), len(self.buffer) - self.at)
        out[:n] = self.buffer[self.at:self.at + n]
        self.at += n
        return n

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self.rest is not None:
            self.rest.close()
        super().close()


class open_stream:
    """`with open_stream(path) as (stream, raw)`: the decompressed bytes, and the file as stored
    (raw.tell() is how much of it was read)."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.raw = open(self.path, "rb")
        kind = compression(self.path)
        if kind == "gzip":
            stream = gzip.GzipFile(fileobj=self.raw, mode="rb")
        elif kind == "bzip2":   # every stream of a multistream dump, several at a time
            stream = io.BufferedReader(_Bz2Streams(self.raw), READ_BYTES)
        elif kind == "xz":
            stream = lzma.LZMAFile(self.raw, "rb")
        elif kind == "zstd":
            stream = io.BufferedReader(_ZstdReader(self.raw), READ_BYTES)
        else:
            stream = self.raw
        self.stream = stream
        return stream, self.raw

    def __exit__(self, *exc):
        self.stream.close()
        self.raw.close()


# What reading a compressed file that is cut short or damaged raises: gzip's and lzma's damage inside
# the data is no OSError (zlib.error, lzma.LZMAError), bz2's and zstd's is.
DAMAGED_DATA = (EOFError, OSError, zlib.error, lzma.LZMAError)


def corrupt_data_error(path, raw, error):
    """The one line for a compressed file that is cut short or damaged (one of DAMAGED_DATA)."""
    kind = compression(path) or "file"
    where = raw.tell() if not raw.closed else "?"
    size = os.path.getsize(path)
    if isinstance(error, EOFError):
        at = f"cut short at byte {where} of {size}"
    else:     # where the damage was noticed: the compressed bytes read so far (read ahead of it)
        at = f"damaged (noticed with {where} of {size} bytes read)"
    return CorpusError(f"{path}: {kind} data {at} ({error}); fetch or decompress the file again")

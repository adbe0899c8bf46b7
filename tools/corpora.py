"""Where documents come from: the input layouts tools/prepare_data.py reads, told apart, streamed.

Owns finding the inputs and their layout, reading each layout as a stream of documents,
reducing markup to text and splitting text into sentences. prepare_data owns what happens next.

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

A document is one of three things, whichever is cheapest to read in the main process:
a list of str (sentences, the `text` layout), a str (plain text; every line break is a
paragraph break) or a `Wikitext` (a str still holding markup). `document_sentences` turns any
of them into sentences; prepare_data runs it in its worker processes, where the cost is.
Readers yield (document, input bytes consumed since the previous yield), the bytes being those of
the file as stored (compressed ones count compressed bytes), for a progress bar over the input.

Sentences are split by blingfire (chosen by measurement against pysbd, syntok and spaCy's rule
based sentencizer: bench/README.md, "Corpora in"); `SPLITTERS` holds all four for the bench.
"""
import bisect
import bz2
import functools
import gzip
import hashlib
import importlib
import io
import json
import logging
import lzma
import os
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from xml.parsers import expat

logger = logging.getLogger(__name__)

LAYOUTS = ("text", "text_docs", "mediawiki", "wikiextractor", "jsonl", "parquet", "hf")
COMPRESSED = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd"}
OPTIONAL = "requirements-corpora.txt"
READ_BYTES = 1 << 20
WIKIEXTRACTOR_NAME = re.compile(r"^wiki_\d+(\.bz2|\.gz)?$")
MEDIAWIKI_NS = "http://www.mediawiki.org/xml/export-"


class CorpusError(ValueError):
    """Input that cannot be read as its layout; the message names the file (and record or byte)."""


class Wikitext(str):
    """A document's text with its wikitext markup still in it (reduced in a worker)."""

    __slots__ = ()


def require(module, purpose):
    """Import an optional package, or raise one line naming the pip command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        package = {"blingfire": "blingfire", "mwparserfromhell": "mwparserfromhell", "pyarrow.parquet": "pyarrow",
                   "zstandard": "zstandard", "datasets": "datasets"}.get(module, module)
        raise CorpusError(f"{purpose} needs the Python package {package}: pip install -r {OPTIONAL} "
                          f"(or pip install {package})") from None


# ----------------------------------------------------------------------------- sources

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


# ----------------------------------------------------------------------------- byte streams

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
        elif kind == "bzip2":
            stream = bz2.BZ2File(self.raw, "rb")          # reads every stream of a multistream dump
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


def corrupt_data_error(path, raw, error):
    """The one line for a compressed file that is cut short or damaged."""
    kind = compression(path) or "file"
    where = raw.tell() if not raw.closed else "?"
    size = os.path.getsize(path)
    cut = "cut short" if isinstance(error, EOFError) else "damaged"
    return CorpusError(f"{path}: {kind} data {cut} at byte {where} of {size} ({error}); "
                       "fetch or decompress the file again")


# ----------------------------------------------------------------------------- readers

@dataclass
class ReadCounts:
    """What the readers met besides documents."""
    bad_records: int = 0            # skipped with --skip_bad_records
    redirects: int = 0              # MediaWiki redirect pages
    other_pages: int = 0            # MediaWiki pages outside namespace 0 (talk, user, templates, ...)
    layouts: dict = field(default_factory=dict)   # layout -> sources read


def read_documents(source, options, counts, text_reader):
    """The documents of one source: yields (document, bytes consumed)."""
    counts.layouts[source.layout] = counts.layouts.get(source.layout, 0) + 1
    if source.layout == "text":
        yield from text_reader.read_file(source.path)
        return
    yield from READERS[source.layout](source, options, counts)


def _decoded_lines(source):
    """(line number, text, bytes consumed) of a (compressed) text file; CorpusError for bytes that
    are not UTF-8 or a stream cut short."""
    path = source.path
    with open_stream(path) as (stream, raw):
        last = 0
        number = 0
        try:
            for number, line in enumerate(stream, start=1):
                pos = raw.tell()
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise CorpusError(f"{path}: line {number} is not UTF-8 (byte 0x{line[e.start]:02x} at column "
                                      f"{e.start + 1}); convert the file first, e.g. iconv -f latin1 -t utf-8") from None
                yield number, text.removeprefix("\ufeff") if number == 1 else text, pos - last
                last = pos
        except (EOFError, OSError) as e:
            raise corrupt_data_error(path, raw, e) from None


def _read_text_docs(source, options, counts):
    for _, line, nbytes in _decoded_lines(source):
        line = line.strip()
        yield (line if line else None), nbytes


def _read_wikiextractor(source, options, counts):
    """<doc id url title> blocks (the title line that starts a block is skipped), or --json lines."""
    if read_head(source.path).lstrip(HEAD_SPACE).startswith(b"{"):
        yield from _read_jsonl(source, replace_field(options, "text"), counts)
        return
    lines, title, consumed, start = None, None, 0, 0
    for number, line, nbytes in _decoded_lines(source):
        consumed += nbytes
        if line.startswith("<doc ") and lines is None:
            lines, start = [], number
            match = re.search(r'title="([^"]*)"', line)
            title = match.group(1) if match else None
            continue
        if line.startswith("</doc>") and lines is not None:
            if lines and title is not None and lines[0].strip() == title.strip():
                lines = lines[1:]
            yield "\n".join(lines).strip(), consumed
            lines, consumed = None, 0
            continue
        if lines is not None:
            lines.append(line.rstrip("\n"))
    if lines is not None:
        raise CorpusError(f"{source.path}: the <doc> block of line {start} has no </doc> (file cut short?)")
    if consumed:
        yield None, consumed


def replace_field(options, name):
    return ReadOptions(name, options.hf_split, options.hf_config, options.skip_bad_records)


def _field(record, name):
    """record[name], where a dotted name walks into nested objects ("meta.text")."""
    value = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return KeyError
        value = value[part]
    return value


def _read_jsonl(source, options, counts):
    name = options.text_field
    seen_field = False
    for number, line, nbytes in _decoded_lines(source):
        if not line.strip():
            yield None, nbytes
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if number == 1 and line.lstrip().startswith("["):
                raise CorpusError(f"{source.path}: a JSON array, not JSON lines (one object per line); convert it, "
                                  "e.g. jq -c '.[]'") from None
            problem = f"line {number} is not JSON ({e.msg} at column {e.colno})"
        except RecursionError:
            problem = f"line {number} is not JSON this reader takes ({JSON_TOO_DEEP})"
        else:
            text = _field(record, name) if isinstance(record, dict) else KeyError
            if text is None:           # a null text: an empty document
                yield None, nbytes
                continue
            problem = not_text(text)
            if problem is None:
                seen_field = True
                yield text, nbytes
                continue
            if not isinstance(record, dict):
                problem = f"line {number} is {json_kind(record)}, not an object with a field {name!r}"
            elif text is KeyError:
                keys = ", ".join(list(record)[:12])
                problem = f"line {number} has no field {name!r} (it has: {keys}); give --text_field"
                if not seen_field and not options.skip_bad_records:
                    raise CorpusError(f"{source.path}: {problem}")
            else:
                problem = f"line {number}: field {name!r} {problem}"
        bad_record(source, options, counts, problem)
        yield None, nbytes


JSON_TOO_DEEP = "arrays or objects nested too deeply"
_SURROGATE = re.compile("[\ud800-\udfff]")
_KINDS = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
          dict: "an object", bytes: "binary data"}


def json_kind(value):
    """The kind of a value read from JSON (or Arrow), in JSON's words: null, a number, an array, ..."""
    return "null" if value is None else _KINDS.get(type(value), type(value).__name__)


def not_text(value):
    """What makes a document's value no text ("is a number, not a string", "holds a lone surrogate
    ..."), or None for a str of Unicode text. JSON's \\ud800 escapes decode to halves of a UTF-16
    pair that no UTF-8 encoder (nor the tokenizer) takes."""
    if not isinstance(value, str):
        return f"is {json_kind(value)}, not a string"
    lone = _SURROGATE.search(value)
    if lone:
        return (f"holds a lone surrogate \\u{ord(lone.group()):04x} at character {lone.start() + 1} "
                "(half of a UTF-16 pair, not text)")
    return None


def bad_record(source, options, counts, problem):
    """A record that is no document: one error line, or with --skip_bad_records counted."""
    if not options.skip_bad_records:
        raise CorpusError(f"{source.path}: {problem} (--skip_bad_records skips and counts such records)")
    counts.bad_records += 1


def _read_mediawiki(source, options, counts):
    """Article pages of a MediaWiki XML export, streamed: each page is dropped once read."""
    path = source.path
    with open_stream(path) as (stream, raw):
        last = 0
        events = ElementTree.iterparse(stream, events=("start", "end"))
        root = None
        try:
            for event, elem in events:
                if root is None:
                    tag = elem.tag
                    if not (tag.startswith("{" + MEDIAWIKI_NS) and tag.endswith("}mediawiki")):
                        raise CorpusError(f"{path}: not a MediaWiki XML dump (its root element is "
                                          f"<{tag.split('}')[-1]}>, namespace {tag[1:].split('}')[0] if '}' in tag else 'none'}; "
                                          f"expected <mediawiki xmlns=\"{MEDIAWIKI_NS}...\">)")
                    root, ns = elem, tag[:-len("mediawiki")]
                    continue
                if event != "end" or elem.tag != ns + "page":
                    continue
                pos = raw.tell()
                text = elem.findtext(f"{ns}revision/{ns}text") or ""
                if elem.findtext(ns + "ns", "0").strip() != "0":
                    counts.other_pages += 1
                    text = None
                elif elem.find(ns + "redirect") is not None or text.lstrip()[:9].upper() == "#REDIRECT":
                    counts.redirects += 1
                    text = None
                root.clear()                 # the page's element is no longer held
                yield (Wikitext(text) if text else None), pos - last
                last = pos
        except ElementTree.ParseError as e:
            raise _xml_error(path, e) from None
        except (EOFError, OSError) as e:
            raise corrupt_data_error(path, raw, e) from None
        if root is None:
            raise CorpusError(f"{path}: empty, not a MediaWiki XML dump")
        yield None, os.path.getsize(path) - last


# What expat refuses of a file that declares entities (MediaWiki exports declare none), in words.
_XML_REFUSED = {
    expat.errors.XML_ERROR_UNDEFINED_ENTITY: "an entity the file does not define (no external entity, XXE, is "
                                             "ever read)",
    expat.errors.XML_ERROR_RECURSIVE_ENTITY_REF: "an entity that refers to itself",
    getattr(expat.errors, "XML_ERROR_AMPLIFICATION_LIMIT_BREACH", "amplification"):
        "entities that expand beyond the parser's limit (a 'billion laughs' file)"}
_XML_CUT = {expat.errors.XML_ERROR_NO_ELEMENTS, expat.errors.XML_ERROR_UNCLOSED_TOKEN,
            expat.errors.XML_ERROR_PARTIAL_CHAR}     # where expat met the end of the file


def _xml_error(path, error):
    """The one line for XML expat would not read: what it refused, or where it is not well-formed."""
    line, column = error.position
    reason = expat.errors.messages.get(error.code)
    if reason in _XML_REFUSED:
        return CorpusError(f"{path}: refused at line {line}, column {column}: {_XML_REFUSED[reason]} ({error})")
    cut = "; the file may be cut short" if reason in _XML_CUT else ""
    return CorpusError(f"{path}: not well-formed XML at line {line}, column {column} ({error}){cut}")


def _read_parquet(source, options, counts):
    pq = require("pyarrow.parquet", f"reading {source.path} (parquet)")
    try:
        pf = pq.ParquetFile(source.path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise CorpusError(f"{source.path}: not a readable parquet file ({e})") from None
    columns = pf.schema_arrow.names
    if options.text_field not in columns:
        raise CorpusError(f"{source.path}: parquet file has no column {options.text_field!r} (it has: "
                          f"{', '.join(columns[:12])}); give --text_field")
    rows = max(pf.metadata.num_rows, 1)
    done = given = 0
    for group in range(pf.num_row_groups):
        table = pf.read_row_group(group, columns=[options.text_field])
        for text in table.column(0).to_pylist():
            done += 1
            share = done * source.size // rows
            yield _row_text(source, options, counts, done, text), share - given
            given = share
        del table
    if source.size > given:
        yield None, source.size - given


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


def _open_hf(source, options):
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


def _read_hf(source, options, counts):
    ds = _open_hf(source, options)
    name = options.text_field
    columns = ds.column_names or []
    if columns and name not in columns:
        raise CorpusError(f"{source.path}: the dataset has no column {name!r} (it has: {', '.join(columns[:12])}); "
                          "give --text_field")
    if hasattr(ds, "data"):           # an Arrow-backed Dataset: read its memory map in batches
        rows = max(len(ds), 1)
        total, done, given = source.size, 0, 0
        table = ds.select_columns([name]).with_format("arrow")
        for start in range(0, len(ds), 1024):
            for text in table[start:start + 1024].column(0).to_pylist():
                done += 1
                share = done * total // rows
                yield _row_text(source, options, counts, done, text), share - given
                given = share
        if total > given:
            yield None, total - given
        return
    for number, row in enumerate(ds, start=1):     # streaming (local data files)
        yield _row_text(source, options, counts, number, row.get(name)), 0
    yield None, source.size


def _row_text(source, options, counts, number, text):
    """A parquet or Arrow row's text; None for a null, or for a bad record (binary data, a list)."""
    if text is None or isinstance(text, str):
        return text
    bad_record(source, options, counts, f"row {number}: column {options.text_field!r} {not_text(text)}")
    return None


READERS = {"text_docs": _read_text_docs, "mediawiki": _read_mediawiki, "wikiextractor": _read_wikiextractor,
           "jsonl": _read_jsonl, "parquet": _read_parquet, "hf": _read_hf}


# ----------------------------------------------------------------------------- wikitext

_COMMENT = re.compile(r"<!--.*?(-->|\Z)", re.DOTALL)
# Tables open and close at the start of a line; elsewhere "|}" is a template's empty last argument.
_HEAVY = re.compile(r"\{\{|\}\}|^[ \t]*\{\||^[ \t]*\|\}|<ref\b[^>]*?/>|<ref\b[^>]*>|</ref\s*>",
                    re.IGNORECASE | re.MULTILINE)
_CLOSES = {"}}": "{{", "|}": "{|"}
_LINK_DROP = re.compile(r"^\s*:?\s*(file|image|category|media|wikipedia|wp|template|help|portal|"
                        r"draft|module|special|[a-z]{2,3}(-[a-z]+)?)\s*:", re.IGNORECASE)
_INVISIBLE_TAGS = {"ref", "references", "math", "chem", "score", "gallery", "timeline", "graph", "syntaxhighlight",
                   "source", "pre", "code", "templatestyles", "imagemap", "mapframe", "hiero", "nowiki"}
_SPACES = re.compile(r"[ \t\u00a0]+")


def _drop_heavy(text):
    """Remove comments, templates ({{...}}, nested), tables ({|...|}) and <ref>s in one scan.

    They are dropped whole, so finding their extent is all it takes; doing it before the parser
    is what makes wikitext reduction fast (mwparserfromhell spends most of its time in them).
    An opener without its closer drops the rest of the page, as MediaWiki would show it broken.
    """
    text = _COMMENT.sub("", text)
    out, stack, pos = [], [], 0     # stack: the open constructs, outermost first
    for m in _HEAVY.finditer(text):
        tok = m.group(0).strip().lower()
        if tok.startswith("<ref") and tok.endswith("/>"):
            if not stack:
                out.append(text[pos:m.start()])
                pos = m.end()
        elif tok in ("{{", "{|") or tok.startswith("<ref"):
            if not stack:
                out.append(text[pos:m.start()])
            stack.append(tok[:4])
        else:
            want = _CLOSES.get(tok, "<ref")
            if want in stack:         # close it (and anything left open inside it)
                while stack.pop() != want:
                    pass
                if not stack:
                    pos = m.end()
    if not stack:
        out.append(text[pos:])
    return "".join(out)


# mwparserfromhell's tokenizer retries a construct that never closes at every later position: an
# unclosed external link, tag or link is quadratic in the page (70 s for 0.24 MB of "[http://a.b "),
# an external link nested in another's title doubles the work per level (20 of them: 1 s, 1,000:
# beyond 10 minutes), and a long heading line of entities is quadratic too. So the brackets and
# tags that never close are escaped before it parses (as HTML entities: the same text comes out),
# links and tags nest at most _MAX_NESTING deep and no link opens inside an external link's title,
# and the parser sees at most _PARSE_BLOCK characters at a time, cut where nothing is open.
_PARSE_BLOCK = 16384
_MAX_NESTING = 8
_ESCAPES = {"[": "&#91;", "<": "&lt;"}


@functools.lru_cache(maxsize=1)
def _markup_tokens():
    """What _unclosed scans for: [[, ]], an external link's [ (a URL scheme follows), ], a line
    break, and tags (groups: "/" of a closing tag, the name, what follows it up to ">", the ">")."""
    mw = require("mwparserfromhell", "reading MediaWiki wikitext")
    schemes = "|".join(s + ("://" if slashes else ":") for s, slashes in sorted(mw.definitions.URI_SCHEMES.items()))
    return re.compile(r"\[\[|\]\]|\[(?=%s|//)|\]|\n|<(/?)([A-Za-z][A-Za-z0-9]*)(?=([^<>\n]*)(>?))" % schemes,
                      re.IGNORECASE), frozenset(mw.definitions.SINGLE)


def _unclosed(text):
    """(positions of the brackets and tag openers to escape, sorted; the line breaks where no
    bracket or tag is open). One scan, whatever the page."""
    tokens, single = _markup_tokens()
    escape, quiet, stack = [], [], []        # stack: (kind, position): "[[", "[" (external) or a tag name
    for m in tokens.finditer(text):
        token, at = m.group(0), m.start()
        if token == "\n":                    # an external link ends with its line
            _escape_above(stack, next((i for i, (kind, _) in enumerate(stack) if kind == "["), len(stack)), escape)
            if not stack:
                quiet.append(at)
        elif token[0] == "]":
            _close(stack, "[[" if token == "]]" and any(kind == "[[" for kind, _ in stack) else "[", escape)
        elif token[0] == "[":
            _open(stack, token, at, escape)
        else:
            closing, name, attributes, end = m.groups()
            name = name.lower()
            if name in single or (end and attributes.endswith("/")):
                continue
            if closing:
                _close(stack, name, escape)
            elif end:
                _open(stack, name, at, escape)
            else:                             # no ">" on its line: no tag
                escape.append(at)
    _escape_above(stack, 0, escape)
    return sorted(escape), quiet


def _open(stack, kind, at, escape):
    if len(stack) >= _MAX_NESTING or (kind[0] == "[" and stack and stack[-1][0] == "["):
        escape.extend(_brackets(kind, at))
    else:
        stack.append((kind, at))


def _close(stack, kind, escape):
    """Close the innermost open `kind`, escaping what is open inside it; a closer of nothing is text."""
    for depth in range(len(stack) - 1, -1, -1):
        if stack[depth][0] == kind:
            _escape_above(stack, depth + 1, escape)
            stack.pop()
            return


def _escape_above(stack, depth, escape):
    for kind, at in stack[depth:]:
        escape.extend(_brackets(kind, at))
    del stack[depth:]


def _brackets(kind, at):
    return (at, at + 1) if kind == "[[" else (at,)


def _parse_blocks(text):
    """`text` in pieces of at most _PARSE_BLOCK characters, cut at line breaks where nothing is open
    (else at a line break, else a space), with _unclosed's brackets and tags escaped."""
    escape, quiet = _unclosed(text)
    start = 0
    while start < len(text):
        stop = _block_end(text, start, quiet)
        lo, hi = bisect.bisect_left(escape, start), bisect.bisect_left(escape, stop)
        out, pos = [], start
        for at in escape[lo:hi]:
            out += [text[pos:at], _ESCAPES[text[at]]]
            pos = at + 1
        out.append(text[pos:stop])
        yield "".join(out)
        start = stop


def _block_end(text, start, quiet):
    limit = start + _PARSE_BLOCK
    if len(text) <= limit:
        return len(text)
    i = bisect.bisect_right(quiet, limit - 1) - 1
    if i >= 0 and quiet[i] >= start:
        return quiet[i] + 1
    for mark in ("\n", " "):
        at = text.rfind(mark, start, limit)
        if at > start:
            return at + 1
    return limit


def wikitext_to_text(wikitext):
    """Plain text of an article's wikitext: templates, tables, references, comments, files,
    categories, interlanguage links and headings removed, link text kept; paragraphs on lines."""
    mw = require("mwparserfromhell", "reading MediaWiki wikitext")
    pieces = []
    for block in _parse_blocks(_drop_heavy(wikitext)):
        text = _reduce(mw.parse(block, skip_style_tags=True), mw.nodes)
        if text:                          # a block cut inside a line goes on on the same line
            pieces += [text, "\n" if block.endswith("\n") else " "]
    return "".join(pieces[:-1])


def _reduce(code, nodes):
    """The text of parsed wikitext, as wikitext_to_text returns it."""
    parts = []
    for node in code.nodes:
        if isinstance(node, nodes.Text):
            parts.append(node.value)
        elif isinstance(node, nodes.Wikilink):
            if _LINK_DROP.match(str(node.title)):
                continue
            parts.append(str(node.text.strip_code() if node.text else node.title.strip_code()))
        elif isinstance(node, nodes.ExternalLink):
            if node.title:
                parts.append(node.title.strip_code())
        elif isinstance(node, nodes.Tag):
            tag = str(node.tag).lower()
            if tag in _INVISIBLE_TAGS or tag == "table":
                continue
            if tag in ("br", "hr"):
                parts.append("\n")
            elif tag == "li" or tag == "dt" or tag == "dd":
                parts.append("\n")
            elif node.contents:
                parts.append(_strip(node.contents))
        elif isinstance(node, nodes.Heading):
            parts.append("\n\n")
        elif isinstance(node, nodes.HTMLEntity):
            parts.append(node.normalize())
        elif isinstance(node, (nodes.Template, nodes.Comment, nodes.Argument)):
            continue
        else:
            parts.append(node.__strip__(normalize=True, collapse=True) or "")
    lines = []
    for line in "".join(parts).split("\n"):
        line = _SPACES.sub(" ", line.replace("'''", "").replace("''", "")).strip()
        if line and not line.startswith(("|", "!", "{", "}")):
            lines.append(line)
    return "\n".join(lines)


def _strip(wikicode):
    """The text of markup inside a tag (bold, italics, spans): link text kept, the rest removed."""
    return wikitext_to_text(str(wikicode)).replace("\n", " ")


# ----------------------------------------------------------------------------- sentences

def _blingfire():
    bf = require("blingfire", "splitting documents into sentences")
    return lambda text: bf.text_to_sentences(text).split("\n")


def _pysbd():
    pysbd = require("pysbd", "the pysbd sentence splitter")
    seg = pysbd.Segmenter(language="en", clean=False)
    return lambda text: [s.strip() for s in seg.segment(text)]


def _syntok():
    segmenter = require("syntok.segmenter", "the syntok sentence splitter")
    return lambda text: ["".join(t.spacing + t.value for t in sentence).strip()
                         for paragraph in segmenter.process(text) for sentence in paragraph]


def _spacy():
    spacy = require("spacy", "spaCy's sentencizer")
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    return lambda text: [s.text.strip() for s in nlp(text).sents]


SPLITTERS = {"blingfire": _blingfire, "pysbd": _pysbd, "syntok": _syntok, "spacy": _spacy}
SPLITTER = "blingfire"


class SentenceSplitter:
    """Paragraphs (lines) into sentences; the splitter is loaded on first use (in the worker)."""

    def __init__(self, name=SPLITTER):
        self.name = name
        self._split = None

    def __call__(self, paragraph):
        if self._split is None:
            self._split = SPLITTERS[self.name]()
        return [s for s in (x.strip() for x in self._split(paragraph)) if s]


def document_sentences(document, splitter):
    """The sentences of a document (a list of sentences is returned as it is)."""
    if isinstance(document, list):
        return document
    text = wikitext_to_text(document) if isinstance(document, Wikitext) else document
    sentences = []
    for paragraph in text.split("\n"):
        if paragraph.strip():
            sentences.extend(splitter(paragraph))
    return sentences


def document_size(document):
    """Characters of text in a document (the unit of --chunk_size_mb)."""
    return sum(map(len, document)) if isinstance(document, list) else len(document)


def cut_document(document, limit):
    """The pieces of a str document (a Wikitext stays one) of at most `limit` characters, in order,
    each cut at its last line break, else sentence end (". "), else space in its second half, else
    at `limit`: a worker then holds at most `limit` characters of it, whatever its size."""
    kind, start = type(document), 0
    while len(document) - start > limit:
        stop = start + limit
        for mark in ("\n", ". ", " "):
            at = document.rfind(mark, start + limit // 2, stop)
            if at >= 0:
                stop = at + len(mark)
                break
        yield kind(document[start:stop])
        start = stop
    yield kind(document[start:])


RECORDS = {"text_docs": "line", "jsonl": "line", "parquet": "row", "hf": "row", "mediawiki": "page",
           "wikiextractor": "document"}   # what a reader yields once each, by layout


def document_key(document):
    """A 64-bit hash of the document's text, case-folded and with its whitespace collapsed: equal for
    exact duplicates (markup and all, for wikitext), used to drop them and to deal parts."""
    text = " ".join(document) if isinstance(document, list) else document
    normalised = " ".join(text.casefold().split())
    return int.from_bytes(hashlib.blake2b(normalised.encode("utf-8"), digest_size=8).digest(), "little")

"""Where documents come from: one streamed reader per layout (tools/prep/layouts.py), giving the
documents of every input in order and counts of what else was met.

A document is one of three things, whichever is cheapest to read in the reader process:
a list of str (sentences, the `text` layout), a str (plain text; every line break is a
paragraph break) or a `Wikitext` (a str still holding markup). tools/prep/sentences.py's
`document_sentences` turns any of them into sentences; prepare_data runs it in its worker
processes, where the cost is. Readers yield (document, input bytes consumed since the previous
yield), the bytes being those of the file as stored (compressed ones count compressed bytes), for
a progress bar over the input; a record that holds no text goes to `bad_record`. A document
longer than --chunk_size_mb is cut into pieces of that size (CorpusReader), so a worker's memory
stays bounded whatever the input.
"""
import json
import logging
import os
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from xml.parsers import expat

from tools.prep import CorpusError, InputNotFoundError, PrepareDataError
from tools.prep.layouts import (DAMAGED_DATA, HEAD_SPACE, ReadOptions, compression, corrupt_data_error, json_kind,
                                open_hf, open_stream, read_head, require)

logger = logging.getLogger(__name__)

MEDIAWIKI_NS = "http://www.mediawiki.org/xml/export-"


class Wikitext(str):
    """A document's text with its wikitext markup still in it (reduced in a worker)."""

    __slots__ = ()


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
        except DAMAGED_DATA as e:
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
        except DAMAGED_DATA as e:
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


def _read_hf(source, options, counts):
    ds = open_hf(source, options)
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


RECORDS = {"text_docs": "line", "jsonl": "line", "parquet": "row", "hf": "row", "mediawiki": "page",
           "wikiextractor": "document"}   # what a reader yields once each, by layout


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
        head = read_head(path, 1 << 16)
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
        except DAMAGED_DATA as e:
            if not compression(path):
                raise
            raise corrupt_data_error(path, self._raw, e) from None

    def _read_file(self, path):
        lines, consumed = [], 0
        size = count = pieces = start = 0       # of the open document: text bytes, lines, cuts, first line
        with open_stream(path) as (f, self._raw):
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


class CorpusReader:
    """The documents of every source in order (iterate: (document, bytes consumed)), the text
    ones through a DocumentReader, and what was met. A document of more than `max_document_bytes`
    of text is cut into pieces of at most that size in every layout, warned about and counted."""

    def __init__(self, sources, options, max_document_bytes=None):
        self.sources, self.options = sources, options
        self.text = DocumentReader([], max_document_bytes)
        self.counts = ReadCounts()
        self.cut = self.pieces = 0         # records (of the other layouts) cut, and the pieces they became
        self.longest = (0, "")             # (characters, where) of the longest

    def __iter__(self):
        for source in self.sources:
            documents = read_documents(source, self.options, self.counts, self.text)
            yield from documents if source.layout == "text" else self._cut(source, documents)

    def _cut(self, source, documents):
        limit = self.text.max_document_bytes
        for number, (document, nbytes) in enumerate(documents, start=1):
            if not limit or not document or len(document) <= limit:
                yield document, nbytes
                continue
            where = f"{source.path}, {RECORDS.get(source.layout, 'record')} {number}"
            logger.warning("%s: a document of %.1f MB of text, more than --chunk_size_mb (%.2f MB): cut into pieces "
                           "of that size", where, len(document) / 2**20, limit / 2**20)
            self.cut += 1
            self.longest = max(self.longest, (len(document), where))
            for piece in cut_document(document, limit):
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

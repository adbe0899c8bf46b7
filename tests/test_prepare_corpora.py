"""tools/prepare_data.py on the corpora users have (tools/prep/layouts.py and documents.py): the
same documents written as a MediaWiki export (templates, tables, references, a redirect, a talk
page; .xml, .bz2 and a multistream .bz2), WikiExtractor output (<doc> files and --json), JSON lines
(.gz, .zst), parquet, a `datasets` save_to_disk folder and plain text all give the same documents,
the splitter's own sentence counts, shards without markup and stats.json counts that match."""
import bz2
import gzip
import importlib
import io
import json
import os
import types

import numpy as np
import pytest

from testkit import corpora as files
from tests.test_prepare_data import read_bing
from tools import prepare_data
from tools.prep import layouts, workers
from tools.prep.documents import RECORDS, CorpusReader, DocumentReader, ReadCounts, read_documents
from tools.prep.filters import DocumentFilter, document_key
from tools.prep.journal import WORK_DIR, run_fingerprint
from tools.prep.layouts import ReadOptions, find_sources
from tools.prep.sentences import _PARSE_BLOCK, SentenceSplitter, document_sentences, wikitext_to_text
from tools.prep.vocab import sample_documents

SPLIT = SentenceSplitter()
MARKUP = set("{}[]|<>=") | {"ref", "thumb", "infobox", "category", "cite", "wikitable", "redirect", "talk",
                            "convert", "citation", "needed", "caption", "picture", "jpg", "ort", "de"}


def make_vocab(path, documents):
    """Every word of the documents, and every markup character and word (so a leak would show as
    its own token rather than hide in [UNK])."""
    words = {w.strip(".?!,").lower() for _, doc in documents for p in doc for w in p.split()}
    chars = {chr(c) for c in range(33, 127)}
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words | MARKUP | chars)
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpora")
    docs = list(files.synthetic_documents(24, seed=3))
    paths = {
        "xml": files.write_mediawiki(str(root / "testwiki-pages-articles.xml"), docs),
        "bz2": files.write_mediawiki(str(root / "testwiki-pages-articles.xml.bz2"), docs),
        "multistream": files.write_mediawiki(str(root / "testwiki-pages-articles-multistream.xml.bz2"), docs,
                                             multistream=True, pages_per_stream=5),
        "wikiextractor": files.write_wikiextractor(str(root / "extracted"), docs, per_file=10),
        "wikiextractor_json": files.write_wikiextractor(str(root / "extracted_json"), docs, as_json=True),
        "jsonl_gz": files.write_jsonl(str(root / "docs.jsonl.gz"), docs),
        "jsonl_zst": files.write_jsonl(str(root / "docs.jsonl.zst"), docs),
        "parquet": files.write_parquet(str(root / "docs.parquet"), docs, rows_per_group=7),
        "hf": files.write_hf(str(root / "hf_saved"), docs),
        "text": files.write_text(str(root / "docs.txt"), docs, SPLIT),
    }
    expected = [[s for p in doc for s in SPLIT(p)] for _, doc in docs]
    return types.SimpleNamespace(root=root, docs=docs, paths=paths, expected=expected,
                                 vocab=make_vocab(root / "vocab.txt", docs))


def documents_of(path, **options):
    sources = find_sources([path], options.pop("input_format", None))
    reader = CorpusReader(sources, ReadOptions(**options))
    return [document_sentences(doc, SPLIT) for doc, _ in reader if doc], reader, sources


LAYOUTS = {"xml": "mediawiki", "bz2": "mediawiki", "multistream": "mediawiki", "wikiextractor": "wikiextractor",
           "wikiextractor_json": "wikiextractor", "jsonl_gz": "jsonl", "jsonl_zst": "jsonl", "parquet": "parquet",
           "hf": "hf", "text": "text"}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_gives_the_same_documents(corpus, name):
    docs, reader, sources = documents_of(corpus.paths[name])
    assert {s.layout for s in sources} == {LAYOUTS[name]}
    assert len(docs) == len(corpus.expected) and docs == corpus.expected
    if LAYOUTS[name] == "mediawiki":       # the talk page and the redirect are not documents
        assert (reader.counts.other_pages, reader.counts.redirects) == (1, 1)
    assert sum(n for _, n in CorpusReader(sources, ReadOptions())) == sum(s.size for s in sources)


def test_wikitext_loses_its_markup_and_keeps_link_text():
    text = wikitext_to_text(
        "{{Infobox river|name=Alder|length={{convert|240|km}}}}\nThe '''Alder''' is a [[river]] in "
        "[[North Country|the north]].<ref>{{cite web|title=Rivers}}</ref> It flows <b>south</b>.<ref name=a/>\n"
        "== History ==\n{| class=\"wikitable\"\n! Town !! People\n|-\n| Marsh End || 300\n|}\n"
        "[[File:Alder.jpg|thumb|The Alder]]\n* A list item &amp; more.<!-- hidden -->\n"
        "See [https://example.com the site] and <math>x^2</math> here.\n[[Category:Rivers]]\n[[de:Alder]]")
    assert text.split("\n") == ["The Alder is a river in the north. It flows south.", "A list item & more.",
                                "See the site and here."]
    # A template's empty last argument ("|}}") is not a table's end; an unclosed one drops the rest.
    assert wikitext_to_text("One {{cite|x|}} two.\nThree {{broken four.") == "One two.\nThree"


@pytest.mark.parametrize("wikitext,text", [
    ('[http://example.com "The Ultimate Revolution" (talk at [[University of California, Berkeley|UC Berkeley]], '
     '20 March 1962)]', '"The Ultimate Revolution" (talk at UC Berkeley, 20 March 1962)'),
    ("[http://a.b A [http://c.d B]]", "A B"),                             # an external link in another's title
    ("[http://a.b A [http://c.d B [[X|C]]]] D", "A B C D"),
    ("[[X|A [http://a.b B [http://c.d C]] D]] E", "A B C D E"),           # both, inside a link's text
    ("[[X|A [[Y|B]] C]]", "A B C"),                                      # a link in a link's text
    ("[http://a.b A '''[[X|B]]''' {{lang|fr|[[Y|gone]]}}]", "A B"),     # a template in a link: dropped
    ("<span>[http://a.b A [[X|B <small>[http://c.d C]</small>]]]</span>", "A B C"),
    ("[[X|A {{nowrap|[[Y|gone]]}} B]] and [http://a.b C {{x|[http://c.d gone]}}]", "A B and C"),
], ids=["link_in_external_title", "external_in_external", "three_deep", "in_link_text", "link_in_link",
        "template_in_external", "through_tags", "templates_in_links"])
def test_nested_markup_reduces_to_its_text_at_every_depth(wikitext, text):
    """A link inside an external link's title left its brackets and pipe in the text ("( talk at [ [
    university of california , berkeley | uc berkeley ] ..."): markup is text at every depth."""
    assert wikitext_to_text(f"Before {wikitext} after.") == f"Before {text} after."


def tokenizer_reads(monkeypatch, budget_per_char=400):
    """A function: wikitext -> the characters mwparserfromhell's tokenizer reads to reduce it (every
    re-read after a retry counted), on its pure-Python tokenizer (the same algorithm as the C one,
    whose work cannot be counted). It stops past `budget_per_char` reads a character."""
    from mwparserfromhell import parser
    from mwparserfromhell.parser.tokenizer import Tokenizer

    monkeypatch.setattr(parser, "use_c", False)
    count = [0, 0]                        # reads, budget
    real_read = Tokenizer._read

    def counted_read(self, *args, **kwargs):
        count[0] += 1
        assert count[0] < count[1], f"more than {count[1]} reads: a retry at every later position"
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Tokenizer, "_read", counted_read)

    def reads(text):
        count[:] = [0, budget_per_char * len(text)]
        wikitext_to_text(text)
        return count[0]
    return reads


@pytest.mark.parametrize("unit,end", [("[http://a.b ", ""), ("<span>x ", ""), ("[[a|[http://a.b ", ""),
                                      ("[http://a.b [", "]")],
                         ids=["external_link", "tag", "link_and_external_link", "nested_external_links"])
def test_wikitext_reduction_is_linear_in_markup_that_never_closes(monkeypatch, unit, end):
    """The parser retried a link or tag that never closes at every later position (a 0.24 MB page of
    "[http://a.b " took 70 s: quadratic) and an external link in another's title doubled its work
    per level: four times the page is now about four times the work, not 16."""
    reads = tokenizer_reads(monkeypatch)
    small, large = (reads("Intro.\n" + unit * n + end) for n in (150, 600))
    assert large < 6 * small, (small, large)
    # what never closes is text, as before; what closes is reduced as before
    assert wikitext_to_text("See [http://a.b the site] and [http://c.d more\n<span>x [[a|b]] [[c d") == \
        "See the site and [ more\n<span>x b [[c d"


def test_a_long_page_is_parsed_in_bounded_pieces_to_the_same_text(monkeypatch):
    """What bounds any page's parse, whatever its markup: the parser sees at most _PARSE_BLOCK
    characters at a time, cut between lines where nothing is open, so the text is as parsed whole."""
    import mwparserfromhell

    seen, real_parse = [], mwparserfromhell.parse
    monkeypatch.setattr(mwparserfromhell, "parse", lambda text, **kw: seen.append(len(text)) or real_parse(text, **kw))
    pages = [files.wikitext(i, doc) for i, (_, doc) in enumerate(files.synthetic_documents(40, seed=1))]
    one_page = "\n\n".join(pages)
    assert len(one_page) > 4 * _PARSE_BLOCK
    text = wikitext_to_text(one_page)
    assert 0 < max(seen) <= _PARSE_BLOCK
    assert text == "\n".join(wikitext_to_text(page) for page in pages)


def run(corpus, out, *inputs, fmt="bing", extra=()):
    argv = ["--input", *map(str, inputs), "--output_dir", str(out), "--format", fmt, "--vocab_file", str(corpus.vocab),
            "--max_seq_length", "64", "--max_predictions_per_seq", "10", "--dupe_factor", "1", *map(str, extra)]
    assert prepare_data.main(argv) == 0
    part = [int(extra[i + 1]) for i, a in enumerate(extra) if a == "--part"]
    return json.loads((out / (f"stats.part{part[0]:03d}.json" if part else "stats.json")).read_text())


@pytest.mark.parametrize("name", ["multistream", "wikiextractor", "jsonl_zst", "parquet", "hf"])
def test_shards_hold_the_text_without_markup_and_stats_count_it(corpus, tmp_path, name):
    stats = run(corpus, tmp_path / "o", corpus.paths[name])
    sentences = sum(map(len, corpus.expected))
    assert stats["documents_read"] == stats["documents_kept"] == len(corpus.docs)
    assert stats["sentences"] == sentences            # the splitter's own count, exactly
    assert stats["duplicates"] == stats["too_short"] == stats["bad_records"] == 0
    assert stats["redirects"] == (1 if name == "multistream" else 0)
    assert stats["sequences"] == sum(stats["sets"]["train"]["shard_sizes"]) > 0
    tokens = {t for a, b, _ in read_bing(tmp_path / "o" / "train" / "shard_000") for t in a + b}
    assert tokens and not tokens & MARKUP, tokens & MARKUP
    assert stats["unk_rate"] == 0


def test_duplicates_and_short_documents_are_dropped_and_counted(corpus, tmp_path):
    path = str(tmp_path / "dups.jsonl")
    short = [("s", ["Too short here."])]
    files.write_jsonl(path, corpus.docs + corpus.docs[:5] + short + [("d", [corpus.docs[0][1][0].upper()])])
    stats = run(corpus, tmp_path / "o", path, extra=["--min_document_words", 5])
    assert stats["documents_read"] == len(corpus.docs) + 7
    assert stats["duplicates"] == 5 and stats["too_short"] == 1
    assert stats["documents_kept"] == len(corpus.docs) + 1  # the upper-cased first paragraph is new text


LONG_WRITERS = {
    "jsonl": lambda root, docs: files.write_jsonl(str(root / "docs.jsonl"), docs),
    "parquet": lambda root, docs: files.write_parquet(str(root / "docs.parquet"), docs),
    "hf": lambda root, docs: files.write_hf(str(root / "hf_saved"), docs),
    "mediawiki": lambda root, docs: files.write_mediawiki(str(root / "testwiki-pages-articles.xml"), docs),
    "wikiextractor": lambda root, docs: files.write_wikiextractor(str(root / "extracted"), docs),
    "text_docs": lambda root, docs: files.write_text_docs(str(root / "docs.txt"), docs)}


@pytest.mark.parametrize("layout", list(LONG_WRITERS))
def test_a_document_longer_than_the_chunk_size_is_cut_in_every_layout(corpus, tmp_path, caplog, layout):
    """Only plain text was cut at --chunk_size_mb: one 40 MB JSON line peaked at 2.4 GB in a worker.
    Now no document handed on is longer, in any layout, none of the text is lost, and it is said."""
    long_document = ("Long", [p for _, doc in corpus.docs for p in doc])
    path = LONG_WRITERS[layout](tmp_path, [long_document] + corpus.docs[:3])
    sources = find_sources([path], "text_docs" if layout == "text_docs" else None)
    whole = [doc for doc, _ in CorpusReader(sources, ReadOptions()) if doc]
    limit = 4096
    assert len(whole[0]) > 4 * limit
    reader = CorpusReader(sources, ReadOptions(), max_document_bytes=limit)
    with caplog.at_level("WARNING"):
        pieces = [doc for doc, _ in reader if doc]
    assert max(map(len, pieces)) <= limit and len(pieces) > len(whole) + 3
    assert "".join(pieces) == "".join(whole)
    assert f"{RECORDS[layout]} 1: a document of " in caplog.text and "more than --chunk_size_mb" in caplog.text
    (warning,) = reader.warnings()
    assert warning.startswith(f"1 document(s) longer than --chunk_size_mb were cut into {len(pieces) - 3} pieces")


def test_text_docs_is_one_document_a_line(corpus, tmp_path):
    path = files.write_text_docs(str(tmp_path / "docs.txt"), corpus.docs)
    docs, _, _ = documents_of(path, input_format="text_docs")
    assert len(docs) == len(corpus.docs)
    assert abs(sum(map(len, docs)) - sum(map(len, corpus.expected))) <= 0.03 * sum(map(len, corpus.expected))


# ----------------------------------------------------------------------------- bad input

def error_of(capsys, argv):
    assert prepare_data.main([str(a) for a in argv]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1, err
    return err[0]


def base(corpus, out):
    return ["--output_dir", out, "--vocab_file", corpus.vocab, "--max_seq_length", 64, "--max_predictions_per_seq", 10]


def test_bad_json_line_is_refused_or_skipped_and_counted(corpus, tmp_path, capsys):
    path = tmp_path / "bad.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"text": "Fine text of a document here. And more."}) + "\n{not json\n")
        f.write(json.dumps({"text": "A second fine document here. With two sentences."}) + "\n")
    line = error_of(capsys, ["--input", path, *base(corpus, tmp_path / "o")])
    assert f"{path}: line 2 is not JSON" in line and "--skip_bad_records" in line
    assert not (tmp_path / "o" / "train").exists()
    stats = run(corpus, tmp_path / "o", path, extra=["--skip_bad_records"])
    assert stats["bad_records"] == 1 and stats["documents_kept"] == 2


GOOD_LINE = json.dumps({"text": "Fine text of a document here. And more."})


@pytest.mark.parametrize("bad,expected", [
    ('{"text": "The river \\ud800 town"}', "line 2: field 'text' holds a lone surrogate \\ud800 at character 11"),
    ("[" * 100_000, "line 2 is not JSON this reader takes (arrays or objects nested too deeply)"),
    ("null", "line 2 is null, not an object with a field 'text'"),
    ('{"text": 7}', "line 2: field 'text' is a number, not a string")], ids=["surrogate", "nesting", "null", "number"])
def test_a_json_line_that_holds_no_text_is_one_bad_record(corpus, tmp_path, capsys, bad, expected):
    """Lines json.loads reads into what is no text (a lone surrogate half, which no UTF-8 encoder takes,
    was a UnicodeEncodeError traceback; 100,000 nested [ a RecursionError): one line, or skipped and counted."""
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{GOOD_LINE}\n{bad}\n{GOOD_LINE.replace('Fine', 'Good')}\n")
    line = error_of(capsys, ["--input", path, *base(corpus, tmp_path / "o")])
    assert line.startswith(f"error: {path}: {expected}") and "--skip_bad_records" in line, line
    assert not (tmp_path / "o" / "train").exists()
    stats = run(corpus, tmp_path / "o", path, extra=["--skip_bad_records"])
    assert stats["bad_records"] == 1 and stats["documents_kept"] == 2


def test_a_byte_order_mark_before_json_lines_is_read(corpus, tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + f"{GOOD_LINE}\n{GOOD_LINE.replace('Fine', 'Good')}\n".encode())
    stats = run(corpus, tmp_path / "o", path)
    assert stats["documents_kept"] == 2 and stats["bad_records"] == 0


def test_missing_text_field_and_parquet_column_are_named(corpus, tmp_path, capsys):
    line = error_of(capsys, ["--input", corpus.paths["jsonl_gz"], "--text_field", "body", *base(corpus, tmp_path / "o")])
    assert "line 1 has no field 'body' (it has: id, title, text); give --text_field" in line
    line = error_of(capsys, ["--input", corpus.paths["parquet"], "--text_field", "body", *base(corpus, tmp_path / "o")])
    assert f"{corpus.paths['parquet']}: parquet file has no column 'body' (it has: title, text)" in line
    line = error_of(capsys, ["--input", corpus.paths["hf"], "--text_field", "body", *base(corpus, tmp_path / "o")])
    assert "the dataset has no column 'body' (it has: title, text)" in line


def test_parquet_and_hf_columns_that_hold_no_text_are_bad_records(corpus, tmp_path, capsys):
    """Binary and list columns were dropped without a word (50 documents read, bad_records 0 and exit 0
    from 1,050 rows): one line naming the file and row, or skipped and counted."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["\n".join(doc) for _, doc in corpus.docs]
    binary, lists, hf = tmp_path / "binary.parquet", tmp_path / "lists.parquet", tmp_path / "hf_binary"
    pq.write_table(pa.table({"text": pa.array([t.encode() for t in texts], pa.binary())}), binary)
    pq.write_table(pa.table({"text": pa.array([[t] for t in texts], pa.list_(pa.string()))}), lists)
    datasets.Dataset.from_dict({"text": [t.encode() for t in texts]}).save_to_disk(str(hf))
    for path, kind in ((binary, "binary data"), (lists, "an array"), (hf, "binary data")):
        line = error_of(capsys, ["--input", path, *base(corpus, tmp_path / "o")])
        assert line.startswith(f"error: {path}: row 1: column 'text' is {kind}, not a string (--skip_bad_records"), line
    stats = run(corpus, tmp_path / "o", corpus.paths["parquet"], binary, lists, hf, extra=["--skip_bad_records"])
    assert stats["documents_kept"] == len(texts) and stats["bad_records"] == 3 * len(texts)
    line = error_of(capsys, ["--input", binary, "--skip_bad_records", *base(corpus, tmp_path / "o2")])
    assert f"no document with tokens, and {len(texts)} bad records skipped (--skip_bad_records)" in line


def test_truncated_compressed_files_are_refused_naming_the_byte(corpus, tmp_path, capsys):
    for name, suffix in (("bz2", ".xml.bz2"), ("jsonl_gz", ".jsonl.gz"), ("jsonl_zst", ".jsonl.zst")):
        data = open(corpus.paths[name], "rb").read()
        cut = tmp_path / f"cut{suffix}"
        cut.write_bytes(data[:len(data) * 2 // 3])
        line = error_of(capsys, ["--input", cut, *base(corpus, tmp_path / "o")])
        assert f"{cut}: " in line and "cut short at byte" in line and f"of {cut.stat().st_size}" in line, line
        assert not (tmp_path / "o" / "train").exists()


def test_compressed_files_damaged_inside_are_one_error_line(corpus, tmp_path, capsys):
    """Damage inside gzip and xz data is raised as zlib.error and lzma.LZMAError, which are no OSError."""
    import lzma
    import zlib

    text = gzip.decompress(open(corpus.paths["jsonl_gz"], "rb").read())
    packed = {".jsonl.gz": gzip.compress(text, mtime=0), ".jsonl.xz": lzma.compress(text)}
    for suffix, at, error in ((".jsonl.gz", 20, zlib.error), (".jsonl.xz", len(packed[".jsonl.xz"]) // 2, lzma.LZMAError)):
        data = packed[suffix]          # 64 bytes inverted (at 20: gzip's first block's code tables)
        data = data[:at] + bytes(b ^ 0xFF for b in data[at:at + 64]) + data[at + 64:]
        with pytest.raises(error):
            (gzip if suffix == ".jsonl.gz" else lzma).decompress(data)
        damaged = tmp_path / f"damaged{suffix}"
        damaged.write_bytes(data)
        line = error_of(capsys, ["--input", damaged, *base(corpus, tmp_path / "o")])
        assert line.startswith(f"error: {damaged}: ") and " data damaged (noticed with " in line, line
        assert line.endswith("fetch or decompress the file again"), line
        assert not (tmp_path / "o" / "train").exists()


def test_xml_that_is_not_a_mediawiki_dump_and_unknown_layouts_are_refused(corpus, tmp_path, capsys):
    other = tmp_path / "feed.xml"
    other.write_text('<?xml version="1.0"?>\n<rss version="2.0"><channel><title>x</title></channel></rss>\n')
    line = error_of(capsys, ["--input", other, *base(corpus, tmp_path / "o")])
    assert f"{other}: not a MediaWiki XML dump (its root element is <rss>" in line
    blob = tmp_path / "archive.gz"
    blob.write_bytes(gzip.compress(bytes(range(256)) * 4))
    line = error_of(capsys, ["--input", blob, *base(corpus, tmp_path / "o")])
    assert f"{blob}: cannot tell the layout" in line and "--input_format" in line


def test_entity_tricks_are_refused_saying_what_was_refused(corpus, tmp_path, capsys):
    """An external entity (XXE) and a 'billion laughs' file were refused as "the file may be cut short"."""
    page = files._page("T", 0, "Some words here. %s more words.", 1)
    root = f'<mediawiki xmlns="{files.EXPORT_NS}">\n'
    xxe = tmp_path / "xxe-pages-articles.xml"
    xxe.write_text('<!DOCTYPE mediawiki [<!ENTITY xxe SYSTEM "file:///etc/hostname">]>\n' + root
                   + page.replace("%s", "&xxe;") + "</mediawiki>\n")
    lol = tmp_path / "lol-pages-articles.xml"
    entities = "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10))
    lol.write_text(f'<!DOCTYPE mediawiki [<!ENTITY l0 "lol">{entities}]>\n' + root + page.replace("%s", "&l9;")
                   + "</mediawiki>\n")
    for path, refused in ((xxe, "an entity the file does not define (no external entity, XXE, is ever read)"),
                          (lol, "entities that expand beyond the parser's limit (a 'billion laughs' file)")):
        line = error_of(capsys, ["--input", path, *base(corpus, tmp_path / "o")])
        assert line.startswith(f"error: {path}: refused at line ") and refused in line, line
        assert "cut short" not in line


def test_empty_files_are_named(corpus, tmp_path, caplog):
    """A 0-byte .gz or .zst (a download that failed) was read as nothing without a word; an empty
    plain file is warned about the same way."""
    for name in ("empty.txt", "empty.jsonl.gz", "empty.jsonl.zst"):
        (tmp_path / name).write_bytes(b"")
    with caplog.at_level("WARNING"):
        stats = run(corpus, tmp_path / "o", corpus.paths["jsonl_gz"], *(tmp_path / n for n in ("empty.txt",
                    "empty.jsonl.gz", "empty.jsonl.zst")))
    assert stats["documents_kept"] == len(corpus.docs)
    assert f"{tmp_path / 'empty.txt'}: an empty file (0 bytes): it gives no documents" in caplog.text
    for name, kind in (("empty.jsonl.gz", "gzip"), ("empty.jsonl.zst", "zstd")):
        assert f"{tmp_path / name}: an empty file (0 bytes), so not even {kind} data" in caplog.text


def test_a_prefix_with_a_path_in_it_is_refused(corpus, tmp_path, capsys):
    """--prefix a/b was h5py's errno line, after the work."""
    line = error_of(capsys, ["--input", corpus.paths["jsonl_gz"], "--prefix", "a/b", *base(corpus, tmp_path / "p")])
    assert line == "error: --prefix 'a/b': a file name prefix, not a path; the shards go in --output_dir's train/ " \
        "and validation/"
    assert not (tmp_path / "p").exists()


def test_uncached_hf_dataset_name_says_what_to_fetch(corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    line = error_of(capsys, ["--input", "someone/no-such-corpus", "--input_format", "hf", "--hf_split", "train",
                             *base(corpus, tmp_path / "o")])
    assert "someone/no-such-corpus" in line and "not in the local cache" in line and "never downloads" in line
    assert "datasets.load_dataset('someone/no-such-corpus', split='train')" in line


def test_a_missing_optional_package_names_the_pip_install(corpus, tmp_path, capsys, monkeypatch):
    real = importlib.import_module

    def no_mwparser(name, *a):
        if name == "mwparserfromhell":
            raise ImportError(name)
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", no_mwparser)
    line = error_of(capsys, ["--input", corpus.paths["xml"], *base(corpus, tmp_path / "o")])
    assert "needs the Python package mwparserfromhell: pip install -r requirements-corpora.txt" in line


# ----------------------------------------------------------------------------- scale features

def test_parts_hold_every_document_once_and_train_as_one_dataset(corpus, tmp_path):
    from nvidia_bert_dataset_provider import list_training_files, read_hdf5_shard

    path = str(tmp_path / "many.jsonl")
    docs = list(files.synthetic_documents(90, seed=5))
    files.write_jsonl(path, docs + docs[:10])           # duplicates must stay in one part
    make_vocab(tmp_path / "v.txt", docs)
    corpus = types.SimpleNamespace(vocab=tmp_path / "v.txt")
    whole = run(corpus, tmp_path / "whole", path, fmt="nvidia")
    out = tmp_path / "parts"
    keys = []
    for k in range(3):
        run(corpus, out, path, fmt="nvidia", extra=["--num_parts", 3, "--part", k, "--validation_fraction", 0.1])
        keep = DocumentFilter(3, k)
        keys.append({document_key(d) for d, _ in CorpusReader(
            find_sources([path]), ReadOptions()) if d and keep(document_key(d))})
    assert sum(map(len, keys)) == len(set().union(*keys)) == whole["documents_kept"] == 90
    stats = [json.loads((out / f"stats.part{k:03d}.json").read_text()) for k in range(3)]
    assert sum(s["documents_kept"] for s in stats) == 90 and sum(s["duplicates"] for s in stats) == 10
    shards = list_training_files(str(out / "train"))
    assert [os.path.basename(f) for f in shards] == [f"parts_part{k:03d}_training_shard0.hdf5" for k in range(3)]
    rows = sum(len(read_hdf5_shard(f)["input_ids"]) for f in shards)
    assert rows == sum(s["sets"]["train"]["sequences"] for s in stats)
    assert sorted(os.listdir(out / "validation")) == [f"parts_part{k:03d}_test_shard0.hdf5" for k in range(3)]


def test_build_vocab_trains_on_a_bounded_sample_of_any_layout(corpus, tmp_path, caplog):
    caplog.set_level("INFO")
    argv = ["--input", corpus.paths["parquet"], "--output_dir", str(tmp_path / "o"), "--build_vocab", 200,
            "--vocab_sample_mb", 0.004, "--max_seq_length", 64, "--max_predictions_per_seq", 10]
    assert prepare_data.main([str(a) for a in argv]) == 0
    sampled = [r.getMessage() for r in caplog.records if "training the vocab on a sample" in r.getMessage()]
    assert len(sampled) == 1, sampled
    n = int(sampled[0].split("sample of ")[1].split()[0])
    assert 0 < n < len(corpus.docs) / 2, sampled      # 4 KB of 24 documents of about 1 KB
    sample = sample_documents(((d, 0) for d in map(str, range(1000))), 30, seed=1)
    assert sum(map(len, sample)) <= 30 and sample == sorted(sample, key=int)
    assert sample == sample_documents(((d, 0) for d in map(str, range(1000))), 30, seed=1)
    vocab = (tmp_path / "o" / "vocab.txt").read_text().split("\n")
    assert "[UNK]" in vocab and not {"{{", "[[", "ref"} & set(vocab)


def test_progress_lines_when_not_on_a_terminal(corpus, tmp_path, caplog, monkeypatch):
    caplog.set_level("INFO")
    monkeypatch.setattr(workers, "PROGRESS_SECONDS", 0)
    run(corpus, tmp_path / "o", corpus.paths["jsonl_gz"], extra=["--chunk_size_mb", 0.002])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress: ")]
    assert len(lines) > 2 and "MB of input" in lines[-1] and "left" in lines[-1]


def kill_after_chunks(argv, out, chunks):
    """Start `python -m tools.prepare_data ARGV` and SIGKILL it once it finished `chunks` chunks
    (in OUT's journal); returns the journal's chunk folder."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "tools.prepare_data", *map(str, argv)],
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = out / WORK_DIR / "chunks"
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None and len(os.listdir(folder) if folder.exists() else []) < chunks:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "train").exists(), "the run ended before it could be killed"
    return folder


def test_resume_after_sigkill_is_byte_identical_and_refuses_other_settings(corpus, tmp_path, capsys):
    path = str(tmp_path / "big.jsonl")
    files.write_jsonl(path, files.synthetic_documents(300, seed=9))
    argv = ["--input", path, "--vocab_file", str(corpus.vocab), "--max_seq_length", "64", "--format", "nvidia",
            "--max_predictions_per_seq", "10", "--chunk_size_mb", "0.004", "--num_shards", "2"]
    out = tmp_path / "o"
    chunks = kill_after_chunks(argv + ["--output_dir", str(out)], out, 5)
    done = len(os.listdir(chunks))
    assert prepare_data.main(argv + ["--output_dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"reused {done} chunks" in printed or f"reused {done - 1} chunks" in printed, printed
    fresh = tmp_path / "fresh"
    assert prepare_data.main(argv + ["--output_dir", str(fresh), "--prefix", "o"]) == 0
    for name in ("o_training_shard0.hdf5", "o_training_shard1.hdf5"):
        assert (out / "train" / name).read_bytes() == (fresh / "train" / name).read_bytes()
    assert not (out / WORK_DIR).exists()
    # An unfinished run of other settings is refused, or started afresh with --overwrite.
    killed = tmp_path / "k"
    (killed / WORK_DIR / "chunks").mkdir(parents=True)
    # the journal a killed run of these settings leaves: its flags as that run resolved them
    fingerprint = run_fingerprint(prepare_data.resolved_tokenizer(prepare_data.build_parser().parse_args(
        argv + ["--output_dir", str(killed)])), find_sources([path]))
    (killed / WORK_DIR / "run.json").write_text(json.dumps(fingerprint))
    np.savez(killed / WORK_DIR / "chunks" / "train_0000000.npz", x=np.zeros(1))
    line = error_of(capsys, argv + ["--output_dir", killed, "--seed", 7])
    assert "holds the unfinished work of a run with other settings (--seed 12345 then, 7 now)" in line
    assert "--overwrite" in line
    assert prepare_data.main(argv + ["--output_dir", str(killed), "--seed", "7", "--overwrite"]) == 0


class ReadProbe(io.FileIO):
    """A file that records how it is read from the operating system: every read's size."""

    def __init__(self, path):
        super().__init__(path, "rb")
        self.sizes = []

    def readinto(self, buffer):
        n = super().readinto(buffer)
        self.sizes.append(n or 0)
        return n

    def readall(self):
        data = super().readall()
        self.sizes.append(len(data))
        return data


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A corpus far larger than any one read (a real one is GBs), as a multistream dump (100 pages a
    bz2 stream, as Wikipedia's; one stream gives nothing before a 900 KB block is read whole), gzipped
    JSON lines and plain text; each over 400 KB as stored."""
    root = tmp_path_factory.mktemp("big")
    docs = list(files.synthetic_documents(2000, seed=11))
    return {"multistream": files.write_mediawiki(str(root / "big-pages-articles-multistream.xml.bz2"), docs,
                                                 multistream=True),
            "jsonl_gz": files.write_jsonl(str(root / "big.jsonl.gz"), docs),
            "text": files.write_text(str(root / "big.txt"), docs, SPLIT)}


@pytest.mark.parametrize("name", ["multistream", "jsonl_gz", "text"])
def test_readers_stream_their_input(big, name, monkeypatch):
    """A corpus is read as it is used, never whole: no single read takes more than a quarter of the
    file (a reader that reads it at once fails), the first document comes before a quarter of it is
    read (one that decompresses or parses all of it first fails), and the bytes the reader reports
    follow what it has read (the progress bar's), summing to the file's size."""
    path = big[name]
    size = os.path.getsize(path)
    probes = []
    real_open = open

    def probed_open(file, mode="r", *args, **kwargs):
        if os.fspath(file) != path or mode != "rb":
            return real_open(file, mode, *args, **kwargs)
        probes.append(ReadProbe(file))
        return io.BufferedReader(probes[-1])

    monkeypatch.setattr(layouts, "open", probed_open, raising=False)   # the one place input files are opened
    (source,) = find_sources([path])
    probes.clear()
    reported, first, lags = 0, None, []
    for doc, nbytes in read_documents(source, ReadOptions(), ReadCounts(), DocumentReader([])):
        (probe,) = probes
        reported += nbytes
        lags.append(sum(probe.sizes) - reported)
        if doc and first is None:
            first = sum(probe.sizes)
    assert len(lags) > 1000 and max(probe.sizes) <= size // 4, (size, max(probe.sizes))
    assert first <= size // 4, (first, size)
    assert 0 <= min(lags) and max(lags) <= size // 4 and reported == size == sum(probe.sizes)
    if name == "multistream":   # a dump of many bz2 streams, which bz2 reads one after another
        assert bz2.decompress(open(path, "rb").read()).startswith(b"<mediawiki")


def test_hf_reads_arrow_files_and_local_data_files(corpus):
    """`datasets` beyond save_to_disk: its .arrow files as they lie in a cache, and, with
    --input_format hf, a local data file it streams."""
    arrow = [os.path.join(corpus.paths["hf"], n) for n in sorted(os.listdir(corpus.paths["hf"])) if n.endswith(".arrow")]
    docs, _, sources = documents_of(arrow[0])
    assert sources[0].layout == "hf" and docs == corpus.expected
    docs, _, sources = documents_of(corpus.paths["jsonl_gz"], input_format="hf")
    assert sources[0].layout == "hf" and docs == corpus.expected


def test_a_save_to_disk_folder_is_read_from_its_own_files_only(corpus, tmp_path, capsys):
    """A crafted folder read data from elsewhere (state.json's _data_files "../secret/...", or a split
    that is a link out of the folder): 5 documents of another folder read, "0.00 MB of input", and the
    resume fingerprint blind to that file. Refused in one line; the input size is the data read."""
    import shutil

    secret = files.write_hf(str(tmp_path / "secret"), corpus.docs[:5])
    arrow = next(name for name in os.listdir(secret) if name.endswith(".arrow"))
    crafted = tmp_path / "crafted"
    crafted.mkdir()
    for name in ("dataset_info.json", "state.json"):
        shutil.copy(os.path.join(secret, name), crafted / name)
    state = json.loads((crafted / "state.json").read_text())
    state["_data_files"] = [{"filename": f"../secret/{arrow}"}]
    (crafted / "state.json").write_text(json.dumps(state))
    line = error_of(capsys, ["--input", crafted, *base(corpus, tmp_path / "o")])
    assert line.startswith(f"error: {crafted}: state.json's data file '../secret/{arrow}' is {secret}/{arrow}, "
                           "outside the dataset folder"), line
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    os.symlink(secret, linked / "train")
    line = error_of(capsys, ["--input", linked, *base(corpus, tmp_path / "o")])
    assert line.startswith(f"error: {linked}: dataset_dict.json's split 'train' is {secret}, outside"), line
    assert not (tmp_path / "o" / "train").exists()
    stats = run(corpus, tmp_path / "o", corpus.paths["hf"])
    data = [os.path.join(corpus.paths["hf"], n) for n in os.listdir(corpus.paths["hf"]) if n.endswith(".arrow")]
    assert stats["input_bytes"] == sum(map(os.path.getsize, data)) and stats["documents_kept"] == len(corpus.docs)
    args = prepare_data.build_parser().parse_args(["--input", corpus.paths["hf"], "--output_dir", str(tmp_path / "o"),
                                                   "--vocab_file", str(corpus.vocab)])
    before = run_fingerprint(args, find_sources([corpus.paths["hf"]]))
    stamp = os.stat(data[0])
    os.utime(data[0], ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))   # the data file changed: a resume sees it
    assert run_fingerprint(args, find_sources([corpus.paths["hf"]])) != before
    os.utime(data[0], ns=(stamp.st_atime_ns, stamp.st_mtime_ns))


def test_a_cached_hf_dataset_name_is_read_offline(corpus, tmp_path, monkeypatch):
    import datasets

    cache = tmp_path / "hf_cache"
    files.write_hf_cache(str(cache), "someone/corpus", corpus.docs, str(tmp_path))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    stats = run(corpus, tmp_path / "o", "someone/corpus", extra=["--input_format", "hf", "--hf_split", "train"])
    assert stats["documents_kept"] == len(corpus.docs) and stats["sentences"] == sum(map(len, corpus.expected))


def test_compressed_sentence_per_line_text_is_read(corpus, tmp_path, capsys):
    packed = tmp_path / "docs.txt.gz"
    packed.write_bytes(gzip.compress(open(corpus.paths["text"], "rb").read()))
    docs, _, sources = documents_of(str(packed))
    assert sources[0].layout == "text" and docs == corpus.expected
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(packed.read_bytes()[:packed.stat().st_size // 2])
    line = error_of(capsys, ["--input", cut, *base(corpus, tmp_path / "o")])
    assert f"{cut}: gzip data cut short at byte" in line

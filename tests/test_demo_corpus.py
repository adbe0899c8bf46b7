"""tools/make_demo_corpus.py: the offline demo corpus built from Python's own documentation."""
import pytest

from tools import make_demo_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo") / "corpus.txt"
    documents, sentences, size = make_demo_corpus.build_demo_corpus(path)
    return path, documents, sentences, size


def test_demo_corpus_is_blank_line_separated_sentences(corpus):
    path, documents, sentences, size = corpus
    text = path.read_text(encoding="utf-8")
    assert size == len(text.encode("utf-8")) and 800_000 < size < 3_000_000
    docs = text.rstrip("\n").split("\n\n")
    assert len(docs) == documents > 150
    lines = [line for doc in docs for line in doc.split("\n")]
    assert len(lines) == sentences
    assert all(line and line == line.strip() for line in lines)    # no blank line inside a document
    assert all(len(doc.split("\n")) >= 2 for doc in docs)
    # Cleaned: no interactive sessions, grammar rules or heading underlines.
    assert not any(line.startswith(">>>") or "::=" in line or set(line) <= set("*=-") for line in lines)
    assert sum(line.endswith(".") for line in lines) > 0.7 * len(lines)


def test_demo_corpus_is_deterministic(corpus, tmp_path):
    path = corpus[0]
    again = tmp_path / "again.txt"
    make_demo_corpus.build_demo_corpus(again)
    assert again.read_bytes() == path.read_bytes()


def test_max_bytes_keeps_whole_documents(corpus, tmp_path):
    out = tmp_path / "small.txt"
    assert make_demo_corpus.main(["--output", str(out), "--max_bytes", "50000"]) == 0
    small = out.read_bytes()
    assert 40_000 < len(small) <= 50_000
    assert corpus[0].read_bytes().startswith(small) and small.endswith(b"\n\n")


def test_code_blocks_and_headings_are_dropped():
    text = """The "for" statement
*******************

The loop runs once per item of a sequence
(or any iterable) and then stops:

   for_stmt ::= "for" target_list "in" starred_list ":" suite

   for i in range(3):
       print(i)

* A bullet item spans
  two lines. It has two sentences.

  Its continuation belongs to it as well.

>>> print(1)
1
"""
    assert make_demo_corpus.text_to_sentences(text) == [
        'The "for" statement',
        "The loop runs once per item of a sequence (or any iterable) and then stops:",
        "A bullet item spans two lines.",
        "It has two sentences.",
        "Its continuation belongs to it as well.",
    ]

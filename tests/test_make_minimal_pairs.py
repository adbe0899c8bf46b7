"""tools/make_minimal_pairs.py: pairs from held-out documents only, each kind's corruption as
documented, the same file for the same seed, and an existing output never silently replaced."""
import json
import random
from collections import Counter

import pytest

from tools import make_minimal_pairs as mmp
from tools.make_probe_tasks import split_documents
from tools.prepare_data import is_validation_document

WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ro", "su", "ti") for b in ("ba", "do", "fi", "gu", "ze")]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 documents of 6 sentences of 6-12 words: a capitalised first word, Zipf-distributed
    lower-case inner words, a last word with a full stop. Returns (path, documents)."""
    rng = random.Random(0)
    weights = [1 / (i + 1) for i in range(len(WORDS))]
    docs = []
    for _ in range(40):
        doc = []
        for _ in range(6):
            words = rng.choices(WORDS, weights, k=rng.randint(6, 12))
            doc.append(" ".join([words[0].capitalize()] + words[1:-1] + [words[-1] + "."]))
        docs.append(doc)
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n")
    return str(path), docs


def _make(corpus_path, output, *flags):
    assert mmp.main(["--input", corpus_path, "--output", str(output), "--pairs_per_kind", "30", *flags]) == 0
    return [json.loads(line) for line in open(output)]


def test_pairs_come_from_the_probe_suites_dev_documents(corpus, tmp_path):
    path, docs = corpus
    records = _make(path, tmp_path / "pairs.jsonl", "--seed", "3")
    train, dev = split_documents(docs, 0.2, random.Random(3))
    dev_sentences = {s for doc in dev for s in doc}
    train_sentences = {s for doc in train for s in doc}
    assert Counter(r["UID"] for r in records) == {kind: 30 for kind in mmp.KINDS}
    for r in records:
        assert r["sentence_good"] in dev_sentences and r["sentence_good"] not in train_sentences
        assert r["sentence_good"] in docs[r["document"]]
        assert r["sentence_bad"] != r["sentence_good"]
    for kind in mmp.KINDS:
        ids = [r["pairID"] for r in records if r["UID"] == kind]
        assert ids == [str(i) for i in range(30)]
        assert len({r["sentence_good"] for r in records if r["UID"] == kind}) == 30  # a sentence once a kind


def test_pairs_from_the_pretraining_validation_documents(corpus, tmp_path):
    path, docs = corpus
    records = _make(path, tmp_path / "pairs.jsonl", "--validation_fraction", "0.25")
    held = {n for n in range(len(docs)) if is_validation_document(n, 0.25)}
    assert len(held) == 10
    assert {r["document"] for r in records} <= held
    assert all(r["sentence_good"] in docs[r["document"]] for r in records)


def test_each_kind_corrupts_as_documented(corpus, tmp_path):
    path, docs = corpus
    records = _make(path, tmp_path / "pairs.jsonl")
    train, _ = split_documents(docs, 0.2, random.Random(0))
    counts = Counter(w for doc in train for s in doc for w in s.split() if w.isalpha() and w.islower())
    ranked = sorted(counts.values())
    for r in records:
        good, bad = r["sentence_good"].split(), r["sentence_bad"].split()
        assert len(good) == len(bad) and good[0] == bad[0] and good[-1] == bad[-1]
        changed = [i for i in range(len(good)) if good[i] != bad[i]]
        assert r["lexically_identical"] == (sorted(good) == sorted(bad))
        if r["UID"] == "swap":
            i, j = changed
            assert j == i + 1 and (good[i], good[j]) == (bad[j], bad[i])
        elif r["UID"] == "shuffle":
            assert len(changed) >= 2 and sorted(good) == sorted(bad)
        elif r["UID"] == "repeat":
            (i,) = changed
            assert bad[i] == good[i - 1]
        else:
            (i,) = changed
            old, new = good[i], bad[i]
            assert new not in good
            # within FREQUENCY_NEIGHBOURS places in the frequency ranking
            between = sum(min(counts[old], counts[new]) < c < max(counts[old], counts[new]) for c in ranked)
            assert between < mmp.FREQUENCY_NEIGHBOURS


def test_a_compressed_corpus_gives_the_same_pairs(corpus, tmp_path):
    """corpus.txt.gz was refused as "binary data", where prepare_data reads it."""
    import gzip

    path, _ = corpus
    packed = tmp_path / "corpus.txt.gz"
    packed.write_bytes(gzip.compress(open(path, "rb").read()))
    assert _make(str(packed), tmp_path / "a.jsonl") == _make(path, tmp_path / "b.jsonl")


def test_the_same_seed_gives_the_same_file(corpus, tmp_path):
    path, _ = corpus
    first = _make(path, tmp_path / "a.jsonl", "--seed", "5")
    assert _make(path, tmp_path / "b.jsonl", "--seed", "5") == first
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert _make(path, tmp_path / "c.jsonl", "--seed", "6") != first


def test_vocab_keeps_the_wordpiece_count(corpus, tmp_path):
    path, _ = corpus
    # whole words for the first half of WORDS only: the rest split into two syllable pieces
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + WORDS[:20] + [
        p for w in WORDS[20:] for p in (w[:2], "##" + w[2:])]
    (tmp_path / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    records = _make(path, tmp_path / "pairs.jsonl", "--vocab_file", str(tmp_path / "vocab.txt"))
    whole = set(WORDS[:20])
    for r in records:
        good, bad = r["sentence_good"].split(), r["sentence_bad"].split()
        for i in range(1, len(good) - 1):
            if good[i] != bad[i]:
                assert r["UID"] in ("swap", "shuffle") or (good[i] in whole) == (bad[i] in whole)


def test_existing_output_is_refused_or_replaced_with_a_warning(corpus, tmp_path, capsys, caplog):
    path, _ = corpus
    out = tmp_path / "pairs.jsonl"
    out.write_text("keep me\n")
    assert mmp.main(["--input", path, "--output", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --output {out} exists; pass --overwrite to replace it, "
                                               "or give another file")
    assert out.read_text() == "keep me\n"
    records = _make(path, out, "--overwrite")
    assert len(records) == 120
    assert f"replacing {out} (1 lines)" in caplog.text
    assert mmp.main(["--input", str(tmp_path / "nowhere.txt"), "--output", str(tmp_path / "x.jsonl")]) == 2
    assert "nowhere.txt: no such file or folder" in capsys.readouterr().err


def test_the_demo_and_bench_quality_make_the_same_pairs_from_the_shards_hold_out():
    """scripts/demo.sh and bench/bench_quality.py make the pairs with the same flags, and their
    --validation_fraction is the one scripts/prepare_demo_data.sh holds documents out with."""
    import os

    from bench.bench_quality import MINIMAL_PAIRS_FLAGS

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def flags_of(script, tool):
        text = open(os.path.join(repo, "scripts", script)).read()
        return " ".join(text.split(tool, 1)[1].split("\n\n", 1)[0].split("\\\n")).split()

    demo = flags_of("demo.sh", "tools.make_minimal_pairs")
    for name, value in zip(MINIMAL_PAIRS_FLAGS[::2], MINIMAL_PAIRS_FLAGS[1::2]):
        assert demo[demo.index(name) + 1] == value, name
    shards = flags_of("prepare_demo_data.sh", "--output_dir \"$WORK/nvidia\"")
    assert shards[shards.index("--validation_fraction") + 1] == demo[demo.index("--validation_fraction") + 1]

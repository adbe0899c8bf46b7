"""tools/make_minimal_pairs.py: pairs from the documents prepare_data held out of its shards only
(by its record, never by splitting the corpus again), each kind's corruption as documented, the
same file for the same seed, and an existing output never silently replaced; and
tools/make_probe_tasks.py --heldout, whose dev examples come from the same record."""
import json
import os
import random
import shutil
import types
from collections import Counter

import pytest

from testkit import corpora as files
from tests.test_prepare_data import occurs, shard_text
from tools import make_minimal_pairs as mmp
from tools import make_probe_tasks, prepare_data
from turing.tokenization import build_fast_tokenizer

WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ro", "su", "ti") for b in ("ba", "do", "fi", "gu", "ze")]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def documents(count, rng):
    """Documents of 6 sentences of 6-12 words: a capitalised first word, Zipf-distributed lower-case
    inner words, a last word with a full stop."""
    weights = [1 / (i + 1) for i in range(len(WORDS))]
    docs = []
    for _ in range(count):
        doc = []
        for _ in range(6):
            words = rng.choices(WORDS, weights, k=rng.randint(6, 12))
            doc.append(" ".join([words[0].capitalize()] + words[1:-1] + [words[-1] + "."]))
        docs.append(doc)
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A folder of 10 documents as JSON lines (a_web.jsonl, read first) and 40 as text (b_books.txt),
    made into Bing shards holding a quarter of the documents out, in chunks far below the default
    --chunk_size_mb (the tool split .txt files again at the default size: with the .jsonl beside
    them its "held-out" sentences were training sentences). docs: all 50, in input order."""
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    docs = documents(50, rng)
    folder = root / "corpus"
    folder.mkdir()
    files.write_jsonl(str(folder / "a_web.jsonl"), [(str(i), [" ".join(doc)]) for i, doc in enumerate(docs[:10])])
    (folder / "b_books.txt").write_text("\n\n".join("\n".join(doc) for doc in docs[10:]) + "\n")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + WORDS) + "\n")
    out = root / "shards"
    assert prepare_data.main(["--input", str(folder), "--output_dir", str(out), "--format", "bing", "--vocab_file",
                              str(vocab), "--max_seq_length", "64", "--validation_fraction", "0.25",
                              "--chunk_size_mb", "0.002"]) == 0
    held = [n for n in range(50) if n % 4 == 3]          # floor((n + 1) / 4) steps: every fourth document
    return types.SimpleNamespace(folder=folder, docs=docs, out=out, vocab=vocab, held=held)


def _make(corpus, output, *flags):
    assert mmp.main(["--heldout", str(corpus.out), "--output", str(output), "--pairs_per_kind", "30", *flags]) == 0
    return [json.loads(line) for line in open(output)]


def test_pairs_come_from_documents_held_out_of_the_shards_and_from_no_training_shard(corpus, tmp_path):
    records = _make(corpus, tmp_path / "pairs.jsonl", "--seed", "3")
    assert Counter(r["UID"] for r in records) == {kind: 30 for kind in mmp.KINDS}
    listed = {}
    for line in open(corpus.out / "heldout.jsonl"):
        document = json.loads(line)
        listed[document["document"]] = document["sentences"]
    assert sorted(listed) == corpus.held
    tokenizer = build_fast_tokenizer(str(corpus.vocab))
    train = shard_text(corpus.out / "train")
    for r in records:
        assert r["document"] in listed and r["sentence_good"] in listed[r["document"]]
        assert r["sentence_good"] in corpus.docs[r["document"]]
        assert not occurs(tokenizer.encode(r["sentence_good"], add_special_tokens=False).tokens, train), r
        assert r["sentence_bad"] != r["sentence_good"]
    for kind in mmp.KINDS:
        ids = [r["pairID"] for r in records if r["UID"] == kind]
        assert ids == [str(i) for i in range(30)]
        assert len({r["sentence_good"] for r in records if r["UID"] == kind}) == 30  # a sentence once a kind


def test_the_forms_that_split_the_corpus_again_are_refused(corpus, tmp_path, capsys):
    output = tmp_path / "pairs.jsonl"
    for flags, says in ((["--input", str(corpus.folder), "--validation_fraction", "0.25"], "--validation_fraction: "),
                        (["--input", str(corpus.folder), "--dev_fraction", "0.2"], "--dev_fraction: "),
                        (["--input", str(corpus.folder)], "--heldout OUT is needed")):
        assert mmp.main([*flags, "--output", str(output)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {says}") and "--heldout OUT" in err[0], err
    assert mmp.main(["--heldout", str(corpus.folder), "--output", str(output)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --heldout {corpus.folder}: holds no documents.json, prepare_data's record of the documents it held "
        "out (shards made by another tool, or before it wrote one): make them again with tools/prepare_data.py")
    assert not output.exists()


def test_the_training_documents_are_read_where_the_corpus_is_now(corpus, tmp_path, capsys):
    first = _make(corpus, tmp_path / "a.jsonl")
    moved = tmp_path / "moved"
    shutil.copytree(corpus.folder, moved)
    assert _make(corpus, tmp_path / "b.jsonl", "--input", str(moved)) == first
    assert mmp.main(["--heldout", str(corpus.out), "--input", str(moved / "b_books.txt"), "--output",
                     str(tmp_path / "c.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --heldout {corpus.out}: its input {moved / 'b_books.txt'} holds 30 of the 38 training "
                   f"documents {corpus.out / 'documents.json'} lists (by key); give the corpus that prepare_data read "
                   "as --input")


def test_each_kind_corrupts_as_documented(corpus, tmp_path):
    records = _make(corpus, tmp_path / "pairs.jsonl")
    train = [doc for n, doc in enumerate(corpus.docs) if n not in corpus.held]
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
            # within FREQUENCY_NEIGHBOURS places in the frequency ranking of the training documents
            between = sum(min(counts[old], counts[new]) < c < max(counts[old], counts[new]) for c in ranked)
            assert between < mmp.FREQUENCY_NEIGHBOURS


def test_a_compressed_corpus_gives_the_same_pairs(corpus, tmp_path):
    """The corpus where it is now, its text compressed (--input): read as prepare_data reads it
    (corpus.txt.gz was refused as "binary data"), the same pairs as from the recorded input."""
    import gzip
    import shutil

    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(corpus.folder / "a_web.jsonl", moved / "a_web.jsonl")
    (moved / "b_books.txt.gz").write_bytes(gzip.compress((corpus.folder / "b_books.txt").read_bytes()))
    assert _make(corpus, tmp_path / "a.jsonl", "--input", str(moved)) == _make(corpus, tmp_path / "b.jsonl")


def test_the_same_seed_gives_the_same_file(corpus, tmp_path):
    first = _make(corpus, tmp_path / "a.jsonl", "--seed", "5")
    assert _make(corpus, tmp_path / "b.jsonl", "--seed", "5") == first
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert _make(corpus, tmp_path / "c.jsonl", "--seed", "6") != first


def test_vocab_keeps_the_wordpiece_count(corpus, tmp_path):
    # whole words for the first half of WORDS only: the rest split into two syllable pieces
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + WORDS[:20] + [
        p for w in WORDS[20:] for p in (w[:2], "##" + w[2:])]
    (tmp_path / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    records = _make(corpus, tmp_path / "pairs.jsonl", "--vocab_file", str(tmp_path / "vocab.txt"))
    whole = set(WORDS[:20])
    for r in records:
        good, bad = r["sentence_good"].split(), r["sentence_bad"].split()
        for i in range(1, len(good) - 1):
            if good[i] != bad[i]:
                assert r["UID"] in ("swap", "shuffle") or (good[i] in whole) == (bad[i] in whole)


def test_existing_output_is_refused_or_replaced_with_a_warning(corpus, tmp_path, capsys, caplog):
    out = tmp_path / "pairs.jsonl"
    out.write_text("keep me\n")
    assert mmp.main(["--heldout", str(corpus.out), "--output", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --output {out} exists; pass --overwrite to replace it, "
                                               "or give another file")
    assert out.read_text() == "keep me\n"
    records = _make(corpus, out, "--overwrite")
    assert len(records) == 120
    assert f"replacing {out} (1 lines)" in caplog.text
    assert mmp.main(["--heldout", str(tmp_path / "nowhere"), "--output", str(tmp_path / "x.jsonl")]) == 2
    assert "nowhere: no such folder" in capsys.readouterr().err


def test_probe_tasks_from_the_held_out_documents_are_dev_examples_never_trained_on(corpus, tmp_path, capsys):
    probe = tmp_path / "probe"
    assert make_probe_tasks.main(["--heldout", str(corpus.out), "--output_dir", str(probe), "--train_size", "60",
                                  "--dev_size", "20", "--max_words", "20"]) == 0
    held = {s for n in corpus.held for s in corpus.docs[n]}
    trained = {s for n, doc in enumerate(corpus.docs) if n not in corpus.held for s in doc}
    tokenizer = build_fast_tokenizer(str(corpus.vocab))
    train_shards = shard_text(corpus.out / "train")
    for task, columns in (("probe_swap", [0]), ("probe_samedoc", [1, 2]), ("probe_order", [1, 2])):
        for split, sentences in (("dev", held), ("train", trained)):
            rows = [line.rstrip("\n").split("\t") for line in open(probe / task / f"{split}.tsv")][1:]
            written = [row[c] for row in rows for c in columns if task != "probe_swap" or row[-1] == "1"]
            assert len(rows) >= 10 and written and set(written) <= sentences, (task, split)
            if split == "dev":
                tokens = [tokenizer.encode(s, add_special_tokens=False).tokens for s in written]
                assert not [s for s in tokens if occurs(s, train_shards)], task
    assert make_probe_tasks.main(["--heldout", str(corpus.folder), "--output_dir", str(tmp_path / "p2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --heldout {corpus.folder}: holds no documents.json"), err


def test_the_demo_and_bench_quality_make_the_same_pairs_from_the_shards_hold_out():
    """scripts/demo.sh and bench/bench_quality.py make the pairs with the same flags, from the
    output folder scripts/prepare_demo_data.sh holds documents out of."""
    from bench.bench_quality import MINIMAL_PAIRS_FLAGS

    def flags_of(script, tool):
        text = open(os.path.join(REPO, "scripts", script)).read()
        return " ".join(text.split(tool, 1)[1].split("\n\n", 1)[0].split("\\\n")).split()

    demo = flags_of("demo.sh", "tools.make_minimal_pairs")
    for name, value in zip(MINIMAL_PAIRS_FLAGS[::2], MINIMAL_PAIRS_FLAGS[1::2]):
        assert demo[demo.index(name) + 1] == value, name
    assert demo[demo.index("--heldout") + 1] == '"$WORK/nvidia"'
    shards = flags_of("prepare_demo_data.sh", "--output_dir \"$WORK/nvidia\"")
    assert float(shards[shards.index("--validation_fraction") + 1]) > 0

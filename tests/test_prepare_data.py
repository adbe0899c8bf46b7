"""tools/prepare_data.py: raw text to NVIDIA hdf5 and Bing numpy shards, read back."""
import importlib
import logging
import os
import random
import subprocess
import sys
import types

import h5py
import numpy as np
import pytest

from testkit import corpora as files
from testkit.launcher import REPO
from tests.launch import tool_error_line
from tools import prepare_data
from tools.prep.filters import document_key
from tools.prep.instances import create_instance_spans, truncation
from tools.prep.journal import WORK_DIR
from tools.prep.shards import ShardSet
from tools.prep.tokens import WordCacheTokenizer
from turing import heldout
from turing.shard_tokenizer import record_name
from turing.tokenization import build_fast_tokenizer, load_vocab

WORDS = ("the cat sat on a mat while dog ran to park with ball and bird sang in tree near house "
         "river flows past old mill where children play games after school every sunny day").split()
PIECES = ["##s", "##ing", "##ed", "##er", "##ly", "jump", "walk", "talk", "quick", "slow"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_corpus(path, documents=60, seed=0):
    """Documents of 2-12 sentences of 3-14 words; some words split into pieces or unknown."""
    rng = random.Random(seed)
    extra = ["jumping", "walked", "talker", "quickly", "zebra", "xylophone"]
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(documents):
            for _ in range(rng.randint(2, 12)):
                words = [rng.choice(WORDS + extra) for _ in range(rng.randint(3, 14))]
                f.write(" ".join(words).capitalize() + ".\n")
            f.write("\n")
    return path


def make_vocab(path, specials=SPECIALS):
    letters = [chr(c) for c in range(ord("b"), ord("z") + 1)]
    tokens = list(specials) + sorted(set(WORDS)) + PIECES + ["."] + letters
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    return types.SimpleNamespace(root=root, corpus=make_corpus(root / "corpus.txt"),
                                 vocab=make_vocab(root / "vocab.txt"))


def run(data, out, *extra, fmt="nvidia", seq=64, workers=1):
    argv = ["--input", str(data.corpus), "--output_dir", str(out), "--format", fmt,
            "--vocab_file", str(data.vocab), "--max_seq_length", str(seq), "--max_predictions_per_seq", "20",
            "--workers", str(workers), *map(str, extra)]
    assert prepare_data.main(argv) == 0
    return out


@pytest.fixture(scope="module")
def nvidia_out(data):
    return run(data, data.root / "nv", "--num_shards", 3, "--validation_fraction", 0.1, "--chunk_size_mb", 0.004)


@pytest.fixture(scope="module")
def bing_out(data):
    return run(data, data.root / "bing", "--num_shards", 3, "--validation_fraction", 0.1, "--chunk_size_mb", 0.004,
               fmt="bing")


def hdf5_arrays(path):
    with h5py.File(path, "r") as f:
        return {k: f[k][:] for k in f}


def read_bing(folder):
    """Decode a Bing shard folder with numpy alone: list of (tokens A, tokens B, is_next)."""
    data = np.load(folder / "data.npy")
    offsets = np.load(folder / "instance_offsets.npy")
    split = np.load(folder / "tokens_split.npy")
    is_next = np.load(folder / "is_next.npy")
    assert data.dtype == np.uint8 and len(offsets) == len(split) + 1 == len(is_next) + 1
    assert offsets[0] == 0 and offsets[-1] == len(data)
    layout_offsets = (folder / "instance_token_offsets.npy").exists()
    if layout_offsets:
        ito, tok_off = np.load(folder / "instance_token_offsets.npy"), np.load(folder / "token_offsets.npy")
        assert len(ito) == len(split) + 1 and ito[-1] == len(tok_off)
    out = []
    for i in range(len(split)):
        raw = data[offsets[i]:offsets[i + 1]].tobytes()
        if layout_offsets:
            assert 0x1F not in raw
            cuts = [0, *tok_off[ito[i]:ito[i + 1]].tolist(), len(raw)]
            tokens = [raw[a:b].decode() for a, b in zip(cuts[:-1], cuts[1:])]
        else:
            tokens = raw.decode().split("\x1f")
        out.append((tokens[:split[i]], tokens[split[i]:], int(is_next[i])))
    return out


def shard_text(folder):
    """The segments of every Bing shard under `folder` as one string, "| tokens of A | tokens of B |"
    per instance, for `occurs` to search."""
    return "".join(f"| {' '.join(a)} | {' '.join(b)} |" for shard in sorted(folder.iterdir())
                   for a, b, _ in read_bing(shard))


def occurs(tokens, text):
    """Whether a sentence's tokens (ending in ".") stand in `text` (shard_text) as a whole sentence:
    first in a segment or after another sentence's full stop."""
    sentence = " ".join(tokens)
    return f"| {sentence} " in text or f". {sentence} " in text


# ----------------------------------------------------------------------------- NVIDIA format

def test_nvidia_shards_match_create_pretraining_data_layout(nvidia_out, data):
    files = sorted(os.listdir(nvidia_out / "train"))
    assert files == [f"nv_training_shard{i}.hdf5" for i in range(3)]
    assert os.listdir(nvidia_out / "validation") == ["nv_test_shard0.hdf5"]
    assert (nvidia_out / "vocab.txt").read_text() == data.vocab.read_text()
    expected = {"input_ids": (np.int32, 64), "input_mask": (np.int8, 64), "segment_ids": (np.int8, 64),
                "masked_lm_positions": (np.int32, 20), "masked_lm_ids": (np.int32, 20),
                "next_sentence_labels": (np.int8, None)}
    with h5py.File(nvidia_out / "train" / files[0], "r") as f:
        assert set(f.keys()) == set(expected)
        n = f["input_ids"].shape[0]
        assert n > 0
        for key, (dtype, width) in expected.items():
            ds = f[key]
            assert ds.dtype == dtype, key
            assert ds.shape == ((n, width) if width else (n,)), key
            assert ds.compression == "gzip", key


def test_nvidia_rows_are_cls_a_sep_b_sep_with_sorted_masks(nvidia_out, data):
    vocab = load_vocab(data.vocab)
    cls, sep, mask = vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"]
    a = hdf5_arrays(nvidia_out / "train" / "nv_training_shard1.hdf5")
    for row in range(len(a["input_ids"])):
        ids, m, seg = a["input_ids"][row], a["input_mask"][row], a["segment_ids"][row]
        n = int(m.sum())
        assert m[:n].all() and not m[n:].any() and not ids[n:].any() and not seg[n:].any()
        seps = np.flatnonzero(ids[:n] == sep)
        pos = a["masked_lm_positions"][row]
        k = int(np.count_nonzero(pos))
        assert not pos[k:].any() and not a["masked_lm_ids"][row, k:].any()   # right-padded with 0
        assert (np.diff(pos[:k]) > 0).all()                                   # sorted, distinct
        # Put the original tokens back; [SEP]s that were masked reappear too.
        orig = ids.copy()
        orig[pos[:k]] = a["masked_lm_ids"][row, :k]
        seps = np.flatnonzero(orig[:n] == sep)
        assert orig[0] == cls and len(seps) == 2 and seps[1] == n - 1 and 2 <= seps[0] <= n - 3
        assert (seg[:seps[0] + 1] == 0).all() and (seg[seps[0] + 1:n] == 1).all()
        # Never on [CLS], [SEP] or padding.
        assert set(pos[:k].tolist()).isdisjoint({0, seps[0], n - 1}) and pos[:k].max(initial=0) < n
        assert mask not in orig[:n]
    assert set(np.unique(a["next_sentence_labels"])) == {0, 1}


def test_nvidia_masking_statistics(nvidia_out, data):
    vocab = load_vocab(data.vocab)
    shards = [hdf5_arrays(nvidia_out / "train" / f"nv_training_shard{i}.hdf5") for i in range(3)]
    a = {key: np.concatenate([shard[key] for shard in shards]) for key in shards[0]}
    n_tokens = a["input_mask"].sum(axis=1).astype(np.int64)
    predicted = np.count_nonzero(a["masked_lm_positions"], axis=1)
    # Exactly min(P, max(1, round(n * 0.15))) per sequence (the cap of 20 never binds at 64).
    np.testing.assert_array_equal(predicted, np.maximum(1, np.rint(n_tokens * 0.15)))
    share = predicted.sum() / (n_tokens - 3).sum()
    assert 0.14 < share < 0.18
    rows, cols = np.nonzero(a["masked_lm_positions"])
    shown = a["input_ids"][rows, a["masked_lm_positions"][rows, cols]]
    original = a["masked_lm_ids"][rows, cols]
    assert len(shown) > 4000
    as_mask = np.mean(shown == vocab["[MASK]"])
    kept = np.mean(shown == original)
    assert 0.77 < as_mask < 0.83
    assert 0.08 < kept < 0.13          # 10% kept, plus random draws that hit the same token
    assert 0.07 < 1 - as_mask - kept < 0.12


def test_nvidia_cap_binds_at_long_sequences(data, tmp_path):
    out = run(data, tmp_path / "o", "--max_predictions_per_seq", 3, "--short_seq_prob", 0, seq=64)
    a = hdf5_arrays(out / "train" / "o_training_shard0.hdf5")
    assert a["masked_lm_positions"].shape[1] == 3
    n_tokens = a["input_mask"].sum(axis=1)
    np.testing.assert_array_equal(np.count_nonzero(a["masked_lm_positions"], axis=1),
                                  np.minimum(3, np.maximum(1, np.rint(n_tokens * 0.15))))


def test_masked_lm_prob_masks_training_only_validation_keeps_15_percent(data, tmp_path):
    out = run(data, tmp_path / "o", "--masked_lm_prob", 0.3, "--validation_fraction", 0.2)
    for name, prob in (("train/o_training_shard0.hdf5", 0.3), ("validation/o_test_shard0.hdf5", 0.15)):
        a = hdf5_arrays(out / name)
        n_tokens = a["input_mask"].sum(axis=1).astype(np.int64)
        np.testing.assert_array_equal(np.count_nonzero(a["masked_lm_positions"], axis=1),
                                      np.minimum(20, np.maximum(1, np.rint(n_tokens * prob))), err_msg=name)


def test_same_seed_gives_same_instances_in_both_formats(nvidia_out, bing_out, data):
    """Unmasking an NVIDIA row gives exactly [CLS] A [SEP] B [SEP] of the Bing instance."""
    vocab = load_vocab(data.vocab)
    inv = {i: t for t, i in vocab.items()}
    a = hdf5_arrays(nvidia_out / "train" / "nv_training_shard2.hdf5")
    instances = read_bing(bing_out / "train" / "shard_002")
    assert len(instances) == len(a["input_ids"])
    for row, (tok_a, tok_b, is_next) in enumerate(instances):
        ids = a["input_ids"][row].copy()
        pos = a["masked_lm_positions"][row]
        k = np.count_nonzero(pos)
        ids[pos[:k]] = a["masked_lm_ids"][row, :k]
        n = int(a["input_mask"][row].sum())
        assert [inv[i] for i in ids[:n]] == ["[CLS]", *tok_a, "[SEP]", *tok_b, "[SEP]"]
        assert a["next_sentence_labels"][row] == is_next


def test_nvidia_provider_reads_the_shards(nvidia_out, data):
    from nvidia_bert_dataset_provider import NvidiaBertDatasetProvider

    args = types.SimpleNamespace(
        local_rank=-1, seed=1, train_micro_batch_size_per_gpu=8, gradient_accumulation_steps=1, max_seq_length=64,
        max_predictions_per_seq=20, data_path_prefix=str(nvidia_out),
        config={"training": {"num_workers": 0}, "data": {"datasets": {"pretrain_dataset": "train"}}})
    provider = NvidiaBertDatasetProvider(args)
    try:
        batches, count = provider.get_shard(0)
        batch = next(iter(batches))
        assert count > 0 and batch.input_ids.shape == (8, 64)
        labels = batch.masked_lm_labels
        assert ((labels != -1).sum(dim=1) >= 1).all()
        assert (batch.input_ids[labels != -1] != labels[labels != -1]).float().mean() > 0.5
    finally:
        provider.close()


# ----------------------------------------------------------------------------- Bing format

def test_bing_shards_decode_to_valid_instances(bing_out, data):
    assert sorted(os.listdir(bing_out / "train")) == ["shard_000", "shard_001", "shard_002"]
    assert os.listdir(bing_out / "validation") == ["shard_000"]
    folder = bing_out / "train" / "shard_000"
    assert sorted(os.listdir(folder)) == ["data.npy", "instance_offsets.npy", "is_next.npy", "tokens_split.npy"]
    vocab = load_vocab(data.vocab)
    instances = read_bing(folder)
    for tok_a, tok_b, _ in instances:
        assert tok_a and tok_b and len(tok_a) + len(tok_b) <= 64 - 3
        assert all(t in vocab for t in tok_a + tok_b)
        assert not {"[CLS]", "[SEP]", "[MASK]"} & set(tok_a + tok_b)   # unmasked, no specials
    is_next = np.array([x[2] for x in instances])
    assert 0.3 < is_next.mean() < 0.7      # about half of B segments are random


def test_bing_layouts_hold_the_same_instances(data, tmp_path, bing_out):
    out = run(data, tmp_path / "b", "--num_shards", 3, "--validation_fraction", 0.1, "--chunk_size_mb", 0.004,
              "--bing_layout", "offsets", fmt="bing")
    folder = out / "train" / "shard_001"
    assert (folder / "token_offsets.npy").exists()
    assert read_bing(folder) == read_bing(bing_out / "train" / "shard_001")
    # The project's own reader agrees on both layouts.
    from turing.dataset import BingShard

    sep, off = BingShard(str(bing_out / "train" / "shard_001")), BingShard(str(folder))
    assert (sep.layout, off.layout) == ("separator", "offsets")
    assert [sep.instance(i) for i in range(len(sep))] == [off.instance(i) for i in range(len(off))]


def test_bing_provider_reads_the_shards(bing_out):
    from bing_bert_dataset_provider import BingBertDatasetProvider

    args = types.SimpleNamespace(
        local_rank=-1, seed=1, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=1,
        refresh_bucket_size=1, max_seq_length=64, max_predictions_per_seq=20,
        data_path_prefix=str(bing_out), vocab_file=str(bing_out / "vocab.txt"),
        config={"training": {"num_workers": 0}, "data": {"datasets": {"wiki_pretrain_dataset": "train"}}})
    provider = BingBertDatasetProvider(args)
    try:
        picker, count = provider.get_shard(0)
        assert count > 0
        batch = provider.get_batch(picker[0])
        assert batch.input_ids.shape == (4, 64)
        assert ((batch.masked_lm_labels != -1).sum(dim=1) >= 1).all()
    finally:
        provider.close()


# ----------------------------------------------------------------------------- shards, determinism

def test_shard_sizes_differ_by_at_most_one(nvidia_out, bing_out):
    sizes = [len(hdf5_arrays(nvidia_out / "train" / f"nv_training_shard{i}.hdf5")["input_ids"]) for i in range(3)]
    assert max(sizes) - min(sizes) <= 1
    bing_sizes = [len(np.load(bing_out / "train" / f"shard_{i:03d}" / "is_next.npy")) for i in range(3)]
    assert bing_sizes == sizes


def test_output_is_the_same_for_any_number_of_workers(data, tmp_path, nvidia_out, bing_out):
    two = run(data, tmp_path / "nv", "--num_shards", 3, "--validation_fraction", 0.1, "--chunk_size_mb", 0.004,
              workers=2)
    for sub, name in [("train", "nv_training_shard0.hdf5"), ("train", "nv_training_shard2.hdf5"),
                      ("validation", "nv_test_shard0.hdf5")]:
        one_arrays, two_arrays = hdf5_arrays(nvidia_out / sub / name), hdf5_arrays(two / sub / name)
        for key in one_arrays:
            np.testing.assert_array_equal(one_arrays[key], two_arrays[key], err_msg=key)
    two = run(data, tmp_path / "bing", "--num_shards", 3, "--validation_fraction", 0.1, "--chunk_size_mb", 0.004,
              workers=2, fmt="bing")
    for shard in ("train/shard_000", "train/shard_001", "validation/shard_000"):
        for name in os.listdir(bing_out / shard):
            assert (two / shard / name).read_bytes() == (bing_out / shard / name).read_bytes()


def test_shards_smaller_than_the_training_batch_are_warned_about_the_shards_unchanged(data, tmp_path, nvidia_out,
                                                                                      caplog):
    """--train_batch_size: shards too small for the batch one rank trains a step on are one warning
    that names how many and the --num_shards that fits (issue 43: --num_shards 64 on a small corpus
    made shards the trainer refused 14 minutes later); the files are those of the run without it."""
    import json

    sizes = json.loads((nvidia_out / "stats.json").read_text())["sets"]["train"]["shard_sizes"]
    batch = max(sizes) + 1
    caplog.set_level(logging.WARNING)
    same = run(data, tmp_path / "nv", "--num_shards", 3, "--validation_fraction", 0.1, "--chunk_size_mb", 0.004,
               "--train_batch_size", batch)
    (warning,) = [r.getMessage() for r in caplog.records if "--train_batch_size" in r.getMessage()]
    assert warning.startswith(f"3 of 3 training shards hold fewer sequences than --train_batch_size {batch} "
                              f"(the smallest: {min(sizes)}): a rank reads a whole NVIDIA shard an epoch")
    assert f"--num_shards {sum(sizes) // batch} or fewer" in warning, warning
    for sub in ("train", "validation"):
        for name in os.listdir(nvidia_out / sub):
            assert (same / sub / name).read_bytes() == (nvidia_out / sub / name).read_bytes(), name
    caplog.clear()
    run(data, tmp_path / "fits", "--num_shards", 3, "--validation_fraction", 0.1, "--chunk_size_mb", 0.004,
        "--train_batch_size", min(sizes))
    assert not [r for r in caplog.records if "--train_batch_size" in r.getMessage()]


def test_seed_changes_the_output(data, tmp_path, nvidia_out):
    other = run(data, tmp_path / "nv", "--num_shards", 3, "--validation_fraction", 0.1, "--chunk_size_mb", 0.004,
                "--seed", 7)
    a = hdf5_arrays(nvidia_out / "train" / "nv_training_shard0.hdf5")["input_ids"]
    b = hdf5_arrays(other / "train" / "nv_training_shard0.hdf5")["input_ids"]
    assert a.shape != b.shape or not np.array_equal(a, b)


def test_validation_split_takes_that_share_of_documents(data, tmp_path, capsys):
    run(data, tmp_path / "o", "--validation_fraction", 0.1, fmt="bing")
    out = capsys.readouterr().out
    # 60 documents: exactly 6 go to validation, 54 stay for training.
    assert "train: 54 documents" in out and "validation: 6 documents" in out
    assert "sequences/s" in out and "[UNK]" in out
    train = {tuple(a + b) for a, b, _ in read_bing(tmp_path / "o" / "train" / "shard_000")}
    valid = {tuple(a + b) for a, b, _ in read_bing(tmp_path / "o" / "validation" / "shard_000")}
    assert train and valid and not train & valid


def test_the_held_out_documents_and_the_training_keys_are_written_beside_the_shards(bing_out, data):
    """OUT/documents.json, heldout.jsonl and train_document_keys.npy (turing/heldout.py) say which
    documents went where: the held-out ones as read, none of their sentences in a training shard."""
    docs = [block.split("\n") for block in data.corpus.read_text().strip("\n").split("\n\n")]
    assert len(docs) == 60
    manifest = heldout.read_manifest(str(bing_out))
    (record,) = manifest.parts
    assert record["documents_read"] == 60 and record["validation_fraction"] == 0.1
    assert (record["train"]["documents"], record["validation"]["documents"]) == (54, 6)
    held = list(manifest.heldout_documents())
    assert [d["sentences"] for d in held] == [docs[d["document"]] for d in held] and len(held) == 6
    keys = {document_key(doc) for doc in docs}
    # the key function it names is the one that made the keys (it named tools.corpora, which never existed)
    module, name = record["key"].split(":")[0].rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is document_key
    assert set(manifest.heldout_keys().tolist()) | set(manifest.train_keys().tolist()) == keys
    assert manifest.train_keys().tolist() == sorted(keys - set(manifest.heldout_keys().tolist()))
    tokenizer = build_fast_tokenizer(str(data.vocab))
    train, validation = shard_text(bing_out / "train"), shard_text(bing_out / "validation")
    sentences = [tokenizer.encode(s, add_special_tokens=False).tokens for d in held for s in d["sentences"]]
    assert not [s for s in sentences if occurs(s, train)]
    assert all(occurs(s, validation) for s in sentences)       # where the search does find them


# ----------------------------------------------------------------------------- pieces

def test_word_cache_tokenizer_equals_plain_encoding(data):
    tokenizer = build_fast_tokenizer(str(data.vocab))
    lines = ["The cat sat.", "Quickly\x0cjumping dogs,walked", "  park\u00a0house\u2028river ",
             "Café ŞÇHÖÖL über naïve", "日本 tree\x1fmill", "zebra zebra zebra xylophone.", "\u200b", "a"]
    words = WordCacheTokenizer(tokenizer)
    words.WORDS_PER_TEXT = 3          # several texts per encode_batch call
    for batch in (lines, lines[::-1]):  # the second pass reads the cache
        ids, per_line = words.encode_lines(batch)
        expected = [e.ids for e in tokenizer.encode_batch(batch, add_special_tokens=False)]
        assert per_line.tolist() == [len(e) for e in expected]
        assert ids.tolist() == [i for e in expected for i in e]


def test_truncation_matches_bert_truncate_seq_pair():
    """Both forms: the tool's per-instance counts and the providers' vectorised lengths
    (turing.dataset.truncate_pair; kept apart because the tool calls it once per instance in
    a pure-Python loop, where numpy per call would cost more than the loop)."""
    from turing.dataset import truncate_pair

    for len_a in range(1, 12):
        for len_b in range(1, 12):
            a, b = len_a, len_b
            while a + b > 8:      # BERT: trim the longer one (B on a tie) one token at a time
                if a > b:
                    a -= 1
                else:
                    b -= 1
            assert truncation(len_a, len_b, 8) == (len_a - a, len_b - b)
            assert tuple(int(n) for n in truncate_pair(np.array(len_a), np.array(len_b), 8)) == (a, b)


def test_instances_follow_bert_segment_rules():
    settings = types.SimpleNamespace(max_seq_length=13, short_seq_prob=0.0, dupe_factor=3)
    docs = [(0, [3, 4, 2, 5]), (14, [6]), (20, [2, 2, 2, 2, 2, 2])]
    a_start, a_len, b_start, b_len, is_random = create_instance_spans(docs, settings, random.Random(3))
    assert (a_len >= 1).all() and (b_len >= 1).all() and (a_len + b_len <= 10).all()
    sentence_starts = {0, 3, 7, 9, 14, 20, 22, 24, 26, 28, 30}
    doc_of = lambda t: 0 if t < 14 else 1 if t < 20 else 2  # noqa: E731
    for i in range(len(a_len)):
        # A real continuation B starts right after A unless A was trimmed at the back.
        if not is_random[i]:
            assert doc_of(a_start[i]) == doc_of(b_start[i]) and b_start[i] >= a_start[i] + a_len[i]
        else:
            assert doc_of(b_start[i]) != doc_of(a_start[i])
        if a_len[i] + b_len[i] < 10:   # untruncated: segments start on sentence boundaries
            assert a_start[i] in sentence_starts and b_start[i] in sentence_starts
    assert is_random.any() and not is_random.all()


# ----------------------------------------------------------------------------- vocab builder

def test_build_vocab_writes_bert_vocab(data, tmp_path):
    out = tmp_path / "o"
    assert prepare_data.main(["--input", str(data.corpus), "--output_dir", str(out), "--build_vocab", "120",
                              "--max_seq_length", "64"]) == 0
    tokens = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert tokens[:5] == SPECIALS
    assert 90 <= len(tokens) <= 120 and len(set(tokens)) == len(tokens)
    assert "the" in tokens and any(t.startswith("##") for t in tokens)
    assert (out / "train" / "o_training_shard0.hdf5").exists()


def test_build_vocab_gives_the_same_vocab_and_shards_in_every_process(tmp_path):
    """`tokenizers`' trainer numbers part of the alphabet in hash order, drawn anew in each process,
    and broke ties between equally frequent merges by it: other entries in each run."""
    corpus = files.write_jsonl(str(tmp_path / "docs.jsonl"), files.synthetic_documents(400, seed=3))
    made = []
    for run in ("a", "b"):
        out = tmp_path / run
        subprocess.run([sys.executable, "-m", "tools.prepare_data", "--input", corpus, "--output_dir", str(out),
                        "--prefix", "p", "--format", "nvidia", "--build_vocab", "300", "--max_seq_length", "64",
                        "--max_predictions_per_seq", "10"], cwd=REPO, check=True, capture_output=True)
        made.append([(out / name).read_bytes() for name in ("vocab.txt", "train/p_training_shard0.hdf5")])
    assert made[0] == made[1]
    tokens = made[0][0].decode().splitlines()
    assert tokens[:5] == SPECIALS and 200 < len(tokens) == len(set(tokens)) <= 300


# ----------------------------------------------------------------------------- bad input

def error_of(capsys, argv):
    return tool_error_line(capsys, prepare_data.main, argv)


def test_bad_inputs_give_one_error_line(data, tmp_path, capsys):
    base = ["--output_dir", str(tmp_path / "o"), "--vocab_file", str(data.vocab)]
    msg = error_of(capsys, ["--input", str(tmp_path / "missing.txt")] + base)
    assert "missing.txt" in msg and "no such file" in msg
    (tmp_path / "empty_dir").mkdir()
    assert "no .txt" in error_of(capsys, ["--input", str(tmp_path / "empty_dir")] + base)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    assert "no document" in error_of(capsys, ["--input", str(empty)] + base)
    no_special = make_vocab(tmp_path / "v.txt", specials=["[PAD]", "[UNK]", "[CLS]"])
    msg = error_of(capsys, ["--input", str(data.corpus), "--output_dir", str(tmp_path / "o"),
                            "--vocab_file", str(no_special)])
    assert "v.txt" in msg and "[SEP]" in msg and "[MASK]" in msg
    msg = error_of(capsys, ["--input", str(data.corpus), *base, "--max_seq_length", "16",
                            "--max_predictions_per_seq", "14"])
    assert "--max_predictions_per_seq 14" in msg and "13" in msg
    with pytest.raises(SystemExit) as exc:
        prepare_data.main(["--input", str(data.corpus), *base, "--format", "csv"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("error: argument --format")
    assert "exactly one" in error_of(capsys, ["--input", str(data.corpus), "--output_dir", str(tmp_path / "o")])
    one_doc = tmp_path / "one.txt"
    one_doc.write_text("The cat sat on a mat.\nThe dog ran.\n")
    msg = error_of(capsys, ["--input", str(one_doc), *base, "--dupe_factor", "1", "--num_shards", "50"])
    assert "50 shards" in msg and "--num_shards" in msg
    assert not (tmp_path / "o" / "train").exists()


def test_existing_shards_need_overwrite(data, tmp_path, capsys):
    out = run(data, tmp_path / "o", "--num_shards", 3, "--validation_fraction", 0.1, fmt="bing")
    argv = ["--input", str(data.corpus), "--output_dir", str(out), "--vocab_file", str(data.vocab),
            "--format", "bing", "--max_seq_length", "64", "--num_shards", "2"]
    msg = error_of(capsys, argv)
    assert "already holds shards" in msg and "--overwrite" in msg
    assert prepare_data.main(argv + ["--overwrite"]) == 0
    # The old third shard and the old validation set are gone: no provider may read stale shards.
    assert sorted(os.listdir(out / "train")) == ["shard_000", "shard_001"]
    assert os.listdir(out / "validation") == []
    # A different vocab.txt is not silently replaced either.
    other = tmp_path / "other"
    other.mkdir()
    (other / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    msg = error_of(capsys, ["--input", str(data.corpus), "--output_dir", str(other),
                            "--vocab_file", str(data.vocab)])
    assert "different vocab.txt" in msg


def test_a_part_removes_only_its_own_shards(data, tmp_path):
    """Part 1 run without a validation set leaves part 0's validation shard (the install removed
    every shard of validation/, no --overwrite given); part 1's own, with --overwrite, goes."""
    out = tmp_path / "parts"
    run(data, out, "--num_parts", 2, "--part", 0, "--validation_fraction", 0.1)
    part0 = (out / "validation" / "parts_part000_test_shard0.hdf5").read_bytes()
    run(data, out, "--num_parts", 2, "--part", 1)
    assert os.listdir(out / "validation") == ["parts_part000_test_shard0.hdf5"]
    assert (out / "validation" / "parts_part000_test_shard0.hdf5").read_bytes() == part0
    run(data, out, "--num_parts", 2, "--part", 1, "--validation_fraction", 0.1, "--overwrite")
    run(data, out, "--num_parts", 2, "--part", 1, "--overwrite")
    assert os.listdir(out / "validation") == ["parts_part000_test_shard0.hdf5"]
    assert sorted(os.listdir(out / "train")) == ["parts_part000_training_shard0.hdf5",
                                                 "parts_part001_training_shard0.hdf5"]
    records = sorted(name for part in (0, 1) for name in heldout.manifest_names(part))
    assert sorted(heldout.manifest_files(str(out))) == records
    # a run without parts (--overwrite) replaces every shard, and every part's record with its own
    run(data, out, "--overwrite")
    assert os.listdir(out / "train") == ["parts_training_shard0.hdf5"] and os.listdir(out / "validation") == []
    assert sorted(heldout.manifest_files(str(out))) == sorted(heldout.manifest_names())


def test_an_output_folder_named_like_a_part_tag_keeps_its_parts_apart(data, tmp_path, capsys):
    """OUT named web_part001 (the default prefix): part 0's shard web_part001_part000_... is not
    part 1's, so part 1 runs without --overwrite, and part 0's shard stays."""
    out = tmp_path / "web_part001"
    run(data, out, "--num_parts", 2, "--part", 0)
    part0 = (out / "train" / "web_part001_part000_training_shard0.hdf5").read_bytes()
    run(data, out, "--num_parts", 2, "--part", 1)
    assert sorted(os.listdir(out / "train")) == ["web_part001_part000_training_shard0.hdf5",
                                                 "web_part001_part001_training_shard0.hdf5"]
    assert (out / "train" / "web_part001_part000_training_shard0.hdf5").read_bytes() == part0
    argv = ["--input", str(data.corpus), "--output_dir", str(out), "--vocab_file", str(data.vocab),
            "--max_seq_length", "64", "--num_parts", "2", "--part", "1"]
    msg = error_of(capsys, argv)
    assert "already holds shards (train/web_part001_part001_training_shard0.hdf5, ...)" in msg
    assert prepare_data.main(argv + ["--overwrite"]) == 0
    assert (out / "train" / "web_part001_part000_training_shard0.hdf5").read_bytes() == part0


def test_crash_leaves_no_partial_shard(data, tmp_path, monkeypatch):
    calls = []

    def failing_add(self, arrays, group_sizes):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return original(self, arrays, group_sizes)

    original = ShardSet.add
    monkeypatch.setattr(ShardSet, "add", failing_add)
    out = tmp_path / "o"
    argv = ["--input", str(data.corpus), "--output_dir", str(out), "--vocab_file", str(data.vocab),
            "--max_seq_length", "64", "--chunk_size_mb", "0.004"]
    with pytest.raises(RuntimeError, match="disk full"):
        prepare_data.main(argv)
    # No shard, no vocab, no temporary folder: only the finished chunks, for the next run.
    assert os.listdir(out) == [WORK_DIR]
    assert os.listdir(out / WORK_DIR / "chunks")
    monkeypatch.setattr(ShardSet, "add", original)
    assert prepare_data.main(argv) == 0
    fresh = tmp_path / "fresh"
    assert prepare_data.main([str(fresh) if a == str(out) else a for a in argv]) == 0
    assert sorted(os.listdir(out)) == sorted(["stats.json", "train", "vocab.txt", record_name(),
                                              *heldout.manifest_names()])
    assert (out / "train" / "o_training_shard0.hdf5").read_bytes() == \
        (fresh / "train" / "fresh_training_shard0.hdf5").read_bytes()


def test_folder_input_reads_its_txt_files_but_not_the_output(data, tmp_path, capsys):
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    make_corpus(folder / "a.txt", documents=10, seed=1)
    make_corpus(folder / "sub" / "b.txt", documents=10, seed=2)
    (folder / "notes.md").write_text("not text input\n")
    argv = ["--input", str(folder), "--output_dir", str(folder / "out"), "--vocab_file", str(data.vocab),
            "--max_seq_length", "64", "--format", "bing"]
    assert prepare_data.main(argv) == 0
    assert "train: 20 documents" in capsys.readouterr().out
    # Again, with --overwrite: out/vocab.txt is now inside the input folder and must not be read.
    assert prepare_data.main(argv + ["--overwrite"]) == 0
    assert "train: 20 documents" in capsys.readouterr().out

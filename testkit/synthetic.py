"""Tiny, learnable pretraining data for tests: a vocab file and shards in both formats.

Skewed word frequencies and repeated words make a masked token predictable, so a
2-layer model's loss falls within a few dozen steps.
"""
import os

import h5py
import numpy as np

from turing.formats import BING_SEPARATOR, HDF5_DTYPES, HDF5_KEYS

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_vocab(path, n_words=91):
    """SPECIALS then w0..w{n-1}; 96 entries by default (already a multiple of 8)."""
    tokens = SPECIALS + [f"w{i}" for i in range(n_words)]
    with open(path, "w") as f:
        f.write("\n".join(tokens) + "\n")
    return {t: i for i, t in enumerate(tokens)}


def make_instances(n, max_seq_length, seed=0, n_words=91, min_len=None):
    """(tokens_a, tokens_b, is_random_next) triples; A+B fill up to max_seq_length - 3.

    A document is a run of Zipf-distributed words, each repeated 2-4 times: the word
    frequencies and the copy-a-neighbour rule are both quick to learn."""
    rng = np.random.default_rng(seed)
    budget = max_seq_length - 3
    weights = 1.0 / np.arange(1, n_words + 1) ** 1.1
    weights /= weights.sum()

    def text(length):
        words = rng.choice(n_words, size=length, p=weights)
        reps = rng.integers(2, 5, size=length)
        return [f"w{w}" for w in np.repeat(words, reps)[:length]]

    out = []
    for _ in range(n):
        total = int(rng.integers(min_len or max(4, budget // 2), budget + 1))
        len_a = int(rng.integers(1, total))
        walk = text(total)
        is_random = int(rng.integers(2))
        b = text(total - len_a) if is_random else walk[len_a:]
        out.append((walk[:len_a], b, is_random))
    return out


def write_nvidia_shard(path, instances, vocab, max_seq_length, max_pred=20, seed=0):
    """One hdf5 shard in NVIDIA's create_pretraining_data.py layout, statically masked."""
    rng = np.random.default_rng(seed)
    n = len(instances)
    ids = np.zeros((n, max_seq_length), np.int32)
    mask = np.zeros((n, max_seq_length), np.int8)
    seg = np.zeros((n, max_seq_length), np.int8)
    pos = np.zeros((n, max_pred), np.int32)
    lab = np.zeros((n, max_pred), np.int32)
    nsp = np.zeros((n,), np.int8)
    words = [i for t, i in vocab.items() if t not in SPECIALS]
    for r, (a, b, is_random) in enumerate(instances):
        tokens = ["[CLS]"] + a + ["[SEP]"] + b + ["[SEP]"]
        row = [vocab[t] for t in tokens]
        cands = [i for i, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
        k = min(max_pred, max(1, int(round(len(tokens) * 0.15))))
        chosen = sorted(rng.choice(cands, size=k, replace=False).tolist())
        for j, p in enumerate(chosen):
            pos[r, j], lab[r, j] = p, row[p]
            u = rng.random()
            row[p] = vocab["[MASK]"] if u < 0.8 else (row[p] if u < 0.9 else int(rng.choice(words)))
        ids[r, :len(row)] = row
        mask[r, :len(row)] = 1
        seg[r, len(a) + 2:len(row)] = 1
        nsp[r] = is_random
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with h5py.File(path, "w") as f:
        for key, arr in zip(HDF5_KEYS, (ids, mask, seg, pos, lab, nsp)):
            f.create_dataset(key, data=arr, dtype=HDF5_DTYPES[key], compression="gzip")
    return path


def write_bing_shard(folder, instances):
    """One Bing numpy shard folder, separator layout (tokens joined by BING_SEPARATOR)."""
    os.makedirs(folder, exist_ok=True)
    blobs = [bytes([BING_SEPARATOR]).join(t.encode() for t in a + b) for a, b, _ in instances]
    offsets = np.zeros(len(blobs) + 1, np.int64)
    offsets[1:] = np.cumsum([len(x) for x in blobs])
    np.save(os.path.join(folder, "data.npy"), np.frombuffer(b"".join(blobs), np.uint8))
    np.save(os.path.join(folder, "instance_offsets.npy"), offsets)
    np.save(os.path.join(folder, "tokens_split.npy"), np.array([len(a) for a, _, _ in instances], np.int64))
    np.save(os.path.join(folder, "is_next.npy"), np.array([r for _, _, r in instances], np.int64))
    return folder


def make_data_root(root, seq_lengths=(128,), n_train=256, n_valid=32, shards=2, seed=0, shard_sizes=None):
    """The layout configs/tiny/bert_config.json expects under --data_path_prefix `root`:
    vocab.txt, nvidia/{seq}/train/*training*.hdf5, nvidia/{seq}/validation/*test*.hdf5,
    bing/{seq}/{wiki,bc}/shard_NNN, bing/{seq}/validation/shard_000."""
    os.makedirs(root, exist_ok=True)
    vocab = write_vocab(os.path.join(root, "vocab.txt"))
    for seq in seq_lengths:
        sizes = shard_sizes or [n_train // shards] * shards
        for i, size in enumerate(sizes):
            inst = make_instances(size, seq, seed=seed * 1000 + seq + i)
            write_nvidia_shard(os.path.join(root, f"nvidia/{seq}/train/tiny_training_shard{i}.hdf5"),
                               inst, vocab, seq, seed=i)
            for name in ("wiki", "bc"):
                write_bing_shard(os.path.join(root, f"bing/{seq}/{name}/shard_{i:03d}"), inst)
        valid = make_instances(n_valid, seq, seed=seed * 1000 + seq + 999)
        write_nvidia_shard(os.path.join(root, f"nvidia/{seq}/validation/tiny_test_shard0.hdf5"),
                           valid, vocab, seq, seed=99)
        write_bing_shard(os.path.join(root, f"bing/{seq}/validation/shard_000"), valid)
    return root

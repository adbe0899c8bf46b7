"""Bing data path speed: the vectorised provider path against the per-sample baseline.

Owns: generating realistic Bing shards with a fake ~30k-token vocab in a temporary folder
and timing, in one process and one run, micro batches of `--batch` samples at each sequence
length: the baseline (bench/baseline_bing.py, per-sample decoding + masking + default
DataLoader collation) and ours (turing.dataset: tokens mapped to ids once per shard, masking
vectorised over a micro batch, served by the provider's DataLoader). Prints samples/s.

    python bench/bench_data.py                      # seq 128 and 512, batch 64
    python bench/bench_data.py --seq 128 --samples 4096
"""
import argparse
import logging
import os
import sys
import tempfile
import time

import numpy as np
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.baseline_bing import PerSampleBingDataset  # noqa: E402
from bing_bert_dataset_provider import _MicroBatches  # noqa: E402
from turing.dataset import BingPretrainDataset, BingShard, VocabIndex, epoch_sample_order, tokenize_shard  # noqa: E402
from turing.tokenization import load_vocab  # noqa: E402

logger = logging.getLogger("bench_data")
SPECIALS = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_fake_vocab(path, size, rng):
    """SPECIALS, then `size` distinct lowercase words and ##pieces of 1-14 letters."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = set()
    while len(words) < size:
        n = int(rng.integers(1, 15))
        w = "".join(rng.choice(letters, n))
        words.add(("##" + w) if rng.random() < 0.25 else w)
    tokens = SPECIALS + sorted(words)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return tokens


def write_fake_shard(folder, tokens, num_instances, max_seq_length, rng, oov_share=0.01):
    """Instances like create_pretraining_data's: 90% fill the sequence, 10% are shorter."""
    os.makedirs(folder, exist_ok=True)
    words = np.array(tokens[len(SPECIALS):], dtype=object)
    full = max_seq_length - 3
    lengths = np.where(rng.random(num_instances) < 0.9, full, rng.integers(2, full + 1, num_instances))
    # Zipf-like word frequencies, as in text.
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    chunks, offsets, split = [], [0], []
    size = 0
    for n in lengths:
        picked = list(words[rng.choice(len(words), n, p=weights)])
        for j in np.flatnonzero(rng.random(n) < oov_share):
            picked[j] = "qx" + picked[j]  # not in the vocab -> [UNK]
        raw = "\x1f".join(picked).encode("utf-8")
        chunks.append(raw)
        size += len(raw)
        offsets.append(size)
        split.append(int(rng.integers(1, n)))
    np.save(os.path.join(folder, "data.npy"), np.frombuffer(b"".join(chunks), dtype=np.uint8))
    np.save(os.path.join(folder, "instance_offsets.npy"), np.array(offsets, dtype=np.int64))
    np.save(os.path.join(folder, "tokens_split.npy"), np.array(split, dtype=np.int32))
    np.save(os.path.join(folder, "is_next.npy"), rng.integers(0, 2, num_instances).astype(np.int8))


def time_baseline(folder, vocab, seq, batch, max_pred, num_batches):
    dataset = PerSampleBingDataset(folder, vocab, seq, max_pred)
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=0)
    it = iter(loader)
    next(it)  # warm-up
    start = time.perf_counter()
    for _ in range(num_batches):
        next(it)
    return num_batches * batch / (time.perf_counter() - start)


def time_ours(folder, vocab, seq, batch, max_pred):
    """(samples/s over one epoch incl. tokenizing the shard, samples/s of batches alone, tokenize s, tokens)."""
    start = time.perf_counter()
    shard = tokenize_shard(BingShard(folder), VocabIndex(vocab))
    tokenize_s = time.perf_counter() - start
    dataset = BingPretrainDataset(shard, vocab, seq, max_pred, seed=42)
    order = epoch_sample_order(len(shard), 42, 0)
    num_batches = len(order) // batch
    rows = order[:num_batches * batch].reshape(num_batches, batch)
    loader = DataLoader(_MicroBatches(dataset, rows), batch_size=None, num_workers=0)
    build_start = time.perf_counter()
    for _ in loader:
        pass
    build_s = time.perf_counter() - build_start
    samples = num_batches * batch
    return samples / (tokenize_s + build_s), samples / build_s, tokenize_s, len(shard.ids)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Bing data path: samples/s, ours vs per-sample baseline")
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--samples", type=int, default=16384, help="instances per generated shard")
    parser.add_argument("--baseline_batches", type=int, default=40)
    parser.add_argument("--vocab_size", type=int, default=30000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tokens = write_fake_vocab(os.path.join(tmp, "vocab.txt"), args.vocab_size, rng)
        vocab = load_vocab(os.path.join(tmp, "vocab.txt"))
        for seq in args.seq:
            max_pred = 20 if seq <= 128 else 80
            folder = os.path.join(tmp, f"shard_{seq}")
            write_fake_shard(folder, tokens, args.samples, seq, rng)
            base = time_baseline(folder, vocab, seq, args.batch, max_pred, args.baseline_batches)
            ours_total, ours_build, tok_s, n_tokens = time_ours(folder, vocab, seq, args.batch, max_pred)
            rows.append((seq, base, ours_build, ours_total, tok_s, n_tokens))
    print(f"micro batch {args.batch}, one process, {args.samples} instances per shard, vocab {len(tokens)}")
    print("samples/s; 'one epoch' also counts mapping the shard's tokens to ids, done once per shard "
          "(in the background during the previous epoch when training)")
    print(f"{'seq':>4} {'baseline':>9} {'ours':>8} {'speed-up':>9} {'ours, one epoch':>16} {'token mapping':>28}")
    for seq, base, build, total, tok_s, n_tokens in rows:
        print(f"{seq:>4} {base:>9,.0f} {build:>8,.0f} {build / base:>8.1f}x {total:>16,.0f} "
              f"{n_tokens / 1e6:>6.1f} M tokens in {tok_s:.2f} s ({n_tokens / tok_s / 1e6:.1f} M/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Data path speed: both providers against per-sample baselines, and the AsyncWorker on and off.

Owns nothing used in training. In a temporary folder it generates, per sequence length, one
Bing shard of realistic instances over a fake ~30k-token vocab (90% of the instances fill
the sequence, Zipf word frequencies, 1% unknown words) and, from the same instances, one
NVIDIA hdf5 shard statically masked by tools/prepare_data.py's `nvidia_arrays` (the layout of
NVIDIA's create_pretraining_data.py, gzip as h5py writes it). Then, in one process:

1. Provider vs per-sample baseline, micro batches of `--batch`, `--rounds` alternating rounds
   (median reported). Ours is the real provider (`NvidiaBertDatasetProvider`,
   `BingBertDatasetProvider` without the AsyncWorker, DataLoader num_workers 0) read through
   get_shard/get_batch as deepspeed_train.py reads it; its figure counts the batches only,
   "one epoch" also counts get_shard (reading and gunzipping the hdf5 shard; mapping the Bing
   shards' tokens to ids, done in the background during the previous epoch when training).
   The baselines are the original's per-sample datasets with the default DataLoader
   collation: bench/baseline_nvidia.py (slice the arrays, build the labels per sample) and
   bench/baseline_bing.py (decode, mask and look up tokens per sample), `--baseline_batches`
   batches after one warm-up batch.
2. AsyncWorker on/off: deepspeed_train.py's consumer loop (get_batch, a simulated step of
   `--step_ms`, prefetch_batch) over `--overlap_batches` micro batches of the provider's real
   batches, fetched directly vs through data_worker.AsyncWorker. Reported: samples/s and
   the share of the loop's time spent waiting for data. The Bing provider switches its own
   AsyncWorker on (`async_worker` in the config); the NVIDIA provider has none, so the bench
   wraps its batch iterator in one the way the Bing provider does. `--step_work sleep`
   leaves the CPU free during the step (a GPU step); `compute` runs single-threaded torch
   matmuls, which release the GIL but hold a core, as a CPU training step does.

    python bench/bench_data.py                                   # seq 128 and 512, batch 64
    python bench/bench_data.py --seq 128 --batch 32 --providers nvidia
    python bench/bench_data.py --output bench/results/data.jsonl
"""
import argparse
import datetime
import logging
import os
import statistics
import sys
import tempfile
import time

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import append_json_lines, load_average, machine_description  # noqa: E402
from bench.baseline_bing import PerSampleBingDataset  # noqa: E402
from bench.baseline_nvidia import PerSampleNvidiaDataset  # noqa: E402
from bing_bert_dataset_provider import BingBertDatasetProvider  # noqa: E402
from data_worker import AsyncWorker  # noqa: E402
from nvidia_bert_dataset_provider import HDF5_KEYS, NvidiaBertDatasetProvider  # noqa: E402
from tools.prep.instances import nvidia_arrays  # noqa: E402
from tools.prep.workers import Settings  # noqa: E402
from turing.dataset import BingShard, VocabIndex, tokenize_shard, truncate_pair  # noqa: E402
from turing.tokenization import load_vocab, special_token_ids  # noqa: E402

logger = logging.getLogger("bench_data")
SPECIALS = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PROVIDERS = ("nvidia", "bing")
SEED = 42
SHARD_LOAD = {"nvidia": "reading + gunzipping the hdf5 shard",
              "bing": "mapping the tokens of the 2 shards (wiki, bc) to ids"}


class BenchError(ValueError):
    """A benchmark option that cannot be honoured; the message says which and why."""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--seq", type=int, nargs="+", default=[128, 512])
    add("--batch", type=int, default=64, help="micro batch")
    add("--samples", type=int, default=16384, help="instances per generated shard")
    add("--providers", default="nvidia,bing", help="comma-separated subset of nvidia,bing")
    add("--rounds", type=int, default=3, help="alternating baseline/provider rounds; the median is reported")
    add("--baseline_batches", type=int, default=40, help="timed baseline batches per round")
    add("--vocab_size", type=int, default=30000, help="words in the fake vocab (plus 104 specials)")
    add("--step_ms", type=float, default=20.0, help="simulated training step per micro batch (AsyncWorker part)")
    add("--step_work", choices=["sleep", "compute"], default="sleep",
        help="sleep: the CPU is free during the step (a GPU step); compute: single-threaded torch matmuls")
    add("--overlap_batches", type=int, default=100,
        help="micro batches per AsyncWorker on/off measurement (0: skip that part)")
    add("--output", default=None, help="append one JSON line per measurement to this file")
    args = parser.parse_args(argv)
    args.providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    if not args.providers or set(args.providers) - set(PROVIDERS) or len(set(args.providers)) < len(args.providers):
        raise BenchError(f"--providers: got {args.providers}; expected a comma-separated subset of "
                         f"{','.join(PROVIDERS)}")
    if min(args.seq) < 8:
        raise BenchError(f"--seq: every length must be at least 8 ([CLS] A [SEP] B [SEP] and a few "
                         f"maskable tokens); got {args.seq}")
    if args.batch < 1:
        raise BenchError(f"--batch must be at least 1; got {args.batch}")
    if args.samples < 2 * args.batch:
        raise BenchError(f"--samples {args.samples} gives fewer than two micro batches of --batch {args.batch}")
    if args.rounds < 1 or args.baseline_batches < 1:
        raise BenchError("--rounds and --baseline_batches must be at least 1")
    if args.step_ms < 0 or args.overlap_batches < 0:
        raise BenchError("--step_ms and --overlap_batches must not be negative")
    if args.vocab_size < 100:
        raise BenchError(f"--vocab_size must be at least 100; got {args.vocab_size}")
    return args


# ---------------------------------------------------------------------------------------------
# Generated data


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


def write_nvidia_shard_like(path, bing_folder, vocab, max_seq_length, max_pred, seed):
    """The instances of a Bing shard as an NVIDIA hdf5 shard, statically masked by prepare_data."""
    shard = tokenize_shard(BingShard(bing_folder), VocabIndex(vocab))
    special = special_token_ids(vocab)
    settings = Settings(fmt="nvidia", bing_layout="separator", max_seq_length=max_seq_length,
                        max_predictions_per_seq=max_pred, masked_lm_prob=0.15, validation_masked_lm_prob=0.15,
                        short_seq_prob=0.1,
                        dupe_factor=1, seed=seed, vocab_size=len(vocab), cls_id=special["cls"],
                        sep_id=special["sep"], mask_id=special["mask"], unk_id=special["unk"])
    start = shard.first_token[:-1]
    len_a = shard.tokens_split
    a_len, b_len = truncate_pair(len_a, np.diff(shard.first_token) - len_a, max_seq_length - 3)
    spans = (start, a_len, start + len_a, b_len, shard.is_next)
    arrays = nvidia_arrays(shard.ids, spans, settings, np.random.default_rng(seed))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with h5py.File(path, "w") as f:
        for key in HDF5_KEYS:
            f.create_dataset(key, data=arrays[key], compression="gzip")


def generate(root, seq, tokens, vocab, args, rng):
    """Bing shard (wiki, and bc as a link to it) and the NVIDIA shard of one sequence length."""
    bing = os.path.join(root, f"bing_{seq}")
    write_fake_shard(os.path.join(bing, "wiki", "shard_000"), tokens, args.samples, seq, rng)
    os.makedirs(os.path.join(bing, "bc"))
    os.symlink(os.path.join(bing, "wiki", "shard_000"), os.path.join(bing, "bc", "shard_000"))
    write_nvidia_shard_like(os.path.join(root, f"nvidia_{seq}", "bench_training_shard0.hdf5"),
                            os.path.join(bing, "wiki", "shard_000"), vocab, seq, max_predictions(seq), SEED)


def max_predictions(seq):
    return min(20 if seq <= 128 else 80, seq - 3)


# ---------------------------------------------------------------------------------------------
# Providers and baselines


def make_provider(name, root, seq, vocab_file, vocab_size, batch, async_worker=False):
    """The provider deepspeed_train.py builds, from the args it would pass (one rank, no workers): the
    providers take the trainer's parsed argparse.Namespace, as the original's do."""
    training = {"num_workers": 0}
    if name == "nvidia":
        datasets = {"pretrain_dataset": f"nvidia_{seq}"}
        provider_class = NvidiaBertDatasetProvider
    else:
        datasets = {"wiki_pretrain_dataset": f"bing_{seq}/wiki", "bc_pretrain_dataset": f"bing_{seq}/bc"}
        provider_class = BingBertDatasetProvider
        if async_worker:
            training["async_worker"] = True
    args = argparse.Namespace(local_rank=-1, seed=SEED, train_micro_batch_size_per_gpu=batch,
                              gradient_accumulation_steps=1, refresh_bucket_size=1, max_seq_length=seq,
                              max_predictions_per_seq=max_predictions(seq), vocab_file=vocab_file,
                              vocab_size=vocab_size, data_path_prefix=root,
                              config={"training": training, "data": {"datasets": datasets}})
    return provider_class(args)


def baseline_dataset(name, root, seq, vocab):
    if name == "nvidia":
        return PerSampleNvidiaDataset(os.path.join(root, f"nvidia_{seq}", "bench_training_shard0.hdf5"),
                                      max_predictions(seq))
    return PerSampleBingDataset(os.path.join(root, f"bing_{seq}", "wiki", "shard_000"), vocab, seq,
                                max_predictions(seq))


def time_baseline(dataset, batch, num_batches):
    """samples/s of the default DataLoader over a per-sample dataset, after one warm-up batch."""
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=0)
    it = iter(loader)
    next(it)
    num_batches = min(num_batches, len(loader) - 1)
    start = time.perf_counter()
    for _ in range(num_batches):
        next(it)
    return num_batches * batch / (time.perf_counter() - start)


def time_provider(provider, epoch, batch):
    """One epoch read as deepspeed_train.py reads it: (samples/s of the batches, get_shard seconds, batches)."""
    start = time.perf_counter()
    refs, count = provider.get_shard(epoch)
    load_s = time.perf_counter() - start
    ref_iter = iter(refs)
    start = time.perf_counter()
    for _ in range(count):
        provider.get_batch(next(ref_iter))
        provider.prefetch_batch()
    build_s = time.perf_counter() - start
    provider.release_shard(epoch)
    return count * batch / build_s, load_s, count


# ---------------------------------------------------------------------------------------------
# AsyncWorker on/off


class SimulatedStep:
    """`ms` of sleep, or of single-threaded torch matmuls (calibrated once), per call."""

    def __init__(self, ms, work):
        self.seconds = ms / 1000
        self.work = work
        self.reps = 0
        if work == "compute" and ms > 0:
            self.a = torch.randn(256, 256)
            start = time.perf_counter()
            for _ in range(50):
                torch.mm(self.a, self.a)
            self.reps = max(1, round(self.seconds / ((time.perf_counter() - start) / 50)))

    def __call__(self):
        if self.work == "sleep":
            time.sleep(self.seconds)
        else:
            for _ in range(self.reps):
                torch.mm(self.a, self.a)


def consume(provider, epoch, batch, step, max_batches, wrap_async):
    """deepspeed_train.py's loop over `max_batches` micro batches: -> (samples/s, data wait share)."""
    refs, count = provider.get_shard(epoch)
    get, prefetch, worker = provider.get_batch, provider.prefetch_batch, None
    if wrap_async:  # as BingBertDatasetProvider does with its loaders
        worker = AsyncWorker({0: refs}, [0] * count)
        worker.start()
        refs, get, prefetch = [0] * count, (lambda _: worker.get()), worker.prefetch
    count = min(count, max_batches)
    ref_iter = iter(refs)
    waited = 0.0
    start = time.perf_counter()
    for _ in range(count):
        before = time.perf_counter()
        get(next(ref_iter))
        waited += time.perf_counter() - before
        step()
        prefetch()
    elapsed = time.perf_counter() - start
    if worker is not None:
        worker.stop()
        worker.join(timeout=10)
    provider.release_shard(epoch)
    return count * batch / elapsed, waited / elapsed


# ---------------------------------------------------------------------------------------------
# Main


def measure(args, root, seq, tokens, vocab, vocab_file):
    """Both parts for one sequence length: -> (throughput rows, overlap rows)."""
    throughput, overlap = [], []
    for name in args.providers:
        provider = make_provider(name, root, seq, vocab_file, len(vocab), args.batch)
        baseline = baseline_dataset(name, root, seq, vocab)
        base, ours, epoch = [], [], []
        for r in range(args.rounds):
            # alternate who goes first, so both see the same machine load on average
            for which in (("base", "ours") if r % 2 == 0 else ("ours", "base")):
                if which == "base":
                    base.append(time_baseline(baseline, args.batch, args.baseline_batches))
                else:
                    rate, load_s, count = time_provider(provider, r, args.batch)
                    ours.append(rate)
                    epoch.append((rate, load_s, count))
        provider.close()
        rate, load_s, count = sorted(epoch)[len(epoch) // 2]  # the median round
        samples = count * args.batch
        throughput.append({
            "provider": name, "seq": seq, "batch": args.batch,
            "samples_per_s": statistics.median(ours), "baseline_samples_per_s": statistics.median(base),
            "ratio": statistics.median(ours) / statistics.median(base),
            "one_epoch_samples_per_s": samples / (samples / rate + load_s), "shard_load_s": load_s,
            "shard_load": SHARD_LOAD[name], "epoch_micro_batches": count,
            "rounds_samples_per_s": ours, "rounds_baseline_samples_per_s": base})
        if args.overlap_batches:
            step = SimulatedStep(args.step_ms, args.step_work)
            modes = {}
            for mode in ("direct", "async"):
                own_worker = name == "bing" and mode == "async"
                provider = make_provider(name, root, seq, vocab_file, len(vocab), args.batch, own_worker)
                modes[mode] = consume(provider, 0, args.batch, step, args.overlap_batches,
                                      wrap_async=mode == "async" and not own_worker)
                provider.close()
            (direct, direct_wait), (asynchronous, async_wait) = modes["direct"], modes["async"]
            overlap.append({
                "provider": name, "seq": seq, "batch": args.batch, "step_ms": args.step_ms,
                "step_work": args.step_work, "micro_batches": min(args.overlap_batches, count),
                "async_worker": "provider's own" if name == "bing" else "wrapped by the bench",
                "samples_per_s": asynchronous, "baseline_samples_per_s": direct, "ratio": asynchronous / direct,
                "data_wait_fraction": async_wait, "baseline_data_wait_fraction": direct_wait,
                "ideal_samples_per_s": args.batch / args.step_ms * 1000 if args.step_ms else None})
    return throughput, overlap


def print_tables(args, throughput, overlap, n_vocab):
    print(f"micro batch {args.batch}, one process (DataLoader num_workers 0), {args.samples} instances per shard, "
          f"vocab {n_vocab}; samples/s, median of {args.rounds} alternating rounds")
    print(f"{'provider':>8} {'seq':>4} {'baseline':>9} {'provider':>9} {'speed-up':>9} {'one epoch':>10}  shard load")
    for row in throughput:
        print(f"{row['provider']:>8} {row['seq']:>4} {row['baseline_samples_per_s']:>9,.0f} "
              f"{row['samples_per_s']:>9,.0f} {row['ratio']:>8.1f}x {row['one_epoch_samples_per_s']:>10,.0f}  "
              f"{row['shard_load_s']:.2f} s ({row['shard_load']})")
    print("baseline: per-sample dataset + default collation (bench/baseline_*.py); 'one epoch' adds get_shard's "
          "shard load to the provider's batches")
    if not overlap:
        return
    print()
    ideal = ""
    if args.step_ms:  # a calibrated compute step may run shorter or longer than --step_ms
        bound = "at most" if args.step_work == "sleep" else "about"
        ideal = f", {bound} {overlap[0]['ideal_samples_per_s']:,.0f} samples/s with no waiting"
    print(f"consumer loop of deepspeed_train.py: get_batch, {args.step_ms:g} ms step ({args.step_work}), "
          f"prefetch_batch{ideal}")
    print(f"{'provider':>8} {'seq':>4} {'batches':>7} {'direct':>8} {'waiting':>8} {'AsyncWorker':>11} "
          f"{'waiting':>8} {'speed-up':>9}")
    for row in overlap:
        star = "" if row["provider"] == "bing" else "*"
        print(f"{row['provider'] + star:>8} {row['seq']:>4} {row['micro_batches']:>7} "
              f"{row['baseline_samples_per_s']:>8,.0f} {100 * row['baseline_data_wait_fraction']:>7.2f}% "
              f"{row['samples_per_s']:>11,.0f} {100 * row['data_wait_fraction']:>7.2f}% {row['ratio']:>8.3f}x")
    if any(row["provider"] == "nvidia" for row in overlap):
        print("* the NVIDIA provider has no AsyncWorker in training; the bench wraps its batch iterator in one")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # quiet the providers' per-epoch lines
    logger.setLevel(logging.INFO)
    try:
        args = parse_args(argv)
    except BenchError as e:
        print(f"bench_data.py: error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    load_start = load_average()
    rng = np.random.default_rng(0)
    throughput, overlap = [], []
    try:
        with tempfile.TemporaryDirectory() as root:
            vocab_file = os.path.join(root, "vocab.txt")
            tokens = write_fake_vocab(vocab_file, args.vocab_size, rng)
            vocab = load_vocab(vocab_file)
            for seq in args.seq:
                started = time.perf_counter()
                generate(root, seq, tokens, vocab, args, rng)
                logger.info("seq %d: generated the shards in %.1f s", seq, time.perf_counter() - started)
                rows, overlap_rows = measure(args, root, seq, tokens, vocab, vocab_file)
                throughput += rows
                overlap += overlap_rows
    except ValueError as e:  # BenchError, or a provider refusing the generated data
        print(f"bench_data.py: error: {e}", file=sys.stderr)
        return 2
    load_end = load_average()
    print_tables(args, throughput, overlap, len(tokens))
    common = {"bench": "data", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "machine": machine_description(),
              "command": " ".join(["python bench/bench_data.py"] + argv), "samples_per_shard": args.samples,
              "vocab": len(tokens), "torch_threads": torch.get_num_threads(),
              "loadavg_start": load_start, "loadavg_end": load_end}
    records = ([{**common, "measure": "provider_vs_per_sample_baseline", **row} for row in throughput]
               + [{**common, "measure": "async_worker_vs_direct", **row} for row in overlap])
    append_json_lines(args.output, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

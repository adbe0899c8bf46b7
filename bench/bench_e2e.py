"""End-to-end training speed: the real deepspeed_train.py, through the launcher, on generated shards.

Owns nothing used in training. It writes, in a temporary folder, a vocab and learnable
synthetic shards (testkit/synthetic.py) in both formats (NVIDIA hdf5 and Bing numpy), a job
config whose `bert_model_config` is configs/demo_original's (the anchor model: 4 layers, 256 hidden,
4 heads, 1024 intermediate; vocab 30,528 by default) and a DeepSpeed config with
`--batch` as the micro batch. Then, for each provider, it runs `deepspeed deepspeed_train.py
... --max_steps N` and reads back what the script itself measures every 20 steps:
samples/s and the fraction of step time spent waiting for data (`Train/samples_per_s` and
`Train/data_wait_fraction` in TensorBoard, read with turing.tb_events). The first 20-step
window includes warm-up (first-touch allocations, the AsyncWorker filling its queue), so the
summary reports it apart from the later, steady windows.

    python bench/bench_e2e.py --steps 20                 # quick check, both providers
    python bench/bench_e2e.py --steps 60 --output bench/results/e2e.jsonl
"""
import argparse
import datetime
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import append_json_lines, load_average  # noqa: E402
from testkit import launcher as launch  # noqa: E402
from testkit import synthetic  # noqa: E402
from turing.tb_events import read_run  # noqa: E402

logger = logging.getLogger("bench_e2e")

PROVIDERS = ("nvidia", "bing")
THROUGHPUT_LINE = re.compile(r"bing_bert_progress: step=(\d+), .*samples_per_s=([0-9.]+), .*data_wait=([0-9.]+)%")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--steps", type=int, default=40, help="optimizer steps per run (throughput is logged every 20, the --print_steps it runs with)")
    add("--providers", default="nvidia,bing", help="comma-separated subset of nvidia,bing")
    add("--rounds", type=int, default=1, help="runs per provider, alternating the provider order")
    add("--seq", type=int, default=128, choices=[128, 512])
    add("--batch", type=int, default=32, help="micro batch (train_micro_batch_size_per_gpu)")
    add("--max_pred", type=int, default=20)
    add("--vocab_words", type=int, default=30517,
        help="words in the generated vocab besides 5 specials (30517 -> model vocab 30,528)")
    add("--model_config", default=os.path.join(REPO, "configs", "demo_original", "bert_config.json"),
        help="job config whose bert_model_config sizes the model")
    add("--sync_data", action="store_true", help="turn the AsyncWorker off (drop the async_worker key)")
    add("--plain_adam", action="store_true",
        help='drop "fused" from the demo DeepSpeed config\'s AdamW params (torch\'s per-parameter loop)')
    add("--train_args", default="",
        help='extra deepspeed_train.py flags, one string, e.g. "--unpad" or "--compile"')
    add("--bf16", action="store_true", help='DeepSpeed config "bf16": {"enabled": true}')
    add("--keep", default=None, help="keep the generated data and runs in this folder instead of a temp dir")
    add("--omp_threads", type=int, default=None,
        help="OMP_NUM_THREADS for the training process (default: the environment's, else torch's default)")
    add("--timeout", type=int, default=900, help="seconds per training run")
    add("--output", default=None, help="append results as JSON lines to this file")
    args = parser.parse_args(argv)
    args.providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    if not args.providers or set(args.providers) - set(PROVIDERS):
        parser.error(f"--providers: expected a comma-separated subset of {','.join(PROVIDERS)}")
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    return args


def write_inputs(root, args):
    """Vocab, shards of both formats and the two configs under `root`; -> (job config, ds config)."""
    started = time.perf_counter()
    vocab = synthetic.write_vocab(os.path.join(root, "vocab.txt"), n_words=args.vocab_words)
    # Enough samples for every run: the Bing provider splits its batches over two datasets.
    n = (args.steps + 4) * args.batch
    instances = synthetic.make_instances(n, args.seq, seed=1, n_words=args.vocab_words)
    synthetic.write_nvidia_shard(os.path.join(root, "nvidia", "train", "bench_training_shard0.hdf5"),
                                 instances, vocab, args.seq, max_pred=args.max_pred, seed=1)
    for name in ("wiki", "bc"):
        synthetic.write_bing_shard(os.path.join(root, "bing", name, "shard_000"), instances)
    logger.info("generated %d instances of seq %d, vocab %d, in %.1f s", n, args.seq, len(vocab),
                time.perf_counter() - started)

    with open(args.model_config, encoding="utf-8") as f:
        base = json.load(f)
    with open(os.path.join(REPO, "configs", "demo", "ds_config.json"), encoding="utf-8") as f:
        ds_config = json.load(f)
    seq = str(args.seq)
    training = dict(next(iter(base["mixed_seq_training"].values())))
    training.update(num_epochs=1, num_workers=0, total_training_steps=max(args.steps, 100))
    if args.sync_data:
        training.pop("async_worker", None)
    else:
        training["async_worker"] = True
    job = {"name": "bench_e2e", "bert_token_file": "vocab.txt", "bert_model_file": "",
           "bert_model_config": base["bert_model_config"],
           "data": {"flags": {"pretrain_dataset": True, "pretrain_type": "wiki_bc"},
                    "mixed_seq_datasets": {seq: {"pretrain_dataset": "nvidia/train",
                                                 "wiki_pretrain_dataset": "bing/wiki",
                                                 "bc_pretrain_dataset": "bing/bc"}}},
           "mixed_seq_training": {seq: training}}
    ds_config["train_micro_batch_size_per_gpu"] = args.batch
    if args.plain_adam:
        ds_config["optimizer"]["params"].pop("fused", None)
    if args.bf16:
        ds_config["bf16"] = {"enabled": True}
    ds_config["gradient_accumulation_steps"] = 1
    job_path, ds_path = os.path.join(root, "bert_config.json"), os.path.join(root, "ds_config.json")
    for path, obj in ((job_path, job), (ds_path, ds_config)):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2)
    return job_path, ds_path


def run_provider(root, job_path, ds_path, provider, args, tag):
    """One training run; -> dict with the 20-step windows read from TensorBoard and the log."""
    out = os.path.join(root, f"out_{tag}")
    shutil.rmtree(out, ignore_errors=True)  # a kept folder's earlier run must not mix into this one's events
    job_name = f"bench_{tag}"
    train_args = ["--cf", job_path, "--deepspeed", "--deepspeed_config", ds_path, "--output_dir", out,
                  "--data_path_prefix", root, "--max_seq_length", str(args.seq),
                  "--max_predictions_per_seq", str(args.max_pred), "--max_steps", str(args.steps),
                  "--print_steps", "20", "--job_name", job_name]
    if provider == "nvidia":
        train_args.append("--use_nvidia_dataset")
    train_args += args.train_args.split()
    # testkit.launcher.launch_env pins one intra-op thread (for tests); a benchmark runs with the machine's threads
    # (or --omp_threads), so the environment is the test helper's minus that pin.
    env = launch.launch_env()
    env.pop("OMP_NUM_THREADS", None)
    if os.environ.get("OMP_NUM_THREADS"):
        env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
    if args.omp_threads:
        env["OMP_NUM_THREADS"] = str(args.omp_threads)
    started = time.perf_counter()
    done = subprocess.run(launch.train_cmd(train_args), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=args.timeout)
    wall = time.perf_counter() - started
    output = done.stdout + done.stderr
    if done.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise RuntimeError(f"deepspeed_train.py ({provider}) exited with {done.returncode}:\n{tail}")
    scalars, _ = read_run(os.path.join(out, "runs", job_name))
    rates = scalars.get("Train/samples_per_s", [])
    waits = scalars.get("Train/data_wait_fraction", [])
    logged = [(int(s), float(r), float(w) / 100) for s, r, w in THROUGHPUT_LINE.findall(output)]
    if not rates and logged:  # TensorBoard missing: fall back on the log lines
        rates = [(s, r) for s, r, _ in logged]
        waits = [(s, w) for s, _, w in logged]
    return {"provider": provider, "wall_s": wall, "windows": [
        {"step": s, "samples_per_s": r, "data_wait_fraction": w} for (s, r), (_, w) in zip(rates, waits)]}


def summarise(run):
    windows = run["windows"]
    steady = windows[1:] or windows  # the first window carries the warm-up
    return {"first_window_samples_per_s": windows[0]["samples_per_s"] if windows else None,
            "first_window_data_wait": windows[0]["data_wait_fraction"] if windows else None,
            "steady_samples_per_s": statistics.median(w["samples_per_s"] for w in steady) if steady else None,
            "steady_data_wait": statistics.median(w["data_wait_fraction"] for w in steady) if steady else None,
            "steady_windows": len(steady) if len(windows) > 1 else 0}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.steps < 20:
        logger.warning("--steps %d < 20: the script logs throughput every 20 steps, so no figure will come back",
                       args.steps)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or tmp
        os.makedirs(root, exist_ok=True)
        job_path, ds_path = write_inputs(root, args)
        for r in range(args.rounds):
            order = args.providers if r % 2 == 0 else args.providers[::-1]
            for provider in order:
                load_start = load_average()
                try:
                    run = run_provider(root, job_path, ds_path, provider, args, f"{provider}_{r}")
                except RuntimeError as e:
                    print(f"bench_e2e.py: error: {e}", file=sys.stderr)
                    return 1
                rec = {"bench": "e2e", "date": datetime.datetime.now().isoformat(timespec="seconds"),
                       "command": "python bench/bench_e2e.py " + " ".join(argv), "round": r,
                       "seq": args.seq, "batch": args.batch, "steps": args.steps,
                       "omp_threads": args.omp_threads or os.environ.get("OMP_NUM_THREADS"),
                       "async_worker": not args.sync_data, "fused_adam": not args.plain_adam, "bf16": args.bf16,
                       "train_args": args.train_args,
                       "loadavg_start": load_start,
                       "loadavg_end": load_average(), **run, **summarise(run)}
                records.append(rec)
                logger.info("%s: %s", provider, ", ".join(
                    f"step {w['step']} {w['samples_per_s']:.1f} samples/s {100 * w['data_wait_fraction']:.2f}% wait"
                    for w in run["windows"]) or "no throughput window logged")

    print(f"seq {args.seq}, micro batch {args.batch}, {args.steps} steps, "
          f"AsyncWorker {'off' if args.sync_data else 'on'}{', plain AdamW' if args.plain_adam else ', fused AdamW'}"
          f"{' ' + args.train_args if args.train_args else ''}"
          f"{', bf16' if args.bf16 else ''}; windows of 20 steps, the first includes warm-up")
    print(f"{'provider':>8} {'round':>5} {'first: samples/s':>16} {'wait':>7} {'steady: samples/s':>17} "
          f"{'wait':>7} {'windows':>7} {'run wall s':>10}")
    for rec in records:
        def fmt(value, pct=False):
            if value is None:
                return "-"
            return f"{100 * value:.2f}%" if pct else f"{value:.1f}"
        print(f"{rec['provider']:>8} {rec['round']:>5} {fmt(rec['first_window_samples_per_s']):>16} "
              f"{fmt(rec['first_window_data_wait'], True):>7} {fmt(rec['steady_samples_per_s']):>17} "
              f"{fmt(rec['steady_data_wait'], True):>7} {rec['steady_windows']:>7} {rec['wall_s']:>10.1f}")
    append_json_lines(args.output, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time to the first optimizer step after a resume, at an early and a late position inside an
epoch of the same data: a resume skips the trained micro batches without reading them, so the time
should not grow with the position. One rank, tiny model, NVIDIA and Bing shards of 2048 samples
(128 steps an epoch at micro batch 16); a first run leaves checkpoints at steps EARLY and LATE,
then resumes from each (alternating, ROUNDS times) are timed from process start to the first
progress line. Appends a JSON line to bench/results/resume.jsonl.

    python bench/bench_resume.py [--work DIR] [--rounds 3] [--early 2] [--late 120] [--samples 4096]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import load_average  # noqa: E402
from testkit.launcher import PROGRESS, REPO, TINY_CFG, TINY_DS, launch_env  # noqa: E402
from testkit.synthetic import make_data_root  # noqa: E402


def command(data, out, provider, *extra):
    return [sys.executable, os.path.join(REPO, "deepspeed_train.py"), "--cf", TINY_CFG, "--deepspeed",
            "--deepspeed_config", TINY_DS, "--output_dir", out, "--data_path_prefix", data, "--max_seq_length",
            "128", "--max_predictions_per_seq", "20", "--print_steps", "1",
            *(["--use_nvidia_dataset"] if provider == "nvidia" else []), *extra]


def time_to_first_step(cmd):
    """Seconds from the start of `cmd` to its first progress line."""
    started = time.time()
    proc = subprocess.Popen(cmd, cwd=REPO, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    first = None
    for line in proc.stdout:
        if first is None and PROGRESS.search(line):
            first = time.time() - started
    proc.wait()
    if proc.returncode or first is None:
        raise SystemExit(f"{' '.join(cmd)} failed (exit code {proc.returncode})")
    return first


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--early", type=int, default=2)
    parser.add_argument("--late", type=int, default=120)
    parser.add_argument("--samples", type=int, default=4096, help="training samples (2 shards)")
    parser.add_argument("--providers", nargs="+", default=["nvidia", "bing"], choices=["nvidia", "bing"])
    parser.add_argument("--output", default=os.path.join(REPO, "bench", "results", "resume.jsonl"),
                        help="append the JSON line here")
    args = parser.parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix="bench_resume_")
    data = make_data_root(os.path.join(work, "data"), seq_lengths=(128,), n_train=args.samples, shards=2, n_valid=16)
    load_start = load_average()
    result = {"bench": "resume", "time": time.strftime("%Y-%m-%d %H:%M:%S"), "early": args.early, "late": args.late}
    for provider in args.providers:
        out = os.path.join(work, provider)
        subprocess.run(command(data, out, provider, "--checkpoint_every_steps", str(args.early), "--max_steps",
                               str(args.late), "--log_level", "warning"), cwd=REPO, env=launch_env(), check=True,
                       capture_output=True)
        folder = os.path.join(out, "saved_models", "tiny_bert")
        times = {"early": [], "late": []}
        for _ in range(args.rounds):
            for position, step in (("early", args.early), ("late", args.late)):
                times[position].append(time_to_first_step(command(
                    data, os.path.join(work, f"{provider}_{position}"), provider, "--load_training_checkpoint",
                    folder, "--load_checkpoint_id", f"step{step}", "--max_steps", "1")))
        result[provider] = {k: {"median_s": statistics.median(v), "all_s": v} for k, v in times.items()}
        print(provider, {k: round(v["median_s"], 2) for k, v in result[provider].items()})
    result["loadavg_start"], result["loadavg_end"] = load_start, load_average()
    with open(args.output, "a") as f:
        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()

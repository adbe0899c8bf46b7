"""Time to quality: recipes trained one after another on the demo data, validation MLM accuracy
against minutes of training, side by side.

Owns nothing used in training. Each recipe is a job config, a DeepSpeed config and a few
flags of deepspeed_train.py (RECIPES below); every recipe trains from scratch with the same
seed on the demo corpus and shards (scripts/prepare_demo_data.sh, made once in --work) through
the `deepspeed` launcher, under a wall-clock budget (`--max_train_hours`), validating every
`validation_every_steps` optimizer steps on the same validation set (15% masked, whatever the
recipe trains with). The script reads back what the training run logs by itself:
`Validation/step/MLM_accuracy` and `Validation/train_minutes` (training time without the
validations), and reports

- each run's curve (step, training minutes, accuracy) as a JSON line in --output,
- a table of accuracy at whole minutes (linear between validation points), and beside it the
  zero-shot minimal-pair accuracy of each run's final checkpoint with its 95% interval
  (tools/eval_mlm.py on WORK/minimal_pairs.jsonl, the demo's pairs from the documents held out of
  the shards; made once, as scripts/demo.sh makes them),
- time to quality: the minutes each recipe needs to reach the baseline recipe's final
  accuracy, and the ratio to the baseline's own time (the baseline trains --baseline_factor
  times the budget, so a 2x faster recipe can be seen reaching it within the budget),
- one figure of all runs (tools/plot_run.py's panels, accuracy against minutes among them).

    python bench/bench_quality.py                                 # original (10 min) vs demo (5 min)
    python bench/bench_quality.py --minutes 1 --recipes demo      # a quick look
    python bench/bench_quality.py --seeds 1 2 3 --output bench/results/quality.jsonl --plot bench/quality.png
"""
import argparse
import datetime
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import append_json_lines, load_average, machine_description  # noqa: E402
from testkit import launcher as launch  # noqa: E402
from tools.plot_run import plot_runs  # noqa: E402
from turing.tb_events import read_run  # noqa: E402

logger = logging.getLogger("bench_quality")

# name -> job config, DeepSpeed config, deepspeed_train.py flags, validation interval (steps).
# Data paths in the configs are under the work folder that scripts/prepare_demo_data.sh fills.
RECIPES = {
    # The original program's recipe scaled to the demo model (configs/demo before this bench):
    # EE schedule, LR 1e-3, dropout 0.1, NSP, 15% static masking, fp32, batch 32.
    "original": {"cf": "configs/demo_original/bert_config.json", "ds": "configs/demo_original/ds_config.json",
                 "flags": ["--lr_schedule", "EE", "--max_predictions_per_seq", "20"],
                 "validation_every_steps": 50},
    # The demo's recipe with the original block (DEMO_CONFIGS=configs/demo bash scripts/demo.sh):
    # keep in step with the training flags of scripts/demo.sh.
    "demo": {"cf": "configs/demo/bert_config.json", "ds": "configs/demo/ds_config.json",
             "flags": ["--lr_schedule", "WSD", "--max_predictions_per_seq", "52"],
             "validation_every_steps": 100},
    # The demo's recipe with the modernbert block, what scripts/demo.sh trains (configs/demo_modern:
    # 2 x 256, RoPE, GeGLU with the original FFN's parameter count, no biases, a full and a
    # sliding-window layer).
    "demo_modern": {"cf": "configs/demo_modern/bert_config.json", "ds": "configs/demo_modern/ds_config.json",
                    "flags": ["--lr_schedule", "WSD", "--max_predictions_per_seq", "52"],
                    "validation_every_steps": 100},
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--recipes", nargs="+", default=["original", "demo"], choices=sorted(RECIPES),
        help="recipes to train, in this order; the first is the baseline")
    add("--minutes", type=float, default=5.0, help="training budget of each recipe (minutes of training)")
    add("--baseline_factor", type=float, default=2.0,
        help="the baseline (first recipe) trains this many times --minutes")
    add("--seeds", nargs="+", type=int, default=[42], help="one run per recipe and seed")
    add("--work", default=os.path.join(REPO, "demo_run"),
        help="data folder (made by scripts/prepare_demo_data.sh when missing); runs go to WORK/quality/")
    add("--output", default=None, help="append one JSON line per run to this file")
    add("--plot", default=None, help="write the runs' figure (tools/plot_run.py panels) to this PNG")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.baseline_factor <= 0:
        parser.error("--minutes and --baseline_factor must be positive")
    return args


# The demo's minimal pairs: keep in step with scripts/demo.sh (from the documents
# scripts/prepare_demo_data.sh held out of WORK/nvidia, which no recipe trains on).
MINIMAL_PAIRS_FLAGS = ["--pairs_per_kind", "250"]


def ensure_data(work):
    if not os.path.isfile(os.path.join(work, "nvidia", "vocab.txt")):
        subprocess.run(["bash", os.path.join(REPO, "scripts", "prepare_demo_data.sh"), work], check=True)
    pairs = os.path.join(work, "minimal_pairs.jsonl")
    if not os.path.isfile(pairs):
        subprocess.run([sys.executable, "-m", "tools.make_minimal_pairs", "--heldout", os.path.join(work, "nvidia"),
                        "--output", pairs, "--vocab_file", os.path.join(work, "nvidia", "vocab.txt")]
                       + MINIMAL_PAIRS_FLAGS, cwd=REPO, check=True)
    return pairs


def minimal_pairs(checkpoint, pairs, out):
    """Zero-shot minimal-pair accuracy of a run's final checkpoint (tools/eval_mlm.py):
    {"accuracy", "ci95", "pairs", "by_uid": {kind: accuracy}}."""
    results_dir = os.path.join(out, "eval_mlm")
    with open(os.path.join(out, "eval_mlm.log"), "w") as log:
        result = subprocess.run([sys.executable, "-m", "tools.eval_mlm", "--model", checkpoint, "--pairs", pairs,
                                 "--output_dir", results_dir], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise SystemExit(f"error: tools/eval_mlm.py failed on {checkpoint}; see {os.path.join(out, 'eval_mlm.log')}")
    with open(os.path.join(results_dir, "results.json")) as f:
        mp = json.load(f)["minimal_pairs"]
    return {"accuracy": round(mp["accuracy"], 5), "ci95": [round(x, 5) for x in mp["ci95"]], "pairs": mp["pairs"],
            "by_uid": {uid: round(e["accuracy"], 5) for uid, e in mp["by_uid"].items()}}


def train(recipe, seed, minutes, work, out):
    """One training run through the launcher (job name RECIPE_seedSEED); returns (command, wall
    seconds, load averages at the start and the end)."""
    spec = RECIPES[recipe]
    cmd = launch.train_cmd([
        "--cf", os.path.join(REPO, spec["cf"]), "--deepspeed",
        "--deepspeed_config", os.path.join(REPO, spec["ds"]), "--use_nvidia_dataset",
        "--data_path_prefix", work, "--validation_data_path_prefix", work, "--output_dir", out,
        "--max_seq_length", "128", "--print_steps", "50", "--seed", str(seed),
        "--max_train_hours", f"{minutes / 60:.6f}", "--validation_every_steps", str(spec["validation_every_steps"]),
        "--job_name", f"{recipe}_seed{seed}"] + spec["flags"])
    logger.info("%s, seed %d, %.1f min: %s", recipe, seed, minutes, shlex.join(cmd))
    os.makedirs(out, exist_ok=True)
    # the launcher sets the process group; the threads are the caller's (not the tests' one thread)
    env = {k: v for k, v in launch.launch_env().items() if k != "OMP_NUM_THREADS"}
    if "OMP_NUM_THREADS" in os.environ:
        env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
    load_start = load_average()
    started = time.time()
    with open(os.path.join(out, "train.log"), "w") as log:
        result = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    wall = time.time() - started
    if result.returncode != 0:
        raise SystemExit(f"error: {recipe} (seed {seed}) failed with exit code {result.returncode}; "
                         f"see {os.path.join(out, 'train.log')}")
    return shlex.join(cmd), wall, load_start, load_average()


def read_curve(run_dir):
    """[(step, training minutes, validation MLM accuracy)] of a run, and its median samples/s."""
    scalars, _ = read_run(run_dir)
    accuracy = dict(scalars.get("Validation/step/MLM_accuracy", []))
    minutes = dict(scalars.get("Validation/train_minutes", []))
    curve = [(step, round(minutes[step], 3), round(accuracy[step], 5)) for step in sorted(accuracy) if step in minutes]
    rates = sorted(v for _, v in scalars.get("Train/samples_per_s", []))
    return curve, (rates[len(rates) // 2] if rates else None)


def accuracy_at(curve, minute):
    """Accuracy at `minute` of training, linear between validation points (None past the end)."""
    points = [(0.0, 0.0)] + [(m, a) for _, m, a in curve]
    for (m0, a0), (m1, a1) in zip(points, points[1:]):
        if m0 <= minute <= m1:
            return a0 + (a1 - a0) * (minute - m0) / (m1 - m0) if m1 > m0 else a1
    return None


def minutes_to_reach(curve, target):
    """Training minutes at which the curve first reaches `target` (linear between points), or None."""
    points = [(0.0, 0.0)] + [(m, a) for _, m, a in curve]
    for (m0, a0), (m1, a1) in zip(points, points[1:]):
        if a1 >= target:
            return m0 + (m1 - m0) * (target - a0) / (a1 - a0) if a1 > a0 else m1
    return None


def summarize(records):
    """Markdown: accuracy at whole minutes per run, then time to the baseline's final accuracy."""
    last = max(max((m for _, m, _ in r["curve"]), default=0) for r in records)
    minutes = list(range(1, int(last) + 1))
    lines = ["| recipe | seed | load (1-min avg, start/end) | samples/s | "
             + " | ".join(f"{m} min" for m in minutes) + " | final (min) | minimal pairs, final [95%] |",
             "|---|---|---|---|" + "---|" * len(minutes) + "---|---|"]
    for r in records:
        cells = [accuracy_at(r["curve"], m) for m in minutes]
        final_min, final_acc = (r["curve"][-1][1], r["curve"][-1][2]) if r["curve"] else (0, 0)
        mp = r.get("minimal_pairs")
        pairs = f"{100 * mp['accuracy']:.1f}% [{100 * mp['ci95'][0]:.1f}, {100 * mp['ci95'][1]:.1f}]" if mp else ""
        lines.append(f"| {r['recipe']} | {r['seed']} | {r['loadavg_start'][0]:.2f} / {r['loadavg_end'][0]:.2f} | "
                     f"{r['samples_per_s'] or 0:.1f} | "
                     + " | ".join("" if c is None else f"{100 * c:.1f}%" for c in cells)
                     + f" | {100 * final_acc:.1f}% ({final_min:.1f}) | {pairs} |")
    baseline = records[0]["recipe"]
    lines.append("")
    for seed in sorted({r["seed"] for r in records}):
        runs = [r for r in records if r["seed"] == seed]
        base = next((r for r in runs if r["recipe"] == baseline), None)
        if base is None or not base["curve"]:
            continue
        target, base_minutes = base["curve"][-1][2], base["curve"][-1][1]
        for r in runs[1:]:
            reached = minutes_to_reach(r["curve"], target)
            lines.append(f"seed {seed}: {r['recipe']} reaches {baseline}'s final {100 * target:.1f}% "
                         f"({base_minutes:.1f} min) "
                         + (f"after {reached:.2f} min: {base_minutes / reached:.2f}x the time to quality"
                            if reached else "not within its budget"))
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    work = os.path.abspath(args.work)
    pairs = ensure_data(work)
    records, run_dirs = [], []
    for seed in args.seeds:
        for i, recipe in enumerate(args.recipes):
            minutes = args.minutes * (args.baseline_factor if i == 0 and len(args.recipes) > 1 else 1.0)
            out = os.path.join(work, "quality", f"{recipe}_seed{seed}")
            shutil.rmtree(out, ignore_errors=True)
            command, wall, load_start, load_end = train(recipe, seed, minutes, work, out)
            run_dir = os.path.join(out, "runs", f"{recipe}_seed{seed}")
            curve, rate = read_curve(run_dir)
            checkpoint = os.path.join(out, "saved_models", f"{recipe}_seed{seed}")
            run_dirs.append(run_dir)
            records.append({
                "bench": "quality", "date": datetime.datetime.now().isoformat(timespec="seconds"),
                "machine": machine_description(), "recipe": recipe, "seed": seed, "budget_minutes": minutes,
                "command": command, "wall_s": round(wall, 1), "loadavg_start": load_start, "loadavg_end": load_end,
                "samples_per_s": rate, "curve": curve, "minimal_pairs": minimal_pairs(checkpoint, pairs, out)})
            logger.info("%s seed %d: %s", recipe, seed, curve[-1] if curve else "no validation point")
    append_json_lines(args.output, records)
    print(summarize(records))
    if args.plot:
        plot_runs(run_dirs, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

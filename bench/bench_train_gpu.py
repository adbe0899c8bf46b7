"""The trainer itself on a GPU: BERT-large through `deepspeed deepspeed_train.py`, side by side with
bench_model.py's pure model step in the same job, so the trainer's overhead is a ratio.

One prepared job (bench/bench_train_gpu.sh runs it on a lent GPU machine, under 10 minutes):
1. data: the demo corpus (built offline from text that ships with Python) -> a WordPiece vocab
   -> NVIDIA hdf5 shards at seq 128 and 512 (tools.prepare_data; nothing is downloaded);
2. runs, most important first, each time-boxed, skipped when the job's deadline is near:
   bf16 + fused AdamW at seq 128 with the original's per-GPU micro batch (64) and a larger one,
   bf16 + fused AdamW at seq 512, fp16 + FusedLamb (the original's recipe) and bf16 + Lamb at
   seq 128; each a few hundred optimizer steps, reading back what the run logs itself
   (Train/samples_per_s, Train/MFU, Train/data_wait_fraction, Train/peak_memory_GiB: the
   steady windows after the first);
3. the pure model step (bench/bench_model.py, the same sizes, batch and precision) for each
   bf16 AdamW run: trainer samples/s / pure samples/s;
4. the transformer-kernel probe (turing.kernel_probe: one DeepSpeed fused layer in a child).
Everything goes to OUT: one JSON line per measurement (train_gpu.jsonl), each run's log, and a
summary table on stdout.

    python bench/bench_train_gpu.py --out OUT [--minutes 9]
    python bench/bench_train_gpu.py --out OUT --tiny        # the same pipeline on the CPU, tiny model
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import append_json_lines, load_average, machine_description  # noqa: E402
from testkit import launcher as launch  # noqa: E402
from turing.tb_events import read_run  # noqa: E402

LARGE = os.path.join(REPO, "configs", "bert_large.json")
TINY = os.path.join(REPO, "configs", "tiny", "bert_config.json")

# name, seq, micro batch, precision, optimizer, steps (GPU); the order is the priority
RUNS = [
    ("bf16_adamw_b64", 128, 64, "bf16", "AdamW", 300),
    ("bf16_adamw_b256", 128, 256, "bf16", "AdamW", 120),
    ("bf16_adamw_seq512_b32", 512, 32, "bf16", "AdamW", 100),
    ("fp16_fusedlamb_b64", 128, 64, "fp16", "Lamb", 300),
    ("bf16_lamb_b64", 128, 64, "bf16", "Lamb", 300),
]
TINY_RUNS = [("fp32_adamw_tiny", 128, 8, "fp32", "AdamW", 40)]  # bf16 matmuls crawl on a CPU


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for the data, the runs, their logs and train_gpu.jsonl")
    p.add_argument("--minutes", type=float, default=9.0, help="the job's deadline, from its start")
    p.add_argument("--tiny", action="store_true", help="the tiny model on the CPU (a check of the pipeline)")
    p.add_argument("--runs", nargs="*", default=None, help="names of RUNS to do (default: all, in order)")
    return p.parse_args(argv)


def sh(cmd, log, timeout, env=None):
    """Run `cmd` with output to `log`; returns (exit code or None on timeout, seconds)."""
    started = time.time()
    with open(log, "w") as f:
        try:
            code = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                  env=env).returncode
        except subprocess.TimeoutExpired:
            code = None
    return code, time.time() - started


def make_data(out, tiny):
    """The demo corpus, a vocab and NVIDIA shards at seq 128 and 512 under OUT/data."""
    data = os.path.join(out, "data")
    corpus = os.path.join(data, "corpus.txt")
    if not os.path.isfile(corpus):
        os.makedirs(data, exist_ok=True)
        subprocess.run([sys.executable, "-m", "tools.make_demo_corpus", "--output", corpus], cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL)
    for seq, pred in ((128, 20), (512, 80)):
        folder = os.path.join(data, f"nvidia{seq}")
        if os.path.isdir(os.path.join(folder, "train")):
            continue
        vocab = ["--build_vocab", "8000" if tiny else "30000"] if seq == 128 else \
            ["--vocab_file", os.path.join(data, "nvidia128", "vocab.txt")]
        subprocess.run([sys.executable, "-m", "tools.prepare_data", "--input", corpus, "--output_dir", folder,
                        "--format", "nvidia", *vocab, "--max_seq_length", str(seq), "--max_predictions_per_seq",
                        str(pred), "--num_shards", "1", "--workers", str(min(8, os.cpu_count() or 1))],
                       cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return data


def job_config(out, data, tiny):
    """BERT-large (or the tiny model) on the generated shards; epochs enough for --max_steps."""
    with open(TINY if tiny else LARGE) as f:
        base = json.load(f)
    training = {"num_epochs": 1000, "warmup_proportion": 0.01, "learning_rate": 1e-4, "num_workers": 2,
                "async_worker": True, "decay_rate": 0.99, "decay_step": 1000, "total_training_steps": 100000}
    config = {"name": "bench", "bert_token_file": os.path.join(data, "nvidia128", "vocab.txt"),
              "bert_model_config": base["bert_model_config"],
              "data": {"mixed_seq_datasets": {"128": {"pretrain_dataset": "nvidia128/train"},
                                              "512": {"pretrain_dataset": "nvidia512/train"}}},
              "mixed_seq_training": {"128": training, "512": training}}
    path = os.path.join(out, "job_config.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return path, config["bert_model_config"]


def ds_config(out, name, micro, precision, optimizer):
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1, "steps_per_print": 10 ** 6,
              "gradient_clipping": 1.0,
              "optimizer": {"type": optimizer, "params": {"lr": 1e-4, "weight_decay": 0.01}}}
    if precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    elif precision == "bf16":
        config["bf16"] = {"enabled": True}
    path = os.path.join(out, f"ds_{name}.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return path


def steady(points):
    """The median of the windows after the first (its start-up is not the trainer's pace)."""
    values = [v for _, v in points][1:] or [v for _, v in points]
    return statistics.median(values) if values else None


def train_run(args, run, data, job, timeout):
    name, seq, micro, precision, optimizer, steps = run
    out = os.path.join(args.out, name)
    ds = ds_config(args.out, name, micro, precision, optimizer)
    cmd = launch.train_cmd(["--cf", job, "--deepspeed", "--deepspeed_config", ds, "--use_nvidia_dataset",
                            "--data_path_prefix", data, "--output_dir", out, "--max_seq_length", seq,
                            "--max_predictions_per_seq", 20 if seq == 128 else 80, "--max_steps", steps,
                            "--print_steps", 20, "--checkpoint_every_steps", 0, "--ckpt_to_save", 10 ** 6,
                            "--job_name", name])
    env = {k: v for k, v in launch.launch_env().items() if k != "OMP_NUM_THREADS"}
    code, seconds = sh(cmd, os.path.join(args.out, f"{name}.log"), timeout, env)
    scalars = read_run(os.path.join(out, "runs", name))[0] if os.path.isdir(os.path.join(out, "runs", name)) else {}
    return {"run": name, "seq": seq, "micro_batch": micro, "precision": precision, "optimizer": optimizer,
            "steps": steps, "exit_code": code, "wall_s": round(seconds, 1),
            "samples_per_s": steady(scalars.get("Train/samples_per_s", [])),
            "mfu": steady(scalars.get("Train/MFU", [])),
            "data_wait_fraction": steady(scalars.get("Train/data_wait_fraction", [])),
            "peak_memory_gib": max((v for _, v in scalars.get("Train/peak_memory_GiB", [])), default=None),
            "peak_tflops_per_device": next((v for _, v in scalars.get("Train/peak_TFLOPs_per_device", [])), None)}


def model_step(args, run, model_config, timeout):
    """bench_model.py's pure step (ours only) at the run's sizes, batch and precision."""
    name, seq, micro, precision, _, _ = run
    c = model_config
    size = ["--layers", c["num_hidden_layers"], "--hidden", c["hidden_size"], "--heads", c["num_attention_heads"],
            "--intermediate", c["intermediate_size"]]
    device = "cpu" if args.tiny else "cuda"
    jsonl = os.path.join(args.out, f"model_{name}.jsonl")
    cmd = [sys.executable, "bench/bench_model.py", "--device", device, "--dtype", precision, "--seq", seq,
           "--batch", micro, "--models", "ours", "--memory", "off", "--rounds", 3, "--steps", 5,
           "--output", jsonl, *size]
    code, seconds = sh([str(a) for a in cmd], os.path.join(args.out, f"model_{name}.log"), timeout)
    rows = [json.loads(line) for line in open(jsonl)] if os.path.isfile(jsonl) else []
    rates = [r.get("samples_per_s") for r in rows if r.get("samples_per_s")]
    return {"run": f"model_{name}", "exit_code": code, "wall_s": round(seconds, 1),
            "samples_per_s": statistics.median(rates) if rates else None, "rows": rows}


def kernel_probe(args, model_config, timeout):
    settings = dict(batch_size=64, hidden_size=model_config["hidden_size"],
                    intermediate_size=model_config["intermediate_size"], heads=model_config["num_attention_heads"],
                    attn_dropout_ratio=0.1, hidden_dropout_ratio=0.1, num_hidden_layers=1, initializer_range=0.02,
                    layer_norm_eps=1e-12, local_rank=0, seed=42, fp16=True, pre_layer_norm=True)
    code, seconds = sh([sys.executable, "-X", "faulthandler", "-m", "turing.kernel_probe", json.dumps(settings)],
                       os.path.join(args.out, "kernel_probe.log"), timeout)
    return {"run": "transformer_kernel_probe", "exit_code": code, "wall_s": round(seconds, 1),
            "ok": code == 0}


def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    deadline = started + args.minutes * 60
    os.makedirs(args.out, exist_ok=True)
    common = {"bench": "train_gpu", "date": time.strftime("%Y-%m-%dT%H:%M"), "machine": machine_description(),
              "load_average": load_average()}
    data = make_data(args.out, args.tiny)
    job, model_config = job_config(args.out, data, args.tiny)
    runs = TINY_RUNS if args.tiny else [r for r in RUNS if args.runs is None or r[0] in args.runs]
    records = []
    for run in runs:
        left = deadline - time.time()
        if left < 60:
            records.append({"run": run[0], "skipped": f"{left:.0f} s left of the job's {args.minutes:g} min"})
            continue
        # a GPU run is cut at 4 minutes to leave the job's budget for the others; --tiny only has its deadline
        record = train_run(args, run, data, job, timeout=left - 30 if args.tiny else min(240, left - 30))
        if run[4] == "AdamW" and time.time() < deadline - 45:  # the trainer against the pure step
            pure = model_step(args, run, model_config, timeout=deadline - time.time() - 15 if args.tiny else
                              min(120, deadline - time.time() - 15))
            record["pure_step_samples_per_s"] = pure["samples_per_s"]
            if record["samples_per_s"] and pure["samples_per_s"]:
                record["trainer_over_pure_step"] = round(record["samples_per_s"] / pure["samples_per_s"], 3)
        records.append(record)
        print(json.dumps(record), flush=True)
    if not args.tiny:
        left = deadline - time.time()
        records.append(kernel_probe(args, model_config, timeout=max(30, left - 10)) if left > 40 else
                       {"run": "transformer_kernel_probe", "skipped": f"{left:.0f} s left"})
    for record in records:
        record.update(common)
    append_json_lines(os.path.join(args.out, "train_gpu.jsonl"), records)
    print(f"{'run':24} {'exit':>4} {'samples/s':>10} {'MFU':>7} {'wait':>6} {'GiB':>6} {'pure/s':>9} {'ratio':>6}")
    for r in records:
        if "skipped" in r:
            print(f"{r['run']:24} skipped: {r['skipped']}")
            continue
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        print(f"{r['run']:24} {fmt(r.get('exit_code'), '>4')} {fmt(r.get('samples_per_s'), '>10.1f')} "
              f"{fmt(r.get('mfu') and 100 * r['mfu'], '>6.1f')}% {fmt(r.get('data_wait_fraction') and 100 * r['data_wait_fraction'], '>5.1f')}% "
              f"{fmt(r.get('peak_memory_gib'), '>6.1f')} {fmt(r.get('pure_step_samples_per_s'), '>9.1f')} "
              f"{fmt(r.get('trainer_over_pure_step'), '>6.3f')}")
    print(f"job: {time.time() - started:.0f} s; {os.path.join(args.out, 'train_gpu.jsonl')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fine-tuning side by side: tools/finetune_glue.py against what users run instead, transformers'
`AutoModelForSequenceClassification` + `Trainer` (as its run_glue.py example does), on the same
checkpoint, files, seeds, epochs, learning rate, batch and schedule.

Everything is made here, offline, in --work (the stock model is bench_continued.py's, made once):
- the checkpoint: a `BertForMaskedLM` (--layers/--hidden/..., the demo's WordPiece vocab) pretrained
  --pretrain_steps on the demo's shards by our trainer (the bert_postln block) and exported with
  tools/export_hf.py: a stock folder both stacks load as the very same weights (neither has a
  pooler or a classification head in it: each builds them fresh, from its seed);
- the tasks, in GLUE's layout: the probe suite of tools/make_probe_tasks.py with --heldout (dev from
  the documents prepare_data held out of the pretraining shards, train from the training ones), and
  `acceptability`: minimal pairs (tools/make_minimal_pairs.py's four corruptions: swap, shuffle,
  repeat, replace) as a single-sentence task in CoLA's layout and metric (MCC): the sentence as
  written is 1, its corrupted copy 0, one pair per sentence (labels balanced); train from the
  pretraining documents, dev from the held-out ones (no dev sentence in a training document);
  `source`: is a sentence from a licence text of the system (bench_continued.py's domain) or from
  the general corpus (the demo's: Python's documentation), in SST-2's layout; train from the
  pretraining documents and three quarters of the licences, dev from the held-out documents and
  the other licences. The probes and acceptability need word order or discourse, which a small
  briefly pretrained model does not learn from 1,500 examples (README.md, fine-tuning: at chance
  whatever the model); source is the one a bag of words learns, so that the two stacks are
  compared on a task where fine-tuning does something.

Per task, both at the same time, --threads each (OMP_WAIT_POLICY=PASSIVE; both see the same load):
- ours: `python -m tools.finetune_glue --model STOCK --task T --seeds N --epochs E --lr LR
  --batch_size B --max_seq_length L` (seeds 0..N-1);
- theirs: a child of this script: per seed, `transformers.set_seed(seed)`,
  `AutoModelForSequenceClassification.from_pretrained(STOCK)`, `Trainer` with TrainingArguments of
  finetune_glue's numbers, read from it (tools/finetune_glue.py's `make_optimizer` and constants):
  AdamW betas/eps/weight decay (biases and LayerNorms undecayed in both), the same warmup steps
  and linear decay to 0, clipping, epochs, batch, seed; the same TSV files (read by
  turing.glue.read_examples), tokenized by the stock folder's own `AutoTokenizer` (pair truncation
  longest_first; the bench counts the examples whose ids equal ours), padded per batch
  (`DataCollatorWithPadding`, the Trainer's default), dropout from the config (0.1) in both;
  scored by `trainer.predict` on the dev file with turing.glue's metrics. What is not matched: the
  Trainer's linear warmup starts at LR 0 (ours at peak/warmup), so in warmup its LR is one step
  behind; its AdamW is torch's fused one (its default), ours torch's default; a pair cut to an odd
  budget gives the spare token to the first segment in ours (the original's _truncate_seq_pair), to
  the second in theirs; each draws its own pooler and head initialisation and batch order from its
  seed (the same seed numbers, not the same draws).

Reported per task: the dev metric of every seed, their mean and min-max, the reported run's (the
lower median, finetune_glue's `score`) 95% percentile bootstrap interval over the dev examples
(--bootstrap resamples), and a paired bootstrap of the two reported runs' difference; training
samples/s of each (the steps after each seed's first, from each step's end time: ours from
finetune_glue's TensorBoard losses, theirs from a TrainerCallback), over the whole runs and over the
steps while both were training, and the ratio ours/theirs.

Prints a table and the JSON line it appends to --output.

    python bench/bench_finetune.py     # 12 minutes on 2 cores, 3 of them the stock model's (made once)
    python bench/bench_finetune.py --tiny --work /tmp/ft_tiny --general GENERAL   # the pipeline in seconds
    (GENERAL: any small tools/prepare_data.py output with --validation_fraction; tests/test_benches.py makes one)
"""
import argparse
import glob
import json
import logging
import math
import os
import random
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.bench_continued import (child_env, domain_documents, finish, fresh, general_data, run,  # noqa: E402
                                   stock_model, write_json)
from bench.common import append_json_lines, load_average, machine_description  # noqa: E402

logger = logging.getLogger("bench_finetune")
ACCEPTABILITY = "acceptability"  # the minimal-pairs task, in CoLA's layout (--task cola)
SOURCE = "source"                 # licence text or the general corpus, in SST-2's layout (--task sst2)
TASK_OF = {ACCEPTABILITY: "cola", SOURCE: "sst2"}
PROBES = ("probe_swap", "probe_samedoc", "probe_order")
LICENCE_MB = 1.5                  # licence text read for the source task (bench_continued's --domain_mb)
MIN_WORDS, MAX_WORDS = 6, 20      # sentence lengths of acceptability and source (make_minimal_pairs' defaults)
PAIRS_PER_KIND = 100              # bench_continued's minimal pairs, made with the demo data (its cache)
TINY = {"seeds": 1, "epochs": 1, "tasks": "probe_swap", "train_size": 48, "dev_size": 24, "pretrain_steps": 0,
        "layers": 1, "hidden": 32, "heads": 2, "intermediate": 64, "max_seq_length": 64,
        "batch_size": 16, "bootstrap": 50}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = p.add_argument
    add("--work", default=os.path.join(REPO, "demo_run"), help="the demo data and stock model (made when missing, "
                                                               "shared with bench_continued.py); the rest under "
                                                               "WORK/finetune/")
    add("--general", default=None, help="a tools/prepare_data.py output to pretrain on and take the tasks' text "
                                         "from (vocab.txt, train/, its held-out documents); default WORK/nvidia")
    add("--tasks", default=",".join((*PROBES, ACCEPTABILITY, SOURCE)),
        help="comma-separated, of " + ", ".join((*PROBES, ACCEPTABILITY, SOURCE)))
    add("--seeds", type=int, default=3)
    add("--epochs", type=int, default=3)
    add("--lr", type=float, default=3e-4, help="peak LR of both (a small model needs more than BERT-base's 4e-5)")
    add("--batch_size", type=int, default=32)
    add("--max_seq_length", type=int, default=128)
    add("--train_size", type=int, default=1500, help="training examples of each task (at most)")
    add("--dev_size", type=int, default=500, help="dev examples of each task (at most: the held-out documents "
                                                  "may hold fewer)")
    add("--pretrain_steps", type=int, default=600, help="our trainer's pretraining of the stock model (0: its "
                                                        "random weights)")
    add("--pretrain_lr", type=float, default=1e-3)
    add("--pretrain_batch", type=int, default=32)
    add("--layers", type=int, default=2)
    add("--hidden", type=int, default=128)
    add("--heads", type=int, default=2)
    add("--intermediate", type=int, default=512)
    add("--threads", type=int, default=1, help="intra-op threads of each stack (the two run side by side)")
    add("--bootstrap", type=int, default=1000, help="bootstrap resamples of the dev examples")
    add("--seed", type=int, default=42, help="the stock model's initialisation")
    add("--tiny", action="store_true", help="the pipeline at a tiny size (the smoke test's): " +
        ", ".join(f"--{k} {v}" for k, v in TINY.items()))
    add("--output", default=os.path.join(REPO, "bench", "results", "finetune.jsonl"))
    add("--hf_worker", metavar="SETTINGS", help=argparse.SUPPRESS)   # theirs, in a child
    return p


def parse_args(argv=None):
    args = build_parser().parse_args(argv)
    if args.tiny:
        for key, value in TINY.items():
            setattr(args, key, value)
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    return args


# ---------------------------------------------------------------------------------------------
# The tasks


def probe_tasks(general, folder, args, env):
    """The probe suite (tools/make_probe_tasks.py --heldout GENERAL) in `folder`."""
    run([sys.executable, "-m", "tools.make_probe_tasks", "--heldout", general, "--output_dir", folder,
         "--train_size", args.train_size, "--dev_size", args.dev_size, "--seed", 0], env,
        os.path.join(os.path.dirname(folder), "make_probe_tasks.log"))


def acceptability_task(split, vocab, folder, train_size, dev_size, seed=0):
    """Minimal pairs (tools/make_minimal_pairs.py's corruptions and word frequencies, the stock
    vocab's token counts kept) as a CoLA-layout task (`source<TAB>label<TAB>*-or-empty<TAB>sentence`,
    no header): train from the training documents of GENERAL, dev from the documents it held out
    (as make_minimal_pairs makes its pairs; no dev sentence in a training document); one pair per
    sentence (its kind drawn, seeded), so the labels are balanced."""
    from tools.make_minimal_pairs import KINDS, Context, make_pairs
    from turing.tokenization import load_tokenizer

    context = Context(split.train, load_tokenizer(vocab), seed)
    seen = {s for doc in split.train for s in doc}
    made = {"train": make_pairs(split.train, range(len(split.train)), context, KINDS, train_size // 2, seed,
                                MIN_WORDS, MAX_WORDS),
            "dev": make_pairs(split.heldout, split.numbers, context, KINDS, dev_size // 2, seed, MIN_WORDS, MAX_WORDS,
                              seen)}
    os.makedirs(folder, exist_ok=True)
    counts = {}
    for name, size in (("train", train_size), ("dev", dev_size)):
        rng = random.Random(f"{seed}/{name}")
        records = made[name]
        rng.shuffle(records)
        first = {}
        for r in records:
            first.setdefault(r["sentence_good"], r)
        rows = [(f"pairs_{r['UID']}", label, "" if label else "*", r[key]) for r in list(first.values())[:size // 2]
                for key, label in (("sentence_good", 1), ("sentence_bad", 0))]
        rng.shuffle(rows)
        with open(os.path.join(folder, f"{name}.tsv"), "w", encoding="utf-8") as f:
                f.writelines("\t".join(map(str, row)) + "\n" for row in rows)
        counts[name] = len(rows)
    if min(counts.values()) < 2:
        raise SystemExit(f"error: {counts} {ACCEPTABILITY} examples: a bigger corpus is needed")


def source_task(split, licences, folder, train_size, dev_size, seed=0):
    """Where a sentence comes from, in SST-2's layout (`sentence<TAB>label`): 1 = a licence text of
    the system (bench_continued's domain: `licences`, a document a line), 0 = the general corpus
    (the demo's: Python's documentation). Train from the general set's training documents and a
    seeded three quarters of the licence documents, dev from its held-out documents and the other
    licences; sentences of MIN_WORDS to MAX_WORDS words, each once, none of dev in train; as many
    of each label (at most half of the size each)."""
    from tools.prep.sentences import SentenceSplitter

    splitter = SentenceSplitter()
    docs = [splitter(line) for line in open(licences, encoding="utf-8") if line.strip()]
    random.Random(f"{seed}/licences").shuffle(docs)
    cut = max(1, round(len(docs) / 4))
    sides = {"train": (split.train, docs[cut:]), "dev": (split.heldout, docs[:cut])}
    seen, counts = set(), {}
    os.makedirs(folder, exist_ok=True)
    for name, size in (("train", train_size), ("dev", dev_size)):
        picked = []
        for side in sides[name]:
            sentences = list(dict.fromkeys(s for doc in side for s in doc
                                           if MIN_WORDS <= len(s.split()) <= MAX_WORDS and s not in seen))
            random.Random(f"{seed}/{name}/{len(picked)}").shuffle(sentences)
            picked.append(sentences)
        n = min(size // 2, *map(len, picked))
        rows = [(sentence.replace("\t", " "), label) for label, sentences in ((0, picked[0]), (1, picked[1]))
                for sentence in sentences[:n]]
        random.Random(f"{seed}/{name}").shuffle(rows)
        seen.update(sentence for sentences in picked for sentence in sentences)   # none of train in dev
        with open(os.path.join(folder, f"{name}.tsv"), "w", encoding="utf-8") as f:
            f.write("sentence\tlabel\n" + "".join(f"{sentence}\t{label}\n" for sentence, label in rows))
        counts[name] = len(rows)
    if min(counts.values()) < 2:
        raise SystemExit(f"error: {counts} {SOURCE} examples: a bigger corpus is needed")


def same_tokens(model, task_name, folder, max_seq_length):
    """How many of the task's examples the stock folder's AutoTokenizer encodes to the very ids
    (and segments) finetune_glue's encoder gives: {"examples": n, "identical": k}."""
    import transformers
    from turing.glue import encode, find_task, read_examples
    from turing.pretrained import open_trained

    ours = open_trained(model).require_tokenizer()
    theirs = transformers.AutoTokenizer.from_pretrained(model)
    task = find_task(task_name)
    n = identical = 0
    for name in ("train.tsv", *task.dev_files):
        examples = read_examples(os.path.join(folder, name), task)
        enc = hf_encode(theirs, examples, max_seq_length)
        for i, (ids, segments) in enumerate(encode(ours, examples, max_seq_length)):
            n += 1
            identical += ids == enc["input_ids"][i] and segments == enc["token_type_ids"][i]
    return {"examples": n, "identical": identical}


def hf_encode(tokenizer, examples, max_seq_length):
    pairs = examples[0].text_b is not None
    return tokenizer([e.text_a for e in examples], [e.text_b for e in examples] if pairs else None,
                     truncation=True, max_length=max_seq_length)


# ---------------------------------------------------------------------------------------------
# Theirs: AutoModelForSequenceClassification + Trainer


def finetune_settings(lr, total_steps):
    """finetune_glue's optimizer and schedule numbers, read from its own make_optimizer (on a
    stand-in module with a decayed and an undecayed parameter) and constants."""
    import torch
    from tools import finetune_glue as ft

    probe = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    optimizer, scheduler = ft.make_optimizer(probe, lr, total_steps)
    betas, eps = optimizer.defaults["betas"], optimizer.defaults["eps"]
    decays = sorted({g["weight_decay"] for g in optimizer.param_groups})
    factor = scheduler.lr_lambdas[0]     # of the 0-based step: the warmup ends where it first reaches the peak
    warmup = next(step + 1 for step in range(total_steps) if factor(step) >= 1.0)
    return {"betas": list(betas), "eps": eps, "weight_decay": max(decays), "undecayed_group": min(decays) == 0.0,
            "warmup_steps": warmup, "max_grad_norm": ft.MAX_GRAD_NORM, "eval_batch_size": ft.EVAL_BATCH_SIZE}


def steps_per_epoch(examples, batch):
    return math.ceil(examples / batch)


def step_samples(step, examples, batch):
    """The examples of optimizer step `step` (1-based): the last of each epoch is the rest."""
    spe = steps_per_epoch(examples, batch)
    k = (step - 1) % spe
    return batch if k < spe - 1 else examples - batch * (spe - 1)


def hf_worker(settings_path):
    import numpy as np
    import torch
    import transformers
    from turing.glue import collapse, compute_metrics, find_task, read_examples, task_score
    from turing.outputs import content_sha256

    s = json.load(open(settings_path))
    torch.set_num_threads(s["threads"])
    task = find_task(s["task"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(s["model"])

    def load(name):
        examples = read_examples(os.path.join(s["data_dir"], name), task)
        enc = hf_encode(tokenizer, examples, s["max_seq_length"])
        return [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                 "attention_mask": enc["attention_mask"][i], "labels": e.label} for i, e in enumerate(examples)]

    dev_file = task.dev_files[0]
    train, dev = load("train.tsv"), load(dev_file)
    gold = [d["labels"] for d in dev]
    total = s["epochs"] * steps_per_epoch(len(train), s["batch_size"])
    o = finetune_settings(s["lr"], total)
    seeds = []
    for seed in range(s["seeds"]):
        steps, lrs = [], []

        class StepTimes(transformers.TrainerCallback):
            def on_step_begin(self, targs, state, control, lr_scheduler=None, **kwargs):
                lrs.append(lr_scheduler.get_last_lr()[0])   # the LR this step trains at

            def on_step_end(self, targs, state, control, **kwargs):
                steps.append((state.global_step, time.time()))

        transformers.set_seed(seed)   # before the model, as run_glue.py: the fresh pooler and head
        model = transformers.AutoModelForSequenceClassification.from_pretrained(s["model"], num_labels=task.num_labels)
        targs = transformers.TrainingArguments(
            output_dir=os.path.join(s["out"], f"seed{seed}"), num_train_epochs=s["epochs"],
            per_device_train_batch_size=s["batch_size"], per_device_eval_batch_size=o["eval_batch_size"],
            learning_rate=s["lr"], lr_scheduler_type="linear", warmup_steps=o["warmup_steps"],
            adam_beta1=o["betas"][0], adam_beta2=o["betas"][1], adam_epsilon=o["eps"], weight_decay=o["weight_decay"],
            max_grad_norm=o["max_grad_norm"], seed=seed, save_strategy="no", eval_strategy="no",
            logging_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=targs, train_dataset=train, processing_class=tokenizer,
                                       callbacks=[StepTimes()])
        trainer.train()
        logits = trainer.predict(dev).predictions
        predictions = logits.squeeze(-1) if task.labels is None else np.asarray(logits).argmax(-1)
        metrics = compute_metrics(task, predictions, gold)
        seeds.append({"seed": seed, "score": task_score(task, metrics), "metrics": metrics,
                      "collapsed": collapse(task, predictions, gold) is not None,
                      "predictions": [float(p) if task.labels is None else int(p) for p in predictions],
                      "steps": steps, "lr": lrs})
        logger.info("theirs %s seed %d: %s", task.name, seed, metrics)
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)   # inside accelerate's wrapper
    write_json(os.path.join(s["out"], "results.json"), {
        "seeds": seeds, "optimizer": type(optimizer).__name__,
        "optimizer_defaults": {k: v for k, v in optimizer.defaults.items() if k in ("fused", "foreach")},
        "decayed_groups": [g["weight_decay"] for g in optimizer.param_groups],
        "train_examples": len(train), "dev_examples": len(dev), "settings": o,
        "data_sha256": {name: content_sha256(os.path.join(s["data_dir"], name)) for name in ("train.tsv", dev_file)}})


# ---------------------------------------------------------------------------------------------
# Reading both back


def ours_steps(out, task_name, seed):
    """[(step, wall time, lr)] of our run of `seed` (finetune_glue's TensorBoard losses and LRs)."""
    from turing.tb_events import iter_events

    rows = {}
    for path in sorted(glob.glob(os.path.join(out, "runs", task_name, f"seed{seed}", "events.out.tfevents.*"))):
        for event in iter_events(path):
            for value in event.summary.value:
                if value.tag == "Train/loss":
                    rows.setdefault(event.step, [None, None])[0] = event.wall_time
                elif value.tag == "Train/lr":
                    rows.setdefault(event.step, [None, None])[1] = value.simple_value
    return [(step, *rows[step]) for step in sorted(rows)]


def samples_per_s(runs, examples, batch, window=(-math.inf, math.inf)):
    """Training samples/s over the seeds' runs ([[(step, time)]]): the steps after each seed's
    first inside `window`, over the time from that first step's end to the last's."""
    samples = seconds = 0.0
    for rows in runs:
        inside = [(step, t) for step, t in rows if window[0] <= t <= window[1]]
        if len(inside) > 1:
            samples += sum(step_samples(step, examples, batch) for step, _ in inside[1:])
            seconds += inside[-1][1] - inside[0][1]
    return samples / seconds if seconds else None


def bootstrap(task, gold, predictions, rounds, seed=0):
    """95% percentile bootstrap over the dev examples of each run's metric ({name: predictions})
    and of the first two runs' difference (paired: the same resampled examples)."""
    import numpy as np
    from turing.glue import compute_metrics, task_score

    gold = np.asarray(gold)
    preds = {k: np.asarray(v) for k, v in predictions.items()}
    rng = np.random.default_rng(seed)
    values = {k: [] for k in preds}
    diffs = []
    for _ in range(rounds):
        pick = rng.integers(0, len(gold), len(gold))
        scores = [task_score(task, compute_metrics(task, p[pick], gold[pick])) for p in preds.values()]
        for k, v in zip(preds, scores):
            values[k].append(v)
        diffs.append(scores[0] - scores[1])

    def ci(v):
        return [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))]
    return {k: ci(v) for k, v in values.items()}, ci(diffs)


def summary(scores):
    return {"scores": scores, "mean": sum(scores) / len(scores), "min": min(scores), "max": max(scores)}


def run_task(args, name, folder, stock, base, env):
    """Both stacks on one task, side by side; returns the task's record."""
    import numpy as np
    from turing.glue import find_task, read_examples

    task = find_task(TASK_OF.get(name, name))
    ours_out, hf_out = fresh(os.path.join(base, name, "ours")), fresh(os.path.join(base, name, "hf"))
    ours_cmd = [sys.executable, "-m", "tools.finetune_glue", "--model", stock, "--task", task.name, "--data_dir",
                folder, "--output_dir", ours_out, "--seeds", args.seeds, "--epochs", args.epochs, "--lr", args.lr,
                "--batch_size", args.batch_size, "--max_seq_length", args.max_seq_length, "--log_level", "warning"]
    settings = write_json(os.path.join(hf_out, "settings.json"), {
        "model": stock, "task": task.name, "data_dir": folder, "out": hf_out, "seeds": args.seeds,
        "epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size, "max_seq_length": args.max_seq_length,
        "threads": args.threads})
    logger.info("%s: ours and the Trainer side by side (%d seed(s), %d epoch(s), %d thread(s) each)", name,
                args.seeds, args.epochs, args.threads)
    started = time.time()
    ours_log, hf_log = os.path.join(base, name, "ours.log"), os.path.join(base, name, "hf.log")
    hf_cmd = [sys.executable, os.path.abspath(__file__), "--hf_worker", settings]
    procs = {who: (subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=env, stdout=open(log, "w"),
                                    stderr=subprocess.STDOUT), log)
             for who, cmd, log in (("ours", ours_cmd, ours_log), ("hf", hf_cmd, hf_log))}
    wall = {}
    while len(wall) < len(procs):   # each process's wall time, start-up and scoring included
        for who, (proc, log) in procs.items():
            if who not in wall and proc.poll() is not None:
                finish(proc, {"ours": "finetune_glue", "hf": "Trainer"}[who], log)
                wall[who] = round(time.time() - started, 1)
        time.sleep(0.2)

    ours = json.load(open(os.path.join(ours_out, "results.json")))
    theirs = json.load(open(os.path.join(hf_out, "results.json")))
    n_train, batch = ours["train_examples"], args.batch_size
    expected = list(range(1, args.epochs * steps_per_epoch(n_train, batch) + 1))
    ours_rows = [ours_steps(ours_out, task.name, seed) for seed in ours["seeds"]]
    hf_rows = [[tuple(r) for r in s["steps"]] for s in theirs["seeds"]]
    for who, rows in (("ours", ours_rows), ("Trainer", hf_rows)):
        if [[r[0] for r in seed_rows] for seed_rows in rows] != [expected] * args.seeds:
            raise SystemExit(f"error: the {who} runs of {name} logged other steps than 1..{expected[-1]} per seed")
    ours_times = [[(step, t) for step, t, _ in rows] for rows in ours_rows]
    lo = max(min(r[0][1] for r in ours_times), min(r[0][1] for r in hf_rows))
    hi = min(max(r[-1][1] for r in ours_times), max(r[-1][1] for r in hf_rows))
    speed = {"ours": samples_per_s(ours_times, n_train, batch), "hf": samples_per_s(hf_rows, n_train, batch)}
    both = {"ours": samples_per_s(ours_times, n_train, batch, (lo, hi)),
            "hf": samples_per_s(hf_rows, n_train, batch, (lo, hi))}
    for d in (speed, both):
        d["ours_over_hf"] = d["ours"] / d["hf"] if d["ours"] and d["hf"] else None
    # the LR each step trained at, ours (TensorBoard, float32) against theirs: the last step they differ
    gaps = [(step, abs(lr - theirs_lr)) for rows, s in zip(ours_rows, theirs["seeds"])
            for (step, _, lr), theirs_lr in zip(rows, s["lr"])]
    last_differing = max((step for step, gap in gaps if gap > 1e-6 * args.lr), default=0)

    dev_file = task.dev_files[0]
    gold = [e.label for e in read_examples(os.path.join(folder, dev_file), task)]
    with open(os.path.join(ours_out, "dev_predictions.tsv"), encoding="utf-8") as f:
        ours_pred = [task.labels.index(line.rstrip("\n").split("\t")[1]) if task.labels else
                     float(line.split("\t")[1]) for line in f.readlines()[1:]]
    hf_scores = [s["score"] for s in theirs["seeds"]]
    hf_median = sorted(theirs["seeds"], key=lambda s: s["score"])[(len(hf_scores) - 1) // 2]
    intervals, diff = bootstrap(task, gold, {"ours": ours_pred, "hf": hf_median["predictions"]}, args.bootstrap)
    accuracy = {who: float(np.mean(np.asarray(p) == np.asarray(gold))) if task.labels else None
                for who, p in (("ours", ours_pred), ("hf", hf_median["predictions"]))}
    ours_files = ours["run"]["data_sha256"]
    return {
        "task": name, "glue_task": task.name, "metric": task.metric_name, "train_examples": n_train,
        "dev_examples": len(gold), "majority_baseline": ours["majority_baseline"],
        "steps_per_seed": expected[-1], "same_files": ours_files == theirs["data_sha256"],
        "data_sha256": ours_files, "seeds": {"ours": ours["seeds"], "hf": [s["seed"] for s in theirs["seeds"]]},
        "score": {"ours": {**summary(ours["scores"]), "reported_seed": ours["median_seed"],
                           "reported": ours["score"], "interval": intervals["ours"], "accuracy": accuracy["ours"],
                           "collapsed": ours["collapsed"]},
                  "hf": {**summary(hf_scores), "reported_seed": hf_median["seed"], "reported": hf_median["score"],
                         "interval": intervals["hf"], "accuracy": accuracy["hf"],
                         "collapsed": [s["collapsed"] for s in theirs["seeds"]]},
                  "reported_difference_interval": diff},
        "samples_per_s": speed, "samples_per_s_while_both_ran": both, "process_seconds": wall,
        "lr_schedule": {"max_abs_difference": max(gap for _, gap in gaps),
                        "equal_from_step": last_differing + 1 if last_differing < expected[-1] else None},
        "hf_optimizer": {k: theirs[k] for k in ("optimizer", "optimizer_defaults", "decayed_groups")},
        "settings_from_finetune_glue": theirs["settings"],
    }


def main(argv=None):
    args = parse_args(argv)
    if args.hf_worker:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        return hf_worker(args.hf_worker)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    import transformers

    unknown = [t for t in args.tasks if t not in (*PROBES, ACCEPTABILITY, SOURCE)]
    if unknown or not args.tasks:
        raise SystemExit(f"error: --tasks: unknown {', '.join(unknown) or '(none given)'}")
    started, load_start = time.time(), load_average()
    work = os.path.abspath(args.work)
    os.makedirs(os.path.join(work, "continued"), exist_ok=True)   # bench_continued's helpers write there
    env = child_env(args.threads)
    general = args.general and os.path.abspath(args.general)
    if general is None:   # the demo data (made when missing)
        general, _ = general_data(work, general, PAIRS_PER_KIND, env)
    stock_args = argparse.Namespace(layers=args.layers, hidden=args.hidden, heads=args.heads,
                                    intermediate=args.intermediate, pretrain_steps=args.pretrain_steps,
                                    pretrain_lr=args.pretrain_lr, batch=args.pretrain_batch, seed=args.seed)
    t0 = time.time()
    stock = stock_model(stock_args, work, general, child_env(2))   # alone on the machine's cores
    stock_seconds = round(time.time() - t0, 1)
    base = os.path.join(work, "finetune")
    tasks_dir = fresh(os.path.join(base, "tasks"))
    folders = {}
    if any(t in PROBES for t in args.tasks):
        probe_tasks(general, os.path.join(tasks_dir, "probe"), args, env)
        folders.update({t: os.path.join(tasks_dir, "probe", t) for t in args.tasks if t in PROBES})
    if ACCEPTABILITY in args.tasks or SOURCE in args.tasks:
        from tools.prep.filters import recorded_split

        split = recorded_split(general)
    if ACCEPTABILITY in args.tasks:
        folders[ACCEPTABILITY] = os.path.join(tasks_dir, ACCEPTABILITY)
        acceptability_task(split, os.path.join(general, "vocab.txt"), folders[ACCEPTABILITY], args.train_size,
                           args.dev_size)
    if SOURCE in args.tasks:
        folders[SOURCE] = os.path.join(tasks_dir, SOURCE)
        licences = os.path.join(tasks_dir, "licences.txt")
        domain_documents(licences, LICENCE_MB)
        source_task(split, licences, folders[SOURCE], args.train_size, args.dev_size)
    tokens = {t: same_tokens(stock, TASK_OF.get(t, t), folders[t], args.max_seq_length) for t in args.tasks}
    results = [run_task(args, t, folders[t], stock, os.path.join(base, "runs"), env) for t in args.tasks]
    for r in results:
        r["same_tokens"] = tokens[r["task"]]
    with open(os.path.join(stock, "config.json")) as f:
        config = json.load(f)
    record = {"bench": "finetune", "time": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_description(),
              "transformers": transformers.__version__,
              "settings": {k: v for k, v in vars(args).items() if k not in ("hf_worker", "output", "work")},
              "stock": stock, "stock_seconds": stock_seconds,
              "stock_config": {k: config.get(k) for k in ("architectures", "num_hidden_layers", "hidden_size",
                                                          "num_attention_heads", "intermediate_size", "vocab_size",
                                                          "hidden_dropout_prob", "attention_probs_dropout_prob")},
              "tasks": results, "loadavg_start": load_start, "loadavg_end": load_average(),
              "wall_minutes": round((time.time() - started) / 60, 1)}
    print("\n".join(report(record)))
    append_json_lines(args.output, [record])
    print(json.dumps(record))
    return 0


def report(r):
    def pct(x):
        return f"{100 * x:.1f}"

    lines = [f"stock model: {r['stock']} ({r['stock_config']['num_hidden_layers']} layers, "
             f"{r['stock_config']['hidden_size']} wide); {r['settings']['seeds']} seed(s), {r['settings']['epochs']} "
             f"epoch(s), LR {r['settings']['lr']:g}, batch {r['settings']['batch_size']}, "
             f"{r['settings']['threads']} thread(s) each; {r['wall_minutes']} minutes "
             f"(load {r['loadavg_start'] and r['loadavg_start'][0]} -> {r['loadavg_end'] and r['loadavg_end'][0]})",
             "(* a run whose dev predictions are all one class: finetune_glue's 'collapsed')",
             "| task (metric) | train / dev | majority | ours: seeds | ours mean [min, max] | ours reported run "
             "[95% bootstrap] | Trainer: seeds | Trainer mean [min, max] | Trainer reported run [95% bootstrap] | "
             "ours - Trainer, reported runs [95% paired] |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for t in r["tasks"]:
        cells = []
        for who in ("ours", "hf"):
            s = t["score"][who]
            lo, hi = s["interval"]
            cells += [" / ".join(pct(x) + "*" * c for x, c in zip(s["scores"], s["collapsed"])),
                      f"{pct(s['mean'])} [{pct(s['min'])}, {pct(s['max'])}]",
                      f"{pct(s['reported'])} [{pct(lo)}, {pct(hi)}]"]
        d_lo, d_hi = t["score"]["reported_difference_interval"]
        lines.append(f"| {t['task']} ({t['metric']}) | {t['train_examples']} / {t['dev_examples']} | "
                     f"{pct(t['majority_baseline'])} | " + " | ".join(cells) + f" | [{pct(d_lo)}, {pct(d_hi)}] |")
    lines += ["| task | steps a seed | ours samples/s | Trainer samples/s | ours / Trainer | while both trained: "
              "ours, Trainer, ratio | same files, seeds, tokens | LR schedules equal from step |",
              "|---|---|---|---|---|---|---|---|"]
    for t in r["tasks"]:
        sp, both = t["samples_per_s"], t["samples_per_s_while_both_ran"]
        while_both = (f"{both['ours']:.1f}, {both['hf']:.1f}, {both['ours_over_hf']:.2f}x" if both["ours_over_hf"]
                      else "no overlap")
        tok = t["same_tokens"]
        lines.append(f"| {t['task']} | {t['steps_per_seed']} | {sp['ours']:.1f} | {sp['hf']:.1f} | "
                     f"{sp['ours_over_hf']:.2f}x | {while_both} | {'yes' if t['same_files'] else 'NO'}, "
                     f"{'yes' if t['seeds']['ours'] == t['seeds']['hf'] else 'NO'}, "
                     f"{tok['identical']}/{tok['examples']} | {t['lr_schedule']['equal_from_step']} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())

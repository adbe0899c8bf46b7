"""Fine-tune a pretrained checkpoint on GLUE (or the offline probe suite) and report dev scores.

    python -m tools.finetune_glue --model PATH --task TASK --data_dir DIR --output_dir OUT \
        [--seeds N] [--epochs E] [--lr LR[,LR...]] [--batch_size B] [--max_seq_length L] [--tokenizer T] \
        [--bf16] [--overwrite] [--log_level warning]

PATH is one of:
- a checkpoint folder of this project: OUT/saved_models/JOB (its `latest` checkpoint) or a tag
  folder; the model sizes, vocab and lower-casing come from the job_config.json and args.json
  saved beside the checkpoint;
- a state dict file (.pt/.bin) with the original's key names; sizes and vocab from --cf (a job
  config) or a job_config.json / args.json beside the file, or --tokenizer;
- a Hugging Face folder written by tools/export_hf.py or a stock one (config.json, vocab.txt or
  tokenizer.json).
--tokenizer (a vocab.txt, a tokenizer.json or a folder holding one; --vocab_file, its older name)
overrides the model's tokenizer in every case; a text is `[CLS] A [SEP] B [SEP]` with the
tokenizer's own special tokens (<s> and </s> for a RoBERTa-style tokenizer.json). --random_init
builds a model of the same size with fresh weights (the original's --random), the baseline that
shows what pretraining gave.

TASK: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli (any case), a probe task of
tools/make_probe_tasks.py (probe_swap, probe_samedoc, probe_order), or `all`: every task folder
found under --data_dir, named as in the GLUE download (CoLA, SST-2, ..., WNLI; probe_*).
DIR holds train.tsv and dev.tsv (MNLI: dev_matched.tsv, dev_mismatched.tsv) in GLUE's layout.

The model is our pre-LN encoder with the original's pooler (from PATH where it has one, fresh
otherwise) and a fresh linear head on the pooled [CLS] output, as the original BingBertGlue's
BertForSequenceClassification. A checkpoint or export of the modernbert architecture
(turing/arch/modernbert/) gets transformers' ModernBertForSequenceClassification's head instead: a fresh
dense + act + norm on the [CLS] (or mean) output, then dropout and the linear head. The protocol is cramming's "GLUE-sane" one: the same
hyper-parameters for every task (AdamW, lr 4e-5, weight decay 0.01 except biases and
LayerNorms, batch 32, 5 epochs, linear warmup over 10% of the steps (the first step at the peak
over the warmup steps, never at 0) then linear decay towards 0,
gradient clipping 1.0), the final model scored on the dev set, and the median over --seeds
runs (seeds 0..N-1; for an even N the lower median, so the score is always one run's).
Small models need a higher learning rate than BERT-base's 4e-5: with several (`--lr
1e-4,3e-4,1e-3`) each fine-tunes seed 0 on the training set less a held-out 10% and the best on
that part is used for the real runs (the dev set is never looked at); results.json records the
sweep. A run whose dev predictions are all one class (regression: a near constant) is named in
a warning with its likely causes and marked `"collapsed"` in results.json.

Output under OUT (for `all`, one subfolder per task, named like the task's folder):
- results.json: {"task", "metric", "score" (the median), "scores" (one per seed), "seeds",
  "metrics" (every metric, per seed), "collapsed" (per seed), "majority_baseline", "model",
  "settings" (lr: the one used), "lr_sweep" (with several --lr), "run" (what the results were
  made from: the weights, every setting, the sha256 of the data files), ...}; for `all` the same
  in each task's subfolder, and in OUT one such entry per task plus "average" (the mean of the
  task scores) and, while tasks remain (a run stopped early), "unfinished" (their names).
  Scores are fractions. Each task's files are written, whole, as soon as the task finishes
  (results.json last), so a stopped run leaves the finished tasks' results and nothing else.
- dev_predictions.tsv: `index<TAB>prediction` per dev line of the median run, labels as the
  data writes them (MNLI also dev_mismatched_predictions.tsv);
- runs/TASK/seedS: TensorBoard logs (loss, learning rate, dev metrics); runs/TASK/lr_sweep/lrLR
  those of the sweep's runs.
The same command run again continues (after Ctrl-C, say): the tasks it finished in OUT with the
same weights, settings and data (their "run") are kept, the others run, what a stopped run left of
them removed first. Results there made otherwise are refused, naming the task and what differs,
and so is a file the tool does not write; --overwrite removes every earlier result first (files
the tool did not write are left, with a warning). So one folder never mixes two runs.

Exit codes: 2 for bad input (missing folder or file, unknown task, malformed TSV line or
non-finite label, a checkpoint whose sizes do not fit or whose weights are not finite, an OUT
holding other results): one `error: ...` line before any training. 3 when a loss (or the final
weights) is not finite: the run stops, and the task has no results. 128 + the signal on SIGINT
(Ctrl-C) or SIGTERM: one line saying which tasks finished.
"""
import dataclasses
import logging
import math
import os
import random
import shutil
import signal
import sys
import threading
import time
from typing import NamedTuple

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from turing.errors import OneLineParser  # light (argparse only): before --help is answered


def build_parser():
    p = OneLineParser(description="Fine-tune a pretrained BERT on GLUE tasks (cramming's GLUE-sane "
                                  "protocol) and report dev scores.", epilog="guide: docs/finetuning.md")
    p.add_argument("--model", required=True,
                   help="checkpoint folder (job folder or tag folder), state dict file, Hugging Face folder, or "
                        "the id of a model in the local Hugging Face cache (ORG/NAME; never downloaded)")
    p.add_argument("--task", required=True, help="cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli, "
                                                 "probe_swap, probe_samedoc, probe_order, or all")
    p.add_argument("--data_dir", required=True, help="the task's folder (GLUE layout); for --task all, the "
                                                     "folder holding the task folders")
    p.add_argument("--output_dir", required=True, help="where results.json, predictions and logs go")
    p.add_argument("--seeds", type=int, default=3, help="runs per task; the median is reported (default 3)")
    p.add_argument("--epochs", type=int, default=5, help="training epochs (default 5)")
    p.add_argument("--lr", default="4e-5",
                   help="peak learning rate (default 4e-5), or several, comma-separated (1e-4,3e-4,1e-3): each is "
                        "tried on the training set less a held-out 10%% of it, and the one that scores best on "
                        "that held-out part is used (the dev set is never looked at)")
    p.add_argument("--batch_size", type=int, default=32, help="training batch size (default 32)")
    p.add_argument("--max_seq_length", type=int, default=128, help="tokens per example, [CLS]/[SEP] included")
    p.add_argument("--tokenizer", "--vocab_file", dest="vocab_file", default=None,
                   help="a tokenizer (vocab.txt, tokenizer.json or a folder holding one) to use instead of the "
                        "model's (--vocab_file: the older name)")
    p.add_argument("--cf", dest="config_file", default=None,
                   help="job config (bert_config.json) for a state dict file without one beside it")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CPU or GPU); weights stay fp32")
    p.add_argument("--random_init", action="store_true",
                   help="same sizes and vocab as --model, fresh weights (the no-pretraining baseline)")
    p.add_argument("--overwrite", action="store_true",
                   help="remove the results of an earlier run in --output_dir first and run every task (else the "
                        "same command continues an earlier run there, and other results there are refused)")
    p.add_argument("--log_level", default="info", choices=("debug", "info", "warning", "error"),
                   help="log lines shown on stderr (default info; warning keeps only warnings and errors)")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


if __name__ == "__main__":  # --help and a bad flag are answered here, before the slow imports below
    build_parser().parse_args()  # (torch, DeepSpeed, transformers); main() parses the flags again

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from turing.checkpoint_files import write_atomic
from turing.errors import InputError, tool_exit
from turing.glue import (TASKS, GlueError, collapse, collate, compute_metrics, encode, find_task, label_string,
                         majority_baseline, read_examples, results_table, sequence_classifier, task_score, tasks_in)
from turing.jsonfile import json_text, read_json
from turing.optim_groups import decay_groups
from turing.outputs import content_sha256
from turing.pretrained import open_trained, resolve_model_path
from turing.process import set_seeds
from turing.sinks import tensorboard_writer, write_metrics

logger = logging.getLogger("finetune_glue")

WARMUP_PROPORTION = 0.1
WEIGHT_DECAY = 0.01
MAX_GRAD_NORM = 1.0
EVAL_BATCH_SIZE = 128


def parse_lrs(text):
    """--lr: one learning rate or a comma-separated list to sweep; each positive and finite."""
    lrs = []
    for part in str(text).split(","):
        try:
            lr = float(part)
        except ValueError:
            raise GlueError(f"--lr {text}: '{part}' is not a number") from None
        if not (math.isfinite(lr) and lr > 0):
            raise GlueError(f"--lr {part}: must be a positive finite number")
        lrs.append(lr)
    if len(set(lrs)) != len(lrs):
        raise GlueError(f"--lr {text}: a learning rate is repeated")
    return lrs


def check_args(args):
    """Flags and paths; turns --lr into the list of its learning rates."""
    for flag in ("seeds", "epochs", "batch_size"):
        if getattr(args, flag) < 1:
            raise GlueError(f"--{flag} {getattr(args, flag)}: must be at least 1")
    args.lr = parse_lrs(args.lr)
    try:
        resolve_model_path(args.model)   # a local path, or a model id in the Hugging Face cache
    except InputError as e:
        raise GlueError(f"--model {e}") from None
    if not os.path.isdir(args.data_dir):
        raise GlueError(f"--data_dir {args.data_dir}: folder not found")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise GlueError(f"--output_dir {args.output_dir}: exists and is not a folder")


# ---------------------------------------------------------------------------------------------
# Stopping early: a signal, or a loss that is not finite


class RunStopped(Exception):
    """The run ends before its tasks are done; finished tasks' results are on disk already."""

    exit_code = 1
    finished, unfinished = (), ()  # task names, set once the tasks are known


class Stopped(RunStopped):
    def __init__(self, signum):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.exit_code = 128 + signum


class Diverged(RunStopped):
    exit_code = 3


class stop_on_signals:
    """SIGINT (Ctrl-C) and SIGTERM raise `Stopped` in the main thread while the run is inside
    this block, so both end the run the same way, with one line; the handlers are restored after.
    (A local stand-in: the trainer has its own signal handling, which stops at a checkpoint.)"""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._raise) for sig in self.SIGNALS}
        return self

    @staticmethod
    def _raise(signum, frame):
        raise Stopped(signum)

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False


# ---------------------------------------------------------------------------------------------
# The model source


def build_model(source, num_labels, random_init):
    """The classifier, initialised from the current torch RNG state, then (unless random_init)
    loaded with --model's weights. The encoder is built through the pretraining model, so a
    random-init baseline starts exactly where pretraining started."""
    return sequence_classifier(source.build(random_init), source.config, num_labels)


# ---------------------------------------------------------------------------------------------
# Data


@dataclasses.dataclass
class TaskData:
    task: object
    folder: str
    train: list          # [((ids, segments), label)]
    dev: dict            # dev file name -> [((ids, segments), label)]
    pad_id: int


def load_task(task, folder, tokenizer, max_seq_length):
    def load(name):
        examples = read_examples(os.path.join(folder, name), task)
        return list(zip(encode(tokenizer, examples, max_seq_length), [e.label for e in examples]))

    return TaskData(task, folder, load("train.tsv"), {name: load(name) for name in task.dev_files},
                    tokenizer.special["pad"])


def _loader(items, batch_size, pad_id, regression, shuffle=False, seed=0):
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(items, batch_size=batch_size, shuffle=shuffle, generator=generator,
                      collate_fn=lambda b: collate(b, pad_id, regression))


# ---------------------------------------------------------------------------------------------
# Training and evaluation


def make_optimizer(model, lr, total_steps):
    groups = decay_groups(model.named_parameters(), WEIGHT_DECAY)
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)
    warmup = max(1, math.ceil(WARMUP_PROPORTION * total_steps))

    def factor(step):  # of optimizer step `step` (0-based): linear warmup to the peak, then linear decay
        # (step + 1): the first step trains at peak / warmup, not at 0 (a one-step run trained at LR 0)
        return (step + 1) / warmup if step < warmup else (total_steps - step) / max(1, total_steps - warmup)

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def predict(model, loader, device, bf16):
    model.eval()
    out = []
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        for input_ids, input_mask, segment_ids, _ in loader:
            logits = model(input_ids.to(device), input_mask.to(device), segment_ids.to(device))
            out.append(model.predictions(logits).cpu())
    return torch.cat(out).numpy()


def run_seed(args, source, data, seed, lr, device, writer):
    """Fine-tune one model at peak learning rate `lr`; returns {dev file: predictions}."""
    task = data.task
    regression = task.labels is None
    set_seeds(seed)
    model = build_model(source, task.num_labels, args.random_init).to(device)
    train_loader = _loader(data.train, args.batch_size, data.pad_id, regression, shuffle=True, seed=seed)
    total_steps = args.epochs * len(train_loader)
    optimizer, scheduler = make_optimizer(model, lr, total_steps)
    bar = tqdm(total=total_steps, desc=f"{task.name} seed {seed}", unit="step", disable=None, leave=False)
    step = 0
    try:
        for _ in range(args.epochs):
            model.train()
            for input_ids, input_mask, segment_ids, labels in train_loader:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                    logits = model(input_ids.to(device), input_mask.to(device), segment_ids.to(device))
                loss = model.loss(logits, labels.to(device))
                value = loss.item()
                if not math.isfinite(value):
                    raise Diverged(f"{task.name} seed {seed}: the loss is {value} at step {step + 1} of "
                                   f"{total_steps} (lr {lr:g}): lower --lr")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
                step_lr = scheduler.get_last_lr()[0]  # the LR this step trains at
                optimizer.step()
                scheduler.step()
                step += 1
                write_metrics(writer, step, {"Train/loss": value, "Train/lr": step_lr})
                bar.update()
                bar.set_postfix(loss=f"{value:.4f}")
    finally:
        bar.close()
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        raise Diverged(f"{task.name} seed {seed}: the weights are not finite after the last step "
                       f"(lr {lr:g}): lower --lr")
    return {name: predict(model, _loader(items, EVAL_BATCH_SIZE, data.pad_id, regression), device, args.bf16)
            for name, items in data.dev.items()}


def _stem(dev_file):
    return os.path.splitext(dev_file)[0]


def metrics_text(task, score, metrics):
    """`accuracy 0.8125`, or with several metrics (or dev files) `f1/accuracy 0.8 (f1 0.82, accuracy 0.78)`."""
    others = {k: v for k, v in metrics.items() if task.metrics != (k,)}
    extra = f" ({', '.join(f'{k} {v:.4f}' for k, v in others.items())})" if others else ""
    return f"{task.metric_name} {score:.4f}{extra}"


class SeedRun(NamedTuple):
    score: float
    seed: int
    metrics: dict       # every metric of every dev file (the first file's unprefixed)
    predictions: dict   # dev file -> predictions
    collapsed: bool     # every prediction on the first dev file one class (see turing.glue.collapse)


def score_predictions(task, predictions, gold, main_dev):
    """(task score, {metric: value}) of one run's predictions on its dev files."""
    metrics = {}
    for name, preds in predictions.items():
        prefix = "" if name == main_dev else _stem(name) + "_"
        metrics.update({prefix + k: v for k, v in compute_metrics(task, preds, gold[name]).items()})
    return task_score(task, metrics), metrics


def warn_if_collapsed(task, what, predictions, labels, steps):
    """A warning when `predictions` are all one class (or a constant); returns whether they are."""
    collapsed = collapse(task, predictions, labels)
    if collapsed:
        logger.warning("%s: every prediction is %s, the majority-class score: the model learned nothing past the "
                       "label frequencies. Likely causes: a learning rate too low for this model size (small models "
                       "need a higher one than the default 4e-5; sweep it, e.g. --lr 1e-4,3e-4,1e-3) or too few "
                       "steps (%d; raise --epochs)", what, collapsed, steps)
    return collapsed is not None


def run_task(args, source, data, out_dir, device):
    """All seeds of one task (at the --lr picked by `sweep_lr` when several are given); writes
    the median run's predictions; returns the results entry."""
    task = data.task
    main_dev = task.dev_files[0]
    gold = {name: [label for _, label in items] for name, items in data.dev.items()}
    steps = args.epochs * math.ceil(len(data.train) / args.batch_size)
    lr, sweep = sweep_lr(args, source, data, out_dir, device) if len(args.lr) > 1 else (args.lr[0], None)
    runs = []
    for seed in range(args.seeds):
        started = time.time()
        with tensorboard_writer(os.path.join(out_dir, "runs", task.name, f"seed{seed}")) as writer:
            predictions = run_seed(args, source, data, seed, lr, device, writer)
            score, metrics = score_predictions(task, predictions, gold, main_dev)
            write_metrics(writer, 0, {f"Dev/{key}": value for key, value in metrics.items()})
        logger.info("%s seed %d: %s in %.0f s", task.name, seed, metrics_text(task, score, metrics),
                    time.time() - started)
        collapsed = warn_if_collapsed(task, f"{task.name} seed {seed}, {main_dev}", predictions[main_dev],
                                      gold[main_dev], steps)
        runs.append(SeedRun(score, seed, metrics, predictions, collapsed))
    median = sorted(runs, key=lambda r: r.score)[(len(runs) - 1) // 2]  # the lower median: one run's
    os.makedirs(out_dir, exist_ok=True)
    for name, preds in median.predictions.items():
        filename = "dev_predictions.tsv" if name == main_dev else f"{_stem(name)}_predictions.tsv"
        write_atomic(os.path.join(out_dir, filename),
                     "index\tprediction\n" + "".join(f"{i}\t{label_string(task, p)}\n" for i, p in enumerate(preds)))
    entry = {
        "task": task.name, "metric": task.metric_name, "score": median.score, "scores": [r.score for r in runs],
        "seeds": [r.seed for r in runs], "median_seed": median.seed, "metrics": [r.metrics for r in runs],
        "collapsed": [r.collapsed for r in runs],
        "majority_baseline": majority_baseline(task, [label for _, label in data.train], gold[main_dev]),
        "model": os.path.abspath(args.model) + (" (random init)" if args.random_init else ""),
        "train_examples": len(data.train), "dev_examples": len(data.dev[main_dev]),
        "settings": {"epochs": args.epochs, "lr": lr, "batch_size": args.batch_size,
                     "max_seq_length": args.max_seq_length, "bf16": args.bf16, "device": device.type},
        "run": run_record(args, source, data.task, data.folder),
    }
    return {**entry, "lr_sweep": sweep} if sweep else entry


# ---------------------------------------------------------------------------------------------
# The --lr sweep

SWEEP_HELD_OUT = 0.1  # share of the training set the sweep scores on (at least min(100, n // 4) examples)
SWEEP_SEED = 0


def held_out_split(items, seed=SWEEP_SEED):
    """(the rest, the held-out part) of the training examples, a seeded SWEEP_HELD_OUT of them."""
    n = len(items)
    k = max(round(SWEEP_HELD_OUT * n), min(100, n // 4))
    if k < 1 or k >= n:
        raise GlueError(f"--lr with several values: {n} training examples are too few to hold some out")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return [items[i] for i in sorted(order[k:])], [items[i] for i in sorted(order[:k])]


def sweep_lr(args, source, data, out_dir, device):
    """(the --lr to use, a record of the sweep): each candidate fine-tunes seed SWEEP_SEED on the
    training set less a held-out part, and is scored on that part; the best score wins (a run
    that collapsed loses a tie; then the first listed). The dev set is not used."""
    task = data.task
    train, held_out = held_out_split(data.train)
    trial = dataclasses.replace(data, train=train, dev={"held_out": held_out})
    gold = {"held_out": [label for _, label in held_out]}
    scores, collapsed = {}, {}
    for lr in args.lr:
        with tensorboard_writer(os.path.join(out_dir, "runs", task.name, "lr_sweep", f"lr{lr:g}")) as writer:
            try:
                predictions = run_seed(args, source, trial, SWEEP_SEED, lr, device, writer)
            except Diverged as e:
                logger.warning("%s: --lr %g left out of the sweep: %s", task.name, lr, e)
                continue
        scores[lr], _ = score_predictions(task, predictions, gold, "held_out")
        collapsed[lr] = collapse(task, predictions["held_out"], gold["held_out"]) is not None
        logger.info("%s --lr %g: %s %.4f on %d held-out training examples%s", task.name, lr, task.metric_name,
                    scores[lr], len(held_out), " (collapsed: one class for all)" if collapsed[lr] else "")
    if not scores:
        raise Diverged(f"{task.name}: every --lr of the sweep gave a non-finite loss: lower them")
    picked = max(scores, key=lambda lr: (scores[lr], not collapsed[lr]))
    logger.info("%s: picked --lr %g (%s on %d held-out training examples, trained on the other %d; %s)", task.name,
                picked, task.metric_name, len(held_out), len(train),
                ", ".join(f"{lr:g}: {scores[lr]:.4f}" if lr in scores else f"{lr:g}: diverged" for lr in args.lr))
    return picked, {"picked": picked, "candidates": args.lr, "held_out_examples": len(held_out),
                    "trained_on": len(train), "seed": SWEEP_SEED,
                    "held_out_scores": [scores.get(lr) for lr in args.lr],
                    "collapsed": [collapsed.get(lr) for lr in args.lr]}


# ---------------------------------------------------------------------------------------------
# An earlier run in --output_dir: continued, refused or removed


def run_record(args, source, task, folder):
    """What a task's results were made from (saved in its entry as "run"): the weights, the
    settings and the sha256 of its data files. A rerun keeps a finished task whose record is this."""
    files = {name: os.path.join(folder, name) for name in ("train.tsv", *task.dev_files)}
    return {"model": os.path.abspath(args.model), "weights": source.weights, "random_init": args.random_init,
            "vocab_file": os.path.abspath(source.vocab_file), "seeds": args.seeds, "epochs": args.epochs,
            "lr": args.lr, "batch_size": args.batch_size, "max_seq_length": args.max_seq_length, "bf16": args.bf16,
            "data_sha256": {name: content_sha256(path) if os.path.isfile(path) else None
                            for name, path in files.items()}}


def _differences(old, new):
    """What differs between an earlier run's record and this one's, in a few words."""
    if not isinstance(old, dict):
        return "an older finetune_glue, which kept no record of them"
    return ", ".join("its data files changed" if key == "data_sha256" else f"{key} {old.get(key)} (now {value})"
                     for key, value in new.items() if old.get(key) != value)


def _is_output(name, path):
    """Whether a file or folder in --output_dir is one finetune_glue writes (or a temporary of one)."""
    base = name.split(".tmp")[0]
    if os.path.isdir(path):
        return name == "runs"
    return base == "results.json" or base.endswith("_predictions.tsv")


def remove_outputs(folder, what):
    """Remove what finetune_glue wrote in `folder` (results, predictions and TensorBoard runs, also
    in the task subfolders of `--task all`), with a warning starting with `what`; files it did not
    write are left in place, with a warning."""
    if not os.path.isdir(folder):
        return
    task_folders = {t.folder.lower() for t in TASKS.values()} | set(TASKS)
    removed, kept = [], []

    def clear(folder, prefix):
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if _is_output(name, path):
                shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
                removed.append(prefix + name)
            elif not prefix and name.lower() in task_folders and os.path.isdir(path) and not os.path.islink(path):
                clear(path, name + "/")
                if not os.listdir(path):
                    os.rmdir(path)
            else:
                kept.append(prefix + name)

    clear(folder, "")
    if removed:
        logger.warning("%s %s: %s", what, folder, ", ".join(removed))
    if kept:
        logger.warning("%s: left in place, not written by finetune_glue: %s", folder, ", ".join(kept))


def check_output_dir(args, tasks, all_tasks):
    """A GlueError unless --output_dir is new, empty or holds only what finetune_glue writes for
    this run (for `all`: the task folders and the summary of an earlier `all` run). --overwrite
    passes any folder: every earlier result is removed once every input is checked."""
    out = args.output_dir
    if args.overwrite or not os.path.isdir(out):
        return
    folders = {os.path.basename(o) for _, _, o in tasks} if all_tasks else set()
    foreign = [name for name in sorted(os.listdir(out)) if name not in folders and not (
        _is_output(name, os.path.join(out, name)) and (not all_tasks or name.split(".tmp")[0] == "results.json"))]
    if foreign:
        raise GlueError(f"--output_dir {out} holds files finetune_glue did not write for this run "
                        f"({', '.join(foreign[:4])}{', ...' if len(foreign) > 4 else ''}); choose a new folder, or "
                        "pass --overwrite to remove the earlier results first (other files are left)")
    summary_file = os.path.join(out, "results.json")
    if all_tasks and os.path.isfile(summary_file):
        document = read_json(summary_file, "results file", GlueError)
        if not isinstance(document, dict) or "task" in document or "average" not in document:
            raise GlueError(f"--output_dir {out} holds {_results_kind(document)} ({summary_file}), not the summary "
                            "of a --task all run; choose a new folder, or pass --overwrite to remove it first")


def _results_kind(document):
    """What a results.json in --output_dir holds, in a few words, for a refusal."""
    if isinstance(document, dict) and "task" in document:
        return f"the results of {document['task']}"
    if isinstance(document, dict) and "average" in document:
        return "the results of a --task all run"
    return "a results.json finetune_glue did not write"


def finished_tasks(args, tasks, source):
    """{task name: results entry} of the tasks an earlier run of this same command finished in
    --output_dir (the same weights, settings and data: `run_record`), which this run keeps; a
    GlueError naming the task and what differs for results made otherwise (none with --overwrite)."""
    kept = {}
    for task, folder, out in [] if args.overwrite else tasks:
        path = os.path.join(out, "results.json")
        if not os.path.isfile(path):
            continue
        entry = read_json(path, "results file", GlueError)
        if not isinstance(entry, dict) or entry.get("task") != task.name:
            raise GlueError(f"--output_dir {args.output_dir} holds {_results_kind(entry)} ({path}), not those of "
                            f"{task.name}; choose a new folder, or pass --overwrite to remove them first")
        record = run_record(args, source, task, folder)
        if entry.get("run") != record:
            raise GlueError(f"--output_dir {args.output_dir}: {task.name} was fine-tuned there with other settings "
                            f"({_differences(entry.get('run'), record)}); run the same command to continue that run, "
                            "pass --overwrite to remove its results and run every task again, or choose a new folder")
        kept[task.name] = entry
    return kept


def write_results(path, document):
    """results.json, whole or not at all; strict JSON (a NaN is a bug, never written)."""
    write_atomic(path, json_text(document, path, GlueError))


def summary(results, pending):
    """The results.json of `--task all`: the finished tasks, their average, the tasks left."""
    document = {**results, "average": float(np.mean([r["score"] for r in results.values()])) if results else None}
    if pending:
        document["unfinished"] = pending
    return document


def finetune(args):
    check_args(args)
    all_tasks = args.task.lower() == "all"
    if all_tasks:
        tasks = [(task, folder, os.path.join(args.output_dir, task.folder)) for task, folder in tasks_in(args.data_dir)]
    else:
        tasks = [(find_task(args.task), args.data_dir, args.output_dir)]
    check_output_dir(args, tasks, all_tasks)
    source = open_trained(args.model, args.vocab_file, args.config_file)   # the weights: read for each run (build_model)
    tokenizer = source.require_tokenizer()
    kept = finished_tasks(args, tasks, source)
    if args.max_seq_length > source.config.max_position_embeddings:
        raise GlueError(f"--max_seq_length {args.max_seq_length}: the model has only "
                        f"{source.config.max_position_embeddings} positions")
    # Every file and the weights are read and checked before the first task trains.
    data = [(load_task(task, folder, tokenizer, args.max_seq_length), out) for task, folder, out in tasks]
    if len(args.lr) > 1:
        for d, _ in data:
            held_out_split(d.train)  # enough examples to hold some out
    if not args.random_init:
        build_model(source, 2, False)
    if args.overwrite:
        remove_outputs(args.output_dir, "--overwrite: removed the earlier results in")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    logger.info("Fine-tuning %s%s on %s (%s): %d seed(s), %d epochs, lr %s, batch %d, max_seq_length %d%s",
                args.model, " (random init)" if args.random_init else "", ", ".join(t.name for t, _, _ in tasks),
                device.type, args.seeds, args.epochs, " or ".join(f"{lr:g}" for lr in args.lr), args.batch_size,
                args.max_seq_length,
                ", bf16" if args.bf16 else "")
    results = {}
    try:
        for i, (d, out) in enumerate(data):
            if d.task.name in kept:
                logger.info("%s: finished by an earlier run of this command, kept (%s)", d.task.name,
                            os.path.join(out, "results.json"))
                entry = kept[d.task.name]
            else:
                remove_outputs(out, f"{d.task.name}: removed what a stopped run left of it in")
                entry = run_task(args, source, d, out, device)
                # The task's files are complete on disk before the next task starts.
                write_results(os.path.join(out, "results.json"), entry)
            results[d.task.name] = entry
            if all_tasks:
                write_results(os.path.join(args.output_dir, "results.json"),
                              summary(results, [t.task.name for t, _ in data[i + 1:]]))
    except RunStopped as e:
        e.finished, e.unfinished = list(results), [d.task.name for d, _ in data if d.task.name not in results]
        raise
    return results


def stop_line(e, output_dir):
    """The one line of a stopped run: why, which tasks have results, which do not."""
    done = (f"finished {', '.join(e.finished)} (results in {os.path.join(output_dir, 'results.json')})"
            if e.finished else "no task finished")
    return f"{e}; {done}" + (f"; no results for {', '.join(e.unfinished)}" if e.unfinished else "")


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        force=True)

    def run():
        try:
            with stop_on_signals():
                results = finetune(args)
        except Stopped as e:
            print(f"finetune_glue: {stop_line(e, args.output_dir)}" + ("; the same command continues the run"
                                                                      if e.unfinished else ""), file=sys.stderr)
            return e.exit_code
        except Diverged as e:
            print(f"error: {stop_line(e, args.output_dir)}", file=sys.stderr)
            return e.exit_code
        print(results_table({"random init" if args.random_init else "pretrained": results}))
        print(f"results: {os.path.join(args.output_dir, 'results.json')}")
        return 0
    return tool_exit(run, args.debug)


if __name__ == "__main__":
    sys.exit(main())

"""GLUE fine-tuning pieces: the task table, the TSV reader, encoding, metrics, the classifier.

Owns what `tools/finetune_glue.py` (the command line and the training loop) and
`tools/make_probe_tasks.py` (the offline probe suite) share:
- `TASKS`: the nine GLUE tasks, as laid out by the standard GLUE download (folder names,
  dev files, header or not, text and label columns, label strings, official metrics), and the
  three probe tasks of `tools/make_probe_tasks.py` in the same layout;
- `read_examples(path, task)`: one TSV file -> examples, with one-line errors naming the file
  and line of anything malformed;
- `encode(...)` / `collate(...)`: `[CLS] A [SEP] (B [SEP])` ids truncated like the original's
  `_truncate_seq_pair`, padded per batch;
- `compute_metrics` / `task_score` / `majority_baseline`: the official metrics through
  scikit-learn and scipy; `collapse`: whether a run's predictions are all one class;
- `sequence_classifier`: the fine-tuning model of a pretraining model's architecture (its
  registry entry's classifier, turing.arch: BERT's pooler, dropout and a linear classification
  or, with one output, regression head, the original BingBertGlue model's module tree with
  state-dict keys `bert.*` and `classifier.*`; the modernbert one as transformers'
  ModernBertForSequenceClassification);
- `load_run` / `load_results` / `results_table`: results.json files (checked) and the text table
  of one or more runs.

Scores are fractions (accuracy 0.84, not 84); tables print them x100.
"""
import codecs
import dataclasses
import logging
import math
import os
from typing import NamedTuple, Optional

import numpy as np
import torch
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from turing.arch import spec_of
from turing.dataset import truncate_pair
from turing.errors import InputValueError
from turing.jsonfile import read_json
from turing.speedups import apply_speedups

logger = logging.getLogger(__name__)


class GlueError(InputValueError):
    """Bad fine-tuning input; the message names the file (and line) or the flag."""


@dataclasses.dataclass(frozen=True)
class Task:
    name: str                 # what --task takes (any case)
    folder: str               # folder name in the GLUE download (--task all looks for it)
    text_columns: tuple       # one (single sentence) or two (pair) columns: names, or indices without header
    label_column: object      # name, or index without header
    labels: Optional[tuple]   # label strings as written in the data, in class order; None = regression
    metrics: tuple            # official metrics; the task score is their mean (as on the GLUE leaderboard)
    header: bool = True
    dev_files: tuple = ("dev.tsv",)  # the first gives the score; others are reported beside it
    fields: Optional[int] = None     # field count of a line, where there is no header to say

    @property
    def num_labels(self):
        return 1 if self.labels is None else len(self.labels)

    @property
    def metric_name(self):
        return "/".join(self.metrics)


_PAIR = ("sentence1", "sentence2")
_NLI = ("entailment", "not_entailment")
# Probe tasks (tools/make_probe_tasks.py): label strings of the probe pair tasks.
PROBE_LABELS = {"probe_samedoc": ("different", "same"), "probe_order": ("reversed", "in_order")}

REGRESSION_RANGE = (0.0, 5.0)   # STS-B's scores: similarity from 0 (none) to 5 (the same meaning)

TASKS = {t.name: t for t in (
    # CoLA has no header: source, label, original annotation, sentence.
    Task("cola", "CoLA", (3,), 1, ("0", "1"), ("mcc",), header=False, fields=4),
    Task("sst2", "SST-2", ("sentence",), "label", ("0", "1"), ("accuracy",)),
    Task("mrpc", "MRPC", ("#1 String", "#2 String"), "Quality", ("0", "1"), ("f1", "accuracy")),
    Task("stsb", "STS-B", _PAIR, "score", None, ("pearson", "spearman")),
    Task("qqp", "QQP", ("question1", "question2"), "is_duplicate", ("0", "1"), ("f1", "accuracy")),
    Task("mnli", "MNLI", _PAIR, "gold_label", ("contradiction", "entailment", "neutral"), ("accuracy",),
         dev_files=("dev_matched.tsv", "dev_mismatched.tsv")),
    Task("qnli", "QNLI", ("question", "sentence"), "label", _NLI, ("accuracy",)),
    Task("rte", "RTE", _PAIR, "label", _NLI, ("accuracy",)),
    Task("wnli", "WNLI", _PAIR, "label", ("0", "1"), ("accuracy",)),
    # The offline probe suite, in the SST-2 (single sentence) and RTE (pair) layouts.
    Task("probe_swap", "probe_swap", ("sentence",), "label", ("0", "1"), ("accuracy",)),
    Task("probe_samedoc", "probe_samedoc", _PAIR, "label", PROBE_LABELS["probe_samedoc"], ("accuracy",)),
    Task("probe_order", "probe_order", _PAIR, "label", PROBE_LABELS["probe_order"], ("accuracy",)),
)}


def find_task(name):
    task = TASKS.get(name.lower().replace("-", ""))
    if task is None:
        raise GlueError(f"--task {name}: unknown task; expected one of {', '.join(TASKS)} or all")
    return task


def tasks_in(data_dir):
    """(task, folder path) for every task folder under `data_dir` named as in the GLUE download,
    in any case (`cola` is CoLA). Two folders for one task are refused; a folder holding a
    train.tsv whose name is no task's is named in a warning, not skipped silently."""
    by_task, others = {}, []
    for entry in sorted(os.listdir(data_dir)):
        if not os.path.isdir(os.path.join(data_dir, entry)):
            continue
        task = next((t for t in TASKS.values() if entry.lower() in (t.folder.lower(), t.name)), None)
        if task is not None:
            by_task.setdefault(task.name, []).append(entry)
        elif os.path.isfile(os.path.join(data_dir, entry, "train.tsv")):
            others.append(entry)
    for name, entries in by_task.items():
        if len(entries) > 1:
            raise GlueError(f"--data_dir {data_dir}: {len(entries)} folders for {name} ({', '.join(entries)}); "
                            "keep one")
    if others:
        logger.warning("--data_dir %s: skipping %s: not a task name (expected %s, any case)", data_dir,
                       ", ".join(others), ", ".join(t.folder for t in TASKS.values()))
    found = [(t, os.path.join(data_dir, by_task[t.name][0])) for t in TASKS.values() if t.name in by_task]
    if not found:
        raise GlueError(f"--data_dir {data_dir}: no task folder found; expected some of "
                        f"{', '.join(t.folder for t in TASKS.values())}")
    return found


# ---------------------------------------------------------------------------------------------
# Reading


class Example(NamedTuple):
    text_a: str
    text_b: Optional[str]
    label: object  # class index, or float for regression


def _quote(text, limit=40):
    """`text` for an error line: at most `limit` characters, control characters escaped."""
    text = text if len(text) <= limit else text[:limit] + "..."
    return repr(text)[1:-1]


def _column(header, column, path):
    if isinstance(column, int):
        return column
    if column not in header:
        shown = ", ".join(_quote(c) for c in header[:8]) + (f", ... ({len(header)} in all)" if len(header) > 8 else "")
        raise GlueError(f"{path}:1: header has no column '{column}' (columns: {shown})")
    return header.index(column)


def _read_lines(path):
    """The file's lines (\n or \r\n endings), decoded as UTF-8; a byte that is not UTF-8 is an
    error naming its line, a file whose lines end in CR only one saying so."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw.startswith(codecs.BOM_UTF8):  # MRPC's files start with a byte-order mark
        raw = raw[len(codecs.BOM_UTF8):]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise GlueError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at byte {column} of the line); "
                        "GLUE files are UTF-8") from None
    if "\n" not in text and "\r" in text.rstrip("\r"):
        raise GlueError(f"{path}: lines end in a carriage return only (CR); expected \\n or \\r\\n line endings")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def read_examples(path, task):
    """The examples of one TSV file of `task`. Lines are split on tabs only (no quoting, as
    GLUE's files need); every line must have the header's field count."""
    if not os.path.isfile(path):
        raise GlueError(f"{path}: {task.name} data file not found")
    lines = _read_lines(path)
    header = lines[0].rstrip("\r").split("\t") if task.header and lines else None
    first = 2 if task.header else 1
    if header is not None:
        fields = len(header)
        columns = [_column(header, c, path) for c in task.text_columns]
        label_col = _column(header, task.label_column, path)
        body = lines[1:]
    else:
        fields, columns, label_col, body = task.fields, list(task.text_columns), task.label_column, lines
    examples = []
    for number, line in enumerate(body, start=first):
        parts = line.rstrip("\r").split("\t")
        if len(parts) != fields:
            raise GlueError(f"{path}:{number}: expected {fields} tab-separated fields, found {len(parts)}")
        raw = parts[label_col].strip()
        if task.labels is None:
            try:
                label = float(raw)
            except ValueError:
                raise GlueError(f"{path}:{number}: label '{_quote(raw)}' is not a number") from None
            if not math.isfinite(label):
                raise GlueError(f"{path}:{number}: label '{_quote(raw)}' is not a finite number")
            if not REGRESSION_RANGE[0] <= label <= REGRESSION_RANGE[1]:   # (1e39 was inf in float32)
                raise GlueError(f"{path}:{number}: label '{_quote(raw)}' is outside STS-B's similarity scale "
                                f"[{REGRESSION_RANGE[0]:g}, {REGRESSION_RANGE[1]:g}]")
        elif raw in task.labels:
            label = task.labels.index(raw)
        else:
            raise GlueError(f"{path}:{number}: label '{_quote(raw)}' is not one of {', '.join(task.labels)}")
        texts = [parts[c] for c in columns]
        examples.append(Example(texts[0], texts[1] if len(texts) > 1 else None, label))
    if not examples:
        raise GlueError(f"{path}: no examples")
    return examples


def label_string(task, prediction):
    """A prediction as the data writes labels: the label string, or the score with 3 decimals."""
    return f"{float(prediction):.3f}" if task.labels is None else task.labels[int(prediction)]


# ---------------------------------------------------------------------------------------------
# Encoding


def encode(tokenizer, examples, max_seq_length):
    """[(input_ids, segment_ids)] of `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]` (the tokenizer's own
    special tokens: turing.tokenization.Tokenizer.special), the pair cut to fit from the end of
    the longer segment (the original's _truncate_seq_pair)."""
    if max_seq_length < 3:
        raise GlueError(f"--max_seq_length {max_seq_length}: needs room for [CLS] and two [SEP]")
    cls_id, sep_id = tokenizer.special["cls"], tokenizer.special["sep"]
    ids_a = tokenizer.encode_batch([e.text_a for e in examples])
    pairs = examples[0].text_b is not None
    ids_b = tokenizer.encode_batch([e.text_b for e in examples]) if pairs else [[]] * len(examples)
    room = max_seq_length - (3 if pairs else 2)
    len_a, len_b = truncate_pair(np.array([len(a) for a in ids_a]), np.array([len(b) for b in ids_b]), room)
    out = []
    for a, b, na, nb in zip(ids_a, ids_b, len_a, len_b):
        ids = [cls_id] + a[:na] + [sep_id]
        segments = [0] * len(ids)
        if pairs:
            ids += b[:nb] + [sep_id]
            segments += [1] * (int(nb) + 1)
        out.append((ids, segments))
    return out


def collate(items, pad_id, regression):
    """[((ids, segments), label)] -> (input_ids, input_mask, segment_ids, labels), padded to the
    longest row of the batch."""
    length = max(len(ids) for (ids, _), _ in items)
    input_ids = torch.full((len(items), length), pad_id, dtype=torch.long)
    segment_ids = torch.zeros((len(items), length), dtype=torch.long)
    input_mask = torch.zeros((len(items), length), dtype=torch.long)
    for row, ((ids, segments), _) in enumerate(items):
        input_ids[row, :len(ids)] = torch.tensor(ids)
        segment_ids[row, :len(ids)] = torch.tensor(segments)
        input_mask[row, :len(ids)] = 1
    labels = torch.tensor([label for _, label in items], dtype=torch.float if regression else torch.long)
    return input_ids, input_mask, segment_ids, labels


# ---------------------------------------------------------------------------------------------
# Metrics


def _correlation(fn, predictions, labels):
    # A constant prediction (a majority baseline) has no correlation; scipy returns NaN.
    if np.ptp(predictions) == 0 or np.ptp(labels) == 0:
        return 0.0
    return float(fn(predictions, labels).statistic)


def compute_metrics(task, predictions, labels):
    """{metric: value} of `task.metrics` for predictions and gold labels (class indices, or
    scores for STS-B). F1 is that of the positive class, label "1" (MRPC, QQP)."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    out = {}
    for metric in task.metrics:
        if metric == "accuracy":
            out[metric] = float(accuracy_score(labels, predictions))
        elif metric == "f1":
            out[metric] = float(f1_score(labels, predictions, pos_label=task.labels.index("1"),
                                         average="binary", zero_division=0.0))
        elif metric == "mcc":
            out[metric] = float(matthews_corrcoef(labels, predictions))
        elif metric == "pearson":
            out[metric] = _correlation(stats.pearsonr, predictions, labels)
        elif metric == "spearman":
            out[metric] = _correlation(stats.spearmanr, predictions, labels)
        else:
            raise ValueError(f"unknown metric {metric!r}")
    return out


def collapse(task, predictions, labels):
    """What a run's predictions collapsed to, or None: one class for every example, or (regression)
    scores that barely vary (a spread under 1% of the gold scores'), i.e. a model that learned
    nothing past the label frequencies (or the mean score)."""
    predictions = np.asarray(predictions)
    if task.labels is None:
        spread, scale = float(np.std(predictions)), float(np.std(labels))
        if np.ptp(predictions) == 0 or spread < 0.01 * scale:
            return (f"a near constant ({float(np.mean(predictions)):.3f}, std {spread:.2g} against the labels' "
                    f"{scale:.2g})")
        return None
    classes = np.unique(predictions)
    return f"'{task.labels[int(classes[0])]}'" if len(classes) == 1 else None


def task_score(task, metrics):
    """The task's one number: the mean of its official metrics."""
    return float(np.mean([metrics[m] for m in task.metrics]))


def majority_baseline(task, train_labels, dev_labels):
    """The score of always predicting the most frequent training label (regression: the
    training mean, which correlates with nothing: 0)."""
    if task.labels is None:
        constant = float(np.mean(train_labels))
    else:
        constant = int(np.bincount(np.asarray(train_labels, dtype=np.int64), minlength=task.num_labels).argmax())
    return task_score(task, compute_metrics(task, [constant] * len(dev_labels), dev_labels))


# ---------------------------------------------------------------------------------------------
# Model


def sequence_classifier(pretraining, config, num_labels):
    """The fine-tuning model on `pretraining.bert` (the encoder of a pretraining model of
    `config`'s architecture): its architecture's classifier (turing.arch), with the speed-ups."""
    return apply_speedups(spec_of(config.architecture).classifier(pretraining, config, num_labels))


# ---------------------------------------------------------------------------------------------
# Results


# Keys of a `--task all` results.json that are not tasks: the mean score of the finished tasks,
# and the tasks a stopped run did not reach (absent once every task has finished).
SUMMARY_KEYS = ("average", "unfinished")
ENTRY_KEYS = {"metric": str, "score": (int, float), "scores": list, "majority_baseline": (int, float)}


def _check_entry(entry, task, path):
    if not isinstance(entry, dict):
        raise GlueError(f"{path}: the entry of {task} is not an object (a results.json of tools/finetune_glue.py "
                        "holds one per task)")
    for key, kind in ENTRY_KEYS.items():
        if key not in entry:
            raise GlueError(f"{path}: the entry of {task} has no '{key}'; not a results.json of "
                            "tools/finetune_glue.py")
        if not isinstance(entry[key], kind) or isinstance(entry[key], bool):
            raise GlueError(f"{path}: '{key}' of {task} is a {type(entry[key]).__name__}, not a "
                            f"{kind.__name__ if isinstance(kind, type) else 'number'}")
    if not entry["scores"] or not all(isinstance(v, (int, float)) for v in entry["scores"]):
        raise GlueError(f"{path}: 'scores' of {task} is not a list of numbers")
    return entry


def load_run(path):
    """({task: entry}, [unfinished task names]) of a results.json written by
    tools/finetune_glue.py (or its folder); anything else is a GlueError naming the file."""
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    results = read_json(path, "results file", GlueError)
    if not isinstance(results, dict):
        raise GlueError(f"{path}: a JSON {type(results).__name__}, not a results.json of tools/finetune_glue.py "
                        "(an object: one task's entry, or one entry per task)")
    if "task" in results:  # one task
        return {str(results["task"]): _check_entry(results, results["task"], path)}, []
    entries = {k: _check_entry(v, k, path) for k, v in results.items() if k not in SUMMARY_KEYS}
    if not entries:
        raise GlueError(f"{path}: no task results in it")
    unfinished = results.get("unfinished") or []
    return entries, [str(t) for t in unfinished] if isinstance(unfinished, list) else []


def load_results(path):
    """{task: entry} of a results.json written by tools/finetune_glue.py (or its folder)."""
    return load_run(path)[0]


def average_score(run, tasks=None):
    """Mean of the (median) task scores of one run ({task: entry}), over `tasks` (default all of its)."""
    return float(np.mean([entry["score"] for task, entry in run.items() if tasks is None or task in tasks]))


def median_collapsed(entry):
    """Whether the run a results entry reports (its median seed) collapsed (see `collapse`)."""
    collapsed, seeds = entry.get("collapsed"), entry.get("seeds")
    if not isinstance(collapsed, list) or not isinstance(seeds, list) or entry.get("median_seed") not in seeds:
        return False
    index = seeds.index(entry["median_seed"])
    return index < len(collapsed) and collapsed[index] is True


COLLAPSE_NOTE = ("* the run predicted one class for every dev example (or a constant score): it learned nothing "
                 "past the label frequencies (a learning rate too low for the model size, or too few steps)")


def _cell(entry):
    scores = entry["scores"]
    text = f"{100 * entry['score']:.1f}" + ("*" if median_collapsed(entry) else "")
    if len(scores) > 1:
        text += f" [{100 * min(scores):.1f}, {100 * max(scores):.1f}]"
    return text


def results_table(runs):
    """Text table, one row per task (+ the average of several), one column per run.

    runs: {column name: {task name: results entry}}. A cell is the median score x100 and, for
    several seeds, [min, max] over them, and a `*` when the reported run collapsed (a note
    under the table says what that means); the last column is the majority-class baseline.
    The average is over the tasks every column has: where some column lacks a task, the row
    says how many tasks it averages and a note under the table names those it leaves out.
    """
    first = {}  # task -> its entry in the first run that has it (metric, baseline)
    for run in runs.values():
        for task, entry in run.items():
            first.setdefault(task, entry)
    rows = [["task", "metric", *runs, "majority"]]
    for task, entry in first.items():
        rows.append([task, entry["metric"], *(_cell(run[task]) if task in run else "-" for run in runs.values()),
                     f"{100 * entry['majority_baseline']:.1f}"])
    common = [task for task in first if all(task in run for run in runs.values())]
    notes = []
    if len(first) > 1 and len(common) < len(first):
        left_out = ", ".join(f"{task} (only in {', '.join(n for n, run in runs.items() if task in run)})"
                             for task in first if task not in common)
        notes.append(f"average: over the {len(common)} of {len(first)} tasks every column has; left out: {left_out}"
                     if common else f"no average: no task is in every column ({left_out})")
    if len(first) > 1 and common:
        label = "average" if len(common) == len(first) else f"average of {len(common)}"
        rows.append([label, "", *(f"{100 * average_score(run, common):.1f}" for run in runs.values()),
                     f"{100 * np.mean([first[t]['majority_baseline'] for t in common]):.1f}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows] + notes
    if any(median_collapsed(entry) for run in runs.values() for entry in run.values()):
        lines.append(COLLAPSE_NOTE)
    return "\n".join(lines)

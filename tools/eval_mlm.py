"""Zero-shot quality of a masked LM: minimal pairs scored by pseudo-log-likelihood, and MLM scores
on held-out text beside the unigram baseline of the same vocab. No fine-tuning, no labels.

    python -m tools.eval_mlm --model PATH [--pairs FILE.jsonl ...] [--text FILE] [--validation_set DIR] \
        [--random_init] [--seed 0] [--tensorboard_dir RUN] --output_dir OUT

--model is opened as every tool opens a trained model (turing.pretrained): a checkpoint folder of
ours (job folder or tag folder), a state dict file with the original's key names (sizes from --cf
or a job_config.json beside it), or a Hugging Face folder written by tools/export_hf.py. Weights
are read weights-only, never unpickled, and must be finite. --random_init scores a model of the
same sizes and vocab with fresh weights (seeded by --seed): the baseline that shows what
pretraining bought.

Scores
- Pseudo-log-likelihood (PLL, Salazar et al. 2020, "Masked Language Model Scoring") of a sentence:
  `[CLS] w_1 .. w_n [SEP]` with each token w_t replaced by [MASK] in turn (n rows, batched; the
  special tokens are the tokenizer's: <s> ... </s> and <mask> for a RoBERTa-style tokenizer.json),
  PLL = sum_t log P(w_t | the other tokens). The distribution is over the ids the model's rows
  stand for (the tokenizer's, and those a tokenizer.json model's config pads them to; our padding
  rows, which no export keeps, are left out), so a checkpoint and its
  Hugging Face export give the same numbers.
- --pairs: minimal pairs in BLiMP's jsonl layout (Warstadt et al. 2020), one JSON object a line
  with `sentence_good`, `sentence_bad`, `UID` and `pairID` (other fields are ignored): the layout
  of BLiMP's files as distributed. A pair is correct when PLL(good) > PLL(bad) (a tie is wrong).
  Accuracy overall and per UID, each with its 95% Wilson interval. A sentence longer than the
  model's positions allow is refused by name, never cut.
- --text: plain text, one sentence (or any piece of text) a line, blank lines ignored. Every token
  masked in turn: masked-token accuracy (argmax = the token) and pseudo-perplexity,
  exp(-sum PLL / tokens). A line longer than the model takes is scored in consecutive windows of
  the longest length it takes (counted as `chunked_lines`).
- --validation_set: a validation folder of the trainer (NVIDIA hdf5 files or Bing shards), scored
  at its own masked positions as the trainer validates (the original's 15%, 80/10/10; Bing
  shards masked with --validation_seed, the trainer's --seed): masked-token accuracy, the mean
  cross-entropy and its perplexity.
- Beside each, the unigram baseline of the same vocab, fitted on the very tokens scored (so it is
  the best any unigram model can do there): the accuracy of always predicting the most frequent
  token and the unigram perplexity, exp(entropy).

Output under OUT: results.json (all of the above, scores as fractions; the model, whether it was
--random_init, and the sha256 of every input scored: each pairs file, the text, the validation
set's files, so that tools/quality_table.py can check that two results scored the same),
pair_scores.jsonl (one line a pair: file, line, UID, pairID, pll_good, pll_bad, correct), and with
--tensorboard_dir RUN scalars `Quality/...` (`Quality_random_init/...` with --random_init) at the
checkpoint's global step (from its tag, or --step), e.g. into the training run's folder OUT/runs/JOB.
Bad input (a missing file, a line that is not JSON or lacks a field, a sentence too long) is one
`error: FILE:LINE: ...` line and exit code 2; so are weights that are not finite (naming the
tensor) and a score that is not (naming the file and key: the files are strict JSON, never NaN,
and are written once everything is scored, so an earlier run's stay as they were).
"""
import dataclasses
import json
import logging
import math
import os
import sys
import time
from collections import Counter
from typing import NamedTuple

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from turing.errors import OneLineParser  # light (argparse only): before --help is answered

DEFAULT_BATCH_TOKENS = 16384


def build_parser():
    p = OneLineParser(description="Zero-shot quality of a masked LM: minimal-pair accuracy by "
                                  "pseudo-log-likelihood, MLM scores on held-out text beside the "
                                  "unigram baseline.", epilog="guide: docs/evaluation.md")
    p.add_argument("--model", required=True,
                   help="checkpoint folder (job folder or tag folder), state dict file, Hugging Face folder, or "
                        "the id of a model in the local Hugging Face cache (ORG/NAME; never downloaded)")
    p.add_argument("--pairs", nargs="+", default=[], metavar="FILE.jsonl",
                   help="minimal-pair files in BLiMP's jsonl layout (sentence_good, sentence_bad, UID, pairID)")
    p.add_argument("--text", default=None, help="held-out plain text: every token masked in turn")
    p.add_argument("--validation_set", default=None,
                   help="a validation folder of the trainer (NVIDIA hdf5 or Bing shards), scored at its masks")
    p.add_argument("--output_dir", required=True, help="where results.json and pair_scores.jsonl go")
    p.add_argument("--random_init", action="store_true",
                   help="same sizes and vocab as --model, fresh weights (the no-pretraining baseline)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --random_init weights (default 0)")
    p.add_argument("--tokenizer", "--vocab_file", dest="vocab_file", default=None,
                   help="a tokenizer (vocab.txt, tokenizer.json or a folder holding one) to use instead of the "
                        "model's (--vocab_file: the older name)")
    p.add_argument("--cf", dest="config_file", default=None,
                   help="job config (bert_config.json) for a state dict file without one beside it")
    p.add_argument("--max_seq_length", type=int, default=128,
                   help="sequence length of the --validation_set shards (default 128)")
    p.add_argument("--max_predictions_per_seq", type=int, default=80,
                   help="masked positions per sequence of Bing --validation_set shards (the trainer's flag)")
    p.add_argument("--validation_seed", type=int, default=42,
                   help="the trainer's --seed, which fixes the masks of Bing --validation_set shards (default 42)")
    p.add_argument("--batch_tokens", type=int, default=DEFAULT_BATCH_TOKENS,
                   help=f"tokens per forward pass, padding included (default {DEFAULT_BATCH_TOKENS})")
    p.add_argument("--tensorboard_dir", default=None, help="run folder to write Quality/* scalars into")
    p.add_argument("--step", type=int, default=None,
                   help="global step of the TensorBoard scalars (default: the checkpoint tag's step, else 0)")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


if __name__ == "__main__":  # --help and a bad flag are answered here, before the slow imports below
    build_parser().parse_args()  # (torch, DeepSpeed, transformers); main() parses the flags again

import numpy as np
import torch
from torch.utils.data import DataLoader

from bert_dataset_provider import ValidationSettings
from data_formats import validation_format
from tools.prep.documents import JSON_TOO_DEEP, not_text
from turing.batch import Batch, collate_batch
from turing.checkpoint_files import write_atomic
from turing.errors import InputError, InputValueError, tool_exit
from turing.jsonfile import json_text
from turing.outputs import content_sha256
from turing.pretrained import TrainedModel, open_trained, resolve_model_path
from turing.process import set_seeds
from turing.shard_tokenizer import check_shard_tokenizer
from turing.sinks import tensorboard_writer, write_metrics
from turing.tokenization import Tokenizer
from turing.validation import FIELDS as VALIDATION_FIELDS, batch_totals, scores_of

logger = logging.getLogger("eval_mlm")

PAIR_FIELDS = ("sentence_good", "sentence_bad", "UID", "pairID")
Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
VALIDATION_BATCH = 64


class EvalError(InputValueError):
    """Bad input to the evaluation; the message names the file (and line) or the flag."""


def check_args(args):
    if not (args.pairs or args.text or args.validation_set):
        raise EvalError("nothing to score: give --pairs, --text and/or --validation_set")
    try:
        resolve_model_path(args.model)   # a local path, or a model id in the Hugging Face cache
    except InputError as e:
        raise EvalError(f"--model {e}") from None
    for path in args.pairs + ([args.text] if args.text else []):
        if not os.path.isfile(path):
            raise EvalError(f"{path}: file not found")
    if args.validation_set and not os.path.isdir(args.validation_set):
        raise EvalError(f"--validation_set {args.validation_set}: folder not found")
    if args.batch_tokens < 1:
        raise EvalError(f"--batch_tokens {args.batch_tokens}: must be at least 1")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise EvalError(f"--output_dir {args.output_dir}: exists and is not a folder")


# ---------------------------------------------------------------------------------------------
# The model


@dataclasses.dataclass
class Scorer:
    model: object                    # a pretraining model of any architecture, eval mode, on `device`
    tokenizer: Tokenizer             # the model's (turing.tokenization: a vocab.txt's or a tokenizer.json's)
    vocab_file: str                  # its file
    vocab_real: int                  # the ids the rows stand for: scores are over ids 0..vocab_real-1
    special: dict                    # {"pad", "unk", "cls", "sep", "mask"} -> id
    max_tokens: int                  # tokens a sequence may hold between [CLS] and [SEP]
    device: torch.device
    source: TrainedModel             # --model, as turing.pretrained opened it


def build_scorer(model_path, vocab_file=None, config_file=None, seed=0):
    """--model's sizes, vocab and tokenizer (opened as every reader opens a trained model:
    turing.pretrained.open_trained), with fresh weights drawn with `seed` (the random-init twin);
    `load_weights` then gives it --model's weights."""
    source = open_trained(model_path, vocab_file, config_file)
    set_seeds(seed)
    model = source.build(random_init=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = source.require_tokenizer()
    special = tokenizer.special   # one error line where the tokenizer lacks one
    return Scorer(model.to(device).eval(), tokenizer, source.vocab_file, source.vocab_ids, special,
                  source.config.max_position_embeddings - 2, device, source)


def load_weights(scorer):
    """--model's weights into the scorer's model (turing.pretrained: weights-only, every tensor
    finite, every shape checked against the config)."""
    scorer.source.load_weights(scorer.model)
    scorer.model.eval()


def load_scorer(model_path, vocab_file=None, config_file=None, random_init=False, seed=0):
    """The model of --model (or, with random_init, its twin with fresh weights), ready to score."""
    scorer = build_scorer(model_path, vocab_file, config_file, seed)
    if not random_init:
        load_weights(scorer)
    return scorer


def _vocab_scores(scorer, hidden):
    """(N, H) final hidden states -> (N, vocab_real) fp32 MLM scores."""
    return scorer.model.mlm_scores(hidden)[:, :scorer.vocab_real].float()


def _batches(lengths, batch_tokens):
    """Rows (sequence index, masked token index), shortest sequences first, grouped so that
    rows x padded length (with [CLS]/[SEP]) stays within batch_tokens (at least one row a batch)."""
    batch, width = [], 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        for t in range(lengths[i]):
            width = max(width, lengths[i] + 2)
            if batch and (len(batch) + 1) * width > batch_tokens:
                yield batch
                batch, width = [], lengths[i] + 2
            batch.append((i, t))
    if batch:
        yield batch


@torch.inference_mode()
def token_scores(scorer, sequences, batch_tokens=DEFAULT_BATCH_TOKENS):
    """Each token of each sequence (token ids, no special tokens; at most scorer.max_tokens)
    masked in turn in `[CLS] ids [SEP]`: per sequence, (log P(token | the rest) as float64, whether
    the token is the argmax), one entry a token."""
    lengths = [len(s) for s in sequences]
    if max(lengths, default=0) > scorer.max_tokens:
        raise ValueError(f"a sequence of {max(lengths)} tokens; the model takes at most {scorer.max_tokens}")
    log_probs = [np.zeros(n, np.float64) for n in lengths]
    hits = [np.zeros(n, bool) for n in lengths]
    sp = scorer.special
    for rows in _batches(lengths, batch_tokens):
        width = max(lengths[i] for i, _ in rows) + 2
        ids = np.full((len(rows), width), sp["pad"], np.int64)
        mask = np.zeros((len(rows), width), np.int64)
        positions = np.empty(len(rows), np.int64)
        targets = np.empty(len(rows), np.int64)
        for r, (i, t) in enumerate(rows):
            n = lengths[i]
            ids[r, 0], ids[r, 1:n + 1], ids[r, n + 1] = sp["cls"], sequences[i], sp["sep"]
            mask[r, :n + 2] = 1
            positions[r], targets[r] = t + 1, sequences[i][t]
            ids[r, t + 1] = sp["mask"]
        ids_t, mask_t, positions_t, target_t = (torch.from_numpy(a).to(scorer.device)
                                                for a in (ids, mask, positions, targets))
        sequence_output = scorer.model.encode(ids_t, torch.zeros_like(ids_t), mask_t)      # (B, L, H)
        hidden = sequence_output[torch.arange(len(rows), device=scorer.device), positions_t]  # (B, H)
        scores = _vocab_scores(scorer, hidden)                                                 # (B, V)
        lp = torch.log_softmax(scores, -1).gather(1, target_t[:, None]).squeeze(1).double().cpu().numpy()
        top = (scores.argmax(-1) == target_t).cpu().numpy()
        for r, (i, t) in enumerate(rows):
            log_probs[i][t], hits[i][t] = lp[r], top[r]
    return log_probs, hits


def pseudo_log_likelihoods(scorer, sequences, batch_tokens=DEFAULT_BATCH_TOKENS):
    """PLL (sum over tokens of log P(token | the rest)) of each token-id sequence."""
    log_probs, _ = token_scores(scorer, sequences, batch_tokens)
    return [float(lp.sum()) for lp in log_probs]


# ---------------------------------------------------------------------------------------------
# Statistics


def wilson_interval(correct, total, z=Z95):
    """The Wilson score interval [lo, hi] of a proportion correct/total (95% by default)."""
    if total == 0:
        return [0.0, 1.0]
    p = correct / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return [max(0.0, centre - half), min(1.0, centre + half)]


def accuracy_entry(correct, total):
    return {"pairs": total, "correct": correct, "accuracy": correct / total if total else 0.0,
            "ci95": wilson_interval(correct, total)}


def unigram_baseline(token_ids, ids_to_tokens):
    """The best a unigram model does on these very tokens: accuracy of always predicting the most
    frequent one, and the perplexity exp(entropy) of their empirical distribution."""
    counts = Counter(int(t) for t in token_ids)
    total = sum(counts.values())
    if not total:
        return {"accuracy": 0.0, "perplexity": None, "most_frequent_token": None}
    top, top_count = counts.most_common(1)[0]
    p = np.array(list(counts.values()), np.float64) / total
    return {"accuracy": top_count / total, "perplexity": float(np.exp(-(p * np.log(p)).sum())),
            "most_frequent_token": ids_to_tokens.get(top, str(top))}


# ---------------------------------------------------------------------------------------------
# Minimal pairs


def _lines(path):
    """The lines of a UTF-8 text file; bytes that are not UTF-8 are an error naming the line."""
    with open(path, "rb") as f:
        raw = f.read().split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    if raw:
        raw[0] = raw[0].removeprefix(b"\xef\xbb\xbf")   # a BOM, as some editors write
    out = []
    for number, line in enumerate(raw, start=1):
        try:
            out.append(line.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise EvalError(f"{path}:{number}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return out


class Pair(NamedTuple):
    file: str
    line: int
    uid: str
    pair_id: str
    good: str
    bad: str


def read_pairs(path):
    """The pairs of one BLiMP-layout jsonl file; blank lines are skipped."""
    pairs = []
    for number, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise EvalError(f"{path}:{number}: not valid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise EvalError(f"{path}:{number}: not JSON this reader takes ({JSON_TOO_DEEP})") from None
        if not isinstance(record, dict):
            raise EvalError(f"{path}:{number}: expected a JSON object with {', '.join(PAIR_FIELDS)}")
        missing = [k for k in PAIR_FIELDS if k not in record]
        if missing:
            raise EvalError(f"{path}:{number}: no {', '.join(missing)} field (BLiMP layout: "
                            f"{', '.join(PAIR_FIELDS)})")
        for key in ("sentence_good", "sentence_bad"):
            problem = not_text(record[key])
            if problem:
                raise EvalError(f"{path}:{number}: {key} {problem}")
            if not record[key].strip():
                raise EvalError(f"{path}:{number}: {key} must be a non-empty string")
        pairs.append(Pair(path, number, str(record["UID"]), str(record["pairID"]),
                          record["sentence_good"], record["sentence_bad"]))
    if not pairs:
        raise EvalError(f"{path}: no pairs in the file")
    return pairs


def encode_pairs(scorer, pairs):
    """[(good ids, bad ids)]; a sentence longer than the model takes is refused by name."""
    good = scorer.tokenizer.encode_batch([p.good for p in pairs])
    bad = scorer.tokenizer.encode_batch([p.bad for p in pairs])
    for pair, g, b in zip(pairs, good, bad, strict=True):
        for key, ids in (("sentence_good", g), ("sentence_bad", b)):
            unit = scorer.tokenizer.unit
            if not ids:
                raise EvalError(f"{pair.file}:{pair.line}: pairID {pair.pair_id}: {key} has no {unit}")
            if len(ids) > scorer.max_tokens:
                raise EvalError(f"{pair.file}:{pair.line}: pairID {pair.pair_id}: {key} has {len(ids)} {unit}s; "
                                f"the model takes at most {scorer.max_tokens} between [CLS] and [SEP] "
                                "(sentences are not cut: shorten or leave out the pair)")
    return list(zip(good, bad))


def score_pairs(scorer, pairs, encoded=None, batch_tokens=DEFAULT_BATCH_TOKENS):
    """(summary, per-pair rows). summary: accuracy overall and by UID, with 95% intervals.
    `encoded`: encode_pairs' result, where the caller has it already."""
    encoded = encode_pairs(scorer, pairs) if encoded is None else encoded
    plls = pseudo_log_likelihoods(scorer, [s for pair in encoded for s in pair], batch_tokens)
    rows = []
    for k, pair in enumerate(pairs):
        good, bad = plls[2 * k], plls[2 * k + 1]
        rows.append({"file": pair.file, "line": pair.line, "UID": pair.uid, "pairID": pair.pair_id,
                     "pll_good": good, "pll_bad": bad, "correct": good > bad})
    by_uid = {}
    for uid in sorted({r["UID"] for r in rows}):
        of_uid = [r for r in rows if r["UID"] == uid]
        by_uid[uid] = accuracy_entry(sum(r["correct"] for r in of_uid), len(of_uid))
    summary = {**accuracy_entry(sum(r["correct"] for r in rows), len(rows)),
               "ties": sum(r["pll_good"] == r["pll_bad"] for r in rows),
               "files": sorted({p.file for p in pairs}), "by_uid": by_uid}
    return summary, rows


# ---------------------------------------------------------------------------------------------
# Held-out text and validation sets


def read_text(path):
    lines = [line.strip() for line in _lines(path)]
    lines = [line for line in lines if line]
    if not lines:
        raise EvalError(f"{path}: no text in the file")
    return lines


def text_windows(scorer, path):
    """(lines, token windows, lines chunked): each line's token ids, a line longer than the
    model takes cut into consecutive windows of the longest length it takes."""
    lines = read_text(path)
    windows, chunked = [], 0
    for ids in scorer.tokenizer.encode_batch(lines):
        chunked += len(ids) > scorer.max_tokens
        windows += [ids[i:i + scorer.max_tokens] for i in range(0, len(ids), scorer.max_tokens)]
    if not windows:
        raise EvalError(f"{path}: no {scorer.tokenizer.unit} in the text")
    return lines, windows, chunked


def score_text(scorer, path, prepared=None, batch_tokens=DEFAULT_BATCH_TOKENS):
    """Every token of the file masked in turn: accuracy, pseudo-perplexity and the unigram baseline.
    `prepared`: text_windows' result, where the caller has it already."""
    lines, windows, chunked = prepared or text_windows(scorer, path)
    log_probs, hits = token_scores(scorer, windows, batch_tokens)
    tokens = sum(len(w) for w in windows)
    total_lp = float(sum(lp.sum() for lp in log_probs))
    return {"file": path, "lines": len(lines), "chunked_lines": chunked, "tokens": tokens,
            "method": "each token masked in turn",
            "accuracy": float(sum(h.sum() for h in hits)) / tokens,
            "pseudo_log_likelihood": total_lp, "pseudo_perplexity": math.exp(-total_lp / tokens),
            "unigram": unigram_baseline([t for w in windows for t in w], scorer.tokenizer.ids_to_tokens)}


def open_validation_set(scorer, path, max_seq_length, max_predictions_per_seq, seed):
    if not os.listdir(path):
        raise EvalError(f"--validation_set {path}: folder is empty; expected NVIDIA .hdf5 files or Bing shard folders")
    provider = validation_format(path, "--validation_set")
    check_shard_tokenizer(scorer.tokenizer, [path])   # where prepare_data recorded the tokenizer beside them
    settings = ValidationSettings(max_seq_length, max_predictions_per_seq, seed, scorer.vocab_file, scorer.vocab_real)
    return provider.validation_dataset(path, settings)


@torch.inference_mode()
def score_validation_set(scorer, path, dataset=None, max_seq_length=128, max_predictions_per_seq=80, seed=42):
    """The set's masked positions, as the trainer validates: accuracy, loss (the mean over masked
    tokens, turing.validation's token_loss), perplexity, unigram. `dataset`: open_validation_set's
    result, where the caller has it already."""
    if dataset is None:
        dataset = open_validation_set(scorer, path, max_seq_length, max_predictions_per_seq, seed)
    totals, labels_seen = torch.zeros(len(VALIDATION_FIELDS), dtype=torch.float64), []
    for batch in DataLoader(dataset, batch_size=VALIDATION_BATCH, collate_fn=collate_batch):
        batch = Batch(*(t.to(scorer.device) for t in batch))
        sequence_output = scorer.model.encode(batch.input_ids, batch.segment_ids, batch.input_mask)
        masked = batch.masked_lm_labels != -1
        labels = batch.masked_lm_labels[masked]
        totals += batch_totals(_vocab_scores(scorer, sequence_output[masked]), labels, len(batch.input_ids)).cpu()
        labels_seen.append(labels.cpu().numpy())
    scores = scores_of(totals, next_sentence_prediction=False)
    if not scores["masked_tokens"]:
        raise EvalError(f"--validation_set {path}: no masked token in it")
    labels = np.concatenate(labels_seen)
    return {"path": path, "sequences": scores["sequences"], "masked_tokens": scores["masked_tokens"],
            "method": "its own masks, as the trainer validates",
            "accuracy": scores["mlm_accuracy"], "loss": scores["token_loss"], "perplexity": scores["perplexity"],
            "unigram": unigram_baseline(labels, scorer.tokenizer.ids_to_tokens)}


# ---------------------------------------------------------------------------------------------
# Reporting


def tensorboard_scalars(results):
    """{tag: value} of the results, under Quality/ (Quality_random_init/ for a random-init model)."""
    root = "Quality_random_init" if results["random_init"] else "Quality"
    out = {}
    if "minimal_pairs" in results:
        mp = results["minimal_pairs"]
        out[f"{root}/minimal_pairs/accuracy"] = mp["accuracy"]
        out.update({f"{root}/minimal_pairs/{uid}": e["accuracy"] for uid, e in mp["by_uid"].items()})
    for key in ("text", "validation_set"):
        if key in results:
            r = results[key]
            out[f"{root}/{key}/mlm_accuracy"] = r["accuracy"]
            out[f"{root}/{key}/unigram_accuracy"] = r["unigram"]["accuracy"]
            ppl = r.get("pseudo_perplexity", r.get("perplexity"))
            out[f"{root}/{key}/{'pseudo_perplexity' if key == 'text' else 'perplexity'}"] = ppl
    return out


def write_tensorboard(run_dir, step, results):
    with tensorboard_writer(run_dir) as writer:
        write_metrics(writer, step, tensorboard_scalars(results))


def _pct(x):
    return f"{100 * x:.1f}%"


def _interval(entry):
    lo, hi = entry["ci95"]
    return f"{100 * entry['accuracy']:5.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def report_lines(results):
    """What a person reads: each score next to its baseline."""
    lines = [f"model: {results['model']}" + (" (random init)" if results["random_init"] else "")
             + (f", step {results['step']}" if results.get("step") is not None else "")]
    for key, what in (("validation_set", "validation set (its own masks)"),
                      ("text", "held-out text (every token masked in turn)")):
        if key in results:
            r = results[key]
            uni = r["unigram"]
            ppl_name, ppl = (("pseudo-perplexity", r["pseudo_perplexity"]) if key == "text"
                             else ("perplexity", r["perplexity"]))
            lines.append(f"{what}: MLM accuracy {_pct(r['accuracy'])} over {r.get('tokens', r.get('masked_tokens')):,} "
                         f"tokens (unigram baseline, always '{uni['most_frequent_token']}': {_pct(uni['accuracy'])}); "
                         f"{ppl_name} {ppl:.1f} (unigram {uni['perplexity']:.1f})")
    if "minimal_pairs" in results:
        mp = results["minimal_pairs"]
        lines.append("minimal pairs (accuracy x100 [95% interval]; chance 50):")
        width = max(len("all"), *(len(uid) for uid in mp["by_uid"]))
        lines += [f"  {uid:<{width}}  {e['pairs']:5d}  {_interval(e)}" for uid, e in mp["by_uid"].items()]
        lines.append(f"  {'all':<{width}}  {mp['pairs']:5d}  {_interval(mp)}")
    return lines


def write_results(output_dir, results, rows):
    """pair_scores.jsonl (with pairs), then results.json, each whole or not at all (results.json, which
    names the scores, last). A score that is not finite is an EvalError naming the file and the
    key, and then neither file is written."""
    texts = []
    if rows is not None:
        path = results["minimal_pairs"]["pair_scores"]
        texts.append((path, "".join(json_text(r, f"{path}:{n}", EvalError, indent=None) + "\n"
                                    for n, r in enumerate(rows, start=1))))
    path = os.path.join(output_dir, "results.json")
    texts.append((path, json_text(results, path, EvalError)))
    # an earlier results.json goes first: a kill between the two files must not leave it beside
    # pair scores it does not describe (quality_table reads results.json)
    if os.path.exists(path):
        os.remove(path)
    for path, text in texts:
        write_atomic(path, text)


def evaluate(args):
    """Score everything asked for; returns the results dict (also written to OUT/results.json).
    Every input is read and checked before the weights load and anything is scored; the files
    are written once everything is scored."""
    check_args(args)
    started = time.time()
    pairs = [p for path in args.pairs for p in read_pairs(path)]
    scorer = build_scorer(args.model, args.vocab_file, args.config_file, args.seed)
    encoded = encode_pairs(scorer, pairs) if pairs else None
    text = text_windows(scorer, args.text) if args.text else None
    validation = (open_validation_set(scorer, args.validation_set, args.max_seq_length, args.max_predictions_per_seq,
                                      args.validation_seed) if args.validation_set else None)
    if not args.random_init:
        load_weights(scorer)
    step = args.step if args.step is not None else scorer.source.step
    results = {"model": os.path.abspath(args.model), "random_init": args.random_init, "seed": args.seed,
               "step": step, "vocab_file": scorer.vocab_file, "vocab_size": scorer.vocab_real}
    os.makedirs(args.output_dir, exist_ok=True)
    rows = None
    if pairs:
        logger.info("Scoring %d minimal pairs of %d file(s)", len(pairs), len(args.pairs))
        results["minimal_pairs"], rows = score_pairs(scorer, pairs, encoded, args.batch_tokens)
        results["minimal_pairs"]["sha256"] = {path: content_sha256(path) for path in results["minimal_pairs"]["files"]}
        results["minimal_pairs"]["pair_scores"] = os.path.join(args.output_dir, "pair_scores.jsonl")
    if text:
        logger.info("Scoring %s, every token masked in turn", args.text)
        results["text"] = {**score_text(scorer, args.text, text, args.batch_tokens),
                           "sha256": content_sha256(args.text)}
    if validation is not None:
        logger.info("Scoring the validation set %s", args.validation_set)
        results["validation_set"] = {**score_validation_set(scorer, args.validation_set, validation),
                                     "validation_seed": args.validation_seed,
                                     "sha256": content_sha256(args.validation_set)}
    results["seconds"] = round(time.time() - started, 1)
    write_results(args.output_dir, results, rows)
    if args.tensorboard_dir:
        write_tensorboard(args.tensorboard_dir, step or 0, results)
    return results


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)

    def run():
        results = evaluate(args)
        print("\n".join(report_lines(results)))
        print(f"results: {os.path.join(args.output_dir, 'results.json')}")
        return 0
    return tool_exit(run, args.debug)


if __name__ == "__main__":
    sys.exit(main())

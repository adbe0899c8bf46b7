"""tools/eval_mlm.py checked against stock Hugging Face `transformers` on a real checkpoint.

    python bench/eval_mlm_vs_transformers.py --model demo_run/out/saved_models/demo_bert \
        --pairs demo_run/minimal_pairs.jsonl [--limit 200]

Exports the checkpoint with tools/export_hf.py (into a temporary folder), then computes the
pseudo-log-likelihood of both sentences of the first --limit pairs three ways: tools/eval_mlm.py on
the checkpoint, tools/eval_mlm.py on the export, and `AutoModelForMaskedLM` + `AutoTokenizer` on the
export with a plain loop (one masked copy per token, no code of ours). Prints the largest
differences and how many pairs' verdicts (good > bad) differ; appends a JSON line with --output.
"""
import argparse
import json
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from bench.common import append_json_lines, machine_description  # noqa: E402
from tools import eval_mlm, export_hf  # noqa: E402


def stock_pll(model, tokenizer, sentence):
    ids = tokenizer(sentence, return_tensors="pt")["input_ids"]
    n = ids.shape[1] - 2
    batch = ids.repeat(n, 1)
    rows = torch.arange(n)
    batch[rows, rows + 1] = tokenizer.mask_token_id
    with torch.no_grad():
        logits = model(input_ids=batch).logits[rows, rows + 1]
    return torch.log_softmax(logits.double(), -1)[rows, ids[0, 1:-1]].sum().item()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a checkpoint folder of ours")
    parser.add_argument("--pairs", required=True, help="a BLiMP-layout jsonl file")
    parser.add_argument("--limit", type=int, default=200, help="pairs compared (the first N)")
    parser.add_argument("--output", default=None, help="append a JSON line to this file")
    args = parser.parse_args(argv)
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    pairs = eval_mlm.read_pairs(args.pairs)[:args.limit]
    with tempfile.TemporaryDirectory() as tmp:
        export = os.path.join(tmp, "hf")
        export_hf.export(args.model, export)
        scores = {}
        for name, path in (("checkpoint", args.model), ("export", export)):
            scorer = eval_mlm.load_scorer(path)
            _, rows = eval_mlm.score_pairs(scorer, pairs)
            scores[name] = [s for r in rows for s in (r["pll_good"], r["pll_bad"])]
        tokenizer = AutoTokenizer.from_pretrained(export)
        model = AutoModelForMaskedLM.from_pretrained(export).eval()
        scores["transformers"] = [stock_pll(model, tokenizer, s) for p in pairs for s in (p.good, p.bad)]

    def verdicts(values):
        return [good > bad for good, bad in zip(values[::2], values[1::2])]

    ours = scores["checkpoint"]
    record = {"bench": "eval_mlm_vs_transformers", "machine": machine_description(), "model": os.path.abspath(args.model),
              "pairs": len(pairs), "sentences": len(ours), "pll_mean": sum(ours) / len(ours)}
    for name in ("export", "transformers"):
        record[f"max_abs_diff_{name}"] = max(abs(a - b) for a, b in zip(scores[name], ours, strict=True))
        record[f"verdicts_differing_{name}"] = sum(a != b for a, b in zip(verdicts(scores[name]), verdicts(ours)))
    print(json.dumps(record, indent=2))
    append_json_lines(args.output, [record])
    return 0


if __name__ == "__main__":
    sys.exit(main())

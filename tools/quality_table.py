"""The quality table of a checkpoint beside its random-init twin, from two tools/eval_mlm.py runs.

    python -m tools.quality_table --pretrained OUT_A --random_init OUT_B [--output quality.json]

OUT_A / OUT_B: output folders (or results.json files) of tools/eval_mlm.py on the checkpoint and
with --random_init on the same checkpoint (the same sizes and vocab, fresh weights), scored on the
same files. Prints validation MLM accuracy and perplexity beside the unigram baseline, then
minimal-pair accuracy by kind of corruption (UID), each with its 95% interval, and whether the
checkpoint's interval lies entirely above the random-init one. --output writes the same as JSON:
{"minimal_pairs": {"pretrained": {"accuracy", "ci95", "pairs", "correct", "by_kind"}, "random_init":
{...}, "pretrained_above_random_init"}, "validation_mlm": {...}, "text_mlm": {...}, "model", "step"}.
Scores in the JSON are fractions; the table prints them x100.
"""
import argparse
import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from tools.make_minimal_pairs import DESCRIPTIONS, KINDS
from turing.jsonfile import read_json, write_json

COLUMNS = ("pretrained", "random_init")


class TableError(ValueError):
    """A results file that is missing or does not hold what the table needs."""


def load(path):
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    return read_json(path, "tools/eval_mlm.py results", TableError)


def _entry(e):
    return {k: e[k] for k in ("accuracy", "ci95", "pairs", "correct")}


def quality(pretrained, random_init):
    """The quality.json document of two eval_mlm results."""
    runs = {"pretrained": pretrained, "random_init": random_init}
    doc = {"model": pretrained["model"], "step": pretrained.get("step")}
    if "minimal_pairs" in pretrained:
        if "minimal_pairs" not in random_init:
            raise TableError("the random-init results have no minimal pairs; score the same --pairs files")
        mp = {name: {**_entry(r["minimal_pairs"]), "by_kind": {uid: _entry(e) for uid, e
                                                                in r["minimal_pairs"]["by_uid"].items()}}
              for name, r in runs.items()}
        if set(mp["pretrained"]["by_kind"]) != set(mp["random_init"]["by_kind"]):
            raise TableError("the two results scored different kinds of pairs; score the same --pairs files")
        mp["pretrained_above_random_init"] = mp["pretrained"]["ci95"][0] > mp["random_init"]["ci95"][1]
        doc["minimal_pairs"] = mp
    for key, name in (("validation_set", "validation_mlm"), ("text", "text_mlm")):
        if key in pretrained and key in random_init:
            ppl = "perplexity" if key == "validation_set" else "pseudo_perplexity"
            doc[name] = {**{n: {"accuracy": r[key]["accuracy"], "perplexity": r[key][ppl]} for n, r in runs.items()},
                         "unigram_baseline": pretrained[key]["unigram"],
                         "tokens": pretrained[key].get("masked_tokens", pretrained[key].get("tokens")),
                         "method": pretrained[key]["method"]}
    return doc


def _cell(e):
    lo, hi = e["ci95"]
    return f"{100 * e['accuracy']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def table(doc):
    lines = []
    for name, what in (("validation_mlm", "validation set"), ("text_mlm", "held-out text")):
        if name in doc:
            v = doc[name]
            uni = v["unigram_baseline"]
            lines += [f"{what}, {v['tokens']:,} masked tokens ({v['method']}):",
                      f"  MLM accuracy   pretrained {100 * v['pretrained']['accuracy']:5.1f}%   random init "
                      f"{100 * v['random_init']['accuracy']:5.1f}%   unigram baseline {100 * uni['accuracy']:5.1f}% "
                      f"(always '{uni['most_frequent_token']}')",
                      f"  perplexity     pretrained {v['pretrained']['perplexity']:6.0f}   random init "
                      f"{v['random_init']['perplexity']:6.0f}   unigram baseline {uni['perplexity']:6.0f}"]
    if "minimal_pairs" in doc:
        mp = doc["minimal_pairs"]
        # make_minimal_pairs' kinds in its order, then any other UIDs (BLiMP's) as they come
        kinds = sorted(mp["pretrained"]["by_kind"], key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS))
        described = {k: f"{k:<8} {DESCRIPTIONS[k]}" if k in DESCRIPTIONS else k for k in kinds}
        width = max(len("all"), *(len(d) for d in described.values()))
        lines += ["minimal pairs: is a held-out sentence more likely than its corrupted twin?",
                  "(accuracy x100 [95% interval]; chance 50)",
                  f"{'kind':<{width}}  pairs  {'pretrained':<18}  random init"]
        for k in kinds:
            p, r = mp["pretrained"]["by_kind"][k], mp["random_init"]["by_kind"][k]
            lines.append(f"{described[k]:<{width}}  {p['pairs']:5d}  {_cell(p):<18}  {_cell(r)}")
        p, r = mp["pretrained"], mp["random_init"]
        lines.append(f"{'all':<{width}}  {p['pairs']:5d}  {_cell(p):<18}  {_cell(r)}")
        lines.append("pretrained above random init (the intervals do not overlap): "
                     + ("yes" if mp["pretrained_above_random_init"] else "NO"))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description="A checkpoint's quality beside its random-init twin.")
    parser.add_argument("--pretrained", required=True, help="tools/eval_mlm.py output folder of the checkpoint")
    parser.add_argument("--random_init", required=True, help="the same with --random_init")
    parser.add_argument("--output", default=None, help="write the table's numbers to this JSON file")
    args = parser.parse_args(argv)
    try:
        doc = quality(load(args.pretrained), load(args.random_init))
    except (TableError, KeyError) as e:
        print(f"error: {e if isinstance(e, TableError) else f'results lack {e}'}", file=sys.stderr)
        return 2
    print(table(doc))
    if args.output:
        write_json(args.output, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The quality table of a checkpoint beside its random-init twin, from two tools/eval_mlm.py runs.

    python -m tools.quality_table --pretrained OUT_A --random_init OUT_B [--output quality.json]

OUT_A / OUT_B: output folders (or results.json files) of tools/eval_mlm.py on the checkpoint and
with --random_init on the same checkpoint (the same sizes and vocab, fresh weights), scored on the
same files. Each is checked first, with one error line for what does not fit: the --pretrained
results scored with --random_init (or the other way round), two models, a score one has and the
other lacks, different pairs files, text or validation set (by the sha256 eval_mlm records of each,
and the validation masks' seed), different numbers of pairs or tokens. Prints validation MLM
accuracy and perplexity beside the unigram baseline, then minimal-pair accuracy by kind of
corruption (UID), each with its 95% interval, and whether the checkpoint's interval lies entirely
above the random-init one (the pair counts, checked equal, are both sides'). --output writes the same as JSON:
{"minimal_pairs": {"pretrained": {"accuracy", "ci95", "pairs", "correct", "by_kind"}, "random_init":
{...}, "pretrained_above_random_init"}, "validation_mlm": {...}, "text_mlm": {...}, "model", "step"}.
Scores in the JSON are fractions; the table prints them x100.
"""
import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from turing.errors import InputValueError, OneLineParser, tool_exit  # light (argparse only): before --help is answered

from tools.make_minimal_pairs import DESCRIPTIONS, KINDS
from turing.jsonfile import read_json, write_json

COLUMNS = ("pretrained", "random_init")


class TableError(InputValueError):
    """A results file that is missing or does not hold what the table needs."""


def load(path):
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    results = read_json(path, "tools/eval_mlm.py results", TableError)
    if not isinstance(results, dict) or not isinstance(results.get("random_init"), bool):
        kind = f"a JSON {type(results).__name__}" if not isinstance(results, dict) else "no 'random_init' in it"
        raise TableError(f"{path}: {kind}, not the results.json of tools/eval_mlm.py")
    problem = _bad_score(results)
    if problem:
        raise TableError(f"{path}: {problem}; not scores tools/eval_mlm.py writes (score the model again)")
    return results


def _bad_score(value, where=""):
    """The first score in an eval_mlm results document that no scoring gives ('KEY is V, expected
    ...'), or None: accuracies and their 95% intervals are shares in [0, 1], perplexities >= 1,
    counts whole numbers >= 0. (NaN and Infinity are read_json's to refuse.)"""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if isinstance(value, dict):
        for key, item in value.items():
            at = f"{where}.{key}" if where else key
            if key == "accuracy" and not (number(item) and 0 <= item <= 1):
                return f"{at} is {item!r}, expected a share in [0, 1]"
            if key == "ci95" and not (isinstance(item, list) and len(item) == 2 and all(number(v) and 0 <= v <= 1
                                                                                        for v in item)):
                return f"{at} is {item!r}, expected [low, high] shares in [0, 1]"
            if "perplexity" in key and item is not None and not (number(item) and item >= 1):   # (None: no tokens)
                return f"{at} is {item!r}, expected a number >= 1"
            if key in ("pairs", "correct", "tokens", "masked_tokens") and not (
                    isinstance(item, int) and not isinstance(item, bool) and item >= 0):
                return f"{at} is {item!r}, expected a whole number >= 0"
            found = _bad_score(item, at)
            if found:
                return found
    return None


# the scores the two results must both have or both lack: key, what it is, the flag that scores it
SCORED = (("minimal_pairs", "minimal pairs", "--pairs"), ("validation_set", "validation set", "--validation_set"),
          ("text", "held-out text", "--text"))


def _digests(section):
    """The sha256 of what a section scored, in a form that compares (pairs files: by content, not path)."""
    digests = section.get("sha256")
    return sorted(digests.values()) if isinstance(digests, dict) else digests


def check_comparable(pretrained, random_init, paths):
    """A TableError (one line) unless the two results are a checkpoint and its random-init twin
    scored on the same inputs. `paths`: {"pretrained": ..., "random_init": ...}, for the messages."""
    if pretrained["random_init"]:
        raise TableError(f"--pretrained {paths['pretrained']}: scored with --random_init (fresh weights); give the "
                         "results of the checkpoint's own weights")
    if not random_init["random_init"]:
        raise TableError(f"--random_init {paths['random_init']}: scored the model's own weights; give the results "
                         "of tools/eval_mlm.py --random_init")
    if pretrained.get("model") != random_init.get("model"):
        raise TableError(f"the two results are of different models ({pretrained.get('model')} and "
                         f"{random_init.get('model')}); score one --model twice, once with --random_init")
    runs = {"pretrained": pretrained, "random_init": random_init}
    for key, what, flag in SCORED:
        have = [name for name, r in runs.items() if key in r]
        if len(have) == 1:
            raise TableError(f"only the {have[0].replace('_', '-')} results ({paths[have[0]]}) have a {what} score; "
                             f"score both with the same {flag}")
        if not have:
            continue
        for name, r in runs.items():
            if not r[key].get("sha256"):
                raise TableError(f"{paths[name]}: no sha256 of its {what} (results of an older tools/eval_mlm.py): "
                                 "score it again")
        if _digests(pretrained[key]) != _digests(random_init[key]):
            raise TableError(f"the two results scored different {what} files (their sha256 differ); score both with "
                             f"the same {flag}")
        for count in ("validation_seed", "masked_tokens", "tokens", "pairs"):
            if pretrained[key].get(count) != random_init[key].get(count):
                raise TableError(f"the two results' {what} scores differ in {count} ({pretrained[key].get(count)} "
                                 f"and {random_init[key].get(count)}); score both with the same {flag} and flags")
    if "minimal_pairs" in pretrained:
        kinds = {name: {uid: e.get("pairs") for uid, e in r["minimal_pairs"]["by_uid"].items()}
                 for name, r in runs.items()}
        if kinds["pretrained"] != kinds["random_init"]:
            raise TableError(f"the two results hold different pairs by kind ({kinds['pretrained']} and "
                             f"{kinds['random_init']}); score both with the same --pairs")


def _entry(e):
    return {k: e[k] for k in ("accuracy", "ci95", "pairs", "correct")}


def quality(pretrained, random_init):
    """The quality.json document of two eval_mlm results that `check_comparable` passed."""
    runs = {"pretrained": pretrained, "random_init": random_init}
    doc = {"model": pretrained["model"], "step": pretrained.get("step")}
    if "minimal_pairs" in pretrained:
        mp = {name: {**_entry(r["minimal_pairs"]), "by_kind": {uid: _entry(e) for uid, e
                                                                in r["minimal_pairs"]["by_uid"].items()}}
              for name, r in runs.items()}
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


def build_parser():
    parser = OneLineParser(description="A checkpoint's quality beside its random-init twin.",
                           epilog="guide: docs/evaluation.md")
    parser.add_argument("--pretrained", required=True, help="tools/eval_mlm.py output folder of the checkpoint")
    parser.add_argument("--random_init", required=True, help="the same with --random_init")
    parser.add_argument("--output", default=None, help="write the table's numbers to this JSON file")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)

    def run():
        results = {"pretrained": load(args.pretrained), "random_init": load(args.random_init)}
        check_comparable(results["pretrained"], results["random_init"],
                         {"pretrained": args.pretrained, "random_init": args.random_init})
        try:
            doc = quality(results["pretrained"], results["random_init"])
        except KeyError as e:   # a score the results lack (only the reading of the two results is in here)
            raise TableError(f"results lack {e}") from None
        if args.output:  # strict JSON: a NaN score (results of an older eval_mlm) is an error line, not a file
            write_json(args.output, doc, TableError)
        print(table(doc))
        return 0
    return tool_exit(run)


if __name__ == "__main__":
    sys.exit(main())

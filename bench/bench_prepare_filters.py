"""The document stages of tools/prepare_data.py: near-duplicate recall and precision, each stage's cost.

Owns nothing used in training. In `--work`:

1. Planted near duplicates. The demo corpus (tools/make_demo_corpus.py: Python's own documentation,
   real text with a few real near duplicates of its own), and after it copies of `--copies` of its
   documents per kind: 1, 3, 5, 10 and 20% of the words replaced, a boilerplate block added, the
   sentences reordered (two halves swapped), 3% changed with boilerplate and a reorder. Each copy's
   true Jaccard similarity to its original (5-word shingles) is computed; the signature pass
   (tools/prep/neardup.py) runs over the corpus with each MinHash library of `--libraries` (rensa, the
   pipeline's; datasketch) and LSH setting of `--configs`, and reports recall per kind and per
   similarity band, and precision: a removed document that is neither a planted copy nor removed in the corpus without copies is a
   false positive.
2. Cost. `python -m tools.prepare_data` in this process on that corpus (NVIDIA, seq 128, dupe factor 5,
   one worker, one vocab), with every stage off, each stage alone, and all on, in alternating rounds:
   CPU seconds of this process (where one worker runs: the figure a shared machine disturbs least),
   MB/s of input per CPU second and the ratio to all off, and wall seconds; and each stage alone over
   the documents, read already (no pipeline around it): MB/s of text per CPU second.
3. Language ID (where /usr/share/locale holds gettext catalogues, as on Debian): py3langid (the
   pipeline's) against lingua, if installed, on held-out sentences of 16 languages (the translations
   of system programs' messages, English from their msgids): accuracy and MB/s.

    python bench/bench_prepare_filters.py --work /tmp/bpf --output bench/results/prepare_filters.jsonl
"""
import argparse
import contextlib
import gettext
import glob
import json
import os
import random
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import append_json_lines, load_average  # noqa: E402
from tools import prepare_data  # noqa: E402
from tools.make_demo_corpus import iter_demo_documents  # noqa: E402
from tools.prep import neardup  # noqa: E402
from tools.prep.decontam import Decontaminator  # noqa: E402
from tools.prep.documents import CorpusReader  # noqa: E402
from tools.prep.language import LanguageFilter  # noqa: E402
from tools.prep.layouts import ReadOptions, find_sources  # noqa: E402
from tools.prep.quality import QualityFilter, parse_thresholds  # noqa: E402
from tools.prep.stages import document_text  # noqa: E402

BOILERPLATE = ("Copyright the authors of this page. All rights reserved. Licensed under the terms of the "
               "license that comes with the software. Report a bug. Show source. Navigation: index, modules, "
               "next, previous. Last updated on the first of the month. Created using the documentation tools.")
KINDS = ("words_1pct", "words_3pct", "words_5pct", "words_10pct", "words_20pct", "boilerplate", "reordered",
         "combined")


def changed(doc, share, rng, vocabulary):
    out = []
    for sentence in doc:
        words = sentence.split()
        for i in range(len(words)):
            if rng.random() < share:
                words[i] = rng.choice(vocabulary)
        out.append(" ".join(words))
    return out


def planted_copy(doc, kind, rng, vocabulary):
    if kind.startswith("words_"):
        return changed(doc, int(kind[6:-3]) / 100, rng, vocabulary)
    if kind == "boilerplate":
        return doc + [BOILERPLATE] if rng.random() < 0.5 else [BOILERPLATE] + doc
    if kind == "reordered":
        half = len(doc) // 2
        return doc[half:] + doc[:half]
    return planted_copy(planted_copy(changed(doc, 0.03, rng, vocabulary), "boilerplate", rng, vocabulary),
                        "reordered", rng, vocabulary)


def jaccard(a, b):
    a, b = set(neardup.shingles("\n".join(a))), set(neardup.shingles("\n".join(b)))
    return len(a & b) / max(len(a | b), 1)


def write_text(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write("\n".join(doc) + "\n\n")
    return path


def make_corpora(work, copies, seed, documents=None):
    """(base corpus path, planted corpus path, [(copy's document number, kind, original's number, jaccard)])."""
    base = [doc for doc in iter_demo_documents() if len(doc) >= 4][:documents]
    rng = random.Random(seed)
    vocabulary = sorted({w for doc in base for s in doc for w in s.split()})
    planted, info = list(base), []
    for kind in KINDS:
        for original in rng.sample(range(len(base)), min(copies, len(base))):
            copy = planted_copy(base[original], kind, rng, vocabulary)
            info.append((kind, original, jaccard(base[original], copy), copy))
    rng.shuffle(info)
    listed = []
    for kind, original, similarity, copy in info:
        listed.append((len(planted), kind, original, similarity))
        planted.append(copy)
    return (write_text(os.path.join(work, "base.txt"), base), write_text(os.path.join(work, "planted.txt"), planted),
            listed)


class DatasketchMinHash:
    """datasketch's MinHash behind rensa's interface (update(list of str), digest())."""

    def __init__(self, num_perm, seed):
        import datasketch
        self.m = datasketch.MinHash(num_perm=num_perm, seed=seed)

    def update(self, items):
        self.m.update_batch([s.encode("utf-8") for s in items])

    def digest(self):
        return self.m.hashvalues


def near_duplicates(path, folder, library, bands, rows):
    """Removed document numbers and seconds of the signature pass with `library`."""
    shutil.rmtree(folder, ignore_errors=True)    # (an earlier run's result would be read back)
    sig = neardup.SignaturePass(folder, seed=1, bands=bands, rows=rows)
    if library == "datasketch":
        sig.minhash = DatasketchMinHash
    c = time.process_time()
    removed = sig.run(CorpusReader(find_sources([path]), ReadOptions()))
    return set(removed.tolist()), time.process_time() - c


def recall_precision(work, base, planted, listed, libraries, configs):
    size = os.path.getsize(planted) / 1e6
    records = []
    for library, config in [(lib, c) for c in configs for lib in libraries]:
        bands, rows = map(int, config.split("x"))
        name = f"{library} {config}"
        try:
            base_removed, _ = near_duplicates(base, os.path.join(work, f"sig_base_{library}_{config}"), library,
                                              bands, rows)
        except ImportError:
            print(f"{library}: not installed, skipped")
            continue
        removed, seconds = near_duplicates(planted, os.path.join(work, f"sig_planted_{library}_{config}"), library,
                                           bands, rows)
        copies = {number for number, *_ in listed}
        found = removed & copies
        false = removed - copies - base_removed
        by_kind = {kind: round(sum(n in removed for n, k, *_ in listed if k == kind)
                               / max(sum(k == kind for _, k, *_ in listed), 1), 3) for kind in KINDS}
        buckets = [(0.0, 0.5), (0.5, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.01)]
        by_similarity = {}
        for low, high in buckets:
            inside = [n for n, _, _, j in listed if low <= j < high]
            if inside:
                by_similarity[f"{low:.1f}-{min(high, 1):.1f}"] = [round(sum(n in removed for n in inside)
                                                                        / len(inside), 3), len(inside)]
        record = {"bench": "near_dedup", "library": library, "bands": bands, "rows": rows,
                  "threshold": round((1 / bands) ** (1 / rows), 3), "planted": len(copies), "found": len(found),
                  "recall": round(len(found) / len(copies), 4),
                  "precision": round(len(found) / max(len(found) + len(false), 1), 4),
                  "false_positives": len(false), "base_corpus_near_duplicates": len(base_removed),
                  "recall_by_kind": by_kind, "recall_by_jaccard": by_similarity,
                  "signature_pass_mb_per_cpu_s": round(size / seconds, 2), "mb": round(size, 3)}
        records.append(record)
        print(f"{name} (threshold {record['threshold']}): recall {record['recall']:.3f} ({len(found)}/{len(copies)}), "
              f"precision {record['precision']:.3f} ({len(false)} false positives), {len(base_removed)} near duplicates "
              f"in the corpus itself; signature pass and marking {record['signature_pass_mb_per_cpu_s']} MB/s (CPU "
              "time, reading included)")
        print("  recall by kind: " + ", ".join(f"{k} {v:.2f}" for k, v in by_kind.items()))
        print("  recall by true Jaccard: " + ", ".join(f"{k}: {v[0]:.2f} of {v[1]}" for k, v in by_similarity.items()))
    return records


def quiet_prepare(argv):
    """tools.prepare_data in this process, its summary lines not printed."""
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        code = prepare_data.main(argv)
    assert code == 0, argv
    return code


def stage_costs(work, planted, rounds, eval_file):
    """prepare_data with each stage on and all off, alternating; and each stage alone."""
    common = ["--input", planted, "--format", "nvidia", "--max_seq_length", "128", "--max_predictions_per_seq", "20",
              "--workers", "1", "--overwrite"]
    vocab_run = os.path.join(work, "vocab_run")
    quiet_prepare(common + ["--output_dir", vocab_run, "--build_vocab", "8000", "--no_near_dedup"])
    vocab = ["--vocab_file", os.path.join(vocab_run, "vocab.txt")]
    configs = {"all off": ["--no_near_dedup"], "near_dedup": [],
               "decontaminate": ["--no_near_dedup", "--decontaminate", eval_file],
               "language": ["--no_near_dedup", "--languages", "en"],
               "quality": ["--no_near_dedup", "--quality_filter"],
               "all on": ["--decontaminate", eval_file, "--languages", "en", "--quality_filter"]}
    seconds = {name: [] for name in configs}      # CPU seconds of this process: one worker runs here
    wall = {name: [] for name in configs}
    kept = {}
    for _ in range(rounds):
        for name, flags in configs.items():
            out = os.path.join(work, "cost_" + name.replace(" ", "_"))
            t, c = time.perf_counter(), time.process_time()
            quiet_prepare(common + vocab + flags + ["--output_dir", out])
            seconds[name].append(time.process_time() - c)
            wall[name].append(time.perf_counter() - t)
            with open(os.path.join(out, "stats.json")) as f:
                kept[name] = json.load(f)["documents_kept"]
    size = os.path.getsize(planted) / 1e6
    off = statistics.median(seconds["all off"])
    records = []
    print(f"\nprepare_data on {size:.2f} MB (median of {rounds} alternating rounds, 1 worker, in this process):")
    print("| stages | CPU seconds | MB/s of CPU time | CPU time vs all off | wall seconds | documents kept |\n"
          "|---|---|---|---|---|---|")
    for name in configs:
        s = statistics.median(seconds[name])
        records.append({"bench": "stage_cost", "stages": name, "cpu_seconds": round(s, 3),
                        "mb_per_cpu_s": round(size / s, 3), "ratio_to_off": round(s / off, 3),
                        "wall_seconds": round(statistics.median(wall[name]), 3), "documents_kept": kept[name],
                        "cpu_rounds": [round(x, 3) for x in seconds[name]]})
        print(f"| {name} | {s:.2f} | {size / s:.2f} | {s / off:.2f}x | {statistics.median(wall[name]):.2f} | "
              f"{kept[name]} |")
    docs = [doc for doc, _ in CorpusReader(find_sources([planted]), ReadOptions()) if doc]
    text_mb = sum(len(document_text(d).encode()) for d in docs) / 1e6
    alone = {"decontaminate": Decontaminator([eval_file]), "language": LanguageFilter(["en"]),
             "quality": QualityFilter(parse_thresholds(None))}
    signing = neardup.SignaturePass(os.path.join(work, "sig_alone"), seed=1)
    alone["near_dedup signature pass"] = lambda set_name, number, doc, text: signing.sign(doc)
    print("\neach stage alone over the documents, read already (no pipeline; CPU time):")
    for name, stage in alone.items():
        c = time.process_time()
        for number, doc in enumerate(docs):
            stage("train", number, doc, document_text(doc))
        s = time.process_time() - c
        records.append({"bench": "stage_alone", "stage": name, "text_mb_per_cpu_s": round(text_mb / s, 2)})
        print(f"  {name}: {text_mb / s:.2f} MB/s of text")
    return records


def gettext_sentences(languages, per_language, seed):
    """Held-out sentences per language: translated messages of the system's gettext catalogues."""
    rng = random.Random(seed)
    samples = {code: [] for code in languages}
    for code in languages[1:]:
        for path in sorted(glob.glob(f"/usr/share/locale/{code}/LC_MESSAGES/*.mo")):
            try:
                with open(path, "rb") as f:
                    catalogue = gettext.GNUTranslations(f)._catalog
            except (OSError, UnicodeDecodeError, ValueError):   # (a catalogue in another encoding)
                continue
            for msgid, msgstr in catalogue.items():
                if isinstance(msgid, str) and isinstance(msgstr, str) and "%" not in msgstr \
                        and len(msgstr.split()) >= 8:
                    samples[code].append(msgstr.strip())
                    if code == "de" and len(msgid.split()) >= 8 and "%" not in msgid:
                        samples["en"].append(msgid.strip())
    for code in languages:
        unique = sorted(set(samples[code]))
        rng.shuffle(unique)
        samples[code] = unique[:per_language]
    return {code: s for code, s in samples.items() if s}


def language_id(per_language, seed):
    languages = ["en", "de", "fr", "es", "it", "pt", "nl", "pl", "ru", "sv", "cs", "tr", "fi", "hu", "da", "uk"]
    samples = gettext_sentences(languages, per_language, seed)
    if len(samples) < 2:
        print("\nlanguage ID: no gettext catalogues in /usr/share/locale, skipped")
        return []
    candidates = {"py3langid": lambda: LanguageFilter(["en"]).identifier.classify}
    try:
        import lingua
        codes = [getattr(lingua.IsoCode639_1, c.upper()) for c in languages]
        candidates["lingua (16 languages)"] = lambda: (lambda detector: (
            lambda s: (detector.detect_language_of(s).iso_code_639_1.name.lower(),)))(
            lingua.LanguageDetectorBuilder.from_iso_codes_639_1(*codes).build())
    except ImportError:
        print("lingua not installed (pip install lingua-language-detector): skipped")
    records = []
    n = sum(map(len, samples.values()))
    print(f"\nlanguage ID on {n} held-out sentences of {len(samples)} languages (gettext catalogues):")
    for name, make in candidates.items():
        classify = make()
        classify(samples["en"][0])          # load the models before timing
        c = time.process_time()
        right = sum(classify(s)[0] == code for code, ss in samples.items() for s in ss)
        s = time.process_time() - c
        mb = sum(len(x.encode()) for ss in samples.values() for x in ss) / 1e6
        records.append({"bench": "language_id", "model": name, "accuracy": round(right / n, 4), "sentences": n,
                        "mb_per_cpu_s": round(mb / s, 3)})
        print(f"  {name}: accuracy {right / n:.3f}, {mb / s:.2f} MB/s (CPU time)")
    return records


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", required=True, help="folder for the corpora and outputs")
    p.add_argument("--copies", type=int, default=40, help="planted near duplicates per kind")
    p.add_argument("--documents", type=int, default=None, help="the demo corpus's first N documents (default: all)")
    p.add_argument("--libraries", nargs="+", default=["rensa", "datasketch"], choices=["rensa", "datasketch"])
    p.add_argument("--configs", nargs="+", default=["14x8", "20x13", "20x5"],
                   help="LSH bands x rows: datatrove's/FineWeb's (the pipeline's), NeMo's, a looser one")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of the cost runs (0: none)")
    p.add_argument("--per_language", type=int, default=200, help="language ID: sentences per language (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="append JSON lines here")
    args = p.parse_args(argv)
    start = load_average()
    os.makedirs(args.work, exist_ok=True)
    base, planted, listed = make_corpora(args.work, args.copies, args.seed, args.documents)
    print(f"{len(listed)} planted near duplicates ({args.copies} per kind) in {os.path.getsize(planted) / 1e6:.2f} MB")
    records = recall_precision(args.work, base, planted, listed, args.libraries, args.configs)
    if args.rounds:
        # the evaluation set: the planted corpus's own held-out documents (as the demo decontaminates)
        held = os.path.join(args.work, "held")
        quiet_prepare(["--input", planted, "--output_dir", held, "--build_vocab", "2000", "--validation_fraction",
                           "0.05", "--no_near_dedup", "--overwrite", "--max_seq_length", "64", "--dupe_factor", "1"])
        records += stage_costs(args.work, planted, args.rounds, os.path.join(held, "heldout.jsonl"))
    if args.per_language:
        records += language_id(args.per_language, args.seed)
    end = load_average()
    for record in records:
        record["loadavg_start"], record["loadavg_end"] = start, end
    append_json_lines(args.output, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())

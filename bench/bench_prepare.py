"""Corpora in: tools/prepare_data.py's speed and memory per input layout, resuming, and the sentence splitters.

Owns nothing used in training. In `--work` it generates one corpus of about `--mb` MB of text
(testkit/corpora.py's documents over a Zipf vocabulary of 30,000 made-up words, so the
tokenizer meets new words as in real text) and writes it in each layout of `--layouts`
(a MediaWiki export with its markup, WikiExtractor files, JSON lines, parquet, a save_to_disk
folder, one-sentence-per-line text, one-document-per-line text). Then:

1. Per layout and `--workers` count: `python -m tools.prepare_data` in a subprocess (NVIDIA
   format, seq 128, dupe factor 5, the README's settings, one vocab for all), reporting MB/s
   of raw text (the documents' text, not the markup or JSON around it) over the run's time,
   MB/s of input as stored, and peak RSS of the main process and of the largest worker (from
   stats.json, the processes' own getrusage).
2. `--resume LAYOUT`: the same run killed with SIGKILL halfway (by time), then the same
   command again: its time against the uninterrupted run's, and whether the shards are
   byte-identical.
3. `--splitters`: each candidate sentence splitter's sentences/s per core (CPU time, one call
   per paragraph as the pipeline calls it) and its agreement with bench/data/sentences_gold.txt
   (84 sentences labelled by hand, 28 passages: boundary F1 and exact sentences); wikitext
   reduction MB/s (tools/prep/sentences.py against mwparserfromhell's strip_code alone) and bz2
   decompression MB/s, for a projection to a Wikipedia dump. The other candidates are not in
   any requirements file: `pip install pysbd syntok spacy` first (a missing one is skipped).
4. `--scaling`: per layout, `--filter_sets` and `--formats`, the same run at each `--workers`
   count one after the other: the speed-up over the first count (wall clock: run it on a quiet
   machine), MB of text per CPU second of all the run's processes (MB/s per core) and where the
   CPU went (main process, reader process, workers, and of those the reader's stage workers); a
   markdown table on stdout. `--pin` runs each run on its first N cores for `--workers N` (the
   speed-up per core: everything the run does on those cores).
5. `--long_document_mb N`: the corpus with one more document of N MB of text first (a book, or a
   corpus without document breaks, in one record), per layout at the largest `--workers`: the
   peak RSS of the largest process, which the cut at --chunk_size_mb keeps bounded.

    python bench/bench_prepare.py --work /tmp/bp --mb 20 --workers 1 2 --splitters
    python bench/bench_prepare.py --work /tmp/bp --mb 2 --long_document_mb 40 --layouts jsonl --workers 2
    python bench/bench_prepare.py --work /tmp/bp --mb 200 --scaling --layouts jsonl mediawiki text \
        --filter_sets exact_dedup no_filter min_words near_dedup quality --formats nvidia bing --workers 1 2
    nice python bench/bench_prepare.py --work /tmp/bp --mb 200 --layouts jsonl --workers 1 2 --resume jsonl \
        --output bench/results/prepare.jsonl
"""
import argparse
import bz2
import datetime
import hashlib
import itertools
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import append_json_lines, load_average  # noqa: E402
from testkit import corpora as files  # noqa: E402
from tools.prep import CorpusError  # noqa: E402
from tools.prep.layouts import ReadOptions, find_sources  # noqa: E402
from tools.prep.reader import PROCESS_NAME  # noqa: E402
from tools.prep.sentences import SPLITTERS, SentenceSplitter, wikitext_to_text  # noqa: E402

logger = logging.getLogger("bench_prepare")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLD = os.path.join(REPO, "bench", "data", "sentences_gold.txt")
ALL_LAYOUTS = ("jsonl", "parquet", "hf", "wikiextractor", "mediawiki", "text", "text_docs")
READER_NAME = PROCESS_NAME.decode()
# --scaling's filter sets: the flags each adds to the run (the default: one copy of each document, near
# duplicates removed).
FILTER_SETS = {"exact_dedup": ["--no_near_dedup"], "no_filter": ["--keep_duplicates", "--no_near_dedup"],
               "min_words": ["--min_document_words", "50", "--no_near_dedup"], "near_dedup": [],
               "quality": ["--no_near_dedup", "--quality_filter"],
               # the same, its rules run in the reader process (as before --stage_workers): the baseline
               "quality_in_reader": ["--no_near_dedup", "--quality_filter", "--stage_workers", "0"]}


# the most frequent words first: with them the text passes Gopher's stop-word rule (two of "the", "be",
# "to", "of", "and", "that", "have", "with"), which random letter strings alone fail in every document
COMMON_WORDS = ["the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "with", "as", "was", "on", "be", "have"]


class ZipfDocuments:
    """Documents of ~`mb` MB of text over a Zipf vocabulary (picklable, so `datasets` can call it)."""

    def __init__(self, mb, seed=0, vocabulary=30000):
        self.mb, self.seed, self.vocabulary = mb, seed, vocabulary

    def __call__(self):
        rng = random.Random(self.seed)
        letters = "etaoinshrdlcumwfgypbvkjxqz"
        words = ["".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(self.vocabulary)]
        words[:len(COMMON_WORDS)] = COMMON_WORDS    # English's most frequent words lead, as in real text
        weights = list(itertools.accumulate(1 / (i + 1) for i in range(self.vocabulary)))
        target, size, d = self.mb * 1e6, 0, 0
        while size < target:
            doc = []
            for _ in range(rng.randint(2, 6)):
                sentences = []
                for _ in range(rng.randint(2, 7)):
                    ws = rng.choices(words, cum_weights=weights, k=rng.randint(5, 25))
                    sentences.append(" ".join(ws).capitalize() + rng.choice("....?!"))
                doc.append(" ".join(sentences))
            size += sum(map(len, doc)) + len(doc)
            d += 1
            yield f"Article {d}", doc


class WithLongDocument:
    """ZipfDocuments(mb) after one document of `long_mb` MB of text, made of other documents' paragraphs."""

    def __init__(self, mb, long_mb):
        self.mb, self.long_mb = mb, long_mb

    def __call__(self):
        yield "Long", [p for _, doc in ZipfDocuments(self.long_mb, seed=1)() for p in doc]
        yield from ZipfDocuments(self.mb)()


def write_corpus(layout, folder, make):
    """Write the documents of `make()` in `layout` under `folder`; returns the --input path."""
    os.makedirs(folder, exist_ok=True)
    if layout == "jsonl":
        return files.write_jsonl(os.path.join(folder, "corpus.jsonl"), make())
    if layout == "parquet":
        return files.write_parquet(os.path.join(folder, "corpus.parquet"), make(), rows_per_group=2048)
    if layout == "hf":
        return files.write_hf(os.path.join(folder, "saved"), make)
    if layout == "wikiextractor":
        return files.write_wikiextractor(os.path.join(folder, "extracted"), make(), per_file=2000)
    if layout == "mediawiki":
        return files.write_mediawiki(os.path.join(folder, "enwiki-pages-articles.xml"), make())
    if layout == "text":
        split = SentenceSplitter()
        return files.write_text(os.path.join(folder, "corpus.txt"), make(), split)
    if layout == "text_docs":
        return files.write_text_docs(os.path.join(folder, "corpus_docs.txt"), make())
    raise ValueError(layout)


def input_size(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(path) for n in ns)
    return os.path.getsize(path)


def prepare_cmd(path, layout, out, vocab, workers, fmt="nvidia"):
    cmd = [sys.executable, "-m", "tools.prepare_data", "--input", path, "--output_dir", out, "--vocab_file", vocab,
           "--format", fmt, "--max_seq_length", "128", "--max_predictions_per_seq", "20", "--dupe_factor", "5",
           "--workers", str(workers), "--overwrite"]
    return cmd + (["--input_format", "text_docs"] if layout == "text_docs" else [])


def run_prepare(cmd, out, cores=None):
    """Run one prepare_data command, on its first `cores` cores only where given (taskset's way);
    (its stats.json, wall seconds, peak RSS MB of the process tree summed, peak RSS MB of its
    largest process, CPU seconds of the main process, the reader, its stage workers and the
    workers), sampled every 0.1 s from /proc (getrusage's ru_maxrss would count this bench
    process's own size, which a forked child inherits)."""
    import psutil

    start = time.perf_counter()
    pin = None if cores is None else (lambda: os.sched_setaffinity(0, range(cores)))
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=pin)
    root = psutil.Process(proc.pid)
    peak_sum = peak_one = 0
    cpu = {}                                   # pid -> last CPU seconds seen
    readers = set()                            # the pid of the reader process (tools/prep/reader.py)
    parents = {}                               # pid -> parent pid: the reader's children are its stage workers
    main_thread = 0.0                          # of those, the main process's main thread
    while proc.poll() is None:
        rss = []
        for p in [root] + _children(root):
            try:
                rss.append(p.memory_info().rss)
                times = p.cpu_times()
                cpu[p.pid] = times.user + times.system
                parents[p.pid] = p.ppid()
                if p.name() == READER_NAME:
                    readers.add(p.pid)
                if p.pid == proc.pid:
                    main_thread = sum(t.user_time + t.system_time for t in p.threads() if t.id == p.pid)
            except psutil.Error:
                pass
        peak_sum, peak_one = max(peak_sum, sum(rss)), max([peak_one] + rss)
        time.sleep(0.1)
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(err[-3000:])
    with open(os.path.join(out, "stats.json")) as f:
        stats = json.load(f)
    main_cpu = cpu.pop(proc.pid, 0.0)
    reader_cpu = sum(cpu.pop(pid, 0.0) for pid in readers)
    stage_cpu = sum(seconds for pid, seconds in cpu.items() if parents.get(pid) in readers)
    stats["cpu"] = {"main_s": round(main_cpu, 1), "main_thread_s": round(main_thread, 1),
                    "reader_s": round(reader_cpu, 1), "stage_workers_s": round(stage_cpu, 1),
                    "workers_s": round(sum(cpu.values()), 1),
                    "busiest_worker_s": round(max(cpu.values(), default=0.0), 1)}
    return stats, wall, peak_sum / 2**20, peak_one / 2**20


def _children(root):
    import psutil

    try:
        return root.children(recursive=True)
    except psutil.Error:
        return []


def shard_digest(out):
    h = hashlib.sha256()
    for name in sorted(os.listdir(os.path.join(out, "train"))):
        with open(os.path.join(out, "train", name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def bench_layouts(args, make, text_bytes, vocab):
    records, inputs = [], {}
    for layout in args.layouts:
        t0 = time.perf_counter()
        inputs[layout] = write_corpus(layout, os.path.join(args.work, f"in_{layout}_{args.mb}"), make)
        logger.info("%s: wrote %.0f MB in %.0f s", layout, input_size(inputs[layout]) / 1e6, time.perf_counter() - t0)
        for workers in args.workers:
            out = os.path.join(args.work, f"out_{layout}_{workers}")
            stats, wall, peak_sum, peak_one = run_prepare(prepare_cmd(inputs[layout], layout, out, vocab, workers), out)
            seconds = stats["seconds"]       # the pipeline, after the tokenizer set-up (setup_seconds)
            rec = {"layout": layout, "workers": workers, "text_mb": round(text_bytes / 1e6, 1),
                   "input_mb": round(stats["input_bytes"] / 1e6, 1), "seconds": round(seconds, 1),
                   "setup_seconds": round(stats["setup_seconds"], 1), "wall_seconds": round(wall, 1),
                   "text_mb_per_s": round(text_bytes / 1e6 / seconds, 3),
                   "input_mb_per_s": round(stats["input_bytes"] / 1e6 / seconds, 3),
                   "peak_rss_mb_all_processes": round(peak_sum), "peak_rss_mb_largest_process": round(peak_one),
                   "main_cpu_s": stats["cpu"]["main_s"], "main_thread_cpu_s": stats["cpu"]["main_thread_s"],
                   "workers_cpu_s": stats["cpu"]["workers_s"],
                   "documents": stats["documents_kept"], "sentences": stats["sentences"],
                   "sequences": stats["sequences"]}
            logger.info("%s", rec)
            records.append(rec)
            if layout != args.resume:
                shutil.rmtree(out)
    return records, inputs


def bench_scaling(args, make, text_bytes, vocab):
    """Per layout, filter set and format: the same run at each --workers count, one after the
    other; wall-clock speed-up over the first count, and MB of text per CPU second of all the
    run's processes (MB/s per core, which a busy machine does not change much), with where the
    CPU went (main process, reader, workers). A table on stdout."""
    records = []
    for layout in args.layouts:
        folder = os.path.join(args.work, f"in_{layout}_{args.mb}")
        names = [n for n in os.listdir(folder) if not n.endswith(".cache")] if os.path.isdir(folder) else []
        path = os.path.join(folder, names[0]) if names else write_corpus(layout, folder, make)
        for filters in args.filter_sets:
            for fmt in args.formats:
                base = base_bound = None
                for workers in args.workers:
                    out = os.path.join(args.work, f"scaling_{layout}_{workers}")
                    cmd = prepare_cmd(path, layout, out, vocab, workers, fmt) + FILTER_SETS[filters]
                    pinned = min(workers, os.cpu_count() or 1) if args.pin else None
                    cores = pinned or os.cpu_count() or 1
                    stats, wall, _, peak_one = run_prepare(cmd, out, pinned)
                    cpu = stats["cpu"]
                    total = cpu["main_s"] + cpu["reader_s"] + cpu["workers_s"]
                    seconds = stats["seconds"]
                    base = base or seconds
                    # On free cores a run takes at least its busiest process's CPU time and its
                    # pipeline's CPU time shared over the cores (the main process's set-up, before
                    # the pipeline, taken off): a speed-up a busy machine's wall clock cannot show.
                    main = stats["main_cpu_seconds"]
                    setup = max(cpu["main_s"] - main, 0.0)
                    bound = max(cpu["busiest_worker_s"], cpu["reader_s"], main, (total - setup) / cores)
                    base_bound = base_bound or bound
                    rec = {"scaling_layout": layout, "filters": filters, "format": fmt, "workers": workers,
                           "cores": cores, "pinned": args.pin,
                           "text_mb": round(text_bytes / 1e6, 1), "seconds": round(seconds, 1),
                           "text_mb_per_s": round(text_bytes / 1e6 / seconds, 2),
                           "speedup": round(base / seconds, 2), "cpu_bound_s": round(bound, 1),
                           "cpu_bound_speedup": round(base_bound / bound, 2), "cpu_s": round(total, 1),
                           "text_mb_per_cpu_s": round(text_bytes / 1e6 / total, 2),
                           "main_cpu_s": cpu["main_s"], "main_pipeline_cpu_s": round(main, 2),
                           "reader_cpu_s": cpu["reader_s"], "stage_workers_cpu_s": cpu["stage_workers_s"],
                           "workers_cpu_s": cpu["workers_s"], "busiest_worker_cpu_s": cpu["busiest_worker_s"],
                           "peak_rss_mb_largest_process": round(peak_one), "load_average_at_run": load_average()}
                    logger.info("%s", rec)
                    records.append(rec)
                    shutil.rmtree(out)
    print("| layout | filters | format | workers | cores | s | MB/s of text | speed-up | CPU-bound speed-up "
          "| MB per CPU s (per core) | CPU s: main (pipeline) / reader / workers, of them stage workers (busiest) "
          "| load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in records:
        print(f"| {r['scaling_layout']} | {r['filters']} | {r['format']} | {r['workers']} | {r['cores']} | {r['seconds']} "
              f"| {r['text_mb_per_s']} | {r['speedup']}x | {r['cpu_bound_speedup']}x | {r['text_mb_per_cpu_s']} | "
              f"{r['main_cpu_s']} ({r['main_pipeline_cpu_s']}) / "
              f"{r['reader_cpu_s']} / {r['workers_cpu_s']}, {r['stage_workers_cpu_s']} ({r['busiest_worker_cpu_s']}) | {r['load_average_at_run']} |")
    return records


def bench_long_document(args, vocab):
    """Peak memory with one document of --long_document_mb MB in the corpus, per layout."""
    records = []
    for layout in args.layouts:
        path = write_corpus(layout, os.path.join(args.work, f"in_long_{layout}_{args.long_document_mb}"),
                            WithLongDocument(args.mb, args.long_document_mb))
        out = os.path.join(args.work, f"out_long_{layout}")
        workers = max(args.workers)
        stats, wall, peak_sum, peak_one = run_prepare(prepare_cmd(path, layout, out, vocab, workers), out)
        rec = {"layout": layout, "workers": workers, "long_document_mb": args.long_document_mb,
               "other_text_mb": args.mb, "input_mb": round(stats["input_bytes"] / 1e6, 1),
               "seconds": round(stats["seconds"], 1), "wall_seconds": round(wall, 1),
               "peak_rss_mb_all_processes": round(peak_sum), "peak_rss_mb_largest_process": round(peak_one),
               "documents_read": stats["documents_read"], "sequences": stats["sequences"]}
        logger.info("%s", rec)
        records.append(rec)
        shutil.rmtree(out)
    return records


def bench_reading(args, make, text_bytes):
    """The main process's share per layout: reading the input, the duplicate filter and the
    chunking, in this process (CPU seconds): what bounds the speed-up from more workers."""
    from tools.prep.documents import CorpusReader
    from tools.prep.filters import DocumentFilter, iter_chunks

    records = []
    for layout in args.layouts:
        folder = os.path.join(args.work, f"in_{layout}_{args.mb}")
        names = [n for n in os.listdir(folder) if not n.endswith(".cache")] if os.path.isdir(folder) else []
        path = os.path.join(folder, names[0]) if names else write_corpus(layout, folder, make)
        sources = find_sources([path], "text_docs" if layout == "text_docs" else None)
        t0 = time.process_time()
        chunks = sum(1 for _ in iter_chunks(CorpusReader(sources, ReadOptions()), 2**18, 0.0,
                                            DocumentFilter()))
        cpu = time.process_time() - t0
        rec = {"reading_layout": layout, "text_mb": round(text_bytes / 1e6, 1), "chunks": chunks,
               "main_cpu_s": round(cpu, 2), "main_text_mb_per_cpu_s": round(text_bytes / 1e6 / cpu, 2)}
        logger.info("%s", rec)
        records.append(rec)
    return records


def bench_resume(args, path, layout, vocab, ref):
    """Kill the run with SIGKILL halfway through its pipeline (by the uninterrupted run `ref`'s
    time), run it again, compare time and CPU seconds (CPU: robust to a busy machine)."""
    uninterrupted, kill_at = ref["wall_seconds"], ref["wall_seconds"] - ref["seconds"] / 2
    workers = max(args.workers)
    reference = os.path.join(args.work, f"out_{layout}_{workers}")
    out = os.path.join(args.work, f"resume_{layout}")
    shutil.rmtree(out, ignore_errors=True)
    cmd = prepare_cmd(path, layout, out, vocab, workers)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    time.sleep(kill_at)
    os.killpg(proc.pid, signal.SIGKILL)       # the main process and its workers, as a lost machine
    proc.wait()
    chunks = os.path.join(out, ".prepare_data.work", "chunks")
    done = len(os.listdir(chunks)) if os.path.isdir(chunks) else 0
    stats, wall, _, _ = run_prepare(cmd, out)
    cpu = stats["cpu"]["main_s"] + stats["cpu"]["workers_s"]
    ref_cpu = ref["main_cpu_s"] + ref["workers_cpu_s"]
    rec = {"resume_layout": layout, "workers": workers, "killed_after_s": round(kill_at, 1),
           "chunks_done_at_kill": done, "reused_chunks": stats["reused_chunks"],
           "reused_input_mb": round(stats["reused_input_bytes"] / 1e6, 1),
           "uninterrupted_s": round(uninterrupted, 1), "resumed_run_s": round(wall, 1),
           "saved_s": round(uninterrupted - wall, 1), "uninterrupted_cpu_s": round(ref_cpu, 1),
           "resumed_run_cpu_s": round(cpu, 1), "saved_cpu_share": round(1 - cpu / ref_cpu, 3),
           "identical": shard_digest(out) == shard_digest(reference)}
    logger.info("%s", rec)
    shutil.rmtree(out)
    shutil.rmtree(reference)
    return [rec]


def gold_passages():
    with open(GOLD, encoding="utf-8") as f:
        return [p.split("\n") for p in f.read().strip().split("\n\n")]


def agreement(split, passages):
    """Boundary F1 (sentence ends as counts of non-space characters) and exact sentences."""
    def ends(sentences):
        out, n = set(), 0
        for s in sentences:
            n += len("".join(s.split()))
            out.add(n)
        return out

    tp = fp = fn = exact = 0
    for gold in passages:
        got = split(" ".join(gold))
        g, o = ends(gold), ends(got)
        tp, fp, fn = tp + len(g & o), fp + len(o - g), fn + len(g - o)
        exact += sum(1 for s in got if s in gold)
    return 2 * tp / (2 * tp + fp + fn), exact


def bench_splitters(make):
    passages = gold_passages()
    paragraphs = [p for _, doc in itertools.islice(make(), 400) for p in doc]
    real = [" ".join(p) for p in passages] * 20
    records = []
    for name in SPLITTERS:
        try:
            split = SentenceSplitter(name)
            split("Warm up. Now.")
        except CorpusError as e:
            logger.warning("%s: %s", name, e)
            continue
        f1, exact = agreement(split, passages)
        rec = {"splitter": name, "boundary_f1": round(f1, 4), "exact": exact,
               "gold_sentences": sum(map(len, passages))}
        for label, texts in (("generated", paragraphs), ("gold_text", real)):
            t0 = time.process_time()
            n = sum(len(split(t)) for t in texts)
            cpu = time.process_time() - t0
            rec[f"{label}_sentences_per_s"] = round(n / cpu)
            rec[f"{label}_mb_per_s"] = round(sum(map(len, texts)) / 1e6 / cpu, 3)
        logger.info("%s", rec)
        records.append(rec)
    return records


def bench_wikitext(make):
    import mwparserfromhell

    docs = list(itertools.islice(make(), 300))
    pages = [files.wikitext(i, doc) for i, (_, doc) in enumerate(docs)]
    size = sum(map(len, pages)) / 1e6
    rec = {"wikitext_mb": round(size, 2)}
    for label, fn in (("ours", wikitext_to_text),
                      ("strip_code_only", lambda t: mwparserfromhell.parse(t).strip_code())):
        t0 = time.process_time()
        for page in pages:
            fn(page)
        rec[f"{label}_mb_per_s"] = round(size / (time.process_time() - t0), 3)
    blob = "".join(pages).encode() * 4
    packed = bz2.compress(blob, 9)
    t0 = time.process_time()
    bz2.decompress(packed)
    rec["bz2_decompress_mb_per_s"] = round(len(blob) / 1e6 / (time.process_time() - t0), 1)
    logger.info("%s", rec)
    return [rec]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", required=True, help="folder for the generated corpora and the outputs")
    p.add_argument("--mb", type=float, default=200, help="MB of text in the generated corpus")
    p.add_argument("--layouts", nargs="*", default=list(ALL_LAYOUTS), choices=ALL_LAYOUTS)
    p.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    p.add_argument("--resume", default=None, choices=ALL_LAYOUTS, help="also kill and resume this layout's run")
    p.add_argument("--splitters", action="store_true", help="also the splitter and wikitext measurements")
    p.add_argument("--reading", action="store_true",
                   help="only the main process's reading and filtering per layout (no prepare_data runs)")
    p.add_argument("--scaling", action="store_true",
                   help="only the runs of each layout, --filter_sets and --formats at each --workers count, "
                        "one after the other: speed-up and MB per CPU second, a table on stdout")
    p.add_argument("--pin", action="store_true",
                   help="--scaling: run each run on its first --workers cores only (N workers on N cores: the "
                        "speed-up per core, with the reader and the stage workers on those cores too)")
    p.add_argument("--filter_sets", nargs="+", default=["exact_dedup"], choices=list(FILTER_SETS))
    p.add_argument("--formats", nargs="+", default=["nvidia"], choices=["nvidia", "bing"])
    p.add_argument("--long_document_mb", type=float, default=None,
                   help="only the peak memory with one more document of this many MB of text, per layout")
    p.add_argument("--vocab_mb", type=float, default=10, help="MB of generated text the bench's vocab is trained on")
    p.add_argument("--output", default=None, help="append JSON lines here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    os.makedirs(args.work, exist_ok=True)
    make = ZipfDocuments(args.mb)
    text_bytes = sum(sum(map(len, doc)) for _, doc in make())
    vocab = os.path.join(args.work, "vocab.txt")
    if not os.path.exists(vocab):
        from tools.prep.vocab import train_vocab

        sample = os.path.join(args.work, "vocab_sample.txt")
        with open(sample, "w", encoding="utf-8") as f:
            for _, doc in ZipfDocuments(args.vocab_mb)():
                f.write("\n".join(doc) + "\n\n")
        train_vocab([sample], 16000, True, vocab)
    common = {"date": datetime.datetime.now().isoformat(timespec="minutes"), "cpus": os.cpu_count(),
              "load_average": load_average(), "bench": "prepare"}
    records = []
    if args.reading:
        records += bench_reading(args, make, text_bytes)
        args.layouts = []
    if args.scaling:
        records += bench_scaling(args, make, text_bytes, vocab)
        args.layouts = []
    if args.long_document_mb:
        records += bench_long_document(args, vocab)
        args.layouts = []
    if args.splitters:
        records += bench_splitters(ZipfDocuments(5)) + bench_wikitext(ZipfDocuments(5))
    if args.layouts:
        layout_records, inputs = bench_layouts(args, make, text_bytes, vocab)
        records += layout_records
        if args.resume:
            ref = [r for r in layout_records if r["layout"] == args.resume and r["workers"] == max(args.workers)]
            records += bench_resume(args, inputs[args.resume], args.resume, vocab, ref[0])
    for rec in records:
        rec.update(common, load_average_end=load_average())
    append_json_lines(args.output, records)


if __name__ == "__main__":
    main()

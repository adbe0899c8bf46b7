"""What a run counted: per set (SetStats, summed over the workers' chunks) and in all (Summary,
what `prepare` returns): OUT/stats.json and the lines the command line ends with."""
import json
import os
import resource
import sys
from dataclasses import dataclass, field


@dataclass
class SetStats:
    """Counts for one of the two sets (training, validation)."""
    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    unk_tokens: int = 0
    sequences: int = 0
    too_short: int = 0              # documents under --min_document_words, dropped
    shard_sizes: list = field(default_factory=list)

    COUNTS = ("documents", "sentences", "tokens", "unk_tokens", "sequences", "too_short")


@dataclass
class Summary:
    """What `prepare` did; printed at the end of the command line."""
    output_dir: str
    fmt: str
    input_bytes: int = 0
    seconds: float = 0.0            # reading, tokenizing, building and writing the shards
    setup_seconds: float = 0.0      # vocab training and tokenizer set-up before that
    main_cpu_seconds: float = 0.0   # CPU time of the main process (which only coordinates) in `seconds`
    peak_mb: float = 0.0            # peak resident memory of the main process
    peak_worker_mb: float = 0.0     # and of the largest pool worker (0: no pool)
    sets: dict = field(default_factory=dict)
    read: dict = field(default_factory=dict)     # documents read, duplicates, other parts, bad records, ...
    reused_chunks: int = 0          # chunks an interrupted run had finished, reused
    reused_bytes: int = 0           # and the input bytes they cover
    part: str = ""                  # "K of N" with --num_parts
    tokenizer: dict = field(default_factory=dict)   # which one made the shards (Tokenizer.record())

    def stats(self):
        """What OUT/stats.json holds."""
        sets = {name: {k: getattr(s, k) for k in SetStats.COUNTS} | {"shard_sizes": s.shard_sizes}
                for name, s in self.sets.items()}
        tokens = sum(s.tokens for s in self.sets.values())
        unk = sum(s.unk_tokens for s in self.sets.values())
        kept = sum(s.documents for s in self.sets.values())
        return {"output_dir": self.output_dir, "format": self.fmt, "part": self.part or None,
                "input_bytes": self.input_bytes, **self.read, "documents_kept": kept,
                "too_short": sum(s.too_short for s in self.sets.values()),
                "sentences": sum(s.sentences for s in self.sets.values()), "tokens": tokens,
                "unk_tokens": unk, "unk_rate": unk / max(tokens, 1), "sequences": self.sequences,
                "sets": sets, "seconds": round(self.seconds, 3), "setup_seconds": round(self.setup_seconds, 3),
                "main_cpu_seconds": round(self.main_cpu_seconds, 3),
                "mb_per_s": self.input_bytes / 1e6 / max(self.seconds, 1e-9),
                "reused_chunks": self.reused_chunks, "reused_input_bytes": self.reused_bytes,
                "peak_mb": round(self.peak_mb, 1), "peak_worker_mb": round(self.peak_worker_mb, 1),
                "tokenizer": self.tokenizer}

    @property
    def sequences(self):
        return sum(s.sequences for s in self.sets.values())

    def lines(self):
        part = f" (part {self.part})" if self.part else ""
        out = [f"prepared {self.fmt} shards in {self.output_dir}{part} from {self.input_bytes / 1e6:.2f} MB of input"]
        if self.tokenizer:
            t = self.tokenizer
            out.append(f"  tokenizer: {t['name']} ({t['kind']}, {t['vocab_size']} ids, sha256 {t['sha256'][:12]})")
        r = self.read
        if r:
            too_short = sum(s.too_short for s in self.sets.values())
            extra = [f"{r['duplicates']} exact duplicates", f"{too_short} under --min_document_words"]
            extra += [f"{r[k]} {what}" for k, what in (("bad_records", "bad records skipped"),
                                                        ("redirects", "redirects"),
                                                        ("other_pages", "non-article pages"),
                                                        ("other_parts", "in other parts")) if r.get(k)]
            out.append(f"  input: {r['documents_read']} documents read ({', '.join(r['layouts'])}), "
                       f"{', '.join(extra)} left out")
            if r.get("filters"):
                out.append("  filters: " + "; ".join(_stage_line(name, f) for name, f in r["filters"].items()))
        for name, s in self.sets.items():
            unk = s.unk_tokens / max(s.tokens, 1)
            sizes = s.shard_sizes
            per_shard = (", ".join(map(str, sizes)) if len(sizes) <= 8 else  # all of them are in stats.json
                         f"{min(sizes)} to {max(sizes)} over {len(sizes)} shards (each in stats.json)")
            out.append(f"  {name}: {s.documents} documents, {s.sentences} sentences, {s.tokens} tokens "
                       f"({unk:.2%} [UNK]), {s.sequences} sequences; per shard: {per_shard}")
        rate = self.sequences / max(self.seconds, 1e-9)
        mb_s = self.input_bytes / 1e6 / max(self.seconds, 1e-9)
        out.append(f"  time: {self.seconds:.2f} s ({rate:,.0f} sequences/s, {mb_s:.2f} MB/s of input) after "
                   f"{self.setup_seconds:.2f} s of vocab/tokenizer set-up")
        if self.reused_chunks:
            out.append(f"  reused {self.reused_chunks} chunks ({self.reused_bytes / 1e6:.2f} MB of input) "
                       "an interrupted run had finished")
        out.append(f"  peak memory: {self.peak_mb:.0f} MB (largest worker {self.peak_worker_mb:.0f} MB)"
                   if self.peak_worker_mb else f"  peak memory: {self.peak_mb:.0f} MB")
        return out


def _stage_line(name, stage):
    """`quality 12 (min_words 9, max_top_2gram 3)`: a stage's documents removed (or cut), by rule."""
    removed = stage["removed"]
    rules = ", ".join(f"{rule} {n}" for rule, n in removed.items() if n)
    return (f"{name} {sum(removed.values())}{' cut' if stage.get('action') == 'cut' else ''}"
            + (f" ({rules})" if rules and len(removed) > 1 else ""))


def write_stats(summary, tmp, out, name):
    """OUT/NAME (stats.json), whole or not at all."""
    with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
        json.dump(summary.stats(), f, indent=1)
    os.replace(os.path.join(tmp, name), os.path.join(out, name))


def peak_rss_mb(who):
    """Peak resident set size in MB (ru_maxrss is KB on Linux, bytes on macOS)."""
    peak = resource.getrusage(who).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)

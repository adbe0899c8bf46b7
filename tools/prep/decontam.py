"""Decontamination (--decontaminate FILE...): training documents that share a long n-gram with an
evaluation set are dropped (or, --decontaminate_action cut, lose the lines holding it).

The test is GPT-3's (Brown et al. 2020, appendix C) and datatrove's n-gram decontamination: text
lower-cased, cut into words (runs of letters and digits, so punctuation and spacing never hide a
match), and a training document matches when one of its --decontaminate_ngram-word sequences (13,
GPT-3's; datatrove's NGramsDecontFilter defaults to 12) is one of an evaluation text's. An evaluation text shorter than that but of at least
--decontaminate_min_words words (8, GPT-3's smallest N) matches where it occurs whole; shorter ones
are too common to mean anything and are counted, not used. Only training documents are tested: the
validation set is held out already. The record of the split (SplitRecord) lists a cut document by
the key of the document as read, so a tool that reads the training documents again from the input
(make_probe_tasks --heldout) gets it whole.

Evaluation sets, by what prepare_data's neighbours read:
    a .tsv file (finetune_glue's GLUE layout, make_probe_tasks' output): every cell of every row
    a .jsonl file (eval_mlm's minimal pairs, BLiMP's layout; prepare_data's own heldout.jsonl): every
              string of every object, and every string of a list there (a held-out document's sentences)
    a folder: its dev*.tsv and test*.tsv files (a GLUE --data_dir, a probe suite; train.tsv is
              training data, not evaluation), its .jsonl and .txt files, at any depth
    any other file: plain text, one evaluation text a line (eval_mlm --text)

Memory: 8 bytes per evaluation n-gram (tools/prep/ngrams.py's hashes, in a sorted array)."""
import csv
import json
import os

import numpy as np

from tools.prep import PrepareDataError
from tools.prep.ngrams import WORD, ngram_hashes, word_hashes, words
from tools.prep.stages import Removal

DEFAULT_NGRAM = 13          # GPT-3's (datatrove's default: 12)
DEFAULT_MIN_WORDS = 8       # GPT-3: N is at least 8 words
HASH_PROBE = "decontaminate"   # its hash tells whether a process shares the string hashes of another


def evaluation_files(path):
    """The files of one --decontaminate argument that hold evaluation text."""
    if os.path.isdir(path):
        found = []
        for root, dirs, names in os.walk(path):
            dirs.sort()
            for name in sorted(names):
                lower = name.lower()
                if (lower.endswith(".tsv") and lower.startswith(("dev", "test"))) or \
                        lower.endswith((".jsonl", ".txt")):
                    found.append(os.path.join(root, name))
        if not found:
            raise PrepareDataError(f"--decontaminate {path}: a folder without evaluation files (expected dev*.tsv "
                                   "or test*.tsv as finetune_glue reads, .jsonl minimal pairs or .txt text)")
        return found
    if not os.path.isfile(path):
        raise PrepareDataError(f"--decontaminate {path}: no such file or folder")
    return [path]


def evaluation_texts(path):
    """The texts of one evaluation file, by its layout (the module's docstring)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            if path.lower().endswith(".tsv"):
                for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                    yield from row
            elif path.lower().endswith(".jsonl"):
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError as e:
                        raise PrepareDataError(f"--decontaminate {path}: line {number} is not JSON ({e})") from None
                    if not isinstance(record, dict):
                        raise PrepareDataError(f"--decontaminate {path}: line {number} is not a JSON object "
                                               "(expected one a line, as eval_mlm's minimal pairs)")
                    for value in record.values():     # a string, or a list of them (heldout.jsonl's sentences)
                        if isinstance(value, str):
                            yield value
                        elif isinstance(value, list):
                            yield from (v for v in value if isinstance(v, str))
            else:
                yield from f
    except UnicodeDecodeError as e:
        raise PrepareDataError(f"--decontaminate {path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise PrepareDataError(f"--decontaminate {path}: cannot be read ({e.strerror})") from None


class Decontaminator:
    """The stage: n-grams of the evaluation sets, and each training document tested against them."""

    name = "decontaminate"
    needs_text = True

    def __init__(self, paths, ngram=DEFAULT_NGRAM, min_words=DEFAULT_MIN_WORDS, action="drop"):
        if ngram < 1:
            raise PrepareDataError(f"--decontaminate_ngram {ngram}: must be at least 1")
        if not 1 <= min_words <= ngram:
            raise PrepareDataError(f"--decontaminate_min_words {min_words}: must be between 1 and "
                                   f"--decontaminate_ngram ({ngram})")
        self.paths, self.ngram, self.min_words, self.action = list(paths), ngram, min_words, action
        self.evaluation = {"files": 0, "texts": 0, "too_short": 0, "ngrams": 0}
        self.grams = self._hashed(self.evaluation)
        if not self.grams:
            raise PrepareDataError(f"--decontaminate {' '.join(paths)}: no evaluation text of at least {min_words} "
                                   "words (--decontaminate_min_words) to test against")
        self.evaluation["ngrams"] = sum(map(len, self.grams.values()))
        self.counts = {f"ngram_{ngram}": 0}
        self.info = {"action": action, "ngram": ngram, "min_words": min_words, "evaluation": self.evaluation}

    def _hashed(self, evaluation):
        """length -> the sorted hashes of the evaluation texts' n-grams (ngram: the n-grams; shorter:
        whole texts), looked up by binary search; `evaluation` counts what was read."""
        grams = {}
        for path in self.paths:
            for file in evaluation_files(path):
                evaluation["files"] += 1
                for text in evaluation_texts(file):
                    w = words(text)
                    if not w:
                        continue
                    evaluation["texts"] += 1
                    if len(w) < self.min_words:
                        evaluation["too_short"] += 1
                        continue
                    n = min(len(w), self.ngram)
                    grams.setdefault(n, []).append(ngram_hashes(word_hashes(w), n))
        return {n: np.unique(np.concatenate(arrays)) for n, arrays in sorted(grams.items())}

    # The hashes are Python's string hashes, which every process draws anew (tools/prep/ngrams.py):
    # a forked stage worker shares this process's, a spawned one hashes the evaluation texts again.
    def __getstate__(self):
        return {**self.__dict__, "_hash_probe": hash(HASH_PROBE)}

    def __setstate__(self, state):
        probe = state.pop("_hash_probe")
        self.__dict__.update(state)
        if probe != hash(HASH_PROBE):
            self.grams = self._hashed({"files": 0, "texts": 0, "too_short": 0})

    def __call__(self, set_name, number, document, text):
        if set_name != "train":
            return document, None
        found = list(WORD.finditer(text)) if self.action == "cut" else None   # (offsets in `text`)
        w = [m.group().casefold() for m in found] if found is not None else words(text)
        spans = self._matches(w)
        if not spans:
            return document, None
        rule = f"ngram_{self.ngram}"
        if self.action == "drop":
            return None, Removal(rule, text)
        return self._cut(document, text, found, spans, rule)

    def _matches(self, w):
        """(start, stop) word positions of every matching n-gram (and whole short text)."""
        hashes = word_hashes(w)
        spans = []
        for n, wanted in self.grams.items():
            grams = ngram_hashes(hashes, n)
            at = np.searchsorted(wanted, grams).clip(max=len(wanted) - 1)
            spans += [(int(i), int(i) + n) for i in np.flatnonzero(wanted[at] == grams)]
        return spans

    def _cut(self, document, text, found, spans, rule):
        """The document without the lines (the text layout's sentences, other layouts' paragraphs)
        that hold part of a match; None when nothing is left."""
        starts = np.cumsum([0] + [len(line) + 1 for line in text.split("\n")])   # each line's first char
        hit = set()
        for start, stop in spans:
            first = int(np.searchsorted(starts, found[start].start(), side="right")) - 1
            last = int(np.searchsorted(starts, found[stop - 1].end() - 1, side="right")) - 1
            hit.update(range(first, last + 1))
        lines = text.split("\n")
        kept = [line for i, line in enumerate(lines) if i not in hit]
        removed = "\n".join(line for i, line in enumerate(lines) if i in hit)
        if not any(line.strip() for line in kept):
            return None, Removal(rule, text)
        # a list of sentences stays one; other documents become their text (a page without markup)
        return (kept if isinstance(document, list) else "\n".join(kept)), Removal(rule, removed)

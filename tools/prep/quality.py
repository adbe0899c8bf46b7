"""Quality rules (--quality_filter): a document is dropped by the first rule it fails, in the order
below, with the thresholds the anchors publish (each can be changed: --quality_threshold NAME=VALUE).

Gopher's quality filter (Rae et al. 2021, appendix A.1.1; datatrove's GopherQualityFilter):
    min_words 50, max_words 100000     words that are not only punctuation
    min_mean_word_length 3, max_mean_word_length 10   characters, over those words
    max_symbol_word_ratio 0.1          "#" and "..." (or "…") each, per word
    max_bullet_lines 0.9               share of lines that start with a bullet (•, -, *)
    max_ellipsis_lines 0.3             share of lines that end with "..." or "…"
    min_alpha_words 0.8                share of words holding a letter (str.isalpha: "²" or "Ⅻ" is none)
    min_stop_words 2                   of "the", "be", "to", "of", "and", "that", "have", "with"
Gopher's repetition filter (appendix A.1.2, table A1; datatrove's GopherRepetitionFilter):
    max_duplicate_paragraphs 0.3, max_duplicate_paragraph_chars 0.2  paragraphs (blank-line separated)
    max_duplicate_lines 0.3, max_duplicate_line_chars 0.2           lines seen before in the document
    max_top_2gram 0.2, max_top_3gram 0.18, max_top_4gram 0.16       characters in the most frequent n-gram
                                                                    (of equally frequent ones, the first)
    max_duplicate_5gram 0.15 ... max_duplicate_10gram 0.1           characters in n-grams seen before in
                                                                    the document, each counted once
C4's page rules (Raffel et al. 2020, section 2.2):
    c4_lorem_ipsum 1, c4_curly_bracket 1   drop pages holding "lorem ipsum" or "{" (0 turns the rule off)

A document's lines are its sentences in the text layout (one a line) and its lines elsewhere; a
text-layout document is one paragraph. Ratios are shares of the document's characters or lines.
Words are split at whitespace for the quality rules and are tools/prep/ngrams.py's (letters and
digits, case-folded) for the n-gram rules, which Gopher counts over words without punctuation."""
import itertools
import math
import re

import numpy as np

from tools.prep import PrepareDataError
from tools.prep.ngrams import first_seen, next_ngram_hashes, runs, word_hashes, words
from tools.prep.stages import Removal

STOP_WORDS = frozenset(("the", "be", "to", "of", "and", "that", "have", "with"))
BULLETS = ("•", "-", "*", "●", "▪", "‣")
ELLIPSES = ("...", "…")
PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~«»“”‘’„…–—•·"

TOP_NGRAMS = {2: 0.2, 3: 0.18, 4: 0.16}
DUPLICATE_NGRAMS = {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.1}

# name -> (default, kind): "count" a whole number, "share" in [0, 1], "ratio" any number >= 0, "switch" 0 or 1
THRESHOLDS = {
    "min_words": (50, "count"), "max_words": (100_000, "count"),
    "min_mean_word_length": (3, "ratio"), "max_mean_word_length": (10, "ratio"),
    "max_symbol_word_ratio": (0.1, "ratio"), "max_bullet_lines": (0.9, "share"),
    "max_ellipsis_lines": (0.3, "share"), "min_alpha_words": (0.8, "share"), "min_stop_words": (2, "count"),
    "max_duplicate_paragraphs": (0.3, "share"), "max_duplicate_paragraph_chars": (0.2, "share"),
    "max_duplicate_lines": (0.3, "share"), "max_duplicate_line_chars": (0.2, "share"),
    **{f"max_top_{n}gram": (v, "share") for n, v in TOP_NGRAMS.items()},
    **{f"max_duplicate_{n}gram": (v, "share") for n, v in DUPLICATE_NGRAMS.items()},
    "c4_lorem_ipsum": (1, "switch"), "c4_curly_bracket": (1, "switch"),
}


def parse_thresholds(items):
    """--quality_threshold NAME=VALUE ... over the defaults; one error line for a bad one."""
    values = {name: default for name, (default, _) in THRESHOLDS.items()}
    given = set()
    for item in items or ():
        name, sep, value = item.partition("=")
        if name not in THRESHOLDS or not sep:
            raise PrepareDataError(f"--quality_threshold {item}: expected NAME=VALUE with NAME one of "
                                   f"{', '.join(THRESHOLDS)}")
        if name in given:
            raise PrepareDataError(f"--quality_threshold {item}: {name} is given twice; give each rule once")
        given.add(name)
        kind = THRESHOLDS[name][1]
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        ok = math.isfinite(number) and {"count": number >= 0 and number == int(number), "ratio": number >= 0,
                                         "share": 0 <= number <= 1, "switch": number in (0, 1)}[kind]
        if not ok:
            expected = {"count": "a whole number >= 0", "ratio": "a finite number >= 0", "share": "a share in [0, 1]",
                        "switch": "0 (off) or 1 (on)"}[kind]
            raise PrepareDataError(f"--quality_threshold {item}: {name} must be {expected}")
        values[name] = int(number) if kind in ("count", "switch") else number
    for low, high in (("min_words", "max_words"), ("min_mean_word_length", "max_mean_word_length")):
        if values[low] > values[high]:
            raise PrepareDataError(f"--quality_threshold: {low} {values[low]} is above {high} {values[high]}: "
                                   "every document would be dropped")
    return values


def _duplicates(items):
    """(items seen before in the list, their characters)."""
    seen, count, chars = set(), 0, 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    return count, chars


def _repeated_ngram_rule(t, ws, size):
    """Gopher's n-gram rules over the words `ws` of a text of `size` characters: the first failed,
    or None. An n-gram's characters are its words' and the spaces between them. The n-grams of each
    size are made from the size below (next_ngram_hashes), the rules checked in order of size."""
    if len(ws) < 2:
        return None
    hashes = word_hashes(ws)
    ends = np.zeros(len(ws) + 1, dtype=np.int64)                       # characters before word i
    np.cumsum(np.fromiter(map(len, ws), dtype=np.int64, count=len(ws)), out=ends[1:])
    grams = hashes
    for n in range(2, max(DUPLICATE_NGRAMS) + 1):
        grams = next_ngram_hashes(grams, hashes, n)
        if not len(grams):
            return None
        if n in TOP_NGRAMS:    # the most frequent n-gram's characters, times its count (seen once: none)
            order, starts, counts = runs(grams)
            top = int(counts.max())
            if top == 1:              # no n-gram twice, so no longer one either: every later rule counts 0
                return None
            # of equally frequent n-grams, the one the text holds first (as datatrove's Counter picks):
            # never the order of the hashes, which Python draws anew in every process
            i = int(order[starts[counts == top]].min())
            if top * (ends[i + n] - ends[i] + n - 1) / size > t[f"max_top_{n}gram"]:
                return f"max_top_{n}gram"
        elif n in DUPLICATE_NGRAMS:   # characters of the words inside an n-gram seen before, each once
            repeats = np.flatnonzero(~first_seen(grams))
            if not len(repeats):      # as above
                return None
            cover = np.zeros(len(ws) + 1, dtype=np.int64)
            np.add.at(cover, repeats, 1)
            np.add.at(cover, repeats + n, -1)
            covered = np.cumsum(cover[:-1]) > 0
            chars = int(np.diff(ends)[covered].sum())
            if chars / size > t[f"max_duplicate_{n}gram"]:
                return f"max_duplicate_{n}gram"
    return None


class QualityFilter:
    """The stage: the rules above, in order; the first one a document fails drops it."""

    name = "quality"
    needs_text = True

    def __init__(self, thresholds):
        self.t = thresholds
        self.counts = {}

    def __call__(self, set_name, number, document, text):
        rule = self.failed_rule(text)
        if rule is None:
            return document, None
        return None, Removal(rule, text)

    def failed_rule(self, text):
        """The name of the first rule `text` fails, or None."""
        lines = list(filter(str.strip, text.split("\n")))      # its lines that are not blank
        return self._gopher_quality(text, lines) or self._gopher_repetition(text, lines) or self._c4(text)

    def _gopher_quality(self, text, lines):
        t = self.t
        tokens = text.split()
        # a token of letters only holds a word's letter and no punctuation: only the others (a few
        # in ten) are looked at one by one
        others = list(itertools.filterfalse(str.isalpha, tokens))
        punctuation_only = [w for w in others if not w.strip(PUNCTUATION)]
        n = len(tokens) - len(punctuation_only)
        if n < max(t["min_words"], 1):      # (no word at all: nothing to measure)
            return "min_words"
        if n > t["max_words"]:
            return "max_words"
        mean = (sum(map(len, tokens)) - sum(map(len, punctuation_only))) / n
        if mean < t["min_mean_word_length"]:
            return "min_mean_word_length"
        if mean > t["max_mean_word_length"]:
            return "max_mean_word_length"
        if text.count("#") / len(tokens) > t["max_symbol_word_ratio"] or \
                sum(text.count(e) for e in ELLIPSES) / len(tokens) > t["max_symbol_word_ratio"]:
            return "max_symbol_word_ratio"
        if sum(line.lstrip().startswith(BULLETS) for line in lines) / len(lines) > t["max_bullet_lines"]:
            return "max_bullet_lines"
        if sum(line.rstrip().endswith(ELLIPSES) for line in lines) / len(lines) > t["max_ellipsis_lines"]:
            return "max_ellipsis_lines"
        without_letter = sum(1 for w in others if not any(map(str.isalpha, w)))
        if (len(tokens) - without_letter) / len(tokens) < t["min_alpha_words"]:
            return "min_alpha_words"
        if sum(map(STOP_WORDS.__contains__, text.lower().split())) < t["min_stop_words"]:
            return "min_stop_words"
        return None

    def _gopher_repetition(self, text, lines):
        t = self.t
        size = max(len(text), 1)
        paragraphs = [p for p in re.split(r"\n{2,}", text.strip()) if p.strip()]
        count, chars = _duplicates(paragraphs)
        if count / max(len(paragraphs), 1) > t["max_duplicate_paragraphs"]:
            return "max_duplicate_paragraphs"
        if chars / size > t["max_duplicate_paragraph_chars"]:
            return "max_duplicate_paragraph_chars"
        count, chars = _duplicates(lines)
        if count / max(len(lines), 1) > t["max_duplicate_lines"]:
            return "max_duplicate_lines"
        if chars / size > t["max_duplicate_line_chars"]:
            return "max_duplicate_line_chars"
        return _repeated_ngram_rule(t, words(text), size)

    def _c4(self, text):
        if self.t["c4_lorem_ipsum"] and "lorem ipsum" in text.lower():
            return "c4_lorem_ipsum"
        if self.t["c4_curly_bracket"] and "{" in text:
            return "c4_curly_bracket"
        return None

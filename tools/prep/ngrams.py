"""Words and word n-grams as the document stages compare them: a word is a run of letters and digits,
case-folded (so punctuation, spacing and case never hide a match), and an n-gram is a 64-bit hash
of n consecutive words, computed for a whole document at once with numpy.

The hashes are Python's hash of each word mixed polynomially modulo 2**64: two different n-grams
share one with odds about 2**-64. Python draws its string hashes anew in every process
(PYTHONHASHSEED), so they are only ever compared for equality within one process and the processes
forked from it (decontamination's evaluation n-grams, hashed before the stage workers fork; a
Decontaminator sent to a spawned process hashes them again there), never ordered: no decision may
follow their order (a resumed run decides again what the killed one decided)."""
import re

import numpy as np

WORD = re.compile(r"\w+")
_MIX = np.uint64(0x9E3779B97F4A7C15)     # odd: the polynomial's base


# The one character that is not a word character but case-folds to one (U+0345, the combining
# ypogegrammeni, folds to a Greek iota); tests/test_prepare_filters.py checks that it is the only one.
FOLDS_INTO_A_WORD = "\u0345"


def words(text):
    """The text's words, each case-folded. Folding the whole text first finds the same words, and
    is faster, where every character folds to one character (no "ß" -> "ss", no "İ" -> "i̇", whose
    combining dot is not a word character) and none of them to a word character from another one."""
    folded = text.casefold()
    if len(folded) == len(text) and FOLDS_INTO_A_WORD not in text:
        return WORD.findall(folded)
    return [w.casefold() for w in WORD.findall(text)]


def word_hashes(ws):
    return np.fromiter(map(hash, ws), dtype=np.int64, count=len(ws)).view(np.uint64)


def ngram_hashes(hashes, n):
    """(len(hashes) - n + 1,) uint64: the hash of each n consecutive words (empty when fewer)."""
    if len(hashes) < n:
        return np.zeros(0, dtype=np.uint64)
    out = hashes[:len(hashes) - n + 1].copy()
    with np.errstate(over="ignore"):
        for j in range(1, n):
            out *= _MIX
            out += hashes[j:len(hashes) - n + 1 + j]
    return out


def next_ngram_hashes(grams, hashes, n):
    """ngram_hashes(hashes, n) from `grams` = ngram_hashes(hashes, n - 1) (the same values: one
    multiply-add over the array where ngram_hashes makes n - 1)."""
    if len(hashes) < n:
        return np.zeros(0, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return grams[:len(hashes) - n + 1] * _MIX + hashes[n - 1:]


def runs(grams):
    """(order, starts, counts): a stable sort of `grams`, where each run of equal n-grams starts in it
    and how long it is; order[starts] is where each distinct n-gram occurs first (np.unique's
    return_index and return_counts, in fewer steps)."""
    order = np.argsort(grams, kind="stable")
    ordered = grams[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    return order, starts, np.diff(np.append(starts, len(grams)))


def first_seen(grams):
    """(len(grams),) bool: True where an n-gram occurs for the first time in the document."""
    order, starts, _ = runs(grams)
    mask = np.zeros(len(grams), dtype=bool)
    mask[order[starts]] = True
    return mask

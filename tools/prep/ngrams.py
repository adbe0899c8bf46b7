"""Words and word n-grams as the document stages compare them: a word is a run of letters and digits,
case-folded (so punctuation, spacing and case never hide a match), and an n-gram is a 64-bit hash
of n consecutive words, computed for a whole document at once with numpy.

The hashes are Python's hash of each word mixed polynomially modulo 2**64: two different n-grams
share one with odds about 2**-64. Python draws its string hashes anew in every process
(PYTHONHASHSEED), so they are only ever compared for equality within one process, never ordered:
no decision may follow their order (a resumed run decides again what the killed one decided)."""
import re

import numpy as np

WORD = re.compile(r"\w+")
_MIX = np.uint64(0x9E3779B97F4A7C15)     # odd: the polynomial's base


def words(text):
    return [w.casefold() for w in WORD.findall(text)]


def word_hashes(ws):
    return np.fromiter((hash(w) for w in ws), dtype=np.int64, count=len(ws)).view(np.uint64)


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


def first_seen(grams):
    """(len(grams),) bool: True where an n-gram occurs for the first time in the document."""
    _, first = np.unique(grams, return_index=True)
    mask = np.zeros(len(grams), dtype=bool)
    mask[first] = True
    return mask

"""Sentences to token ids, in the workers, through the `tokenizers` batch encoder: for a WordPiece
vocab.txt each distinct word of a chunk tokenized once (WordCacheTokenizer); for a tokenizer.json
each sentence as it stands in its document's running text (SentenceEncoder). `token_encoder` picks."""
import itertools
import re
import unicodedata

import numpy as np

from turing.tokenization import VOCAB_TXT

# Whitespace to Python's str.split() that BERT's tokenizer deletes as control characters
# (category C), e.g. form feed: removed before splitting words so both agree.
_CONTROL_SPACES = "".join(c for c in map(chr, range(0x3001))
                          if c.isspace() and unicodedata.category(c).startswith("C")
                          and c not in "\t\n\r")
_DROP_CONTROL_SPACES = str.maketrans("", "", _CONTROL_SPACES)
_CONTROL_SPACES_RE = re.compile(f"[{_CONTROL_SPACES}]")


def token_encoder(tokenizer):
    """The encoder of a chunk's documents for `tokenizer` (turing.tokenization.Tokenizer)."""
    if tokenizer.kind == VOCAB_TXT:
        return WordCacheTokenizer(tokenizer.backend)
    return SentenceEncoder(tokenizer)


class SentenceEncoder:
    """Token ids of a chunk's sentences with any tokenizer: every sentence encoded whole, a
    document's first as it begins the text and each later one after the space that separated it
    (a byte-level BPE keeps that space in the next token, "Ġword"), so that a document's ids are
    the ids of its sentences joined by spaces, and any run of sentences decodes to its text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode_documents(self, documents):
        """(flat token ids int32 (T,), tokens per sentence int64 (n_sentences,)) of lists of sentences."""
        firsts = [doc[:1] for doc in documents]
        laters = [doc[1:] for doc in documents]
        first_ids = self.tokenizer.encode_batch([s for d in firsts for s in d])
        later_ids = self.tokenizer.encode_batch([s for d in laters for s in d], after_space=True)
        ordered, a, b = [], 0, 0
        for first, later in zip(firsts, laters):
            ordered += first_ids[a:a + len(first)] + later_ids[b:b + len(later)]
            a, b = a + len(first), b + len(later)
        lengths = np.fromiter(map(len, ordered), dtype=np.int64, count=len(ordered))
        ids = np.fromiter(itertools.chain.from_iterable(ordered), dtype=np.int32, count=int(lengths.sum()))
        return ids, lengths


class WordCacheTokenizer:
    """Token ids of many lines, tokenizing each distinct whitespace-separated word once.

    BERT's tokenizer splits on whitespace before anything can join characters across it, so
    the ids of a line are the ids of its words concatenated; words repeat a lot (Zipf), so
    encoding only the new distinct ones in one `encode_batch` call is several times faster.
    The cache only memoises (word -> its ids in one growing array), so results never depend
    on what a worker saw before; it is emptied when it holds MAX_CACHED_WORDS.
    """

    MAX_CACHED_WORDS = 1 << 19
    WORDS_PER_TEXT = 256

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._clear()

    def _clear(self):
        self.index = {}                                   # word -> row in start/length
        self.start = np.zeros(0, dtype=np.int64)
        self.length = np.zeros(0, dtype=np.int64)
        self.store = np.zeros(0, dtype=np.int32)          # the ids of all cached words

    def _add(self, words):
        """Tokenize new distinct words and append their ids to the store.

        The words go to the encoder joined by spaces, WORDS_PER_TEXT to a text: far cheaper
        than one text per word. Each token is given back to its word by its character offset.
        """
        n = self.WORDS_PER_TEXT
        texts = [" ".join(words[i:i + n]) for i in range(0, len(words), n)]
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int32)
        char = np.fromiter(itertools.chain.from_iterable(
            (start for start, _ in e.offsets) for e in encodings), dtype=np.int64, count=len(ids))
        # Offsets as if all texts were one string with a space between them.
        text_len = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        text_base = np.cumsum(text_len + 1) - (text_len + 1)
        tokens_per_text = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))
        char += np.repeat(text_base, tokens_per_text)
        word_len = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        word_start = np.cumsum(word_len + 1) - (word_len + 1)    # the same layout, word by word
        owner = np.searchsorted(word_start, char, side="right") - 1
        length = np.bincount(owner, minlength=len(words)).astype(np.int64)
        base = len(self.index)
        self.index.update(zip(words, range(base, base + len(words))))
        self.start = np.concatenate([self.start, len(self.store) + np.cumsum(length) - length])
        self.length = np.concatenate([self.length, length])
        self.store = np.concatenate([self.store, ids])

    def encode_documents(self, documents):
        """(flat token ids int32 (T,), tokens per sentence int64 (n_sentences,)) of lists of sentences."""
        return self.encode_lines([line for doc in documents for line in doc])

    def encode_lines(self, lines):
        """(flat token ids int32 (T,), tokens per line int64 (n_lines,))."""
        if _CONTROL_SPACES_RE.search("".join(lines)):
            lines = [line.translate(_DROP_CONTROL_SPACES) for line in lines]
        line_words = [line.split() for line in lines]
        words = list(itertools.chain.from_iterable(line_words))
        if len(self.index) > self.MAX_CACHED_WORDS:
            self._clear()
        new = [w for w in dict.fromkeys(words) if w not in self.index]
        if new:
            self._add(new)
        rows = np.fromiter(map(self.index.__getitem__, words), dtype=np.int64, count=len(words))
        lens = self.length[rows]                              # tokens per word occurrence
        token_ids = self.store[concat_ranges(self.start[rows], lens)]
        words_per_line = np.fromiter(map(len, line_words), dtype=np.int64, count=len(line_words))
        cum = np.concatenate([[0], np.cumsum(lens)])
        line_end = np.cumsum(words_per_line)
        tokens_per_line = cum[line_end] - cum[line_end - words_per_line]
        return token_ids, tokens_per_line


def concat_ranges(starts, lens):
    """Concatenation of arange(s, s + n) for each (s, n): int64 indices."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    out_start = np.cumsum(lens) - lens
    return np.repeat(starts - out_start, lens) + np.arange(total, dtype=np.int64)

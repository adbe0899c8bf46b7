"""Near-duplicate removal (on unless --no_near_dedup): MinHash LSH over word shingles, datatrove's and
FineWeb's recipe. A document's words (runs of letters and digits, case-folded) give its 5-word
shingles; rensa's MinHash (R-MinHash, 112 permutations, seeded) signs them; the signature's 14 bands
of 8 values are hashed, and a document that shares a band with an earlier document is a near
duplicate and is dropped: the first of each group is kept, in input order. Two documents of Jaccard
similarity s (over their shingle sets) share a band with probability 1 - (1 - s^8)^14: 0.92 at
s = 0.8, 0.56 at 0.7, 0.05 at 0.5 (the threshold, where the curve is steepest, is (1/14)^(1/8) = 0.72).

Two passes, both resumable. The signature pass reads the whole input (every part's documents with
--num_parts, so every part finds the same near duplicates without talking to the others, and a near
duplicate in another part is found too), numbering documents as the split does, and writes the band
hashes of each block of BLOCK documents to the journal (OUT/.prepare_data.work/near_dedup/, 8 bytes
a band a document), each block whole or not at all; a resumed run signs only the blocks missing.
Then, one band at a time (memory: about 25 bytes a document), the documents whose band hash an
earlier document has are marked, and their numbers written (removed.npy). The removal is the run's
ordinary pass: the stage drops those documents; an exact duplicate is the exact filter's, never
counted here. rensa was chosen by measurement (bench/README.md): 50x datasketch's speed for the same
signatures' quality; datatrove's stages need its own pipeline and executor around them."""
import collections
import importlib
import logging
import os
import time

import numpy as np

from tools.prep import PrepareDataError
from tools.prep.ngrams import words
from tools.prep.stages import Removal, document_text

logger = logging.getLogger(__name__)

SHINGLE_WORDS, BANDS, ROWS = 5, 14, 8    # datatrove's MinhashConfig defaults (FineWeb's)
MAX_MINHASH_VALUES = 4096               # bands x rows at most (datatrove's 14 x 8 = 112)
BLOCK = 50_000                           # documents a signature file holds
BATCH = 1_000                            # documents signed at once (a worker's task)
_MIX = np.uint64(0x9E3779B97F4A7C15)     # odd 64-bit multiplier: a band's rows into one hash


def shingles(text, n=SHINGLE_WORDS):
    """A document's n-word shingles (its words: runs of letters and digits, case-folded); a document of
    fewer words is one shingle, one of no words its stripped text."""
    w = words(text)
    if len(w) <= n:
        return [" ".join(w) if w else text.strip()]
    return list(map(" ".join, zip(*(w[i:] for i in range(n)))))


def _minhash_class():
    try:
        return importlib.import_module("rensa").RMinHash
    except ImportError:
        raise PrepareDataError("near-duplicate removal needs rensa: pip install 'rensa>=0.5' "
                               "(or turn it off: --no_near_dedup)") from None


def band_hashes(signatures, bands, rows):
    """(documents, bands) uint64 from (documents, bands * rows) MinHash values."""
    values = np.asarray(signatures, dtype=np.uint64).reshape(len(signatures), bands, rows)
    powers = _MIX ** np.arange(1, rows + 1, dtype=np.uint64)   # wraps mod 2**64, as intended
    with np.errstate(over="ignore"):
        return (values * powers).sum(axis=2, dtype=np.uint64)


class SignaturePass:
    """The signature pass and the marking, in `folder` (the journal's near_dedup/)."""

    def __init__(self, folder, seed, bands=BANDS, rows=ROWS, ngram=SHINGLE_WORDS):
        self.folder, self.seed, self.bands, self.rows, self.ngram = folder, seed, bands, rows, ngram
        self.minhash = _minhash_class()
        self.removed_file = os.path.join(folder, "removed.npy")

    def block_path(self, block):
        return os.path.join(self.folder, f"signatures_{block:07d}.npy")

    def run(self, documents, check_stop=lambda: None, pool=None):
        """The numbers of the near duplicates among `documents` (a CorpusReader over the whole input),
        sorted; from the journal where an earlier run got that far. `pool` (a WorkerPool): batches
        are signed in its workers, this process only reads (the same hashes, in the same order)."""
        if os.path.exists(self.removed_file):
            return np.load(self.removed_file)
        os.makedirs(self.folder, exist_ok=True)
        start = time.perf_counter()
        count = self._sign(documents, check_stop, pool)
        removed = self._mark(count)
        _save(self.removed_file, removed)
        # Not the stage's count: exact copies are marked too (the exact-duplicate filter drops and counts
        # them first), and with --num_parts the pass reads every part's documents.
        logger.info("near-duplicate pass: %d of the input's %d documents are like an earlier one, exact copies "
                    "included (%.1f s); the summary counts those as exact duplicates, the others as near_dedup",
                    len(removed), count, time.perf_counter() - start)
        return removed

    def _batches(self, documents, check_stop, counted):
        """(block, documents, whether the block is whole there) of at most BATCH documents, never
        across a block, those of the blocks written already left out; `counted` gets the number
        read (the last block, shorter, is written when the input ends)."""
        number, batch, block, skip = 0, [], 0, False
        for doc, _ in documents:
            if not doc:
                continue
            if number % BLOCK == 0:      # between blocks
                check_stop()
                block = number // BLOCK
                skip = os.path.exists(self.block_path(block))
            number += 1
            if not skip:
                batch.append(doc)
            if batch and (number % BLOCK == 0 or len(batch) == BATCH):
                yield block, batch, number % BLOCK == 0
                batch = []
        if batch:
            yield block, batch, False
        counted.append(number)

    def _sign(self, documents, check_stop, pool):
        """Write every block's band hashes (those not written yet), each once it is whole; returns
        the documents counted. A block in the making holds 8 bytes a band a document (a signature
        as Python ints, 4 KB)."""
        counted, hashed, block = [], [], 0
        for block, hashes, last in self._signed(self._batches(documents, check_stop, counted), check_stop, pool):
            hashed.append(hashes)
            if last:
                _save(self.block_path(block), np.concatenate(hashed))
                hashed = []
        if hashed:        # the input's last block, short of BLOCK documents
            _save(self.block_path(block), np.concatenate(hashed))
        return counted[0]

    def _signed(self, batches, check_stop, pool):
        """(block, band hashes, last) of each batch, in order: here, or in the pool's workers with a
        few batches a worker in flight (memory stays bounded)."""
        if pool is None:
            for block, docs, last in batches:
                yield block, band_hashes([self.sign(d) for d in docs], self.bands, self.rows), last
            return
        in_flight = collections.deque()
        for block, docs, last in batches:
            in_flight.append((block, pool.submit("sign", self.seed, self.bands, self.rows, self.ngram, docs), last))
            if len(in_flight) >= 2 * len(pool.workers):
                block, ticket, last = in_flight.popleft()
                yield block, pool.result(ticket, check_stop), last
        while in_flight:
            block, ticket, last = in_flight.popleft()
            yield block, pool.result(ticket, check_stop), last

    def sign(self, document):
        """The document's MinHash signature (bands * rows values)."""
        return _signature(self.minhash, document, self.seed, self.bands * self.rows, self.ngram)

    def _mark(self, count):
        """Document numbers whose hash in some band an earlier document has (stable sort: the
        earliest of equal hashes comes first and is kept)."""
        blocks = [self.block_path(b) for b in range((count + BLOCK - 1) // BLOCK)]
        removed = np.zeros(count, dtype=bool)
        for band in range(self.bands):
            column = np.concatenate([np.load(path, mmap_mode="r")[:, band] for path in blocks]) if blocks \
                else np.zeros(0, dtype=np.uint64)
            order = np.argsort(column, kind="stable")
            ordered = column[order]
            removed[order[1:][ordered[1:] == ordered[:-1]]] = True
        return np.flatnonzero(removed).astype(np.uint64)


def _signature(minhash, document, seed, num_perm, ngram):
    m = minhash(num_perm, seed)
    m.update(shingles(document_text(document), ngram))
    return m.digest()


def sign_batch(seed, bands, rows, ngram, documents):
    """(documents, bands) band hashes of a batch (what a worker's "sign" task returns)."""
    minhash = _minhash_class()
    return band_hashes([_signature(minhash, d, seed, bands * rows, ngram) for d in documents], bands, rows)


def _save(path, array):
    tmp = path + ".tmp.npy"
    np.save(tmp, array)
    os.replace(tmp, path)


class NearDuplicateFilter:
    """The stage: drop the documents the signature pass marked."""

    name = "near_dedup"
    needs_text = False          # the signature pass read it: the number decides

    def __init__(self, removed, bands=BANDS, rows=ROWS, ngram=SHINGLE_WORDS):
        self.removed = removed
        self.counts = {"near_duplicate": 0}
        self.info = {"shingle_words": ngram, "bands": bands, "rows": rows,
                     "similarity_at_half_odds": round((1 - 0.5 ** (1 / bands)) ** (1 / rows), 3)}

    def __call__(self, set_name, number, document, text):
        i = int(np.searchsorted(self.removed, number))
        if i == len(self.removed) or self.removed[i] != number:
            return document, None
        return None, Removal("near_duplicate", document_text(document))

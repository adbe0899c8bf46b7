"""Bing numpy pretraining shards: reading, token ids, dynamic masking.

Owns: opening and checking a shard folder (both layouts, memory-mapped, never pickled),
turning its token strings into vocab ids once per shard (vectorised), the per-epoch sample
order of a rank, building a whole micro batch `[CLS] A [SEP] B [SEP]` with dynamic masking
in numpy, and the validation set read from the same layout.

The shard layout (its files, the two token layouts) is turing.formats'. An optional lang.npy (per-instance language) is ignored. Instances hold A then B only; the
[CLS]/[SEP] tokens are added here.

The NSP label given to the model (`next_sentence_labels`) follows the NVIDIA/Google BERT
convention, 1 = B is random, which is exactly `is_next` as stored.

Determinism (for exact resume): the sample order of an epoch depends only on
(seed, epoch, rank, world, dataset salt) and the masking of a sample only on
(seed, epoch, dataset salt, sample index). Masking random numbers come from a counter-based
hash of those values and the token position, so they do not depend on DataLoader workers,
on batch composition or on how many batches were read before.
"""
import argparse
import logging
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from turing.batch import Batch, BatchType
from turing.errors import InputFileNotFoundError, InputValueError
from turing.formats import BING_OFFSET_FILES, BING_SEPARATOR, BING_SHARD_FILES, is_bing_shard
from turing.tokenization import load_tokenizer, vocab_of

logger = logging.getLogger(__name__)

MASKED_SHARE = 0.15
MASK_SPLIT = (0.8, 0.1, 0.1)  # of the predicted tokens: [MASK], a random token, kept
# Byte budget of one token-mapping pass: bounds the temporary arrays (about 40 bytes per token).
_MAP_CHUNK_BYTES = 8 << 20
# _BYTE_MASKS[n] keeps the low n bytes of a little-endian uint64 word.
_BYTE_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(9)], dtype=np.uint64)
# Stream salt of the validation set, so its masks never equal a training epoch's.
VALIDATION_SALT = 0x7661_6C69
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio, the splitmix64 increment
_MASK64 = (1 << 64) - 1


def _splitmix(x):
    """splitmix64 finaliser on a uint64 array: a well-mixed hash of each element."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class ShardFormatError(InputValueError):
    """A Bing shard folder whose files are missing or inconsistent."""


class BingShard:
    """One shard folder, memory-mapped. Cheap to open: only the per-instance arrays are read.

    Attributes: `folder`, `data` (memmap uint8), `instance_offsets` (N+1,), `tokens_split` (N,),
    `is_next` (N,), `layout` ("separator" or "offsets"), and for the offsets layout
    `instance_token_offsets` (N+1,) and `token_offsets` (memmap).
    """

    def __init__(self, folder):
        if not os.path.isdir(folder):
            raise InputFileNotFoundError(f"Bing shard folder {folder} does not exist")
        self.folder = folder
        self.data = self._load("data.npy", 1, np.uint8)
        self.instance_offsets = np.asarray(self._load("instance_offsets.npy", 1, "int"), dtype=np.int64)
        self.tokens_split = np.asarray(self._load("tokens_split.npy", 1, "int"), dtype=np.int64)
        self.is_next = np.asarray(self._load("is_next.npy", 1, "int"), dtype=np.int64)
        n = len(self.tokens_split)
        self._check_offsets("instance_offsets.npy", self.instance_offsets, n + 1, len(self.data),
                            "byte offsets into data.npy")
        if np.any(np.diff(self.instance_offsets) <= 0):
            bad = int(np.flatnonzero(np.diff(self.instance_offsets) <= 0)[0])
            raise ShardFormatError(f"Bing shard {folder}: instance_offsets.npy gives instance {bad} no bytes; "
                                   f"every instance needs at least one token")
        if len(self.is_next) != n:
            raise ShardFormatError(f"Bing shard {folder}: is_next.npy has {len(self.is_next)} entries; "
                                   f"expected {n}, one per instance like tokens_split.npy")
        if n and (self.is_next.min() < 0 or self.is_next.max() > 1):
            raise ShardFormatError(f"Bing shard {folder}: is_next.npy must hold only 0 and 1")
        if n and self.tokens_split.min() < 0:
            raise ShardFormatError(f"Bing shard {folder}: tokens_split.npy has negative entries")

        has_ito = os.path.exists(os.path.join(folder, "instance_token_offsets.npy"))
        self.layout = "offsets" if has_ito else "separator"
        if has_ito:
            self.token_offsets = self._load("token_offsets.npy", 1, "int")
            self.instance_token_offsets = np.asarray(self._load("instance_token_offsets.npy", 1, "int"),
                                                     dtype=np.int64)
            self._check_offsets("instance_token_offsets.npy", self.instance_token_offsets, n + 1,
                                len(self.token_offsets), "indexes into token_offsets.npy")

    def __len__(self):
        return len(self.tokens_split)

    def _load(self, name, ndim, kind):
        path = os.path.join(self.folder, name)
        if not os.path.isfile(path):
            raise ShardFormatError(f"Bing shard {self.folder}: {name} is missing; a shard folder needs "
                                   f"{', '.join(BING_SHARD_FILES)} (plus {' and '.join(BING_OFFSET_FILES)} "
                                   f"for the offsets layout)")
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            raise ShardFormatError(f"Bing shard {self.folder}: cannot read {name} as a numpy array "
                                   f"without pickle ({e})") from None
        if arr.ndim != ndim:
            raise ShardFormatError(f"Bing shard {self.folder}: {name} has shape {arr.shape}; expected 1-D")
        if kind == "int":
            if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
                raise ShardFormatError(f"Bing shard {self.folder}: {name} has dtype {arr.dtype}; "
                                       f"expected an integer dtype")
        elif arr.dtype != kind:
            raise ShardFormatError(f"Bing shard {self.folder}: {name} has dtype {arr.dtype}; "
                                   f"expected {np.dtype(kind)}")
        return arr

    def _check_offsets(self, name, offsets, expected_len, end, what):
        if len(offsets) != expected_len:
            raise ShardFormatError(f"Bing shard {self.folder}: {name} has {len(offsets)} entries; expected "
                                   f"{expected_len} (number of instances in tokens_split.npy + 1)")
        if offsets[0] != 0 or offsets[-1] != end:
            raise ShardFormatError(f"Bing shard {self.folder}: {name} ({what}) must start at 0 and end at "
                                   f"{end}; found {int(offsets[0])} .. {int(offsets[-1])}")
        if np.any(np.diff(offsets) < 0):
            raise ShardFormatError(f"Bing shard {self.folder}: {name} ({what}) must not decrease")

    def instance_tokens(self, i):
        """Token strings of instance i, decoded in Python (for inspection and tests)."""
        raw = bytes(self.data[self.instance_offsets[i]:self.instance_offsets[i + 1]])
        if self.layout == "separator":
            pieces = raw.split(bytes([BING_SEPARATOR]))
        else:
            cuts = [0] + [int(c) for c in self.token_offsets[
                self.instance_token_offsets[i]:self.instance_token_offsets[i + 1]]] + [len(raw)]
            pieces = [raw[s:e] for s, e in zip(cuts[:-1], cuts[1:])]
        return [p.decode("utf-8") for p in pieces]

    def instance(self, i):
        """(tokens_a, tokens_b, is_next) of instance i."""
        tokens = self.instance_tokens(i)
        split = int(self.tokens_split[i])
        return tokens[:split], tokens[split:], int(self.is_next[i])

    def token_bounds(self, first, last):
        """Byte bounds of every token of instances [first, last), relative to data[off[first]].

        Returns (starts, ends, instance_first_token) with starts/ends (T,) int64 and
        instance_first_token (last-first+1,) the index of each instance's first token (last = T).
        """
        off = self.instance_offsets[first:last + 1] - self.instance_offsets[first]
        n = last - first
        if self.layout == "separator":
            seps = np.flatnonzero(
                np.asarray(self.data[self.instance_offsets[first]:self.instance_offsets[last]]) == BING_SEPARATOR)
            seps_before = np.searchsorted(seps, off)  # (n+1,) separators before each instance start
            inner_starts = seps + 1
            inner_ends = seps
        else:
            ito = self.instance_token_offsets[first:last + 1]
            rel = np.asarray(self.token_offsets[ito[0]:ito[-1]], dtype=np.int64)
            seps_before = ito - ito[0]  # like separators: one per token after an instance's first
            inner_starts = rel + np.repeat(off[:-1], np.diff(ito))
            inner_ends = None
        first_token = np.arange(n + 1) + seps_before  # (n+1,)
        total = int(first_token[-1])
        starts = np.empty(total, dtype=np.int64)
        is_first = np.zeros(total, dtype=bool)
        is_first[first_token[:-1]] = True
        starts[first_token[:-1]] = off[:-1]
        starts[~is_first] = inner_starts
        ends = np.empty(total, dtype=np.int64)
        is_last = np.zeros(total, dtype=bool)
        is_last[first_token[1:] - 1] = True
        ends[is_last] = off[1:]
        if inner_ends is None:  # offsets layout: a token ends where the next one begins
            ends[~is_last] = starts[1:][~is_last[:-1]]
        else:
            ends[~is_last] = inner_ends
        if total and np.any(ends <= starts):
            token = int(np.flatnonzero(ends <= starts)[0])
            inst = first + int(np.searchsorted(first_token, token, side="right")) - 1
            source = "data.npy (two separators in a row?)" if self.layout == "separator" else "token_offsets.npy"
            raise ShardFormatError(f"Bing shard {self.folder}: instance {inst} has an empty or reversed "
                                   f"token; check {source}")
        return starts, ends, first_token


class VocabIndex:
    """Exact, vectorised lookup of token byte strings in a tokenizer's vocab (a Tokenizer, or a
    WordPiece vocab dict: turing.tokenization.vocab_of).

    Every vocab token is packed into little-endian uint64 words (zero padded) and hashed into
    an open-addressing table (load <= 1/4, linear probing). A data token is looked up by its
    hash and then compared word by word and by length, so the result is exact whatever the
    hash does. Tokens not in the vocab get [UNK].
    """

    def __init__(self, vocab):
        vocab, special, _ = vocab_of(vocab)
        self.unk_id = special["unk"]
        tokens = [t.encode("utf-8") for t in vocab]
        self.row_ids = np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))
        # Every rank keeps a whole shard's ids in memory: 2 bytes a token for BERT-sized vocabs.
        self.id_dtype = np.uint16 if max(self.row_ids.max(), self.unk_id) < (1 << 16) else np.int32
        self.max_len = max(len(t) for t in tokens)
        self.num_words = max(1, (self.max_len + 7) // 8)
        packed = np.zeros((len(tokens), self.num_words * 8), dtype=np.uint8)
        for row, t in enumerate(tokens):
            packed[row, :len(t)] = np.frombuffer(t, dtype=np.uint8)
        words = packed.view("<u8")  # (V, num_words)
        self.words = [np.ascontiguousarray(words[:, k]) for k in range(self.num_words)]
        self.lengths = np.array([len(t) for t in tokens], dtype=np.int64)
        # Distinct hashes make the first hash hit the only candidate; another salt is tried in
        # the (astronomically unlikely) case two vocab tokens collide.
        for salt in range(16):
            hashes = self._hash(self.words, self.lengths, salt)
            if len(np.unique(hashes)) == len(hashes):
                break
        else:
            raise RuntimeError("vocab token hashes collide for every salt")
        self.salt = salt
        bits = max(8, int(np.ceil(np.log2(4 * len(tokens)))))
        self._shift = np.uint64(64 - bits)
        self._table_mask = (1 << bits) - 1
        self.table_rows = np.full(1 << bits, -1, dtype=np.int64)
        self.table_hashes = np.zeros(1 << bits, dtype=np.uint64)
        self.max_probe = 0
        for row, slot in enumerate((hashes >> self._shift).tolist()):
            probe = 0
            while self.table_rows[(slot + probe) & self._table_mask] >= 0:
                probe += 1
            self.table_rows[(slot + probe) & self._table_mask] = row
            self.table_hashes[(slot + probe) & self._table_mask] = hashes[row]
            self.max_probe = max(self.max_probe, probe)

    @staticmethod
    def _hash(words, lengths, salt):
        """Multiply-xor hash of (length, words): cheap, and its high bits (the table slot) mix every input bit."""
        h = (lengths.astype(np.uint64) + np.uint64(salt + 1)) * _GOLDEN
        for w in words:
            h ^= w
            h *= np.uint64(0xD6E8FEB86659FD93)
            h ^= h >> np.uint64(32)
        return h * _GOLDEN

    def lookup(self, data, starts, ends):
        """Vocab ids (T,) (id_dtype) of the tokens data[starts[t]:ends[t]]; data is a 1-D uint8 array."""
        lengths = ends - starts
        # An unaligned little-endian uint64 view at every byte offset: word k of a token is one gather.
        padded = np.zeros(len(data) + 8, dtype=np.uint8)
        padded[:len(data)] = data
        at_byte = np.ndarray(shape=(len(data) + 1,), dtype="<u8", buffer=padded, offset=0, strides=(1,))
        words = []
        for k in range(self.num_words):
            word = at_byte[np.minimum(starts + 8 * k, len(data))]
            word &= _BYTE_MASKS[np.clip(lengths - 8 * k, 0, 8)]
            words.append(word)
        h = self._hash(words, lengths, self.salt)

        slot = (h >> self._shift).astype(np.int64)
        rows = self.table_rows[slot]
        hit = self.table_hashes[slot] == h
        # Most tokens are settled by their first slot: a hit, or an empty slot (not in the vocab).
        pending = np.flatnonzero(~hit & (rows >= 0))
        rows[~hit] = -1
        for probe in range(1, self.max_probe + 1):
            if not len(pending):
                break
            at = (slot[pending] + probe) & self._table_mask
            row = self.table_rows[at]
            hit = self.table_hashes[at] == h[pending]
            rows[pending[hit]] = row[hit]
            pending = pending[~hit & (row >= 0)]
        found = rows >= 0
        safe = np.where(found, rows, 0)
        match = found & (self.lengths[safe] == lengths)
        for vocab_word, word in zip(self.words, words):
            match &= vocab_word[safe] == word
        return np.where(match, self.row_ids[safe], self.unk_id).astype(self.id_dtype)


@dataclass
class TokenizedShard:
    """A shard with its tokens as vocab ids, ready for batch building.

    ids (T,) vocab ids (uint16 or int32) of every token; first_token (N+1,) index into ids of
    each instance's first token; tokens_split (N,); is_next (N,); name: where it came from.
    """
    ids: np.ndarray
    first_token: np.ndarray
    tokens_split: np.ndarray
    is_next: np.ndarray
    name: str

    def __len__(self):
        return len(self.tokens_split)

    @classmethod
    def concatenate(cls, parts, name):
        shifts = np.cumsum([0] + [len(p.ids) for p in parts[:-1]])
        first_token = np.concatenate([p.first_token[:-1] + s for p, s in zip(parts, shifts)]
                                     + [np.array([sum(len(p.ids) for p in parts)])])
        return cls(np.concatenate([p.ids for p in parts]), first_token,
                   np.concatenate([p.tokens_split for p in parts]),
                   np.concatenate([p.is_next for p in parts]), name)


def tokenize_shard(shard, vocab_index):
    """Map every token of a BingShard to its vocab id in one vectorised pass (in byte chunks)."""
    n = len(shard)
    offsets = shard.instance_offsets
    ids_parts, first_parts = [], []
    done_tokens = 0
    first = 0
    while first < n:
        last = int(np.searchsorted(offsets, offsets[first] + _MAP_CHUNK_BYTES, side="right")) - 1
        last = min(max(last, first + 1), n)
        starts, ends, first_token = shard.token_bounds(first, last)
        chunk = np.asarray(shard.data[offsets[first]:offsets[last]])
        ids_parts.append(vocab_index.lookup(chunk, starts, ends))
        first_parts.append(first_token[:-1] + done_tokens)
        done_tokens += int(first_token[-1])
        first = last
    ids = np.concatenate(ids_parts) if ids_parts else np.zeros(0, dtype=vocab_index.id_dtype)
    first_token = np.concatenate(first_parts + [np.array([done_tokens], dtype=np.int64)])
    counts = np.diff(first_token)
    if n and np.any(shard.tokens_split > counts):
        bad = int(np.flatnonzero(shard.tokens_split > counts)[0])
        raise ShardFormatError(f"Bing shard {shard.folder}: tokens_split.npy says instance {bad} has "
                               f"{int(shard.tokens_split[bad])} tokens in segment A but it has only "
                               f"{int(counts[bad])} tokens")
    unk_share = float(np.mean(ids == vocab_index.unk_id)) if len(ids) else 0.0
    logger.debug("%s: %d instances, %d tokens, %.2f%% [UNK]", shard.folder, n, len(ids), 100 * unk_share)
    return TokenizedShard(ids, first_token, np.array(shard.tokens_split), np.array(shard.is_next),
                          shard.folder)


# ---------------------------------------------------------------- counter-based random numbers


def _stream_key(*parts):
    """One uint64 key from a few Python ints (any sign), mixed step by step."""
    key = np.zeros(1, dtype=np.uint64)
    for p in parts:
        key = _splitmix(key ^ np.uint64(p & _MASK64))
        key = key + _GOLDEN
    return key


def sample_random_bits(key, indices, length, stream):
    """(B, length) uint64 random bits for samples `indices`, a function of (key, index, position, stream)."""
    per_sample = _splitmix(key ^ _splitmix(indices.astype(np.uint64) * _GOLDEN + np.uint64(stream)))
    positions = np.arange(length, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
    return _splitmix(per_sample[:, None] + positions[None, :])


def _uniform(bits):
    """uint64 bits -> float64 uniform in [0, 1)."""
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def epoch_sample_order(num_samples, seed, epoch, rank=0, world=1, salt=0):
    """This rank's sample indices for an epoch: a seeded permutation split over ranks.

    Like DistributedSampler(shuffle=True, drop_last=True): every rank gets num_samples // world
    samples, so all ranks run the same number of steps. Depends on (seed, epoch, salt, rank, world) only.
    """
    rng = np.random.default_rng([seed & _MASK64, epoch & _MASK64, salt & _MASK64])
    perm = rng.permutation(num_samples)
    per_rank = num_samples // world
    return perm[rank:per_rank * world:world]


def truncate_pair(len_a, len_b, max_tokens):
    """Lengths after trimming the longer segment (B on ties) one token at a time to fit max_tokens.

    Vectorised closed form of BERT's truncate_seq_pair; tokens are removed from the end.
    """
    over = len_a + len_b > max_tokens
    half_up = (max_tokens + 1) // 2
    new_a = np.minimum(len_a, np.maximum(max_tokens - len_b, half_up))
    new_a = np.where(over, new_a, len_a)
    new_b = np.where(over, max_tokens - new_a, len_b)
    return new_a, new_b


class BingPretrainDataset(Dataset):
    """Masked `[CLS] A [SEP] B [SEP]` samples of a TokenizedShard, built a micro batch at a time.

    `build_batch(indices)` makes a Batch for a list of sample indices in one numpy pass;
    `__getitem__`/`__getitems__` serve a DataLoader (per-sample Batch of 1-D tensors, to be
    stacked by turing.batch.collate_batch). Masking depends on (seed, epoch, salt, index) only;
    call set_epoch() to get fresh masks each epoch. `masked_lm_prob` of the tokens (at most
    max_predictions_per_seq a row) are predicted; `mask_split` = (mask, random, keep) shares
    of those become [MASK], a random token or stay (the original: 15%, 80/10/10).
    """

    def __init__(self, shard, vocab, max_seq_length, max_predictions_per_seq, seed, salt=0, epoch=0,
                 masked_lm_prob=MASKED_SHARE, mask_split=MASK_SPLIT):
        if max_seq_length < 3:
            raise InputValueError(f"max_seq_length must be at least 3 for [CLS] A [SEP] B [SEP]; got {max_seq_length}")
        self.shard = shard
        _, special, self.vocab_size = vocab_of(vocab)   # a Tokenizer, or a WordPiece vocab dict
        self.cls_id, self.sep_id, self.mask_id = special["cls"], special["sep"], special["mask"]
        self.max_seq_length = max_seq_length
        self.max_predictions_per_seq = max_predictions_per_seq
        self.seed = seed
        self.salt = salt
        self.masked_lm_prob = masked_lm_prob
        self.mask_split = tuple(mask_split)
        self.set_epoch(epoch)

    def set_epoch(self, epoch):
        self.epoch = epoch
        self._key = _stream_key(self.seed, self.epoch, self.salt)

    def __len__(self):
        return len(self.shard)

    def __getitem__(self, index):
        return self.__getitems__([index])[0]

    def __getitems__(self, indices):
        batch = self.build_batch(indices)
        return [Batch(*(field[row] for field in batch)) for row in range(len(indices))]

    def build_batch(self, indices):
        """Batch of int64 tensors for sample `indices`: ids/mask/segments/labels (B, L), others (B,)."""
        idx = np.asarray(indices, dtype=np.int64)
        length = self.max_seq_length
        shard = self.shard
        start = shard.first_token[idx]
        len_a = shard.tokens_split[idx]
        len_b = shard.first_token[idx + 1] - start - len_a
        a, b = truncate_pair(len_a, len_b, length - 3)
        used = a + b + 3  # (B,) real tokens incl. [CLS] and two [SEP]

        pos = np.arange(length)[None, :]  # (1, L)
        b_first = (a + 2)[:, None]        # position of B's first token
        in_a = (pos >= 1) & (pos <= a[:, None])
        in_b = (pos >= b_first) & (pos < b_first + b[:, None])
        words = in_a | in_b               # (B, L) candidates for masking: all but [CLS]/[SEP]/pad
        src = np.where(in_a, start[:, None] + pos - 1, (start + len_a)[:, None] + pos - b_first)
        input_ids = np.where(words, shard.ids[np.where(words, src, 0)], 0).astype(np.int64)
        input_ids[:, 0] = self.cls_id
        rows = np.arange(len(idx))
        input_ids[rows, a + 1] = self.sep_id
        input_ids[rows, used - 1] = self.sep_id
        input_mask = pos < used[:, None]
        segment_ids = (pos >= b_first) & input_mask

        input_ids, labels = self._mask(idx, input_ids, words, used)
        as_tensor = torch.from_numpy
        return Batch(
            batch_type=torch.full((len(idx),), int(BatchType.PRETRAIN_BATCH), dtype=torch.int64),
            input_ids=as_tensor(input_ids),
            input_mask=as_tensor(input_mask.astype(np.int64)),
            segment_ids=as_tensor(segment_ids.astype(np.int64)),
            next_sentence_labels=as_tensor(shard.is_next[idx].astype(np.int64)),
            masked_lm_labels=as_tensor(labels),
        )

    def _mask(self, idx, input_ids, words, used):
        """Dynamic masking of a whole batch: in each row, round(masked_lm_prob x tokens used) of
        its word positions (at least 1, at most max_predictions_per_seq; never [CLS], [SEP] or
        padding), chosen uniformly, are predicted; of those a mask_split[0] share becomes [MASK],
        a mask_split[1] share a random vocab id, the rest keeps its token (the original's 15%,
        80/10/10 by default). Returns (masked ids, labels with -1 = none)."""
        length = input_ids.shape[1]
        n_words = words.sum(axis=1)
        n_pred = np.minimum(self.max_predictions_per_seq, np.maximum(1, np.rint(used * self.masked_lm_prob)))
        n_pred = np.minimum(n_pred, n_words).astype(np.int64)  # (B,)

        # A uniformly random subset of n_pred candidates per row: the n_pred smallest random keys.
        # The low bits carry the position, so keys in a row are distinct and exactly n_pred win.
        low = np.uint64((1 << max(1, (length - 1).bit_length())) - 1)
        keys = (sample_random_bits(self._key, idx, length, 0) & ~low) | np.arange(length, dtype=np.uint64)
        keys[~words] = np.uint64(_MASK64)
        sorted_keys = np.sort(keys, axis=1)
        threshold = sorted_keys[np.arange(len(idx)), np.maximum(n_pred - 1, 0)]
        chosen = (keys <= threshold[:, None]) & words & (n_pred[:, None] > 0)

        labels = np.where(chosen, input_ids, -1)
        roll = _uniform(sample_random_bits(self._key, idx, length, 1))
        mask_share, random_share, _ = self.mask_split  # (mask, random, keep)
        to_mask = chosen & (roll < mask_share)
        to_random = chosen & (roll >= 1.0 - random_share)  # roll in between keeps the token
        random_ids = (_uniform(sample_random_bits(self._key, idx, length, 2)) * self.vocab_size).astype(np.int64)
        masked = np.where(to_mask, self.mask_id, np.where(to_random, random_ids, input_ids))
        return masked, labels


def open_tokenized_shard(folder, vocab, vocab_index=None):
    """Open, check and tokenize one shard folder."""
    return tokenize_shard(BingShard(folder), vocab_index or VocabIndex(vocab))


def open_validation_dataset(path, vocab, args):
    """The validation set in the Bing layout, as a map-style Dataset.

    `path` is a shard folder or a folder of shard folders (all used, in sorted order). Uses
    args.seed, args.max_seq_length and args.max_predictions_per_seq; the masking is fixed by
    the seed and the sample index, and always the original's 15% with 80/10/10 whatever the
    training masks, so the validation loss and accuracy compare across epochs and recipes.
    Items are per-sample Batches; batch them with turing.batch.collate_batch.
    """
    if not os.path.isdir(path):
        raise InputFileNotFoundError(f"validation set folder {path} does not exist")
    if is_bing_shard(path):
        folders = [path]
    else:
        folders = [os.path.join(path, d) for d in sorted(os.listdir(path))
                   if os.path.isdir(os.path.join(path, d))]
        if not folders:
            raise ShardFormatError(f"validation set {path} holds neither data.npy nor shard folders")
    index = VocabIndex(vocab)
    parts = [open_tokenized_shard(f, vocab, index) for f in folders]
    shard = TokenizedShard.concatenate(parts, path) if len(parts) > 1 else parts[0]
    logger.info("validation set %s: %d shard(s), %d samples", path, len(parts), len(shard))
    return BingPretrainDataset(shard, vocab, args.max_seq_length, args.max_predictions_per_seq,
                               args.seed, salt=VALIDATION_SALT)


def describe_shard(folder, vocab_file=None, count=3, max_seq_length=128, max_predictions_per_seq=20, seed=42):
    """Lines showing the first `count` instances of a shard (and their masked rows given its tokenizer)."""
    shard = BingShard(folder)
    lines = [f"{folder}: {len(shard)} instances, {len(shard.data)} bytes, {shard.layout} layout"]
    for i in range(min(count, len(shard))):
        a, b, is_next = shard.instance(i)
        lines.append(f"[{i}] is_next={is_next}  A: {' '.join(a)}  |  B: {' '.join(b)}")
    if vocab_file:
        vocab = load_tokenizer(vocab_file)
        inv = vocab.ids_to_tokens
        dataset = BingPretrainDataset(tokenize_shard(shard, VocabIndex(vocab)), vocab, max_seq_length,
                                      max_predictions_per_seq, seed)
        batch = dataset.build_batch(list(range(min(count, len(shard)))))
        for row in range(len(batch.input_ids)):
            used = int(batch.input_mask[row].sum())
            shown = []
            for tok, lab in zip(batch.input_ids[row, :used].tolist(), batch.masked_lm_labels[row, :used].tolist()):
                shown.append(inv.get(tok, "?") if lab < 0 else f"{inv.get(tok, '?')}<{inv.get(lab, '?')}>")
            lines.append(f"[{row}] masked: {' '.join(shown)}")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description="Print a few decoded instances of a Bing shard folder")
    parser.add_argument("folder")
    parser.add_argument("--vocab", "--tokenizer", dest="vocab", default=None,
                        help="the tokenizer (vocab.txt, tokenizer.json or a folder holding one): also show masked "
                             "model inputs")
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--max_seq_length", type=int, default=128)
    args = parser.parse_args(argv)
    try:
        lines = describe_shard(args.folder, args.vocab, args.count, args.max_seq_length)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

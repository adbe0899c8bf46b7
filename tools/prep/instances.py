"""A chunk's token ids to its training sequences, in the workers: BERT's
create_instances_from_document on token spans (sentence pairs, random next sentences, truncation),
then the arrays of either format: statically masked NVIDIA rows, or Bing token strings."""
import numpy as np

from tools.prep.tokens import concat_ranges
from turing.formats import BING_SEPARATOR


def truncation(len_a, len_b, max_num_tokens):
    """How many tokens BERT's truncate_seq_pair removes from A and from B.

    It removes one token at a time from the longer segment (B on a tie) until the pair fits;
    the counts follow in closed form: first the longer one down to the other's length, then
    alternately starting with B.
    """
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0
    remove_a = remove_b = 0
    if len_a > len_b:
        remove_a = min(excess, len_a - len_b)
    else:
        remove_b = min(excess, len_b - len_a)
    rest = excess - remove_a - remove_b
    return remove_a + rest // 2, remove_b + rest - rest // 2


def create_instance_spans(docs, settings, rng):
    """BERT's create_instances_from_document over a chunk's documents, on token spans.

    `docs`: per document (first token offset in the chunk's flat token array, list of
    sentence token counts). Returns int64 arrays a_start, a_len, b_start, b_len and int8
    is_random: segment A is tokens[a_start:a_start + a_len], B likewise. Sentences of a
    document are contiguous in the flat array, so every segment is one span.
    """
    max_num_tokens = settings.max_seq_length - 3
    # Per document, token offset of each sentence start (n + 1 entries, absolute).
    offsets = []
    for start, lens in docs:
        acc, cum = start, [start]
        for n in lens:
            acc += n
            cum.append(acc)
        offsets.append(cum)
    out = ([], [], [], [], [])
    a_starts, a_lens, b_starts, b_lens, randoms = out
    rand = rng.random

    def randint(low, high):
        # random.randint's distribution at a third of its cost (the ranges here are small).
        return low + int(rand() * (high - low + 1))

    num_docs = len(docs)
    for _ in range(settings.dupe_factor):
        for d in range(num_docs):
            cum = offsets[d]
            n_sent = len(cum) - 1
            # As BERT: one target length per document, sometimes shorter to match fine-tuning.
            target = max_num_tokens
            if rand() < settings.short_seq_prob:
                target = randint(2, max_num_tokens)
            first = 0            # first sentence of the current chunk of sentences
            i = 0
            while i < n_sent:
                if i == n_sent - 1 or cum[i + 1] - cum[first] >= target:
                    count = i + 1 - first
                    a_end = randint(1, count - 1) if count >= 2 else 1
                    a_start, a_len = cum[first], cum[first + a_end] - cum[first]
                    if count == 1 or rand() < 0.5:
                        is_random = 1
                        target_b = target - a_len
                        # Ten tries for another document, as BERT (a lone document gets itself).
                        for _ in range(10):
                            r = randint(0, num_docs - 1)
                            if r != d:
                                break
                        rcum = offsets[r]
                        r_n = len(rcum) - 1
                        r_start = randint(0, r_n - 1)
                        j = r_start
                        while j < r_n and rcum[j + 1] - rcum[r_start] < target_b:
                            j += 1
                        j = min(j, r_n - 1)
                        b_start, b_len = rcum[r_start], rcum[j + 1] - rcum[r_start]
                        # The unused sentences of this chunk start the next one.
                        i -= count - a_end
                    else:
                        is_random = 0
                        b_start, b_len = cum[first + a_end], cum[i + 1] - cum[first + a_end]
                    cut_a, cut_b = truncation(a_len, b_len, max_num_tokens)
                    if cut_a:
                        # Each removal is from the front or the back with even odds.
                        front = rng.getrandbits(cut_a).bit_count()
                        a_start += front
                        a_len -= cut_a
                    if cut_b:
                        front = rng.getrandbits(cut_b).bit_count()
                        b_start += front
                        b_len -= cut_b
                    a_starts.append(a_start)
                    a_lens.append(a_len)
                    b_starts.append(b_start)
                    b_lens.append(b_len)
                    randoms.append(is_random)
                    first = i + 1
                i += 1
    return tuple(np.array(x, dtype=np.int64) for x in out[:4]) + (np.array(randoms, dtype=np.int8),)


def nvidia_arrays(tokens, spans, settings, rng):
    """Statically masked NVIDIA arrays for instances given as spans into `tokens`.

    Sequence: [CLS] A [SEP] B [SEP], zero-padded to L. Masking as create_pretraining_data.py:
    num_to_predict = min(P, max(1, round(n_tokens * prob))) of the A/B positions in random
    order, each 80% [MASK], 10% kept, 10% a uniformly random vocab id; positions sorted,
    positions and ids right-padded with 0. Returns a dict of the six hdf5 datasets.
    """
    a_start, a_len, b_start, b_len, is_random = spans
    n, L, P = len(a_len), settings.max_seq_length, settings.max_predictions_per_seq
    pos = np.arange(L, dtype=np.int64)[None, :]                               # (1, L)
    la, lb = a_len[:, None], b_len[:, None]                                   # (n, 1)
    n_tokens = la + lb + 3
    in_a = (pos >= 1) & (pos <= la)
    in_b = (pos >= la + 2) & (pos < la + 2 + lb)
    src = np.where(in_a, a_start[:, None] + pos - 1, b_start[:, None] + pos - la - 2)
    src = np.where(in_a | in_b, src, 0)
    ids = np.where(in_a | in_b, tokens[src], 0).astype(np.int32)             # (n, L)
    rows = np.arange(n)
    ids[:, 0] = settings.cls_id
    ids[rows, a_len + 1] = settings.sep_id
    ids[rows, a_len + b_len + 2] = settings.sep_id
    input_mask = (pos < n_tokens).astype(np.int8)
    segment_ids = ((pos >= la + 2) & (pos < n_tokens)).astype(np.int8)

    # Python's round (half to even), as the original: np.rint rounds the same way.
    num_to_predict = np.minimum(P, np.maximum(1, np.rint(n_tokens[:, 0] * settings.masked_lm_prob)))
    num_to_predict = np.minimum(num_to_predict, a_len + b_len).astype(np.int64)   # (n,)
    # A random order of the candidates: sort random keys, non-candidates last.
    keys = rng.random((n, L))
    keys[~(in_a | in_b)] = 2.0
    k = P                                                                     # P <= L - 3 < L
    smallest = np.argpartition(keys, k - 1, axis=1)[:, :k]
    order = np.argsort(np.take_along_axis(keys, smallest, axis=1), axis=1)
    chosen = np.take_along_axis(smallest, order, axis=1)                      # (n, k) random order
    valid = np.arange(k)[None, :] < num_to_predict[:, None]
    positions = np.sort(np.where(valid, chosen, L), axis=1)                   # sorted, unused = L
    valid = positions < L
    positions = np.where(valid, positions, 0)
    original = np.take_along_axis(ids, positions, axis=1)
    masked_lm_ids = np.where(valid, original, 0).astype(np.int32)
    u = rng.random((n, k))
    random_ids = rng.integers(0, settings.vocab_size, size=(n, k))
    replacement = np.where(u < 0.8, settings.mask_id, np.where(u < 0.9, original, random_ids))
    r, c = np.nonzero(valid)
    ids[r, positions[r, c]] = replacement[r, c]
    return {
        "input_ids": ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": masked_lm_ids,
        "next_sentence_labels": is_random.astype(np.int8),
    }


class VocabBytes:
    """The utf-8 bytes of every vocab token, for vectorised string output.

    `table` row i is the separator byte then token i's bytes, padded (V, 1 + longest);
    a gather from it plus a mask is the fastest way to write millions of tokens. With very
    long tokens the table would be wasteful, and a flat gather is used instead.
    """

    MAX_TABLE_WIDTH = 64

    def __init__(self, tokens_by_id):
        encoded = [t.encode("utf-8") for t in tokens_by_id]
        self.blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        self.length = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        self.start = np.cumsum(self.length) - self.length
        width = 1 + int(self.length.max())
        self.table = None
        if width <= self.MAX_TABLE_WIDTH:
            self.table = np.full((len(encoded), width), BING_SEPARATOR, dtype=np.uint8)
            rows = np.repeat(np.arange(len(encoded)), self.length)
            cols = 1 + np.arange(len(self.blob)) - np.repeat(self.start, self.length)
            self.table[rows, cols] = self.blob

    def strings(self, ids, separator_before):
        """The bytes of tokens `ids` in order, each preceded by 0x1f where separator_before."""
        length = self.length[ids]
        if self.table is not None:
            width = 1 + int(length.max(initial=0))        # only the columns these tokens use
            col = np.arange(width)[None, :]
            keep = (col >= ~separator_before[:, None]) & (col <= length[:, None])
            return self.table[ids, :width][keep]
        out_len = length + separator_before
        data = np.full(int(out_len.sum()), BING_SEPARATOR, dtype=np.uint8)
        text_start = np.cumsum(out_len) - length
        data[concat_ranges(text_start, length)] = self.blob[concat_ranges(self.start[ids], length)]
        return data


def bing_arrays(tokens, spans, settings, vocab_bytes):
    """Bing shard arrays for instances given as spans: the token strings of A then B.

    Returns data (uint8), instance_lengths (bytes per instance), tokens_split (tokens in A),
    is_next, and for the offsets layout token_offsets (in-instance byte offset of every
    token but the first) with tokens_per_instance.
    """
    a_start, a_len, b_start, b_len, is_random = spans
    seg_start = np.stack([a_start, b_start], axis=1).ravel()                  # A0 B0 A1 B1 ...
    seg_len = np.stack([a_len, b_len], axis=1).ravel()
    ids = tokens[concat_ranges(seg_start, seg_len)]                                  # (T,) all tokens
    per_instance = a_len + b_len
    first = np.zeros(len(ids), dtype=bool)
    first[np.cumsum(per_instance) - per_instance] = True
    separators = settings.bing_layout == "separator"
    # Separator layout: a 0x1f before every token but an instance's first.
    separator_before = ~first if separators else np.zeros(len(ids), dtype=bool)
    data = vocab_bytes.strings(ids, separator_before)
    out_len = vocab_bytes.length[ids] + separator_before
    out_start = np.cumsum(out_len) - out_len
    instance_start = out_start[first]
    result = {
        "data": data,
        "instance_lengths": np.diff(np.append(instance_start, len(data))),
        "tokens_split": a_len.astype(np.int32),
        "is_next": is_random.astype(np.int8),
    }
    if not separators:
        owner = np.repeat(np.arange(len(a_len)), per_instance)
        result["token_offsets"] = (out_start - instance_start[owner])[~first].astype(np.int32)
        result["tokens_per_instance"] = per_instance
    return result

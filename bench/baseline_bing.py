"""The straightforward per-sample Bing data path, kept only as the speed baseline of bench_data.py.

Owns nothing used in training. It does what the original did per sample: decode the token
strings of one instance from the memory-mapped shard in Python, build `[CLS] A [SEP] B [SEP]`,
mask with Python's `random`, look every token up in the vocab dict, pad, and let the default
DataLoader collation stack the samples.
"""
import logging
import random

import numpy as np
import torch
from torch.utils.data import Dataset

from turing.tokenization import special_token_ids

logger = logging.getLogger(__name__)

SEPARATOR = "\x1f"


class PerSampleBingDataset(Dataset):
    """One masked sample per __getitem__, from a separator-layout shard folder."""

    def __init__(self, folder, vocab, max_seq_length, max_predictions_per_seq, seed=42):
        self.data = np.load(f"{folder}/data.npy", mmap_mode="r", allow_pickle=False)
        self.offsets = np.load(f"{folder}/instance_offsets.npy", mmap_mode="r", allow_pickle=False)
        self.split = np.load(f"{folder}/tokens_split.npy", mmap_mode="r", allow_pickle=False)
        self.is_next = np.load(f"{folder}/is_next.npy", mmap_mode="r", allow_pickle=False)
        self.vocab = vocab
        self.vocab_words = list(vocab)
        special = special_token_ids(vocab)
        self.unk_id = special["unk"]
        self.max_seq_length = max_seq_length
        self.max_predictions_per_seq = max_predictions_per_seq
        self.rng = random.Random(seed)

    def __len__(self):
        return len(self.split)

    def __getitem__(self, i):
        raw = self.data[self.offsets[i]:self.offsets[i + 1]].tobytes().decode("utf-8")
        tokens = raw.split(SEPARATOR)
        split = int(self.split[i])
        tokens_a, tokens_b = tokens[:split], tokens[split:]
        while len(tokens_a) + len(tokens_b) > self.max_seq_length - 3:
            (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()
        tokens = ["[CLS]"] + tokens_a + ["[SEP]"] + tokens_b + ["[SEP]"]
        segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)

        candidates = [j for j, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
        self.rng.shuffle(candidates)
        n_pred = min(self.max_predictions_per_seq, max(1, round(len(tokens) * 0.15)))
        labels = [-1] * len(tokens)
        for j in candidates[:n_pred]:
            labels[j] = self.vocab.get(tokens[j], self.unk_id)
            roll = self.rng.random()
            if roll < 0.8:
                tokens[j] = "[MASK]"
            elif roll >= 0.9:
                tokens[j] = self.rng.choice(self.vocab_words)
        input_ids = [self.vocab.get(t, self.unk_id) for t in tokens]
        pad = self.max_seq_length - len(input_ids)
        input_mask = [1] * len(input_ids) + [0] * pad
        return (torch.tensor(2), torch.tensor(input_ids + [0] * pad), torch.tensor(input_mask),
                torch.tensor(segment_ids + [0] * pad), torch.tensor(int(self.is_next[i])),
                torch.tensor(labels + [-1] * pad))

"""The original's per-sample NVIDIA hdf5 dataset, kept only as the speed baseline of bench_data.py.

Owns nothing used in training. It does what DeepSpeedExamples' (and NVIDIA's)
`pretraining_dataset` did: read the six arrays of a shard into numpy once, then per sample
slice each array, convert it to an int64 torch tensor, build `masked_lm_labels` (-1
everywhere, `masked_lm_ids` at `masked_lm_positions`, the listing ending at the first 0
position) and return the six fields in the original order; the default DataLoader collation
stacks the samples.
"""
import logging

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

logger = logging.getLogger(__name__)

KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
        "next_sentence_labels")
PRETRAIN_BATCH = 2


class PerSampleNvidiaDataset(Dataset):
    """One sample per __getitem__ from an NVIDIA hdf5 shard held in memory as numpy arrays."""

    def __init__(self, path, max_pred_length):
        self.max_pred_length = max_pred_length
        with h5py.File(path, "r") as f:
            self.inputs = [np.asarray(f[key][:]) for key in KEYS]

    def __len__(self):
        return len(self.inputs[0])

    def __getitem__(self, index):
        input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids, next_sentence_labels = [
            torch.from_numpy(np.asarray(array[index].astype(np.int64))) for array in self.inputs]
        masked_lm_labels = torch.ones(input_ids.shape, dtype=torch.long) * -1
        count = self.max_pred_length
        padded = (masked_lm_positions == 0).nonzero()
        if len(padded) != 0:
            count = padded[0].item()
        masked_lm_labels[masked_lm_positions[:count]] = masked_lm_ids[:count]
        return [torch.LongTensor([PRETRAIN_BATCH]), input_ids, input_mask, segment_ids,
                next_sentence_labels, masked_lm_labels]

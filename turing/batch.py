"""The batch every provider yields and the model consumes.

A NamedTuple keeps the original's positional order, so `batch[1]` and `batch.input_ids`
both work. Shapes for a micro batch of B sequences of length L:
batch_type (B,), input_ids/input_mask/segment_ids/masked_lm_labels (B, L),
next_sentence_labels (B,); all int64; masked_lm_labels is -1 where nothing is predicted.
"""
from enum import IntEnum
from typing import NamedTuple

import torch


class BatchType(IntEnum):
    """The original's batch kinds; pretraining is the only one this program makes (value 2, as
    the original numbered it)."""
    PRETRAIN_BATCH = 2


class Batch(NamedTuple):
    batch_type: torch.Tensor
    input_ids: torch.Tensor
    input_mask: torch.Tensor
    segment_ids: torch.Tensor
    next_sentence_labels: torch.Tensor
    masked_lm_labels: torch.Tensor


def collate_batch(items):
    """DataLoader collate: stack per-field tensors (or numpy arrays) into a Batch (a dataset that
    yields whole batches already: as they are)."""
    if isinstance(items, Batch):
        return items
    return Batch(*(torch.stack([torch.as_tensor(x) for x in field]) for field in zip(*items)))


def as_batch(batch):
    """A Batch of `batch` (a Batch, or any sequence of the six fields in their order, as the
    original's callers pass a list), so the model reads fields by name."""
    return batch if isinstance(batch, Batch) else Batch(*batch)

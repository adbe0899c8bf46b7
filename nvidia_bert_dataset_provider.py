"""NVIDIA hdf5 pretraining shards, the `--use_nvidia_dataset` provider.

Owns: the choice of shard file per (epoch, rank), turning `masked_lm_positions`/`masked_lm_ids`
into per-token labels, the DataLoader over a shard, and loading the next epoch's shard in a
background process while this one trains (turing.shard_prefetch). The format itself (keys, dtypes, the layout and
value checks, reading a shard) is turing.formats'.
"""
import logging
import os
import random

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset

from bert_dataset_provider import (BertDatasetProviderInterface, DataSettings, EpochPlan, ignore_stop_signals,
                                   remap_epoch, stop_signals_held)
from turing.batch import Batch, BatchType
from turing.errors import InputFileNotFoundError, InputValueError
from turing.formats import HDF5_KEYS, HDF5_SUFFIXES, check_hdf5_shard, holds_nvidia_validation, read_hdf5_shard
from turing.process import get_rank_and_world, set_seeds
from turing.shard_prefetch import ShardPrefetch

logger = logging.getLogger(__name__)

def labels_from_positions(positions, ids):
    """Per-token MLM labels for a batch: -1 everywhere, ids at the listed positions.

    positions/ids: (B, P); the listing of a row ends at its first 0 position (P if none),
    as position 0 always holds [CLS] and is never masked. Returns (B, L) filled later by caller.
    """
    valid = np.cumprod(positions != 0, axis=1).astype(bool)  # (B, P): True up to the first 0
    rows = np.nonzero(valid)[0]
    return rows, positions[valid], ids[valid]


class PretrainingHdf5Dataset(Dataset):
    """One shard in memory; `__getitems__` builds a whole Batch with numpy fancy indexing."""

    def __init__(self, arrays, path="<memory>", vocab_size=None):
        self.path = path
        self.arrays = arrays
        if vocab_size is not None:
            ids = arrays["input_ids"]
            top = max(int(ids.max(initial=0)), int(arrays["masked_lm_ids"].max(initial=0)))
            if top >= vocab_size:
                raise InputValueError(f"{path}: token id {top} outside the vocab of {vocab_size} entries; "
                                 f"was the shard made with another vocab.txt?")

    def __len__(self):
        return len(self.arrays["input_ids"])

    def __getitem__(self, index):
        return Batch(*(t[0] for t in self.__getitems__([index])))  # one sample, no batch dim

    def __getitems__(self, indices):
        idx = np.asarray(indices, dtype=np.int64)
        a = self.arrays
        input_ids = a["input_ids"][idx].astype(np.int64)
        labels = np.full_like(input_ids, -1)
        rows, cols, ids = labels_from_positions(a["masked_lm_positions"][idx], a["masked_lm_ids"][idx])
        labels[rows, cols] = ids
        return Batch(
            batch_type=torch.full((len(idx),), int(BatchType.PRETRAIN_BATCH), dtype=torch.long),
            input_ids=torch.from_numpy(input_ids),
            input_mask=torch.from_numpy(a["input_mask"][idx].astype(np.int64)),
            segment_ids=torch.from_numpy(a["segment_ids"][idx].astype(np.int64)),
            next_sentence_labels=torch.from_numpy(a["next_sentence_labels"][idx].astype(np.int64)),
            masked_lm_labels=torch.from_numpy(labels),
        )


def _identity(batch):
    return batch


class _WorkerInit:
    """Seeds numpy/random/torch of each DataLoader worker with seed + local_rank + worker_id;
    the worker ignores stop signals (the rank handles them)."""

    def __init__(self, seed):
        self.seed = seed

    def __call__(self, worker_id):
        ignore_stop_signals()
        set_seeds(self.seed + worker_id)


def list_training_files(folder):
    """Shard files of a folder: names containing 'training', sorted."""
    if not os.path.isdir(folder):
        raise InputFileNotFoundError(f"{folder}: pretraining data folder not found "
                                f"(config data.mixed_seq_datasets.<seq>.pretrain_dataset under --data_path_prefix)")
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder)
                   if "training" in f and os.path.isfile(os.path.join(folder, f)))
    if not files:
        raise InputFileNotFoundError(f"{folder}: no shard files with 'training' in the name "
                                f"(expected NVIDIA hdf5 shards such as x_training_shard0.hdf5)")
    return files


def shard_file_index(epoch, rank, world, num_files):
    """Index of the file a rank reads in an epoch: epoch x world + rank, shifted by
    (world mod files) x epoch when there are more ranks than files, modulo the file count
    (the original's rule)."""
    index = epoch * world + rank
    if world > num_files:
        index += (world % num_files) * epoch
    return index % num_files


class NvidiaBertDatasetProvider(BertDatasetProviderInterface):
    def __init__(self, args):
        settings = DataSettings.of(args)
        self.rank, self.world = get_rank_and_world()
        self.local_rank = max(settings.local_rank, 0)
        self.seed = settings.seed
        self.micro_batch = settings.train_micro_batch_size_per_gpu
        self.grad_accum = settings.gradient_accumulation_steps
        job = settings.job
        self.num_workers = job.training.num_workers
        self.vocab_size = settings.vocab_size
        self.max_seq_length = settings.max_seq_length
        folder = os.path.join(settings.data_path_prefix, job.datasets["pretrain_dataset"])
        self.files = list_training_files(folder)
        # Same shuffle on every rank: the per-rank formula below relies on a shared order.
        random.Random(settings.seed).shuffle(self.files)
        # check_shards() opens every shard before the model is built.
        self._future = None          # (epoch, ShardPrefetch) of the shard being read in the background
        self._loader = None
        logger.info("NVIDIA provider: %d shard files in %s, rank %d of %d", len(self.files), folder,
                    self.rank, self.world)

    holds_validation_set = staticmethod(holds_nvidia_validation)

    @staticmethod
    def validation_dataset(path, args):
        """Every .hdf5/.h5 file of `path`, in sorted order, read whole and checked against the
        sequence length and the vocab size."""
        files = sorted(f for f in os.listdir(path) if f.endswith(HDF5_SUFFIXES))
        paths = [os.path.join(path, f) for f in files]
        parts = [PretrainingHdf5Dataset(read_hdf5_shard(p, args.max_seq_length), p, args.vocab_size) for p in paths]
        return parts[0] if len(parts) == 1 else ConcatDataset(parts)

    def check_shards(self):
        """Layout, sequence length and size of every training shard (cheap: no data is read), in
        file name order, so that a wrong or too small shard fails before any training, naming the
        first such file. A rank reads one whole shard an epoch, so each must hold at least the
        micro batch x gradient accumulation of one optimizer step."""
        step = self.micro_batch * self.grad_accum
        sizes = {path: check_hdf5_shard(path, self.max_seq_length) for path in sorted(self.files)}
        small = [path for path, samples in sizes.items() if samples < step]
        if small:
            total = sum(sizes.values())
            fix = (f"make fewer, larger shards (prepare_data --num_shards {total // step} or fewer: the {total} "
                   f"samples make {total // step} of {step}), or train with a smaller batch" if total >= step
                   else f"the {total} samples of all {len(sizes)} shards are fewer than one step: train with a "
                        f"smaller batch, or on more data")
            raise InputValueError(
                f"{small[0]}: {sizes[small[0]]} samples, fewer than the micro batch of {self.micro_batch} x "
                f"{self.grad_accum} gradient accumulation steps: an epoch on this shard would train 0 steps "
                f"({len(small)} of the {len(sizes)} shards hold fewer than {step}, and a rank reads one whole shard "
                f"an epoch); {fix}")

    def training_folders(self):
        return sorted({os.path.dirname(f) for f in self.files})

    def shard_path(self, index):
        return self.files[shard_file_index(index, self.rank, self.world, len(self.files))]

    def _dataset(self, index):
        path = self.shard_path(index)
        if self._future is not None and self._future[0] == index:
            reader, self._future = self._future[1], None
            arrays = reader.result()
        else:
            self._cancel_prefetch()
            arrays = read_hdf5_shard(path, self.max_seq_length)
        return PretrainingHdf5Dataset(arrays, path, self.vocab_size)

    def _order(self, num_samples, index, rank):
        """The epoch's sample order of a rank's shard. It depends on (seed, epoch, rank) only, so a
        resumed epoch can skip the batches already trained on without reading them."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index * 1009 + rank)
        return torch.randperm(num_samples, generator=generator)

    def get_shard(self, index, shuffle=True, *, start_batch=0, plan=None):
        """(iterator over the epoch's micro batches from `start_batch` on, micro batches left).
        `shuffle` (the interface's parameter): False reads the shard's samples in file order.
        `plan`: the layout the epoch started with, when the run resumed it on another one."""
        layout = EpochPlan(self.world, self.micro_batch, self.grad_accum)
        if plan is not None and plan != layout:
            return self._remapped_shard(index, start_batch, plan, layout)
        dataset = self._dataset(index)
        order = self._order(len(dataset), index, self.rank) if shuffle else torch.arange(len(dataset))
        order = order[start_batch * self.micro_batch:]
        return self._open_loader(dataset, index, order.tolist(), start_batch)

    def _remapped_shard(self, index, start_batch, plan, layout):
        """The rest of an epoch begun on `plan`: the shards every plan rank read, in one dataset,
        their micro batches dealt out over this run's ranks (remap_epoch)."""
        self._cancel_prefetch()
        paths = [self.files[shard_file_index(index, r, plan.world, len(self.files))] for r in range(plan.world)]
        unique = list(dict.fromkeys(paths))
        arrays = [read_hdf5_shard(path, self.max_seq_length) for path in unique]
        offsets = np.cumsum([0] + [len(a["input_ids"]) for a in arrays])
        rows = []
        for r, path in enumerate(paths):
            i = unique.index(path)
            n = len(arrays[i]["input_ids"]) // plan.micro_batch * plan.micro_batch
            rows.append(offsets[i] + self._order(len(arrays[i]["input_ids"]), index, r)[:n].numpy()
                        .reshape(-1, plan.micro_batch))
        mine, unused = remap_epoch(rows, plan, start_batch // self.grad_accum, layout, self.rank)
        if unused:
            logger.warning("Epoch %d: the %d samples after its last whole optimizer step are not trained (an epoch "
                           "trains whole steps)", index + 1, unused)
        dataset = PretrainingHdf5Dataset({k: np.concatenate([a[k] for a in arrays]) for k in HDF5_KEYS},
                                         " + ".join(unique), self.vocab_size)
        logger.info("Epoch %d began on %d ranks x micro batch %d x accumulation %d: its remaining %d steps "
                    "dealt over this run's %d ranks", index + 1, *plan, len(mine) // self.grad_accum, self.world)
        return self._open_loader(dataset, index, mine.reshape(-1).tolist(), start_batch)

    def _open_loader(self, dataset, index, order, start_batch):
        self._loader = DataLoader(
            dataset,
            sampler=order,
            # its own generator: creating the iterator must not draw from the global torch RNG
            # (dropout), or a resumed run would diverge from the uninterrupted one
            generator=torch.Generator().manual_seed(self.seed + index),
            batch_size=self.micro_batch,
            num_workers=self.num_workers,
            collate_fn=_identity,
            worker_init_fn=_WorkerInit(self.seed + self.local_rank),
            pin_memory=torch.cuda.is_available(),
            drop_last=True,
        )
        logger.info("Epoch %d: shard %s, %d samples, %d micro-batches from micro-batch %d", index + 1,
                    dataset.path, len(dataset), len(self._loader), start_batch)
        with stop_signals_held():  # workers start here
            return iter(self._loader), len(self._loader)

    def release_shard(self, index):
        self._loader = None

    def prefetch_shard(self, index):
        """Read epoch `index`'s shard in a process of its own (turing.shard_prefetch) while this
        epoch trains."""
        self._cancel_prefetch()
        with stop_signals_held():  # the reader ignores them from its start
            self._future = (index, ShardPrefetch(self.shard_path(index), self.max_seq_length))

    def _cancel_prefetch(self):
        if self._future is not None:
            self._future[1].cancel()
            self._future = None

    def get_batch(self, batch_iter):
        return batch_iter

    def prefetch_batch(self):
        pass

    def close(self):
        self._cancel_prefetch()


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO)
    shard = PretrainingHdf5Dataset(read_hdf5_shard(sys.argv[1]), sys.argv[1])
    batch = shard.__getitems__(range(min(3, len(shard))))
    for i in range(len(batch.input_ids)):
        n = int(batch.input_mask[i].sum())
        logger.info("sample %d: ids %s\n  segments %s\n  labels %s\n  nsp %d", i,
                    batch.input_ids[i, :n].tolist(), batch.segment_ids[i, :n].tolist(),
                    batch.masked_lm_labels[i, :n].tolist(), int(batch.next_sentence_labels[i]))

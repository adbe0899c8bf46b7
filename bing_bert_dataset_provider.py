"""The default pretraining data provider: Bing numpy shards of Wikipedia and BookCorpus.

Owns: which shard folder of each dataset an epoch reads, this rank's share of its samples,
the epoch's dataset picker (the shuffled interleaving of the two datasets), the DataLoaders
that build masked micro batches (turing.dataset), and the AsyncWorker switch.

For epoch `index`, each dataset d (a folder of shard folders) reads
`sorted(shard folders)[index % count]`; it contributes
`batches_d = len // world // micro // grad_accum // refresh_bucket_size` picker entries, each
expanded to grad_accum x refresh_bucket_size consecutive micro batches. Everything random is
seeded from (seed, epoch[, rank, dataset]), so an epoch can start at any micro batch
(`get_shard(index, start_batch=k)`) and yield exactly what an uninterrupted run would.
"""
import logging
import math
import os
from concurrent.futures import Future, ThreadPoolExecutor
from enum import IntEnum

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from bert_dataset_provider import (BertDatasetProviderInterface, DataSettings, EpochPlan, ignore_stop_signals,
                                   remap_epoch, stop_signals_held)
from data_worker import AsyncWorker, DataExhaustedError
from turing.dataset import (BingPretrainDataset, BingShard, VocabIndex,
                            epoch_sample_order, open_validation_dataset, tokenize_shard)
from turing.dataset import main as dataset_main
from turing.errors import InputFileNotFoundError, InputValueError
from turing.formats import BING_SHARD_FILES, holds_bing_validation
from turing.tokenization import load_tokenizer
from turing.process import get_rank_and_world

logger = logging.getLogger(__name__)

# Salt of the picker's random stream, so it never equals a dataset's sample order.
_PICKER_SALT = 0x7069636B


class PretrainDataType(IntEnum):
    WIKIPEDIA = 0
    BOOK_CORPUS = 1


DATASET_CONFIG_KEYS = {
    PretrainDataType.WIKIPEDIA: "wiki_pretrain_dataset",
    PretrainDataType.BOOK_CORPUS: "bc_pretrain_dataset",
}


def build_dataset_picker(batches_per_dataset, repeat, seed, epoch, shuffle=True):
    """The epoch's micro-batch order of dataset ids.

    Each dataset id appears batches_per_dataset[id] times, shuffled by (seed, epoch) (with
    shuffle=False in dataset order, the original's `get_shard(index, shuffle=False)`), and each
    entry is expanded to `repeat` (= grad_accum x refresh_bucket_size) consecutive micro batches.
    """
    entries = np.concatenate([np.full(n, int(d), dtype=np.int64) for d, n in sorted(batches_per_dataset.items())]
                             + [np.zeros(0, dtype=np.int64)])
    if shuffle:
        entries = np.random.default_rng([seed & ((1 << 64) - 1), epoch, _PICKER_SALT]).permutation(entries)
    return np.repeat(entries, repeat).tolist()


class _MicroBatches(Dataset):
    """Item k = the k-th micro batch of the epoch, built in one call (samples fixed by `rows`)."""

    def __init__(self, dataset, rows):
        self.dataset = dataset
        self.rows = rows  # (num_micro_batches, micro) sample indices

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, k):
        return self.dataset.build_batch(self.rows[k])


class _BatchIterator:
    """next() over a DataLoader, with running out of batches as a named error."""

    def __init__(self, loader, name):
        self._it = iter(loader)
        self.name = name

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._it)
        except StopIteration:
            raise DataExhaustedError(f"{self.name}: no micro batches left in this epoch") from None


class BingBertDatasetProvider(BertDatasetProviderInterface):
    """Provider for `deepspeed_train.py` without --use_nvidia_dataset; built as `Provider(args)`."""

    def __init__(self, args):
        settings = DataSettings.of(args)
        self.micro = settings.train_micro_batch_size_per_gpu
        self.grad_accum = settings.gradient_accumulation_steps
        self.refresh_bucket_size = settings.refresh_bucket_size
        self.seed = settings.seed
        self.max_seq_length = settings.max_seq_length
        self.max_predictions_per_seq = settings.max_predictions_per_seq
        job = settings.job
        self.num_workers = job.training.num_workers
        self.num_epochs = job.training.num_epochs
        # "async_worker": true turns the worker on; false (or no key) leaves it off
        self.use_async_worker = job.training.async_worker
        # Dynamic masking of the training batches (validation keeps the original's 15%, 80/10/10).
        self.masked_lm_prob = job.training.masked_lm_prob
        self.mask_split = list(job.training.mask_split)
        self.rank, self.world = get_rank_and_world()

        datasets = job.datasets
        prefix = settings.data_path_prefix or ""
        self.dataset_folders = {}
        for dataset_type, key in DATASET_CONFIG_KEYS.items():
            if key in datasets:
                self.dataset_folders[dataset_type] = self._shard_folders(os.path.join(prefix, datasets[key]), key)
        if not self.dataset_folders:
            raise InputValueError(f"job config data.mixed_seq_datasets[\"{self.max_seq_length}\"] names no Bing dataset; "
                             f"expected {' and/or '.join(DATASET_CONFIG_KEYS.values())}")
        named = {key: os.path.realpath(os.path.join(prefix, datasets[key])) for key in DATASET_CONFIG_KEYS.values()
                 if key in datasets}
        if len(named) > 1 and len(set(named.values())) == 1:
            logger.warning("job config: %s all name %s: every sample of it is trained %d times an epoch; name it once "
                           "(e.g. wiki_pretrain_dataset alone) to train it once", " and ".join(named),
                           next(iter(named.values())), len(named))

        self.vocab = load_tokenizer(settings.vocab_file)   # the tokenizer: its token strings -> ids, special ids
        self.vocab_index = VocabIndex(self.vocab)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-prefetch")
        self._prefetched = {}  # shard folder -> Future of its TokenizedShard
        self._current = {}     # shard folder -> TokenizedShard of the open epoch
        self._iterators = {}
        self.worker = None
        self.open_epoch = None

    @staticmethod
    def _shard_folders(folder, key):
        if not os.path.isdir(folder):
            raise InputFileNotFoundError(f"dataset folder {folder} (job config {key} under --data_path_prefix) "
                                    f"does not exist")
        # Every sub-folder is a shard; check_shards() opens them all before the model is built.
        shards = [os.path.join(folder, d) for d in sorted(os.listdir(folder)) if os.path.isdir(os.path.join(folder, d))]
        if not shards:
            raise InputValueError(f"dataset folder {folder} (job config {key}) holds no shard folders "
                                  f"(sub-folders with {', '.join(BING_SHARD_FILES)})")
        return shards

    holds_validation_set = staticmethod(holds_bing_validation)

    @staticmethod
    def validation_dataset(path, args):
        return open_validation_dataset(path, load_tokenizer(args.vocab_file), args)

    def check_shards(self):
        """Every shard folder's layout (cheap: BingShard maps the files), and that every epoch of the
        run trains: an epoch whose shards all hold fewer samples than one optimizer step takes from
        a shard (they give no batches) is refused here, before the model is built, naming its first
        shard in folder order."""
        per_step = self.world * self.micro * self.grad_accum * self.refresh_bucket_size
        sizes = {folder: len(BingShard(folder)) for folders in self.dataset_folders.values() for folder in folders}
        counts = [len(folders) for folders in self.dataset_folders.values()]
        epochs = min(math.lcm(*counts), self.num_epochs or math.lcm(*counts))   # the shards repeat after that
        for index in range(epochs):
            read = sorted(self.shard_folder(t, index) for t in self.dataset_folders)
            if all(sizes[folder] < per_step for folder in read):
                raise InputValueError(
                    f"{read[0]}: {sizes[read[0]]} samples, fewer than {self.world} rank(s) x micro batch {self.micro} "
                    f"x {self.grad_accum} gradient accumulation steps x refresh_bucket_size "
                    f"{self.refresh_bucket_size} = {per_step}: epoch {index + 1} would train 0 steps (no shard it "
                    f"reads gives a batch); make fewer, larger shards, or train with a smaller batch or fewer ranks")

    def training_folders(self):
        return sorted({os.path.dirname(f) for folders in self.dataset_folders.values() for f in folders})

    def shard_folder(self, dataset_type, index):
        folders = self.dataset_folders[dataset_type]
        return folders[index % len(folders)]

    def _tokenized(self, folder):
        future = self._prefetched.pop(folder, None)
        if future is not None:
            return future.result()  # re-raises a bad-shard error met in the background
        return tokenize_shard(BingShard(folder), self.vocab_index)

    def _plan_rows(self, shards, index, plan, rank, shuffle=True):
        """Epoch `index` as rank `rank` of `plan` runs it: (picker, {dataset id: rows}) with rows
        [micro batches, micro] of sample indices of that dataset's shard, in the order it uses them."""
        repeat = plan.grad_accum * self.refresh_bucket_size
        batches = {t: len(shard) // plan.world // plan.micro_batch // repeat for t, shard in shards.items()}
        picker = build_dataset_picker(batches, repeat, self.seed, index, shuffle)
        rows = {}
        for dataset_type, shard in shards.items():
            num_micro = batches[dataset_type] * repeat
            order = epoch_sample_order(len(shard), self.seed, index, rank, plan.world, salt=int(dataset_type))
            rows[int(dataset_type)] = order[:num_micro * plan.micro_batch].reshape(num_micro, plan.micro_batch)
        return picker, rows

    def _remapped_rows(self, shards, index, start_batch, plan, layout):
        """The rest of an epoch begun on `plan`, dealt over this run's ranks (remap_epoch): every
        optimizer step of the plan reads one dataset, so each of its micro batches here does too.
        Sample ids are the dataset's row indices offset by the sizes of the datasets before it."""
        offsets = dict(zip(sorted(shards), np.cumsum([0] + [len(shards[t]) for t in sorted(shards)]).tolist()))
        per_rank = []
        for r in range(plan.world):
            picker, rows = self._plan_rows(shards, index, plan, r)
            used = {d: 0 for d in rows}
            micro = []
            for d in picker:
                micro.append(rows[d][used[d]] + offsets[d])
                used[d] += 1
            per_rank.append(np.asarray(micro).reshape(-1, plan.micro_batch))
        mine, unused = remap_epoch(per_rank, plan, start_batch // self.grad_accum, layout, self.rank)
        picker, rows = [], {int(t): [] for t in shards}
        for batch in mine:
            d = max(t for t in offsets if offsets[t] <= batch[0])
            picker.append(int(d))
            rows[int(d)].append(batch - offsets[d])
        logger.info("Epoch %d began on %d ranks x micro batch %d x accumulation %d: its remaining %d micro batches "
                    "dealt over this run's %d ranks (%d samples unused)", index + 1, *plan, len(mine),
                    self.world, unused)
        return picker, {d: np.asarray(r, dtype=np.int64).reshape(-1, self.micro) for d, r in rows.items()}

    def get_shard(self, index, shuffle=True, *, start_batch=0, plan=None):
        """Start epoch `index` at micro batch `start_batch`: returns (picker entries, their count).

        The picker lists the dataset id of every remaining micro batch; pass each entry to
        get_batch(). start_batch > 0 skips the first micro batches without reading them.
        `shuffle` (the original's parameter): False keeps the datasets' micro batches in dataset
        order instead of interleaving them by (seed, epoch). `plan`: the layout the epoch started
        with, when the run resumed it on another one.
        """
        if self.worker is not None or self._iterators:
            self.release_shard(self.open_epoch)
        self.open_epoch = index
        layout = EpochPlan(self.world, self.micro, self.grad_accum)
        repeat = self.grad_accum * self.refresh_bucket_size
        per_step = self.world * self.micro * repeat
        shards = {}
        for dataset_type in self.dataset_folders:
            folder = self.shard_folder(dataset_type, index)
            shards[dataset_type] = self._tokenized(folder)
            self._current[folder] = shards[dataset_type]
            if len(shards[dataset_type]) // per_step == 0:
                logger.warning("Epoch %d: shard %s has %d samples, fewer than world x micro x grad_accum x "
                               "refresh_bucket_size = %d; it gives no batches", index + 1, folder,
                               len(shards[dataset_type]), per_step)
        # Prefetched shards of another epoch are no longer wanted.
        self._prefetched.clear()
        if plan is not None and plan != layout:
            picker, rows = self._remapped_rows(shards, index, start_batch, plan, layout)
            first = {d: 0 for d in rows}
            start_batch = 0
        else:
            picker, rows = self._plan_rows(shards, index, layout, self.rank, shuffle)
            first = {d: picker[:start_batch].count(d) for d in rows}
        if not picker:
            raise InputValueError(f"epoch {index}: no dataset shard holds world x micro x grad_accum x "
                             f"refresh_bucket_size = {per_step} samples; use bigger shards or fewer ranks")
        if not 0 <= start_batch <= len(picker):
            raise InputValueError(f"epoch {index}: start_batch {start_batch} is outside the epoch's "
                             f"{len(picker)} micro batches")

        for dataset_type, shard in shards.items():
            if not len(rows[int(dataset_type)]):
                continue
            dataset = BingPretrainDataset(shard, self.vocab, self.max_seq_length, self.max_predictions_per_seq,
                                          self.seed, salt=int(dataset_type), epoch=index,
                                          masked_lm_prob=self.masked_lm_prob, mask_split=self.mask_split)
            loader = DataLoader(_MicroBatches(dataset, rows[int(dataset_type)]), batch_size=None,
                                sampler=range(first[int(dataset_type)], len(rows[int(dataset_type)])),
                                num_workers=self.num_workers, worker_init_fn=ignore_stop_signals,
                                # its own generator: creating the iterator must not draw from the
                                # global torch RNG (dropout), or a resumed run would diverge
                                generator=torch.Generator().manual_seed(self.seed + index))
            with stop_signals_held():  # workers start here
                self._iterators[int(dataset_type)] = _BatchIterator(
                    loader, f"epoch {index} {dataset_type.name} shard {shard.name}")
        remaining = picker[start_batch:]
        logger.info("Epoch %d: %s; %d micro batches%s", index + 1,
                    ", ".join(f"{t.name} {os.path.basename(shards[t].name)} ({len(shards[t])} samples, "
                              f"{len(rows[int(t)])} micro batches)" for t in shards),
                    len(picker), f", starting at {start_batch}" if start_batch else "")
        if self.use_async_worker and remaining:
            self.worker = AsyncWorker(self._iterators, remaining)
            self.worker.start()
        return remaining, len(remaining)

    def get_batch(self, batch_iter):
        """The next micro batch (turing.batch.Batch) of dataset `batch_iter` (a picker entry: the
        dataset id; in picker order, as the AsyncWorker fetches them ahead of time)."""
        dataset_id = batch_iter
        if self.worker is not None:
            return self.worker.get(dataset_id)
        if dataset_id not in self._iterators:
            raise DataExhaustedError(f"get_batch({dataset_id}): no open loader for that dataset id "
                                     f"(call get_shard first; open: {sorted(self._iterators)})")
        return next(self._iterators[dataset_id])

    def prefetch_batch(self):
        if self.worker is not None:
            self.worker.prefetch()

    def prefetch_shard(self, index):
        """Tokenize the shards of epoch `index` in a background thread while this epoch trains."""
        for dataset_type in self.dataset_folders:
            folder = self.shard_folder(dataset_type, index)
            if folder in self._prefetched:
                continue
            if folder in self._current:  # a dataset with one shard folder reads it again
                self._prefetched[folder] = Future()
                self._prefetched[folder].set_result(self._current[folder])
            else:
                self._prefetched[folder] = self._pool.submit(tokenize_shard, BingShard(folder), self.vocab_index)

    def release_shard(self, index):
        """Stop the worker and drop this epoch's loaders and shard arrays."""
        if self.worker is not None:
            self.worker.stop()
            self.worker.join(timeout=10)
            if self.worker.is_alive():
                logger.warning("AsyncWorker did not stop within 10 s (a loader is blocked); leaving it behind")
            self.worker = None
        self._iterators = {}
        self._current = {}

    def close(self):
        """Stop the worker and the shard-prefetch thread (end of training)."""
        self.release_shard(self.open_epoch)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._prefetched.clear()


if __name__ == "__main__":
    # Prints a few decoded (and, given --vocab, masked) instances of a Bing shard folder.
    raise SystemExit(dataset_main())

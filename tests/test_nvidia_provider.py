"""NVIDIA hdf5 provider: labels from positions, shard choice per rank, file selection, checks."""
import argparse
import os
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from bert_dataset_provider import stop_signals_held
from nvidia_bert_dataset_provider import (NvidiaBertDatasetProvider, PretrainingHdf5Dataset,
                                          list_training_files, read_hdf5_shard, shard_file_index)
from testkit.launcher import REPO
from testkit.synthetic import make_instances, write_nvidia_shard, write_vocab
from turing.errors import InputValueError
from turing.shard_prefetch import ShardPrefetch


def _shard_with(path, positions, ids, seq=8):
    n, p = positions.shape
    with h5py.File(path, "w") as f:
        f.create_dataset("input_ids", data=np.arange(n * seq, dtype=np.int32).reshape(n, seq) % 50)
        f.create_dataset("input_mask", data=np.ones((n, seq), np.int8))
        f.create_dataset("segment_ids", data=np.zeros((n, seq), np.int8))
        f.create_dataset("masked_lm_positions", data=positions.astype(np.int32))
        f.create_dataset("masked_lm_ids", data=ids.astype(np.int32))
        f.create_dataset("next_sentence_labels", data=np.array([1, 0][:n], np.int8))
    return path


def test_labels_built_from_positions_until_first_zero(tmp_path):
    positions = np.array([[1, 3, 0, 0], [2, 5, 6, 7]])
    ids = np.array([[11, 13, 0, 0], [12, 15, 16, 17]])
    ds = PretrainingHdf5Dataset(read_hdf5_shard(_shard_with(tmp_path / "a_training.hdf5", positions, ids)))
    batch = ds.__getitems__([0, 1])
    expected = torch.full((2, 8), -1, dtype=torch.long)
    expected[0, 1], expected[0, 3] = 11, 13
    expected[1, 2], expected[1, 5], expected[1, 6], expected[1, 7] = 12, 15, 16, 17
    assert torch.equal(batch.masked_lm_labels, expected)
    assert batch.input_ids.dtype == torch.long and batch.next_sentence_labels.tolist() == [1, 0]
    single = ds[1]  # one sample without a batch dimension
    assert single.input_ids.shape == (8,) and torch.equal(single.masked_lm_labels, expected[1])


def test_shard_index_formula():
    # 4 files, 2 ranks: epoch e reads e*2 + r (mod 4)
    assert [shard_file_index(e, r, 2, 4) for e in range(3) for r in range(2)] == [0, 1, 2, 3, 0, 1]
    # world 3 > 2 files: e*3 + r + (3 % 2) * e
    assert [shard_file_index(e, r, 3, 2) for e in range(2) for r in range(3)] == [0, 1, 0, 0, 1, 0]
    assert shard_file_index(1, 2, 3, 2) == (1 * 3 + 2 + 1 * 1) % 2


def test_file_selection_ignores_non_training_and_errors(tmp_path):
    vocab = write_vocab(tmp_path / "vocab.txt")
    inst = make_instances(8, 32)
    for name in ("b_training_shard1.hdf5", "a_training_shard0.hdf5", "a_test_shard0.hdf5"):
        write_nvidia_shard(str(tmp_path / "d" / name), inst, vocab, 32)
    (tmp_path / "d" / "notes.txt").write_text("x")
    files = [os.path.basename(f) for f in list_training_files(str(tmp_path / "d"))]
    assert files == ["a_training_shard0.hdf5", "b_training_shard1.hdf5"]
    with pytest.raises(FileNotFoundError, match="no shard files"):
        list_training_files(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not found"):
        list_training_files(str(tmp_path / "missing"))


def test_bad_shards_named_in_errors(tmp_path):
    bad = tmp_path / "x_training.hdf5"
    with h5py.File(bad, "w") as f:
        f.create_dataset("input_ids", data=np.zeros((2, 4), np.int32))
    with pytest.raises(ValueError, match="lacks dataset.*input_mask"):
        read_hdf5_shard(str(bad))
    trunc = tmp_path / "t_training.hdf5"
    trunc.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 20)
    with pytest.raises(ValueError, match="t_training.hdf5: cannot read"):
        read_hdf5_shard(str(trunc))
    vocab = write_vocab(tmp_path / "vocab.txt")
    write_nvidia_shard(str(tmp_path / "ok_training.hdf5"), make_instances(4, 16), vocab, 16)
    with pytest.raises(ValueError, match="outside the vocab of 50"):
        PretrainingHdf5Dataset(read_hdf5_shard(str(tmp_path / "ok_training.hdf5")), "ok", vocab_size=50)


def test_provider_epochs_and_background_prefetch(tmp_path):
    vocab = write_vocab(tmp_path / "vocab.txt")
    for i, n in enumerate((40, 24)):
        write_nvidia_shard(str(tmp_path / "train" / f"s_training_shard{i}.hdf5"), make_instances(n, 32, seed=i),
                           vocab, 32)
    args = argparse.Namespace(local_rank=-1, seed=7, train_micro_batch_size_per_gpu=8, gradient_accumulation_steps=1,
                              max_seq_length=32, max_predictions_per_seq=20, data_path_prefix=str(tmp_path),
                              vocab_size=96, config={"data": {"datasets": {"pretrain_dataset": "train"}},
                                                     "training": {"num_workers": 0}})
    provider = NvidiaBertDatasetProvider(args)
    try:
        sizes = {}
        for epoch in range(2):
            refs, total = provider.get_shard(epoch)
            provider.prefetch_shard(epoch + 1)
            batches = [provider.get_batch(r) for r in refs]
            assert len(batches) == total
            assert all(b.input_ids.shape == (8, 32) for b in batches)
            sizes[provider.shard_path(epoch)] = total
            provider.release_shard(epoch)
        assert sorted(sizes.values()) == [3, 5]  # both files used once, drop_last batches of 8
        # Same (seed, epoch, rank) -> same order, whatever happened before.
        first = [provider.get_batch(r).input_ids for r in provider.get_shard(0)[0]]
        again = [provider.get_batch(r).input_ids for r in provider.get_shard(0)[0]]
        assert len(first) == len(again) == sizes[provider.shard_path(0)]
        assert all(torch.equal(a, b) for a, b in zip(first, again))
    finally:
        provider.close()


# --- the next epoch's shard, read by a process of its own (turing.shard_prefetch)

def test_the_reader_process_gives_the_arrays_read_here(tmp_path):
    """Every array, dtype and shape as read_hdf5_shard gives them in this process, and writable
    (the pipe's bytes land in arrays of their own)."""
    vocab = write_vocab(tmp_path / "vocab.txt")
    path = str(tmp_path / "s_training_shard0.hdf5")
    write_nvidia_shard(path, make_instances(37, 32, seed=3), vocab, 32)
    here = read_hdf5_shard(path, 32)
    there = ShardPrefetch(path, 32).result()
    assert list(there) == list(here)
    for key in here:
        assert there[key].dtype == here[key].dtype and np.array_equal(there[key], here[key]), key
        assert there[key].flags.writeable and there[key].flags.c_contiguous


def test_a_shard_the_reader_refuses_is_the_error_of_this_process(tmp_path):
    positions = np.array([[1, 3, 0, 0], [2, 9, 0, 0]])        # 9 is outside the 8 tokens of a row
    path = str(_shard_with(tmp_path / "bad_training.hdf5", positions, positions + 10))
    with pytest.raises(InputValueError) as here:
        read_hdf5_shard(path, 8)
    with pytest.raises(InputValueError) as there:
        ShardPrefetch(path, 8).result()
    assert str(there.value) == str(here.value) and path in str(here.value)
    with pytest.raises(InputValueError, match="sequences of length 8, but --max_seq_length is 16"):
        ShardPrefetch(path, 16).result()


def test_the_reader_imports_neither_torch_nor_deepspeed():
    """What keeps it cheap: 0.2 s and a few MB, where a process that imported the trainer's
    modules took 2-3 s and about 400 MB a rank for the whole run."""
    code = "import sys, turing.shard_prefetch; print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_reader_ignores_stop_signals_and_is_ended_by_cancel(tmp_path):
    """Ctrl-C reaches the whole process group; the rank answers it and ends the reader (cancel)."""
    vocab = write_vocab(tmp_path / "vocab.txt")
    path = str(tmp_path / "s_training_shard0.hdf5")
    write_nvidia_shard(path, make_instances(16, 32, seed=1), vocab, 32)
    with stop_signals_held():
        reader = ShardPrefetch(path, 32)
    reader.process.stdout.peek(1)              # it has read the shard and is writing it
    for sig in (signal.SIGINT, signal.SIGTERM):
        reader.process.send_signal(sig)
    assert reader.result()["input_ids"].shape == (16, 32)
    with stop_signals_held():
        reader = ShardPrefetch(path, 32)
    reader.cancel()
    assert reader.process.returncode is not None and reader.process.stdout.closed

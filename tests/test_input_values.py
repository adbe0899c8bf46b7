"""Inputs that would train silently wrong are refused with one error line: shards made for
another sequence length (both providers, training and validation), config values no run can
mean (before any work), impossible values inside a shard, an empty validation set and an
epoch of 0 steps. Through the real entry point, in-process, one rank."""
import json
import os
import re
import shutil

import h5py
import numpy as np
import pytest

import deepspeed_train
from nvidia_bert_dataset_provider import read_hdf5_shard
from tests.launch import TINY_CFG, TINY_DS, expect_input_error, tiny_argv
from testkit.synthetic import make_data_root, make_instances, write_bing_shard, write_nvidia_shard, write_vocab
from turing.dataset import BingShard, ShardFormatError


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """Tiny shards at 128 and 512 in both formats (one training shard of 32 each)."""
    root = tmp_path_factory.mktemp("value_data")
    make_data_root(str(root), seq_lengths=(128, 512), n_train=32, shards=1, n_valid=8)
    return root


def run_expect_error(capsys, argv):
    return expect_input_error(capsys, deepspeed_train.main, [str(a) for a in argv])


def argv(root, out, *extra, cf=TINY_CFG, nvidia=True):
    return tiny_argv(root, out, "--log_level", "warning", *extra, cf=cf, nvidia=nvidia)


def job_config(tmp_path, edit):
    config = json.load(open(TINY_CFG))
    edit(config)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(config))
    return path


# ----------------------------------------------------------------------------- sequence length

def test_nvidia_shards_of_another_length_are_refused_before_training(capsys, data_root, tmp_path):
    # A seq-128 run over the seq-512 shards.
    cf = job_config(tmp_path, lambda c: c["data"]["mixed_seq_datasets"]["128"].update(
        pretrain_dataset="nvidia/512/train"))
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", cf=cf))
    assert "tiny_training_shard0.hdf5: sequences of length 512, but --max_seq_length is 128" in line
    assert not (tmp_path / "out" / "runs").exists()              # before the model and the writer
    # A mix: a seq-512 shard among seq-128 ones is named, whichever epoch would read it.
    root = tmp_path / "mixed"
    shutil.copytree(data_root, root)
    shutil.copy(root / "nvidia" / "512" / "train" / "tiny_training_shard0.hdf5",
                root / "nvidia" / "128" / "train" / "long_training_shard1.hdf5")
    line = run_expect_error(capsys, argv(root, tmp_path / "out2"))
    assert "long_training_shard1.hdf5: sequences of length 512, but --max_seq_length is 128" in line


def test_nvidia_validation_file_of_another_length_is_refused(capsys, data_root, tmp_path):
    valid = tmp_path / "valid"
    (valid / "validation").mkdir(parents=True)
    shutil.copy(data_root / "nvidia" / "512" / "validation" / "tiny_test_shard0.hdf5", valid / "validation")
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", "--max_steps_per_epoch", 1,
                                         "--validation_data_path_prefix", valid))
    assert "tiny_test_shard0.hdf5: sequences of length 512, but --max_seq_length is 128" in line


# ----------------------------------------------------------------------------- config values

def _training(key, value):
    return lambda c: c["mixed_seq_training"]["128"].update({key: value})


@pytest.mark.parametrize("edit, expected", [
    (_training("learning_rate", -0.01), "mixed_seq_training.128.learning_rate must be > 0, got -0.01"),
    (_training("learning_rate", 0), "mixed_seq_training.128.learning_rate must be > 0, got 0"),
    (_training("learning_rate", "0.005"), "learning_rate must be a number, got the string '0.005'"),
    (_training("total_training_steps", -100), "total_training_steps must be >= 1, got -100"),
    (_training("warmup_proportion", -0.1), "warmup_proportion must be >= 0 and <= 1, got -0.1"),
    (_training("decay_step", 0), "decay_step must be > 0, got 0"),
    (_training("num_epochs", 2.5), "num_epochs must be an integer, got 2.5"),
    (_training("num_epochs", "2"), "num_epochs must be an integer, got the string '2'"),
    (lambda c: c["bert_model_config"].update(hidden_size="64"), "hidden_size must be a positive int, got '64'"),
], ids=["negative_lr", "zero_lr", "string_lr", "negative_steps", "negative_warmup", "decay_step_0",
        "fractional_epochs", "string_epochs", "string_model_size"])
def test_config_values_no_run_can_mean(capsys, data_root, tmp_path, edit, expected):
    cf = job_config(tmp_path, edit)
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", cf=cf))
    assert str(cf) in line and expected in line
    assert not (tmp_path / "out").exists()                       # before any work


@pytest.mark.parametrize("flag, value, expected", [
    ("--print_steps", 0, "--print_steps must be >= 1, got 0"),
    ("--max_steps", -1, "--max_steps must be >= 1, got -1"),
    ("--stop_at_step", 0, "--stop_at_step must be >= 1, got 0"),
    ("--max_seq_length", 1024, "--max_seq_length 1024 exceeds bert_model_config.max_position_embeddings 512"),
    ("--lr_offset", "nan", "--lr_offset must be a number, got nan"),
    ("--lr_offset", "inf", "--lr_offset must be a number, got inf"),
    ("--max_train_hours", "nan", "--max_train_hours must be a number, got nan"),
    ("--dist_timeout", "inf", "--dist_timeout must be a number, got inf"),
    ("--dist_timeout", "1e10", "--dist_timeout must be > 0 and <= 604800, got 10000000000.0"),
    ("--lr_offset", "-1", "--lr_offset must be >= 0, got -1.0"),
    ("--validation_every_steps", "-3", "--validation_every_steps must be >= 0, got -3"),
])
def test_flag_values_no_run_can_mean(capsys, data_root, tmp_path, flag, value, expected):
    def add_seq_1024(config):  # so that --max_seq_length 1024 gets past the config's entries
        for table in (config["mixed_seq_training"], config["data"]["mixed_seq_datasets"]):
            table["1024"] = table["128"]

    cf = job_config(tmp_path, add_seq_1024)
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", flag, value, cf=cf))
    assert expected in line
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- values in shards

def _nvidia_shard(path, key, row, col, value):
    vocab = write_vocab(path.parent / "vocab.txt")
    write_nvidia_shard(str(path), make_instances(4, 32), vocab, 32)
    with h5py.File(path, "r+") as f:
        data = f[key][:]
        data[(row, col) if data.ndim == 2 else row] = value
        f[key][...] = data
    return path


@pytest.mark.parametrize("key, col, value, expected", [
    ("input_ids", 3, -7, "input_ids holds token id -7 (row 2); token ids are >= 0"),
    ("masked_lm_ids", 0, -1, "masked_lm_ids holds token id -1 (row 2)"),
    ("segment_ids", 3, 2, "segment_ids holds 2 (row 2); expected 0 or 1"),
    ("next_sentence_labels", None, 5, "next_sentence_labels holds 5 (row 2); expected 0 or 1"),
    ("input_mask", 1, 3, "input_mask holds 3 (row 2); expected 0 or 1"),
])
def test_impossible_values_in_an_nvidia_shard(tmp_path, key, col, value, expected):
    path = _nvidia_shard(tmp_path / "x_training_shard0.hdf5", key, 2, col, value)
    with pytest.raises(ValueError, match=re.escape(f"x_training_shard0.hdf5: {expected}")):
        read_hdf5_shard(str(path))


def test_impossible_values_in_a_training_run(capsys, data_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_root, root)
    shard = root / "nvidia" / "128" / "train" / "tiny_training_shard0.hdf5"
    with h5py.File(shard, "r+") as f:
        nsp = f["next_sentence_labels"][:]
        nsp[5] = -1
        f["next_sentence_labels"][...] = nsp
    line = run_expect_error(capsys, argv(root, tmp_path / "out"))
    assert "tiny_training_shard0.hdf5: next_sentence_labels holds -1 (row 5); expected 0 or 1" in line


def test_impossible_nsp_label_in_a_bing_shard(tmp_path):
    folder = write_bing_shard(str(tmp_path / "shard_000"), make_instances(4, 32))
    np.save(os.path.join(folder, "is_next.npy"), np.array([0, 1, 2, 0], np.int64))
    with pytest.raises(ShardFormatError, match="shard_000: is_next.npy must hold only 0 and 1"):
        BingShard(folder)


# ----------------------------------------------------------------------------- empty sets

def test_empty_validation_set_is_an_error_not_a_zero_loss(capsys, data_root, tmp_path):
    valid = tmp_path / "valid" / "validation"
    valid.mkdir(parents=True)
    vocab = write_vocab(tmp_path / "vocab.txt")
    write_nvidia_shard(str(valid / "empty_test_shard0.hdf5"), [], vocab, 128)
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", "--max_steps_per_epoch", 1,
                                         "--validation_data_path_prefix", tmp_path / "valid"))
    assert f"{valid}: the validation set has no sequences" in line


def test_epoch_of_zero_steps_is_refused_before_training(capsys, data_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_root, root)
    vocab = write_vocab(tmp_path / "vocab.txt")
    write_nvidia_shard(str(root / "nvidia" / "128" / "train" / "small_training_shard1.hdf5"),
                       make_instances(10, 128), vocab, 128)
    line = run_expect_error(capsys, argv(root, tmp_path / "out"))
    assert "small_training_shard1.hdf5: 10 samples, fewer than the micro batch of 16 x 1 gradient" in line
    assert "0 steps" in line and not (tmp_path / "out" / "runs").exists()
    # With gradient accumulation an epoch needs micro x accumulation samples for one step.
    (root / "nvidia" / "128" / "train" / "small_training_shard1.hdf5").unlink()
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({**json.load(open(TINY_DS)), "gradient_accumulation_steps": 4}))
    line = run_expect_error(capsys, [a if a != TINY_DS else ds for a in argv(root, tmp_path / "out")])
    assert "tiny_training_shard0.hdf5: 32 samples, fewer than the micro batch of 16 x 4 gradient" in line


def test_every_too_small_shard_is_found_before_training_the_first_one_named(capsys, tmp_path):
    """Shards prepare_data made too many of (issue 43: --num_shards 64 on a small corpus): every
    training shard's size is checked before the model is built, not only those this rank reads in
    the run's epochs, and the error names the first too small one in file name order, how many are
    too small and how many shards the samples make. The Bing provider refuses an epoch of 0 steps
    there too, instead of in that epoch, after the engine started."""
    root = tmp_path / "data"
    make_data_root(str(root), shard_sizes=[10, 16, 10, 16, 16, 16], n_valid=8)   # micro batch 16, 2 epochs
    line = run_expect_error(capsys, argv(root, tmp_path / "out"))
    assert "tiny_training_shard0.hdf5: 10 samples, fewer than the micro batch of 16 x 1 gradient" in line
    assert "(2 of the 6 shards hold fewer than 16" in line and "--num_shards 5 or fewer" in line, line
    assert not (tmp_path / "out" / "runs").exists()
    line = run_expect_error(capsys, argv(root, tmp_path / "out_bing", nvidia=False))
    assert f"{root / 'bing' / '128' / 'bc' / 'shard_000'}: 10 samples, fewer than 1 rank(s) x micro batch 16" in line
    assert "epoch 1 would train 0 steps" in line, line
    assert not (tmp_path / "out_bing" / "runs").exists()


def _edit_shard(path, **edits):
    vocab = write_vocab(path.parent / "vocab.txt")
    write_nvidia_shard(str(path), make_instances(4, 32), vocab, 32)
    with h5py.File(path, "r+") as f:
        for key, edit in edits.items():
            data = f[key][:]
            f[key][...] = edit(data)
    return path


def _duplicate_first_position(positions):
    positions[1, 1] = positions[1, 0]
    return positions


@pytest.mark.parametrize("edits, expected", [
    ({key: (lambda a: np.zeros_like(a)) for key in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                                                     "masked_lm_ids", "next_sentence_labels")},
     "row 0 has no tokens (input_mask all 0, 4 such rows)"),
    ({"masked_lm_positions": lambda a: np.zeros_like(a)}, "no masked position in any row (masked_lm_positions all 0)"),
    ({"masked_lm_positions": _duplicate_first_position}, "masked_lm_positions of row 1 are not increasing"),
], ids=["all_zeros", "no_masked_tokens", "masked_twice"])
def test_a_shard_the_mlm_cannot_learn_from_is_refused(tmp_path, edits, expected):
    path = _edit_shard(tmp_path / "x_training_shard0.hdf5", **edits)
    with pytest.raises(ValueError, match=re.escape(f"x_training_shard0.hdf5: {expected}")):
        read_hdf5_shard(str(path))


def test_a_masked_position_in_the_padding_is_refused(tmp_path):
    def last_slot_into_padding(positions):
        positions[2, :] = 0
        positions[2, 0] = 30            # alone in row 2's listing, past its real tokens
        return positions

    def short_row(mask):
        mask[2, 10:] = 0
        return mask

    path = _edit_shard(tmp_path / "x_training_shard0.hdf5", masked_lm_positions=last_slot_into_padding,
                       input_mask=short_row)
    with pytest.raises(ValueError, match=re.escape("masked_lm_positions of row 2 hold 30, in the padding (the row "
                                                   "has 10 real tokens)")):
        read_hdf5_shard(str(path))


@pytest.mark.parametrize("value", ["absent", None, ""])
def test_a_job_config_without_pretrained_weights_trains(value, data_root, tmp_path):
    """bert_model_file absent, null or empty (a job config written for training from scratch, as
    the bench's GPU job writes one) is no pretrained model: the run trains (it was a TypeError)."""
    def edit(config):
        config.pop("bert_model_file", None)
        if value != "absent":
            config["bert_model_file"] = value
    cf = job_config(tmp_path, edit)
    assert deepspeed_train.main(argv(data_root, tmp_path / "out", "--max_steps", 1, cf=cf)).global_step == 1


@pytest.mark.parametrize("which", ["job", "ds"])
def test_nan_or_infinity_anywhere_in_a_config_is_one_line(capsys, data_root, tmp_path, which):
    """Python's json takes NaN, Infinity and 1e400 (inf); strict JSON has none. In a key no other check
    reads (another sequence length's learning rate, LAMB's max_coeff) it went on into the run, or
    into the checkpoint's job_config.json as a bare NaN."""
    if which == "job":
        config = json.load(open(TINY_CFG))
        config["mixed_seq_training"]["512"]["learning_rate"] = "@NAN@"
        path = tmp_path / "job.json"
        path.write_text(json.dumps(config).replace('"@NAN@"', "NaN"))
        args, key = argv(data_root, tmp_path / "out", cf=path), "mixed_seq_training.512.learning_rate is nan"
    else:
        config = {**json.load(open(TINY_DS)), "optimizer": {"type": "Lamb", "params": {"lr": 1e-3, "max_coeff": "@INF@"}}}
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(config).replace('"@INF@"', "1e400"))
        args, key = [a if a != TINY_DS else str(path) for a in argv(data_root, tmp_path / "out")], \
            "optimizer.params.max_coeff is inf"
    line = run_expect_error(capsys, args)
    assert str(path) in line and key in line and "not a finite number" in line, line
    assert not (tmp_path / "out").exists()

"""Each bad input gives one error line naming the file or key and what was expected,
exit code 2, no traceback, and nothing already written is touched."""
import hashlib
import json
import os
import shutil

import h5py
import numpy as np
import pytest
import torch

import deepspeed_train
from tests.launch import TINY_CFG, TINY_DS, expect_input_error, tiny_argv
from testkit.synthetic import make_data_root


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input_data")
    make_data_root(str(root), seq_lengths=(128,), n_train=64, shards=1, n_valid=8)
    return root


def write_json(path, obj):
    path.write_text(json.dumps(obj))
    return path


def run_expect_error(capsys, argv):
    return expect_input_error(capsys, deepspeed_train.main, [str(a) for a in argv])


def argv(data_root, out, cf=TINY_CFG, ds=TINY_DS, *extra, nvidia=True):
    return tiny_argv(data_root, out, "--log_level", "warning", *extra, cf=cf, ds=ds, nvidia=nvidia)


def tiny_config():
    return json.load(open(TINY_CFG))


def test_job_config_not_json(capsys, data_root, tmp_path):
    bad = tmp_path / "job.json"
    bad.write_text('{\n  "name": "x",\n  "bert_token_file": vocab.txt\n}')
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", bad))
    assert str(bad) in line and "not valid JSON" in line and "line 3" in line


def test_missing_config_key(capsys, data_root, tmp_path):
    config = tiny_config()
    del config["mixed_seq_training"]["128"]["learning_rate"]
    cf = write_json(tmp_path / "job.json", config)
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", cf))
    assert "missing key 'training.learning_rate'" in line and "mixed_seq_training.128" in line


def test_sequence_length_without_config_entry(capsys, data_root, tmp_path):
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", TINY_CFG, TINY_DS, "--max_seq_length", 256))
    assert "no entry for --max_seq_length 256" in line and "entries: 128, 512" in line


def test_vocab_file_missing(capsys, data_root, tmp_path):
    cf = write_json(tmp_path / "job.json", {**tiny_config(), "bert_token_file": "nowhere/vocab.txt"})
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", cf))
    assert "bert_token_file 'nowhere/vocab.txt' not found" in line


def test_batch_sizes_do_not_multiply(capsys, data_root, tmp_path):
    ds = write_json(tmp_path / "ds.json", {**json.load(open(TINY_DS)), "train_batch_size": 48,
                                           "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2})
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", TINY_CFG, ds))
    assert "train_batch_size 48 != train_micro_batch_size_per_gpu 16 x gradient_accumulation_steps 2 x world size 1" in line


def test_data_folder_without_shards(capsys, data_root, tmp_path):
    empty = tmp_path / "data"
    shutil.copytree(data_root, empty)
    for f in os.listdir(empty / "nvidia" / "128" / "train"):
        os.remove(empty / "nvidia" / "128" / "train" / f)
    line = run_expect_error(capsys, argv(empty, tmp_path / "out"))
    assert "no shard files with 'training' in the name" in line


def _replace_shard(root, make):
    folder = root / "nvidia" / "128" / "train"
    for f in os.listdir(folder):
        os.remove(folder / f)
    make(folder / "bad_training_shard0.hdf5")


def test_truncated_hdf5(capsys, data_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_root, root)
    good = sorted((data_root / "nvidia" / "128" / "train").iterdir())[0].read_bytes()
    _replace_shard(root, lambda p: p.write_bytes(good[:len(good) // 3]))
    line = run_expect_error(capsys, argv(root, tmp_path / "out"))
    assert "bad_training_shard0.hdf5: cannot read hdf5 shard" in line and "truncated" in line


def test_hdf5_with_missing_dataset_or_wrong_shape(capsys, data_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_root, root)

    def missing(path):
        with h5py.File(path, "w") as f:
            f.create_dataset("input_ids", data=np.zeros((4, 128), np.int32))
    _replace_shard(root, missing)
    line = run_expect_error(capsys, argv(root, tmp_path / "out"))
    assert "lacks dataset(s) input_mask" in line

    def wrong_shape(path):
        with h5py.File(path, "w") as f:
            for key, shape in (("input_ids", (4, 128)), ("input_mask", (4, 64)), ("segment_ids", (4, 128)),
                               ("masked_lm_positions", (4, 20)), ("masked_lm_ids", (4, 20)),
                               ("next_sentence_labels", (4,))):
                f.create_dataset(key, data=np.zeros(shape, np.int32))
    _replace_shard(root, wrong_shape)
    line = run_expect_error(capsys, argv(root, tmp_path / "out"))
    assert "input_mask has shape (4, 64); expected (4, 128)" in line


def test_token_ids_outside_vocab(capsys, data_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_root, root)
    shard = sorted((root / "nvidia" / "128" / "train").iterdir())[0]
    with h5py.File(shard, "r+") as f:
        ids = f["input_ids"][:]
        ids[0, 1] = 5000
        f["input_ids"][...] = ids
    line = run_expect_error(capsys, argv(root, tmp_path / "out"))
    assert "token id 5000 outside the vocab of 96 entries" in line and str(shard) in line
    root = tmp_path / "data2"                           # in a validation shard: named by its whole path too
    shutil.copytree(data_root, root)
    shard = root / "nvidia" / "128" / "validation" / "tiny_test_shard0.hdf5"
    with h5py.File(shard, "r+") as f:
        ids = f["input_ids"][:]
        ids[0, 1] = 5000
        f["input_ids"][...] = ids
    line = run_expect_error(capsys, argv(root, tmp_path / "out", TINY_CFG, TINY_DS, "--validation_data_path_prefix",
                                         root / "nvidia" / "128"))
    assert "token id 5000 outside the vocab of 96 entries" in line and str(shard) in line, line


def test_bing_shard_with_missing_file(capsys, data_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_root, root)
    os.remove(root / "bing" / "128" / "wiki" / "shard_000" / "tokens_split.npy")
    line = run_expect_error(capsys, argv(root, tmp_path / "out", nvidia=False))
    assert "shard_000" in line and "tokens_split.npy" in line


def test_checkpoint_folder_missing(capsys, data_root, tmp_path):
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", TINY_CFG, TINY_DS,
                                         "--load_training_checkpoint", tmp_path / "nope", "--load_checkpoint_id", "x"))
    assert "nope: checkpoint folder not found" in line


def test_nothing_written_is_touched(capsys, data_root, tmp_path):
    out = tmp_path / "out"
    (out / "saved_models" / "tiny_bert" / "epoch1_step4").mkdir(parents=True)
    keep = out / "saved_models" / "tiny_bert" / "epoch1_step4" / "precious.pt"
    keep.write_bytes(b"weights")
    cf = write_json(tmp_path / "job.json", {**tiny_config(), "bert_token_file": "missing.txt"})
    run_expect_error(capsys, argv(data_root, out, cf))
    assert keep.read_bytes() == b"weights" and not (out / "runs").exists()


def test_one_bit_optimizer_refused_on_cpu(capsys, data_root, tmp_path):
    ds = write_json(tmp_path / "ds.json", {**json.load(open(TINY_DS)),
                                           "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3}}})
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", TINY_CFG, ds))
    assert "optimizer 'OneBitAdam' needs CUDA and cupy" in line


def test_fp16_refused_on_cpu(capsys, data_root, tmp_path):
    ds = write_json(tmp_path / "ds.json", {**json.load(open(TINY_DS)), "fp16": {"enabled": True}})
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", TINY_CFG, ds))
    assert "fp16 needs a CUDA GPU" in line


@pytest.mark.parametrize("change, expected", [
    ({"optimizer": {"type": "Adamm", "params": {"lr": 1e-3}}}, "optimizer type 'Adamm' is not one DeepSpeed builds"),
    ({"optimizer": "AdamW"}, 'optimizer must be an object {"type": NAME, "params": {...}}'),
    ({"optimizer": {"type": "AdamW", "params": {"lr": "0.001"}}}, "optimizer.params.lr must be a number, got the string '0.001' (remove the quotes)"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9]}}}, "optimizer.params.betas must be two"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "bogus_param": 1}}},
     "DeepSpeed could not build the engine from it (TypeError: "),
    ({"gradient_clipping": "1.0"}, "gradient_clipping (0: none) must be a number, got the string '1.0' (remove the quotes)"),
    ({"zero_optimization": {"stage": 9}}, 'zero_optimization must be an object with "stage" 0, 1, 2 or 3'),
])
def test_deepspeed_config_blocks_deepspeed_fails_on_late_are_one_line(capsys, data_root, tmp_path, change, expected):
    """What DeepSpeed itself would fail on in the engine's build or at the first step (a traceback)."""
    ds = write_json(tmp_path / "ds.json", {**json.load(open(TINY_DS)), **change})
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", TINY_CFG, ds))
    assert str(ds) in line and expected in line, line


@pytest.mark.parametrize("change, expected", [
    ({"bert_model_config": "x"}, "'bert_model_config' must be a JSON object {...}, got a string"),
    ({"mixed_seq_training": {"128": []}}, "'mixed_seq_training.128' must be a JSON object {...}, got an array"),
    ({"data": {"mixed_seq_datasets": "x"}}, "'data.mixed_seq_datasets' must be a JSON object {...} keyed by"),
])
def test_job_config_values_of_the_wrong_type_are_one_line(capsys, data_root, tmp_path, change, expected):
    cf = write_json(tmp_path / "job.json", {**tiny_config(), **change})
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", cf))
    assert str(cf) in line and expected in line, line
    top = write_json(tmp_path / "list.json", [tiny_config()])
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", top))
    assert "the file must hold a JSON object {...}, got an array" in line, line


def test_a_negative_validation_interval_is_refused(capsys, data_root, tmp_path):
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", TINY_CFG, TINY_DS, "--validation_every_steps", -3))
    assert "--validation_every_steps" in line, line


def test_a_bad_flag_value_is_one_line_not_the_usage(capsys, data_root, tmp_path):
    with pytest.raises(SystemExit) as end:
        deepspeed_train.main([str(a) for a in argv(data_root, tmp_path / "out", TINY_CFG, TINY_DS, "--log_level",
                                                   "verbose")])
    assert end.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: argument --log_level: invalid choice: 'verbose'"), err


def test_one_bit_parameter_groups_mask_position_embeddings(tmp_path):
    import argparse

    from turing.models import BertMultiTask

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(11)]))
    config = tiny_config()
    config["training"] = config["mixed_seq_training"]["128"]
    for opt, flat in (("OneBitAdam", True), ("OneBitLamb", False)):
        args = argparse.Namespace(config=config, vocab_file=str(vocab), max_seq_length=128,
                                  ds_config={"optimizer": {"type": opt}})
        groups = deepspeed_train.prepare_optimizer_parameters(args, BertMultiTask(args))
        masked = [g for g in groups if "exp_avg_mask" in g]
        assert len(masked) == 1
        mask = masked[0]["exp_avg_mask"]
        rows = masked[0]["params"][0].shape[0]
        expected = torch.zeros(masked[0]["params"][0].shape)
        expected[:128] = 1
        assert torch.equal(mask, expected.flatten() if flat else expected) and rows == 512
        names = sum(len(g["params"]) for g in groups)
        assert names == len([n for n, _ in BertMultiTask(args).network.named_parameters() if "pooler" not in n])


def test_an_output_folder_this_user_cannot_write_is_one_line(capsys, data_root, tmp_path):
    if os.geteuid() == 0:  # root writes anywhere: a path under a file is unwritable for everyone
        (tmp_path / "a_file").write_text("")
        out = tmp_path / "a_file" / "out"
    else:
        (tmp_path / "read_only").mkdir(mode=0o555)
        out = tmp_path / "read_only" / "out"
    line = run_expect_error(capsys, argv(data_root, out))
    assert f"--output_dir {out}: cannot create {out}/saved_models/tiny_bert" in line


@pytest.mark.parametrize("name", ["..", "../elsewhere", "/tmp/absolute"])
def test_a_job_name_that_is_a_path_is_refused(capsys, data_root, tmp_path, name):
    line = run_expect_error(capsys, argv(data_root, tmp_path / "out", TINY_CFG, TINY_DS, "--job_name", name))
    assert f"job name {name!r} (--job_name, or the job config's 'name') must be a plain folder name" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "elsewhere").exists()


def test_a_checkpoint_carries_its_vocab_and_the_lock_says_when_it_was_released(data_root, tmp_path):
    out = tmp_path / "out"
    deepspeed_train.main(argv(data_root, out, TINY_CFG, TINY_DS, "--max_steps", 1))
    folder = out / "saved_models" / "tiny_bert" / "step1"
    assert (folder / "vocab.txt").read_bytes() == (data_root / "vocab.txt").read_bytes()
    saved = json.load(open(folder / "args.json"))
    assert saved["vocab_sha256"] == hashlib.sha256((data_root / "vocab.txt").read_bytes()).hexdigest()
    assert "released by pid" in (out / "saved_models" / "tiny_bert.lock").read_text()

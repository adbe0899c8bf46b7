"""The original's calls, written as its users wrote them, run unchanged: the training functions
of deepspeed_train.py, the AsyncWorker and the providers' shard interface."""
import importlib
import inspect
import json
import os
import sys
import types

import pytest
import torch
from tensorboardX import SummaryWriter

from bing_bert_dataset_provider import BingBertDatasetProvider
from data_worker import AsyncWorker
from deepspeed_train import (checkpoint_model, construct_arguments, load_checkpoint, load_training_checkpoint,
                             pretrain_validation, prepare_model_optimizer, report_lamb_coefficients,
                             report_step_metrics, run, train, update_learning_rate)
from nvidia_bert_dataset_provider import NvidiaBertDatasetProvider
from tests.launch import TINY_CFG, TINY_DS
from turing.errors import InputError
from turing.tb_events import read_run


def test_original_style_calls_run_as_written(data_root, tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", [
        "deepspeed_train.py", "--cf", TINY_CFG, "--deepspeed", "--deepspeed_config", TINY_DS, "--output_dir",
        str(out), "--data_path_prefix", str(data_root), "--max_seq_length", "128", "--max_predictions_per_seq",
        "20", "--use_nvidia_dataset", "--print_steps", "1"])
    args = construct_arguments()
    model, optimizer = prepare_model_optimizer(args)
    assert (args.train_micro_batch_size_per_gpu, args.gradient_accumulation_steps) == (16, 1)
    assert args.device == torch.device("cpu") and args.fp16 is False

    PATH = args.saved_model_path
    checkpoint_model(PATH, "start", model, 0, 0, 0)
    epoch, last_global_step, last_global_data_samples = load_training_checkpoint(args, model, PATH, "start")
    assert (epoch, last_global_step, last_global_data_samples) == (0, 0, 0)

    provider = NvidiaBertDatasetProvider(args)
    try:
        train(args, 0, model, optimizer, provider, finetune=False)
    finally:
        provider.close()
    assert (model.session.state.epoch, model.session.state.global_step) == (1, 4)
    run(args, model, optimizer, 1)                       # epoch 2 of 2, its own provider, a checkpoint
    assert model.session.state.global_step == 8
    assert open(os.path.join(PATH, "latest")).read() == "epoch2_step8"

    args.load_training_checkpoint, args.load_checkpoint_id = PATH, "epoch2_step8"
    assert load_checkpoint(args, model) == 2
    assert pretrain_validation(args, 1, model) is None   # no --validation_data_path_prefix
    lr = update_learning_rate(args, args.config, 5, optimizer)
    assert all(group["lr"] == lr for group in optimizer.param_groups)
    writer = SummaryWriter(str(tmp_path / "tb"))
    report_step_metrics(args, lr, 1.5, 5, 80, writer)
    writer.close()
    written, _ = read_run(str(tmp_path / "tb"))
    assert written["Train/lr"] == [(5, pytest.approx(lr))]
    assert written["Train/Samples/train_loss"] == [(80, 1.5)] and written["Train/Samples/lr"] == [(80, pytest.approx(lr))]
    assert report_lamb_coefficients(args, optimizer) is None   # AdamW: no LAMB coefficients


def test_async_worker_takes_a_list_of_loaders():
    worker = AsyncWorker([iter([1, 2]), iter(["a", "b"])], [0, 1, 1, 0])
    worker.start()
    got = []
    for _ in range(4):
        got.append(worker.get())
        worker.prefetch()
    worker.stop()
    worker.join(timeout=5)
    assert got == [1, "a", "b", 2]


def _bing_args(data_root, async_worker):
    config = json.load(open(TINY_CFG))
    config["data"]["datasets"] = config["data"]["mixed_seq_datasets"]["128"]
    config["training"] = {**config["mixed_seq_training"]["128"], "async_worker": async_worker}
    return types.SimpleNamespace(config=config, vocab_file=str(data_root / "vocab.txt"),
                                 data_path_prefix=str(data_root), max_seq_length=128, max_predictions_per_seq=20, seed=1, local_rank=-1,
                                 train_micro_batch_size_per_gpu=16, gradient_accumulation_steps=1,
                                 refresh_bucket_size=1, vocab_size=96)


@pytest.mark.parametrize("provider_name", ["nvidia", "bing"])
def test_get_shard_called_as_the_original_interface(data_root, provider_name):
    args = _bing_args(data_root, True)
    args.config["data"]["datasets"]["pretrain_dataset"] = "nvidia/128/train"
    provider = NvidiaBertDatasetProvider(args) if provider_name == "nvidia" else BingBertDatasetProvider(args)
    try:
        dataset_iterator, total_length = provider.get_shard(0)
        provider.prefetch_shard(1)
        batches = []
        for batch_index in dataset_iterator:
            batches.append(provider.get_batch(batch_index))
            provider.prefetch_batch()
        provider.release_shard(0)
        assert len(batches) == total_length > 0 and all(b.input_ids.shape == (16, 128) for b in batches)
        # the original's (index, shuffle): True is the same epoch; False the stored order, the same batches
        assert [b.input_ids.tolist() for b in read_shard(provider, 0, True)] == [b.input_ids.tolist() for b in batches]
        in_order = read_shard(provider, 0, False)
        assert [b.input_ids.tolist() for b in in_order] != [b.input_ids.tolist() for b in batches]
        assert sample_rows(in_order) == sample_rows(batches)          # every sample once, in another order
    finally:
        provider.close()


def sample_rows(batches):
    return sorted(str(row) for b in batches for row in b.input_ids.tolist())


def read_shard(provider, index, shuffle):
    refs, _ = provider.get_shard(index, shuffle)
    batches = []
    for ref in refs:
        batches.append(provider.get_batch(ref))
        provider.prefetch_batch()
    provider.release_shard(index)
    return batches


def test_async_worker_false_means_off(data_root):
    off = BingBertDatasetProvider(_bing_args(data_root, False))
    on = BingBertDatasetProvider(_bing_args(data_root, True))
    try:
        off.get_shard(0)
        on.get_shard(0)
        assert off.worker is None and isinstance(on.worker, AsyncWorker)
    finally:
        off.close()
        on.close()
    with pytest.raises(InputError, match=r"mixed_seq_training\.128\.async_worker: expected true or false"):
        BingBertDatasetProvider(_bing_args(data_root, "false"))


# Every public function and method of the original's scripts, with its parameters in order:
# ours must take them as the original's callers pass them (ours may add optional ones after).
ORIGINAL_API = {
    "deepspeed_train": {
        "checkpoint_model": "PATH ckpt_id model epoch last_global_step last_global_data_samples",
        "load_training_checkpoint": "args model PATH ckpt_id",
        "get_dataloader": "args dataset eval_set",
        "pretrain_validation": "args index model",
        "master_process": "args",
        "train": "args index model optimizer pretrain_dataset_provider finetune",
        "update_learning_rate": "args config current_global_step optimizer",
        "report_step_metrics": "args lr loss step data_sample_count",
        "report_lamb_coefficients": "args optimizer",
        "get_arguments": "",
        "construct_arguments": "",
        "prepare_optimizer_parameters": "args model",
        "prepare_model_optimizer": "args",
        "load_checkpoint": "args model",
        "run": "args model optimizer start_epoch",
        "main": "",
    },
    "utils": {"get_argument_parser": "", "is_time_to_exit": "args epoch_steps global_steps"},
    "data_worker": {"AsyncWorker": "dataloaders dataset_picker", "AsyncWorker.run": "self",
                    "AsyncWorker.get": "self", "AsyncWorker.prefetch": "self", "AsyncWorker.stop": "self"},
    "bing_bert_dataset_provider": {f"BingBertDatasetProvider.{name}": params for name, params in {
        "get_shard": "self index shuffle", "release_shard": "self index", "prefetch_shard": "self index",
        "get_batch": "self batch_iter", "prefetch_batch": "self"}.items()},
    "nvidia_bert_dataset_provider": {f"NvidiaBertDatasetProvider.{name}": params for name, params in {
        "get_shard": "self index", "release_shard": "self index", "prefetch_shard": "self index",
        "get_batch": "self batch_iter", "prefetch_batch": "self"}.items()},
    "turing.models": {f"BertMultiTask.{name}": params for name, params in {
        "__init__": "self args", "set_device": "self device", "save": "self filename", "load": "self model_state_dict",
        "move_batch": "self batch non_blocking", "eval": "self", "train": "self", "save_bert": "self filename",
        "to": "self device", "half": "self"}.items()},
}


@pytest.mark.parametrize("module_name", sorted(ORIGINAL_API))
def test_every_public_function_of_the_original_is_here(module_name):
    module = importlib.import_module(module_name)
    for name, params in ORIGINAL_API[module_name].items():
        target = module
        for part in name.split("."):
            assert hasattr(target, part), f"{module_name}.{name} is missing"
            target = getattr(target, part)
        ours = list(inspect.signature(target).parameters.values())
        wanted = params.split()
        assert [p.name for p in ours[:len(wanted)]] == wanted, f"{module_name}.{name}{inspect.signature(target)}"
        assert all(p.default is not p.empty or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
                   for p in ours[len(wanted):]), f"{module_name}.{name}: a new parameter without a default"


def test_master_process_and_the_model_calls(data_root, tmp_path, monkeypatch):
    from deepspeed_train import master_process
    from tests.launch import tiny_argv
    from turing.models import BertMultiTask

    args = construct_arguments(tiny_argv(data_root, tmp_path))
    assert master_process(args) is True                      # one process, no process group
    model = BertMultiTask(args)
    model.half()
    assert next(model.network.parameters()).dtype == torch.float16
    model.to(torch.device("cpu"))
    assert model.device == torch.device("cpu")
    model.save_bert(tmp_path / "encoder.pt")
    encoder = torch.load(tmp_path / "encoder.pt", weights_only=True)
    assert set(encoder) == {k[len("bert."):] for k in model.network.state_dict() if k.startswith("bert.")}
    monkeypatch.setattr("turing.process.get_rank_and_world", lambda: (1, 2))
    assert master_process(args) is False                     # rank 1 of 2


@pytest.mark.parametrize("finetune", [False, True])
def test_train_validates_unless_finetune(data_root, tmp_path, monkeypatch, finetune):
    """The original's train(..., finetune=False) ended its epoch with validation; finetune=True skips it."""
    from tests.launch import tiny_argv

    args = construct_arguments(tiny_argv(data_root, tmp_path / "out", "--validation_data_path_prefix",
                                         os.path.join(data_root, "nvidia", "128")))
    model, optimizer = prepare_model_optimizer(args)
    provider = NvidiaBertDatasetProvider(args)
    try:
        train(args, 0, model, optimizer, provider, finetune=finetune)
    finally:
        provider.close()
        model.session.reporter.close()
    scalars, _ = read_run(args.tensorboard_path)
    assert ("Validation/Loss" in scalars) is not finetune

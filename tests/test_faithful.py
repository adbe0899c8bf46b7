"""Defects that silently changed results or lost work for users of the original: the epoch step
limit across sessions, checkpoints that load weights-only, parameter and optimizer-group
order, the bad-input boundary, the vocab size, and resumes that cannot be carried over."""
import argparse
import json
import os
import random
import shutil

import pytest
import torch

import deepspeed_train
from testkit import reference_model
from tests.launch import TINY_CFG, ds_config, train_in_process, train_losses, expect_input_error
from testkit.synthetic import SPECIALS
from tools import prepare_data
from turing.modeling import BertConfig, BertForPreTrainingPreLN

JOB = "tiny_bert"


def run_expect_error(capsys, data_root, out, ds, *extra, cf=TINY_CFG):
    return expect_input_error(capsys, train_in_process, data_root, out, ds, *extra, cf=cf)


@pytest.fixture(scope="module")
def one_step(data_root, tmp_path_factory):
    """A run stopped after its first optimizer step: OUT/saved_models/tiny_bert/step1 (mid-epoch)."""
    root = tmp_path_factory.mktemp("one_step")
    ds = ds_config(root / "ds")
    train_in_process(data_root, root / "out", ds, "--max_steps", 1)
    return root / "out"


def test_max_steps_per_epoch_counts_the_epoch_across_sessions(data_root, tmp_path):
    ds = ds_config(tmp_path)
    whole = tmp_path / "whole"
    assert train_in_process(data_root, whole, ds, "--max_steps_per_epoch", 3).global_step == 6
    parts = tmp_path / "parts"
    train_in_process(data_root, parts, ds, "--max_steps_per_epoch", 3, "--max_steps", 1)
    state = train_in_process(data_root, parts, ds, "--max_steps_per_epoch", 3, "--auto_resume")
    assert state.global_step == 6 and state.epoch == 2
    assert train_losses(parts) == train_losses(whole)
    assert {"epoch1_step3", "epoch2_step6"} <= set(os.listdir(parts / "saved_models" / JOB))


def test_checkpoint_opens_with_weights_only_load(one_step):
    saved = torch.load(one_step / "saved_models" / JOB / "step1" / "mp_rank_00_model_states.pt",
                       map_location="cpu", weights_only=True)
    assert saved["last_global_step"] == 1 and saved["epoch_micro_step"] == 1 and saved["seq_length"] == 128
    assert set(saved["rng_states"][0]) >= {"python", "numpy", "torch"}


def test_use_pretrain_never_unpickles_a_checkpoint(one_step, data_root, tmp_path, capsys):
    folder = tmp_path / "pretrained"
    shutil.copytree(one_step / "saved_models" / JOB / "step1", folder)
    states = folder / "mp_rank_00_model_states.pt"
    saved = torch.load(states, weights_only=True)
    saved["args"] = argparse.Namespace(lr=1.0)      # a Python object, as older DeepSpeed versions saved
    torch.save(saved, states)
    config = json.load(open(TINY_CFG))
    config["bert_model_file"] = str(folder)
    cf = tmp_path / "job.json"
    cf.write_text(json.dumps(config))
    line = run_expect_error(capsys, data_root, tmp_path / "out", ds_config(tmp_path), "--use_pretrain", cf=cf)
    assert "mp_rank_00_model_states.pt: does not load with torch.load(weights_only=True)" in line


def test_resume_inside_an_epoch_with_another_global_batch_is_refused(one_step, data_root, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(one_step, out)
    half_the_global_batch = ds_config(tmp_path, train_micro_batch_size_per_gpu=8, gradient_accumulation_steps=1)
    line = run_expect_error(capsys, data_root, out, half_the_global_batch, "--auto_resume")
    assert ("step1: saved inside epoch 1 (after 1 optimizer steps) with a global batch of 16 (1 ranks x micro "
            "batch 16 x gradient accumulation 1); this run's is 8 (1 x 8 x 1)") in line
    assert sorted(os.listdir(out / "saved_models" / JOB)) == ["latest", "step1"]


def test_resume_at_an_epoch_end_with_another_micro_batch_goes_on(data_root, tmp_path):
    out = tmp_path / "out"
    train_in_process(data_root, out, ds_config(tmp_path / "a"), "--max_steps", 4)
    ds = ds_config(tmp_path / "b", train_micro_batch_size_per_gpu=8, gradient_accumulation_steps=2)
    assert train_in_process(data_root, out, ds, "--auto_resume").global_step == 8


def test_checkpoint_of_another_model_size_is_one_line(one_step, data_root, tmp_path, capsys):
    config = json.load(open(TINY_CFG))
    config["bert_model_config"].update(hidden_size=32, num_hidden_layers=3)
    cf = tmp_path / "job.json"
    cf.write_text(json.dumps(config))
    line = run_expect_error(capsys, data_root, tmp_path / "out", ds_config(tmp_path), "--load_training_checkpoint",
                            one_step / "saved_models" / JOB, "--load_checkpoint_id", "step1", cf=cf)
    assert "saved from a model of other sizes" in line and "2 encoder layers there, 3 here" in line
    assert "bert.embeddings.word_embeddings.weight (96, 64) there, (96, 32) here" in line


@pytest.mark.parametrize("error", [ValueError, FileNotFoundError])
def test_a_crash_inside_training_keeps_its_traceback(error, data_root, tmp_path, monkeypatch):
    def forward(self, batch, **kwargs):
        raise error("raised deep inside a library")
    monkeypatch.setattr(BertForPreTrainingPreLN, "forward", forward)
    with pytest.raises(error, match="deep inside a library"):
        train_in_process(data_root, tmp_path / "out", ds_config(tmp_path))


# --- parameter order ------------------------------------------------------------------------

def original_parameter_order(layers):
    """named_parameters() of the original's BertForPreTrainingPreLN (nvidia/modelingpreln.py): each
    module's own parameters, then its children in registration order (FinalLayerNorm before the
    layers); the tied MLM decoder weight is the word embedding and is listed once."""
    return (["bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
             "bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.weight",
             "bert.embeddings.LayerNorm.bias", "bert.encoder.FinalLayerNorm.weight",
             "bert.encoder.FinalLayerNorm.bias"]
            + [f"bert.encoder.layer.{i}.{m}.{p}" for i in range(layers) for m in (
                "attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                "PreAttentionLayerNorm", "PostAttentionLayerNorm", "intermediate.dense_act", "output.dense")
               for p in ("weight", "bias")]
            + ["bert.pooler.dense_act.weight", "bert.pooler.dense_act.bias", "cls.predictions.bias",
               "cls.predictions.transform.dense_act.weight", "cls.predictions.transform.dense_act.bias",
               "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias",
               "cls.seq_relationship.weight", "cls.seq_relationship.bias"])


def tiny_bert_config(layers):
    return BertConfig(96, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=32,
                      max_position_embeddings=64)


def test_parameter_order_is_the_originals():
    ours = [n for n, _ in BertForPreTrainingPreLN(tiny_bert_config(2), argparse.Namespace()).named_parameters()]
    assert ours == original_parameter_order(2)
    reference = [n for n, _ in reference_model.BertForPreTrainingPreLN(tiny_bert_config(2)).named_parameters()]
    assert reference == original_parameter_order(2)


def original_groups(named, opt_type, weight_decay=0.01):
    """Parameter names per group as the original's prepare_optimizer_parameters orders them."""
    no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight"]
    need_mask = ["position_embeddings.weight"] if opt_type in ("OneBitAdam", "OneBitLamb", "ZeroOneAdam") else []
    names = [n for n in named if "pooler" not in n]
    groups = [[n for n in names if not any(nd in n for nd in no_decay + need_mask)],
              [n for n in names if any(nd in n for nd in no_decay) and not any(nd in n for nd in need_mask)]]
    return groups + [[n] for n in names if any(nd in n for nd in need_mask)]


def our_model_and_args(opt_type, layers=2):
    model = argparse.Namespace(network=BertForPreTrainingPreLN(tiny_bert_config(layers), argparse.Namespace()))
    args = argparse.Namespace(config={"training": {"weight_decay": 0.01}}, max_seq_length=32,
                              ds_config={"optimizer": {"type": opt_type}})
    return model, args


@pytest.mark.parametrize("opt_type", ["AdamW", "OneBitAdam", "OneBitLamb"])
def test_optimizer_groups_are_in_the_originals_order(opt_type):
    model, args = our_model_and_args(opt_type)
    groups = deepspeed_train.prepare_optimizer_parameters(args, model)
    name_of = {id(p): n for n, p in model.network.named_parameters()}
    ours = [[name_of[id(p)] for p in g["params"]] for g in groups]
    assert ours == original_groups([n for n, _ in model.network.named_parameters()], opt_type)


def test_optimizer_state_saved_in_the_originals_order_resumes_onto_the_right_parameters():
    torch.manual_seed(0)
    original = reference_model.BertForPreTrainingPreLN(tiny_bert_config(2))
    named = dict(original.named_parameters())
    groups = [{"params": [named[n] for n in names]} for names in original_groups(original_parameter_order(2), "AdamW")]
    optimizer = torch.optim.AdamW(groups, lr=1e-3)
    for name, p in named.items():
        p.grad = torch.randn_like(p)                          # a different moment for every tensor
    optimizer.step()
    saved = optimizer.state_dict()

    model, args = our_model_and_args("AdamW")
    model.network.load_state_dict(original.state_dict())
    ours = torch.optim.AdamW(deepspeed_train.prepare_optimizer_parameters(args, model), lr=1e-3)
    ours.load_state_dict(saved)
    for name, p in model.network.named_parameters():
        if "pooler" not in name:
            assert torch.equal(ours.state[p]["exp_avg"], optimizer.state[named[name]]["exp_avg"]), name


# --- one vocab size -------------------------------------------------------------------------

def test_vocab_with_a_repeated_line_trains_on_the_data_tools_shards(tmp_path):
    """The data tool and training size a vocab alike (highest id + 1): a repeated token keeps
    its last line's id, which the shards use and the model must have a row for."""
    words = [f"w{i}" for i in range(59)]                    # 5 specials + 59 words: 64 ids, a multiple of 8
    root = tmp_path / "data"
    root.mkdir()
    (root / "vocab.txt").write_text("\n".join(SPECIALS + words + ["w0"]) + "\n")     # w0 again: id 64
    rng = random.Random(0)
    with open(tmp_path / "corpus.txt", "w") as f:
        for _ in range(40):
            for _ in range(rng.randint(4, 10)):
                f.write(" ".join(rng.choice(words[:8]) for _ in range(rng.randint(6, 14))) + "\n")
            f.write("\n")
    assert prepare_data.main(["--input", str(tmp_path / "corpus.txt"), "--output_dir", str(root / "nvidia" / "128"),
                              "--format", "nvidia", "--vocab_file", str(root / "vocab.txt"),
                              "--max_seq_length", "128", "--max_predictions_per_seq", "20", "--workers", "1"]) == 0
    state = train_in_process(root, tmp_path / "out", ds_config(tmp_path), "--max_steps", 2)
    assert state.global_step == 2

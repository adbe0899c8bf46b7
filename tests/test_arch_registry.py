"""The architecture registry (turing/arch/): one spec an architecture, and nothing outside the
registry branches on an architecture's name. A toy architecture (an embedding, one MLP block and
a tied MLM head, defined here) is added the way docs/DESIGN.md says, by its spec and one registry
entry, and the program trains it, checkpoints it, reports its FLOPs, refuses what it says it
cannot run and fine-tunes it, with no other file touched."""
import ast
import json
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import turing.arch
from tests.launch import TINY_CFG, ds_config, expect_input_error, train_in_process, train_losses
from testkit.launcher import REPO
from turing.arch import (ARCHITECTURES, DEFAULT_ARCHITECTURE, architecture_of, model_config_from_dict,
                         pretraining_model, spec_of, training_flops)
from turing.arch.spec import ArchSpec
from turing.glue import sequence_classifier
from turing.model_options import block_options
from turing.modeling import BertConfigError, config_values


class ToyConfig:
    architecture = "toy"

    def __init__(self, vocab_size, hidden_size=32, max_position_embeddings=512):
        self.vocab_size, self.hidden_size, self.max_position_embeddings = vocab_size, hidden_size, max_position_embeddings

    @classmethod
    def from_dict(cls, values):
        values, vocab_size = config_values(values, cls.architecture)
        return cls(vocab_size, **values)

    def to_dict(self):
        return {"architecture": self.architecture, "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                "max_position_embeddings": self.max_position_embeddings}


class ToyEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.mlp = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.GELU())
        self.norm = nn.LayerNorm(config.hidden_size)

    def forward(self, input_ids):
        x = self.embeddings(input_ids)
        return self.norm(x + self.mlp(x))   # (B, L, H)


class ToyForPreTraining(nn.Module):
    architecture = "toy"
    refused_options = {"unpad": "the toy block has nothing to unpad"}
    nsp_head = False

    def __init__(self, config, options=None):
        super().__init__()
        block_options(options, type(self))
        self.config = config
        self.bert = ToyEncoder(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def mlm_scores(self, hidden_states):
        return F.linear(hidden_states, self.bert.embeddings.weight, self.bias)   # tied decoder

    def encode(self, input_ids, segment_ids, input_mask):
        return self.bert(input_ids)

    def predict(self, input_ids, segment_ids, input_mask):
        return self.mlm_scores(self.encode(input_ids, segment_ids, input_mask)), None

    def forward(self, batch, **kwargs):
        if batch.masked_lm_labels is None:
            return self.predict(batch.input_ids, batch.segment_ids, batch.input_mask)
        scores = self.mlm_scores(self.bert(batch.input_ids))
        return F.cross_entropy(scores.reshape(-1, scores.size(-1)), batch.masked_lm_labels.reshape(-1),
                               ignore_index=-1)


class ToyClassifier(nn.Module):
    def __init__(self, pretraining, num_labels):
        super().__init__()
        self.bert = pretraining.bert
        self.classifier = nn.Linear(pretraining.config.hidden_size, num_labels)

    def forward(self, input_ids, input_mask, segment_ids):
        return self.classifier(self.bert(input_ids)[:, 0])


def toy_flops(config, seq_length, predictions):
    h, v = config.hidden_size, config.vocab_size
    return 3 * (2 * seq_length * h * h + predictions * 2 * h * v)


TOY = ArchSpec(name="toy", config=ToyConfig, model=ToyForPreTraining,
               classifier=lambda pretraining, config, num_labels: ToyClassifier(pretraining, num_labels),
               flops=toy_flops)
TOY_MODEL_CONFIG = {"architecture": "toy", "vocab_size": 96, "hidden_size": 32, "max_position_embeddings": 512}


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(ARCHITECTURES, "toy", TOY)   # the registry line
    return TOY


def test_the_default_architecture_and_an_unknown_name():
    assert DEFAULT_ARCHITECTURE == "bert" and architecture_of({"hidden_size": 8}) == "bert"
    assert architecture_of(None) == "bert" and model_config_from_dict({"vocab_size": 96}).architecture == "bert"
    with pytest.raises(BertConfigError, match="architecture 'toy' is not one of bert, modernbert, bert_postln"):
        spec_of("toy")
    for spec in ARCHITECTURES.values():   # every spec names its own classes
        assert spec.config.architecture == spec.model.architecture == spec.name


def test_a_registered_architecture_is_built_counted_and_fine_tuned(toy):
    config = model_config_from_dict(TOY_MODEL_CONFIG)
    assert isinstance(config, ToyConfig) and config.vocab_size == 96
    model = pretraining_model(config)
    assert isinstance(model, ToyForPreTraining)
    assert training_flops(config, 128, 20) == toy_flops(config, 128, 20)
    classifier = sequence_classifier(model, config, 3)
    assert classifier.bert is model.bert
    assert classifier(torch.randint(0, 96, (2, 5)), torch.ones(2, 5), torch.zeros(2, 5)).shape == (2, 3)


def toy_job(tmp_path):
    job = json.load(open(TINY_CFG))
    job["bert_model_config"] = dict(TOY_MODEL_CONFIG)
    path = tmp_path / "toy.json"
    path.write_text(json.dumps({**job, "name": "toy"}))
    return path


def test_the_program_trains_a_registered_architecture(toy, data_root, tmp_path):
    out = tmp_path / "out"
    train_in_process(data_root, out, ds_config(tmp_path), "--max_steps", 4, cf=toy_job(tmp_path))
    losses = train_losses(str(out), "toy")
    assert len(losses) == 4 and all(map(torch.isfinite, torch.tensor(losses)))
    saved = json.load(open(out / "saved_models" / "toy" / open(out / "saved_models" / "toy" / "latest").read().strip()
                           / "job_config.json"))
    assert saved["bert_model_config"]["architecture"] == "toy"


def test_what_a_registered_architecture_refuses_is_one_error_line(toy, data_root, tmp_path, capsys):
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds_config(tmp_path), "--unpad",
                              cf=toy_job(tmp_path))
    assert line == ("error: --unpad does not apply to bert_model_config.architecture 'toy' (the toy block has "
                    "nothing to unpad); run without it (run with --debug for a traceback)")


def string_constants(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    return [node for node in ast.walk(tree) if isinstance(node, ast.Compare)
            and any(isinstance(c, ast.Constant) and c.value in ARCHITECTURES for c in [node.left, *node.comparators])]


def test_no_code_outside_the_registry_compares_with_an_architecture_name():
    """`x == "modernbert"`, `"bert" != name`, ... appear nowhere in the program, the library outside
    turing/arch/, or the tools: what differs between architectures is in their specs."""
    found = {}
    for folder in (".", "turing", "tools"):
        for root, _, names in os.walk(os.path.join(REPO, folder)):
            if root.startswith(os.path.join(REPO, "turing", "arch")) or (folder == "." and root != REPO):
                continue
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    if string_constants(path):
                        found[os.path.relpath(path, REPO)] = len(string_constants(path))
    assert found == {}

"""`BertMultiTask`: the model as the training script holds it, and the architectures it can be.

Owns: `ARCHITECTURES` (the job config's `bert_model_config.architecture` -> its config class and
pretraining model: "bert", the original's `BertForPreTrainingPreLN`, the default; "modernbert",
`turing.modern.ModernForPreTraining`; "bert_postln", `turing.postln.BertForPreTrainingPostLN`,
Hugging Face's post-LN BertModel), `model_config_from_dict` and `pretraining_model`, which
every tool builds through; building the model from the job config's `bert_model_config` and the
tokenizer file (the vocab size is the tokenizer's, rounded up to a multiple of 8: `Tokenizer.rows`,
a vocab.txt's whatever the config says), the device the batches go to, and plain state-dict
save/load of the network.
After `deepspeed.initialize` the training script replaces `.network` by the engine; the
methods here work with either.
"""
import logging
import os

import torch

from turing.batch import Batch
from turing.checkpoint import read_state_dict_file
from turing.errors import ConversionError, InputFileNotFoundError, InputValueError
from turing.modeling import BertConfig, BertConfigError, BertForPreTrainingPreLN
from turing.modern import ModernConfig, ModernForPreTraining
from turing.postln import BertForPreTrainingPostLN, PostLNConfig
from turing.job_config import bert_model_config_of
from turing.speedups import apply_speedups
from turing.tokenization import load_tokenizer

logger = logging.getLogger(__name__)

# bert_model_config.architecture -> (config class, pretraining model class); a new architecture
# is one line here (its config's `from_dict`, its model's `forward(batch, **kwargs)` and `predict`).
ARCHITECTURES = {
    "bert": (BertConfig, BertForPreTrainingPreLN),
    "modernbert": (ModernConfig, ModernForPreTraining),
    "bert_postln": (PostLNConfig, BertForPreTrainingPostLN),
}


def model_config_from_dict(values):
    """The config of a `bert_model_config` dict, of the class its "architecture" names (default bert)."""
    architecture = values.get("architecture", "bert") if isinstance(values, dict) else "bert"
    if architecture not in ARCHITECTURES:
        raise BertConfigError(f"bert_model_config: architecture {architecture!r} is not one of "
                              f"{', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[architecture][0].from_dict(values)


def pretraining_model(config, options=None):
    """The pretraining model of `config`'s architecture, with the speed-ups of turing.speedups;
    `options`: ModelOptions or a command line."""
    return apply_speedups(ARCHITECTURES[config.architecture][1](config, options))


class CheckpointError(InputValueError):
    """A weights file that does not fit the model; the message names the file."""


class BertMultiTask:
    def __init__(self, args):
        model_config = bert_model_config_of(args)
        if model_config is None:
            raise BertConfigError("job config: missing key 'bert_model_config' (the model sizes)")
        self.config = model_config_from_dict(model_config)
        tokenizer = load_tokenizer(args.vocab_file)
        # One row per id (a vocab.txt's lines, repeated ones included), padded to 8 for tensor-core friendly shapes.
        self.config.vocab_size = tokenizer.rows(self.config.vocab_size)
        logger.info("Model vocab size %d (tokenizer %s has %d ids)",
                    self.config.vocab_size, args.vocab_file, tokenizer.vocab_size)
        self.network = pretraining_model(self.config, args)
        self.device = torch.device("cpu")

    def _module(self):
        """The bare model, also when `.network` is a DeepSpeed engine wrapping it."""
        return getattr(self.network, "module", self.network)

    def set_device(self, device):
        self.device = torch.device(device)

    def save(self, filename):
        torch.save(self._module().state_dict(), filename)

    def load(self, model_state_dict):
        """The weights of the state dict file `model_state_dict` (the original's parameter name),
        read weights-only, keys and shapes checked against the model."""
        state_dict_file = model_state_dict
        if not os.path.isfile(state_dict_file):
            raise InputFileNotFoundError(f"model weights {state_dict_file}: file not found")
        try:
            state_dict = read_state_dict_file(state_dict_file)
        except ConversionError as e:
            raise CheckpointError(f"model weights {e}") from None
        model = self._module()
        expected = set(model.state_dict())
        missing = sorted(expected - set(state_dict))
        unexpected = sorted(set(state_dict) - expected)
        if missing or unexpected:
            raise CheckpointError(
                f"model weights {state_dict_file}: keys do not match the model "
                f"(missing: {missing[:5]}{' ...' if len(missing) > 5 else ''}; "
                f"unexpected: {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''})")
        try:
            model.load_state_dict(state_dict, strict=True)
        except RuntimeError as e:  # shape mismatches
            raise CheckpointError(f"model weights {state_dict_file}: {e}") from None

    def move_batch(self, batch, non_blocking=False):
        moved = [t.to(self.device, non_blocking=non_blocking) if torch.is_tensor(t) else t for t in batch]
        return Batch(*moved) if isinstance(batch, Batch) else type(batch)(moved)

    def eval(self):
        self.network.eval()

    def train(self):
        self.network.train()

    def save_bert(self, filename):
        """The encoder's weights alone (`bert.*` without the prefix, as the original's save_bert)."""
        torch.save(self._module().bert.state_dict(), filename)

    def to(self, device):
        self.network.to(device)
        self.set_device(device)

    def half(self):
        self.network.half()

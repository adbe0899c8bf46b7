"""`BertMultiTask`: the model as the training script holds it, and the architectures it can be.

Owns: building the model from the job config's `bert_model_config` (its architecture's, through
the registry turing.arch, which every tool builds through too) and the tokenizer file (the vocab size is the tokenizer's, rounded up to a multiple of 8: `Tokenizer.rows`,
a vocab.txt's whatever the config says), the device the batches go to, and plain state-dict
save/load of the network.
After `deepspeed.initialize` the training script replaces `.network` by the engine; the
methods here work with either.
"""
import logging
import os

import torch

from turing.arch import check_tokenizer, model_config_from_dict, pretraining_model
from turing.batch import Batch
from turing.errors import InputFileNotFoundError
from turing.modeling import BertConfigError
from turing.job_config import bert_model_config_of
from turing.pretrained import load_into, read_weights
from turing.tokenization import load_tokenizer

logger = logging.getLogger(__name__)

class BertMultiTask:
    def __init__(self, args):
        model_config = bert_model_config_of(args)
        if model_config is None:
            raise BertConfigError("job config: missing key 'bert_model_config' (the model sizes)")
        self.config = model_config_from_dict(model_config)
        tokenizer = load_tokenizer(args.vocab_file)
        check_tokenizer(self.config, tokenizer, f"tokenizer {args.vocab_file}")
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
        read as every trained model is (turing.pretrained: weights-only, every tensor finite),
        every key and shape the model's."""
        if not os.path.isfile(model_state_dict):
            raise InputFileNotFoundError(f"model weights {model_state_dict}: file not found")
        load_into(self._module(), read_weights(model_state_dict), f"model weights {model_state_dict}", strict=True)

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

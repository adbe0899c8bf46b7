"""What a run chooses about the model beyond its sizes: `ModelOptions`, built from a command line
in one place (`from_args`), and the checks of what cannot run (`check`: this machine or build;
`for_block`: one architecture's block, from the model class's `architecture`, `refused_options`
and `nsp_head`); `precision_of` a DeepSpeed config. The models read these and nothing else of the run.
"""
import dataclasses
import os
from typing import Optional

import torch

from turing.errors import InputValueError


def precision_of(ds_config):
    """'fp16', 'bf16' or 'fp32' from a DeepSpeed config dict."""
    if (ds_config.get("fp16") or {}).get("enabled", False):
        return "fp16"
    if any((ds_config.get(key) or {}).get("enabled", False) for key in ("bf16", "bfloat16")):
        return "bf16"
    return "fp32"


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """What a run chooses about the model beyond its sizes (`BertConfig`): the model reads these
    and nothing else. `from_args` builds them from a command line (the training script's `args`,
    or any object with some of its attributes) in one place.

    A new model option is a field here (with its default), the flag in utils.py when it is one
    (and its name in _SAME_NAME, which from_args copies), and the code in the model that reads it."""
    checkpoint_activations: bool = False        # recompute each encoder layer in backward
    unpad: bool = False                         # encoder on real tokens only (training loss)
    next_sentence_prediction: bool = True       # the job config's training switch: NSP term in the loss
    progressive_layer_drop: bool = False
    deepspeed_sparse_attention: bool = False
    sparse_attention: Optional[dict] = None     # ds_config's `sparse_attention` block (None: defaults)
    deepspeed_transformer_kernel: bool = False  # DeepSpeed's fused CUDA layer, with its memory flags:
    stochastic_mode: bool = False
    attention_dropout_checkpoint: bool = False
    normalize_invertible: bool = False
    gelu_checkpoint: bool = False
    precision: str = "fp32"                     # of the DeepSpeed config: fp32, fp16 or bf16
    micro_batch: Optional[int] = None           # the kernel's maximum batch
    local_rank: int = 0                         # the kernel's device and init rank
    seed: int = 42                              # the kernel's and the sparse layouts' random draws

    # fields taken from the attribute of the same name
    _SAME_NAME = ("checkpoint_activations", "unpad", "next_sentence_prediction", "progressive_layer_drop",
                  "deepspeed_sparse_attention", "deepspeed_transformer_kernel", "stochastic_mode",
                  "attention_dropout_checkpoint", "normalize_invertible", "gelu_checkpoint", "seed")

    @classmethod
    def from_args(cls, args):
        """The options of `args` (None: all defaults; ModelOptions: itself; a RunConfig: its
        `model`). Attributes `args`
        lacks keep their defaults; ds_config gives the sparse-attention block and the precision,
        train_micro_batch_size_per_gpu the micro batch, local_rank (or the launcher's
        LOCAL_RANK) the local rank."""
        if args is None or isinstance(args, cls):
            return args or cls()
        if isinstance(getattr(args, "model", None), cls):
            return args.model  # the training script's RunConfig
        ds_config = getattr(args, "ds_config", None) or {}
        local_rank = getattr(args, "local_rank", -1)
        if local_rank is None or local_rank < 0:
            # launched without --local_rank (e.g. --no_local_rank): the launcher's environment says
            local_rank = int(os.environ.get("LOCAL_RANK", 0))
        return cls(**{name: getattr(args, name) for name in cls._SAME_NAME if hasattr(args, name)},
                   sparse_attention=ds_config.get("sparse_attention"), precision=precision_of(ds_config),
                   micro_batch=getattr(args, "train_micro_batch_size_per_gpu", None), local_rank=local_rank)

    def check(self):
        """Reject option combinations this machine or build cannot run, with one line saying why."""
        if self.unpad:
            for flag in ("deepspeed_transformer_kernel", "deepspeed_sparse_attention"):
                if getattr(self, flag):
                    raise InputValueError(f"--unpad cannot be combined with --{flag} (it needs full-length, "
                                          "padded sequences)")
        if not self.deepspeed_transformer_kernel:
            return
        if self.deepspeed_sparse_attention:
            raise InputValueError("--deepspeed_sparse_attention cannot be combined with --deepspeed_transformer_kernel")
        if not torch.cuda.is_available():
            raise InputValueError("--deepspeed_transformer_kernel needs a CUDA GPU (DeepSpeed's fused transformer "
                                  "layer is a CUDA op); none is available, run without the flag")
        if self.progressive_layer_drop:
            raise InputValueError("--progressive_layer_drop cannot be combined with --deepspeed_transformer_kernel "
                                  "(the fused layer cannot scale or skip its branches)")
        if self.checkpoint_activations:
            raise InputValueError("--checkpoint_activations cannot be combined with --deepspeed_transformer_kernel; "
                                  "use the kernel's --attention_dropout_checkpoint, --gelu_checkpoint and "
                                  "--normalize_invertible to save memory")
        if self.precision == "bf16":
            raise InputValueError("--deepspeed_transformer_kernel runs in fp32 or fp16 only; the DeepSpeed config "
                                  "enables bf16")

    def for_block(self, block):
        """These options, checked for the pretraining model class `block` (its `architecture` name,
        its `refused_options` {flag: why} and whether it has a next-sentence head, `nsp_head`):
        a refused flag, or next-sentence prediction without a head, is one error line; then `check`."""
        for flag, why in block.refused_options.items():
            if getattr(self, flag):
                raise InputValueError(f"--{flag} does not apply to bert_model_config.architecture "
                                      f"'{block.architecture}' ({why}); run without it")
        if self.next_sentence_prediction and not block.nsp_head:
            raise InputValueError(f"next_sentence_prediction is true, but bert_model_config.architecture "
                                  f"'{block.architecture}' has no next-sentence head (it trains the MLM loss "
                                  f"alone); set it false in the job config's training section or leave it out")
        self.check()
        return self


def block_options(options, block):
    """The checked ModelOptions a pretraining model of class `block` is built with, from `options`
    (a command line, ModelOptions or None): where `options` does not say (None, or a command line
    without the attribute), a block without a next-sentence head trains without the NSP term."""
    resolved = ModelOptions.from_args(options)
    if not block.nsp_head and not hasattr(options, "next_sentence_prediction"):
        resolved = dataclasses.replace(resolved, next_sentence_prediction=False)
    return resolved.for_block(block)


def check_model_flags(args):
    """Reject model options this machine or build cannot run, with one line saying why.

    Cheap (no weights, no data): the model calls it first, and a training script can call it
    right after parsing so the error comes before any work. `args`: a command line or ModelOptions.
    """
    ModelOptions.from_args(args).check()

"""The two layouts of an encoder layer's weights: the original model's names (query, key, value,
PreAttentionLayerNorm, ...) and DeepSpeed's fused transformer layer's (attn_qkvw, ..., norm_b).

`to_transformer_kernel_layout` / `from_transformer_kernel_layout` rename a state dict either way;
the model's encoder uses them when loading (so checkpoints of kernel and plain runs load into
both), `--use_pretrain` and checkpoint reading use them too. Depends on torch only.
"""
import re

import torch

from turing.errors import ConversionError

# DeepSpeedTransformerLayer parameter -> our per-layer name (pre_layer_norm=True). The kernel
# applies norm_w/norm_b to the layer input (before attention) and attn_nw/attn_nb to the
# residual after attention (ds_transformer_cuda.cpp, Forward), so they are our Pre- and
# PostAttentionLayerNorm respectively. attn_qkvw/attn_qkvb are [query; key; value] on dim 0.
_KERNEL_NAMES = {
    "attn_ow": "attention.output.dense.weight", "attn_ob": "attention.output.dense.bias",
    "norm_w": "PreAttentionLayerNorm.weight", "norm_b": "PreAttentionLayerNorm.bias",
    "attn_nw": "PostAttentionLayerNorm.weight", "attn_nb": "PostAttentionLayerNorm.bias",
    "inter_w": "intermediate.dense_act.weight", "inter_b": "intermediate.dense_act.bias",
    "output_w": "output.dense.weight", "output_b": "output.dense.bias",
}
_KERNEL_KEY = re.compile(r"^(?P<prefix>.*\.layer\.\d+\.)(?P<name>attn_qkv[wb]|"
                         + "|".join(_KERNEL_NAMES) + r")$")
_SPEC_TO_KERNEL = {ours: kernel for kernel, ours in _KERNEL_NAMES.items()}
_QKV_PARTS = ("query", "key", "value")
_SPEC_LAYER_KEY = re.compile(r"^(?P<prefix>.*\.layer\.\d+\.)(?P<name>attention\.self\.(?:query|key|value)\."
                             r"(?:weight|bias)|" + "|".join(re.escape(n) for n in _KERNEL_NAMES.values()) + r")$")


def from_transformer_kernel_layout(state_dict):
    """Rename DeepSpeedTransformerLayer parameters (attn_qkvw, ..., norm_b) to the original's names.

    Keys without kernel names pass through; a state dict in the plain layout is returned as is.
    """
    out = {}
    for key, value in state_dict.items():
        m = _KERNEL_KEY.match(key)
        if m is None:
            out[key] = value
            continue
        prefix, name = m.group("prefix"), m.group("name")
        if name in ("attn_qkvw", "attn_qkvb"):
            if value.shape[0] % 3:
                raise ConversionError(f"{key}: first dimension {value.shape[0]} is not 3 x hidden_size")
            p = "weight" if name == "attn_qkvw" else "bias"
            for part, tensor in zip(("query", "key", "value"), value.chunk(3, dim=0)):
                out[f"{prefix}attention.self.{part}.{p}"] = tensor.clone()
        else:
            out[prefix + _KERNEL_NAMES[name]] = value
    return out


def to_transformer_kernel_layout(state_dict):
    """Rename the original's layer parameters to DeepSpeedTransformerLayer's (the reverse of
    `from_transformer_kernel_layout`): query/key/value weights (and biases) become attn_qkvw
    (attn_qkvb), concatenated [query; key; value] on dim 0; the rest map one to one.

    Keys outside the layers pass through; a state dict already in the kernel layout is
    returned as is. A layer with only some of query/key/value raises ConversionError.
    """
    out = {}
    parts = {}  # attn_qkv key -> {"query": tensor, ...}
    for key, value in state_dict.items():
        m = _SPEC_LAYER_KEY.match(key)
        if m is None:
            out[key] = value
            continue
        prefix, name = m.group("prefix"), m.group("name")
        if name.startswith("attention.self."):
            part, kind = name.split(".")[2:]
            fused = f"{prefix}attn_qkv{kind[0]}"
            out.setdefault(fused, None)  # placeholder, so the fused tensor keeps query's place
            parts.setdefault(fused, {})[part] = value
        else:
            out[prefix + _SPEC_TO_KERNEL[name]] = value
    for fused, tensors in parts.items():
        missing = [p for p in _QKV_PARTS if p not in tensors]
        if missing:
            prefix, kind = fused[:-len("attn_qkvw")], "weight" if fused.endswith("w") else "bias"
            raise ConversionError(f"{prefix}attention.self.{missing[0]}.{kind}: missing; the kernel's "
                                  f"{fused.rsplit('.', 1)[-1]} needs query, key and value")
        shapes = {tuple(tensors[p].shape) for p in _QKV_PARTS}
        if len(shapes) != 1:
            raise ConversionError(f"{fused}: query, key and value shapes differ ({sorted(shapes)})")
        out[fused] = torch.cat([tensors[p] for p in _QKV_PARTS], dim=0)
    return out

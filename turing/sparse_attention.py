"""Block-sparse self-attention: DeepSpeed's sparsity layouts, computed with FlexAttention.

DeepSpeed's sparse attention (`--deepspeed_sparse_attention`, the `sparse_attention` block of
the DeepSpeed config) needed Triton 1.0 and is no longer shipped. This module owns
- the layouts, re-implemented from DeepSpeed's `sparsity_config.py` rules with its class and
  argument names: `DenseSparsityConfig`, `FixedSparsityConfig` (the default),
  `VariableSparsityConfig`, `BigBirdSparsityConfig`, `BSLongformerSparsityConfig`; each
  `make_layout(seq_len)` gives a 0/1 int64 tensor (num_heads, num_blocks, num_blocks), entry
  [h, i, j] = 1 when query block i of head h attends to key block j;
- `sparsity_config_from_ds`, reading the DeepSpeed config's `sparse_attention` block;
- `SparseSelfAttention`, softmax attention restricted to a layout, plus key padding.

Compute. A FlexAttention `BlockMask` is built from a mask_mod that looks up
layout[h, q // block, k // block] and the key padding mask. On CUDA it runs through
`torch.compile(flex_attention)` (one compile per shape, then a real block-sparse kernel).
PyTorch 2.13's FlexAttention has no backward on CPU (it raises NotImplementedError for
inputs that require grad, compiled or not), and compiling it on CPU costs ~25 s for the
forward alone; so on CPU the same mask_mod is materialised as a dense boolean mask and fed
to `F.scaled_dot_product_attention`: identical math, dense cost. `backend="flex"` forces
FlexAttention (on CPU: eager, inference only), `backend="sdpa"` the dense path.

Semantics to know:
- Padded keys are excluded (boolean mask), not penalised by -10000 as in our dense model.
  Rows whose every allowed key is padding (padded query positions only: a real query always
  sees its own block) give 0 where the additive form gives an average of padding values;
  real positions, hence the loss, are the same.
- Lengths that are not a multiple of `block` are padded up to one (padded keys masked) and
  the output is cut back to the input length.
- The layout is built once for `max_seq_length` and sliced to the current length, as
  DeepSpeed's `master_layout`; random blocks come from a seeded generator, so every rank
  builds the same layout without a broadcast.
- No dropout on the attention probabilities: DeepSpeed's BertSparseSelfAttention has none and
  FlexAttention offers none.
"""
import functools
import logging
import math
import random

import torch
import torch.nn.functional as F
from torch import nn

from turing.errors import InputValueError
from turing.internals import tensor_version

logger = logging.getLogger(__name__)

MODES = ("dense", "fixed", "variable", "bigbird", "bslongformer")
ATTENTION_TYPES = ("bidirectional", "unidirectional")


class SparsityConfigError(InputValueError):
    """A sparse-attention setting that DeepSpeed's rules do not allow."""


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SparsityConfigError(f"sparse_attention.{name}: expected an integer >= {minimum}, got {value!r}")


def _check_attention(attention):
    if attention not in ATTENTION_TYPES:
        raise SparsityConfigError(f"sparse_attention.attention: {attention!r} is not one of "
                                  f"{', '.join(ATTENTION_TYPES)}")


def _blocks_in_row(layout, key, needed):
    """Blocks in a row of `layout`, after checking that the `needed` blocks of config `key` fit."""
    num_blocks = layout.shape[1]
    if num_blocks < needed:
        raise SparsityConfigError(f"sparse_attention.{key} {needed} exceeds the {num_blocks} blocks of a row")
    return num_blocks


def _check_global_ranges(starts, ends):
    for i in starts:
        _check_int("global_block_indices[]", i, 0)
    if ends is None:
        return
    if len(starts) != len(ends):
        raise SparsityConfigError(f"sparse_attention.global_block_end_indices: {len(ends)} entries, but "
                                  f"global_block_indices has {len(starts)}")
    for start, end in zip(starts, ends):
        if start >= end:
            raise SparsityConfigError(f"sparse_attention.global_block_end_indices: end {end} is not after "
                                      f"its start {start}")


class SparsityConfig:
    """What all layouts share: head count, block size, one layout for all heads or one each."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False):
        _check_int("num_heads", num_heads, 1)
        _check_int("block", block, 1)
        self.num_heads = num_heads
        self.block = block
        self.different_layout_per_head = bool(different_layout_per_head)
        self.num_layout_heads = num_heads if different_layout_per_head else 1

    def setup_layout(self, seq_len):
        if seq_len % self.block:
            raise SparsityConfigError(f"sequence length {seq_len} is not a multiple of the block size {self.block}")
        num_blocks = seq_len // self.block
        return torch.zeros((self.num_heads, num_blocks, num_blocks), dtype=torch.int64)

    def check_and_propagate_first_head_layout(self, layout):
        if not self.different_layout_per_head:
            layout[1:] = layout[0]
        return layout

    def make_layout(self, seq_len):
        raise NotImplementedError

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class DenseSparsityConfig(SparsityConfig):
    """Every block attends to every block: ordinary attention, for comparison."""

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        layout[:] = 1
        return layout


def _set_local_windows(layout, h, windows, attention):
    """Block-diagonal windows; `windows` is a list of (start, end) block ranges."""
    for start, end in windows:
        if attention == "unidirectional":
            size = end - start
            block = layout[h, start:end, start:end]
            # OR, not assign: blocks set before (Variable's random ones) must survive
            block |= torch.tril(torch.ones(size, size, dtype=layout.dtype))
        else:
            layout[h, start:end, start:end] = 1


def _set_sliding_window(layout, h, width):
    num_blocks = _blocks_in_row(layout, "num_sliding_window_blocks", width)
    w = width // 2
    for row in range(num_blocks):
        layout[h, row, max(0, row - w):min(row + w + 1, num_blocks)] = 1


class FixedSparsityConfig(SparsityConfig):
    """Sparse Transformer "fixed" pattern (Child et al. 2019) as DeepSpeed customised it.

    Local: the sequence is cut into windows of num_local_blocks blocks, each attending within
    itself (lower triangle for unidirectional). Global: in every window the last
    num_global_blocks blocks (shifted one group earlier per head pattern when
    num_different_global_patterns > 1) are attended by all rows (unidirectional: by the rows
    from that block on), and with horizontal_global_attention also attend to everything.
    """

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_local_blocks=4,
                 num_global_blocks=1, attention="bidirectional", horizontal_global_attention=False,
                 num_different_global_patterns=1):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_int("num_local_blocks", num_local_blocks, 1)
        _check_int("num_global_blocks", num_global_blocks, 1)
        _check_int("num_different_global_patterns", num_different_global_patterns, 1)
        _check_attention(attention)
        if num_local_blocks % num_global_blocks:
            raise SparsityConfigError(f"sparse_attention.num_local_blocks {num_local_blocks} must be a multiple "
                                      f"of num_global_blocks {num_global_blocks}")
        if horizontal_global_attention and attention != "bidirectional":
            raise SparsityConfigError("sparse_attention.horizontal_global_attention needs attention "
                                      "'bidirectional'")
        if num_different_global_patterns > 1 and not different_layout_per_head:
            raise SparsityConfigError("sparse_attention.num_different_global_patterns > 1 needs "
                                      "different_layout_per_head true")
        if num_different_global_patterns > num_local_blocks // num_global_blocks:
            raise SparsityConfigError(
                f"sparse_attention.num_different_global_patterns {num_different_global_patterns} exceeds "
                f"num_local_blocks / num_global_blocks = {num_local_blocks // num_global_blocks}")
        self.num_local_blocks = num_local_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention
        self.horizontal_global_attention = bool(horizontal_global_attention)
        self.num_different_global_patterns = num_different_global_patterns

    def set_local_layout(self, h, layout):
        num_blocks = layout.shape[1]
        windows = [(i, min(i + self.num_local_blocks, num_blocks))
                   for i in range(0, num_blocks, self.num_local_blocks)]
        _set_local_windows(layout, h, windows, self.attention)
        return layout

    def _set_global_columns(self, h, layout, start, end):
        first_row = 0 if self.attention == "bidirectional" else start
        layout[h, first_row:, start:end] = 1
        if self.horizontal_global_attention:
            layout[h, start:end, :] = 1

    def set_global_layout(self, h, layout):
        num_blocks = layout.shape[1]
        local, glob = self.num_local_blocks, self.num_global_blocks
        first = local - (1 + h % self.num_different_global_patterns) * glob
        full_end = num_blocks - num_blocks % local   # end of the last complete window
        for i in range(first, full_end, local):
            self._set_global_columns(h, layout, i, i + glob)
        if full_end < num_blocks:
            # a short last window still gets its global blocks, pulled inside the sequence
            start = min(full_end + first, num_blocks - glob)
            self._set_global_columns(h, layout, start, start + glob)
        return layout

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_local_layout(h, layout)
            self.set_global_layout(h, layout)
        return self.check_and_propagate_first_head_layout(layout)


class VariableSparsityConfig(SparsityConfig):
    """Fixed's generalisation: random blocks per row, windows of given sizes (the last size
    repeats), and explicit global blocks (or [start, end) ranges of blocks)."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_random_blocks=0,
                 local_window_blocks=(4,), global_block_indices=(0,), global_block_end_indices=None,
                 attention="bidirectional", horizontal_global_attention=False, seed=0):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_int("num_random_blocks", num_random_blocks, 0)
        if not local_window_blocks:
            raise SparsityConfigError("sparse_attention.local_window_blocks: expected a non-empty list")
        for w in local_window_blocks:
            _check_int("local_window_blocks[]", w, 1)
        _check_global_ranges(global_block_indices, global_block_end_indices)
        _check_attention(attention)
        if horizontal_global_attention and attention != "bidirectional":
            raise SparsityConfigError("sparse_attention.horizontal_global_attention needs attention "
                                      "'bidirectional'")
        self.num_random_blocks = num_random_blocks
        self.local_window_blocks = list(local_window_blocks)
        self.global_block_indices = list(global_block_indices)
        self.global_block_end_indices = (None if global_block_end_indices is None
                                         else list(global_block_end_indices))
        self.attention = attention
        self.horizontal_global_attention = bool(horizontal_global_attention)
        self.seed = seed

    def set_random_layout(self, h, layout, rng):
        num_blocks = _blocks_in_row(layout, "num_random_blocks", self.num_random_blocks)
        # as in DeepSpeed, Variable's random blocks ignore the attention direction
        for row in range(num_blocks):
            layout[h, row, rng.sample(range(num_blocks), self.num_random_blocks)] = 1
        return layout

    def set_local_layout(self, h, layout):
        num_blocks = layout.shape[1]
        windows, start = [], 0
        for size in self.local_window_blocks:
            windows.append((start, min(start + size, num_blocks)))
            start += size
        size = self.local_window_blocks[-1]
        windows += [(i, min(i + size, num_blocks)) for i in range(start, num_blocks, size)]
        _set_local_windows(layout, h, [(s, e) for s, e in windows if s < e], self.attention)
        return layout

    def set_global_layout(self, h, layout):
        num_blocks = layout.shape[1]
        ends = self.global_block_end_indices or [i + 1 for i in self.global_block_indices]
        for start, end in zip(self.global_block_indices, ends):
            if start >= num_blocks:
                continue
            end = min(end, num_blocks)
            if self.horizontal_global_attention:
                layout[h, start:end, :] = 1
            first_row = 0 if self.attention == "bidirectional" else start
            layout[h, first_row:, start:end] = 1
        return layout

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        rng = random.Random(self.seed)
        for h in range(self.num_layout_heads):
            self.set_random_layout(h, layout, rng)
            self.set_local_layout(h, layout)
            self.set_global_layout(h, layout)
        return self.check_and_propagate_first_head_layout(layout)


class BigBirdSparsityConfig(SparsityConfig):
    """BigBird (Zaheer et al. 2020) in blocks: random blocks per row, a sliding window, and the
    first num_global_blocks blocks global in both directions."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_random_blocks=1,
                 num_sliding_window_blocks=3, num_global_blocks=1, attention="bidirectional", seed=0):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_int("num_random_blocks", num_random_blocks, 0)
        _check_int("num_sliding_window_blocks", num_sliding_window_blocks, 1)
        _check_int("num_global_blocks", num_global_blocks, 0)
        _check_attention(attention)
        self.num_random_blocks = num_random_blocks
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention
        self.seed = seed

    def set_random_layout(self, h, layout, rng):
        num_blocks = _blocks_in_row(layout, "num_random_blocks", self.num_random_blocks)
        for row in range(num_blocks):
            # unidirectional rows draw from the past only; the first rows have fewer than
            # num_random_blocks candidates (DeepSpeed crashed there), so they take them all
            candidates = range(num_blocks) if self.attention == "bidirectional" else range(row + 1)
            layout[h, row, rng.sample(candidates, min(self.num_random_blocks, len(candidates)))] = 1
        return layout

    def set_sliding_window_layout(self, h, layout):
        _set_sliding_window(layout, h, self.num_sliding_window_blocks)
        return layout

    def set_global_layout_itc(self, h, layout):
        _blocks_in_row(layout, "num_global_blocks", self.num_global_blocks)
        layout[h, :self.num_global_blocks, :] = 1
        layout[h, :, :self.num_global_blocks] = 1
        return layout

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        rng = random.Random(self.seed)
        for h in range(self.num_layout_heads):
            self.set_random_layout(h, layout, rng)
            self.set_sliding_window_layout(h, layout)
            self.set_global_layout_itc(h, layout)
        if self.attention == "unidirectional":
            layout = torch.tril(layout)
        return self.check_and_propagate_first_head_layout(layout)


class BSLongformerSparsityConfig(SparsityConfig):
    """Block-sparse Longformer (Beltagy et al. 2020): a sliding window plus global blocks
    (indices, or [start, end) ranges) that attend to and are attended by everything."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_sliding_window_blocks=3,
                 global_block_indices=(0,), global_block_end_indices=None, attention="bidirectional"):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_int("num_sliding_window_blocks", num_sliding_window_blocks, 1)
        _check_global_ranges(global_block_indices, global_block_end_indices)
        _check_attention(attention)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.global_block_indices = list(global_block_indices)
        self.global_block_end_indices = (None if global_block_end_indices is None
                                         else list(global_block_end_indices))
        self.attention = attention

    def set_sliding_window_layout(self, h, layout):
        _set_sliding_window(layout, h, self.num_sliding_window_blocks)
        return layout

    def set_global_layout(self, h, layout):
        num_blocks = layout.shape[1]
        ends = self.global_block_end_indices or [i + 1 for i in self.global_block_indices]
        for start, end in zip(self.global_block_indices, ends):
            if start < num_blocks:
                layout[h, start:min(end, num_blocks), :] = 1
                layout[h, :, start:min(end, num_blocks)] = 1
        return layout

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_sliding_window_layout(h, layout)
            self.set_global_layout(h, layout)
        if self.attention == "unidirectional":
            layout = torch.tril(layout)
        return self.check_and_propagate_first_head_layout(layout)


# The DeepSpeed config keys each mode reads (DeepSpeed 0.16's get_sparse_*_config), plus
# `attention` for bigbird/bslongformer, whose classes take it although DeepSpeed never read it.
_MODE_KEYS = {
    "dense": ("block", "different_layout_per_head"),
    "fixed": ("block", "different_layout_per_head", "num_local_blocks", "num_global_blocks", "attention",
              "horizontal_global_attention", "num_different_global_patterns"),
    "variable": ("block", "different_layout_per_head", "num_random_blocks", "local_window_blocks",
                 "global_block_indices", "global_block_end_indices", "attention",
                 "horizontal_global_attention"),
    "bigbird": ("block", "different_layout_per_head", "num_random_blocks", "num_sliding_window_blocks",
                "num_global_blocks", "attention"),
    "bslongformer": ("block", "different_layout_per_head", "num_sliding_window_blocks",
                     "global_block_indices", "global_block_end_indices", "attention"),
}
_MODE_CLASSES = {"dense": DenseSparsityConfig, "fixed": FixedSparsityConfig,
                 "variable": VariableSparsityConfig, "bigbird": BigBirdSparsityConfig,
                 "bslongformer": BSLongformerSparsityConfig}


def sparsity_config_from_ds(ds_sparse_config, num_heads, seed=0):
    """The layout config for a DeepSpeed `sparse_attention` block (a dict; None = all defaults).

    `mode` defaults to "fixed"; missing keys take DeepSpeed's defaults; `seed` seeds the random
    blocks of variable/bigbird. An unknown mode or key raises SparsityConfigError naming it.
    """
    if not isinstance(ds_sparse_config, (dict, type(None))):
        raise SparsityConfigError(f"sparse_attention: expected a JSON object, got {ds_sparse_config!r}")
    cfg = dict(ds_sparse_config or {})
    mode = cfg.pop("mode", "fixed")
    if mode not in _MODE_KEYS:
        raise SparsityConfigError(f"sparse_attention.mode: {mode!r} is not one of {', '.join(MODES)}")
    unknown = sorted(set(cfg) - set(_MODE_KEYS[mode]))
    if unknown:
        raise SparsityConfigError(f"sparse_attention: unknown key(s) {', '.join(unknown)} for mode {mode!r}; "
                                  f"expected some of mode, {', '.join(_MODE_KEYS[mode])}")
    if mode in ("variable", "bigbird"):
        cfg["seed"] = seed
    return _MODE_CLASSES[mode](num_heads, **cfg)


def split_sparse_attention_config(ds_config):
    """(the `sparse_attention` block or None, a copy of the DeepSpeed config without it).

    DeepSpeed 0.19 refuses a config that still has the block (the op was removed), so the
    block is read here and the rest goes to `deepspeed.initialize`.
    """
    rest = {k: v for k, v in ds_config.items() if k != "sparse_attention"}
    return ds_config.get("sparse_attention"), rest


def _keep_mask(key_padding_mask, batch, seq_len):
    """(B, L) bool, True = real key, from the two forms the model has at hand:
    (B, L) input_mask (nonzero = real token) or (B, 1, 1, L) additive mask (0 = real token)."""
    if key_padding_mask is None:
        return None
    m = key_padding_mask
    if m.dim() == 4 and m.shape[1] == 1 and m.shape[2] == 1 and m.is_floating_point():
        m = m[:, 0, 0, :] == 0
    elif m.dim() == 2:
        m = m != 0
    else:
        raise ValueError(f"key_padding_mask: expected (batch, seq_len) with 1 = real token or a floating "
                         f"(batch, 1, 1, seq_len) additive mask, got shape {tuple(m.shape)} {m.dtype}")
    if m.shape != (batch, seq_len):
        raise ValueError(f"key_padding_mask: shape {tuple(m.shape)} does not match batch {batch} x "
                         f"length {seq_len}")
    return m


def _mask_mod(layout, block, keep):
    """FlexAttention mask_mod: layout (Hl, nb, nb) bool, keep (B, L) bool or None.

    The kernel calls it with the real head index even when the BlockMask is broadcast over
    heads, so a layout shared by all heads (Hl = 1) must not be indexed by h.
    """
    shared = layout[0] if layout.shape[0] == 1 else None

    def mask_mod(b, h, q_idx, kv_idx):
        if shared is not None:
            allowed = shared[q_idx // block, kv_idx // block]
        else:
            allowed = layout[h, q_idx // block, kv_idx // block]
        if keep is not None:
            allowed = allowed & keep[b, kv_idx]
        return allowed
    return mask_mod


@functools.lru_cache(maxsize=None)
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention  # optional: PyTorch >= 2.5, CUDA path
    return torch.compile(flex_attention, dynamic=False)


def default_backend(device):
    """FlexAttention where it can train (CUDA); the dense-mask path elsewhere."""
    return "flex" if torch.device(device).type == "cuda" else "sdpa"


def prepare_mask(layout, block, key_padding_mask, batch, seq_len, device, backend):
    """What `attend` needs for one batch: a BlockMask (flex) or a dense bool mask (sdpa),
    over the length padded to a multiple of block.

    layout: (num_heads or 1, >= nb, >= nb) 0/1 (sliced to nb blocks here).
    """
    padded = math.ceil(seq_len / block) * block
    nb = padded // block
    if layout.shape[-1] < nb:
        raise InputValueError(f"sequence length {seq_len} needs {nb} blocks of {block}, but the sparse layout "
                         f"was built for {layout.shape[-1]} (raise max_seq_length)")
    lay = layout[:, :nb, :nb].to(device=device, dtype=torch.bool)
    keep = _keep_mask(key_padding_mask, batch, seq_len)
    if padded != seq_len:
        if keep is None:
            keep = torch.ones(batch, seq_len, dtype=torch.bool, device=device)
        keep = F.pad(keep, (0, padded - seq_len), value=False)
    if keep is not None:
        keep = keep.to(device)
    heads = lay.shape[0] if lay.shape[0] > 1 else None
    batches = batch if keep is not None else None
    if backend == "flex":
        from torch.nn.attention.flex_attention import create_block_mask  # optional: PyTorch >= 2.5
        return create_block_mask(_mask_mod(lay, block, keep), batches, heads, padded, padded, device=device)
    if backend != "sdpa":
        raise ValueError(f"backend: {backend!r} is not one of flex, sdpa")
    # The mask_mod written out densely: (Hl, L, L) from the blocks, & keys kept -> (B|1, Hl, L, L)
    dense = lay.repeat_interleave(block, dim=1).repeat_interleave(block, dim=2)[None]
    if keep is not None:
        dense = dense & keep[:, None, None, :]
    return dense


def attend(q, k, v, mask, backend):
    """Attention of q, k, v (B, H, L, D) under a mask from `prepare_mask`; returns (B, H, L, D)."""
    seq_len = q.shape[2]
    padded = mask.shape[-1]
    if padded != seq_len:
        q, k, v = (F.pad(t, (0, 0, 0, padded - seq_len)) for t in (q, k, v))
    if backend == "flex":
        if q.device.type == "cpu":
            if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
                raise NotImplementedError("FlexAttention has no backward on CPU in this PyTorch; "
                                          "use backend='sdpa' to train on CPU")
            from torch.nn.attention.flex_attention import flex_attention  # optional: PyTorch >= 2.5
            # eager, inference only; it refuses inputs that require grad even under no_grad
            out = flex_attention(q.detach(), k.detach(), v.detach(), block_mask=mask)
        else:
            out = _compiled_flex_attention()(q, k, v, block_mask=mask)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out[:, :, :seq_len]


def sparse_attention(q, k, v, layout, block, key_padding_mask=None, backend=None):
    """Block-sparse softmax(q k^T / sqrt(D)) v for q, k, v (B, H, L, D), any L.

    layout: (H or 1, nb, nb) 0/1 from a SparsityConfig (sliced to the blocks L needs);
    key_padding_mask: (B, L) with 1 = real token, or the model's (B, 1, 1, L) additive mask.
    """
    B, H, L, _ = q.shape
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"sparse_attention is self-attention: q, k, v shapes {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)} differ")
    if layout.shape[0] not in (1, H):
        raise ValueError(f"layout has {layout.shape[0]} heads, the input {H}")
    backend = backend or default_backend(q.device)
    mask = prepare_mask(layout, block, key_padding_mask, B, L, q.device, backend)
    return attend(q, k, v, mask, backend)


class SparseSelfAttention(nn.Module):
    """Block-sparse attention over (B, H, L, D) inputs with a layout from `sparsity_config`.

    One instance can serve every layer of a model: it holds no parameters (the layout is a
    non-persistent buffer, so state_dict keys do not change), and it reuses the mask it built
    for the previous call when called again with the same key padding mask tensor, so a
    model that passes the same mask to all its layers builds the BlockMask once per forward.
    """

    def __init__(self, sparsity_config, max_seq_length=512, backend=None):
        super().__init__()
        self.sparsity_config = sparsity_config
        self.block = sparsity_config.block
        self.backend = backend
        length = math.ceil(max_seq_length / self.block) * self.block
        # (num_layout_heads, nb, nb): one layout broadcast over heads unless they differ
        layout = sparsity_config.make_layout(length)[:sparsity_config.num_layout_heads]
        self.register_buffer("master_layout", layout.bool(), persistent=False)
        self._cached = None   # (key padding mask tensor, (its version, B, L, device, backend), prepared mask)
        logger.info("sparse attention: %s, %d of %d blocks attended at length %d", sparsity_config,
                    int(layout.sum()), layout.numel(), length)

    def forward(self, query, key, value, key_padding_mask=None):
        B, H, L, _ = query.shape
        if key.shape != query.shape or value.shape != query.shape:
            raise ValueError(f"SparseSelfAttention is self-attention: q, k, v shapes {tuple(query.shape)}, "
                             f"{tuple(key.shape)}, {tuple(value.shape)} differ")
        if H != self.sparsity_config.num_heads:
            raise ValueError(f"input has {H} heads, the sparsity config {self.sparsity_config.num_heads}")
        backend = self.backend or default_backend(query.device)
        tag = (None if key_padding_mask is None else tensor_version(key_padding_mask), B, L, query.device, backend)
        if self._cached is not None and self._cached[0] is key_padding_mask and self._cached[1] == tag:
            mask = self._cached[2]
        else:
            mask = prepare_mask(self.master_layout, self.block, key_padding_mask, B, L, query.device, backend)
            self._cached = (key_padding_mask, tag, mask)
        return attend(query, key, value, mask, backend)

"""The pre-LayerNorm BERT pretraining model and its configuration.

Owns: `BertConfig` (the `bert_model_config` of the job config) and `BertForPreTrainingPreLN`
(embeddings, pre-LN encoder with optional progressive layer drop and activation
checkpointing, pooler, MLM and NSP heads, the pretraining loss), and the two model options
that change how the encoder computes: block-sparse self-attention
(`--deepspeed_sparse_attention`, `turing.sparse_attention`) and DeepSpeed's fused CUDA
transformer layer (`--deepspeed_transformer_kernel`), chosen by `ModelOptions` (turing.model_options,
which also rejects option combinations this build cannot run). Knows nothing of training: no
optimizer, no engine. `turing/arch/bert/` registers this model as the "bert" architecture.

The model reads as the model: torch's dropout, SDPA and cross-entropy. The speed-ups for the CPU
(a cheaper dropout mask, attention under dropout written out around it, the vocab projection and
cross-entropy fused into one buffer) are turing/speedups.py's, applied by the builder
(turing.arch.pretraining_model) as module swaps that keep every key and every number.

The module tree, and therefore every `state_dict` key, is the original Bing BERT model's, so
its checkpoints load with `strict=True`. The computation is the original's, arranged to do
less work:
- Q, K and V come from one matmul over the concatenated weights (the three parameters stay
  separate so the keys stay);
- attention is `F.scaled_dot_product_attention` with the original's additive mask;
- bias + GELU is `F.gelu(F.linear(...))` (exact erf GELU), bias + tanh likewise;
- the MLM head gathers the masked positions first and runs its transform (dense, GELU,
  LayerNorm) and the tied vocab projection on those rows only; the original transformed every
  position and selected afterwards. Row-wise ops commute with row selection, so the result is
  the same;
- position embeddings are a slice of the table broadcast over the batch, not a lookup;
- optionally (`ModelOptions.unpad`) the embeddings and encoder run on the real tokens only
  (`Unpadding`), with the padded model's loss.

Sparse attention: one `SparseSelfAttention` (parameter-free, its layout a non-persistent
buffer) is shared by every layer's self-attention and replaces SDPA there; state_dict keys do
not change. It has no dropout on the attention probabilities (neither had DeepSpeed's).

Transformer kernel (CUDA only): the encoder layers are DeepSpeed's `DeepSpeedTransformerLayer`,
whose parameters are named attn_qkvw, attn_qkvb, attn_ow, ..., norm_b (the original's
checkpoints of kernel runs have those keys). The encoder's load_state_dict accepts either
layout and converts to its own (`turing.kernel_layout`), so weights move between kernel and plain
runs. Differences from the plain layer: the kernel's GELU is the tanh approximation, and it
cannot scale its branches (no progressive layer drop) or be recomputed by
torch.utils.checkpoint (its own memory flags do that job). NOT run in this project's CPU tests:
the CUDA construction and forward are checked only through a stand-in layer with the kernel's
parameter names, and the layout conversion by a round-trip test.
"""
import copy
import json
import logging
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from turing.batch import as_batch
from turing.errors import InputFileNotFoundError, InputValueError
from turing.kernel_layout import from_transformer_kernel_layout, to_transformer_kernel_layout
from turing.model_options import block_options
from turing.sparse_attention import SparseSelfAttention, sparsity_config_from_ds

logger = logging.getLogger(__name__)

LAYER_NORM_EPS = 1e-12

_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "tanh": torch.tanh}


class BertConfigError(InputValueError):
    """A model configuration that cannot be built; the message names the key or file."""


def config_values(json_object, architecture):
    """(the other keys, the vocab size) of a `bert_model_config` of `architecture`: a JSON object
    whose "architecture" (optional) is that one, with the vocab size under
    `vocab_size_or_config_json_file` (the original's key) or `vocab_size`."""
    if not isinstance(json_object, dict):
        raise BertConfigError(f"bert_model_config must be a JSON object, got {type(json_object).__name__}")
    values = dict(json_object)
    if values.pop("architecture", architecture) != architecture:
        raise BertConfigError(f"bert_model_config: architecture {json_object['architecture']!r} is not "
                              f"{architecture!r} (turing.arch.model_config_from_dict reads any)")
    vocab_keys = [k for k in ("vocab_size_or_config_json_file", "vocab_size") if k in values]
    if not vocab_keys:
        raise BertConfigError("bert_model_config: missing key 'vocab_size_or_config_json_file' (the vocab size)")
    vocab_size = values.pop(vocab_keys[0])
    for key in vocab_keys[1:]:
        values.pop(key)
    return values, vocab_size


class BertConfig:
    """Sizes, dropouts and init scale of the model (the job config's `bert_model_config`).

    `BertConfig(vocab_size_or_config_json_file, ...)` takes the vocab size as an int, or a
    path to a JSON file holding the whole configuration (as the original did).
    """

    architecture = "bert"  # bert_model_config's "architecture" (a class attribute: not in to_dict)
    FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
              "max_position_embeddings", "type_vocab_size", "initializer_range")

    def __init__(self, vocab_size_or_config_json_file, hidden_size=768, num_hidden_layers=12,
                 num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                 max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02):
        if isinstance(vocab_size_or_config_json_file, str):
            loaded = BertConfig.from_json_file(vocab_size_or_config_json_file)
            self.__dict__.update(loaded.__dict__)
            return
        if isinstance(vocab_size_or_config_json_file, bool) or not isinstance(vocab_size_or_config_json_file, int):
            raise BertConfigError(
                "bert_model_config: vocab_size_or_config_json_file must be an int (vocab size) or "
                f"a path to a config JSON, got {vocab_size_or_config_json_file!r}")
        self.vocab_size = vocab_size_or_config_json_file
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self._validate()

    def _validate(self):
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise BertConfigError(f"bert_model_config: {key} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise BertConfigError(
                f"bert_model_config: hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}")
        if self.hidden_act not in _ACTIVATIONS:
            raise BertConfigError(
                f"bert_model_config: hidden_act {self.hidden_act!r} is not one of {sorted(_ACTIVATIONS)}")
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise BertConfigError(f"bert_model_config: {key} must be in [0, 1), got {value!r}")
        if (isinstance(self.initializer_range, bool) or not isinstance(self.initializer_range, (int, float))
                or not 0 < self.initializer_range < math.inf):
            raise BertConfigError(
                f"bert_model_config: initializer_range must be a finite number > 0, got {self.initializer_range!r}")

    @classmethod
    def from_dict(cls, json_object):
        """Build from a dict with `vocab_size_or_config_json_file` (or `vocab_size`) and FIELDS (and
        optionally "architecture": "bert")."""
        values, vocab_size = config_values(json_object, cls.architecture)
        unknown = sorted(set(values) - set(cls.FIELDS))
        if unknown:
            raise BertConfigError(
                f"bert_model_config: unknown key(s) {unknown}; expected vocab_size_or_config_json_file "
                f"and any of {list(cls.FIELDS)}")
        if isinstance(vocab_size, str):
            raise BertConfigError("bert_model_config: vocab_size_or_config_json_file must be an int inside a dict")
        return cls(vocab_size, **values)

    @classmethod
    def from_json_file(cls, json_file):
        try:
            with open(json_file, encoding="utf-8") as reader:
                json_object = json.load(reader)
        except FileNotFoundError:
            raise InputFileNotFoundError(f"model config {json_file}: file not found") from None
        except json.JSONDecodeError as e:
            raise BertConfigError(f"model config {json_file}: not valid JSON ({e})") from None
        try:
            return cls.from_dict(json_object)
        except BertConfigError as e:
            raise BertConfigError(f"model config {json_file}: {e}") from None

    def to_dict(self):
        return copy.deepcopy(self.__dict__)

    def to_json_string(self):
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def __repr__(self):
        return self.to_json_string()


def _extended_attention_mask(input_mask, dtype):
    """(B, L) 1/0 mask -> (B, 1, 1, L) additive mask: 0 to attend, -10000 to ignore."""
    mask = input_mask[:, None, None, :].to(dtype=dtype)
    return (1.0 - mask) * -10000.0


def _round_up(n, multiple):
    return -(-n // multiple) * multiple


class MaskedLMLoss(nn.Module):
    """Mean cross-entropy of the vocab scores `hidden @ weight.T + bias` (N, V) against `target`
    (N,); 0 for N = 0 (a batch with no masked position adds nothing, not the NaN of a mean over
    nothing). turing.speedups swaps in a fused version with the same value and gradients."""

    def forward(self, hidden, weight, bias, target):
        return F.cross_entropy(F.linear(hidden, weight, bias), target, reduction="sum") / max(target.numel(), 1)


class ScaledDotProductAttention(nn.Module):
    """softmax(q k^T / sqrt(d) + mask) v with dropout on the probabilities, by
    F.scaled_dot_product_attention; q, k, v (B, heads, L, d). turing.speedups swaps in a CPU
    version for training with dropout."""

    def forward(self, q, k, v, attention_mask, dropout_p):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=dropout_p)


class Unpadding:
    """Where the real tokens of a padded (B, L) batch go when the encoder runs on them only.

    Kept: every position with input_mask 1, plus position 0 of every row (the pooler reads it)
    and any position carrying an MLM label, so the packed encoder gives the padded one's
    results for everything the loss reads. `indices` are the kept flat positions (T,) in the
    (B, L) layout; attention re-pads its Q/K/V to (B, length) (`pad`), where the additive
    `mask` (B, 1, 1, length) hides the padding as before, and packs the result back (`unpad`).

    Shapes are bucketed: `length` is the last kept column + 1 rounded up to a multiple of
    L/16, and T is rounded up to a multiple of B·L/32 by also keeping padding positions
    (computed like any padding, read by nothing). Without that every batch would bring new
    matmul shapes, and oneDNN builds a new bf16 kernel for each (measured: +2.8 ms a matmul,
    which made bf16 training slower with unpad than without); now at most 16 x 32 shapes recur.
    """

    def __init__(self, input_mask, masked_lm_labels, dtype):
        B, L = input_mask.shape
        keep = input_mask != 0
        keep[:, 0] = True
        if masked_lm_labels is not None:
            keep |= masked_lm_labels != -1
        last_column = int(torch.nonzero(keep.any(0)).max())
        self.length = min(L, _round_up(last_column + 1, max(1, L // 16)))
        kept = int(keep.sum())
        extra = min(B * self.length, _round_up(kept, max(1, B * L // 32))) - kept
        if extra > 0:  # the first `extra` padding positions inside the (B, length) window
            window = keep[:, :self.length].reshape(-1)
            spare = torch.nonzero(~window).squeeze(1)[:extra]
            keep[spare // self.length, spare % self.length] = True
        self.batch = B
        self.indices = torch.nonzero(keep.reshape(-1)).squeeze(1)  # (T,) in the (B, L) layout
        columns = self.indices % L
        self.positions = columns  # position id of every kept token
        # The same tokens in the (B, length) layout used by attention.
        self.padded_indices = self.indices // L * self.length + columns
        self.mask = _extended_attention_mask(input_mask[:, :self.length], dtype)
        self.dense = self.indices.numel() == B * self.length  # the whole (B, length) window is kept
        # flat (B, L) position -> row of the packed tensor (-1: not kept)
        self._packed_rows = torch.full((B * L,), -1, dtype=torch.long, device=keep.device)
        self._packed_rows[self.indices] = torch.arange(self.indices.numel(), device=keep.device)

    def pack(self, x):
        """(B, L, ...) -> (T, ...)."""
        return x.reshape(-1, *x.shape[2:]).index_select(0, self.indices)

    def pad(self, x):
        """(T, C) -> (B, length, C), zeros where nothing was kept."""
        if self.dense:
            return x.view(self.batch, self.length, -1)
        padded = x.new_zeros(self.batch * self.length, x.size(-1))
        return padded.index_copy(0, self.padded_indices, x).view(self.batch, self.length, -1)

    def unpad(self, x):
        """(B, length, C) -> (T, C)."""
        if self.dense:
            return x.reshape(-1, x.size(-1))
        return x.reshape(-1, x.size(-1)).index_select(0, self.padded_indices)

    def packed_index(self, flat_positions):
        """Flat (B, L) positions of kept tokens -> their rows in the packed (T, ...) tensor."""
        return self._packed_rows.index_select(0, flat_positions)


class BertEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=LAYER_NORM_EPS)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids, unpadding=None):
        """(B, L) ids -> (B, L, H); with `unpadding`, the kept tokens only: (T, H)."""
        seq_length = input_ids.size(1)
        if seq_length > self.position_embeddings.num_embeddings:
            raise InputValueError(f"sequence length {seq_length} exceeds max_position_embeddings "
                             f"{self.position_embeddings.num_embeddings}")
        if unpadding is not None:
            embeddings = (self.word_embeddings(unpadding.pack(input_ids))
                          + self.token_type_embeddings(unpadding.pack(token_type_ids))
                          + self.position_embeddings(unpadding.positions))
        else:
            # Positions 0..L-1 are the same for every row: add the table slice, broadcast over B.
            embeddings = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
                          + self.position_embeddings.weight[:seq_length])
        return self.dropout(self.LayerNorm(embeddings))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention; dense SDPA, or block-sparse when given a SparseSelfAttention."""

    def __init__(self, config, sparse_attention=None):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        self.core = ScaledDotProductAttention()  # no parameters: no state_dict keys
        # Shared by all layers; no parameters or persistent buffers, so no state_dict keys.
        self.sparse_attention = sparse_attention

    def forward(self, hidden_states, attention_mask, unpadding=None):
        """(B, L, H) -> (B, L, H); with `unpadding`, packed (T, H) -> (T, H) and the mask is
        `unpadding.mask`."""
        weight = torch.cat((self.query.weight, self.key.weight, self.value.weight))  # (3H, H)
        bias = torch.cat((self.query.bias, self.key.bias, self.value.bias))
        qkv = F.linear(hidden_states, weight, bias)  # (B, L, 3H) or packed (T, 3H)
        if unpadding is not None:
            qkv = unpadding.pad(qkv)  # (B, length, 3H)
        B, L, H = qkv.size(0), qkv.size(1), qkv.size(2) // 3
        # Views only: (B, L, 3, heads, d) -> three (B, L, heads, d) strided tensors.
        q, k, v = qkv.view(B, L, 3, self.num_attention_heads, self.attention_head_size).unbind(2)
        dropout_p = self.dropout_p if self.training else 0.0
        if self.sparse_attention is not None:
            # The additive (B, 1, 1, L) mask doubles as the key padding mask (0 = real key).
            context = self.sparse_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                            key_padding_mask=attention_mask)
        else:
            context = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attention_mask, dropout_p)
        context = context.transpose(1, 2).reshape(B, L, H)  # (B, heads, L, d) -> (B, L, H)
        return unpadding.unpad(context) if unpadding is not None else context


class BertSelfOutput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states):
        return self.dropout(self.dense(hidden_states))


class BertAttention(nn.Module):
    def __init__(self, config, sparse_attention=None):
        super().__init__()
        self.self = BertSelfAttention(config, sparse_attention)
        self.output = BertSelfOutput(config)

    def forward(self, hidden_states, attention_mask, unpadding=None):
        return self.output(self.self(hidden_states, attention_mask, unpadding))


class BertIntermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_act = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, hidden_states):
        return self.act(self.dense_act(hidden_states))


class BertOutput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states):
        return self.dropout(self.dense(hidden_states))


class BertLayer(nn.Module):
    """x + Dropout(Attn(LN(x))), then h + Dropout(FFN(LN(h))); branches scaled by 1/keep_prob."""

    def __init__(self, config, sparse_attention=None):
        super().__init__()
        self.attention = BertAttention(config, sparse_attention)
        self.PreAttentionLayerNorm = nn.LayerNorm(config.hidden_size, eps=LAYER_NORM_EPS)
        self.PostAttentionLayerNorm = nn.LayerNorm(config.hidden_size, eps=LAYER_NORM_EPS)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden_states, attention_mask, keep_prob: float = 1.0, unpadding=None):
        # PLD: a kept layer's residual branches are scaled by 1/keep_prob so the expected
        # output matches the full network; alpha folds the scaling into the residual add.
        scale = 1.0 / keep_prob
        attention_output = self.attention(self.PreAttentionLayerNorm(hidden_states), attention_mask, unpadding)
        hidden_states = torch.add(hidden_states, attention_output, alpha=scale)
        ffn_output = self.output(self.intermediate(self.PostAttentionLayerNorm(hidden_states)))
        return torch.add(hidden_states, ffn_output, alpha=scale)


def _load_layers_in_own_layout(encoder, state_dict, prefix, *_):
    """load_state_dict pre-hook of BertEncoder: rename incoming layer weights to the layout
    this encoder has (the original's names, or the transformer kernel's), so checkpoints of either
    kind load into both. Edits `state_dict` in place (load_state_dict passes a copy)."""
    convert = to_transformer_kernel_layout if encoder.uses_transformer_kernel else from_transformer_kernel_layout
    layer_prefix = prefix + "layer."
    keys = [k for k in state_dict if k.startswith(layer_prefix)]
    # The converters find layers by ".layer.N."; a leading "." covers prefix "" too.
    layers = {"." + k: state_dict.pop(k) for k in keys}
    state_dict.update({k[1:]: v for k, v in convert(layers).items()})


class BertEncoder(nn.Module):
    """The layers and the final LayerNorm. Layers are `BertLayer`s, or with `kernel_layers`
    (a list of DeepSpeedTransformerLayer) DeepSpeed's fused layers."""

    def __init__(self, config, checkpoint_activations=False, sparse_attention=None, kernel_layers=None):
        super().__init__()
        self.uses_transformer_kernel = kernel_layers is not None
        # Registered before the layers, as in the original: parameter order is what positional
        # optimizer states (and DeepSpeed's flat master weights) are matched by.
        self.FinalLayerNorm = nn.LayerNorm(config.hidden_size, eps=LAYER_NORM_EPS)
        if self.uses_transformer_kernel:
            self.layer = nn.ModuleList(kernel_layers)
        else:
            self.layer = nn.ModuleList([BertLayer(config, sparse_attention)
                                        for _ in range(config.num_hidden_layers)])
        self.checkpoint_activations = checkpoint_activations
        self.last_layers_run = 0  # layers computed by the last forward (PLD skips some)
        self.register_load_state_dict_pre_hook(_load_layers_in_own_layout)

    def keep_probabilities(self, theta):
        """PLD keep probability of each layer: p_i = 1 - i * (1 - theta) / L, i from 0."""
        num_layers = len(self.layer)
        return [1.0 - i * (1.0 - theta) / num_layers for i in range(num_layers)]

    def forward(self, hidden_states, attention_mask, pld_theta: Optional[float] = None, unpadding=None):
        """(B, L, H) -> (B, L, H), or packed (T, H) -> (T, H) with `unpadding` (plain layers only)."""
        if self.uses_transformer_kernel:
            if pld_theta is not None:
                raise ValueError("progressive layer drop cannot run with --deepspeed_transformer_kernel")
            for layer_module in self.layer:
                # (B, L, H) in and out; the mask is the additive (B, 1, 1, L) one, model dtype
                hidden_states = layer_module(hidden_states, attention_mask)
            self.last_layers_run = len(self.layer)
            return self.FinalLayerNorm(hidden_states)
        drop_layers = self.training and pld_theta is not None
        keep_probs = self.keep_probabilities(pld_theta) if drop_layers else [1.0] * len(self.layer)
        layers_run = 0
        for layer_module, keep_prob in zip(self.layer, keep_probs):
            # Only layers that can be dropped draw from the RNG, so theta = 1 consumes none
            # and reproduces a run without PLD. The CPU generator keeps this free of device syncs.
            if keep_prob < 1.0 and torch.rand(()).item() >= keep_prob:
                continue  # dropped: the layer passes its input through
            layers_run += 1
            if self.checkpoint_activations and self.training:
                hidden_states = checkpoint(layer_module, hidden_states, attention_mask, keep_prob, unpadding,
                                           use_reentrant=False)
            else:
                hidden_states = layer_module(hidden_states, attention_mask, keep_prob, unpadding)
        self.last_layers_run = layers_run
        return self.FinalLayerNorm(hidden_states)


class BertPooler(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_act = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states):
        return self.dense_pool(hidden_states[:, 0])  # (B, H) from [CLS]

    def dense_pool(self, first_tokens):
        return torch.tanh(self.dense_act(first_tokens))


class BertModel(nn.Module):
    def __init__(self, config, checkpoint_activations=False, sparse_attention=None, kernel_layers=None):
        super().__init__()
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config, checkpoint_activations, sparse_attention, kernel_layers)
        self.pooler = BertPooler(config)

    def forward(self, input_ids, token_type_ids, attention_mask, pld_theta=None, unpadding=None):
        """-> (sequence_output (B, L, H) after FinalLayerNorm, pooled_output (B, H)).

        With `unpadding` (an `Unpadding` of this batch) the encoder runs on the kept tokens
        only and sequence_output is packed: (T, H).
        """
        embedding_output = self.embeddings(input_ids, token_type_ids, unpadding)
        if unpadding is not None:
            sequence_output = self.encoder(embedding_output, unpadding.mask, pld_theta, unpadding)
            # Position 0 of every row is always kept and comes first in its row.
            first_tokens = sequence_output.index_select(0, unpadding.packed_index(
                torch.arange(unpadding.batch, device=input_ids.device) * input_ids.size(1)))
            return sequence_output, self.pooler.dense_pool(first_tokens)
        extended_mask = _extended_attention_mask(attention_mask, embedding_output.dtype)
        sequence_output = self.encoder(embedding_output, extended_mask, pld_theta)
        return sequence_output, self.pooler(sequence_output)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_act = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = _ACTIVATIONS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=LAYER_NORM_EPS)

    def forward(self, hidden_states):
        return self.LayerNorm(self.act(self.dense_act(hidden_states)))


class BertLMPredictionHead(nn.Module):
    """transform (default the original's), then the vocab projection tied to the word embedding, + bias."""

    def __init__(self, config, word_embedding_weight, transform=None):
        super().__init__()
        self.transform = transform if transform is not None else BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.decoder.weight = word_embedding_weight  # tied: one tensor, two names
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states):
        """(..., H) -> (..., V) vocab scores."""
        return F.linear(self.transform(hidden_states), self.decoder.weight, self.bias)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config, word_embedding_weight, transform=None):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embedding_weight, transform)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, sequence_output, pooled_output):
        return self.predictions(sequence_output), self.seq_relationship(pooled_output)


def _transformer_kernel_layers(config, options):
    """One DeepSpeedTransformerLayer per encoder layer (pre-LN, CUDA).

    Checked only against a stand-in layer on CPU (tests/test_model_options.py); run the GPU
    check script before relying on it.
    """
    from deepspeed.ops.transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer  # CUDA-only op

    settings = transformer_kernel_settings(config, options)
    logger.info("DeepSpeed transformer kernel layers: %s", settings)
    # A fresh config per layer: each layer writes its own id into the config it is given.
    return [DeepSpeedTransformerLayer(DeepSpeedTransformerConfig(**settings))
            for _ in range(config.num_hidden_layers)]


def transformer_kernel_settings(config, options):
    """DeepSpeedTransformerConfig's keyword arguments for the encoder's sizes and the run's options
    (turing.kernel_probe builds a probe layer from them)."""
    if config.hidden_act != "gelu":
        raise BertConfigError(f"bert_model_config: hidden_act {config.hidden_act!r}; "
                              "--deepspeed_transformer_kernel computes gelu only")
    batch_size = options.micro_batch
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise InputValueError("--deepspeed_transformer_kernel needs args.train_micro_batch_size_per_gpu (the "
                              f"kernel's maximum batch), got {batch_size!r}")
    settings = dict(
        batch_size=batch_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        heads=config.num_attention_heads,
        attn_dropout_ratio=config.attention_probs_dropout_prob,
        hidden_dropout_ratio=config.hidden_dropout_prob,
        num_hidden_layers=config.num_hidden_layers,
        initializer_range=config.initializer_range,
        layer_norm_eps=LAYER_NORM_EPS,
        local_rank=options.local_rank,
        seed=options.seed,
        fp16=options.precision == "fp16",
        pre_layer_norm=True,
        attn_dropout_checkpoint=bool(options.attention_dropout_checkpoint),
        normalize_invertible=bool(options.normalize_invertible),
        gelu_checkpoint=bool(options.gelu_checkpoint),
        stochastic_mode=bool(options.stochastic_mode),
    )
    return settings


def _sparse_self_attention(config, options):
    """The one SparseSelfAttention all layers share, from ds_config's `sparse_attention` block."""
    sparsity_config = sparsity_config_from_ds(options.sparse_attention, config.num_attention_heads,
                                              seed=options.seed)
    return SparseSelfAttention(sparsity_config, max_seq_length=config.max_position_embeddings)


def layer_drop_theta(kwargs):
    """The keep rate a forward's keyword arguments ask for: `pld_theta` in (0, 1] where DeepSpeed's
    engine passes `progressive_layer_drop` true (training with PLD), else None (every layer runs)."""
    if not kwargs.get("progressive_layer_drop", False):
        return None
    pld_theta = kwargs.get("pld_theta")
    if pld_theta is None or not 0.0 < float(pld_theta) <= 1.0:
        raise ValueError(f"progressive_layer_drop needs pld_theta in (0, 1], got {pld_theta!r}")
    return float(pld_theta)


def masked_lm_loss_of_scores(prediction_scores, masked_lm_labels):
    """The MLM term from full prediction scores (B, L, V): cross-entropy in fp32, averaged over the
    positions whose label is not -1; 0 for a batch without any (not the NaN of a mean over
    nothing). The training forward computes the same term on the masked rows only."""
    masked = masked_lm_labels != -1
    return (F.cross_entropy(prediction_scores[masked].float(), masked_lm_labels[masked], reduction="sum")
            / masked.sum().clamp(min=1))


def pretraining_loss(masked_lm_loss, nsp_scores, next_sentence_labels):
    """The pretraining loss, for training and validation alike: the MLM term plus the NSP
    cross-entropy (labels -1 ignored), or the MLM term alone where `nsp_scores` is None (the
    job config's next_sentence_prediction false)."""
    if nsp_scores is None:
        return masked_lm_loss
    return masked_lm_loss + F.cross_entropy(nsp_scores, next_sentence_labels.reshape(-1), ignore_index=-1)


class BertForPreTrainingPreLN(nn.Module):
    """BERT with the MLM and NSP heads; `forward(batch)` returns the pretraining loss.

    `batch` is (batch_type, input_ids, input_mask, segment_ids, next_sentence_labels,
    masked_lm_labels), a `turing.batch.Batch` or any sequence in that order; labels -1 are
    ignored. With labels, returns CE(MLM over the masked positions) + CE(NSP), or the MLM term
    alone when the options' next_sentence_prediction is False (the pooler and NSP head stay in the
    model, untrained, so checkpoints keep their keys); a batch with no masked position
    contributes 0 for the MLM term (instead of the NaN a mean over nothing gives). With `masked_lm_labels` None, returns (prediction_scores (B, L, V), nsp_scores (B, 2)).
    Keyword arguments: `progressive_layer_drop` and `pld_theta`, which DeepSpeed's engine adds
    when PLD is on (layers drop only in training); any other keyword is ignored.
    `options`: ModelOptions, or the original's `args` (read once, by ModelOptions.from_args);
    see turing.model_options for what cannot be combined.
    """

    architecture = "bert"     # bert_model_config's architecture (turing.arch)
    refused_options = {}      # ModelOptions flags this block cannot run: {flag: why}
    nsp_head = True           # it has a pooler and a next-sentence head

    def __init__(self, config, options=None):
        super().__init__()
        options = block_options(options, type(self))
        self.config = config
        sparse_attention = kernel_layers = None
        if options.deepspeed_sparse_attention:
            sparse_attention = _sparse_self_attention(config, options)
        if options.deepspeed_transformer_kernel:
            kernel_layers = _transformer_kernel_layers(config, options)
        self.bert = BertModel(config, bool(options.checkpoint_activations), sparse_attention, kernel_layers)
        # --unpad: the encoder runs on real tokens only (training loss; predict() stays padded).
        self.unpad = bool(options.unpad)
        self.next_sentence_prediction = bool(options.next_sentence_prediction)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings.weight)
        self.mlm_loss = MaskedLMLoss()
        self._init_weights()

    def _init_weights(self):
        std = self.config.initializer_range
        # The dense layers that write into the residual stream start smaller (GPT-2 style).
        residual_std = std / math.sqrt(2.0 * self.config.num_hidden_layers)
        residual_denses = {id(m.dense) for m in self.modules() if isinstance(m, (BertSelfOutput, BertOutput))}
        for module in self.modules():
            if module is self.cls.predictions.decoder:
                continue  # tied: its weight is the word embedding, initialised there
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, residual_std if id(module) in residual_denses else std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if self.bert.encoder.uses_transformer_kernel:
            # The same init for the kernel's parameters too, so both layer kinds start alike
            # (DeepSpeed's own init scales the residual weights only when local_rank == 0).
            for layer in self.bert.encoder.layer:
                for name in ("attn_qkvw", "inter_w"):
                    nn.init.normal_(getattr(layer, name), 0.0, std)
                for name in ("attn_ow", "output_w"):
                    nn.init.normal_(getattr(layer, name), 0.0, residual_std)
                for name in ("attn_qkvb", "attn_ob", "inter_b", "output_b", "attn_nb", "norm_b"):
                    nn.init.zeros_(getattr(layer, name))
                for name in ("attn_nw", "norm_w"):
                    nn.init.ones_(getattr(layer, name))

    def forward(self, batch, **kwargs):
        batch = as_batch(batch)
        input_ids, input_mask, segment_ids = batch.input_ids, batch.input_mask, batch.segment_ids
        next_sentence_labels, masked_lm_labels = batch.next_sentence_labels, batch.masked_lm_labels
        pld_theta = layer_drop_theta(kwargs)

        if masked_lm_labels is None or next_sentence_labels is None:
            sequence_output, pooled_output = self.bert(input_ids, segment_ids, input_mask, pld_theta)
            return self.cls(sequence_output, pooled_output)

        unpadding = None
        if self.unpad:
            unpadding = Unpadding(input_mask, masked_lm_labels, self.bert.embeddings.word_embeddings.weight.dtype)
            if unpadding.indices.numel() == input_mask.numel():
                unpadding = None  # no padding in this batch
        sequence_output, pooled_output = self.bert(input_ids, segment_ids, input_mask, pld_theta, unpadding)

        # Gather the masked rows first: the transform and the vocab projection see only them.
        flat_labels = masked_lm_labels.reshape(-1)
        masked_positions = torch.nonzero(flat_labels != -1).squeeze(1)  # (N,)
        rows = masked_positions if unpadding is None else unpadding.packed_index(masked_positions)
        masked_output = sequence_output.reshape(-1, sequence_output.size(-1)).index_select(0, rows)
        predictions = self.cls.predictions
        masked_lm_loss = self.mlm_loss(predictions.transform(masked_output), predictions.decoder.weight,
                                       predictions.bias, flat_labels.index_select(0, masked_positions))
        nsp_scores = self.cls.seq_relationship(pooled_output) if self.next_sentence_prediction else None
        return pretraining_loss(masked_lm_loss, nsp_scores, next_sentence_labels)

    def predict(self, input_ids, segment_ids, input_mask):
        """Scores for every position: (prediction_scores (B, L, V), nsp_scores (B, 2))."""
        sequence_output, pooled_output = self.bert(input_ids, segment_ids, input_mask)
        return self.cls(sequence_output, pooled_output)

    def encode(self, input_ids, segment_ids, input_mask):
        """The final hidden states (B, L, H), for scoring chosen positions with `mlm_scores`."""
        return self.bert(input_ids, segment_ids, input_mask)[0]

    def mlm_scores(self, hidden_states):
        """(..., H) final hidden states -> (..., V) MLM scores."""
        return self.cls.predictions(hidden_states)

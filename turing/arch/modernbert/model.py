"""The ModernBERT-style encoder: `bert_model_config` with `"architecture": "modernbert"`.

Owns `ModernConfig` (that architecture's `bert_model_config`: key names and defaults are Hugging
Face's `ModernBertConfig`'s where the concept is the same), `ModernForPreTraining` (embeddings,
encoder, MLM head, the pretraining loss; `forward(batch)` like `BertForPreTrainingPreLN`'s),
`ModernEncoder` (what fine-tuning sits on, `model.bert`) and `ModernPredictionHead`. Knows
nothing of training; the shared pieces (the fused vocab projection + cross-entropy, the CPU
dropout, `Unpadding`, `pretraining_loss`) are `turing.modeling`'s, the options `turing.model_options`'.

The block, as ModernBERT (Warner et al. 2024) and `transformers`' ModernBertModel compute it:
- embeddings: token embedding, LayerNorm, dropout; no position table, no token types (segment
  ids are read by nothing);
- layer i: `x + Attn(attn_norm(x))` then `h + MLP(mlp_norm(h))`; layer 0 has no attn_norm
  (the embedding norm precedes it); a final LayerNorm after the last layer;
- attention: one Wqkv projection, rotary position embeddings (RoPE, `rotate_half` form, theta
  `global_rope_theta` in full-attention layers, `local_rope_theta` in sliding-window ones),
  softmax attention, Wo; full attention every `global_attn_every_n_layers` layers (layers 0, n,
  2n, ...), elsewhere a sliding window: query i sees key j when |i - j| <= local_attention // 2
  (`layer_types` in `transformers`' terms);
- MLP: GeGLU, `Wo(act(a) * g)` with `a, g = Wi(x).chunk(2)` (Wi: hidden -> 2 x intermediate);
- no biases in the linear layers and LayerNorms (`attention_bias`, `mlp_bias`, `norm_bias`,
  `classifier_bias` false), LayerNorm eps `norm_eps` (1e-5);
- MLM head: dense + act + LayerNorm (`ModernPredictionHead`), then the decoder tied to the
  token embedding, with a bias; like our BERT, it runs on the masked rows only.
No next-sentence head and no pooler: ModernBERT trains the MLM loss alone, so a job config of
this architecture must not turn `next_sentence_prediction` on (it defaults to false here).
Fine-tuning puts a fresh prediction head on the [CLS] token (or the mean, `classifier_pooling`),
as `transformers`' ModernBertForSequenceClassification does (`turing.glue`).

Attention masks. Padding is an additive -10000 on the keys, as in our BERT. The sliding window is
a dense band mask added to it (B, 1, L, L) on CPU; on CUDA, where FlexAttention exists and no
attention dropout is asked for, the sliding-window layers run FlexAttention with a BlockMask
(one per forward, shared by those layers), which skips the blocks outside the band. With
`ModelOptions.unpad` the encoder runs on the real tokens only, exactly as `--unpad` does for
BERT (`turing.modeling.Unpadding`): attention re-pads Q/K/V to the batch's kept length, where
positions are the columns, so RoPE and the band are the padded model's.

Parameter names are `transformers`' ModernBertForMaskedLM's under our two roots: `bert.` for its
`model.` (embeddings.tok_embeddings, embeddings.norm, layers.N.{attn_norm, attn.Wqkv, attn.Wo,
mlp_norm, mlp.Wi, mlp.Wo}, final_norm) and `cls.` for its `head.` and `decoder.`, so the export
(`turing/arch/modernbert/hf.py`) renames the roots and drops the vocab padding rows, nothing else.
Initialisation is `transformers`' (truncated normal at `initializer_cutoff_factor` stds;
Wo of attention and MLP and the head's dense at initializer_range / sqrt(2 x layers)).

Options: `--unpad`, `--checkpoint_activations`, `--compile` and progressive layer drop apply;
DeepSpeed's transformer kernel (the original block, fused) and `--deepspeed_sparse_attention`
(DeepSpeed's layouts for the original block) do not, and `refused_options` refuses them.
"""
import copy
import dataclasses
import functools
import json
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from turing.errors import InputValueError
from turing.model_options import block_options
from turing.batch import as_batch
from turing.modeling import (_ACTIVATIONS, BertConfigError, MaskedLMLoss, Unpadding, _extended_attention_mask,
                             config_values, layer_drop_theta, pretraining_loss)

ARCHITECTURE = "modernbert"
FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' layer_types names
LAYER_TYPES = (FULL, SLIDING)
MASKED = -10000.0  # additive score of a key a query must not see (padding, outside the window)

# Keys of the original's bert_model_config that ModernBertConfig names otherwise, or lacks.
BERT_ONLY_KEYS = {
    "hidden_act": "use hidden_activation",
    "hidden_dropout_prob": "use embedding_dropout and mlp_dropout",
    "attention_probs_dropout_prob": "use attention_dropout",
    "type_vocab_size": "the modernbert architecture has no token type embeddings",
}


class ModernConfig:
    """Sizes and settings of the ModernBERT-style model: `bert_model_config` with
    "architecture": "modernbert". Names and defaults are transformers' ModernBertConfig's (5.x)
    where the concept is the same (its defaults are ModernBERT-base's); `layer_types` may be
    given instead of `global_attn_every_n_layers`. The vocab size is the vocab file's (rounded up
    to 8) whatever the config says, as for BERT."""

    architecture = ARCHITECTURE
    DEFAULTS = dict(
        hidden_size=768, intermediate_size=1152, num_hidden_layers=22, num_attention_heads=12,
        hidden_activation="gelu", max_position_embeddings=8192, initializer_range=0.02,
        initializer_cutoff_factor=2.0, norm_eps=1e-5, norm_bias=False, attention_bias=False,
        attention_dropout=0.0, global_attn_every_n_layers=3, layer_types=None,
        global_rope_theta=160000.0, local_rope_theta=10000.0, local_attention=128, embedding_dropout=0.0,
        mlp_bias=False, mlp_dropout=0.0, classifier_pooling="cls", classifier_dropout=0.0,
        classifier_bias=False, classifier_activation="gelu")
    FIELDS = tuple(DEFAULTS)

    def __init__(self, vocab_size, **values):
        unknown = sorted(set(values) - set(self.FIELDS))
        if unknown:
            raise BertConfigError(f"bert_model_config (architecture {ARCHITECTURE}): unknown key(s) {unknown}; "
                                  f"expected any of {list(self.FIELDS)}")
        self.vocab_size = vocab_size
        for key, default in self.DEFAULTS.items():
            setattr(self, key, copy.deepcopy(values.get(key, default)))
        self._validate_sizes()
        if self.layer_types is None:  # full attention in layers 0, n, 2n, ... (transformers' rule)
            every = self.global_attn_every_n_layers
            self.layer_types = [SLIDING if i % every else FULL for i in range(self.num_hidden_layers)]
        self._validate()

    def _fail(self, message):
        raise BertConfigError(f"bert_model_config (architecture {ARCHITECTURE}): {message}")

    def _validate_sizes(self):
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "max_position_embeddings", "global_attn_every_n_layers", "local_attention"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                self._fail(f"{key} must be a positive int, got {value!r}")

    def _validate(self):
        if self.hidden_size % self.num_attention_heads or (self.hidden_size // self.num_attention_heads) % 2:
            self._fail(f"hidden_size {self.hidden_size} must be num_attention_heads {self.num_attention_heads} "
                       f"x an even head size (rotary embeddings rotate pairs)")
        for key in ("hidden_activation", "classifier_activation"):
            if getattr(self, key) not in _ACTIVATIONS:
                self._fail(f"{key} {getattr(self, key)!r} is not one of {sorted(_ACTIVATIONS)}")
        for key in ("attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                self._fail(f"{key} must be in [0, 1), got {value!r}")
        for key in ("initializer_range", "initializer_cutoff_factor", "norm_eps", "global_rope_theta",
                    "local_rope_theta"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                self._fail(f"{key} must be a finite number > 0, got {value!r}")
        for key in ("norm_bias", "attention_bias", "mlp_bias", "classifier_bias"):
            if not isinstance(getattr(self, key), bool):
                self._fail(f"{key} must be true or false, got {getattr(self, key)!r}")
        if self.classifier_pooling not in ("cls", "mean"):
            self._fail(f"classifier_pooling must be 'cls' or 'mean', got {self.classifier_pooling!r}")
        types = self.layer_types
        if (not isinstance(types, list) or len(types) != self.num_hidden_layers
                or any(t not in LAYER_TYPES for t in types)):
            self._fail(f"layer_types must list one of {list(LAYER_TYPES)} for each of the {self.num_hidden_layers} "
                       f"layers, got {types!r}")

    @classmethod
    def from_dict(cls, json_object):
        """From `bert_model_config`: `vocab_size_or_config_json_file` (or `vocab_size`), "architecture":
        "modernbert", and any of FIELDS; the original's BERT-only keys are refused with the name to use."""
        values, vocab_size = config_values(json_object, ARCHITECTURE)
        for key, hint in BERT_ONLY_KEYS.items():
            if key in values:
                raise BertConfigError(f"bert_model_config (architecture {ARCHITECTURE}): key {key!r} is the original "
                                      f"BERT's; {hint}")
        return cls(vocab_size, **values)

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    @property
    def window_half(self):
        """A sliding-window query sees keys up to this many positions away on either side."""
        return self.local_attention // 2

    def rope_theta(self, layer_type):
        return self.global_rope_theta if layer_type == FULL else self.local_rope_theta

    def to_dict(self):
        out = {"architecture": ARCHITECTURE, "vocab_size": self.vocab_size}
        out.update({key: copy.deepcopy(getattr(self, key)) for key in self.FIELDS})
        return out

    def to_json_string(self):
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def __repr__(self):
        return self.to_json_string()


# ---------------------------------------------------------------------------------------------
# Rotary embeddings and masks


def rope_cos_sin(theta, head_dim, length, device):
    """cos, sin (length, head_dim) in fp32 for positions 0..length-1 (transformers' default rope)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    freqs = torch.arange(length, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """x (B, heads, L, d) rotated by position, in fp32 (the `rotate_half` form), back in x's dtype."""
    xf = x.float()
    first, second = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)


def band(length, window_half, device):
    """(L, L) bool: True where |query - key| <= window_half (what a sliding-window query sees)."""
    positions = torch.arange(length, device=device)
    return (positions[None, :] - positions[:, None]).abs() <= window_half


def flex_available():
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401 (PyTorch >= 2.5)
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False)


def flex_attention(q, k, v, block_mask):
    """FlexAttention: compiled on CUDA (a block-sparse kernel); eager elsewhere, which torch
    2.13 runs for inference only (no backward on CPU)."""
    if q.device.type == "cuda":
        return _compiled_flex_attention()(q, k, v, block_mask=block_mask)
    from torch.nn.attention.flex_attention import flex_attention as eager
    return eager(q, k, v, block_mask=block_mask)


def sliding_block_mask(keep, window_half):
    """FlexAttention BlockMask of the sliding window and the real keys `keep` (B, L) bool."""
    from torch.nn.attention.flex_attention import create_block_mask
    batch, length = keep.shape

    def mask_mod(b, h, q_idx, kv_idx):
        return ((q_idx - kv_idx).abs() <= window_half) & keep[b, kv_idx]
    return create_block_mask(mask_mod, batch, None, length, length, device=keep.device)


@dataclasses.dataclass
class AttentionInputs:
    """What every layer of one forward shares: RoPE tables and a mask per layer type. A mask is an
    additive (B, 1, 1|L, L) tensor, or (sliding layers on CUDA) a FlexAttention BlockMask."""
    rope: dict
    masks: dict


# ---------------------------------------------------------------------------------------------
# The modules


def _layer_norm(config):
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.norm = _layer_norm(config)
        self.drop = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids, unpadding=None):
        """(B, L) ids -> (B, L, H); with `unpadding`, the kept tokens only: (T, H)."""
        ids = unpadding.pack(input_ids) if unpadding is not None else input_ids
        return self.drop(self.norm(self.tok_embeddings(ids)))


class ModernAttention(nn.Module):
    def __init__(self, config, layer_type):
        super().__init__()
        self.heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.layer_type = layer_type
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.dropout_p = config.attention_dropout
        self.out_drop = nn.Dropout(config.attention_dropout)

    def forward(self, hidden_states, inputs, unpadding=None):
        """(B, L, H) -> (B, L, H); with `unpadding`, packed (T, H) -> (T, H)."""
        qkv = self.Wqkv(hidden_states)
        if unpadding is not None:
            qkv = unpadding.pad(qkv)  # (B, length, 3H)
        B, L, H = qkv.size(0), qkv.size(1), qkv.size(2) // 3
        # (B, L, 3, heads, d) -> three (B, heads, L, d) views: transformers' Wqkv row order
        q, k, v = (t.transpose(1, 2) for t in qkv.view(B, L, 3, self.heads, self.head_dim).unbind(2))
        cos, sin = inputs.rope[self.layer_type]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        mask = inputs.masks[self.layer_type]
        if torch.is_tensor(mask):
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                     dropout_p=self.dropout_p if self.training else 0.0)
        else:  # a BlockMask: FlexAttention (CUDA, no attention dropout)
            context = flex_attention(q, k, v, mask)
        context = context.transpose(1, 2).reshape(B, L, H)  # (B, heads, L, d) -> (B, L, H)
        if unpadding is not None:
            context = unpadding.unpad(context)
        return self.out_drop(self.Wo(context))


class ModernMLP(nn.Module):
    """GeGLU (or another gated unit, `hidden_activation`): Wo(act(a) * g), (a, g) = Wi(x) halves."""

    def __init__(self, config):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = _ACTIVATIONS[config.hidden_activation]
        self.drop = nn.Dropout(config.mlp_dropout)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, hidden_states):
        value, gate = self.Wi(hidden_states).chunk(2, dim=-1)
        return self.Wo(self.drop(self.act(value) * gate))


class ModernLayer(nn.Module):
    """x + Attn(attn_norm(x)), then h + MLP(mlp_norm(h)); branches scaled by 1/keep_prob (PLD)."""

    def __init__(self, config, index):
        super().__init__()
        self.attention_type = config.layer_types[index]
        self.attn_norm = nn.Identity() if index == 0 else _layer_norm(config)  # layer 0: the embedding norm
        self.attn = ModernAttention(config, self.attention_type)
        self.mlp_norm = _layer_norm(config)
        self.mlp = ModernMLP(config)

    def forward(self, hidden_states, inputs, keep_prob: float = 1.0, unpadding=None):
        scale = 1.0 / keep_prob
        hidden_states = torch.add(hidden_states, self.attn(self.attn_norm(hidden_states), inputs, unpadding),
                                  alpha=scale)
        return torch.add(hidden_states, self.mlp(self.mlp_norm(hidden_states)), alpha=scale)


class ModernEncoder(nn.Module):
    """Embeddings, layers, final norm (transformers' ModernBertModel): `model.bert` of
    ModernForPreTraining, and what fine-tuning builds on."""

    def __init__(self, config, checkpoint_activations=False, flex_attention=None):
        super().__init__()
        self.config = config
        self.embeddings = ModernEmbeddings(config)
        self.layers = nn.ModuleList([ModernLayer(config, i) for i in range(config.num_hidden_layers)])
        self.final_norm = _layer_norm(config)
        self.checkpoint_activations = checkpoint_activations
        # None: FlexAttention for the sliding-window layers where it trains (CUDA, no attention
        # dropout); True/False force it on/off (True on CPU: inference only)
        self.flex_attention = flex_attention
        self.last_layers_run = 0  # layers computed by the last forward (PLD skips some)

    def keep_probabilities(self, theta):
        """PLD keep probability of each layer: p_i = 1 - i * (1 - theta) / L, i from 0."""
        num_layers = len(self.layers)
        return [1.0 - i * (1.0 - theta) / num_layers for i in range(num_layers)]

    def _uses_flex(self, device):
        if self.flex_attention is not None:
            return self.flex_attention
        return device.type == "cuda" and not (self.training and self.config.attention_dropout) and flex_available()

    def attention_inputs(self, input_mask, dtype, unpadding=None):
        """RoPE tables and masks for this batch, in the (B, length) layout attention works in."""
        config = self.config
        if unpadding is not None:
            length, padding = unpadding.length, unpadding.mask
            keep = input_mask[:, :length] != 0
        else:
            length, padding = input_mask.size(1), _extended_attention_mask(input_mask, dtype)
            keep = input_mask != 0
        device = input_mask.device
        types = set(config.layer_types)
        rope = {t: rope_cos_sin(config.rope_theta(t), config.head_dim, length, device) for t in types}
        masks = {FULL: padding}
        if SLIDING in types:
            if self._uses_flex(device):
                masks[SLIDING] = sliding_block_mask(keep, config.window_half)
            else:
                outside = torch.zeros(length, length, dtype=dtype, device=device).masked_fill_(
                    ~band(length, config.window_half, device), MASKED)
                masks[SLIDING] = padding + outside  # (B, 1, L, L)
        return AttentionInputs(rope, masks)

    def forward(self, input_ids, input_mask, pld_theta=None, unpadding=None):
        """-> sequence_output (B, L, H) after the final norm; packed (T, H) with `unpadding`."""
        if input_ids.size(1) > self.config.max_position_embeddings:
            raise InputValueError(f"sequence length {input_ids.size(1)} exceeds max_position_embeddings "
                                  f"{self.config.max_position_embeddings}")
        hidden_states = self.embeddings(input_ids, unpadding)
        inputs = self.attention_inputs(input_mask, hidden_states.dtype, unpadding)
        drop_layers = self.training and pld_theta is not None
        keep_probs = self.keep_probabilities(pld_theta) if drop_layers else [1.0] * len(self.layers)
        layers_run = 0
        for layer, keep_prob in zip(self.layers, keep_probs):
            # as BertEncoder: only layers that can be dropped draw from the (CPU) generator
            if keep_prob < 1.0 and torch.rand(()).item() >= keep_prob:
                continue
            layers_run += 1
            if self.checkpoint_activations and self.training:
                hidden_states = checkpoint(layer, hidden_states, inputs, keep_prob, unpadding, use_reentrant=False)
            else:
                hidden_states = layer(hidden_states, inputs, keep_prob, unpadding)
        self.last_layers_run = layers_run
        return self.final_norm(hidden_states)


class ModernPredictionHead(nn.Module):
    """dense + act + LayerNorm (transformers' ModernBertPredictionHead): the MLM head's transform,
    and the fine-tuning head on the pooled output."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = _ACTIVATIONS[config.classifier_activation]
        self.norm = _layer_norm(config)

    def forward(self, hidden_states):
        return self.norm(self.act(self.dense(hidden_states)))


class ModernMLMHead(nn.Module):
    def __init__(self, config, token_embedding_weight):
        super().__init__()
        self.head = ModernPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.decoder.weight = token_embedding_weight  # tied: one tensor, two names

    def forward(self, hidden_states):
        """(..., H) -> (..., V) vocab scores."""
        return self.decoder(self.head(hidden_states))


def trunc_normal_(weight, std, cutoff):
    nn.init.trunc_normal_(weight, 0.0, std, a=-cutoff * std, b=cutoff * std)


class ModernForPreTraining(nn.Module):
    """The ModernBERT-style encoder with its MLM head; `forward(batch)` returns the pretraining
    loss (the MLM term alone: `pretraining_loss` without NSP scores).

    `batch`: (batch_type, input_ids, input_mask, segment_ids, next_sentence_labels,
    masked_lm_labels), as for BertForPreTrainingPreLN; segment ids and next-sentence labels are
    not read. With labels None, returns (prediction_scores (B, L, V), None): there are no NSP
    scores. Keyword arguments: `progressive_layer_drop` and `pld_theta`, as the engine passes
    them; any other keyword is ignored. `options`: ModelOptions or a command line (where it does not
    say, next-sentence prediction is off: there is no NSP head; `refused_options` says what else is refused).
    """

    architecture = ARCHITECTURE
    refused_options = {
        "deepspeed_transformer_kernel": "DeepSpeed's fused layer computes the original BERT block",
        "deepspeed_sparse_attention": "its layouts are for the original block; the modern block has its own "
                                      "sliding-window attention (local_attention)",
    }
    nsp_head = False

    def __init__(self, config, options=None):
        super().__init__()
        options = block_options(options, type(self))
        self.config = config
        self.bert = ModernEncoder(config, bool(options.checkpoint_activations))
        self.cls = ModernMLMHead(config, self.bert.embeddings.tok_embeddings.weight)
        self.mlm_loss = MaskedLMLoss()
        self.unpad = bool(options.unpad)
        self._init_weights()

    def _init_weights(self):
        config = self.config
        std, cutoff = config.initializer_range, config.initializer_cutoff_factor
        out_std = std / math.sqrt(2.0 * config.num_hidden_layers)
        trunc_normal_(self.bert.embeddings.tok_embeddings.weight, std, cutoff)
        for layer in self.bert.layers:
            for linear, linear_std in ((layer.attn.Wqkv, std), (layer.attn.Wo, out_std), (layer.mlp.Wi, std),
                                       (layer.mlp.Wo, out_std)):
                trunc_normal_(linear.weight, linear_std, cutoff)
        trunc_normal_(self.cls.head.dense.weight, out_std, cutoff)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, batch, **kwargs):
        batch = as_batch(batch)
        input_ids, input_mask = batch.input_ids, batch.input_mask
        next_sentence_labels, masked_lm_labels = batch.next_sentence_labels, batch.masked_lm_labels
        pld_theta = layer_drop_theta(kwargs)
        if masked_lm_labels is None:
            return self.cls(self.bert(input_ids, input_mask, pld_theta)), None

        unpadding = None
        if self.unpad:
            unpadding = Unpadding(input_mask, masked_lm_labels, self.bert.embeddings.tok_embeddings.weight.dtype)
            if unpadding.indices.numel() == input_mask.numel():
                unpadding = None  # no padding in this batch
        sequence_output = self.bert(input_ids, input_mask, pld_theta, unpadding)
        # The masked rows first: the head and the vocab projection see only them.
        flat_labels = masked_lm_labels.reshape(-1)
        masked_positions = torch.nonzero(flat_labels != -1).squeeze(1)  # (N,)
        rows = masked_positions if unpadding is None else unpadding.packed_index(masked_positions)
        masked_output = sequence_output.reshape(-1, sequence_output.size(-1)).index_select(0, rows)
        masked_lm_loss = self.mlm_loss(self.cls.head(masked_output), self.cls.decoder.weight, self.cls.decoder.bias,
                                       flat_labels.index_select(0, masked_positions))
        return pretraining_loss(masked_lm_loss, None, next_sentence_labels)

    def predict(self, input_ids, segment_ids, input_mask):
        """Scores for every position: (prediction_scores (B, L, V), None)."""
        return self.cls(self.bert(input_ids, input_mask)), None

    def encode(self, input_ids, segment_ids, input_mask):
        """The final hidden states (B, L, H) (segment ids are read by nothing), for `mlm_scores`."""
        return self.bert(input_ids, input_mask)

    def mlm_scores(self, hidden_states):
        """(..., H) final hidden states -> (..., V) MLM scores."""
        return self.cls(hidden_states)


"""The "modernbert" architecture (turing/arch/modernbert/model.py) <-> Hugging Face's ModernBERT
(`ModernBertForMaskedLM`): `modern_to_hf` and `hf_to_modern`.

Our parameter names are transformers' under other roots (model.py): `bert.` is its
`model.`, `cls.head.` its `head.`, `cls.decoder.` its `decoder.` (weight tied to the token
embedding, bias). So the mapping renames the roots and, as for BERT, drops the vocab padding rows
(re-created on import as zero rows with an MLM bias of PADDED_ROW_BIAS). Nothing is dropped
otherwise: the model has no pooler and no NSP head. Positions are RoPE, computed from 0 at the
first token in both models, so there is no table to shift. The config writes transformers'
`layer_types` and `rope_parameters`.
"""
from turing.arch.hf_common import (FLOAT32, VOCAB_ROWS, check_encoder_config, check_keys, check_tied, config_dict,
                                   fresh_bias, head_absent, readme_head, renamed, under_prefix, vocab_rows_of,
                                   with_vocab_padding, word_embedding_of)
from turing.arch.modernbert.model import FULL, SLIDING, ModernConfig
from turing.arch.spec import HFAdapter
from turing.errors import ConversionError
from turing.modeling import BertConfigError
from turing.tokenization import vocab_size_padded

MODERN_MODEL_TYPE = "modernbert"
MODERN_HF_ARCHITECTURE = "ModernBertForMaskedLM"
MODERN_HF_CLASSES = (MODERN_HF_ARCHITECTURE, "ModernBertModel")   # ModernBertModel: the bare encoder
_MODERN_ROOTS = (("bert.", "model."), ("cls.head.", "head."), ("cls.decoder.", "decoder."))
_MODERN_WORD, _MODERN_DECODER, _MODERN_BIAS = ("bert.embeddings.tok_embeddings.weight", "cls.decoder.weight",
                                               "cls.decoder.bias")
# config keys copied as they are, both ways (transformers' names are ours)
_MODERN_SAME_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "hidden_activation", "max_position_embeddings", "initializer_range", "initializer_cutoff_factor",
                     "norm_eps", "norm_bias", "attention_bias", "attention_dropout", "local_attention",
                     "embedding_dropout", "mlp_bias", "mlp_dropout", "classifier_pooling", "classifier_dropout",
                     "classifier_bias", "classifier_activation")


def _to_hf_key(key):
    return renamed(key, _MODERN_ROOTS)


_HEAD_KEYS = tuple(f"cls.head.{n}.{p}" for n in ("dense", "norm") for p in ("weight", "bias"))


def _modern_keys(config, head=True):
    """Our keys of the modernbert model of `config`, except the three with vocab rows (and, `head`
    false, the MLM head's)."""
    def names(prefix, bias):
        return [prefix + "weight"] + ([prefix + "bias"] if bias else [])
    keys = names("bert.embeddings.norm.", config.norm_bias) + names("bert.final_norm.", config.norm_bias)
    for i in range(config.num_hidden_layers):
        layer = f"bert.layers.{i}."
        if i > 0:
            keys += names(layer + "attn_norm.", config.norm_bias)
        keys += names(layer + "attn.Wqkv.", config.attention_bias) + names(layer + "attn.Wo.", config.attention_bias)
        keys += names(layer + "mlp_norm.", config.norm_bias)
        keys += names(layer + "mlp.Wi.", config.mlp_bias) + names(layer + "mlp.Wo.", config.mlp_bias)
    if not head:
        return keys
    return keys + names("cls.head.dense.", config.classifier_bias) + names("cls.head.norm.", config.norm_bias)


def modern_to_hf(state_dict, config, vocab_size_real, pad_token_id=0, cls_token_id=None, sep_token_id=None):
    """Map our ModernForPreTraining weights onto ModernBertForMaskedLM.

    config: our ModernConfig (vocab_size = padded embedding rows); vocab_size_real: the vocab
    file's size (rows from there on are padding and are dropped); the token ids go to the config
    ([CLS] is ModernBERT's bos/cls, [SEP] its eos/sep). Returns (hf_state_dict, hf_config_dict);
    tensors keep their dtype."""
    keys = _modern_keys(config)
    check_keys(state_dict, keys + [_MODERN_WORD, _MODERN_BIAS], [_MODERN_DECODER], "our state dict")
    hf = {_to_hf_key(k): state_dict[k].clone() for k in keys}
    hf[_to_hf_key(_MODERN_WORD)], hf["decoder.bias"] = vocab_rows_of(
        state_dict, (_MODERN_WORD, _MODERN_DECODER, _MODERN_BIAS), config, vocab_size_real, pad_token_id)
    hf["decoder.weight"] = hf[_to_hf_key(_MODERN_WORD)]  # tied, as in the HF model
    rope = {kind: {"rope_type": "default", "rope_theta": float(config.rope_theta(kind))} for kind in (FULL, SLIDING)}
    hf_config = {"architectures": [MODERN_HF_ARCHITECTURE], "model_type": MODERN_MODEL_TYPE,
                 "vocab_size": int(vocab_size_real), **{k: getattr(config, k) for k in _MODERN_SAME_KEYS},
                 "layer_types": list(config.layer_types), "rope_parameters": rope,
                 "pad_token_id": int(pad_token_id), "decoder_bias": True, "tie_word_embeddings": True}
    for key, value in (("bos_token_id", cls_token_id), ("cls_token_id", cls_token_id),
                       ("eos_token_id", sep_token_id), ("sep_token_id", sep_token_id)):
        if value is not None:
            hf_config[key] = int(value)
    return hf, hf_config


def _modern_config_from_hf(cfg):
    """Our ModernConfig (vocab_size: the padded rows) of a ModernBertConfig dict; the theta of each
    layer type from rope_parameters (default rope only), else global_/local_rope_theta."""
    if cfg.get("model_type") != MODERN_MODEL_TYPE:
        raise ConversionError(f"Hugging Face config: model_type {cfg.get('model_type')!r}, expected "
                              f"{MODERN_MODEL_TYPE!r} (a folder written by tools/export_hf.py)")
    # (a position_embedding_type some ModernBERT configs carry is read by nothing: the model has RoPE)
    check_encoder_config({k: v for k, v in cfg.items() if k != "position_embedding_type"}, MODERN_HF_CLASSES)
    values = {k: cfg[k] for k in _MODERN_SAME_KEYS if k in cfg}
    if cfg.get("layer_types") is not None:
        values["layer_types"] = list(cfg["layer_types"])
    elif "global_attn_every_n_layers" in cfg:
        values["global_attn_every_n_layers"] = cfg["global_attn_every_n_layers"]
    rope = cfg.get("rope_parameters") or {}
    for kind, key in ((FULL, "global_rope_theta"), (SLIDING, "local_rope_theta")):
        params = rope.get(kind) or {}
        if params.get("rope_type", "default") != "default":
            raise ConversionError(f"Hugging Face config: rope_parameters.{kind}.rope_type "
                                  f"{params['rope_type']!r}; only 'default' rotary embeddings map onto our model")
        theta = params.get("rope_theta", cfg.get(key))
        if theta is not None:
            values[key] = theta
    if not cfg.get("decoder_bias", True):
        raise ConversionError("Hugging Face config: decoder_bias false; our MLM decoder has a bias")
    if not isinstance(cfg.get("vocab_size"), int):
        raise ConversionError(f"Hugging Face config: vocab_size must be an int, got {cfg.get('vocab_size')!r}")
    try:
        return ModernConfig(vocab_size_padded(cfg["vocab_size"]), **values)
    except BertConfigError as e:
        raise ConversionError(f"Hugging Face config: {e}") from None


def hf_to_modern(hf_state_dict, hf_config):
    """Map ModernBertForMaskedLM weights (as exported by `modern_to_hf`, or a stock one), or a bare
    ModernBertModel's (keys with or without the `model.` prefix), back to ours.

    hf_config: the config.json dict, its path (or folder), or a PretrainedConfig. Returns
    (state_dict, ModernConfig): the vocab padded to a multiple of 8 with zero embedding rows and
    MLM bias PADDED_ROW_BIAS; a bare encoder's MLM bias zero and its head absent (fresh:
    `head_absent`); tensors keep their dtype."""
    cfg = config_dict(hf_config)
    config = _modern_config_from_hf(cfg)
    sd = under_prefix(hf_state_dict, "model.", ("embeddings", "layers", "final_norm"))
    headless = head_absent(sd, ("head.", "decoder."))
    keys = _modern_keys(config, head=not headless)
    word_key = _to_hf_key(_MODERN_WORD)
    check_keys(sd, [_to_hf_key(k) for k in keys] + [word_key] + ([] if headless else ["decoder.bias"]),
               ["decoder.weight"], "Hugging Face state dict")
    vocab_real = cfg["vocab_size"]
    word = word_embedding_of(sd, word_key, vocab_real)
    check_tied(sd, [("decoder.weight", word, word_key)])
    ours = {k: sd[_to_hf_key(k)].clone() for k in keys}
    ours[_MODERN_WORD], ours[_MODERN_BIAS] = with_vocab_padding(word, fresh_bias(word) if headless
                                                                else sd["decoder.bias"])
    ours[_MODERN_DECODER] = ours[_MODERN_WORD]  # tied
    return ours, config


# ---------------------------------------------------------------------------------------------
# The export's README


README = readme_head("ModernBERT-style encoder") + """Architecture: ModernBERT (`transformers`' own ModernBertForMaskedLM, no remote code): the same
blocks as our modernbert model (rotary embeddings, GeGLU, {layers} layers of which {full} use full
attention and {sliding} a sliding window of +-{window} tokens), final norm and tied MLM head; the
MLM scores at every real (non-pad) position equal ours (checked when exported on sequences
longer than the window: max difference {diff}).

What differs from the training checkpoint:
- Names only: our `bert.` is `model.`, `cls.head.` is `head.`, `cls.decoder.` is `decoder.`.
""" + VOCAB_ROWS + FLOAT32 + """- Tokenizer: BERT WordPiece (not ModernBERT's BPE), do_lower_case={lower}, [CLS] A [SEP] B [SEP];
  no token type ids (ModernBERT has no token type embeddings). `transformers`' BertTokenizer uses
  the Rust normaliser's Unicode tables; on rare characters it can split differently from
  `turing.tokenization`, which follows Google's tokenizer under this Python's `unicodedata`.
"""


def readme(config, fields):
    full = config.layer_types.count(FULL)
    return README.format(layers=config.num_hidden_layers, full=full, sliding=config.num_hidden_layers - full,
                         window=config.window_half, **fields)


def _export(state_dict, config, vocab_size_real, ids):
    return modern_to_hf(state_dict, config, vocab_size_real, pad_token_id=ids["pad"], cls_token_id=ids["cls"],
                        sep_token_id=ids["sep"])


def _verify_length(config):
    """Longer than the sliding window, so that an export's check compares the local layers' band too."""
    return max(32, config.local_attention + 16)


ADAPTER = HFAdapter(model_types=(MODERN_MODEL_TYPE,), classes=MODERN_HF_CLASSES, config_from_hf=_modern_config_from_hf,
                    from_hf=hf_to_modern, to_hf=_export, readme=readme, fresh_keys=_HEAD_KEYS, token_types=False,
                    verify_length=_verify_length)

"""Weights between our models and Hugging Face's: our pre-LN BERT and RoBERTa-PreLayerNorm, our
bert_postln architecture and BERT (BertForMaskedLM, BertForPreTraining), our modernbert
architecture and ModernBERT; and reading a Hugging Face folder, an export of ours or a stock one
(`save_pretrained`'s layout, safetensors only: a pickle is never read).

Owns the key and tensor mapping (no CLI; `tools/export_hf.py` and `--use_pretrain` call it):
- `ours_to_hf(state_dict, config, vocab_size_real)` -> (state dict of
  `RobertaPreLayerNormForMaskedLM`, its `config.json` dict);
- `hf_to_ours(hf_state_dict, hf_config)` -> (our state dict, `BertConfig`), the reverse;
- `postln_to_hf` / `hf_to_postln`: the same between `turing.postln.BertForPreTrainingPostLN` and
  `BertForMaskedLM` (import also from `BertForPreTraining`, with its pooler and NSP head);
- `modern_to_hf` / `hf_to_modern`: the same between `turing.modern.ModernForPreTraining` and
  `ModernBertForMaskedLM` (below);
- `load_hf_folder(folder)` doing the reverse for a folder of any of the three, as its config.json's
  model_type says (`is_hf_folder` recognises a folder with one; `hf_folder_config` reads only its
  config and the names in its weights files);
(the transformer kernel's layer layout is `turing.kernel_layout`'s, reading checkpoint folders
`turing.checkpoint`'s).

Why RoBERTa-PreLayerNorm: it is the `transformers` architecture with exactly our block,
`x + Attn(LN(x))` then `h + FFN(LN(h))`, a final LayerNorm after the last layer, learned
absolute positions, token types, LayerNorm eps 1e-12, exact (erf) GELU, and a tied MLM head
(dense, GELU, LayerNorm, decoder + bias). So the export runs with `transformers`' own classes
and no remote code. The differences, and how the mapping handles them:
- Positions. RoBERTa computes position ids from the input ids: cumsum(input_ids != pad) * mask
  + pad_id, so a real token at index j has position pad_id + 1 + j when padding sits at the end
  (always so for BERT inputs). The exported table holds our rows from row pad_id + 1 on (rows
  0..pad_id are zero, never read at real tokens), so it has pad_id + 1 more rows. Positions of pad
  tokens, and of any token after a pad, differ from ours; those outputs are not compared.
- Attention mask: ours adds -10000 at pads, `transformers` the dtype's minimum. Both give a
  softmax weight of exactly 0 in fp32, so outputs at real positions agree to rounding.
- Vocab: our embedding has the vocab file's size rounded up to a multiple of 8; the padded
  rows are never a label or an input, so they are dropped (HF vocab_size = the file's size).
  On import they come back as zero embedding rows with an MLM bias of -10000, so they take no
  probability mass and our MLM loss equals the exported model's.
- Dropped: the pooler and the NSP head (`cls.seq_relationship`); `...ForMaskedLM` has neither.
  On import they are absent from the returned state dict (`HF_MISSING_KEYS`): the model keeps
  its fresh initialisation for them and the caller reports them as missing.
"""
import json
import logging
import os
import re

import torch

from turing.checkpoint import check_finite
from turing.errors import CheckpointNotFoundError, ConversionError
from turing.jsonfile import read_json
from turing.modeling import _ACTIVATIONS, LAYER_NORM_EPS, BertConfig, BertConfigError
from turing.modern import FULL, SLIDING, ModernConfig
from turing.postln import PostLNConfig
from turing.tokenization import vocab_size_padded

logger = logging.getLogger(__name__)

HF_MODEL_TYPE = "roberta-prelayernorm"
HF_ARCHITECTURE = "RobertaPreLayerNormForMaskedLM"
HF_BASE = "roberta_prelayernorm."
# Our keys with no counterpart in RobertaPreLayerNormForMaskedLM.
HF_MISSING_KEYS = ("bert.pooler.dense_act.weight", "bert.pooler.dense_act.bias",
                   "cls.seq_relationship.weight", "cls.seq_relationship.bias")
PADDED_ROW_BIAS = -10000.0  # MLM bias of re-created vocab padding rows: no probability mass

# ---------------------------------------------------------------------------------------------
# Key mapping


def _key_pairs(num_layers):
    """[(our key, HF key)] for every tensor copied unchanged (no row surgery)."""
    pairs = [("bert.embeddings.token_type_embeddings.weight", HF_BASE + "embeddings.token_type_embeddings.weight")]
    for p in ("weight", "bias"):
        pairs += [
            (f"bert.embeddings.LayerNorm.{p}", f"{HF_BASE}embeddings.LayerNorm.{p}"),
            (f"bert.encoder.FinalLayerNorm.{p}", f"{HF_BASE}LayerNorm.{p}"),
            (f"cls.predictions.transform.dense_act.{p}", f"lm_head.dense.{p}"),
            (f"cls.predictions.transform.LayerNorm.{p}", f"lm_head.layer_norm.{p}"),
        ]
    for i in range(num_layers):
        ours, hf = f"bert.encoder.layer.{i}.", f"{HF_BASE}encoder.layer.{i}."
        for p in ("weight", "bias"):
            pairs += [(f"{ours}attention.self.{n}.{p}", f"{hf}attention.self.{n}.{p}")
                      for n in ("query", "key", "value")]
            pairs += [
                (f"{ours}attention.output.dense.{p}", f"{hf}attention.output.dense.{p}"),
                (f"{ours}PreAttentionLayerNorm.{p}", f"{hf}attention.LayerNorm.{p}"),
                (f"{ours}PostAttentionLayerNorm.{p}", f"{hf}intermediate.LayerNorm.{p}"),
                (f"{ours}intermediate.dense_act.{p}", f"{hf}intermediate.dense.{p}"),
                (f"{ours}output.dense.{p}", f"{hf}output.dense.{p}"),
            ]
    return pairs


_WORD, _POS = "bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight"
_DECODER, _BIAS = "cls.predictions.decoder.weight", "cls.predictions.bias"
_HF_WORD, _HF_POS = HF_BASE + "embeddings.word_embeddings.weight", HF_BASE + "embeddings.position_embeddings.weight"


def _num_layers(keys, pattern):
    found = {int(m.group(1)) for k in keys if (m := re.match(pattern, k))}
    return max(found) + 1 if found else 0


def _short(keys, n=6):
    keys = sorted(keys)
    return ", ".join(keys[:n]) + (f" ... ({len(keys)} in all)" if len(keys) > n else "")


def _check_keys(have, expected, optional, what):
    missing = set(expected) - set(have)
    unexpected = set(have) - set(expected) - set(optional)
    if missing or unexpected:
        raise ConversionError(f"{what}: keys do not match (missing: {_short(missing) or 'none'}; "
                              f"unexpected: {_short(unexpected) or 'none'})")


def check_encoder_config(cfg, classes):
    """Refuse a Hugging Face config our blocks do not compute, naming what differs: a class other
    than `classes` (the masked-LM ones we import), a decoder or cross-attention, positions other
    than learned absolute ones."""
    listed = cfg.get("architectures") or []
    if listed and not set(listed) & set(classes):
        raise ConversionError(f"Hugging Face config: architectures {listed}; the {cfg.get('model_type')} classes "
                              f"imported are {', '.join(classes)} (a model with its masked-LM head)")
    for key in ("is_decoder", "add_cross_attention"):
        if cfg.get(key):
            raise ConversionError(f"Hugging Face config: {key} is true; our models are bidirectional encoders "
                                  "without cross-attention")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError("Hugging Face config: position_embedding_type must be 'absolute', "
                              f"got {cfg['position_embedding_type']!r}")


def _with_vocab_padding(word, bias):
    """(word embedding, MLM bias) of `vocab_real` rows -> padded to a multiple of 8: zero embedding
    rows and an MLM bias of PADDED_ROW_BIAS, so the padding takes no probability mass."""
    padded = vocab_size_padded(word.shape[0])
    return (torch.cat([word, word.new_zeros((padded - word.shape[0], word.shape[1]))]),
            torch.cat([bias, bias.new_full((padded - bias.shape[0],), PADDED_ROW_BIAS)]))


def _vocab_rows_of(state_dict, keys, config, vocab_size_real, pad_token_id):
    """The first `vocab_size_real` rows of our word embedding and MLM bias (the rest are padding)
    for an export; `keys`: our (embedding, tied decoder, bias) keys. The embedding's shape is
    checked against `config`, the decoder must be tied, the pad id inside the vocab."""
    word_key, decoder_key, bias_key = keys
    word = state_dict[word_key]
    if tuple(word.shape) != (config.vocab_size, config.hidden_size):
        raise ConversionError(f"{word_key} has shape {tuple(word.shape)}, config expects "
                              f"({config.vocab_size}, {config.hidden_size})")
    if not 0 < vocab_size_real <= word.shape[0]:
        raise ConversionError(f"vocab size {vocab_size_real} does not fit the {word.shape[0]} embedding rows")
    if decoder_key in state_dict and not torch.equal(state_dict[decoder_key], word):
        raise ConversionError(f"{decoder_key} differs from {word_key}: the export needs the tied decoder")
    if not 0 <= pad_token_id < vocab_size_real:
        raise ConversionError(f"pad_token_id {pad_token_id} is outside the vocab (size {vocab_size_real})")
    return word[:vocab_size_real].clone(), state_dict[bias_key][:vocab_size_real].clone()


# ---------------------------------------------------------------------------------------------
# Ours -> Hugging Face


def ours_to_hf(state_dict, config, vocab_size_real, pad_token_id=0, bos_token_id=None, eos_token_id=None):
    """Map our BertForPreTrainingPreLN weights onto RobertaPreLayerNormForMaskedLM.

    state_dict: the original's keys (the pooler and NSP head may be present; they are dropped).
    config: our BertConfig (vocab_size = padded embedding rows).
    vocab_size_real: the vocab file's size; rows from there on are padding and are dropped.
    pad_token_id: id of [PAD], the RoBERTa padding index that shifts the position table.
    bos/eos_token_id: written to the config ([CLS]/[SEP] ids), for tools that read them.
    Returns (hf_state_dict, hf_config_dict); tensors keep their dtype.
    """
    if config.hidden_act != "gelu":
        raise ConversionError(f"hidden_act {config.hidden_act!r} cannot be exported: the "
                              "RoBERTa-PreLayerNorm MLM head always applies GELU, ours applies hidden_act")
    num_layers = config.num_hidden_layers
    pairs = _key_pairs(num_layers)
    expected = [o for o, _ in pairs] + [_WORD, _POS, _BIAS]
    _check_keys(state_dict, expected, list(HF_MISSING_KEYS) + [_DECODER], "our state dict")
    found_layers = _num_layers(state_dict, r"bert\.encoder\.layer\.(\d+)\.")
    if found_layers != num_layers:
        raise ConversionError(f"state dict has {found_layers} layers, config num_hidden_layers is {num_layers}")

    word = state_dict[_WORD]
    if word.shape[0] != config.vocab_size or word.shape[1] != config.hidden_size:
        raise ConversionError(f"{_WORD} has shape {tuple(word.shape)}, config expects "
                              f"({config.vocab_size}, {config.hidden_size})")
    if not 0 < vocab_size_real <= word.shape[0]:
        raise ConversionError(f"vocab size {vocab_size_real} does not fit the {word.shape[0]} embedding rows")
    if vocab_size_padded(vocab_size_real) != word.shape[0]:
        logger.warning("vocab size %d pads to %d, but the embedding has %d rows; exporting the first %d",
                       vocab_size_real, vocab_size_padded(vocab_size_real), word.shape[0], vocab_size_real)
    if _DECODER in state_dict and not torch.equal(state_dict[_DECODER], word):
        raise ConversionError(f"{_DECODER} differs from {_WORD}: the export needs the tied MLM decoder")
    if not 0 <= pad_token_id < vocab_size_real:
        raise ConversionError(f"pad_token_id {pad_token_id} is outside the vocab (size {vocab_size_real})")

    hf = {h: state_dict[o].clone() for o, h in pairs}
    hf[_HF_WORD] = word[:vocab_size_real].clone()
    hf["lm_head.decoder.weight"] = hf[_HF_WORD]  # tied, as in the HF model
    hf["lm_head.bias"] = state_dict[_BIAS][:vocab_size_real].clone()
    hf["lm_head.decoder.bias"] = hf["lm_head.bias"]
    # Our row j is RoBERTa's position pad_token_id + 1 + j; the rows below are never read at
    # real tokens (they would be the positions of pads), so they are zero.
    pos = state_dict[_POS]
    shift = pad_token_id + 1
    hf_pos = pos.new_zeros((pos.shape[0] + shift, pos.shape[1]))
    hf_pos[shift:] = pos
    hf[_HF_POS] = hf_pos

    hf_config = {
        "architectures": [HF_ARCHITECTURE],
        "model_type": HF_MODEL_TYPE,
        "vocab_size": int(vocab_size_real),
        "hidden_size": config.hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": config.hidden_act,  # "gelu" in transformers is the exact erf form
        "hidden_dropout_prob": config.hidden_dropout_prob,
        "attention_probs_dropout_prob": config.attention_probs_dropout_prob,
        "max_position_embeddings": config.max_position_embeddings + shift,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": LAYER_NORM_EPS,
        "pad_token_id": int(pad_token_id),
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }
    if bos_token_id is not None:
        hf_config["bos_token_id"] = int(bos_token_id)
    if eos_token_id is not None:
        hf_config["eos_token_id"] = int(eos_token_id)
    return hf, hf_config


# ---------------------------------------------------------------------------------------------
# Hugging Face -> ours


def _config_dict(hf_config):
    if isinstance(hf_config, (str, os.PathLike)):
        path = os.fspath(hf_config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        return read_json(path, "Hugging Face config.json", ConversionError, CheckpointNotFoundError)
    if isinstance(hf_config, dict):
        return dict(hf_config)
    if hasattr(hf_config, "to_dict"):  # a transformers PretrainedConfig
        return hf_config.to_dict()
    raise ConversionError(f"hf_config must be a dict, a config.json path or a PretrainedConfig, "
                          f"got {type(hf_config).__name__}")


def _prelayernorm_config_from_hf(cfg):
    """Our BertConfig (vocab_size: the padded rows) of a RobertaPreLayerNormConfig dict; what our
    block does not compute is refused, naming it."""
    model_type = cfg.get("model_type")
    if model_type != HF_MODEL_TYPE:
        raise ConversionError(f"Hugging Face config: model_type {model_type!r}, expected {HF_MODEL_TYPE!r} "
                              "(a folder written by tools/export_hf.py)")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "pad_token_id"):
        if not isinstance(cfg.get(key), int):
            raise ConversionError(f"Hugging Face config: {key} must be an int, got {cfg.get(key)!r}")
    eps = cfg.get("layer_norm_eps", LAYER_NORM_EPS)
    if abs(eps - LAYER_NORM_EPS) > 1e-15:
        raise ConversionError(f"Hugging Face config: layer_norm_eps {eps} differs from our model's {LAYER_NORM_EPS}")
    check_encoder_config(cfg, (HF_ARCHITECTURE,))
    if cfg.get("hidden_act", "gelu") != "gelu":
        raise ConversionError(f"Hugging Face config: hidden_act {cfg['hidden_act']!r}; only 'gelu' maps onto our model")
    pad = cfg["pad_token_id"]
    if cfg["max_position_embeddings"] <= pad + 1:
        raise ConversionError(f"Hugging Face config: max_position_embeddings {cfg['max_position_embeddings']} "
                              f"leaves no positions after the padding index {pad}")
    try:
        return BertConfig(
            vocab_size_padded(cfg["vocab_size"]),
            hidden_size=cfg["hidden_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            intermediate_size=cfg["intermediate_size"],
            hidden_act="gelu",
            hidden_dropout_prob=cfg.get("hidden_dropout_prob", 0.1),
            attention_probs_dropout_prob=cfg.get("attention_probs_dropout_prob", 0.1),
            max_position_embeddings=cfg["max_position_embeddings"] - (pad + 1),
            type_vocab_size=cfg.get("type_vocab_size", 2),
            initializer_range=cfg.get("initializer_range", 0.02),
        )
    except BertConfigError as e:
        raise ConversionError(f"Hugging Face config: {e}") from None


def hf_to_ours(hf_state_dict, hf_config):
    """Map RobertaPreLayerNormForMaskedLM weights (as exported by `ours_to_hf`, or a stock one
    with our block's settings) back to ours.

    hf_config: the config.json dict, its path (or folder), or a PretrainedConfig.
    Returns (state_dict, BertConfig): the original's keys without `HF_MISSING_KEYS` (pooler and NSP
    head, left to the model's initialisation); the vocab padded to a multiple of 8 with zero
    embedding rows and MLM bias PADDED_ROW_BIAS; the position table shifted back. Tensors keep
    their dtype.
    """
    cfg = _config_dict(hf_config)
    config = _prelayernorm_config_from_hf(cfg)
    sd = dict(hf_state_dict)
    if not any(k.startswith(HF_BASE) for k in sd) and any(k.startswith("embeddings.") for k in sd):
        sd = {HF_BASE + k: v for k, v in sd.items()}  # saved from the bare RobertaPreLayerNormModel
    pairs = _key_pairs(config.num_hidden_layers)
    expected = [h for _, h in pairs] + [_HF_WORD, _HF_POS, "lm_head.bias"]
    optional = ["lm_head.decoder.weight", "lm_head.decoder.bias", HF_BASE + "pooler.dense.weight",
                HF_BASE + "pooler.dense.bias", HF_BASE + "embeddings.position_ids"]
    _check_keys(sd, expected, optional, "Hugging Face state dict")

    vocab_real = cfg["vocab_size"]
    word = sd[_HF_WORD]
    if word.shape[0] != vocab_real:
        raise ConversionError(f"{_HF_WORD} has {word.shape[0]} rows, config vocab_size is {vocab_real}")
    if "lm_head.decoder.weight" in sd and not torch.equal(sd["lm_head.decoder.weight"], word):
        raise ConversionError("lm_head.decoder.weight differs from the word embeddings: our MLM decoder is tied")
    ours = {o: sd[h].clone() for o, h in pairs}
    ours[_WORD], ours[_BIAS] = _with_vocab_padding(word, sd["lm_head.bias"])
    ours[_DECODER] = ours[_WORD]  # tied
    ours[_POS] = sd[_HF_POS][cfg["pad_token_id"] + 1:].clone()
    return ours, config


# ---------------------------------------------------------------------------------------------
# The bert_postln architecture <-> BertForMaskedLM (and BertForPreTraining)
#
# Our parameter names are transformers' (turing/postln.py), so the mapping drops the vocab padding
# rows on export (re-created on import as zero rows with an MLM bias of PADDED_ROW_BIAS) and the
# pooler and NSP head, which BertForMaskedLM lacks; on import a BertForPreTraining's (or
# bert-base-uncased's, whose file holds them) are kept. Also on import: the LayerNorm names of
# early checkpoints (`LayerNorm.gamma`, `.beta`, as bert-base-uncased's model.safetensors still has
# them) become `.weight`, `.bias`, as transformers renames them; the tied decoder copies and the
# position_ids buffer some files hold are dropped (checked equal where they are tensors we keep).

POSTLN_MODEL_TYPE = "bert"
POSTLN_HF_ARCHITECTURE = "BertForMaskedLM"
POSTLN_HF_CLASSES = (POSTLN_HF_ARCHITECTURE, "BertForPreTraining")
POSTLN_MISSING_KEYS = ("bert.pooler.dense.weight", "bert.pooler.dense.bias", "cls.seq_relationship.weight",
                       "cls.seq_relationship.bias")
# Our keys a Hugging Face folder may lack (either BERT block): the pooler and the NSP head, which
# keep the model's fresh initialisation.
OPTIONAL_KEYS = HF_MISSING_KEYS + POSTLN_MISSING_KEYS
_POSTLN_DECODER_BIAS = "cls.predictions.decoder.bias"  # transformers' tied copy of cls.predictions.bias
# config keys copied as they are, both ways (transformers' names are ours)
_POSTLN_SAME_KEYS = PostLNConfig.FIELDS


def _postln_keys(num_layers):
    """Our keys of the bert_postln model, except the word embedding, the MLM bias and the pooler
    and NSP head."""
    def dense_and_norm(prefix):
        return [f"{prefix}{n}.{p}" for n in ("dense", "LayerNorm") for p in ("weight", "bias")]
    keys = ["bert.embeddings.position_embeddings.weight", "bert.embeddings.token_type_embeddings.weight",
            "bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias"]
    for i in range(num_layers):
        layer = f"bert.encoder.layer.{i}."
        keys += [f"{layer}attention.self.{n}.{p}" for n in ("query", "key", "value") for p in ("weight", "bias")]
        keys += dense_and_norm(layer + "attention.output.") + dense_and_norm(layer + "output.")
        keys += [f"{layer}intermediate.dense.weight", f"{layer}intermediate.dense.bias"]
    return keys + dense_and_norm("cls.predictions.transform.")


def _legacy_layer_norm_names(state_dict):
    """`...LayerNorm.gamma/.beta` -> `...LayerNorm.weight/.bias` (early BERT checkpoints' names)."""
    renamed = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
    out = {}
    for key, value in state_dict.items():
        for old, new in renamed.items():
            if key.endswith(old):
                key = key[:-len(old)] + new
        out[key] = value
    return out


def postln_to_hf(state_dict, config, vocab_size_real, pad_token_id=0):
    """Map our BertForPreTrainingPostLN weights onto BertForMaskedLM.

    config: our PostLNConfig (vocab_size = padded embedding rows); vocab_size_real: the vocab
    file's size (rows from there on are padding and are dropped); pad_token_id: [PAD]'s id. The
    pooler and the NSP head are dropped. Returns (hf_state_dict, hf_config_dict); tensors keep
    their dtype."""
    keys = _postln_keys(config.num_hidden_layers)
    _check_keys(state_dict, keys + [_WORD, _BIAS], list(POSTLN_MISSING_KEYS) + [_DECODER], "our state dict")
    hf = {k: state_dict[k].clone() for k in keys}
    hf[_WORD], hf[_BIAS] = _vocab_rows_of(state_dict, (_WORD, _DECODER, _BIAS), config, vocab_size_real,
                                          pad_token_id)
    hf[_DECODER], hf[_POSTLN_DECODER_BIAS] = hf[_WORD], hf[_BIAS]  # tied, as in the HF model
    hf_config = {"architectures": [POSTLN_HF_ARCHITECTURE], "model_type": POSTLN_MODEL_TYPE,
                 "vocab_size": int(vocab_size_real), **{k: getattr(config, k) for k in _POSTLN_SAME_KEYS},
                 "pad_token_id": int(pad_token_id), "is_decoder": False, "add_cross_attention": False,
                 "tie_word_embeddings": True}
    return hf, hf_config


def _postln_config_from_hf(cfg):
    """Our PostLNConfig (vocab_size: the padded rows) of a BertConfig dict; what our block does not
    compute is refused, naming it."""
    if cfg.get("model_type") != POSTLN_MODEL_TYPE:
        raise ConversionError(f"Hugging Face config: model_type {cfg.get('model_type')!r}, expected "
                              f"{POSTLN_MODEL_TYPE!r} (BertForMaskedLM or BertForPreTraining)")
    check_encoder_config(cfg, POSTLN_HF_CLASSES)
    if not isinstance(cfg.get("vocab_size"), int):
        raise ConversionError(f"Hugging Face config: vocab_size must be an int, got {cfg.get('vocab_size')!r}")
    if cfg.get("hidden_act", "gelu") not in _ACTIVATIONS:
        raise ConversionError(f"Hugging Face config: hidden_act {cfg['hidden_act']!r} is not one this block computes "
                              f"({', '.join(sorted(_ACTIVATIONS))}; gelu is the exact erf form, as transformers')")
    try:
        return PostLNConfig(vocab_size_padded(cfg["vocab_size"]), **{k: cfg[k] for k in _POSTLN_SAME_KEYS if k in cfg})
    except BertConfigError as e:
        raise ConversionError(f"Hugging Face config: {e}") from None


def hf_to_postln(hf_state_dict, hf_config):
    """Map BertForMaskedLM or BertForPreTraining weights (a stock folder's, or as exported by
    `postln_to_hf`) to ours.

    hf_config: the config.json dict, its path (or folder), or a PretrainedConfig. Returns
    (state_dict, PostLNConfig): the vocab padded to a multiple of 8 with zero embedding rows and
    MLM bias PADDED_ROW_BIAS; the pooler and NSP head where the weights have them. Tensors keep
    their dtype."""
    cfg = _config_dict(hf_config)
    config = _postln_config_from_hf(cfg)
    sd = _legacy_layer_norm_names(hf_state_dict)
    if not any(k.startswith("cls.predictions.") for k in sd):
        raise ConversionError("Hugging Face state dict: no MLM head (cls.predictions.*): a bare BertModel or a "
                              f"fine-tuned model; {' or '.join(POSTLN_HF_CLASSES)} has one")
    sd.pop("bert.embeddings.position_ids", None)
    keys = _postln_keys(config.num_hidden_layers)
    _check_keys(sd, keys + [_WORD, _BIAS], list(POSTLN_MISSING_KEYS) + [_DECODER, _POSTLN_DECODER_BIAS],
                "Hugging Face state dict")
    vocab_real, word = cfg["vocab_size"], sd[_WORD]
    if word.shape[0] != vocab_real:
        raise ConversionError(f"{_WORD} has {word.shape[0]} rows, config vocab_size is {vocab_real}")
    for copy, tensor in ((_DECODER, word), (_POSTLN_DECODER_BIAS, sd[_BIAS])):
        if copy in sd and not torch.equal(sd[copy], tensor):
            raise ConversionError(f"{copy} differs from its tied tensor: our MLM decoder is tied to the word "
                                  "embedding, with the bias cls.predictions.bias")
    ours = {k: sd[k].clone() for k in keys + [k for k in POSTLN_MISSING_KEYS if k in sd]}
    ours[_WORD], ours[_BIAS] = _with_vocab_padding(word, sd[_BIAS])
    ours[_DECODER] = ours[_WORD]  # tied
    return ours, config


# ---------------------------------------------------------------------------------------------
# The modernbert architecture <-> ModernBertForMaskedLM
#
# Our parameter names are transformers' under other roots (turing/modern.py): `bert.` is its
# `model.`, `cls.head.` its `head.`, `cls.decoder.` its `decoder.` (weight tied to the token
# embedding, bias). So the mapping renames the roots and, as for BERT, drops the vocab padding rows
# (re-created on import as zero rows with an MLM bias of PADDED_ROW_BIAS). Nothing is dropped
# otherwise: the model has no pooler and no NSP head. Positions are RoPE, computed from 0 at the
# first token in both models, so there is no table to shift. The config writes transformers'
# `layer_types` and `rope_parameters`.

MODERN_MODEL_TYPE = "modernbert"
MODERN_HF_ARCHITECTURE = "ModernBertForMaskedLM"
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
    for ours, hf in _MODERN_ROOTS:
        if key.startswith(ours):
            return hf + key[len(ours):]
    raise ConversionError(f"our state dict: key {key} is not under {', '.join(o for o, _ in _MODERN_ROOTS)}")


def _modern_keys(config):
    """Our keys of the modernbert model of `config`, except the three with vocab rows."""
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
    return keys + names("cls.head.dense.", config.classifier_bias) + names("cls.head.norm.", config.norm_bias)


def modern_to_hf(state_dict, config, vocab_size_real, pad_token_id=0, cls_token_id=None, sep_token_id=None):
    """Map our ModernForPreTraining weights onto ModernBertForMaskedLM.

    config: our ModernConfig (vocab_size = padded embedding rows); vocab_size_real: the vocab
    file's size (rows from there on are padding and are dropped); the token ids go to the config
    ([CLS] is ModernBERT's bos/cls, [SEP] its eos/sep). Returns (hf_state_dict, hf_config_dict);
    tensors keep their dtype."""
    keys = _modern_keys(config)
    _check_keys(state_dict, keys + [_MODERN_WORD, _MODERN_BIAS], [_MODERN_DECODER], "our state dict")
    hf = {_to_hf_key(k): state_dict[k].clone() for k in keys}
    hf[_to_hf_key(_MODERN_WORD)], hf["decoder.bias"] = _vocab_rows_of(
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
    check_encoder_config({k: v for k, v in cfg.items() if k != "position_embedding_type"}, (MODERN_HF_ARCHITECTURE,))
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
    """Map ModernBertForMaskedLM weights (as exported by `modern_to_hf`) back to ours.

    hf_config: the config.json dict, its path (or folder), or a PretrainedConfig. Returns
    (state_dict, ModernConfig): the vocab padded to a multiple of 8 with zero embedding rows and
    MLM bias PADDED_ROW_BIAS; tensors keep their dtype."""
    cfg = _config_dict(hf_config)
    config = _modern_config_from_hf(cfg)
    keys = _modern_keys(config)
    sd = dict(hf_state_dict)
    word_key = _to_hf_key(_MODERN_WORD)
    _check_keys(sd, [_to_hf_key(k) for k in keys] + [word_key, "decoder.bias"], ["decoder.weight"],
                "Hugging Face state dict")
    vocab_real, word = cfg["vocab_size"], sd[word_key]
    if word.shape[0] != vocab_real:
        raise ConversionError(f"{word_key} has {word.shape[0]} rows, config vocab_size is {vocab_real}")
    if "decoder.weight" in sd and not torch.equal(sd["decoder.weight"], word):
        raise ConversionError("decoder.weight differs from the token embeddings: our MLM decoder is tied")
    ours = {k: sd[_to_hf_key(k)].clone() for k in keys}
    ours[_MODERN_WORD], ours[_MODERN_BIAS] = _with_vocab_padding(word, sd["decoder.bias"])
    ours[_MODERN_DECODER] = ours[_MODERN_WORD]  # tied
    return ours, config


# ---------------------------------------------------------------------------------------------
# Hugging Face folders: an export of ours, or a stock model saved by save_pretrained

# model_type -> (the config reader, the importer)
_IMPORTERS = {HF_MODEL_TYPE: (_prelayernorm_config_from_hf, hf_to_ours),
              POSTLN_MODEL_TYPE: (_postln_config_from_hf, hf_to_postln),
              MODERN_MODEL_TYPE: (_modern_config_from_hf, hf_to_modern)}
_IMPORTED = (f"{HF_MODEL_TYPE} ({HF_ARCHITECTURE}), {POSTLN_MODEL_TYPE} ({', '.join(POSTLN_HF_CLASSES)}), "
             f"{MODERN_MODEL_TYPE} ({MODERN_HF_ARCHITECTURE})")
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")  # transformers' pickles: never read


def _folder_model_type(path):
    config = os.path.join(os.fspath(path), "config.json")
    if not os.path.isfile(config):
        return None
    try:
        with open(config, encoding="utf-8") as f:
            return json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def is_hf_folder(path):
    """True for a folder with a config.json naming a model_type: an export of ours or a stock
    Hugging Face model (`load_hf_folder` reads the model types of `_IMPORTERS` and names the others)."""
    return isinstance(_folder_model_type(path), str)


def _importer(folder):
    """(config reader, importer) of the folder's model_type; another model_type is one error line."""
    model_type = _folder_model_type(folder)
    if model_type not in _IMPORTERS:
        raise ConversionError(f"{folder}: config.json model_type {model_type!r} is not one this project imports: "
                              f"{_IMPORTED}")
    return _IMPORTERS[model_type]


def _weight_files(folder):
    """The safetensors files of a Hugging Face folder: model.safetensors, or the shards its index names."""
    single = os.path.join(folder, "model.safetensors")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(single):
        return [single]
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                files = [os.path.join(folder, name) for name in sorted(set(json.load(f)["weight_map"].values()))]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConversionError(f"{index}: not a safetensors index (a JSON object with a 'weight_map'; "
                                  f"{type(e).__name__}: {e})") from None
        missing = [path for path in files if not os.path.isfile(path)]
        if missing:
            raise ConversionError(f"{missing[0]}: not found (named by {os.path.basename(index)})")
        return files
    pickled = [name for name in PICKLED_WEIGHTS if os.path.isfile(os.path.join(folder, name))]
    if pickled:
        raise ConversionError(f"{folder}: the weights are in {pickled[0]} only, a pickle, which this project never "
                              f"unpickles; re-save them with safetensors (transformers: AutoModelForMaskedLM."
                              f"from_pretrained(FOLDER).save_pretrained(FOLDER, safe_serialization=True))")
    raise CheckpointNotFoundError(f"{folder}: no model.safetensors (or model.safetensors.index.json); "
                                  "expected a folder written by tools/export_hf.py or save_pretrained")


def _read_safetensors(path, read):
    """read(path) with safetensors (`load_file`, or the header's names); a damaged file is one line."""
    try:  # optional: only for reading Hugging Face folders
        from safetensors import SafetensorError
    except ImportError as e:
        raise ConversionError(f"{path}: reading safetensors needs the 'safetensors' package ({e})") from None
    try:
        return read(path)
    except SafetensorError as e:  # a truncated, empty or damaged file
        raise ConversionError(f"{path}: not a complete safetensors file ({os.path.getsize(path)} bytes: {e}); "
                              "export it again") from None


def _tensors(path):
    from safetensors.torch import load_file
    return load_file(path)


def _tensor_names(path):
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return list(f.keys())


def hf_folder_config(folder):
    """(our config, the config.json dict, the tensor names in its weights files) of a Hugging Face
    folder, read without loading a tensor (the files' headers only): what `turing.pretrained`
    says of one before the weights are read."""
    folder = os.fspath(folder)
    files = _weight_files(folder)
    names = [name for path in files for name in _read_safetensors(path, _tensor_names)]
    reader, _ = _importer(folder)
    cfg = _config_dict(folder)
    try:
        return reader(cfg), cfg, names
    except ConversionError as e:
        raise ConversionError(f"{folder}: {e}") from None


def load_hf_folder(folder):
    """(state_dict, config) of a Hugging Face folder (an export of ours, or a stock
    RobertaPreLayerNormForMaskedLM, BertForMaskedLM, BertForPreTraining or ModernBertForMaskedLM
    saved with safetensors), via `hf_to_ours` (a BertConfig), `hf_to_postln` (a PostLNConfig) or
    `hf_to_modern` (a ModernConfig), as its model_type says."""
    folder = os.fspath(folder)
    files = _weight_files(folder)
    _, importer = _importer(folder)
    hf_state = {}
    for path in files:
        hf_state.update(check_finite(_read_safetensors(path, _tensors), path))
    try:
        return importer(hf_state, folder)
    except ConversionError as e:
        raise ConversionError(f"{folder}: {e}") from None

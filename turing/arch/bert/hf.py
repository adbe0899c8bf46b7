"""The "bert" architecture (the original's pre-LN BERT, turing/modeling.py) <-> Hugging Face's
RoBERTa-PreLayerNorm (`RobertaPreLayerNormForMaskedLM`, or the bare `RobertaPreLayerNormModel`'s
keys): `ours_to_hf(state_dict, config, vocab_size_real)` -> (its state dict, its config.json dict);
`hf_to_ours(hf_state_dict, hf_config)` -> (our state dict, `BertConfig`), the reverse.

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
import logging

from turing.arch.hf_common import (FLOAT32, NO_BERT_HEADS, VOCAB_ROWS, WORDPIECE, check_encoder_config, check_keys,
                                   check_tied, config_dict, fresh_bias, head_absent, layers_in, readme_head,
                                   same_values, under_prefix, with_vocab_padding, word_embedding_of)
from turing.arch.spec import HFAdapter
from turing.errors import ConversionError
from turing.modeling import LAYER_NORM_EPS, BertConfig, BertConfigError
from turing.tokenization import vocab_size_padded

logger = logging.getLogger(__name__)

HF_MODEL_TYPE = "roberta-prelayernorm"
HF_ARCHITECTURE = "RobertaPreLayerNormForMaskedLM"
HF_CLASSES = (HF_ARCHITECTURE, "RobertaPreLayerNormModel")   # RobertaPreLayerNormModel: the bare encoder
HF_BASE = "roberta_prelayernorm."
# Our keys with no counterpart in RobertaPreLayerNormForMaskedLM.
HF_MISSING_KEYS = ("bert.pooler.dense_act.weight", "bert.pooler.dense_act.bias",
                   "cls.seq_relationship.weight", "cls.seq_relationship.bias")


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


_POOLER_PAIRS = [(f"bert.pooler.dense_act.{p}", f"{HF_BASE}pooler.dense.{p}") for p in ("weight", "bias")]
_HEAD_TRANSFORM_KEYS = tuple(f"cls.predictions.transform.{n}.{p}" for n in ("dense_act", "LayerNorm")
                             for p in ("weight", "bias"))
_WORD, _POS = "bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight"
_DECODER, _BIAS = "cls.predictions.decoder.weight", "cls.predictions.bias"
_HF_WORD, _HF_POS = HF_BASE + "embeddings.word_embeddings.weight", HF_BASE + "embeddings.position_embeddings.weight"


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
    check_keys(state_dict, expected, list(HF_MISSING_KEYS) + [_DECODER], "our state dict")
    found_layers = layers_in(state_dict, r"bert\.encoder\.layer\.(\d+)\.")
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
    if _DECODER in state_dict and not same_values(state_dict[_DECODER], word):
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
    check_encoder_config(cfg, HF_CLASSES)
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
    """Map RobertaPreLayerNormForMaskedLM or bare RobertaPreLayerNormModel weights (as exported by
    `ours_to_hf`, or a stock one with our block's settings) back to ours.

    hf_config: the config.json dict, its path (or folder), or a PretrainedConfig.
    Returns (state_dict, BertConfig): the original's keys without the NSP head (left to the model's
    initialisation), the pooler where the weights hold one (the same dense + tanh); the vocab padded
    to a multiple of 8 with zero embedding rows and MLM bias PADDED_ROW_BIAS; the position table
    shifted back; a bare RobertaPreLayerNormModel's (keys with or without the prefix) MLM bias zero
    and its transform absent (fresh: `head_absent`). Tensors keep their dtype.
    """
    cfg = config_dict(hf_config)
    config = _prelayernorm_config_from_hf(cfg)
    # a bare RobertaPreLayerNormModel's keys have no prefix
    sd = under_prefix(hf_state_dict, HF_BASE, ("embeddings", "encoder", "LayerNorm", "pooler"))
    headless = head_absent(sd, ("lm_head.",))
    pairs = [(o, h) for o, h in _key_pairs(config.num_hidden_layers) if not (headless and h.startswith("lm_head."))]
    expected = [h for _, h in pairs] + [_HF_WORD, _HF_POS] + ([] if headless else ["lm_head.bias"])
    optional = ["lm_head.decoder.weight", "lm_head.decoder.bias", HF_BASE + "embeddings.position_ids",
                *(h for _, h in _POOLER_PAIRS)]
    check_keys(sd, expected, optional, "Hugging Face state dict")

    vocab_real = cfg["vocab_size"]
    word = word_embedding_of(sd, _HF_WORD, vocab_real)
    check_tied(sd, [("lm_head.decoder.weight", word, _HF_WORD)])
    ours = {o: sd[h].clone() for o, h in pairs + [p for p in _POOLER_PAIRS if p[1] in sd]}
    ours[_WORD], ours[_BIAS] = with_vocab_padding(word, fresh_bias(word) if headless else sd["lm_head.bias"])
    ours[_DECODER] = ours[_WORD]  # tied
    ours[_POS] = sd[_HF_POS][cfg["pad_token_id"] + 1:].clone()
    return ours, config


# ---------------------------------------------------------------------------------------------
# The export's README


README = readme_head("pre-LN BERT") + """Architecture: RoBERTa-PreLayerNorm, which computes the same pre-LayerNorm blocks, final
LayerNorm and tied MLM head as the Bing BERT model; the MLM scores at every real (non-pad)
position equal ours (checked when exported: max difference {diff}).

What differs from the training checkpoint:
- Position table: RoBERTa numbers positions from `pad_token_id + 1` ({shift}), so the table is
  ours shifted by {shift} rows (zero rows in front) and `max_position_embeddings` is
  {hf_positions} = {positions} + {shift}. Sequences must be padded at the end (as BERT inputs
  are); a token after a pad gets a different position than in our model.
""" + VOCAB_ROWS + NO_BERT_HEADS + FLOAT32 + WORDPIECE + """  `transformers`' BertTokenizer uses the Rust normaliser's Unicode tables; on rare characters
  (e.g. punctuation added in recent Unicode versions) it can split differently from
  `turing.tokenization`, which follows Google's tokenizer under this Python's `unicodedata`.
"""


def readme(config, fields):
    shift = fields["pad_id"] + 1
    return README.format(shift=shift, hf_positions=config.max_position_embeddings + shift,
                         positions=config.max_position_embeddings, **fields)


def _export(state_dict, config, vocab_size_real, ids):
    return ours_to_hf(state_dict, config, vocab_size_real, pad_token_id=ids["pad"], bos_token_id=ids["cls"],
                      eos_token_id=ids["sep"])


ADAPTER = HFAdapter(model_types=(HF_MODEL_TYPE,), classes=HF_CLASSES, config_from_hf=_prelayernorm_config_from_hf,
                    from_hf=hf_to_ours, to_hf=_export, readme=readme, fresh_keys=HF_MISSING_KEYS + _HEAD_TRANSFORM_KEYS)

"""The "bert_postln" architecture (turing/arch/bert_postln/model.py) <-> Hugging Face's BERT
(`BertForMaskedLM`; import also from `BertForPreTraining`, with its pooler and NSP head):
`postln_to_hf` and `hf_to_postln`.

Our parameter names are transformers' (model.py), so the mapping drops the vocab padding
rows on export (re-created on import as zero rows with an MLM bias of PADDED_ROW_BIAS) and the
pooler and NSP head, which BertForMaskedLM lacks; on import a BertForPreTraining's (or
bert-base-uncased's, whose file holds them) are kept. Also on import: the LayerNorm names of
early checkpoints (`LayerNorm.gamma`, `.beta`, as bert-base-uncased's model.safetensors still has
them) become `.weight`, `.bias`, as transformers renames them; the tied decoder copies and the
position_ids buffer some files hold are dropped (checked equal where they are tensors we keep).
"""
from turing.arch.bert_postln.model import PostLNConfig
from turing.arch.hf_common import (FLOAT32, NO_BERT_HEADS, VOCAB_ROWS, WORDPIECE, check_encoder_config, check_keys,
                                   check_tied, config_dict, fresh_bias, head_absent, legacy_layer_norm_names,
                                   readme_head, under_prefix, vocab_rows_of, with_vocab_padding, word_embedding_of)
from turing.arch.spec import HFAdapter
from turing.errors import ConversionError
from turing.modeling import _ACTIVATIONS, BertConfigError
from turing.tokenization import vocab_size_padded

_WORD, _DECODER, _BIAS = ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight",
                          "cls.predictions.bias")

POSTLN_MODEL_TYPE = "bert"
POSTLN_HF_ARCHITECTURE = "BertForMaskedLM"
POSTLN_HF_CLASSES = (POSTLN_HF_ARCHITECTURE, "BertForPreTraining", "BertModel")   # BertModel: the bare encoder
POSTLN_MISSING_KEYS = ("bert.pooler.dense.weight", "bert.pooler.dense.bias", "cls.seq_relationship.weight",
                       "cls.seq_relationship.bias")
_POSTLN_DECODER_BIAS = "cls.predictions.decoder.bias"  # transformers' tied copy of cls.predictions.bias
# config keys copied as they are, both ways (transformers' names are ours)
_POSTLN_SAME_KEYS = PostLNConfig.FIELDS


def _dense_and_norm(prefix):
    return [f"{prefix}{n}.{p}" for n in ("dense", "LayerNorm") for p in ("weight", "bias")]


_HEAD_TRANSFORM_KEYS = tuple(_dense_and_norm("cls.predictions.transform."))


def _postln_keys(num_layers, head=True):
    """Our keys of the bert_postln model, except the word embedding, the MLM bias and the pooler
    and NSP head (and, `head` false, the MLM head's transform)."""
    dense_and_norm = _dense_and_norm
    keys = ["bert.embeddings.position_embeddings.weight", "bert.embeddings.token_type_embeddings.weight",
            "bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias"]
    for i in range(num_layers):
        layer = f"bert.encoder.layer.{i}."
        keys += [f"{layer}attention.self.{n}.{p}" for n in ("query", "key", "value") for p in ("weight", "bias")]
        keys += dense_and_norm(layer + "attention.output.") + dense_and_norm(layer + "output.")
        keys += [f"{layer}intermediate.dense.weight", f"{layer}intermediate.dense.bias"]
    return keys + (list(_HEAD_TRANSFORM_KEYS) if head else [])


def postln_to_hf(state_dict, config, vocab_size_real, pad_token_id=0):
    """Map our BertForPreTrainingPostLN weights onto BertForMaskedLM.

    config: our PostLNConfig (vocab_size = padded embedding rows); vocab_size_real: the vocab
    file's size (rows from there on are padding and are dropped); pad_token_id: [PAD]'s id. The
    pooler and the NSP head are dropped. Returns (hf_state_dict, hf_config_dict); tensors keep
    their dtype."""
    keys = _postln_keys(config.num_hidden_layers)
    check_keys(state_dict, keys + [_WORD, _BIAS], list(POSTLN_MISSING_KEYS) + [_DECODER], "our state dict")
    hf = {k: state_dict[k].clone() for k in keys}
    hf[_WORD], hf[_BIAS] = vocab_rows_of(state_dict, (_WORD, _DECODER, _BIAS), config, vocab_size_real,
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
    """Map BertForMaskedLM, BertForPreTraining or bare BertModel weights (a stock folder's, keys with
    or without the `bert.` prefix, or as exported by `postln_to_hf`) to ours.

    hf_config: the config.json dict, its path (or folder), or a PretrainedConfig. Returns
    (state_dict, PostLNConfig): the vocab padded to a multiple of 8 with zero embedding rows and
    MLM bias PADDED_ROW_BIAS; the pooler and NSP head where the weights have them; a bare
    encoder's MLM bias zero and its transform absent (fresh: `head_absent`). Tensors keep their dtype."""
    cfg = config_dict(hf_config)
    config = _postln_config_from_hf(cfg)
    sd = under_prefix(legacy_layer_norm_names(hf_state_dict), "bert.", ("embeddings", "encoder", "pooler"))
    sd.pop("bert.embeddings.position_ids", None)
    headless = head_absent(sd, ("cls.predictions.",))
    keys = _postln_keys(config.num_hidden_layers, head=not headless)
    check_keys(sd, keys + [_WORD] + ([] if headless else [_BIAS]),
               list(POSTLN_MISSING_KEYS) + [_DECODER, _POSTLN_DECODER_BIAS], "Hugging Face state dict")
    vocab_real = cfg["vocab_size"]
    word = word_embedding_of(sd, _WORD, vocab_real)
    bias = fresh_bias(word) if headless else sd[_BIAS]
    check_tied(sd, [(_DECODER, word, _WORD), (_POSTLN_DECODER_BIAS, bias, _BIAS)])
    ours = {k: sd[k].clone() for k in keys + [k for k in POSTLN_MISSING_KEYS if k in sd]}
    ours[_WORD], ours[_BIAS] = with_vocab_padding(word, bias)
    ours[_DECODER] = ours[_WORD]  # tied
    return ours, config


# ---------------------------------------------------------------------------------------------
# The export's README


README = readme_head("post-LN BERT") + """Architecture: BERT (`transformers`' own BertForMaskedLM, no remote code), the post-LayerNorm block
our bert_postln model computes (a stock BERT imported and trained on here); the MLM scores at every
real (non-pad) position equal ours (checked when exported: max difference {diff}).

What differs from the training checkpoint:
""" + VOCAB_ROWS + NO_BERT_HEADS + FLOAT32 + WORDPIECE


def readme(config, fields):
    return README.format(**fields)


def _export(state_dict, config, vocab_size_real, ids):
    return postln_to_hf(state_dict, config, vocab_size_real, pad_token_id=ids["pad"])


ADAPTER = HFAdapter(model_types=(POSTLN_MODEL_TYPE,), classes=POSTLN_HF_CLASSES,
                    config_from_hf=_postln_config_from_hf, from_hf=hf_to_postln, to_hf=_export, readme=readme,
                    fresh_keys=POSTLN_MISSING_KEYS + _HEAD_TRANSFORM_KEYS)

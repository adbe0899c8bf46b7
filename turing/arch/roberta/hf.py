"""The "roberta" architecture (turing/arch/roberta/model.py) <-> transformers' RoBERTa family:
`RobertaForMaskedLM` (model_type "roberta"), `XLMRobertaForMaskedLM` ("xlm-roberta"),
`CamembertForMaskedLM` ("camembert"), and on import their bare encoders `RobertaModel`,
`XLMRobertaModel`, `CamembertModel` (keys with or without the `roberta.` prefix):
`roberta_to_hf` and `hf_to_roberta`.

Our parameter names are transformers' under other roots (model.py): `bert.` is its `roberta.`,
`cls.predictions.transform.dense` its `lm_head.dense`, `cls.predictions.transform.LayerNorm` its
`lm_head.layer_norm`, `cls.predictions.bias` its `lm_head.bias` (in both the decoder is tied to the
word embeddings). So the mapping renames the roots and drops the vocab padding rows on export
(re-created on import as zero rows with an MLM bias of PADDED_ROW_BIAS); the position table goes
across whole (its max_position_embeddings is ours + pad_token_id + 1, model.py). config.json's
model_type is kept in ours (`model_type`) and the export writes that family's masked-LM class, so
an XLM-R comes back an XLMRobertaForMaskedLM. A config.json without a key has transformers'
default (RobertaConfig's: 512 positions, two token types, LayerNorm eps 1e-12), not ours.
Also on import: a bare encoder's pooler (RobertaModel's pooling layer) is dropped, as
RobertaForMaskedLM has none; the tied decoder copies and the position_ids buffer some files hold
are dropped (the copies checked equal to what they copy); a bare encoder's MLM head starts fresh
(`head_absent`: its transform as the model initialises it, a zero bias, the decoder tied).
"""
from turing.arch.bert_postln.hf import _postln_keys
from turing.arch.hf_common import (FLOAT32, VOCAB_ROWS, check_encoder_config, check_keys, check_tied, config_dict,
                                   fresh_bias, head_absent, readme_head, renamed, under_prefix, vocab_rows_of,
                                   with_vocab_padding, word_embedding_of)
from turing.arch.roberta.model import MODEL_TYPES, RobertaConfig
from turing.arch.spec import HFAdapter
from turing.errors import ConversionError
from turing.modeling import _ACTIVATIONS, BertConfigError
from turing.tokenization import vocab_size_padded

MASKED_LM_CLASSES = dict(zip(MODEL_TYPES, ("RobertaForMaskedLM", "XLMRobertaForMaskedLM", "CamembertForMaskedLM")))
BARE_CLASSES = dict(zip(MODEL_TYPES, ("RobertaModel", "XLMRobertaModel", "CamembertModel")))
HF_CLASSES = (*MASKED_LM_CLASSES.values(), *BARE_CLASSES.values())
_ROOTS = (("bert.", "roberta."), ("cls.predictions.transform.dense.", "lm_head.dense."),
          ("cls.predictions.transform.LayerNorm.", "lm_head.layer_norm."), ("cls.predictions.", "lm_head."))
_WORD, _DECODER, _BIAS = ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight",
                          "cls.predictions.bias")
_HF_DECODER_BIAS = "lm_head.decoder.bias"  # transformers' tied copy of lm_head.bias
_HEAD_KEYS = tuple(f"cls.predictions.transform.{n}.{p}" for n in ("dense", "LayerNorm") for p in ("weight", "bias"))
# transformers' RobertaConfig defaults (XLMRobertaConfig's and CamembertConfig's too) where they are not ours
_HF_DEFAULTS = {"max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 1}
# config keys copied as they are, both ways (transformers' names are ours)
_SAME_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
              "hidden_dropout_prob", "attention_probs_dropout_prob", "type_vocab_size", "initializer_range",
              "layer_norm_eps", "classifier_dropout")


def _hf_key(key):
    return renamed(key, _ROOTS)


def roberta_to_hf(state_dict, config, vocab_size_real, pad_token_id, bos_token_id=None, eos_token_id=None):
    """Map our RobertaForPreTraining weights onto the masked-LM class of `config.model_type`.

    config: our RobertaConfig (vocab_size = padded embedding rows); vocab_size_real: the tokenizer's
    ids (rows from there on are padding and are dropped); pad_token_id: the tokenizer's pad id, which
    must be the config's (transformers numbers positions from the pad id it finds in the input);
    bos/eos_token_id: written to the config (the tokenizer's cls and sep). Returns (hf_state_dict,
    hf_config_dict); tensors keep their dtype."""
    problem = config.pad_id_problem(pad_token_id)
    if problem:
        raise ConversionError(problem)
    keys = _postln_keys(config.num_hidden_layers)
    check_keys(state_dict, keys + [_WORD, _BIAS], [_DECODER], "our state dict")
    hf = {_hf_key(k): state_dict[k].clone() for k in keys}
    word, bias = vocab_rows_of(state_dict, (_WORD, _DECODER, _BIAS), config, vocab_size_real, pad_token_id)
    hf[_hf_key(_WORD)] = hf[_hf_key(_DECODER)] = word   # tied, as in the HF model
    hf[_hf_key(_BIAS)] = hf[_HF_DECODER_BIAS] = bias
    hf_config = {"architectures": [MASKED_LM_CLASSES[config.model_type]], "model_type": config.model_type,
                 "vocab_size": int(vocab_size_real), **{k: getattr(config, k) for k in _SAME_KEYS},
                 "max_position_embeddings": config.max_position_embeddings + config.first_position,
                 "pad_token_id": int(pad_token_id), "is_decoder": False, "add_cross_attention": False,
                 "tie_word_embeddings": True}
    for key, value in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id)):
        if value is not None:
            hf_config[key] = int(value)
    return hf, hf_config


def _roberta_config_from_hf(cfg):
    """Our RobertaConfig (vocab_size: the padded rows; max_position_embeddings: the positions a
    sequence may use) of a RobertaConfig, XLMRobertaConfig or CamembertConfig dict; what our block
    does not compute is refused, naming it."""
    model_type = cfg.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ConversionError(f"Hugging Face config: model_type {model_type!r}, expected one of "
                              f"{', '.join(MODEL_TYPES)}")
    check_encoder_config(cfg, (MASKED_LM_CLASSES[model_type], BARE_CLASSES[model_type]))
    values = {**_HF_DEFAULTS, **cfg}
    for key in ("vocab_size", "max_position_embeddings", "pad_token_id"):
        if isinstance(values.get(key), bool) or not isinstance(values.get(key), int):
            raise ConversionError(f"Hugging Face config: {key} must be an int, got {values.get(key)!r}")
    if values["type_vocab_size"] != 1:
        raise ConversionError(f"Hugging Face config: type_vocab_size {values['type_vocab_size']!r}; the {model_type} "
                              "block imported has one token type (RoBERTa's tokenizers give no token type ids)")
    if values.get("hidden_act", "gelu") not in _ACTIVATIONS:
        raise ConversionError(f"Hugging Face config: hidden_act {values['hidden_act']!r} is not one this block "
                              f"computes ({', '.join(sorted(_ACTIVATIONS))}; gelu is the exact erf form, as "
                              "transformers')")
    pad, table = values["pad_token_id"], values["max_position_embeddings"]
    if not 0 <= pad < table - 1:
        raise ConversionError(f"Hugging Face config: max_position_embeddings {table} leaves no position after the "
                              f"padding index {pad} (RoBERTa numbers positions from pad_token_id + 1)")
    try:
        return RobertaConfig(vocab_size_padded(values["vocab_size"]), max_position_embeddings=table - pad - 1,
                             pad_token_id=pad, model_type=model_type,
                             **{k: values[k] for k in _SAME_KEYS if k in values})
    except BertConfigError as e:
        raise ConversionError(f"Hugging Face config: {e}") from None


def hf_to_roberta(hf_state_dict, hf_config):
    """Map RobertaForMaskedLM, XLMRobertaForMaskedLM or CamembertForMaskedLM weights, or their bare
    encoder's (keys with or without the `roberta.` prefix; a pooler is dropped), to ours.

    hf_config: the config.json dict, its path (or folder), or a PretrainedConfig. Returns
    (state_dict, RobertaConfig): the vocab padded to a multiple of 8 with zero embedding rows and
    MLM bias PADDED_ROW_BIAS; a bare encoder's MLM bias zero and its transform absent (fresh:
    `head_absent`). Tensors keep their dtype."""
    cfg = config_dict(hf_config)
    config = _roberta_config_from_hf(cfg)
    sd = under_prefix(hf_state_dict, "roberta.", ("embeddings", "encoder", "pooler"))
    headless = head_absent(sd, ("lm_head.",))
    keys = _postln_keys(config.num_hidden_layers, head=not headless)
    hf_word, hf_decoder, hf_bias = (_hf_key(k) for k in (_WORD, _DECODER, _BIAS))
    optional = [hf_decoder, _HF_DECODER_BIAS, "roberta.embeddings.position_ids", "roberta.pooler.dense.weight",
                "roberta.pooler.dense.bias"]
    check_keys(sd, [_hf_key(k) for k in keys] + [hf_word] + ([] if headless else [hf_bias]), optional,
               "Hugging Face state dict")
    vocab_real = cfg["vocab_size"]
    word = word_embedding_of(sd, hf_word, vocab_real)
    bias = fresh_bias(word) if headless else sd[hf_bias]
    check_tied(sd, [(hf_decoder, word, hf_word), (_HF_DECODER_BIAS, bias, hf_bias)])
    ours = {k: sd[_hf_key(k)].clone() for k in keys}
    ours[_WORD], ours[_BIAS] = with_vocab_padding(word, bias)
    ours[_DECODER] = ours[_WORD]  # tied
    return ours, config


# ---------------------------------------------------------------------------------------------
# The export's README


README = readme_head("RoBERTa-family encoder") + """Architecture: {architecture} (`transformers`' own class, no remote
code), the post-LayerNorm block of the {model_type} family that our roberta model computes (a stock
model of it continues pretraining there); the MLM scores at every real (non-pad) position equal
ours (checked when exported: max difference {diff}).

What differs from the training checkpoint:
- Names only: our `bert.` is `roberta.`, `cls.predictions.transform.dense` and `.LayerNorm` are
  `lm_head.dense` and `lm_head.layer_norm`, `cls.predictions.bias` is `lm_head.bias`. The position
  table is the same: a sequence's first token reads row pad_token_id + 1 = {first}, so sequences
  must be padded at the end (with the pad id {pad_id}).
""" + VOCAB_ROWS + FLOAT32 + """- Sentence pairs were trained as `<s> A </s> B </s>` (BERT's layout, with the
  tokenizer's cls and sep), not RoBERTa's `<s> A </s></s> B </s>`; there are no token type ids.
- Tokenizer: BERT WordPiece (vocab.txt), do_lower_case={lower}, [CLS] A [SEP] B [SEP], no token type ids.
"""


def readme(config, fields):
    return README.format(model_type=config.model_type, first=config.first_position, **fields)


def _export(state_dict, config, vocab_size_real, ids):
    return roberta_to_hf(state_dict, config, vocab_size_real, ids["pad"], bos_token_id=ids["cls"],
                         eos_token_id=ids["sep"])


ADAPTER = HFAdapter(model_types=MODEL_TYPES, classes=HF_CLASSES, config_from_hf=_roberta_config_from_hf,
                    from_hf=hf_to_roberta, to_hf=_export, readme=readme, fresh_keys=_HEAD_KEYS, token_types=False)

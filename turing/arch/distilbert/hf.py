"""The "distilbert" architecture (turing/arch/distilbert/model.py) <-> Hugging Face's DistilBERT
(`DistilBertForMaskedLM`; import also from the bare encoder `DistilBertModel`): `distil_to_hf` and
`hf_to_distil`.

Our parameter names are the post-LN BERT's (model.py), so the mapping renames: `distilbert.` is our
`bert.`, `transformer.layer.N.` our `encoder.layer.N.`, and in a layer q_lin, k_lin, v_lin are
attention.self.query, key, value, out_lin is attention.output.dense, sa_layer_norm
attention.output.LayerNorm, ffn.lin1 intermediate.dense, ffn.lin2 output.dense, output_layer_norm
output.LayerNorm; the head's vocab_transform is cls.predictions.transform.dense, vocab_layer_norm
cls.predictions.transform.LayerNorm, vocab_projector the decoder tied to the word embedding
(its bias cls.predictions.bias). The config's dim, n_layers, n_heads, hidden_dim, activation,
dropout, attention_dropout are hidden_size, num_hidden_layers, num_attention_heads,
intermediate_size, hidden_act, hidden_dropout_prob, attention_probs_dropout_prob;
max_position_embeddings, initializer_range and seq_classif_dropout keep their names. As for BERT,
the vocab padding rows are dropped on export and re-created on import (zero rows, an MLM bias of
PADDED_ROW_BIAS). A bare DistilBertModel's keys (with or without `distilbert.`) import with the
masked-LM head created as transformers creates it (`head_absent`). Refused on import: a
sinusoidal position table (`sinusoidal_pos_embds`), an activation the block does not compute.
"""
from turing.arch.distilbert.model import DistilConfig
from turing.arch.hf_common import (FLOAT32, VOCAB_ROWS, check_encoder_config, check_keys, check_tied, config_dict,
                                   fresh_bias, head_absent, readme_head, under_prefix, vocab_rows_of,
                                   with_vocab_padding, word_embedding_of)
from turing.arch.spec import HFAdapter
from turing.errors import ConversionError
from turing.modeling import _ACTIVATIONS, BertConfigError
from turing.tokenization import vocab_size_padded

DISTIL_MODEL_TYPE = "distilbert"
DISTIL_HF_ARCHITECTURE = "DistilBertForMaskedLM"
DISTIL_HF_CLASSES = (DISTIL_HF_ARCHITECTURE, "DistilBertModel")   # DistilBertModel: the bare encoder
_WORD, _DECODER, _BIAS = ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight",
                          "cls.predictions.bias")
_HF_WORD, _HF_DECODER, _HF_BIAS = ("distilbert.embeddings.word_embeddings.weight", "vocab_projector.weight",
                                   "vocab_projector.bias")
# (transformers' name, ours) of a layer's modules, under distilbert.transformer.layer.N. / bert.encoder.layer.N.
_LAYER_NAMES = (("attention.q_lin", "attention.self.query"), ("attention.k_lin", "attention.self.key"),
                ("attention.v_lin", "attention.self.value"), ("attention.out_lin", "attention.output.dense"),
                ("sa_layer_norm", "attention.output.LayerNorm"), ("ffn.lin1", "intermediate.dense"),
                ("ffn.lin2", "output.dense"), ("output_layer_norm", "output.LayerNorm"))
_HEAD_NAMES = (("vocab_transform", "cls.predictions.transform.dense"),
               ("vocab_layer_norm", "cls.predictions.transform.LayerNorm"))
_HEAD_KEYS = tuple(f"{ours}.{p}" for _, ours in _HEAD_NAMES for p in ("weight", "bias"))
# (transformers' config key, ours)
_CONFIG_NAMES = (("dim", "hidden_size"), ("n_layers", "num_hidden_layers"), ("n_heads", "num_attention_heads"),
                 ("hidden_dim", "intermediate_size"), ("activation", "hidden_act"), ("dropout", "hidden_dropout_prob"),
                 ("attention_dropout", "attention_probs_dropout_prob"),
                 ("max_position_embeddings", "max_position_embeddings"), ("initializer_range", "initializer_range"),
                 ("seq_classif_dropout", "seq_classif_dropout"))


def _key_pairs(num_layers, head=True):
    """(our key, transformers' key) of every tensor but the word embedding, the decoder and the MLM
    bias (and, `head` false, the MLM head's transform)."""
    pairs = [(f"bert.embeddings.{name}", f"distilbert.embeddings.{name}")
             for name in ("position_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias")]
    for i in range(num_layers):
        pairs += [(f"bert.encoder.layer.{i}.{ours}.{p}", f"distilbert.transformer.layer.{i}.{theirs}.{p}")
                  for theirs, ours in _LAYER_NAMES for p in ("weight", "bias")]
    if head:
        pairs += [(f"{ours}.{p}", f"{theirs}.{p}") for theirs, ours in _HEAD_NAMES for p in ("weight", "bias")]
    return pairs


def distil_to_hf(state_dict, config, vocab_size_real, pad_token_id=0):
    """Map our DistilForPreTraining weights onto DistilBertForMaskedLM.

    config: our DistilConfig (vocab_size = padded embedding rows); vocab_size_real: the vocab
    file's size (rows from there on are padding and are dropped); pad_token_id: [PAD]'s id.
    Returns (hf_state_dict, hf_config_dict); tensors keep their dtype."""
    pairs = _key_pairs(config.num_hidden_layers)
    check_keys(state_dict, [ours for ours, _ in pairs] + [_WORD, _BIAS], [_DECODER], "our state dict")
    hf = {theirs: state_dict[ours].clone() for ours, theirs in pairs}
    hf[_HF_WORD], hf[_HF_BIAS] = vocab_rows_of(state_dict, (_WORD, _DECODER, _BIAS), config, vocab_size_real,
                                               pad_token_id)
    hf[_HF_DECODER] = hf[_HF_WORD]  # tied, as in the HF model
    hf_config = {"architectures": [DISTIL_HF_ARCHITECTURE], "model_type": DISTIL_MODEL_TYPE,
                 "vocab_size": int(vocab_size_real),
                 **{theirs: getattr(config, ours) for theirs, ours in _CONFIG_NAMES},
                 "sinusoidal_pos_embds": False, "pad_token_id": int(pad_token_id), "tie_word_embeddings": True}
    return hf, hf_config


def _distil_config_from_hf(cfg):
    """Our DistilConfig (vocab_size: the padded rows) of a DistilBertConfig dict; what our block
    does not compute is refused, naming it."""
    if cfg.get("model_type") != DISTIL_MODEL_TYPE:
        raise ConversionError(f"Hugging Face config: model_type {cfg.get('model_type')!r}, expected "
                              f"{DISTIL_MODEL_TYPE!r} (DistilBertForMaskedLM or DistilBertModel)")
    check_encoder_config(cfg, DISTIL_HF_CLASSES)
    if cfg.get("sinusoidal_pos_embds"):
        raise ConversionError("Hugging Face config: sinusoidal_pos_embds is true; the distilbert block has a learned "
                              "position table (transformers 4.x kept a sinusoidal one frozen, 5.x trains it): set it "
                              "false in config.json to train the folder's table as learned positions")
    if not isinstance(cfg.get("vocab_size"), int):
        raise ConversionError(f"Hugging Face config: vocab_size must be an int, got {cfg.get('vocab_size')!r}")
    if cfg.get("activation", "gelu") not in _ACTIVATIONS:
        raise ConversionError(f"Hugging Face config: activation {cfg['activation']!r} is not one this block computes "
                              f"({', '.join(sorted(_ACTIVATIONS))}; gelu is the exact erf form, as transformers')")
    try:
        return DistilConfig(vocab_size_padded(cfg["vocab_size"]),
                            **{ours: cfg[theirs] for theirs, ours in _CONFIG_NAMES if theirs in cfg})
    except BertConfigError as e:
        raise ConversionError(f"Hugging Face config: {e}") from None


def hf_to_distil(hf_state_dict, hf_config):
    """Map DistilBertForMaskedLM weights (a stock folder's, or as exported by `distil_to_hf`) or a
    bare DistilBertModel's (keys with or without the `distilbert.` prefix) to ours.

    hf_config: the config.json dict, its path (or folder), or a PretrainedConfig. Returns
    (state_dict, DistilConfig): the vocab padded to a multiple of 8 with zero embedding rows and
    MLM bias PADDED_ROW_BIAS; a bare encoder's MLM bias zero and its transform absent (fresh:
    `head_absent`). Tensors keep their dtype."""
    cfg = config_dict(hf_config)
    config = _distil_config_from_hf(cfg)
    sd = under_prefix(hf_state_dict, "distilbert.", ("embeddings", "transformer"))
    sd.pop("distilbert.embeddings.position_ids", None)  # a buffer some files hold: positions are 0..L-1
    headless = head_absent(sd, ("vocab_transform.", "vocab_layer_norm.", "vocab_projector."))
    pairs = _key_pairs(config.num_hidden_layers, head=not headless)
    check_keys(sd, [theirs for _, theirs in pairs] + [_HF_WORD] + ([] if headless else [_HF_BIAS]), [_HF_DECODER],
               "Hugging Face state dict")
    vocab_real = cfg["vocab_size"]
    word = word_embedding_of(sd, _HF_WORD, vocab_real)
    check_tied(sd, [(_HF_DECODER, word, _HF_WORD)])
    ours = {k: sd[theirs].clone() for k, theirs in pairs}
    ours[_WORD], ours[_BIAS] = with_vocab_padding(word, fresh_bias(word) if headless else sd[_HF_BIAS])
    ours[_DECODER] = ours[_WORD]  # tied
    return ours, config


# ---------------------------------------------------------------------------------------------
# The export's README


README = readme_head("DistilBERT") + """Architecture: DistilBERT (`transformers`' own DistilBertForMaskedLM, no remote
code), the block our distilbert model computes (a stock DistilBERT imported and trained on here):
post-LN layers, learned positions, no token types, no pooler; the MLM scores at every real
(non-pad) position equal ours (checked when exported: max difference {diff}).

What differs from the training checkpoint:
- Names only: our post-LN BERT names (`bert.encoder.layer.N.attention.self.query`, ...) are
  DistilBERT's (`distilbert.transformer.layer.N.attention.q_lin`, ...).
""" + VOCAB_ROWS + FLOAT32 + """- Tokenizer: BERT WordPiece, do_lower_case={lower}, [CLS] A [SEP] B [SEP];
  no token type ids (DistilBERT has no token type embeddings).
"""


def readme(config, fields):
    return README.format(**fields)


def _export(state_dict, config, vocab_size_real, ids):
    return distil_to_hf(state_dict, config, vocab_size_real, pad_token_id=ids["pad"])


ADAPTER = HFAdapter(model_types=(DISTIL_MODEL_TYPE,), classes=DISTIL_HF_CLASSES, config_from_hf=_distil_config_from_hf,
                    from_hf=hf_to_distil, to_hf=_export, readme=readme, fresh_keys=_HEAD_KEYS, token_types=False)

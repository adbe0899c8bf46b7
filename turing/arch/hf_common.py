"""What every architecture's Hugging Face adapter (turing/arch/NAME/hf.py) shares: reading a
config.json into a dict, checking key sets and encoder settings, the vocab rows our embeddings pad
to a multiple of 8 (dropped on export, re-created on import with no probability mass), early
checkpoints' LayerNorm names, and the README fragments of an export.
"""
import os
import re

import torch

from turing.errors import CheckpointNotFoundError, ConversionError
from turing.jsonfile import read_json
from turing.tokenization import vocab_size_padded

PADDED_ROW_BIAS = -10000.0  # MLM bias of re-created vocab padding rows: no probability mass


def layers_in(keys, pattern):
    """How many layers the keys matching `pattern` (its group 1: the layer index) number."""
    found = {int(m.group(1)) for k in keys if (m := re.match(pattern, k))}
    return max(found) + 1 if found else 0


def short(keys, n=6):
    keys = sorted(keys)
    return ", ".join(keys[:n]) + (f" ... ({len(keys)} in all)" if len(keys) > n else "")


def check_keys(have, expected, optional, what):
    missing = set(expected) - set(have)
    unexpected = set(have) - set(expected) - set(optional)
    if missing or unexpected:
        raise ConversionError(f"{what}: keys do not match (missing: {short(missing) or 'none'}; "
                              f"unexpected: {short(unexpected) or 'none'})")


def check_encoder_config(cfg, classes):
    """Refuse a Hugging Face config our blocks do not compute, naming what differs: a class other
    than `classes` (the masked-LM ones we import and the bare encoder), a decoder or cross-attention,
    positions other than learned absolute ones."""
    listed = cfg.get("architectures") or []
    if listed and not set(listed) & set(classes):
        raise ConversionError(f"Hugging Face config: architectures {listed}; the {cfg.get('model_type')} classes "
                              f"imported are {', '.join(classes)} (an encoder with or without its masked-LM head)")
    for key in ("is_decoder", "add_cross_attention"):
        if cfg.get(key):
            raise ConversionError(f"Hugging Face config: {key} is true; our models are bidirectional encoders "
                                  "without cross-attention")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError("Hugging Face config: position_embedding_type must be 'absolute', "
                              f"got {cfg['position_embedding_type']!r}")


def same_values(copy, tensor):
    """Whether a tied copy in a weights file (a decoder's weight, its bias) holds its tensor's values;
    for tensors on the meta device (a folder's headers, checked before anything is allocated) its
    shape."""
    if copy.shape != tensor.shape:
        return False
    return copy.is_meta or tensor.is_meta or torch.equal(copy, tensor)


def renamed(key, roots):
    """`key` with its root renamed: the first (ours, theirs) of `roots` it starts with, `ours`
    replaced by `theirs` (our state dict's keys -> an adapter's Hugging Face names)."""
    for ours, theirs in roots:
        if key.startswith(ours):
            return theirs + key[len(ours):]
    raise ConversionError(f"our state dict: key {key} is not under {', '.join(o for o, _ in roots)}")


def word_embedding_of(state_dict, key, vocab_size):
    """The word embedding `key` of a Hugging Face state dict, checked to have the config's
    `vocab_size` rows."""
    word = state_dict[key]
    if word.shape[0] != vocab_size:
        raise ConversionError(f"{key} has {word.shape[0]} rows, config vocab_size is {vocab_size}")
    return word


def check_tied(state_dict, ties):
    """Each (copy key, tensor, the tensor's key) of `ties` whose copy the state dict holds (the
    MLM decoder's weight, and a decoder's own bias key) must hold the values of the tensor it is
    tied to: our MLM decoder is tied to the word embedding, with the head's bias."""
    for copy, tensor, tied_to in ties:
        if copy in state_dict and not same_values(state_dict[copy], tensor):
            raise ConversionError(f"{copy} differs from {tied_to}: our MLM decoder is tied to the word embedding, "
                                  "with the head's bias")


def under_prefix(state_dict, prefix, bare_roots):
    """The keys of a bare encoder as its masked-LM class names them: `BertModel.save_pretrained`
    writes `embeddings.*`, `encoder.*`, ... where BertForMaskedLM writes `bert.embeddings.*`, so keys
    whose first part is one of `bare_roots` go under `prefix`; a state dict already under it is kept."""
    if any(k.startswith(prefix) for k in state_dict):
        return dict(state_dict)
    return {prefix + k if k.split(".")[0] in bare_roots else k: v for k, v in state_dict.items()}


def head_absent(state_dict, head_prefixes):
    """True where the weights hold no masked-LM head (a bare encoder: no key under `head_prefixes`).
    Its transform then keeps the model's fresh initialisation (the adapter lists its keys in
    `fresh_keys`), which is transformers' (normal(0, initializer_range) weights, zero biases, unit
    LayerNorms), its decoder is tied to the word embedding and its bias starts at zero (`fresh_bias`)."""
    return not any(k.startswith(tuple(head_prefixes)) for k in state_dict)


def fresh_bias(word):
    """The MLM bias of a head the weights lack: zero for every row of the word embedding `word`."""
    return word.new_zeros(word.shape[0])


def with_vocab_padding(word, bias):
    """(word embedding, MLM bias) of `vocab_real` rows -> padded to a multiple of 8: zero embedding
    rows and an MLM bias of PADDED_ROW_BIAS, so the padding takes no probability mass."""
    padded = vocab_size_padded(word.shape[0])
    return (torch.cat([word, word.new_zeros((padded - word.shape[0], word.shape[1]))]),
            torch.cat([bias, bias.new_full((padded - bias.shape[0],), PADDED_ROW_BIAS)]))


def vocab_rows_of(state_dict, keys, config, vocab_size_real, pad_token_id):
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
    if decoder_key in state_dict and not same_values(state_dict[decoder_key], word):
        raise ConversionError(f"{decoder_key} differs from {word_key}: the export needs the tied decoder")
    if not 0 <= pad_token_id < vocab_size_real:
        raise ConversionError(f"pad_token_id {pad_token_id} is outside the vocab (size {vocab_size_real})")
    return word[:vocab_size_real].clone(), state_dict[bias_key][:vocab_size_real].clone()


def config_dict(hf_config):
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


def legacy_layer_norm_names(state_dict):
    """`...LayerNorm.gamma/.beta` -> `...LayerNorm.weight/.bias` (early BERT checkpoints' names)."""
    renamed = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
    out = {}
    for key, value in state_dict.items():
        for old, new in renamed.items():
            if key.endswith(old):
                key = key[:-len(old)] + new
        out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# The export's README.md: its head and the lines of "What differs" that more than one architecture's has


def readme_head(model):
    return f"""# {{name}}: {model} exported for Hugging Face transformers

Exported by `tools/export_hf.py` from the DeepSpeed checkpoint `{{checkpoint}}`.

```python
from transformers import AutoModelForMaskedLM, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained("{{folder}}")
model = AutoModelForMaskedLM.from_pretrained("{{folder}}")   # {{architecture}}
```

"""


VOCAB_ROWS = """- Vocab: {vocab_real} tokens (vocab.txt). The {vocab_dropped} padding row(s) our embedding had
  (rounded up to {vocab_padded}, a multiple of 8) are dropped; they were never an input or a label.
"""
NO_BERT_HEADS = """- Dropped: the pooler (`bert.pooler`) and the next-sentence head (`cls.seq_relationship`);
  a masked-LM model has neither. Fine-tuning heads start fresh.
"""
FLOAT32 = "- Weights are stored in float32 whatever the training precision was.\n"
WORDPIECE = "- Tokenizer: BERT WordPiece, do_lower_case={lower}, [CLS] A [SEP] B [SEP] with token type ids.\n"

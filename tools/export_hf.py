"""Export one of our DeepSpeed checkpoints as a Hugging Face model folder.

    python -m tools.export_hf --checkpoint_dir OUT/saved_models/JOB [--tag epoch2_step60] \
        --output_dir hf_model [--cf bert_config.json]

The folder holds `config.json` + `model.safetensors` of a `RobertaPreLayerNormForMaskedLM`
(our pre-LN BERT, mapped by `turing.hf_convert`), of a `BertForMaskedLM` for a checkpoint of the
bert_postln architecture (`turing/postln.py`: a stock BERT trained on), or of a
`ModernBertForMaskedLM` for one of the modernbert architecture (`turing/modern.py`), the tokenizer files (`vocab.txt`,
`tokenizer_config.json`, `special_tokens_map.json`, and `tokenizer.json` too for the modernbert
architecture; a model trained with a `tokenizer.json` gets that one instead of `vocab.txt`) and a
README saying what was dropped.
It loads offline with `transformers`' own classes:

    from transformers import AutoModelForMaskedLM, AutoTokenizer
    model = AutoModelForMaskedLM.from_pretrained("hf_model")
    tokenizer = AutoTokenizer.from_pretrained("hf_model")

A non-empty --output_dir (another model's README.md or config.json, say) is refused unless
--overwrite, which replaces the files the export writes and leaves the others, with a warning.

Everything needed comes from the checkpoint: the weights, the job config and the resolved
arguments saved next to them (vocab file, lower-casing). `--cf` is a fallback for checkpoints
without those files, or whose vocab file has moved. Before writing, the exported model is run
next to ours on a padded batch and the MLM scores at real positions must agree.
"""
import json
import logging
import os
import shutil
import sys
import tempfile

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from turing.errors import OneLineParser  # light (argparse only): before --help is answered


def build_parser():
    parser = OneLineParser(description="Export a DeepSpeed checkpoint of ours as a Hugging Face "
                                       "masked-LM folder (RoBERTa-PreLayerNorm, BERT or ModernBERT, "
                                       "as its architecture; offline).")
    parser.add_argument("--checkpoint_dir", required=True,
                        help="OUT/saved_models/JOB (or one of its tag folders)")
    parser.add_argument("--tag", default=None, help="checkpoint tag, e.g. epoch2_step60 (default: the 'latest' file)")
    parser.add_argument("--output_dir", required=True, help="folder to write the Hugging Face model to")
    parser.add_argument("--cf", "--config-file", dest="config_file", default=None,
                        help="job config (bert_config.json), used when the checkpoint lacks job_config.json "
                             "or its vocab file has moved")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --output_dir, replacing the files the export writes there")
    parser.add_argument("--trust_checkpoint", action="store_true",
                        help="unpickle the checkpoint's files in full, which runs any code they hold: only for a "
                             "checkpoint you wrote yourself that does not load weights-only (other DeepSpeed versions)")
    parser.add_argument("--no_verify", action="store_true",
                        help="skip running both models on a test batch before writing")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return parser


if __name__ == "__main__":  # --help and a bad flag are answered here, before the slow imports below
    build_parser().parse_args()  # (torch, DeepSpeed, transformers); main() parses the flags again

import torch

from turing.checkpoint import load_checkpoint_state, resolve_checkpoint_tag_dir
from turing.hf_convert import (HF_ARCHITECTURE, HF_MISSING_KEYS, MODERN_HF_ARCHITECTURE, OPTIONAL_KEYS,
                               POSTLN_HF_ARCHITECTURE, POSTLN_MISSING_KEYS, ConversionError, modern_to_hf, ours_to_hf,
                               postln_to_hf)
from turing.jsonfile import read_json
from turing.models import pretraining_model
from turing.outputs import clear_unfinished, earlier_output, install_staged
from turing.pretrained import find_vocab_file, model_config_of
from turing.job_config import config_vocab_size
from turing.tokenization import SPECIAL_TOKENS, BertTokenizer, load_tokenizer

logger = logging.getLogger(__name__)

VERIFY_TOLERANCE = 1e-3  # max |ours - HF| MLM score, relative to max(1, max |score|)
# the token embedding's key in our state dict, by architecture
EMBEDDING_KEYS = {"bert": "bert.embeddings.word_embeddings.weight", "bert_postln": "bert.embeddings.word_embeddings.weight",
                  "modernbert": "bert.embeddings.tok_embeddings.weight"}


class ExportError(ValueError):
    """Bad input to the export; the message names the file or key."""


def _read_json(path, what):
    return read_json(path, what, ExportError)


def model_config(job_config, state_dict, source):
    """Our model config (a BertConfig, or a ModernConfig for the modernbert architecture):
    bert_model_config of the job config, sized by the saved tensors."""
    config = model_config_of(job_config, source)
    word = state_dict.get(EMBEDDING_KEYS[config.architecture])
    pos = state_dict.get("bert.embeddings.position_embeddings.weight")
    if word is None or (pos is None and config.architecture != "modernbert"):
        raise ExportError(f"{source}: the checkpoint has no embedding tables (not a checkpoint of ours of "
                          f"architecture {config.architecture})")
    # The training script overrides the config's vocab size with the vocab file's (padded).
    config.vocab_size = word.shape[0]
    if pos is None:  # modernbert: RoPE, no position table
        if word.shape[1] != config.hidden_size:
            raise ExportError(f"{source}: bert_model_config (hidden_size {config.hidden_size}) does not match the "
                              f"checkpoint's token embedding {tuple(word.shape)}")
    elif pos.shape[0] != config.max_position_embeddings or word.shape[1] != config.hidden_size:
        raise ExportError(f"{source}: bert_model_config (hidden_size {config.hidden_size}, max_position_embeddings "
                          f"{config.max_position_embeddings}) does not match the checkpoint's embeddings "
                          f"{tuple(word.shape)} and {tuple(pos.shape)}")
    return config


def verify(state_dict, config, hf_model, vocab_size_real, pad_id, seed=0):
    """Run ours and the HF model on a padded batch; returns the max |difference| of the MLM
    scores at real positions (raises if above VERIFY_TOLERANCE x max(1, max |score|)). For the
    modernbert architecture the batch is longer than its sliding window, so the local layers'
    band is compared too."""
    modern = config.architecture == "modernbert"
    ours = pretraining_model(config)
    # the pooler, which no optimizer group holds, is not in a gathered ZeRO stage 3 checkpoint;
    # the export leaves it out anyway, and the MLM scores compared here do not use it
    missing, unexpected = ours.load_state_dict(state_dict, strict=False)
    if unexpected or set(missing) - set(OPTIONAL_KEYS):
        raise ConversionError(f"the checkpoint's weights do not fit the model: missing "
                              f"{sorted(set(missing) - set(OPTIONAL_KEYS))[:4]}, unexpected {unexpected[:4]}")
    ours.eval()
    hf_model.eval()
    g = torch.Generator().manual_seed(seed)
    length = min(max(32, config.local_attention + 16) if modern else 32, config.max_position_embeddings)
    lengths = [length, max(2, length // 2), max(2, length // 3)]
    ids = torch.randint(0, vocab_size_real, (len(lengths), length), generator=g)
    ids[ids == pad_id] = (pad_id + 1) % vocab_size_real
    mask = torch.zeros_like(ids)
    segments = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
        segments[row, n // 2:n] = 1 if getattr(config, "type_vocab_size", 1) > 1 else 0
    ids = ids.masked_fill(mask == 0, pad_id)  # BERT inputs: padding at the end
    types = {} if modern else {"token_type_ids": segments}  # ModernBERT has no token types
    with torch.no_grad():
        scores, _ = ours.predict(ids, segments, mask)
        hf_scores = hf_model(input_ids=ids, attention_mask=mask, **types).logits
    real = mask.bool()
    for name, values in (("our model's", scores[real]), ("the exported model's", hf_scores[real])):
        if not bool(torch.isfinite(values).all()):
            raise ConversionError(f"{name} MLM scores on a test batch are not finite (NaN or Infinity); "
                                  "not exported")
    diff = (scores[..., :vocab_size_real][real] - hf_scores[real]).abs().max().item()
    scale = max(1.0, scores[real].abs().max().item())
    if diff > VERIFY_TOLERANCE * scale:
        raise ConversionError(f"the exported model's MLM scores differ from ours by {diff:.3g} "
                              f"(scores up to {scale:.3g}); the mapping does not fit this checkpoint")
    return diff


def write_tokenizer_files(output_dir, tokenizer, model_max_length, modern=False):
    """The tokenizer the checkpoint was trained with, as AutoTokenizer reads it with our ids and
    settings: a vocab.txt + configs for a BertTokenizer (for the modernbert architecture: no token
    type ids, the model has none, and tokenizer.json too, since AutoTokenizer reads only that for a
    ModernBERT config); a tokenizer.json as it was + configs naming its special tokens for a
    PreTrainedTokenizerFast."""
    if not isinstance(tokenizer, BertTokenizer):
        special = {f"{role}_token": token for role, token in tokenizer.special_tokens.items()}
        shutil.copyfile(tokenizer.path, os.path.join(output_dir, "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": int(model_max_length),
                  "clean_up_tokenization_spaces": False, **special}
        if modern:
            config["model_input_names"] = ["input_ids", "attention_mask"]
        for name, content in (("tokenizer_config.json", config), ("special_tokens_map.json", special)):
            with open(os.path.join(output_dir, name), "w", encoding="utf-8") as f:
                json.dump(content, f, indent=2)
        return
    do_lower_case = tokenizer.do_lower_case
    shutil.copyfile(tokenizer.path, os.path.join(output_dir, "vocab.txt"))
    special = {f"{key}_token": tok for key, tok in SPECIAL_TOKENS.items()}
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": bool(do_lower_case),
        # Google's BasicTokenizer strips accents exactly when it lower-cases: None = follow do_lower_case.
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "model_max_length": int(model_max_length),
        "clean_up_tokenization_spaces": False,
        **special,
    }
    if modern:
        tokenizer_config["model_input_names"] = ["input_ids", "attention_mask"]
    with open(os.path.join(output_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config, f, indent=2)
    with open(os.path.join(output_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(special, f, indent=2)
    if modern:  # the same WordPiece tokenizer, serialised as transformers builds it from the files above
        from transformers import BertTokenizer as HFBertTokenizer
        HFBertTokenizer.from_pretrained(output_dir, local_files_only=True).backend_tokenizer.save(
            os.path.join(output_dir, "tokenizer.json"))


def _readme_head(model):
    return f"""# {{name}}: {model} exported for Hugging Face transformers

Exported by `tools/export_hf.py` from the DeepSpeed checkpoint `{{checkpoint}}`.

```python
from transformers import AutoModelForMaskedLM, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained("{{folder}}")
model = AutoModelForMaskedLM.from_pretrained("{{folder}}")   # {{architecture}}
```

"""


# the lines of "What differs" that more than one architecture's README has
_VOCAB_ROWS = """- Vocab: {vocab_real} tokens (vocab.txt). The {vocab_dropped} padding row(s) our embedding had
  (rounded up to {vocab_padded}, a multiple of 8) are dropped; they were never an input or a label.
"""
_NO_BERT_HEADS = """- Dropped: the pooler (`bert.pooler`) and the next-sentence head (`cls.seq_relationship`);
  a masked-LM model has neither. Fine-tuning heads start fresh.
"""
_FLOAT32 = "- Weights are stored in float32 whatever the training precision was.\n"
_WORDPIECE = "- Tokenizer: BERT WordPiece, do_lower_case={lower}, [CLS] A [SEP] B [SEP] with token type ids.\n"

README = _readme_head("pre-LN BERT") + """Architecture: RoBERTa-PreLayerNorm, which computes the same pre-LayerNorm blocks, final
LayerNorm and tied MLM head as the Bing BERT model; the MLM scores at every real (non-pad)
position equal ours (checked when exported: max difference {diff}).

What differs from the training checkpoint:
- Position table: RoBERTa numbers positions from `pad_token_id + 1` ({shift}), so the table is
  ours shifted by {shift} rows (zero rows in front) and `max_position_embeddings` is
  {hf_positions} = {positions} + {shift}. Sequences must be padded at the end (as BERT inputs
  are); a token after a pad gets a different position than in our model.
""" + _VOCAB_ROWS + _NO_BERT_HEADS + _FLOAT32 + _WORDPIECE + """  `transformers`' BertTokenizer uses the Rust normaliser's Unicode tables; on rare characters
  (e.g. punctuation added in recent Unicode versions) it can split differently from
  `turing.tokenization`, which follows Google's tokenizer under this Python's `unicodedata`.
"""


MODERN_README = _readme_head("ModernBERT-style encoder") + """Architecture: ModernBERT (`transformers`' own ModernBertForMaskedLM, no remote code): the same
blocks as our modernbert model (rotary embeddings, GeGLU, {layers} layers of which {full} use full
attention and {sliding} a sliding window of +-{window} tokens), final norm and tied MLM head; the
MLM scores at every real (non-pad) position equal ours (checked when exported on sequences
longer than the window: max difference {diff}).

What differs from the training checkpoint:
- Names only: our `bert.` is `model.`, `cls.head.` is `head.`, `cls.decoder.` is `decoder.`.
""" + _VOCAB_ROWS + _FLOAT32 + """- Tokenizer: BERT WordPiece (not ModernBERT's BPE), do_lower_case={lower}, [CLS] A [SEP] B [SEP];
  no token type ids (ModernBERT has no token type embeddings). `transformers`' BertTokenizer uses
  the Rust normaliser's Unicode tables; on rare characters it can split differently from
  `turing.tokenization`, which follows Google's tokenizer under this Python's `unicodedata`.
"""


POSTLN_README = _readme_head("post-LN BERT") + """Architecture: BERT (`transformers`' own BertForMaskedLM, no remote code), the post-LayerNorm block
our bert_postln model computes (a stock BERT imported and trained on here); the MLM scores at every
real (non-pad) position equal ours (checked when exported: max difference {diff}).

What differs from the training checkpoint:
""" + _VOCAB_ROWS + _NO_BERT_HEADS + _FLOAT32 + _WORDPIECE


def hf_model_of(state_dict, config, vocab_real, ids):
    """Our weights in the Hugging Face masked-LM class of their architecture (float32):
    (model, class name, our keys it leaves out)."""
    import transformers  # checked by export() before any work

    if config.architecture == "modernbert":
        hf_state, hf_config = modern_to_hf(state_dict, config, vocab_real, pad_token_id=ids["pad"],
                                           cls_token_id=ids["cls"], sep_token_id=ids["sep"])
        name, dropped = MODERN_HF_ARCHITECTURE, ()
        model = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**hf_config))
    elif config.architecture == "bert_postln":
        hf_state, hf_config = postln_to_hf(state_dict, config, vocab_real, pad_token_id=ids["pad"])
        name, dropped = POSTLN_HF_ARCHITECTURE, POSTLN_MISSING_KEYS
        model = transformers.BertForMaskedLM(transformers.BertConfig(**hf_config))
    else:
        hf_state, hf_config = ours_to_hf(state_dict, config, vocab_real, pad_token_id=ids["pad"],
                                         bos_token_id=ids["cls"], eos_token_id=ids["sep"])
        name, dropped = HF_ARCHITECTURE, HF_MISSING_KEYS
        model = transformers.RobertaPreLayerNormForMaskedLM(transformers.RobertaPreLayerNormConfig(**hf_config))
    result = model.load_state_dict({k: v.float() for k, v in hf_state.items()}, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ConversionError(f"the mapped weights do not fit {name}: missing {result.missing_keys}, "
                              f"unexpected {result.unexpected_keys}")
    return model, name, dropped


def readme_text(config, name, tag_dir, output_dir, architecture, diff, vocab_real, pad_id, do_lower_case,
                tokenizer=None):
    common = dict(name=name, checkpoint=tag_dir, folder=output_dir, architecture=architecture,
                  diff="skipped" if diff is None else f"{diff:.2g}", vocab_real=vocab_real,
                  vocab_dropped=config.vocab_size - vocab_real, vocab_padded=config.vocab_size, lower=do_lower_case)
    if config.architecture == "bert_postln":
        text = POSTLN_README.format(**common)
    elif config.architecture == "modernbert":
        full = config.layer_types.count("full_attention")
        text = MODERN_README.format(layers=config.num_hidden_layers, full=full,
                                    sliding=config.num_hidden_layers - full, window=config.local_attention // 2,
                                    **common)
    else:
        shift = pad_id + 1
        text = README.format(shift=shift, hf_positions=config.max_position_embeddings + shift,
                             positions=config.max_position_embeddings, **common)
    if tokenizer is None or isinstance(tokenizer, BertTokenizer):
        return text
    # a tokenizer.json: its own normaliser and special tokens, in place of the WordPiece lines (the last bullet)
    special = tokenizer.special_tokens
    return (text[:text.index("- Tokenizer:")].replace("tokens (vocab.txt)", "ids (tokenizer.json)")
            + f"- Tokenizer: the checkpoint's tokenizer.json as it was (sha256 {tokenizer.digest[:12]}), "
              f"{special['cls']} A {special['sep']} B {special['sep']} with its own special tokens.\n")


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


STAGING_PREFIX = ".export_hf."        # the folder an export is written in before it is moved into place
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def check_output_dir(output_dir, overwrite):
    """Refuse a non-empty --output_dir (it may hold another model's README.md or config.json)
    unless --overwrite; returns what is there already. What a killed export left (its staging
    folder, the files of an install it did not finish) is cleared first."""
    cleared = clear_unfinished(output_dir, STAGING_PREFIX)
    if cleared:
        logger.warning("%s: removed %s, left by an export that was stopped while moving them in", output_dir,
                       ", ".join(cleared))
    return earlier_output(output_dir, overwrite, ExportError, "pass --overwrite to replace the export's files there, or give an empty or new folder")


def export(checkpoint_dir, output_dir, tag=None, config_file=None, check=True, overwrite=False, trust=False):
    """Write the Hugging Face folder; returns a dict summarising what was written. The checkpoint
    is read weights-only; `trust` (--trust_checkpoint): with the full unpickler."""
    try:
        # optional, slow to import; hf_model_of builds them
        from transformers import BertForMaskedLM, ModernBertForMaskedLM, RobertaPreLayerNormForMaskedLM  # noqa: F401
    except ImportError as e:
        raise ExportError(f"the export needs the 'transformers' package ({e}); pip install transformers") from None
    present = check_output_dir(output_dir, overwrite)

    tag_dir = resolve_checkpoint_tag_dir(checkpoint_dir, tag, folder_flag="--checkpoint_dir", tag_flag="--tag")
    state_dict, job_config, run_args = load_checkpoint_state(tag_dir, trust=trust, trust_flag=True)
    cf_config = _read_json(config_file, "job config (--cf)") if config_file else None
    if job_config is not None:
        source = os.path.join(tag_dir, "job_config.json")
    else:
        job_config, source = cf_config, config_file or os.path.join(tag_dir, "job_config.json")
    config = model_config(job_config, state_dict, source)

    vocab_file = find_vocab_file(run_args, job_config, cf_config, config_file, tag_dir)
    do_lower_case = bool((run_args or {}).get("do_lower_case", True))
    tokenizer = load_tokenizer(vocab_file, do_lower_case)
    trained_vocab = config_vocab_size((job_config or {}).get("bert_model_config"))
    vocab_real = tokenizer.model_vocab(trained_vocab)
    if tokenizer.vocab_size == 0 or tokenizer.rows(trained_vocab) != config.vocab_size:
        raise ExportError(f"vocab file {vocab_file} has {tokenizer.vocab_size} tokens, but the checkpoint's embedding "
                          f"has {config.vocab_size} rows (the vocab size rounded up to a multiple of 8): "
                          "not the vocab it was trained with")
    ids = tokenizer.special   # one error line where it lacks one

    hf_model, architecture, dropped = hf_model_of(state_dict, config, vocab_real, ids)
    diff = verify(state_dict, config, hf_model, vocab_real, ids["pad"]) if check else None
    if diff is not None:
        logger.info("Exported model matches ours: max MLM score difference %.3g", diff)

    # Written in a staging folder first, then moved in: the names replaced are exactly the export's.
    os.makedirs(output_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=output_dir)
    try:
        hf_model.save_pretrained(staging)
        write_tokenizer_files(staging, tokenizer, config.max_position_embeddings,
                              modern=config.architecture == "modernbert")
        with open(os.path.join(staging, "README.md"), "w", encoding="utf-8") as f:
            f.write(readme_text(config, (job_config or {}).get("name", "bing_bert"), tag_dir, output_dir,
                                architecture, diff, vocab_real, ids["pad"], do_lower_case, tokenizer))
        written = sorted(os.listdir(staging))
        mode = 0o666 & ~current_umask()  # safetensors writes its file 0600: readable as the umask says, like the rest
        for name in written:
            os.chmod(os.path.join(staging, name), mode)
        # the weights last (and an earlier export's first out): a kill between two renames leaves no
        # folder that loads with the new config and the old weights; the same command clears it
        install_staged(staging, output_dir, written, last=[n for n in written if n.endswith(WEIGHT_SUFFIXES)])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("Wrote %s (dropped: %s)", output_dir, ", ".join(dropped) or "the vocab padding rows only")
    kept = [name for name in present if name not in written]
    if kept:
        logger.warning("%s: left in place, not written by this export: %s", output_dir, ", ".join(kept))
    return {"checkpoint": tag_dir, "output_dir": output_dir, "vocab_file": vocab_file,
            "vocab_size": vocab_real, "max_abs_diff": diff, "do_lower_case": do_lower_case}


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        summary = export(args.checkpoint_dir, args.output_dir, args.tag, args.config_file,
                         check=not args.no_verify, overwrite=args.overwrite, trust=args.trust_checkpoint)
    except (ValueError, OSError) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exported {summary['checkpoint']} -> {summary['output_dir']} "
          f"(vocab {summary['vocab_size']}, max MLM score difference {summary['max_abs_diff']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

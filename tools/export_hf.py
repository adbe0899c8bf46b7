"""Export one of our DeepSpeed checkpoints as a Hugging Face model folder.

    python -m tools.export_hf --checkpoint_dir OUT/saved_models/JOB [--tag epoch2_step60] \
        --output_dir hf_model [--cf bert_config.json]

The folder holds `config.json` + `model.safetensors` of the masked-LM class of the checkpoint's
architecture, as its adapter (turing/arch/NAME/hf.py) writes it: `RobertaPreLayerNormForMaskedLM`
for our pre-LN BERT, `BertForMaskedLM` for bert_postln, `RobertaForMaskedLM`,
`XLMRobertaForMaskedLM` or `CamembertForMaskedLM` for roberta (the class its weights came from),
`DistilBertForMaskedLM`, `ModernBertForMaskedLM`; the tokenizer files (`vocab.txt`,
`tokenizer_config.json`, `special_tokens_map.json`, and `tokenizer.json` too for a model without
token types; a model trained with a `tokenizer.json` gets that one instead of `vocab.txt`) and a
README saying what was dropped. --checkpoint_dir may also name any trained model
turing.pretrained opens (a Hugging Face folder, a cached model id): it is written back as its class.
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
                                       "as its architecture; offline).", epilog="guide: docs/export.md")
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

from turing.arch import pretraining_model, spec_of
from turing.errors import ConversionError, InputValueError, tool_exit
from turing.outputs import clear_unfinished, earlier_output, install_staged
from turing.pretrained import CHECKPOINT, load_into, open_trained, read_weights
from turing.tokenization import SPECIAL_TOKENS, BertTokenizer

logger = logging.getLogger(__name__)

VERIFY_TOLERANCE = 1e-3  # max |ours - HF| MLM score, relative to max(1, max |score|)
class ExportError(InputValueError):
    """Bad input to the export; the message names the file or key."""


def verify(ours, config, hf_model, vocab_size_real, pad_id, seed=0):
    """Run ours (the pretraining model with the checkpoint's weights) and the HF model on a padded
    batch; returns the max |difference| of the MLM scores at real positions (raises if above
    VERIFY_TOLERANCE x max(1, max |score|)). The batch's length is the adapter's (for the
    modernbert architecture longer than its sliding window, so the local layers' band is compared
    too); token type ids only where the model reads them."""
    adapter = spec_of(config.architecture).hf
    ours.eval()
    hf_model.eval()
    g = torch.Generator().manual_seed(seed)
    length = min(adapter.verify_length(config), config.max_position_embeddings)
    lengths = [length, max(2, length // 2), max(2, length // 3)]
    ids = torch.randint(0, vocab_size_real, (len(lengths), length), generator=g)
    ids[ids == pad_id] = (pad_id + 1) % vocab_size_real
    mask = torch.zeros_like(ids)
    segments = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
        segments[row, n // 2:n] = 1 if getattr(config, "type_vocab_size", 1) > 1 else 0
    ids = ids.masked_fill(mask == 0, pad_id)  # BERT inputs: padding at the end
    types = {"token_type_ids": segments} if adapter.token_types else {}  # ModernBERT has no token types
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


def write_tokenizer_files(output_dir, tokenizer, model_max_length, token_types=True):
    """The tokenizer the checkpoint was trained with, as AutoTokenizer reads it with our ids and
    settings: a vocab.txt + configs for a BertTokenizer (for a model without token types, the
    modernbert architecture's: no token type ids, and tokenizer.json too, since AutoTokenizer reads
    only that for a ModernBERT config); a tokenizer.json as it was + configs naming its special
    tokens for a PreTrainedTokenizerFast."""
    if not isinstance(tokenizer, BertTokenizer):
        special = {f"{role}_token": token for role, token in tokenizer.special_tokens.items()}
        shutil.copyfile(tokenizer.path, os.path.join(output_dir, "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": int(model_max_length),
                  "clean_up_tokenization_spaces": False, **special}
        if not token_types:
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
    if not token_types:
        tokenizer_config["model_input_names"] = ["input_ids", "attention_mask"]
    with open(os.path.join(output_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config, f, indent=2)
    with open(os.path.join(output_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(special, f, indent=2)
    if not token_types:  # the same WordPiece tokenizer, serialised as transformers builds it from the files above
        from transformers import BertTokenizer as HFBertTokenizer
        HFBertTokenizer.from_pretrained(output_dir, local_files_only=True).backend_tokenizer.save(
            os.path.join(output_dir, "tokenizer.json"))


def hf_model_of(state_dict, config, vocab_real, ids):
    """Our weights in the Hugging Face masked-LM class of their architecture (float32), through its
    adapter (turing.arch): (model, class name, our keys it leaves out)."""
    import transformers  # checked by export() before any work

    adapter = spec_of(config.architecture).hf
    hf_state, hf_config = adapter.to_hf(state_dict, config, vocab_real, ids)
    name = hf_config["architectures"][0]
    model_class = getattr(transformers, name)
    model = model_class(model_class.config_class(**hf_config))
    result = model.load_state_dict({k: v.float() for k, v in hf_state.items()}, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ConversionError(f"the mapped weights do not fit {name}: missing {result.missing_keys}, "
                              f"unexpected {result.unexpected_keys}")
    return model, name, adapter.fresh_keys


def readme_text(config, name, tag_dir, output_dir, architecture, diff, vocab_real, pad_id, do_lower_case,
                tokenizer=None):
    fields = dict(name=name, checkpoint=tag_dir, folder=output_dir, architecture=architecture,
                  diff="skipped" if diff is None else f"{diff:.2g}", vocab_real=vocab_real,
                  vocab_dropped=config.vocab_size - vocab_real, vocab_padded=config.vocab_size, lower=do_lower_case,
                  pad_id=pad_id)
    text = spec_of(config.architecture).hf.readme(config, fields)
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
    """Write the Hugging Face folder; returns a dict summarising what was written. The trained model
    is opened the one way (turing.pretrained: its config, tokenizer and weights, read weights-only;
    `trust` (--trust_checkpoint): with the full unpickler)."""
    try:
        import transformers  # noqa: F401 (optional, slow to import; hf_model_of builds its classes)
    except ImportError as e:
        raise ExportError(f"the export needs the 'transformers' package ({e}); pip install transformers") from None
    present = check_output_dir(output_dir, overwrite)

    trained = open_trained(checkpoint_dir, config_file=config_file, tag=tag, folder_flag="--checkpoint_dir",
                           tag_flag="--tag", vocab_flag=None)
    tag_dir = trained.weights if trained.kind == CHECKPOINT else trained.path
    config, tokenizer = trained.config, trained.require_tokenizer("--cf")
    if tokenizer.vocab_size == 0:
        raise ExportError(f"vocab file {trained.vocab_file} is empty")
    ours = pretraining_model(config)
    state_dict = read_weights(trained.weights, trust=trust, trust_flag=True)
    load_into(ours, state_dict, tag_dir)   # every shape as the config's and the vocab's; one error line if not
    state_dict = ours.state_dict()   # the model's layout (the transformer kernel's converted, fresh heads in)
    vocab_real = trained.vocab_ids
    ids = tokenizer.special   # one error line where it lacks one

    hf_model, architecture, dropped = hf_model_of(state_dict, config, vocab_real, ids)
    diff = verify(ours, config, hf_model, vocab_real, ids["pad"]) if check else None
    if diff is not None:
        logger.info("Exported model matches ours: max MLM score difference %.3g", diff)

    # Written in a staging folder first, then moved in: the names replaced are exactly the export's.
    os.makedirs(output_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=output_dir)
    try:
        hf_model.save_pretrained(staging)
        write_tokenizer_files(staging, tokenizer, config.max_position_embeddings,
                              token_types=spec_of(config.architecture).hf.token_types)
        with open(os.path.join(staging, "README.md"), "w", encoding="utf-8") as f:
            f.write(readme_text(config, (trained.job_config or {}).get("name", "bing_bert"), tag_dir, output_dir,
                                architecture, diff, vocab_real, ids["pad"], trained.do_lower_case, tokenizer))
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
    return {"checkpoint": tag_dir, "output_dir": output_dir, "vocab_file": trained.vocab_file,
            "vocab_size": vocab_real, "max_abs_diff": diff, "do_lower_case": trained.do_lower_case}


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    def run():
        summary = export(args.checkpoint_dir, args.output_dir, args.tag, args.config_file,
                         check=not args.no_verify, overwrite=args.overwrite, trust=args.trust_checkpoint)
        print(f"exported {summary['checkpoint']} -> {summary['output_dir']} "
              f"(vocab {summary['vocab_size']}, max MLM score difference {summary['max_abs_diff']})")
        return 0
    return tool_exit(run, args.debug)


if __name__ == "__main__":
    sys.exit(main())

"""Opening a trained model, the one way every reader does it (--use_pretrain, BertMultiTask.load,
tools/eval_mlm.py, tools/finetune_glue.py, tools/export_hf.py).

A trained model is one of:
- a checkpoint of ours: a job folder (OUT/saved_models/JOB: its `latest` tag) or one tag folder,
  with job_config.json and args.json beside the weights;
- a state dict file with the original's key names (.pt/.bin);
- a Hugging Face folder (`save_pretrained`'s layout: safetensors, else pytorch_model.bin read
  weights-only; one file or shards), also as a model id in the local Hugging Face cache or as a
  sentence-transformers folder (turing.model_path.resolve_model_path: the one rule for which local
  folder a path names): written by tools/export_hf.py, or a stock model of a class an
  architecture's adapter imports (turing.arch: the masked-LM classes of BERT, RoBERTa,
  XLM-RoBERTa, CamemBERT, DistilBERT, RoBERTa-PreLayerNorm and ModernBERT, and their bare encoders).
  Sizes and architecture come from its config.json (turing.hf_folder, and the adapter of its
  model_type), the tokenizer from its vocab.txt, whose size must be config.json's vocab_size and
  whose [PAD] its pad_token_id, else from its tokenizer.json, whose ids must fit config.json's
  vocab_size (rows past them are padding the model keeps) and whose pad token its pad_token_id. A
  folder with neither (only a vocab.json and merges.txt) still opens: `tokenizer_file` names what
  it has, and `require_tokenizer` is the one error line of a reader that needs the tokenizer.

`open_trained(path, vocab_file, config_file)` says what it is: a TrainedModel with its kind, its
config (sizes and architecture, vocab_size the rows its tokenizer gives: `Tokenizer.rows`), its
tokenizer file and lower-casing, and whether its weights hold a next-sentence head.
`TrainedModel.build()` is the model with those weights (or, random_init, its twin with fresh ones);
`load_weights`, or `read_weights` and `load_into`, give them to a model built elsewhere (the
trainer's engine). Every file is read weights-only and every tensor must be finite
(turing.checkpoint_files); only the tensors an architecture's adapter lists as fresh may be absent (a
pooler and next-sentence head a masked-LM class lacks, the masked-LM head of a bare encoder): they
keep the model's initialisation, transformers' own, and one warning line names them.
"""
import dataclasses
import logging
import os
from typing import Optional

import torch

from turing.arch import hf_imported, model_config_from_dict, pretraining_model, spec_of
from turing.checkpoint_files import (ENGINE_FILE_SUFFIX, complete_tags, engine_tags, load_checkpoint_state,
                                     read_state_dict_file, resolve_checkpoint_tag_dir, step_of)
from turing.errors import ConversionError, InputValueError
from turing.hf_folder import hf_folder_config, load_hf_folder
from turing.model_path import is_hf_folder, resolve_model_path
from turing.jsonfile import json_kind, read_json
from turing.kernel_layout import to_transformer_kernel_layout
from turing.modeling import BertConfigError
from turing.tokenization import (SPECIAL_TOKEN_FILES, TOKENIZER_FILES, BertTokenizer, Tokenizer, load_tokenizer,
                                 tokenizer_difference, tokenizer_file, vocab_digest)

logger = logging.getLogger(__name__)

CHECKPOINT, STATE_DICT, EXPORT = "checkpoint", "state_dict", "export"  # EXPORT: any Hugging Face folder
# a Hugging Face folder's tokenizer files, in the order they name its tokenizer (a vocab.json: one we cannot read)
FOLDER_TOKENIZER_FILES = (*TOKENIZER_FILES, "vocab.json")
NSP_HEAD_KEY = "cls.seq_relationship.weight"


class ModelSourceError(InputValueError):
    """A trained model that cannot be opened; the message names the path, file or key."""


@dataclasses.dataclass
class TrainedModel:
    path: str                 # as given
    kind: str                 # CHECKPOINT, STATE_DICT or EXPORT
    weights: str              # what the weights are read from: the file, the tag folder or the export folder
    config: object            # BertConfig, PostLNConfig or ModernConfig; vocab_size = the rows of its tokenizer
    vocab_file: Optional[str]  # the tokenizer file (vocab.txt or tokenizer.json); None: a Hugging Face folder
                               # with neither (tokenizer_file names what it has)
    do_lower_case: bool
    job_config: Optional[dict] = None   # a checkpoint's job_config.json (or --cf's)
    run_args: Optional[dict] = None     # a checkpoint's args.json
    tokenizer_file: Optional[str] = None  # a Hugging Face folder's: vocab.txt, else tokenizer.json or vocab.json
    nsp_head: bool = False    # the weights hold a next-sentence head (a BertForPreTraining's, a checkpoint's)
    vocab_ids: Optional[int] = None  # the ids the embedding rows stand for (Tokenizer.model_vocab); rows past them pad
    tokenizer: Optional[Tokenizer] = None  # of vocab_file, lower-casing as the model's

    @property
    def architecture(self):
        return self.config.architecture

    def require_tokenizer(self, flag="--tokenizer"):
        """The model's tokenizer (turing.tokenization: its vocab.txt or tokenizer.json, lower-casing
        as the model's); a folder with neither is one error line (`flag`: how the caller names a
        tokenizer given instead)."""
        if self.tokenizer is None:
            raise ModelSourceError(
                f"{self.path}: no vocab.txt or tokenizer.json; its tokenizer is "
                f"{self.tokenizer_file or 'not in the folder'}, which this project (turing.tokenization) cannot read: "
                f"save it as tokenizer.json (transformers: AutoTokenizer.from_pretrained(FOLDER).save_pretrained("
                f"FOLDER) writes one), or give a tokenizer whose ids are the model's ({flag})")
        return self.tokenizer

    @property
    def step(self):
        """The global step in the tag of a checkpoint of ours (None for the other kinds, or a tag without one)."""
        if self.kind != CHECKPOINT:
            return None
        step = step_of(os.path.basename(self.weights))
        return step if step >= 0 else None

    def build(self, random_init=False):
        """The pretraining model of this config, initialised from the current torch RNG state,
        then (unless `random_init`) given these weights."""
        model = pretraining_model(self.config)
        if not random_init:
            self.load_weights(model)
        return model

    def load_weights(self, model, trust=False):
        """These weights into `model`, a pretraining model of this config built elsewhere (read
        weights-only, or with `trust` the full unpickler; checked by `load_into`)."""
        load_into(model, read_weights(self.weights, trust), self.path)


def _json_beside(folder, name):
    path = os.path.join(folder, name)
    return read_json(path, name, ModelSourceError) if os.path.isfile(path) else None


def model_config_of(job_config, source):
    """The model config (BertConfig or ModernConfig) of a job config's bert_model_config."""
    if not job_config or "bert_model_config" not in job_config:
        raise ModelSourceError(f"{source}: no bert_model_config (the model sizes); pass --cf with the job config")
    try:
        return model_config_from_dict(job_config["bert_model_config"])
    except BertConfigError as e:
        raise ModelSourceError(f"{source}: {e}") from None


def _vocab_candidates(token_file, bases):
    for base in bases:
        path = token_file if base is None else os.path.join(base, token_file)
        if os.path.isdir(path):
            try:
                yield tokenizer_file(path)
            except FileNotFoundError:
                yield os.path.join(path, TOKENIZER_FILES[0])
        else:
            yield path


def find_vocab_file(run_args, job_config, cf_config, cf_path, folder=None):
    """The tokenizer file the checkpoint in `folder` was trained with: its copy beside the
    checkpoint (vocab.txt or tokenizer.json, written since the checkpoints record it), else
    args.json's vocab_file if it exists and, where args.json records its sha256, is that file;
    else bert_token_file of --cf (or of the saved job config) as given, next to --cf, or under the
    run's --data_path_prefix."""
    copy = next((os.path.join(folder, n) for n in TOKENIZER_FILES if folder is not None
                 and os.path.isfile(os.path.join(folder, n))), None)
    if copy is not None:
        return copy
    tried = []
    saved = (run_args or {}).get("vocab_file")
    digest = (run_args or {}).get("vocab_sha256")
    if saved:
        if os.path.isfile(saved) and digest and vocab_digest(saved) != digest:
            raise ModelSourceError(f"vocab file {saved} has changed since the checkpoint was trained with it (its "
                                   f"sha256 differs from args.json's vocab_sha256); pass --cf with a bert_token_file "
                                   f"that is the training vocab")
        if os.path.isfile(saved):
            return saved
        tried.append(saved)
    prefix = (run_args or {}).get("data_path_prefix") or None
    for config, base in ((cf_config, os.path.dirname(os.path.abspath(cf_path)) if cf_path else None),
                         (job_config, None)):
        token_file = (config or {}).get("bert_token_file")
        if not token_file:
            continue
        for path in _vocab_candidates(token_file, [None, base, prefix]):
            if os.path.isfile(path):
                return path
            tried.append(path)
    raise ModelSourceError("vocab file not found: tried " + (", ".join(dict.fromkeys(tried)) or "nothing")
                           + "; pass --cf with a bert_token_file that exists (a vocab.txt, a tokenizer.json or a "
                             "folder holding one)")


def kind_of(path):
    """CHECKPOINT, STATE_DICT or EXPORT (a Hugging Face folder) of the model `path` names
    (resolve_model_path: a local path, a model id in the Hugging Face cache, a sentence-transformers
    folder); a path that names none is one error line."""
    return _kind(resolve_model_path(path))


def _kind(local):
    """The kind of a resolved local path (resolve_model_path's). A folder with a config.json that names
    no model_type, and nothing of a checkpoint, is a Hugging Face folder that cannot be read: one line
    naming config.json (not "no checkpoint there")."""
    if is_hf_folder(local):
        return EXPORT
    if not os.path.isdir(local):
        return STATE_DICT
    config = os.path.join(local, "config.json")
    if os.path.isfile(config) and not _holds_checkpoint(local):
        document = read_json(config, "config.json", ModelSourceError)     # not JSON: that line
        if not isinstance(document, dict):
            raise ModelSourceError(f"{config}: {json_kind(document)}, not a Hugging Face config (a JSON object "
                                   f"with a model_type)")
        found = document.get("model_type")
        what = "without model_type" if found is None else f"whose model_type is {json_kind(found)}, not a name"
        raise ModelSourceError(f"{config}: a Hugging Face folder {what}; add the model's model_type (one of "
                               f"{hf_imported()}), or give a checkpoint folder")
    return CHECKPOINT


def _holds_checkpoint(folder):
    """Whether `folder` holds a checkpoint's files: a `latest` file, tag folders with engine files
    (complete or not) or, a tag folder itself, the engine files."""
    return (os.path.isfile(os.path.join(folder, "latest")) or bool(complete_tags(folder) or engine_tags(folder))
            or any(name.endswith(ENGINE_FILE_SUFFIX) for name in os.listdir(folder)))


def _check_folder_tokenizer(path, tokenizer, hf_config):
    """A Hugging Face folder's tokenizer must be its config.json's: a vocab.txt as many tokens as
    vocab_size, a tokenizer.json's ids within it (rows past them are the model's padding); its pad
    token at pad_token_id (RoBERTa numbers positions from it; every export writes it)."""
    name, size, rows = os.path.basename(tokenizer.path), tokenizer.vocab_size, hf_config.get("vocab_size")
    wordpiece = isinstance(tokenizer, BertTokenizer)
    fits = size == rows if wordpiece else isinstance(rows, int) and size <= rows
    if not fits:
        raise ModelSourceError(f"{path}: {name} has {size} {'tokens' if wordpiece else 'ids'}, config.json vocab_size "
                               f"is {rows}; the embedding rows are the {'vocab' if wordpiece else 'tokenizer'}'s")
    pad = tokenizer.special_tokens["pad"]
    pad_id = hf_config.get("pad_token_id")
    if pad in tokenizer.vocab and pad_id is not None and tokenizer.vocab[pad] != pad_id:
        raise ModelSourceError(f"{path}: config.json pad_token_id is {pad_id}, but {pad} is id {tokenizer.vocab[pad]} "
                               f"of {name}")


def _open_hf_folder(path, vocab_file):
    """(config, the config.json dict, the weights' headers (hf_folder_config), tokenizer file or
    None, lower-casing, tokenizer file found, the folder's own tokenizer checked or None) of a
    Hugging Face folder; its weights are not read."""
    config, hf_config, headers = hf_folder_config(path)
    found = next((os.path.join(path, name) for name in FOLDER_TOKENIZER_FILES
                  if os.path.isfile(os.path.join(path, name))), None)
    do_lower_case = (_json_beside(path, SPECIAL_TOKEN_FILES[1]) or {}).get("do_lower_case", True)
    tokenizer = None
    if vocab_file is None and found is not None and os.path.basename(found) in TOKENIZER_FILES:
        vocab_file = found
        tokenizer = _tokenizer(vocab_file, do_lower_case)
        _check_folder_tokenizer(path, tokenizer, hf_config)
    return config, hf_config, headers, vocab_file, do_lower_case, found, tokenizer


def _tokenizer(vocab_file, do_lower_case):
    try:
        return load_tokenizer(vocab_file, do_lower_case)
    except ValueError as e:
        raise ModelSourceError(str(e)) from None   # it names the file


def open_trained(path, vocab_file=None, config_file=None, *, tag=None, folder_flag=None, tag_flag=None,
                 vocab_flag="--vocab_file"):
    """What the trained model at `path` is (TrainedModel): its sizes and architecture, vocab and
    lower-casing, from the model itself (a Hugging Face folder's config.json and tokenizer files, a
    checkpoint's job_config.json and args.json); `config_file` (a job config, --cf) for what a
    state dict file or an older checkpoint does not carry; `vocab_file` to name the tokenizer (a
    vocab.txt, a tokenizer.json or a folder holding one). `tag`:
    the checkpoint tag of a job folder (default its `latest`); `folder_flag`, `tag_flag`,
    `vocab_flag`: the caller's flags for the folder, the tag and the tokenizer, which an error line
    about them names (None: it has none). `path` may also be a model id in the local Hugging Face
    cache or a sentence-transformers folder (resolve_model_path); `weights` is then the folder
    read. The weights are read by build()."""
    path = os.fspath(path)
    local = resolve_model_path(path)
    kind = _kind(local)
    vocab_file = tokenizer_file(vocab_file) if vocab_file is not None else None   # a file, or a folder holding one
    cf_config = read_json(config_file, "job config (--cf)", ModelSourceError) if config_file else None
    job_config = run_args = found = tokenizer = None
    if kind == EXPORT:
        config, hf_config, headers, vocab_file, do_lower_case, found, tokenizer = _open_hf_folder(local, vocab_file)
        nsp_head, config_vocab = NSP_HEAD_KEY in headers, hf_config.get("vocab_size")
        weights = local
    else:
        weights = resolve_checkpoint_tag_dir(local, tag, folder_flag, tag_flag) if kind == CHECKPOINT else local
        folder = weights if kind == CHECKPOINT else os.path.dirname(os.path.abspath(local))
        job_config, run_args = _json_beside(folder, "job_config.json"), _json_beside(folder, "args.json")
        # the model's own job config first; --cf for what a state dict file or an older checkpoint does not carry
        config = model_config_of(job_config, os.path.join(folder, "job_config.json")) if job_config is not None \
            else model_config_of(cf_config, config_file or os.path.join(folder, "job_config.json"))
        if vocab_file is None:
            try:
                vocab_file = find_vocab_file(run_args, job_config, cf_config, config_file, folder)
            except ModelSourceError as e:
                raise ModelSourceError(f"{path}: {e}" + (f", or {vocab_flag}" if vocab_flag else "")) from None
        do_lower_case = bool((run_args or {}).get("do_lower_case", True))
        nsp_head = spec_of(config.architecture).nsp_head  # our models keep theirs, trained or not
        config_vocab = config.vocab_size
    vocab_ids = None
    if vocab_file is not None:  # else (a folder without a tokenizer we read) config.json's vocab_size, padded
        tokenizer = tokenizer or _tokenizer(vocab_file, do_lower_case)
        try:
            vocab_ids, config.vocab_size = tokenizer.model_vocab(config_vocab), tokenizer.rows(config_vocab)
        except ValueError as e:
            raise ModelSourceError(str(e)) from None   # it names the file (an empty vocab.txt)
    if kind == EXPORT:
        check_folder_shapes(local, config, headers, hf_config)
    return TrainedModel(path, kind, os.path.abspath(weights), config, vocab_file, do_lower_case,
                        job_config or cf_config, run_args, found, nsp_head, vocab_ids, tokenizer)


def locate(name, data_path_prefix):
    """The local path of the job config's bert_model_file (resolve_model_path): as given, else under
    --data_path_prefix, else a model id in the local Hugging Face cache; None where the job config
    names none (the key absent, null or empty). A name found nowhere is one error line."""
    if not name:
        return None
    under = os.path.join(data_path_prefix or "", name)
    if not os.path.exists(name) and os.path.exists(under):
        return resolve_model_path(under)
    return resolve_model_path(name, tried=(under,) if data_path_prefix else ())


def bert_model_config(config):
    """The job config's bert_model_config of a model config (any architecture)."""
    return {"architecture": config.architecture, **config.to_dict()}


def _comparable(config):
    """A model config's settings without what is not the model's own: the vocab size (the vocab
    file's, padded) and global_attn_every_n_layers (layer_types, which it may derive, says it)."""
    return {k: v for k, v in bert_model_config(config).items() if k not in ("vocab_size", "global_attn_every_n_layers")}


def check_job_settings(path, model_config, vocab_file, next_sentence_prediction, where):
    """A job config that starts from the Hugging Face folder `path` (--use_pretrain) and gives its
    own bert_model_config or bert_token_file must give the folder's (`where` names the job config in
    the one error line); a next-sentence term on a folder without the head (a masked-LM class's)
    trains a fresh one, with a warning. Other kinds of trained model are not checked here (load_into
    checks shapes)."""
    if kind_of(path) != EXPORT:
        return
    trained = open_trained(path)
    try:
        given = _comparable(model_config_from_dict(model_config))
    except BertConfigError as e:
        raise ModelSourceError(f"{where}: {e}") from None
    folder = _comparable(trained.config)
    differ = [k for k in sorted(set(given) | set(folder)) if given.get(k) != folder.get(k)]
    if differ:
        shown = ", ".join(f"{k} {given.get(k)!r} (the folder's {folder.get(k)!r})" for k in differ[:4])
        raise ModelSourceError(f"{where}: bert_model_config differs from {os.path.join(path, 'config.json')}: {shown}; "
                               f"leave bert_model_config out to take the folder's")
    folder_tokenizer = trained.require_tokenizer("the job config's bert_token_file")
    why = tokenizer_difference(load_tokenizer(vocab_file), folder_tokenizer, "the folder's")
    if why:   # the same tokenizer in another file (a vocab.txt, the tokenizer.json written from it) is the folder's
        raise ModelSourceError(f"{where}: bert_token_file {vocab_file} is not the tokenizer of "
                               f"{folder_tokenizer.path}: {why}; leave bert_token_file out to take the folder's")
    if next_sentence_prediction and not trained.nsp_head:   # (a masked-LM class's folder: a fresh head trains)
        logger.warning("%s: next_sentence_prediction is true and %s has no next-sentence head: a fresh one "
                       "trains from its initialisation", where, path)


def read_weights(path, trust=False, trust_flag=False):
    """The state dict (our key names) of a trained model of any kind, read weights-only (`trust`:
    with the full unpickler; `trust_flag`: the caller has --trust_checkpoint, which a refusal
    then names), every tensor finite. `path` is resolved as open_trained resolves it."""
    path = resolve_model_path(path)
    kind = _kind(path)
    if kind == EXPORT:
        return load_hf_folder(path)[0]
    if kind == CHECKPOINT:
        return load_checkpoint_state(path, trust=trust, trust_flag=trust_flag)[0]
    return read_state_dict_file(path)


def check_fits(network, state_dict, where, strict=False):
    """Whether `state_dict` fits a built pretraining model (`where` names it in the one error line):
    every shape as the model's, every key of the model present but (unless `strict`) those its
    architecture's adapter may lack (a pooler and next-sentence head a masked-LM class lacks, a bare
    encoder's masked-LM head), none it lacks. Returns the keys that will keep their fresh
    initialisation. Works on the meta device too (a folder's headers against a model built there:
    nothing allocated)."""
    own = network.state_dict()
    wrong = [f"{k} {tuple(v.shape)} (model {tuple(own[k].shape)})" for k, v in state_dict.items()
             if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if wrong:
        raise ModelSourceError(f"{where}: shapes differ from bert_model_config and the vocab: {', '.join(wrong[:4])}")
    adapter = spec_of(network.architecture).hf
    allowed = () if strict or adapter is None else adapter.fresh_keys
    missing = [k for k in own if k not in state_dict and k not in allowed]
    unexpected = [k for k in state_dict if k not in own]
    if missing or unexpected:
        raise ModelSourceError(f"{where}: weights do not fit the model: missing {missing[:4]}, "
                               f"unexpected {unexpected[:4]}")
    return [k for k in own if k not in state_dict]


def load_into(network, state_dict, where, strict=False):
    """`state_dict` into a built pretraining model, once `check_fits` says it fits; one warning line
    names the tensors that keep their fresh initialisation (transformers' own). Converted to the
    layout of DeepSpeed's transformer kernel when the model uses it."""
    if getattr(getattr(network.bert, "encoder", None), "uses_transformer_kernel", False):
        state_dict = to_transformer_kernel_layout(state_dict)
    fresh = check_fits(network, state_dict, where, strict)
    network.load_state_dict(state_dict, strict=False)
    if fresh:
        logger.warning("%s: %s not in the weights: they start fresh, initialised as transformers initialises "
                       "them (the decoder tied to the word embeddings)", where,
                       ", ".join(fresh) if len(fresh) <= 8 else ", ".join(fresh[:8]) + f" ... ({len(fresh)} in all)")


def check_folder_shapes(path, config, headers, hf_config):
    """A Hugging Face folder's tensors (`headers`: meta tensors of the shapes its weights files
    name) against the model `config` describes, built on the meta device: a shape that differs or a
    tensor missing is one line before any weight is allocated (a config.json asking for billions of
    positions is refused, not allocated)."""
    spec = spec_of(config.architecture)
    try:
        ours, _ = spec.hf.from_hf(headers, hf_config)
    except ConversionError as e:
        raise ConversionError(f"{path}: {e}") from None
    with torch.device("meta"):
        model = spec.model(config)
    check_fits(model, ours, path)

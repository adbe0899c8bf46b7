"""Which local file or folder a model path names, the one rule every reader of a trained model
and of a tokenizer goes through (turing.pretrained, the job config's bert_model_file and
bert_token_file, every tool's --model and --tokenizer): `resolve_model_path`. Imports neither torch
nor transformers, so that tools/prepare_data.py (whose workers are forked before torch is loaded)
reads it too.

A path that exists is read as it is; else a model id (`NAME` or `ORG/NAME`) is
the snapshot its `refs/main` names in the local Hugging Face cache (`hub_cache`), never
downloaded: an id not there is one error line with the command that fetches it. A
sentence-transformers folder (a `modules.json`) is read through its Transformer module's folder
(config.json, weights and tokenizer there; the pooling and the other modules are not the MLM's).
"""
import json
import os
import re

from turing.errors import CheckpointNotFoundError, ConversionError
from turing.jsonfile import read_json

MODEL_ID = re.compile(r"^(?:\w[\w.-]*/)?\w[\w.-]*$")   # huggingface_hub's repo ids: NAME or ORG/NAME
MODULES_FILE = "modules.json"                          # a sentence-transformers folder's modules, in order
ST_TRANSFORMER = "sentence_transformers.models.Transformer"


def folder_model_type(path):
    """The model_type of the config.json in folder `path`, None where there is none (or it is unreadable)."""
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
    Hugging Face model (`load_hf_folder` reads the model types the registry's adapters import and
    names the others)."""
    return isinstance(folder_model_type(path), str)


def hub_cache():
    """The local Hugging Face cache folder, as huggingface_hub finds it: HF_HUB_CACHE, else
    HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. Read from
    the environment at each call (huggingface_hub's constants are fixed when it is imported)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return os.path.expanduser(os.path.join(os.environ.get("HF_HOME") or os.path.join(cache_home, "huggingface"), "hub"))


def is_model_id(name):
    """True where `name` has the form of a Hugging Face model id (NAME or ORG/NAME, at most 96
    characters, no `--` or `..`), as huggingface_hub checks one."""
    return bool(MODEL_ID.match(name)) and "--" not in name and ".." not in name and len(name) <= 96


def _fetch_hint(model_id):
    return (f"fetch it with `hf download {model_id}` (huggingface_hub's command line; `huggingface-cli download "
            f"{model_id}` before its 1.0), or give the path of a local folder")


def _cache_folder(model_id):
    return os.path.join(hub_cache(), "models--" + model_id.replace("/", "--"))


def cached_model(model_id):
    """The folder of `model_id` in the local Hugging Face cache (hub_cache: models--ORG--NAME/
    snapshots/COMMIT, COMMIT as refs/main names it; a model fetched at a pinned revision has no
    refs/main, and then its one snapshot), or None where the cache has no copy of it. Nothing is
    downloaded: a copy that is not whole is one error line with the command that fetches it."""
    repo = _cache_folder(model_id)
    if not os.path.isdir(repo):
        return None
    ref, snapshots = os.path.join(repo, "refs", "main"), os.path.join(repo, "snapshots")
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as f:
            commits = [f.read().strip()]
    else:
        commits = sorted(os.listdir(snapshots)) if os.path.isdir(snapshots) else []
    folder = os.path.join(snapshots, commits[0]) if len(commits) == 1 and commits[0] else None
    if folder is None or not os.path.isdir(folder):
        found = "refs/main names no snapshot folder" if os.path.isfile(ref) else \
            f"no refs/main and {len(commits)} snapshots"
        raise CheckpointNotFoundError(f"{repo}: the Hugging Face cache's copy of {model_id} is not whole ({found}); "
                                      f"{_fetch_hint(model_id)}")
    return folder


def _transformer_module(folder):
    """The folder of a sentence-transformers folder's Transformer module (modules.json's entry of
    type sentence_transformers.models.Transformer: its `path`, "" for the folder itself); `folder`
    itself where it has no modules.json."""
    modules_file = os.path.join(folder, MODULES_FILE)
    if not os.path.isfile(modules_file):
        return folder
    modules = read_json(modules_file, "sentence-transformers modules.json", ConversionError)
    entries = [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []
    transformer = next((m for m in entries if m.get("type") == ST_TRANSFORMER), None)
    if transformer is None:
        raise ConversionError(f"{modules_file}: no module of type {ST_TRANSFORMER} (the encoder, whose folder holds "
                              f"config.json and the weights); expected a sentence-transformers model's list of modules")
    path = transformer.get("path", "")
    module = os.path.normpath(os.path.join(folder, path)) if isinstance(path, str) else None
    if module is None or os.path.relpath(module, folder).startswith(os.pardir) or not is_hf_folder(module):
        raise ConversionError(f"{modules_file}: the {ST_TRANSFORMER} module's path {path!r} is not a folder inside "
                              f"{folder} with a config.json naming a model_type")
    return module


def resolve_model_path(path, tried=()):
    """The local file or folder a model path names, the one rule every reader of a trained model
    goes through: `path` as given where it exists (a local path wins over a model id), else the
    model id's folder in the local Hugging Face cache (`cached_model`); a sentence-transformers
    folder then by its Transformer module's folder. `tried`: other paths the caller looked at,
    which the not-found line names. Nothing is read over the network."""
    path = os.fspath(path)
    if os.path.exists(path):
        return _transformer_module(path) if os.path.isdir(path) else path
    where = "".join(f", nor {other}" for other in tried)
    if not is_model_id(path):
        raise CheckpointNotFoundError(f"{path}: not found{where}; expected a checkpoint folder of this project, a "
                                      f"state dict file (.pt/.bin), a Hugging Face folder or the id of a model in "
                                      f"the Hugging Face cache")
    snapshot = cached_model(path)
    if snapshot is None:
        raise CheckpointNotFoundError(f"{path}: no such file or folder{where}, and no model {path} in the Hugging Face "
                                      f"cache {hub_cache()} (no {os.path.basename(_cache_folder(path))} there); "
                                      f"{_fetch_hint(path)}")
    folder = _transformer_module(snapshot)
    if not is_hf_folder(folder):
        raise CheckpointNotFoundError(f"{folder}: the Hugging Face cache's copy of {path} has no config.json naming "
                                      f"a model_type; {_fetch_hint(path)}")
    return folder

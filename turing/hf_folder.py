"""Reading a Hugging Face model folder (`save_pretrained`'s layout: an export of ours or a stock
model, as published): its config.json, the architecture whose adapter imports it (turing.arch.hf_spec, by model_type), the
tensor names in its weights files (`hf_folder_config`) and its weights in our names
(`load_hf_folder`).

A model path is resolved by turing/model_path.py (a local path, a model id in the Hugging Face
cache, a sentence-transformers folder).

Weights: model.safetensors or the shards model.safetensors.index.json names; where a folder has
none, pytorch_model.bin or the shards pytorch_model.bin.index.json names, read with torch's
weights-only unpickler (turing.checkpoint_files.read_torch_file): a pickle that would build anything but
tensors and plain values is refused in one line naming the file, and nothing in it runs. Every
tensor must be finite (turing.checkpoint_files.check_finite).
"""
import json
import os

import torch

from turing.arch import hf_spec
from turing.arch.hf_common import config_dict
from turing.checkpoint_files import check_finite, read_torch_file
from turing.errors import CheckpointNotFoundError, ConversionError
from turing.model_path import folder_model_type

# (the single file, the index of its shards), in the order they are read: safetensors first
WEIGHT_FILES = (("model.safetensors", "model.safetensors.index.json"),
                ("pytorch_model.bin", "pytorch_model.bin.index.json"))


def _adapter(folder):
    """The HFAdapter of the folder's model_type (turing.arch); another model_type is one error line."""
    return hf_spec(folder_model_type(folder), folder).hf


def _shard_files(folder, index):
    """The files an index of shards names (its weight_map's values), each present and inside the
    folder: a name is a path within it, never `..` or absolute (a file in it may be a link, as the
    Hugging Face cache's are)."""
    try:
        with open(index, encoding="utf-8") as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.normpath(os.path.join(folder, name)) for name in names]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConversionError(f"{index}: not an index of weights shards (a JSON object with a 'weight_map' of "
                              f"tensor name -> file name; {type(e).__name__}: {e})") from None
    outside = next((name for name, path in zip(names, files)
                    if os.path.isabs(name) or os.path.relpath(path, folder).startswith(os.pardir)), None)
    if outside is not None:
        raise ConversionError(f"{index}: names {outside!r}, a file outside {folder}; the shards of an index are "
                              f"files of its folder")
    missing = [path for path in files if not os.path.isfile(path)]
    if missing:
        raise ConversionError(f"{missing[0]}: not found (named by {os.path.basename(index)})")
    return files


def _weight_files(folder):
    """The weights files of a Hugging Face folder: model.safetensors or the shards its index
    names; where there is neither, pytorch_model.bin or the shards its index names."""
    for single, index in WEIGHT_FILES:
        if os.path.isfile(os.path.join(folder, single)):
            return [os.path.join(folder, single)]
        if os.path.isfile(os.path.join(folder, index)):
            return _shard_files(folder, os.path.join(folder, index))
    raise CheckpointNotFoundError(f"{folder}: no model.safetensors or pytorch_model.bin (nor the index of their "
                                  "shards); expected a folder written by tools/export_hf.py or save_pretrained")


def _read_safetensors(path, read):
    """read(path) with safetensors (`load_file`, or the header); a damaged file is one line."""
    try:  # optional: only for reading Hugging Face folders
        from safetensors import SafetensorError
    except ImportError as e:
        raise ConversionError(f"{path}: reading safetensors needs the 'safetensors' package ({e})") from None
    try:
        return read(path)
    except SafetensorError as e:  # a truncated, empty or damaged file
        raise ConversionError(f"{path}: not a complete safetensors file ({os.path.getsize(path)} bytes: {e}); "
                              "export it again") from None


def _safetensors_tensors(path):
    from safetensors.torch import load_file
    return load_file(path)


def _safetensors_headers(path):
    """{name: a tensor on the meta device with the shape and dtype the header gives}: nothing allocated."""
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return {name: torch.empty(f.get_slice(name).get_shape(), dtype=_SAFETENSORS_DTYPES.get(
            f.get_slice(name).get_dtype(), torch.float32), device="meta") for name in f.keys()}


# safetensors' dtype names -> torch's (those a weights file of a model holds; another reads as float32 for shapes)
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                       "BOOL": torch.bool}


def _read_torch_bin(path):
    """The state dict in a pytorch_model.bin (or one of its shards), read weights-only
    (read_torch_file: a pickle of anything else is refused unread, a damaged file is one line)."""
    state = read_torch_file(path)
    if not isinstance(state, dict):
        raise ConversionError(f"{path}: expected a state dict (tensor name -> tensor), found {type(state).__name__}")
    odd = next((key for key, value in state.items() if not (isinstance(key, str) and torch.is_tensor(value))), None)
    if odd is not None:
        raise ConversionError(f"{path}: {odd!r} is not a tensor name with a tensor; expected a state dict "
                              "(tensor name -> tensor)")
    return state


def _tensors(path):
    return _read_safetensors(path, _safetensors_tensors) if path.endswith(".safetensors") else _read_torch_bin(path)


def _tensor_headers(path):
    """A weights file's tensors as meta tensors (names, shapes, dtypes; nothing allocated): a
    safetensors file's header alone; a .bin has no header, so it is loaded whole, weights-only (its
    tensors are read and dropped)."""
    if path.endswith(".safetensors"):
        return _read_safetensors(path, _safetensors_headers)
    return {name: tensor.to("meta") for name, tensor in _read_torch_bin(path).items()}


def hf_folder_config(folder):
    """(our config, the config.json dict, {tensor name: a meta tensor of its shape and dtype} of its
    weights files) of a Hugging Face folder: what `turing.pretrained` says of one, and checks its
    shapes against, before anything is allocated. Safetensors files: their headers only; a
    pytorch_model.bin: loaded weights-only for its names, so that a pickle it holds is refused
    here, before any work."""
    folder = os.fspath(folder)
    files = _weight_files(folder)
    names = {name: tensor for path in files for name, tensor in _tensor_headers(path).items()}
    adapter = _adapter(folder)
    cfg = config_dict(folder)
    try:
        return adapter.config_from_hf(cfg), cfg, names
    except ConversionError as e:
        raise ConversionError(f"{folder}: {e}") from None


def load_hf_folder(folder):
    """(state_dict, config) of a Hugging Face folder (an export of ours, or a stock model of a class
    an architecture's adapter imports), through the adapter of its model_type (turing.arch)."""
    folder = os.fspath(folder)
    files = _weight_files(folder)
    adapter = _adapter(folder)
    hf_state = {}
    for path in files:
        hf_state.update(check_finite(_tensors(path), path))
    try:
        return adapter.from_hf(hf_state, config_dict(folder))
    except ConversionError as e:
        raise ConversionError(f"{folder}: {e}") from None

"""The two pretraining data formats on disk, each defined once: its file names, keys and
separator, and the checks that tell a folder of it and a file of it apart from anything else.
The providers read them, tools.prepare_data writes them and testkit makes tiny ones, all from
here. numpy and h5py only (prepare_data does not import torch).

NVIDIA hdf5 shards, as NVIDIA's create_pretraining_data.py writes them, one `.hdf5` file each:
input_ids int32 [N, L], input_mask int8 [N, L], segment_ids int8 [N, L],
masked_lm_positions int32 [N, P], masked_lm_ids int32 [N, P] (right-padded with 0),
next_sentence_labels int8 [N] (1 = B is a random sentence). Any integer dtype is read.

Bing numpy shards, one folder each:
    data.npy              uint8: utf-8 bytes of every token of every instance, concatenated
    instance_offsets.npy  (N+1,) byte offsets: instance i is data[off[i]:off[i+1]]
    tokens_split.npy      (N,) number of tokens of segment A (the rest is segment B)
    is_next.npy           (N,) 1 = B is a random next segment, 0 = the real continuation
and one of two token layouts:
    separator layout      tokens inside an instance are separated by the byte BING_SEPARATOR (0x1f)
    offsets layout        instance_token_offsets.npy (N+1,) indexes token_offsets.npy, the
                          in-instance byte offsets where each token after the first begins
The reader (with its checks) is turing.dataset.BingShard.
"""
import contextlib
import os

import h5py
import numpy as np

from turing.errors import InputValueError

# ---------------------------------------------------------------------------------------------
# NVIDIA hdf5

HDF5_SUFFIXES = (".hdf5", ".h5")
HDF5_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
             "next_sentence_labels")
HDF5_DTYPES = {"input_ids": np.int32, "input_mask": np.int8, "segment_ids": np.int8, "masked_lm_positions": np.int32,
               "masked_lm_ids": np.int32, "next_sentence_labels": np.int8}   # what NVIDIA's tool (and ours) write


def _check_hdf5_layout(path, f, max_seq_length=None):
    """Keys, ranks, shapes and integer dtypes of an open shard, without reading the data; the
    sequence length must be `max_seq_length` when given."""
    missing = [k for k in HDF5_KEYS if k not in f]
    if missing:
        raise InputValueError(f"{path}: hdf5 shard lacks dataset(s) {', '.join(missing)}; "
                         f"expected {', '.join(HDF5_KEYS)} (NVIDIA create_pretraining_data.py layout)")
    for key in HDF5_KEYS:
        if f[key].dtype.kind not in "iu":
            raise InputValueError(f"{path}: {key} has dtype {f[key].dtype}; expected an integer dtype")
    ids = f["input_ids"].shape
    if len(ids) != 2:
        raise InputValueError(f"{path}: input_ids has shape {ids}; expected [N, seq_len]")
    if max_seq_length is not None and ids[1] != max_seq_length:
        raise InputValueError(f"{path}: sequences of length {ids[1]}, but --max_seq_length is {max_seq_length}; "
                         f"use shards made for {max_seq_length}")
    n = ids[0]
    for key in ("input_mask", "segment_ids"):
        if f[key].shape != ids:
            raise InputValueError(f"{path}: {key} has shape {f[key].shape}; expected {ids} like input_ids")
    preds = f["masked_lm_positions"].shape
    if len(preds) != 2 or preds[0] != n or f["masked_lm_ids"].shape != preds:
        raise InputValueError(f"{path}: masked_lm_positions {preds} and masked_lm_ids {f['masked_lm_ids'].shape} "
                         f"must both be [N={n}, max_predictions]")
    if f["next_sentence_labels"].shape != (n,):
        raise InputValueError(f"{path}: next_sentence_labels has shape {f['next_sentence_labels'].shape}; "
                         f"expected ({n},)")


@contextlib.contextmanager
def _open_checked(path, max_seq_length=None):
    """The open shard with its layout checked; an unreadable file (at open or while reading
    inside the block) becomes one ValueError naming it."""
    try:
        with h5py.File(path, "r") as f:
            _check_hdf5_layout(path, f, max_seq_length)
            yield f
    except OSError as e:
        raise InputValueError(f"{path}: cannot read hdf5 shard ({e}); the file may be truncated or not hdf5") from None


def check_hdf5_shard(path, max_seq_length=None):
    """Open a shard and check its layout (cheap: reads no data); returns the sample count."""
    with _open_checked(path, max_seq_length) as f:
        return f["input_ids"].shape[0]


def _check_values(path, arrays):
    """Values no shard can mean: negative token ids, masks/segments/NSP labels outside {0, 1},
    masked positions outside the sequence."""
    length = arrays["input_ids"].shape[1]
    positions = arrays["masked_lm_positions"]
    if positions.size and (positions.min() < 0 or positions.max() >= length):
        raise InputValueError(f"{path}: masked_lm_positions outside [0, {length})")
    for key in ("input_ids", "masked_lm_ids"):
        if arrays[key].size and arrays[key].min() < 0:
            row = int(np.argwhere(arrays[key] < 0)[0][0])
            raise InputValueError(f"{path}: {key} holds token id {int(arrays[key].min())} (row {row}); token ids are >= 0")
    for key, meaning in (("input_mask", "1 = real token, 0 = padding"), ("segment_ids", "0 = segment A, 1 = B"),
                         ("next_sentence_labels", "1 = B is random, 0 = B follows A")):
        bad = (arrays[key] != 0) & (arrays[key] != 1)
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise InputValueError(f"{path}: {key} holds {int(arrays[key][bad][0])} (row {row}); expected 0 or 1 ({meaning})")
    _check_masked_positions(path, arrays)


def _check_masked_positions(path, arrays):
    """A shard the MLM can learn from: every row has real tokens; a row's masked positions (its
    listing ends at the first 0, as position 0 is [CLS]) are increasing, so none is masked twice,
    and inside its real tokens, not in the padding; and some row has one (a shard without any
    trains the NSP head alone)."""
    real = arrays["input_mask"].sum(axis=1)
    if len(real) and (real == 0).any():
        row = int(np.flatnonzero(real == 0)[0])
        raise InputValueError(f"{path}: row {row} has no tokens (input_mask all 0, {int((real == 0).sum())} such rows); "
                              f"every sequence holds at least [CLS] and [SEP]")
    positions = arrays["masked_lm_positions"]
    listed = np.cumprod(positions != 0, axis=1).astype(bool)           # up to each row's first 0
    if positions.size and not listed.any():
        raise InputValueError(f"{path}: no masked position in any row (masked_lm_positions all 0): the MLM loss "
                              f"would be 0 throughout; make the shard with masking (prepare_data --masked_lm_prob)")
    later = listed[:, 1:]
    repeated = later & (np.diff(positions, axis=1) <= 0)
    if repeated.any():
        row, col = (int(v) for v in np.argwhere(repeated)[0])
        raise InputValueError(f"{path}: masked_lm_positions of row {row} are not increasing ({int(positions[row, col])} "
                              f"then {int(positions[row, col + 1])}): a token masked twice, or an unsorted listing")
    in_padding = listed & (positions >= real[:, None])
    if in_padding.any():
        row, col = (int(v) for v in np.argwhere(in_padding)[0])
        raise InputValueError(f"{path}: masked_lm_positions of row {row} hold {int(positions[row, col])}, in the "
                              f"padding (the row has {int(real[row])} real tokens)")


def read_hdf5_shard(path, max_seq_length=None):
    """Read and check one shard (layout, sequence length when given, values); returns a dict
    of numpy arrays keyed by HDF5_KEYS.

    Module-level so the background process pool can run it.
    """
    with _open_checked(path, max_seq_length) as f:
        arrays = {k: np.asarray(f[k][:]) for k in HDF5_KEYS}
    _check_values(path, arrays)
    return arrays


def holds_nvidia_validation(path):
    """Whether the folder holds NVIDIA hdf5 files (a validation set of this format)."""
    return any(f.endswith(HDF5_SUFFIXES) for f in os.listdir(path))


# ---------------------------------------------------------------------------------------------
# Bing numpy shards

BING_SEPARATOR = 0x1F
BING_SHARD_FILES = ("data.npy", "instance_offsets.npy", "tokens_split.npy", "is_next.npy")
BING_OFFSET_FILES = ("instance_token_offsets.npy", "token_offsets.npy")


def is_bing_shard(folder):
    """True if `folder` looks like a Bing shard folder (holds data.npy)."""
    return os.path.isfile(os.path.join(folder, BING_SHARD_FILES[0]))


def holds_bing_validation(path):
    """Whether the folder is a Bing shard folder or holds one (a validation set of this format)."""
    return is_bing_shard(path) or any(is_bing_shard(os.path.join(path, d)) for d in os.listdir(path))


def token_storage_problem(vocab, fmt, bing_layout="separator"):
    """Why a tokenizer's tokens (`vocab`: token -> id) cannot be stored in shard format `fmt`, with
    the format or layout to use instead; None where they can. NVIDIA hdf5 stores ids, any
    tokenizer's; a Bing shard stores token strings, which the reader maps back to ids: each must
    be a non-empty string, and free of the separator byte 0x1f in the separator layout."""
    if fmt != "bing":
        return None
    empty = [i for t, i in vocab.items() if t == ""]
    if empty:
        return (f"id {empty[0]} is the empty string, which a Bing shard cannot store (its reader knows tokens by "
                f"their strings); use --format nvidia, which stores ids")
    if bing_layout == "separator":
        bad = next((t for t in vocab if chr(BING_SEPARATOR) in t), None)
        if bad is not None:
            return f"token {bad!r} holds the separator byte 0x1f; use --bing_layout offsets"
    return None

"""Checkpoint folders: what a complete checkpoint is, which one a resume or an export reads, how
old ones are pruned, and reading their weights safely.

A run's checkpoints live in OUT/saved_models/JOB/TAG. Tags: epoch{E}_step{S} after an epoch,
step{S} for interval and stop checkpoints (mid-epoch, with the position inside it). A tag folder
is complete once COMPLETE_MARKER is in it; only then does `latest` (written atomically) name it.
Before any engine file of it is written, WRITING_MARKER goes in: a folder with that marker and
without the complete one is this program's unfinished write (a run killed while saving), which
is no checkpoint at all, not even where no complete one is beside it (a run killed in its first
save starts fresh under --auto_resume). Folders without either marker (the original program's, DeepSpeed's own, copies) are read only when no
complete checkpoint is beside them, and only once they load. One rule picks the checkpoint for
every reader (`resume_candidates`): the trainer's resume, `--use_pretrain` of a checkpoint folder,
tools/export_hf.py and tools/finetune_glue.py.

No file a user hands us runs code. Every torch file is read weights-only: tensors, plain
containers, numbers and strings, plus the few classes DeepSpeed's own checkpoints hold
(`checkpoint_globals`), never the full unpickler, which runs whatever a crafted file asks
(an object whose __reduce__ calls os.system). Before the engine or DeepSpeed's converters read
a checkpoint, `check_weights_only` reads every *.pt of it that way and refuses the checkpoint
in one line naming the file and the object it holds; the readers themselves run under
`weights_only_loads`, which makes torch.load weights-only even where DeepSpeed asks for the
full unpickler, so a file changed after the check cannot run code either. The full unpickler
is used only when the user says they trust the files (--trust_checkpoint).

Weights that hold NaN or Infinity (a run that diverged) are refused by every reader of weights
(`load_checkpoint_state`, `read_state_dict_file`, and `turing.hf_folder.load_hf_folder`), in one
line naming the file and the tensor (`check_finite`): no tool scores, exports or trains from them.
"""
import contextlib
import logging
import os
import pickle
import re
import shutil
import zipfile

import numpy as np
import torch

from turing.errors import CheckpointNotFoundError, ConversionError, InputValueError, UnsafeCheckpointError
from turing.internals import numpy_reconstruct
from turing.jsonfile import _fsync, read_json, write_atomic  # noqa: F401 (write_atomic: re-exported)
from turing.kernel_layout import from_transformer_kernel_layout

logger = logging.getLogger(__name__)

MODEL_STATES_FILE = "mp_rank_00_model_states.pt"  # ZeRO stages 0-2: the whole module, model-parallel rank 0
ZERO3_MODEL_STATES_FILE = "zero_pp_rank_0_mp_rank_00_model_states.pt"  # ZeRO stage 3: rank 0's partition
COMPLETE_MARKER = "checkpoint_complete.json"
WRITING_MARKER = "checkpoint_writing.json"  # in the folder before its engine files: being written
ENGINE_FILE_SUFFIX = "model_states.pt"   # every DeepSpeed checkpoint has a *model_states.pt
FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"  # torch: every torch.load weights-only, whatever it is asked
TRUST_FLAG = "--trust_checkpoint"  # the user trusts the files: the full unpickler

def sync_folder(folder):
    """fsync every file under `folder`, then the folders (so their new entries last too)."""
    for root, _, files in os.walk(folder):
        for name in files:
            _fsync(os.path.join(root, name))
        _fsync(root)


def check_finite(state_dict, path):
    """`state_dict` unchanged, or a ConversionError naming `path` and its first tensor that holds
    NaN or Infinity: the weights of a run that diverged, which no reader scores, exports or trains
    from (every reader of weights here calls this)."""
    for key, value in state_dict.items():
        if torch.is_tensor(value) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            nan, inf = int(torch.isnan(value).sum()), int(torch.isinf(value).sum())
            raise ConversionError(f"{path}: tensor {key} is not finite ({nan} NaN and {inf} infinite of its "
                                  f"{value.numel()} values): the weights of a run that diverged; use an earlier "
                                  "checkpoint")
    return state_dict


def step_of(tag):
    match = re.fullmatch(r"(?:epoch\d+_)?(?:global_)?step(\d+)", tag)
    return int(match.group(1)) if match else -1


def tag_order(tag):
    return step_of(tag), tag.startswith("epoch")


def complete_tags(path):
    """Complete checkpoint tags in a folder, oldest first (by global step)."""
    if not os.path.isdir(path):
        return []
    tags = [d for d in os.listdir(path) if os.path.isfile(os.path.join(path, d, COMPLETE_MARKER))]
    return sorted(tags, key=tag_order)


def unfinished_write(folder):
    """Whether `folder` is this program's checkpoint write that never finished (its run died saving)."""
    return (os.path.isfile(os.path.join(folder, WRITING_MARKER))
            and not os.path.isfile(os.path.join(folder, COMPLETE_MARKER)))


def engine_tags(path):
    """Tag folders holding DeepSpeed engine files, complete or not, oldest first; this program's
    unfinished writes are not among them."""
    if not os.path.isdir(path):
        return []
    tags = [d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))
            and any(f.endswith(ENGINE_FILE_SUFFIX) for f in os.listdir(os.path.join(path, d)))
            and not unfinished_write(os.path.join(path, d))]
    return sorted(tags, key=tag_order)


def unfinished_tags(path):
    """Tag folders of this program's checkpoint writes that never finished, oldest first."""
    if not os.path.isdir(path):
        return []
    return sorted((d for d in os.listdir(path) if unfinished_write(os.path.join(path, d))), key=tag_order)


def holds_checkpoints(path):
    """Whether `path` holds a checkpoint of any kind: ours, the original's, DeepSpeed's, a copy
    (an unfinished write of ours is none)."""
    return bool(engine_tags(path)) or os.path.isfile(os.path.join(path, "latest"))


def checkpoint_damage(folder):
    """Why the checkpoint in `folder` cannot load, found without loading it; None when it looks
    whole. A torch file is a zip archive whose directory sits at its end: cut short, it has none."""
    names = sorted(os.listdir(folder))
    if not any(n.endswith(ENGINE_FILE_SUFFIX) for n in names):
        return f"no {MODEL_STATES_FILE} (no *{ENGINE_FILE_SUFFIX} file)"
    for name in (n for n in names if n.endswith(".pt")):
        with open(os.path.join(folder, name), "rb") as f:
            head = f.read(4)
        if not head:
            return f"{name} is empty"
        if head == b"PK\x03\x04":  # torch's zip format (the legacy pickle format is left to the loader)
            try:
                zipfile.ZipFile(os.path.join(folder, name)).close()
            except zipfile.BadZipFile:
                return f"{name} is cut short or damaged"
    return None


def prune_interval_checkpoints(path, keep_last, keep):
    """Remove all but the newest `keep_last` step{S} checkpoints; never `keep` (the latest)."""
    if keep_last <= 0:
        return
    interval = [t for t in complete_tags(path) if t.startswith("step")]
    for tag in interval[:-keep_last]:
        if tag != keep:
            shutil.rmtree(os.path.join(path, tag), ignore_errors=True)
            logger.info("Removed old interval checkpoint %s", tag)


def not_loadable(folder, why):
    """The warning for a checkpoint a resume passes over, as logger arguments: one wording whether its
    files are seen to be damaged (`resume_candidates`) or the engine fails on them (the trainer's restore)."""
    return "Checkpoint %s cannot be loaded (%s)", folder, why


def none_loadable(path, reasons, folder_flag="--load_training_checkpoint"):
    """The error when no checkpoint in `path` loads; `reasons`: 'TAG: why' for each one passed over.
    The fix it names is the trainer's (its own folder: start fresh or another job) unless
    `folder_flag` names a tool's flag (None: a tool's model argument, "point it at another checkpoint")."""
    if folder_flag == "--load_training_checkpoint":
        fix = "move the folder away to start fresh, or give another --job_name"
    else:
        fix = "point " + (folder_flag or "it") + " at another checkpoint"
    return f"{path}: no checkpoint there can be loaded ({'; '.join(reasons)}); {fix}"


def resume_candidates(path, tag, warn=logger.warning, folder_flag="--load_training_checkpoint",
                      tag_flag="--load_checkpoint_id"):
    """The checkpoint tags in `path` to try, best first, for a resume from `tag` (None or
    'latest': the tag the latest file names, else the newest). The flags named in errors are
    the caller's.

    Where the folder holds complete checkpoints, only they count (a tag without the marker was
    being written when its run died); a folder without any (written by the original program,
    by DeepSpeed directly, or copied without the markers) offers every tag folder with engine
    files. The tag asked for comes first; older ones follow as fall-backs. Tags whose files are
    cut short are left out, with a warning; none left is an InputError.
    """
    if not os.path.isdir(path):
        raise CheckpointNotFoundError(f"{path}: checkpoint folder not found"
                                      + (f" ({folder_flag})" if folder_flag else ""))
    complete = complete_tags(path)
    pool = complete or engine_tags(path)
    if tag in (None, "latest"):
        latest = os.path.join(path, "latest")
        if os.path.isfile(latest):
            with open(latest) as f:
                tag = f.read().strip()
        elif pool:
            tag = pool[-1]
        else:
            raise CheckpointNotFoundError(f"{path}: no checkpoint there (no 'latest' file, no tag folder with "
                                          f"*{ENGINE_FILE_SUFFIX}); give {tag_flag + ' TAG' if tag_flag else 'a tag'} or another folder")
    elif not os.path.isdir(os.path.join(path, tag)):
        tags = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
        raise CheckpointNotFoundError(f"{os.path.join(path, tag)}: checkpoint tag '{tag}' not found"
                                      + (f" ({tag_flag})" if tag_flag else "") + "; "
                                      f"tags there: {', '.join(tags) or 'none'}")
    folder = os.path.join(path, tag)
    if tag not in pool:
        warn("Checkpoint %s is missing or incomplete (no %s: killed while writing?)", folder, COMPLETE_MARKER)
    elif not complete:
        warn("Checkpoint %s has no %s (written by the original program, by DeepSpeed directly, or copied "
             "without it): resuming from it if it loads", folder, COMPLETE_MARKER)
    candidates = ([tag] if tag in pool else []) + [
        t for t in reversed(pool) if t != tag and (tag_order(t) <= tag_order(tag) or step_of(tag) < 0)]
    usable, damaged = [], []
    if tag not in pool and os.path.isdir(folder):
        damaged.append(f"{tag}: {checkpoint_damage(folder) or 'incomplete'}")
    for candidate in candidates:
        damage = checkpoint_damage(os.path.join(path, candidate))
        if damage is None:
            usable.append(candidate)
        else:
            damaged.append(f"{candidate}: {damage}")
            warn(*not_loadable(os.path.join(path, candidate), damage))
    if not usable:
        raise InputValueError(none_loadable(path, damaged or [f"{tag} incomplete"], folder_flag))
    if usable[0] != tag:
        warn("Resuming from %s instead of %s", os.path.join(path, usable[0]), tag)
    return usable


def _read_json_if_present(path):
    return read_json(path, "file", ConversionError) if os.path.isfile(path) else None


def resolve_checkpoint_tag_dir(checkpoint_dir, tag=None, folder_flag=None, tag_flag=None):
    """The folder of the checkpoint to read weights from: checkpoint_dir itself when it is a tag
    folder (holds MODEL_STATES_FILE, or ZeRO stage 3's partitions), else the first of `resume_candidates` (the trainer's rule:
    the tag asked for or the one `latest` names, complete checkpoints first, an older loadable
    one where it is cut short, with a warning)."""
    checkpoint_dir = os.fspath(checkpoint_dir)
    if not os.path.isdir(checkpoint_dir):
        raise CheckpointNotFoundError(f"{checkpoint_dir}: checkpoint folder not found")
    if tag is None and any(os.path.isfile(os.path.join(checkpoint_dir, f))
                           for f in (MODEL_STATES_FILE, ZERO3_MODEL_STATES_FILE)):
        return checkpoint_dir
    notes = []  # warnings, given only when a checkpoint is found (an error stays one line)
    usable = resume_candidates(checkpoint_dir, tag, warn=lambda *note: notes.append(note), folder_flag=folder_flag,
                               tag_flag=tag_flag)
    for note in notes:
        logger.warning(*note)
    return os.path.join(checkpoint_dir, usable[0])


def numpy_array_globals():
    """What unpickling a numpy array needs (older checkpoints' client states hold numpy RNG
    states); allowed in weights-only loads."""
    return [numpy_reconstruct(), np.ndarray, np.dtype] + [
        getattr(np.dtypes, name) for name in ("UInt32DType", "Float64DType", "Int64DType")
        if hasattr(getattr(np, "dtypes", None), name)]


def checkpoint_globals():
    """The classes besides tensors and plain values that DeepSpeed's checkpoints hold, allowed in
    weights-only loads: the loss scalers of the optimizer states (fp16, ZeRO), ZeRO's stage enum,
    the bf16 optimizer's fragment addresses, and numpy arrays. Allowing a class lets a file
    build an instance of it, nothing else: their constructors only store values."""
    # DeepSpeed is imported where a checkpoint is read, not with this module (slow, and it logs)
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return numpy_array_globals() + [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


@contextlib.contextmanager
def weights_only_loads(trust=False):
    """Inside: every torch.load in this process (and in child processes it starts) is
    weights-only, whatever its caller passes (torch's TORCH_FORCE_WEIGHTS_ONLY_LOAD), with
    `checkpoint_globals` allowed. DeepSpeed's engine, zero_to_fp32 and ds_to_universal ask for
    the full unpickler; here they get the weights-only one. `trust`: leave torch.load as it is."""
    if trust:
        yield
        return
    saved = os.environ.get(FORCE_WEIGHTS_ONLY)
    os.environ[FORCE_WEIGHTS_ONLY] = "1"
    try:
        with torch.serialization.safe_globals(checkpoint_globals()):
            yield
    finally:
        if saved is None:
            os.environ.pop(FORCE_WEIGHTS_ONLY, None)
        else:
            os.environ[FORCE_WEIGHTS_ONLY] = saved


def weights_only_refusal(path):
    """Why the weights-only unpickler refuses `path` (the objects it holds beyond those allowed),
    or None when it loads, or fails for another reason (a damaged file, which its reader reports
    as such). Tensors are mapped, not read."""
    try:
        with weights_only_loads():
            torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        return None
    except pickle.UnpicklingError as e:  # what the weights-only unpickler raises for what it will not build
        allowed = {f"{g.__module__}.{g.__name__}" for g in checkpoint_globals()}
        try:
            unsafe = [g for g in torch.serialization.get_unsafe_globals_in_checkpoint(path) if g not in allowed]
        except ValueError:  # torch's legacy (non-zip) format, which it does not scan
            unsafe = []
        if unsafe:
            return f"it holds {', '.join(unsafe[:3])}, which only the full unpickler builds"
        return load_error_detail(path, e)
    except Exception:  # noqa: BLE001 - damage: torch raises several types for a file it cannot read
        return None


def check_weights_only(folder, trust=False, flag=TRUST_FLAG):
    """Refuse the checkpoint in `folder` unless every *.pt under it loads weights-only (an
    UnsafeCheckpointError naming the first file that does not, and why). `trust` (the user's
    `flag`) skips the check."""
    if trust:
        logger.warning("%s: %s given: its files are unpickled in full, which runs any code they hold", folder, flag)
        return
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(f for f in files if f.endswith(".pt")):
            path = os.path.join(root, name)
            if os.path.getsize(path) == 0:
                continue  # an empty file is damage, which the readers report as such
            why = weights_only_refusal(path)
            if why is not None:
                raise UnsafeCheckpointError(refusal_message(path, why, flag))


def refusal_message(path, why, flag=None):
    """The one line refusing `path`; `flag`: the caller's flag that unpickles in full, if it has one."""
    advice = (f". If you wrote it yourself (with a DeepSpeed version that saves other objects), pass {flag} to "
              f"unpickle it in full" if flag else "")
    return (f"{path}: does not load with torch.load(weights_only=True) ({why}); it is not unpickled here, as that "
            f"could run code from the file{advice}")


def load_error_detail(path, error):
    """Why torch could not load `path`, in a few words: an empty file says so; else the first
    line of the error's message, or its type where it has none (torch gives EOFError())."""
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        return "empty file, 0 bytes: written incompletely?"
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def read_torch_file(path, trust=False, flag=None):
    """A torch file read weights-only (`weights_only_loads`); the full unpickler only with `trust`
    (the caller's `flag`, named in the refusal when it has one)."""
    if os.path.getsize(path) == 0:
        raise ConversionError(f"{path}: not a readable torch checkpoint ({load_error_detail(path, None)})")
    if not trust:
        why = weights_only_refusal(path)
        if why is not None:
            raise UnsafeCheckpointError(refusal_message(path, why, flag))
    try:
        with weights_only_loads(trust):
            return torch.load(path, map_location="cpu", weights_only=not trust)
    except Exception as e:  # noqa: BLE001
        raise ConversionError(f"{path}: not a readable torch checkpoint ({load_error_detail(path, e)})") from None


def load_checkpoint_state(checkpoint_dir, tag=None, trust=False, trust_flag=False):
    """Read the model weights of one of our DeepSpeed checkpoints, weights-only (`trust`: the
    user's --trust_checkpoint, the full unpickler; `trust_flag`: the caller has that flag, which a
    refusal then names).

    checkpoint_dir: OUT/saved_models/JOB (tag None = the one named by its `latest` file), or
    a tag folder. ZeRO stages 0-2 store the full module in TAG/mp_rank_00_model_states.pt;
    stage 3 partitions it over its ranks' files, which DeepSpeed's zero_to_fp32 gathers.
    Returns (state_dict in fp32 with the original's keys, job_config dict or None, args dict or None);
    the two dicts come from the job_config.json and args.json saved next to the checkpoint.
    """
    folder = resolve_checkpoint_tag_dir(checkpoint_dir, tag)
    path = os.path.join(folder, MODEL_STATES_FILE)
    if not os.path.isfile(path) and os.path.isfile(os.path.join(folder, ZERO3_MODEL_STATES_FILE)):
        return _gathered_zero3_state(folder, trust, trust_flag)
    if not os.path.isfile(path):
        raise CheckpointNotFoundError(f"{path}: model states file not found (expected a DeepSpeed "
                                      "checkpoint of one model-parallel rank)")
    saved = read_torch_file(path, trust, TRUST_FLAG if trust_flag else None)
    if not isinstance(saved, dict) or not isinstance(saved.get("module"), dict):
        raise ConversionError(f"{path}: no 'module' state dict in it (not a DeepSpeed model states file)")
    state = {}
    for key, value in saved["module"].items():
        if not torch.is_tensor(value):
            continue
        if value.numel() == 0:
            raise ConversionError(f"{path}: {key} is empty; a ZeRO stage 3 checkpoint keeps the weights "
                                  "partitioned: gather them first with DeepSpeed's zero_to_fp32.py")
        key = key[len("module."):] if key.startswith("module.") else key
        state[key] = value.float() if value.is_floating_point() else value
    state = from_transformer_kernel_layout(check_finite(state, path))
    job_config = _read_json_if_present(os.path.join(folder, "job_config.json"))
    args = _read_json_if_present(os.path.join(folder, "args.json"))
    logger.info("Read %d tensors from %s", len(state), path)
    return state, job_config, args


def _gathered_zero3_state(folder, trust, trust_flag=False):
    """The weights of a ZeRO stage 3 checkpoint (partitioned over its ranks' files), gathered by
    DeepSpeed's zero_to_fp32, after every file of it was checked to load weights-only and under
    `weights_only_loads` (zero_to_fp32 asks for the full unpickler)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    check_weights_only(folder, trust, TRUST_FLAG if trust_flag else None)
    parent, tag = os.path.split(os.path.normpath(folder))
    with weights_only_loads(trust):
        gathered = get_fp32_state_dict_from_zero_checkpoint(parent, tag)
    state = {k[len("module."):] if k.startswith("module.") else k: v.float() for k, v in gathered.items()}
    state = from_transformer_kernel_layout(check_finite(state, folder))
    return (state, _read_json_if_present(os.path.join(folder, "job_config.json")),
            _read_json_if_present(os.path.join(folder, "args.json")))


def read_state_dict_file(path):
    """A state dict saved with torch.save (name -> tensor; a DeepSpeed {"module": ...} file is
    unwrapped), read with torch.load(weights_only=True); a ConversionError naming the file when it
    is not one."""
    try:
        state_dict = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a file it cannot read
        raise ConversionError(f"{path}: not a torch state dict ({load_error_detail(path, e)})") from None
    state_dict = state_dict.get("module", state_dict) if isinstance(state_dict, dict) else state_dict
    if not isinstance(state_dict, dict):
        raise ConversionError(f"{path}: expected a state dict (name -> tensor), found {type(state_dict).__name__}")
    return check_finite(state_dict, path)

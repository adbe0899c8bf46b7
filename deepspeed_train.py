"""Bing BERT pretraining with DeepSpeed: the whole program, top to bottom.

Parse and check arguments -> build the model and the DeepSpeed engine -> restore a
checkpoint -> run epochs: train (the step loop), validate, checkpoint.

    deepspeed deepspeed_train.py --cf bert_config.json --deepspeed --deepspeed_config ds_config.json \
        --output_dir OUT --data_path_prefix DATA [--use_nvidia_dataset] ...

`main(argv)` also runs in-process (single rank): without the launcher's environment it
sets up a one-process group itself.
"""
import dataclasses
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from turing.dataset import MASK_SPLIT, MASKED_SHARE
from turing.jsonfile import read_json
from turing.lamb import find_lamb_coeffs
from turing.tokenization import load_vocab, vocab_size_padded
from utils import get_argument_parser, get_rank_and_world, is_time_to_exit

logger = logging.getLogger("bing_bert")

NO_DECAY_NAMES = ("bias", "LayerNorm.bias", "LayerNorm.weight",
                  # DeepSpeed transformer-kernel names
                  "attn_nw", "attn_nb", "norm_w", "norm_b", "attn_qkvb", "attn_ob", "inter_b", "output_b")
ONEBIT_OPTIMIZERS = ("onebitadam", "onebitlamb", "zerooneadam")
COOLDOWN_PROPORTION = 0.2        # WSD / budget: final share of the run spent decaying
COOLDOWN_SHAPES = ("linear", "1-sqrt")


class InputError(Exception):
    """Bad user input: reported as one line (no traceback unless --debug) and exit code 2."""


@dataclasses.dataclass
class RunState:
    """Everything that counts progress; saved whole in every checkpoint's client state."""
    epoch: int = 0                  # epochs finished (= index of the epoch in progress)
    epoch_micro_step: int = 0       # micro-batches of that epoch already trained on
    global_step: int = 0            # optimizer steps taken
    global_data_samples: int = 0    # samples seen (all ranks)
    rewarmup_offset: int = 0        # global step at which the LR warmup (re)started
    train_seconds: float = 0.0      # training wall time of earlier sessions (--max_train_hours)
    restore_step: int = 0           # global step at the restore; --max_steps counts from here
    nonfinite_in_a_row: int = 0
    nonfinite_total: int = 0

    def client_state(self):
        return {"epoch": self.epoch, "last_global_step": self.global_step,
                "last_global_data_samples": self.global_data_samples,
                "epoch_micro_step": self.epoch_micro_step, "rewarmup_offset": self.rewarmup_offset,
                "train_seconds": self.train_seconds, "nonfinite_total": self.nonfinite_total}


class StopTraining(Exception):
    """Raised out of the step loop after a checkpoint was written; carries the exit code."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


# ---------------------------------------------------------------------------------------------
# Arguments and configuration


def get_arguments(argv=None):
    import deepspeed

    parser = deepspeed.add_config_arguments(get_argument_parser())
    return parser.parse_args(argv)


def _read_json(path, what):
    return read_json(path, what, InputError)


def _require(config, keys, where):
    node = config
    for i, key in enumerate(keys):
        if not isinstance(node, dict) or key not in node:
            raise InputError(f"{where}: missing key '{'.'.join(keys[:i + 1])}'")
        node = node[key]
    return node


def resolve_vocab_file(token_file, data_path_prefix, config_file):
    """The vocab.txt named by `bert_token_file`: a file or a folder holding vocab.txt, taken as
    given, else under --data_path_prefix."""
    for candidate in (token_file, os.path.join(data_path_prefix, token_file)):
        if os.path.isdir(candidate):
            candidate = os.path.join(candidate, "vocab.txt")
        if os.path.isfile(candidate):
            return candidate
    raise InputError(f"{config_file}: bert_token_file '{token_file}' not found (as given or under "
                     f"--data_path_prefix '{data_path_prefix}'); expected a vocab.txt or a folder holding one")


def construct_arguments(argv=None):
    """Parse the command line, read and check the job config, resolve paths.

    Adds to args: config (with data.datasets and training for this sequence length),
    job_name, vocab_file, vocab_size, saved_model_path, tensorboard_path.
    """
    args = get_arguments(argv)
    config = _read_json(args.config_file, "job config (--cf)")
    seq = str(args.max_seq_length)
    datasets = _require(config, ["data", "mixed_seq_datasets"], args.config_file)
    training = _require(config, ["mixed_seq_training"], args.config_file)
    for name, table in (("data.mixed_seq_datasets", datasets), ("mixed_seq_training", training)):
        if seq not in table:
            raise InputError(f"{args.config_file}: {name} has no entry for --max_seq_length {seq}; "
                             f"entries: {', '.join(sorted(table))}")
    config["data"]["datasets"] = datasets[seq]
    config["training"] = training[seq]
    for key in ("num_epochs", "learning_rate", "warmup_proportion", "total_training_steps"):
        _require(config, ["training", key], f"{args.config_file} (mixed_seq_training.{seq})")
    if args.lr_schedule in ("LE", "EE"):
        for key in ("decay_rate", "decay_step"):
            _require(config, ["training", key], f"{args.config_file} (mixed_seq_training.{seq})")
    _require(config, ["bert_model_config"], args.config_file)
    check_recipe(args, config["training"], f"{args.config_file} (mixed_seq_training.{seq})")
    args.config = config
    args.job_name = args.job_name or config.get("name") or "bing_bert"
    args.vocab_file = resolve_vocab_file(_require(config, ["bert_token_file"], args.config_file),
                                         args.data_path_prefix, args.config_file)
    args.vocab_size = vocab_size_padded(len(load_vocab(args.vocab_file)))
    args.saved_model_path = os.path.join(args.output_dir, "saved_models", args.job_name)
    args.tensorboard_path = os.path.join(args.output_dir, "runs", args.job_name)
    if args.deepspeed_config is None:
        raise InputError("--deepspeed_config is required (a DeepSpeed JSON config, e.g. ds_config.json)")
    args.ds_config = _read_json(args.deepspeed_config, "DeepSpeed config (--deepspeed_config)")
    if args.progressive_layer_drop and "progressive_layer_drop" not in args.ds_config:
        raise InputError(f"{args.deepspeed_config}: --progressive_layer_drop needs a 'progressive_layer_drop' "
                         f"block ({{\"enabled\": true, \"theta\": 0.5, \"gamma\": 0.001}})")
    if args.max_predictions_per_seq > args.max_seq_length:
        raise InputError(f"--max_predictions_per_seq {args.max_predictions_per_seq} exceeds "
                         f"--max_seq_length {args.max_seq_length}")
    return args


def check_recipe(args, training, where):
    """The recipe switches of a training entry (each optional, default = the original's recipe)
    and the flags that depend on them; sets args.next_sentence_prediction. masked_lm_prob and
    mask_split are the Bing provider's dynamic masking; NVIDIA shards carry the masking they
    were made with (tools/prepare_data.py --masked_lm_prob)."""
    prob = training.get("masked_lm_prob", MASKED_SHARE)
    if not isinstance(prob, (int, float)) or not 0 < prob <= 1:
        raise InputError(f"{where}: masked_lm_prob must be a number in (0, 1], got {prob!r}")
    split = training.get("mask_split", list(MASK_SPLIT))
    if (not isinstance(split, list) or len(split) != 3 or not all(isinstance(v, (int, float)) and v >= 0 for v in split)
            or abs(sum(split) - 1.0) > 1e-6):
        raise InputError(f"{where}: mask_split must be [mask, random, keep] shares summing to 1 "
                         f"(the original's [0.8, 0.1, 0.1]), got {split!r}")
    nsp = training.get("next_sentence_prediction", True)
    if not isinstance(nsp, bool):
        raise InputError(f"{where}: next_sentence_prediction must be true or false, got {nsp!r}")
    args.next_sentence_prediction = nsp
    if args.lr_schedule in ("WSD", "budget"):
        cooldown = training.get("cooldown_proportion", COOLDOWN_PROPORTION)
        if not isinstance(cooldown, (int, float)) or not 0 <= cooldown <= 1:
            raise InputError(f"{where}: cooldown_proportion must be a number in [0, 1], got {cooldown!r}")
        if training.get("cooldown_shape", "linear") not in COOLDOWN_SHAPES:
            raise InputError(f"{where}: cooldown_shape must be one of {', '.join(COOLDOWN_SHAPES)}, "
                             f"got {training['cooldown_shape']!r}")
    if args.lr_schedule == "budget" and not args.max_train_hours:
        raise InputError("--lr_schedule budget follows the share of --max_train_hours spent; give --max_train_hours")
    if args.validation_every_steps and not args.validation_data_path_prefix:
        raise InputError("--validation_every_steps needs a validation set (--validation_data_path_prefix)")


def resolve_batch_sizes(ds_config, world, path):
    """(micro batch per rank, gradient accumulation steps) as DeepSpeed will derive them from
    its config, checked up front with a message that names the fix."""
    train = ds_config.get("train_batch_size")
    micro = ds_config.get("train_micro_batch_size_per_gpu")
    accum = ds_config.get("gradient_accumulation_steps")
    for key, value in (("train_batch_size", train), ("train_micro_batch_size_per_gpu", micro),
                       ("gradient_accumulation_steps", accum)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise InputError(f"{path}: {key} must be a positive integer, got {value!r}")
    if train is None and micro is None:
        raise InputError(f"{path}: give train_batch_size or train_micro_batch_size_per_gpu")
    if train is not None and micro is not None and accum is not None:
        if train != micro * accum * world:
            raise InputError(f"{path}: train_batch_size {train} != train_micro_batch_size_per_gpu {micro} "
                             f"x gradient_accumulation_steps {accum} x world size {world}")
    elif train is not None and micro is not None:
        if train % (micro * world):
            raise InputError(f"{path}: train_batch_size {train} is not a multiple of "
                             f"train_micro_batch_size_per_gpu {micro} x world size {world}")
        accum = train // (micro * world)
    elif train is not None:
        accum = accum or 1
        if train % (accum * world):
            raise InputError(f"{path}: train_batch_size {train} is not a multiple of "
                             f"gradient_accumulation_steps {accum} x world size {world}")
        micro = train // (accum * world)
    else:
        accum = accum or 1
    return micro, accum


def master_process(args=None):
    """True on global rank 0 (or when no process group exists)."""
    return get_rank_and_world()[0] == 0


def setup_logging(args, is_master):
    level = getattr(logging, args.log_level.upper()) if is_master else logging.WARNING
    rank = get_rank_and_world()[0]
    logging.basicConfig(level=level, force=True,
                        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s")
    logging.getLogger("bing_bert").setLevel(level)


def ensure_process_group_env():
    """Let `python deepspeed_train.py ...` (and tests calling main()) run as one rank."""
    if "RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def set_seeds(seed):
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# Model, optimizer, engine


def prepare_optimizer_parameters(args, model):
    """Parameter groups (SPEC 4): no pooler; no weight decay for biases and LayerNorms;
    the 1-bit optimizers get the position-embedding momentum mask group."""
    weight_decay = args.config["training"].get("weight_decay", 0.01)
    named = [(n, p) for n, p in model.network.named_parameters() if "pooler" not in n]
    opt_type = args.ds_config.get("optimizer", {}).get("type", "").lower()
    groups = []
    if opt_type in ONEBIT_OPTIMIZERS:
        pos = [(n, p) for n, p in named if "position_embeddings.weight" in n]
        named = [(n, p) for n, p in named if "position_embeddings.weight" not in n]
        for _, p in pos:
            mask = torch.zeros_like(p)
            mask[:args.max_seq_length] = 1.0
            if opt_type != "onebitlamb":
                mask = mask.flatten()
            groups.append({"params": [p], "weight_decay": weight_decay, "exp_avg_mask": mask})
    decay = [p for n, p in named if not any(nd in n for nd in NO_DECAY_NAMES)]
    no_decay = [p for n, p in named if any(nd in n for nd in NO_DECAY_NAMES)]
    groups += [{"params": decay, "weight_decay": weight_decay},
               {"params": no_decay, "weight_decay": 0.0}]
    return groups


def _check_optimizer_support(ds_config, path):
    from deepspeed.accelerator import get_accelerator

    on_cuda = get_accelerator().device_name() == "cuda"
    opt_type = ds_config.get("optimizer", {}).get("type", "")
    if opt_type.lower() in ONEBIT_OPTIMIZERS and not on_cuda:
        raise InputError(f"{path}: optimizer '{opt_type}' needs CUDA and cupy; use AdamW on this machine")
    if ds_config.get("fp16", {}).get("enabled") and not on_cuda:
        raise InputError(f"{path}: fp16 needs a CUDA GPU; use bf16 or fp32 on this machine")


def load_pretrained_weights(args, network):
    """--use_pretrain: start from `bert_model_file`, which is a state dict with the original's
    key names (.pt/.bin), a checkpoint folder of ours (its `latest` tag, or a tag folder), or
    a Hugging Face folder written by tools/export_hf.py. Only the pooler and the NSP head may
    be missing (an export drops them); they keep their fresh initialisation."""
    from turing.hf_convert import HF_MISSING_KEYS, is_hf_folder, load_checkpoint_state, load_hf_folder

    name = args.config.get("bert_model_file") or ""
    path = next((p for p in (name, os.path.join(args.data_path_prefix, name)) if name and os.path.exists(p)), None)
    if path is None:
        raise InputError(f"{args.config_file}: bert_model_file '{name}' not found (--use_pretrain); expected "
                         f"a state dict file, a checkpoint folder of this project or a Hugging Face export")
    if is_hf_folder(path):
        state_dict, _ = load_hf_folder(path)
    elif os.path.isdir(path):
        state_dict, _, _ = load_checkpoint_state(path)
    else:
        try:
            state_dict = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises several types for a file it cannot read
            raise InputError(f"{path}: not a torch state dict ({e})") from None
        state_dict = state_dict.get("module", state_dict) if isinstance(state_dict, dict) else state_dict
        if not isinstance(state_dict, dict):
            raise InputError(f"{path}: expected a state dict (name -> tensor), found {type(state_dict).__name__}")
    if getattr(network.bert.encoder, "uses_transformer_kernel", False):
        from turing.hf_convert import to_transformer_kernel_layout

        state_dict = to_transformer_kernel_layout(state_dict)
    own = network.state_dict()
    wrong = [f"{k} {tuple(v.shape)} (model {tuple(own[k].shape)})" for k, v in state_dict.items()
             if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if wrong:
        raise InputError(f"{path}: shapes differ from bert_model_config and the vocab: {', '.join(wrong[:4])}")
    missing, unexpected = network.load_state_dict(state_dict, strict=False)
    missing = [k for k in missing if k not in HF_MISSING_KEYS]
    if missing or unexpected:
        raise InputError(f"{path}: weights do not fit the model: missing {missing[:4]}, unexpected {unexpected[:4]}")
    logger.info("Started from pretrained weights %s", path)


def compile_model(network):
    """--compile: torch.compile the network's forward in place (its state_dict keys do not change).

    Compilation happens at the first forward; a graph that fails there runs eagerly, with
    torch's warning, instead of stopping the run. Where torch.compile cannot be set up at all,
    the run goes on uncompiled, with a warning.
    """
    try:
        import torch._dynamo

        torch._dynamo.config.suppress_errors = True
        network.compile()
    except Exception as e:  # noqa: BLE001 - any failure to set up compile leaves the model eager
        logger.warning("--compile: torch.compile is not usable here (%s); training uncompiled",
                       str(e).splitlines()[0] if str(e) else type(e).__name__)
        return
    logger.info("--compile: the model is compiled at its first forward (this takes a while)")


def prepare_model_optimizer(args):
    """Build BertMultiTask, wrap its network in a DeepSpeed engine; returns (model, optimizer)."""
    import deepspeed

    from turing.lamb import build_lamb_if_needed
    from turing.models import BertMultiTask

    _check_optimizer_support(args.ds_config, args.deepspeed_config)
    model = BertMultiTask(args)
    if args.use_pretrain:
        load_pretrained_weights(args, model.network)
    if args.compile:
        compile_model(model.network)
    groups = prepare_optimizer_parameters(args, model)
    # Blocks DeepSpeed 0.19 no longer knows (and refuses) are ours to read: sparse attention
    # (the model builds it) and progressive layer drop (theta computed in RunContext).
    engine_config = {k: v for k, v in args.ds_config.items()
                     if k not in ("sparse_attention", "progressive_layer_drop")}
    # "Lamb" off CUDA: our portable LAMB, since DeepSpeed's FusedLamb is a CUDA op.
    optimizer, engine_config = build_lamb_if_needed(engine_config, groups)
    model.network, optimizer, _, _ = deepspeed.initialize(model=model.network, model_parameters=groups,
                                                          optimizer=optimizer, config=engine_config)
    engine_sizes = (model.network.train_micro_batch_size_per_gpu(), model.network.gradient_accumulation_steps())
    if engine_sizes != (args.train_micro_batch_size_per_gpu, args.gradient_accumulation_steps):
        raise RuntimeError(f"DeepSpeed derived micro batch/accumulation {engine_sizes}, expected "
                           f"{(args.train_micro_batch_size_per_gpu, args.gradient_accumulation_steps)}")
    model.set_device(model.network.device)
    return model, optimizer


# ---------------------------------------------------------------------------------------------
# Checkpoints
#
# A checkpoint folder OUT/saved_models/JOB/TAG is complete once COMPLETE_MARKER is in it; only
# then does `latest` (written by us, atomically) name it. Tags: epoch{E}_step{S} after an
# epoch, step{S} for interval and stop checkpoints (mid-epoch, with the position inside it).

COMPLETE_MARKER = "checkpoint_complete.json"


def checkpoint_model(PATH, ckpt_id, model, epoch, last_global_step, last_global_data_samples, **kwargs):
    """Save through the engine (every rank takes part) with the run state as client state."""
    client_state = {"epoch": epoch, "last_global_step": last_global_step,
                    "last_global_data_samples": last_global_data_samples, **kwargs}
    if not model.network.save_checkpoint(PATH, ckpt_id, client_state, save_latest=False):
        raise RuntimeError(f"checkpoint {PATH}/{ckpt_id} was not written")


def rng_states():
    """This rank's python, numpy and torch generator states."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def set_rng_states(states):
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])


def _all_ranks(obj):
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _barrier():
    if dist.is_initialized():
        dist.barrier()


def save_run_files(args, folder):
    """The job config and the resolved arguments next to a checkpoint (rank 0)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "job_config.json"), "w") as f:
        json.dump(args.config, f, indent=2)
    plain = {k: v for k, v in vars(args).items() if k not in ("config", "ds_config")}
    with open(os.path.join(folder, "args.json"), "w") as f:
        json.dump(plain, f, indent=2, default=str)
    with open(os.path.join(folder, "ds_config.json"), "w") as f:
        json.dump(args.ds_config, f, indent=2)


def _write_atomic(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(args, model, state, tag):
    """A complete checkpoint: engine + client state (with every rank's RNG), run files, the
    completion marker, then `latest`; older interval checkpoints pruned (--keep_last_checkpoints)."""
    folder = os.path.join(args.saved_model_path, tag)
    logger.info("Saving checkpoint %s", folder)
    checkpoint_model(args.saved_model_path, tag, model, **state.client_state(), rng_states=_all_ranks(rng_states()))
    _barrier()
    if master_process(args):
        save_run_files(args, folder)
        _write_atomic(os.path.join(folder, COMPLETE_MARKER),
                      json.dumps({"tag": tag, "global_step": state.global_step, "time": time.time()}))
        _write_atomic(os.path.join(args.saved_model_path, "latest"), tag)
        prune_interval_checkpoints(args.saved_model_path, args.keep_last_checkpoints, keep=tag)
    _barrier()
    return folder


def _step_of(tag):
    match = re.fullmatch(r"(?:epoch\d+_)?step(\d+)", tag)
    return int(match.group(1)) if match else -1


def complete_tags(path):
    """Complete checkpoint tags in a folder, oldest first (by global step)."""
    if not os.path.isdir(path):
        return []
    tags = [d for d in os.listdir(path) if os.path.isfile(os.path.join(path, d, COMPLETE_MARKER))]
    return sorted(tags, key=lambda t: (_step_of(t), t.startswith("epoch")))


def prune_interval_checkpoints(path, keep_last, keep):
    """Remove all but the newest `keep_last` step{S} checkpoints; never `keep` (the latest)."""
    if keep_last <= 0:
        return
    interval = [t for t in complete_tags(path) if t.startswith("step")]
    for tag in interval[:-keep_last]:
        if tag != keep:
            shutil.rmtree(os.path.join(path, tag), ignore_errors=True)
            logger.info("Removed old interval checkpoint %s", tag)


def resolve_checkpoint_tag(path, tag):
    """The tag to load: `latest` reads the latest file; a tag whose folder is incomplete (killed
    while writing) falls back to the newest complete one, with a warning."""
    if not os.path.isdir(path):
        raise InputError(f"{path}: checkpoint folder not found (--load_training_checkpoint)")
    if tag in (None, "latest"):
        latest = os.path.join(path, "latest")
        if not os.path.isfile(latest):
            raise InputError(f"{path}: no 'latest' file; give --load_checkpoint_id TAG "
                             f"(tags there: {', '.join(sorted(os.listdir(path))) or 'none'})")
        tag = open(latest).read().strip()
    folder = os.path.join(path, tag)
    if not os.path.isdir(folder):
        tags = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
        raise InputError(f"{folder}: checkpoint tag '{tag}' not found (--load_checkpoint_id); "
                         f"tags there: {', '.join(tags) or 'none'}")
    if not os.path.isfile(os.path.join(folder, COMPLETE_MARKER)):
        complete = [t for t in complete_tags(path) if _step_of(t) <= _step_of(tag) or _step_of(tag) < 0]
        has_engine_files = any(f.endswith("model_states.pt") for f in os.listdir(folder))
        if complete:
            logger.warning("Checkpoint %s is incomplete (no %s; killed while writing?): using %s instead",
                           folder, COMPLETE_MARKER, complete[-1])
            return complete[-1]
        if not has_engine_files:
            raise InputError(f"{folder}: incomplete checkpoint (no model states) and no complete one beside it")
        logger.warning("Checkpoint %s has no %s (written by another tool?); loading it as it is",
                       folder, COMPLETE_MARKER)
    return tag


def load_training_checkpoint(args, model, PATH, ckpt_id):
    """Restore engine, optimizer and client state; returns (epoch, last_global_step,
    last_global_data_samples) and the whole client state dict as a fourth value."""
    ckpt_id = resolve_checkpoint_tag(PATH, ckpt_id)
    logger.info("Restoring checkpoint %s", os.path.join(PATH, ckpt_id))
    _, client_state = model.network.load_checkpoint(PATH, ckpt_id)
    if client_state is None:
        raise InputError(f"{os.path.join(PATH, ckpt_id)}: DeepSpeed could not load this checkpoint")
    return (client_state["epoch"], client_state["last_global_step"],
            client_state["last_global_data_samples"], client_state)


def load_checkpoint(args, model, state):
    """Restore from --auto_resume (OUT/saved_models/JOB/latest, when there) or from
    --load_training_checkpoint/--load_checkpoint_id; fills the run state."""
    path, tag = args.load_training_checkpoint, args.load_checkpoint_id
    if args.auto_resume and complete_tags(args.saved_model_path):
        path, tag = args.saved_model_path, "latest"
        logger.info("--auto_resume: resuming from %s", path)
    elif args.auto_resume:
        logger.info("--auto_resume: no checkpoint in %s yet, %s", args.saved_model_path,
                    "starting from --load_training_checkpoint" if path else "starting fresh")
    if path is None:
        return
    own = os.path.abspath(path) == os.path.abspath(args.saved_model_path)
    epoch, step, samples, client = load_training_checkpoint(args, model, path, tag)
    state.epoch, state.global_step, state.global_data_samples = epoch, step, samples
    state.epoch_micro_step = client.get("epoch_micro_step", 0)
    state.rewarmup_offset = client.get("rewarmup_offset", 0)
    state.train_seconds = client.get("train_seconds", 0.0)
    state.nonfinite_total = client.get("nonfinite_total", 0)
    state.restore_step = step
    rank, world = get_rank_and_world()
    saved_rng = client.get("rng_states")
    if saved_rng is not None and len(saved_rng) == world:
        set_rng_states(saved_rng[rank])
    elif saved_rng is not None:
        logger.warning("Checkpoint saved by %d ranks, running %d: random states not restored", len(saved_rng), world)
    if args.rewarmup and not own:
        # A new phase from another run's checkpoint: fresh warmup, epoch position from that run.
        state.rewarmup_offset = step
        state.epoch_micro_step = 0
        logger.info("Re-warming the learning rate from global step %d", step)
    logger.info("Resumed at epoch %d (micro-batch %d), global step %d, %d samples", epoch + 1,
                state.epoch_micro_step, step, samples)


# ---------------------------------------------------------------------------------------------
# Learning rate


def lr_factor(schedule, step, training, budget_fraction=None):
    """Multiplier of the base learning rate at `step` (counted from the warmup start).

    LE/EE/EP are the original's schedules. WSD (warmup-stable-decay): linear warmup over
    warmup_proportion, 1.0, then a cool-down to 0 over the final cooldown_proportion of
    total_training_steps, `linear` (1 - t) or `1-sqrt` (1 - sqrt t) by cooldown_shape.
    budget: the same shape over `budget_fraction`, the share of --max_train_hours spent, so a
    run stopped by its time budget ends annealed whatever its speed.
    """
    total = training["total_training_steps"]
    warmup = training["warmup_proportion"]
    x = step / total
    if schedule in ("WSD", "budget"):
        return warmup_stable_decay(budget_fraction if schedule == "budget" else x, warmup,
                                   training.get("cooldown_proportion", COOLDOWN_PROPORTION),
                                   training.get("cooldown_shape", "linear"))
    if schedule in ("LE", "EE"):
        if warmup == 0:
            return 1.0
        if x < warmup:
            return x / warmup if schedule == "LE" else (x / warmup) ** 2
        return training["decay_rate"] ** ((step - warmup * total) / training["decay_step"])
    if schedule == "EP":
        if x < warmup:
            return (x / warmup) ** 1.5
        return max(0.0, 1.0 - x) ** 2
    raise ValueError(f"unknown --lr_schedule {schedule}")


def warmup_stable_decay(x, warmup, cooldown, shape):
    """Factor at progress x (0 = start, 1 = end): x/warmup, then 1.0, then the cool-down over
    the final `cooldown` share (starting no earlier than the warmup's end), 0 from x = 1 on."""
    if x < warmup:
        return x / warmup
    start = max(warmup, 1.0 - cooldown)
    if x < start:
        return 1.0
    t = min(1.0, (x - start) / (1.0 - start)) if start < 1.0 else 1.0
    return 1.0 - t if shape == "linear" else 1.0 - math.sqrt(t)


def budget_fraction(args, state, ctx, device):
    """The share of --max_train_hours spent (summed over sessions) for the budget schedule, the
    largest over ranks so every rank sets the same LR; None for the other schedules."""
    if args.lr_schedule != "budget":
        return None
    spent = torch.tensor([state.train_seconds + time.time() - ctx.session_start], dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(spent, op=dist.ReduceOp.MAX)
    return spent.item() / (args.max_train_hours * 3600)


def update_learning_rate(args, config, current_global_step, optimizer, rewarmup_offset=0, budget_fraction=None):
    """Set the LR of every param group for this optimizer step (all precisions); returns it."""
    step = current_global_step - rewarmup_offset
    lr = config["training"]["learning_rate"] * lr_factor(args.lr_schedule, step, config["training"],
                                                         budget_fraction)
    lr += args.lr_offset
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


# ---------------------------------------------------------------------------------------------
# Reporting


class Reporter:
    """TensorBoard (rank 0) + progress lines. Losses stay on the device until a print step."""

    def __init__(self, args, is_master):
        self.args = args
        self.is_master = is_master
        self.writer = None
        if is_master:
            from tensorboardX import SummaryWriter

            # a unique suffix: a resumed session in the same second must not overwrite the file
            self.writer = SummaryWriter(args.tensorboard_path, filename_suffix=f".{os.getpid()}.{time.time_ns()}")
        self.pending = []          # (step, samples, lr, loss tensor) not yet written
        self.fp16_skipped = 0      # the engine's count of overflow-skipped steps, last seen
        self.window = (time.time(), 0, 0.0)  # start, samples, data wait seconds
        self.train_seconds = None  # training time at the end of the last optimizer step

    def step(self, state, lr, loss, data_wait, engine, ctx):
        self.pending.append((state.global_step, state.global_data_samples, lr, loss))
        self.train_seconds = state.train_seconds + time.time() - ctx.session_start
        if self.writer is not None:
            coeffs = find_lamb_coeffs(engine)
            if coeffs:
                self.writer.add_histogram("Train/lamb_coeffs", np.asarray(coeffs), state.global_step)
            if self.args.progressive_layer_drop:
                self.writer.add_scalar("Train/pld_theta", ctx.pld_theta(state.global_step - 1), state.global_step)
            if engine.fp16_enabled() and engine.skipped_steps != self.fp16_skipped:
                # DeepSpeed's dynamic loss scale skipped this step (gradient overflow)
                self.fp16_skipped = engine.skipped_steps
                logger.warning("fp16 overflow: step %d skipped by the loss scaler (%d in all)",
                               state.global_step, self.fp16_skipped)
                self.writer.add_scalar("Train/fp16_skipped_steps", self.fp16_skipped, state.global_step)
        start, samples, waited = self.window
        samples += self.args.train_micro_batch_size_per_gpu * self.args.gradient_accumulation_steps * \
            get_rank_and_world()[1]
        self.window = (start, samples, waited + data_wait)
        if state.global_step % self.args.print_steps == 0:
            self.flush()
        if state.global_step % 20 == 0:
            self.throughput(state.global_step)

    def flush(self):
        if not self.pending:
            return
        losses = torch.stack([p[3] for p in self.pending]).float().cpu().tolist()  # one sync
        for (step, samples, lr, _), loss in zip(self.pending, losses):
            report_step_metrics(self.args, lr, loss, step, samples, self.writer)
        step, samples, lr, _ = self.pending[-1]
        if self.is_master:
            logger.info("bing_bert_progress: step=%d, loss=%.6f, lr=%.6g, sample_count=%d",
                        step, losses[-1], lr, samples)
        self.pending = []

    def throughput(self, step):
        start, samples, waited = self.window
        now = time.time()
        elapsed = max(now - start, 1e-9)
        rate = samples / elapsed
        if self.is_master:
            logger.info("step %d: %.1f samples/s, %.1f%% of the time waiting for data", step, rate,
                        100 * waited / elapsed)
            self.scalar("Train/samples_per_sec", rate, step)
            self.scalar("Train/tokens_per_sec", rate * self.args.max_seq_length, step)
            self.scalar("Train/data_wait_fraction", waited / elapsed, step)
        self.window = (now, 0, 0.0)

    def validation(self, state, loss, mlm_acc, nsp_acc):
        """A validation point by global step, with the training time it took to get there
        (`Validation/step/*` and `Validation/train_minutes`, x = global step), so accuracy
        can be plotted against steps or minutes whatever the epoch length."""
        minutes = (state.train_seconds if self.train_seconds is None else self.train_seconds) / 60
        if self.is_master:
            logger.info("Validation at step %d after %.2f min of training: loss=%.6f, mlm_accuracy=%.4f",
                        state.global_step, minutes, loss, mlm_acc)
        self.scalar("Validation/train_minutes", minutes, state.global_step)
        self.scalar("Validation/step/Loss", loss, state.global_step)
        self.scalar("Validation/step/MLM_accuracy", mlm_acc, state.global_step)
        if nsp_acc is not None:
            self.scalar("Validation/step/NSP_accuracy", nsp_acc, state.global_step)

    def scalar(self, tag, value, step):
        if self.writer is not None:
            self.writer.add_scalar(tag, value, step)

    def close(self):
        self.flush()
        if self.writer is not None:
            self.writer.close()


def report_step_metrics(args, lr, loss, step, data_sample_count, writer=None):
    """One optimizer step's metrics to TensorBoard (SPEC 9 tags)."""
    if writer is None:
        return
    writer.add_scalar("Train/lr", lr, step)
    writer.add_scalar("Train/Samples/train_loss", loss, data_sample_count)
    writer.add_scalar("Train/Samples/lr", lr, data_sample_count)


# ---------------------------------------------------------------------------------------------
# Data


def get_dataloader(args, dataset, eval_set=False):
    """A DataLoader over a map-style dataset (validation uses micro/2 per batch)."""
    from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler

    batch_size = args.train_micro_batch_size_per_gpu
    if eval_set:
        batch_size = max(1, batch_size // 2)
    rank, world = get_rank_and_world()
    if world > 1:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    else:
        sampler = SequentialSampler(dataset)
    # its own generator: building the iterator must not draw from the global torch RNG
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=_as_batch,
                      generator=torch.Generator().manual_seed(args.seed))


def _as_batch(items):
    from turing.batch import Batch, collate_batch

    if isinstance(items, Batch):
        return items
    return collate_batch(items)


def build_provider(args):
    if args.use_nvidia_dataset:
        from nvidia_bert_dataset_provider import NvidiaBertDatasetProvider

        return NvidiaBertDatasetProvider(args)
    from bing_bert_dataset_provider import BingBertDatasetProvider

    return BingBertDatasetProvider(args)


def open_validation_set(args):
    """The validation set of the job config: NVIDIA hdf5 files or Bing numpy shards."""
    path = os.path.join(args.validation_data_path_prefix,
                        _require(args.config, ["validation", "path"], args.config_file))
    if not os.path.isdir(path):
        raise InputError(f"{path}: validation folder not found (validation.path under "
                         f"--validation_data_path_prefix)")
    hdf5 = sorted(f for f in os.listdir(path) if f.endswith((".hdf5", ".h5")))
    if hdf5:
        from torch.utils.data import ConcatDataset

        from nvidia_bert_dataset_provider import PretrainingHdf5Dataset, read_hdf5_shard

        parts = [PretrainingHdf5Dataset(read_hdf5_shard(os.path.join(path, f)), f, args.vocab_size)
                 for f in hdf5]
        return parts[0] if len(parts) == 1 else ConcatDataset(parts)
    from turing.dataset import open_validation_dataset

    return open_validation_dataset(path, load_vocab(args.vocab_file), args)


# ---------------------------------------------------------------------------------------------
# Validation


def pretrain_validation(args, index, model, reporter=None, state=None, epoch_end=True):
    """Loss and MLM accuracy over the validation set, averaged over all ranks. Logged by epoch
    (at an epoch's end) and, given the run state, by global step with the training minutes."""
    dataset = open_validation_set(args)
    loader = get_dataloader(args, dataset, eval_set=True)
    model.eval()
    device = model.network.device
    # loss sum, batches, MLM correct, masked tokens, NSP correct, sequences
    totals = torch.zeros(6, dtype=torch.float64, device=device)
    with torch.no_grad():
        for batch in loader:
            batch = model.move_batch(batch)
            # One forward for the scores; the loss is the model's (SPEC 5): MLM cross-entropy
            # over the masked positions (0 without any) + NSP cross-entropy, in fp32.
            scores, nsp_scores = model.network(batch._replace(masked_lm_labels=None))
            labels = batch.masked_lm_labels
            masked = labels != -1
            mlm_loss = (F.cross_entropy(scores[masked].float(), labels[masked], reduction="sum")
                        / masked.sum().clamp(min=1))
            loss = mlm_loss
            if args.next_sentence_prediction:
                loss = loss + F.cross_entropy(nsp_scores.float(), batch.next_sentence_labels, ignore_index=-1)
            correct = (scores.argmax(-1) == labels) & masked
            nsp_correct = nsp_scores.argmax(-1) == batch.next_sentence_labels
            totals += torch.stack([loss.double(), torch.ones((), dtype=torch.float64, device=device),
                                   correct.sum().double(), masked.sum().double(),
                                   nsp_correct.sum().double(),
                                   torch.tensor(float(len(labels)), dtype=torch.float64, device=device)])
    if dist.is_initialized():
        dist.all_reduce(totals)
    model.train()
    loss, mlm_acc, nsp_acc = (totals[[0, 2, 4]] / totals[[1, 3, 5]].clamp(min=1)).tolist()
    if not args.next_sentence_prediction:
        nsp_acc = None  # the NSP head is not trained: its accuracy means nothing
    logger.info("Validation epoch %d: loss=%.6f, mlm_accuracy=%.4f, nsp_accuracy=%s", index + 1, loss,
                mlm_acc, "off" if nsp_acc is None else f"{nsp_acc:.4f}")
    if reporter is not None:
        if epoch_end:
            reporter.scalar("Validation/Loss", loss, index + 1)
            reporter.scalar("Validation/MLM_accuracy", mlm_acc, index + 1)
            if nsp_acc is not None:
                reporter.scalar("Validation/NSP_accuracy", nsp_acc, index + 1)
        if state is not None:
            reporter.validation(state, loss, mlm_acc, nsp_acc)
    return loss, mlm_acc


# ---------------------------------------------------------------------------------------------
# Training


def agreed_step_count(local_count, device):
    """The number of micro-batches every rank can run this epoch (the minimum over ranks)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local_count
    t = torch.tensor([local_count], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


class StopSignals:
    """SIGTERM/SIGINT: the first asks for a checkpoint at the end of the current optimizer
    step; a second one exits at once. Copies arriving within REPEAT_WINDOW seconds of the
    first are the same request: a scheduler signalling the whole process group reaches a
    rank twice, directly and through the deepspeed launcher, which forwards SIGTERM."""

    REPEAT_WINDOW = 2.0

    def __init__(self):
        self.received = None
        self.received_at = None
        self._previous = {}

    def install(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame):
        if self.received is not None:
            if time.time() - self.received_at < self.REPEAT_WINDOW:
                return
            os._exit(128 + signum)
        self.received, self.received_at = signum, time.time()
        logger.warning("Received %s: stopping after this optimizer step with a checkpoint "
                       "(send it again to exit at once)", signal.Signals(signum).name)


def step_checks(args, state, loss, signals, session_start, engine):
    """Once per optimizer step: is the loss finite, was a stop signal received, is the time
    budget spent. Ranks agree (one small all-reduce) so they stop or skip at the same step."""
    over_time = (args.max_train_hours is not None and
                 state.train_seconds + time.time() - session_start >= args.max_train_hours * 3600)
    flags = torch.stack([(~torch.isfinite(loss)).float(), torch.tensor(float(signals.received or 0)).to(loss.device),
                         torch.tensor(float(over_time)).to(loss.device)])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    nonfinite, signum, over_time = flags.tolist()
    if engine.fp16_enabled():
        nonfinite = 0.0  # DeepSpeed's loss scaler skips overflowing fp16 steps itself
    return bool(nonfinite), int(signum), bool(over_time)


def skip_step(engine, optimizer):
    """Drop this step's gradients (zeroed in place: the engine's clipping expects them) and
    step with LR 0: no parameter moves, and the engine's step counters stay in line with the
    micro-batches. The optimizer's moments decay by one step of zero gradient."""
    for p in engine.module.parameters():
        if p.grad is not None:
            p.grad.zero_()
    clear_hp_grads = getattr(optimizer, "clear_hp_grads", None)  # DeepSpeed's bf16 optimizer
    if clear_hp_grads is not None:
        clear_hp_grads()
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    engine.step()


def train(args, index, model, optimizer, pretrain_dataset_provider, state, reporter, ctx, finetune=False):
    """One epoch of the step loop (from state.epoch_micro_step on). Returns the stop reason:
    None (epoch done), "max_steps" or "time"; raises StopTraining after a signal or too many
    non-finite losses, once the checkpoint is written."""
    engine = model.network
    start = state.epoch_micro_step
    refs, local_total = pretrain_dataset_provider.get_shard(index, start_batch=start)
    pretrain_dataset_provider.prefetch_shard(index + 1)
    total = agreed_step_count(local_total, engine.device)
    if total < local_total:
        logger.warning("Epoch %d: this rank has %d micro-batches left, runs %d like the shortest rank "
                       "(%d samples unused)", index + 1, local_total, total,
                       (local_total - total) * args.train_micro_batch_size_per_gpu)
    _, world = get_rank_and_world()
    samples_per_micro = args.train_micro_batch_size_per_gpu * world
    accum = args.gradient_accumulation_steps
    epoch_steps, step_loss, data_wait, stop = 0, None, 0.0, None
    model.train()
    bar = tqdm(total=start + total, initial=start, desc=f"epoch {index + 1}", disable=not reporter.is_master,
               mininterval=2.0, file=sys.stderr)
    ref_iter = iter(refs)
    for _ in range(total):
        waited = time.time()
        batch = model.move_batch(pretrain_dataset_provider.get_batch(next(ref_iter)), non_blocking=True)
        data_wait += time.time() - waited
        loss = engine(batch, **ctx.pld_kwargs(state.global_step))
        step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        state.global_data_samples += samples_per_micro
        state.epoch_micro_step += 1
        pretrain_dataset_provider.prefetch_batch()
        engine.backward(loss)
        bar.update(1)
        if not engine.is_gradient_accumulation_boundary():
            engine.step()
            continue
        step_loss = step_loss / accum
        nonfinite, signum, over_time = step_checks(args, state, step_loss, ctx.signals, ctx.session_start, engine)
        if nonfinite:
            handle_nonfinite(args, model, optimizer, state, reporter, ctx)
        else:
            state.nonfinite_in_a_row = 0
            lr = update_learning_rate(args, args.config, state.global_step, optimizer, state.rewarmup_offset,
                                      budget_fraction(args, state, ctx, engine.device))
            engine.step()
            state.global_step += 1
            epoch_steps += 1
            reporter.step(state, lr, step_loss, data_wait, engine, ctx)
        step_loss, data_wait = None, 0.0
        if signum:
            bar.close()
            stop_with_checkpoint(args, model, state, reporter, ctx,
                                 f"stopped by {signal.Signals(signum).name}", 128 + signum)
        if over_time:
            stop = "time"
        elif is_time_to_exit(args, global_steps=state.global_step - state.restore_step):
            stop = "max_steps"
        if args.checkpoint_every_steps and state.global_step % args.checkpoint_every_steps == 0 \
                and not nonfinite and stop is None and state.epoch_micro_step < start + total:
            save_checkpoint(args, model, ctx.with_time(state), f"step{state.global_step}")
        if stop or is_time_to_exit(args, epoch_steps=epoch_steps):
            break
        if args.validation_every_steps and state.global_step % args.validation_every_steps == 0 \
                and not nonfinite and state.epoch_micro_step < start + total:
            validate_in_epoch(args, index, model, reporter, state, ctx)
    bar.close()
    reporter.flush()
    pretrain_dataset_provider.release_shard(index)
    if stop is None or state.epoch_micro_step >= start + total:
        state.epoch, state.epoch_micro_step = index + 1, 0
    return stop


def validate_in_epoch(args, index, model, reporter, state, ctx):
    """--validation_every_steps: validate now (the end of an epoch or run validates in run());
    the time it takes is not training time (the clock of --max_train_hours and of the budget
    schedule is moved on by it)."""
    started = time.time()
    pretrain_validation(args, index, model, reporter, state, epoch_end=False)
    ctx.session_start += time.time() - started


def handle_nonfinite(args, model, optimizer, state, reporter, ctx):
    """Skip the step; after --max_nonfinite_steps in a row, checkpoint and stop."""
    skip_step(model.network, optimizer)
    state.nonfinite_in_a_row += 1
    state.nonfinite_total += 1
    logger.warning("Non-finite loss at global step %d: step skipped (%d in a row, %d in all)",
                   state.global_step + 1, state.nonfinite_in_a_row, state.nonfinite_total)
    reporter.scalar("Train/nonfinite_steps", state.nonfinite_total, state.global_step + 1)
    if state.nonfinite_in_a_row >= args.max_nonfinite_steps:
        stop_with_checkpoint(args, model, state, reporter, ctx,
                             f"{state.nonfinite_in_a_row} non-finite losses in a row (--max_nonfinite_steps); "
                             f"lower the learning rate or check the data", 3)


def stop_with_checkpoint(args, model, state, reporter, ctx, reason, exit_code):
    reporter.flush()
    folder = save_checkpoint(args, model, ctx.with_time(state), f"step{state.global_step}")
    raise StopTraining(f"{reason}; checkpoint of global step {state.global_step} in {folder} "
                       f"(re-run with --auto_resume to continue)", exit_code)


class RunContext:
    """Per-session things the step loop needs besides the run state."""

    def __init__(self, args, engine):
        self.args = args
        self.engine = engine
        self.signals = StopSignals()
        self.session_start = time.time()
        self.session_base = 0.0

    def with_time(self, state):
        """The run state with this session's training time added (for a checkpoint)."""
        return dataclasses.replace(state, train_seconds=self.session_base + time.time() - self.session_start)

    def pld_theta(self, step):
        """Progressive layer drop keep-rate: theta(t) = (1 - theta_bar) exp(-gamma t) + theta_bar."""
        block = self.args.ds_config["progressive_layer_drop"]
        theta_bar, gamma = block.get("theta", 0.5), block.get("gamma", 0.001)
        return (1.0 - theta_bar) * math.exp(-gamma * step) + theta_bar

    def pld_kwargs(self, step):
        if not self.args.progressive_layer_drop:
            return {}
        return {"progressive_layer_drop": True, "pld_theta": self.pld_theta(step)}


def run(args, model, optimizer, start_epoch, state, provider, reporter, ctx):
    """The epoch loop: train, validate, checkpoint; a stop (--max_steps, --max_train_hours)
    inside an epoch leaves a step{S} checkpoint that remembers the position in the epoch."""
    num_epochs = args.config["training"]["num_epochs"]
    if start_epoch >= num_epochs:
        logger.warning("Nothing to do: the checkpoint has finished %d of %d epochs", start_epoch, num_epochs)
    for index in range(start_epoch, num_epochs):
        logger.info("Training epoch %d of %d", index + 1, num_epochs)
        started = time.time()
        stop = train(args, index, model, optimizer, provider, state, reporter, ctx)
        epoch_done = state.epoch == index + 1
        if args.validation_data_path_prefix and not args.finetune and (epoch_done or stop == "time"):
            pretrain_validation(args, index, model, reporter, state)
        if epoch_done and (args.ckpt_to_save is None or state.epoch in args.ckpt_to_save):
            save_checkpoint(args, model, ctx.with_time(state), f"epoch{state.epoch}_step{state.global_step}")
        elif stop is not None:
            save_checkpoint(args, model, ctx.with_time(state), f"step{state.global_step}")
        logger.info("Epoch %d took %.1f s", index + 1, time.time() - started)
        if stop is not None:
            logger.warning("Stopping: %s reached at epoch %d, global step %d",
                           "--max_train_hours" if stop == "time" else "--max_steps", index + 1, state.global_step)
            return


def main(argv=None):
    args = None
    try:
        args = construct_arguments(argv)
        return _main(args)
    except (InputError, FileNotFoundError, ValueError) as e:
        # Bad input (configs, paths, shards): one line, no traceback, unless --debug.
        if "--debug" in (sys.argv if argv is None else argv):
            raise
        print(f"error: {e} (run with --debug for a traceback)", file=sys.stderr)
        raise SystemExit(2) from None
    except StopTraining as e:
        logger.error("%s", e)
        raise SystemExit(e.exit_code) from None


def _main(args):
    ensure_process_group_env()
    import deepspeed

    deepspeed.init_distributed()
    rank, world = get_rank_and_world()
    is_master = rank == 0
    setup_logging(args, is_master)
    args.train_micro_batch_size_per_gpu, args.gradient_accumulation_steps = resolve_batch_sizes(
        args.ds_config, world, args.deepspeed_config)
    set_seeds(args.seed)
    if is_master:
        os.makedirs(args.saved_model_path, exist_ok=True)
        logger.info("Arguments: %s", json.dumps({k: v for k, v in vars(args).items()
                                                 if k not in ("config", "ds_config")}, default=str))
        logger.info("Job config: %s", json.dumps(args.config))
    from turing.modeling import check_model_flags

    check_model_flags(args)          # e.g. the CUDA-only transformer kernel, before any work
    provider = build_provider(args)  # opens and checks the data before the model is built
    reporter = ctx = None
    try:
        model, optimizer = prepare_model_optimizer(args)
        state = RunState()
        load_checkpoint(args, model, state)
        reporter = Reporter(args, is_master)
        if is_master:
            reporter.writer.add_text("config", json.dumps(args.config, indent=2))
        ctx = RunContext(args, model.network)
        ctx.session_base = state.train_seconds
        ctx.signals.install()
        run(args, model, optimizer, state.epoch, state, provider, reporter, ctx)
    finally:
        if ctx is not None:
            ctx.signals.uninstall()
        if reporter is not None:
            reporter.close()
        if hasattr(provider, "close"):
            provider.close()
    logger.info("Done: %d epochs, global step %d, %d samples", state.epoch, state.global_step,
                state.global_data_samples)
    return state


if __name__ == "__main__":
    main()

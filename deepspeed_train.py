"""Bing BERT pretraining with DeepSpeed: the whole program, top to bottom.

Parse and check arguments -> build the model and the DeepSpeed engine -> restore a
checkpoint -> run epochs: train (the step loop), checkpoint, validate.

    deepspeed deepspeed_train.py --cf bert_config.json --deepspeed --deepspeed_config ds_config.json \
        --output_dir OUT --data_path_prefix DATA [--use_nvidia_dataset] ...

`main(argv)` also runs in-process (single rank): without the launcher's environment it
sets up a one-process group itself.
"""
import dataclasses
import datetime
import fcntl
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Optional

import deepspeed
import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as dist_c10d
from deepspeed.accelerator import get_accelerator
from tensorboardX import SummaryWriter
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler
from tqdm import tqdm

from bert_dataset_provider import EpochPlan
from bing_bert_dataset_provider import BingBertDatasetProvider
from nvidia_bert_dataset_provider import NvidiaBertDatasetProvider
from turing.batch import Batch, collate_batch
from turing.checkpoint import (COMPLETE_MARKER, MODEL_STATES_FILE, check_weights_only, complete_tags, engine_tags,
                               holds_checkpoints, load_checkpoint_state, prune_interval_checkpoints,
                               read_state_dict_file, resume_candidates, sync_folder, weights_only_loads, write_atomic)
from turing.dataset import MASK_SPLIT, MASKED_SHARE
from turing.errors import InputError
from turing.hf_convert import HF_MISSING_KEYS, is_hf_folder, load_hf_folder
from turing.jsonfile import read_json
from turing.kernel_layout import to_transformer_kernel_layout
from turing.lamb import build_lamb_if_needed, find_lamb_coeffs
from turing.modeling import (BertConfig, BertConfigError, ModelOptions, masked_lm_loss_of_scores, precision_of,
                             pretraining_loss)
from turing.models import BertMultiTask
from turing.tokenization import load_vocab, vocab_size, vocab_size_padded
from utils import Ranks, get_argument_parser, is_time_to_exit, set_seeds

logger = logging.getLogger("bing_bert")
REPO = os.path.dirname(os.path.abspath(__file__))

NO_DECAY_NAMES = ("bias", "LayerNorm.bias", "LayerNorm.weight",
                  # DeepSpeed transformer-kernel names
                  "attn_nw", "attn_nb", "norm_w", "norm_b", "attn_qkvb", "attn_ob", "inter_b", "output_b")
ONEBIT_OPTIMIZERS = ("onebitadam", "onebitlamb", "zerooneadam")
COOLDOWN_PROPORTION = 0.2        # WSD / budget: final share of the run spent decaying
COOLDOWN_SHAPES = ("linear", "1-sqrt")


@dataclasses.dataclass
class RunState:
    """Everything that counts progress, and the phase and batch layout it was counted in; saved
    in every checkpoint's client state (ints and floats only, so a checkpoint loads with
    torch.load(..., weights_only=True)) under the keys of CLIENT_KEYS, and read back by
    `from_client_state`. A new field is saved and restored once it has a line there."""
    epoch: int = 0                  # epochs finished (= index of the epoch in progress)
    epoch_micro_step: int = 0       # micro-batches of that epoch already trained on
    global_step: int = 0            # optimizer steps taken
    global_data_samples: int = 0    # samples seen (all ranks)
    rewarmup_offset: int = 0        # global step at which the LR warmup (re)started
    train_seconds: float = 0.0      # training wall time of earlier sessions (--max_train_hours)
    restore_step: int = 0           # not saved: the global step this session was restored at
    nonfinite_in_a_row: int = 0     # not saved: a run stopped by them resumes counting afresh
    nonfinite_total: int = 0
    seq_length: int = 0             # --max_seq_length trained at: the phase (0: not recorded)
    micro_batch: int = 0            # micro batch per rank epoch_micro_step counts in (0: not recorded)
    grad_accum: int = 0             # gradient accumulation steps, likewise
    world: int = 0                  # ranks, likewise
    # The layout (ranks, micro batch, accumulation) the epoch in progress began with, whose sample
    # order it follows to its end, when it differs from this run's (0: the same)
    plan_world: int = 0
    plan_micro_batch: int = 0
    plan_grad_accum: int = 0

    # field -> client-state key. The first three are the original's keys (and the only ones its
    # checkpoints have: the other fields keep their defaults when a checkpoint lacks them).
    CLIENT_KEYS = {"epoch": "epoch", "global_step": "last_global_step",
                   "global_data_samples": "last_global_data_samples",
                   "epoch_micro_step": "epoch_micro_step", "rewarmup_offset": "rewarmup_offset",
                   "train_seconds": "train_seconds", "nonfinite_total": "nonfinite_total",
                   "seq_length": "seq_length", "micro_batch": "micro_batch", "grad_accum": "grad_accum",
                   "world": "world_size", "plan_world": "epoch_plan_world",
                   "plan_micro_batch": "epoch_plan_micro_batch", "plan_grad_accum": "epoch_plan_grad_accum"}
    REQUIRED = ("epoch", "global_step", "global_data_samples")
    LAYOUT = ("seq_length", "micro_batch", "grad_accum", "world")  # this run's own, never taken from a checkpoint

    def to_client_state(self):
        return {key: getattr(self, name) for name, key in self.CLIENT_KEYS.items()}

    def layout(self):
        return EpochPlan(self.world, self.micro_batch, self.grad_accum)

    def epoch_plan(self):
        """The layout the epoch in progress began with, None when it is this run's."""
        plan = EpochPlan(self.plan_world, self.plan_micro_batch, self.plan_grad_accum)
        return None if not self.plan_world or plan == self.layout() else plan

    @classmethod
    def missing_keys(cls, client):
        """The required client-state keys `client` lacks (not written by this program or the original)."""
        return [cls.CLIENT_KEYS[name] for name in cls.REQUIRED if cls.CLIENT_KEYS[name] not in client]

    @classmethod
    def from_client_state(cls, client):
        """The run state a checkpoint saved; fields it lacks (older or the original's
        checkpoints) keep their defaults."""
        return cls(**{name: client[key] for name, key in cls.CLIENT_KEYS.items() if key in client})


class StopTraining(Exception):
    """Raised out of the step loop after a checkpoint was written; carries the exit code."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


# ---------------------------------------------------------------------------------------------
# Arguments and configuration


def get_arguments(argv=None):
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
    vocab = load_vocab(args.vocab_file)
    args.vocab_size = vocab_size_padded(vocab_size(vocab))  # the model's rows, repeated lines included
    if len(vocab) < vocab_size(vocab):
        logger.warning("%s: %d repeated line(s); a repeated token keeps the id of its last line, and "
                       "every line keeps its row in the model", args.vocab_file, vocab_size(vocab) - len(vocab))
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
    check_config_values(args)
    try:
        lr_factor(args.lr_schedule, 0, config["training"], 0.0)
    except ValueError as e:
        raise InputError(f"{e} (the schedules are those of deepspeed_train.lr_factor; see --help)") from None
    return args


def _check_value(value, name, low, *, above=False, high=None, integer=False):
    """InputError unless `value` is a JSON/command-line number (an int where `integer`) in
    [low, high], or (low, high] where `above`. A quoted number ("0.01") is refused by name."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, str):
        raise InputError(f"{name} must be {kind}, got the string {value!r} (remove the quotes)")
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or not math.isfinite(value):
        raise InputError(f"{name} must be {kind}, got {value!r}")
    if (value <= low if above else value < low) or (high is not None and value > high):
        bounds = f"{'>' if above else '>='} {low}" + ("" if high is None else f" and <= {high}")
        raise InputError(f"{name} must be {bounds}, got {value!r}")


def check_config_values(args):
    """Refuse values no run can mean, before any work, with one line naming the key or flag:
    the training section's numbers (learning_rate > 0, total_training_steps >= 1 and
    num_epochs >= 1 whole numbers, warmup_proportion in [0, 1], decay_step > 0, decay_rate in
    (0, 1], weight_decay >= 0, num_workers >= 0; never quoted strings), the model sizes of
    bert_model_config, and the step and size flags."""
    where = f"{args.config_file}: mixed_seq_training.{args.max_seq_length}"
    training = args.config["training"]
    rules = {"learning_rate": dict(low=0, above=True),
             "total_training_steps": dict(low=1, integer=True),
             "num_epochs": dict(low=1, integer=True),
             "warmup_proportion": dict(low=0, high=1),
             "decay_step": dict(low=0, above=True),
             "decay_rate": dict(low=0, above=True, high=1),
             "weight_decay": dict(low=0),
             "num_workers": dict(low=0, integer=True)}
    for key, rule in rules.items():
        if key in training:
            _check_value(training[key], f"{where}.{key}", **rule)
    try:
        model_config = BertConfig.from_dict(args.config["bert_model_config"])
    except BertConfigError as e:
        raise InputError(f"{args.config_file}: {e}") from None
    for flag, low in (("max_seq_length", 5), ("max_predictions_per_seq", 1), ("print_steps", 1),
                      ("max_steps", 1), ("max_steps_per_epoch", 1), ("refresh_bucket_size", 1),
                      ("checkpoint_every_steps", 0), ("keep_last_checkpoints", 0), ("max_nonfinite_steps", 1)):
        _check_value(getattr(args, flag), f"--{flag}", low, integer=True)
    if args.max_seq_length > model_config.max_position_embeddings:
        raise InputError(f"--max_seq_length {args.max_seq_length} exceeds bert_model_config.max_position_embeddings "
                         f"{model_config.max_position_embeddings} of {args.config_file}")
    _check_value(args.dist_timeout, "--dist_timeout", 0, above=True)
    _check_value(args.lr_offset, "--lr_offset", -math.inf)  # any finite number: a NaN offset makes every weight NaN
    if args.max_train_hours is not None:
        _check_value(args.max_train_hours, "--max_train_hours", 0, above=True)
    for epoch in args.ckpt_to_save or ():
        _check_value(epoch, "--ckpt_to_save", 1, integer=True)


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


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The run's settings, built once (`from_args`) from the command line, the job config and
    the DeepSpeed config once they are read and checked (construct_arguments) and the process
    group is up (setup_distributed), and handed to every part of the program. Attribute names
    are the command line's, so a function written for the original's `args` reads either;
    `args` itself stays at the public boundary the original defined (construct_arguments,
    prepare_model_optimizer, train, run, the checkpoint and validation calls)."""
    # files and folders
    config_file: str
    deepspeed_config: str
    output_dir: str
    job_name: str
    saved_model_path: str            # OUT/saved_models/JOB
    tensorboard_path: str            # OUT/runs/JOB
    data_path_prefix: str
    validation_data_path_prefix: Optional[str]
    vocab_file: str                  # resolved bert_token_file
    vocab_size: int                  # the model's rows: the vocab file's lines, rounded up to a multiple of 8
    # the configs, read and checked; config["training"] is this sequence length's section and
    # config["data"]["datasets"] its data sets
    config: dict
    ds_config: dict
    # data and batch layout
    max_seq_length: int
    max_predictions_per_seq: int
    use_nvidia_dataset: bool
    refresh_bucket_size: int
    do_lower_case: bool
    train_micro_batch_size_per_gpu: int   # as DeepSpeed derives it from ds_config
    gradient_accumulation_steps: int
    ranks: Ranks
    # schedule and run control
    lr_schedule: str
    lr_offset: float
    rewarmup: bool
    seed: int
    print_steps: int
    max_steps: int
    max_steps_per_epoch: int
    max_train_hours: Optional[float]
    validation_every_steps: int
    finetune: bool
    log_level: str
    # checkpoints
    auto_resume: bool
    load_training_checkpoint: Optional[str]
    load_checkpoint_id: Optional[str]
    trust_checkpoint: bool
    ckpt_to_save: Optional[tuple]
    checkpoint_every_steps: int
    keep_last_checkpoints: int
    max_nonfinite_steps: int
    use_pretrain: bool
    # model
    model: ModelOptions
    next_sentence_prediction: bool
    progressive_layer_drop: bool
    compile: bool
    # the resolved command line, as saved beside every checkpoint (args.json) and logged
    arguments: dict

    @classmethod
    def from_args(cls, args, ranks):
        """The config of a parsed, checked command line (construct_arguments) on `ranks`."""
        same = {f.name for f in dataclasses.fields(cls)} - {"ranks", "model", "ckpt_to_save", "arguments"}
        return cls(ranks=ranks, model=ModelOptions.from_args(args),
                   ckpt_to_save=tuple(args.ckpt_to_save) if args.ckpt_to_save is not None else None,
                   arguments={k: v for k, v in vars(args).items() if k not in ("config", "ds_config")},
                   **{name: getattr(args, name) for name in same})


def master_process(args=None):
    """The original's call: True on global rank 0 (or when no process group exists)."""
    return Ranks.current().is_main


def setup_logging(cfg):
    ranks = cfg.ranks
    level = getattr(logging, cfg.log_level.upper()) if ranks.is_main else logging.WARNING
    logging.basicConfig(level=level, force=True,
                        format=f"%(asctime)s [rank {ranks.rank}] %(levelname)s %(name)s: %(message)s")
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


def bound_collectives(seconds):
    """--dist_timeout as the bound of every collective: of the default group (returned, for
    init_distributed, which also bounds the start-up rendezvous with it) and of the groups
    DeepSpeed creates later (its data-parallel group, ZeRO's), which torch.distributed.new_group
    builds with torch's default timeout, 30 minutes, unless that default is set too. A rank
    whose peer died or hangs then raises instead of waiting; main() ends it with one line."""
    timeout = datetime.timedelta(seconds=seconds)
    dist_c10d.default_pg_timeout = timeout
    dist_c10d.default_pg_nccl_timeout = timeout
    return timeout


SHM_ALLREDUCE_NAME = "/dev/shm/deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}"


def release_shm_allreduce_name():
    """Remove the name of this rank's shared-memory all-reduce buffer once every rank holds it.

    On the CPU accelerator, when all ranks are on one machine (LOCAL_SIZE == WORLD_SIZE, as the
    launcher sets), DeepSpeed gives each rank a 67 MB buffer in /dev/shm, which every peer maps
    during init_distributed, and never unlinks it: each run leaves 67 MB per rank of RAM behind,
    a killed run too, until /dev/shm fills the machine's memory. After a barrier every rank has
    mapped every peer's buffer, so the names can go; the mappings stay valid until the
    processes end, and nothing is left behind whatever way the run ends."""
    env = os.environ
    if get_accelerator().device_name() != "cpu" or env.get("LOCAL_SIZE") != env.get("WORLD_SIZE"):
        return
    dist.barrier()
    name = SHM_ALLREDUCE_NAME.format(uid=os.getuid(), addr=env.get("MASTER_ADDR", ""),
                                     port=env.get("MASTER_PORT", ""), rank=dist.get_rank())
    try:
        os.unlink(name)
    except FileNotFoundError:
        pass  # released by an earlier call, or DeepSpeed did not create one


def setup_distributed(args):
    """The process group (one rank when started without the launcher) and the batch sizes in
    `args` (train_micro_batch_size_per_gpu, gradient_accumulation_steps) as DeepSpeed will
    derive them from its config; returns this process's Ranks. Safe to call again."""
    ensure_process_group_env()
    deepspeed.init_distributed(timeout=bound_collectives(args.dist_timeout))
    if get_accelerator().device_name() != "cpu":  # collectives before the engine's, on this rank's GPU
        get_accelerator().set_device(int(os.environ.get("LOCAL_RANK", "0")))
    release_shm_allreduce_name()
    ranks = Ranks.current()
    args.train_micro_batch_size_per_gpu, args.gradient_accumulation_steps = resolve_batch_sizes(
        args.ds_config, ranks.world, args.deepspeed_config)
    return ranks


# ---------------------------------------------------------------------------------------------
# Model, optimizer, engine


def prepare_optimizer_parameters(args, model):
    """Parameter groups, in the original's order, which positional optimizer states
    rely on: the weight-decay group, the no-decay group (biases and LayerNorms), each in the
    model's parameter order without the pooler; for the 1-bit optimizers, after those, one group
    per position-embedding table with its momentum mask."""
    weight_decay = args.config["training"].get("weight_decay", 0.01)
    named = [(n, p) for n, p in model.network.named_parameters() if "pooler" not in n]
    opt_type = args.ds_config.get("optimizer", {}).get("type", "").lower()
    masked = []
    if opt_type in ONEBIT_OPTIMIZERS:
        masked = [(n, p) for n, p in named if "position_embeddings.weight" in n]
        named = [(n, p) for n, p in named if "position_embeddings.weight" not in n]
    decay = [p for n, p in named if not any(nd in n for nd in NO_DECAY_NAMES)]
    no_decay = [p for n, p in named if any(nd in n for nd in NO_DECAY_NAMES)]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    for _, p in masked:
        mask = torch.zeros_like(p)
        mask[:args.max_seq_length] = 1.0
        if opt_type != "onebitlamb":
            mask = mask.flatten()
        groups.append({"params": [p], "weight_decay": weight_decay, "exp_avg_mask": mask})
    return groups


def _check_optimizer_support(ds_config, path):
    on_cuda = get_accelerator().device_name() == "cuda"
    opt_type = ds_config.get("optimizer", {}).get("type", "")
    if opt_type.lower() in ONEBIT_OPTIMIZERS and not on_cuda:
        raise InputError(f"{path}: optimizer '{opt_type}' needs CUDA and cupy; use AdamW on this machine")
    if precision_of(ds_config) == "fp16" and not on_cuda:
        raise InputError(f"{path}: fp16 needs a CUDA GPU; use bf16 or fp32 on this machine")
    zero = ds_config.get("zero_optimization") or {}
    for key in ("offload_optimizer", "offload_param"):
        device = (zero.get(key) or {}).get("device", "none")
        if device != "none" and not on_cuda:
            raise InputError(f"{path}: zero_optimization.{key} (device '{device}') moves ZeRO states out of GPU "
                             f"memory, and needs a CUDA GPU; on this machine the states are in host memory already: "
                             f"remove the block")


def load_pretrained_weights(cfg, network):
    """--use_pretrain: start from `bert_model_file`, which is a state dict with the original's
    key names (.pt/.bin), a checkpoint folder of ours (its `latest` tag, or a tag folder), or
    a Hugging Face folder written by tools/export_hf.py. Only the pooler and the NSP head may
    be missing (an export drops them); they keep their fresh initialisation. Files are read
    with torch.load(weights_only=True) and never unpickled beyond that."""
    name = cfg.config.get("bert_model_file") or ""
    path = next((p for p in (name, os.path.join(cfg.data_path_prefix, name)) if name and os.path.exists(p)), None)
    if path is None:
        raise InputError(f"{cfg.config_file}: bert_model_file '{name}' not found (--use_pretrain); expected "
                         f"a state dict file, a checkpoint folder of this project or a Hugging Face export")
    if is_hf_folder(path):
        state_dict, _ = load_hf_folder(path)
    elif os.path.isdir(path):
        state_dict, _, _ = load_checkpoint_state(path)
    else:
        state_dict = read_state_dict_file(path)
    if getattr(network.bert.encoder, "uses_transformer_kernel", False):
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
        import torch._dynamo  # only for --compile, whose failure to set up is a warning

        torch._dynamo.config.suppress_errors = True
        network.compile()
    except Exception as e:  # noqa: BLE001 - any failure to set up compile leaves the model eager
        logger.warning("--compile: torch.compile is not usable here (%s); training uncompiled",
                       str(e).splitlines()[0] if str(e) else type(e).__name__)
        return
    logger.info("--compile: the model is compiled at its first forward (this takes a while)")


def prepare_model_optimizer(args, cfg=None):
    """Build BertMultiTask, wrap its network in a DeepSpeed engine; returns (model, optimizer).

    Works on its own after construct_arguments(), as the original's did: it sets up the process
    group, fills args.train_micro_batch_size_per_gpu, args.gradient_accumulation_steps,
    args.device and args.fp16, and starts the session (`model.session`: the RunConfig `cfg`,
    built here when not given, run state, reporter, stop signals) that train(), run() and the
    checkpoint functions use.
    """
    ranks = setup_distributed(args)
    cfg = cfg or RunConfig.from_args(args, ranks)
    _check_optimizer_support(cfg.ds_config, cfg.deepspeed_config)
    model = BertMultiTask(cfg)
    if cfg.use_pretrain:
        load_pretrained_weights(cfg, model.network)
    if cfg.compile:
        compile_model(model.network)
    groups = prepare_optimizer_parameters(cfg, model)
    # Blocks DeepSpeed 0.19 no longer knows (and refuses) are ours to read: sparse attention
    # (the model builds it) and progressive layer drop (theta computed in RunContext).
    engine_config = {k: v for k, v in cfg.ds_config.items()
                     if k not in ("sparse_attention", "progressive_layer_drop")}
    # "Lamb" off CUDA: our portable LAMB, since DeepSpeed's FusedLamb is a CUDA op.
    optimizer, engine_config = build_lamb_if_needed(engine_config, groups)
    model.network, optimizer, _, _ = deepspeed.initialize(model=model.network, model_parameters=groups,
                                                          optimizer=optimizer, config=engine_config)
    engine_sizes = (model.network.train_micro_batch_size_per_gpu(), model.network.gradient_accumulation_steps())
    if engine_sizes != (cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps):
        raise RuntimeError(f"DeepSpeed derived micro batch/accumulation {engine_sizes}, expected "
                           f"{(cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps)}")
    model.set_device(model.network.device)
    args.device = model.network.device
    args.fp16 = model.network.fp16_enabled()
    model.session = RunContext(cfg, RunState(
        seq_length=cfg.max_seq_length, micro_batch=cfg.train_micro_batch_size_per_gpu,
        grad_accum=cfg.gradient_accumulation_steps, world=ranks.world))
    return model, optimizer


# ---------------------------------------------------------------------------------------------
# Checkpoints (folders, tags, the completion marker and pruning: turing/checkpoint.py)



class CheckpointNotWritten(StopTraining):
    """A checkpoint could not be written (a full disk, ...): the run ends with one line; the
    half-written folder is gone, the previous checkpoints and `latest` are as they were."""


def checkpoint_model(PATH, ckpt_id, model, epoch, last_global_step, last_global_data_samples, **kwargs):
    """The original's call: save through the engine with the run position (its parameters are
    the client-state keys) and any other client state in `kwargs`. Training saves through
    save_checkpoint, which makes the checkpoint complete."""
    write_engine_checkpoint(model, PATH, ckpt_id, {"epoch": epoch, "last_global_step": last_global_step,
                                                   "last_global_data_samples": last_global_data_samples, **kwargs})


def write_engine_checkpoint(model, path, tag, client_state):
    """The engine's files of path/tag (every rank takes part) with `client_state`."""
    if not model.network.save_checkpoint(path, tag, client_state, save_latest=False):
        raise RuntimeError(f"checkpoint {path}/{tag} was not written")


def rng_states():
    """This rank's python, numpy and torch generator states, as tensors, ints, floats and strings:
    fine-tuning loaders open checkpoints with torch.load(..., weights_only=True), which refuses
    numpy arrays."""
    version, mt_state, gauss = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    states = {"python": [version, torch.tensor(mt_state, dtype=torch.int64), gauss],
              "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached_gaussian],
              "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def set_rng_states(states):
    """Restore what rng_states() saved (also the tuples and numpy arrays of older checkpoints)."""
    version, mt_state, gauss = states["python"]
    random.setstate((version, tuple(int(x) for x in mt_state), gauss))
    name, keys, pos, has_gauss, cached_gaussian = states["numpy"]
    np.random.set_state((name, np.asarray(keys).astype(np.uint32), pos, has_gauss, cached_gaussian))
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


def save_run_files(cfg, folder):
    """The job config and the resolved arguments next to a checkpoint (rank 0), on disk."""
    os.makedirs(folder, exist_ok=True)
    for name, content in (("job_config.json", cfg.config), ("args.json", cfg.arguments),
                          ("ds_config.json", cfg.ds_config)):
        write_atomic(os.path.join(folder, name), json.dumps(content, indent=2, default=str))


def save_checkpoint(cfg, model, state, tag):
    """A complete checkpoint, or none. The engine's files (every rank takes part, with every
    rank's RNG states in the client state) are fsync'ed by one rank per node, then rank 0
    writes the run files and the completion marker, then `latest`; older interval checkpoints
    are pruned (--keep_last_checkpoints).

    A write that fails (a full disk) ends the run with CheckpointNotWritten: the half-written
    folder is removed, the previous checkpoints and `latest` are untouched.
    """
    folder = os.path.join(cfg.saved_model_path, tag)
    ranks = model.session.ranks
    is_master = ranks.is_main
    if not parameters_finite(model.network):
        raise nonfinite_parameters_stop(cfg, tag, state)
    logger.info("Saving checkpoint %s", folder)
    try:
        marker = os.path.join(folder, COMPLETE_MARKER)
        if is_master and os.path.exists(marker):
            os.remove(marker)  # written again under the same tag: incomplete until whole again
        write_engine_checkpoint(model, cfg.saved_model_path, tag,
                                {**state.to_client_state(), "rng_states": _all_ranks(rng_states())})
        _barrier()
        if ranks.is_node_main:
            sync_folder(folder)
        _barrier()
        if is_master:
            save_run_files(cfg, folder)
            write_atomic(marker, json.dumps({"tag": tag, "global_step": state.global_step, "time": time.time()}))
            write_atomic(os.path.join(cfg.saved_model_path, "latest"), tag)
    except (OSError, RuntimeError) as e:  # torch's writer reports a full disk as a RuntimeError
        raise checkpoint_not_written(cfg, folder, e, ranks) from e
    if is_master:
        prune_interval_checkpoints(cfg.saved_model_path, cfg.keep_last_checkpoints, keep=tag)
    _barrier()
    return folder


def parameters_finite(engine):
    """Whether every parameter of the model is finite on every rank (ZeRO stage 3: each rank's
    partition)."""
    bad = torch.zeros((), device=engine.device)
    for p in engine.module.parameters():
        bad += (~torch.isfinite(getattr(p, "ds_tensor", p).detach())).sum()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(bad)
    return bad.item() == 0


def nonfinite_parameters_stop(cfg, tag, state):
    """The end of a run whose parameters are no longer finite: a checkpoint of them would be
    resumed into the same state, so none is written; the newest one on disk was checked when
    it was written."""
    complete = complete_tags(cfg.saved_model_path)
    newest = (f"the newest checkpoint, {complete[-1]}, holds finite weights: lower the learning rate (or "
              f"--lr_offset), then re-run with --auto_resume" if complete else "no checkpoint was written before")
    return StopTraining(f"parameters are not finite at global step {state.global_step} ({state.nonfinite_total} "
                        f"non-finite losses so far): checkpoint {tag} not written; {newest}", 3)


def checkpoint_not_written(cfg, folder, error, ranks):
    """The one-line end of a run whose checkpoint failed, after rank 0 removed the half-written
    folder (which frees the space it took, e.g. for the TensorBoard events still to flush)."""
    logger.debug("Checkpoint write failed", exc_info=error)
    free_mib = shutil.disk_usage(cfg.saved_model_path).free / 2**20  # as the failed write found it
    if ranks.is_main:
        shutil.rmtree(folder, ignore_errors=True)
    complete = complete_tags(cfg.saved_model_path)
    reason = (str(error).strip().splitlines() or [""])[0]
    newest = f"the newest complete checkpoint is {complete[-1]}" if complete else "no checkpoint yet"
    return CheckpointNotWritten(
        f"checkpoint {folder} could not be written ({type(error).__name__}: {reason}; {free_mib:.1f} MiB free "
        f"there): removed it; {newest}, `latest` unchanged. Free some space, then re-run with --auto_resume", 4)


def load_first_loadable(model, path, tag):
    """Load the first of resume_candidates(path, tag) that the engine loads and whose client
    state holds the run position; returns (tag, client state). Those that fail are warned about.
    Every file of a candidate loads weights-only, or the run stops (unless --trust_checkpoint)."""
    failed = []
    trust = model.session.config.trust_checkpoint
    for candidate in resume_candidates(path, tag):
        folder = os.path.join(path, candidate)
        logger.info("Restoring checkpoint %s", folder)
        check_weights_only(folder, trust)  # a file that would run code: one line, no fall-back
        check_checkpoint_fits(model, folder)  # another model size: likewise
        try:
            with weights_only_loads(trust):  # DeepSpeed asks for the full unpickler
                _, client_state = model.network.load_checkpoint(path, candidate)
        except Exception as e:  # noqa: BLE001 - torch and DeepSpeed raise many types for a file they cannot read
            why = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        else:
            missing = RunState.missing_keys(client_state or {})
            if client_state is None:
                why = "DeepSpeed could not load it"
            elif missing:
                why = (f"its client state lacks {', '.join(missing)}: not written by this program or the "
                       f"original Bing BERT")
            else:
                if failed:
                    logger.warning("Resuming from %s instead of %s", folder, ", ".join(failed))
                return candidate, client_state
        failed.append(candidate)
        logger.warning("Checkpoint %s does not load (%s)", folder, why)
    raise InputError(f"{path}: no checkpoint there loads (tried {', '.join(failed)}; reasons above); move the "
                     f"folder away to start fresh, or give another --job_name")


def check_checkpoint_fits(model, folder):
    """Refuse, in one line, a checkpoint whose model has other sizes than this run's (DeepSpeed's
    strict load would end in a long size-mismatch traceback). The model states file is mapped,
    not read; a file this check cannot open is left to DeepSpeed."""
    path = os.path.join(folder, MODEL_STATES_FILE)
    try:
        with weights_only_loads():
            saved = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        module = saved["module"]
        theirs = {k: tuple(v.shape) for k, v in module.items() if torch.is_tensor(v) and v.numel()}
    except Exception:  # noqa: BLE001 - not ours to judge: DeepSpeed's load reports it
        return
    if not theirs:
        return  # ZeRO stage 3 keeps the weights partitioned elsewhere
    ours = {k: tuple(v.shape) for k, v in model.network.module.state_dict().items()}
    differences = [f"{k} {theirs[k]} there, {ours[k]} here" for k in ours if k in theirs and theirs[k] != ours[k]]

    def layers(keys):
        return len({m.group(1) for m in (re.match(r"bert\.encoder\.layer\.(\d+)\.", k) for k in keys) if m})

    if layers(theirs) != layers(ours):
        differences.insert(0, f"{layers(theirs)} encoder layers there, {layers(ours)} here")
    if differences:
        raise InputError(f"{folder}: saved from a model of other sizes than this run's bert_model_config and "
                         f"vocab ({'; '.join(differences[:3])}); resume with the job config it was trained "
                         f"with (job_config.json beside it)")


def restore_run_state(cfg, state, saved, folder):
    """Take a checkpoint's run state `saved` into this session's `state`, by phase (the sequence
    length, which the run state records):

    - the same phase continues where it stopped: epoch, position inside the epoch, counters and
      the LR warmup start, whether or not --rewarmup is given (re-running phase 2's command,
      --rewarmup included, resumes it). A position inside an epoch carries over to another
      number of ranks, micro batch or accumulation of the same global batch
      (continue_epoch_on_this_layout).
    - another phase (the checkpoint was trained at another sequence length, or does not say):
      counters and epoch carry on, the position inside the epoch starts at 0, and --rewarmup
      restarts the LR warmup at the restored step, once (this phase's checkpoints record it).
    """
    for name in RunState.CLIENT_KEYS:
        if name not in RunState.LAYOUT:
            setattr(state, name, getattr(saved, name))
    state.restore_step = saved.global_step
    if saved.seq_length == state.seq_length:
        if saved.epoch_micro_step and saved.micro_batch:
            continue_epoch_on_this_layout(state, saved, folder)
        if cfg.rewarmup:
            logger.info("--rewarmup: %s was trained at sequence length %d like this run; continuing its "
                        "warmup from global step %d", folder, state.seq_length, state.rewarmup_offset)
        return
    trained_at = f"sequence length {saved.seq_length}" if saved.seq_length else "an unrecorded sequence length"
    state.epoch_micro_step = 0
    state.rewarmup_offset = saved.global_step if cfg.rewarmup else saved.rewarmup_offset
    logger.info("%s was trained at %s, this run at %d: a new phase, starting at the beginning of epoch %d%s",
                folder, trained_at, state.seq_length, state.epoch + 1,
                f", LR re-warmed from global step {saved.global_step}" if cfg.rewarmup else "")


def continue_epoch_on_this_layout(state, saved, folder):
    """A checkpoint saved inside an epoch: its position (micro batches per rank, counted in the
    saving run's layout) in this run's, and the layout whose sample order the epoch follows to
    its end (the one it began with; the providers deal its remaining steps over this run's ranks).
    A position counts whole optimizer steps, the same on any layout of the same global batch;
    another global batch is refused."""
    saved_layout = EpochPlan(saved.world or state.world, saved.micro_batch, saved.grad_accum)
    plan = EpochPlan(saved.plan_world, saved.plan_micro_batch, saved.plan_grad_accum) if saved.plan_world \
        else saved_layout
    if plan.global_batch != state.layout().global_batch:
        raise InputError(
            f"{folder}: saved inside epoch {saved.epoch + 1} (after {saved.epoch_micro_step // saved.grad_accum} "
            f"optimizer steps) with a global batch of {plan.global_batch} ({plan.world} ranks x micro batch "
            f"{plan.micro_batch} x gradient accumulation {plan.grad_accum}); this run's is "
            f"{state.layout().global_batch} ({state.world} x {state.micro_batch} x {state.grad_accum}). Ranks, micro "
            f"batch and accumulation may change inside an epoch, the global batch may not: resume with the DeepSpeed "
            f"config saved beside it (ds_config.json), or from an epoch-end checkpoint (epoch{{E}}_step{{S}})")
    state.epoch_micro_step = saved.epoch_micro_step // saved.grad_accum * state.grad_accum
    state.plan_world, state.plan_micro_batch, state.plan_grad_accum = plan if plan != state.layout() else (0, 0, 0)
    if saved_layout != state.layout():
        logger.info("%s: epoch %d was saved on %d ranks x micro batch %d x accumulation %d and began on %d x %d x %d; "
                    "its remaining samples are dealt over this run's %d x %d x %d", folder, saved.epoch + 1,
                    *saved_layout, *plan, *state.layout())


def load_training_checkpoint(args, model, PATH, ckpt_id):
    """Restore engine, optimizer, the session's run state and the RNG states from PATH/ckpt_id
    (or, where that one does not load, the newest older checkpoint that does, with a warning);
    returns (epoch, last_global_step, last_global_data_samples) as the original did."""
    ckpt_id, client_state = load_first_loadable(model, PATH, ckpt_id)
    folder = os.path.join(PATH, ckpt_id)
    cfg = model.session.config
    saved = RunState.from_client_state(client_state)
    restore_run_state(cfg, model.session.state, saved, folder)
    rank, world = model.session.ranks.rank, model.session.ranks.world
    saved_rng = client_state.get("rng_states")
    if saved_rng is not None and len(saved_rng) == world:
        set_rng_states(saved_rng[rank])
    elif saved_rng is not None:
        # Per-rank states do not map onto another number of ranks: every rank re-seeds its
        # python, numpy and torch generators (dropout) with --seed + the restored global step,
        # as a fresh run seeds them with --seed. The data order and masking do not draw from them.
        set_seeds(model.session.config.seed + saved.global_step)
        logger.warning("Checkpoint saved by %d ranks, running %d: random generators re-seeded with --seed + "
                       "global step (%d)", len(saved_rng), world, model.session.config.seed + saved.global_step)
    return saved.epoch, saved.global_step, saved.global_data_samples


UNIVERSAL_FOLDER = "universal"  # OUT/saved_models/JOB/universal/TAG: TAG converted for another number of ranks
ZERO_OPTIM_FILE = re.compile(r"(bf16_)?zero_pp_rank_\d+_mp_rank_00_optim_states\.pt")


def zero_partitions(folder):
    """The number of ranks a ZeRO checkpoint's optimizer states are partitioned over (0: not ZeRO)."""
    return sum(bool(ZERO_OPTIM_FILE.fullmatch(name)) for name in os.listdir(folder))


def universal_resume(cfg):
    """A ZeRO checkpoint partitioned over another number of ranks than this run's loads through
    DeepSpeed's universal checkpoint: rank 0 converts the tag a resume will load (once; kept in
    SOURCE/universal/TAG) with `python -m deepspeed.checkpoint.ds_to_universal`, and the engine is
    built with checkpoint.load_universal. Returns the RunConfig to build the engine with."""
    path, tag = resume_source(cfg)
    if path is None:
        return cfg
    tag = resume_candidates(path, tag, warn=lambda *_: None)[0]
    folder = os.path.join(path, tag)
    saved = zero_partitions(folder)
    if not saved or saved == cfg.ranks.world:
        return cfg
    target = os.path.join(path, UNIVERSAL_FOLDER, tag)
    if cfg.ranks.is_main and not os.path.isfile(os.path.join(target, COMPLETE_MARKER)):
        logger.info("%s: ZeRO states of %d ranks, this run has %d: converting to a universal checkpoint in %s",
                    folder, saved, cfg.ranks.world, target)
        check_weights_only(folder, cfg.trust_checkpoint)
        shutil.rmtree(target, ignore_errors=True)
        # ds_to_universal unpickles in full: run it with every load weights-only (turing.safe_run)
        runner = ["-m"] if cfg.trust_checkpoint else ["-m", "turing.safe_run"]
        command = [sys.executable, *runner, "deepspeed.checkpoint.ds_to_universal", "--input_folder", folder,
                   "--output_folder", target, "--inject_missing_state"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (REPO, os.environ.get("PYTHONPATH"))))}
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise InputError(f"{folder}: saved by {saved} ranks with ZeRO, and its conversion for {cfg.ranks.world} "
                             f"ranks failed (ds_to_universal: {last}); resume on {saved} ranks")
        write_atomic(os.path.join(target, COMPLETE_MARKER), json.dumps({"tag": tag, "from": folder}))
    _barrier()
    checkpoint = {**cfg.ds_config.get("checkpoint", {}), "load_universal": True}
    return dataclasses.replace(cfg, ds_config={**cfg.ds_config, "checkpoint": checkpoint})


def resume_source(cfg):
    """(folder, tag) the run resumes from, or (None, None) for a fresh start: --auto_resume takes
    the run's own folder when it holds any checkpoint, else --load_training_checkpoint."""
    if cfg.auto_resume and holds_checkpoints(cfg.saved_model_path):
        return cfg.saved_model_path, "latest"
    return cfg.load_training_checkpoint, cfg.load_checkpoint_id


def load_checkpoint(args, model):
    """Restore from --auto_resume (OUT/saved_models/JOB/latest, when there) or from
    --load_training_checkpoint/--load_checkpoint_id into the session's run state; returns the
    epoch to start at (0 without a checkpoint)."""
    # the original's callers may set the resume flags on `args` after the model is built
    cfg = dataclasses.replace(model.session.config, auto_resume=args.auto_resume,
                              load_training_checkpoint=args.load_training_checkpoint,
                              load_checkpoint_id=args.load_checkpoint_id)
    path, tag = resume_source(cfg)
    if cfg.auto_resume and path == cfg.saved_model_path:
        logger.info("--auto_resume: resuming from %s", path)
    elif cfg.auto_resume:
        logger.info("--auto_resume: no checkpoint in %s yet, %s", cfg.saved_model_path,
                    "starting from --load_training_checkpoint" if path else "starting fresh")
    state = model.session.state
    if path is None:
        return state.epoch
    if cfg.ds_config.get("checkpoint", {}).get("load_universal"):  # converted by universal_resume
        path, tag = os.path.join(path, UNIVERSAL_FOLDER), resume_candidates(path, tag, warn=lambda *_: None)[0]
    epoch, step, samples = load_training_checkpoint(args, model, path, tag)
    logger.info("Resumed at epoch %d (micro-batch %d), global step %d, %d samples", epoch + 1,
                state.epoch_micro_step, step, samples)
    return epoch


# ---------------------------------------------------------------------------------------------
# Learning rate


def lr_factor(schedule, step, training, budget_fraction=None):
    """Multiplier of the base learning rate at `step` (counted from the warmup start).

    LE/EE/EP are the original's schedules. WSD (warmup-stable-decay): linear warmup over
    warmup_proportion, 1.0, then a cool-down to 0 over the final cooldown_proportion of
    total_training_steps, `linear` (1 - t) or `1-sqrt` (1 - sqrt t) by cooldown_shape.
    budget: the same shape over `budget_fraction`, the share of --max_train_hours spent, so a
    run stopped by its time budget ends annealed whatever its speed.

    A new schedule is one more branch here (construct_arguments refuses names this function
    does not know), plus its line in --help.
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
    raise ValueError(f"unknown --lr_schedule {schedule!r}")


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


def budget_fraction(cfg, state, ctx, device):
    """The share of --max_train_hours spent (summed over sessions) for the budget schedule, the
    largest over ranks so every rank sets the same LR; None for the other schedules."""
    if cfg.lr_schedule != "budget":
        return None
    spent = torch.tensor([state.train_seconds + time.time() - ctx.session_start], dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(spent, op=dist.ReduceOp.MAX)
    return spent.item() / (cfg.max_train_hours * 3600)


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


THROUGHPUT_PERIOD = 20  # optimizer steps between throughput points (the progress period is --print_steps)


def write_metrics(writer, step, values):
    """The one place metrics reach TensorBoard: every {tag: value} at x = `step`. A string is
    written as text, a list or array of numbers as a histogram, anything else as a scalar.
    Without a writer (ranks other than 0) nothing is written."""
    if writer is None:
        return
    for tag, value in values.items():
        if isinstance(value, str):
            writer.add_text(tag, value, step)
        elif isinstance(value, (list, tuple, np.ndarray)):
            writer.add_histogram(tag, np.asarray(value), step)
        else:
            writer.add_scalar(tag, value, step)


class Reporter:
    """TensorBoard (rank 0) + progress lines. Every metric goes through `log(step, {tag: value})`.
    Losses stay on the device until a progress step (every --print_steps optimizer steps);
    throughput is measured over THROUGHPUT_PERIOD steps."""

    def __init__(self, cfg):
        self.config = cfg
        self.ranks = ranks = cfg.ranks
        self.is_master = ranks.is_main
        self.writer = None
        if ranks.is_main:
            # a unique suffix: a resumed session in the same second must not overwrite the file
            self.writer = SummaryWriter(cfg.tensorboard_path, filename_suffix=f".{os.getpid()}.{time.time_ns()}")
        self.pending = []          # (step, samples, lr, loss tensor) not yet written
        self.fp16_skipped = 0      # the engine's count of overflow-skipped steps, last seen
        self.window = (time.time(), 0, 0.0)  # start, samples, data wait seconds
        self.train_seconds = None  # training time at the end of the last optimizer step

    def log(self, step, values):
        """Write {tag: value} at x = `step` (rank 0; a no-op elsewhere)."""
        write_metrics(self.writer, step, values)

    def step(self, state, lr, loss, data_wait, engine, ctx):
        self.pending.append((state.global_step, state.global_data_samples, lr, loss))
        self.train_seconds = state.train_seconds + time.time() - ctx.session_start
        if self.writer is not None:
            coeffs = find_lamb_coeffs(engine)
            if coeffs:
                self.log(state.global_step, {"Train/lamb_coeffs": coeffs})
            if self.config.progressive_layer_drop:
                self.log(state.global_step, {"Train/pld_theta": ctx.pld_theta(state.global_step - 1)})
            if engine.fp16_enabled() and engine.skipped_steps != self.fp16_skipped:
                # DeepSpeed's dynamic loss scale skipped this step (gradient overflow)
                self.fp16_skipped = engine.skipped_steps
                logger.warning("fp16 overflow: step %d skipped by the loss scaler (%d in all)",
                               state.global_step, self.fp16_skipped)
                self.log(state.global_step, {"Train/fp16_skipped_steps": self.fp16_skipped})
        start, samples, waited = self.window
        samples += self.config.train_micro_batch_size_per_gpu * self.config.gradient_accumulation_steps * \
            self.ranks.world
        self.window = (start, samples, waited + data_wait)
        if state.global_step % self.config.print_steps == 0:
            self.flush()
        if state.global_step % THROUGHPUT_PERIOD == 0:
            self.throughput(state.global_step)

    def flush(self, to_disk=False):
        """Write pending step metrics; `to_disk`: also the TensorBoard file (before a checkpoint,
        so that a disk the checkpoint fills up keeps this session's curves)."""
        if self.pending:
            self._write_pending()
        if to_disk and self.writer is not None:
            self.writer.flush()

    def _write_pending(self):
        losses = torch.stack([p[3] for p in self.pending]).float().cpu().tolist()  # one sync
        for (step, samples, lr, _), loss in zip(self.pending, losses):
            self.log(step, {"Train/lr": lr})
            self.log(samples, {"Train/Samples/train_loss": loss, "Train/Samples/lr": lr})
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
        self.log(step, {"Train/samples_per_sec": rate, "Train/tokens_per_sec": rate * self.config.max_seq_length,
                        "Train/data_wait_fraction": waited / elapsed})
        self.window = (now, 0, 0.0)

    def validation(self, state, index, epoch_end, loss, mlm_acc, nsp_acc):
        """A validation result: by epoch (`Validation/*`, x = epoch number) at an epoch's end, and
        always by global step with the training time it took to get there (`Validation/step/*`
        and `Validation/train_minutes`, x = global step), so accuracy can be plotted against
        steps or minutes whatever the epoch length. The NSP accuracy is left out when None."""
        minutes = (state.train_seconds if self.train_seconds is None else self.train_seconds) / 60
        if self.is_master:
            logger.info("Validation at step %d after %.2f min of training: loss=%.6f, mlm_accuracy=%.4f",
                        state.global_step, minutes, loss, mlm_acc)
        values = {"Loss": loss, "MLM_accuracy": mlm_acc, **({} if nsp_acc is None else {"NSP_accuracy": nsp_acc})}
        if epoch_end:
            self.log(index + 1, {f"Validation/{k}": v for k, v in values.items()})
        self.log(state.global_step, {"Validation/train_minutes": minutes,
                                     **{f"Validation/step/{k}": v for k, v in values.items()}})

    def close(self):
        self.flush()
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError as e:  # a full disk: what flush(to_disk=True) wrote before stays
                logger.warning("TensorBoard: the last events could not be written (%s)", e)


def report_step_metrics(args, lr, loss, step, data_sample_count, writer=None):
    """The original's call: one optimizer step's metrics to `writer`, under the original's tags
    (Train/lr by step, Train/Samples/train_loss and Train/Samples/lr by samples seen); the
    training loop writes the same through Reporter.log."""
    write_metrics(writer, step, {"Train/lr": lr})
    write_metrics(writer, data_sample_count, {"Train/Samples/train_loss": loss, "Train/Samples/lr": lr})


def report_lamb_coefficients(args, optimizer, writer=None, step=0):
    """The last step's LAMB coefficients (None without LAMB), written as the `Train/lamb_coeffs`
    histogram at `step` when a writer is given. `optimizer`: DeepSpeed's optimizer or the engine."""
    coeffs = find_lamb_coeffs(optimizer)
    if coeffs:
        write_metrics(writer, step, {"Train/lamb_coeffs": coeffs})
    return coeffs


# ---------------------------------------------------------------------------------------------
# Data


def get_dataloader(args, dataset, eval_set=False):
    """A DataLoader over a map-style dataset (validation uses micro/2 per batch)."""
    batch_size = args.train_micro_batch_size_per_gpu
    if eval_set:
        batch_size = max(1, batch_size // 2)
    ranks = Ranks.current()
    if ranks.world > 1:
        sampler = DistributedSampler(dataset, num_replicas=ranks.world, rank=ranks.rank, shuffle=False)
    else:
        sampler = SequentialSampler(dataset)
    # its own generator: building the iterator must not draw from the global torch RNG
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=_as_batch,
                      generator=torch.Generator().manual_seed(args.seed))


def _as_batch(items):
    if isinstance(items, Batch):
        return items
    return collate_batch(items)


# The data formats: name -> provider (a module at the repository root). Training reads the format
# the job config's data.format names, else the original's switch: --use_nvidia_dataset "nvidia",
# without it "bing". A validation folder is read by the first format that recognises it.
DATA_FORMATS = {"nvidia": NvidiaBertDatasetProvider, "bing": BingBertDatasetProvider}


def build_provider(args):
    """The training data provider of the run's data format (see DATA_FORMATS)."""
    name = args.config["data"].get("format") or ("nvidia" if args.use_nvidia_dataset else "bing")
    if name not in DATA_FORMATS:
        raise InputError(f"{args.config_file}: data.format '{name}' is not a known data format; "
                         f"expected one of {', '.join(DATA_FORMATS)}")
    return DATA_FORMATS[name](args)


def open_validation_set(args):
    """The validation set of the job config (NVIDIA hdf5 files or Bing numpy shards, as the
    folder holds), read and checked whole; once per run (check_run_inputs, before the model is
    built; the session keeps it)."""
    path = os.path.join(args.validation_data_path_prefix,
                        _require(args.config, ["validation", "path"], args.config_file))
    if not os.path.isdir(path):
        raise InputError(f"{path}: validation folder not found (validation.path under "
                         f"--validation_data_path_prefix)")
    if not os.listdir(path):
        raise InputError(f"{path}: validation folder is empty; expected NVIDIA .hdf5 files or Bing shard "
                         f"folders (validation.path under --validation_data_path_prefix)")
    provider = next(p for p in DATA_FORMATS.values() if p.holds_validation_set(path))
    return provider.validation_dataset(path, args)


def check_run_inputs(cfg, provider):
    """What the run will read, checked before the model is built, so that a bad path or file
    costs seconds, not an epoch: the layout of every training shard, the validation set (read
    whole; returned, None without one), and the checkpoint a resume will load (there, and its
    files not cut short)."""
    provider.check_shards()
    validation = None
    if cfg.validation_data_path_prefix and not cfg.finetune:
        validation = open_validation_set(cfg)
    path, tag = resume_source(cfg)
    if path is not None:
        resume_candidates(path, tag, warn=lambda *_: None)  # the load warns, once
    return validation


SHARED_PROBE = ".shared_probe"  # OUT/saved_models/JOB/.shared_probe.HOST.PID, during the check


def check_output_shared(cfg):
    """Every rank must see the folder rank 0 writes checkpoints to: a checkpoint is the files of
    all ranks (ZeRO's partitions, each node's fsync) plus rank 0's marker and `latest`, and a
    resume reads them back on any node. Rank 0 writes a probe file there with a token only this
    run knows; a rank that does not find it (a node-local --output_dir on a multi-node job) stops
    every rank with one line naming the ranks and hosts, before anything is trained or written."""
    if cfg.ranks.world == 1:
        return
    mine = None
    if cfg.ranks.is_main:  # a name and a content of this run's own, whatever else runs there
        mine = (os.path.join(cfg.saved_model_path, f"{SHARED_PROBE}.{socket.gethostname()}.{os.getpid()}"),
                str(time.time_ns()))
        write_atomic(*mine)
    probe, token = _all_ranks(mine)[0]
    try:
        with open(probe, encoding="utf-8") as f:
            seen = f.read() == token
    except OSError:
        seen = False
    seen_by = _all_ranks((seen, socket.gethostname()))
    if cfg.ranks.is_main:
        os.remove(probe)
    blind = [f"rank {rank} on {host}" for rank, (ok, host) in enumerate(seen_by) if not ok]
    if blind:
        raise InputError(f"--output_dir {cfg.output_dir}: {', '.join(blind)} cannot see the files rank 0 writes to "
                         f"{cfg.saved_model_path}; checkpoints need a folder every node sees (a shared file "
                         f"system), not node-local scratch")


def claim_job_folder(cfg):
    """One run per OUT/saved_models/JOB at a time; returns the lock (an open file; the run
    holds it until it closes it or ends, however it ends, as the OS then drops it), or None
    on ranks other than 0.

    A second run of the job, while one runs, stops here with the holder's pid and host. So does
    a fresh run (neither --auto_resume nor --load_training_checkpoint) where checkpoints exist
    already: it would write over them and mix its TensorBoard curves with theirs.
    """
    folder = cfg.saved_model_path
    lock = None
    if cfg.ranks.is_main:
        lock_path = f"{folder}.lock"
        lock = open(lock_path, "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown process"
            lock.close()
            raise InputError(f"{folder} is in use by another run ({holder}; lock {lock_path}); wait for it to "
                             f"end, or give another --job_name or --output_dir") from None
        lock.truncate(0)
        lock.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        lock.flush()
    if not cfg.auto_resume and cfg.load_training_checkpoint is None and holds_checkpoints(folder):
        if lock is not None:
            lock.close()
        raise InputError(f"{folder} already holds checkpoints ({', '.join(engine_tags(folder)[-3:]) or 'latest'}); "
                         f"re-run with --auto_resume to continue that run, or give a new --job_name or "
                         f"--output_dir for a new one")
    return lock


# ---------------------------------------------------------------------------------------------
# Validation


def pretrain_validation(args, index, model, epoch_end=True):
    """Loss and MLM accuracy over the validation set, averaged over all ranks; None without
    --validation_data_path_prefix. Written to the session's reporter: by epoch (at an epoch's
    end) and by global step with the training minutes."""
    cfg = model.session.config
    if cfg.validation_data_path_prefix is None:
        return None
    if model.session.validation_set is None:
        model.session.validation_set = open_validation_set(cfg)
    loader = get_dataloader(cfg, model.session.validation_set, eval_set=True)
    model.eval()
    device = model.network.device
    # loss sum, batches, MLM correct, masked tokens, NSP correct, sequences
    totals = torch.zeros(6, dtype=torch.float64, device=device)
    with torch.no_grad():
        for batch in loader:
            batch = model.move_batch(batch)
            # One forward for the scores (for the accuracies); the loss is the model's, in fp32.
            scores, nsp_scores = model.network(batch._replace(masked_lm_labels=None))
            labels = batch.masked_lm_labels
            masked = labels != -1
            loss = pretraining_loss(masked_lm_loss_of_scores(scores, labels),
                                    nsp_scores.float() if cfg.next_sentence_prediction else None,
                                    batch.next_sentence_labels)
            correct = (scores.argmax(-1) == labels) & masked
            nsp_correct = nsp_scores.argmax(-1) == batch.next_sentence_labels
            totals += torch.stack([loss.double(), torch.ones((), dtype=torch.float64, device=device),
                                   correct.sum().double(), masked.sum().double(),
                                   nsp_correct.sum().double(),
                                   torch.tensor(float(len(labels)), dtype=torch.float64, device=device)])
    if dist.is_initialized():
        dist.all_reduce(totals)
    if totals[5] == 0:
        raise InputError(f"{os.path.join(cfg.validation_data_path_prefix, cfg.config['validation']['path'])}: "
                         f"the validation set has no sequences (validation.path under --validation_data_path_prefix)")
    model.train()
    loss, mlm_acc, nsp_acc = (totals[[0, 2, 4]] / totals[[1, 3, 5]].clamp(min=1)).tolist()
    if not cfg.next_sentence_prediction:
        nsp_acc = None  # the NSP head is not trained: its accuracy means nothing
    logger.info("Validation epoch %d: loss=%.6f, mlm_accuracy=%.4f, nsp_accuracy=%s", index + 1, loss,
                mlm_acc, "off" if nsp_acc is None else f"{nsp_acc:.4f}")
    model.session.reporter.validation(model.session.state, index, epoch_end, loss, mlm_acc, nsp_acc)
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
    """SIGTERM/SIGINT, and the end of the deepspeed launcher: the first asks for a checkpoint at
    the end of the current optimizer step; a second signal exits at once. Copies arriving within
    REPEAT_WINDOW seconds of the first are the same request: a scheduler signalling the whole
    process group reaches a rank twice, directly and through the deepspeed launcher, which
    forwards SIGTERM. (The data providers' helper processes ignore these signals, so that the
    rank can finish its step and write the checkpoint with them.)"""

    REPEAT_WINDOW = 2.0
    LAUNCHER_GONE = int(signal.SIGHUP)  # the code a stop for a vanished launcher goes by

    def __init__(self):
        self.received = None
        self.received_at = None
        self.reason = None
        self._previous = {}
        self._watch = None

    def install(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        if LauncherWatch.applies():
            self._watch = LauncherWatch(self)
            self._watch.start()

    def uninstall(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._watch is not None:
            self._watch.stop()

    def _handle(self, signum, frame):
        if self.received is not None:
            if time.time() - self.received_at < self.REPEAT_WINDOW:
                return
            os._exit(128 + signum)
        self.request(signum, f"Received {signal.Signals(signum).name}")

    def request(self, code, reason):
        """Ask for a stop with a checkpoint (from a signal handler or the launcher watch)."""
        if self.received is not None:
            return
        self.received, self.received_at, self.reason = code, time.time(), reason
        logger.warning("%s: stopping after this optimizer step with a checkpoint (a signal sent again "
                       "exits at once)", reason)

    def describe(self, code):
        """The stop reason of `code`, which may have come from another rank."""
        if code == self.LAUNCHER_GONE:
            seen = self.reason if self.received == code else "seen by another rank"
            return f"stopped: the deepspeed launcher is gone ({seen})"
        return f"stopped by {signal.Signals(code).name}"


def _proc_parent(pid):
    """The parent pid of process `pid`, read from /proc (Linux); None once it has gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _proc_cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


class LauncherWatch(threading.Thread):
    """Stops the rank (through StopSignals.request) once its launcher is gone.

    The deepspeed command runs launch.py, which runs the ranks. Killed alone, the command exits
    and leaves launch.py and the ranks training; launch.py killed with SIGKILL leaves the ranks.
    This thread polls /proc once a second: when launch.py is no longer this rank's parent, or the
    deepspeed command no longer launch.py's, it asks for a stop as SIGTERM does. It runs only
    under launch.py; the command above it is watched only when it is deepspeed's runner (a shell
    that ran launch.py itself may end without stopping the run).
    """

    POLL_SECONDS = 1.0

    def __init__(self, signals):
        super().__init__(name="LauncherWatch", daemon=True)
        self.signals = signals
        self.launch_pid = os.getppid()
        runner = _proc_parent(self.launch_pid)
        command = _proc_cmdline(runner) if runner else []
        is_runner = ("deepspeed.launcher.runner" in command
                     or any(os.path.basename(a) in ("deepspeed", "ds") for a in command[:2]))
        self.runner_pid = runner if is_runner else None
        self._done = threading.Event()

    @staticmethod
    def applies():
        return any("deepspeed.launcher.launch" in a for a in _proc_cmdline(os.getppid()))

    def run(self):
        while not self._done.wait(self.POLL_SECONDS):
            if os.getppid() != self.launch_pid:
                gone = f"launch.py (pid {self.launch_pid}) has ended"
            elif self.runner_pid is not None and _proc_parent(self.launch_pid) != self.runner_pid:
                gone = f"the deepspeed command (pid {self.runner_pid}) has ended"
            else:
                continue
            self.signals.request(StopSignals.LAUNCHER_GONE, gone)
            return

    def stop(self):
        self._done.set()


def step_checks(cfg, state, loss, signals, session_start, engine):
    """Once per optimizer step: is the loss finite, was a stop signal received, is the time
    budget spent. Ranks agree (one small all-reduce) so they stop or skip at the same step."""
    over_time = (cfg.max_train_hours is not None and
                 state.train_seconds + time.time() - session_start >= cfg.max_train_hours * 3600)
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


def epoch_micro_batches_allowed(cfg, start):
    """Micro-batches epoch may still run from position `start` under --max_steps_per_epoch,
    which counts the epoch's optimizer steps whichever session ran them."""
    return max(0, cfg.max_steps_per_epoch * cfg.gradient_accumulation_steps - start)


def train(args, index, model, optimizer, pretrain_dataset_provider, finetune=False):
    """One epoch of the step loop, from the session's position in epoch `index` on (the run
    state, reporter and stop signals are `model.session`'s). Returns the stop reason: None
    (epoch done), "max_steps" or "time"; raises StopTraining after a signal or too many
    non-finite losses, once the checkpoint is written. `finetune` is the original's parameter,
    kept for its callers: validation is run()'s business (skipped with --finetune)."""
    ctx = model.session
    cfg = ctx.config
    state, reporter = ctx.state, ctx.reporter
    engine = model.network
    if index != state.epoch:  # a caller's choice of epoch (the original's train(args, index, ...))
        state.epoch, state.epoch_micro_step = index, 0
    start = state.epoch_micro_step
    if start == 0:  # an epoch begins on this run's layout
        state.plan_world = state.plan_micro_batch = state.plan_grad_accum = 0
    plan = state.epoch_plan()
    refs, local_total = pretrain_dataset_provider.get_shard(index, start_batch=start,
                                                            **({"plan": plan} if plan else {}))
    pretrain_dataset_provider.prefetch_shard(index + 1)
    total = agreed_step_count(local_total, engine.device)
    if total < local_total:
        logger.warning("Epoch %d: this rank has %d micro-batches left, runs %d like the shortest rank "
                       "(%d samples unused)", index + 1, local_total, total,
                       (local_total - total) * cfg.train_micro_batch_size_per_gpu)
    total = min(total, epoch_micro_batches_allowed(cfg, start))
    samples_per_micro = cfg.train_micro_batch_size_per_gpu * ctx.ranks.world
    accum = cfg.gradient_accumulation_steps
    step_loss, data_wait, stop = None, 0.0, None
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
        nonfinite, signum, over_time = step_checks(cfg, state, step_loss, ctx.signals, ctx.session_start, engine)
        if nonfinite:
            handle_nonfinite(cfg, model, optimizer, state, reporter, ctx)
        else:
            state.nonfinite_in_a_row = 0
            lr = update_learning_rate(cfg, cfg.config, state.global_step, optimizer, state.rewarmup_offset,
                                      budget_fraction(cfg, state, ctx, engine.device))
            engine.step()
            state.global_step += 1
            reporter.step(state, lr, step_loss, data_wait, engine, ctx)
        step_loss, data_wait = None, 0.0
        if signum:
            bar.close()
            stop_with_checkpoint(cfg, model, state, reporter, ctx, ctx.signals.describe(signum), 128 + signum)
        if over_time:
            stop = "time"
        elif is_time_to_exit(cfg, global_steps=state.global_step - state.restore_step):
            stop = "max_steps"
        if cfg.checkpoint_every_steps and state.global_step % cfg.checkpoint_every_steps == 0 \
                and not nonfinite and stop is None and state.epoch_micro_step < start + total:
            reporter.flush(to_disk=True)
            save_checkpoint(cfg, model, ctx.with_time(state), f"step{state.global_step}")
        if stop:
            break
        if cfg.validation_every_steps and state.global_step % cfg.validation_every_steps == 0 \
                and not nonfinite and state.epoch_micro_step < start + total:
            validate_in_epoch(cfg, index, model, reporter, state, ctx)
    bar.close()
    reporter.flush()
    pretrain_dataset_provider.release_shard(index)
    if stop is None or state.epoch_micro_step >= start + total:
        state.epoch, state.epoch_micro_step = index + 1, 0
    return stop


def validate_in_epoch(cfg, index, model, reporter, state, ctx):
    """--validation_every_steps: validate now (the end of an epoch or run validates in run());
    the time it takes is not training time (the clock of --max_train_hours and of the budget
    schedule is moved on by it)."""
    started = time.time()
    pretrain_validation(cfg, index, model, epoch_end=False)
    ctx.session_start += time.time() - started


def handle_nonfinite(cfg, model, optimizer, state, reporter, ctx):
    """Skip the step; after --max_nonfinite_steps in a row, checkpoint and stop."""
    skip_step(model.network, optimizer)
    state.nonfinite_in_a_row += 1
    state.nonfinite_total += 1
    logger.warning("Non-finite loss at global step %d: step skipped (%d in a row, %d in all)",
                   state.global_step + 1, state.nonfinite_in_a_row, state.nonfinite_total)
    reporter.log(state.global_step + 1, {"Train/nonfinite_steps": state.nonfinite_total})
    if state.nonfinite_in_a_row >= cfg.max_nonfinite_steps:
        stop_with_checkpoint(cfg, model, state, reporter, ctx,
                             f"{state.nonfinite_in_a_row} non-finite losses in a row (--max_nonfinite_steps); "
                             f"lower the learning rate or check the data", 3)


def stop_with_checkpoint(cfg, model, state, reporter, ctx, reason, exit_code):
    reporter.flush(to_disk=True)
    folder = save_checkpoint(cfg, model, ctx.with_time(state), f"step{state.global_step}")
    raise StopTraining(f"{reason}; checkpoint of global step {state.global_step} in {folder} "
                       f"(re-run with --auto_resume to continue)", exit_code)


class RunContext:
    """One training session: its RunConfig (`config`, with the ranks), the run state (saved in
    checkpoints), the reporter, stop signals and the session's clock. prepare_model_optimizer()
    keeps it on the model (`model.session`), where the original's calls, which pass only
    (args, model, ...), find it."""

    def __init__(self, cfg, state):
        self.config = cfg
        self.ranks = cfg.ranks
        self.state = state
        self.signals = StopSignals()
        self.session_start = time.time()
        self._reporter = None
        self.validation_set = None  # opened once per run, at the first validation (or by check_run_inputs)

    @property
    def reporter(self):
        """TensorBoard (rank 0) and progress lines, opened at first use."""
        if self._reporter is None:
            self._reporter = Reporter(self.config)
        return self._reporter

    def close(self):
        self.signals.uninstall()
        if self._reporter is not None:
            self._reporter.close()

    def with_time(self, state):
        """The run state with this session's training time added (for a checkpoint)."""
        return dataclasses.replace(state, train_seconds=state.train_seconds + time.time() - self.session_start)

    def pld_theta(self, step):
        """Progressive layer drop keep-rate: theta(t) = (1 - theta_bar) exp(-gamma t) + theta_bar."""
        block = self.config.ds_config["progressive_layer_drop"]
        theta_bar, gamma = block.get("theta", 0.5), block.get("gamma", 0.001)
        return (1.0 - theta_bar) * math.exp(-gamma * step) + theta_bar

    def pld_kwargs(self, step):
        if not self.config.progressive_layer_drop:
            return {}
        return {"progressive_layer_drop": True, "pld_theta": self.pld_theta(step)}


def run(args, model, optimizer, start_epoch, provider=None):
    """The epoch loop from epoch `start_epoch`: train, checkpoint, validate. The checkpoint comes
    first, so that nothing failing after an epoch (validation included) costs the epoch. A stop
    (--max_steps, --max_train_hours) inside an epoch leaves a step{S} checkpoint that remembers
    the position in the epoch. Validation follows every epoch and a run's end by --max_steps or
    --max_train_hours, once; a signal or non-finite stop ends the run without it. The session is
    `model.session`; without a `provider` (the original's call) run() opens the job config's
    data itself and closes it at the end."""
    if provider is None:
        provider = build_provider(args)
        try:
            return run(args, model, optimizer, start_epoch, provider)
        finally:
            provider.close()
    ctx = model.session
    cfg = ctx.config
    state, reporter = ctx.state, ctx.reporter
    ctx.session_start = time.time()
    num_epochs = cfg.config["training"]["num_epochs"]
    if start_epoch >= num_epochs:
        logger.warning("Nothing to do: the checkpoint has finished %d of %d epochs", start_epoch, num_epochs)
    for index in range(start_epoch, num_epochs):
        logger.info("Training epoch %d of %d", index + 1, num_epochs)
        started = time.time()
        stop = train(args, index, model, optimizer, provider)
        epoch_done = state.epoch == index + 1
        reporter.flush(to_disk=True)
        if epoch_done and (cfg.ckpt_to_save is None or state.epoch in cfg.ckpt_to_save):
            save_checkpoint(cfg, model, ctx.with_time(state), f"epoch{state.epoch}_step{state.global_step}")
        elif stop is not None:
            save_checkpoint(cfg, model, ctx.with_time(state), f"step{state.global_step}")
        if cfg.validation_data_path_prefix and not cfg.finetune:
            pretrain_validation(args, index, model)
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
    except InputError as e:
        # Bad input (configs, paths, shards, checkpoints): one line, no traceback, unless --debug.
        # Any other exception is a crash and keeps its traceback.
        if "--debug" in (sys.argv if argv is None else argv):
            raise
        print(f"error: {e} (run with --debug for a traceback)", file=sys.stderr)
        raise SystemExit(2) from None
    except StopTraining as e:
        logger.error("%s", e)
        raise SystemExit(e.exit_code) from None
    except RuntimeError as e:
        # A collective failed: a peer rank died (its connection closed) or hung past --dist_timeout.
        # The launcher's own line names the rank that exited; re-run with --auto_resume.
        if not is_collective_failure(e) or "--debug" in (sys.argv if argv is None else argv):
            raise
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"error: rank {Ranks.current().rank}: lost the other ranks ({type(e).__name__}: {reason[:300]}); a "
              f"rank died or did not answer within --dist_timeout {args.dist_timeout:g} s. Re-run with "
              f"--auto_resume to continue from the last checkpoint", file=sys.stderr)
        raise SystemExit(5) from None


def is_collective_failure(error):
    """Whether `error` came out of torch.distributed: its errors (a timeout is a DistError) or one
    of gloo's RuntimeErrors (a peer's connection closed) raised inside a collective."""
    if isinstance(error, dist.DistError):
        return True
    frames = traceback.extract_tb(error.__traceback__)
    return any(f"{os.sep}torch{os.sep}distributed{os.sep}" in frame.filename for frame in frames[-3:])


def _main(args):
    cfg = RunConfig.from_args(args, setup_distributed(args))
    setup_logging(cfg)
    set_seeds(cfg.seed)
    if cfg.ranks.is_main:
        os.makedirs(cfg.saved_model_path, exist_ok=True)
        logger.info("Arguments: %s", json.dumps(cfg.arguments, default=str))
        logger.info("Job config: %s", json.dumps(cfg.config))
    check_output_shared(cfg)
    lock = claim_job_folder(cfg)  # before anything else is written there
    provider = session = None
    try:
        cfg.model.check()                # e.g. the CUDA-only transformer kernel, before any work
        _check_optimizer_support(cfg.ds_config, cfg.deepspeed_config)  # 1-bit / fp16 need CUDA
        provider = build_provider(args)  # opens and checks the data before the model is built
        validation = check_run_inputs(cfg, provider)
        model, optimizer = prepare_model_optimizer(args, universal_resume(cfg))
        session = model.session
        session.validation_set = validation
        start_epoch = load_checkpoint(args, model)
        session.reporter.log(None, {"config": json.dumps(cfg.config, indent=2)})
        session.signals.install()
        run(args, model, optimizer, start_epoch, provider)
    finally:
        if session is not None:
            session.close()
        if hasattr(provider, "close"):
            provider.close()
        if lock is not None:
            lock.close()
    state = session.state
    logger.info("Done: %d epochs, global step %d, %d samples", state.epoch, state.global_step,
                state.global_data_samples)
    return state


if __name__ == "__main__":
    main()

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
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from turing.tokenization import load_vocab, vocab_size_padded
from utils import get_argument_parser, get_rank_and_world, is_time_to_exit

logger = logging.getLogger("bing_bert")

NO_DECAY_NAMES = ("bias", "LayerNorm.bias", "LayerNorm.weight",
                  # DeepSpeed transformer-kernel names
                  "attn_nw", "attn_nb", "norm_w", "norm_b", "attn_qkvb", "attn_ob", "inter_b", "output_b")
ONEBIT_OPTIMIZERS = ("onebitadam", "onebitlamb", "zerooneadam")


class InputError(Exception):
    """Bad user input: reported as one line (no traceback unless --debug) and exit code 2."""


@dataclasses.dataclass
class RunState:
    """Everything that counts progress; saved whole in every checkpoint's client state."""
    epoch: int = 0                  # epochs finished
    global_step: int = 0            # optimizer steps taken
    global_data_samples: int = 0    # samples seen (all ranks)
    rewarmup_offset: int = 0        # global step at which the LR warmup (re)started
    restore_step: int = 0           # global step at the restore; --max_steps counts from here

    def client_state(self):
        return {"epoch": self.epoch, "last_global_step": self.global_step,
                "last_global_data_samples": self.global_data_samples,
                "rewarmup_offset": self.rewarmup_offset}


# ---------------------------------------------------------------------------------------------
# Arguments and configuration


def get_arguments(argv=None):
    import deepspeed

    parser = deepspeed.add_config_arguments(get_argument_parser())
    return parser.parse_args(argv)


def _read_json(path, what):
    if not os.path.isfile(path):
        raise InputError(f"{path}: {what} not found")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None


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
    if args.max_predictions_per_seq > args.max_seq_length:
        raise InputError(f"--max_predictions_per_seq {args.max_predictions_per_seq} exceeds "
                         f"--max_seq_length {args.max_seq_length}")
    return args


def check_batch_sizes(ds_config, world, path):
    """DeepSpeed's batch arithmetic, checked up front with a message that names the fix."""
    train = ds_config.get("train_batch_size")
    micro = ds_config.get("train_micro_batch_size_per_gpu")
    accum = ds_config.get("gradient_accumulation_steps")
    if train is not None and micro is not None:
        if accum is None and train % (micro * world):
            raise InputError(f"{path}: train_batch_size {train} is not a multiple of "
                             f"train_micro_batch_size_per_gpu {micro} x world size {world}")
        if accum is not None and train != micro * accum * world:
            raise InputError(f"{path}: train_batch_size {train} != train_micro_batch_size_per_gpu {micro} "
                             f"x gradient_accumulation_steps {accum} x world size {world}")


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
    if opt_type.lower() == "lamb" and not on_cuda:
        raise InputError(f"{path}: optimizer 'Lamb' is DeepSpeed's FusedLamb, which needs CUDA; "
                         f"use AdamW on this machine (see configs/tiny/ds_config.json)")
    if opt_type.lower() in ONEBIT_OPTIMIZERS and not on_cuda:
        raise InputError(f"{path}: optimizer '{opt_type}' needs CUDA and cupy; use AdamW on this machine")
    if ds_config.get("fp16", {}).get("enabled") and not on_cuda:
        raise InputError(f"{path}: fp16 needs a CUDA GPU; use bf16 or fp32 on this machine")


def prepare_model_optimizer(args):
    """Build BertMultiTask, wrap its network in a DeepSpeed engine; returns (model, optimizer)."""
    import deepspeed

    from turing.models import BertMultiTask

    _check_optimizer_support(args.ds_config, args.deepspeed_config)
    model = BertMultiTask(args)
    groups = prepare_optimizer_parameters(args, model)
    model.network, optimizer, _, _ = deepspeed.initialize(args=args, model=model.network,
                                                          model_parameters=groups)
    args.train_micro_batch_size_per_gpu = model.network.train_micro_batch_size_per_gpu()
    args.gradient_accumulation_steps = model.network.gradient_accumulation_steps()
    model.set_device(model.network.device)
    return model, optimizer


# ---------------------------------------------------------------------------------------------
# Checkpoints


def checkpoint_model(PATH, ckpt_id, model, epoch, last_global_step, last_global_data_samples, **kwargs):
    """Save through the engine (every rank takes part) with the run state as client state."""
    client_state = {"epoch": epoch, "last_global_step": last_global_step,
                    "last_global_data_samples": last_global_data_samples, **kwargs}
    logger.info("Saving checkpoint %s/%s", PATH, ckpt_id)
    if not model.network.save_checkpoint(PATH, ckpt_id, client_state):
        raise RuntimeError(f"checkpoint {PATH}/{ckpt_id} was not written")


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


def load_training_checkpoint(args, model, PATH, ckpt_id):
    """Restore engine, optimizer and client state; returns (epoch, last_global_step,
    last_global_data_samples) and the whole client state dict as a fourth value."""
    folder = os.path.join(PATH, str(ckpt_id))
    if not os.path.isdir(PATH):
        raise InputError(f"{PATH}: checkpoint folder not found (--load_training_checkpoint)")
    if not os.path.isdir(folder):
        tags = sorted(d for d in os.listdir(PATH) if os.path.isdir(os.path.join(PATH, d)))
        raise InputError(f"{folder}: checkpoint tag '{ckpt_id}' not found (--load_checkpoint_id); "
                         f"tags there: {', '.join(tags) or 'none'}")
    logger.info("Restoring checkpoint %s", folder)
    _, client_state = model.network.load_checkpoint(PATH, ckpt_id)
    if client_state is None:
        raise InputError(f"{folder}: DeepSpeed could not load this checkpoint (incomplete or not a checkpoint)")
    return (client_state["epoch"], client_state["last_global_step"],
            client_state["last_global_data_samples"], client_state)


def load_checkpoint(args, model, state):
    """Apply --load_training_checkpoint/--load_checkpoint_id to the run state."""
    if args.load_training_checkpoint is None:
        return
    epoch, step, samples, client_state = load_training_checkpoint(
        args, model, args.load_training_checkpoint, args.load_checkpoint_id)
    state.epoch, state.global_step, state.global_data_samples = epoch, step, samples
    state.rewarmup_offset = client_state.get("rewarmup_offset", 0)
    state.restore_step = step
    if args.rewarmup:
        state.rewarmup_offset = step
        logger.info("Re-warming the learning rate from global step %d", step)
    logger.info("Resumed at epoch %d, global step %d, %d samples", epoch, step, samples)


# ---------------------------------------------------------------------------------------------
# Learning rate


def lr_factor(schedule, step, training):
    """Multiplier of the base learning rate at `step` (counted from the warmup start), SPEC 8."""
    total = training["total_training_steps"]
    warmup = training["warmup_proportion"]
    x = step / total
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


def update_learning_rate(args, config, current_global_step, optimizer, rewarmup_offset=0):
    """Set the LR of every param group for this optimizer step (all precisions); returns it."""
    step = current_global_step - rewarmup_offset
    lr = config["training"]["learning_rate"] * lr_factor(args.lr_schedule, step, config["training"])
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

            self.writer = SummaryWriter(args.tensorboard_path)
        self.pending = []          # (step, samples, lr, loss tensor) not yet written
        self.window_start = time.time()
        self.window_samples = 0

    def step(self, state, lr, loss):
        self.pending.append((state.global_step, state.global_data_samples, lr, loss))
        if state.global_step % self.args.print_steps == 0:
            self.flush()

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

    def throughput(self, step, samples_this_step):
        self.window_samples += samples_this_step
        if step % 20 == 0:
            now = time.time()
            rate = self.window_samples / max(now - self.window_start, 1e-9)
            if self.is_master:
                logger.info("step %d: %.1f samples/s", step, rate)
                if self.writer is not None:
                    self.writer.add_scalar("Train/samples_per_sec", rate, step)
            self.window_start, self.window_samples = now, 0

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
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=_as_batch)


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


def pretrain_validation(args, index, model, reporter=None, state=None):
    """Loss and MLM accuracy over the validation set, averaged over all ranks."""
    dataset = open_validation_set(args)
    loader = get_dataloader(args, dataset, eval_set=True)
    model.eval()
    device = model.network.device
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, batches, correct, masked
    with torch.no_grad():
        for batch in loader:
            batch = model.move_batch(batch)
            loss = model.network(batch)
            scores, _ = model.network(batch._replace(masked_lm_labels=None))
            labels = batch.masked_lm_labels
            masked = labels != -1
            correct = (scores.argmax(-1) == labels) & masked
            totals += torch.stack([loss.double(), torch.ones((), dtype=torch.float64, device=device),
                                   correct.sum().double(), masked.sum().double()])
    if dist.is_initialized():
        dist.all_reduce(totals)
    model.train()
    loss = (totals[0] / totals[1].clamp(min=1)).item()
    accuracy = (totals[2] / totals[3].clamp(min=1)).item()
    logger.info("Validation epoch %d: loss=%.6f, mlm_accuracy=%.4f", index + 1, loss, accuracy)
    if reporter is not None:
        reporter.scalar("Validation/Loss", loss, index + 1)
        reporter.scalar("Validation/MLM_accuracy", accuracy, index + 1)
    return loss, accuracy


# ---------------------------------------------------------------------------------------------
# Training


def agreed_step_count(local_count, device):
    """The number of micro-batches every rank can run this epoch (the minimum over ranks)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local_count
    t = torch.tensor([local_count], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def train(args, index, model, optimizer, pretrain_dataset_provider, state, reporter, finetune=False):
    """One epoch of the step loop. Returns True when --max_steps was reached."""
    engine = model.network
    refs, local_total = pretrain_dataset_provider.get_shard(index)
    pretrain_dataset_provider.prefetch_shard(index + 1)
    total = agreed_step_count(local_total, engine.device)
    if total < local_total:
        logger.warning("Epoch %d: this rank has %d micro-batches, runs %d like the shortest rank",
                       index + 1, local_total, total)
    _, world = get_rank_and_world()
    samples_per_micro = args.train_micro_batch_size_per_gpu * world
    accum = args.gradient_accumulation_steps
    epoch_steps = 0
    step_loss = None
    model.train()
    bar = tqdm(total=total, desc=f"epoch {index + 1}", disable=not reporter.is_master, smoothing=0.1,
               mininterval=2.0, file=sys.stderr)
    for micro_step, ref in enumerate(refs):
        if micro_step >= total:
            break
        batch = model.move_batch(pretrain_dataset_provider.get_batch(ref), non_blocking=True)
        loss = engine(batch)
        detached = loss.detach()
        step_loss = detached if step_loss is None else step_loss + detached
        state.global_data_samples += samples_per_micro
        pretrain_dataset_provider.prefetch_batch()
        engine.backward(loss)
        bar.update(1)
        if engine.is_gradient_accumulation_boundary():
            lr = update_learning_rate(args, args.config, state.global_step, optimizer, state.rewarmup_offset)
            engine.step()
            state.global_step += 1
            epoch_steps += 1
            reporter.step(state, lr, step_loss / accum)
            reporter.throughput(state.global_step, samples_per_micro * accum)
            step_loss = None
            if is_time_to_exit(args, epoch_steps, state.global_step - state.restore_step):
                break
        else:
            engine.step()
    bar.close()
    reporter.flush()
    pretrain_dataset_provider.release_shard(index)
    return state.global_step - state.restore_step >= args.max_steps


def run(args, model, optimizer, start_epoch, state, provider, reporter):
    """The epoch loop: train, validate, checkpoint."""
    num_epochs = args.config["training"]["num_epochs"]
    if start_epoch >= num_epochs:
        logger.warning("Nothing to do: the checkpoint has finished %d of %d epochs", start_epoch, num_epochs)
    for index in range(start_epoch, num_epochs):
        logger.info("Training epoch %d of %d", index + 1, num_epochs)
        started = time.time()
        reached_max = train(args, index, model, optimizer, provider, state, reporter)
        state.epoch = index + 1
        if args.validation_data_path_prefix and not args.finetune:
            pretrain_validation(args, index, model, reporter, state)
        if args.ckpt_to_save is None or state.epoch in args.ckpt_to_save:
            tag = f"epoch{state.epoch}_step{state.global_step}"
            checkpoint_model(args.saved_model_path, tag, model, **state.client_state())
            if master_process(args):
                save_run_files(args, os.path.join(args.saved_model_path, tag))
        logger.info("Epoch %d took %.1f s", index + 1, time.time() - started)
        if reached_max:
            logger.warning("Stopping early: --max_steps %d reached at epoch %d, global step %d",
                           args.max_steps, state.epoch, state.global_step)
            break


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


def _main(args):
    ensure_process_group_env()
    import deepspeed

    deepspeed.init_distributed()
    rank, world = get_rank_and_world()
    is_master = rank == 0
    setup_logging(args, is_master)
    check_batch_sizes(args.ds_config, world, args.deepspeed_config)
    set_seeds(args.seed)
    if is_master:
        os.makedirs(args.saved_model_path, exist_ok=True)
        logger.info("Arguments: %s", json.dumps({k: v for k, v in vars(args).items()
                                                 if k not in ("config", "ds_config")}, default=str))
        logger.info("Job config: %s", json.dumps(args.config))
    model, optimizer = prepare_model_optimizer(args)
    state = RunState()
    load_checkpoint(args, model, state)
    provider = build_provider(args)
    reporter = Reporter(args, is_master)
    if is_master:
        reporter.writer.add_text("config", json.dumps(args.config, indent=2))
    try:
        run(args, model, optimizer, state.epoch, state, provider, reporter)
    finally:
        reporter.close()
        if hasattr(provider, "close"):
            provider.close()
    logger.info("Done: %d epochs, global step %d, %d samples", state.epoch, state.global_step,
                state.global_data_samples)
    return state


if __name__ == "__main__":
    main()

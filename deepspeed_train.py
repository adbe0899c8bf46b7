"""Bing BERT pretraining with DeepSpeed: the program, in the order it runs.

Arguments (the command line, the job config, the DeepSpeed config: read and checked before any
work) -> the model and the DeepSpeed engine -> restore a checkpoint -> epochs: train (the step
loop, one optimizer step at a time), checkpoint, validate.

    deepspeed deepspeed_train.py --cf bert_config.json --deepspeed --deepspeed_config ds_config.json \
        --output_dir OUT --data_path_prefix DATA [--use_nvidia_dataset] ...

`main(argv)` also runs in-process (single rank): without the launcher's environment it sets up
a one-process group itself. The infrastructure is in turing/: the run's configuration and state
(run_config), checkpoints (checkpointer, checkpoint), metrics (reporting), the training clock,
stop signals, the process group (distributed), the LR schedules. The original's public calls
(prepare_model_optimizer, train, run, load_checkpoint, ...) are at the end; construct_arguments,
update_learning_rate and get_dataloader are where the program uses them.
"""
import dataclasses
import itertools
import json
import logging
import math
import os
import sys
import time
from typing import Optional

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from data_formats import DATA_FORMATS, validation_format  # noqa: F401 (DATA_FORMATS: importable from here too)
from turing.arch import spec_of, training_flops
from turing.batch import collate_batch
from turing.checkpoint_files import resume_candidates
from turing.checkpointer import Checkpointer, JobLock, check_output_shared, resume_source, universal_source, \
    write_engine_checkpoint
from turing.clock import TrainClock
from turing.distributed import agreed_min, all_ranks, all_reduce, close_process_group, is_collective_failure, \
    setup_process_group
from turing.errors import InputError, StopTraining
from turing.flops import peak_tflops
from turing.heldout import warn_if_validation_trained
from turing.kernel_probe import check_transformer_kernel
from turing.lamb import build_lamb_if_needed, find_lamb_coeffs
from turing.job_config import JobConfig, job_config_of
from turing.lr_schedule import lr_factor
from turing.model_options import precision_of
from turing.modeling import BertConfig, transformer_kernel_settings
from turing.models import BertMultiTask
from turing.optim_groups import NO_DECAY_NAMES, decay_groups  # noqa: F401 (NO_DECAY_NAMES: importable from here too)
from turing.pretrained import check_job_settings, load_into, locate, read_weights
from turing.reporting import Reporter, write_metrics
from turing.run_config import ONEBIT_OPTIMIZERS, RunConfig, complete_arguments, pld_setting
from turing.run_state import RunState
from turing.shard_tokenizer import check_shard_tokenizer
from turing.signals import StopSignals
from turing.tokenization import load_tokenizer
from turing.validation import FIELDS as VALIDATION_FIELDS, batch_totals, scores_of
from utils import Ranks, get_argument_parser, is_time_to_exit, set_seeds

logger = logging.getLogger("bing_bert")


# The data formats (data_formats.DATA_FORMATS: name -> provider). Training reads the format the job
# config's data.format names, else the original's switch: --use_nvidia_dataset "nvidia", without it
# "bing". A validation folder is read by the format that recognises it.


# ---------------------------------------------------------------------------------------------
# Arguments


def get_arguments(argv=None):
    parser = deepspeed.add_config_arguments(get_argument_parser())
    return parser.parse_args(argv)


def construct_arguments(argv=None):
    """Parse the command line, read and check the job config and the DeepSpeed config, resolve
    paths (turing.run_config.complete_arguments says what it adds to args)."""
    return complete_arguments(get_arguments(argv))


def main(argv=None):
    """The program: arguments, then the run; bad input is one line (exit 2), a stop with its work
    saved exits with its code (StopTraining), a lost peer rank one line (exit 5)."""
    debug = "--debug" in (sys.argv if argv is None else argv)
    args = None
    try:
        args = construct_arguments(argv)
        return train_job(args)
    except InputError as e:
        # Bad input (configs, paths, shards, checkpoints): one line, no traceback, unless --debug.
        # Any other exception is a crash and keeps its traceback.
        if debug:
            raise
        print(f"error: {e} (run with --debug for a traceback)", file=sys.stderr)
        raise SystemExit(2) from None
    except StopTraining as e:
        logger.error("%s", e)
        raise SystemExit(e.exit_code) from None
    except RuntimeError as e:
        # A collective failed: a peer rank died (its connection closed) or hung past --dist_timeout.
        # The launcher's own line names the rank that exited; re-run with --auto_resume.
        if not is_collective_failure(e) or debug:
            raise
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"error: rank {Ranks.current().rank}: lost the other ranks ({type(e).__name__}: {reason[:300]}); a "
              f"rank died or did not answer within --dist_timeout {args.dist_timeout:g} s. Re-run with "
              f"--auto_resume to continue from the last checkpoint", file=sys.stderr)
        raise SystemExit(5) from None


def train_job(args):
    """One run of a checked command line: set up, check what it will read, build the engine,
    resume, train the epochs; returns the final RunState."""
    setup_logging(args.log_level, Ranks.launched())   # what the process group's start says (it may compile)
    cfg = RunConfig.from_args(args, setup_process_group(args.dist_timeout))
    setup_logging(cfg.log_level, cfg.ranks)
    set_seeds(cfg.seed)
    open_output_folder(cfg)
    check_output_shared(cfg)
    with JobLock(cfg):  # before anything else is written there
        # what the architecture's block refuses, the CUDA-only transformer kernel, ...: before any work
        cfg.model.for_block(spec_of(cfg.job.architecture).model)
        if cfg.model.deepspeed_transformer_kernel:
            probe_transformer_kernel(cfg)
        check_optimizer_support(cfg)     # 1-bit / fp16 / offload need CUDA
        provider = build_provider(cfg)   # opens and checks the data before the model is built
        try:
            validation_set = check_run_inputs(cfg, provider)
            cfg = universal_source(cfg)  # a ZeRO checkpoint of another rank count, converted
            if cfg.ranks.is_main:
                logger.info("Building the model and the DeepSpeed engine")
            session = start_session(cfg, *build_model_and_engine(cfg), validation_set)
            try:
                start_epoch = session.checkpointer.resume(session.state)
                session.reporter.log(None, {"config": json.dumps(cfg.config, indent=2)})
                session.signals.install(watch_launcher=True)
                train_epochs(session, start_epoch, provider)
            finally:
                session.close()
        finally:
            provider.close()
    state = session.state
    logger.info("Done: global step %d, %d samples, %d of %d epochs finished", state.global_step,
                state.global_data_samples, state.epoch, cfg.job.training.num_epochs)
    return state


def setup_logging(log_level, ranks):
    """Rank 0 logs at --log_level, the others warnings and errors; each line names its rank."""
    level = getattr(logging, log_level.upper()) if ranks.is_main else logging.WARNING
    logging.basicConfig(level=level, force=True,
                        format=f"%(asctime)s [rank {ranks.rank}] %(levelname)s %(name)s: %(message)s")
    logging.getLogger("bing_bert").setLevel(level)


def open_output_folder(cfg):
    """OUT/saved_models/JOB (rank 0), and the resolved run logged once."""
    if not cfg.ranks.is_main:
        return
    try:
        os.makedirs(cfg.saved_model_path, exist_ok=True)
    except OSError as e:
        raise InputError(f"--output_dir {cfg.output_dir}: cannot create {cfg.saved_model_path} ({e.strerror}); "
                         f"give a folder this user can write to") from None
    training = cfg.job.training
    logger.info("Run %s: seq %d, global batch %d (%d rank(s) x micro batch %d x accumulation %d), %d epoch(s), LR %g "
                "(--lr_schedule %s), into %s (all arguments and the job config: --log_level debug, and args.json, "
                "job_config.json beside each checkpoint)", cfg.job_name, cfg.max_seq_length,
                cfg.ranks.world * cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps, cfg.ranks.world,
                cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps, training.num_epochs,
                training.learning_rate, cfg.lr_schedule, cfg.saved_model_path)
    logger.debug("Arguments: %s", json.dumps(cfg.arguments, default=str))
    logger.debug("Job config: %s", json.dumps(cfg.config))


def build_provider(cfg):
    """The training data provider of the run's data format (see DATA_FORMATS)."""
    name = cfg.job.data_format or ("nvidia" if cfg.use_nvidia_dataset else "bing")
    if name not in DATA_FORMATS:
        raise InputError(f"{cfg.config_file}: data.format '{name}' is not a known data format; "
                         f"expected one of {', '.join(DATA_FORMATS)}")
    return DATA_FORMATS[name](cfg)


def check_run_inputs(cfg, provider):
    """What the run will read, checked before the model is built, so that a bad path or file
    costs seconds, not an epoch: the layout of every training shard, the tokenizer the shards
    were made with (prepare_data's record: turing.shard_tokenizer; a file there that prepare_data's
    record of the split does not list is refused first), the validation set (read
    whole; returned, None without one), and the checkpoint a resume will load (there, and its
    files not cut short)."""
    provider.check_shards()
    validating = bool(cfg.validation_data_path_prefix) and not cfg.finetune
    validation_folder = os.path.join(cfg.validation_data_path_prefix, _validation_path(cfg)) if validating else None
    # prepare_data's record of the tokenizer beside the shards (none: shards of another tool, trained as they are)
    check_shard_tokenizer(load_tokenizer(cfg.vocab_file, cfg.do_lower_case),
                          provider.training_folders() + ([validation_folder] if validating else []))
    validation_set = None
    if validating:
        validation_set = open_validation_set(cfg)
        # prepare_data's record of its split beside the shards: read on every rank (a changed one is
        # refused by all), the warning said once
        warn_if_validation_trained(provider.training_folders(), validation_folder, say=cfg.ranks.is_main)
    path, tag = resume_source(cfg)
    if path is not None:
        resume_candidates(path, tag, warn=lambda *_: None)  # the load warns, once
    return validation_set


def open_validation_set(cfg):
    """The validation set of the job config (validation.path under --validation_data_path_prefix),
    read and checked whole, in the format whose files the folder holds."""
    path = os.path.join(cfg.validation_data_path_prefix, _validation_path(cfg))
    if not os.path.isdir(path):
        raise InputError(f"{path}: validation folder not found (validation.path under "
                         f"--validation_data_path_prefix)")
    return validation_format(path, "validation.path under --validation_data_path_prefix").validation_dataset(path, cfg)


def _validation_path(cfg):
    path = cfg.job.validation_path
    if path is None:
        raise InputError(f"{cfg.config_file}: missing key 'validation.path' (needed with "
                         f"--validation_data_path_prefix)")
    return path


# ---------------------------------------------------------------------------------------------
# The model and the engine


def check_optimizer_support(cfg):
    """What needs CUDA, refused in one line on another accelerator."""
    path, ds_config = cfg.deepspeed_config, cfg.ds_config
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


def probe_transformer_kernel(cfg):
    """--deepspeed_transformer_kernel: one layer of the run's sizes in a child process (rank 0 of
    each node), before any rank builds the model; a crash there refuses the flag on every rank."""
    refusal = None
    if cfg.ranks.is_node_main:
        config = BertConfig.from_dict(cfg.job.bert_model_config)
        try:
            check_transformer_kernel(transformer_kernel_settings(config, cfg.model))
        except InputError as e:
            refusal = str(e)
    refusal = next((r for r in all_ranks(refusal) if r), None)
    if refusal:
        raise InputError(refusal)


def build_model_and_engine(cfg):
    """BertMultiTask with its network wrapped in a DeepSpeed engine; returns (model, optimizer)."""
    model = BertMultiTask(cfg)
    if cfg.use_pretrain:
        load_pretrained_weights(cfg, model.network)
    if cfg.compile:
        compile_model(model.network)
    groups = prepare_optimizer_parameters(cfg, model)
    # Blocks DeepSpeed 0.19 no longer knows (and refuses) are ours to read: sparse attention
    # (the model builds it) and progressive layer drop (theta computed by the session).
    engine_config = {k: v for k, v in cfg.ds_config.items()
                     if k not in ("sparse_attention", "progressive_layer_drop")}
    # "Lamb" off CUDA: our portable LAMB, since DeepSpeed's FusedLamb is a CUDA op; "Adam"/"AdamW"
    # off CUDA: torch's, unless the config says otherwise (DeepSpeed JIT-compiles its FusedAdam).
    optimizer, engine_config = build_lamb_if_needed(torch_adam_off_cuda(engine_config), groups)
    try:
        model.network, optimizer, _, _ = deepspeed.initialize(model=model.network, model_parameters=groups,
                                                              optimizer=optimizer, config=engine_config)
    except (AssertionError, TypeError, ValueError) as e:   # (pydantic's ValidationError is a ValueError)
        # what check_ds_config cannot foresee of DeepSpeed's own checks: an optimizer parameter the
        # class does not take, a block of the wrong shape; its message names the key
        raise InputError(f"{cfg.deepspeed_config}: DeepSpeed could not build the engine from it "
                         f"({type(e).__name__}: {' '.join(str(e).split())})") from e
    engine_sizes = (model.network.train_micro_batch_size_per_gpu(), model.network.gradient_accumulation_steps())
    if engine_sizes != (cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps):
        raise RuntimeError(f"DeepSpeed derived micro batch/accumulation {engine_sizes}, expected "
                           f"{(cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps)}")
    model.set_device(model.network.device)
    return model, optimizer


def torch_adam_off_cuda(engine_config):
    """The DeepSpeed config with `torch_adam: true` for an Adam/AdamW optimizer on an accelerator
    other than CUDA where the config does not set it: DeepSpeed would otherwise build its FusedAdam
    op there, a JIT compile of minutes on a CPU (paid again when a run is killed during it), for
    the same update torch.optim.AdamW makes."""
    opt = engine_config.get("optimizer")
    if (get_accelerator().device_name() == "cuda" or not isinstance(opt, dict)
            or str(opt.get("type", "")).lower() not in ("adam", "adamw")
            or "torch_adam" in (opt.get("params") or {})):
        return engine_config
    logger.info("optimizer %s on %s: torch's implementation (torch_adam), not DeepSpeed's FusedAdam, which it would "
                "compile first; set \"torch_adam\": false in the DeepSpeed config to have that", opt["type"],
                get_accelerator().device_name())
    return {**engine_config, "optimizer": {**opt, "params": {**(opt.get("params") or {}), "torch_adam": True}}}


def prepare_optimizer_parameters(args, model):
    """Parameter groups, in the original's order, which positional optimizer states
    rely on: the weight-decay group, the no-decay group (biases and LayerNorms), each in the
    model's parameter order without the pooler; for the 1-bit optimizers, after those, one group
    per position-embedding table with its momentum mask."""
    weight_decay = job_config_of(args).training.weight_decay
    named = [(n, p) for n, p in model.network.named_parameters() if "pooler" not in n]
    opt_type = args.ds_config.get("optimizer", {}).get("type", "").lower()
    masked = []
    if opt_type in ONEBIT_OPTIMIZERS:
        masked = [(n, p) for n, p in named if "position_embeddings.weight" in n]
        named = [(n, p) for n, p in named if "position_embeddings.weight" not in n]
    groups = decay_groups(named, weight_decay)
    for _, p in masked:
        mask = torch.zeros_like(p)
        mask[:args.max_seq_length] = 1.0
        if opt_type != "onebitlamb":
            mask = mask.flatten()
        groups.append({"params": [p], "weight_decay": weight_decay, "exp_avg_mask": mask})
    return groups


def load_pretrained_weights(cfg, network):
    """--use_pretrain: start from `bert_model_file` (as given, else under --data_path_prefix), which
    is a state dict with the original's key names (.pt/.bin), a checkpoint folder of ours (its
    `latest` tag, or a tag folder), or a Hugging Face folder (an export of ours or a stock model,
    whose config.json and vocab.txt the job config's own must be): opened as every reader opens a
    trained model (turing.pretrained: weights-only, finite, shapes checked, only the pooler and the
    NSP head may be missing)."""
    name = cfg.job.bert_model_file
    path = locate(name, cfg.data_path_prefix)
    if path is None:
        raise InputError(f"{cfg.config_file}: bert_model_file '{name}' not found (--use_pretrain); expected "
                         f"a state dict file, a checkpoint folder of this project or a Hugging Face folder")
    state_dict = read_weights(path)
    check_job_settings(path, cfg.job.bert_model_config, cfg.vocab_file, cfg.next_sentence_prediction, cfg.config_file)
    load_into(network, state_dict, path)
    logger.info("Started from pretrained weights %s", path)


def compile_model(network):
    """--compile: torch.compile the network's forward in place (its state_dict keys do not change).

    Compilation happens at the first forward. What torch cannot trace runs eagerly (graph breaks,
    as torch.compile does); a compiler error stops the run with its traceback (train without
    --compile), so that it is seen: nothing here changes torch's process-wide error handling.
    Where torch.compile cannot be set up at all, the run goes on uncompiled, with a warning.
    """
    try:
        network.compile()
    except Exception as e:  # noqa: BLE001 - any failure to set up compile leaves the model eager
        logger.warning("--compile: torch.compile is not usable here (%s); training uncompiled",
                       str(e).splitlines()[0] if str(e) else type(e).__name__)
        return
    logger.info("--compile: the model is compiled at its first forward (this takes a while)")


@dataclasses.dataclass
class Session:
    """One training session: the run's config, the model (its `.network` the engine) and optimizer,
    the run state (saved in checkpoints), the training clock and the components that act on the
    run (reporter, checkpointer, validator, stop signals). The epoch loop and the optimizer step
    (train_epochs, train_epoch, optimizer_step) take it; every function they call takes only the
    objects it acts on. The original's calls, which pass only (args, model, ...), find it on the
    model (`model.session`)."""
    config: RunConfig
    model: BertMultiTask
    optimizer: object
    state: RunState
    clock: TrainClock
    reporter: Reporter
    checkpointer: Checkpointer
    validator: "Validator"
    signals: StopSignals

    @property
    def engine(self):
        return self.model.network

    def close(self):
        self.signals.uninstall()
        self.reporter.close()


def pld_kwargs(cfg, step):
    """The engine's progressive layer drop arguments at global step `step` (none without PLD)."""
    if not cfg.progressive_layer_drop:
        return {}
    return {"progressive_layer_drop": True, "pld_theta": pld_theta(cfg, step)}


def pld_theta(cfg, step):
    """PLD's keep rate at global step `step`: theta(t) = (1 - theta_bar) exp(-gamma t) + theta_bar."""
    theta_bar, gamma = pld_setting(cfg.ds_config, "theta"), pld_setting(cfg.ds_config, "gamma")
    return (1.0 - theta_bar) * math.exp(-gamma * step) + theta_bar


def start_session(cfg, model, optimizer, validation_set=None):
    """The session of a built engine (kept on the model too, for the original's calls)."""
    state = RunState(seq_length=cfg.max_seq_length, micro_batch=cfg.train_micro_batch_size_per_gpu,
                     grad_accum=cfg.gradient_accumulation_steps, world=cfg.ranks.world)
    clock = TrainClock()
    flops = training_flops(model.config, cfg.max_seq_length, cfg.max_predictions_per_seq)
    reporter = Reporter(cfg, clock, flops,
                        lambda again=False: peak_tflops(model.network.device, precision_of(cfg.ds_config),
                                                        cfg.peak_tflops, again))
    checkpointer = Checkpointer(cfg, model.network, clock, before_write=lambda: reporter.flush(to_disk=True))
    validator = Validator(cfg, validation_set, clock, reporter)
    session = Session(cfg, model, optimizer, state, clock, reporter, checkpointer, validator, StopSignals())
    model.session = session
    return session


# ---------------------------------------------------------------------------------------------
# Epochs


def train_epochs(session, start_epoch, provider):
    """The epoch loop from epoch `start_epoch`: train, checkpoint, validate. The checkpoint comes
    first, so that nothing failing after an epoch (validation included) costs the epoch. A stop
    (--max_steps, --stop_at_step, --max_train_hours) inside an epoch leaves a step{S} checkpoint
    that remembers the position in the epoch. Validation follows every epoch and a run's end by
    one of them, once; a signal or non-finite stop ends the run without it."""
    cfg, state = session.config, session.state
    num_epochs = cfg.job.training.num_epochs
    if start_epoch >= num_epochs:
        logger.warning("Nothing to do: the run has finished its %d epochs (global step %d); give a new --job_name "
                       "or --output_dir to train again", num_epochs, state.global_step)
    elif reached_stop_step(cfg, state):
        logger.warning("Nothing to do: the run reached --stop_at_step %d (global step %d); give a later step to "
                       "train on", cfg.stop_at_step, state.global_step)
        return
    session.clock.start()
    with logging_redirect_tqdm():  # log lines never cut into the progress bar
        for epoch in range(start_epoch, num_epochs):
            logger.info("Training epoch %d of %d", epoch + 1, num_epochs)
            started, resumed_at = time.time(), state.epoch_micro_step if epoch == state.epoch else 0
            stop = train_epoch(session, epoch, provider)
            session.reporter.flush()
            if state.epoch == epoch + 1 and session.checkpointer.keeps_epoch(state.epoch):
                session.checkpointer.save(state, f"epoch{state.epoch}_step{state.global_step}")
            elif stop is not None:
                session.checkpointer.save(state, f"step{state.global_step}")
            session.validator.run(session.model, state, epoch, epoch_end=state.epoch == epoch + 1)
            logger.info("Epoch %d took %.1f s%s", epoch + 1, time.time() - started,
                        f" in this session (resumed after {resumed_at // cfg.gradient_accumulation_steps} of its "
                        f"optimizer steps)" if resumed_at else "")
            if stop is not None:   # an end the command line asked for: said, not warned about
                logger.info("Stopping: %s reached at epoch %d, global step %d", STOP_FLAGS[stop], epoch + 1,
                            state.global_step)
                return


def train_epoch(session, epoch, provider):
    """One epoch of the step loop, from the session's position in epoch `epoch` on. Returns the
    stop reason: None (epoch done), "max_steps", "stop_at_step" or "time" (STOP_FLAGS); raises
    StopTraining after a signal or too many non-finite losses, once the checkpoint is written."""
    cfg, state = session.config, session.state
    if epoch != state.epoch:  # a caller's choice of epoch (the original's train(args, index, ...))
        state.epoch, state.epoch_micro_step = epoch, 0
    start = state.epoch_micro_step
    if start == 0:  # an epoch begins on this run's layout
        state.plan_world = state.plan_micro_batch = state.plan_grad_accum = 0
    stop = None
    with provider.epoch(epoch, start=start, plan=state.epoch_plan()) as batches:
        total = micro_batches_to_run(cfg, session.engine.device, epoch, len(batches), start)
        session.model.train()
        bar = tqdm(total=start + total, initial=start, desc=f"epoch {epoch + 1}", mininterval=2.0, file=sys.stderr,
                   disable=not (session.config.ranks.is_main and sys.stderr.isatty()))
        micro_batches = bar_updates(itertools.islice(batches, total), bar)
        steps_left = run_steps_left(cfg, state, epoch, start + total)
        while (step := optimizer_step(session, micro_batches, steps_left)) is not None:
            if step.signum:
                bar.close()
                stop_with_checkpoint(session.checkpointer, state, session.signals.describe(step.signum),
                                     128 + step.signum)
            stop = stop_reason(cfg, state, step)
            if stop is not None or state.epoch_micro_step == start + total:
                break  # train_epochs writes the stop's or the epoch's checkpoint
            if step.skipped:
                continue
            if session.checkpointer.due(state.global_step):
                session.checkpointer.save(state, f"step{state.global_step}")
            if session.validator.due(state.global_step):
                session.validator.run(session.model, state, epoch, epoch_end=False)
        bar.close()
    session.reporter.flush()
    if stop is None or state.epoch_micro_step >= start + total:
        state.epoch, state.epoch_micro_step = epoch + 1, 0
    return stop


@dataclasses.dataclass
class StepResult:
    skipped: bool           # non-finite loss: no parameter moved
    signum: int             # a stop signal some rank received (0: none)
    over_time: bool         # --max_train_hours spent


def optimizer_step(session, micro_batches, steps_left=lambda: None):
    """One optimizer step: forward and backward of its micro batches (gradient accumulation),
    then the checks every rank agrees on (a non-finite loss is skipped, see handle_nonfinite), the
    LR for this step and the engine's step. None when `micro_batches` has ended (the epoch runs
    whole steps: micro_batches_to_run).
    `steps_left()`: the run's optimizer steps still to go, for the progress lines' estimate."""
    cfg, state, engine = session.config, session.state, session.engine
    samples_per_micro = cfg.train_micro_batch_size_per_gpu * cfg.ranks.world
    step_loss, data_wait = None, 0.0
    while True:
        waited = time.time()
        batch = next(micro_batches, None)
        if batch is None:
            return None
        batch = session.model.move_batch(batch, non_blocking=True)
        data_wait += time.time() - waited
        loss = engine(batch, **pld_kwargs(cfg, state.global_step))
        step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        state.global_data_samples += samples_per_micro
        state.epoch_micro_step += 1
        engine.backward(loss)
        if engine.is_gradient_accumulation_boundary():
            break
        engine.step()
    step_loss = step_loss / cfg.gradient_accumulation_steps
    reporter = session.reporter
    nonfinite, signum, over_time = step_checks(cfg, state, session.clock, session.signals, engine, step_loss)
    if nonfinite:
        handle_nonfinite(cfg, state, engine, session.optimizer, reporter, session.checkpointer)
    else:
        state.nonfinite_in_a_row = 0
        lr = set_learning_rate(cfg, cfg.job.training, state.global_step - state.rewarmup_offset, session.optimizer,
                               budget_fraction(cfg, session.clock, state, engine.device))
        warn_when_the_schedule_has_ended(cfg, state, reporter, lr)
        engine.step()
        state.global_step += 1
        if cfg.ranks.is_main:
            log_engine_metrics(cfg, state, engine, reporter)
        reporter.step(state, lr, step_loss, data_wait, steps_left())
    return StepResult(nonfinite, signum, over_time)


def bar_updates(batches, bar):
    """`batches`, moving the progress bar on by one for each."""
    for batch in batches:
        yield batch
        bar.update(1)


def micro_batches_to_run(cfg, device, epoch, available, start):
    """The micro batches this epoch runs on every rank: the fewest any rank has left, in whole
    optimizer steps, within --max_steps_per_epoch (which counts the epoch's optimizer steps
    whichever session ran them).

    An epoch trains whole optimizer steps: the last micro batches of an epoch that do not fill a
    step (fewer than the gradient accumulation) are not trained in it, and no accumulation runs
    on into the next epoch. So every checkpoint, the epoch's own included, is written on a step
    boundary, where the engine holds no pending gradients, and a resume from any of them is exact.
    `start` (micro batches already run) is always a whole number of steps."""
    accum, micro = cfg.gradient_accumulation_steps, cfg.train_micro_batch_size_per_gpu
    shortest = agreed_min(available, device)
    if shortest < available:
        logger.warning("Epoch %d: this rank has %d micro-batches left, runs %d like the shortest rank "
                       "(%d samples unused)", epoch + 1, available, shortest, (available - shortest) * micro)
    total = shortest // accum * accum
    if total < shortest and cfg.ranks.is_main:
        logger.warning("Epoch %d: its last %d micro-batch(es) per rank (%d samples) do not fill an optimizer step of "
                       "%d micro-batches; an epoch trains whole steps, so they are not trained in it", epoch + 1,
                       shortest - total, (shortest - total) * micro * cfg.ranks.world, accum)
    return min(total, max(0, cfg.max_steps_per_epoch * accum - start))


def run_steps_left(cfg, state, epoch, epoch_micro_end):
    """A function giving about how many optimizer steps the run has left (for the progress lines'
    estimate): this epoch's, the later epochs' at this epoch's length, within --max_steps and
    --stop_at_step."""
    accum, num_epochs = cfg.gradient_accumulation_steps, cfg.job.training.num_epochs

    def steps_left():
        left = ((epoch_micro_end - state.epoch_micro_step) // accum
                + (num_epochs - epoch - 1) * (epoch_micro_end // accum))
        left = min(left, cfg.max_steps - (state.global_step - state.restore_step))
        return left if cfg.stop_at_step is None else min(left, cfg.stop_at_step - state.global_step)
    return steps_left


def step_checks(cfg, state, clock, signals, engine, loss):
    """Once per optimizer step: is the loss finite, was a stop signal received, is the time
    budget spent. Ranks agree (one small all-reduce) so they stop or skip at the same step."""
    over_time = cfg.max_train_hours is not None and clock.train_seconds(state) >= cfg.max_train_hours * 3600
    flags = torch.stack([(~torch.isfinite(loss)).float(),
                         torch.tensor(float(signals.received or 0)).to(loss.device),
                         torch.tensor(float(over_time)).to(loss.device)])
    nonfinite, signum, over_time = all_reduce(flags, torch.distributed.ReduceOp.MAX).tolist()
    if engine.fp16_enabled():
        nonfinite = 0.0  # DeepSpeed's loss scaler skips overflowing fp16 steps itself
    return bool(nonfinite), int(signum), bool(over_time)


STOP_FLAGS = {"time": "--max_train_hours", "max_steps": "--max_steps", "stop_at_step": "--stop_at_step"}


def stop_reason(cfg, state, step):
    """"time" (--max_train_hours), "max_steps" (counted since the restore), "stop_at_step" (the
    global step, over every session), or None."""
    if step.over_time:
        return "time"
    if is_time_to_exit(cfg, global_steps=state.global_step - state.restore_step):
        return "max_steps"
    return "stop_at_step" if reached_stop_step(cfg, state) else None


def reached_stop_step(cfg, state):
    return cfg.stop_at_step is not None and state.global_step >= cfg.stop_at_step


def handle_nonfinite(cfg, state, engine, optimizer, reporter, checkpointer):
    """Skip the step; after --max_nonfinite_steps in a row, checkpoint and stop."""
    skip_step(engine, optimizer)
    state.nonfinite_in_a_row += 1
    state.nonfinite_total += 1
    logger.warning("Non-finite loss at global step %d: step skipped (%d in a row, %d in all)",
                   state.global_step + 1, state.nonfinite_in_a_row, state.nonfinite_total)
    reporter.log(state.global_step + 1, {"Train/nonfinite_steps": state.nonfinite_total})
    if state.nonfinite_in_a_row >= cfg.max_nonfinite_steps:
        stop_with_checkpoint(checkpointer, state, f"{state.nonfinite_in_a_row} non-finite losses in a row "
                                                  f"(--max_nonfinite_steps); lower the learning rate or check the "
                                                  f"data", 3)


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


def stop_with_checkpoint(checkpointer, state, reason, exit_code):
    folder = checkpointer.save(state, f"step{state.global_step}")
    raise StopTraining(f"{reason}; checkpoint of global step {state.global_step} in {folder} "
                       f"(re-run with --auto_resume to continue)", exit_code)


def log_engine_metrics(cfg, state, engine, reporter):
    """Rank 0, after each optimizer step: the LAMB coefficients (with LAMB), the PLD keep-rate
    (with PLD), and an fp16 step the loss scaler skipped (gradient overflow: the engine counts them,
    the reporter says each new one)."""
    coeffs = find_lamb_coeffs(engine)
    if coeffs:
        reporter.log(state.global_step, {"Train/lamb_coeffs": coeffs})
    if cfg.progressive_layer_drop:
        reporter.log(state.global_step, {"Train/pld_theta": pld_theta(cfg, state.global_step - 1)})
    if engine.fp16_enabled():
        reporter.fp16_skipped(state.global_step, engine.skipped_steps)


# ---------------------------------------------------------------------------------------------
# Learning rate


def budget_fraction(cfg, clock, state, device):
    """The share of --max_train_hours spent (summed over sessions) for the budget schedule, the
    largest over ranks so every rank sets the same LR; None for the other schedules."""
    if cfg.lr_schedule != "budget":
        return None
    spent = torch.tensor([clock.train_seconds(state)], dtype=torch.float64, device=device)
    return all_reduce(spent, torch.distributed.ReduceOp.MAX).item() / (cfg.max_train_hours * 3600)


def learning_rate(cfg, training, step, budget_fraction=None):
    """The LR of optimizer step `step` (counted from the warmup start): the training section's
    learning_rate x the --lr_schedule factor (turing.lr_schedule), plus --lr_offset."""
    return training.learning_rate * lr_factor(cfg.lr_schedule, step, training, budget_fraction) + cfg.lr_offset


def set_learning_rate(cfg, training, step, optimizer, budget_fraction=None):
    """Set the LR of every param group for optimizer step `step` (counted from the warmup start;
    all precisions) by learning_rate; returns it."""
    lr = learning_rate(cfg, training, step, budget_fraction)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def update_learning_rate(args, config, current_global_step, optimizer, rewarmup_offset=0, budget_fraction=None):
    """The original's call: set_learning_rate from the job config dict `config` (its training
    section, read as the program reads it) and `args`' --lr_schedule and --lr_offset; returns it."""
    return set_learning_rate(args, JobConfig.from_resolved(config).training, current_global_step - rewarmup_offset,
                             optimizer, budget_fraction)


def warn_when_the_schedule_has_ended(cfg, state, reporter, lr):
    """Once per session: a schedule that ends at 0 (WSD, EP) has reached total_training_steps, and
    the steps after it do not train."""
    total = cfg.job.training.total_training_steps
    if lr == 0.0 and state.global_step - state.rewarmup_offset >= total and reporter.first_time("lr_ended"):
        logger.warning("step %d: the learning rate is 0 from here on (--lr_schedule %s ends at the job config's "
                       "total_training_steps, %d): the steps after it do not train; set total_training_steps to the "
                       "run's step count, or end the run there with --stop_at_step", state.global_step,
                       cfg.lr_schedule, total)


# ---------------------------------------------------------------------------------------------
# Validation


class Validator:
    """Validation (--validation_data_path_prefix, the job config's validation.path): loss and MLM
    accuracy over the validation set, averaged over all ranks, after every epoch and every
    --validation_every_steps optimizer steps (`due`), written to the reporter. The set is opened
    once per run; the time validation takes is not training time."""

    def __init__(self, cfg, dataset, clock, reporter):
        self.config, self.dataset, self.clock, self.reporter = cfg, dataset, clock, reporter
        self.enabled = bool(cfg.validation_data_path_prefix) and not cfg.finetune

    def due(self, step):
        every = self.config.validation_every_steps
        return self.enabled and bool(every) and step % every == 0

    def run(self, model, state, epoch, epoch_end):
        """(loss, MLM accuracy), or None without a validation set."""
        if not self.enabled:
            return None
        if self.dataset is None:
            self.dataset = open_validation_set(self.config)
        with self.clock.paused():
            loss, mlm_acc, nsp_acc = validation_scores(self.config, model, self.dataset)
        self.reporter.validation(state, epoch, epoch_end, loss, mlm_acc, nsp_acc)
        return loss, mlm_acc


def validation_scores(cfg, model, dataset):
    """(loss, MLM accuracy, NSP accuracy or None) of `model` on `dataset`, over all ranks: the
    original's Validation/Loss, the mean over batches (turing.validation names both averages)."""
    loader = get_dataloader(cfg, dataset, eval_set=True)
    model.eval()
    device = model.network.device
    totals = torch.zeros(len(VALIDATION_FIELDS), dtype=torch.float64, device=device)
    nsp = cfg.next_sentence_prediction   # off: there may be no NSP head (the modernbert architecture)
    with torch.no_grad():
        for batch in loader:
            batch = model.move_batch(batch)
            # One forward for the scores (for the accuracies); the loss is the model's, in fp32.
            scores, nsp_scores = model.network(batch._replace(masked_lm_labels=None))
            masked = batch.masked_lm_labels != -1
            totals += batch_totals(scores[masked], batch.masked_lm_labels[masked], len(batch.masked_lm_labels),
                                   nsp_scores if nsp else None, batch.next_sentence_labels)
    all_reduce(totals)
    if totals[VALIDATION_FIELDS.index("sequences")] == 0:
        raise InputError(f"{os.path.join(cfg.validation_data_path_prefix, _validation_path(cfg))}: the validation "
                         f"set has no sequences (validation.path under --validation_data_path_prefix)")
    model.train()
    scores = scores_of(totals, nsp)
    return scores["loss"], scores["mlm_accuracy"], scores["nsp_accuracy"]


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
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_batch,
                      generator=torch.Generator().manual_seed(args.seed))




# ---------------------------------------------------------------------------------------------
# The original's calls, as its users wrote them: they take (args, model, ...) and find the
# session that prepare_model_optimizer started on the model.


def prepare_model_optimizer(args):
    """Build BertMultiTask, wrap its network in a DeepSpeed engine; returns (model, optimizer).

    Works on its own after construct_arguments(), as the original's did: it sets up the process
    group, fills args.train_micro_batch_size_per_gpu, args.gradient_accumulation_steps,
    args.device and args.fp16, and starts the session (`model.session`) that train(), run() and
    the checkpoint functions use."""
    cfg = RunConfig.from_args(args, setup_process_group(args.dist_timeout))
    check_optimizer_support(cfg)
    model, optimizer = build_model_and_engine(cfg)
    start_session(cfg, model, optimizer)
    args.train_micro_batch_size_per_gpu = cfg.train_micro_batch_size_per_gpu
    args.gradient_accumulation_steps = cfg.gradient_accumulation_steps
    args.device = model.network.device
    args.fp16 = model.network.fp16_enabled()
    return model, optimizer


def master_process(args):
    """The original's call: whether this process is the run's main process (global rank 0: it
    logs, writes TensorBoard and the run files). Works before and after the process group is up."""
    return Ranks.current().is_main


def train(args, index, model, optimizer, pretrain_dataset_provider, finetune=False):
    """The original's call: one epoch (`index`) of the step loop (train_epoch), then, unless
    `finetune`, validation, as the original's train() ended (without a validation set, none).
    Returns the stop reason of train_epoch."""
    session = model.session
    stop = train_epoch(session, index, pretrain_dataset_provider)
    if not finetune:
        session.validator.run(model, session.state, index, epoch_end=session.state.epoch == index + 1)
    return stop


def run(args, model, optimizer, start_epoch, provider=None):
    """The original's call: the epoch loop from `start_epoch` (train_epochs); without a `provider`
    it opens the job config's data itself and closes it at the end."""
    session = model.session
    if provider is not None:
        return train_epochs(session, start_epoch, provider)
    provider = build_provider(session.config)
    try:
        return train_epochs(session, start_epoch, provider)
    finally:
        provider.close()


def load_checkpoint(args, model):
    """The original's call: restore from --auto_resume (OUT/saved_models/JOB/latest, when there) or
    from --load_training_checkpoint/--load_checkpoint_id; returns the epoch to start at (0 without
    a checkpoint). Its callers may set those flags on `args` after the model is built."""
    session = model.session
    flags = dataclasses.replace(session.config, auto_resume=args.auto_resume,
                                load_training_checkpoint=args.load_training_checkpoint,
                                load_checkpoint_id=args.load_checkpoint_id)
    return session.checkpointer.resume(session.state, flags)


def load_training_checkpoint(args, model, PATH, ckpt_id):
    """The original's call: restore engine, optimizer, run state and RNG states from PATH/ckpt_id
    (or the newest older checkpoint that loads); returns (epoch, last_global_step,
    last_global_data_samples)."""
    state = model.session.state
    model.session.checkpointer.restore(state, PATH, ckpt_id)
    return state.epoch, state.global_step, state.global_data_samples


def checkpoint_model(PATH, ckpt_id, model, epoch, last_global_step, last_global_data_samples, **kwargs):
    """The original's call: save through the engine with the run position (its parameters are
    the client-state keys) and any other client state in `kwargs`. Training saves through the
    session's checkpointer, which makes the checkpoint complete."""
    write_engine_checkpoint(model.network, PATH, ckpt_id, {"epoch": epoch, "last_global_step": last_global_step,
                                                           "last_global_data_samples": last_global_data_samples,
                                                           **kwargs})


def pretrain_validation(args, index, model, epoch_end=True):
    """The original's call: loss and MLM accuracy over the validation set after epoch `index`
    (None without --validation_data_path_prefix), written to the session's reporter."""
    session = model.session
    return session.validator.run(model, session.state, index, epoch_end)


def report_step_metrics(args, lr, loss, step, data_sample_count, writer=None):
    """The original's call: one optimizer step's metrics to `writer`, under the original's tags
    (Train/lr by step, Train/Samples/train_loss and Train/Samples/lr by samples seen); the
    training loop writes the same through its reporter."""
    write_metrics(writer, step, {"Train/lr": lr})
    write_metrics(writer, data_sample_count, {"Train/Samples/train_loss": loss, "Train/Samples/lr": lr})


def report_lamb_coefficients(args, optimizer, writer=None, step=0):
    """The last step's LAMB coefficients (None without LAMB), written as the `Train/lamb_coeffs`
    histogram at `step` when a writer is given. `optimizer`: DeepSpeed's optimizer or the engine."""
    coeffs = find_lamb_coeffs(optimizer)
    if coeffs:
        write_metrics(writer, step, {"Train/lamb_coeffs": coeffs})
    return coeffs


if __name__ == "__main__":
    try:
        main()
        code = 0
    except SystemExit as stop:   # bad input (2), a stop with its work saved, a lost peer (5)
        code = stop.code
    # Here the exception, and the half-built engine its traceback held, are gone: the process groups
    # are closed before the interpreter's teardown, where a gloo thread still releasing a collective's
    # tensors aborted the process (turing.distributed.close_process_group). A lost peer's are left:
    # closing them could wait on it.
    if code != 5:
        close_process_group()
    sys.exit(code)

"""The run's checkpoints through the DeepSpeed engine: when one is due, writing it complete or
not at all, restoring a run from one (also on another number of ranks), the RNG states they
carry, and the job folder they live in (one run at a time, seen by every node).

A checkpoint is OUT/saved_models/JOB/TAG (turing.checkpoint_files: tags, the markers, the pick rule,
weights-only reading): the writing marker, then the engine's files of every rank, with the run
state and every rank's RNG states in the client state (tensors, numbers and strings only, so that
it loads weights-only), then rank 0's run files (job config, resolved arguments, DeepSpeed config,
the vocab), the completion marker and `latest`. A checkpoint is never written from non-finite
weights: it would be resumed into the same state.
"""
import dataclasses
import fcntl
import json
import logging
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import torch

from turing.checkpoint_files import (COMPLETE_MARKER, MODEL_STATES_FILE, WRITING_MARKER, check_weights_only, complete_tags,
                               engine_tags, holds_checkpoints, none_loadable, not_loadable,
                               prune_interval_checkpoints, resume_candidates, sync_folder, unfinished_tags,
                               unfinished_write, weights_only_loads, write_atomic)
from turing.distributed import all_ranks, all_reduce, barrier, is_collective_failure
from turing.epoch_plan import EpochPlan
from turing.errors import InputError, InputValueError, StopTraining
from turing.process import set_seeds
from turing.run_state import RunState
from turing.tokenization import load_tokenizer

logger = logging.getLogger("bing_bert")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNIVERSAL_FOLDER = "universal"  # OUT/saved_models/JOB/universal/TAG: a ZeRO checkpoint converted for another rank count
ZERO_OPTIM_FILE = re.compile(r"(bf16_)?zero_pp_rank_\d+_mp_rank_00_optim_states\.pt")
SHARED_PROBE = ".shared_probe"  # OUT/saved_models/JOB/.shared_probe.HOST.PID, during the check


class CheckpointNotWritten(StopTraining):
    """A checkpoint could not be written (a full disk, ...): the run ends with one line; the
    half-written folder is gone, the previous checkpoints and `latest` are as they were."""


class Checkpointer:
    """Writes the run's checkpoints and restores the run from one. `before_write` runs first (the
    reporter's flush, so that a disk the checkpoint fills up keeps this session's curves); the
    clock does not count the time a write takes as training time."""

    def __init__(self, cfg, engine, clock, before_write=lambda: None):
        self.cfg = cfg
        self.engine = engine
        self.clock = clock
        self.before_write = before_write
        self.ranks = cfg.ranks

    # -- when -------------------------------------------------------------------------------

    def due(self, step):
        """An interval checkpoint (--checkpoint_every_steps) after optimizer step `step`."""
        every = self.cfg.checkpoint_every_steps
        return bool(every) and step % every == 0

    def keeps_epoch(self, epoch):
        """Whether the end of epoch `epoch` (1-based) is checkpointed (--ckpt_to_save; default all)."""
        return self.cfg.ckpt_to_save is None or epoch in self.cfg.ckpt_to_save

    # -- writing ----------------------------------------------------------------------------

    def save(self, state, tag):
        """A complete checkpoint OUT/saved_models/JOB/`tag` of `state` (its training time brought
        up to now), or none: the engine's files (every rank takes part) are fsync'ed by one rank
        per node, then rank 0 writes the run files and the completion marker, then `latest`;
        older interval checkpoints are pruned (--keep_last_checkpoints). Returns the folder.

        Non-finite parameters on any rank end the run (StopTraining, exit 3) without writing. A
        write that fails (a full disk) ends it with CheckpointNotWritten: the half-written folder
        is removed, the previous checkpoints and `latest` are untouched. A peer lost while the
        ranks write (a collective that fails as a dead or silent peer's does) is no write failure:
        it ends the run as any lost peer does, the folder left an unfinished write."""
        cfg = self.cfg
        self.before_write()
        if not parameters_finite(self.engine):
            raise nonfinite_parameters_stop(cfg, tag, state)
        folder = os.path.join(cfg.saved_model_path, tag)
        state = dataclasses.replace(state, train_seconds=self.clock.train_seconds(state))
        logger.info("Saving checkpoint %s", folder)
        with self.clock.paused():
            try:
                marker = os.path.join(folder, COMPLETE_MARKER)
                if self.ranks.is_main:
                    begin_write(folder)
                barrier()  # the writing marker is in before any rank writes an engine file
                write_engine_checkpoint(self.engine, cfg.saved_model_path, tag,
                                        {**state.to_client_state(), "rng_states": all_ranks(rng_states())})
                barrier()
                if self.ranks.is_node_main:
                    sync_folder(folder)
                barrier()
                if self.ranks.is_main:
                    save_run_files(cfg, folder)
                    write_atomic(marker, json.dumps({"tag": tag, "global_step": state.global_step,
                                                     "time": time.time()}))
                    write_atomic(os.path.join(cfg.saved_model_path, "latest"), tag)
                    os.remove(os.path.join(folder, WRITING_MARKER))
            except (OSError, RuntimeError) as e:  # torch's writer reports a full disk as a RuntimeError
                if is_collective_failure(e):
                    raise     # a peer lost while the ranks wrote: the program's "lost the other ranks"
                raise checkpoint_not_written(cfg, folder, e, self.ranks) from e
            if self.ranks.is_main:
                prune_interval_checkpoints(cfg.saved_model_path, cfg.keep_last_checkpoints, keep=tag)
                # a conversion for another number of ranks is needed only until this run has saved
                shutil.rmtree(os.path.join(cfg.saved_model_path, UNIVERSAL_FOLDER), ignore_errors=True)
            barrier()
        return folder

    # -- restoring --------------------------------------------------------------------------

    def resume(self, state, cfg=None):
        """Restore `state`, the engine and the RNG states from the checkpoint this run resumes
        from (`resume_source` of the run's config, or of `cfg` with other resume flags), if any;
        returns the epoch to start at."""
        cfg = cfg or self.cfg
        path, tag = resume_source(cfg)
        unfinished = unfinished_tags(cfg.saved_model_path) if cfg.auto_resume else []
        if unfinished:
            logger.warning("--auto_resume: %s %s being written when its run ended (in %s): no checkpoint, passed "
                           "over (written again when this run reaches that step)", ", ".join(unfinished),
                           "was" if len(unfinished) == 1 else "were", cfg.saved_model_path)
        if cfg.auto_resume and path == cfg.saved_model_path:
            logger.info("--auto_resume: resuming from %s", path)
        elif cfg.auto_resume:
            logger.info("--auto_resume: no checkpoint in %s yet, %s", cfg.saved_model_path,
                        "starting from --load_training_checkpoint" if path else "starting fresh")
        if path is None:
            return state.epoch
        if cfg.ds_config.get("checkpoint", {}).get("load_universal"):  # converted by universal_source
            path, tag = os.path.join(cfg.saved_model_path, UNIVERSAL_FOLDER), \
                resume_candidates(path, tag, warn=lambda *_: None)[0]
        self.restore(state, path, tag)
        num_epochs = cfg.job.training.num_epochs
        if state.epoch >= num_epochs:
            logger.info("Resumed a finished run (%d of %d epochs, global step %d)", state.epoch, num_epochs,
                        state.global_step)
        else:
            logger.info("Resumed at epoch %d (micro-batch %d), global step %d, %d samples", state.epoch + 1,
                        state.epoch_micro_step, state.global_step, state.global_data_samples)
        return state.epoch

    def restore(self, state, path, tag):
        """Restore engine, optimizer, `state` and the RNG states from path/tag (or, where that one
        does not load, the newest older checkpoint that does, with a warning)."""
        tag, client_state = self._load_first_loadable(path, tag)
        folder = os.path.join(path, tag)
        saved = RunState.from_client_state(client_state)
        restore_run_state(self.cfg, state, saved, folder)
        saved_rng = client_state.get("rng_states")
        if saved_rng is not None and len(saved_rng) == self.ranks.world:
            set_rng_states(saved_rng[self.ranks.rank])
        elif saved_rng is not None:
            # Per-rank states do not map onto another number of ranks: every rank re-seeds its
            # python, numpy and torch generators (dropout) with --seed + the restored global step,
            # as a fresh run seeds them with --seed. The data order and masking do not draw from them.
            set_seeds(self.cfg.seed + saved.global_step)
            logger.warning("Checkpoint saved by %d ranks, running %d: random generators re-seeded with --seed + "
                           "global step (%d)", len(saved_rng), self.ranks.world, self.cfg.seed + saved.global_step)

    def _load_first_loadable(self, path, tag):
        """Load the first of resume_candidates(path, tag) that the engine loads and whose client
        state holds the run position; returns (tag, client state). Those that fail are warned
        about. Every file of a candidate loads weights-only, or the run stops (unless
        --trust_checkpoint)."""
        failed, reasons = [], []  # the candidates passed over, and 'TAG: why' of each
        trust = self.cfg.trust_checkpoint
        for candidate in resume_candidates(path, tag):
            folder = os.path.join(path, candidate)
            logger.info("Restoring checkpoint %s", folder)
            check_weights_only(folder, trust)  # a file that would run code: one line, no fall-back
            check_checkpoint_fits(self.engine, folder)  # another model size: likewise
            try:
                with weights_only_loads(trust):  # DeepSpeed asks for the full unpickler
                    _, client_state = self.engine.load_checkpoint(path, candidate)
            except Exception as e:  # noqa: BLE001 - torch and DeepSpeed raise many types for a file they cannot read
                why = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
            else:
                missing = RunState.missing_keys(client_state or {})
                bad = RunState.bad_value(client_state) if client_state is not None else None
                if client_state is None:
                    why = "DeepSpeed could not load it"
                elif missing:
                    why = (f"its client state lacks {', '.join(missing)}: not written by this program or the "
                           f"original Bing BERT")
                elif bad:
                    why = f"its client state holds {bad}"
                else:
                    if failed:
                        logger.warning("Resuming from %s instead of %s", folder, ", ".join(failed))
                    return candidate, client_state
            failed.append(candidate)
            reasons.append(f"{candidate}: {why}")
            logger.warning(*not_loadable(folder, why))
        raise InputValueError(none_loadable(path, reasons))


def begin_write(folder):
    """Rank 0, before the engine writes the checkpoint `folder`: what an unfinished write left
    there goes (another number of ranks may have written other files), WRITING_MARKER goes in,
    then the complete marker of a checkpoint written again under the same tag goes out
    (incomplete until whole again; in this order a kill in between leaves it complete)."""
    if unfinished_write(folder):
        shutil.rmtree(folder)
    os.makedirs(folder, exist_ok=True)
    write_atomic(os.path.join(folder, WRITING_MARKER), json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                                   "time": time.time()}))
    marker = os.path.join(folder, COMPLETE_MARKER)
    if os.path.exists(marker):
        os.remove(marker)


def write_engine_checkpoint(engine, path, tag, client_state):
    """The engine's files of path/tag (every rank takes part) with `client_state`."""
    if not engine.save_checkpoint(path, tag, client_state, save_latest=False):
        raise RuntimeError(f"checkpoint {path}/{tag} was not written")


def save_run_files(cfg, folder):
    """The job config, the resolved arguments, the DeepSpeed config and a copy of the tokenizer
    (its vocab.txt, or its tokenizer.json and special_tokens_map.json: Tokenizer.files) next to a
    checkpoint (rank 0), on disk: what an export or a fine-tuning run needs of the run."""
    os.makedirs(folder, exist_ok=True)
    for name, content in (("job_config.json", cfg.config), ("args.json", cfg.arguments),
                          ("ds_config.json", cfg.ds_config)):
        write_atomic(os.path.join(folder, name), json.dumps(content, indent=2, default=str))
    for name, data in load_tokenizer(cfg.vocab_file).files().items():
        write_atomic(os.path.join(folder, name), data)


def parameters_finite(engine):
    """Whether every parameter of the model is finite on every rank (ZeRO stage 3: each rank's
    partition)."""
    bad = torch.zeros((), device=engine.device)
    for p in engine.module.parameters():
        bad += (~torch.isfinite(getattr(p, "ds_tensor", p).detach())).sum()
    return all_reduce(bad).item() == 0


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


def check_checkpoint_fits(engine, folder):
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
    ours = {k: tuple(v.shape) for k, v in engine.module.state_dict().items()}
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
    if saved.epoch_micro_step % saved.grad_accum:
        # only an earlier version's checkpoint: an epoch now trains whole steps, each saved on a boundary
        logger.warning("%s: saved %d micro batch(es) into an optimizer step of epoch %d, whose gradients a "
                       "checkpoint does not hold; resuming at the step's start, so they are trained again",
                       folder, saved.epoch_micro_step % saved.grad_accum, saved.epoch + 1)
    state.epoch_micro_step = saved.epoch_micro_step // saved.grad_accum * state.grad_accum
    state.plan_world, state.plan_micro_batch, state.plan_grad_accum = plan if plan != state.layout() else (0, 0, 0)
    if saved_layout != state.layout():
        logger.info("%s: epoch %d was saved on %d ranks x micro batch %d x accumulation %d and began on %d x %d x %d; "
                    "its remaining samples are dealt over this run's %d x %d x %d", folder, saved.epoch + 1,
                    *saved_layout, *plan, *state.layout())


def resume_source(cfg):
    """(folder, tag) the run resumes from, or (None, None) for a fresh start: --auto_resume takes
    the run's own folder when it holds any checkpoint, else --load_training_checkpoint."""
    if cfg.auto_resume and holds_checkpoints(cfg.saved_model_path):
        return cfg.saved_model_path, "latest"
    return cfg.load_training_checkpoint, cfg.load_checkpoint_id


def zero_partitions(folder):
    """The number of ranks a ZeRO checkpoint's optimizer states are partitioned over (0: not ZeRO)."""
    return sum(bool(ZERO_OPTIM_FILE.fullmatch(name)) for name in os.listdir(folder))


def universal_source(cfg):
    """A ZeRO checkpoint partitioned over another number of ranks than this run's loads through
    DeepSpeed's universal checkpoint: rank 0 converts the tag a resume will load into this run's
    own folder (OUT/saved_models/JOB/universal/TAG, kept until this run saves a checkpoint of its
    own) with `ds_to_universal`, every file of it read weights-only (turing.safe_run), and the
    engine is built with checkpoint.load_universal. Returns the RunConfig to build the engine with."""
    path, tag = resume_source(cfg)
    if path is None:
        return cfg
    tag = resume_candidates(path, tag, warn=lambda *_: None)[0]
    folder = os.path.join(path, tag)
    saved = zero_partitions(folder)
    if not saved or saved == cfg.ranks.world:
        return cfg
    target = os.path.join(cfg.saved_model_path, UNIVERSAL_FOLDER, tag)
    if cfg.ranks.is_main and not os.path.isfile(os.path.join(target, COMPLETE_MARKER)):
        logger.info("%s: ZeRO states of %d ranks, this run has %d: converting to a universal checkpoint in %s",
                    folder, saved, cfg.ranks.world, target)
        check_weights_only(folder, cfg.trust_checkpoint)
        shutil.rmtree(target, ignore_errors=True)
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
    barrier()
    checkpoint = {**cfg.ds_config.get("checkpoint", {}), "load_universal": True}
    return dataclasses.replace(cfg, ds_config={**cfg.ds_config, "checkpoint": checkpoint})


# ---------------------------------------------------------------------------------------------
# The job folder


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
    probe, token = all_ranks(mine)[0]
    try:
        with open(probe, encoding="utf-8") as f:
            seen = f.read() == token
    except OSError:
        seen = False
    seen_by = all_ranks((seen, socket.gethostname()))
    if cfg.ranks.is_main:
        os.remove(probe)
    blind = [f"rank {rank} on {host}" for rank, (ok, host) in enumerate(seen_by) if not ok]
    if blind:
        raise InputError(f"--output_dir {cfg.output_dir}: {', '.join(blind)} cannot see the files rank 0 writes to "
                         f"{cfg.saved_model_path}; checkpoints need a folder every node sees (a shared file "
                         f"system), not node-local scratch")


class JobLock:
    """One run per OUT/saved_models/JOB at a time (rank 0 holds the lock file JOB.lock; the OS
    drops it when the run ends, however it ends). A second run of the job, while one runs, stops
    with the holder's pid and host. So does a fresh run (neither --auto_resume nor
    --load_training_checkpoint) where checkpoints exist already: it would write over them and
    mix its TensorBoard curves with theirs."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.path = f"{cfg.saved_model_path}.lock"
        self.file = None

    def __enter__(self):
        cfg = self.cfg
        if cfg.ranks.is_main:
            self.file = self._claim()
        if not cfg.auto_resume and cfg.load_training_checkpoint is None and holds_checkpoints(cfg.saved_model_path):
            self.__exit__()
            raise InputError(f"{cfg.saved_model_path} already holds checkpoints "
                             f"({', '.join(engine_tags(cfg.saved_model_path)[-3:]) or 'latest'}); re-run with "
                             f"--auto_resume to continue that run, or give a new --job_name or --output_dir for a "
                             f"new one")
        return self

    def _claim(self):
        try:
            lock = open(self.path, "a+")
        except OSError as e:
            raise InputError(f"--output_dir {self.cfg.output_dir}: cannot write there ({self.path}: "
                             f"{e.strerror}); give a folder this user can write to") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown process"
            lock.close()
            raise InputError(f"{self.cfg.saved_model_path} is in use by another run ({holder}; lock {self.path}); "
                             f"wait for it to end, or give another --job_name or --output_dir") from None
        self._note(lock, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        return lock

    @staticmethod
    def _note(lock, text):
        lock.truncate(0)
        lock.write(text + "\n")
        lock.flush()

    def __exit__(self, *exc):
        if self.file is not None:
            try:
                self._note(self.file, f"released by pid {os.getpid()} at {time.strftime('%Y-%m-%d %H:%M:%S')}: free")
            except OSError:
                pass  # a full disk: the OS drops the lock all the same
            self.file.close()
            self.file = None
        return False

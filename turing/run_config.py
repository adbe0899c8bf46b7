"""The run's configuration: reading and checking the job config, the DeepSpeed config and the
command line's values (`complete_arguments`, before any work: every bad value is one InputError
line naming the key or flag) and the RunConfig the program is handed. (The RunState it counts its
progress in is turing/run_state.py's.)
"""
import dataclasses
import logging
import math
import os
from typing import Optional

from turing.arch import architecture_of, model_config_from_dict, spec_of
from turing.dataset import MASK_SPLIT, MASKED_SHARE
from turing.errors import InputError
from turing.flops import MEASURE
from turing.job_config import JobConfig, config_vocab_size
from turing.jsonfile import json_kind, read_json
from turing.lr_schedule import COOLDOWN_PROPORTION, COOLDOWN_SHAPES, LR_SCHEDULES, schedule_help
from turing.model_options import ModelOptions
from turing.modeling import BertConfigError
from turing.pretrained import bert_model_config, is_hf_folder, locate, open_trained
from turing.process import Ranks
from turing.sinks import check_report_to
from turing.tokenization import (BertTokenizer, folder_lower_case, load_tokenizer, tokenizer_file, vocab_digest,
                               vocab_size)

logger = logging.getLogger("bing_bert")


def _read_json(path, what):
    return read_json(path, what, InputError)


def _require(config, keys, where):
    node = config
    for i, key in enumerate(keys):
        if not isinstance(node, dict):
            what = f"'{'.'.join(keys[:i])}'" if i else "the file"
            raise InputError(f"{where}: {what} must be a JSON object {{...}}, got {json_kind(node)}")
        if key not in node:
            raise InputError(f"{where}: missing key '{'.'.join(keys[:i + 1])}'")
        node = node[key]
    return node


def resolve_vocab_file(token_file, data_path_prefix, config_file):
    """The tokenizer file named by `bert_token_file`: a vocab.txt or a tokenizer.json, or a folder
    holding one (turing.tokenization.tokenizer_file: its vocab.txt first), taken as given, else
    under --data_path_prefix."""
    for candidate in (token_file, os.path.join(data_path_prefix, token_file)):
        if os.path.isdir(candidate):
            try:
                return tokenizer_file(candidate)
            except FileNotFoundError as e:
                raise InputError(f"{config_file}: bert_token_file {e}") from None
        if os.path.isfile(candidate):
            return candidate
    raise InputError(f"{config_file}: bert_token_file '{token_file}' not found (as given or under "
                     f"--data_path_prefix '{data_path_prefix}'); expected a vocab.txt, a tokenizer.json or a folder "
                     f"holding one")


def model_rows(vocab_file, model_config, config_file):
    """(the tokenizer of the resolved bert_token_file, the model's embedding rows: its
    Tokenizer.rows, a tokenizer.json's with bert_model_config's vocab size where larger)."""
    try:
        tokenizer = load_tokenizer(vocab_file)
        return tokenizer, tokenizer.rows(config_vocab_size(model_config))
    except ValueError as e:
        raise InputError(f"{config_file}: bert_token_file {e}") from None


def complete_arguments(args):
    """Read and check the job config and the DeepSpeed config of a parsed command line, resolve
    its paths; returns `args` with, added (the original's attributes): config (with
    data.datasets and training for this sequence length), job_name, vocab_file, vocab_size,
    saved_model_path, tensorboard_path, ds_config, next_sentence_prediction, and `job`, the job
    config as typed sections (turing.job_config), which everything after this reads. Nothing is
    added to `args` after this: the run reads its RunConfig."""
    config = _read_json(args.config_file, "job config (--cf)")
    if not isinstance(config, dict):
        raise InputError(f"{args.config_file}: the file must hold a JSON object {{...}}, got {json_kind(config)}")
    if "bert_model_config" in config and not isinstance(config["bert_model_config"], dict):   # (read before _require's)
        raise InputError(f"{args.config_file}: 'bert_model_config' must be a JSON object {{...}}, got "
                         f"{json_kind(config['bert_model_config'])}")
    seq = str(args.max_seq_length)
    datasets = _require(config, ["data", "mixed_seq_datasets"], args.config_file)
    training = _require(config, ["mixed_seq_training"], args.config_file)
    for name, table in (("data.mixed_seq_datasets", datasets), ("mixed_seq_training", training)):
        if not isinstance(table, dict):
            raise InputError(f"{args.config_file}: '{name}' must be a JSON object {{...}} keyed by sequence length, "
                             f"got {json_kind(table)}")
        if seq not in table:
            raise InputError(f"{args.config_file}: {name} has no entry for --max_seq_length {seq}; "
                             f"entries: {', '.join(sorted(table))}")
    for name, table in (("data.mixed_seq_datasets", datasets), ("mixed_seq_training", training)):
        if not isinstance(table[seq], dict):
            raise InputError(f"{args.config_file}: '{name}.{seq}' must be a JSON object {{...}}, got "
                             f"{json_kind(table[seq])}")
    config["data"]["datasets"] = datasets[seq]
    config["training"] = training[seq]
    for key in ("num_epochs", "learning_rate", "warmup_proportion", "total_training_steps"):
        _require(config, ["training", key], f"{args.config_file} (mixed_seq_training.{seq})")
    if args.lr_schedule not in LR_SCHEDULES:
        raise InputError(f"--lr_schedule {args.lr_schedule!r} is not a known schedule; expected one of "
                         f"{', '.join(LR_SCHEDULES)} ({schedule_help()})")
    for key in LR_SCHEDULES[args.lr_schedule].needs:
        _require(config, ["training", key], f"{args.config_file} (mixed_seq_training.{seq})")
    settings_from_pretrained(args, config)
    _require(config, ["bert_model_config"], args.config_file)
    check_recipe(args, config["training"], f"{args.config_file} (mixed_seq_training.{seq})", config)
    args.config = config
    args.job = JobConfig.from_resolved(config, seq)  # what the run reads: typed, by attribute
    args.job_name = args.job_name or config.get("name") or "bing_bert"
    if args.job_name in (".", "..") or os.sep in args.job_name or (os.altsep and os.altsep in args.job_name):
        raise InputError(f"job name {args.job_name!r} (--job_name, or the job config's 'name') must be a plain folder "
                         f"name: the run writes OUT/saved_models/NAME and OUT/runs/NAME")
    args.vocab_file = resolve_vocab_file(_require(config, ["bert_token_file"], args.config_file),
                                         args.data_path_prefix, args.config_file)
    if args.do_lower_case is None:   # neither flag given: as the vocab.txt's folder says, else on (the original's)
        args.do_lower_case = folder_lower_case(tokenizer_file(args.vocab_file))
    tokenizer, args.vocab_size = model_rows(args.vocab_file, config["bert_model_config"], args.config_file)
    vocab = tokenizer.vocab
    if isinstance(tokenizer, BertTokenizer) and len(vocab) < vocab_size(vocab):
        logger.warning("%s: %d repeated line(s); a repeated token keeps the id of its last line, and "
                       "every line keeps its row in the model", args.vocab_file, vocab_size(vocab) - len(vocab))
    args.saved_model_path = os.path.join(args.output_dir, "saved_models", args.job_name)
    args.tensorboard_path = os.path.join(args.output_dir, "runs", args.job_name)
    if args.deepspeed_config is None:
        raise InputError("--deepspeed_config is required (a DeepSpeed JSON config, e.g. ds_config.json)")
    args.ds_config = _read_json(args.deepspeed_config, "DeepSpeed config (--deepspeed_config)")
    check_ds_config(args.ds_config, args.deepspeed_config)
    check_progressive_layer_drop(args)
    args.report_to = check_report_to(args.report_to)
    check_local_rank(args)
    if args.max_predictions_per_seq > args.max_seq_length:
        raise InputError(f"--max_predictions_per_seq {args.max_predictions_per_seq} exceeds "
                         f"--max_seq_length {args.max_seq_length}")
    check_config_values(args)
    return args


# DeepSpeed's 1-bit optimizers (CUDA and cupy only), which the program gives position-masked groups
ONEBIT_OPTIMIZERS = ("onebitadam", "onebitlamb", "zerooneadam")

# The DeepSpeed config's keys this program reads or checks itself before DeepSpeed does: key, type,
# default, meaning (the configuration reference, tools/config_reference.py); every other key is
# DeepSpeed's own, passed to the engine as written.
DS_CONFIG_KEYS = (
    ("train_batch_size", "int", "micro x accumulation x ranks", "the global batch (sequences an optimizer step)"),
    ("train_micro_batch_size_per_gpu", "int", "train_batch_size / (accumulation x ranks)",
     "sequences a rank's forward takes"),
    ("gradient_accumulation_steps", "int", "train_batch_size / (micro x ranks)", "micro batches an optimizer step"),
    ("optimizer.type", "str", "none", "a DeepSpeed optimizer (Lamb, Adam, AdamW, OneBitAdam, OneBitLamb, "
                                      "ZeroOneAdam) or a torch.optim class name"),
    ("optimizer.params", "object", "{}", "lr, betas, eps, weight_decay, and the optimizer's own (LAMB's "
                                         "max_coeff, min_coeff, bias_correction)"),
    ("gradient_clipping", "float", "0 (none)", "clip the global gradient norm"),
    ("fp16.enabled", "bool", "false", "fp16 with loss scaling (CUDA only)"),
    ("bf16.enabled", "bool", "false", "bf16"),
    ("zero_optimization.stage", "int", "0", "ZeRO stage 0-3"),
    ("sparse_attention", "object", "none", "--deepspeed_sparse_attention's layout (mode fixed, block 16, ...)"),
    ("progressive_layer_drop", "object", "none", "enabled, theta (0.5: the final keep rate), gamma (0.001: its decay "
                                                 "rate); on with --progressive_layer_drop"),
    ("checkpoint.load_universal", "bool", "false", "set by the program itself where it resumes a ZeRO checkpoint "
                                                   "on another number of ranks"),
)


def check_ds_config(ds_config, path):
    """The DeepSpeed config's blocks that DeepSpeed itself would only fail on deep in the engine's
    build or at the first step (a traceback): the optimizer's name and numeric parameters,
    gradient_clipping, the ZeRO stage. The batch sizes are resolve_batch_sizes'."""
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    if not isinstance(ds_config, dict):
        raise InputError(f"{path}: the file must hold a JSON object {{...}}, got {json_kind(ds_config)}")
    opt = ds_config.get("optimizer")
    if opt is not None:
        if not isinstance(opt, dict) or not isinstance(opt.get("type"), str):
            raise InputError(f'{path}: optimizer must be an object {{"type": NAME, "params": {{...}}}}, got {opt!r}')
        name = opt["type"]
        if (name.lower() not in (*DEEPSPEED_OPTIMIZERS, *ONEBIT_OPTIMIZERS)
                and not isinstance(getattr(torch.optim, name, None), type)):
            raise InputError(f"{path}: optimizer type {name!r} is not one DeepSpeed builds: one of "
                             f"{', '.join(DEEPSPEED_OPTIMIZERS)} (any case), or a torch.optim class name")
        params = opt.get("params", {})
        if not isinstance(params, dict):
            raise InputError(f"{path}: optimizer.params must be a JSON object {{...}}, got {json_kind(params)}")
        for key in ("lr", "weight_decay", "eps"):      # (their ranges are DeepSpeed's to refuse, by name)
            if key in params:
                _check_value(params[key], f"{path}: optimizer.params.{key}", -math.inf)
        betas = params.get("betas", [0.9, 0.999])
        if not (isinstance(betas, list) and len(betas) == 2):
            raise InputError(f"{path}: optimizer.params.betas must be two numbers [beta1, beta2], got {betas!r}")
        for i, beta in enumerate(betas):
            _check_value(beta, f"{path}: optimizer.params.betas[{i}]", -math.inf)
    if ds_config.get("gradient_clipping") is not None:
        _check_value(ds_config["gradient_clipping"], f"{path}: gradient_clipping (0: none)", 0)
    zero = ds_config.get("zero_optimization")
    if zero is not None:
        stage = zero.get("stage", 0) if isinstance(zero, dict) else None
        if not isinstance(zero, dict) or isinstance(stage, bool) or stage not in (0, 1, 2, 3):
            raise InputError(f'{path}: zero_optimization must be an object with "stage" 0, 1, 2 or 3, got {zero!r}')


def settings_from_pretrained(args, config):
    """A job config whose bert_model_file is a Hugging Face folder (a stock model or an export,
    as given or under --data_path_prefix) and that leaves bert_model_config or bert_token_file out
    takes them from the folder (turing.pretrained: its config.json, its vocab.txt or tokenizer.json); the training
    section's next_sentence_prediction is then false where the folder has no NSP head to train
    (a BertForMaskedLM, a RobertaPreLayerNorm) and the section does not say. Values the job config
    gives are checked against the folder where --use_pretrain loads it
    (turing.pretrained.check_job_settings). bert_model_file is found here, before any work, where
    the run needs it (--use_pretrain, or the keys it gives): as a path, or a model id in the local
    Hugging Face cache (turing.pretrained.locate); a name found nowhere is one error line."""
    missing = [key for key in ("bert_model_config", "bert_token_file") if not config.get(key)]
    if not missing and not args.use_pretrain:
        return
    try:
        path = locate(config.get("bert_model_file"), args.data_path_prefix)
        if not missing or path is None or not is_hf_folder(path):
            return
        trained = open_trained(path)
        # vocab_size: the ids its rows stand for (config.json's), not our padded rows, so that an
        # embedding padded past a tokenizer.json's ids keeps its rows and its export its vocab_size
        config["bert_model_config"] = config.get("bert_model_config") or {
            **bert_model_config(trained.config), **({"vocab_size": trained.vocab_ids} if trained.vocab_ids else {})}
        config["bert_token_file"] = (config.get("bert_token_file")
                                     or trained.require_tokenizer("the job config's bert_token_file").path)
    except InputError as e:
        raise InputError(f"{args.config_file}: bert_model_file {e}") from None
    if spec_of(trained.architecture).nsp_head and not trained.nsp_head:
        config["training"].setdefault("next_sentence_prediction", False)
    logger.info("%s: %s from %s (architecture %s)", args.config_file, " and ".join(missing), path,
                trained.architecture)


PLD_DEFAULTS = {"theta": 0.5, "gamma": 0.001}   # the progressive_layer_drop block's, as DeepSpeed's


def pld_setting(ds_config, key):
    """theta or gamma of the DeepSpeed config's progressive_layer_drop block (its default where absent)."""
    return (ds_config.get("progressive_layer_drop") or {}).get(key, PLD_DEFAULTS[key])


def check_progressive_layer_drop(args):
    """Progressive layer drop is on with --progressive_layer_drop or with the DeepSpeed config's
    progressive_layer_drop.enabled true (the original's recipe sets both); its theta (the final
    keep rate, in (0, 1]) and gamma (the decay rate, >= 0) are checked here, before any work. The
    flag with `enabled: false`, or without the block, is refused: one of them is a mistake."""
    path, block = args.deepspeed_config, args.ds_config.get("progressive_layer_drop")
    if block is None:
        if args.progressive_layer_drop:
            raise InputError(f"{path}: --progressive_layer_drop needs a 'progressive_layer_drop' block "
                             f"({{\"enabled\": true, \"theta\": 0.5, \"gamma\": 0.001}})")
        return
    if not isinstance(block, dict):
        raise InputError(f"{path}: progressive_layer_drop must be an object such as "
                         f"{{\"enabled\": true, \"theta\": 0.5, \"gamma\": 0.001}}, got {block!r}")
    enabled = block.get("enabled", None)
    if enabled not in (None, True, False):
        raise InputError(f"{path}: progressive_layer_drop.enabled must be true or false, got {enabled!r}")
    if args.progressive_layer_drop and enabled is False:
        raise InputError(f"{path}: progressive_layer_drop.enabled is false but --progressive_layer_drop is given; "
                         f"set it true, or leave the flag out to train without layer drop")
    if enabled and not args.progressive_layer_drop:
        logger.info("%s: progressive_layer_drop.enabled is true: progressive layer drop is on", path)
        args.progressive_layer_drop = True
    if args.progressive_layer_drop:
        _check_value(pld_setting(args.ds_config, "theta"), f"{path}: progressive_layer_drop.theta", 0, above=True,
                     high=1)
        _check_value(pld_setting(args.ds_config, "gamma"), f"{path}: progressive_layer_drop.gamma", 0)


def check_local_rank(args):
    """--local_rank (the original's flag, which the deepspeed launcher passes) and the launcher's
    LOCAL_RANK must agree; given alone, --local_rank is this process's place on its node (the
    device it uses), as LOCAL_RANK would be."""
    if args.local_rank is None or args.local_rank < 0:
        return
    env = os.environ.get("LOCAL_RANK")
    if env is None:
        os.environ["LOCAL_RANK"] = str(args.local_rank)
    elif env != str(args.local_rank):
        raise InputError(f"--local_rank {args.local_rank} differs from the launcher's LOCAL_RANK {env}; "
                         f"leave --local_rank to the launcher")


MAX_DIST_TIMEOUT = 7 * 24 * 3600     # seconds: a week


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
        model_config = model_config_from_dict(args.config["bert_model_config"])
    except BertConfigError as e:
        raise InputError(f"{args.config_file}: {e}") from None
    for flag, low in (("max_seq_length", 5), ("max_predictions_per_seq", 1), ("print_steps", 1),
                      ("max_steps", 1), ("max_steps_per_epoch", 1), ("refresh_bucket_size", 1),
                      ("checkpoint_every_steps", 0), ("keep_last_checkpoints", 0), ("max_nonfinite_steps", 1),
                      ("validation_every_steps", 0)):
        _check_value(getattr(args, flag), f"--{flag}", low, integer=True)
    if args.max_seq_length > model_config.max_position_embeddings:
        raise InputError(f"--max_seq_length {args.max_seq_length} exceeds bert_model_config.max_position_embeddings "
                         f"{model_config.max_position_embeddings} of {args.config_file}")
    # (torch holds a timeout in C ints of milliseconds: 1e300 s overflowed, 1e10 s was read as a lost rank)
    _check_value(args.dist_timeout, "--dist_timeout", 0, above=True, high=MAX_DIST_TIMEOUT)
    # added to every step's LR, which warmup starts at 0: a negative offset trains with a negative LR
    _check_value(args.lr_offset, "--lr_offset", 0)
    if args.peak_tflops not in (None, MEASURE):
        try:
            args.peak_tflops = float(args.peak_tflops)
        except ValueError:
            raise InputError(f"--peak_tflops must be a number or '{MEASURE}', got {args.peak_tflops!r}") from None
        _check_value(args.peak_tflops, "--peak_tflops", 0, above=True)
    if args.max_train_hours is not None:
        _check_value(args.max_train_hours, "--max_train_hours", 0, above=True)
    if args.stop_at_step is not None:
        _check_value(args.stop_at_step, "--stop_at_step", 1, integer=True)
    for epoch in args.ckpt_to_save or ():
        _check_value(epoch, "--ckpt_to_save", 1, integer=True)


def check_recipe(args, training, where, config=None):
    """The recipe switches of a training entry (each optional, default = the original's recipe)
    and the flags that depend on them; sets args.next_sentence_prediction (its default depends on
    the architecture of the job `config`). masked_lm_prob and mask_split are the Bing provider's
    dynamic masking; NVIDIA shards carry the masking they were made with
    (tools/prepare_data.py --masked_lm_prob)."""
    prob = training.get("masked_lm_prob", MASKED_SHARE)
    if not isinstance(prob, (int, float)) or not 0 < prob <= 1:
        raise InputError(f"{where}: masked_lm_prob must be a number in (0, 1], got {prob!r}")
    split = training.get("mask_split", list(MASK_SPLIT))
    if (not isinstance(split, list) or len(split) != 3 or not all(isinstance(v, (int, float)) and v >= 0 for v in split)
            or abs(sum(split) - 1.0) > 1e-6):
        raise InputError(f"{where}: mask_split must be [mask, random, keep] shares summing to 1 "
                         f"(the original's [0.8, 0.1, 0.1]), got {split!r}")
    # The original's NSP term is on unless switched off; an architecture without an NSP head (the
    # modernbert one: ModernBERT trains the MLM loss alone) has it off, and it cannot be turned on.
    architecture = architecture_of((config or {}).get("bert_model_config"))
    try:
        has_nsp_head = spec_of(architecture).nsp_head
    except BertConfigError as e:
        raise InputError(f"{args.config_file}: {e}") from None
    nsp = training.get("next_sentence_prediction", has_nsp_head)
    if not isinstance(nsp, bool):
        raise InputError(f"{where}: next_sentence_prediction must be true or false, got {nsp!r}")
    if nsp and not has_nsp_head:
        raise InputError(f"{where}: next_sentence_prediction is true, but bert_model_config.architecture "
                         f"'{architecture}' has no next-sentence head; set it false or leave it out")
    args.next_sentence_prediction = nsp
    schedule = LR_SCHEDULES.get(args.lr_schedule)
    if schedule is not None and schedule.cooldown:
        cooldown = training.get("cooldown_proportion", COOLDOWN_PROPORTION)
        if not isinstance(cooldown, (int, float)) or not 0 <= cooldown <= 1:
            raise InputError(f"{where}: cooldown_proportion must be a number in [0, 1], got {cooldown!r}")
        if training.get("cooldown_shape", "linear") not in COOLDOWN_SHAPES:
            raise InputError(f"{where}: cooldown_shape must be one of {', '.join(COOLDOWN_SHAPES)}, "
                             f"got {training['cooldown_shape']!r}")
    if schedule is not None and schedule.time_budget and not args.max_train_hours:
        raise InputError(f"--lr_schedule {args.lr_schedule} follows the share of --max_train_hours spent; give "
                         f"--max_train_hours")
    if args.validation_every_steps > 0 and not args.validation_data_path_prefix:
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
    the DeepSpeed config once they are read and checked (complete_arguments), on the ranks of
    the process group, and handed to every part of the program. Attribute names are the command
    line's, so a function written for the original's `args` reads either (the providers take
    one); `args` itself stays at the public boundary the original defined (construct_arguments,
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
    vocab_file: str                  # resolved bert_token_file: the tokenizer file (vocab.txt or tokenizer.json)
    vocab_size: int                  # the model's rows: the tokenizer's ids, rounded up to a multiple of 8
    # the configs, read and checked: `job` the job config typed (what the program reads; the JSON
    # as resolved for this sequence length is `config`), `ds_config` the DeepSpeed config
    job: JobConfig
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
    peak_tflops: object              # a number, 'measure' or None (turing.flops.peak_tflops)
    rewarmup: bool
    seed: int
    print_steps: int
    max_steps: int
    max_steps_per_epoch: int
    stop_at_step: Optional[int]      # a global step, over every session (None: no such end)
    max_train_hours: Optional[float]
    validation_every_steps: int
    finetune: bool
    log_level: str
    dist_timeout: float
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
    report_to: tuple                 # the metrics sinks (turing.sinks)
    # the resolved command line, as saved beside every checkpoint (args.json) and logged
    arguments: dict

    @property
    def config(self):
        """The job config's JSON as resolved for this sequence length (saved beside each checkpoint
        as job_config.json), the one `job` was read from."""
        return self.job.raw

    @property
    def local_rank(self):
        """This rank's place on its node (the providers' name for it)."""
        return self.ranks.local_rank

    @classmethod
    def from_args(cls, args, ranks):
        """The config of a parsed, checked command line (complete_arguments) on `ranks`, with the
        micro batch and accumulation DeepSpeed will derive from its config on that many ranks."""
        micro, accum = resolve_batch_sizes(args.ds_config, ranks.world, args.deepspeed_config)
        derived = {"ranks", "model", "ckpt_to_save", "arguments", "train_micro_batch_size_per_gpu",
                   "gradient_accumulation_steps"}
        same = {f.name for f in dataclasses.fields(cls)} - derived
        arguments = {k: v for k, v in vars(args).items() if k not in ("config", "ds_config")}
        arguments.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=accum,
                         vocab_sha256=vocab_digest(args.vocab_file))
        return cls(ranks=ranks, model=ModelOptions.from_args(args), train_micro_batch_size_per_gpu=micro,
                   gradient_accumulation_steps=accum,
                   ckpt_to_save=tuple(args.ckpt_to_save) if args.ckpt_to_save is not None else None,
                   arguments=arguments, **{name: getattr(args, name) for name in same})

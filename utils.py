"""Command line of deepspeed_train.py (the original's `get_argument_parser`) and its time-to-exit
check (`is_time_to_exit`). This process's place in the job and its seeds are turing.process's
(`Ranks`, `get_rank_and_world`, `set_seeds`, importable from here as well).
"""
import argparse
import sys

from turing.errors import OneLineParser
from turing.lr_schedule import schedule_help
from turing.process import Ranks, get_rank_and_world, set_seeds  # noqa: F401 (the library's, re-exported)


def get_argument_parser():
    """Every flag of the pretraining script, one line of help each, with its default."""
    parser = OneLineParser(
        description="Bing BERT pretraining with DeepSpeed",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, epilog="guide: docs/pretraining.md",
    )
    add = parser.add_argument

    # Required
    add("--config-file", "--cf", dest="config_file", required=True,
        help="job config JSON: model, vocab, datasets and per-sequence-length training settings")
    add("--output_dir", required=True,
        help="checkpoints go to OUT/saved_models/JOB, TensorBoard events to OUT/runs/JOB")

    # Data and masking
    add("--max_seq_length", type=int, default=512,
        help="sequence length; selects the '128'/'512' entries of the job config")
    add("--max_predictions_per_seq", "--max_pred", dest="max_predictions_per_seq", type=int, default=80,
        help="cap on masked positions per sequence")
    add("--do_lower_case", dest="do_lower_case", action="store_true", default=None,
        help="lower-case text and strip accents in the tokenizer (the default, unless the tokenizer_config.json "
             "beside the vocab.txt says do_lower_case false)")
    add("--no_lower_case", dest="do_lower_case", action="store_false",
        help="keep case and accents (cased vocab)")
    add("--data_path_prefix", default="", help="prefix joined to the dataset paths of the job config")
    add("--validation_data_path_prefix", default=None,
        help="prefix joined to the job config's validation.path; unset = no validation")
    add("--use_nvidia_dataset", action="store_true", default=False,
        help="read NVIDIA hdf5 shards instead of Bing numpy shards")
    add("--refresh_bucket_size", type=int, default=1,
        help="each picked dataset is repeated grad_accum x this many micro-steps (Bing provider)")

    # Run control
    add("--seed", type=int, default=42, help="seed for python, numpy and torch")
    add("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    add("--job_name", default=None, help="run name (default: the job config's 'name')")
    add("--max_steps", type=int, default=sys.maxsize,
        help="stop after this many optimizer steps, counted since the restore (the original's flag: the same "
             "command re-run after a stop trains that many again; see --stop_at_step)")
    add("--stop_at_step", type=int, default=None,
        help="end the run at this global optimizer step, counted over every session of the run: the same command "
             "re-run after a kill (--auto_resume) ends where the uninterrupted run ends, and once there has "
             "nothing to do")
    add("--max_steps_per_epoch", type=int, default=sys.maxsize,
        help="end an epoch after this many optimizer steps")
    add("--print_steps", type=int, default=100, help="progress line every this many optimizer steps")
    add("--finetune", action="store_true", default=False, help="skip pretraining validation")
    add("--validation_every_steps", type=int, default=0,
        help="also validate every N optimizer steps inside an epoch (logged by step and training minutes); "
             "0 = only after each epoch")
    add("--log_level", default="info", choices=["debug", "info", "warning", "error"],
        help="logging level of rank 0 (other ranks log warnings and errors)")
    add("--debug", action="store_true", default=False,
        help="show Python tracebacks for input errors instead of one error line")
    add("--report_to", nargs="+", default=["tensorboard"], metavar="SINK",
        help="where metrics go: tensorboard (OUT/runs/JOB), wandb ($WANDB_PROJECT, $WANDB_MODE), mlflow "
             "($MLFLOW_TRACKING_URI, else OUT/mlruns); several, 'all' or 'none'; wandb and mlflow need their package")
    add("--peak_tflops", default=None,
        help="peak TFLOP/s of one device for the logged MFU (Train/MFU), or 'measure' (a timed matmul); default: "
             "the data sheet of a known GPU (H200, H100, A100, V100), a measured matmul on the CPU or another device")
    add("--dist_timeout", type=float, default=1800.0,
        help="seconds a collective (all-reduce, barrier) may wait for the other ranks before this rank gives "
             "up with an error line (exit code 5): a rank that died or hangs ends the job instead of stalling "
             "it; the start-up rendezvous waits this long but at least 300 s for the ranks to join")

    # Learning rate
    add("--lr_schedule", default="LE", help=schedule_help())
    add("--lr_offset", type=float, default=0.0, help="added to every computed learning rate")
    add("--rewarmup", action="store_true", default=False,
        help="restart the learning-rate warmup from the restored step (phase 2)")

    # Checkpoints
    add("--load_training_checkpoint", "--load_cp", dest="load_training_checkpoint", default=None,
        help="checkpoint folder to resume from")
    add("--load_checkpoint_id", "--load_cp_id", dest="load_checkpoint_id", default=None,
        help="checkpoint tag inside that folder, e.g. epoch3_step1200")
    add("--ckpt_to_save", nargs="+", type=int, default=None,
        help="epoch numbers to checkpoint (default: every epoch)")
    add("--use_pretrain", action="store_true", default=False,
        help="start the encoder from the job config's bert_model_file")
    add("--trust_checkpoint", action="store_true", default=False,
        help="unpickle checkpoint files in full, which runs any code they hold: only for checkpoints you wrote "
             "yourself that hold Python objects beyond tensors (other DeepSpeed versions); by default every file "
             "must load with torch.load(weights_only=True)")
    add("--checkpoint_every_steps", type=int, default=0,
        help="also checkpoint every N optimizer steps (tag step{S}); 0 = only per epoch")
    add("--keep_last_checkpoints", type=int, default=0,
        help="keep only the newest K interval (step{S}) checkpoints; 0 = keep all")
    add("--auto_resume", action="store_true", default=False,
        help="resume from OUT/saved_models/JOB/latest when it exists, else start fresh")
    add("--max_nonfinite_steps", type=int, default=10,
        help="stop (with a checkpoint of the last good state) after this many non-finite losses in a row")
    add("--max_train_hours", type=float, default=None,
        help="stop cleanly (validation, checkpoint, exit 0) after this much training time, "
             "counted across resumes")

    # Model options
    add("--deepspeed_transformer_kernel", action="store_true", default=False,
        help="use DeepSpeed's fused transformer layer (CUDA only)")
    add("--stochastic_mode", action="store_true", default=False, help="transformer kernel: stochastic mode")
    add("--attention_dropout_checkpoint", action="store_true", default=False,
        help="transformer kernel: recompute attention dropout in backward")
    add("--normalize_invertible", action="store_true", default=False,
        help="transformer kernel: invertible LayerNorm (saves memory)")
    add("--gelu_checkpoint", action="store_true", default=False,
        help="transformer kernel: recompute GELU in backward")
    add("--deepspeed_sparse_attention", action="store_true", default=False,
        help="block-sparse self-attention configured by ds_config 'sparse_attention'")
    add("--checkpoint_activations", action="store_true", default=False,
        help="recompute each encoder layer in backward: less activation memory, ~1/3 more compute")
    add("--progressive_layer_drop", action="store_true", default=False,
        help="progressive layer drop, theta from ds_config 'progressive_layer_drop'")
    add("--unpad", action="store_true", default=False,
        help="run the encoder on real tokens only (padding dropped, restored for the loss): faster on "
             "batches with padding, e.g. phase 2; same results in eval, other dropout draws in training")
    add("--compile", action="store_true", default=False,
        help="torch.compile the model; code torch cannot trace runs eagerly, a compiler error stops the run")
    return parser


def is_time_to_exit(args, epoch_steps=None, global_steps=None):
    """True when the epoch or the whole run has done its allotted optimizer steps.

    `epoch_steps` counts this epoch's optimizer steps; `global_steps` those since the restore;
    either may be left out.
    """
    return ((epoch_steps is not None and epoch_steps >= args.max_steps_per_epoch)
            or (global_steps is not None and global_steps >= args.max_steps))

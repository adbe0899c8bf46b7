#!/usr/bin/env bash
# BERT-large with 0/1 Adam (NCCL backend), seq 512, batch 4K, from the seq-128 run's checkpoint
# LOAD_TAG (the original's default: epoch233_step152511, the one at step 152K; no re-warmup, as
# in the original). Needs CUDA and cupy. Usage:
#   [HOSTFILE=hostfile] [LOAD_TAG=epoch233_step152511] bash scripts/ds_train_bert_01adam_bsz4k_seq512.sh DATA_DIR OUT_DIR [extra flags]
set -euo pipefail
DATA=${1:?data folder}
OUT=${2:?output folder}
shift 2
source "$(dirname "$0")/common.sh"
NCCL_TREE_THRESHOLD=0 \
"${launcher[@]}" deepspeed_train.py \
  --cf configs/bert_large.json \
  --max_seq_length 512 \
  --output_dir "$OUT" \
  --deepspeed \
  --print_steps 40 \
  --lr_schedule LE \
  --lr_offset 0.0 \
  --job_name "${JOB_NAME:-01adam_bsz4k_seq512_nccl}" \
  --deepspeed_config configs/deepspeed_bsz4k_01adam_config_seq512.json \
  --data_path_prefix "$DATA" \
  --load_training_checkpoint "$OUT/saved_models/${PHASE1_JOB:-01adam_bsz4k_seq128_nccl}" \
  --load_checkpoint_id "${LOAD_TAG:-epoch233_step152511}" \
  --auto_resume \
  "$@"

#!/usr/bin/env bash
# Phase 2 of the original recipe: seq 512, batch 32K, from phase 1's epoch-150 checkpoint
# (OUT/saved_models/lamb_64k_seq128/epoch150_*) with the learning rate re-warmed, to epoch 160.
# Usage:
#   [HOSTFILE=hostfile] [LOAD_EPOCH=150] bash scripts/ds_train_bert_bsz32k_seq512.sh DATA_DIR OUT_DIR [extra flags]
# Run the same command again to resume phase 2 (--auto_resume; the warmup continues).
set -euo pipefail
DATA=${1:?data folder}
OUT=${2:?output folder}
shift 2
source "$(dirname "$0")/common.sh"
LOAD_EPOCH=${LOAD_EPOCH:-150}
JOB=${JOB_NAME:-lamb_32k_chkpt${LOAD_EPOCH}_seq512}
phase1_checkpoint "$OUT" "${PHASE1_JOB:-lamb_64k_seq128}" "$LOAD_EPOCH" "$JOB"
"${launcher[@]}" deepspeed_train.py \
  --cf bert_config.json \
  --max_seq_length 512 \
  --output_dir "$OUT" \
  --print_steps 100 \
  --deepspeed \
  "${kernel[@]}" \
  --job_name "$JOB" \
  --deepspeed_config configs/ds_config_seq512.json \
  --data_path_prefix "$DATA" \
  --validation_data_path_prefix "$DATA" \
  --rewarmup \
  --lr_schedule EE \
  --attention_dropout_checkpoint \
  --lr_offset 0.0 \
  "${load[@]}" \
  --auto_resume \
  "$@"

#!/usr/bin/env bash
# Phase 2 of the original recipe on NVIDIA hdf5 shards: seq 512, batch 32K, from phase 1's
# epoch-16 checkpoint (OUT/saved_models/lamb_nvidia_data_64k_seq128/epoch16_*) with the
# learning rate re-warmed, to epoch 20. Usage:
#   [HOSTFILE=hostfile] [LOAD_EPOCH=16] bash scripts/ds_train_bert_nvidia_data_bsz32k_seq512.sh DATA_DIR OUT_DIR [extra flags]
# Run the same command again to resume phase 2 (--auto_resume; the warmup continues).
set -euo pipefail
DATA=${1:?data folder}
OUT=${2:?output folder}
shift 2
source "$(dirname "$0")/common.sh"
LOAD_EPOCH=${LOAD_EPOCH:-16}
JOB=${JOB_NAME:-lamb_nvidia_data_32k_chkpt${LOAD_EPOCH}_seq512}
phase1_checkpoint "$OUT" "${PHASE1_JOB:-lamb_nvidia_data_64k_seq128}" "$LOAD_EPOCH" "$JOB"
"${launcher[@]}" deepspeed_train.py \
  --cf configs/bert_large_nvidia_data.json \
  --max_seq_length 512 \
  --output_dir "$OUT" \
  --print_steps 1 \
  --deepspeed \
  "${kernel[@]}" \
  --job_name "$JOB" \
  --deepspeed_config configs/ds_config_seq512.json \
  --data_path_prefix "$DATA" \
  --use_nvidia_dataset \
  --rewarmup \
  --lr_schedule EE \
  --attention_dropout_checkpoint \
  --lr_offset 0.0 \
  "${load[@]}" \
  --auto_resume \
  "$@"

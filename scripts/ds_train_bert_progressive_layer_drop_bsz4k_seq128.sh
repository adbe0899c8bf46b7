#!/usr/bin/env bash
# BERT-base with progressive layer drop: seq 128, batch 4K, Adam, fp16
# (configs/bert_base_large_lr.json, configs/deepspeed_bsz4k_progressive_layer_drop_config_seq128.json).
# Usage: [HOSTFILE=hostfile] bash scripts/ds_train_bert_progressive_layer_drop_bsz4k_seq128.sh DATA_DIR OUT_DIR [extra flags]
set -euo pipefail
DATA=${1:?data folder}
OUT=${2:?output folder}
shift 2
source "$(dirname "$0")/common.sh"
"${launcher[@]}" deepspeed_train.py \
  --cf configs/bert_base_large_lr.json \
  --max_seq_length 128 \
  --output_dir "$OUT" \
  --deepspeed \
  --print_steps 100 \
  --lr_schedule LE \
  --job_name "${JOB_NAME:-adam_4k_seq128_progressive_layer_drop}" \
  --deepspeed_config configs/deepspeed_bsz4k_progressive_layer_drop_config_seq128.json \
  --data_path_prefix "$DATA" \
  --progressive_layer_drop \
  --auto_resume \
  "$@"

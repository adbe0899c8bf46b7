#!/usr/bin/env bash
# BERT-large with 0/1 Adam (NCCL backend): seq 128, batch 4K (configs/bert_large.json,
# configs/deepspeed_bsz4k_01adam_config_seq128.json). Needs CUDA and cupy. Usage:
#   [HOSTFILE=hostfile] bash scripts/ds_train_bert_01adam_bsz4k_seq128.sh DATA_DIR OUT_DIR [extra flags]
set -euo pipefail
DATA=${1:?data folder}
OUT=${2:?output folder}
shift 2
source "$(dirname "$0")/common.sh"
NCCL_TREE_THRESHOLD=0 \
"${launcher[@]}" deepspeed_train.py \
  --cf configs/bert_large.json \
  --max_seq_length 128 \
  --output_dir "$OUT" \
  --deepspeed \
  --print_steps 40 \
  --lr_schedule LE \
  --lr_offset 0.0 \
  --job_name "${JOB_NAME:-01adam_bsz4k_seq128_nccl}" \
  --deepspeed_config configs/deepspeed_bsz4k_01adam_config_seq128.json \
  --data_path_prefix "$DATA" \
  --auto_resume \
  "$@"

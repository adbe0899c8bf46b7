#!/usr/bin/env bash
# Phase 1 with DeepSpeed sparse attention (the `sparse_attention` block of ds_config.json,
# "fixed" mode), as the original's ds_sa_train_bert_bsz64k_seq128.sh. Usage:
#   [HOSTFILE=hostfile] bash scripts/ds_sa_train_bert_bsz64k_seq128.sh DATA_DIR OUT_DIR [extra flags]
set -euo pipefail
DATA=${1:?data folder}
OUT=${2:?output folder}
shift 2
source "$(dirname "$0")/common.sh"
"${launcher[@]}" deepspeed_train.py \
  --cf bert_config.json \
  --max_seq_length 128 \
  --output_dir "$OUT" \
  --deepspeed \
  --deepspeed_sparse_attention \
  --print_steps 100 \
  --lr_schedule EE \
  --lr_offset 10e-4 \
  --job_name "${JOB_NAME:-lamb_64k_seq128}" \
  --deepspeed_config ds_config.json \
  --data_path_prefix "$DATA" \
  --auto_resume \
  "$@"

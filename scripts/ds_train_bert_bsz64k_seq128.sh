#!/usr/bin/env bash
# Phase 1 of the original recipe: BERT-large, seq 128, batch 64K, LAMB, fp16, Bing numpy shards,
# 150 epochs (bert_config.json, ds_config.json). Usage:
#   [HOSTFILE=hostfile] bash scripts/ds_train_bert_bsz64k_seq128.sh DATA_DIR OUT_DIR [extra flags]
# DATA_DIR holds bnorick_format/128/... and vocab/. Phase 2: ds_train_bert_bsz32k_seq512.sh.
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
  "${kernel[@]}" \
  --print_steps 100 \
  --lr_schedule EE \
  --lr_offset 10e-4 \
  --job_name "${JOB_NAME:-lamb_64k_seq128}" \
  --deepspeed_config ds_config.json \
  --data_path_prefix "$DATA" \
  --auto_resume \
  "$@"

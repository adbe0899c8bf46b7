#!/usr/bin/env bash
# Phase 1 of the original recipe on NVIDIA hdf5 shards: BERT-large, seq 128, batch 64K, LAMB,
# fp16, 16 epochs (configs/bert_large_nvidia_data.json, ds_config.json). Usage:
#   [HOSTFILE=hostfile] bash scripts/ds_train_bert_nvidia_data_bsz64k_seq128.sh DATA_DIR OUT_DIR [extra flags]
# DATA_DIR holds data/128/*training*.hdf5 and vocab/.
set -euo pipefail
DATA=${1:?data folder}
OUT=${2:?output folder}
shift 2
source "$(dirname "$0")/common.sh"
"${launcher[@]}" deepspeed_train.py \
  --cf configs/bert_large_nvidia_data.json \
  --max_seq_length 128 \
  --output_dir "$OUT" \
  --deepspeed \
  "${kernel[@]}" \
  --print_steps 100 \
  --lr_schedule EE \
  --lr_offset 10e-4 \
  --job_name "${JOB_NAME:-lamb_nvidia_data_64k_seq128}" \
  --deepspeed_config ds_config.json \
  --data_path_prefix "$DATA" \
  --use_nvidia_dataset \
  --auto_resume \
  "$@"

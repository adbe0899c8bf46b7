#!/usr/bin/env bash
# Phase 1 of the original recipe: BERT-large, seq 128, batch 64K, LAMB, fp16, NVIDIA hdf5 shards.
# Usage: [HOSTFILE=hostfile] bash scripts/ds_train_bert_nvidia_data_bsz64k_seq128.sh DATA_DIR OUT_DIR [extra flags]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:?data folder (holds hdf5_lower_case_1_seq_len_128_.../ and vocab/)}
OUT=${2:?output folder}
shift 2
launcher=(deepspeed)
[ -n "${HOSTFILE:-}" ] && launcher+=(--hostfile "$HOSTFILE")
"${launcher[@]}" deepspeed_train.py \
  --cf configs/bert_large_nvidia_data.json --use_nvidia_dataset \
  --max_seq_length 128 --max_predictions_per_seq 20 \
  --output_dir "$OUT" --data_path_prefix "$DATA" \
  --deepspeed --deepspeed_config ds_config.json \
  --lr_schedule EE --print_steps 100 \
  "$@"

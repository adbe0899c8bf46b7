#!/usr/bin/env bash
# Phase 1 of the original recipe: BERT-large, seq 128, batch 64K, LAMB, fp16, Bing numpy shards.
# Usage: [HOSTFILE=hostfile] bash scripts/ds_train_bert_bsz64k_seq128.sh DATA_DIR OUT_DIR [extra flags]
# JOB_CONFIG and PROVIDER_FLAGS pick another job config / data provider (the nvidia_data scripts set them).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:?data folder (holds bing_format/128/... and vocab/)}
OUT=${2:?output folder}
shift 2
launcher=(deepspeed)
[ -n "${HOSTFILE:-}" ] && launcher+=(--hostfile "$HOSTFILE")
"${launcher[@]}" deepspeed_train.py \
  --cf "${JOB_CONFIG:-bert_config.json}" ${PROVIDER_FLAGS:-} \
  --max_seq_length 128 --max_predictions_per_seq 20 \
  --output_dir "$OUT" --data_path_prefix "$DATA" \
  --deepspeed --deepspeed_config ds_config.json \
  --lr_schedule EE --print_steps 100 \
  "$@"

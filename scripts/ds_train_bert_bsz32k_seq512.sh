#!/usr/bin/env bash
# Phase 2 of the original recipe: seq 512, batch 32K, started from a phase-1 checkpoint with the
# learning rate re-warmed. Usage:
#   bash scripts/ds_train_bert_bsz32k_seq512.sh DATA_DIR OUT_DIR PHASE1_CKPT_DIR PHASE1_TAG [extra flags]
# e.g. PHASE1_CKPT_DIR=OUT/saved_models/bing_bert_large_lamb_seq PHASE1_TAG=epoch16_step7038
# JOB_CONFIG and PROVIDER_FLAGS pick another job config / data provider (the nvidia_data scripts set them).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:?data folder}
OUT=${2:?output folder}
CKPT=${3:?phase-1 checkpoint folder}
TAG=${4:?phase-1 checkpoint tag}
shift 4
launcher=(deepspeed)
[ -n "${HOSTFILE:-}" ] && launcher+=(--hostfile "$HOSTFILE")
"${launcher[@]}" deepspeed_train.py \
  --cf "${JOB_CONFIG:-bert_config.json}" ${PROVIDER_FLAGS:-} \
  --max_seq_length 512 --max_predictions_per_seq 80 \
  --output_dir "$OUT" --data_path_prefix "$DATA" \
  --deepspeed --deepspeed_config configs/ds_config_seq512.json \
  --lr_schedule EE --print_steps 100 \
  --load_training_checkpoint "$CKPT" --load_checkpoint_id "$TAG" --rewarmup \
  "$@"

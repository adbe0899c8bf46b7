#!/usr/bin/env bash
# Phase 2 with 1-bit LAMB (NCCL backend): seq 512, batch 32K, from the 1-bit LAMB phase 1's
# epoch-150 checkpoint with the learning rate re-warmed, checkpoint at epoch 160 only
# (bert_config.json, configs/deepspeed_bsz32k_onebitlamb_config_seq512.json). Needs CUDA and cupy.
# Usage:
#   [HOSTFILE=hostfile] [LOAD_EPOCH=150] bash scripts/ds_train_bert_onebitlamb_bsz32k_seq512.sh DATA_DIR OUT_DIR [extra flags]
set -euo pipefail
DATA=${1:?data folder}
OUT=${2:?output folder}
shift 2
source "$(dirname "$0")/common.sh"
LOAD_EPOCH=${LOAD_EPOCH:-150}
JOB=${JOB_NAME:-onebit_lamb_32k_chkpt${LOAD_EPOCH}_seq512_nccl}
phase1_checkpoint "$OUT" "${PHASE1_JOB:-onebit_lamb_64k_seq128_nccl}" "$LOAD_EPOCH" "$JOB"
# NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=eth0 (the original's) keep NCCL off InfiniBand; unset them to use it.
NCCL_TREE_THRESHOLD=0 NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-eth0} \
"${launcher[@]}" deepspeed_train.py \
  --cf bert_config.json \
  --max_seq_length 512 \
  --output_dir "$OUT" \
  --print_steps 100 \
  --deepspeed \
  "${kernel[@]}" \
  --job_name "$JOB" \
  --deepspeed_config configs/deepspeed_bsz32k_onebitlamb_config_seq512.json \
  --data_path_prefix "$DATA" \
  --validation_data_path_prefix "$DATA" \
  --rewarmup \
  --lr_schedule EE \
  --attention_dropout_checkpoint \
  --lr_offset 0.0 \
  "${load[@]}" \
  --ckpt_to_save 160 \
  --auto_resume \
  "$@"

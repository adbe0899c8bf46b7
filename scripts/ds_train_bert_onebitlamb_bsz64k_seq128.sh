#!/usr/bin/env bash
# Phase 1 with 1-bit LAMB (NCCL backend): BERT-large, seq 128, batch 64K, checkpoint at epoch
# 150 only (bert_config.json, configs/deepspeed_bsz64k_onebitlamb_config_seq128.json). Needs CUDA
# and cupy. Phase 2: ds_train_bert_onebitlamb_bsz32k_seq512.sh. Usage:
#   [HOSTFILE=hostfile] bash scripts/ds_train_bert_onebitlamb_bsz64k_seq128.sh DATA_DIR OUT_DIR [extra flags]
set -euo pipefail
DATA=${1:?data folder}
OUT=${2:?output folder}
shift 2
source "$(dirname "$0")/common.sh"
# NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=eth0 (the original's) keep NCCL off InfiniBand; unset them to use it.
NCCL_TREE_THRESHOLD=0 NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-eth0} \
"${launcher[@]}" deepspeed_train.py \
  --cf bert_config.json \
  --max_seq_length 128 \
  --output_dir "$OUT" \
  --deepspeed \
  "${kernel[@]}" \
  --print_steps 40 \
  --lr_schedule EE \
  --lr_offset 10e-4 \
  --job_name "${JOB_NAME:-onebit_lamb_64k_seq128_nccl}" \
  --deepspeed_config configs/deepspeed_bsz64k_onebitlamb_config_seq128.json \
  --data_path_prefix "$DATA" \
  --ckpt_to_save 150 \
  --auto_resume \
  "$@"

#!/usr/bin/env bash
# BERT-large with 1-bit Adam (NCCL backend): seq 128, batch 4K (configs/bert_large.json,
# configs/deepspeed_bsz4k_onebitadam_config_seq128.json). Needs CUDA and cupy; for MPI set the
# config's comm_backend_name to "mpi" and set LAUNCHER_ARGS="--launcher openmpi" (README). Usage:
#   [HOSTFILE=hostfile] bash scripts/ds_train_bert_onebitadam_bsz4k_seq128.sh DATA_DIR OUT_DIR [extra flags]
set -euo pipefail
DATA=${1:?data folder}
OUT=${2:?output folder}
shift 2
source "$(dirname "$0")/common.sh"
# NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=eth0 (the original's) keep NCCL off InfiniBand; unset them to use it.
NCCL_TREE_THRESHOLD=0 NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-eth0} \
"${launcher[@]}" deepspeed_train.py \
  --cf configs/bert_large.json \
  --max_seq_length 128 \
  --output_dir "$OUT" \
  --deepspeed \
  "${kernel[@]}" \
  --print_steps 40 \
  --lr_schedule LE \
  --lr_offset 0.0 \
  --job_name "${JOB_NAME:-onebit_adam_4k_seq128_nccl}" \
  --deepspeed_config configs/deepspeed_bsz4k_onebitadam_config_seq128.json \
  --data_path_prefix "$DATA" \
  --auto_resume \
  "$@"

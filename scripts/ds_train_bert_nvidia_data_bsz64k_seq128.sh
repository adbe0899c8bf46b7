#!/usr/bin/env bash
# Phase 1 of the original recipe: BERT-large, seq 128, batch 64K, LAMB, fp16, NVIDIA hdf5 shards.
# Usage: [HOSTFILE=hostfile] bash scripts/ds_train_bert_nvidia_data_bsz64k_seq128.sh DATA_DIR OUT_DIR [extra flags]
set -euo pipefail
JOB_CONFIG=configs/bert_large_nvidia_data.json PROVIDER_FLAGS=--use_nvidia_dataset \
  exec bash "$(dirname "$0")/ds_train_bert_bsz64k_seq128.sh" "$@"

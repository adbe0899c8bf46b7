#!/usr/bin/env bash
# Phase 2 of the original recipe on NVIDIA hdf5 shards: seq 512, batch 32K, started from a phase-1 checkpoint with the
# learning rate re-warmed. Usage:
#   bash scripts/ds_train_bert_nvidia_data_bsz32k_seq512.sh DATA_DIR OUT_DIR PHASE1_CKPT_DIR PHASE1_TAG [extra flags]
# e.g. PHASE1_CKPT_DIR=OUT/saved_models/bing_bert_large_lamb_nvidia_data PHASE1_TAG=epoch16_step7038
set -euo pipefail
JOB_CONFIG=configs/bert_large_nvidia_data.json PROVIDER_FLAGS=--use_nvidia_dataset \
  exec bash "$(dirname "$0")/ds_train_bert_bsz32k_seq512.sh" "$@"

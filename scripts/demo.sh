#!/usr/bin/env bash
# The README's main job: set up, build the demo corpus from text that ships with Python,
# train a WordPiece vocab, write NVIDIA hdf5 shards, pretrain a small BERT on the CPU through
# the deepspeed launcher for 5 minutes of training (the budget LR schedule anneals to 0 by
# then), validating as it goes, and plot the run.
# Usage: bash scripts/demo.sh [WORK_DIR (default demo_run)] [more deepspeed_train.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-demo_run}
PY=${PYTHON:-python3}
bash scripts/setup.sh
bash scripts/prepare_demo_data.sh "$WORK"
launcher=$(command -v deepspeed || echo "$PY -m deepspeed.launcher.runner")
$launcher --num_gpus 1 deepspeed_train.py \
  --cf configs/demo/bert_config.json --deepspeed --deepspeed_config configs/demo/ds_config.json \
  --use_nvidia_dataset --data_path_prefix "$WORK" --validation_data_path_prefix "$WORK" \
  --output_dir "$WORK/out" --max_seq_length 128 --max_predictions_per_seq 40 --print_steps 20 \
  --lr_schedule budget --max_train_hours 0.0833 --validation_every_steps 75 "${@:2}"
"$PY" tools/plot_run.py "$WORK/out/runs/demo_bert" --output "$WORK/demo_run.png"
echo "checkpoints: $WORK/out/saved_models/demo_bert   plot: $WORK/demo_run.png"

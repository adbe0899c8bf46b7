#!/usr/bin/env bash
# The README's main job: set up, build the demo corpus from text that ships with Python,
# train a WordPiece vocab, write NVIDIA hdf5 shards, and pretrain a small BERT on the CPU
# through the deepspeed launcher. Re-running it resumes (or, once finished, leaves) the run in
# WORK/out; remove that folder for a fresh one. Usage: bash scripts/demo.sh [WORK_DIR (default demo_run)]
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-demo_run}
PY=${PYTHON:-python3}
bash scripts/setup.sh
if [ ! -f "$WORK/nvidia/vocab.txt" ]; then
  "$PY" -m tools.make_demo_corpus --output "$WORK/corpus.txt"
  "$PY" -m tools.prepare_data --input "$WORK/corpus.txt" --output_dir "$WORK/nvidia" --format nvidia \
    --build_vocab 8000 --max_seq_length 128 --max_predictions_per_seq 20 --num_shards 2 \
    --validation_fraction 0.05 --workers 2 --overwrite
fi
launcher=$(command -v deepspeed || echo "$PY -m deepspeed.launcher.runner")
$launcher --num_gpus 1 deepspeed_train.py \
  --cf configs/demo/bert_config.json --deepspeed --deepspeed_config configs/demo/ds_config.json \
  --use_nvidia_dataset --data_path_prefix "$WORK" --validation_data_path_prefix "$WORK" \
  --output_dir "$WORK/out" --max_seq_length 128 --max_predictions_per_seq 20 --print_steps 20 --auto_resume "${@:2}"
echo "checkpoints: $WORK/out/saved_models/demo_bert   TensorBoard: tensorboard --logdir $WORK/out/runs"

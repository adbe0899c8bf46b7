#!/usr/bin/env bash
# The demo's data, made once in WORK (default demo_run), used by scripts/demo.sh and
# bench/bench_quality.py: the corpus built offline from text that ships with Python, a
# WordPiece vocab and NVIDIA hdf5 shards at seq 128, all with the same vocab and split.
#   WORK/nvidia/        vocab.txt, train/ (15% of the tokens masked, the original's recipe),
#                       validation/ (15%: every recipe validates on it)
#   WORK/nvidia_mlm40/  train/ with 40% of the tokens masked (the demo's recipe), decontaminated against
#                       the documents WORK/nvidia held out (its heldout.jsonl: the validation set and the
#                       source of the demo's minimal pairs): the training lines that share a 13-word
#                       sequence with them are cut (WORK/nvidia_mlm40/filtered/ shows which)
# Usage: bash scripts/prepare_demo_data.sh [WORK]
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-demo_run}
PY=${PYTHON:-python3}
if [ ! -f "$WORK/nvidia/vocab.txt" ]; then
  "$PY" -m tools.make_demo_corpus --output "$WORK/corpus.txt"
  "$PY" -m tools.prepare_data --input "$WORK/corpus.txt" --output_dir "$WORK/nvidia" --format nvidia \
    --build_vocab 8000 --max_seq_length 128 --max_predictions_per_seq 20 --num_shards 2 \
    --validation_fraction 0.05 --workers 2 --overwrite
else
  echo "using the existing corpus, vocab and shards in $WORK/nvidia (remove the folder to make them again)"
fi
if [ ! -d "$WORK/nvidia_mlm40/train" ]; then
  # the same documents held out (same --validation_fraction), its own validation copy unused
  "$PY" -m tools.prepare_data --input "$WORK/corpus.txt" --output_dir "$WORK/nvidia_mlm40" --format nvidia \
    --vocab_file "$WORK/nvidia/vocab.txt" --masked_lm_prob 0.4 --max_predictions_per_seq 52 --num_shards 2 \
    --validation_fraction 0.05 --workers 2 --overwrite \
    --decontaminate "$WORK/nvidia/heldout.jsonl" --decontaminate_action cut --keep_filtered "$WORK/nvidia_mlm40/filtered"
else
  echo "using the existing 40%-masked shards in $WORK/nvidia_mlm40"
fi

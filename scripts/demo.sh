#!/usr/bin/env bash
# usage: bash scripts/demo.sh [WORK_DIR (default demo_run)] [training flags...]
#        (training flags: the trainer's, listed by its --help; -h or --help here prints this, doing nothing)
# The README's main job, on the CPU: set up; build the demo corpus from text that ships with
# Python, a WordPiece vocab and NVIDIA hdf5 shards (scripts/prepare_demo_data.sh: near duplicates
# dropped, the training lines sharing 13 words with the held-out documents, which every evaluation
# sentence below comes from, cut); pretrain a small BERT-style encoder through the deepspeed
# launcher with the demo's recipe (configs/demo_modern:
# the ModernBERT-style block, 2 layers, 40% masking, MLM only, warmup-stable-decay, no dropout;
# it reached the original block's accuracy 8x sooner, bench/README.md section 13); write its plot
# and print its validation MLM accuracy; then score it and a randomly initialised twin, without fine-tuning, on minimal pairs
# from held-out documents and on the validation set, and print both side by side with the
# unigram baseline (what pretraining bought).
# Re-running it resumes (or, once finished, leaves) the run in WORK/out; remove that folder for
# a fresh one. DEMO_CONFIGS=configs/demo: the same job with the original's BERT block (same recipe).
set -euo pipefail
for arg in "$@"; do
  if [ "$arg" = -h ] || [ "$arg" = --help ]; then sed -n '2,/^set -e/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
done
cd "$(dirname "$0")/.."
WORK=demo_run
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then WORK=$1; shift; fi   # a first argument that is no flag is the folder
PY=${PYTHON:-python3}
CONFIGS=${DEMO_CONFIGS:-configs/demo_modern}
[ -f "$CONFIGS/bert_config.json" ] && [ -f "$CONFIGS/ds_config.json" ] \
  || { echo "error: DEMO_CONFIGS=$CONFIGS: expected a folder holding bert_config.json and ds_config.json" >&2; exit 2; }
bash scripts/setup.sh
bash scripts/prepare_demo_data.sh "$WORK"
launcher=$(command -v deepspeed || echo "$PY -m deepspeed.launcher.runner")
# a free port for the run's rendezvous, so that two demos (or another job) on one machine do not collide
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
# The run ends where its WSD schedule does, at the job config's total_training_steps: within its 3rd
# epoch of the demo's shards (tests/test_recipes.py checks it on the demo's data), so that no step
# trains at learning rate 0. A bound in steps, not in time: the same steps and losses on any machine.
stop=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["mixed_seq_training"]["128"]["total_training_steps"])' \
  "$CONFIGS/bert_config.json")
# keep these flags in step with the "demo" and "demo_modern" recipes of bench/bench_quality.py
bash scripts/run_launcher.sh $launcher --num_gpus 1 --master_port "$port" deepspeed_train.py \
  --cf "$CONFIGS/bert_config.json" --deepspeed --deepspeed_config "$CONFIGS/ds_config.json" --job_name demo_bert \
  --use_nvidia_dataset --data_path_prefix "$WORK" --validation_data_path_prefix "$WORK" \
  --output_dir "$WORK/out" --max_seq_length 128 --max_predictions_per_seq 52 --lr_schedule WSD \
  --validation_every_steps 100 --print_steps 20 --stop_at_step "$stop" --auto_resume "$@"
"$PY" -m tools.plot_run "$WORK/out/runs/demo_bert" --output "$WORK/out/demo_loss.png"

# Zero-shot quality, no fine-tuning: minimal pairs (tools/make_minimal_pairs.py) from the documents
# prepare_data held out of the pretraining shards (its record in WORK/nvidia: documents.json,
# heldout.jsonl), scored by pseudo-log-likelihood (tools/eval_mlm.py) with the checkpoint
# and with a randomly initialised twin, and the validation set's MLM accuracy beside the unigram
# baseline; tools/quality_table.py prints them side by side and writes WORK/quality.json.
# Redone only when the checkpoint is newer than the last scores.
CKPT="$WORK/out/saved_models/demo_bert"
PAIRS="$WORK/minimal_pairs.jsonl"
echo "zero-shot quality of $CKPT, no fine-tuning (4 steps):"
if [ ! -f "$PAIRS" ]; then
  echo "1/4 making minimal pairs (a held-out sentence and a corrupted twin) from the documents kept out of"
  echo "    training: $PAIRS"
  "$PY" -m tools.make_minimal_pairs --heldout "$WORK/nvidia" --output "$PAIRS" \
    --vocab_file "$WORK/nvidia/vocab.txt" --pairs_per_kind 250 > /dev/null
else
  echo "1/4 using the minimal pairs in $PAIRS"
fi
step=2
for init in pretrained random_init; do
  if [ "$init" = random_init ]; then
    what="a randomly initialised twin (same sizes, fresh weights)"; flags=(--random_init)
  else
    what="the checkpoint"; flags=(--tensorboard_dir "$WORK/out/runs/demo_bert")
  fi
  # (also when the scores lack the sha256 of their inputs, which quality_table checks: an older eval_mlm's)
  scores="$WORK/quality_$init/results.json"
  if [ ! "$scores" -nt "$CKPT/latest" ] || ! grep -q '"sha256"' "$scores"; then
    echo "$step/4 scoring $what on the pairs and the validation set with tools/eval_mlm.py (a minute or two on a CPU;"
    echo "    its log: $WORK/quality_$init.log, its scores: $scores)"
    "$PY" -m tools.eval_mlm --model "$CKPT" --pairs "$PAIRS" --validation_set "$WORK/nvidia/validation" \
      --output_dir "$WORK/quality_$init" "${flags[@]}" > "$WORK/quality_$init.log" 2>&1 \
      || { cat "$WORK/quality_$init.log" >&2; exit 1; }
  else
    echo "$step/4 using the scores of $what in $WORK/quality_$init (newer than the checkpoint)"
  fi
  step=$((step + 1))
done
echo "4/4 the two side by side (tools/quality_table.py, also in $WORK/quality.json):"
"$PY" -m tools.quality_table --pretrained "$WORK/quality_pretrained" --random_init "$WORK/quality_random_init" \
  --output "$WORK/quality.json"
echo "checkpoint: $CKPT   plot: $WORK/out/demo_loss.png   Hugging Face export: docs/export.md"

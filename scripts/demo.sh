#!/usr/bin/env bash
# The README's main job, on the CPU: set up; build the demo corpus from text that ships with
# Python, a WordPiece vocab and NVIDIA hdf5 shards (scripts/prepare_demo_data.sh); pretrain a
# small BERT through the deepspeed launcher with the demo's recipe (configs/demo: 2 layers, 40% masking,
# MLM only, warmup-stable-decay, no dropout); write its plot and print its validation MLM
# accuracy; then fine-tune it and a randomly initialised twin on the offline probe suite and
# print both scores side by side (what pretraining bought).
# Re-running it resumes (or, once finished, leaves) the run in WORK/out; remove that folder for
# a fresh one. Usage: bash scripts/demo.sh [WORK_DIR (default demo_run)] [training flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-demo_run}
PY=${PYTHON:-python3}
bash scripts/setup.sh
bash scripts/prepare_demo_data.sh "$WORK"
launcher=$(command -v deepspeed || echo "$PY -m deepspeed.launcher.runner")
# keep these flags in step with the "demo" recipe of bench/bench_quality.py
$launcher --num_gpus 1 deepspeed_train.py \
  --cf configs/demo/bert_config.json --deepspeed --deepspeed_config configs/demo/ds_config.json \
  --use_nvidia_dataset --data_path_prefix "$WORK" --validation_data_path_prefix "$WORK" \
  --output_dir "$WORK/out" --max_seq_length 128 --max_predictions_per_seq 52 --lr_schedule WSD \
  --validation_every_steps 100 --print_steps 20 --auto_resume "${@:2}"
"$PY" -m tools.plot_run "$WORK/out/runs/demo_bert" --output "$WORK/out/demo_loss.png"

# The probe suite (tools/make_probe_tasks.py): small GLUE-layout tasks from the same corpus,
# fine-tuned briefly (sizes cut to about a minute on 2 cores; the GLUE protocol's defaults
# are for real tasks). Redone only when the checkpoint is newer than the last scores.
CKPT="$WORK/out/saved_models/demo_bert"
if [ ! -d "$WORK/probe" ]; then
  "$PY" -m tools.make_probe_tasks --input "$WORK/corpus.txt" --output_dir "$WORK/probe" \
    --train_size 400 --dev_size 400 --max_words 20
fi
for init in pretrained random; do
  if [ ! "$WORK/probe_$init/results.json" -nt "$CKPT/latest" ]; then
    # the log (stdout and stderr) goes to the file; on failure its last lines are shown
    "$PY" -m tools.finetune_glue --model "$CKPT" --task all --data_dir "$WORK/probe" \
      --output_dir "$WORK/probe_$init" --overwrite --seeds 1 --epochs 3 --lr 1e-3 --max_seq_length 32 \
      $([ "$init" = random ] && echo --random_init) > "$WORK/probe_$init.log" 2>&1 \
      || { tail -n 5 "$WORK/probe_$init.log"; exit 1; }
  fi
done
echo "probe suite (dev accuracy x100; $WORK/probe_*/results.json):"
"$PY" -m tools.glue_table pretrained="$WORK/probe_pretrained" "random init"="$WORK/probe_random"
echo "checkpoint: $CKPT   plot: $WORK/out/demo_loss.png   Hugging Face export: see README"

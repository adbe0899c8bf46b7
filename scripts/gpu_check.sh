#!/usr/bin/env bash
# One job for a CUDA machine: the CUDA-only tests (tests/test_gpu.py: fp16, FusedLamb, the
# transformer kernel, sparse attention, --unpad, --compile) and the GPU benchmark (BERT-large,
# bf16, seq 128: samples/s and MFU against the measured bf16 matmul peak; then --unpad at 50%
# padding). Results go to OUT (default gpu_check/): pytest.log, gpu.jsonl, bench*.log.
# Usage: bash scripts/gpu_check.sh [OUT]      (about 5-8 minutes on one H100/H200)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-gpu_check}}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
"$PY" -c "import torch, deepspeed; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'deepspeed', deepspeed.__version__, torch.cuda.get_device_name())" >> "$OUT/gpu.txt" 2>&1
status=0
"$PY" -m pytest -q -rs tests/test_gpu.py 2>&1 | tee "$OUT/pytest.log" | tail -n 20 || status=1
"$PY" bench/bench_model.py --device cuda --large --dtype bf16 --seq 128 --batch 64 \
  --output "$OUT/gpu.jsonl" 2>&1 | tee "$OUT/bench_large.log" | tail -n 12 || status=1
"$PY" bench/bench_model.py --device cuda --large --dtype bf16 --seq 128 --batch 64 --pad 0.5 \
  --models ours+unpad,ours --memory off --output "$OUT/gpu.jsonl" 2>&1 | tee "$OUT/bench_unpad.log" | tail -n 6 || status=1
exit $status

#!/usr/bin/env bash
# The prepared GPU job of the trainer itself (bench/bench_train_gpu.py; under 10 minutes on one
# H100/H200): BERT-large through deepspeed deepspeed_train.py at seq 128 and 512, bf16 + fused
# AdamW, bf16 + Lamb, fp16 + FusedLamb, beside the pure model step, then the transformer-kernel
# probe. Results in OUT (default bench_gpu/): train_gpu.jsonl, one log per run.
# On the lent machine, which lacks DeepSpeed and tensorboardX, carry .whl (../shared/gpu-wheels):
#   echo /.whl/ >> .git/info/exclude; mkdir -p .whl; cp ../shared/gpu-wheels/*.whl .whl/
# Usage: bash bench/bench_train_gpu.sh [OUT] [bench_train_gpu.py flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-bench_gpu}}
PY=${PYTHON:-python3}
source scripts/require_cuda.sh
require_cuda "no CUDA device: bench/bench_train_gpu.sh needs a GPU (torch.cuda.is_available() is False here)"
if ! "$PY" -c "import deepspeed, tensorboardX" 2>/dev/null && ls .whl/*.whl > /dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-} || exit 2
fi
# DeepSpeed 0.19's JIT op builder parses TORCH_CUDA_ARCH_LIST as numbers ("9.0a" fails)
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${GPU_ARCH:-9.0} MAX_JOBS=${MAX_JOBS:-16}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "import torch, deepspeed; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'deepspeed', deepspeed.__version__)"
} > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
exec "$PY" bench/bench_train_gpu.py --out "$OUT" "${@:2}"

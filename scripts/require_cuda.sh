# Sourced by the CUDA-only scripts: require_cuda MESSAGE ends the script with "error: MESSAGE"
# and exit 2 when torch sees no CUDA device, before the script does anything else.
require_cuda() {
  if ! "${PYTHON:-python3}" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "error: $1" >&2
    exit 2
  fi
}

#!/usr/bin/env bash
# Installs what the project needs into the current Python (a venv or the system one).
# Usage: bash scripts/setup.sh [dev]     -- "dev" adds the test requirements.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# torch first: with torch already present pip keeps it; on a bare machine take the CPU build
# (2.13.0) rather than letting a loose requirement pull a several-GB CUDA wheel.
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q torch==2.13.0
fi
req=requirements.txt
[ "${1:-}" = "dev" ] && req=requirements-dev.txt
"$PY" -m pip install -q -r "$req"

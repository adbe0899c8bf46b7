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
# DeepSpeed builds its CPU communication op on first use (about a minute, longer on a busy
# machine); build it here, once per machine, so that no run spends its start compiling or waits
# on another run's build. Nothing to do where an accelerator is found (the op is the CPU's).
"$PY" - >/dev/null <<'PYEOF'
import logging
logging.disable(logging.WARNING)
from deepspeed.accelerator import get_accelerator
if get_accelerator().device_name() == "cpu":
    import sys
    print("set-up: DeepSpeed's CPU communication op (compiled on a machine's first set-up: about a minute)",
          file=sys.stderr, flush=True)
    from deepspeed.comm.torch import build_shm_op
    build_shm_op()
PYEOF

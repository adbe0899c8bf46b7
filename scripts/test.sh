#!/usr/bin/env bash
# The README's test command: set up (test extras included), then run the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
exec "${PYTHON:-python3}" -m pytest -q tests/ "$@"

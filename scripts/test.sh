#!/usr/bin/env bash
# The README's test command: set up (test extras included), then run the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
# two workers, one test file each at a time (module fixtures built once), the longest files first
# (tests/conftest.py's LONG_FIRST); `-n 0` runs serially
exec "${PYTHON:-python3}" -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests/ "$@"

#!/usr/bin/env bash
# The README's demo command: create .venv, install Tidegate, run the demo fleet
# (`bash scripts/demo.sh --compare round_robin --duration 30 --load 1.0`: Tidegate next to round-robin).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
exec .venv/bin/tidegate demo "$@"

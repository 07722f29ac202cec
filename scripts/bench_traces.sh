#!/usr/bin/env bash
# Benchmarks of docs/BENCHMARKS.md: every policy on 16 x llama3-8b-h100 at loads 0.5-1.1 of the
# fleet's estimated capacity, replaying the Azure conversation and code traces and the Mooncake
# synthetic trace. Usage: scripts/bench_traces.sh [TRACE_DIR] [OUT_DIR] [extra simulate flags...]
# (the traces are not shipped with the package; default TRACE_DIR ../shared/data/traces).
# POLICY=llmd,least_kv limits the policies (default: all). The second table set of the doc:
#   POLICY=llmd,least_kv scripts/bench_traces.sh TRACE_DIR OUT_DIR --scrape-ms 50
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
traces="${1:-$here/../shared/data/traces}"
out="${2:-${TMPDIR:-/tmp}/tidegate-bench}"
shift $(( $# > 2 ? 2 : $# ))
py="${PYTHON:-$here/.venv/bin/python}"
mkdir -p "$out"
common=(--replicas 16 --profile llama3-8b-h100 --load 0.5,0.7,0.9,1.1 --policy "${POLICY:-all}" --seed 0 --log-level warning)
run() {
  local name="$1"; shift
  echo "== $name" >&2
  /usr/bin/time -f "$name: %e s wall" "$py" -m tidegate.cli.main simulate "${common[@]}" "$@" \
    --json "$out/$name.json" > "$out/$name.txt"
}
run azure_conv --trace "$traces/AzureLLMInferenceTrace_conv.csv" --slo-ttft 2s --slo-tpot 100ms "$@" &
run azure_code --trace "$traces/AzureLLMInferenceTrace_code.csv" --slo-ttft 2s --slo-tpot 100ms "$@"
# Mooncake prompts average 15k tokens (p99 66k, up to the 128k context): alone on an idle H100 a
# 66k-token prompt needs ~1.5 s of prefill and a 128k one ~2.9 s, so TTFT <= 2 s is unattainable
# for the long tail whatever the routing; 5 s leaves room for queueing to separate the policies.
run mooncake --trace "$traces/mooncake_synthetic_trace.jsonl" --slo-ttft 5s --slo-tpot 100ms "$@"
wait

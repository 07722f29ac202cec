#!/usr/bin/env bash
# Benchmarks of docs/BENCHMARKS.md on 16 x llama3-8b-h100, replaying the Azure conversation and
# code traces and the Mooncake synthetic trace (not shipped; default TRACE_DIR ../shared/data/traces).
#
# Usage: scripts/bench_traces.sh [TRACE_DIR] [OUT_DIR] [extra simulate flags...]
#
# Default: the SLO-capacity tables. Per trace, every policy (POLICY, default all) with 1 and 4
# routers (ROUTERS, default 1,4) is searched for the highest offered rate at which >= 95% of the
# requests meet both SLOs (tidegate simulate --find-capacity); JOBS (default 2) searches run in
# parallel. CONV_MAX / CODE_MAX / MOON_MAX (default: the whole trace) replay only the first N
# requests of each trace; TRACES (default "azure_conv azure_code mooncake") picks the traces.
# Writes OUT_DIR/<trace>.json, .txt, and OUT_DIR/tables.md (markdown); each finished capacity
# search is also appended to OUT_DIR/<trace>.json.progress.jsonl as it completes.
# LOADS=0.5,0.7,0.9,1.1 instead runs that load sweep (the older tables of the doc).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
traces="${1:-$here/../shared/data/traces}"
out="${2:-${TMPDIR:-/tmp}/tidegate-bench}"
shift $(( $# > 2 ? 2 : $# ))
py="${PYTHON:-$here/.venv/bin/python}"
mkdir -p "$out"
common=(--replicas 16 --profile llama3-8b-h100 --policy "${POLICY:-all}" --routers "${ROUTERS:-1,4}" --seed 0
        --jobs "${JOBS:-2}" --log-level warning)
if [[ -n "${LOADS:-}" ]]; then common+=(--load "$LOADS"); else common+=(--find-capacity --attainment 0.95); fi
want=" ${TRACES:-azure_conv azure_code mooncake} "
run() {
  local name="$1" max="$2"; shift 2
  [[ "$want" == *" $name "* ]] || return 0
  local window=()
  [[ -n "$max" ]] && window=(--max-requests "$max")
  echo "== $name" >&2
  /usr/bin/time -f "$name: %e s wall" "$py" -m tidegate.cli.main simulate "${common[@]}" "${window[@]}" "$@" \
    --json "$out/$name.json" > "$out/$name.txt"
}
run azure_conv "${CONV_MAX:-}" --trace "$traces/AzureLLMInferenceTrace_conv.csv" --slo-ttft 2s --slo-tpot 100ms "$@"
run azure_code "${CODE_MAX:-}" --trace "$traces/AzureLLMInferenceTrace_code.csv" --slo-ttft 2s --slo-tpot 100ms "$@"
# Mooncake prompts average 15k tokens (p99 66k, up to the 128k context): alone on an idle H100 a
# 66k-token prompt needs ~1.5 s of prefill and a 128k one ~2.9 s, so TTFT <= 2 s is unattainable
# for the long tail whatever the routing; 5 s leaves room for queueing to separate the policies.
run mooncake "${MOON_MAX:-}" --trace "$traces/mooncake_synthetic_trace.jsonl" --slo-ttft 5s --slo-tpot 100ms "$@"
files=()
for name in azure_conv azure_code mooncake; do [[ -f "$out/$name.json" ]] && files+=("$out/$name.json"); done
"$py" "$here/scripts/bench_tables.py" "${files[@]}" > "$out/tables.md"
echo "wrote $out/tables.md" >&2

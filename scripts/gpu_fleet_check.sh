#!/usr/bin/env bash
# On a GPU machine: a local fleet (`tidegate up`, 2 simulated replicas) whose agents read the real
# GPU through NVML (`--gpu-source nvml`, the default), then what the control plane shows of it,
# before and while another process holds GPU memory. Writes its captures to DIR (default ./gpu-fleet).
# Needs `tidegate` on PATH and PyTorch with CUDA for the allocation step.
set -uo pipefail
out=${1:-gpu-fleet}
hold_gib=${HOLD_GIB:-20}
mkdir -p "$out"
run_dir=$(mktemp -d)
tidegate up --replicas 2 --report-interval-s 0.5 --run-dir "$run_dir" > "$out/up.txt" 2>&1 &
up=$!
trap 'kill -INT $up 2>/dev/null; wait $up 2>/dev/null' EXIT
for _ in $(seq 120); do grep -q "fleet is up" "$out/up.txt" && break; sleep 0.5; done
grep -q "fleet is up" "$out/up.txt" || { echo "fleet did not come up"; cat "$out/up.txt"; tail -n 20 "$run_dir"/*.log; exit 1; }
sleep 2  # a few reports
tidegate get replicas | tee "$out/replicas-idle.txt"
tidegate describe replica replica-0 -o json > "$out/describe.json"
tidegate describe replica replica-0 | tee "$out/describe.txt"
python3 - "$hold_gib" <<'PY' &
import sys, time, torch
buf = torch.ones(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print(f"holding {sys.argv[1]} GiB on cuda:0", flush=True)
time.sleep(8)
PY
holder=$!
sleep 5  # allocation plus at least two reports
tidegate get replicas | tee "$out/replicas-held.txt"
tidegate get replicas -o json > "$out/replicas-held.json"
wait $holder
sleep 2
tidegate get replicas | tee "$out/replicas-after.txt"
cp "$run_dir"/agent-0.log "$out/agent-0.log" 2>/dev/null
echo "gpu fleet check done"

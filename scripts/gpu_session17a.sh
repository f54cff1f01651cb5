#!/bin/bash
# H200 call 1 of session 17: the whole `make test-gpu` (two halves, scripts/gpu_test_halves.sh)
# and beside it `make probe` (the first run with the tf32 cutlass_80 s1688 64x64_16x6 row).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T=${1:-540}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bash scripts/gpu_test_halves.sh "$T" &   # make test-gpu, two halves
t0=$SECONDS
timeout 400 make probe PROBE_ARGS="--out /tmp/pa" > "$OUT/probe.log" 2>&1
echo "=== make probe rc=$? wall $((SECONDS - t0))s (beside make test-gpu)" >> "$OUT/probe.log"
cp /tmp/pa/*/*/report.json "$OUT/probe-report.json"; cp /tmp/pa/*/*/report.html "$OUT/probe-report.html"
tail -1 "$OUT/probe.log"
python3 scripts/probe_summary.py "$OUT/probe-report.json"
wait
for f in a b; do grep -E "passed|failed|rc=" "$OUT/test-gpu-$f.log" | tail -3; done
grep -E "FAILED|Error" "$OUT"/test-gpu-*.log | head -20

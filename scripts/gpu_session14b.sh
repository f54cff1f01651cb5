#!/bin/bash
# H200 call 2 of session 14: `make probe` timed alone (every device, the bounded random-shape
# step included), then whether cuBLASLt's heuristic predicts the probed split-K.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
t0=$SECONDS
timeout 330 make probe PROBE_ARGS="--out /tmp/pa" > "$OUT/probe.log" 2>&1
echo "=== make probe rc=$? wall $((SECONDS - t0))s"; tail -40 "$OUT/probe.log"
cp /tmp/pa/*/*/report.json "$OUT/probe-report.json" 2>/dev/null
cp /tmp/pa/*/*/report.html "$OUT/probe-report.html" 2>/dev/null
timeout 120 python3 scripts/gpu_heuristic_check.py --log reports/baselines/shapes/nvidia-h200.jsonl \
  --out "$OUT/heuristic.json" > "$OUT/heuristic.log" 2>&1
echo "=== heuristic rc=$? $((SECONDS - t0))s"; cat "$OUT/heuristic.log" | tail -20

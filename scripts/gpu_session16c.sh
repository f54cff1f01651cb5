#!/bin/bash
# H200 call 3 of session 16: `make probe` timed alone with the combine-order step in explain,
# then the GPU test of the combine probe (tests/test_split_order.py).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
t0=$SECONDS
timeout 320 make probe PROBE_ARGS="--out /tmp/pa" > "$OUT/probe.log" 2>&1
echo "=== make probe rc=$? wall $((SECONDS - t0))s" >> "$OUT/probe.log"
cp /tmp/pa/*/*/report.json "$OUT/probe-report.json"; cp /tmp/pa/*/*/report.html "$OUT/probe-report.html"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_split_order.py > "$OUT/test-gpu-d.log" 2>&1
echo "rc=$?" >> "$OUT/test-gpu-d.log"
tail -1 "$OUT/probe.log"; grep -E "passed|failed|rc=" "$OUT/test-gpu-d.log" | tail -2
python3 scripts/probe_summary.py "$OUT/probe-report.json"

#!/bin/bash
# H200 call 4 of session 15: `make probe` timed alone (every device; the missed validation
# shapes now explained at their shape, Triton imprecise-0 from its kernel row), then the
# random-shape validation of cuBLAS fp16 / tf32 / fp32 with the session's new rules (the
# logged misses checked again first, then fresh shapes up to 115 each), beside the GPU tests
# of the files this session changed.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T=${1:-560}
t0=$SECONDS
timeout 320 make probe PROBE_ARGS="--out /tmp/pa" > "$OUT/probe.log" 2>&1
echo "=== make probe rc=$? wall $((SECONDS - t0))s"
cp /tmp/pa/*/*/report.json "$OUT/probe-report.json" 2>/dev/null
cp /tmp/pa/*/*/report.html "$OUT/probe-report.html" 2>/dev/null
R=$((T - (SECONDS - t0) - 15))
( timeout $((R - 5)) python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_explain.py tests/test_shape_validation.py \
    tests/test_native.py tests/test_probes_gpu.py > "$OUT/test-gpu-c.log" 2>&1; echo "rc=$?" >> "$OUT/test-gpu-c.log" ) &
OUT=$OUT SHAPES=115 GROUPS_="cuda-cublas-fp32 cuda-cublas-tf32 cuda-cublas-float16" \
  BASELINE=reports/baselines/shapes/h200-probe-session14.json \
  VALIDATE_SHAPES_ARGS="--explain-budget-s 20 --retry-misses" bash scripts/gpu_validate_shapes.sh "$R" > /dev/null 2>&1
wait
echo "=== done $((SECONDS - t0))s"; tail -3 "$OUT/test-gpu-c.log"; grep -E "FAILED" "$OUT/test-gpu-c.log" | head
python3 - "$OUT/probe-report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for d in r["devices"]:
    v = (d.get("validation") or {})
    print(f'{d["name"]:45s} {d["status"]:8s} {d.get("wall_s", 0):6.1f}s', v.get("matches"), "/", v.get("outputs"),
          (d.get("extra") or {}).get("unfitted_kernels", "")[:1])
PY
tail -40 "$OUT/run.log"

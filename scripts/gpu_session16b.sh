#!/bin/bash
# H200 call 2 of session 16: the combine-order probe in explain, on the GPU.  cuBLAS fp32's
# logged miss (26x1402x11025, sm80_xmma 32x128x8 adding its 48 slices in a measured order)
# checked again first, then fresh random fp32 shapes; beside it the GPU tests of the changed
# files (explain, shape validation, native).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T=${1:-480}
( OMP_NUM_THREADS=2 timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_explain.py \
    tests/test_shape_validation.py tests/test_native.py tests/test_split_order.py > "$OUT/test-gpu-c.log" 2>&1
  echo "rc=$?" >> "$OUT/test-gpu-c.log" ) &
OUT=$OUT SHAPES=${SHAPES:-170} GROUPS_="cuda-cublas-fp32" BASELINE=reports/baselines/shapes/h200-probe-session14.json \
  VALIDATE_SHAPES_ARGS="--explain-budget-s 30 --retry-misses" bash scripts/gpu_validate_shapes.sh "$T" > /dev/null 2>&1
wait
grep -E "passed|failed|rc=" "$OUT/test-gpu-c.log" | tail -3
grep -E "cuda-cublas-fp32" "$OUT/run.log" | tail -12
python3 - "$OUT/shapes.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["device"] == "cuda-cublas-fp32" and r.get("utc", "") > "2026-12-02T05" and "matches" in r:
        print(r["shape"], r["matches"], "/", r["outputs"], r.get("explain_s"), r["model"][-60:], r["kernels"][-1][:60])
PY

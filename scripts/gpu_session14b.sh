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
timeout 60 python3 scripts/gpu_heuristic_check.py --log reports/baselines/shapes/nvidia-h200.jsonl \
  --out "$OUT/heuristic.json" > /tmp/heuristic.log 2>&1
echo "=== heuristic rc=$? $((SECONDS - t0))s"; tail -20 /tmp/heuristic.log
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_emulator.py \
  -k "h200_fp8_cuda or fast_path_cuda" > "$OUT/fast-gpu.log" 2>&1
echo "=== fast-path GPU tests rc=$? $((SECONDS - t0))s"; tail -3 "$OUT/fast-gpu.log"
# issue 18: the distribution table after the counts fix-up (MXFP4 included), MXFP4's profile
# and where the host time of prepare goes
OUT=$OUT T_DIST=110 CAP_S=10 STEPS=dist bash scripts/gpu_cliffs.sh > /dev/null 2>&1
echo "=== dist $((SECONDS - t0))s"; tail -45 "$OUT/dist.log"
timeout 60 python3 scripts/gpu_profile_gemm.py mxfp4,host > "$OUT/profile.log" 2>&1
echo "=== profile rc=$? $((SECONDS - t0))s"; grep -v "^   " "$OUT/profile.log" | head -60

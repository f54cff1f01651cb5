#!/bin/bash
# One H200 call for issue 13 (and the new GPU paths): the GPU tests of the new modules, the
# emulator speed check, `make probe` (timed, random-shape step included) and the random-shape
# validation for the time left.  Everything flat into $OUT (at most 8 files).
#   OUT=/dir bash scripts/gpu_session13.sh [VALIDATE_SECONDS]
set -u
OUT=${OUT:?OUT}
VS=${1:-130}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
t0=$SECONDS
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_explain.py tests/test_native.py \
  tests/test_shape_validation.py tests/test_gemm_triton_wide.py tests/test_gemm_emulator.py \
  $(ls tests/test_gemm_triton_specials.py tests/test_probes_kernels.py tests/test_probes_triton0.py 2>/dev/null) \
  > "$OUT/gpu-tests.log" 2>&1
echo "=== gpu tests rc=$? $((SECONDS - t0))s"; tail -4 "$OUT/gpu-tests.log"
[ -f scripts/gpu_emulate_speed.py ] && timeout 60 python3 scripts/gpu_emulate_speed.py > "$OUT/emulate-speed.log" 2>&1
echo "=== emulate speed rc=$? $((SECONDS - t0))s"; tail -12 "$OUT/emulate-speed.log"
t1=$SECONDS
timeout 320 make probe PROBE_ARGS="--out /tmp/pa" > "$OUT/probe.log" 2>&1
echo "=== make probe rc=$? wall $((SECONDS - t1))s"; tail -30 "$OUT/probe.log"
cp /tmp/pa/*/*/report.json "$OUT/probe-report.json" 2>/dev/null
cp /tmp/pa/*/*/report.html "$OUT/probe-report.html" 2>/dev/null
OUT=$OUT bash scripts/gpu_validate_shapes.sh "$VS" > /dev/null 2>&1
echo "=== validate-shapes $((SECONDS - t0))s total"; tail -40 "$OUT/run.log"

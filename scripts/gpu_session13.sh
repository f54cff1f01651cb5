#!/bin/bash
# One H200 call for issues 13 and 18: the GPU tests of the new modules, the emulator speed
# check, where the block-scaled GEMM's time goes, `make probe` (timed, random-shape step
# included) and the random-shape validation for the time left.  Flat into $OUT (8 files).
#   OUT=/dir bash scripts/gpu_session13.sh [VALIDATE_SECONDS]
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
t0=$SECONDS
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_explain.py tests/test_native.py \
  tests/test_shape_validation.py tests/test_gemm_triton_wide.py tests/test_gemm_triton_specials.py \
  tests/test_gemm_emulator.py tests/test_probes_kernels.py > "$OUT/gpu-tests.log" 2>&1
echo "=== gpu tests rc=$? $((SECONDS - t0))s"; tail -4 "$OUT/gpu-tests.log"
timeout 60 python3 scripts/gpu_emulate_speed.py --ks 2048,12347 --generic-max-k bf16=2048,tf32=2048,fp32=512 > "$OUT/emulate-speed.log" 2>&1
echo "=== emulate speed rc=$? $((SECONDS - t0))s"; tail -14 "$OUT/emulate-speed.log"
timeout 60 python3 scripts/gpu_profile_gemm.py > "$OUT/profile-gemm.log" 2>&1
echo "=== profile rc=$? $((SECONDS - t0))s"; grep -v "^   " "$OUT/profile-gemm.log" | tail -12
t1=$SECONDS
timeout 310 make probe PROBE_ARGS="--out /tmp/pa" > "$OUT/probe.log" 2>&1
echo "=== make probe rc=$? wall $((SECONDS - t1))s"; tail -32 "$OUT/probe.log"
cp /tmp/pa/*/*/report.json "$OUT/probe-report.json" 2>/dev/null
cp /tmp/pa/*/*/report.html "$OUT/probe-report.html" 2>/dev/null
VS=$(( 585 - (SECONDS - t0) ))   # the rest of the call
[ "$VS" -ge 40 ] && OUT=$OUT bash scripts/gpu_validate_shapes.sh "$VS" > /dev/null 2>&1
echo "=== validate-shapes ($VS s) $((SECONDS - t0))s total"; tail -30 "$OUT/run.log"; rm -f "$OUT/run.log"

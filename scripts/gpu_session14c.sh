#!/bin/bash
# H200 call 3 of session 14: the random-shape validation, one process per device, beside the
# block-scaled GEMM GPU tests (the files call 1 left out).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T=${1:-560}
( timeout $((T - 20)) python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 tests/test_gemm_triton.py \
   tests/test_gemm_triton_specials.py tests/test_gemm_triton_wide.py > "$OUT/test-gpu-b.log" 2>&1
  echo "rc=$?" >> "$OUT/test-gpu-b.log" ) &
OUT=$OUT bash scripts/gpu_validate_shapes.sh "$T" > /dev/null 2>&1
wait
tail -4 "$OUT/test-gpu-b.log"; tail -45 "$OUT/run.log"

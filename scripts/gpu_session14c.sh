#!/bin/bash
# H200 call 3 of session 14: the random-shape validation, one process per device (the missed
# shapes of earlier runs checked again first, explanation budget 20 s, base models from this
# session's `make probe` report), beside the block-scaled GEMM GPU tests call 1 left out.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T=${1:-540}
( timeout $((T - 20)) python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 tests/test_gemm_triton.py \
   tests/test_gemm_triton_specials.py tests/test_gemm_triton_wide.py > "$OUT/test-gpu-b.log" 2>&1
  echo "rc=$?" >> "$OUT/test-gpu-b.log" ) &
G="cuda-cublas-fp32 cuda-cublas-tf32 cuda-cublas-bfloat16 cuda-cublas-float16"
for m in tensorwise rowwise; do for f in slow fast; do for o in float32 bfloat16; do
  G="$G cuda-scaled_mm-e4m3-$m-$f-$o"; done; done; done
G="$G triton-dot-e4m3-imprecise-unset triton-dot-e4m3-imprecise-32 triton-dot-e4m3-imprecise-64"
G="$G triton-dot-e4m3-imprecise-128"   # imprecise-0: no model in the family order (docs/kernels.md)
OUT=$OUT GROUPS_="$G" BASELINE=reports/baselines/shapes/h200-probe-session14.json \
  VALIDATE_SHAPES_ARGS="--explain-budget-s 20 --retry-misses" bash scripts/gpu_validate_shapes.sh "$T" > /dev/null 2>&1
wait
tail -4 "$OUT/test-gpu-b.log"; tail -60 "$OUT/run.log"

#!/bin/bash
# H200 call 1 of session 15: the whole `make test-gpu` (two halves side by side: the
# block-scaled GEMM files, and the rest), and beside them the random-shape validation of the
# devices short of issue 13's target (the missed shapes of earlier runs checked again first,
# explanation budget 20 s), Triton imprecise-0 included (base model: its kernel row).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T=${1:-560}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bash scripts/gpu_test_halves.sh "$T" &   # make test-gpu, two halves
G="cuda-cublas-fp32 cuda-cublas-tf32 cuda-cublas-float16 triton-dot-e4m3-imprecise-0"
G="$G triton-dot-e4m3-imprecise-unset triton-dot-e4m3-imprecise-32 triton-dot-e4m3-imprecise-64"
G="$G triton-dot-e4m3-imprecise-128"
OUT=$OUT GROUPS_="$G" BASELINE=reports/baselines/shapes/h200-probe-session14.json \
  VALIDATE_SHAPES_ARGS="--explain-budget-s 20 --retry-misses" bash scripts/gpu_validate_shapes.sh "$T" > /dev/null 2>&1
wait
for f in a b; do grep -E "passed|failed|rc=" "$OUT/test-gpu-$f.log" | tail -3; done
grep -E "FAILED|Error" "$OUT"/test-gpu-*.log | head -20
tail -45 "$OUT/run.log"

#!/bin/bash
# H200 call 2 of session 15: dumps for offline fitting of the kernels the random shapes left
# unexplained (cuBLAS fp16 split-K at 48x330x12213 and serial split at 2607x1559x2272; tf32
# segment-K, one output per 64 x 64 tile, launched three times; fp32 gemv at N = 1 and M = 1),
# beside the fp32 random shapes still short of 100.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T=${1:-400}
D="python3 scripts/gpu_dump_shapes.py"
( $D --devices cuda-cublas-float16 --shape 48x330x12213 --shape 2607x1559x2272 --rows 16 --cols 16 --repeat 2 \
    --out $OUT/f16.npz > $OUT/dump.log 2>&1
  $D --devices cuda-cublas-tf32 --shape 2223x2468x9324 --shape 1945x568x13960 --shape 273x1608x12664 --step 64 \
    --repeat 3 --out $OUT/tf32.npz >> $OUT/dump.log 2>&1
  $D --devices cuda-cublas-fp32 --shape 3654x1x15364 --shape 1000x1x4000 --shape 517x1x333 --shape 2048x1x8192 \
    --shape 1x1500x3000 --shape 1x77x9000 --rows 16 --cols 16 --repeat 2 --out $OUT/gemv.npz >> $OUT/dump.log 2>&1 ) &
OUT=$OUT GROUPS_="cuda-cublas-fp32" BASELINE=reports/baselines/shapes/h200-probe-session14.json \
  VALIDATE_SHAPES_ARGS="--explain-budget-s 20" bash scripts/gpu_validate_shapes.sh "$T" > /dev/null 2>&1
wait
ls -la $OUT; cat $OUT/dump.log | cut -c1-400; tail -30 "$OUT/run.log"

#!/bin/bash
# H200 call 1 of session 14: the GPU tests except the block-scaled GEMM files (call 2 runs
# those), and beside them, exploration for issue 13: the shape survey of cuBLAS bf16/fp16 with
# operand dumps (the cutlass_80 s16816 kernels), what Triton fp8 tl.dot compiles to with
# max_num_imprecise_acc=0, and TF32/FP32 random shapes after the precision-switch fix.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
( timeout 560 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=25 tests \
    --ignore=tests/test_gemm_triton.py --ignore=tests/test_gemm_triton_specials.py \
    --ignore=tests/test_gemm_triton_wide.py > "$OUT/test-gpu-a.log" 2>&1; echo "rc=$?" >> "$OUT/test-gpu-a.log" ) &
P1=$!
( OMP_NUM_THREADS=3 timeout 330 python3 scripts/shape_survey.py --baseline reports/baselines/redesign/h200-probe-after.json \
    --only cublas-bfloat16,cublas-float16 --shapes 40 --max-k 8192 --budget-s 290 --search-s 3 --seed 14 \
    --out /tmp/sv > /tmp/sv.log 2>&1; cp /tmp/sv.log /tmp/sv/; tar czf "$OUT/survey.tgz" -C /tmp sv ) &
( OMP_NUM_THREADS=3 timeout 200 python3 scripts/triton_dump.py --out /tmp/td > /tmp/td.log 2>&1; cp /tmp/td.log /tmp/td/;
  tar czf "$OUT/triton.tgz" -C /tmp td ) &
cp reports/baselines/shapes/nvidia-h200.jsonl /tmp/vs.jsonl
for d in cuda-cublas-tf32 cuda-cublas-fp32; do
  ( OMP_NUM_THREADS=3 timeout 420 python3 -m fp4ref validate-shapes --baseline reports/baselines/redesign/h200-probe-after.json \
     --devices $d --shapes 100 --time-limit-s 380 --log /tmp/vs.jsonl > /tmp/vs-$d.log 2>&1 ) &
done
wait
cat /tmp/vs-*.log > "$OUT/vs.log"
python3 -c "
import json
for l in open('/tmp/vs.jsonl'):
    r=json.loads(l)
    if r['device'] in ('cuda-cublas-tf32','cuda-cublas-fp32'): print(l, end='')
" > "$OUT/vs-new.jsonl"
echo "=== done $((SECONDS - t0))s"; tail -5 "$OUT/test-gpu-a.log"; tail -15 "$OUT/vs.log"; cat /tmp/td/triton_mma.json 2>/dev/null | head -30; tail -3 /tmp/sv.log

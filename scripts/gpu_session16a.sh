#!/bin/bash
# H200 call 1 of session 16: the whole `make test-gpu` (two halves side by side: the
# block-scaled GEMM files, and the rest), and beside them the crafted-operand read of the
# split-K combine order of cuBLAS fp32's one missed shape (scripts/gpu_xmma_order.py).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T=${1:-540}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bash scripts/gpu_test_halves.sh "$T" &   # make test-gpu, two halves
python3 scripts/gpu_xmma_order.py --shape 26x1402x11025 --repeat 5 --out "$OUT/xmma_order.npz" \
    > "$OUT/xmma-order.log" 2>&1
cat "$OUT/xmma-order.log"
wait
for f in a b; do grep -E "passed|failed|rc=" "$OUT/test-gpu-$f.log" | tail -3; done
grep -E "FAILED|Error" "$OUT"/test-gpu-*.log | head -20

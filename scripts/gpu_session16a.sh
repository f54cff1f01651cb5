#!/bin/bash
# H200 call 1 of session 16: the whole `make test-gpu` (two halves side by side: the
# block-scaled GEMM files, and the rest), and beside them the crafted-operand read of the
# split-K combine order of cuBLAS fp32's one missed shape (scripts/gpu_xmma_order.py).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T=${1:-540}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TRI="tests/test_gemm_triton.py tests/test_gemm_triton_specials.py tests/test_gemm_triton_wide.py"
( OMP_NUM_THREADS=2 timeout $((T + 10)) python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 tests \
    $(for f in $TRI; do echo --ignore=$f; done) > "$OUT/test-gpu-a.log" 2>&1; echo "rc=$?" >> "$OUT/test-gpu-a.log" ) &
( OMP_NUM_THREADS=2 timeout $((T + 10)) python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 $TRI \
    > "$OUT/test-gpu-b.log" 2>&1; echo "rc=$?" >> "$OUT/test-gpu-b.log" ) &
python3 scripts/gpu_xmma_order.py --shape 26x1402x11025 --repeat 5 --out "$OUT/xmma_order.npz" \
    > "$OUT/xmma-order.log" 2>&1
cat "$OUT/xmma-order.log"
wait
for f in a b; do grep -E "passed|failed|rc=" "$OUT/test-gpu-$f.log" | tail -3; done
grep -E "FAILED|Error" "$OUT"/test-gpu-*.log | head -20

#!/bin/bash
# H200 call 5 of session 18 (issue 17): the chain GPU tests and the other GPU tests that run
# the chain (fp4ref.scaled_mm) under the final kernel (16 warps on GENERAL
# blocks), then the bench's chain section (the old 8-warp GENERAL side by side).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 190 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_chain_triton.py \
    tests/test_scaled_mm.py > "$OUT/test-gpu-chain.log" 2>&1
echo "rc=$?" >> "$OUT/test-gpu-chain.log"
tail -3 "$OUT/test-gpu-chain.log"; grep -E "^E  |FAILED" "$OUT/test-gpu-chain.log" | cut -c1-600 | head -12
timeout 110 python3 -m fp4ref.harness.bench_chain --sizes 8192 --out "$OUT/bench-chain.json" \
    > "$OUT/bench-chain.log" 2>&1
echo "rc=$?" >> "$OUT/bench-chain.log"
tail -13 "$OUT/bench-chain.log" | cut -c1-200

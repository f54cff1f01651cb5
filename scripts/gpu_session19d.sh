#!/bin/bash
# H200 call 4 of session 19 (issue 17), all in one (device time was short): chain_triton
# variants side by side (scratch/bench_variants.py, uncommitted scratch copies; session19-
# variants.md), the GPU tests that run the chain under the working tree's kernel, then the
# bench's chain section (10 timed calls per row).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 230 python3 scratch/bench_variants.py "${1:-head,v1b,v7}" 2>&1 | grep -v Warn > "$OUT/variants.log"
grep -E "^time|diff [1-9]" "$OUT/variants.log"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_chain_triton.py \
    tests/test_scaled_mm.py > "$OUT/test-gpu-chain.log" 2>&1
echo "rc=$?" >> "$OUT/test-gpu-chain.log"
tail -3 "$OUT/test-gpu-chain.log"; grep -E "^E  |FAILED" "$OUT/test-gpu-chain.log" | cut -c1-400 | head -12
timeout 140 python3 -m fp4ref.harness.bench_chain --sizes 8192 --out "$OUT/bench-chain.json" \
    > "$OUT/bench-chain.log" 2>&1
echo "rc=$?" >> "$OUT/bench-chain.log"
tail -12 "$OUT/bench-chain.log" | cut -c1-160

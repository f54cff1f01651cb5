#!/bin/bash
# H200 call 5 of session 17 (issue 17): the bench's chain section with the new default (GENERAL
# in integers on quarter blocks, 4 warps, no reduction over C) next to the old kernel shape,
# same run; then the chain GPU tests under the default.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 260 python3 -m fp4ref.harness.bench_chain --sizes 8192,4096 --out "$OUT/bench-chain.json" \
    > "$OUT/bench-chain.log" 2>&1
echo "rc=$?" >> "$OUT/bench-chain.log"
tail -22 "$OUT/bench-chain.log" | cut -c1-200
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_chain_triton.py > "$OUT/test-gpu-chain.log" 2>&1
echo "rc=$?" >> "$OUT/test-gpu-chain.log"
tail -3 "$OUT/test-gpu-chain.log"; grep -E "^E  |FAILED" "$OUT/test-gpu-chain.log" | cut -c1-600 | head -12

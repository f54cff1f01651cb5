#!/bin/bash
# H200 call 4 of session 18 (issue 17): chain_triton variants side by side (uncommitted
# scratch modules, scratch/bench_variants.py, not kept: reports/baselines/chain-general/
# session18-variants.md; bit-compared with the committed session 17
# kernel), the bench's chain section with the working tree's kernel (the default config and,
# side by side on the worst sets, 16 warps on the GENERAL blocks), then the chain GPU tests.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ -n "${1:-}" ]; then
  SETS=${SETS:-mxfp4_wide_scales_nan,negzero,negzero32,nvfp4_wide_scales_nan} timeout 200 \
    python3 scratch/bench_variants.py "$1" 2>&1 | grep -v Warn > "$OUT/variants.log"
  cut -c1-170 "$OUT/variants.log"
fi
FP4REF_BENCH_CHAIN_CONFIGS="${CFGS:-128,128,8,3,8,16,1}" timeout 200 python3 -m fp4ref.harness.bench_chain \
    --sizes 8192 --out "$OUT/bench-chain.json" > "$OUT/bench-chain.log" 2>&1
echo "rc=$?" >> "$OUT/bench-chain.log"
tail -14 "$OUT/bench-chain.log" | cut -c1-200
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_chain_triton.py > "$OUT/test-gpu-chain.log" 2>&1
echo "rc=$?" >> "$OUT/test-gpu-chain.log"
tail -3 "$OUT/test-gpu-chain.log"; grep -E "^E  |FAILED" "$OUT/test-gpu-chain.log" | cut -c1-600 | head -12

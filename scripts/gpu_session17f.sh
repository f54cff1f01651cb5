#!/bin/bash
# H200 call 6 of session 17 (issue 17): GENERAL with every step's tiles, words and statistics
# loaded a step ahead; group dots as masked K = 64 dots or one K = 16 dot per group slice.
# The grid (kernel shapes x modes, worst sets, Gaussian and cuBLAS same run) picks the
# (config, mode) of least worst slowdown; the bench's chain section and the chain GPU tests
# then run under it.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 170 python3 scripts/gpu_chain_grid.py --size 8192 --modes masked,slices \
    --configs "128,128,8,3,8,4,2;128,128,8,3,8,8,2;128,128,8,3,8,8,1" \
    --out "$OUT/chain-grid3.json" > "$OUT/chain-grid3.log" 2>&1
echo "rc=$?" >> "$OUT/chain-grid3.log"
python3 scripts/gpu_chain_grid.py --table "$OUT/chain-grid3.json"
read CFG MODE < <(python3 scripts/gpu_chain_grid.py --pick "$OUT/chain-grid3.json" 2>>"$OUT/chain-grid3.log")
echo "picked: $CFG $MODE"
export FP4REF_CHAIN_CONFIG=$CFG FP4REF_CHAIN_GENERAL=$MODE
FP4REF_BENCH_CHAIN_CONFIGS="" timeout 70 python3 -m fp4ref.harness.bench_chain --sizes 8192 \
    --out "$OUT/bench-chain.json" > "$OUT/bench-chain.log" 2>&1
echo "rc=$?" >> "$OUT/bench-chain.log"
tail -9 "$OUT/bench-chain.log" | cut -c1-160
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_chain_triton.py > "$OUT/test-gpu-chain.log" 2>&1
echo "rc=$?" >> "$OUT/test-gpu-chain.log"
tail -2 "$OUT/test-gpu-chain.log"; grep -E "^E  |FAILED" "$OUT/test-gpu-chain.log" | cut -c1-500 | head -8

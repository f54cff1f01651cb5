#!/bin/bash
# H200 calls 2 and 4 of session 19 (issue 17): chain_triton variants side by side (scratch/
# bench_variants.py and scratch/ct_*.py, uncommitted scratch copies of fp4ref/chain_triton.py;
# reports/baselines/chain-general/session19-variants.md), then the chain GPU tests under the
# working tree's kernel.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 300 python3 scratch/bench_variants.py "${1:-head,v6}" 2>&1 | grep -v Warn | tee "$OUT/variants.log"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_chain_triton.py > "$OUT/test-chain.log" 2>&1
echo "rc=$?" >> "$OUT/test-chain.log"; tail -3 "$OUT/test-chain.log"; grep -E "^E  |FAILED" "$OUT/test-chain.log" | cut -c1-400 | head -12

#!/bin/bash
# H200 call 1 of session 20 (issue 17): a branch-free GENERAL-only kernel for the blocks
# whose every instruction fails FAST's conditions (plan flag 2), its loads pipelined by Triton
# (TMA or cp.async, 2-3 stages), side by side with the final kernel of session 19 (head).
# scratch/bench_variants.py (a scratch script, not committed) compiles and runs the check
# sets in one process per variant, then compares every variant's output bits with head's and
# times 8192^3 in one process.  The chain GPU tests run meanwhile under the working tree's
# kernel (the GENERAL-only kernel, TMA, 2 stages).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
V=${1:-head,gT2,gT3,gC2,gC3}
( timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_chain_triton.py \
    tests/test_scaled_mm.py > "$OUT/test-gpu-chain.log" 2>&1; echo "rc=$?" >> "$OUT/test-gpu-chain.log" ) &
for v in ${V//,/ }; do ( timeout 240 python3 scratch/bench_variants.py warm $v 2>&1 | grep -v Warn > "$OUT/warm-$v.log" ) & done
wait
tail -2 "$OUT/test-gpu-chain.log"; grep -E "^E  |FAILED" "$OUT/test-gpu-chain.log" | cut -c1-400 | head -8
for v in ${V//,/ }; do tail -1 "$OUT/warm-$v.log"; done
timeout 200 python3 scratch/bench_variants.py time "$V" "$OUT/variants.json" 2>&1 | grep -v Warn | tee "$OUT/variants.log" | grep -E "^time|diff [1-9]|Error|error"

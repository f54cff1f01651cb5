#!/bin/bash
# H200 call 2 of session 20 (issue 17): the GENERAL-only kernel (cp.async loads pipelined by
# Triton) at 2-6 stages and on 64 x 64 (16 warps), 64 x 32 (8 warps, two blocks per SM) and
# 64 x 16 (4 warps, four per SM) blocks, side by side with session 19's kernel (head):
# scratch/bench_variants.py, as in call 1 (scripts/gpu_session20a.sh).  The chain GPU tests run
# meanwhile under the working tree's kernel (cp.async, 3 stages, 64 x 64).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
V=${1:-head,gC3,gC4,gC6,gC3n2,gC4n2,gC3n4,gC4n4,gC6n4}
( timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_chain_triton.py \
    tests/test_scaled_mm.py > "$OUT/test-gpu-chain.log" 2>&1; echo "rc=$?" >> "$OUT/test-gpu-chain.log" ) &
for v in ${V//,/ }; do ( timeout 240 python3 scratch/bench_variants.py warm $v 2>&1 | grep -v Warn > "/tmp/warm-$v.log" ) & done
wait
for v in ${V//,/ }; do echo "== $v"; cat "/tmp/warm-$v.log"; done > "$OUT/warm.log"
tail -2 "$OUT/test-gpu-chain.log"; grep -E "^E  |FAILED" "$OUT/test-gpu-chain.log" | cut -c1-400 | head -8
grep -c done "$OUT/warm.log"
timeout 200 python3 scratch/bench_variants.py time "$V" "$OUT/variants.json" 2>&1 | grep -v Warn | tee "$OUT/variants.log" | grep -E "^time|diff [1-9]|Error|error"

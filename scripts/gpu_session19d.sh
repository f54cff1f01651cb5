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
bash scripts/gpu_chain_checks.sh 200 140

#!/bin/bash
# H200 call 5 of session 19 (issue 17): session 18's kernel (head), the restructured v7 and
# head with v7's arithmetic alone (v9, the working tree) side by side at the default kernel
# shape (scratch/bench_variants.py), then the GPU tests that run the chain under v9.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 110 python3 scratch/bench_variants.py "${1:-head,v7,v9}" "" 2>&1 | grep -v Warn > "$OUT/variants.log"
grep -E "^time|diff [1-9]" "$OUT/variants.log"
bash scripts/gpu_chain_checks.sh 140

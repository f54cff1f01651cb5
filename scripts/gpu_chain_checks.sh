#!/bin/bash
# The GPU tests that run the emulated Blackwell chain (tests/test_chain_triton.py and
# tests/test_scaled_mm.py, -m gpu) within $1 seconds into $OUT/test-gpu-chain.log, then, if
# $2 is given, bench_chain at 8192^3 within $2 seconds into $OUT/bench-chain.{json,log}.
# Session scripts call it after their own experiments:  bash scripts/gpu_chain_checks.sh 200 140
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout "${1:?test seconds}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_chain_triton.py \
    tests/test_scaled_mm.py > "$OUT/test-gpu-chain.log" 2>&1
echo "rc=$?" >> "$OUT/test-gpu-chain.log"
tail -3 "$OUT/test-gpu-chain.log"; grep -E "^E  |FAILED" "$OUT/test-gpu-chain.log" | cut -c1-600 | head -12
[ -z "${2:-}" ] && exit 0
timeout "$2" python3 -m fp4ref.harness.bench_chain --sizes 8192 --out "$OUT/bench-chain.json" \
    > "$OUT/bench-chain.log" 2>&1
echo "rc=$?" >> "$OUT/bench-chain.log"
tail -13 "$OUT/bench-chain.log" | cut -c1-200

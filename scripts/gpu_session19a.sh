#!/bin/bash
# H200 call 1 of session 19: the whole `make test-gpu` (two halves side by side,
# scripts/gpu_test_halves.sh) on session 18's final chain kernel (16 warps on GENERAL blocks),
# which only the chain tests had run; then bench_chain at 8192^3 with 10 timed calls per row.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
bash scripts/gpu_test_halves.sh "${1:-420}"
for f in a b; do grep -E "passed|failed|rc=" "$OUT/test-gpu-$f.log" | tail -2; done
grep -E "FAILED|Error" "$OUT"/test-gpu-*.log | head -20
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader
timeout 140 python3 -m fp4ref.harness.bench_chain --sizes 8192 --out "$OUT/bench-chain.json" \
    > "$OUT/bench-chain.log" 2>&1
echo "rc=$?" >> "$OUT/bench-chain.log"
tail -13 "$OUT/bench-chain.log" | cut -c1-200

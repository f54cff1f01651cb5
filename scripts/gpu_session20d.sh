#!/bin/bash
# H200 calls 4 and 5 of session 20 (issue 17): the whole `make test-gpu` (two halves side by
# side, scripts/gpu_test_halves.sh, within $1 seconds; 0: skipped) on the final chain kernels
# (the GENERAL-only kernel on 64 x 32 blocks, cp.async, 3 stages), then, within $2 seconds
# (0: skipped), bench_chain at 8192^3 (its ALT_CONFIGS row: 64 x 16 blocks).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
if [ "${1:-400}" != 0 ]; then
    bash scripts/gpu_test_halves.sh "${1:-400}"
    for f in a b; do grep -E "passed|failed|rc=" "$OUT/test-gpu-$f.log" | tail -2; done
    grep -E "FAILED|Error" "$OUT"/test-gpu-*.log | head -20
fi
[ "${2:-150}" = 0 ] && exit 0
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader
timeout "${2:-150}" python3 -m fp4ref.harness.bench_chain --sizes 8192 --out "$OUT/bench-chain.json" \
    > "$OUT/bench-chain.log" 2>&1
echo "rc=$?" >> "$OUT/bench-chain.log"
tail -14 "$OUT/bench-chain.log" | cut -c1-200

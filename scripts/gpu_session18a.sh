#!/bin/bash
# H200 call 1 of session 18: the whole `make test-gpu` (two halves, scripts/gpu_test_halves.sh),
# the first run of tests/test_scaled_mm.py and test_gemm_emulator.py since session 17's chain change.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T=${1:-540}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bash scripts/gpu_test_halves.sh "$T"
for f in a b; do grep -E "passed|failed|rc=" "$OUT/test-gpu-$f.log" | tail -3; done
grep -E "FAILED|Error" "$OUT"/test-gpu-*.log | head -20

#!/bin/bash
# Issue 17: the chain's GENERAL path, old ("loads") vs new ("tma") group dots, on the GPU:
# the chain GPU tests under the new mode, then the bench section under each mode (same run).
# Usage: scripts/gpu_chain_general.sh OUTDIR
set -u
OUT=${1:?outdir}
PY=${PY:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
FP4REF_CHAIN_GENERAL=tma $PY -m pytest -q -m gpu tests/test_chain_triton.py 2>&1 | tail -5 | tee $OUT/chain-gpu-tests-tma.log
for mode in loads tma; do
  FP4REF_CHAIN_GENERAL=$mode FP4REF_BENCH_CHAIN_CONFIGS="128,64,4,3,8,4" timeout 200 \
    $PY -m fp4ref.harness.bench_chain --sizes 8192 --out $OUT/bench-chain-$mode.json 2>&1 | tail -14
done

#!/bin/bash
# H200 call 5 of session 18 (issue 17): the chain GPU tests and the other GPU tests that run
# the chain (fp4ref.scaled_mm) under the final kernel (16 warps on GENERAL
# blocks), then the bench's chain section (the old 8-warp GENERAL side by side).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
bash scripts/gpu_chain_checks.sh 190 110

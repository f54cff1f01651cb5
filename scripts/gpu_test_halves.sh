#!/bin/bash
# The whole `make test-gpu` on the H200 as two halves side by side, within $1 seconds: the
# block-scaled GEMM files (test_gemm_triton*.py), and the rest.  Logs: $OUT/test-gpu-a.log
# (the rest), $OUT/test-gpu-b.log (the three files), each ending in "rc=N".  Session scripts
# run it in the background beside other GPU work:  bash scripts/gpu_test_halves.sh 540 &
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T=${1:-540}
TRI="tests/test_gemm_triton.py tests/test_gemm_triton_specials.py tests/test_gemm_triton_wide.py"
( OMP_NUM_THREADS=2 timeout $((T + 10)) python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 tests \
    $(for f in $TRI; do echo --ignore=$f; done) > "$OUT/test-gpu-a.log" 2>&1; echo "rc=$?" >> "$OUT/test-gpu-a.log" ) &
( OMP_NUM_THREADS=2 timeout $((T + 10)) python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 $TRI \
    > "$OUT/test-gpu-b.log" 2>&1; echo "rc=$?" >> "$OUT/test-gpu-b.log" ) &
wait

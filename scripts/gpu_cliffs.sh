#!/usr/bin/env bash
# Issue 18 on the H200 (helper "cliffs"): the GPU tests of fp4ref.gemm_triton (every route,
# the WIDE kernel included, against the exact reference) and the operand-distribution bench
# table, each time-boxed; logs, JUnit XML and JSON flat into ${OUT:-gpu-out}.
#   bash scripts/gpu_cliffs.sh                      # all steps
#   STEPS="dist" bash scripts/gpu_cliffs.sh         # only the distribution table
# Steps: env, bitdump (behaviour guard: the blockscaled section, CUDA only, against the H200
# baseline: every route forced on fixed data, 0 changed expected), tests (pytest -m gpu
# tests/test_gemm_triton*.py), dist (the table alone: bench_gemm.dist_rows -> dist.json),
# bench (the whole gemm section -> bench_gemm.json).
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
STEPS=${STEPS:-"env bitdump tests dist bench"}
step() { local name=$1 limit=$2; shift 2; echo "=== $name (limit ${limit}s) $(date +%T)";
  local t0=$SECONDS; timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; local rc=$?;
  echo "=== $name rc=$rc wall=$((SECONDS-t0))s"; tail -n 40 "$OUT/$name.log"; }
for s in $STEPS; do case $s in
  env) step env 60 bash -c "nvidia-smi --query-gpu=name,driver_version --format=csv; $PY -c 'import torch,triton;print(torch.__version__,torch.version.cuda,triton.__version__)'" ;;
  bitdump) step bitdump ${T_BITDUMP:-240} $PY scripts/bit_dump.py --only blockscaled \
           --compare reports/baselines/redesign/h200-bitdump-after.json --out "$OUT/bitdump.json" ;;
  tests) step tests ${T_TESTS:-420} $PY -m pytest -q -m gpu -p no:cacheprovider -rs \
           --junitxml="$OUT/tests.xml" tests/test_gemm_triton.py tests/test_gemm_triton_wide.py ;;
  dist) step dist ${T_DIST:-420} $PY -c "
import json, sys, torch
from fp4ref.harness.bench_gemm import dist_rows
from fp4ref.harness.io import write_json_atomic
rows = dist_rows('cuda', sizes=(8192, 4096), cap_s=float('${CAP_S:-20}'))
write_json_atomic('$OUT/dist.json', {'meta': {'device': torch.cuda.get_device_name(),
                  'torch': torch.__version__}, 'rows': rows})
for r in rows:
    sh = r.get('route') or {}
    print(f\"{r.get('fmt', '-'):6} {r.get('dist', ''):20} {r['size']:>16} {r['tflops']:10.4g} TFLOP/s\"
          + (f\"  {100 * r['fraction_of_cublas_bf16']:6.1f}% cuBLAS\" if 'fraction_of_cublas_bf16' in r else '')
          + (f\"  {r['slowdown_vs_gaussian']:7.2f}x\" if 'slowdown_vs_gaussian' in r else '')
          + ('  ' + ' '.join(f'{k}={v:.2f}' for k, v in sh.items()) if sh else '')
          + ('  CAPPED' if r.get('capped') else '')
          + (f\"  peak {r['peak_mem_bytes'] / 2**30:.2f} GiB\" if r.get('peak_mem_bytes') else ''))
" ;;
  bench) step bench ${T_BENCH:-480} $PY -m fp4ref.harness.bench_gemm --out "$OUT/bench_gemm.json" ;;
  *) echo "unknown step $s" ;;
esac; done

#!/bin/bash
# H200 call 4 of session 16 (issue 18): the operand-distribution table with the real
# activations row (the training script's bf16 run, last fc2 input and weight), and the
# profile of the Gaussian NVFP4 GEMM at 8192^3 / 4096^3.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
t0=$SECONDS
timeout 120 python3 scripts/train_lm.py --out /tmp/lm --runs bf16 --dump-activations /tmp/act.pt > "$OUT/train.log" 2>&1
echo "=== train rc=$? $((SECONDS - t0))s"; tail -3 "$OUT/train.log"
FP4REF_ACTIVATIONS=/tmp/act.pt OUT=$OUT T_DIST=${T_DIST:-220} CAP_S=10 STEPS=dist bash scripts/gpu_cliffs.sh > /dev/null 2>&1
echo "=== dist $((SECONDS - t0))s"
python3 - "$OUT/dist.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["size"], r["method"], r.get("fmt"), r["dist"], f'{r["tflops"]:.1f}',
          f'{100 * r.get("fraction_of_cublas_bf16", 0):.1f}%', f'{r.get("slowdown_vs_gaussian", 0):.2f}x', r.get("route"))
PY
timeout 100 python3 scripts/gpu_profile_gemm.py nvfp4 > "$OUT/profile.log" 2>&1
echo "=== profile rc=$? $((SECONDS - t0))s"; grep -v "^   " "$OUT/profile.log" | head -30

#!/bin/bash
# H200 call 2 of session 17 (issue 17): the chain's GENERAL path in integers (cvt.rzi /
# cvt.rz), timed over a grid of GENERAL-kernel shapes and dot modes next to the Gaussian
# operands and cuBLAS bf16 (scripts/gpu_chain_grid.py), then the chain GPU tests (every
# path case compiled under each kernel shape).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 330 python3 scripts/gpu_chain_grid.py --size 8192 --modes tma,loads \
    --configs "128,128,8,3,8,8,1;128,128,8,3,8,4,2;128,128,8,3,8,8,2" \
    --out "$OUT/chain-grid.json" > "$OUT/chain-grid.log" 2>&1
echo "rc=$?" >> "$OUT/chain-grid.log"
python3 - "$OUT/chain-grid.log" <<'PY'
import json, sys
for ln in open(sys.argv[1]):
    if ln.startswith("{"):
        r = json.loads(ln)
        print(f"{r['set']:24s} {r.get('config', ''):20s} {r.get('mode', ''):6s} {r['seconds'] * 1e3:8.2f} ms "
              f"{r.get('fraction_of_cublas_bf16', 1):.3f} {r.get('paths', '')}")
    else:
        print(ln.rstrip()[-300:])
PY
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_chain_triton.py > "$OUT/test-gpu-chain.log" 2>&1
echo "rc=$?" >> "$OUT/test-gpu-chain.log"
tail -3 "$OUT/test-gpu-chain.log"; grep -E "^E  |FAILED" "$OUT/test-gpu-chain.log" | cut -c1-600 | head -12

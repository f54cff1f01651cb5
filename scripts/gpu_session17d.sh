#!/bin/bash
# H200 call 4 of session 17 (issue 17): GENERAL's group dots from prepass copies (copy g of
# B holds group g alone: no masking in registers), |C| bounded without a reduction; timed
# against the masked TMA dots over two kernel shapes, then the chain GPU tests in the new mode.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 300 python3 scripts/gpu_chain_grid.py --size 8192 --modes copies,tma \
    --configs "128,128,8,3,8,8,1;128,128,8,3,8,4,2" \
    --out "$OUT/chain-grid2.json" > "$OUT/chain-grid2.log" 2>&1
echo "rc=$?" >> "$OUT/chain-grid2.log"
python3 -c "
import json, sys
for ln in open(sys.argv[1]):
    if ln.startswith('{'):
        r = json.loads(ln)
        print(r['set'][:22].ljust(22), r.get('config', '').ljust(18), r.get('mode', '').ljust(7), '%.2f ms' % (r['seconds'] * 1e3))
    else:
        print(ln.rstrip()[-300:])
" "$OUT/chain-grid2.log"
FP4REF_CHAIN_GENERAL=copies timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_chain_triton.py > "$OUT/test-gpu-chain-copies.log" 2>&1
echo "rc=$?" >> "$OUT/test-gpu-chain-copies.log"
tail -3 "$OUT/test-gpu-chain-copies.log"; grep -E "^E  |FAILED" "$OUT/test-gpu-chain-copies.log" | cut -c1-600 | head -12

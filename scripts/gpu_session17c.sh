#!/bin/bash
# H200 call 3 of session 17 (issue 17): ablations of the chain's GENERAL step (FP4REF_CHAIN_EXP
# bits: 1 no group dots, 2 no per-step reductions, 4 no exponent-word loads, 8 GENERAL returns
# C), wrong results by design, to find where its time goes.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 300 python3 scripts/gpu_chain_grid.py --size 8192 --modes tma --exps 0,1,2,4,8 \
    --sets nvfp4_gaussian,nvfp4_wide_scales_nan --configs "128,128,8,3,8,8,1;128,128,8,3,8,4,2" \
    --out "$OUT/chain-ablate.json" > "$OUT/chain-ablate.log" 2>&1
echo "rc=$?" >> "$OUT/chain-ablate.log"
timeout 200 python3 scripts/gpu_chain_grid.py --size 8192 --modes tma --exps 0,8,11 \
    --sets mxfp4_gaussian,mxfp4_wide_scales_nan --configs "128,128,8,3,8,8,1" \
    --out "$OUT/chain-ablate-mx.json" > "$OUT/chain-ablate-mx.log" 2>&1
echo "rc=$?" >> "$OUT/chain-ablate-mx.log"
cat "$OUT"/chain-ablate*.log | python3 -c "
import json, sys
for ln in sys.stdin:
    if ln.startswith('{'):
        r = json.loads(ln)
        print(r['set'][:22].ljust(22), r.get('config', '').ljust(18), r.get('exp', ''), '%.2f ms' % (r['seconds'] * 1e3))
    else:
        print(ln.rstrip()[-300:])
"

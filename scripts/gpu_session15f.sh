#!/bin/bash
# H200 call 6 of session 15: `make probe` with the session's new kernel rows (WMMA, gemv,
# segment-K tiles), beside it the logged misses of cuBLAS fp16 / fp32 checked again with them,
# and whether fp32 sm80_xmma at 26x1402x11025 (48 interleaved slices after a Memset) gives the
# same bits on repeated identical calls.
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
t0=$SECONDS
( timeout 300 make probe PROBE_ARGS="--out /tmp/pa" > "$OUT/probe.log" 2>&1; echo "=== make probe rc=$? wall $((SECONDS - t0))s" >> "$OUT/probe.log"
  cp /tmp/pa/*/*/report.json "$OUT/probe-report.json"; cp /tmp/pa/*/*/report.html "$OUT/probe-report.html" ) &
python3 - > "$OUT/repeat.log" 2>&1 <<'PY'
import torch
torch.backends.cuda.matmul.allow_tf32 = False
g = torch.Generator(device="cuda").manual_seed(7)
for (M, N, K) in [(26, 1402, 11025), (3654, 1, 15364), (2223, 2468, 9324)]:
    a = torch.randn(M, K, device="cuda", generator=g); b = torch.randn(K, N, device="cuda", generator=g)
    ref = (a @ b).view(torch.int32)
    diff = [int((((a @ b).view(torch.int32)) != ref).sum()) for _ in range(20)]
    print((M, N, K), "outputs differing from the first call, 20 repeats:", diff, flush=True)
PY
OUT=$OUT SHAPES=115 GROUPS_="cuda-cublas-fp32 cuda-cublas-float16" BASELINE=reports/baselines/shapes/h200-probe-session14.json \
  VALIDATE_SHAPES_ARGS="--explain-budget-s 30 --retry-misses" bash scripts/gpu_validate_shapes.sh 120 > /dev/null 2>&1
wait
cat "$OUT/repeat.log"; grep -E "cuda-cublas-(fp32|float16) \[" "$OUT/run.log" | tail -8; tail -1 "$OUT/probe.log"
python3 - "$OUT/probe-report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for d in r["devices"]:
    if d["name"].startswith(("cuda-cublas", "triton-dot-e4m3-imprecise-0")):
        u = (d.get("extra") or {}).get("unfitted_kernels") or []
        print(d["name"], d["status"], [(x["shape"], x["family"][:60]) for x in u])
PY

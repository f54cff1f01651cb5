#!/bin/bash
# H200 call 3 of session 15: dumps to pin the last two rules (scripts/fit_segment_k.py,
# scripts/fit_gemv.py): the whole corner tile of tf32 1945x568x13960 (segment-K), tf32 shapes
# whose last wave holds 53..71 tiles or that fill two waves, and a sweep of fp32 gemv shapes
# (chunk width per K and output count).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
D="python3 scripts/gpu_dump_shapes.py --devices cuda-cublas-tf32"
( $D --shape 1945x568x13960 --block 1792:1945,512:568 --out $OUT/tf32a.npz > $OUT/dump.log 2>&1
  $D --shape 1500x630x11000 --shape 1530x700x12000 --shape 2000x500x10500 --shape 2500x440x11500 --step 64 \
     --out $OUT/tf32b.npz >> $OUT/dump.log 2>&1
  $D --shape 2500x1900x9000 --shape 2800x1530x9500 --shape 2000x1580x10000 --step 64 \
     --out $OUT/tf32c.npz >> $OUT/dump.log 2>&1 ) &
python3 - > $OUT/gemv.log 2>&1 <<'PY' &
import sys; sys.path.insert(0, "scripts")
import fit_gemv as f
Ks = [32, 64, 100, 256, 333, 512, 1000, 1024, 1500, 2048, 2049, 2500, 3000, 3500, 4000, 4096, 5000, 6000, 8192, 9000]
f.dump(sys.argv[0] and "OUTDIR/gemv1.npz".replace("OUTDIR", __import__("os").environ["OUT"]), n_sample=3, Ks=Ks[:14])
f.dump(__import__("os").environ["OUT"] + "/gemv2.npz", n_sample=3, Ks=Ks[14:])
print("gemv sweep done")
PY
wait
ls -la $OUT; grep -v Warn $OUT/dump.log | grep -v "_warn_once" | cut -c1-250; tail -3 $OUT/gemv.log

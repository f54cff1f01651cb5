#!/bin/bash
# H200 call 5 of session 15: dumps of the kernels the last validation and `make probe` left
# unexplained: cuBLAS f16 WMMA s161616 kernels (cutlass_75 with splitKreduce at 78x877x813 and
# 13x1620x4139, cutlass_80 at 64x64x100), fp32 sm80_xmma FFMA at 26x1402x11025, the fp32
# dot_kernel + reduce_1Block at 1x64x2048 (tf32 and fp32).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
D="python3 scripts/gpu_dump_shapes.py"
$D --devices cuda-cublas-float16 --shape 78x877x813 --shape 13x1620x4139 --shape 64x64x100 --rows 16 --cols 16 \
   --out $OUT/wmma.npz > $OUT/dump.log 2>&1 &
$D --devices cuda-cublas-fp32 --shape 26x1402x11025 --rows 8 --cols 16 --out $OUT/xmma.npz >> $OUT/dump2.log 2>&1 &
$D --devices cuda-cublas-fp32,cuda-cublas-tf32 --shape 1x64x2048 --shape 1x200x3000 --shape 1x64x500 --rows 1 --cols 32 \
   --out $OUT/dot.npz >> $OUT/dump3.log 2>&1 &
wait
ls -la $OUT; cat $OUT/dump*.log | grep -v -i warn | cut -c1-300

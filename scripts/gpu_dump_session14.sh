export PYTHONPATH=$PWD
L=reports/baselines/shapes/nvidia-h200.jsonl
python3 scripts/gpu_dump_shapes.py --from $L --devices cuda-cublas-fp32 --misses --max 10 --out $OUT/fp32.npz > $OUT/dump.log 2>&1 &
python3 scripts/gpu_dump_shapes.py --from $L --devices cuda-cublas-tf32 --misses --max 10 --out $OUT/tf32.npz >> $OUT/dump.log 2>&1 &
python3 scripts/gpu_dump_shapes.py --from $L --devices cuda-cublas-bfloat16,cuda-cublas-float16 --misses --max 8 --out $OUT/b16.npz >> $OUT/dump.log 2>&1 &
wait; ls -la $OUT; tail -5 $OUT/dump.log

#!/usr/bin/env bash
# Random-shape validation (issue 13) on the GPU machine, for every CUDA device (cuBLAS,
# _scaled_mm, Triton fp8), within $1 seconds.  Run from the repo root:
#     OUT=/some/dir scripts/gpu_validate_shapes.sh 540
# The committed log reports/baselines/shapes/nvidia-h200.jsonl seeds $OUT/shapes.jsonl, so
# the seeded draw sequence resumes and shapes accumulate across sessions: copy
# $OUT/shapes.jsonl back over the committed log afterwards.  Device groups run as parallel
# processes on the one GPU (one per device by default; GROUPS_ overrides), all appending
# whole lines to one log.  $OUT gets (flat): shapes.jsonl, summary.json, run.log.
set -u
T=${1:?usage: scripts/gpu_validate_shapes.sh SECONDS}
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export FP4REF_PYTHON=${FP4REF_PYTHON:-python3}
PY=$FP4REF_PYTHON
BASE=${BASELINE:-reports/baselines/redesign/h200-probe-after.json}
SEED_LOG=${SEED_LOG:-reports/baselines/shapes/nvidia-h200.jsonl}
LOG="$OUT/shapes.jsonl"
SHAPES=${SHAPES:-100}
[ -f "$SEED_LOG" ] && [ ! -f "$LOG" ] && cp "$SEED_LOG" "$LOG"
# the run stops itself (--time-limit-s) with a margin for start-up and the summary
LIMIT=$(( T > 60 ? T - 45 : T * 3 / 4 ))
# one process per device: a shape's explanation is mostly CPU work (16 cores on the H200 box)
ALL="cuda-cublas-fp32 cuda-cublas-tf32 cuda-cublas-bfloat16 cuda-cublas-float16"
for m in tensorwise rowwise; do for f in slow fast; do for o in float32 bfloat16; do
  ALL="$ALL cuda-scaled_mm-e4m3-$m-$f-$o"; done; done; done
ALL="$ALL triton-dot-e4m3-imprecise-unset triton-dot-e4m3-imprecise-0 triton-dot-e4m3-imprecise-32"
ALL="$ALL triton-dot-e4m3-imprecise-64 triton-dot-e4m3-imprecise-128"
GROUPS_=${GROUPS_:-$ALL}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
echo "=== validate-shapes: ${T}s (runs stop at ${LIMIT}s), groups: $GROUPS_ $(date +%T)" | tee "$OUT/run.log"
pids=()
for g in $GROUPS_; do
  timeout "$((T - 10))" $PY -m fp4ref validate-shapes --baseline "$BASE" --devices "$g" --shapes "$SHAPES" \
    --time-limit-s "$LIMIT" --log "$LOG" ${VALIDATE_SHAPES_ARGS:-} >>"$OUT/run.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; echo "=== pid $p rc=$?" >>"$OUT/run.log"; done
$PY -m fp4ref validate-shapes --baseline "$BASE" --summary-only --log "$LOG" \
  --summary-json "$OUT/summary.json" >>"$OUT/run.log" 2>&1
tail -n 60 "$OUT/run.log"

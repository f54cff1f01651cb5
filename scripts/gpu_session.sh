#!/usr/bin/env bash
# One batched GPU session (the H200 is lent in short leases): GPU tests, the
# probe suite, benchmarks, exhaustive verification and the training run, each
# time-boxed, logs and artifacts into ${OUT:-gpu-out}. Steps via STEPS="a b c".
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export FP4REF_PYTHON=python3
STEPS=${STEPS:-"env testgpu probe bench verify train"}
step() { local name=$1 limit=$2; shift 2; echo "=== $name (limit ${limit}s) $(date +%T)";
  local t0=$SECONDS; timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; local rc=$?;
  echo "=== $name rc=$rc wall=$((SECONDS-t0))s"; tail -n 25 "$OUT/$name.log"; }
for s in $STEPS; do case $s in
  env) step env 60 bash -c 'nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch,triton;print(torch.__version__,torch.version.cuda,triton.__version__)"' ;;
  testgpu) step testgpu ${T_TESTGPU:-240} python3 -m pytest -q -m gpu -x -p no:cacheprovider tests ;;
  probe) step probe ${T_PROBE:-300} python3 -m fp4ref probe --out "$OUT/probe" ${PROBE_ARGS:-} ;;
  bench) step bench ${T_BENCH:-200} python3 -m fp4ref bench --out "$OUT/bench.json" ;;
  verify) step verify ${T_VERIFY:-240} python3 -m fp4ref verify-exhaustive --out "$OUT/verify.json" ;;
  train) step train ${T_TRAIN:-240} python3 scripts/train_lm.py --out "$OUT/train" ${TRAIN_ARGS:-} ;;
  *) echo "unknown step $s" ;;
esac; done

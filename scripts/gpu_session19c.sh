#!/bin/bash
# H200 call 3 of session 19 (issue 17): Nsight Compute on the GENERAL kernel (_full_kernel,
# MXFP4 over the whole ue8m0 range, 2048 x 2048 x 8192) of two scratch variants: warp states
# and per-instruction stall samples (scratch/prof_one.py; reports/baselines/chain-general/).
set -u
OUT=${OUT:?OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
which ncu || ls /opt/nvidia/nsight-compute/*/ncu
for v in ${1:-head v6}; do
  timeout 200 ncu --clock-control none -k regex:_full_kernel -s 1 -c 1 --section WarpStateStats \
      --section SourceCounters --section SpeedOfLight --section LaunchStats --section Occupancy \
      -o "$OUT/prof_$v" -f python3 scratch/prof_one.py "$v" > "$OUT/ncu_$v.log" 2>&1
  tail -3 "$OUT/ncu_$v.log"
  ncu -i "$OUT/prof_$v.ncu-rep" --page details --csv > "$OUT/details_$v.csv" 2>&1
  ncu -i "$OUT/prof_$v.ncu-rep" --page source --csv --print-source sass > "$OUT/sass_$v.csv" 2>&1
  ls -la "$OUT"/*_$v.*
  grep -i "stall\|warp cycles\|issued\|duration" "$OUT/details_$v.csv" | cut -c1-200 | head -30
done

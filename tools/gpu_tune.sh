#!/usr/bin/env bash
# On the GPU host, after tools/gpu_build.sh: the dispatcher's tuning knobs (VKNORM_TUNE_*, read in
# src/dispatch.cpp) over a reduced sweep, vknorm and the copy roof only, one table per setting.
# Usage: bash tools/gpu_tune.sh OUTDIR
set -uo pipefail
out=${1:-/tmp}
shapes="--rows 131072 --cols 256 --rows 43690 --cols 768 --rows 32768 --cols 1024 --rows 8192 --cols 4096
  --rows 4096 --cols 8192 --rows 2048 --cols 16384 --rows 1 --cols 768 --rows 77 --cols 512 --rows 197 --cols 768
  --rows 1 --cols 4096"
settings=(
  ""
  "VKNORM_TUNE_LATENCY_THREADS=0"
  "VKNORM_TUNE_ITEMS_TARGET_FP16=16 VKNORM_TUNE_MAX_ITEMS=32"
  "VKNORM_TUNE_ITEMS_TARGET=16 VKNORM_TUNE_MAX_ITEMS=32"
  "VKNORM_TUNE_ITEMS_TARGET=4"
)
for i in "${!settings[@]}"; do
  for packing in "" "--no-packing"; do
    echo "== ${settings[$i]:-defaults} $packing"
    env ${settings[$i]} python3 -m vknorm bench $shapes --compare copy --batches 2 $packing \
      --json "$out/tune_${i}${packing:+_pack1}.json" 2>/dev/null | tail -n +4
  done
done

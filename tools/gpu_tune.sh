#!/usr/bin/env bash
# On the GPU host, after tools/gpu_build.sh: the fused kernel's tuning knobs over a reduced sweep
# (vknorm and the copy roof only), one table per setting. Usage: bash tools/gpu_tune.sh OUTDIR
set -uo pipefail
out=${1:-/tmp}
shapes="--rows 131072 --cols 256 --rows 43690 --cols 768 --rows 32768 --cols 1024 --rows 8192 --cols 4096 --rows 4096 --cols 8192 --rows 2048 --cols 16384 --rows 1024 --cols 32768 --rows 1 --cols 768 --rows 197 --cols 768 --rows 1 --cols 4096"
for cfg in "8 16 256" "16 32 256" "32 64 256" "8 16 128" "16 32 128" "4 16 256"; do
  set -- $cfg
  echo "== items_target=$1 max_items=$2 workgroup=$3"
  VKNORM_TUNE_ITEMS_TARGET=$1 VKNORM_TUNE_MAX_ITEMS=$2 VKNORM_TUNE_WORKGROUP=$3 \
    python3 -m vknorm bench $shapes --compare copy --batches 2 --json "$out/tune_$1_$2_$3.json" 2>/dev/null | tail -n +3
done

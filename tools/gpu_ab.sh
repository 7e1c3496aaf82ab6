#!/usr/bin/env bash
# On the GPU host, after tools/gpu_build.sh: one knob (VAR=a vs VAR=b) A/B over the 2^25-element sweep,
# LayerNorm and RMSNorm, fp32 and fp16, vknorm and the copy roof, runs interleaved per setting.
# Usage: bash tools/gpu_ab.sh OUTDIR "VKNORM_TUNE_X=0" "VKNORM_TUNE_X=1" [more settings]
set -uo pipefail
out=$1; shift
shapes="--rows 1048576 --cols 32 --rows 524288 --cols 64 --rows 131072 --cols 256 --rows 43690 --cols 768
  --rows 32768 --cols 1024 --rows 8192 --cols 4096 --rows 2048 --cols 16384 --rows 1024 --cols 32768
  --rows 197 --cols 768 --rows 1 --cols 4096"
for round in 1 2; do
  for i in $(seq 1 $#); do
    setting=${!i}
    echo "== round $round: ${setting:-defaults}"
    env $setting python3 -m vknorm bench --op both $shapes --compare copy --batches 2 \
      --json "$out/ab_${i}_r${round}.json" 2>/dev/null | tail -n +3
  done
done

#!/usr/bin/env bash
# On the GPU host, after tools/gpu_build.sh: A/B of settings over a 2^25-element sweep, LayerNorm and
# RMSNorm, fp32 and fp16, vknorm and the copy roof, settings interleaved round by round.
# A setting is env assignments (NAME=value: VKNORM_TUNE_*, read in src/dispatch.cpp) and/or `vknorm bench`
# flags, words split on spaces:
#   bash tools/gpu_ab.sh OUTDIR "VKNORM_TUNE_ONE_REDUCTION=0" "" "--no-affine" "--no-packing --dtype fp16"
# SHAPES, ROUNDS (2), BATCHES (2) and WARMUP_MS (150) override the defaults.
set -uo pipefail
out=$1; shift
shapes=${SHAPES:-"--rows 1048576 --cols 32 --rows 524288 --cols 64 --rows 131072 --cols 256 --rows 43690 --cols 768
  --rows 32768 --cols 1024 --rows 8192 --cols 4096 --rows 2048 --cols 16384 --rows 1024 --cols 32768
  --rows 197 --cols 768 --rows 1 --cols 4096"}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for i in $(seq 1 $#); do
    setting=${!i}
    envs=() flags=()
    for word in $setting; do
      if [[ $word =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then envs+=("$word"); else flags+=("$word"); fi
    done
    echo "== round $round: ${setting:-defaults}"
    env "${envs[@]}" python3 -m vknorm bench --op both $shapes --compare copy --batches "${BATCHES:-2}" \
      --warmup-ms "${WARMUP_MS:-150}" "${flags[@]}" --json "$out/ab_${i}_r${round}.json" 2>/dev/null | tail -n +4
  done
done

source .gpu/setup.sh > /dev/null
NO_NCNN=1 bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
S="--op groupnorm --dtype both --channels 1280 --size 20x20 --channels 1280 --size 28x28 --channels 1280 --size 40x40 --channels 1920 --size 32x32 --groups 8 --groups 16 --groups 32 --groups 32"
for r in 1 2 3; do
  for k in 15 0; do
    echo "== round $r VKNORM_TUNE_FULL_TEAM_SPILL_ITEMS_HELD=$k"
    VKNORM_TUNE_FULL_TEAM_SPILL_ITEMS_HELD=$k python3 -m vknorm bench $S --compare copy --batches 3 --json $OUT/spill_${k}_r$r.json 2>/dev/null | tail -n +4
  done
done

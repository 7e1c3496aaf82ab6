source .gpu/setup.sh > /dev/null
NO_NCNN=1 bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
S="--op groupnorm --dtype both --channels 512 --size 8x8 --channels 1920 --size 12x12 --channels 768 --size 12x12 --channels 384 --size 16x16 --channels 960 --size 16x16 --channels 1920 --size 20x20 --channels 192 --size 16x16 --channels 1280 --size 20x20 --channels 640 --size 16x16 --channels 1280 --size 16x16 --groups 1 --groups 8 --groups 4 --groups 4 --groups 8 --groups 16 --groups 2 --groups 16 --groups 8 --groups 8"
for r in 1 2; do
  for k in 20 0; do
    echo "== round $r VKNORM_TUNE_MANY_PLANES=$k"
    VKNORM_TUNE_MANY_PLANES=$k python3 -m vknorm bench $S --compare copy --batches 3 --json $OUT/planes_${k}_r$r.json 2>/dev/null | tail -n +4
  done
done

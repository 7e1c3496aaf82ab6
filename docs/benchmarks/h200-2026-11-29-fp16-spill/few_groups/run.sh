source .gpu/setup.sh > /dev/null
NO_NCNN=1 bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
S="--op groupnorm --dtype both --channels 1280 --size 16x16 --channels 640 --size 16x16 --channels 1280 --size 16x16 --channels 512 --size 32x32 --channels 320 --size 20x20 --channels 960 --size 16x16 --channels 1280 --size 24x24 --channels 512 --size 16x16 --groups 8 --groups 8 --groups 16 --groups 16 --groups 4 --groups 16 --groups 16 --groups 4"
for r in 1 2; do
  for p in auto cooperative; do
    echo "== round $r path $p"
    python3 -m vknorm bench $S --compare copy --batches 3 --path $p --json $OUT/few_${p}_r$r.json 2>/dev/null | tail -n +4
  done
done

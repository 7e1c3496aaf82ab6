source .gpu/setup.sh > /dev/null
NO_NCNN=1 bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
S="--channels 1280 --size 40x40 --channels 1920 --size 40x40 --channels 960 --size 40x40 --channels 1920 --size 32x32 --channels 960 --size 48x48 --channels 1280 --size 32x32 --channels 640 --size 40x40 --channels 640 --size 48x48 --channels 2560 --size 16x16 --channels 1920 --size 24x24"
for r in 1 2; do
  for p in auto cooperative; do
    echo "== round $r path $p"
    python3 -m vknorm bench --op groupnorm --dtype fp16 $S --compare copy --batches 3 --path $p --json $OUT/fp16_${p}_r$r.json 2>/dev/null | tail -n +4
  done
done

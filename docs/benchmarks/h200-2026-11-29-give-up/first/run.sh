source .gpu/setup.sh > /dev/null
export ROUNDS=3
bash tools/gpu_builds_ab.sh run /tmp/ab --op groupnorm --dtype both \
  --channels 1280 --size 40x40 --channels 320 --size 64x64 --channels 960 --size 64x64 \
  --channels 640 --size 16x16 --channels 64 --size 128x128 \
  --groups 32 --groups 32 --groups 32 --groups 2 --groups 64 --batches 3 > $OUT/ab.txt 2>&1
tail -20 $OUT/ab.txt
for s in /tmp/builds/site_*; do
  echo "== $s"
  for shape in "1280 40x40 32" "320 64x64 32"; do set -- $shape
    PYTHONPATH=$s:$PYTHONPATH VKNORM_PIPELINE_STATS=1 timeout 60 python3 -m vknorm bench --op groupnorm --dtype both --channels $1 --size $2 --groups $3 --compare '' --batches 1 --warmup-ms 1 2>&1 | grep -o "vknorm pipeline norm_coop.*Register Count=[0-9]*" | sed 's/Stage.*Register/Register/' | head -4
  done
done > $OUT/regs.txt 2>&1
cat $OUT/regs.txt
(cd /tmp/ab && tar czf $OUT/ab_json.tar.gz *.json)

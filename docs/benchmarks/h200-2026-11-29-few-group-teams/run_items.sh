source .gpu/setup.sh > /dev/null
NO_NCNN=1 bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
timeout 240 python3 tools/channel_ab.py --setting items20: --setting items32:VKNORM_TUNE_FEW_GROUP_ITEMS=32 \
  --setting items40:VKNORM_TUNE_FEW_GROUP_ITEMS=40 \
  gn:640x32x32/32 gn:960x32x32/32 gn:256x64x64/32 gn:1280x32x32/32 in:128x64x64 in:64x56x56 gn:1920x32x32/32 \
  --rounds 2 --dtype both --json $OUT/few_group_items.json > $OUT/few_group_items.txt 2>&1
echo rc $?; cat $OUT/few_group_items.txt | tail -30

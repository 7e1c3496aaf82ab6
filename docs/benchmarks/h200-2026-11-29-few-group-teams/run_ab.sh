source .gpu/setup.sh > /dev/null
NO_NCNN=1 bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
timeout 450 python3 tools/channel_ab.py --setting team256:VKNORM_TUNE_FEW_GROUP_MIN_TEAM=256 --setting team128: \
  gn:1280x16x16/32 gn:1280x8x8/32 in:256x32x32 gn:2560x8x8/32 gn:960x7x7/8 gn:64x16x16/2 gn:32x40x40/32 gn:640x8x8/32 \
  in:128x32x32 in:64x28x28 gn:256x32x32/32 gn:640x32x32/32 gn:320x16x16/32 \
  --rounds 3 --dtype both --json $OUT/few_group_min_team.json > $OUT/few_group_min_team.txt 2>&1
echo rc $?; cat $OUT/few_group_min_team.txt | tail -40

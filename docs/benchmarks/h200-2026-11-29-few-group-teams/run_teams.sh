source .gpu/setup.sh > /dev/null
NO_NCNN=1 bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
timeout 400 python3 tools/channel_ab.py --setting w256: --setting w128:VKNORM_TUNE_WORKGROUP=128 --setting w64:VKNORM_TUNE_WORKGROUP=64 \
  gn:1280x8x8/32 gn:2560x8x8/32 gn:1280x16x16/32 gn:960x7x7/8 gn:64x16x16/2 gn:32x40x40/32 gn:640x8x8/32 gn:320x16x16/32 \
  --rounds 3 --dtype both --json $OUT/teams.json > $OUT/teams.txt 2>&1
echo rc $?; cat $OUT/teams.txt | tail -60

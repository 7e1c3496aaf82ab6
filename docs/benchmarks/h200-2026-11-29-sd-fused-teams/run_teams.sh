source .gpu/setup.sh > /dev/null
NO_NCNN=1 bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
# Fused plans for few large groups: neither the few-large-groups rule nor the full-team rule sends them cooperative.
F=VKNORM_TUNE_COOPERATIVE_MIN_GROUP=1000000000,VKNORM_TUNE_FULL_TEAM_MAX_ITEMS=0
timeout 420 python3 tools/channel_ab.py --setting coop: --setting f1024:$F \
  --setting f512:$F,VKNORM_TUNE_FEW_GROUP_ANY_SIZE=1,VKNORM_TUNE_FEW_GROUP_ITEMS=40 \
  gn:320x64x64/32 gn:640x64x64/32 \
  --rounds 3 --dtype both --json $OUT/teams.json > $OUT/teams.txt 2>&1
echo rc $?; tail -40 $OUT/teams.txt

# here: bash tools/gpu_builds_ab.sh pack HEAD; the first change packed as FULL (atomic polls + hand-off barriers);
# the second as CONFIRM (plain polls, one atomic read ending each wait, the same hand-off barriers)
source .gpu/setup.sh > /dev/null
ROUNDS=3 timeout 380 bash tools/gpu_builds_ab.sh run $OUT/ab2 --op groupnorm --dtype both \
  --channels 320 --size 64x64 --channels 960 --size 64x64 --channels 640 --size 16x16 --groups 32 --groups 32 --groups 2 \
  > $OUT/ab2.txt 2>&1
echo rc $?; tail -9 $OUT/ab2.txt

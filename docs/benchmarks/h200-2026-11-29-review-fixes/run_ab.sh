# here: bash tools/gpu_builds_ab.sh pack 9fa4e0e 183a876 (before and after the inverse square root defined at 0)
source .gpu/setup.sh > /dev/null
ROUNDS=3 timeout 270 bash tools/gpu_builds_ab.sh run $OUT/ab --op groupnorm --dtype fp32 > $OUT/ab.txt 2>&1
echo rc $?; tail -20 $OUT/ab.txt

source .gpu/setup.sh > /dev/null
s=$(date +%s)
ROUNDS=3 timeout 300 bash tools/gpu_builds_ab.sh run $OUT/ln --op layernorm --dtype both --rows 43690 --cols 768 --rows 8192 --cols 4096 --rows 524288 --cols 64 --batches 3 2>&1 | tail -8
echo "ln at $(( $(date +%s) - s )) s"
ROUNDS=2 timeout 150 bash tools/gpu_builds_ab.sh run $OUT/in --op instancenorm --dtype both --batches 3 2>&1 | tail -12
echo "in at $(( $(date +%s) - s )) s"

# here: bash tools/gpu_builds_ab.sh pack HEAD WORKTREE (before: 03c7e82's kernel; after: the hand-off barriers)
source .gpu/setup.sh > /dev/null
ROUNDS=3 timeout 500 bash tools/gpu_builds_ab.sh run $OUT/ab --op groupnorm --dtype both > $OUT/ab.txt 2>&1
echo rc $?; tail -24 $OUT/ab.txt

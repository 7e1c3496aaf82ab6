# The H200 runs of one build: bash run.sh tests FILE... (those test files, validation on) or bash run.sh ops
# (`vknorm bench` at its default shapes: --op groupnorm, instancenorm and both (LayerNorm, RMSNorm), each warm-up
# --warmup-ms of GPU time by the clock); the build made only where this host has none.
source .gpu/setup.sh > /dev/null
start=$(date +%s)
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || { bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
echo "build $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "$1" in
  tests) shift
         timeout $(( 570 - ($(date +%s) - start) )) bash tools/gpu_test.sh -q -n 16 --dist loadfile -p no:cacheprovider \
           --junitxml=$OUT/tests_junit.xml "$@" > $OUT/tests.txt 2>&1
         echo "rc $?"; tail -15 $OUT/tests.txt ;;
  ops) for op in groupnorm instancenorm both; do
         timeout $(( 580 - ($(date +%s) - start) )) python3 -m vknorm bench --op $op --json $OUT/$op.json \
           > $OUT/$op.txt 2>&1; echo "$op rc $? at $(( $(date +%s) - start )) s"; tail -12 $OUT/$op.txt
       done ;;
esac
echo "total $(( $(date +%s) - start )) s"

# Half of the suite on the H200, validation on: bash run.sh 1 (tests/test_[a-f]*.py) or 2 (tests/test_[g-z]*.py);
# the build made only where this host has none.
half=$1; files=$([ "$half" = 1 ] && echo 'tests/test_[a-f]*.py' || echo 'tests/test_[g-z]*.py')
source .gpu/setup.sh > /dev/null
start=$(date +%s)
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || { bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }; }
echo "build $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout $(( 570 - ($(date +%s) - start) )) bash tools/gpu_test.sh -q -n 16 --dist loadfile -p no:cacheprovider \
  --junitxml=$OUT/tests_junit_$half.xml $(ls $files) > $OUT/tests_$half.txt 2>&1
echo "rc $?"; tail -15 $OUT/tests_$half.txt

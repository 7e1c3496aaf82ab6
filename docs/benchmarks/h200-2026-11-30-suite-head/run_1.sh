# The suite's test files tests/test_[a-f]*.py on the H200, validation on; the build made only where this host has none.
source .gpu/setup.sh > /dev/null
start=$(date +%s)
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || { bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }; }
echo "build $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout $(( 570 - ($(date +%s) - start) )) bash tools/gpu_test.sh -q -n 16 --dist loadfile -p no:cacheprovider \
  --junitxml=$OUT/tests_junit_1.xml $(ls tests/test_[a-f]*.py) > $OUT/tests_1.txt 2>&1
echo "rc $?"; tail -15 $OUT/tests_1.txt

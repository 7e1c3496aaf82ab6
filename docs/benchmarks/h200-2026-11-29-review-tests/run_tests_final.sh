source .gpu/setup.sh > /dev/null
start=$(date +%s)
bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"
timeout $(( 170 - ($(date +%s) - start) )) bash tools/gpu_test.sh -q -n 16 --dist loadfile -p no:cacheprovider \
  --junitxml=$OUT/tests_junit.xml tests/test_graph_ncnn.py tests/test_dispatch_policy.py tests/test_group_norms.py > $OUT/tests.txt 2>&1
echo "rc $?"; tail -4 $OUT/tests.txt

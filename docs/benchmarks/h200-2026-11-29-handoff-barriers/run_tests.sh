# The cooperative kernel's hand-off barriers (buffer memory ordered at lane 0's hand-offs, atomic polls) and
# check's --input naming: the test files that run them, validation on.
source .gpu/setup.sh > /dev/null
start=$(date +%s)
bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout $(( 570 - ($(date +%s) - start) )) bash tools/gpu_test.sh -q -n 16 --dist loadfile -p no:cacheprovider \
  --junitxml=$OUT/tests_junit.xml tests/test_cooperative.py tests/test_reliability.py tests/test_group_norms.py \
  tests/test_check_vulkan.py tests/test_ncnn_models.py tests/test_reliability_graph.py > $OUT/tests.txt 2>&1
echo "rc $?"; tail -15 $OUT/tests.txt

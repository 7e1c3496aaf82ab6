source .gpu/setup.sh > /dev/null
start=$(date +%s)
bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"
timeout $(( 560 - ($(date +%s) - start) )) bash tools/gpu_test.sh -q -n 16 --dist loadfile -p no:cacheprovider \
  --junitxml=$OUT/tests_junit_late.xml tests/test_vulkan_precision.py tests/test_deploy_engine.py \
  tests/test_graph_ncnn.py tests/test_group_norms.py tests/test_cooperative.py tests/test_python_processes.py \
  tests/test_fusion.py tests/test_ncnn_models.py tests/test_foundation_bad_input.py tests/test_vulkan_api.py \
  tests/test_reliability_fuzz.py > $OUT/tests_late.txt 2>&1
echo "rc $?"; tail -15 $OUT/tests_late.txt

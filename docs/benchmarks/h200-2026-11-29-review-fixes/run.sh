source .gpu/setup.sh > /dev/null
start=$(date +%s)
bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout $(( 570 - ($(date +%s) - start) )) bash tools/gpu_test.sh -q -n 16 --dist loadfile -p no:cacheprovider \
  --junitxml=$OUT/tests_junit.xml tests/test_fusion.py tests/test_deploy_engine.py tests/test_deploy_cpp.py \
  tests/test_deploy_ncnn_cpp.py tests/test_foundation_bad_input.py tests/test_vulkan_api.py tests/test_graph_ncnn.py \
  tests/test_check_vulkan.py tests/test_cooperative.py > $OUT/tests.txt 2>&1
echo "rc $?"; tail -15 $OUT/tests.txt

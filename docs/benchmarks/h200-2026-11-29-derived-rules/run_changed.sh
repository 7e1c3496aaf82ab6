# The test files whose rules changed since the whole-suite run (built first)
set -uo pipefail
t0=$(date +%s)
bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s)-t0 ))s"
files="tests/test_vulkan_vs_pyncnn.py tests/test_ncnn_models.py tests/test_check_vulkan.py tests/test_check_fp16_rule.py tests/test_graph_ncnn.py tests/test_fusion.py tests/test_vulkan_ncnn_cases.py tests/test_vulkan_shapes.py tests/test_group_norms.py tests/test_vulkan_precision.py tests/test_foundation_cpu_reference.py tests/test_bench_kernels.py tests/test_bench_model.py tests/test_deploy_cpp.py"
mkdir -p $OUT/changed
OUT=$OUT/changed timeout 420 bash tools/gpu_test.sh -q -n 16 --dist loadfile -p no:cacheprovider --timeout 400 $files > $OUT/changed.txt 2>&1; echo "changed rc $? $(( $(date +%s)-t0 ))s"
tail -5 $OUT/changed.txt

# The 16 KB plans (VKNORM_MAX_SHARED_MEMORY=16384) after the dispatcher's change, run on this GPU under validation
set -uo pipefail
t0=$(date +%s)
bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s)-t0 ))s"
mkdir -p $OUT/shared16k
VKNORM_MAX_SHARED_MEMORY=16384 OUT=$OUT/shared16k timeout 200 bash tools/gpu_test.sh -q -n 16 --dist loadfile -p no:cacheprovider --timeout 190 tests/test_group_norms.py tests/test_vulkan_shapes.py tests/test_cooperative.py tests/test_vulkan_ncnn_cases.py tests/test_fusion.py > $OUT/shared16k.txt 2>&1; echo "16k rc $? $(( $(date +%s)-t0 ))s"
grep -E "passed|failed" $OUT/shared16k.txt | tail -3; grep -c "" $OUT/shared16k.txt

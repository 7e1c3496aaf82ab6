# This session's changed test files on the H200 (fusion reading a .param as ncnn does, graph Mat views and pyncnn's
# signatures, crash stages), validation on; the build made only where this host has none.
source .gpu/setup.sh > /dev/null
start=$(date +%s)
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || { bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }; }
echo "build $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout $(( 570 - ($(date +%s) - start) )) bash tools/gpu_test.sh -q -n 16 --dist loadfile -p no:cacheprovider \
  --junitxml=$OUT/tests_junit.xml tests/test_graph_ncnn.py tests/test_fusion.py tests/test_ncnn_models.py \
  tests/test_bench_model.py tests/test_bench_kernels.py > $OUT/tests.txt 2>&1
echo "rc $?"; tail -15 $OUT/tests.txt

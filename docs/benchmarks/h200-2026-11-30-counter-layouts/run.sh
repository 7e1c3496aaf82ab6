# On the H200: the build before the counter-layout fix (.gpu/builds/before.tar.gz, packed with
# `git archive -o .gpu/builds/before.tar.gz 0872fb6`) and this tree, kernels only, side by side; the pieces
# tests of tests/test_cooperative.py (this tree's) against each; then the first half of the suite on this tree.
source .gpu/setup.sh > /dev/null
start=$(date +%s)
rm -rf /tmp/before && mkdir -p /tmp/before && tar -xzf .gpu/builds/before.tar.gz -C /tmp/before
build=$(realpath tools/gpu_build.sh)
(cd /tmp/before && NO_NCNN=1 VKNORM_SITE=/tmp/site_before VKNORM_BUILD_DIR=/tmp/build_before bash "$build" \
   > $OUT/build_before.log 2>&1) &
bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
wait
echo "builds $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for site in /tmp/site_before /tmp/vknorm-site; do
  echo "== $site"
  PYTHONPATH=$site VKNORM_VALIDATION=1 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cooperative.py \
    -k pieces -rs --tb=line 2>&1 | tail -8
done > $OUT/pieces.txt
cat $OUT/pieces.txt
timeout $(( 580 - ($(date +%s) - start) )) bash tools/gpu_test.sh -q -n 16 --dist loadfile -p no:cacheprovider \
  --junitxml=$OUT/tests_junit_1.xml $(ls tests/test_[a-f]*.py) > $OUT/tests_1.txt 2>&1
echo "rc $?"; tail -15 $OUT/tests_1.txt

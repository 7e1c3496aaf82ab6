# Half of the suite on the H200, validation on: bash run.sh 1 (tests/test_[a-f]*.py) or 2 (tests/test_[g-z]*.py), or
# the test files named (bash run.sh tests/test_fusion.py ...); the build made only where this host has none.
case "$1" in
  1) files=$(ls tests/test_[a-f]*.py); tag=_1 ;;
  2) files=$(ls tests/test_[g-z]*.py); tag=_2 ;;
  *) files="$*"; tag= ;;
esac
source .gpu/setup.sh > /dev/null
start=$(date +%s)
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || { bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }; }
echo "build $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout $(( 570 - ($(date +%s) - start) )) bash tools/gpu_test.sh -q -n 16 --dist loadfile -p no:cacheprovider \
  --junitxml=$OUT/tests_junit$tag.xml $files > $OUT/tests$tag.txt 2>&1
echo "rc $?"; tail -15 $OUT/tests$tag.txt

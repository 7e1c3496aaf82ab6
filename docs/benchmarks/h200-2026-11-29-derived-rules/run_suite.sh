# whole suite in two halves; usage: bash .gpu/suite.sh 1|2
set -uo pipefail
files=$(ls tests/test_*.py)
half=$1
n=$(echo "$files" | wc -l)
if [ "$half" = 1 ]; then sel=$(echo "$files" | head -n $((n/2))); else sel=$(echo "$files" | tail -n +$((n/2+1))); fi
bash tools/gpu_test.sh -q -n 16 --dist loadfile -p no:cacheprovider --timeout 600 $sel 2>&1 | tail -40

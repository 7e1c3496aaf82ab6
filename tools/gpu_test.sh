#!/usr/bin/env bash
# On the lent GPU host: build vknorm with ncnn (tools/gpu_build.sh, skipped when this host already has the
# build) and run the test suite, or the test files named, against it with the validation layer on.
# Usage: source .gpu/setup.sh; bash tools/gpu_test.sh [pytest args]   (junit XML to $OUT when set)
set -uo pipefail
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || bash tools/gpu_build.sh || exit 1
export PYTHONPATH=/tmp/vknorm-site:${PYTHONPATH:-} VKNORM_CACHE=/tmp/vkcache VKNORM_VALIDATION=1
python3 -m pytest -q -p no:cacheprovider ${OUT:+--junitxml=$OUT/junit.xml} "$@"

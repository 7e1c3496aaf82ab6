#!/usr/bin/env bash
# On the lent GPU host: build vknorm with ncnn (tools/gpu_build.sh, skipped when this host already has the
# build) and run the test suite, or the test files named, against it with the validation layer on.
# Usage: source .gpu/setup.sh; bash tools/gpu_test.sh [pytest args]   (junit XML to $OUT when set)
# The whole suite in ~7 min on the H200 host: bash tools/gpu_test.sh -n 16 --dist loadfile tests
# (pytest-xdist carried as wheels, which .gpu/setup.sh installs from .gpu/whl: here, once,
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 -d .gpu/whl pytest-xdist==3.8.0 execnet==2.1.2
# loadfile keeps each file's module fixtures, which build C++ examples in fixed directories, in one worker).
# tools/gpu_build.sh leaves the ncnn it built in $OUT/ncnn-prefix.tar.gz; copied to .gpu/, later hosts skip
# that build.
# A validation layer package carried as .gpu/layer/vulkan-validationlayers_*.deb replaces the bundle's: a
# layer older than the GPU driver cannot parse the SPIR-V of the driver's newer extensions (ncnn's
# cooperative-matrix shaders on NVIDIA) and reports it as invalid. Fetch one with
#   curl -o .gpu/layer/<file> http://deb.debian.org/debian/pool/main/v/vulkan-validationlayers/<file>
# (<file>: vulkan-validationlayers_1.4.309.0-1_amd64.deb, Debian 13's, ran the suite on the H200 in 2026-11)
set -uo pipefail
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || bash tools/gpu_build.sh || exit 1
export PYTHONPATH=/tmp/vknorm-site:${PYTHONPATH:-} VKNORM_CACHE=/tmp/vkcache VKNORM_VALIDATION=1
# the build tree tools/gpu_build.sh left: tests/test_deploy_spirv.py checks its SPIR-V and build rules there
export VKNORM_BUILD_DIR=${VKNORM_BUILD_DIR:-/tmp/vknorm-build}
layer_deb=$(ls .gpu/layer/vulkan-validationlayers_*.deb 2>/dev/null | tail -1)
if [ -n "$layer_deb" ]; then
  dpkg -x "$layer_deb" /tmp/vklayer
  manifest=/tmp/vklayer/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json
  # the manifest names the library without a path, which would load the system's older copy
  sed -i "s|\"libVkLayer_khronos_validation.so\"|\"/tmp/vklayer/usr/lib/x86_64-linux-gnu/libVkLayer_khronos_validation.so\"|" "$manifest"
  export VK_LAYER_PATH=$(dirname "$manifest")
  echo "validation layer: $(grep -o '"api_version": "[^"]*"' "$manifest") from $layer_deb"
fi
python3 -m pytest -q -p no:cacheprovider ${OUT:+--junitxml=$OUT/junit.xml} "$@"

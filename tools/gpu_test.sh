#!/usr/bin/env bash
# On the lent GPU host: build vknorm with ncnn (tools/gpu_build.sh, skipped when this host already has the
# build) and run the test suite, or the test files named, against it with the validation layer on.
# Usage: source .gpu/setup.sh; bash tools/gpu_test.sh [pytest args]   (junit XML to $OUT when set)
# A validation layer package carried as .gpu/layer/vulkan-validationlayers_*.deb replaces the bundle's: a
# layer older than the GPU driver cannot parse the SPIR-V of the driver's newer extensions (ncnn's
# cooperative-matrix shaders on NVIDIA) and reports it as invalid. Fetch one with
#   curl -o .gpu/layer/<file> http://deb.debian.org/debian/pool/main/v/vulkan-validationlayers/<file>
set -uo pipefail
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || bash tools/gpu_build.sh || exit 1
export PYTHONPATH=/tmp/vknorm-site:${PYTHONPATH:-} VKNORM_CACHE=/tmp/vkcache VKNORM_VALIDATION=1
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

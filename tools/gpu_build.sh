#!/usr/bin/env bash
# On the lent GPU host (no network): build vknorm from this tree into /tmp/vknorm-site with the host's
# own cmake/ninja/nanobind/scikit-build-core, using the Vulkan headers and glslang that
# ../shared/gpu/bundle.sh put in .gpu/. Usage: source .gpu/setup.sh; bash tools/gpu_build.sh
set -euo pipefail
python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/vknorm-site \
  --config-settings=build-dir=/tmp/vknorm-build . 2>&1 | tail -20
echo "built: $(ls /tmp/vknorm-site/vknorm/_core*.so)"

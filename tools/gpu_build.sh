#!/usr/bin/env bash
# On the lent GPU host (no network): build ncnn from its pinned sdist (carried as .gpu/ncnn-*.tar.gz) and
# vknorm against it into /tmp/vknorm-site, with the host's own cmake/ninja/nanobind/scikit-build-core and
# the Vulkan headers and glslang that ../shared/gpu/bundle.sh put in .gpu/.
# Usage: source .gpu/setup.sh; bash tools/gpu_build.sh; export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
# It builds the tree it runs in; VKNORM_SITE and VKNORM_BUILD_DIR (defaults /tmp/vknorm-site, /tmp/vknorm-build)
# let several trees build side by side (tools/gpu_builds_ab.sh).
set -euo pipefail
export VKNORM_CACHE=/tmp/vkcache
site=${VKNORM_SITE:-/tmp/vknorm-site}
mkdir -p $VKNORM_CACHE/src
# NO_NCNN=1: the kernels alone (no ncnn build), for kernel sweeps.
[ -n "${NO_NCNN:-}" ] || cp .gpu/ncnn-*.tar.gz $VKNORM_CACHE/src/ 2>/dev/null || echo "no .gpu/ncnn-*.tar.gz: building vknorm without ncnn" >&2
# A host goes back bare after each lease: .gpu/ncnn-prefix.tar.gz (what an earlier build left in $OUT,
# copied into .gpu/) brings the built ncnn along instead of rebuilding it.
[ -f .gpu/ncnn-prefix.tar.gz ] && tar -xzf .gpu/ncnn-prefix.tar.gz -C $VKNORM_CACHE
ncnn_args=()
if [ -z "${NO_NCNN:-}" ] && ls $VKNORM_CACHE/src/ncnn-*.tar.gz >/dev/null 2>&1; then
  prefix=$(JOBS=$(nproc) bash tools/build_ncnn.sh)
  [ -n "${OUT:-}" ] && [ ! -f .gpu/ncnn-prefix.tar.gz ] && tar -czf "$OUT/ncnn-prefix.tar.gz" -C $VKNORM_CACHE "$(basename "$prefix")"
  ncnn_args=(--config-settings=cmake.define.VKNORM_NCNN=ON --config-settings=cmake.define.ncnn_DIR=$prefix/lib/cmake/ncnn)
fi
python3 -m pip install -q --no-build-isolation --no-deps --target "$site" \
  --config-settings=build-dir="${VKNORM_BUILD_DIR:-/tmp/vknorm-build}" "${ncnn_args[@]}" . 2>&1 | tail -20
echo "built: $(ls "$site"/vknorm/_*.so)"

#!/usr/bin/env bash
# Builds ncnn from its pinned PyPI sdist (the same version as the pyncnn pin) with Vulkan on, once per
# machine, and installs it outside the clone so a second `make test` skips it.
#   tools/build_ncnn.sh [PREFIX]     default PREFIX: ~/.cache/vknorm/ncnn-$VERSION
# Prints the prefix (holding lib/cmake/ncnn/ncnnConfig.cmake) on its last line.
set -euo pipefail
VERSION=1.0.20261020
SHA256=ad8cdd63e9755cfa8e23b9b6d9ce46156077d80298a89e7c3ba325ffccfca200
URL=https://files.pythonhosted.org/packages/b7/50/32b5172afe7d3e0dce410b7d8f4a5b7b84b942a0d69affbaedf669de52bc/ncnn-$VERSION.tar.gz
CACHE=${VKNORM_CACHE:-$HOME/.cache/vknorm}
PREFIX=${1:-$CACHE/ncnn-$VERSION}
if [ -f "$PREFIX/lib/cmake/ncnn/ncnnConfig.cmake" ] && [ -f "$PREFIX/.complete" ]; then
  echo "$PREFIX"; exit 0
fi
JOBS=${JOBS:-$(nproc)}
work=$CACHE/build/ncnn-$VERSION
mkdir -p "$CACHE/src" "$work"
tarball=$CACHE/src/ncnn-$VERSION.tar.gz
if ! echo "$SHA256  $tarball" | sha256sum -c --status 2>/dev/null; then
  echo "downloading ncnn $VERSION sdist" >&2
  python3 -c "import sys, urllib.request; open(sys.argv[2], 'wb').write(urllib.request.urlopen(sys.argv[1], timeout=120).read())" \
    "$URL" "$tarball.part"
  echo "$SHA256  $tarball.part" | sha256sum -c --status || { echo "ncnn sdist: sha256 mismatch" >&2; rm -f "$tarball.part"; exit 1; }
  mv "$tarball.part" "$tarball"
fi
rm -rf "$work/src" && mkdir -p "$work/src" && tar xzf "$tarball" -C "$work/src" --strip-components=1
echo "building ncnn $VERSION with Vulkan (once per machine, ~6 min on 2 cores) -> $PREFIX" >&2
# Only what vknorm needs: the library with Vulkan and its bundled glslang (ncnn compiles its own
# shaders at run time). No tools, examples, tests, Python, int8/bf16 or runtime CPU dispatch.
cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DNCNN_VULKAN=ON -DNCNN_BUILD_TOOLS=OFF -DNCNN_BUILD_EXAMPLES=OFF \
  -DNCNN_BUILD_BENCHMARK=OFF -DNCNN_BUILD_TESTS=OFF -DNCNN_PYTHON=OFF -DNCNN_INT8=OFF -DNCNN_BF16=OFF \
  -DNCNN_RUNTIME_CPU=OFF -DNCNN_AVX512=OFF -DNCNN_AVX512VNNI=OFF -DNCNN_SHARED_LIB=OFF >"$work/configure.log" 2>&1 ||
  { tail -30 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" -j "$JOBS" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }
cmake --install "$work/build" >"$work/install.log" 2>&1 || { tail -20 "$work/install.log" >&2; exit 1; }
touch "$PREFIX/.complete"
rm -rf "$work"
echo "$PREFIX"

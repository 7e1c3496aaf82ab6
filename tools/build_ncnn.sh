#!/usr/bin/env bash
# Builds ncnn from its pinned PyPI sdist (the same version as the pyncnn pin) with Vulkan on, once per
# machine, and installs it outside the clone so a second `make test` skips it.
#   tools/build_ncnn.sh [PREFIX]     default PREFIX: ~/.cache/vknorm/ncnn-$VERSION
# Prints the prefix (holding lib/cmake/ncnn/ncnnConfig.cmake) on its last line; messages and build
# progress go to stderr.
#   VKNORM_NCNN_SDIST=/path/to/ncnn-$VERSION.tar.gz   use that local sdist instead of downloading it
#                                                     (offline, or behind a mirror); same sha256 check
set -euo pipefail
VERSION=1.0.20261020
SHA256=ad8cdd63e9755cfa8e23b9b6d9ce46156077d80298a89e7c3ba325ffccfca200
# VKNORM_NCNN_URL: for testing the download-failure path only.
URL=${VKNORM_NCNN_URL:-https://files.pythonhosted.org/packages/b7/50/32b5172afe7d3e0dce410b7d8f4a5b7b84b942a0d69affbaedf669de52bc/ncnn-$VERSION.tar.gz}
home=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6 || true)}
if [ -z "${VKNORM_CACHE:-}" ] && [ -z "$home" ]; then
  echo "tools/build_ncnn.sh: no HOME and no home directory for uid $(id -u): set VKNORM_CACHE=DIR" >&2; exit 1
fi
CACHE=${VKNORM_CACHE:-$home/.cache/vknorm}
PREFIX=${1:-$CACHE/ncnn-$VERSION}
# A given sdist is kept in the cache as a download would be (a later run, and tests/test_build_ncnn_script.py,
# find it there), the build being done already or not.
if [ -n "${VKNORM_NCNN_SDIST:-}" ] && [ -f "$VKNORM_NCNN_SDIST" ] && [ ! -f "$CACHE/src/ncnn-$VERSION.tar.gz" ] &&
   [ "$(sha256sum "$VKNORM_NCNN_SDIST" | cut -d' ' -f1)" = "$SHA256" ]; then
  mkdir -p "$CACHE/src" && cp "$VKNORM_NCNN_SDIST" "$CACHE/src/ncnn-$VERSION.tar.gz"
fi
# Only what vknorm needs: the library with Vulkan and its bundled glslang (ncnn compiles its own
# shaders at run time). No tools, examples, tests, Python, int8/bf16 or runtime CPU dispatch.
OPTIONS=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DNCNN_VULKAN=ON -DNCNN_BUILD_TOOLS=OFF
         -DNCNN_BUILD_EXAMPLES=OFF -DNCNN_BUILD_BENCHMARK=OFF -DNCNN_BUILD_TESTS=OFF -DNCNN_PYTHON=OFF -DNCNN_INT8=OFF
         -DNCNN_BF16=OFF -DNCNN_RUNTIME_CPU=OFF -DNCNN_AVX512=OFF -DNCNN_AVX512VNNI=OFF -DNCNN_SHARED_LIB=OFF)
# The finished build's marker holds what it was built from: a cache built from another version or other options
# is built again rather than used.
CONFIG="ncnn $VERSION ${OPTIONS[*]}"
if [ -f "$PREFIX/lib/cmake/ncnn/ncnnConfig.cmake" ] && [ "$(cat "$PREFIX/.complete" 2>/dev/null)" = "$CONFIG" ]; then
  echo "$PREFIX"; exit 0
fi
JOBS=${JOBS:-$(nproc)}
work=$CACHE/build/ncnn-$VERSION
tarball=$CACHE/src/ncnn-$VERSION.tar.gz
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -n "${VKNORM_NCNN_SDIST:-}" ]; then
  sdist=$VKNORM_NCNN_SDIST
  if [ ! -f "$sdist" ]; then
    echo "VKNORM_NCNN_SDIST=$sdist: $([ -e "$sdist" ] && echo "not a file" || echo "no such file")" \
         "(expected the ncnn $VERSION sdist, ncnn-$VERSION.tar.gz)" >&2
    exit 1
  fi
  got=$(sha_of "$sdist")
  if [ "$got" != "$SHA256" ]; then
    echo "VKNORM_NCNN_SDIST=$sdist: sha256 mismatch: got $got, expected $SHA256 (ncnn-$VERSION.tar.gz)" >&2
    exit 1
  fi
  echo "using ncnn $VERSION sdist $sdist" >&2
  tarball=$sdist
elif [ ! -f "$tarball" ] || [ "$(sha_of "$tarball")" != "$SHA256" ]; then
  mkdir -p "$CACHE/src"
  echo "downloading ncnn $VERSION sdist" >&2
  python3 - "$URL" "$tarball.part" <<'EOF' || {
import sys, urllib.request
try:
    data = urllib.request.urlopen(sys.argv[1], timeout=120).read()
except Exception as e:  # one line, not a traceback
    sys.exit(f"ncnn sdist: download failed: {sys.argv[1]}: {getattr(e, 'reason', None) or e}")
open(sys.argv[2], "wb").write(data)
EOF
    rm -f "$tarball.part"
    echo "offline or behind a mirror? get ncnn-$VERSION.tar.gz (sha256 $SHA256) another way and rerun with" \
         "VKNORM_NCNN_SDIST=/path/to/ncnn-$VERSION.tar.gz" >&2
    exit 1
  }
  got=$(sha_of "$tarball.part")
  if [ "$got" != "$SHA256" ]; then
    echo "ncnn sdist: sha256 mismatch for $URL: got $got, expected $SHA256" >&2
    rm -f "$tarball.part"; exit 1
  fi
  mv "$tarball.part" "$tarball"
fi
rm -rf "$work/src" && mkdir -p "$work/src" && tar xzf "$tarball" -C "$work/src" --strip-components=1
echo "building ncnn $VERSION with Vulkan (once per machine, 3-8 min on 2 cores) -> $PREFIX" >&2

# Copies the build output into $1 (the full log) and shows progress on stderr from its "[ NN%]" (make)
# or "[N/M]" (ninja) lines: one updating line on a terminal, else a line every 10%.
progress() {
  local log=$1 line pct last=-1 tty=0 step=10
  [ -t 2 ] && tty=1
  : >"$log"
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$log"
    if [[ $line =~ ^\[\ *([0-9]+)%\] ]]; then
      pct=$((10#${BASH_REMATCH[1]}))
    elif [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]] && [ "${BASH_REMATCH[2]}" -gt 0 ]; then
      pct=$((100 * BASH_REMATCH[1] / BASH_REMATCH[2]))
    else
      continue
    fi
    if [ "$tty" = 1 ]; then
      [ "$pct" != "$last" ] && printf '\r  ncnn build %3d%%  (%dm%02ds)' "$pct" $((SECONDS / 60)) $((SECONDS % 60)) >&2
      last=$pct
    elif [ $((pct / step)) -gt $((last < 0 ? -1 : last / step)) ]; then
      printf '  ncnn build %3d%%  (%dm%02ds)\n' "$pct" $((SECONDS / 60)) $((SECONDS % 60)) >&2
      last=$pct
    fi
  done
  [ "$tty" = 1 ] && [ "$last" -ge 0 ] && printf '\n' >&2
  return 0
}

SECONDS=0
cmake -S "$work/src" -B "$work/build" -DCMAKE_INSTALL_PREFIX="$PREFIX" "${OPTIONS[@]}" >"$work/configure.log" 2>&1 ||
  { tail -30 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" -j "$JOBS" 2>&1 | progress "$work/build.log" ||
  { echo "ncnn build failed (full log: $work/build.log):" >&2; tail -40 "$work/build.log" >&2; exit 1; }
cmake --install "$work/build" >"$work/install.log" 2>&1 || { tail -20 "$work/install.log" >&2; exit 1; }
echo "$CONFIG" >"$PREFIX/.complete"
rm -rf "$work"
echo "built ncnn $VERSION in $((SECONDS / 60))m$((SECONDS % 60))s" >&2
echo "$PREFIX"

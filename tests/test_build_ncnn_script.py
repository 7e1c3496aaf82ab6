"""tools/build_ncnn.sh without building ncnn: the local-sdist variable (VKNORM_NCNN_SDIST) and its sha256
check, the download-failure message, and the stdout/stderr contract with build progress (a stand-in
`cmake` on PATH). Every run has VKNORM_CACHE in tmp_path, so the real cache is never touched."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from availability import missing

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "build_ncnn.sh"
TEXT = SCRIPT.read_text()
VERSION = re.search(r"^VERSION=(\S+)", TEXT, re.M).group(1)
SHA256 = re.search(r"^SHA256=([0-9a-f]{64})", TEXT, re.M).group(1)
# The real sdist, where `make setup` left it (only the stand-in build test needs it).
CACHED_SDIST = Path(os.environ.get("VKNORM_CACHE", Path.home() / ".cache" / "vknorm")) / "src" / f"ncnn-{VERSION}.tar.gz"


def run(tmp_path: Path, env_extra: dict, *args, path_prefix: Path = None, timeout=120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VKNORM_NCNN_", "CMAKE_GENERATOR"))}
    env.update(VKNORM_CACHE=str(tmp_path / "cache"), **env_extra)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    prefix = str(tmp_path / "prefix")
    return subprocess.run(["bash", str(SCRIPT), *(args or (prefix,))], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_bad_sdist_sha_is_a_clear_error(tmp_path):
    bogus = tmp_path / f"ncnn-{VERSION}.tar.gz"
    bogus.write_bytes(b"not the ncnn sdist\n")
    got = hashlib.sha256(bogus.read_bytes()).hexdigest()
    r = run(tmp_path, {"VKNORM_NCNN_SDIST": str(bogus)})
    assert r.returncode != 0
    assert r.stdout == ""  # the Makefile reads the prefix from the last stdout line: none on failure
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, err
    for needle in ("VKNORM_NCNN_SDIST", str(bogus), "sha256 mismatch", got, SHA256):
        assert needle in err, (needle, err)
    assert not (tmp_path / "prefix").exists() and not (tmp_path / "cache" / "build").exists()


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_missing_sdist_is_a_clear_error(tmp_path, kind):
    where = tmp_path / "nope.tar.gz"
    if kind == "directory":
        where.mkdir()
    r = run(tmp_path, {"VKNORM_NCNN_SDIST": str(where)})
    assert r.returncode != 0 and r.stdout == ""
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, err
    want = "no such file" if kind == "missing" else "not a file"
    for needle in ("VKNORM_NCNN_SDIST", str(where), want, f"ncnn-{VERSION}.tar.gz"):
        assert needle in err, (needle, err)


def test_download_failure_names_the_variable(tmp_path):
    """An unreachable URL (VKNORM_NCNN_URL, for this test only): two lines on stderr, the second says how to
    give a local sdist; no traceback, no partial file left."""
    r = run(tmp_path, {"VKNORM_NCNN_URL": "http://127.0.0.1:9/ncnn.tar.gz"})
    assert r.returncode != 0 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr
    assert lines[0] == f"downloading ncnn {VERSION} sdist", lines
    assert lines[1].startswith("ncnn sdist: download failed: http://127.0.0.1:9/ncnn.tar.gz"), lines
    assert "VKNORM_NCNN_SDIST=/path/to/ncnn-" in lines[2] and SHA256 in lines[2], lines
    assert len(lines) == 3, lines
    assert list((tmp_path / "cache" / "src").iterdir()) == []


FAKE_CMAKE = """#!/usr/bin/env bash
# Stands in for cmake: configure and install succeed at once, --build prints make's progress lines.
case "$1" in
  --build)
    for p in 0 3 7 12 25 26 50 75 99 100; do echo "[$(printf '%3d' $p)%] Building CXX object x$p.o"; echo "warning: noise"; done
    [ -n "${FAKE_BUILD_FAIL:-}" ] && { echo "x.cpp:1: error: it broke"; exit 2; }
    exit 0 ;;
  --install)
    prefix=$(cat "$2/prefix")
    mkdir -p "$prefix/lib/cmake/ncnn" && touch "$prefix/lib/cmake/ncnn/ncnnConfig.cmake"; exit 0 ;;
  *)
    while [ $# -gt 0 ]; do
      case "$1" in -B) build=$2; shift ;; -DCMAKE_INSTALL_PREFIX=*) prefix=${1#*=} ;; esac; shift
    done
    mkdir -p "$build" && echo "$prefix" >"$build/prefix"; exit 0 ;;
esac
"""


@pytest.fixture()
def fake_cmake(tmp_path):
    if not CACHED_SDIST.is_file():
        missing(f"no cached ncnn sdist at {CACHED_SDIST} (make setup downloads it)")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "cmake").write_text(FAKE_CMAKE)
    (bindir / "cmake").chmod(0o755)
    return bindir


def test_progress_goes_to_stderr_and_the_prefix_is_the_last_stdout_line(tmp_path, fake_cmake):
    r = run(tmp_path, {"VKNORM_NCNN_SDIST": str(CACHED_SDIST)}, path_prefix=fake_cmake)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == str(tmp_path / "prefix")
    assert "%" not in r.stdout
    pct = [int(m.group(1)) for m in re.finditer(r"^  ncnn build +([0-9]+)%", r.stderr, re.M)]
    assert pct == [0, 12, 25, 50, 75, 99, 100], r.stderr  # stderr is not a terminal: a line per 10% step
    assert (tmp_path / "prefix" / ".complete").exists()
    assert not (tmp_path / "cache" / "build" / f"ncnn-{VERSION}").exists()  # the build tree is removed


def test_a_finished_build_is_used_as_it_is_and_nothing_else_runs(tmp_path, fake_cmake):
    first = run(tmp_path, {"VKNORM_NCNN_SDIST": str(CACHED_SDIST)}, path_prefix=fake_cmake)
    assert first.returncode == 0, first.stderr
    prefix = tmp_path / "prefix"
    r = run(tmp_path, {"VKNORM_NCNN_SDIST": str(tmp_path / "nope.tar.gz")})  # not even looked at
    assert r.returncode == 0 and r.stdout == f"{prefix}\n" and r.stderr == "", r


@pytest.mark.parametrize("marker", ["", f"ncnn {VERSION} -DCMAKE_BUILD_TYPE=Debug", "ncnn 1.0.20240410 -DNCNN_VULKAN=ON"])
def test_a_build_from_another_version_or_other_options_is_built_again(tmp_path, fake_cmake, marker):
    """The finished build's marker names its version and cmake options; one that differs from the script's own (an
    older script's empty marker, other options, another version) is not taken for this build."""
    assert run(tmp_path, {"VKNORM_NCNN_SDIST": str(CACHED_SDIST)}, path_prefix=fake_cmake).returncode == 0
    done = tmp_path / "prefix" / ".complete"
    ours = done.read_text()
    assert ours.startswith(f"ncnn {VERSION} ") and "-DNCNN_VULKAN=ON" in ours, ours
    done.write_text(marker + "\n")
    r = run(tmp_path, {"VKNORM_NCNN_SDIST": str(CACHED_SDIST)}, path_prefix=fake_cmake)
    assert r.returncode == 0 and f"building ncnn {VERSION} with Vulkan" in r.stderr, r.stderr
    assert done.read_text() == ours


def test_build_failure_prints_the_log_tail(tmp_path, fake_cmake):
    r = run(tmp_path, {"VKNORM_NCNN_SDIST": str(CACHED_SDIST), "FAKE_BUILD_FAIL": "1"}, path_prefix=fake_cmake)
    assert r.returncode != 0 and r.stdout == ""
    log = tmp_path / "cache" / "build" / f"ncnn-{VERSION}" / "build.log"
    assert f"full log: {log}" in r.stderr
    assert "x.cpp:1: error: it broke" in r.stderr and "it broke" in log.read_text()
    assert "warning: noise" in log.read_text()  # the full build output is kept in the log
    assert not (tmp_path / "prefix" / ".complete").exists()


@pytest.mark.parametrize("cache", [None, "/opt/elsewhere/vknorm-cache"])
def test_make_builds_ncnn_in_the_cache_that_VKNORM_CACHE_names(cache):
    """`make setup` hands tools/build_ncnn.sh the install prefix inside VKNORM_CACHE (default ~/.cache/vknorm), so
    the script's sources and build tree and the Makefile's install land in one cache."""
    env = {k: v for k, v in os.environ.items() if k != "VKNORM_CACHE"}
    if cache:
        env["VKNORM_CACHE"] = cache
    expected = f"{cache or Path.home() / '.cache' / 'vknorm'}/ncnn-{VERSION}"
    # the target is the built ncnn's own marker: a cache deleted or moved is built again
    r = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), f"{expected}/.complete"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f'tools/build_ncnn.sh "{expected}"' in r.stdout, r.stdout

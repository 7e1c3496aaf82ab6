"""Portable SPIR-V: every shader variant is SPIR-V for Vulkan 1.0 (float32 storage, shared-memory
reductions) or 1.1 (subgroup or float16-storage variants), and spirv-val accepts it for each environment
it is meant for.

What is checked, honestly:
* the SPIR-V embedded in the vknorm that runs (vknorm._core.shader_variants / shader_spirv: an installed
  package has no build tree) passes spirv-val for each environment, and the SPIR-V version in each header
  is what its environment allows (1.0 for Vulkan 1.0, at most 1.3 for Vulkan 1.1);
* in a build tree (build/*/generated of this checkout, or VKNORM_BUILD_DIR=<cmake build dir>, e.g.
  tools/gpu_build.sh's /tmp/vknorm-build): the build rules (cmake/shaders.cmake) ran spirv-val for
  vulkan1.0/1.1/1.2 (1.0 variants) or 1.1/1.2 (1.1 variants) on every .spv they compiled -- read back from
  the generated build files (build.ninja or the Makefiles' build.make) -- spirv-val passes on every .spv
  there too, and every embedded variant has its .spv. Without a build tree these are skipped, saying so.
Not checked: that a real Vulkan 1.0 driver runs them (lavapipe forced to 1.0 does: test_capabilities.py).
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import struct
import subprocess

import pytest

from availability import requirement

from vknorm import _core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATED = sorted(glob.glob(os.path.join(ROOT, "build", "*", "generated")) +
                   ([os.path.join(os.environ["VKNORM_BUILD_DIR"], "generated")]
                    if os.environ.get("VKNORM_BUILD_DIR") else []))
GENERATED = [g for g in GENERATED if os.path.isdir(g)]
SPIRV_VAL = shutil.which("spirv-val")
needs_build_tree = requirement(
    bool(GENERATED), "no build tree (build/*/generated, or VKNORM_BUILD_DIR): an installed package carries "
                          "only the embedded SPIR-V, checked by test_embedded_spirv_passes_spirv_val")
needs_spirv_val = requirement(SPIRV_VAL is not None, "spirv-val not installed (apt-get install spirv-tools)")


def envs_for(name: str):
    """(environment compiled for, environments validated) of a variant <shader>_fp<0|1>_p<..>_sg<0|1>."""
    fp16 = "_fp1_" in name
    subgroup = name.endswith("_sg1")
    return ("vulkan1.1", ("vulkan1.1", "vulkan1.2")) if fp16 or subgroup else \
        ("vulkan1.0", ("vulkan1.0", "vulkan1.1", "vulkan1.2"))


def spv_files():
    out = []
    for gen in GENERATED:
        out += sorted(glob.glob(os.path.join(gen, "spv", "*.spv")))
    return out


def validate(name: str, spv: str) -> list:
    """spirv-val of one variant for each environment it is meant for, and its SPIR-V version: failures."""
    failures = []
    compiled_for, val_envs = envs_for(name)
    with open(spv, "rb") as f:
        magic, version = struct.unpack("<II", f.read(8))
    if magic != 0x07230203:
        return [f"{name}: not SPIR-V"]
    major, minor = version >> 16 & 0xFF, version >> 8 & 0xFF
    allowed = (1, 0) if compiled_for == "vulkan1.0" else (1, 3)
    if (major, minor) > allowed:
        failures.append(f"{name}: SPIR-V {major}.{minor} is too new for {compiled_for}")
    for env in val_envs:
        proc = subprocess.run([SPIRV_VAL, "--target-env", env, spv], capture_output=True, text=True)
        if proc.returncode != 0:
            failures.append(f"{name} --target-env {env}: {(proc.stdout + proc.stderr).strip()[:500]}")
    if compiled_for == "vulkan1.1":  # and a Vulkan 1.0 device must not get them: they are SPIR-V 1.3
        proc = subprocess.run([SPIRV_VAL, "--target-env", "vulkan1.0", spv], capture_output=True, text=True)
        if proc.returncode == 0 and (major, minor) > (1, 0):
            failures.append(f"{name}: SPIR-V {major}.{minor} accepted for vulkan1.0?")
    return failures


@needs_spirv_val
def test_embedded_spirv_passes_spirv_val(tmp_path):
    """The SPIR-V inside the vknorm that runs, whatever built it: every kernel, both storages, every
    packing, both reduction flavours, each valid for its environments."""
    names = _core.shader_variants()
    assert any(n.endswith("_sg1") for n in names) and any("_fp1_" in n for n in names), names
    assert {n.split("_fp")[0] for n in names} >= {"norm_fused", "norm_reduce", "norm_finalize", "norm_apply"}, names
    failures = []
    for name in names:
        path = tmp_path / f"{name}.spv"
        path.write_bytes(_core.shader_spirv(name))
        failures += validate(name, str(path))
    assert not failures, "\n".join(failures)
    with pytest.raises(ValueError, match="no embedded shader variant"):
        _core.shader_spirv("norm_fused_fp2_p1_sg0")


@needs_build_tree
def test_there_are_generated_shaders():
    assert GENERATED, "no build/*/generated: build vknorm first (make test does)"
    for gen in GENERATED:
        with open(os.path.join(gen, "shaders.cpp")) as f:
            embedded = set(re.findall(r'"((?:norm_\w+|copy)_fp[01]_p(?:1|4|v4)_sg[01])"', f.read()))
        files = {os.path.basename(p)[:-4] for p in glob.glob(os.path.join(gen, "spv", "*.spv"))}
        assert embedded, f"{gen}/shaders.cpp names no variant"
        assert embedded <= files, f"{gen}: embedded variants without a .spv: {sorted(embedded - files)}"
        assert any(n.endswith("_sg1") for n in embedded) and any("_fp1_" in n for n in embedded)


@needs_build_tree
@needs_spirv_val
def test_spirv_val_passes_for_every_target_environment():
    failures = []
    files = spv_files()
    for spv in files:
        failures += validate(os.path.basename(spv)[:-4], spv)
    assert files, "no .spv files found"
    assert not failures, "\n".join(failures)


@needs_build_tree
def test_build_rules_validate_each_variant_for_each_environment():
    """The build itself ran spirv-val: the generated build files validate each .spv for its environments."""
    checked = 0
    for gen in GENERATED:
        build_dir = os.path.dirname(gen)
        rules = ""
        for path in [os.path.join(build_dir, "build.ninja")] + glob.glob(
                os.path.join(build_dir, "CMakeFiles", "**", "build.make"), recursive=True):
            if os.path.exists(path):
                with open(path) as f:
                    rules += f.read()
        if not rules:
            continue
        for spv in glob.glob(os.path.join(gen, "spv", "*.spv")):
            name = os.path.basename(spv)[:-4]
            compiled_for, val_envs = envs_for(name)
            assert re.search(rf"--target-env {compiled_for} .*-o \S*/{name}\.spv", rules), \
                f"{build_dir}: {name} is not compiled for {compiled_for}"
            for env in val_envs:
                if env == "vulkan1.0" and not _option_on(build_dir, "VKNORM_VULKAN_1_0_TARGET"):
                    continue
                assert re.search(rf"spirv-val\S* --target-env {env} \S*/{name}\.spv", rules), \
                    f"{build_dir}: the build does not validate {name} for {env}"
                checked += 1
    assert checked, "no build files found under build/"


def _option_on(build_dir: str, option: str) -> bool:
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            m = re.search(rf"^{option}:BOOL=(\w+)$", f.read(), re.M)
    except OSError:
        return True
    return not m or m.group(1).upper() in ("ON", "1", "TRUE", "YES")

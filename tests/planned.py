"""Plans for a described device (`_core.plan_for_device`: no device is touched), shared by the dispatch tests."""
from __future__ import annotations

import os
import re

import pytest

from vknorm import _core

# An NVIDIA H200 as vknorm reads it (vknorm info), without its multiprocessor count: the fused and split rules
# measured there, with the cooperative kernel (planned only where residency is known) out of the picture.
H200_UNKNOWN_RESIDENCY = {"type": "discrete", "subgroup_size": 32, "max_shared_memory": 49152,
                          "max_workgroup_invocations": 1024, "max_workgroup_size_x": 1024,
                          "max_workgroup_count_x": 2**31 - 1, "subgroup_reduce": True}
# ... and as it is: 132 multiprocessors (VK_NV_shader_sm_builtins).
H200 = dict(H200_UNKNOWN_RESIDENCY, compute_units=132)
# lavapipe (llvmpipe, 256-bit): a CPU device.
LAVAPIPE = {"type": "cpu", "subgroup_size": 8, "max_shared_memory": 32768, "max_workgroup_invocations": 1024,
            "max_workgroup_size_x": 1024, "max_workgroup_count_x": 65535, "subgroup_reduce": True}

KNOBS = ("VKNORM_PATH", "VKNORM_COOPERATIVE_WORKGROUPS")


@pytest.fixture
def no_tuning_knobs(monkeypatch):
    """The dispatcher reads these per plan: none of them set while a test plans."""
    for k in list(os.environ):
        if k.startswith("VKNORM_TUNE_") or k in KNOBS:
            monkeypatch.delenv(k)


def rows_plan(op, rows, cols, fp16=False, device=H200, pack=4, path="auto"):
    """A 2-D blob of rows x cols as ncnn stores it: pack4 packs 4 rows per element (rows must divide)."""
    return _core.plan_for_device(op, cols, 1, 0, 2, cols, rows // pack, 1, 1, pack, fp16, device, path)


def channels_plan(op, c, h, w, group, fp16=False, device=H200, path="auto"):
    """A c x h x w blob in pack4 (GroupNorm's group; InstanceNorm takes group = c)."""
    return _core.plan_for_device(op, 0, group, c, 3, w, h, 1, c // 4, 4, fp16, device, path)


# ---------------------------------------------------------------- shared memory the shaders declare

SHADERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shaders")
SHARED_STATEMENT = re.compile(r"\bshared\s+(\w+)\s+([^;]+);")
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
SHARED_ITEM = re.compile(r"^(\w+)\s*(?:\[([^\]]*)\])?$")
TYPE_BYTES = {"float": 4, "uint": 4, "int": 4, "bool": 4, "vec4": 16, "afp": 16, "stat": 16, "wfp": 16}  # afp, stat,
# wfp: vec4 at most (common.glsl)
# Array sizes other than one per invocation, and the slots each holds in the dispatcher's budget (a kernel whose
# plan keeps no plane's weights: one; norm_fused.comp).
FIXED_ARRAY_SLOTS = {"PLANE_WEIGHT_SLOTS": 1}


def shared_bytes(shaders_dir: str = SHADERS) -> dict:
    """Shader -> (shared bytes per workgroup invocation, shared bytes besides), read from every GLSL shared
    declaration (arrays, scalars, comma lists) of the shader and the .glsl files it includes. An array is sized
    gl_WorkGroupSize.x (per invocation) or by a size FIXED_ARRAY_SLOTS knows; any other declaration fails here, so
    that none goes uncounted in what the dispatcher budgets (src/dispatch.cpp device_caps)."""
    def decls(path):
        with open(path) as f:
            text = COMMENT.sub("", f.read())  # "shared" in a comment declares nothing
        per_invocation = fixed = 0
        for typ, items in SHARED_STATEMENT.findall(text):
            assert typ in TYPE_BYTES, f"{path}: shared type {typ} unknown to this test: add it to TYPE_BYTES"
            for item in items.split(","):
                m = SHARED_ITEM.match(item.strip())
                assert m, f"{path}: shared declaration {item.strip()!r} not understood by this test"
                name, size = m.groups()
                if size is None:
                    fixed += TYPE_BYTES[typ]
                elif size.strip() == "gl_WorkGroupSize.x":
                    per_invocation += TYPE_BYTES[typ]
                else:
                    assert size.strip() in FIXED_ARRAY_SLOTS, f"{path}: shared {name}[{size}]: a size unknown to this test"
                    fixed += TYPE_BYTES[typ] * FIXED_ARRAY_SLOTS[size.strip()]
        return per_invocation, fixed

    def with_includes(name):  # the shader and every .glsl it includes (common.glsl among them)
        with open(os.path.join(shaders_dir, name)) as f:
            included = re.findall(r'#include "([^"]+)"', f.read())
        parts = [decls(os.path.join(shaders_dir, name))] + [decls(os.path.join(shaders_dir, i)) for i in included]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    return {name[:-5]: with_includes(name) for name in sorted(os.listdir(shaders_dir)) if name.endswith(".comp")}


def declared_shared(per_shader: dict, plan: dict) -> int:
    """Shared bytes the largest kernel of a plan (plan_for_device, or a last_dispatch) declares: per invocation,
    fixed, and where the fused kernel keeps its planes' weights, a slot of each per plane of its item (the
    plan's "planes", which only plan_for_device reports)."""
    shaders = {"split": ("norm_reduce", "norm_finalize", "norm_apply"),
               "cooperative": ("norm_cooperative",)}.get(plan["path"], ("norm_fused",))
    total = max(plan["workgroup_size"] * per_shader[s][0] + per_shader[s][1] for s in shaders)
    if plan["plane_weights"]:
        assert "planes" in plan, "plane weights add a slot per plane: plan it with plan_for_device"
        total += 2 * 16 * (plan["planes"] - 1)
    return total

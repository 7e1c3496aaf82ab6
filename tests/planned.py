"""Plans for a described device (`_core.plan_for_device`: no device is touched), shared by the dispatch tests."""
from __future__ import annotations

import os

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

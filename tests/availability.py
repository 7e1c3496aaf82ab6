"""Test support: what this machine offers the suites — a Vulkan device for vknorm, vknorm.graph (vknorm
built with ncnn) — as functions and skip marks."""
from __future__ import annotations

import pytest

from vknorm import _core


def has_vulkan() -> bool:
    try:
        return len(_core.devices()) > 0
    except _core.VulkanUnavailableError:
        return False


def has_graph() -> bool:
    try:
        import vknorm.graph  # noqa: F401  (importing it starts nothing: no Vulkan, no ncnn instance)
    except ImportError:
        return False
    return True


def import_graph():
    """vknorm.graph, or a skip (of the test, or of the module at import) where vknorm was built without ncnn.
    (pytest.importorskip skips only a missing module: vknorm.graph is there and raises ImportError itself.)"""
    if not has_graph():
        pytest.skip("vknorm built without ncnn (make setup builds it)", allow_module_level=True)
    import vknorm.graph

    return vknorm.graph


needs_vulkan = pytest.mark.skipif(not has_vulkan(), reason="no Vulkan device")
needs_graph = pytest.mark.skipif(not has_graph(), reason="vknorm built without ncnn (make setup builds it)")

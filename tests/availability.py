"""Test support: what this machine offers the suites — a Vulkan device for vknorm, vknorm.graph (vknorm
built with ncnn), pyncnn, the tools make setup installs — as functions and skip marks.

`make test` provides every one of them (lavapipe, vknorm built with ncnn, ...) and says so with
VKNORM_TEST_REQUIRE_ALL=1: there, a test that would skip for want of one fails instead, so a broken set-up cannot
pass as hundreds of skips. Elsewhere (a GPU host without lavapipe, a build without ncnn) they skip."""
from __future__ import annotations

import importlib
import os

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


REQUIRE_ALL = os.environ.get("VKNORM_TEST_REQUIRE_ALL") == "1"
UNMET = "unmet_requirement"  # the mark a test gets for a requirement missing under REQUIRE_ALL (conftest fails it)


def missing(reason: str) -> None:
    """Skip the test (or the module, at import) for want of something this machine lacks; fail where make test
    promised it (REQUIRE_ALL)."""
    if REQUIRE_ALL:
        pytest.fail(f"make test provides this, but it is missing: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def requirement(ok: bool, reason: str):
    """A mark: nothing where ok, else a skip (a failure under REQUIRE_ALL)."""
    if ok:
        return pytest.mark.skipif(False, reason=reason)
    return getattr(pytest.mark, UNMET)(reason) if REQUIRE_ALL else pytest.mark.skip(reason=reason)


def import_graph():
    """vknorm.graph, or a skip (of the test, or of the module at import) where vknorm was built without ncnn.
    (pytest.importorskip skips only a missing module: vknorm.graph is there and raises ImportError itself.)"""
    if not has_graph():
        missing("vknorm built without ncnn (make setup builds it)")
    import vknorm.graph

    return vknorm.graph


def import_or_missing(module: str):
    """The module (pyncnn's "ncnn", "vknorm.ncnn"), or missing() where it cannot be imported."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing(f"cannot import {module} ({e})")


needs_vulkan = requirement(has_vulkan(), "no Vulkan device")
needs_graph = requirement(has_graph(), "vknorm built without ncnn (make setup builds it)")

"""Shared pytest set-up for the vknorm suites.

* VKNORM_VALIDATION defaults to 1 *before* vknorm is imported, so the Khronos validation layer (with
  synchronization validation) wraps every Vulkan call this process makes.
* The layer reads tests/validation_layer.py's settings (notices about the layer's own age filtered).
* Every test starts with an empty validation log and fails if any message (warning or error) was
  reported while it ran (hook wrappers below; every validation message counts as a failure). Python child
  processes the tests start exit with status 86 on any message (tests/child_site/sitecustomize.py).
* A test whose requirement make test provides (VKNORM_TEST_REQUIRE_ALL=1) but this machine lacks fails rather than
  skips (tests/availability.py).
* pytest.ini at the repository root gives every test a 300 s timeout (pytest-timeout); the marker
  ``@pytest.mark.timeout(N)`` tightens it per test.
* A context keeps 2048 pipelines here (VKNORM_PIPELINE_CACHE_COUNT; the default is 128): the parity sweeps come
  back to the same few thousand shapes file after file, and lavapipe takes 30-200 ms to make each pipeline again
  (two sweep files: 261 s with 128 kept, 59 s with 2048, at 2.2 GB of memory). Tests of the count set their own.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("VKNORM_VALIDATION", "1")
os.environ.setdefault("VKNORM_PIPELINE_CACHE_COUNT", "2048")
# Python children the tests start fail (exit 86) on validation messages too (tests/child_site/sitecustomize.py).
CHILD_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child_site")
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (CHILD_SITE, os.environ.get("PYTHONPATH")) if p)

import pytest  # noqa: E402

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

import validation_layer  # noqa: E402

# The layer's notices about its own age (a driver newer than the layer) are not messages about the code
# under test: filtered for this process and every child it starts, before the first instance exists.
os.environ.setdefault("VK_LAYER_SETTINGS_PATH", validation_layer.session_settings_dir())

import vknorm  # noqa: E402
from vknorm import _core  # noqa: E402

import availability  # noqa: E402  (after the settings above: it asks for a Vulkan device)


def _fail_on_messages(where: str) -> None:
    messages = _core.validation_messages()
    _core.clear_validation_messages()
    if messages:
        shown = "\n".join(f"  [{i}] {m}" for i, m in enumerate(messages[:10]))
        more = f"\n  ... and {len(messages) - 10} more" if len(messages) > 10 else ""
        raise AssertionError(f"{len(messages)} Vulkan validation message(s) {where}:\n{shown}{more}")


# The validation check is done with hook wrappers rather than an autouse fixture: a fixture would run
# after module/session fixtures were set up (losing their messages) and could only fail in teardown
# (an "error", not a failure). These three wrappers cover set-up, the test body and teardown.
def pytest_configure(config):
    config.addinivalue_line("markers", f"{availability.UNMET}(reason): a requirement make test provides is missing "
                                       "(tests/availability.py): the test fails")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """Each test starts with an empty validation log (cleared before any of its fixtures run); one marked with a
    requirement make test provides but this machine lacks fails (tests/availability.py)."""
    unmet = item.get_closest_marker(availability.UNMET)
    if unmet:
        availability.missing(unmet.args[0])  # (the mark is made only where make test requires it all: a failure)
    _core.clear_validation_messages()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Any validation message reported during set-up or the test body fails the test."""
    result = yield
    _fail_on_messages(f"during {item.nodeid}")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Messages reported while tearing down fixtures fail too (reported as a teardown error)."""
    result = yield
    _fail_on_messages(f"while tearing down after {item.nodeid}")
    return result


@pytest.fixture(scope="session")
def vulkan_device() -> dict:
    """The default Vulkan device (lavapipe on CI): its info dict."""
    return vknorm.device_info()

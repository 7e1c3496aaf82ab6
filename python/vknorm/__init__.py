"""vknorm: fast, exact LayerNorm, RMSNorm, GroupNorm and InstanceNorm on Vulkan for ncnn-style
inference engines.

    ln = vknorm.LayerNorm(affine_size=768, eps=1e-5)
    ln.load_model(gamma, beta)
    y = ln(x)                      # on the default Vulkan device; device="cpu" for the reference
    gn = vknorm.GroupNorm(group=32, channels=320, eps=1e-5)   # ncnn's params and weight order
"""
from . import _core
from ._core import Context, Mat, VkMat, VulkanUnavailableError
from . import layers
from .layers import GroupNorm, InstanceNorm, LayerNorm, Option, RMSNorm, device_info, devices, to_device

__all__ = [
    "LayerNorm",
    "RMSNorm",
    "GroupNorm",
    "InstanceNorm",
    "Option",
    "Mat",
    "VkMat",
    "Context",
    "VulkanUnavailableError",
    "devices",
    "device_info",
    "to_device",
]
__version__ = "0.1.0"

import atexit as _atexit
import os as _os
import sys as _sys


# Whether this process was forked while other threads ran: their frames, and what they hold, are copied into
# the child, where those threads never run again.
_forked_beside_threads = False
_threads_at_fork = 1


def _count_threads_before_fork() -> None:
    global _threads_at_fork
    import threading

    _threads_at_fork = threading.active_count()


def _note_fork_in_child() -> None:
    global _forked_beside_threads
    _forked_beside_threads = _forked_beside_threads or _threads_at_fork > 1


def _quiet_leak_warnings_for_parked_threads() -> None:
    """A daemon thread still inside vknorm when the interpreter finalizes parks there until the process ends
    (python/release_gil.h); the objects it holds are not leaks, which nanobind would list one by one. Nor are
    those a forked child keeps of the threads its parent had running at the fork."""
    import threading

    if threading.active_count() > 1 or _forked_beside_threads:
        for m in [_core] + [m for m in (_sys.modules.get("vknorm._graph"),) if m is not None]:
            m._quiet_leak_warnings()


# Destroy the default device, and those made for device indices, while the interpreter and the driver are both
# still whole (atexit runs the last registered first).
_atexit.register(Context.release_default)
_atexit.register(layers.release_indexed_contexts)
_atexit.register(_quiet_leak_warnings_for_parked_threads)
if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(before=_count_threads_before_fork, after_in_child=_note_fork_in_child)

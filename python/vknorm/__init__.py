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
import sys as _sys


def _begin_exit() -> None:
    """First of vknorm's exit hooks: from here on, a thread other than the main one that enters vknorm, or
    comes back from it, parks until the process ends (python/release_gil.h): once finalization begins,
    Python would end it by unwinding it through vknorm's native code, which aborts the process. Threads
    already back and waiting for the GIL get it during a short sleep, before the devices are released."""
    import threading
    import time

    modules = [_core] + [m for m in (_sys.modules.get("vknorm._graph"),) if m is not None]
    for m in modules:
        m._begin_exit()
    if threading.active_count() > 1:
        for m in modules:
            m._quiet_leak_warnings()
        time.sleep(0.005)


# Destroy the default device, and those made for device indices, while the interpreter and the driver are both
# still whole (atexit runs the last registered first).
_atexit.register(Context.release_default)
_atexit.register(layers.release_indexed_contexts)
# Registered last, run first (atexit runs the last registered first).
_atexit.register(_begin_exit)

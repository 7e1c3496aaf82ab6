"""vknorm: fast, exact LayerNorm, RMSNorm, GroupNorm and InstanceNorm on Vulkan for ncnn-style
inference engines.

    ln = vknorm.LayerNorm(affine_size=768, eps=1e-5)
    ln.load_model(gamma, beta)
    y = ln(x)                      # on the default Vulkan device; device="cpu" for the reference
    gn = vknorm.GroupNorm(group=32, channels=320, eps=1e-5)   # ncnn's params and weight order
"""
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

# Destroy the default device, and those made for device indices, while the interpreter and the driver are both
# still whole (atexit runs the last registered first).
_atexit.register(Context.release_default)
_atexit.register(layers.release_indexed_contexts)

"""vknorm: fast, exact LayerNorm and RMSNorm on Vulkan for ncnn-style inference engines.

    ln = vknorm.LayerNorm(affine_size=768, eps=1e-5)
    ln.load_model(gamma, beta)
    y = ln(x)                      # on the default Vulkan device; device="cpu" for the reference
"""
from ._core import Context, Mat, VkMat, VulkanUnavailableError
from .layers import LayerNorm, Option, RMSNorm, device_info, devices, to_device

__all__ = [
    "LayerNorm",
    "RMSNorm",
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

# Destroy the default device while the interpreter and the driver are both still whole.
_atexit.register(Context.release_default)

"""Run ncnn's own LayerNorm / RMSNorm layer through pyncnn (helper, no tests).

Used as the ground truth for vknorm: a one-layer ncnn net (``Input`` ->
``LayerNorm``/``RMSNorm``) is built from in-memory param text plus a raw
float32 weight file written to a temporary directory, run on the CPU or on
ncnn's Vulkan path, and the output is returned as a float32 numpy array of the
input's shape.

Requires the pip package ``ncnn`` (checked with 1.0.20261020).  The Vulkan path
runs on whatever device ncnn picks (device 0, e.g. Mesa lavapipe "llvmpipe").

Public API
----------
run_ncnn_layer(op, x, affine_size, eps, affine, gamma=None, beta=None,
               vulkan=False, fp16=False, packing=True, num_threads=1) -> np.ndarray
vulkan_available() -> bool
param_text(op, affine_size, eps, affine) -> str
format_eps(eps) -> str

Behaviour notes (ncnn 1.0.20261020)
-----------------------------------
* Options: ``fp16=False`` turns off use_fp16_packed / use_fp16_storage /
  use_fp16_arithmetic / use_bf16_packed / use_bf16_storage on both paths, so
  the CPU path is plain fp32 and the Vulkan path stores and computes in fp32.
  ``fp16=True`` turns on use_fp16_packed + use_fp16_storage with
  use_fp16_arithmetic off (bf16 off) -- what ncnn's own test_layer does on the
  GPU.  On an x86 CPU LayerNorm/RMSNorm have no fp16 storage, so fp16=True on
  the CPU path still computes in fp32.
* ``packing`` sets opt.use_packing_layout.  On the x86 CPU path it decides
  whether the layer sees elempack 16/8/4 blobs (packing=True) or elempack 1.
  On the Vulkan path ncnn 1.0.20261020 packs to elempack 4 whenever the packed
  axis (dims1: w, dims2: h, dims3/4: c) is a multiple of 4, whatever
  use_packing_layout says; the option then only affects the download layout,
  which the Extractor unpacks anyway.
* The Vulkan LayerNorm/RMSNorm return the input unchanged when affine_size is
  0 (CPU normalizes), so pass a real affine_size for Vulkan comparisons.
* ``ncnn.Mat(numpy)`` only wraps the numpy memory (no refcount); fed to an
  in-place layer on the CPU path with lightmode on it crashes the process.
  This module always feeds ``ncnn.Mat(x).clone()``.
* Lifetime: the output Mat is copied to numpy, then the Mat, the Extractor and
  finally the Net are released, in that order.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

import ncnn

__all__ = ["run_ncnn_layer", "vulkan_available", "param_text", "format_eps"]

_OPS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}


def vulkan_available() -> bool:
    """True when pyncnn sees at least one Vulkan device."""
    try:
        return ncnn.get_gpu_count() > 0
    except Exception:  # pragma: no cover - built without Vulkan
        return False


def format_eps(eps: float) -> str:
    """Shortest decimal text that ncnn's param parser turns back into float32(eps)."""
    return np.format_float_scientific(np.float32(eps), unique=True, trim="-")


def _op_name(op: str) -> str:
    key = op.lower()
    if key not in _OPS:
        raise ValueError(f"op must be 'LayerNorm' or 'RMSNorm', got {op!r}")
    return _OPS[key]


def param_text(op: str, affine_size: int, eps: float, affine: int) -> str:
    """ncnn .param text for Input(blob 'in') -> op(blob 'out')."""
    name = _op_name(op)
    return (
        "7767517\n"
        "2 2\n"
        "Input in 0 1 in\n"
        f"{name} norm 1 1 in out 0={int(affine_size)} 1={format_eps(eps)} 2={int(affine)}\n"
    )


def _weights_bytes(op: str, affine_size: int, affine: int, gamma, beta) -> bytes:
    """Raw float32 weights as ModelBin::load(affine_size, 1) reads them."""
    if not affine:
        return b""
    g = np.ones(affine_size, np.float32) if gamma is None else np.asarray(gamma, np.float32).reshape(-1)
    if g.size != affine_size:
        raise ValueError(f"gamma has {g.size} values, affine_size is {affine_size}")
    parts = [g.tobytes()]
    if _op_name(op) == "LayerNorm":
        b = np.zeros(affine_size, np.float32) if beta is None else np.asarray(beta, np.float32).reshape(-1)
        if b.size != affine_size:
            raise ValueError(f"beta has {b.size} values, affine_size is {affine_size}")
        parts.append(b.tobytes())
    return b"".join(parts)


def _set_options(opt, vulkan: bool, fp16: bool, packing: bool, num_threads: int) -> None:
    opt.use_vulkan_compute = bool(vulkan)
    opt.num_threads = int(num_threads)
    opt.use_packing_layout = bool(packing)
    opt.use_bf16_packed = False
    opt.use_bf16_storage = False
    opt.use_fp16_arithmetic = False
    opt.use_fp16_packed = bool(fp16)
    opt.use_fp16_storage = bool(fp16)


def run_ncnn_layer(
    op: str,
    x: np.ndarray,
    affine_size: int,
    eps: float,
    affine: int,
    gamma=None,
    beta=None,
    vulkan: bool = False,
    fp16: bool = False,
    packing: bool = True,
    num_threads: int = 1,
) -> np.ndarray:
    """Run ncnn's LayerNorm or RMSNorm on ``x`` and return float32 output of x's shape.

    op: "LayerNorm" or "RMSNorm" (case-insensitive).
    x: 1-4 dim array in numpy order, (w,), (h, w), (c, h, w) or (c, d, h, w).
    affine_size / eps / affine: ncnn params 0 / 1 / 2.
    gamma / beta: affine_size values each (used only when affine=1; default
        ones / zeros; beta is ignored for RMSNorm).
    vulkan: run on ncnn's Vulkan path (raises RuntimeError if no device).
    fp16: see the module docstring.
    packing: opt.use_packing_layout.
    """
    name = _op_name(op)
    weights = _weights_bytes(name, affine_size, affine, gamma, beta)
    return run_ncnn_param(param_text(name, affine_size, eps, affine), weights, x, vulkan, fp16, packing, num_threads)


def channel_norm_param(op: str, channels: int, eps: float, affine: int, group: int = 1) -> str:
    """ncnn .param text for Input('in') -> GroupNorm / InstanceNorm('out'), with ncnn's param ids."""
    params = (f"0={group} 1={channels} 2={format_eps(eps)} 3={affine}" if op == "GroupNorm"
              else f"0={channels} 1={format_eps(eps)} 2={affine}")
    return f"7767517\n2 2\nInput in 0 1 in\n{op} norm 1 1 in out {params}\n"


def run_ncnn_param(param: str, weights: bytes, x: np.ndarray, vulkan: bool = False, fp16: bool = False,
                   packing: bool = True, num_threads: int = 1) -> np.ndarray:
    """Run a one-layer ncnn model (``param`` text: Input 'in' -> layer -> 'out'; ``weights``: its .bin
    bytes) on ``x`` and return float32 output of x's shape."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not 1 <= x.ndim <= 4:
        raise ValueError(f"x must have 1-4 dims, got shape {x.shape}")
    if vulkan and not vulkan_available():
        raise RuntimeError("ncnn sees no Vulkan device")

    net = ncnn.Net()
    try:
        _set_options(net.opt, vulkan, fp16, packing, num_threads)
        ret = net.load_param_mem(param)
        if ret != 0:
            raise RuntimeError(f"ncnn load_param failed ({ret})")
        if weights:
            with tempfile.TemporaryDirectory(prefix="pyncnn_layer_") as tmp:
                path = os.path.join(tmp, "norm.bin")
                with open(path, "wb") as f:
                    f.write(weights)
                ret = net.load_model(path)
        else:
            ret = net.load_model(ncnn.DataReaderFromEmpty())
        if ret != 0:
            raise RuntimeError(f"ncnn load_model failed ({ret})")

        ex = net.create_extractor()
        try:
            mat_in = ncnn.Mat(x).clone()
            ret = ex.input("in", mat_in)
            if ret != 0:
                raise RuntimeError(f"ncnn extractor input failed ({ret})")
            ret, mat_out = ex.extract("out")
            if ret != 0:
                raise RuntimeError(f"ncnn extract failed ({ret})")
            y = np.array(mat_out, dtype=np.float32, copy=True)
            del mat_out
            del mat_in
        finally:
            del ex
    finally:
        net.clear()
        del net

    if y.shape != x.shape:
        raise RuntimeError(f"ncnn returned shape {y.shape}, expected {x.shape}")
    return y

"""Fusion: a residual add before the norm and an activation after it, in the norm's kernel.

Kernels (vknorm's own runtime): y = act(norm(x + r)) on every path, packing and storage, against float64
of the sum the kernel saw; the written sum is the add's value exactly; the inputs stay as they were.
Graph rewrite (vknorm::ncnn::fuse_param): what fuses, what is left alone, the errors. ncnn graphs:
every committed model fused and unfused against ncnn's CPU run; a broadcasting add met at run time is
left to ncnn's BinaryOp; fused models in CPU nets; the fused types refused by stock nets; `vknorm optimize`.

Tolerances: against float64 of the sum the kernel normalized (float16 storage: that sum as float16), the storage
rule (reference.storage_rule): float32, 1e-5 relative to max(1, max|y|) (a few float32 roundings of the normalize,
the activation's own error < 2e-7); float16, what the output's rounding to float16 cannot explain within the same.
Against ncnn's float32 CPU run of float32 inputs (the graph tests), float16 storage: 4e-3 relative (FP16_TOL: one
float16 output rounding, 2^-11, plus the float16 roundings of the inputs and the sum, scaled by |x| / std, which
that reference never saw, so not the storage rule).
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import graph_runs
from availability import has_graph, needs_graph, needs_vulkan
from reference import FP16_TOL, FP32_TOL, storage_rule

import vknorm

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
MODELS = {k: v for k, v in json.loads((DATA / "models.json").read_text()).items() if not k.startswith("_")}

pytestmark = [needs_vulkan, pytest.mark.timeout(600)]

ACTS = ["none", "relu", "leakyrelu", "sigmoid", "swish", "gelu", "gelu_fast"]


def act64(y, name, alpha=0.1):
    with np.errstate(all="ignore"):
        if name == "relu":
            return np.where(y < 0, 0.0, y)
        if name == "leakyrelu":
            return np.where(y < 0, y * alpha, y)
        if name == "sigmoid":
            return 1 / (1 + np.exp(-y))
        if name == "swish":
            return y / (1 + np.exp(-y))
        if name == "gelu":
            return 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
        if name == "gelu_fast":
            return 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    return y


def norm64(x, op, gamma, beta, group=None, eps=1e-5):
    """float64 LayerNorm / RMSNorm over the last axis, GroupNorm over (c, h, w) in `group` groups."""
    x = np.asarray(x, np.float64)
    if op == "groupnorm":
        c = x.shape[0]
        g = x.reshape(group, -1)
        y = ((g - g.mean(1, keepdims=True)) / np.sqrt(g.var(1, keepdims=True) + eps)).reshape(c, -1)
        return (y * gamma[:, None] + beta[:, None]).reshape(x.shape)
    if op == "layernorm":
        y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
        return y * gamma + beta
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gamma


def make_layer(op, shape, rng):
    if op == "groupnorm":
        c = shape[0]
        layer = vknorm.GroupNorm(group=4 if c % 4 == 0 else 2, channels=c, eps=1e-5)
        gamma, beta = 1 + 0.2 * rng.standard_normal(c), 0.2 * rng.standard_normal(c)
        layer.load_model(gamma, beta)
        return layer, gamma, beta, layer._layer.group
    w = shape[-1]
    gamma, beta = 1 + 0.2 * rng.standard_normal(w), 0.2 * rng.standard_normal(w)
    if op == "layernorm":
        layer = vknorm.LayerNorm(affine_size=w, eps=1e-5)
        layer.load_model(gamma, beta)
    else:
        layer = vknorm.RMSNorm(affine_size=w, eps=1e-5)
        layer.load_model(gamma)
        beta = np.zeros(w)
    return layer, gamma, beta, None


# ------------------------------------------------------------------------------------------ the kernels

CASES = [  # op, shape, path
    ("layernorm", (24, 768), "auto"), ("layernorm", (24, 768), "subgroup"), ("layernorm", (8, 6, 40), "workgroup"),
    ("layernorm", (4, 8192), "split"), ("rmsnorm", (16, 64), "auto"), ("rmsnorm", (4, 3000), "split"),
    ("groupnorm", (12, 7, 7), "auto"), ("groupnorm", (20, 16, 16), "split"), ("groupnorm", (16, 9, 9), "auto"),
]


@pytest.mark.parametrize("write_sum", [False, True], ids=["add", "add+sum"])
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("packing", [True, False], ids=["pack4", "pack1"])
@pytest.mark.parametrize("op,shape,path", CASES, ids=[f"{o}-{'x'.join(map(str, s))}-{p}" for o, s, p in CASES])
def test_fused_add_on_every_path(op, shape, path, packing, fp16, write_sum):
    rng = np.random.default_rng(len(shape) * 7 + shape[-1])
    layer, gamma, beta, group = make_layer(op, shape, rng)
    layer.set_activation("swish")
    x = (3 + rng.standard_normal(shape)).astype(np.float32)
    r = rng.standard_normal(shape).astype(np.float32)
    x0, r0 = x.copy(), r.copy()
    opt = vknorm.Option(use_fp16_storage=fp16, use_packing_layout=packing, path=path)
    out = layer.forward_add(x, r, return_sum=write_sum, option=opt)
    y, s = out if write_sum else (out, None)
    assert np.array_equal(x, x0) and np.array_equal(r, r0)
    # What the kernel normalized: the add as ncnn stores it (float16 storage: rounded to float16).
    if fp16:
        x16, r16 = x.astype(np.float16).astype(np.float32), r.astype(np.float16).astype(np.float32)
        seen = (x16 + r16).astype(np.float16).astype(np.float32)
    else:
        seen = x + r
    ref = act64(norm64(seen, op, gamma, beta, group), "swish")
    err, bound = storage_rule(y, ref, fp16)
    assert err <= bound, (err, bound)
    if write_sum:
        assert np.array_equal(s.astype(np.float32), seen)  # the add's value, bit for bit
    if path == "split":
        assert layer.last_dispatch["path"] == "split"  # reduce (writes the sum) and apply (reads it)


@pytest.mark.parametrize("write_sum", [False, True], ids=["add", "add+sum"])
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", [(40, 6, 6), (24, 5, 5), (120, 3, 3)], ids=lambda s: "x".join(map(str, s)))
def test_fused_add_with_groups_inside_pack4_lanes_in_items_of_their_own(shape, fp16, write_sum, monkeypatch):
    """GroupNorm(4) of 10, 6 and 30 channels per group in pack4, each group an item of its own (forced from 2
    channels per group on any device) in the fused kernel's vec4 variant: the sum and the output written in
    halves of the elements the two groups share, each exactly as the whole-element stores would write them."""
    monkeypatch.setenv("VKNORM_TUNE_LANE_GROUPS", "2")
    rng = np.random.default_rng(shape[0])
    layer, gamma, beta, group = make_layer("groupnorm", shape, rng)
    layer.set_activation("swish")
    x = (3 + rng.standard_normal(shape)).astype(np.float32)
    r = rng.standard_normal(shape).astype(np.float32)
    out = layer.forward_add(x, r, return_sum=write_sum, option=vknorm.Option(use_fp16_storage=fp16))
    assert layer.last_dispatch["lane_groups"] is True, layer.last_dispatch
    assert layer.last_dispatch["vec4"] is True, layer.last_dispatch
    y, s = out if write_sum else (out, None)
    as_stored = (lambda a: a.astype(np.float16).astype(np.float32)) if fp16 else (lambda a: a)  # noqa: E731
    seen = as_stored(as_stored(x) + as_stored(r))
    ref = act64(norm64(seen, "groupnorm", gamma, beta, group), "swish")
    err, bound = storage_rule(y, ref, fp16)
    assert err <= bound, (err, bound)
    if write_sum:
        assert np.array_equal(s.astype(np.float32), seen)


@pytest.mark.parametrize("packing", [True, False], ids=["pack4", "pack1"])
@pytest.mark.parametrize("path", ["auto", "subgroup", "workgroup", "split", "cooperative"])
def test_float16_fused_add_normalizes_the_sum_as_the_add_layer_stores_it(path, packing):
    """float16 storage: the norm reads x + r rounded to float16, as ncnn's BinaryOp would have stored it, not the
    float32 sum. Around 700 the float16 spacing is 0.5, so that rounding moves an element by up to 0.25 against a
    group std of ~2.8: ~0.09 in y, far above what the layer itself may add. Rows of 250 (not a multiple of 4:
    scalar float16 loads in pack1) and 8 rows (two pack4 elements). Tolerance: the storage rule against float64 of
    the float16-rounded sum (what the output's rounding to float16 cannot explain within 1e-5 of the output scale)."""
    rng = np.random.default_rng(21)
    layer, gamma, beta, _ = make_layer("layernorm", (8, 250), rng)
    x = (700 + 2 * rng.standard_normal((8, 250))).astype(np.float32)
    r = (2 * rng.standard_normal((8, 250))).astype(np.float32)
    as_stored = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    seen = as_stored(as_stored(x) + as_stored(r))
    ref = norm64(seen, "layernorm", gamma, beta)
    unrounded = norm64(as_stored(x) + as_stored(r), "layernorm", gamma, beta)
    assert float(np.abs(unrounded - ref).max()) > 0.02  # the case tells the two sums apart
    opt = vknorm.Option(use_fp16_storage=True, use_packing_layout=packing, path=path)
    y = layer.forward_add(x, r, option=opt).astype(np.float64)
    err, bound = storage_rule(y, ref, True)
    assert err <= bound, (layer.last_dispatch["path"], err, bound)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("act", ACTS)
def test_activation_matches_ncnn_cpu_formula_and_float64(act, fp16):
    rng = np.random.default_rng(3)
    layer, gamma, beta, _ = make_layer("layernorm", (33, 256), rng)
    layer.set_activation(act, 0.1 if act == "leakyrelu" else 0.0)
    assert layer.activation == act
    x = (rng.standard_normal((33, 256)) * 2).astype(np.float32)
    y = layer(x, option=vknorm.Option(use_fp16_storage=fp16))
    cpu = layer(x, device="cpu")  # ncnn's CPU formulas (erfc GELU, tanh fast GELU)
    xin = x.astype(np.float16).astype(np.float32) if fp16 else x
    ref = act64(norm64(xin, "layernorm", gamma, beta), act)
    err, bound = storage_rule(y, ref, fp16)
    assert err <= bound, (err, bound)
    assert float(np.abs(cpu - act64(norm64(x, "layernorm", gamma, beta), act)).max()) <= FP32_TOL * float(np.abs(ref).max())


def test_relu_with_a_slope_is_the_leaky_one_and_only_the_relus_take_a_slope():
    """As ncnn's ReLU 0=slope: a slope given to relu is kept (not dropped); an alpha for an activation without
    one is refused rather than ignored."""
    layer = vknorm.LayerNorm(affine_size=16, eps=1e-5, affine=False)
    x = np.random.default_rng(5).standard_normal((4, 16)).astype(np.float32)
    layer.set_activation("relu", 0.5)
    assert layer.activation == "leakyrelu"
    ref = act64(norm64(x, "layernorm", np.ones(16), np.zeros(16)), "leakyrelu", alpha=0.5)
    err, bound = storage_rule(layer(x), ref, False)
    assert err <= bound and float(ref.min()) < -0.1, (err, bound)  # negative outputs kept, at half their value
    for act in ("sigmoid", "swish", "gelu", "gelu_fast", None):
        with pytest.raises(ValueError, match="takes no alpha"):
            layer.set_activation(act, 0.5)
    assert layer.activation == "leakyrelu"  # a refused call changes nothing


def test_activation_keeps_inf_and_nan_as_ncnn_cpu():
    """On every path. ReLU's compare became max(v, 0) on NVIDIA's compiler, which turned NaN into 0."""
    layer = vknorm.LayerNorm(affine_size=8, eps=1e-5, affine=False)
    x = np.zeros((3, 8), np.float32)
    x[0] = np.arange(8)
    x[1, 2] = np.nan
    x[2] = np.arange(8) * 1e30
    for act in ("gelu", "gelu_fast", "swish", "sigmoid", "relu", "leakyrelu"):
        layer.set_activation(act, 0.1 if act == "leakyrelu" else 0.0)
        cpu = layer(x, device="cpu")
        for path in ("auto", "subgroup", "workgroup", "split", "cooperative"):
            y = layer(x, option=vknorm.Option(path=path))
            assert np.isnan(y[1]).all() and np.isnan(cpu[1]).all(), (act, path)
            np.testing.assert_allclose(y[[0, 2]], cpu[[0, 2]], rtol=1e-5, atol=1e-6, err_msg=f"{act} {path}")


def test_relu_of_an_output_overflowing_to_minus_inf_is_zero_as_ncnn_cpu():
    """gamma 3e38 takes every |normalized value| past 1.2 beyond float32's range: -Inf below 0, +Inf above. ReLU
    gives 0 for -Inf (it is below zero), +Inf stays, leaky ReLU gives -Inf; on every path, as ncnn's CPU layers."""
    layer = vknorm.LayerNorm(affine_size=8, eps=1e-5)
    layer.load_model(np.full(8, 3e38, np.float32), np.zeros(8, np.float32))
    x = np.tile(np.arange(8, dtype=np.float32), (4, 1))  # normalized: -1.53 .. 1.53
    for act, want_low in (("relu", 0.0), ("leakyrelu", -np.inf)):
        layer.set_activation(act, 0.1 if act == "leakyrelu" else 0.0)
        cpu = layer(x, device="cpu")
        assert (cpu[:, 0] == want_low).all() and (cpu[:, -1] == np.inf).all(), (act, cpu[0])
        for path in ("auto", "subgroup", "workgroup", "split", "cooperative"):
            y = layer(x, option=vknorm.Option(path=path))
            np.testing.assert_array_equal(np.isinf(y), np.isinf(cpu), err_msg=f"{act} {path}")
            np.testing.assert_array_equal(y[np.isinf(cpu)], cpu[np.isinf(cpu)], err_msg=f"{act} {path}")
            np.testing.assert_array_equal(y[:, 0], cpu[:, 0], err_msg=f"{act} {path}")


def test_sigmoid_of_outputs_past_exps_range_is_0_or_1_as_ncnn_cpu():
    """Normalized outputs times gamma 1000 (|v| from 218 to 1528, where exp(|v|) overflows float32) and 3e38 (+-Inf):
    sigmoid gives 0 below zero and 1 above on every path, as ncnn's CPU formula 1 / (1 + exp(-v)) does, never
    Inf / Inf = NaN. Exact: 0 and 1 are what float32 rounds sigmoid to there."""
    x = np.tile(np.arange(8, dtype=np.float32), (4, 1))  # normalized: -1.53 .. 1.53
    for g in (1000.0, 3e38):
        layer = vknorm.LayerNorm(affine_size=8, eps=1e-5)
        layer.load_model(np.full(8, g, np.float32), np.zeros(8, np.float32))
        layer.set_activation("sigmoid")
        cpu = layer(x, device="cpu")
        np.testing.assert_array_equal(cpu, np.where(np.arange(8) < 4, 0.0, 1.0)[None, :].repeat(4, 0))
        for path in ("auto", "subgroup", "workgroup", "split", "cooperative"):
            for fp16 in (False, True):
                y = layer(x, option=vknorm.Option(path=path, use_fp16_storage=fp16))
                np.testing.assert_array_equal(y, cpu, err_msg=f"gamma {g} {path} fp16={fp16}")


def test_forward_add_refuses_what_it_cannot_fuse():
    layer = vknorm.LayerNorm(affine_size=16, eps=1e-5)
    layer.load_model(np.ones(16), np.zeros(16))
    with pytest.raises(ValueError, match="differ in shape"):
        layer.forward_add(np.zeros((4, 16), np.float32), np.zeros((16,), np.float32))
    a = vknorm.to_device(np.zeros((4, 16), np.float32))
    b = vknorm.to_device(np.zeros((8, 16), np.float32))
    # ncnn's packed extents, and the shapes as numpy gives them (VkMat.shape)
    with pytest.raises(ValueError, match=r"x \(dims=2 w=16 h=1 .*, shape \(4, 16\)\) and residual \(dims=2 w=16 h=2 "
                                         r".*, shape \(8, 16\)\) differ in shape, packing or storage"):
        layer.forward_add(a, b)
    with pytest.raises(ValueError, match="activation 'tanh'"):
        layer.set_activation("tanh")


def test_forward_add_refuses_blobs_past_one_binding_as_the_norms_plan_it(monkeypatch):
    # VKNORM_MAX_BUFFER_BYTES makes storage buffers look that small: a norm then runs in pieces, but the fused add
    # takes none, so a blob past it is refused by name (numpy and VkMats alike), not bound past the limit.
    layer = vknorm.LayerNorm(affine_size=1000, eps=1e-5)
    layer.load_model(np.ones(1000), np.zeros(1000))
    x = np.random.default_rng(8).standard_normal((8, 1000)).astype(np.float32)  # 32000 bytes
    vx, vr = vknorm.to_device(x), vknorm.to_device(x)
    monkeypatch.setenv("VKNORM_MAX_BUFFER_BYTES", "16384")
    with pytest.raises(ValueError, match=r"32000 bytes exceed one storage buffer \(16384 bytes, VKNORM_MAX_BUFFER_BYTES\)"):
        layer.forward_add(x, x)
    with pytest.raises(ValueError, match=r"exceed one storage buffer \(16384 bytes, VKNORM_MAX_BUFFER_BYTES\)"):
        layer.forward_add(vx, vr)
    y = layer(x)  # the norm alone: in pieces
    assert layer.last_dispatch["pieces"] > 1
    ref = norm64(x, "layernorm", np.ones(1000), np.zeros(1000))
    assert float(np.abs(y - ref).max()) <= FP32_TOL * max(1.0, float(np.abs(ref).max()))


def test_forward_add_on_vkmats_stays_on_the_device():
    rng = np.random.default_rng(5)
    layer, gamma, beta, _ = make_layer("layernorm", (64, 512), rng)
    x, r = rng.standard_normal((64, 512)).astype(np.float32), rng.standard_normal((64, 512)).astype(np.float32)
    vx, vr = vknorm.to_device(x), vknorm.to_device(r)
    y, s = layer.forward_add(vx, vr, return_sum=True)
    assert isinstance(y, vknorm._core.VkMat) and isinstance(s, vknorm._core.VkMat)
    got = y.download().convert_packing(1).numpy().reshape(64, 512)
    ref = norm64(x + r, "layernorm", gamma, beta)
    assert float(np.abs(got - ref).max()) <= FP32_TOL * max(1.0, float(np.abs(ref).max()))
    assert np.array_equal(s.download().convert_packing(1).numpy().reshape(64, 512), x + r)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("packing", [True, False], ids=["pack4", "pack1"])
def test_forward_add_on_numpy_gives_what_it_gives_on_vkmats(packing, fp16):
    # One kernel either way: the numpy call (one submission, arrays read in place) must match bit for bit.
    rng = np.random.default_rng(6)
    layer, _, _, _ = make_layer("groupnorm", (12, 5, 7), rng)
    layer.set_activation("gelu")
    opt = vknorm.Option(use_fp16_storage=fp16, use_packing_layout=packing)
    x, r = rng.standard_normal((12, 5, 7)).astype(np.float32), rng.standard_normal((12, 5, 7)).astype(np.float32)
    y, s = layer.forward_add(x, r, return_sum=True, option=opt)
    vy, vs = layer.forward_add(vknorm.to_device(x, opt), vknorm.to_device(r, opt), return_sum=True, option=opt)
    assert y.dtype == s.dtype == np.float32 and y.shape == s.shape == (12, 5, 7)
    assert np.array_equal(y, vy.numpy(np.float32).reshape(12, 5, 7))
    assert np.array_equal(s, vs.numpy(np.float32).reshape(12, 5, 7))
    assert np.array_equal(layer.forward_add(x, r, option=opt), y)  # without the sum: the same y


def test_forward_add_on_numpy_of_two_float_types_returns_x_s_type():
    rng = np.random.default_rng(7)
    layer, gamma, beta, _ = make_layer("layernorm", (6, 32), rng)
    x16 = rng.standard_normal((6, 32)).astype(np.float16)
    r32 = rng.standard_normal((6, 32)).astype(np.float32)
    y, s = layer.forward_add(x16, r32, return_sum=True)
    assert y.dtype == s.dtype == np.float16
    seen = x16.astype(np.float32) + r32  # float32 storage: the residual is not rounded before the add
    assert np.array_equal(s, seen.astype(np.float16))
    ref = norm64(seen, "layernorm", gamma, beta)
    # float16 results: half an ulp of float16 (2^-11 relative) at the output scale, and the kernel's float32 error
    assert float(np.abs(y.astype(np.float64) - ref).max()) <= 2 ** -11 * float(np.abs(ref).max()) + 1e-5


@pytest.mark.parametrize("device", ["cpu", "vulkan"])
def test_forward_add_of_float16_arrays_rounds_the_float32_sum_and_norm_as_its_storage_says(device):
    """float32 storage (the default): the add and the norm in float32, both results rounded to float16 after, a sum
    past float16's range +-Inf beside the finite norm of the float32 sum (no numpy overflow warning); float16
    storage normalizes the float16 sum, as ncnn's graph stores it: NaN for that group."""
    import warnings

    x = np.array([[40000, 40000, 40000, 1000], [1, 2, 3, 4]], np.float16)
    ln = vknorm.LayerNorm(4, eps=1e-5, affine=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, s = ln.forward_add(x, x, return_sum=True, device=device)
    seen = x.astype(np.float32) * 2
    with np.errstate(over="ignore"):
        assert np.array_equal(s, seen.astype(np.float16)) and np.isinf(s[0, :3]).all()
    ref = norm64(seen, "layernorm", 1.0, 0.0)
    assert float(np.abs(y.astype(np.float64) - ref).max()) <= 2 ** -11 * 2 + 1e-5
    if device == "vulkan":
        fp16 = vknorm.Option()
        fp16.use_fp16_storage = True
        y16, s16 = ln.forward_add(x, x, return_sum=True, option=fp16)
        assert np.array_equal(s16, s) and np.isnan(y16[0]).all()
        assert float(np.abs(y16[1].astype(np.float64) - ref[1]).max()) <= 2 ** -11 * 2 + 1e-5


# -------------------------------------------------------------------------------------- the graph rewrite

if has_graph():  # the rewrite's tests need it; the module's others do not
    import vknorm.graph as graph
else:
    graph = None


def fuse(text: str):
    return graph._graph.fuse_param(text)


def lines_of(text: str):
    return [ln.split() for ln in text.splitlines()[2:]]


# What each committed model fuses (read off its .param by hand).
EXPECTED_FUSED = {
    # a Split between add and norm that fusion leaves with one top is gone, named in the pattern
    "transformer_block": ["BinaryOp+Split+LayerNorm", "BinaryOp+LayerNorm"],
    "llama_block": ["BinaryOp+Split+RMSNorm"],
    "ln_residual_stack": ["LayerNorm+GELU"] + ["BinaryOp+Split+LayerNorm+GELU"] * 11,
    "sd_resblock": ["GroupNorm+Swish"] * 2,
    "sd_resblock_c320": ["GroupNorm+Swish"] * 2,
    "instnorm_block": ["InstanceNorm+ReLU"],
    "instnorm_noaffine": ["InstanceNorm+ReLU"],
}


@needs_graph
@pytest.mark.parametrize("name", list(MODELS))
def test_committed_models_fuse_as_read_by_hand(name):
    text = (DATA / f"{name}.ncnn.param").read_text()
    fused_text, fused = fuse(text)
    assert [f["pattern"] for f in fused] == EXPECTED_FUSED.get(name, [])
    head = fused_text.splitlines()[1].split()
    rows = lines_of(fused_text)
    assert int(head[0]) == len(rows)
    assert int(head[1]) == len({b for t in rows for b in t[4:4 + int(t[2]) + int(t[3])]})
    # every blob read is produced earlier; weights keep their order (the norms' names, in order)
    made = set()
    for t in rows:
        nb, nt = int(t[2]), int(t[3])
        assert set(t[4:4 + nb]) <= made, t
        made |= set(t[4 + nb:4 + nb + nt])
    norm = lambda rs: [t[1] for t in rs if t[0].split(".")[-1] in ("LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm")]
    assert norm(rows) == norm(lines_of(text))


def test_split_read_before_the_norm_is_left_unfused_and_one_reader_split_goes():
    text = ("7767517\n7 9\nInput in0 0 1 a\nInput in1 0 1 b\nBinaryOp add 2 1 a b s 0=0\n"
            "Split sp 1 2 s s1 s2\nSigmoid early 1 1 s1 e\nLayerNorm ln 1 1 s2 y 0=8 1=1e-05 2=0\n"
            "ReLU act 1 1 y out 0=1.000000e-01\n")
    out, fused = fuse(text)
    # the Split's other output is read before the norm: the add stays, the activation fuses
    assert [f["pattern"] for f in fused] == ["LayerNorm+ReLU"]
    assert any(t[0] == "BinaryOp" for t in lines_of(out))
    ln = next(t for t in lines_of(out) if t[1] == "ln")
    assert ln[0] == "vknorm.LayerNorm" and "9=2" in ln and any(p.startswith("-23310=1,1.0") for p in ln)
    text2 = text.replace("Sigmoid early 1 1 s1 e\nLayerNorm ln 1 1 s2 y", "LayerNorm ln 1 1 s2 y").replace(
        "ReLU act 1 1 y out 0=1.000000e-01\n", "ReLU act 1 1 y out 0=1.000000e-01\nSigmoid late 1 1 s1 e\n")
    out2, fused2 = fuse(text2)
    assert [f["pattern"] for f in fused2] == ["BinaryOp+Split+LayerNorm+ReLU"]
    assert fused2[0]["layers"] == ["add", "sp", "ln", "act"]
    rows = lines_of(out2)
    # the Split of one is gone: the fused layer writes the sum under the name of the Split's other output
    assert [t[0] for t in rows] == ["Input", "Input", "vknorm.LayerNorm", "Sigmoid"]
    assert rows[2][4:8] == ["a", "b", "out", "s1"] and "20=2" in rows[2] and rows[3][4] == "s1"


@needs_graph
def test_two_norms_reading_one_sum_through_a_split_fuse_the_add_once():
    """add -> Split -> two norms: the add joins the first norm, which writes the sum under the Split's other
    output; the second norm reads that sum as it is (it is no add's output any more), so the add runs once and
    no blob is left that nothing reads."""
    text = ("7767517\n6 8\nInput in0 0 1 a\nInput in1 0 1 b\nBinaryOp add 2 1 a b s 0=0\n"
            "Split sp 1 2 s s1 s2\nLayerNorm ln1 1 1 s1 out0 0=8 1=1e-05 2=0\n"
            "LayerNorm ln2 1 1 s2 out1 0=8 1=1e-05 2=0\n")
    out, fused = fuse(text)
    assert fused == [{"pattern": "BinaryOp+Split+LayerNorm", "layers": ["add", "sp", "ln1"]}]  # the Split is gone
    rows = lines_of(out)
    assert [t[1] for t in rows] == ["in0", "in1", "ln1", "ln2"]
    assert rows[2][0] == "vknorm.LayerNorm" and rows[2][4:8] == ["a", "b", "out0", "s2"] and "20=2" in rows[2]
    assert rows[3][0] == "LayerNorm" and rows[3][4:6] == ["s2", "out1"]


@needs_graph
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_a_model_output_beside_the_norm_keeps_its_name(tmp_path, fp16):
    """pnnx writes a blob that is both a model output and a norm's input as a Split whose second output no
    layer reads: fused, the layer writes the sum under that output's name, still extractable (it was lost)."""
    text = ("7767517\n5 6\nInput in0 0 1 in0\nInput in1 0 1 in1\nBinaryOp add 2 1 in0 in1 s 0=0\n"
            "Split sp 1 2 s t1 out1\nLayerNorm ln 1 1 t1 out0 0=64 1=1e-05 2=0\n")
    out, fused = fuse(text)
    assert [f["pattern"] for f in fused] == ["BinaryOp+Split+LayerNorm"]
    assert lines_of(out)[-1][:8] == ["vknorm.LayerNorm", "ln", "2", "2", "in0", "in1", "out0", "out1"]
    p, b = write_model(tmp_path, text)
    rng = np.random.default_rng(5)
    inputs = {k: rng.standard_normal((16, 64)).astype(np.float32) for k in ("in0", "in1")}
    ref = run_graph(p, b, inputs, vknorm_layers=False, vulkan=False, outputs=("out0", "out1"))[0]
    got, net = run_graph(p, b, inputs, fp16=fp16, outputs=("out0", "out1"))
    assert len(net.fused()) == 1
    if fp16:  # both within FP16_TOL of their scale: ref is ncnn's CPU float32 run of the unrounded float32 inputs
        for k in ("out0", "out1"):
            assert float(np.abs(got[k] - ref[k]).max()) <= FP16_TOL * max(1.0, float(np.abs(ref[k]).max())), k
    else:  # the sum bit for bit as ncnn's add
        assert np.array_equal(got["out1"], ref["out1"])
        assert float(np.abs(got["out0"] - ref["out0"]).max()) <= FP32_TOL * max(1.0, float(np.abs(ref["out0"]).max()))


@needs_graph
def test_a_fused_net_lists_its_outputs_in_the_models_order(tmp_path):
    """The fused layer's tops come norm first, then the sum; output_names() and output_indexes() still give the
    model's order, as Net(fuse=False) and stock ncnn do, so code taking outputs by position gets the same blobs."""
    text = ("7767517\n5 6\nInput in0 0 1 in0\nInput in1 0 1 in1\nBinaryOp add 2 1 in0 in1 s 0=0\n"
            "Split sp 1 2 s t1 out1\nLayerNorm ln 1 1 t1 out0 0=64 1=1e-05 2=0\n")
    p, b = write_model(tmp_path, text)
    nets = {}
    for label, kw in (("stock", dict(vknorm=False)), ("unfused", dict(fuse=False)), ("fused", {})):
        nets[label] = graph.Net(**kw)
        assert nets[label].load_param(str(p)) == 0
    assert len(nets["fused"].fused()) == 1
    for label, net in nets.items():
        assert (net.input_names(), net.output_names()) == (["in0", "in1"], ["out1", "out0"]), label
        assert (list(net.input_indexes()), list(net.output_indexes())) == ([0, 1], [4, 5]), label


@needs_graph
def test_a_blob_inside_a_fused_pattern_can_be_neither_set_nor_extracted_and_the_log_says_why(tmp_path):
    """The add's output and the norm's output before its activation are gone from a fused net: input() and
    extract() of them are -1 with the reason, where a name the model never had gets no word about fusion."""
    from vknorm._stdio import quiet_stderr

    p, b = write_model(tmp_path, "7767517\n5 5\nInput in0 0 1 a\nInput in1 0 1 r\nBinaryOp add 2 1 a r s 0=0\n"
                       "LayerNorm ln 1 1 s n 0=64 1=1e-05 2=0\nSwish act 1 1 n out0\n")
    net = graph.Net()
    assert net.load_param(str(p)) == 0 and net.load_model(str(b)) == 0
    assert [f["pattern"] for f in net.fused()] == ["BinaryOp+LayerNorm+Swish"]
    x = graph.Mat(np.ones((4, 64), np.float32))
    for name in ("s", "n"):
        ex = net.create_extractor()
        log: list = []
        with quiet_stderr(log):
            assert ex.input(name, x) == -1
            assert ex.extract(name)[0] == -1
        assert any(f"Extractor.input {name}: the model's blob, inside a fused pattern, is not in the fused net" in ln
                   for ln in log), log
        assert any(f"extract {name}: the net has no blob of that name (the model's, inside a fused pattern" in ln
                   for ln in log), log
    ex = net.create_extractor()
    log = []
    with quiet_stderr(log):
        assert ex.extract("out_0")[0] == -1
    assert any("extract out_0: the net has no blob of that name" in ln for ln in log), log
    assert not any("fused" in ln for ln in log), log


@needs_graph
@pytest.mark.parametrize("vulkan", [True, False], ids=["vulkan", "cpu"])
def test_a_sum_given_with_input_and_freed_is_not_made_again_by_the_fused_layer(tmp_path, vulkan):
    """The add's output s, read by the norm through a Split, set with input(): once light mode freed it, the
    fused layer (which writes s) would normalize the upstream sum instead of the value given. An extract that
    needs it is -1 with the reason, as in an extractor where s is still held; before that, the other readers of
    s get the value given."""
    from vknorm._stdio import quiet_stderr

    p, b = write_model(tmp_path, "7767517\n7 9\nInput in0 0 1 a\nInput in1 0 1 r\nBinaryOp add 2 1 a r s 0=0\n"
                       "Split sp 1 3 s s1 s2 s3\nLayerNorm ln 1 1 s1 out0 0=64 1=1e-05 2=0\n"
                       "Sigmoid sg 1 1 s2 out1\nTanH th 1 1 s3 out2\n")
    rng = np.random.default_rng(7)
    a, r = (rng.standard_normal((16, 64)).astype(np.float32) for _ in range(2))
    given = (3 + 2 * rng.standard_normal((16, 64))).astype(np.float32)
    net = graph.configure(graph.Net(), vulkan=vulkan)
    assert net.load_param(str(p)) == 0 and net.load_model(str(b)) == 0
    assert [f["pattern"] for f in net.fused()] == ["BinaryOp+LayerNorm"]  # the Split stays, for sg and th
    ex = net.create_extractor()
    for name, m in (("a", a), ("r", r), ("s", given)):
        assert ex.input(name, graph.Mat(m)) == 0
    ret, out1 = ex.extract("out1")
    assert ret == 0
    want = 1 / (1 + np.exp(-given.astype(np.float64)))
    assert float(np.abs(np.array(out1) - want).max()) <= 1e-3  # (ncnn's Vulkan sigmoid's own accuracy)
    log: list = []
    with quiet_stderr(log):
        assert ex.extract("out0")[0] == -1
        assert ex.extract("s")[0] == -1
    assert any("would overwrite blob s, set with input()" in ln for ln in log), log


@needs_graph
def test_shape_hints_follow_the_tops_they_describe(tmp_path):
    """ncnnoptimize and pnnx write shape hints (-23330=n,...: one run of values per top); ncnn refuses a model
    whose hints do not divide among a layer's tops. The fused layer gets the norm's run for each of its tops
    (its output and the sum); a Split kept behind it loses the run of the top the norm read."""
    w, h = 16, 6
    hint = f"-23330=4,2,{w},{h},1"
    text = (f"7767517\n7 9\nInput in0 0 1 a 0={w} 1={h} {hint}\nInput in1 0 1 r 0={w} 1={h} {hint}\n"
            f"BinaryOp add 2 1 a r s 0=0 {hint}\n"
            f"Split sp 1 3 s s1 s2 s3 -23330=12,2,{w},{h},1,2,{w},{h},1,2,{w},{h},1\n"
            f"LayerNorm ln 1 1 s1 y 0={w} 1=1e-5 2=0 {hint}\nBinaryOp add2 2 1 y s2 out0 0=0 {hint}\n"
            f"BinaryOp add3 2 1 s3 out0 out1 0=0 {hint}\n")
    out, fused = fuse(text)
    assert [f["pattern"] for f in fused] == ["BinaryOp+LayerNorm"]
    rows = {t[1]: t for t in lines_of(out)}
    assert rows["ln"][6:8] == ["y", "s"] and f"-23330=8,2,{w},{h},1,2,{w},{h},1" in rows["ln"]
    assert rows["sp"][5:7] == ["s2", "s3"] and f"-23330=8,2,{w},{h},1,2,{w},{h},1" in rows["sp"]
    p, b = write_model(tmp_path, text)
    rng = np.random.default_rng(7)
    inputs = {k: rng.standard_normal((h, w)).astype(np.float32) for k in ("a", "r")}
    ref = run_graph(p, b, inputs, vknorm_layers=False, vulkan=False, outputs=("out1",))[0]["out1"]
    got, net = run_graph(p, b, inputs, outputs=("out1",))
    assert len(net.fused()) == 1
    assert float(np.abs(got["out1"] - ref).max()) <= FP32_TOL * max(1.0, float(np.abs(ref).max()))


@pytest.mark.parametrize("line", ["GELU g 1 1 y out0 0=1.0", "ReLU g 1 1 y out0 0=slope"])
def test_an_activation_param_ncnn_reads_its_own_way_is_left_unfused(line):
    """ncnn loads an integer param written as a float (GELU 0=1.0) or a garbled number its own way; the
    rewrite does not guess: the activation stays a layer of its own (the model loads as without vknorm)."""
    out, fused = fuse("7767517\n3 3\nInput in0 0 1 a\nLayerNorm ln 1 1 a y 0=8 1=1e-5 2=0\n" + line + "\n")
    assert fused == [] and [t[0] for t in lines_of(out)] == ["Input", "LayerNorm", line.split()[0]]


@needs_graph
def test_layer_names_of_any_length_survive_the_rewrite(tmp_path):
    """ncnn reads names of up to 255 characters; the rewritten param keeps every one whole."""
    long_in, long_ln = "input_" + "x" * 200, "/encoder/layers.0/self_attn_layer_norm/" + "LayerNormalization" * 11
    text = (f"7767517\n3 3\nInput {long_in} 0 1 in0\nLayerNorm {long_ln} 1 1 in0 y 0=64 1=1e-05 2=0\n"
            "GELU gelu 1 1 y out0\n")
    out, fused = fuse(text)
    assert fused == [{"pattern": "LayerNorm+GELU", "layers": [long_ln, "gelu"]}]
    assert [t[1] for t in lines_of(out)] == [long_in, long_ln]
    p, b = write_model(tmp_path, text)
    x = np.random.default_rng(6).standard_normal((4, 64)).astype(np.float32)
    ref = run_graph(p, b, {"in0": x}, vknorm_layers=False, vulkan=False)[0]["out0"]
    got = run_graph(p, b, {"in0": x})[0]["out0"]
    assert float(np.abs(got - ref).max()) <= FP32_TOL * max(1.0, float(np.abs(ref).max()))


@pytest.mark.parametrize("add_line", [
    "BinaryOp add 1 1 a s 0=0 1=1 2=1.0",  # a scalar add
    "BinaryOp add 2 1 a b s 0=2",         # a multiply
    "BinaryOp add 2 1 a b s 0=0,0",       # an array where ncnn reads an int: it takes its default, not the array
    "BinaryOp add 2 1 a b s 0=0x0",       # a value ncnn cannot read: ncnn refuses the line, fused or not
])
def test_adds_that_are_not_plain_stay(add_line):
    nin = 1 if " 1 1 " in add_line else 2
    text = (f"7767517\n{3 + (nin == 2)} 5\nInput in0 0 1 a\n" + ("Input in1 0 1 b\n" if nin == 2 else "")
            + f"{add_line}\nLayerNorm ln 1 1 s y 0=8 1=1e-05 2=0\n")
    out, fused = fuse(text)
    assert fused == [] and [t[0] for t in lines_of(out)][-2:] == ["BinaryOp", "LayerNorm"]


@pytest.mark.parametrize("add_mask,norm_mask,act_mask,fused_patterns", [
    ("", "", "", ["BinaryOp+LayerNorm+GELU"]),
    (" 31=16", " 31=16", " 31=16", ["BinaryOp+LayerNorm+GELU"]),  # all kept off Vulkan: still one layer
    (" 31=16", "", "", ["LayerNorm+GELU"]),                      # the add stays off Vulkan on its own
    ("", "", " 31=16", ["BinaryOp+LayerNorm"]),                  # so does the activation
    ("", " 31=16", "", []),
])
def test_featmask_decides_what_fuses(add_mask, norm_mask, act_mask, fused_patterns):
    """featmask (param 31; bit 4 keeps a layer off Vulkan) is per layer: an add or activation joins a norm only with
    the same featmask, so fusing never moves a layer on or off Vulkan."""
    text = ("7767517\n5 5\nInput in0 0 1 a\nInput in1 0 1 b\n"
            f"BinaryOp add 2 1 a b s 0=0{add_mask}\nLayerNorm ln 1 1 s n 0=8 1=1e-05 2=0{norm_mask}\n"
            f"GELU g 1 1 n y{act_mask}\n")
    out, fused = fuse(text)
    assert [f["pattern"] for f in fused] == fused_patterns, out


def test_an_add_whose_output_another_layer_also_reads_is_not_fused_away():
    """The add's output read by the norm and, directly (no Split), by another layer: fusing the add into the norm
    would leave that reader a blob no layer makes. The add stays a layer of its own; only the activation fuses."""
    text = ("7767517\n6 6\nInput in0 0 1 a\nInput in1 0 1 b\nBinaryOp add 2 1 a b s 0=0\n"
            "LayerNorm ln 1 1 s y 0=8 1=1e-05 2=0\nGELU g 1 1 y out0\nSigmoid other 1 1 s out1\n")
    out, fused = fuse(text)
    assert [f["pattern"] for f in fused] == ["LayerNorm+GELU"]
    rows = lines_of(out)
    assert [t[0] for t in rows] == ["Input", "Input", "BinaryOp", "vknorm.LayerNorm", "Sigmoid"]
    made = set()
    for t in rows:  # every blob read is made by an earlier layer
        nb, nt = int(t[2]), int(t[3])
        assert set(t[4:4 + nb]) <= made, t
        made |= set(t[4 + nb:4 + nb + nt])


def test_norm_output_with_two_readers_keeps_its_activation():
    text = ("7767517\n5 6\nInput in0 0 1 a\nLayerNorm ln 1 1 a y 0=8 1=1e-05 2=0\nSplit sp 1 2 y y1 y2\n"
            "GELU g 1 1 y1 o1\nSigmoid s 1 1 y2 o2\n")
    assert fuse(text)[1] == []


@pytest.mark.parametrize("text,needle", [
    ("", "line 1: expected ncnn's magic number 7767517"),
    ("7767517\n2\n", "line 2: expected 'layer_count blob_count'"),
    ("7767517\n0 2\n", "line 2: the header's layer and blob counts must be 1 to 1000000 (ncnn refuses others), got 0 and 2"),
    ("7767517\n2 2000000\nInput in0 0 1 a\nReLU r 1 1 a b\n", "line 2: the header's layer and blob counts must be 1 to"),
    ("7767517\n2 2\nInput in0 0 1 a\n", "line 2: the header says 2 layers, the file has 1"),
    # ncnn counts a blob for every top (a name used again included) and refuses more than the header declares
    ("7767517\n2 1\nInput in0 0 1 a\nReLU r 1 1 a b\n", "line 2: the header says 1 blobs, the layers make 2"),
    ("7767517\n2 1\nInput in0 0 1 a\nReLU r 1 1 a a\n", "line 2: the header says 1 blobs, the layers make 2"),
    # a bottom no layer produces is a blob of its own too
    ("7767517\n2 2\nInput in0 0 1 a\nReLU r 1 1 zz b\n", "line 2: the header says 2 blobs, the layers make 3; they "
     "count blob 'zz', which layer r (line 4) reads and no earlier layer produces: an input of the model"),
    ("7767517\n2 2\nInput in0 0 1 a\nLayerNorm ln x 1 a y\n", "line 4: expected layer ln's bottom count, got 'x'"),
    ("7767517\n2 2\nInput in0 0 1 a\nLayerNorm ln 1 1 a y junk\n", "line 4: layer ln: param 'junk' is not id=value"),
    # the header's words over lines: the line of the word at fault, not of the last blank line read
    ("7767517\nabc\n\n2\n", "line 2: expected a layer count, got 'abc'"),
    ("7767517\n2\n\n\n\n", "line 2: expected 'layer_count blob_count'"),
    ("7767517\n1 1\nInput in0 0 99999999999999999999 a\n", "line 3: expected layer in0's top count"),
    ("7767517\n-1\n3\n", "line 2: the header's layer and blob counts must be 1 to 1000000"),
    # ncnn reads a number's word with %31s and refuses a longer one, leading zeros or not
    ("0" * 25 + "7767517\n", "line 1: expected ncnn's magic number 7767517 (a text .param), got '0000"),
    ("7767517\n" + "0" * 31 + "1 1\nInput in0 0 1 a\n", "line 2: expected a layer count, got '0000"),
    ("7767517\n4\n3\nInput in0 0 1 a\n", "line 2: the header says 4 layers, the file has 1"),
    # a layer's words over lines: the line of the word at fault
    ("7767517\n2 2\nInput in0 0 1 a\nConvolution conv_0\n-1 1 a b 0=8\n", "line 5: layer conv_0 names fewer blobs"),
    ("7767517\n2 2\nInput in0 0 1 a\nLayerNorm ln 1 1\na y junk\n", "line 5: layer ln: param 'junk' is not id=value"),
    ("7767517\n2 2\nInput in0 0 1 a\nLayerNorm ln 1\n2147483647 a\n", "line 5: layer ln's top count 2147483647: ncnn "
     "takes at most 1000000"),
    # a NUL starting a word: an empty name to ncnn, which finds blobs not yet made by it
    ("7767517\n2 2\nInput in0 0 1 a\nLayerNorm \0ln 1 1 a y\n", "line 4: a word starts with a NUL byte"),
])
def test_malformed_param_names_the_line(text, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        fuse(text)


def test_the_rewrite_reads_a_param_as_ncnn_reads_it():
    """ncnn's load_param reads the header's count of layers and nothing after, and makes a bottom that no
    earlier layer produces a blob of its own (the caller fills it): the rewrite loads what ncnn loads."""
    past_the_count = ("7767517\n2 2\nInput in0 0 1 a\nLayerNorm ln 1 1 a n 0=8 1=1e-05 2=0\n"
                      "ReLU r 1 1 n out0\nthis line is never read\n")
    text, fused = fuse(past_the_count)
    assert fused == [] and lines_of(text) == [["Input", "in0", "0", "1", "a"],
                                              ["LayerNorm", "ln", "1", "1", "a", "n", "0=8", "1=1e-05", "2=0"]]
    # no Input layers: both the add's operands come from the caller, and ncnn counts a blob for each
    text, fused = fuse("7767517\n3 5\nBinaryOp add 2 1 x r s 0=0\nLayerNorm ln 1 1 s n 0=8 1=1e-05 2=0\n"
                       "ReLU act 1 1 n out0\n")
    assert fused == [{"pattern": "BinaryOp+LayerNorm+ReLU", "layers": ["add", "ln", "act"]}]
    assert text.splitlines()[1] == "1 3"  # x, r, out0
    assert lines_of(text)[0][:7] == ["vknorm.LayerNorm", "ln", "2", "1", "x", "r", "out0"]
    # a later top named like such an input is a second blob ncnn never reads by that name: its layer stays
    text, fused = fuse("7767517\n3 4\nLayerNorm ln 1 1 x n 0=8 1=1e-05 2=0\nReLU act 1 1 n out0\n"
                       "Input in0 0 1 x\n")
    assert [f["pattern"] for f in fused] == ["LayerNorm+ReLU"] and text.splitlines()[1] == "2 3"
    text, fused = fuse("7767517\n3 4\nReLU first 1 1 x y\nLayerNorm ln 1 1 y n 0=8 1=1e-05 2=0\n"
                       "ReLU act 1 1 n x\n")
    assert fused == []
    # an add is not taken into the norm where a top between them takes its bottom's name: read at the norm's
    # place, the name would find that top (a name finds its first blob, and the input's is made at the add's read)
    text, fused = fuse(SHADOWED_INPUT)
    assert fused == [] and [ln[0] for ln in lines_of(text)] == ["BinaryOp", "MemoryData", "Split", "LayerNorm",
                                                                "BinaryOp"]
    # a name taken again after the norm, or the first blob of a reused name made by a layer: found alike at the
    # add's place and the norm's, so the add is fused
    ln = "LayerNorm ln 1 1 s out0 0=8 1=1e-05 2=0\n"
    assert [f["pattern"] for f in fuse("7767517\n3 5\nBinaryOp add 2 1 x r s 0=0\n" + ln + "Input in0 0 1 x\n")[1]] \
        == ["BinaryOp+LayerNorm"]
    assert [f["pattern"] for f in fuse("7767517\n6 8\nInput in0 0 1 a\nSplit sp 1 3 a a1 a2 a3\nReLU p 1 1 a1 x\n"
                                       "ReLU q 1 1 a2 x\nBinaryOp add 2 1 x a3 s 0=0\n" + ln)[1]] == ["BinaryOp+LayerNorm"]


# in0 is the caller's (no layer makes it) and the Split's second top: ncnn's input("in0") and the add read the first
SHADOWED_INPUT = ("7767517\n5 8\nBinaryOp add 2 1 in0 in0 s 0=0\nMemoryData md 0 1 c 0=4\nSplit sp 1 2 c in0 d\n"
                  "LayerNorm ln 1 1 s y 0=4 1=1e-5 2=0\nBinaryOp out 2 1 d y out0 0=0\n")


# ------------------------------------------------------------------------------------------ ncnn graphs

def run_graph(param, binp, inputs, *, vknorm_layers=True, fuse_=True, vulkan=True, fp16=False, outputs=("out0",)):
    from vknorm._stdio import quiet_stderr

    with quiet_stderr():
        net = graph.configure(graph.Net(vknorm=vknorm_layers, fuse=fuse_ and vknorm_layers), vulkan=vulkan, fp16=fp16)
        assert net.load_param(str(param)) == 0 and net.load_model(str(binp)) == 0
    return graph_runs.extract_all(graph, net, inputs, outputs, label=param), net


@needs_graph
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_every_committed_model_fused_matches_unfused(fp16):
    """Fused and unfused in one ncnn, against ncnn's CPU fp32 run of the unfused model: the fused output
    is as close as the unfused one (float16: within the fp16 rule of the output scale)."""
    for name, dims in MODELS.items():
        p, b = DATA / f"{name}.ncnn.param", DATA / f"{name}.ncnn.bin"
        x = np.random.default_rng(0).standard_normal(tuple(int(v) for v in dims.split("x"))).astype(np.float32)
        ref = run_graph(p, b, {"in0": x}, vknorm_layers=False, vulkan=False)[0]["out0"]
        unfused = run_graph(p, b, {"in0": x}, fuse_=False, fp16=fp16)[0]["out0"]
        fused, net = run_graph(p, b, {"in0": x}, fp16=fp16)
        fused = fused["out0"]
        assert len(net.fused()) == len(EXPECTED_FUSED.get(name, []))
        scale = max(float(np.abs(ref).max()), 1.0)
        e_fused, e_unfused = float(np.abs(fused - ref).max()), float(np.abs(unfused - ref).max())
        if fp16:  # ref saw the float32 input unrounded: FP16_TOL, not the storage rule
            assert e_fused <= max(2 * e_unfused, FP16_TOL * scale), (name, e_fused, e_unfused)
        else:
            # ncnn's Vulkan GELU differs from its CPU GELU (5e-3 on ln_residual_stack unfused); the fused
            # kernel uses the CPU formula, so fused is never further from the CPU run than 1e-4 x scale
            # beyond the unfused error
            assert e_fused <= e_unfused + 1e-4 * scale, (name, e_fused, e_unfused)
        counters = net.vknorm_counters()
        assert counters["cpu_forwards"] == 0 and counters["unfused_adds"] == 0


def write_model(tmp: Path, text: str, weights=b""):
    p, b = tmp / "m.param", tmp / "m.bin"
    p.write_text(text)
    b.write_bytes(weights)
    return p, b


@needs_graph
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_a_model_stock_ncnn_loads_runs_fused_as_unfused(tmp_path, fp16):
    """A model without Input layers (its inputs are the bottoms no layer produces) and with a line past the
    header's layer count: Net() fuses and runs it as Net(fuse=False) and stock ncnn's CPU run do, the inputs
    given by name or by ncnn's blob index of the unfused model."""
    p, b = write_model(tmp_path, "7767517\n3 5\nBinaryOp add 2 1 x r s 0=0\nLayerNorm ln 1 1 s n 0=64 1=1e-05 2=0\n"
                       "Swish act 1 1 n out0\nGarbage that ncnn never reads\n")
    rng = np.random.default_rng(5)
    x, r = (rng.standard_normal((6, 64)).astype(np.float32) for _ in range(2))
    s = x.astype(np.float64) + r
    y = (s - s.mean(1, keepdims=True)) / np.sqrt(s.var(1, keepdims=True) + 1e-5)
    want = act64(y, "swish")
    ref = run_graph(p, b, {"x": x, "r": r}, vknorm_layers=False, vulkan=False)[0]["out0"]
    unfused = run_graph(p, b, {"x": x, "r": r}, fuse_=False, fp16=fp16)[0]["out0"]
    fused, net = run_graph(p, b, {"x": x, "r": r}, fp16=fp16)
    assert [f["pattern"] for f in net.fused()] == ["BinaryOp+LayerNorm+Swish"]
    tol = FP16_TOL if fp16 else FP32_TOL
    for got in (ref, unfused, fused["out0"]):
        assert float(np.abs(got - want).max()) <= tol * max(1.0, float(np.abs(want).max()))
    ex = net.create_extractor()  # ncnn's indices of the unfused model: x 0, r 1, s 2, n 3, out0 4
    assert ex.input(0, graph.Mat(x)) == 0 and ex.input(1, graph.Mat(r)) == 0
    ret, m = ex.extract(4)
    assert ret == 0 and np.array_equal(np.array(m), fused["out0"])
    assert net.vknorm_counters()["cpu_forwards"] == 0
    from vknorm._stdio import quiet_stderr

    ex = net.create_extractor()  # an input left out is named, as one of an Input layer is
    assert ex.input("x", graph.Mat(x)) == 0
    log: list = []
    with quiet_stderr(log):
        assert ex.extract("out0")[0] == -1
    assert any("the input r it depends on was not given" in ln for ln in log), log


@needs_graph
def test_an_input_whose_name_a_later_top_takes_is_the_callers_fused_or_not(tmp_path):
    """input("in0") fills the first blob of that name, the one no layer makes, as ncnn's does; the Split's top of
    the same name is its own blob. Net() and Net(fuse=False) give stock ncnn's CPU result."""
    c = np.array([10, 20, 30, 45], np.float32)
    p, b = write_model(tmp_path, SHADOWED_INPUT, c.tobytes())
    x = np.array([0.5, -1, 2, 0.25], np.float32)
    s = 2 * x.astype(np.float64)
    want = c + (s - s.mean()) / np.sqrt(s.var() + 1e-5)
    ref = run_graph(p, b, {"in0": x}, vknorm_layers=False, vulkan=False)[0]["out0"]
    assert float(np.abs(ref - want).max()) <= FP32_TOL * 45
    for fuse_ in (False, True):
        got = run_graph(p, b, {"in0": x}, fuse_=fuse_)[0]["out0"]
        assert float(np.abs(got - want).max()) <= FP32_TOL * 45, fuse_


@needs_graph
@pytest.mark.parametrize("r_shape", [(64,), (1, 64)], ids=["dims1-row", "dims2-one-row"])
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_broadcasting_add_met_at_run_time_is_left_to_ncnn(tmp_path, fp16, r_shape):
    # in1 is one row (a dims-1 blob, or a dims-2 blob of one row: same dims and packing, other h; 15 rows keep
    # in0 unpacked too): ncnn's BinaryOp broadcasts it; the fused layer sees different shapes and runs ncnn's
    # own add first, then the norm (and writes the sum the Split's other reader needs).
    w = 64
    p, b = write_model(tmp_path, "7767517\n7 8\nInput in0 0 1 in0\nInput in1 0 1 in1\nBinaryOp add 2 1 in0 in1 s 0=0\n"
                       "Split sp 1 2 s s1 s2\nLayerNorm ln 1 1 s1 y 0=64 1=1e-05 2=0\nGELU g 1 1 y out0\n"
                       "Sigmoid tail 1 1 s2 out1\n")
    rng = np.random.default_rng(2)
    inputs = {"in0": rng.standard_normal((15, w)).astype(np.float32), "in1": rng.standard_normal(r_shape).astype(np.float32)}
    ref = run_graph(p, b, inputs, vknorm_layers=False, vulkan=False, outputs=("out0", "out1"))[0]
    before = graph._graph.process_counters()["unfused_adds"]
    got, net = run_graph(p, b, inputs, fp16=fp16, outputs=("out0", "out1"))
    assert [f["pattern"] for f in net.fused()] == ["BinaryOp+Split+LayerNorm+GELU"]
    assert net.vknorm_counters()["unfused_adds"] >= 1
    assert graph._graph.process_counters()["unfused_adds"] >= before + 1  # the process-wide count too
    tol = FP16_TOL if fp16 else FP32_TOL  # ref: ncnn's CPU float32 run of the unrounded inputs
    for k in ("out0", "out1"):
        assert float(np.abs(got[k] - ref[k]).max()) <= tol * max(1.0, float(np.abs(ref[k]).max())), k


@needs_graph
def test_in_a_cpu_net_every_committed_model_fused_or_not_is_stock_ncnn_cpu_bit_for_bit():
    """On the CPU vknorm's layers (fused or not) run ncnn's own CPU layers: the norm, the activation, the add's
    BinaryOp; the outputs are stock ncnn's exactly, also where |mean| >> std (a naive float32 sum of its own
    would differ there)."""
    for name, dims in MODELS.items():
        p, b = DATA / f"{name}.ncnn.param", DATA / f"{name}.ncnn.bin"
        shape = tuple(int(v) for v in dims.split("x"))
        x = (np.random.default_rng(4).standard_normal(shape) * 0.01 + 30).astype(np.float32)
        ref = run_graph(p, b, {"in0": x}, vknorm_layers=False, vulkan=False)[0]["out0"]
        for fuse in (False, True):
            got, net = run_graph(p, b, {"in0": x}, vulkan=False, fuse_=fuse)
            assert len(net.fused()) == (len(EXPECTED_FUSED.get(name, [])) if fuse else 0)
            c = net.vknorm_counters()
            assert c["vulkan_forwards"] == 0 and c["cpu_forwards"] > 0, (name, c)
            np.testing.assert_array_equal(got["out0"], ref, err_msg=f"{name} fuse={fuse}")


@needs_graph
@pytest.mark.parametrize("norm", ["InstanceNorm", "GroupNorm", "LayerNorm"])
@pytest.mark.parametrize("act", ["Sigmoid", "Swish", "GELU"])
def test_in_a_cpu_net_a_fused_add_norm_activation_is_stock_ncnn_bit_for_bit(tmp_path, norm, act):
    """Each of ncnn's CPU layers inside a fused layer runs at the packing a stock graph gives it: ncnn's
    InstanceNorm takes no packed blobs, its activations do (their vector and scalar maths differ)."""
    c = 16
    params = {"InstanceNorm": f"0={c} 1=1e-05 2=1", "GroupNorm": f"0=4 1={c} 2=1e-05 3=1",
              "LayerNorm": "0=3 1=1e-05 2=1"}[norm]
    n = 3 if norm == "LayerNorm" else c
    rng = np.random.default_rng(8)
    weights = rng.uniform(0.5, 1.5, n).astype(np.float32).tobytes() + rng.uniform(-1, 1, n).astype(np.float32).tobytes()
    text = ("7767517\n6 7\nInput in0 0 1 in0\nInput in1 0 1 in1\nBinaryOp add 2 1 in0 in1 s 0=0\n"
            "Split split 1 2 s s0 out1\n"
            f"{norm} norm 1 1 s0 n {params}\n{act} act 1 1 n out0\n")
    p, b = write_model(tmp_path, text, weights)
    inputs = {k: (rng.standard_normal((c, 3, 3)) * 2).astype(np.float32) for k in ("in0", "in1")}
    ref = run_graph(p, b, inputs, vknorm_layers=False, vulkan=False, outputs=("out0", "out1"))[0]
    got, net = run_graph(p, b, inputs, vulkan=False, outputs=("out0", "out1"))
    assert [f["pattern"] for f in net.fused()] == [f"BinaryOp+Split+{norm}+{act}"], net.fused()
    for k in ("out0", "out1"):
        np.testing.assert_array_equal(got[k], ref[k], err_msg=k)


@needs_graph
@pytest.mark.parametrize("fast", [0, 1], ids=["erf_gelu", "fast_gelu"])
def test_each_gelu_form_keeps_its_formula_through_the_rewrite_on_vulkan(tmp_path, fast):
    """GELU 0=0 (erf) and 0=1 (tanh) differ by up to 4.7e-4: the fused Vulkan kernel of LayerNorm+GELU is within
    the float32 rule of stock ncnn's CPU net of the same model, and further from the other form's, so neither
    form can stand in for the other (a model-level comparison bounded by stock Vulkan's own GELU error cannot
    tell them apart)."""
    text = f"7767517\n3 3\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 y 0=64 1=1e-05 2=0\nGELU act 1 1 y out0 0={fast}\n"
    other = text.replace(f"0={fast}\n", f"0={1 - fast}\n")
    p, b = write_model(tmp_path, text)
    x = (np.random.default_rng(9).standard_normal((32, 64)) * 2).astype(np.float32)
    ref = run_graph(p, b, {"in0": x}, vknorm_layers=False, vulkan=False)[0]["out0"]
    (tmp_path / "other").mkdir()
    po, bo = write_model(tmp_path / "other", other)
    ref_other = run_graph(po, bo, {"in0": x}, vknorm_layers=False, vulkan=False)[0]["out0"]
    got, net = run_graph(p, b, {"in0": x})
    assert [f["pattern"] for f in net.fused()] == ["LayerNorm+GELU"]
    bound = FP32_TOL * max(1.0, float(np.abs(ref).max()))
    assert float(np.abs(got["out0"] - ref).max()) <= bound
    assert float(np.abs(ref_other - ref).max()) > 10 * bound  # the forms are apart by more than the rule


@needs_graph
@pytest.mark.parametrize("slope", ["0.123456789", "1.0e-7", "-3.3333333"])
def test_a_leaky_relu_slope_survives_the_rewrite_to_the_last_bit(tmp_path, slope):
    """The fused layer's slope (-23310=1,v) is the float32 ncnn reads from the ReLU's 0=v, every bit of it: in a CPU
    net the fused model is stock ncnn bit for bit, negative outputs included (slopes of many digits, tiny, negative)."""
    text = f"7767517\n3 3\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 y 0=16 1=1e-05 2=0\nReLU act 1 1 y out0 0={slope}\n"
    out, fused = fuse(text)
    assert [f["pattern"] for f in fused] == ["LayerNorm+ReLU"]
    (ln,) = [t for t in lines_of(out) if t[1] == "ln"]
    (written,) = [p.split("=", 1)[1] for p in ln if p.startswith("-23310=")]
    count, value = written.split(",")
    assert count == "1" and np.float32(float(value)) == np.float32(float(slope)), written
    p, b = write_model(tmp_path, text)
    x = (np.random.default_rng(4).standard_normal((6, 16)) * 3).astype(np.float32)
    ref = run_graph(p, b, {"in0": x}, vknorm_layers=False, vulkan=False)[0]["out0"]
    got, net = run_graph(p, b, {"in0": x}, vulkan=False)
    assert len(net.fused()) == 1  # half of a normalized row is below 0: through the slope
    np.testing.assert_array_equal(got["out0"], ref)


LOCALE_SCRIPT = """
import json, locale, sys
import numpy as np
locale.setlocale(locale.LC_ALL, "de_DE.UTF-8")  # a decimal comma, as a program that calls setlocale(LC_ALL, "") has
from vknorm import graph
text = sys.argv[1]
outs = {}
for vk in (False, True):
    net = graph.Net(vknorm=vk)
    net.opt.use_vulkan_compute = False
    assert net.load_param_mem(text) == 0 and net.load_model_mem(b"") == 0
    ex = net.create_extractor()
    ex.input("in0", graph.Mat(np.linspace(-3, 3, 96, dtype=np.float32).reshape(6, 16)))
    ret, out = ex.extract("out0")
    outs[vk] = (ret, np.array(out).tolist())
print(json.dumps({"point": locale.localeconv()["decimal_point"], "fused": graph._graph.fuse_param(text)[0],
                  "same": outs[False] == outs[True], "ret": outs[True][0]}))
"""


@needs_graph
def test_a_fused_model_is_written_as_ncnn_reads_it_whatever_the_locale(tmp_path):
    """A process whose locale writes a decimal comma (setlocale(LC_ALL, "") in Germany, a Qt application) got
    "-23310=1,1,000000015e-01" in the fused text, which ncnn refused: the slope is written in the C locale."""
    locales = tmp_path / "locales"
    locales.mkdir()
    made = subprocess.run(["localedef", "-i", "de_DE", "-f", "UTF-8", str(locales / "de_DE.UTF-8")],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode in (0, 1), made.stderr  # 1: warnings only
    text = "7767517\n3 3\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 y 0=16 1=1e-05 2=0\nReLU act 1 1 y out0 0=0.1\n"
    proc = subprocess.run([sys.executable, "-c", LOCALE_SCRIPT, text], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LOCPATH": str(locales)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.splitlines()[-1])
    assert res["point"] == ",", res  # the locale took: the case is the one it names
    assert "-23310=1,1.000000015e-01" in res["fused"].split(), res["fused"]
    assert res["ret"] == 0 and res["same"], res


LN_RELU = "7767517\n3 3\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 y 0=8 1=1e-5 2=0\nReLU relu 1 1 y out{hint}\n"


@needs_graph
@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
def test_the_rewrite_reads_lines_ending_as_ncnn_ends_them(ending):
    """ncnn ends a line at \\n or \\r: a .param with old-Mac CR line endings loads in stock ncnn, and fuses as one with
    LF or CRLF (it was refused: "expected 7767517, got '7767517'")."""
    out, fused = fuse(LN_RELU.format(hint="").replace("\n", ending))
    assert [f["pattern"] for f in fused] == ["LayerNorm+ReLU"], fused
    assert out == fuse(LN_RELU.format(hint=""))[0]


@needs_graph
def test_a_quote_in_a_layer_or_blob_name_is_a_character_of_the_name(tmp_path):
    """ncnn reads types, names and blob names as whitespace-separated words; only param values may be quoted
    strings. A blob named y="a is a name like any other (it broke the line: "names fewer blobs than its counts"),
    in the rewrite and in the reader vknorm optimize, check and bench --model share."""
    text = LN_RELU.format(hint="").replace(" y", ' y="a')
    out, fused = fuse(text)
    assert [f["pattern"] for f in fused] == ["LayerNorm+ReLU"], fused
    p, b = write_model(tmp_path, text)
    r = optimize(p, b, tmp_path / "o.param", tmp_path / "o.bin")
    assert r.returncode == 0 and "vknorm.LayerNorm" in (tmp_path / "o.param").read_text(), (r.stdout, r.stderr)


@needs_graph
def test_names_longer_than_ncnn_reads_are_refused_with_their_line():
    """ncnn reads names with %255s and refuses a longer one, so a pattern that would drop such a name is not one
    the stock model loads with: refused, naming the line, rather than fused into a model that loads."""
    with pytest.raises(ValueError, match=r"line 4: layer 'ln': its blob name 'y{40}'\.\.\. is 300 characters; ncnn reads at most 255"):
        fuse(LN_RELU.format(hint="").replace(" y", " " + "y" * 300))


@needs_graph
@pytest.mark.parametrize("case", ["hint_4d", "split_featmask"])
def test_layers_ncnn_refuses_are_not_fused_away(case):
    """A pattern holding a layer ncnn would refuse stays as it is, so that the fused model fails to load where the
    stock one does: a 4-D shape hint whose w x h x d overflows (its d was left out of the size), a Split whose
    featmask is a float ("invalid feature mask")."""
    if case == "hint_4d":
        text = LN_RELU.format(hint=" -23330=5,4,1024,1024,65536,1073741824")
    else:
        text = ("7767517\n6 7\nInput in0 0 1 in0\nInput in1 0 1 in1\nBinaryOp add 2 1 in0 in1 s 0=0\n"
                "Split sp 1 2 s t1 t2 31=1.5\nLayerNorm ln 1 1 t1 out 0=8 1=1e-5 2=0\nSigmoid sig 1 1 t2 out2\n")
    out, fused = fuse(text)
    assert fused == [], fused
    assert [t[:2] for t in lines_of(out)] == [t[:2] for t in lines_of(text)]  # every layer still there


@needs_graph
def test_fused_types_refuse_bad_params(tmp_path):
    """A fused line ncnn would read as something else is refused at load_param, naming the param: a residual or
    activation type out of range, a leaky slope missing, a float for an int (ncnn reads 9=1.0 as not given:
    no activation), and blob counts that do not fit the residual (they used to pass load and fail the first
    extract)."""
    from vknorm._stdio import quiet_stderr

    base = "7767517\n3 3\nInput in0 0 1 in0\nInput in1 0 1 in1\n"
    for line, needle in [
        ("vknorm.LayerNorm ln 2 1 in0 in1 y 0=8 1=1e-05 2=0 20=3", "residual=3"),
        ("vknorm.LayerNorm ln 2 1 in0 in1 y 0=8 1=1e-05 2=0 9=5 20=1", "activation_type=5"),
        ("vknorm.LayerNorm ln 1 1 in0 y 0=8 1=1e-05 2=0 9=2", "needs its slope as the array 10="),
        ("vknorm.LayerNorm ln 1 1 in0 y 0=8 1=1e-05 2=0 9=1.0", "9= takes an integer, got a float"),
        ("vknorm.LayerNorm ln 2 1 in0 in1 y 0=8 1=1e-05 2=0 20=1.0", "20= takes an integer, got a float"),
        ('vknorm.LayerNorm ln 1 1 in0 y 0=8 1=1e-05 2=0 9="leaky"', "9= takes an integer, got a string"),
        ("vknorm.LayerNorm ln 2 1 in0 in1 y 0=8 1=1e-05 2=0", "residual=0 takes 1 input and gives 1 output"),
        ("vknorm.LayerNorm ln 2 1 in0 in1 y 0=8 1=1e-05 2=0 20=2", "residual=2 takes 2 inputs and gives 2 outputs"),
        ("vknorm.LayerNorm ln 1 1 in0 y 0=8 1=1e-05 2=0 20=1", "residual=1 takes 2 inputs and gives 1 outputs"),
    ]:
        p, _ = write_model(tmp_path, base + line + "\n")
        log: list = []
        with quiet_stderr(log):
            net = graph.Net()
            assert net.load_param(str(p)) != 0, line
        assert any(needle in ln for ln in log), (needle, log)


@needs_graph
@pytest.mark.parametrize("slope", ["-23310=1,1", "-23310=1,1.0"], ids=["int_array", "float_array"])
def test_a_fused_leaky_slope_written_as_integers_is_their_value(tmp_path, slope):
    """-23310=1,1 is an array of ints to ncnn's ParamDict: a slope of 1 (the identity), as -23310=1,1.0 is, not the
    float whose bits the int has (1.4e-45, which zeroed every negative value)."""
    from vknorm._stdio import quiet_stderr

    p, b = write_model(tmp_path, f"7767517\n2 2\nInput in0 0 1 in0\nvknorm.LayerNorm ln 1 1 in0 y 0=8 1=1e-05 2=0 9=2 {slope}\n")
    x = np.random.default_rng(4).standard_normal((3, 8)).astype(np.float32)
    with quiet_stderr():
        out, _ = run_graph(p, b, {"in0": x}, vulkan=False, outputs=("y",))
    m = x - x.mean(1, keepdims=True)
    np.testing.assert_allclose(out["y"], m / np.sqrt((m * m).mean(1, keepdims=True) + 1e-5), atol=1e-5)


@needs_graph
def test_fused_model_in_a_stock_net_says_what_it_needs(tmp_path):
    from vknorm._stdio import quiet_stderr

    src = (DATA / "transformer_block.ncnn.param").read_text()
    p = tmp_path / "fused.param"
    p.write_text(fuse(src)[0])
    log: list = []
    with quiet_stderr(log):
        assert graph.Net(vknorm=False).load_param(str(p)) == -1
    assert any("a fused vknorm layer" in ln and "vknorm.LayerNorm" in ln for ln in log), log


# ------------------------------------------------------------------------------------------ vknorm optimize

def optimize(*args):
    env = dict(os.environ, VKNORM_VALIDATION="1")
    return subprocess.run([sys.executable, "-m", "vknorm", "optimize", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@needs_graph
def test_optimize_writes_a_model_that_runs_like_the_load_time_rewrite(tmp_path):
    p, b = DATA / "ln_residual_stack.ncnn.param", DATA / "ln_residual_stack.ncnn.bin"
    op, ob = tmp_path / "f.param", tmp_path / "f.bin"
    r = optimize(p, b, op, ob, "--json")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    rep = json.loads(r.stdout)
    assert [f["pattern"] for f in rep["fused"]] == EXPECTED_FUSED["ln_residual_stack"]
    assert rep["fused"][1]["layers"] == ["add_0", "splitncnn_1", "ln_13", "gelu_1"]
    assert rep["custom_type_indexes"] == {"vknorm.LayerNorm": 256}  # ncnn2mem's index for binary params
    assert ob.read_bytes() == b.read_bytes()
    x = np.random.default_rng(1).standard_normal((197, 768)).astype(np.float32)
    offline = run_graph(op, ob, {"in0": x}, fuse_=False)[0]["out0"]
    at_load = run_graph(p, b, {"in0": x})[0]["out0"]
    assert np.array_equal(offline, at_load)


@needs_graph
def test_optimize_prints_how_to_register_the_fused_types_of_binary_params(tmp_path):
    """ncnn2mem numbers the fused types custom (256 + j): the report gives the registrations, C++ and Python."""
    p, b = DATA / "ln_residual_stack.ncnn.param", DATA / "ln_residual_stack.ncnn.bin"
    r = optimize(p, b, tmp_path / "f.param", tmp_path / "f.bin")
    assert r.returncode == 0, r.stderr
    assert 'vknorm::ncnn::register_layer(net, 256, "vknorm.LayerNorm")' in r.stdout, r.stdout
    assert 'net.register_layer(256, "vknorm.LayerNorm")' in r.stdout, r.stdout


@needs_graph
def test_optimize_errors_are_one_line_and_write_nothing(tmp_path):
    p, b = DATA / "transformer_block.ncnn.param", DATA / "transformer_block.ncnn.bin"
    short = tmp_path / "short.bin"
    short.write_bytes(b.read_bytes()[:100])
    garbled = tmp_path / "garbled.param"
    garbled.write_text(p.read_text().replace("Split                    splitncnn_1              1 2 5 6 7",
                                             "Split splitncnn_1 1 2 nowhere 6 7"))
    # the same with a blob more in the header: ncnn loads it (blob 'nowhere' an input to fill), optimize
    # refuses it as check does (a model's inputs are its Input layers there)
    counted = tmp_path / "counted.param"
    magic, counts, body = garbled.read_text().split("\n", 2)
    counted.write_text(f"{magic}\n{counts.split()[0]} {int(counts.split()[1]) + 1}\n{body}")
    binary = tmp_path / "binary.param"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    magic_only = tmp_path / "magic_only.param"
    magic_only.write_text("7767517\n")
    few_blobs = tmp_path / "few_blobs.param"  # a header declaring fewer blobs than the layers make
    magic, counts, body = p.read_text().split("\n", 2)
    few_blobs.write_text(f"{magic}\n{counts.split()[0]} 3\n{body}")
    unknown = tmp_path / "unknown.param"  # a type ncnn does not have: ncnn's own message names the type alone
    unknown.write_text("7767517\n2 2\nInput in0 0 1 a\nFooLayer foo 1 1 a b\n")
    long_name = tmp_path / "long_name.param"  # past ncnn's %255s: ncnn would read the rest as the next field
    long_name.write_text("7767517\n2 2\nInput in0 0 1 a\nLayerNorm " + "n" * 300 + " 1 1 a b 0=8\n")
    twice = tmp_path / "twice.param"  # two layers of one name: ncnn loads it, check and bench refuse it
    twice.write_text(p.read_text().replace("LayerNorm                ln_4", "LayerNorm                ln_3"))
    nul = tmp_path / "nul.param"  # a NUL where the rewrite reads C strings: its message ended there
    nul.write_bytes(b"7767517\n2 2\x00\nInput in0 0 1 a\n")
    too_big = tmp_path / "too_big.param"  # ncnn's ParamDict logs its own line before the one error line
    too_big.write_text("7767517\n2 2\nInput in0 0 1 a\nLayerNorm ln 1 1 a b 0=99999999999 1=1e-5 2=0\n")
    (tmp_path / "adir").mkdir()
    for args, needle in [
        ((nul, b), "nul.param: not an ncnn text .param (binary data: a NUL byte at byte 11)"),
        ((too_big, b), "param 0 (affine_size)=99999999999 does not fit ncnn's 32-bit int"),
        ((tmp_path / "missing.param", b), "no such file"),
        ((p, tmp_path / "missing.bin"), "no such file"),
        ((tmp_path / "adir", b), "is a directory, not the model .param"),
        ((p, tmp_path / "adir"), "is a directory, not the weights .bin"),
        ((magic_only, b), "line 2: expected 'layer_count blob_count', the file ends after the magic number"),
        ((garbled, b), "line 2: the header says 14 blobs, the layers make 15; they count blob 'nowhere', which layer "
                       "splitncnn_1 (line 8) reads and no earlier layer produces"),
        ((counted, b), "layer 'splitncnn_1' reads blob 'nowhere', which no earlier layer produces"),
        ((few_blobs, b), "line 2: the header says 3 blobs, the layers make"),
        ((twice, b), "line 9: layer name 'ln_3' used twice"),
        ((unknown, b), "the model does not load (its layers): line 4: layer 'foo' is of type 'FooLayer', which this "
                       "ncnn does not have"),
        ((long_name, b), "line 4: a layer: its name 'nnnn"),
        ((binary, b), "binary.param: not an ncnn text .param (binary data"),  # as check says it
        ((p, p), "the weights .bin is the model .param itself"),
        ((p, short), f"{short}: the fused model of {p} does not load (the weights, "),
    ]:
        out_p, out_b = tmp_path / "o.param", tmp_path / "o.bin"
        r = optimize(*args, out_p, out_b)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("vknorm optimize: error:") and needle in lines[0], r.stderr
        assert not out_p.exists() and not out_b.exists()
        assert not [f for f in os.listdir(tmp_path) if f.startswith(".vknorm-optimize-")]


@needs_graph
def test_optimize_a_bin_it_cannot_read_is_named_as_read(tmp_path):
    """open() refusing the .bin (no permission, for a user without root's override) is an error reading that
    file, not one "writing" it."""
    import vknorm.optimize as vo
    from vknorm.cli import UsageError

    with open(tmp_path / "o.bin", "wb") as out, \
            pytest.raises(UsageError, match=r"nope\.bin: cannot be read \(No such file or directory\)"):
        vo._copy_into(str(tmp_path / "nope.bin"), out)


@needs_graph
@pytest.mark.parametrize("json_report", [False, True], ids=["table", "json"])
def test_optimize_whose_report_cannot_be_written_says_the_model_was(tmp_path, json_report):
    """Standard output on a full device (/dev/full): the model is written (both files, atomically, before the
    report), so the one error line says so, rather than a bare failure that reads as "nothing written"."""
    p, b = DATA / "transformer_block.ncnn.param", DATA / "transformer_block.ncnn.bin"
    op, ob = tmp_path / "o.param", tmp_path / "o.bin"
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "vknorm", "optimize", str(p), str(b), str(op), str(ob),
                            *(["--json"] if json_report else [])], cwd=ROOT, stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines == [f"vknorm optimize: error: wrote {op} and {ob}, but not the report: writing standard output: "
                     "No space left on device"], r.stderr
    assert ob.read_bytes() == b.read_bytes() and "vknorm.LayerNorm" in op.read_text()


@needs_graph
def test_optimize_warns_of_a_bin_longer_than_the_model_reads(tmp_path):
    """A .bin with bytes past the weights the .param reads is probably another model's (ln_residual_stack's
    LayerNorms read their gamma and beta as raw float32, so its .param takes exactly its own byte count from
    the front of transformer_block's larger .bin, and loads): the model is written as asked, with a warning on
    stderr and in the JSON naming the bytes left over. The model's own .bin: no warning."""
    p = DATA / "ln_residual_stack.ncnn.param"
    own, other = DATA / "ln_residual_stack.ncnn.bin", DATA / "transformer_block.ncnn.bin"
    r = optimize(p, other, tmp_path / "o.param", tmp_path / "o.bin", "--json")
    assert r.returncode == 0, r.stderr
    warnings = json.loads(r.stdout)["warnings"]
    assert len(warnings) == 1 and "bytes after the weights" in warnings[0] and "another .param" in warnings[0]
    assert f"{other.stat().st_size - own.stat().st_size} bytes after" in warnings[0], warnings
    assert r.stderr.strip() == f"warning: {warnings[0]}"
    r = optimize(p, own, tmp_path / "o.param", tmp_path / "o.bin", "--json")
    assert r.returncode == 0 and r.stderr == "" and json.loads(r.stdout)["warnings"] == [], r.stderr


@needs_graph
def test_check_and_bench_refuse_a_fused_model_saying_which_to_give(tmp_path):
    """vknorm check and bench --model run stock ncnn beside vknorm, and stock ncnn cannot load vknorm's fused
    types: a model written by vknorm optimize is refused in one line naming the layer and the model to give."""
    p, b = DATA / "transformer_block.ncnn.param", DATA / "transformer_block.ncnn.bin"
    op, ob = tmp_path / "f.param", tmp_path / "f.bin"
    assert optimize(p, b, op, ob).returncode == 0
    env = dict(os.environ, VKNORM_VALIDATION="1")
    for cmd in (["check", op, ob, "--input", "in0=16x64", "--vulkan"], ["bench", "--model", op, ob, "--input", "in0=16x64"]):
        r = subprocess.run([sys.executable, "-m", "vknorm", *map(str, cmd)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (cmd, r.stderr)
        assert "is vknorm.LayerNorm, written by vknorm optimize" in lines[0] and "from before vknorm optimize" in lines[0]


@needs_graph
def test_optimize_refuses_outputs_it_would_clobber_and_writes_files_as_open_would(tmp_path):
    """Each output is replaced whole at the end, so a directory, a special file (a FIFO here, /dev/null for a
    user) or one file named for both outputs is refused before anything is written; what it writes has the
    mode a plain open() gives under the umask, not mkstemp's 0600."""
    p, b = DATA / "transformer_block.ncnn.param", DATA / "transformer_block.ncnn.bin"
    (tmp_path / "adir").mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    ok = tmp_path / "ok.param"
    for outs, needle in [((ok, tmp_path / "adir"), "a directory"), ((tmp_path / "adir", ok), "a directory"),
                         ((ok, fifo), "not a regular file"), ((ok, ok), "the same file"),
                         # a link into /dev or /proc: never replaced (/dev/stdout was, by a file holding the model)
                         ((Path("/dev/stdout"), tmp_path / "o.bin"), "/dev/stdout: not a regular file"),
                         ((ok, Path("/proc/vknorm.bin")), "/proc/vknorm.bin: not a regular file"),
                         # a trailing slash names a directory to be: never a file of that name
                         ((str(tmp_path / "newdir") + "/", tmp_path / "o.bin"), "a directory path (trailing /"),
                         ((ok, str(tmp_path / "o.bin") + "/."), "a directory path (trailing /")]:
        r = optimize(p, b, *outs)
        assert r.returncode == 2, (outs, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("vknorm optimize: error:") and needle in lines[0], r.stderr
        assert not ok.exists() and (tmp_path / "adir").is_dir() and fifo.is_fifo() and not (tmp_path / "newdir").exists()
    mask = os.umask(0o027)
    try:
        r = optimize(p, b, ok, tmp_path / "ok.bin")
    finally:
        os.umask(mask)
    assert r.returncode == 0, r.stderr
    for f in (ok, tmp_path / "ok.bin"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o640, oct(f.stat().st_mode)
    # a file replaced keeps its mode: in place, a private model stays private (it became 0644)
    private_p, private_b = tmp_path / "private.param", tmp_path / "private.bin"
    shutil.copyfile(p, private_p), shutil.copyfile(b, private_b)
    os.chmod(private_p, 0o600), os.chmod(private_b, 0o600)
    r = optimize(private_p, private_b, private_p, private_b)
    assert r.returncode == 0 and "vknorm.LayerNorm" in private_p.read_text(), r.stderr
    for f in (private_p, private_b):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, oct(f.stat().st_mode)
    # a symbolic link as an output is written through: the link stays, its target holds the model
    target, link = tmp_path / "target.param", tmp_path / "link.param"
    target.write_text("old")
    link.symlink_to(target)
    r = optimize(p, b, link, tmp_path / "ok.bin")
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and "vknorm.LayerNorm" in target.read_text()


@needs_graph
def test_optimize_replaces_an_input_only_by_its_own_output(tmp_path):
    """OUT.param may replace IN.param and OUT.bin IN.bin (in place); an output naming the other input would
    write param text over the weights (or weights over the param text): refused, both inputs left as they were."""
    p, b = tmp_path / "m.param", tmp_path / "m.bin"
    p.write_bytes((DATA / "transformer_block.ncnn.param").read_bytes())
    b.write_bytes((DATA / "transformer_block.ncnn.bin").read_bytes())
    before = (p.read_bytes(), b.read_bytes())
    for outs, needle in [((b, p), "OUT.param"), ((b, tmp_path / "o.bin"), "is the input IN.bin"),
                         ((tmp_path / "o.param", p), "is the input IN.param")]:
        r = optimize(p, b, *outs)
        assert r.returncode == 2, (outs, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("vknorm optimize: error:") and needle in lines[0], r.stderr
        assert (p.read_bytes(), b.read_bytes()) == before
        assert not (tmp_path / "o.param").exists() and not (tmp_path / "o.bin").exists()
    r = optimize(p, b, p, b)  # in place
    assert r.returncode == 0, r.stderr
    assert b.read_bytes() == before[1] and p.read_bytes() != before[0] and "vknorm.LayerNorm" in p.read_text()


@needs_graph
@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "new_outputs"])
def test_optimize_whose_second_output_cannot_be_written_leaves_the_first_as_it_was(tmp_path, monkeypatch, in_place):
    """OUT.param is moved into place before OUT.bin: when OUT.bin then cannot be written, OUT.param is put back
    as it was (an in-place run's IN.param unfused; a new OUT.param not there at all), and no temporary or backup
    file is left behind."""
    from vknorm import optimize as opt
    from vknorm.cli import UsageError

    p, b = tmp_path / "m.param", tmp_path / "m.bin"
    p.write_bytes((DATA / "transformer_block.ncnn.param").read_bytes())
    b.write_bytes((DATA / "transformer_block.ncnn.bin").read_bytes())
    out_param, out_bin = (p, tmp_path / "o.bin") if in_place else (tmp_path / "o.param", tmp_path / "o.bin")
    out_bin.write_bytes(b"old weights")
    before = {f: f.read_bytes() for f in tmp_path.iterdir()}
    real_replace = os.replace

    def replace(src, dst):
        if os.path.basename(dst) == "o.bin":
            raise PermissionError(1, "Operation not permitted")
        real_replace(src, dst)

    monkeypatch.setattr(opt.os, "replace", replace)
    with pytest.raises(UsageError, match=r"o\.bin: cannot be written \(Operation not permitted\)"):
        opt.fuse_files(str(p), str(b), str(out_param), str(out_bin))
    assert {f: f.read_bytes() for f in tmp_path.iterdir()} == before
    monkeypatch.setattr(opt.os, "replace", real_replace)
    opt.fuse_files(str(p), str(b), str(out_param), str(out_bin))  # and then it works, leaving only the outputs
    assert "vknorm.LayerNorm" in out_param.read_text() and out_bin.read_bytes() == b.read_bytes()
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted({"m.param", "m.bin", "o.bin", out_param.name})


@needs_graph
def test_a_split_output_the_norm_shares_with_another_reader_is_not_fused_away(tmp_path):
    """add -> Split -> (s0, s1) with s0 read by the norm and by a ReLU: fusing the add into the norm would erase
    s0, which the ReLU still reads (its output then could not be extracted). The add stays, the norm runs on s0."""
    text = ("7767517\n6 8\nInput in0 0 1 in0\nInput in1 0 1 in1\nBinaryOp add 2 1 in0 in1 s 0=0\n"
            "Split sp 1 2 s s0 s1\nLayerNorm ln 1 1 s0 out0 0=64 1=1e-05 2=0\nReLU relu 1 1 s0 out1\n")
    out, fused = fuse(text)
    assert fused == []
    assert [t[0] for t in lines_of(out)] == ["Input", "Input", "BinaryOp", "Split", "LayerNorm", "ReLU"]
    p, b = write_model(tmp_path, text)
    rng = np.random.default_rng(8)
    inputs = {k: rng.standard_normal((16, 64)).astype(np.float32) for k in ("in0", "in1")}
    # one extractor per output: in light mode ncnn frees s0 after its first reader (no Split holds it)
    ref = {o: run_graph(p, b, inputs, vknorm_layers=False, vulkan=False, outputs=(o,))[0][o] for o in ("out0", "out1")}
    got = {o: run_graph(p, b, inputs, outputs=(o,))[0][o] for o in ("out0", "out1")}
    assert np.array_equal(got["out1"], ref["out1"])
    assert float(np.abs(got["out0"] - ref["out0"]).max()) <= FP32_TOL * max(1.0, float(np.abs(ref["out0"]).max()))


def ncnn_param_id(p: str) -> int:
    """The id ncnn's ParamDict reads from id=value: a number ("09" and "+9" are 9), -23300-k an array of id k."""
    i = int(p.split("=", 1)[0])
    return -(i + 23300) if i <= -23300 else i


@pytest.mark.parametrize("stray", ["9=1", "20=2", "10=0.5", "-23310=1,0.5",
                                   "09=1", "+20=2", "-23309=1,2", "010=0.5", "9=1 9=2"])
def test_ids_stock_norms_ignore_do_not_become_fusion_params(stray):
    """A norm line carrying ids 9, 10 or 20 (stock ncnn's norms ignore them), in any spelling ncnn reads as those
    ids, keeps meaning what it meant: the fused layer's activation and residual params are the rewrite's alone."""
    fusion_ids = lambda params: [p for p in params if ncnn_param_id(p) in (9, 10, 20)]
    add_then_norm = ("7767517\n4 4\nInput in0 0 1 a\nInput in1 0 1 b\nBinaryOp add 2 1 a b s 0=0\n"
                     f"LayerNorm ln 1 1 s out0 0=16 1=1e-05 2=0 {stray}\n")
    ln = next(t for t in lines_of(fuse(add_then_norm)[0]) if t[1] == "ln")
    assert ln[0] == "vknorm.LayerNorm" and fusion_ids(ln[8:]) == ["20=1"], ln
    norm_then_act = ("7767517\n3 3\nInput in0 0 1 a\nLayerNorm ln 1 1 a y 0=16 1=1e-05 2=0 " + stray +
                     "\nSigmoid act 1 1 y out0\n")
    ln = next(t for t in lines_of(fuse(norm_then_act)[0]) if t[1] == "ln")
    assert ln[0] == "vknorm.LayerNorm" and fusion_ids(ln[6:]) == ["9=4"], ln


@needs_graph
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", ["GroupNorm c8", "InstanceNorm c8", "GroupNorm dims1 w8", "LayerNorm dims1 w8",
                                  "RMSNorm dims1 w100", "GroupNorm dims2 h8"])
def test_shape_hints_on_the_input_load_and_run_as_in_stock_ncnn(tmp_path, case, fp16):
    """ncnn hands a Vulkan layer that takes packed blobs its input's shape hint packed already (c, h or w over 4
    where they divide): the layer plans from the unpacked shape, not from 8 channels taken for 2."""
    op, shape = case.split(" ", 1)
    dims = {"c8": (8, 3, 5), "w8": (8,), "w100": (100,), "h8": (8, 6)}[shape.split()[-1]]
    w, h, c = dims[-1], dims[-2] if len(dims) >= 2 else 1, dims[0] if len(dims) == 3 else 1
    hint = ",".join(str(v) for v in [len(dims)] + [w, h, c][:len(dims)] + [0] * (3 - len(dims)))  # dims, w, h, c
    params = {"GroupNorm": "0=2 1={n} 2=1e-5 3=1", "InstanceNorm": "0={n} 1=1e-5 2=1",
              "LayerNorm": "0={n} 1=1e-5 2=1", "RMSNorm": "0={n} 1=1e-5 2=1"}[op]
    n = dims[0] if op in ("GroupNorm", "InstanceNorm") else w
    text = (f"7767517\n2 2\nInput in0 0 1 in0 -23330=4,{hint}\n"
            f"{op} norm 1 1 in0 out0 {params.format(n=n)}\n")
    rng = np.random.default_rng(9)
    weights = rng.uniform(0.5, 1.5, n).astype(np.float32).tobytes()
    if op != "RMSNorm":
        weights += rng.uniform(-0.5, 0.5, n).astype(np.float32).tobytes()
    p, b = write_model(tmp_path, text, weights)
    inputs = {"in0": rng.standard_normal(dims).astype(np.float32)}
    ref = run_graph(p, b, inputs, vknorm_layers=False, vulkan=False)[0]["out0"]
    got = run_graph(p, b, inputs, fp16=fp16)[0]["out0"]
    tol = FP16_TOL if fp16 else FP32_TOL  # ref: ncnn's CPU float32 run of the unrounded input
    assert float(np.abs(got - ref).max()) <= tol * max(1.0, float(np.abs(ref).max()))


@needs_graph
@pytest.mark.parametrize("rows", [16, 15], ids=["pack4", "pack1"])
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("fused", [False, True], ids=["norm", "add+norm"])
def test_a_shape_hint_builds_the_pipeline_the_forward_records_and_no_other(tmp_path, fused, fp16, rows):
    """A hint on the norm's input (ncnnoptimize and pnnx write them) has the layer build its pipeline at load;
    it must be the variant the forward then records (out of place, or the fused add's), not one more: in the
    net's storage too (float16 nets store rows of any count as float16, 15 rows unpacked)."""
    hint = f"-23330=4,2,64,{rows},0"
    text = (f"7767517\n4 4\nInput in0 0 1 in0 {hint}\nInput in1 0 1 in1 {hint}\n"
            f"BinaryOp add 2 1 in0 in1 s 0=0 {hint}\nLayerNorm ln 1 1 s out0 0=64 1=1e-05 2=0 {hint}\n")
    p, b = write_model(tmp_path, text)
    from vknorm._stdio import quiet_stderr

    with quiet_stderr():
        net = graph.configure(graph.Net(fuse=fused), vulkan=True, fp16=fp16)
        assert net.load_param(str(p)) == 0 and net.load_model(str(b)) == 0
    (ln,) = net.vknorm_layers()
    assert ln["pipelines"] == 1, ln["variants"]
    rng = np.random.default_rng(10)
    graph_runs.extract_all(graph, net, {k: rng.standard_normal((rows, 64)).astype(np.float32) for k in ("in0", "in1")},
                           ("out0",))
    (ln,) = net.vknorm_layers()
    assert ln["pipelines"] == 1 and ln["vulkan_forwards"] == 1, ln["variants"]


@needs_graph
def test_loading_a_directory_as_a_param_is_cannot_read(tmp_path):
    code = ("import sys\nfrom vknorm import graph\nnet = graph.configure(graph.Net(), vulkan=False)\n"
            "print('load', net.load_param(sys.argv[1]))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "load -1" in proc.stdout, proc.stdout + proc.stderr
    assert f"cannot read {tmp_path}" in proc.stderr and "magic" not in proc.stderr, proc.stderr


@needs_graph
def test_loading_the_weights_as_the_param_is_refused_from_their_first_bytes(tmp_path):
    """An 8 GiB .bin given to load_param: -1 from its first bytes (under 1 MiB read, /proc's rchar) within a 4 GiB
    address space, fused or not, and in a stock net (which looks for fused layer types first); the fused reader
    says what it found, where it used to read the whole file first (12 s, then "cannot read" once memory ran
    out)."""
    big = tmp_path / "weights.bin"
    big.write_bytes(np.random.default_rng(0).standard_normal(64).astype(np.float32).tobytes())
    os.truncate(big, 8 << 30)
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
            "from vknorm import graph\n"
            "def bytes_read():\n"
            "    with open('/proc/self/io') as f:\n"
            "        return next(int(ln.split()[1]) for ln in f if ln.startswith('rchar'))\n"
            "for kw in ({}, {'fuse': False}, {'vknorm': False}):\n"
            "    net = graph.configure(graph.Net(**kw), vulkan=False)\n"
            "    before = bytes_read()\n"
            "    print('load', net.load_param(sys.argv[1]), bytes_read() - before, flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(big)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    loads = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith("load")]
    assert [int(r) for _, r, _ in loads] == [-1, -1, -1], proc.stdout
    assert all(int(n) < 1 << 20 for _, _, n in loads), proc.stdout
    assert f"{big}: line 1: expected ncnn's magic number 7767517 (a text .param), got binary data" in proc.stderr, \
        proc.stderr



def loads_in_each_net(param, binp):
    """"load <load_param> <load_model> <patterns fused>" in a fused, an unfused and a stock vknorm.graph net on the
    CPU, in a process of its own (ncnn's log kept from the test's)."""
    code = ("import sys\nfrom vknorm import graph\n"
            "for kw in ({}, {'fuse': False}, {'vknorm': False}):\n"
            "    net = graph.configure(graph.Net(**kw), vulkan=False)\n"
            "    print('load', net.load_param(sys.argv[1]), net.load_model(sys.argv[2]), len(net.fused()), flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(param), str(binp)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split("\n")[:3]

@needs_graph
@pytest.mark.parametrize("lead", ["\n" * 58, " " * 63, "\n" * 70, "\f\v\t\r\n"], ids=["58nl", "63sp", "70nl", "fvtrn"])
def test_a_param_whose_magic_number_comes_after_blank_space_loads_as_ncnn_loads_it(tmp_path, lead):
    """The first bytes looked at before reading on are not a fixed 64: blank space before the magic number (up
    to and past 64 bytes, any of C's white-space characters) reads on to the token, in every reader."""
    from vknorm import check

    p, b = DATA / "transformer_block.ncnn.param", DATA / "transformer_block.ncnn.bin"
    lead_p = tmp_path / "lead.param"
    lead_p.write_text(lead + Path(p).read_text())
    assert len(check.parse_param(str(lead_p)).norms) == 3
    assert loads_in_each_net(lead_p, b) == ["load 0 0 2", "load 0 0 0", "load 0 0 0"]



LN_3 = "LayerNorm                ln_3                     1 1 2 3 0=64"
TEXT_FORMS = {  # transformer_block (magic, "12 14", then a layer a line) written other ways ncnn reads
    "header_on_one_line": lambda t: t.replace("7767517\n12 14\n", "7767517 12 14\n"),
    "header_spread": lambda t: t.replace("7767517\n12 14\n", "7767517\n\n12\n  14\n"),
    "first_layer_on_the_header_line": lambda t: t.replace("7767517\n12 14\n", "7767517 12 14 "),
    "plus_counts": lambda t: t.replace("12 14\n", "+12 +14\n").replace("0 1 in0", "+0 +1 in0", 1),
    "minus_zero_count": lambda t: t.replace("0 1 in0", "-0 1 in0", 1),
    # numbers as ncnn's scan reads them: a sign, leading zeros, up to 31 characters
    "magic_and_counts_as_numbers": lambda t: t.replace("7767517\n12 14\n", "+07767517\n" + "0" * 29 + "12 +14\n"),
    # a layer's words over lines; its params are the rest of the line its last blob name is on
    "layer_words_over_lines": lambda t: t.replace(LN_3, "LayerNorm ln_3\n1\n\n1 2\r3 0=64"),
}



def test_a_nul_ends_a_layers_params_and_control_characters_are_escaped_in_messages():
    """ncnn reads a layer's params into a C string, so a NUL ends them and the rest of that line is not read: the
    rewrite reads them so, fused as without it (it had refused the line, its message cut at the NUL by ncnn's log).
    A control character in a message is written as \\xNN, one line a log shows whole."""
    text = (DATA / "transformer_block.ncnn.param").read_text()
    assert fuse(text.replace(LN_3 + " 1=1.000000e-5 2=1", LN_3 + " 1=1.000000e-5 2=1\0junk 7=x"))[1] == fuse(text)[1]
    # a word is a C string too: ln_3's top "3\0zz" is blob 3, and no NUL reaches the text ncnn loads
    named = fuse(text.replace(LN_3, LN_3.replace(" 2 3 ", " 2 3\0zz ")))
    assert named == fuse(text) and "\0" not in named[0]
    with pytest.raises(ValueError, match=re.escape("line 4: layer ln: param '\\x01junk\\x1b' is not id=value")):
        fuse("7767517\n2 2\nInput in0 0 1 a\nLayerNorm ln 1 1 a y \x01junk\x1b\n")



@needs_graph
def test_the_rewrites_messages_are_utf8_with_other_bytes_escaped(tmp_path):
    """ncnn takes any bytes in a .param; the rewrite's message about one quotes the word, a byte that is not UTF-8
    written as \\xNN, so a log read as UTF-8 (Python's stderr) decodes it; UTF-8 names stay as they are."""
    path = tmp_path / "latin1.param"
    code = "import sys\nfrom vknorm import graph\nprint(graph.configure(graph.Net(), vulkan=False).load_param(sys.argv[1]))\n"
    # Latin-1, a UTF-16 surrogate, U+0085 and U+2028 (line breaks to Python's splitlines): each byte escaped
    for name, said in ((b"x\xe9", "x\\xe9"), (b"x\xed\xa0\x80", "x\\xed\\xa0\\x80"), (b"x\xc2\x85", "x\\xc2\\x85"),
                       ("x\u2028".encode(), "x\\xe2\\x80\\xa8")):
        path.write_bytes(b"7767517\n2 2\nInput in0 0 1 a\nLayerNorm caf\xc3\xa9 1 " + name + b" a y 0=8\n")
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
        assert proc.stdout == "-1\n", proc.stdout + proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if "vknorm" in ln]
        assert len(lines) == 1 and f"line 4: expected layer caf\u00e9's top count, got '{said}'" in lines[0], proc.stderr

@needs_graph
def test_a_stock_net_refuses_fused_layers_by_their_type_not_by_a_word_that_starts_a_line():
    """A stock net (vknorm=False) names a fused layer type where it meets one, read as ncnn reads the text: a blob
    named vknorm.t that starts a line, a layer's words running over lines, is a blob (it had been refused as a
    fused layer); a fused layer on the header's line is found."""
    from vknorm import graph
    from vknorm._stdio import quiet_stderr

    wrapped = "7767517\n3 3\nInput in0 0 1 a\nLayerNorm ln 1 1 a\nvknorm.t 0=64 1=1e-5 2=0\nReLU r 1 1 vknorm.t out0\n"
    for kw in ({"vknorm": False}, {"fuse": False}, {}):
        net = graph.configure(graph.Net(**kw), vulkan=False)
        assert net.load_param_mem(wrapped) == 0, kw
    for fused in ("7767517 2 2 Input in0 0 1 a\nvknorm.LayerNorm ln 1 1 a out0 0=64 1=1e-5 2=0\n",
                  "7767517\r2 2\rInput in0 0 1 a\r\rvknorm.LayerNorm ln 1 1 a out0 0=64 1=1e-5 2=0\r"):  # (CR ends lines)
        logs = []
        with quiet_stderr(logs):
            assert graph.configure(graph.Net(vknorm=False), vulkan=False).load_param_mem(fused) == -1
        line = fused.replace("\r", "\n").split("\n").index("vknorm.LayerNorm ln 1 1 a out0 0=64 1=1e-5 2=0") + 1
        assert any(f"line {line}: layer ln is vknorm.LayerNorm, a fused vknorm layer" in ln for ln in logs), logs


@needs_graph
def test_a_blob_name_that_starts_with_a_nul_is_refused_at_load_not_a_crash(tmp_path):
    """ncnn reads a bottom named by a word that starts with a NUL as an empty name, which finds the next blob it
    makes: the layer then reads its own output, and ncnn's forward crashes (SIGSEGV, pyncnn too). vknorm.graph's
    nets refuse such a model at load_param, fused (the rewrite refuses the word) or not (the graph is checked)."""
    path = tmp_path / "nul.param"
    path.write_bytes(b"7767517\n3 3\nInput in0 0 1 in0\nReLU r 1 1 \0in0 1\nLayerNorm ln 1 1 1 out0 0=8 1=1e-5 2=0\n")
    code = ("import sys\nfrom vknorm import graph\n"
            "for kw in ({}, {'fuse': False}, {'vknorm': False}):\n"
            "    print(graph.configure(graph.Net(**kw), vulkan=False).load_param(sys.argv[1]), flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["-1"] * 3, proc.stdout + proc.stderr
    assert "line 4: a word starts with a NUL byte" in proc.stderr, proc.stderr
    assert proc.stderr.count("layer r reads blob 1, which it or a later layer makes") == 2, proc.stderr

@needs_graph
@pytest.mark.parametrize("form", TEXT_FORMS)
def test_a_param_written_as_ncnn_reads_it_loads_fused_in_every_reader(tmp_path, form):
    """ncnn reads a .param as words wherever the lines break (the magic number, the counts, each layer's type,
    name, counts and blob names; the params are the rest of the last blob name's line), and a count with a sign
    as the number: the load-time rewrite (vknorm.graph's default), check's reader and vknorm optimize read such a
    model as ncnn does, fused as the model written the usual way (the rewrite had refused "7767517 12 14" as
    "expected 7767517, got '7767517'")."""
    from vknorm import check

    p, b = DATA / "transformer_block.ncnn.param", DATA / "transformer_block.ncnn.bin"
    text = Path(p).read_text()
    written = TEXT_FORMS[form](text)
    assert written != text
    form_p = tmp_path / "form.param"
    form_p.write_text(written)
    assert [layer.name for layer in check.parse_param(str(form_p)).layers] == \
        [layer.name for layer in check.parse_param(str(p)).layers]
    assert fuse(written)[1] == fuse(text)[1] != []
    assert loads_in_each_net(form_p, b) == ["load 0 0 2", "load 0 0 0", "load 0 0 0"]
    out = tmp_path / "out.param"
    opt = subprocess.run([sys.executable, "-m", "vknorm", "optimize", str(form_p), str(b), str(out),
                          str(tmp_path / "out.bin")], capture_output=True, text=True, timeout=120)
    assert opt.returncode == 0 and out.read_text().startswith("7767517\n"), opt.stderr[-2000:]

# ------------------------------------------------------------------------------------------ params as ncnn reads them

ADD_LN_SWISH = ("7767517\n5 5\nInput in0 0 1 in0\nInput in1 0 1 in1\nBinaryOp add 2 1 in0 in1 s {op}\n"
                "LayerNorm ln 1 1 s y 0=16 1=1e-5 2=1\nSwish act 1 1 y out0\n")


@needs_graph
@pytest.mark.parametrize("op,is_add", [
    ("00=1", False),     # id 00 is id 0: a subtract
    ("+0=1", False),     # so is +0
    ("0=0 0=2", False),  # an id given twice: the last wins, a multiply
    ("0=2 0=0", True),   # the last says add
    ("00=0", True),
], ids=["00=1", "+0=1", "0=0 0=2", "0=2 0=0", "00=0"])
def test_a_binaryop_is_fused_only_where_ncnn_reads_it_as_an_add(tmp_path, op, is_add):
    """ncnn's ParamDict reads a param's id as a number and lets the last of an id given twice win: the rewrite
    reads the BinaryOp the same way, so a subtract or multiply spelled so is never fused as an add, and the model
    gives what stock ncnn gives."""
    text = ADD_LN_SWISH.format(op=op)
    _, fused = fuse(text)
    assert [f["pattern"] for f in fused] == ["BinaryOp+LayerNorm+Swish" if is_add else "LayerNorm+Swish"]
    weights = np.concatenate([np.ones(16), np.zeros(16)]).astype(np.float32).tobytes()
    p, b = write_model(tmp_path, text, weights)
    rng = np.random.default_rng(5)
    inputs = {"in0": rng.standard_normal((8, 16)).astype(np.float32),
              "in1": (rng.standard_normal((8, 16)) * 3 + 2).astype(np.float32)}
    ref = run_graph(p, b, inputs, vknorm_layers=False, vulkan=False)[0]["out0"]
    got, net = run_graph(p, b, inputs)
    assert len(net.fused()) == 1
    assert float(np.abs(got["out0"] - ref).max()) <= FP32_TOL * max(1.0, float(np.abs(ref).max()))


@needs_graph
def test_a_string_param_with_spaces_is_one_param_as_ncnn_reads_it(tmp_path):
    """ncnn reads a double-quoted string param whole, spaces included (5="a b"): the rewrite, vknorm optimize and
    vknorm check read it the same way (before, the space split it into a token that is not id=value, and the
    model stock ncnn loads was refused), and the string is written back as it was."""
    text = ("7767517\n4 4\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 y 0=16 1=1e-05 2=0\nSwish act 1 1 y z\n"
            'Noop keep 1 1 z out0 5="a b  c"\n')
    out, fused = fuse(text)
    assert [f["pattern"] for f in fused] == ["LayerNorm+Swish"]
    assert re.search(r'\nNoop\s+keep\s+1 1 z out0 5="a b  c"\n', out), out
    # a quote inside a blob name is a character like any other there, as ncnn reads names
    quoted_name = text.replace(" y 0=16", ' y"q 0=16').replace("Swish act 1 1 y z", 'Swish act 1 1 y"q z')
    assert [f["pattern"] for f in fuse(quoted_name)[1]] == ["LayerNorm+Swish"]
    p, b = write_model(tmp_path, text)
    from vknorm import check

    assert len(check.parse_param(str(p)).layers) == 4
    (tmp_path / "quoted").mkdir()
    quoted_p, _ = write_model(tmp_path / "quoted", quoted_name)
    assert [ly.tops for ly in check.parse_param(str(quoted_p)).layers][1] == ['y"q']
    x = np.random.default_rng(6).standard_normal((6, 16)).astype(np.float32)
    ref = run_graph(p, b, {"in0": x}, vknorm_layers=False, vulkan=False)[0]["out0"]
    got, net = run_graph(p, b, {"in0": x})
    assert len(net.fused()) == 1
    assert float(np.abs(got["out0"] - ref).max()) <= FP32_TOL * max(1.0, float(np.abs(ref).max()))


@needs_graph
@pytest.mark.parametrize("relu", ["0=0 0=0.5", "00=0.5", "+0=0.5"])
def test_a_relu_slope_is_the_one_ncnn_reads(tmp_path, relu):
    """A ReLU's slope given twice (the last wins) or under a zero-padded or signed id is the slope ncnn's ReLU reads:
    the fused layer is a LeakyReLU of that slope, bit for bit stock ncnn in a CPU net."""
    text = f"7767517\n3 3\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 y 0=16 1=1e-05 2=0\nReLU act 1 1 y out0 {relu}\n"
    out, fused = fuse(text)
    assert [f["pattern"] for f in fused] == ["LayerNorm+ReLU"]
    (ln,) = [t for t in lines_of(out) if t[1] == "ln"]
    assert "9=2" in ln and [float(p.split(",")[1]) for p in ln if p.startswith("-23310=")] == [0.5], ln
    p, b = write_model(tmp_path, text)
    x = (np.random.default_rng(4).standard_normal((6, 16)) * 3).astype(np.float32)
    ref = run_graph(p, b, {"in0": x}, vknorm_layers=False, vulkan=False)[0]["out0"]
    assert (ref < 0).any()  # the slope is taken
    np.testing.assert_array_equal(run_graph(p, b, {"in0": x}, vulkan=False)[0]["out0"], ref)
    got = run_graph(p, b, {"in0": x})[0]["out0"]
    assert float(np.abs(got - ref).max()) <= FP32_TOL * max(1.0, float(np.abs(ref).max()))


@needs_graph
def test_a_top_named_again_is_left_unfused_and_the_model_loads_fused_or_not(tmp_path):
    """ncnn loads a model whose last layer writes a name already taken (Swish act 1 1 y y: a second blob named y,
    which no bottom or extract can reach, since ncnn finds a name's first blob). The rewrite leaves the layers
    writing such a name as they are: fused and unfused nets load it and give what stock ncnn gives."""
    text = ("7767517\n5 6\nInput in0 0 1 in0\nInput in1 0 1 in1\nBinaryOp add 2 1 in0 in1 s 0=0\n"
            "LayerNorm ln 1 1 s y 0=16 1=1e-5 2=1\nSwish act 1 1 y y\n")
    out, fused = fuse(text)
    assert fused == [] and [t[0] for t in lines_of(out)] == ["Input", "Input", "BinaryOp", "LayerNorm", "Swish"]
    assert out.splitlines()[1].split() == ["5", "5"]  # ncnn's count: a blob for each top, y twice
    weights = np.concatenate([np.ones(16), np.zeros(16)]).astype(np.float32).tobytes()
    p, b = write_model(tmp_path, text, weights)
    rng = np.random.default_rng(6)
    inputs = {k: rng.standard_normal((8, 16)).astype(np.float32) for k in ("in0", "in1")}
    ref = run_graph(p, b, inputs, vknorm_layers=False, vulkan=False, outputs=("y",))[0]["y"]
    for fuse_ in (True, False):
        got = run_graph(p, b, inputs, fuse_=fuse_, outputs=("y",))[0]["y"]
        assert float(np.abs(got - ref).max()) <= FP32_TOL * max(1.0, float(np.abs(ref).max())), fuse_


@needs_graph
def test_a_header_declaring_fewer_blobs_than_the_layers_make_is_refused_fused_or_not(tmp_path):
    from vknorm._stdio import quiet_stderr

    text = ("7767517\n4 3\nInput in0 0 1 in0\nInput in1 0 1 in1\nBinaryOp add 2 1 in0 in1 s 0=0\n"
            "LayerNorm ln 1 1 s out0 0=16 1=1e-5 2=0\n")
    p, _ = write_model(tmp_path, text)
    for fuse_ in (True, False):
        log: list = []
        with quiet_stderr(log):
            assert graph.Net(fuse=fuse_).load_param(str(p)) != 0
        if fuse_:
            assert any("line 2: the header says 3 blobs, the layers make 4" in ln for ln in log), log

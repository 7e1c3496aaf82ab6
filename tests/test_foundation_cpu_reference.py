"""CPU reference layers: vknorm's CPU LayerNorm/RMSNorm follow ncnn's CPU layers exactly.

* every case of ncnn's tests/test_layernorm.cpp and test_rmsnorm.cpp vs float64 numpy;
* bit-exact vs a numpy float32 emulation of ncnn's generic layer (two sequential passes, ncnn's order,
  y = (x*a + b)*gamma + beta);
* vs pyncnn's own LayerNorm/RMSNorm on the CPU (one-layer net, tests/pyncnn_layer.py);
* the Python mirror of ncnn's layer: ParamDict ids and defaults, load_model, grouping rules.
"""
from __future__ import annotations

import numpy as np
import pytest

import ncnn_cases
import vknorm
from pyncnn_layer import run_ncnn_layer
from reference import (FP32_TOL, all_cases, case_data, case_name, group_size, make_layer, max_abs_err, n_groups,
                       norm64, scale, storage_rule)

CASES = all_cases()


def ncnn_generic_f32(op: str, x: np.ndarray, affine_size: int, eps: float, affine: bool, gamma, beta) -> np.ndarray:
    """ncnn's src/layer/layernorm.cpp / rmsnorm.cpp in numpy float32: sequential sums (np.cumsum is
    sequential), every operation rounded to float32, ncnn's formula and order."""
    f = np.float32
    gs = group_size(x.shape, affine_size)
    rows = x.reshape(-1, gs).astype(f)
    n = f(gs)
    eps = f(eps)
    if op == "LayerNorm":
        mean = (np.cumsum(rows, axis=1, dtype=f)[:, -1] / n).astype(f)
        t = (rows - mean[:, None]).astype(f)
        var = (np.cumsum((t * t).astype(f), axis=1, dtype=f)[:, -1] / n).astype(f)
        a = (f(1) / np.sqrt((var + eps).astype(f))).astype(f)
        b = (-mean * a).astype(f)
        y = ((rows * a[:, None]).astype(f) + b[:, None]).astype(f)
        if affine:
            y = ((y * np.asarray(gamma, f)).astype(f) + np.asarray(beta, f)).astype(f)
    else:
        ms = (np.cumsum((rows * rows).astype(f), axis=1, dtype=f)[:, -1] / n).astype(f)
        a = (f(1) / np.sqrt((ms + eps).astype(f))).astype(f)
        y = (rows * a[:, None]).astype(f)
        if affine:
            y = (y * np.asarray(gamma, f)).astype(f)
    return y.reshape(x.shape)


def run_cpu(op, case, seed):
    x, gamma, beta = case_data(op, case, seed)
    layer = make_layer(op, case["affine_size"], case["eps"], case["affine"], gamma, beta)
    return x, gamma, beta, layer(x, device="cpu")


def test_cpu_reference_matches_float64_on_every_ncnn_case():
    failures = []
    for seed, (op, case) in enumerate(CASES):
        x, gamma, beta, y = run_cpu(op, case, seed)
        assert y.dtype == np.float32 and y.shape == x.shape
        ref = norm64(op, x, case["affine_size"], case["eps"], case["affine"], gamma, beta)
        err, bound = max_abs_err(y, ref), FP32_TOL * scale(ref)
        if not err <= bound:
            failures.append(f"{case_name(op, case)}: err {err:.3e} > {bound:.3e}")
    assert not failures, f"{len(failures)}/{len(CASES)} cases off float64:\n" + "\n".join(failures)


def test_cpu_reference_is_bit_exact_to_ncnn_generic_layer_float32_order():
    failures = []
    for seed, (op, case) in enumerate(CASES):
        x, gamma, beta, y = run_cpu(op, case, seed)
        want = ncnn_generic_f32(op, x, case["affine_size"], case["eps"], case["affine"], gamma, beta)
        if not np.array_equal(y, want):
            failures.append(f"{case_name(op, case)}: max diff {max_abs_err(y, want):.3e}")
    assert not failures, "not bit-exact to ncnn's generic float32 algorithm:\n" + "\n".join(failures)


@pytest.mark.parametrize("packing", [False, True], ids=["pack1", "packed"])
def test_cpu_reference_matches_pyncnn_cpu_layer_on_every_ncnn_case(packing):
    """pip ncnn runs LayerNorm_x86/RMSNorm_x86 (SIMD partial sums, FMA): a few ulp from the generic
    layer. Tolerance: 1e-5 x max(1, max|y|), and ncnn's own NearlyEqual (1e-3 LayerNorm, 1e-4 RMSNorm)."""
    failures = []
    for seed, (op, case) in enumerate(CASES):
        x, gamma, beta, y = run_cpu(op, case, seed)
        theirs = run_ncnn_layer(op, x, case["affine_size"], case["eps"], case["affine"], gamma, beta,
                                vulkan=False, fp16=False, packing=packing)
        err, bound = max_abs_err(y, theirs), FP32_TOL * scale(theirs)
        ncnn_eps = ncnn_cases.LAYERNORM_TEST_EPSILON if op == "LayerNorm" else ncnn_cases.RMSNORM_TEST_EPSILON
        diff = np.abs(y - theirs)
        nearly_equal = (diff <= ncnn_eps) | (diff < ncnn_eps * np.maximum(np.abs(y), np.abs(theirs)))
        if not (err <= bound and nearly_equal.all()):
            failures.append(f"{case_name(op, case)}: err {err:.3e} (bound {bound:.3e})")
    assert not failures, "CPU reference vs pyncnn CPU:\n" + "\n".join(failures)


@pytest.mark.parametrize("op,shape,affine_size", [
    ("LayerNorm", (197, 768), 768), ("RMSNorm", (64, 4096), 4096), ("LayerNorm", (16, 14, 14), 196),
    ("RMSNorm", (3, 2, 5, 33), 165), ("LayerNorm", (3, 2, 5, 33), 330),
], ids=lambda v: str(v))
def test_cpu_reference_matches_pyncnn_cpu_on_model_sized_blobs(op, shape, affine_size):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float32)
    gamma = (1 + 0.1 * rng.standard_normal(affine_size)).astype(np.float32)
    beta = (0.1 * rng.standard_normal(affine_size)).astype(np.float32)
    layer = make_layer(op, affine_size, 1e-5, True, gamma, beta)
    y = layer(x, device="cpu")
    theirs = run_ncnn_layer(op, x, affine_size, 1e-5, 1, gamma, beta, vulkan=False)
    assert max_abs_err(y, theirs) <= FP32_TOL * scale(theirs)
    ref = norm64(op, x, affine_size, 1e-5, True, gamma, beta)
    assert max_abs_err(y, ref) <= FP32_TOL * scale(ref)


# ------------------------------------------------------------------------------ the layer's interface

def test_constructor_and_from_param_use_ncnn_param_ids_and_defaults():
    for cls in (vknorm.LayerNorm, vknorm.RMSNorm):
        d = cls()
        assert (d.affine_size, d.affine) == (0, True) and d.eps == pytest.approx(0.001)
        p = cls.from_param({})
        assert (p.affine_size, p.affine) == (0, True) and p.eps == pytest.approx(0.001)
        q = cls.from_param({0: 768, 1: 1e-5, 2: 0})
        assert (q.affine_size, q.affine) == (768, False)
        assert q.eps == np.float32(1e-5)  # stored as ncnn's float
        with pytest.raises(ValueError):
            cls.from_param({3: 1})


def test_load_model_stores_gamma_and_beta_as_float32():
    ln = vknorm.LayerNorm(affine_size=4, eps=1e-5)
    ln.load_model(np.arange(4, dtype=np.float64), [0.5, 1.5, 2.5, 3.5])
    np.testing.assert_array_equal(ln.gamma, np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(ln.beta, np.array([0.5, 1.5, 2.5, 3.5], np.float32))
    rms = vknorm.RMSNorm(affine_size=3)
    rms.load_model(np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(rms.gamma, np.array([1, 2, 3], np.float32))


@pytest.mark.parametrize("op", ["LayerNorm", "RMSNorm"])
def test_affine_false_takes_no_weights_and_normalizes_without_them(op):
    cls = getattr(vknorm, op)
    layer = cls(affine_size=6, eps=0.01, affine=False)
    layer.load_model()  # nothing to load
    with pytest.raises(ValueError):
        layer.load_model(np.ones(6)) if op == "RMSNorm" else layer.load_model(np.ones(6), np.zeros(6))
    x = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    y = layer(x, device="cpu")
    np.testing.assert_allclose(y, norm64(op, x, 6, 0.01, False), atol=1e-5)


@pytest.mark.parametrize("shape,affine_size,expect", [
    ((10,), 10, 10), ((5, 7), 7, 7), ((3, 4, 6), 6, 6), ((3, 4, 6), 24, 24), ((3, 4, 6), 0, 24),
    ((2, 3, 4, 5), 5, 5), ((2, 3, 4, 5), 20, 20), ((2, 3, 4, 5), 60, 60), ((2, 3, 4, 5), 0, 60),
])
def test_groups_follow_ncnn_rules(shape, affine_size, expect):
    layer = vknorm.LayerNorm(affine_size=affine_size, affine=False)
    g = layer.groups(shape)
    assert g["group_size"] == expect == group_size(shape, affine_size)
    assert g["groups"] == n_groups(shape, affine_size)


def test_affine_false_grouping_on_dims3_whole_channel_matches_float64():
    """affine=0 with affine_size matching nothing: dims 3/4 normalize each whole channel (ncnn's rule)."""
    x = np.random.default_rng(2).standard_normal((3, 4, 6)).astype(np.float32)
    layer = vknorm.LayerNorm(affine_size=0, eps=1e-3, affine=False)
    y = layer(x, device="cpu")
    ref = norm64("LayerNorm", x, 0, 1e-3, False)
    assert max_abs_err(y, ref) <= FP32_TOL * scale(ref)
    assert abs(y[0].mean()) < 1e-5


def test_forward_inplace_on_numpy_writes_into_the_array():
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    ln = make_layer("LayerNorm", 8, 1e-5, True, np.full(8, 2, np.float32), np.full(8, 1, np.float32))
    want = ln(x, device="cpu")
    out = ln.forward_inplace(x, device="cpu")
    assert out is x
    np.testing.assert_array_equal(x, want)


def test_cpu_reference_accepts_float16_and_returns_float16():
    x = np.random.default_rng(4).standard_normal((6, 10)).astype(np.float16)
    rms = make_layer("RMSNorm", 10, 1e-5, True, np.linspace(0.5, 1.5, 10).astype(np.float32))
    y = rms(x, device="cpu")
    assert y.dtype == np.float16 and y.shape == x.shape
    ref = norm64("RMSNorm", x, 10, 1e-5, True, np.linspace(0.5, 1.5, 10).astype(np.float32))
    err, bound = storage_rule(y, ref, True)  # float32 arithmetic: the output's rounding to float16 only
    assert err <= bound, (err, bound)


def test_cpu_reference_accepts_float64_and_strided_input():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 20))
    ln = make_layer("LayerNorm", 10, 1e-5, False)
    view = x[:, ::2]
    y = ln(view, device="cpu")
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, ln(np.ascontiguousarray(view, np.float32), device="cpu"))

"""vknorm on Vulkan vs pyncnn's own LayerNorm/RMSNorm -- on ncnn's Vulkan path (lavapipe) and on its CPU path,
fp32 and fp16 -- for every ncnn test case and a few model-sized blobs.

ncnn is an independent float32 implementation that sums in its own orders, so the two differ by ncnn's own
rounding as well as vknorm's. The rule (reference.ncnn_rule), per element: |vknorm - ncnn| less the a-priori
bound of ncnn's float32 error on that input (reference.ncnn_float32_error: the sums' error bounds for groups
of n elements, then the coefficient and affine steps), less half a float16 spacing for each side whose output
is stored in float16, within vknorm's float32 rule, 1e-5 x max(1, max|y_ncnn|). Where ncnn's float16 path
rounds gamma/beta to float16 (its Vulkan layer), the exact shift that makes in float64 is part of its error.
Every comparison first checks that the bound holds for ncnn itself against float64 of the same input.
The fp16 comparison with ncnn's CPU path feeds it the fp16-rounded input (x86 ncnn has no fp16 storage for
these layers). ncnn runs RMSNORM_GPU_SKIPPED_CASES with TEST_LAYER_DISABLE_GPU_TESTING, so those are compared
with ncnn's CPU path only. A negative control shows the rule tells a different formula apart.
"""
from __future__ import annotations

import numpy as np
import pytest

import ncnn_cases
import vknorm
from pyncnn_layer import run_ncnn_layer, vulkan_available
from reference import (PATHS, all_cases, case_data, case_name, layernorm_from_stats, make_layer,
                       ncnn_float32_error, ncnn_rule, norm64, stats_raw_sums_f32, storage_rule)

CASES = all_cases()


def fp16_weights(gamma, beta):
    return tuple(None if w is None else np.asarray(w, np.float16).astype(np.float32) for w in (gamma, beta))


def ncnn_error(op, x, affine_size, eps, affine, gamma, beta, vulkan_fp16: bool) -> np.ndarray:
    """The bound of ncnn's error against float64 of (x, gamma, beta), per element. ncnn's Vulkan layer with
    float16 storage holds gamma/beta and each square in float16: its float64 result moves by the weights'
    rounding (computed exactly here) and its variance by the squares'."""
    if not vulkan_fp16 or not affine:
        return ncnn_float32_error(op, x, affine_size, eps, affine, gamma, beta, squares_in_fp16=vulkan_fp16)
    g16, b16 = fp16_weights(gamma, beta)
    shift = np.abs(norm64(op, x, affine_size, eps, affine, g16, b16) - norm64(op, x, affine_size, eps, affine, gamma, beta))
    return ncnn_float32_error(op, x, affine_size, eps, affine, g16, b16, squares_in_fp16=True) + shift


def gpu_skipped(op, case) -> bool:
    return op == "RMSNorm" and case in ncnn_cases.RMSNORM_GPU_SKIPPED_CASES


@pytest.fixture(scope="module")
def ncnn_results():
    """ncnn's outputs for every case, computed once: CPU fp32, CPU on fp16-rounded input, Vulkan fp32/fp16."""
    if not vulkan_available():
        pytest.fail("pyncnn sees no Vulkan device (lavapipe expected)")
    out = []
    for seed, (op, case) in enumerate(CASES):
        x, gamma, beta = case_data(op, case, seed)
        args = (case["affine_size"], case["eps"], case["affine"], gamma, beta)
        x16 = x.astype(np.float16)
        r = {
            "op": op, "case": case, "x": x, "x16": x16, "args": args,
            "layer": make_layer(op, *args),
            "cpu32": run_ncnn_layer(op, x, *args, vulkan=False),
            "cpu16": run_ncnn_layer(op, x16.astype(np.float32), *args, vulkan=False),
            "cpu32_error": ncnn_error(op, x, *args, vulkan_fp16=False),
            "cpu16_error": ncnn_error(op, x16, *args, vulkan_fp16=False),
        }
        if not gpu_skipped(op, case):
            r["vk32"] = run_ncnn_layer(op, x, *args, vulkan=True, fp16=False)
            r["vk16"] = run_ncnn_layer(op, x16.astype(np.float32), *args, vulkan=True, fp16=True)  # exact in float16
            r["vk32_error"] = r["cpu32_error"]
            r["vk16_error"] = ncnn_error(op, x16, *args, vulkan_fp16=True)
        out.append(r)
    return out


def compare(results, key: str, fp16: bool):
    failures = []
    compared = 0
    for r in results:
        if key not in r:
            continue
        theirs, their_error = r[key], r[key + "_error"]
        f64 = norm64(r["op"], r["x16"] if key.endswith("16") else r["x"], *r["args"])
        if ncnn_rule(f64, theirs, their_error, theirs_fp16=key == "vk16")[0] > 0:  # the bound must hold for ncnn
            failures.append(f"{case_name(r['op'], r['case'])}: ncnn's own error passes its derived bound")
        for path in PATHS:
            for packing in (False, True):
                opt = vknorm.Option(use_fp16_storage=fp16, use_packing_layout=packing, path=path)
                ours = r["layer"](r["x16"] if fp16 else r["x"], device="vulkan", option=opt)
                err, bound = ncnn_rule(ours, theirs, their_error, ours_fp16=fp16, theirs_fp16=key == "vk16")
                compared += 1
                if not err <= bound:
                    failures.append(f"{case_name(r['op'], r['case'])} path={path} packing={packing}: "
                                    f"{err:.3e} > {bound:.3e}")
    assert compared > 0
    assert not failures, f"vs ncnn {key}: {len(failures)} failure(s)\n" + "\n".join(failures[:40])


def test_fp32_matches_ncnn_vulkan_layer(ncnn_results):
    compare(ncnn_results, "vk32", fp16=False)


def test_fp16_storage_matches_ncnn_vulkan_layer_with_fp16_storage(ncnn_results):
    compare(ncnn_results, "vk16", fp16=True)


def test_fp32_matches_ncnn_cpu_layer(ncnn_results):
    compare(ncnn_results, "cpu32", fp16=False)


def test_fp16_storage_matches_ncnn_cpu_layer_on_the_fp16_rounded_input(ncnn_results):
    compare(ncnn_results, "cpu16", fp16=True)


MODEL_BLOBS = [
    ("LayerNorm", (197, 768), 768), ("RMSNorm", (32, 4096), 4096), ("LayerNorm", (16, 56, 56), 56),
    ("LayerNorm", (64, 7, 7), 49), ("RMSNorm", (4, 2, 3, 64), 64), ("LayerNorm", (4, 2, 8, 33), 264),
]


@pytest.mark.parametrize("op,shape,affine_size", MODEL_BLOBS, ids=[f"{o}-{'x'.join(map(str, s))}" for o, s, _ in MODEL_BLOBS])
def test_model_sized_blobs_match_float64_and_ncnn_vulkan_and_cpu(op, shape, affine_size):
    rng = np.random.default_rng(affine_size)
    x = (rng.standard_normal(shape) * 1.5 + 0.7).astype(np.float32)
    gamma = (1 + 0.2 * rng.standard_normal(affine_size)).astype(np.float32)
    beta = (0.2 * rng.standard_normal(affine_size)).astype(np.float32)
    layer = make_layer(op, affine_size, 1e-5, True, gamma, beta)
    args = (affine_size, 1e-5, 1, gamma, beta)
    failures = []
    for fp16 in (False, True):
        xin = x.astype(np.float16) if fp16 else x
        refs = {  # ncnn's output, whether it is stored in float16, the bound of its error
            "ncnn vulkan": (run_ncnn_layer(op, xin.astype(np.float32), *args, vulkan=True, fp16=fp16), fp16,
                            ncnn_error(op, xin, *args, vulkan_fp16=fp16)),
            "ncnn cpu": (run_ncnn_layer(op, xin.astype(np.float32), *args, vulkan=False), False,
                         ncnn_error(op, xin, *args, vulkan_fp16=False)),
        }
        f64 = norm64(op, xin, *args)
        for name, (theirs, theirs_fp16, their_error) in refs.items():  # the bound must hold for ncnn
            if ncnn_rule(f64, theirs, their_error, theirs_fp16=theirs_fp16)[0] > 0:
                failures.append(f"fp16={fp16}: {name}'s own error passes its derived bound")
        for packing in (False, True):
            ours = layer(xin, device="vulkan", option=vknorm.Option(use_fp16_storage=fp16, use_packing_layout=packing))
            # ncnn's error bound grows with the group (8-12x the storage rule at 768 and 4096): float64 holds
            # vknorm to its own rule, ncnn to the looser one
            err, bound = storage_rule(ours, f64, fp16)
            if not err <= bound:
                failures.append(f"fp16={fp16} packing={packing} vs float64: {err:.3e} > {bound:.3e}")
            for name, (theirs, theirs_fp16, their_error) in refs.items():
                err, bound = ncnn_rule(ours, theirs, their_error, ours_fp16=fp16, theirs_fp16=theirs_fp16)
                if not err <= bound:
                    failures.append(f"fp16={fp16} packing={packing} vs {name}: {err:.3e} > {bound:.3e}")
    assert not failures, "\n".join(failures)


def test_the_rule_tells_another_formula_from_ncnn(ncnn_results):
    """Negative control: LayerNorm with an n - 1 variance (torch.var's default) in float64 -- closer to ncnn than
    any float32 kernel could be, but another formula -- fails the rule against ncnn's CPU layer in every ncnn
    case (its groups are small, so the difference, about |y| / 2n, passes the sums' error bound), and float64
    of ncnn's own formula passes it everywhere."""
    judged = failed = 0
    for r in ncnn_results:
        if r["op"] != "LayerNorm":
            continue
        x, (affine_size, eps, affine, gamma, beta) = r["x"], r["args"]
        honest = norm64("LayerNorm", x, affine_size, eps, affine, gamma, beta)
        assert ncnn_rule(honest, r["cpu32"], r["cpu32_error"])[0] == 0.0, case_name(r["op"], r["case"])
        err, bound = ncnn_rule(norm64("LayerNorm", x, affine_size, eps, affine, gamma, beta, ddof=1), r["cpu32"],
                               r["cpu32_error"])
        judged += 1
        failed += err > bound
    assert judged >= 10 and failed == judged, (failed, judged)


def test_the_rule_tells_a_float32_one_pass_kernel_from_ncnn_far_from_zero():
    """Negative control where |mean| >> std: rows of 768 at 1000 + U(-1.2, 1.2). A float32 kernel taking
    var = E[x^2] - mean^2 (tree-reduced sums) loses the variance to cancellation and fails the rule against
    ncnn's two-pass CPU layer; float64 and vknorm pass it. The bound stays finite and below the one-pass
    kernel's error there (its variance term is relative to var, not to mean^2)."""
    rng = np.random.default_rng(11)
    x = (1000 + rng.uniform(-1.2, 1.2, (8, 768))).astype(np.float32)
    args = (768, 1e-5, 0, None, None)
    theirs = run_ncnn_layer("LayerNorm", x, *args, vulkan=False)
    their_error = ncnn_error("LayerNorm", x, *args, vulkan_fp16=False)
    assert np.isfinite(their_error).all()
    assert ncnn_rule(norm64("LayerNorm", x, *args), theirs, their_error)[0] == 0.0
    ours = make_layer("LayerNorm", *args)(x, device="vulkan")
    err, bound = ncnn_rule(ours, theirs, their_error)
    assert err <= bound, (err, bound)
    one_pass = layernorm_from_stats(x, *stats_raw_sums_f32(x), 1e-5)
    err, bound = ncnn_rule(one_pass, theirs, their_error)
    assert err > bound, (err, bound)

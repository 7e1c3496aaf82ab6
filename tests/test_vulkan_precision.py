"""Precision where ncnn's formula breaks — large offsets (|mean| >> std), constant
groups, eps = 0, NaN/Inf — on every path, fp32 storage, packing off and on.

* Large offsets: groups from N(1e4, 1e-2) and N(-3e3, 1), group sizes 768 and 65537: output within the
  float32 rule (FP32_TOL x max(1, max|y|)) of float64 computed from the same float32 input. numpy float32
  emulations of a raw sum / sum-of-squares reduction, of a float32 running mean and of a two-pass
  reduction without a pivot FAIL that same check (kept as a test).
* Constant groups -> beta within 1e-5 (affine) or 0 (no affine); eps = 0 on non-constant groups.
* NaN/Inf in one group -> that group's NaNs exactly where the CPU reference has them, every other
  group untouched (fp32 tolerance vs float64).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import vknorm
from reference import (FP16_TOL, FP32_TOL, PATHS, channel_norm64, check_dispatch, layernorm_from_stats,
                       make_channel_norm, make_layer, max_abs_err, norm64, scale, stats_raw_sums_f32,
                       stats_running_mean_f32, stats_shifted_one_reduction_f32, stats_two_pass, storage_rule)

OFFSETS = [(1e4, 1e-2), (-3e3, 1.0)]
OFFSET_SIZES = [768, 65537]
N_GROUPS = 8  # two pack4 elements of four rows each


def offset_input(mu: float, sd: float, size: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (mu + sd * rng.standard_normal((N_GROUPS, size))).astype(np.float32)


def offset_id(v):
    return f"N({v[0]:g},{v[1]:g})" if isinstance(v, tuple) else str(v)


# ------------------------------------------------------------------------------ large offsets

@pytest.mark.parametrize("size", OFFSET_SIZES)
@pytest.mark.parametrize("dist", OFFSETS, ids=offset_id)
def test_large_offsets_match_float64_within_the_fp32_rule_on_every_path(dist, size, vulkan_device):
    x = offset_input(*dist, size)
    rng = np.random.default_rng(1)
    gamma = (1 + 0.5 * rng.standard_normal(size)).astype(np.float32)
    beta = (0.5 * rng.standard_normal(size)).astype(np.float32)
    layers = {
        "LayerNorm": make_layer("LayerNorm", size, 1e-5, False),
        "LayerNorm+affine": make_layer("LayerNorm", size, 1e-5, True, gamma, beta),
        "RMSNorm+affine": make_layer("RMSNorm", size, 1e-5, True, gamma),
    }
    refs = {
        "LayerNorm": norm64("LayerNorm", x, size, 1e-5, False),
        "LayerNorm+affine": norm64("LayerNorm", x, size, 1e-5, True, gamma, beta),
        "RMSNorm+affine": norm64("RMSNorm", x, size, 1e-5, True, gamma),
    }
    failures = []
    for name, layer in layers.items():
        for path in PATHS:
            for packing in (False, True):
                y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing))
                err, bound = max_abs_err(y, refs[name]), FP32_TOL * scale(refs[name])
                if not err <= bound:
                    failures.append(f"{name} path={path} packing={packing} ({layer.last_dispatch['path']}): "
                                    f"max abs error {err:.3e} > {bound:.3e}")
                problem = check_dispatch(layer.last_dispatch, path, size, vulkan_device)
                if problem:
                    failures.append(f"{name} path={path} packing={packing}: {problem}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("size", OFFSET_SIZES)
@pytest.mark.parametrize("dist", OFFSETS, ids=offset_id)
def test_reductions_without_a_pivot_fail_the_large_offset_check(dist, size):
    """Why the shaders keep a pivot: the same check rejects plain sums, a float32 running mean and a float32
    two-pass reduction (mean, then squares about it) that does not shift by a pivot first."""
    x = offset_input(*dist, size)
    ref = norm64("LayerNorm", x, size, 1e-5, False)
    bound = FP32_TOL * scale(ref)
    for what, stats in (("raw sum/sumsq", stats_raw_sums_f32), ("float32 running mean", stats_running_mean_f32),
                        ("float32 two-pass without a pivot", stats_two_pass)):
        mean, var = stats(x)
        err = max_abs_err(layernorm_from_stats(x, mean, var, 1e-5), ref)
        assert err > bound, f"{what} unexpectedly within tolerance ({err:.3e} <= {bound:.3e})"


@pytest.mark.parametrize("size", [64, 768, 4096])
def test_the_float16_rule_passes_float32_accumulation_and_fails_float16_accumulation(size):
    """The float16 storage rule (reference.storage_rule: past the output's own rounding, the float32 rule): a
    numpy kernel that reads float16, reduces in float32 and rounds its output to float16 passes it; the same with
    its sums in float16 (every addition rounded) fails it, while within FP16_TOL (4e-3 of the scale), the
    tolerance used where a reference saw the unrounded input."""
    x16 = (np.random.default_rng(size).standard_normal((8, size)) * 2 + 1).astype(np.float16)
    ref = norm64("LayerNorm", x16, size, 1e-5, False)

    def kernel(dtype):
        return layernorm_from_stats(x16, *stats_two_pass(x16, dtype), 1e-5).astype(np.float16)

    err32, bound = storage_rule(kernel(np.float32), ref, True)
    assert err32 <= bound, (err32, bound)
    y16 = kernel(np.float16)
    err16, _ = storage_rule(y16, ref, True)
    assert err16 > bound, f"float16 accumulation passed the float16 rule ({err16:.3e} <= {bound:.3e})"
    assert max_abs_err(y16, ref) <= FP16_TOL * scale(ref)  # the contrast: FP16_TOL would pass it


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_the_storage_rule_treats_infinities_and_nan_alike_in_both_storages(fp16):
    """An output equal to an infinite reference is no error, in float32 as in float16 storage (float32 counted
    inf - inf as an infinite error); an infinity against a finite value or the other sign, and NaN on either side,
    are infinite errors; the scale is of the finite values."""
    ref = np.array([np.inf, -np.inf, 1.5, -3.0])
    assert storage_rule(ref.copy(), ref, fp16) == (0.0, FP32_TOL * 3.0)
    for y in ([np.inf, np.inf, 1.5, -3.0], [np.inf, -np.inf, np.inf, -3.0], [np.inf, -np.inf, np.nan, -3.0]):
        assert storage_rule(np.array(y), ref, fp16)[0] == math.inf, y
    assert storage_rule(ref.copy(), np.array([np.inf, -np.inf, np.nan, -3.0]), fp16)[0] == math.inf


def failures_on_every_path(layer, x, ref, bound, check_dispatch_info=None) -> list:
    """Each forced path, packing off and on: a line per run whose max abs error exceeds bound, and per
    run that check_dispatch_info(path, packing, last_dispatch) describes as wrong."""
    failures = []
    for path in PATHS:
        for packing in (False, True):
            y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing))
            err = max_abs_err(y, ref)
            if not err <= bound:
                failures.append(f"path={path} packing={packing} ran {layer.last_dispatch['path']}: "
                                f"max abs error {err:.3e} > {bound:.3e}")
            problem = check_dispatch_info and check_dispatch_info(path, packing, layer.last_dispatch)
            if problem:
                failures.append(problem)
    return failures


@pytest.mark.parametrize("size", [768, 4097])
def test_a_massive_activation_as_the_pivot_stays_exact_on_every_path(size, vulkan_device):
    """The first element of each group (the natural pivot) is a massive activation (1000 among N(0, 1),
    as LLM hidden states have): the pivot is then far from the group's bulk, the same |mean - pivot| >> std
    situation as a large offset. ncnn's own float32 formula meets the fp32 tolerance here
    (asserted), so every Vulkan path must too."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((N_GROUPS, size)).astype(np.float32)
    x[:, 0] = 1000.0
    layer = make_layer("LayerNorm", size, 1e-5, False)
    ref = norm64("LayerNorm", x, size, 1e-5, False)
    bound = FP32_TOL * scale(ref)
    assert max_abs_err(layer(x, device="cpu"), ref) <= bound
    failures = failures_on_every_path(layer, x, ref, bound)
    assert not failures, "\n".join(failures)


def massive_pivot_input(size: int) -> np.ndarray:
    """The first four elements of every group (what the fused kernel averages into its pivot) are massive
    activations among N(0, 1): the pivot sits ~1000 std from the group's mean."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((N_GROUPS, size)).astype(np.float32)
    x[:, :4] = 1000.0
    return x


@pytest.mark.parametrize("size", [768, 4097])
def test_a_pivot_of_massive_activations_takes_the_second_pass_on_every_path(size, vulkan_device):
    """The fused kernel reduces the pivot-shifted sum and sum of squares together; where they would cancel
    (here E[d]^2 / var ~ size / 4) it must take the second pass and stay at the fp32 tolerance."""
    x = massive_pivot_input(size)
    layer = make_layer("LayerNorm", size, 1e-5, False)
    ref = norm64("LayerNorm", x, size, 1e-5, False)
    bound = FP32_TOL * scale(ref)

    def one_reduction_ran(path, packing, info):
        if path == "workgroup" and not info["one_reduction"]:
            return f"packing={packing}: the workgroup team did not use the one-reduction kernel"

    failures = failures_on_every_path(layer, x, ref, bound, one_reduction_ran)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("size", [768, 4097])
def test_one_reduction_without_the_second_pass_fails_the_massive_pivot_check(size):
    """Why the one-reduction kernel keeps its second pass: E[d^2] - E[d]^2 alone misses the same bound."""
    x = massive_pivot_input(size)
    ref = norm64("LayerNorm", x, size, 1e-5, False)
    mean, var = stats_shifted_one_reduction_f32(x)
    err = max_abs_err(layernorm_from_stats(x, mean, var, 1e-5), ref)
    assert err > FP32_TOL * scale(ref), f"one reduction unexpectedly within tolerance ({err:.3e})"


# ------------------------------------------------------------------------------ constant groups, eps = 0

CONSTANTS = [0.0, 1.0, -3.5, 1234.567, 1e4, -3e3, 1e-30, 3.0e38]


@pytest.mark.parametrize("size", [1, 3, 768, 4097, 65537])
def test_constant_groups_give_beta_within_1e_5(size):
    rows = len(CONSTANTS)  # 8 rows: packs by 4
    x = np.repeat(np.array(CONSTANTS, np.float32)[:, None], size, axis=1)
    rng = np.random.default_rng(3)
    gamma = rng.uniform(-2, 2, size).astype(np.float32)
    beta = rng.uniform(-2, 2, size).astype(np.float32)
    with_affine = make_layer("LayerNorm", size, 1e-5, True, gamma, beta)
    without = make_layer("LayerNorm", size, 1e-5, False)
    failures = []
    for path in PATHS:
        for packing in (False, True):
            opt = vknorm.Option(path=path, use_packing_layout=packing)
            y = with_affine(x, device="vulkan", option=opt)
            err = max_abs_err(y, np.broadcast_to(beta, (rows, size)))
            if not err <= 1e-5:
                bad = sorted({CONSTANTS[i] for i in np.flatnonzero(~(np.abs(y - beta) <= 1e-5).all(axis=1))})
                failures.append(f"affine path={path} packing={packing}: max |y - beta| {err:.3e}, constants {bad}")
            y0 = without(x, device="vulkan", option=opt)
            err0 = max_abs_err(y0, np.zeros_like(y0))
            if not err0 <= 1e-5:
                failures.append(f"no affine path={path} packing={packing}: max |y| {err0:.3e}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("size", [1, 3, 768, 4097, 65537])
@pytest.mark.parametrize("op", ["LayerNorm", "RMSNorm"])
def test_eps_zero_on_zero_variance_groups_gives_nan_as_ncnns_cpu_layer(op, size):
    """var + eps = 0: ncnn's CPU layer divides by sqrt(0) and its outputs are NaN (the CPU reference's too). The
    kernels' inverse square root is defined there (+Inf, where inversesqrt(0) is undefined: any value a driver
    likes), so every path gives NaN, in both storages, rather than beta or a driver's choice. Groups beside
    them with a variance stay finite."""
    # a mean square of 0 needs zeros; constants whose float32 sums stay exact, so ncnn's CPU mean is exact too
    zero_var = [0.0] if op == "RMSNorm" else [0.0, 1.0, -3.5, 0.25]
    rows = np.array(zero_var * (4 // len(zero_var) + 1), np.float32)[:4]
    x = np.concatenate([np.repeat(rows[:, None], size, axis=1),
                        np.random.default_rng(6).standard_normal((4, size)).astype(np.float32) + 1.0])
    gamma = np.linspace(0.5, 1.5, size, dtype=np.float32)
    beta = np.linspace(-1, 1, size, dtype=np.float32)
    layer = make_layer(op, size, 0.0, True, gamma, beta)
    cpu = layer(x, device="cpu")
    assert np.isnan(cpu[:4]).all()
    if size > 1:  # a group of one element has no variance either
        assert np.isfinite(cpu[4:]).all()
    failures = []
    for path in PATHS:
        for fp16 in (False, True):
            y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_fp16_storage=fp16))
            if not (np.isnan(y) == np.isnan(cpu)).all():
                failures.append(f"path={path} fp16={fp16}: NaN at {np.argwhere(np.isnan(y) != np.isnan(cpu))[:4].tolist()}")
            elif size > 1:  # the groups with a variance: float64 of the input as stored, by the storage's rule
                read = x[4:].astype(np.float16) if fp16 else x[4:]
                err, bound = storage_rule(y[4:], norm64(op, read, size, 0.0, True, gamma, beta), fp16)
                if not err <= bound:
                    failures.append(f"path={path} fp16={fp16}: groups with a variance off by {err:.3e} > {bound:.3e}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("size", [2, 5, 33, 768, 4097])
@pytest.mark.parametrize("op", ["LayerNorm", "RMSNorm"])
def test_eps_zero_on_non_constant_groups_matches_float64(op, size):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((8, size)) * rng.uniform(0.01, 10, (8, 1)) + rng.uniform(-5, 5, (8, 1))).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, size).astype(np.float32)
    beta = rng.uniform(-1, 1, size).astype(np.float32)
    layer = make_layer(op, size, 0.0, True, gamma, beta)
    assert layer.eps == 0.0
    ref = norm64(op, x, size, 0.0, True, gamma, beta)
    cpu = layer(x, device="cpu")
    failures = []
    for path in PATHS:
        for packing in (False, True):
            y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing))
            for label, r in (("float64", ref), ("CPU reference", cpu)):
                err, bound = max_abs_err(y, r), FP32_TOL * scale(r)
                if not err <= bound:
                    failures.append(f"path={path} packing={packing} vs {label}: {err:.3e} > {bound:.3e}")
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------ NaN / Inf

NONFINITE = [("nan", np.nan), ("+inf", np.inf), ("-inf", -np.inf)]


@pytest.mark.parametrize("size", [37, 1500, 70000])
@pytest.mark.parametrize("op", ["LayerNorm", "RMSNorm"])
def test_nan_or_inf_in_one_group_poisons_that_group_as_the_cpu_reference_and_no_other(op, size):
    rng = np.random.default_rng(5)
    base = rng.standard_normal((8, size)).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, size).astype(np.float32)
    beta = rng.uniform(-1, 1, size).astype(np.float32)
    layer = make_layer(op, size, 1e-5, True, gamma, beta)
    bad_row = 5
    others = [r for r in range(8) if r != bad_row]
    ref_others = norm64(op, base[others], size, 1e-5, True, gamma, beta)
    bound = FP32_TOL * scale(ref_others)
    failures = []
    for name, value in NONFINITE:
        for pos in (0, size // 2):  # the pivot itself, and an element in the middle
            x = base.copy()
            x[bad_row, pos] = value
            cpu = layer(x, device="cpu")
            cpu_nan = np.isnan(cpu[bad_row])
            if op == "LayerNorm" or name == "nan":
                assert cpu_nan.all(), f"CPU reference: {name} should make the whole group NaN"
            for path in PATHS:
                for packing in (False, True):
                    y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing))
                    what = f"{name} at {pos}, path={path} ({layer.last_dispatch['path']}) packing={packing}"
                    vk_nan = np.isnan(y[bad_row])
                    if not np.array_equal(vk_nan, cpu_nan):
                        sample_vals = y[bad_row][vk_nan != cpu_nan][:3]
                        failures.append(f"{what}: {int(vk_nan.sum())} NaN in the group, CPU reference has "
                                        f"{int(cpu_nan.sum())} (e.g. {sample_vals} where CPU has "
                                        f"{cpu[bad_row][vk_nan != cpu_nan][:3]})")
                    elif (~cpu_nan).any() and not np.allclose(y[bad_row][~cpu_nan], cpu[bad_row][~cpu_nan], atol=1e-5):
                        failures.append(f"{what}: finite values differ from the CPU reference")
                    err = max_abs_err(y[others], ref_others)
                    if not err <= bound:
                        failures.append(f"{what}: other groups changed, max abs error {err:.3e} > {bound:.3e}")
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures[:30])


# ------------------------------------------------------------------------------ squares past float32's range

# Finite values whose squared deviations (~1e39-1e40) are not: the variance is inf, 1/sqrt(var + eps) is 0 and
# the CPU reference gives y = 0 (beta with affine) for the group. Two ways to get there: +-3e19 in the group's
# middle (the split path's merge of chunk statistics must not make inf * 0 = NaN of it), and 1e20 as the first
# element, inside the fused kernel's pivot (its one-reduction variance, sum_sq/n - mean^2, must not be inf - inf).
def squares_past_float32(x, row, pattern):
    size = x.shape[-1]
    if pattern == "+-3e19":
        x[row, 0], x[row, size // 2] = 3e19, -3e19
    else:
        x[row, 0] = 1e20


@pytest.mark.parametrize("pattern", ["+-3e19", "1e20 first"])
@pytest.mark.parametrize("size", [37, 1500, 2048, 70000])
def test_a_group_whose_squares_overflow_float32_gives_the_cpu_reference_s_zeros_on_every_path(size, pattern):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((8, size)).astype(np.float32)
    big_row = 2
    squares_past_float32(x, big_row, pattern)
    gamma = rng.uniform(0.5, 1.5, size).astype(np.float32)
    beta = rng.uniform(-1, 1, size).astype(np.float32)
    layer = make_layer("LayerNorm", size, 1e-5, True, gamma, beta)
    cpu = layer(x, device="cpu")
    assert np.array_equal(cpu[big_row], beta), "CPU reference: an infinite variance should leave beta"
    others = [r for r in range(8) if r != big_row]
    ref_others = norm64("LayerNorm", x[others], size, 1e-5, True, gamma, beta)
    bound = FP32_TOL * scale(ref_others)
    failures = []
    for path in PATHS:
        for packing in (False, True):
            y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing))
            d = layer.last_dispatch
            what = f"path={path} ({d['path']}, one_reduction={d.get('one_reduction')}) packing={packing}"
            if not np.array_equal(y[big_row], beta):
                failures.append(f"{what}: the overflowing group gave {y[big_row][:4]}..., not beta "
                                f"({int(np.isnan(y[big_row]).sum())} NaN)")
            err = max_abs_err(y[others], ref_others)
            if not err <= bound:
                failures.append(f"{what}: other groups {err:.3e} > {bound:.3e}")
    assert not failures, "\n".join(failures)


# Squares about the pivot (the mean of a group's first 4 elements) exceed squares about the mean by n * (mean -
# pivot)^2. With the pivot 2a away from the other 8188 of 8192 elements, their sum passes float32's range from a ~
# 1e17 while the squared deviations from the mean sum to ~16 a^2: the variance is finite, the first 4 elements
# normalize to ~45 and ncnn's CPU layer, which squares deviations from the mean, gives them.
@pytest.mark.parametrize("a", [1.1e17, 2e17])
@pytest.mark.parametrize("op", ["LayerNorm", "GroupNorm", "InstanceNorm"])
def test_a_group_whose_squares_about_the_pivot_overflow_but_whose_variance_fits_is_normalized_on_every_path(op, a):
    rng = np.random.default_rng(8)
    if op == "LayerNorm":
        x = rng.standard_normal((8, 8192)).astype(np.float32)
        big = x[2]                         # a view: one row of 8192
        layer = make_layer("LayerNorm", 8192, 1e-5, False)
    else:
        x = rng.standard_normal((8, 64, 128) if op == "InstanceNorm" else (8, 64, 64)).astype(np.float32)
        big = x[2:4].reshape(-1) if op == "GroupNorm" else x[2].reshape(-1)  # GroupNorm(4, 8): channels 2-3
        layer = make_channel_norm(op, 8, 1e-5, False, group=4)
    assert big.size == 8192 and np.shares_memory(big, x)
    big[:4], big[4:] = a, -a
    first = int(np.argmax(x.reshape(-1) == np.float32(a)))  # the group's first element, normalized to ~45
    ref = (norm64("LayerNorm", x, 8192, 1e-5, False) if op == "LayerNorm" else channel_norm64(op, x, 1e-5, group=4))
    assert np.isfinite(ref).all() and np.abs(ref).max() > 40
    cpu = layer(x, device="cpu")
    assert np.isfinite(cpu).all() and np.abs(cpu).max() > 40, "CPU reference (ncnn's formula): finite, not zeros"
    bound = FP32_TOL * scale(ref)
    failures = []
    for path in PATHS + ("cooperative",):
        for packing in (False, True):
            y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing))
            d = layer.last_dispatch
            err = max_abs_err(y, ref)
            if not err <= bound:
                failures.append(f"path={path} ({d['path']}, one_reduction={d.get('one_reduction')}) "
                                f"packing={packing}: max error {err:.3e} > {bound:.3e}; the group's first element "
                                f"{y.reshape(-1)[first]:.4g}, float64 {ref.reshape(-1)[first]:.4g}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("op", ["GroupNorm", "InstanceNorm"])
def test_channel_norms_whose_squares_overflow_float32_give_the_cpu_reference_s_zeros_on_every_path(op):
    """The same for groups of channel planes: 1e20 first in every plane of 8x8 (the fused kernel's one reduction
    runs there on packing off) and +-3e19 in one channel's middle."""
    rng = np.random.default_rng(7)
    layer = (vknorm.GroupNorm(group=4, channels=8, eps=1e-5, affine=False) if op == "GroupNorm"
             else vknorm.InstanceNorm(channels=8, eps=1e-5, affine=False))
    failures = []
    for pattern in ("+-3e19", "1e20 first"):
        x = rng.standard_normal((8, 8, 8)).astype(np.float32)
        if pattern == "1e20 first":
            x[:, 0, 0] = 1e20
        else:
            x[3, 0, 0], x[3, 4, 4] = 3e19, -3e19
        cpu = layer(x, device="cpu")
        assert not np.isnan(cpu).any()
        # the overflowing groups (every one with 1e20 first; the one with channel 3 otherwise) are exactly 0
        big = slice(None) if pattern == "1e20 first" else (slice(2, 4) if op == "GroupNorm" else 3)
        assert not cpu[big].any(), "CPU reference: an infinite variance should leave 0 (no affine)"
        for path in PATHS:
            for packing in (False, True):
                y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing))
                d = layer.last_dispatch
                err = max_abs_err(y, cpu)
                if not err <= FP32_TOL * scale(cpu):
                    failures.append(f"{pattern} path={path} ({d['path']}, one_reduction={d.get('one_reduction')}) "
                                    f"packing={packing}: {int(np.isnan(y).sum())} NaN, max error {err:.3e}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("gamma0", [np.inf, -np.inf, 1e38], ids=["inf", "-inf", "1e38"])
def test_an_instance_norm_gamma_past_float32s_range_after_normalizing_gives_float64s_answer(gamma0):
    """ncnn's InstanceNorm folds gamma into one coefficient, a = gamma / sqrt(var + eps), and computes x * a + (beta -
    mean * a): where a overflows (an infinite gamma, or 1e38 over a std of 1e-3), inf - inf makes every output of
    the channel NaN, and the CPU reference follows it. The kernels normalize first and scale by gamma after, as
    for the other three norms (whose ncnn layers do the same): the channel is float64's answer, +-inf or finite
    (README). The channel beside it, with an ordinary gamma, is unaffected either way."""
    x = np.stack([1e-3 * np.array([[1, 2], [3, 4]], np.float32),
                  np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)])
    gamma = np.array([gamma0, 1.5], np.float32)
    beta = np.array([0.25, -0.5], np.float32)
    layer = make_channel_norm("InstanceNorm", 2, 1e-9, True, gamma, beta)
    ref = channel_norm64("InstanceNorm", x, 1e-9, gamma=gamma, beta=beta).astype(np.float32)
    assert np.isinf(ref[0]).all() if np.isinf(gamma0) else np.isfinite(ref[0]).all()
    cpu = layer(x, device="cpu")
    assert np.isnan(cpu[0]).all() and np.isfinite(cpu[1]).all()
    failures = []
    for path in PATHS:
        for packing in (False, True):
            y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing))
            infinite_as_float64 = (np.isinf(y[0]) == np.isinf(ref[0])).all() and (y[0][np.isinf(y[0])] ==
                                                                                    ref[0][np.isinf(ref[0])]).all()
            finite = np.isfinite(ref)
            err = max_abs_err(y[finite], ref[finite])
            bound = FP32_TOL * scale(ref[finite])
            if not (infinite_as_float64 and err <= bound and np.isfinite(y[1]).all()):
                failures.append(f"path={path} packing={packing}: {y.ravel().tolist()} against float64 "
                                f"{ref.ravel().tolist()}")
    assert not failures, "\n".join(failures)

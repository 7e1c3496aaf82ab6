"""Sizes: group_size 1 ... 2^20+7, group counts 1 ... 2^20, widths that are not a
multiple of 4 under pack4, dims 1-4 — every path, vs float64 and the CPU reference.

fp32 storage: max abs error <= 1e-5 * max(1, max|y|); fp16 storage, against float64 of the fp16-rounded input,
what the output's own rounding to float16 cannot explain <= 1e-5 * max(1, max|y|) (reference.storage_rule);
against the CPU reference (ncnn's float32 algorithm, its float16 output rounded too), what that algorithm's own
a-priori float32 error and each side's float16 rounding cannot explain, within the same 1e-5 rule
(reference.ncnn_rule; the CPU reference itself keeps to that error against float64). Layers are reused across
paths and packings.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vknorm
from reference import (FP32_TOL, PATHS, check_dispatch, group_size, make_layer, max_abs_err, n_groups,
                       ncnn_float32_error, ncnn_rule, norm64, scale, storage_rule)

GROUP_SIZES = [1, 2, 3, 5, 31, 33, 1023, 1025, 4097, 65537, 2**20 + 7]


def weights(rng, size):
    return (rng.uniform(0.5, 1.5, size).astype(np.float32), rng.uniform(-1, 1, size).astype(np.float32))


def run_all_paths(layer, op, x, affine_size, eps, gamma, beta, device, paths=PATHS, packings=(False, True),
                  storages=("fp32",), check_cpu=True):
    """Runs every (path, packing, storage); returns failure descriptions."""
    gs = group_size(x.shape, affine_size)
    failures = []
    refs = {}
    for storage in storages:
        xin = x.astype(np.float16) if storage == "fp16" else x
        ref = norm64(op, xin, affine_size, eps, layer.affine, gamma, beta)
        fp16 = storage == "fp16"
        cpu = layer(xin, device="cpu") if check_cpu else None
        if cpu is not None:
            cpu_error = ncnn_float32_error(op, xin, affine_size, eps, layer.affine, gamma, beta)
            if ncnn_rule(ref, cpu, cpu_error, theirs_fp16=fp16)[0] > 0:
                failures.append(f"{op}{x.shape} {storage}: the CPU reference is off float64 by more than its own float32 error bound")
        refs[storage] = ref
        for path in paths:
            for packing in packings:
                opt = vknorm.Option(path=path, use_packing_layout=packing, use_fp16_storage=fp16)
                y = layer(xin, device="vulkan", option=opt)
                what = f"{op}{x.shape} affine_size={affine_size} {storage} path={path} packing={packing}"
                if y.shape != x.shape or y.dtype != xin.dtype:
                    failures.append(f"{what}: got {y.dtype}{y.shape}")
                    continue
                err, bound = storage_rule(y, ref, fp16)
                if not err <= bound:
                    failures.append(f"{what} ran {layer.last_dispatch['path']}: vs float64 {err:.3e} > {bound:.3e}")
                if cpu is not None:
                    err, bound = ncnn_rule(y, cpu, cpu_error, ours_fp16=fp16, theirs_fp16=fp16)
                    if not err <= bound:
                        failures.append(f"{what} ran {layer.last_dispatch['path']}: vs CPU reference {err:.3e} > {bound:.3e}")
                problem = check_dispatch(layer.last_dispatch, path, gs, device)
                if problem:
                    failures.append(f"{what}: {problem}")
    return failures


# ------------------------------------------------------------------------------ group sizes

@pytest.mark.parametrize("size", GROUP_SIZES)
@pytest.mark.parametrize("op", ["LayerNorm", "RMSNorm"])
def test_group_sizes_from_1_to_2_pow_20_plus_7_on_every_path(op, size, vulkan_device):
    rng = np.random.default_rng(size)
    rows = 4 if size <= 65537 else 1  # 4 rows pack by 4; the 2^20+7 group stays one row to keep the suite fast
    x = (rng.standard_normal((rows, size)) * 3 + 1).astype(np.float32)
    gamma, beta = weights(rng, size)
    layer = make_layer(op, size, 1e-5, True, gamma, beta)
    storages = ("fp32", "fp16") if size <= 4097 else ("fp32",)
    failures = run_all_paths(layer, op, x, size, 1e-5, gamma, beta, vulkan_device, storages=storages)
    if size > 4097:  # fp16 storage on the big groups: auto path only
        failures += run_all_paths(layer, op, x, size, 1e-5, gamma, beta, vulkan_device, paths=("auto",),
                                  packings=(rows == 4,), storages=("fp16",), check_cpu=False)
    assert not failures, "\n".join(failures)


def test_one_huge_group_is_split_across_many_workgroups(vulkan_device):
    """A group larger than one workgroup's share runs the split path with several chunks."""
    size = 2**20 + 7
    layer = make_layer("LayerNorm", size, 1e-5, False)
    x = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    y = layer(x, device="vulkan", option=vknorm.Option(path="auto"))
    info = layer.last_dispatch
    assert info["path"] == "split", info
    assert info["chunks"] > 1, f"one group of 2^20+7 reduced by a single workgroup: {info}"
    ref = norm64("LayerNorm", x, size, 1e-5, False)
    assert max_abs_err(y, ref) <= FP32_TOL * scale(ref)


# ------------------------------------------------------------------------------ group counts

COUNT_CASES = [
    # (groups, group_size, paths): every path where it is cheap; the forced workgroup path on 2^20 tiny
    # groups is left out (a 64-invocation team per 2-element group is seconds on lavapipe).
    (1, 2, PATHS), (3, 2, PATHS), (4, 3, PATHS), (5, 1, PATHS), (64, 5, PATHS), (1000, 3, PATHS),
    (65535, 2, PATHS), (65536 + 4, 3, PATHS), (2**17, 2, PATHS),
    (2**20, 1, ("auto", "subgroup", "split")), (2**20, 2, ("auto", "subgroup", "split")),
]


@pytest.mark.parametrize("groups,size,paths", COUNT_CASES, ids=[f"{g}x{s}" for g, s, _ in COUNT_CASES])
@pytest.mark.parametrize("op", ["LayerNorm", "RMSNorm"])
def test_group_counts_from_1_to_2_pow_20(op, groups, size, paths, vulkan_device):
    rng = np.random.default_rng(groups + size)
    x = (rng.standard_normal((groups, size)) * 2 - 0.5).astype(np.float32)
    gamma, beta = weights(rng, size)
    layer = make_layer(op, size, 1e-5, True, gamma, beta)
    layout = layer.groups(x.shape)
    assert (layout["group_size"], layout["groups"]) == (size, groups)
    failures = run_all_paths(layer, op, x, size, 1e-5, gamma, beta, vulkan_device, paths=paths,
                             check_cpu=groups <= 65536)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("op", ["LayerNorm", "RMSNorm"])
def test_2_pow_20_groups_in_dims_3_and_4_layouts(op, vulkan_device):
    """Many groups spread over channels (cstep padding between them) rather than rows."""
    rng = np.random.default_rng(9)
    failures = []
    for shape, affine_size in (((64, 8192, 2), 2), ((16, 4, 4096, 4), 4), ((2**16, 4, 4), 16)):
        x = rng.standard_normal(shape).astype(np.float32)
        gamma, beta = weights(rng, affine_size)
        layer = make_layer(op, affine_size, 1e-5, True, gamma, beta)
        assert n_groups(shape, affine_size) >= 2**16
        failures += run_all_paths(layer, op, x, affine_size, 1e-5, gamma, beta, vulkan_device,
                                  paths=("auto", "split"), check_cpu=False)
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------ pack4 with odd widths

ODD_WIDTH_CASES = [
    ((8, 5), 5), ((4, 3), 3), ((12, 7), 7), ((4, 1), 1), ((4, 1023), 1023),
    ((8, 3, 7), 7), ((8, 3, 7), 21), ((4, 5, 9), 45), ((4, 1, 1), 1),
    ((4, 2, 3, 5), 5), ((4, 2, 3, 5), 15), ((4, 2, 3, 5), 30), ((8, 3, 1, 3), 3),
]


@pytest.mark.parametrize("shape,affine_size", ODD_WIDTH_CASES, ids=[f"{'x'.join(map(str, s))}-a{a}" for s, a in ODD_WIDTH_CASES])
def test_widths_not_multiple_of_4_with_pack4(shape, affine_size, vulkan_device):
    rng = np.random.default_rng(sum(shape) + affine_size)
    x = rng.standard_normal(shape).astype(np.float32)
    # The blob really is pack4 on the device (outer axis divisible by 4).
    for fp16 in (False, True):
        vk = vknorm.to_device(x, vknorm.Option(use_packing_layout=True, use_fp16_storage=fp16))
        assert vk.elempack == 4 and vk.elemsize == (8 if fp16 else 16), (vk.elempack, vk.elemsize)
    failures = []
    for op in ("LayerNorm", "RMSNorm"):
        gamma, beta = weights(rng, affine_size)
        layer = make_layer(op, affine_size, 1e-3, True, gamma, beta)
        failures += run_all_paths(layer, op, x, affine_size, 1e-3, gamma, beta, vulkan_device,
                                  packings=(True,), storages=("fp32", "fp16"))
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------ dims 1-4

DIMS_CASES = [
    ((1,), 1), ((7,), 7), ((4,), 4), ((4096,), 4096), ((70001,), 70001),
    ((1, 9), 9), ((6, 10), 10), ((8, 257), 257),
    ((3, 4, 6), 6), ((3, 4, 6), 24), ((4, 4, 6), 0), ((12, 33, 17), 17), ((8, 40, 40), 1600),
    ((2, 3, 4, 5), 5), ((2, 3, 4, 5), 20), ((2, 3, 4, 5), 60), ((4, 3, 4, 5), 0), ((8, 2, 33, 35), 1155),
]


@pytest.mark.parametrize("shape,affine_size", DIMS_CASES, ids=[f"{'x'.join(map(str, s))}-a{a}" for s, a in DIMS_CASES])
def test_dims_1_to_4_with_every_grouping_rule(shape, affine_size, vulkan_device):
    rng = np.random.default_rng(len(shape) * 100 + affine_size)
    x = (rng.standard_normal(shape) + 0.3).astype(np.float32)
    failures = []
    affine = affine_size > 0
    for op in ("LayerNorm", "RMSNorm"):
        gamma, beta = weights(rng, affine_size) if affine else (None, None)
        layer = make_layer(op, affine_size, 1e-4, affine, gamma, beta)
        failures += run_all_paths(layer, op, x, affine_size, 1e-4, gamma, beta, vulkan_device,
                                  storages=("fp32", "fp16") if group_size(shape, affine_size) <= 64 else ("fp32",))
    if len(shape) == 1:  # dims 1 is never packed (ncnn treats it as unpacked for LayerNorm)
        assert vknorm.to_device(x, vknorm.Option(use_packing_layout=True)).elempack == 1
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------ property test

@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    dims=st.integers(1, 4),
    ext=st.lists(st.integers(1, 13), min_size=4, max_size=4),
    rule=st.integers(0, 2),
    op=st.sampled_from(["LayerNorm", "RMSNorm"]),
    path=st.sampled_from(list(PATHS)),
    fp16=st.booleans(),
    packing=st.booleans(),
    affine=st.booleans(),
)
def test_random_shapes_match_float64(dims, ext, rule, op, path, fp16, packing, affine):
    shape = tuple(ext[:dims])
    if dims >= 2 and packing:
        shape = (shape[0] * 4,) + shape[1:]
    w = shape[-1]
    if dims == 3:
        affine_size = w if rule == 0 else w * shape[-2]
    elif dims == 4:
        affine_size = (w, w * shape[-2], w * shape[-2] * shape[-3])[rule]
    else:
        affine_size = w
    rng = np.random.default_rng(sum(shape) * 7 + rule)
    x = (rng.standard_normal(shape) * 2 + rng.uniform(-3, 3)).astype(np.float32)
    gamma, beta = weights(rng, affine_size) if affine else (None, None)
    layer = make_layer(op, affine_size, 1e-5, affine, gamma, beta)
    xin = x.astype(np.float16) if fp16 else x
    y = layer(xin, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing, use_fp16_storage=fp16))
    ref = norm64(op, xin, affine_size, 1e-5, affine, gamma, beta)
    assert y.dtype == xin.dtype
    err, bound = storage_rule(y, ref, fp16)
    assert err <= bound, f"{op}{shape} affine_size={affine_size} path={path}: {err:.3e} > {bound:.3e}"

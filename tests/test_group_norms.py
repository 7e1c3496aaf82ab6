"""GroupNorm and InstanceNorm on the one group model: ncnn's params and weights, the CPU reference
against ncnn's CPU layers, every Vulkan path against float64 and ncnn's Vulkan layers, the layouts that
break naive kernels, numerics and bad input.

Tolerances: fp32 storage max abs error <= 1e-5 * max(1, max|y|) against float64; fp16 storage, against float64
of the float16-rounded input, what the output's own rounding to float16 cannot explain <= 1e-5 * max(1, max|y|)
(reference.storage_rule). Against the CPU reference and ncnn's float32 layers: what ncnn's float32 algorithm's own
a-priori error and each side's float16 rounding cannot explain, within the same 1e-5 (reference.ncnn_rule); ncnn's
own float16 Vulkan layers, which keep their intermediates in float16, within 4e-3 of float64.
The CPU reference follows ncnn's float32 order, so it is held to ncnn's CPU layer within 16 float32 roundings of
max|y| (pyncnn's x86 layers sum in SIMD lanes).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import vknorm
from pyncnn_layer import channel_norm_param, run_ncnn_param, vulkan_available
from availability import import_graph
from reference import (FP16_TOL, FP32_TOL, PATHS, channel_count, channel_norm64, make_channel_norm, max_abs_err,
                       ncnn_channel_float32_error, ncnn_rule, scale, storage_rule)

# (op, numpy shape, group): the layouts of the group model that break naive kernels.
CASES = [
    ("GroupNorm", (320, 6, 6), 32),     # 10 channels per group: groups start and end inside pack4 elements
    ("GroupNorm", (12, 7, 7), 6),       # 2 per group; a 7x7 plane: cstep (52) > w*h in float32
    ("GroupNorm", (20, 3, 3), 4),       # 5 per group (odd), 4 groups per pack4 item
    ("GroupNorm", (24, 6, 6), 3),       # 8 per group: whole pack4 elements in one group (read as vec4s)
    ("GroupNorm", (16, 5, 5), 16),      # one channel per group
    ("GroupNorm", (12, 2, 3, 5), 4),    # dims 4
    ("GroupNorm", (12, 10), 3),         # dims 2: rows are channels
    ("GroupNorm", (24,), 6),            # dims 1: every element a channel
    ("InstanceNorm", (8, 7, 7), 0),     # 7x7 maps
    ("InstanceNorm", (12, 4, 4), 0),
    ("InstanceNorm", (6, 2, 3, 5), 0),  # dims 4
    ("InstanceNorm", (8, 12), 0),       # dims 2: one channel (ncnn's CPU layer), pack4 rows
    ("InstanceNorm", (30,), 0),         # dims 1: one channel
]


def case_id(case) -> str:
    op, shape, group = case
    return f"{op}-{'x'.join(map(str, shape))}" + (f"-g{group}" if op == "GroupNorm" else "")


def weights(rng, channels):
    return rng.uniform(0.5, 1.5, channels).astype(np.float32), rng.uniform(-1, 1, channels).astype(np.float32)


def make_case(case, seed=0, affine=True, eps=1e-5):
    op, shape, group = case
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float32)
    channels = channel_count(op, shape)
    gamma, beta = weights(rng, channels) if affine else (None, None)
    layer = make_channel_norm(op, channels, eps, affine, gamma, beta, group=max(group, 1))
    return layer, x, gamma, beta


def ncnn_bin(gamma, beta) -> bytes:
    return b"" if gamma is None else gamma.tobytes() + beta.tobytes()


def ncnn_param(layer) -> str:
    return channel_norm_param(type(layer).__name__, layer.channels, layer.eps, int(layer.affine),
                              group=getattr(layer, "group", 1))


def every_path(layer, x, gamma, beta, storages=("fp32", "fp16"), paths=PATHS, packings=(True, False)):
    """Failures of every (storage, path, packing) against float64 (the storage rule) and against the CPU reference
    (ncnn_rule: what ncnn's float32 algorithm's own a-priori error and each side's float16 rounding cannot
    explain; the CPU reference itself keeps to that error against float64)."""
    op = type(layer).__name__
    failures = []
    group = getattr(layer, "group", 1)
    for storage in storages:
        xin = x.astype(np.float16) if storage == "fp16" else x
        ref = channel_norm64(op, xin, layer.eps, group, gamma, beta)
        fp16 = storage == "fp16"
        cpu = layer(xin, device="cpu")
        cpu_error = ncnn_channel_float32_error(op, xin, layer.eps, group, gamma, beta)
        if ncnn_rule(ref, cpu, cpu_error, theirs_fp16=fp16)[0] > 0:
            failures.append(f"{op}{x.shape} {storage}: the CPU reference is off float64 by more than its own float32 error bound")
        for path, packing in itertools.product(paths, packings):
            opt = vknorm.Option(path=path, use_packing_layout=packing, use_fp16_storage=fp16)
            y = layer(xin, device="vulkan", option=opt)
            ran = layer.last_dispatch
            what = f"{op}{x.shape} {storage} path={path} packing={packing} ran {ran['path']}"
            err, bound = storage_rule(y, ref, fp16)
            if y.shape != x.shape or not err <= bound:
                failures.append(f"{what}: vs float64 {err:.3e} > {bound:.3e} (the storage rule)")
            err, bound = ncnn_rule(y, cpu, cpu_error, ours_fp16=fp16, theirs_fp16=fp16)
            if not err <= bound:
                failures.append(f"{what}: vs CPU reference {err:.3e} > {bound:.3e}")
            if path == "split" and ran["path"] != "split":
                failures.append(f"{what}: the forced split path did not run")
    return failures


# ------------------------------------------------------------------------------ params and weights

def test_groupnorm_takes_ncnns_param_ids_and_defaults():
    gn = vknorm.GroupNorm.from_param({0: 32, 1: 320, 2: 1e-6, 3: 0})
    assert (gn.group, gn.channels, gn.affine) == (32, 320, False) and gn.eps == np.float32(1e-6)
    default = vknorm.GroupNorm.from_param({1: 8, 3: 0})
    assert (default.group, default.eps, default.affine) == (1, np.float32(0.001), False)
    inorm = vknorm.InstanceNorm.from_param({0: 16, 1: 1e-5, 2: 1})
    assert (inorm.channels, inorm.affine) == (16, True)
    with pytest.raises(ValueError, match="unknown param ids"):
        vknorm.InstanceNorm.from_param({3: 1})
    assert repr(gn) == "GroupNorm(group=32, channels=320, eps=1e-06, affine=False)"


def test_groupnorm_and_instancenorm_from_param_fill_absent_ids_with_ncnns_defaults():
    # ncnn: GroupNorm group = pd.get(0, 1), channels = pd.get(1, 0), eps = pd.get(2, 0.001f),
    # affine = pd.get(3, 1); InstanceNorm channels = pd.get(0, 0), eps = pd.get(1, 0.001f), affine = pd.get(2, 1).
    # eps is stored as a float32, so compared with float32(0.001) exactly.
    gn = vknorm.GroupNorm.from_param({1: 8})
    assert (gn.group, gn.channels, gn.affine) == (1, 8, True) and gn.eps == np.float32(0.001)
    inorm = vknorm.InstanceNorm.from_param({0: 16})
    assert (inorm.channels, inorm.affine) == (16, True) and inorm.eps == np.float32(0.001)
    bare = vknorm.InstanceNorm.from_param({2: 0})
    assert (bare.channels, bare.affine) == (0, False) and bare.eps == np.float32(0.001)
    for made in (gn, inorm, bare):  # the constructor's defaults are the same
        assert made.eps == type(made)(**({"channels": made.channels, "affine": made.affine})).eps


def test_gamma_and_beta_are_per_channel():
    gn = vknorm.GroupNorm(group=2, channels=4, eps=1e-5)
    gn.load_model([1, 2, 3, 4], [0.5, 0.5, -1, -1])
    np.testing.assert_array_equal(gn.gamma, [1, 2, 3, 4])
    x = np.random.default_rng(0).standard_normal((4, 3, 3)).astype(np.float32)
    y = gn(x, device="cpu")
    ref = channel_norm64("GroupNorm", x, 1e-5, 2, np.array([1, 2, 3, 4.]), np.array([0.5, 0.5, -1, -1]))
    assert max_abs_err(y, ref) <= FP32_TOL * scale(ref)
    assert gn.groups(x.shape) == {"group_size": 18, "groups": 2, "planes": 2}


# ------------------------------------------------------------------------------ CPU reference

@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_cpu_reference_matches_ncnns_cpu_layer_and_float64(case, affine):
    layer, x, gamma, beta = make_case(case, affine=affine)
    y = layer(x, device="cpu")
    ncnn_y = run_ncnn_param(ncnn_param(layer), ncnn_bin(gamma, beta), x)
    ref = channel_norm64(case[0], x, layer.eps, max(case[2], 1), gamma, beta)
    assert max_abs_err(y, ref) <= FP32_TOL * scale(ref)
    # ncnn's generic float32 order; pyncnn's x86 build sums in SIMD lanes, another float32 order, which
    # moves the statistics by a few roundings (measured: <= 2.5e-7 relative): 16 roundings of max|y|.
    assert max_abs_err(y, ncnn_y) <= 16 * np.finfo(np.float32).eps * scale(ref), max_abs_err(y, ncnn_y)


# ------------------------------------------------------------------------------ Vulkan, every path

@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_path_packing_and_storage_matches_float64_and_the_cpu_reference(case):
    layer, x, gamma, beta = make_case(case)
    failures = every_path(layer, x, gamma, beta)
    plain, x2, _, _ = make_case(case, seed=1, affine=False)
    failures += every_path(plain, x2, None, None, storages=("fp32",), paths=("auto", "split"))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("case", [c for c in CASES if len(c[1]) >= 3], ids=case_id)
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_vulkan_and_ncnns_own_vulkan_layer_both_match_float64(case, fp16):
    """Parity with ncnn's Vulkan GroupNorm/InstanceNorm (pyncnn, same device), on the same (float16: float16)
    input. Float32: vknorm against ncnn's output by what ncnn's own float32 error (its a-priori bound, which ncnn's
    output keeps to against float64) cannot explain (ncnn_rule). Float16: ncnn's layer stores its intermediates
    (partial sums, mean, coefficients) in float16 too, past that bound (lavapipe: up to 1.4e-3 over it); it is
    held to 4e-3 of the scale of float64 and vknorm to the storage rule, both against the one float64 reference:
    ncnn's output passing is what says the reference's meaning (eps, groups, per-channel weights) is ncnn's."""
    assert vulkan_available(), "pyncnn sees no Vulkan device where vknorm sees one"
    layer, x, gamma, beta = make_case(case)
    xin = x.astype(np.float16) if fp16 else x
    group = max(case[2], 1)
    ref = channel_norm64(case[0], xin, layer.eps, group, gamma, beta)
    ours = layer(xin, device="vulkan", option=vknorm.Option(use_fp16_storage=fp16))
    theirs = run_ncnn_param(ncnn_param(layer), ncnn_bin(gamma, beta), xin.astype(np.float32), vulkan=True, fp16=fp16)
    err, bound = storage_rule(ours, ref, fp16)
    assert err <= bound, ("vknorm vs float64", err, bound)
    if fp16:
        assert max_abs_err(theirs, ref) <= FP16_TOL * scale(ref), ("ncnn's float16 layer", max_abs_err(theirs, ref))
        return
    their_error = ncnn_channel_float32_error(case[0], xin, layer.eps, group, gamma, beta)
    assert ncnn_rule(ref, theirs, their_error)[0] == 0.0, "ncnn's own error passes its bound"
    err, bound = ncnn_rule(ours, theirs, their_error)
    assert err <= bound, ("vknorm vs ncnn's Vulkan layer", err, bound)


# Groups spanning more channel planes than a small workgroup has invocations: the fused kernel loads each
# plane's weights into shared memory with one invocation per plane, so it may do that only where every plane
# has one (62 planes in a workgroup of 16 on lavapipe read unset shared memory: errors of 5-7, Inf, NaN).
MANY_PLANES = [
    (("GroupNorm", (62, 5, 5), 1), None),
    (("GroupNorm", (20, 1, 1), 1), 16),
    (("GroupNorm", (64, 2, 16), 2), 16),
    (("GroupNorm", (700, 33), 14), 32),  # dims 2: rows are channels, 50 per group
    (("GroupNorm", (33,), 1), 16),       # dims 1: every element a channel
]


@pytest.mark.parametrize("case,max_wg", MANY_PLANES, ids=[f"{case_id(c)}-wg{w}" for c, w in MANY_PLANES])
def test_groups_of_more_channel_planes_than_the_workgroup_has_invocations(case, max_wg):
    layer, x, gamma, beta = make_case(case)
    ref = channel_norm64(case[0], x, layer.eps, case[2], gamma, beta)
    planes_per_group = x.shape[0] // case[2]
    runs = []
    for path, packing in itertools.product(("auto", "workgroup"), (True, False)):
        opt = vknorm.Option(path=path, use_packing_layout=packing, max_workgroup_size=max_wg or 0)
        y = layer(x, device="vulkan", option=opt)
        ran = layer.last_dispatch
        runs.append(ran)
        assert ran["workgroup_size"] <= (max_wg or ran["workgroup_size"]), (path, packing, ran)
        assert max_abs_err(y, ref) <= FP32_TOL * scale(ref), (path, packing, ran, max_abs_err(y, ref))
    # The case itself: one fused dispatch in workgroups narrower than the group's planes. lavapipe (workgroups of
    # 64 at most) plans every run so; a GPU may plan wider workgroups (an H200: 128 for 62 planes), or split.
    narrow = [r["dispatches"] == 1 and r["workgroup_size"] < planes_per_group for r in runs]
    assert all(narrow) or vknorm.device_info()["type"] != "cpu", runs


def test_straddling_groups_run_pack4_and_whole_group_elements_read_vec4s(monkeypatch):
    """320 channels / 32 groups packs 10 channels per group across pack4 elements: as items of two groups
    (VKNORM_TUNE_LANE_GROUPS=0; CPU drivers by default) the pack4 kernel with group slots runs; as an item per
    group (=2; GPUs by default) the vec4 one, one group per item. Both in one dispatch, both right. 24 / 3 groups
    (8 per group) reads each pack4 element as one group's vec4."""
    straddle, x, gamma, beta = make_case(CASES[0])
    ref = channel_norm64(CASES[0][0], x, straddle.eps, CASES[0][2], gamma, beta)
    straddle(x, device="vulkan")
    assert straddle.last_dispatch["vec4"] is straddle.last_dispatch["lane_groups"], straddle.last_dispatch
    for knob, item_per_group in (("0", False), ("2", True)):
        monkeypatch.setenv("VKNORM_TUNE_LANE_GROUPS", knob)
        y = straddle(x, device="vulkan")
        ran = straddle.last_dispatch
        assert ran["lane_groups"] is item_per_group and ran["vec4"] is item_per_group, ran
        assert ran["dispatches"] == 1, ran
        assert max_abs_err(y, ref) <= FP32_TOL * scale(ref), (ran, max_abs_err(y, ref))
    monkeypatch.delenv("VKNORM_TUNE_LANE_GROUPS")
    whole, x, gamma, beta = make_case(CASES[3])
    y = whole(x, device="vulkan")
    assert whole.last_dispatch["vec4"] is True
    ref = channel_norm64(CASES[3][0], x, whole.eps, CASES[3][2], gamma, beta)
    assert max_abs_err(y, ref) <= FP32_TOL * scale(ref)


@pytest.mark.parametrize("merges", ["0", "1"], ids=["finalize-pass", "apply-merges"])
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[3], CASES[8]], ids=case_id)
def test_split_path_in_three_passes_and_in_two(case, merges, monkeypatch):
    """Per-channel weights on the split path: GPUs merge the chunk partials in the apply pass (two passes),
    lavapipe runs a finalize pass (three); both are exercised here on whatever device runs the suite,
    including a large offset, which reads each group's pivot (kept by the reduce pass: by the time an apply
    team runs, others may have normalized the group's first elements in place)."""
    monkeypatch.setenv("VKNORM_TUNE_APPLY_MERGES", merges)
    layer, x, gamma, beta = make_case(case)
    failures = every_path(layer, x, gamma, beta, paths=("split",))
    assert layer.last_dispatch["dispatches"] == (2 if merges == "1" else 3)
    x = (1e4 + 1e-2 * np.random.default_rng(3).standard_normal(x.shape)).astype(np.float32)
    ref = channel_norm64(case[0], x, layer.eps, max(case[2], 1), gamma, beta)
    for packing in (True, False):
        y = layer(x, device="vulkan", option=vknorm.Option(path="split", use_packing_layout=packing))
        if not max_abs_err(y, ref) <= FP32_TOL * scale(ref):
            failures.append(f"large offset, packing={packing}: {max_abs_err(y, ref):.3e}")
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------ an item per group inside lanes

LANE_CASES = [
    ("GroupNorm", (320, 6, 6), 32),  # 10 channels per group: groups start at lane 0 or 2 of their first element
    ("GroupNorm", (12, 7, 7), 6),    # 2 per group; a 7x7 plane: cstep (52) > w*h in float32
    ("GroupNorm", (24, 5, 3), 4),    # 6 per group
    ("GroupNorm", (60, 9, 9), 2),    # 30 per group, over 8 packed planes each
]


@pytest.mark.parametrize("case", LANE_CASES, ids=case_id)
def test_groups_inside_pack4_lanes_run_in_items_of_their_own(case, monkeypatch):
    """pack4 GroupNorm whose groups hold 2 mod 4 channels: GPUs give each group an item of its own (the packed
    planes it touches; the other group's lanes are loaded, never counted, never stored: each group writes only
    its half of a shared element), in the fused kernel's vec4 variant (one float per statistic). Forced here from
    2 channels per group, on any device: every fused path and storage against float64 and the CPU reference,
    including a large offset (the pivot is the group's own first lane), and the same as the items of two groups
    within the storage's tolerance."""
    monkeypatch.setenv("VKNORM_TUNE_LANE_GROUPS", "2")
    layer, x, gamma, beta = make_case(case)
    failures = every_path(layer, x, gamma, beta, paths=("auto", "subgroup", "workgroup"), packings=(True,))
    assert layer.last_dispatch["lane_groups"] is True, layer.last_dispatch
    assert layer.last_dispatch["vec4"] is True, layer.last_dispatch
    x = (1e4 + 1e-2 * np.random.default_rng(3).standard_normal(x.shape)).astype(np.float32)
    ref = channel_norm64(case[0], x, layer.eps, case[2], gamma, beta)
    y = layer(x, device="vulkan", option=vknorm.Option(path="workgroup"))
    if not max_abs_err(y, ref) <= FP32_TOL * scale(ref):
        failures.append(f"large offset: {max_abs_err(y, ref):.3e}")
    assert not failures, "\n".join(failures)
    # A NaN in the element the two groups share (the last channel of one, the first of the other) spoils its
    # own group only: each sums its own lanes by select, as ncnn's CPU layer keeps it in its group
    per_group = layer.channels // case[2]
    for channel in (per_group - 1, per_group):
        bad = x.copy()
        bad[channel].reshape(-1)[0] = np.nan
        cpu = layer(bad, device="cpu")
        spoiled = layer(bad, device="vulkan", option=vknorm.Option(path="workgroup"))
        np.testing.assert_array_equal(np.isfinite(spoiled), np.isfinite(cpu), err_msg=f"NaN in channel {channel}")
        assert 0 < np.isfinite(cpu).sum() < cpu.size
    monkeypatch.setenv("VKNORM_TUNE_LANE_GROUPS", "0")
    items = layer(x, device="vulkan", option=vknorm.Option(path="workgroup"))
    assert layer.last_dispatch["lane_groups"] is False
    assert max_abs_err(y, items) <= FP32_TOL * scale(ref)


def test_groups_inside_pack4_lanes_run_in_pieces_of_whole_items(monkeypatch):
    """A blob past the binding limit runs in pieces of whole items of two groups, so every piece's groups start
    at the lanes they start at in the whole blob: an item per group gives the same bits in pieces."""
    monkeypatch.setenv("VKNORM_TUNE_LANE_GROUPS", "2")
    layer, x, _, _ = make_case(LANE_CASES[0])
    whole = layer(x, device="vulkan", option=vknorm.Option(path="workgroup"))
    monkeypatch.setenv("VKNORM_MAX_BUFFER_BYTES", "8000")  # 2 items of 5 packed 6x6 planes per piece
    pieces = layer(x, device="vulkan", option=vknorm.Option(path="workgroup"))
    assert layer.last_dispatch["pieces"] >= 2 and layer.last_dispatch["lane_groups"], layer.last_dispatch
    np.testing.assert_array_equal(pieces, whole)


# ------------------------------------------------------------------------------ large and small groups

LARGE = [
    ("GroupNorm", (320, 64, 64), 32),   # Stable Diffusion: 10 channels and 40960 elements per group
    ("GroupNorm", (640, 16, 16), 2),    # 81920 elements per group
    ("InstanceNorm", (3, 224, 224), 0), # one 224x224 channel per group
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", LARGE, ids=case_id)
def test_large_groups_on_the_auto_and_split_paths(case):
    layer, x, gamma, beta = make_case(case)
    failures = every_path(layer, x, gamma, beta, storages=("fp32",), paths=("auto", "split"))
    # float16 storage: float32 accumulation over 40960-81920 elements (a float16 sum would be off by far more).
    failures += every_path(layer, x, gamma, beta, storages=("fp16",), paths=("auto",), packings=(True,))
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------ numerics

@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[3], CASES[8]], ids=case_id)
def test_exact_when_the_mean_is_far_larger_than_the_std(case):
    """1e4 + N(0, 1e-2) per group: float32 sums of x lose the std entirely; shifting by a pivot keeps it."""
    layer, x, gamma, beta = make_case(case)
    x = (1e4 + 1e-2 * np.random.default_rng(7).standard_normal(x.shape)).astype(np.float32)
    ref = channel_norm64(case[0], x, layer.eps, max(case[2], 1), gamma, beta)
    for path, packing in itertools.product(PATHS, (True, False)):
        y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing))
        assert max_abs_err(y, ref) <= FP32_TOL * scale(ref), (path, packing, max_abs_err(y, ref))
    ncnn_err = max_abs_err(run_ncnn_param(ncnn_param(layer), ncnn_bin(gamma, beta), x), ref)
    assert ncnn_err > 100 * FP32_TOL * scale(ref)  # ncnn's CPU float32 order cannot do this: the case is hard


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[8]], ids=case_id)
def test_constant_groups_give_beta(case):
    layer, x, gamma, beta = make_case(case)
    x = np.full(x.shape, 3.25, np.float32)
    c = channel_count(case[0], x.shape)
    want = np.broadcast_to(beta.reshape((c,) + (1,) * (x.ndim - 1)), x.shape)
    for path, packing in itertools.product(PATHS, (True, False)):
        y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing))
        np.testing.assert_allclose(y, want, atol=1e-6, err_msg=f"{path} {packing}")


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[8]], ids=case_id)
@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
def test_nan_and_inf_spoil_their_own_group_as_ncnns_cpu_layer_does(case, bad):
    layer, x, gamma, beta = make_case(case)
    x.reshape(-1)[x.size // 2 + 1] = bad
    ncnn_y = run_ncnn_param(ncnn_param(layer), ncnn_bin(gamma, beta), x)
    cpu = layer(x, device="cpu")
    np.testing.assert_array_equal(np.isnan(cpu), np.isnan(ncnn_y))
    ok = np.isfinite(ncnn_y)
    assert 0 < ok.sum() < ok.size  # one group spoiled, the others not
    for path, packing in itertools.product(PATHS, (True, False)):
        y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing))
        np.testing.assert_array_equal(np.isfinite(y), ok, err_msg=f"{path} {packing}")
        # against ncnn's float32 algorithm, itself within the rule of float64: twice the rule between the two
        assert max_abs_err(y[ok], cpu[ok]) <= 2 * FP32_TOL * scale(cpu[ok])


def one_element_groups():
    """(name, layer, x): every group holds one element, some of them Inf or NaN."""
    x = np.array([1, np.nan, np.inf, -np.inf, 5, 6, 7, 8], np.float32)
    gamma, beta = np.full(8, 2.0, np.float32), np.full(8, 0.5, np.float32)
    inorm = vknorm.InstanceNorm(channels=8, eps=1e-5, affine=True)
    inorm.load_model(gamma, beta)
    gn = vknorm.GroupNorm(group=8, channels=8, eps=1e-5, affine=True)
    gn.load_model(gamma, beta)
    ln = vknorm.LayerNorm(affine_size=1, eps=1e-5, affine=True)
    ln.load_model(gamma[:1], beta[:1])
    return [("InstanceNorm 8x1x1", inorm, x.reshape(8, 1, 1)), ("GroupNorm 8x1x1/8", gn, x.reshape(8, 1, 1)),
            ("GroupNorm dims 1, 8/8", gn, x), ("LayerNorm 8x1", ln, x.reshape(8, 1))]


@pytest.mark.parametrize("activation", [None, "relu"])
def test_a_one_element_group_holding_inf_or_nan_gives_nan_as_ncnns_cpu_layer_does(activation):
    """x - mean of a group's only element is 0, or NaN where it is Inf or NaN. The shader's x - x was folded
    to 0 by the compiler (SPIR-V keeps no NaN semantics), so such groups gave beta; ReLU(NaN) stays NaN."""
    for name, layer, x in one_element_groups():
        layer.set_activation(activation)
        cpu = layer(x, device="cpu")
        assert np.isnan(cpu.reshape(-1)[1:4]).all() and np.isfinite(cpu.reshape(-1)[[0, 4, 5, 6, 7]]).all(), name
        for path, packing, fp16 in itertools.product(PATHS, (True, False), (False, True)):
            y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing,
                                                               use_fp16_storage=fp16))
            np.testing.assert_array_equal(np.isnan(y), np.isnan(cpu), err_msg=f"{name} {path} {packing} {fp16}")
            ok = ~np.isnan(cpu)
            np.testing.assert_allclose(y[ok], cpu[ok], atol=1e-6, err_msg=f"{name} {path} {packing} {fp16}")


# ------------------------------------------------------------------------------ bad input

def test_a_packed_item_past_one_buffer_is_refused_as_such_and_runs_unpacked(monkeypatch):
    """Pieces hold whole pack4 items: an InstanceNorm whose 4-channel item passes the buffer limit says so,
    not that a channel's group does; without the packing layout its groups fit and it runs."""
    monkeypatch.setenv("VKNORM_MAX_BUFFER_BYTES", "1024")
    inorm = vknorm.InstanceNorm(channels=8, eps=1e-5, affine=False)
    x = np.random.default_rng(3).standard_normal((8, 9, 9)).astype(np.float32)
    with pytest.raises(ValueError, match=r"a pack4 item \(4 channels or rows stored interleaved\).*1296 bytes.*"
                                         r"without the packing layout its groups are 4 times smaller"):
        inorm(x, device="vulkan", option=vknorm.Option(use_packing_layout=True))
    y = inorm(x, device="vulkan", option=vknorm.Option(use_packing_layout=False))
    assert max_abs_err(y, inorm(x, device="cpu")) <= 2 * FP32_TOL * scale(y)  # both within the rule of float64


def test_a_group_of_whole_channels_past_one_buffer_names_the_layer_and_promises_no_smaller_unpacked_groups(monkeypatch):
    """A GroupNorm group of 4 or more channels is its pack4 item: unpacked, it is as large, so the message does not
    suggest turning the packing layout off (it did), and it names the layer."""
    monkeypatch.setenv("VKNORM_MAX_BUFFER_BYTES", "65536")
    x = np.random.default_rng(3).standard_normal((4, 64, 128)).astype(np.float32)
    gn = vknorm.GroupNorm(group=1, channels=4, affine=False)
    for packing in (True, False):
        with pytest.raises(ValueError, match=r"^GroupNorm: a .*131072 bytes") as e:
            gn(x, device="vulkan", option=vknorm.Option(use_packing_layout=packing))
        assert "smaller" not in str(e.value), str(e.value)
    # 2 channels per group: a pack4 item holds two groups, each half as large unpacked
    with pytest.raises(ValueError, match=r"without the packing layout its groups are 2 times smaller"):
        vknorm.GroupNorm(group=2, channels=4, affine=False)(np.random.default_rng(3).standard_normal(
            (4, 64, 256)).astype(np.float32), device="vulkan")


@pytest.mark.parametrize("make,match", [
    (lambda: vknorm.GroupNorm(group=3, channels=10), "do not divide into group=3"),
    (lambda: vknorm.GroupNorm(group=0, channels=8), "group must be > 0"),
    (lambda: vknorm.GroupNorm(group=-2, channels=8), "group must be > 0"),
    (lambda: vknorm.GroupNorm(group=1, channels=0, affine=True), "affine=1 needs channels > 0"),
    (lambda: vknorm.InstanceNorm(channels=0, affine=True), "affine=1 needs channels > 0"),
    (lambda: vknorm.InstanceNorm(channels=-1, affine=False), "channels must be >= 0"),
], ids=["not-divisible", "group-0", "group-negative", "gn-affine-no-channels", "in-affine-no-channels",
        "in-negative"])
def test_bad_params_raise_naming_the_layer_and_numbers(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_an_input_with_other_channels_than_the_layer_raises_on_every_device():
    gn = make_channel_norm("GroupNorm", 8, 1e-5, False, group=4)
    x = np.zeros((12, 4, 4), np.float32)
    for device in ("cpu", "vulkan"):
        with pytest.raises(ValueError, match="GroupNorm: the input has 12 channels, the layer 8"):
            gn(x, device=device)
    inorm = make_channel_norm("InstanceNorm", 6, 1e-5, True, np.ones(6), np.zeros(6))
    with pytest.raises(ValueError, match="InstanceNorm: the input has 4 channels, the layer 6"):
        inorm(np.zeros((4, 3, 3), np.float32), device="vulkan")
    # a torch-style batch of one (1 x 8 x 4 x 4) is ncnn's c x d x h x w of 1 channel: the message says so
    for device in ("cpu", "vulkan"):
        with pytest.raises(ValueError, match=r"the input has 1 channels, the layer 8 \(a 4-D input is c x d x h x w"):
            gn(np.zeros((1, 8, 4, 4), np.float32), device=device)
    with pytest.raises(ValueError, match=r"the input has 2 channels, the layer 8$"):  # no batch hint: d is not 8
        gn(np.zeros((2, 4, 4, 4), np.float32))
    gn0 = vknorm.GroupNorm(group=2, channels=0, affine=False)
    with pytest.raises(ValueError, match="channels=0 cannot split"):
        gn0(np.zeros((4, 3, 3), np.float32), device="vulkan")


def test_instancenorm_takes_a_dims_1_or_2_blob_as_one_channel_and_a_layer_of_more_channels_refuses_it():
    """ncnn's InstanceNorm normalizes a (w) or (h, w) blob as one instance with the first channel's weights; a layer
    of several channels given one (what pnnx makes of nn.InstanceNorm1d) is refused, not run with a meaning its
    weights do not have."""
    x = np.random.default_rng(3).standard_normal((12, 24)).astype(np.float32)
    for channels in (0, 1):
        inorm = vknorm.InstanceNorm(channels=channels, eps=1e-5, affine=False)
        ref = channel_norm64("InstanceNorm", x, 1e-5)  # the whole blob as one channel
        for device in ("cpu", "vulkan"):
            assert max_abs_err(inorm(x, device=device), ref) <= FP32_TOL * scale(ref)
    inorm = vknorm.InstanceNorm(channels=12, eps=1e-5, affine=False)
    for device in ("cpu", "vulkan"):
        for shape in ((12, 24), (24,)):
            with pytest.raises(ValueError,
                               match=f"InstanceNorm: a dims-{len(shape)} input is one channel, the layer has 12"):
                inorm(np.zeros(shape, np.float32), device=device)


@pytest.mark.parametrize("fused", [False, True], ids=["alone", "fused-relu"])
@pytest.mark.parametrize("vulkan", [False, True], ids=["cpu-net", "vulkan-net"])
def test_in_graph_instancenorm_of_several_channels_refuses_a_dims_2_blob(tmp_path, vulkan, fused):
    line = ("InstanceNorm in_0 1 1 in0 n 0=12 1=1e-05 2=0\nReLU relu 1 1 n out0" if fused else
            "InstanceNorm in_0 1 1 in0 out0 0=12 1=1e-05 2=0")
    graph, net, rp, rm, _ = graph_net(tmp_path, line, b"", vulkan=vulkan)
    assert rp == 0 and rm == 0 and len(net.fused()) == int(fused)
    from vknorm._stdio import quiet_stderr

    log = []
    with quiet_stderr(log):
        ex = net.create_extractor()
        ex.input("in0", graph.Mat(np.ones((12, 24), np.float32)))
        ret, _ = ex.extract("out0")
    # the layer's type once: "vknorm vknorm.InstanceNorm in_0: a dims-2 ...", fused or not
    kind = "vknorm.InstanceNorm" if fused else "InstanceNorm"
    assert ret != 0 and any(f"vknorm {kind} in_0: a dims-2 input is one channel, the layer has 12" in ln
                            for ln in log), log


def test_weights_of_the_wrong_length_or_missing_raise():
    gn = vknorm.GroupNorm(group=2, channels=4)
    with pytest.raises(ValueError, match="gamma has 3 values, expected channels=4"):
        gn.load_model(np.ones(3), np.zeros(4))
    with pytest.raises(ValueError, match="needs gamma and beta"):
        gn.load_model(np.ones(4))
    with pytest.raises(ValueError, match="no weights loaded"):
        gn(np.zeros((4, 2, 2), np.float32), device="vulkan")


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_a_layer_fed_inputs_of_many_sizes_keeps_a_bounded_number_of_pipelines_on_its_context(fp16):
    """An app feeding images of any size to vknorm's own layer (style transfer's InstanceNorm): the group size is a
    specialization constant for the layer's first 16 sizes only; later ones share the pipelines of their kernel,
    team and items (one per size before: 40 sizes, 40 pipelines): the 24 later sizes make at most one for every
    two (lavapipe: 3). Every size stays within the storage rule."""
    ctx = vknorm.Context.create(0)  # pipelines counted on a context of the test's own
    gamma, beta = np.linspace(0.5, 1.5, 8).astype(np.float32), np.linspace(-1, 1, 8).astype(np.float32)
    layer = vknorm.InstanceNorm(channels=8, eps=1e-5, device=ctx, option=vknorm.Option(use_fp16_storage=fp16))
    layer.load_model(gamma, beta)
    made = []
    for i in range(40):
        x = np.random.default_rng(i).standard_normal((8, 7 + i, 9 + 2 * i)).astype(np.float32)
        seen = x.astype(np.float16) if fp16 else x  # float16 storage rounds the input first
        err, bound = storage_rule(layer(x), channel_norm64("InstanceNorm", seen, 1e-5, gamma=gamma, beta=beta), fp16)
        assert err <= bound, (i, err, bound)
        made.append(ctx.pipelines_made)
    assert made[15] <= 16 and made[-1] - made[15] <= 12, made


def test_instancenorm_without_affine_takes_channels_0_as_any_number_of_channels():
    """ncnn's InstanceNorm reads channels (param 0) only for its weights: with affine=0 and channels=0 it
    normalizes every channel plane of whatever it is given, on the CPU, on every Vulkan path and in an ncnn
    net (GroupNorm, which splits channels into groups, refuses channels=0 instead). Tolerances as the module's:
    the storage rule against float64 of the input the kernel read."""
    inorm = vknorm.InstanceNorm(channels=0, eps=1e-5, affine=False)
    for shape in ((6, 5, 7), (8, 3, 4), (4, 2, 3, 5)):
        x = (np.random.default_rng(len(shape)).standard_normal(shape) * 2 + 0.5).astype(np.float32)
        ref = channel_norm64("InstanceNorm", x, inorm.eps)
        assert max_abs_err(inorm(x, device="cpu"), ref) <= FP32_TOL * scale(ref), shape
        for path, packing, fp16 in itertools.product(PATHS, (True, False), (False, True)):
            xin = x.astype(np.float16) if fp16 else x
            y = inorm(xin, device="vulkan",
                      option=vknorm.Option(path=path, use_packing_layout=packing, use_fp16_storage=fp16))
            ref16 = channel_norm64("InstanceNorm", xin, inorm.eps) if fp16 else ref
            err, bound = storage_rule(y, ref16, fp16)
            assert err <= bound, (shape, path, packing, fp16, err, bound)


def test_instancenorm_channels_0_without_affine_runs_in_an_ncnn_net(tmp_path):
    graph, net, rp, rm, log = graph_net(tmp_path, "InstanceNorm inorm 1 1 in0 out0 0=0 1=1e-05 2=0", b"")
    assert rp == 0 and rm == 0, log
    x = np.random.default_rng(5).standard_normal((8, 5, 6)).astype(np.float32)
    ex = net.create_extractor()
    ex.input("in0", graph.Mat(x))
    ret, out = ex.extract("out0")
    assert ret == 0
    ref = channel_norm64("InstanceNorm", x, 1e-5)
    assert max_abs_err(np.array(out), ref) <= FP32_TOL * scale(ref)
    assert net.vknorm_counters()["vulkan_forwards"] == 1


@pytest.mark.parametrize("op", ["GroupNorm", "InstanceNorm"])
def test_weights_that_are_not_one_dimensional_raise_value_error_naming_the_length(op):
    """gamma and beta are 1-D arrays of `channels` values: a scalar or a 2-D array of the right count is a
    ValueError saying so (not the binding's raw TypeError); text is a TypeError."""
    layer = vknorm.GroupNorm(group=1, channels=4) if op == "GroupNorm" else vknorm.InstanceNorm(channels=4)
    for gamma, beta in ((np.float32(1.0), np.zeros(4)), (np.ones((2, 2)), np.zeros(4)), (np.ones(4), np.zeros((1, 4)))):
        with pytest.raises(ValueError, match="must be 1-D of length channels=4"):
            layer.load_model(gamma, beta)
    with pytest.raises(TypeError, match="gamma must be numeric"):
        layer.load_model(["a"] * 4, np.zeros(4))
    one = vknorm.InstanceNorm(channels=1)
    with pytest.raises(ValueError, match=r"must be 1-D of length channels=1, got shape \(\)"):
        one.load_model(np.float32(2.0), np.float32(0.5))


# ------------------------------------------------------------------------------ bad input inside an ncnn Net

def graph_net(tmp_path, line: str, weights: bytes, fp16: bool = False, vulkan: bool = True):
    """A vknorm.graph net (Vulkan unless told) of Input -> one layer (or a chain of one-top layers, a line each);
    (net, load_param return, load_model return, log)."""
    graph = import_graph()
    from vknorm._stdio import quiet_stderr

    param, binp = tmp_path / "m.param", tmp_path / "m.bin"
    n = 1 + len(line.splitlines())
    param.write_text(f"7767517\n{n} {n}\nInput in0 0 1 in0\n{line}\n")
    binp.write_bytes(weights)
    log: list = []
    with quiet_stderr(log):
        net = graph.configure(graph.Net(vknorm=True), vulkan=vulkan, fp16=fp16)
        rp = net.load_param(str(param))
        rm = net.load_model(str(binp)) if rp == 0 else None
    return graph, net, rp, rm, log


@pytest.mark.parametrize("line,words", [
    ("GroupNorm gn 1 1 in0 out0 0=3 1=10 2=1e-05 3=0", "group=3 channels=10"),
    ("GroupNorm gn 1 1 in0 out0 0=0 1=8 2=1e-05 3=0", "group=0 channels=8"),
    ("GroupNorm gn 1 1 in0 out0 0=2 1=0 2=1e-05 3=1", "group=2 channels=0 affine=1"),
    ("InstanceNorm inorm 1 1 in0 out0 0=0 1=1e-05 2=1", "channels=0 affine=1"),
])
def test_in_graph_bad_params_fail_load_param_naming_the_layer(tmp_path, line, words):
    _, net, rp, _, log = graph_net(tmp_path, line, b"")
    assert rp != 0
    assert any("vknorm" in ln and words in ln for ln in log), log


def test_in_graph_short_bin_and_wrong_channels_fail_with_ncnns_return_codes(tmp_path):
    gamma = np.ones(8, np.float32).tobytes()
    _, _, rp, rm, log = graph_net(tmp_path, "GroupNorm gn 1 1 in0 out0 0=4 1=8 2=1e-05 3=1", gamma)  # beta missing
    assert rp == 0 and rm != 0 and any("gn" in ln and "8 beta values" in ln for ln in log), log
    from vknorm._stdio import quiet_stderr

    graph, net, rp, rm, _ = graph_net(tmp_path, "GroupNorm gn 1 1 in0 out0 0=4 1=8 2=1e-05 3=1", gamma * 2)
    assert rp == 0 and rm == 0
    log = []
    with quiet_stderr(log):
        ex = net.create_extractor()
        ex.input("in0", graph.Mat(np.ones((12, 4, 4), np.float32)))
        ret, _ = ex.extract("out0")
    assert ret != 0 and any("GroupNorm gn: the input has 12 channels, the layer 8" in ln for ln in log), log
    ex = net.create_extractor()  # the net still works on a right-sized input (float32 storage: the fp32 rule)
    x = np.random.default_rng(0).standard_normal((8, 4, 4)).astype(np.float32)
    ex.input("in0", graph.Mat(x))
    ret, out = ex.extract("out0")
    ref = channel_norm64("GroupNorm", x, 1e-5, 4, np.ones(8), np.ones(8))  # the .bin: gamma, then beta, all ones
    assert ret == 0 and max_abs_err(np.array(out), ref) <= FP32_TOL * scale(ref)

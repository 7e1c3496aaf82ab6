"""Test helpers (no tests): ncnn's grouping, a float64 LayerNorm/RMSNorm, deliberately bad float32
reductions, input generation and the error metrics the tests hold vknorm to.

Grouping follows ncnn (see tests/ncnn_cases.py): every blob is rows of ``group_size`` contiguous
elements in numpy (C) order, gamma/beta indexed by the position inside the group:

* dims 1 (w,)          -> one group of w
* dims 2 (h, w)        -> h groups of w
* dims 3 (c, h, w)     -> affine_size == w: c*h groups of w; else c groups of h*w
* dims 4 (c, d, h, w)  -> affine_size == w: rows; == w*h: c*d groups of h*w; else c groups of d*h*w
"""
from __future__ import annotations

import numpy as np

import ncnn_cases

PATHS = ("auto", "subgroup", "workgroup", "split")
PATH_RANK = {"subgroup": 0, "workgroup": 1, "split": 2, "cooperative": 2}  # auto only: never a forced fall

# The tolerances, relative to max(1, max|y|). fp32 storage: 1e-5, 84 float32 ulps (2^-23): the roundings of the
# reductions (short sequences per invocation, then trees and pairwise merges of partials: far fewer rounding steps
# in a row than the group has elements) and of the affine step; the kernels measure a few ulps at every size the
# tests run, groups of up to 2^20+7 elements included (an n-step sequential float32 sum could reach n ulps there;
# test_vulkan_precision's controls show the rule failing reductions without a pivot). Inputs far from
# zero (|mean| >> std) are held to the same float32 rule: the kernels reduce about a pivot, so the offset costs
# them no precision. fp16 storage, two rules:
# - storage_rule (the output's own float16 rounding and the float32 rule, nothing more): wherever a float64
#   reference is computed from the very float16 values the kernel read (float16 input, or float32 input rounded
#   to float16 first as the storage does). Every such comparison in the tests uses it.
# - FP16_TOL, 4e-3: one float16 output rounding plus the float16 input's (2^-11 each, scaled by |x| / std), for
#   a reference that rounding does not fit: one that saw the float32 input before float16 storage rounded it
#   (ncnn's CPU float32 run of float32 data in the graph tests, the CPU reference or float64 of a float32 input:
#   test_fusion, test_cooperative, test_vulkan_api's in-place read); ncnn's own float16 Vulkan
#   layers (test_group_norms), which store their intermediates in float16; and test_vulkan_precision's
#   float16-accumulation control, which passes FP16_TOL and fails storage_rule. A reference whose own output is
#   float16 too (the CPU reference of float16 input) is no FP16_TOL case: test_vulkan_ncnn_cases,
#   test_capabilities, test_vulkan_shapes and test_group_norms hold vknorm to it by ncnn_rule (its float32
#   algorithm's own error and both roundings).
FP32_TOL = 1e-5
FP16_TOL = 4e-3


def half_fp16_spacing(ref) -> np.ndarray:
    """The most rounding to float16 moves each value: half the spacing of its binade (2^(e - 11) for
    |ref| in [2^e, 2^(e+1)); 2^-25 among the subnormals, below 2^-14)."""
    a = np.abs(np.asarray(ref, np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isfinite(a), np.exp2(np.floor(np.log2(np.maximum(a, 2.0 ** -14))) - 11.0), np.inf)


def finite_scale(ref) -> float:
    """max(1, max finite |ref|): the rules' scale, which an infinite reference value must not make infinite."""
    a = np.abs(np.asarray(ref, np.float64))
    a = a[np.isfinite(a)]
    return max(1.0, float(a.max())) if a.size else 1.0


def _excess_over_slack(d, slack) -> float:
    """max(d - slack, 0) over all elements, NaN (inf - inf: an infinite value and an infinite allowance) counting
    as infinite."""
    with np.errstate(invalid="ignore"):
        e = np.asarray(d - slack, np.float64)
    return float(np.where(np.isnan(e), np.inf, np.maximum(e, 0.0)).max(initial=0.0))


def _difference(y, ref) -> np.ndarray:
    """|y - ref| per element: 0 where both are the same value (equal infinities included), inf where one side
    alone is NaN, 0 where both are."""
    y64, ref64 = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    with np.errstate(invalid="ignore"):
        d = np.where(y64 == ref64, 0.0, np.abs(y64 - ref64))
    both_nan = np.isnan(y64) & np.isnan(ref64)
    return np.where(both_nan, 0.0, np.where(np.isnan(d), np.inf, d))


def storage_rule(y, ref, fp16: bool) -> tuple:
    """(error, bound) of the storage's rule against a float64 reference computed from the very input the kernel
    read (for float16 storage: the float16 values). float32: max |y - ref| <= FP32_TOL x scale(ref). float16:
    what the output's own rounding to float16 cannot explain, max(|y - ref| - half_fp16_spacing(y)), within the
    same float32 rule: the kernels compute in float32 from float16 inputs, so storage costs only that rounding (a
    float16 accumulation fails it: test_vulkan_precision). Rounding moved y from the kernel's float32 value by at
    most half the spacing at y (never into a lower binade), which at a binade's edge is not the spacing at ref.
    NaN anywhere is an infinite error; the scale is of the finite reference values."""
    y64, ref64 = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    if np.isnan(y64).any() or np.isnan(ref64).any():
        return float("inf"), FP32_TOL * finite_scale(ref)
    # equal infinities are no error in either storage (an infinity where the reference is finite, or the other
    # sign, is an infinite one)
    if not fp16:
        return float(_difference(y64, ref64).max(initial=0.0)), FP32_TOL * finite_scale(ref)
    return _excess_over_slack(_difference(y64, ref64), half_fp16_spacing(y64)), FP32_TOL * finite_scale(ref)


# ---------------------------------------------------------------- against ncnn's own float32 layers

F32_UNIT_ROUNDOFF = 2.0 ** -24


# 1/sqrt(var + eps) in ulps: eps's addition (0.5); sqrt, which Vulkan may take as 1/inversesqrt (2 + 2.5); the 1/x
# after it (2.5); a GroupNorm's gamma product (0.5): 8 at most (ncnn's x86 packed path, an rsqrt estimate and Newton
# steps, a few). Twice that, for a bound that no conformant driver's rounding of the steps passes.
A_ROUNDINGS = 16


def _gamma_n(k) -> np.ndarray:
    """Higham's gamma_k = k u / (1 - k u): the relative error bound of k chained float32 roundings, in
    particular of a sum of k + 1 terms in any order (relative to the sum of the terms' magnitudes)."""
    k = np.asarray(k, np.float64) * F32_UNIT_ROUNDOFF
    return k / (1.0 - k)


def _two_pass_float32_error(rows, eps: float, g, b, rms: bool, squares_in_fp16: bool) -> np.ndarray:
    """ncnn_float32_error's bound for groups as rows, with |gamma| and |beta| per element (g, b broadcast)."""
    n = rows.shape[1]
    u = F32_UNIT_ROUNDOFF
    eps64 = float(np.float32(eps))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if rms:
            mean = dmean = 0.0
            var = (rows * rows).mean(axis=1, keepdims=True)
            dvar = _gamma_n(n + 2) * var
        else:
            mean = rows.mean(axis=1, keepdims=True)
            magnitude = np.abs(rows)
            dmean = _gamma_n(n + 2) * (magnitude.mean(axis=1, keepdims=True) + magnitude.max(axis=1, keepdims=True))
            var = ((rows - mean) ** 2).mean(axis=1, keepdims=True)
            dvar = _gamma_n(n + 3) * (var + dmean * dmean) + dmean * dmean
        if squares_in_fp16:
            largest = (np.abs(rows - mean) + dmean).max(axis=1, keepdims=True) ** 2
            dvar = np.where(largest < 65504.0, dvar + 2.0 ** -11 * (var + dvar) + 2.0 ** -14, np.inf)
        a = 1.0 / np.sqrt(var + eps64)
        # The computed variance is a sum of squares: var + eps never drops below eps.
        low = np.maximum(var + eps64 - dvar, eps64)
        da = np.where(low > 0, 1.0 / np.sqrt(np.where(low > 0, low, 1.0)) - a, np.inf) + A_ROUNDINGS * u * a
        err = g * (np.abs(rows - mean) * da + dmean * (a + da))
        return err + _gamma_n(4) * (g * (a + da) * (np.abs(rows) + np.abs(mean) + dmean) + b)


def ncnn_float32_error(op: str, x, affine_size: int, eps: float, affine: bool, gamma=None, beta=None,
                       squares_in_fp16: bool = False) -> np.ndarray:
    """Per element, the most a float32 LayerNorm/RMSNorm computed as ncnn computes it may differ from float64 of
    the same input and weights, whatever order its sums take (ncnn's CPU and Vulkan layers sum differently):
    LayerNorm mean = sum/n (its Vulkan subgroup reduction sums x - x[0]), var = sum((x - mean)^2)/n,
    a = 1/sqrt(var + eps), y = (x*a - mean*a)*gamma + beta; RMSNorm ms = sum(x*x)/n, y = x*a*gamma.
    ``squares_in_fp16``: ncnn's Vulkan layers with float16 storage may store each square in float16 before
    summing it (their multi-pass reduction does). From the a-priori bound of each step, in float64:
    - the mean's error dmean <= gamma_{n+2} (mean|x| + max|x|) (terms up to |x| + |x[0]|);
    - the variance's dvar <= gamma_{n+3} (var + dmean^2) + dmean^2 (squares about the computed mean sum to
      var + dmean^2 exactly); RMSNorm's dms <= gamma_{n+2} mean(x^2); float16 squares add 2^-11 of that mean
      square and 2^-14 (float16's subnormals, which a device may flush to zero), and none past float16's range;
    - a's error: what dvar moves 1/sqrt(var + eps) by (the computed variance is never below 0), plus A_ROUNDINGS
      ulps;
    - y's: |gamma| (|x - mean| da + dmean (a + da)) + 4 roundings of each term's magnitude.
    A bound, not an estimate: ncnn's results sit well inside it, and another formula (an n - 1 variance, eps
    outside the root) outside it in groups small enough for its difference to pass n roundings."""
    x64 = np.asarray(x, np.float64)
    rows = x64.reshape(-1, group_size(x64.shape, affine_size))
    g = np.abs(np.asarray(gamma, np.float64))[None, :] if affine else 1.0
    b = np.abs(np.asarray(beta, np.float64))[None, :] if affine and beta is not None else 0.0
    return _two_pass_float32_error(rows, eps, g, b, op == "RMSNorm", squares_in_fp16).reshape(x64.shape)


def ncnn_channel_float32_error(op: str, x, eps: float, group: int = 1, gamma=None, beta=None) -> np.ndarray:
    """ncnn_float32_error for GroupNorm (``group`` groups of consecutive channels) and InstanceNorm (a group per
    channel), numpy order, gamma/beta per channel: ncnn's CPU layers take the same steps (two passes, then
    a = gamma/sqrt(var + eps), b = beta - mean*a, y = x*a + b), and so do its float32 Vulkan layers."""
    x64 = np.asarray(x, np.float64)
    c = channel_count(op, x64.shape)
    groups = c if op == "InstanceNorm" else int(group)
    per_channel = x64.size // c
    def per_element(w):
        return np.repeat(np.abs(np.asarray(w, np.float64)), per_channel).reshape(groups, -1)
    g = per_element(gamma) if gamma is not None else 1.0
    b = per_element(beta) if beta is not None else 0.0
    return _two_pass_float32_error(x64.reshape(groups, -1), eps, g, b, False, False).reshape(x64.shape)


def ncnn_rule(ours, theirs, their_error, ours_fp16: bool = False, theirs_fp16: bool = False) -> tuple:
    """(excess, bound) of vknorm's output against an ncnn layer's output on the same input: what ncnn's own float32
    error (ncnn_float32_error, plus any shift of its weights) and the float16 rounding of each side's stored
    output cannot explain, max(|ours - theirs| - their_error - half_fp16_spacing of each float16 output), within
    vknorm's float32 rule, FP32_TOL x max(1, max finite |theirs|). NaN on one side only, or an infinite difference
    that only an infinite allowance would explain, is an infinite excess."""
    y64, t64 = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    slack = np.asarray(their_error, np.float64)
    if ours_fp16:
        slack = slack + half_fp16_spacing(y64)
    if theirs_fp16:
        slack = slack + half_fp16_spacing(t64)
    return _excess_over_slack(_difference(y64, t64), slack), FP32_TOL * finite_scale(theirs)


def group_size(shape, affine_size: int) -> int:
    """Elements per group for a numpy-order shape under ncnn's rules."""
    shape = tuple(int(s) for s in shape)
    dims = len(shape)
    if dims == 1:
        return shape[0]
    if dims == 2:
        return shape[1]
    if dims == 3:
        c, h, w = shape
        return w if affine_size == w else h * w
    if dims == 4:
        c, d, h, w = shape
        if affine_size == w:
            return w
        if affine_size == w * h:
            return w * h
        return w * h * d
    raise ValueError(f"dims must be 1-4, got {shape}")


def n_groups(shape, affine_size: int) -> int:
    return int(np.prod(shape)) // group_size(shape, affine_size)


def norm64(op: str, x, affine_size: int, eps: float, affine: bool, gamma=None, beta=None, ddof: int = 0) -> np.ndarray:
    """LayerNorm / RMSNorm in float64: two-pass mean and variance, y = (x - mean)/sqrt(var + eps)*gamma + beta.

    ``x``, ``gamma``, ``beta`` are taken at the values they hold (float16/float32 are widened
    exactly); ``eps`` is rounded to float32 first, as ncnn stores it. ``ddof=1``: LayerNorm's variance divided
    by n - 1 (torch.var's default), another formula for negative controls.
    """
    x64 = np.asarray(x).astype(np.float64)
    gs = group_size(x64.shape, affine_size)
    rows = x64.reshape(-1, gs)
    eps64 = float(np.float32(eps))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if op == "LayerNorm":
            mean = rows.mean(axis=1, keepdims=True)
            var = ((rows - mean) ** 2).sum(axis=1, keepdims=True) / (rows.shape[1] - ddof)
            y = (rows - mean) / np.sqrt(var + eps64)
        elif op == "RMSNorm":
            ms = (rows * rows).mean(axis=1, keepdims=True)
            y = rows / np.sqrt(ms + eps64)
        else:
            raise ValueError(op)
        if affine:
            y = y * np.asarray(gamma, np.float32).astype(np.float64)[None, :]
            if op == "LayerNorm":
                y = y + np.asarray(beta, np.float32).astype(np.float64)[None, :]
    return y.reshape(x64.shape)


def max_abs_err(y, ref) -> float:
    """max |y - ref| over all elements (NaN anywhere counts as infinite error)."""
    d = np.abs(np.asarray(y, np.float64) - np.asarray(ref, np.float64))
    if np.isnan(d).any():
        return float("inf")
    return float(d.max()) if d.size else 0.0


def scale(ref) -> float:
    """max(1, max|ref|), the scale the tolerances are relative to."""
    return max(1.0, float(np.abs(np.asarray(ref, np.float64)).max()))


def check_close(y, ref, tol: float, what: str) -> None:
    """Assert max|y - ref| <= tol * max(1, max|ref|) with a message naming the case."""
    err = max_abs_err(y, ref)
    bound = tol * scale(ref)
    assert err <= bound, f"{what}: max abs error {err:.3e} > {bound:.3e} (tol {tol:g} x max(1, max|y|)={scale(ref):.3g})"


# ---------------------------------------------------------------- inputs like ncnn's RandomMat

def ncnn_random(rng, shape, lo=-1.2, hi=1.2) -> np.ndarray:
    """Uniform in [lo, hi) with |v| < 1e-4 set to 0, as ncnn's RandomMat (own generator, same law)."""
    a = rng.uniform(lo, hi, size=shape).astype(np.float32)
    a[np.abs(a) < 1e-4] = 0
    return a


def case_name(op: str, case: dict) -> str:
    return f"{op}{case['shape']} affine_size={case['affine_size']} eps={case['eps']} affine={case['affine']}"


def all_cases():
    """Every ncnn case: (op, case). LayerNorm also gets the dims-4 mirror of test_rmsnorm_4."""
    out = [("LayerNorm", c) for c in ncnn_cases.LAYERNORM_CASES]
    out += [("LayerNorm", c) for c in ncnn_cases.LAYERNORM_DIMS4_EXTRA_CASES]
    out += [("RMSNorm", c) for c in ncnn_cases.RMSNORM_CASES]
    return out


def case_data(op: str, case: dict, seed: int):
    """(x, gamma, beta) for a case; gamma/beta None when affine=0 (beta None for RMSNorm)."""
    rng = np.random.default_rng(seed)
    x = ncnn_random(rng, case["shape"])
    gamma = beta = None
    if case["affine"]:
        gamma = ncnn_random(rng, (case["affine_size"],))
        if op == "LayerNorm":
            beta = ncnn_random(rng, (case["affine_size"],))
    return x, gamma, beta


def make_layer(op: str, affine_size: int, eps: float, affine: bool, gamma=None, beta=None, **kwargs):
    import vknorm

    cls = vknorm.LayerNorm if op == "LayerNorm" else vknorm.RMSNorm
    layer = cls(affine_size=affine_size, eps=float(np.float32(eps)), affine=bool(affine), **kwargs)
    if affine:
        if op == "LayerNorm":
            layer.load_model(gamma, beta)
        else:
            layer.load_model(gamma)
    return layer


# ---------------------------------------------------------------- reductions that must NOT be used

def _tree_sum(a: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Pairwise (GPU-style tree) sum over the last axis, every addition rounded to dtype."""
    a = np.asarray(a, dtype)
    n = a.shape[-1]
    p = 1
    while p < n:
        p *= 2
    buf = np.zeros(a.shape[:-1] + (p,), dtype)
    buf[..., :n] = a
    while buf.shape[-1] > 1:
        half = buf.shape[-1] // 2
        buf = (buf[..., :half] + buf[..., half:]).astype(dtype)
    return buf[..., 0]


def stats_raw_sums_f32(rows: np.ndarray):
    """mean, var from a float32 sum and sum of squares (tree-reduced): var = E[x^2] - mean^2."""
    rows = np.asarray(rows, np.float32)
    n = np.float32(rows.shape[-1])
    s1 = _tree_sum(rows)
    s2 = _tree_sum(rows * rows)
    mean = (s1 / n).astype(np.float32)
    var = (s2 / n - mean * mean).astype(np.float32)
    return mean, var


def stats_two_pass(rows: np.ndarray, dtype=np.float32):
    """mean, var in two passes (tree-reduced, in dtype) without a pivot: the mean, then squares about it."""
    rows = np.asarray(rows, dtype)
    n = dtype(rows.shape[-1])
    mean = (_tree_sum(rows, dtype) / n).astype(dtype)
    d = (rows - mean[:, None]).astype(dtype)
    return mean, (_tree_sum(d * d, dtype) / n).astype(dtype)


def stats_shifted_one_reduction_f32(rows: np.ndarray):
    """mean, var from float32 sums of d = x - pivot and d^2 reduced together (pivot: the mean of the
    first 4 elements): var = E[d^2] - E[d]^2, with no second pass."""
    rows = np.asarray(rows, np.float32)
    n = np.float32(rows.shape[-1])
    q = np.float32(0.25)
    pivot = (q * rows[:, 0] + q * rows[:, 1]) + (q * rows[:, 2] + q * rows[:, 3])
    d = (rows - pivot[:, None]).astype(np.float32)
    m = (_tree_sum(d) / n).astype(np.float32)
    var = (_tree_sum(d * d) / n - m * m).astype(np.float32)
    return (pivot + m).astype(np.float32), var


def stats_running_mean_f32(rows: np.ndarray):
    """mean, var from Welford's update with the running mean held in one float32 per group."""
    rows = np.asarray(rows, np.float32)
    mean = np.zeros(rows.shape[0], np.float32)
    m2 = np.zeros(rows.shape[0], np.float32)
    for k in range(rows.shape[1]):
        xk = rows[:, k]
        delta = (xk - mean).astype(np.float32)
        mean = (mean + delta / np.float32(k + 1)).astype(np.float32)
        m2 = (m2 + delta * (xk - mean)).astype(np.float32)
    return mean, (m2 / np.float32(rows.shape[1])).astype(np.float32)


def layernorm_from_stats(rows: np.ndarray, mean, var, eps: float) -> np.ndarray:
    """y from given (float32) statistics, applied in float64 so only the statistics' error shows."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rows.astype(np.float64) - np.asarray(mean, np.float64)[:, None]) / np.sqrt(
            np.asarray(var, np.float64)[:, None] + float(np.float32(eps)))


# ---------------------------------------------------------------- which kernel ran

def check_dispatch(info: dict, forced: str, group_size: int, device: dict):
    """None if ``layer.last_dispatch`` is consistent with the forced path, else a description.

    Rules (Option.path): fused kernels (subgroup, workgroup) are one dispatch, split is
    reduce -> finalize -> normalize; a forced path that cannot hold a group falls to the next larger
    one (subgroup -> workgroup -> split), never to a smaller one; a forced path that surely holds the
    group is taken: split always, workgroup for groups of <= 64 elements (one per invocation of the
    smallest workgroup vknorm uses), subgroup for groups of <= subgroup_size elements. A workgroup no
    larger than the device's subgroup is one subgroup, so a forced workgroup path may run as "subgroup".
    """
    path = info.get("path")
    if path not in PATH_RANK:
        return f"last_dispatch path {path!r} is not subgroup/workgroup/split/cooperative"
    n = info.get("dispatches")
    if path == "split" and not (isinstance(n, int) and n >= 2):
        return f"split path recorded {n} dispatches (reduce, finalize, normalize expected)"
    if path != "split" and n != 1:
        return f"fused {path} path recorded {n} dispatches, expected 1"
    if forced == "auto":
        return None
    if forced == "workgroup" and path == "subgroup" and 0 < (info.get("workgroup_size") or 0) <= int(
            device.get("subgroup_size") or 0):
        return None  # a workgroup no larger than a subgroup is one subgroup: the planner names the team so
    if PATH_RANK[path] < PATH_RANK[forced]:
        return f"forced {forced} ran {path}: a forced path only falls to a larger one"
    surely_holds = {
        "split": True,
        "workgroup": group_size <= 64,
        "subgroup": group_size <= int(device.get("subgroup_size") or 0),
    }[forced]
    if surely_holds and path != forced:
        return f"forced {forced} ran {path} although a group of {group_size} fits {forced}"
    return None


# ---------------------------------------------------------------- GroupNorm / InstanceNorm

def channel_count(op: str, shape) -> int:
    """ncnn's channels of a numpy-order shape: w (dims 1), rows (dims 2), c (dims 3/4); InstanceNorm
    treats a dims 1-2 blob as one channel."""
    if op == "InstanceNorm" and len(shape) <= 2:
        return 1
    return int(shape[0])


def channel_norm64(op: str, x, eps: float, group: int = 1, gamma=None, beta=None) -> np.ndarray:
    """float64 GroupNorm (``group`` groups of consecutive channels) or InstanceNorm (one group per
    channel) of x in numpy order, then gamma[c] / beta[c] per channel."""
    x = np.asarray(x, np.float64)
    c = channel_count(op, x.shape)
    groups = c if op == "InstanceNorm" else int(group)
    per_channel = x.reshape(c, -1)
    g = per_channel.reshape(groups, -1)
    with np.errstate(all="ignore"):
        y = ((g - g.mean(1, keepdims=True)) / np.sqrt(g.var(1, keepdims=True) + float(np.float32(eps))))
        y = y.reshape(c, -1)
        if gamma is not None:
            y = y * np.asarray(gamma, np.float64)[:, None] + np.asarray(beta, np.float64)[:, None]
    return y.reshape(x.shape)


def make_channel_norm(op: str, channels: int, eps: float, affine: bool, gamma=None, beta=None, group: int = 1,
                      **kwargs):
    """A vknorm GroupNorm / InstanceNorm with its weights loaded."""
    import vknorm

    layer = (vknorm.GroupNorm(group, channels, eps, affine, **kwargs) if op == "GroupNorm"
             else vknorm.InstanceNorm(channels, eps, affine, **kwargs))
    if affine:
        layer.load_model(gamma, beta)
    return layer

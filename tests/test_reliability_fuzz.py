"""Fuzzing: bad and odd input never crashes, hangs or returns garbage.

Property tests (hypothesis, derandomized so CI runs the same cases every time; VKNORM_FUZZ_SCALE=N
multiplies every budget for a longer local run) over:

* layer inputs: shapes, affine_size, affine, eps, dtypes, memory layouts (non-contiguous views),
  options, devices -> the float64 reference's result, or ValueError / TypeError with a message;
* param dicts given to load_param / from_param -> a valid layer, or ValueError / TypeError, and a
  refused dict changes nothing;
* garbled and truncated .param text parsed by `vknorm check`'s reader (in-process) -> a Model or a
  UsageError naming the file;
* garbled / truncated .param and .bin files run through the whole `vknorm check` CLI -> exit 0, a
  one-line error with exit 2, or exit 1 only where explained (R.explain_mismatch: vknorm's layer output
  equals ncnn's algorithm on the input it received, which garbled upstream layers can make differ from
  the stock run's, or the values go past float32's range); never a crash, a hang (each case has a time
  bound), a traceback or a validation message. These run in a
  worker process (tests/reliability_lib.py check-worker) that forks the CLI per case, so a crash
  cannot take pytest down and no case pays a Python start-up.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import reliability_lib as R
import vknorm
from reference import FP32_TOL, group_size, half_fp16_spacing, norm64, scale
from vknorm import check as vkcheck
from vknorm.cli import UsageError

SCALE = max(1, int(os.environ.get("VKNORM_FUZZ_SCALE", "1")))


def fuzz_settings(examples: int, deadline_ms=None):
    # No deadline by default: an example that first makes a pipeline runs slower than its replay, which hypothesis
    # would call flaky; the 300 s test timeout catches a hang.
    return settings(max_examples=examples * SCALE, deadline=deadline_ms, derandomize=SCALE == 1,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], database=None)


# ============================================================================ layer inputs

EPS = st.one_of(st.sampled_from([0.0, -0.0, 1e-30, 1e-6, 1e-5, 1e-3, 0.5, 1.0, 1e30, -1e-5, -1.0, math.nan,
                                 math.inf, -math.inf, 1e300, 1e-40, 1e-50]),
                st.floats(min_value=0, max_value=10, allow_nan=False))
DTYPES = ("float32",) * 5 + ("float16",) * 3 + ("float64",) * 2 + ("int32", "bool", "complex64", "uint8")
LAYOUTS = ("contiguous", "every_other", "reversed", "transposed", "fortran", "readonly")


@st.composite
def layer_cases(draw):
    dims = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=dims - 1, max_size=dims - 1))) + (draw(st.integers(1, 70)),)
    mode = draw(st.sampled_from(["w", "wh", "whole", "random"]))
    w = shape[-1]
    h = shape[-2] if dims >= 2 else 1
    whole = int(np.prod(shape[-3:] if dims == 4 else shape[-2:] if dims == 3 else shape))
    affine_size = {"w": w, "wh": w * h, "whole": whole, "random": draw(st.integers(-2, 80))}[mode]
    return {
        "op": draw(st.sampled_from(["LayerNorm", "RMSNorm"])),
        "shape": shape,
        "affine_size": affine_size,
        "affine": draw(st.booleans()),
        "eps": draw(EPS),
        "dtype": draw(st.sampled_from(DTYPES)),
        "layout": draw(st.sampled_from(LAYOUTS)),
        "magnitude": draw(st.sampled_from([1.0, 1e-3, 30.0])),
        "fp16": draw(st.booleans()),
        "packing": draw(st.booleans()),
        "path": draw(st.sampled_from(["auto", "subgroup", "workgroup", "split"])),
        "device": draw(st.sampled_from(["vulkan", "vulkan", "cpu", "vkmat"])),
        "seed": draw(st.integers(0, 2**16)),
    }


def make_input(case):
    rng = np.random.default_rng(case["seed"])
    shape, layout = case["shape"], case["layout"]
    base_shape = {"every_other": shape[:-1] + (2 * shape[-1],), "transposed": shape[::-1]}.get(layout, shape)
    base = rng.standard_normal(base_shape) * case["magnitude"]
    base = base.astype(case["dtype"]) if case["dtype"] != "bool" else base > 0
    x = {"every_other": lambda a: a[..., ::2], "reversed": lambda a: a[::-1], "transposed": lambda a: a.T,
         "fortran": np.asfortranarray}.get(layout, lambda a: a)(base)
    if layout == "readonly":
        x.flags.writeable = False
    assert x.shape == shape
    return x


def expected_error(case):
    """The error a case must raise (type, words in the message), or None when it must succeed."""
    if case["affine_size"] < 0:  # checked first, as load_param does
        return ValueError, "affine_size"
    with np.errstate(over="ignore", under="ignore"):
        if not (math.isfinite(case["eps"]) and case["eps"] >= 0 and math.isfinite(np.float32(case["eps"]))):
            return ValueError, "eps"
        if case["eps"] != 0 and np.float32(case["eps"]) == 0:  # float32 would hold it as 0
            return ValueError, "eps"
    if case["dtype"] not in ("float32", "float16", "float64"):
        return TypeError, "float"
    if case["affine"] and case["affine_size"] != group_size(case["shape"], case["affine_size"]):
        return ValueError, "affine_size"
    return None


def run_case(case):
    cls = vknorm.LayerNorm if case["op"] == "LayerNorm" else vknorm.RMSNorm
    layer = cls(affine_size=case["affine_size"], eps=case["eps"], affine=case["affine"])
    rng = np.random.default_rng(case["seed"] + 1)
    gamma = rng.uniform(-2, 2, max(case["affine_size"], 0)).astype(np.float32)
    beta = rng.uniform(-2, 2, max(case["affine_size"], 0)).astype(np.float32)
    if case["affine"]:
        layer.load_model(gamma, beta) if case["op"] == "LayerNorm" else layer.load_model(gamma)
    x = make_input(case)
    opt = vknorm.Option(use_fp16_storage=case["fp16"], use_packing_layout=case["packing"], path=case["path"])
    if case["device"] == "vkmat":
        v = vknorm.to_device(x, option=opt)
        layer.forward_inplace(v, option=opt)
        y = v.download().numpy().reshape(x.shape)
    else:
        y = layer(x, device=case["device"], option=opt)
    return layer, x, y, gamma, beta


@fuzz_settings(300)
@given(case=layer_cases())
# Found by the fuzz: a read-only array was refused by the binding ("incompatible function arguments");
# groups of 2 with eps=0 are ill-conditioned in float32 (cancellation_slack).
@example(case={"op": "LayerNorm", "shape": (1,), "affine_size": 1, "affine": False, "eps": 0.0, "dtype": "float32",
               "layout": "readonly", "magnitude": 1.0, "fp16": False, "packing": False, "path": "auto",
               "device": "vulkan", "seed": 0})
@example(case={"op": "LayerNorm", "shape": (2, 3, 5, 2), "affine_size": 2, "affine": False, "eps": 0.0,
               "dtype": "float32", "layout": "contiguous", "magnitude": 1.0, "fp16": False, "packing": False,
               "path": "auto", "device": "cpu", "seed": 3})
def test_fuzz_layer_inputs_give_the_reference_result_or_a_clear_error(case):
    want = expected_error(case)
    event(f"expected: {want[0].__name__ if want else 'a result'}")
    try:
        layer, x, y, gamma, beta = run_case(case)
    except (ValueError, TypeError) as e:
        assert want is not None, f"{case}: unexpected {type(e).__name__}: {e}"
        assert isinstance(e, want[0]) and want[1] in str(e), f"{case}: {type(e).__name__}: {e}, wanted {want}"
        return
    assert want is None, f"{case}: succeeded, expected {want}"
    assert y.shape == x.shape
    half = case["fp16"] if case["device"] == "vkmat" else x.dtype == np.float16  # a VkMat downloads as stored
    assert y.dtype == (np.float16 if half else np.float32)
    # the values the kernel read: float32 (float64 input is converted to float32 first), then float16 where stored so
    xs = x.astype(np.float32)
    if (case["fp16"] and case["device"] != "cpu") or x.dtype == np.float16:
        xs = xs.astype(np.float16)
    ref = norm64(case["op"], xs, case["affine_size"], case["eps"], case["affine"], gamma, beta)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(y), nan), f"{case}: NaN where the reference has none, or the reverse"
    # the storage rule (reference.storage_rule) on the elements that are not NaN, plus cancellation_slack: float32,
    # FP32_TOL of the scale; float16 (the reference saw the float16 input), the same past the output's own rounding.
    # Unlike storage_rule, an infinite output fails even against an equal infinite reference (the fuzzed inputs
    # are finite and their norms too)
    bound = FP32_TOL * scale(np.where(nan, 0, ref)) + cancellation_slack(case, xs, gamma)
    err = np.where(nan, 0, np.abs(y.astype(np.float64) - np.where(nan, 0, ref)))
    if xs.dtype == np.float16:
        with np.errstate(invalid="ignore"):  # an infinite y: inf - inf, NaN, fails below
            err = err - half_fp16_spacing(np.where(nan, 0, y))
    worst = np.unravel_index(np.argmax(np.where(np.isnan(err), np.inf, err - bound)), err.shape)
    assert (err <= bound).all(), \
        f"{case}: abs error {'past the float16 rounding ' if xs.dtype == np.float16 else ''}" \
        f"{err[worst]:.3g} > {np.broadcast_to(bound, err.shape)[worst]:.3g}"


def cancellation_slack(case, xs, gamma):
    """What float32 arithmetic cannot avoid, ncnn's own CPU code included: LayerNorm computes x - mean, and a
    mean of relative error e moves every output by e * |mean| / sqrt(var + eps) (the group's offset condition
    number) times |gamma|. vknorm's kernels sum about a pivot, so their mean is off by its last roundings only
    (4 float32 ulps of |mean| allowed); the CPU reference follows ncnn, a sequential sum of the group's n
    elements, off by up to n ulps. Below the float32 rule for groups about zero (test below), zero for constant
    groups (x - mean is exactly 0 about the pivot, so y is beta) and for RMSNorm (no subtraction)."""
    if case["op"] != "LayerNorm":
        return 0.0
    gs = group_size(xs.shape, case["affine_size"])
    rows = xs.astype(np.float64).reshape(-1, gs)
    with np.errstate(divide="ignore", invalid="ignore"):
        var = rows.var(axis=1)
        kappa = np.where(var == 0, 0.0, np.abs(rows.mean(axis=1)) / np.sqrt(var + float(np.float32(case["eps"]))))
    g = float(np.abs(gamma).max()) if case["affine"] and gamma.size else 1.0
    ulps = gs if case["device"] == "cpu" else 4
    slack = ulps * 2.0**-23 * np.nan_to_num(kappa, nan=0.0, posinf=np.inf) * g
    return np.repeat(slack, gs).reshape(xs.shape)


@pytest.mark.parametrize("device", ["vulkan", "cpu"])
def test_the_cancellation_slack_stays_below_the_float32_rule_for_groups_about_zero(device):
    """The fuzz's inputs are N(0, 1) times a magnitude: groups of 70 to 3430 elements about zero get less slack
    than the float32 rule itself (so a kernel off by the n - 1 variance, ~1/2n of |y|, still fails there)."""
    rng = np.random.default_rng(5)
    for gs in (70, 490, 3430):
        xs = (rng.standard_normal((8, gs)) * 30).astype(np.float32)
        gamma = rng.uniform(-2, 2, gs).astype(np.float32)
        case = {"op": "LayerNorm", "affine_size": gs, "affine": True, "eps": 1e-5, "device": device}
        ref = norm64("LayerNorm", xs, gs, 1e-5, True, gamma, np.zeros(gs, np.float32))
        assert float(cancellation_slack(case, xs, gamma).max()) < FP32_TOL * scale(ref), gs


# ============================================================================ param dicts

PARAM_VALUES = st.one_of(st.integers(-(2**40), 2**40), st.integers(-3, 3),
                         st.floats(allow_nan=True, allow_infinity=True),
                         st.sampled_from(["3", "abc", "", "1e-5", None, True, False, 2.5, -0.0]))


@fuzz_settings(200)
@given(params=st.dictionaries(st.one_of(st.integers(-3, 6), st.sampled_from(["0", "x", 2**33])), PARAM_VALUES,
                              max_size=5),
       op=st.sampled_from(["LayerNorm", "RMSNorm"]))
# Found by the fuzz: RuntimeError "std::bad_cast" and OverflowError instead of ValueError.
@example(params={0: 2**40}, op="LayerNorm")
@example(params={0: math.inf}, op="RMSNorm")
def test_fuzz_param_dicts_load_or_refuse_cleanly(params, op):
    cls = vknorm.LayerNorm if op == "LayerNorm" else vknorm.RMSNorm
    layer = cls(affine_size=8, eps=1e-5)
    before = (layer.affine_size, layer.eps, layer.affine)
    try:
        layer.load_param(params)
    except (ValueError, TypeError) as e:
        assert str(e), "an error without a message"
        assert (layer.affine_size, layer.eps, layer.affine) == before, "a refused load_param changed the layer"
    else:
        assert layer.affine_size >= 0 and math.isfinite(layer.eps) and layer.eps >= 0 and layer.affine in (True, False)
        x = np.random.default_rng(0).standard_normal((3, max(layer.affine_size, 1) if layer.affine_size < 4096 else 4))
        x = x.astype(np.float32)
        if layer.affine and layer.affine_size != x.shape[-1]:
            with pytest.raises(ValueError):
                layer(x)
        elif not layer.affine:
            y = layer(x)
            assert np.isfinite(y).all() or layer.eps == 0
    try:
        made = cls.from_param(params)
    except (ValueError, TypeError) as e:
        assert str(e)
    else:
        assert made.affine_size >= 0 and math.isfinite(made.eps) and made.eps >= 0


# ============================================================================ garbled .param text, parsed

MODEL_NAMES = sorted(R.MODELS)


@st.composite
def garbled_param(draw):
    name = draw(st.sampled_from(MODEL_NAMES))
    text = R.model_files(name)[0].read_bytes()
    for _ in range(draw(st.integers(1, 3))):
        text = R.garble_param(text, draw(st.sampled_from(R.PARAM_MUTATIONS)), draw(st.integers(0, 2**30)),
                              draw(st.integers(0, 2**30)), draw(st.binary(min_size=1, max_size=12)))
    return name, text


@fuzz_settings(300, deadline_ms=2000)
@given(case=garbled_param())
def test_fuzz_param_reader_returns_a_model_or_a_usage_error(tmp_path_factory, case):
    name, text = case
    path = tmp_path_factory.mktemp("p") / "m.param"
    path.write_bytes(text)
    try:
        model = vkcheck.parse_param(str(path))
    except UsageError as e:
        event("UsageError")
        msg = str(e)
        assert msg.startswith(str(path)) and "\n" not in msg.strip(), msg
        return
    assert model.layers and all(layer.type for layer in model.layers)


# ============================================================================ the whole CLI on garbled files

@pytest.fixture(scope="module")
def worker():
    w = R.CheckWorker()
    yield w
    w.close()


@st.composite
def garbled_model(draw):
    name = draw(st.sampled_from(MODEL_NAMES))
    p, b = R.model_files(name)
    ptext, bdata = p.read_bytes(), b.read_bytes()
    target = draw(st.sampled_from(["param", "bin"]))
    kind = draw(st.sampled_from(R.PARAM_MUTATIONS if target == "param" else R.BIN_MUTATIONS))
    a, c = draw(st.integers(0, 2**30)), draw(st.integers(0, 2**30))
    junk = draw(st.binary(min_size=1, max_size=16))
    if target == "param":
        ptext = R.garble_param(ptext, kind, a, c, junk)
    else:
        bdata = R.garble_bin(bdata, kind, a, c, junk)
    return name, f"{target}:{kind}", ptext, bdata


CHECK_TIMEOUT = 60.0  # seconds per case (a clean run takes ~0.5 s)


def _flipped(name, pos, bit):
    p, b = R.model_files(name)
    return name, "param:flip_byte", R.garble_param(p.read_bytes(), "flip_byte", pos, bit, b""), b.read_bytes()


@fuzz_settings(100, deadline_ms=None)
@given(case=garbled_model())
# Found by the fuzz: a convolution stride set to 5 makes ncnn's forward fail, and ncnn then printed
# "FATAL ERROR! pool allocator destroyed too early" on stderr next to check's one-line error.
@example(case=_flipped("layernorm_2d", 146, 2))
def test_fuzz_vknorm_check_on_garbled_models(worker, tmp_path_factory, case):
    name, kind, ptext, bdata = case
    d = tmp_path_factory.mktemp("m")
    (d / "m.param").write_bytes(ptext)
    (d / "m.bin").write_bytes(bdata)
    argv = ["check", str(d / "m.param"), str(d / "m.bin"), "--input", f"in0={R.MODELS[name]}", "--json"]
    res = worker.run(argv, timeout=CHECK_TIMEOUT)
    outcome = R.classify(res)
    event(f"{kind} -> {outcome}")
    assert outcome in ("ok", "error", "mismatch"), f"{name} {kind}: {outcome}\n{res}"
    if outcome == "mismatch":
        # Only where garbage weights or params push the values past float32's comfortable range.
        assert kind != "bin:append", f"{name} {kind}: exit 1\n{res['stdout']}"
        import json

        failing = {r["name"] for r in json.loads(res["stdout"])["layers"] if not r["ok"]}
        why = {e["layer"]: e for e in R.explain_mismatch(str(d / "m.param"), str(d / "m.bin"), R.MODELS[name])}
        unexplained = [n for n in failing if not why[n]["explained"]]
        assert not unexplained, f"{name} {kind}: mismatch not explained: {[why[n] for n in unexplained]}"
        for n in failing:
            event("mismatch: " + ("vknorm matches ncnn's algorithm on its input" if why[n]["self_consistent"] else
                                  "values past float32's range"))
    if kind == "bin:append":  # trailing bytes: a warning, the model itself is intact
        assert outcome == "ok", f"{name} {kind}: must pass\n{res}"


# ============================================================================ the same through `check --vulkan`

@pytest.fixture(scope="module")
def vulkan_worker():
    w = R.CheckWorker(graph_validation=True)  # the validation layer in ncnn's instance too, logging to a file
    yield w
    w.close()


@fuzz_settings(25, deadline_ms=None)
@given(case=garbled_model())
def test_fuzz_vknorm_check_vulkan_on_garbled_models(vulkan_worker, tmp_path_factory, case):
    """The garbled models above through `vknorm check --vulkan` (vknorm inside ncnn's Vulkan graph): exit 0,
    one clear line with exit 2, or exit 1 only where explained (R.explain_mismatch_vulkan); never a crash,
    a hang, a traceback or a validation message from any instance, ncnn's included (but for stock ncnn's own
    copy hazard, which stock layers in place on a shared blob cause: validation_layer.only_ncnn_clone_hazards)."""
    name, kind, ptext, bdata = case
    d = tmp_path_factory.mktemp("m")
    (d / "m.param").write_bytes(ptext)
    (d / "m.bin").write_bytes(bdata)
    argv = ["check", str(d / "m.param"), str(d / "m.bin"), "--input", f"in0={R.MODELS[name]}", "--json", "--vulkan"]
    res = vulkan_worker.run(argv, timeout=CHECK_TIMEOUT)
    outcome = R.classify(res)
    event(f"{kind} -> {outcome}")
    if res.get("validation_log", "").strip():
        event("stock ncnn's clone hazard in ncnn's instance (validation_layer.only_ncnn_clone_hazards)")
    assert outcome in ("ok", "error", "mismatch"), f"{name} {kind}: {outcome}\n{res}"
    if outcome == "mismatch":
        why = R.explain_failing(vulkan_worker, res, str(d / "m.param"), str(d / "m.bin"), R.MODELS[name], vulkan=True)
        unexplained = [w for w in why.values() if not w["explained"]]
        assert not unexplained, f"{name} {kind}: mismatch not explained: {unexplained}"
        for w in why.values():
            event("mismatch: " + ("vknorm matches ncnn's algorithm on its input" if w["self_consistent"] else
                                  "values past float32's range"))
    if kind == "bin:append":  # trailing bytes: a warning, the model itself is intact
        assert outcome == "ok", f"{name} {kind}: must pass\n{res}"


def test_check_vulkan_worker_reports_a_validation_message_from_ncnns_instance(tmp_path):
    """Negative control for the worker above: a dims-1 input of 300000 elements makes ncnn's own upload
    conversion dispatch 75000 workgroups in y (maxComputeWorkGroupCount[1] is 65535 on lavapipe and NVIDIA
    alike): the validation layer in ncnn's instance reports it to the log, and the case counts as a
    validation failure whatever the check's verdict (lavapipe runs the oversized dispatch whole, exit 0;
    NVIDIA's driver leaves rows unconverted, exit 1: what it computes is undefined)."""
    (tmp_path / "m.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 out0 0=0 1=1e-5 2=0\n")
    (tmp_path / "m.bin").write_bytes(b"")
    w = R.CheckWorker(graph_validation=True)
    try:
        res = w.run(["check", str(tmp_path / "m.param"), str(tmp_path / "m.bin"), "--input", "in0=300000", "--json",
                     "--vulkan"], 60)
    finally:
        w.close()
    assert res["rc"] in (0, 1) and not res["signal"] and not res["timed_out"], res
    assert "maxComputeWorkGroupCount" in res["validation_log"], res
    assert R.classify(res) == "validation", res

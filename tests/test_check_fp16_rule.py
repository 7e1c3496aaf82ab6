"""`vknorm check --fp16`: one pass rule for both engines (vknorm.check.judge_layer).

The held-out case: LayerNorm ln0 (gamma 3, beta 100) makes 100 + 3y, and LayerNorm ln1 (groups of 14,
gamma 2: |y| ~ 4) normalizes it. With float16 storage ln1's input is rounded to a spacing of 1/16 at 100,
which moves its output by ~2e-2 against the float32 stock run however exact the kernel is: the former
pyncnn rule (max |vknorm - stock| <= 1e-2) failed it. The rule of both engines judges each layer against
float64 of the float16-rounded input it saw, less the float16 output rounding, each element's over max(1, |its
value|, |gamma x^| + |beta|) (<= 1e-3): it passes, and still fails an output 1e-2 off (negative control: vknorm's
layer output shifted on purpose).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vknorm import check as vkcheck
from availability import import_or_missing, needs_graph, needs_vulkan

ROOT = Path(__file__).resolve().parent.parent
W = 14  # the group: LayerNorm over w of an h x w input
DIMS = "16x14"






pytestmark = [needs_vulkan, pytest.mark.timeout(300)]


def write_model(tmp: Path):
    """in0 -> LayerNorm ln0 (gamma 3, beta 100) -> a -> LayerNorm ln1 (gamma 2, beta 0) -> out0."""
    param, binp = tmp / "offset_ln.param", tmp / "offset_ln.bin"
    param.write_text("7767517\n3 3\nInput in0 0 1 in0\n"
                     f"LayerNorm ln0 1 1 in0 a 0={W} 1=1.000000e-05 2=1\n"
                     f"LayerNorm ln1 1 1 a out0 0={W} 1=1.000000e-05 2=1\n")
    weights = [np.full(W, 3.0), np.full(W, 100.0), np.full(W, 2.0), np.zeros(W)]
    binp.write_bytes(b"".join(np.asarray(a, np.float32).tobytes() for a in weights))
    return str(param), str(binp)


def cli(*args, timeout=180) -> subprocess.CompletedProcess:
    env = dict(os.environ, VKNORM_VALIDATION="1", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "vknorm", "check", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_fp16_check_passes_a_layernorm_after_100_plus_3y(tmp_path):
    import_or_missing("ncnn")
    p, b = write_model(tmp_path)
    r = cli(p, b, "--input", f"in0={DIMS}", "--fp16", "--json")
    assert r.returncode == 0 and r.stderr == "", (r.stdout, r.stderr)
    res = json.loads(r.stdout)
    assert res["ok"] is True and res["fp16"] is True and res["atol"] == 1e-3
    assert res["rule"].startswith("fp16:") and "float16-rounded input" in res["rule"]
    ln0, ln1 = res["layers"]
    assert (ln1["name"], ln1["group_size"], ln1["groups"]) == ("ln1", W, 16)
    assert ln1["max_abs_err"] > 1e-2, ln1  # the former rule (max |vknorm - stock| <= 1e-2) failed this layer
    for x in (ln0, ln1):
        assert x["ok"] is True and 0 <= x["judged_err"] <= 1e-3, x

    t = cli(p, b, "--input", f"in0={DIMS}", "--fp16")  # the table says the same
    assert t.returncode == 0 and t.stderr == "", (t.stdout, t.stderr)
    lines = t.stdout.splitlines()
    assert next(ln for ln in lines if ln.startswith("layer")).split() == [
        "layer", "type", "shape", "group_size", "groups", "max_abs_err", "f64_err", "judged", "gpu_us"]
    assert f"rule: {res['rule']}" in lines
    assert lines[-1].startswith("ok:") and "fp16 rule" in lines[-1]


@needs_graph
def test_both_engines_state_and_apply_the_same_rule(tmp_path):
    import_or_missing("ncnn")
    p, b = write_model(tmp_path)
    runs = {v: cli(p, b, "--input", f"in0={DIMS}", "--fp16", "--json", *(["--vulkan"] if v else []))
            for v in (False, True)}
    for r in runs.values():
        assert r.returncode == 0, (r.stdout, r.stderr)
    plain, vulkan = (json.loads(runs[v].stdout) for v in (False, True))
    assert plain["atol"] == vulkan["atol"] == vkcheck.ATOL_FP16 == 1e-3
    # the --vulkan engine adds only what it alone can judge: host round trips and the model's outputs
    assert vulkan["rule"] == (plain["rule"] + "; no host round trips; each model output within 2x stock ncnn "
                              "Vulkan's max |error| against the CPU run + atol x max(1, max |CPU output|)")
    assert vulkan["outputs_ok"] is True and "outputs_ok" not in plain
    assert [x["name"] for x in plain["layers"]] == [x["name"] for x in vulkan["layers"]] == ["ln0", "ln1"]
    assert all(x["ok"] and x["judged_err"] <= 1e-3 for res in (plain, vulkan) for x in res["layers"])


def _shift_output(monkeypatch, layer_name: str, delta: float):
    """vknorm's ncnn layer `layer_name` returns its output + delta (a wrong kernel, on purpose)."""
    from vknorm import ncnn as vkncnn

    real = vkncnn.VknormLayer.forward_inplace

    def wrong(self, blob, opt):
        ret = real(self, blob, opt)
        if self.name == layer_name:
            np.asarray(blob)[...] += delta  # a writable view of the blob
        return ret

    monkeypatch.setattr(vkncnn.VknormLayer, "forward_inplace", wrong)


@pytest.mark.parametrize("fp16", [True, False], ids=["fp16", "fp32"])
def test_rule_fails_an_output_off_by_1e_2(tmp_path, monkeypatch, fp16):
    """Negative control: ln1's output shifted by 1e-2, well above its float16 rounding (half a spacing of
    |y| <= 8 is <= 2e-3): the layer fails, ln0 still passes, the check fails. Honest run first (in process)."""
    import_or_missing("ncnn")
    p, b = write_model(tmp_path)
    honest = vkcheck.check_model(p, b, {"in0": (16, W)}, fp16=fp16)
    assert honest["ok"] is True, honest["layers"]

    _shift_output(monkeypatch, "ln1", 1e-2)
    res = vkcheck.check_model(p, b, {"in0": (16, W)}, fp16=fp16)
    ln0, ln1 = res["layers"]
    assert res["ok"] is False and ln0["ok"] is True and ln1["ok"] is False, res["layers"]
    if fp16:
        assert 5e-3 < ln1["judged_err"] <= 1e-2 + 1e-6, ln1  # the shift less the float16 output rounding
    else:
        assert abs(ln1["judged_err"] - 1e-2) < 1e-5, ln1
    assert "FAIL" in vkcheck.format_text(res) and "ln1" in vkcheck.format_text(res).splitlines()[-1]


def test_judge_layer_arithmetic():
    """The rule on its own (no device): 100 + 3z rows normalized in float32 with float16 storage pass;
    the same 1e-2 off fail; a NaN the reference does not have fails."""
    rng = np.random.default_rng(0)
    x = (100 + 3 * rng.standard_normal((16, W))).astype(np.float32)
    g = x.astype(np.float16).astype(np.float32)  # what a float16-storage layer uploads
    y32 = (g - g.mean(1, keepdims=True)) / np.sqrt(g.var(1, keepdims=True) + np.float32(1e-5)) * np.float32(2)
    y16 = y32.astype(np.float16).astype(np.float32)  # what it stores
    f64, judged, ok = vkcheck.judge_layer(y16, x, "LayerNorm", 1e-5, W, np.full(W, 2.0), np.zeros(W), True, 1e-3)
    assert ok and judged <= 1e-4 and f64 > judged, (f64, judged)
    _, judged, ok = vkcheck.judge_layer(y16 + 1e-2, x, "LayerNorm", 1e-5, W, np.full(W, 2.0), np.zeros(W), True,
                                        1e-3)
    assert not ok and judged > 5e-3
    bad = y16.copy()
    bad[3, 4] = np.nan
    _, judged, ok = vkcheck.judge_layer(bad, x, "LayerNorm", 1e-5, W, np.full(W, 2.0), np.zeros(W), True, 1e-3)
    assert not ok and judged == float("inf")
    # fp32: against float64 of the unrounded input, no allowance
    f64, judged, ok = vkcheck.judge_layer(y16, x, "LayerNorm", 1e-5, W, np.full(W, 2.0), np.zeros(W), False, 1e-4)
    assert f64 >= judged > 1e-4 and not ok  # float16 storage is not within the fp32 rule


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_each_outputs_bound_grows_with_its_magnitude_and_with_nothing_else(fp16):
    """gamma 1000 puts outputs near 2000, where one float32 step is 1.2e-4: the output of float64 rounded once to
    the storage passes (an absolute 1e-4 failed it); an error of 3 atol relative to each output fails; and one
    large output (beta 1000 on one column) does not loosen the others: 0.05 added to the rest fails."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, W)).astype(np.float32)
    seen = (x.astype(np.float16) if fp16 else x).astype(np.float64)  # what the layer uploads
    xhat = (seen - seen.mean(1, keepdims=True)) / np.sqrt(seen.var(1, keepdims=True) + 1e-5)
    atol = 1e-3 if fp16 else 1e-4
    storage = np.float16 if fp16 else np.float32

    def judge(y, gamma, beta):
        return vkcheck.judge_layer(y, x, "LayerNorm", 1e-5, W, gamma, beta, fp16, atol)

    gamma, beta = np.full(W, 1000.0), np.zeros(W)
    y = (1000.0 * xhat).astype(storage).astype(np.float32)  # exact, rounded once as stored
    f64, judged, ok = judge(y, gamma, beta)
    assert ok and judged <= atol, (f64, judged)
    if not fp16:
        assert f64 > atol  # float32's rounding alone: past an absolute atol
    _, judged, ok = judge(y * np.float32(1 + 3 * atol), gamma, beta)
    assert not ok and judged > atol, judged
    gamma, beta = np.ones(W), np.zeros(W)
    beta[0] = 1000.0
    ref = xhat + beta
    bad = ref.astype(storage).astype(np.float32)
    bad[:, 1:] += np.float32(0.05)
    _, judged, ok = judge(bad, gamma, beta)
    assert not ok and judged > 0.04, judged


def test_outputs_where_gamma_x_and_beta_cancel_are_judged_at_the_scale_of_those_terms():
    """gamma = beta = 1000 gives outputs near 0 (where x^ is near -1) that carry the float32 rounding of terms near
    1000: the float64 output's rounding of each term and the sum, once each, passes (judged over max(1, |y|) alone it
    failed); a layer that drops beta, or one off by 3 atol of the terms, fails."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((512, W)).astype(np.float32)
    x64 = x.astype(np.float64)
    xhat = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    gamma, beta = np.full(W, 1000.0), np.full(W, 1000.0)
    rounded = (np.float32(1000) * xhat.astype(np.float32) + np.float32(1000)).astype(np.float32)  # float32 steps
    f64, judged, ok = vkcheck.judge_layer(rounded, x, "LayerNorm", 1e-5, W, gamma, beta, False, 1e-4)
    near_zero = np.abs(1000 * xhat + 1000) < 1
    assert near_zero.any() and ok and judged <= 1e-6, (f64, judged)
    for bad in (rounded - np.float32(1000), rounded + np.float32(3e-4 * 2000)):
        _, judged, ok = vkcheck.judge_layer(bad, x, "LayerNorm", 1e-5, W, gamma, beta, False, 1e-4)
        assert not ok and judged > 1e-4, judged

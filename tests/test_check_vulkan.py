"""`vknorm check --vulkan`: vknorm inside ncnn's Vulkan graph (vknorm.graph), three runs in one ncnn (stock CPU
fp32, stock Vulkan, Vulkan with vknorm's layers), checked on every committed model in fp32 and fp16; the pass
rule can fail (negative control) and does not fail an honest kernel on float16 storage (a LayerNorm fed
100 + 3x, whose error against the CPU run is above 1e-2); every error path exits 2 with one line; without
--vulkan the output keeps today's keys, plus those of the pass rule both engines share.

The CLI runs as `sys.executable -m vknorm check ...` subprocesses (VKNORM_VALIDATION=1; a few at once:
lavapipe on two cores, ln_residual_stack at 197x768 takes several seconds per run).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import vknorm
from vknorm import check as vkcheck
from availability import import_graph, import_or_missing, needs_graph, needs_vulkan
from reference import norm64
# the committed models and the CLI error contract, one place
from test_ncnn_models import MODELS, ROOT, assert_one_line_error, model_files
from test_ncnn_models import norm_layers as model_norm_layers

# Today's JSON keys (without --vulkan), top level and per layer; --vulkan keeps them all.
TODAY_KEYS = {"ok", "device", "layers", "outputs", "model", "weights", "inputs", "fp16", "seed", "atol", "warnings"}
TODAY_LAYER_KEYS = {"name", "type", "shape", "group_size", "groups", "max_abs_err", "gpu_us", "ok"}


pytestmark = [needs_vulkan, pytest.mark.timeout(600)]


def norm_layers(name: str):
    """(type, name) of every norm line of a committed .param, in order."""
    return [(t, n) for t, n, _top in model_norm_layers(name)]


def cli(*args, env_extra=None, python_code=None, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, VKNORM_VALIDATION="1", PYTHONUNBUFFERED="1")
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "vknorm", "check", *map(str, args)]
    if python_code is not None:
        cmd = [sys.executable, "-c", python_code, *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def cli_many(jobs: dict) -> dict:
    """Several CLI runs at once (three: two cores, and each run waits on lavapipe and Python in turn)."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {key: pool.submit(cli, *args) for key, args in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


def write_offset_model(tmp: Path):
    """in0 -> 3 * in0 + 100 (ncnn BinaryOp, scalar) -> LayerNorm(64): with float16 storage the LayerNorm's
    input is rounded to a spacing of 1/16 at 100, which costs ~1e-2 against the float32 CPU run however exact
    the kernel is."""
    w = 64
    param, binp = tmp / "offset.param", tmp / "offset.bin"
    param.write_text("7767517\n4 4\nInput in0 0 1 in0\n"
                     "BinaryOp mul3 1 1 in0 a 0=2 1=1 2=3.000000e+00\n"
                     "BinaryOp add100 1 1 a b 0=0 1=1 2=1.000000e+02\n"
                     f"LayerNorm ln 1 1 b out0 0={w} 1=1.000000e-05 2=1\n")
    rng = np.random.default_rng(1)
    gamma = (1 + 0.1 * rng.standard_normal(w)).astype(np.float32)
    beta = (0.1 * rng.standard_normal(w)).astype(np.float32)
    binp.write_bytes(gamma.tobytes() + beta.tobytes())
    return param, binp


# ------------------------------------------------------------------------------------ every committed model

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import_graph()
    tmp = tmp_path_factory.mktemp("check_vulkan")
    op, ob = write_offset_model(tmp)
    jobs = {}
    for name, dims in MODELS.items():
        p, b = model_files(name)
        jobs[(name, False)] = (p, b, "--input", f"in0={dims}", "--vulkan", "--json")
        jobs[(name, True)] = (p, b, "--input", f"in0={dims}", "--vulkan", "--json", "--fp16")
    tb = model_files("transformer_block")
    jobs["text"] = (*tb, "--input", "in0=16x64", "--vulkan")
    jobs["text_fp16"] = (*tb, "--input", "in0=16x64", "--vulkan", "--fp16")
    jobs["text_sums"] = (*model_files("ln_residual_stack"), "--input", "in0=197x768", "--vulkan")
    jobs["atol0"] = (*tb, "--input", "in0=16x64", "--vulkan", "--atol", "0")
    jobs["atol0_json"] = (*model_files("layernorm_4d"), "--input", "in0=4x3x5x8", "--vulkan", "--atol", "0", "--json")
    jobs["offset_fp16"] = (op, ob, "--input", "in0=16x64", "--vulkan", "--fp16", "--json")
    return cli_many(jobs)


@needs_graph
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_check_vulkan_passes_on_committed_model(runs, name, fp16):
    r = runs[(name, fp16)]
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stderr == "", r.stderr  # no ncnn banner or log lines, no validation messages
    res = json.loads(r.stdout)
    assert TODAY_KEYS | {"engine", "host_round_trips"} <= set(res), set(res)
    assert res["engine"] == "vulkan"
    assert res["ok"] is True and res["fp16"] is fp16 and res["seed"] == 0
    assert res["host_round_trips"] == 0
    assert res["atol"] == (1e-3 if fp16 else 1e-4)
    assert res["rule"].startswith("fp16:" if fp16 else "fp32:")
    assert isinstance(res["device"], str) and res["device"]
    assert [(x["type"], x["name"]) for x in res["layers"]] == norm_layers(name)
    for x in res["layers"]:
        assert TODAY_LAYER_KEYS | {"ncnn_abs_err"} <= set(x), set(x)
        assert x["ok"] is True, x
        assert isinstance(x["max_abs_err"], float) and isinstance(x["ncnn_abs_err"], float), x
        assert 0 <= x["judged_err"] <= res["atol"], x
        assert x["gpu_us"] > 0, x
        assert x["group_size"] * x["groups"] == int(np.prod(x["shape"])), x
        assert x["vulkan_forwards"] > 0 and x["cpu_forwards"] == 0, x
    assert set(res["outputs"]) == set(res["ncnn_outputs"]) == set(res["output_bounds"]) == {"out0"}
    assert all(isinstance(v, float) for v in (*res["outputs"].values(), *res["ncnn_outputs"].values()))
    # the model output is judged too: within twice stock Vulkan's error + atol at the output's scale
    assert res["outputs_ok"] is True and res["output_judgements"]["out0"]["ok"] is True
    assert res["output_judgements"]["out0"]["unjudged"] == 0
    assert res["outputs"]["out0"] <= res["output_bounds"]["out0"], res
    assert res["output_bounds"]["out0"] >= 2 * res["ncnn_outputs"]["out0"] + res["atol"], res
    assert set(res["model_ms"]) == {"ncnn_vulkan", "vknorm"} and all(v > 0 for v in res["model_ms"].values())
    assert res["timing_rounds"] >= 3
    assert res.get("validation_messages", 0) == 0


@needs_graph
def test_check_vulkan_fp16_rule_does_not_fail_an_honest_kernel(runs):
    """Against the float32 CPU run, float16 storage of 100 + 3x alone costs more than 1e-2 (stock ncnn's own
    Vulkan LayerNorm too); against float64 of the float16 input the layer saw, vknorm's kernel is exact to
    within the float16 rounding of its output."""
    r = runs["offset_fp16"]
    assert r.returncode == 0, (r.stdout, r.stderr)
    res = json.loads(r.stdout)
    (x,) = res["layers"]
    assert x["max_abs_err"] > 1e-2 and x["ncnn_abs_err"] > 1e-2, x
    assert x["judged_err"] <= 1e-3 and x["ok"] is True, x
    assert res["host_round_trips"] == 0


@needs_graph
def test_check_vulkan_fp16_judges_the_kernel_not_the_storage(runs):
    """ln_residual_stack: twelve LayerNorms in a residual chain; by the last ones float16 storage upstream has
    moved the blobs further from the CPU run than the tolerance, yet every layer passes."""
    res = json.loads(runs[("ln_residual_stack", True)].stdout)
    assert max(x["max_abs_err"] for x in res["layers"]) > res["atol"]
    assert all(x["ok"] for x in res["layers"]) and res["ok"] is True


@needs_graph
@pytest.mark.parametrize("key, fp16", [("text", False), ("text_fp16", True)])
def test_check_vulkan_table(runs, key, fp16):
    r = runs[key]
    assert r.returncode == 0 and r.stderr == "", (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith("layer"))
    want = ["layer", "type", "shape", "group_size", "groups", "vknorm_err", "ncnn_vk_err", "f64_err", "judged"]
    # add_0 -> ln_4 runs fused and writes its sum for the next residual add: sum_err
    assert header.split() == want + ["sum_err", "gpu_us"]
    for name in ("ln_3", "ln_4", "ln_5"):
        row = next(ln for ln in lines if ln.startswith(name + " ")).split()
        assert row[:5] == [name, "LayerNorm", "16x64", "64", "16"], row
        assert len(row) == len(header.split()), row  # no FAIL
        assert float(row[-1]) > 0  # gpu_us
    assert next(ln for ln in lines if ln.startswith("output")).split() == ["output", "vknorm_err", "ncnn_vk_err", "bound"]
    out = next(ln for ln in lines if ln.startswith("out0")).split()
    assert len(out) == 4 and all(float(v) >= 0 for v in out[1:])  # no FAIL
    assert float(out[1]) <= float(out[3])
    assert any(ln.startswith("model wall ms/inference") and "ncnn Vulkan" in ln and "vknorm" in ln for ln in lines)
    assert any(ln.startswith("device: ") for ln in lines)
    assert "host round trips: 0" in lines
    rule = next(ln for ln in lines if ln.startswith("rule: "))
    assert rule.startswith("rule: fp16:" if fp16 else "rule: fp32:"), rule
    assert lines[-1].startswith("ok:") and ("fp16 rule" if fp16 else "fp32 rule") in lines[-1]


@needs_graph
def test_check_vulkan_table_shows_the_sums_fused_layers_wrote(runs):
    """ln_residual_stack: every LayerNorm but the first reads add + LayerNorm + GELU fused and writes the sum
    for the next residual add; the table gains sum_err, exactly 0 on those rows and "-" on the first."""
    r = runs["text_sums"]
    assert r.returncode == 0 and r.stderr == "", (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith("layer")).split()
    assert header[-2:] == ["sum_err", "gpu_us"], header
    col = header.index("sum_err")
    sums = {ln.split()[0]: ln.split()[col] for ln in lines if ln.startswith("ln_")}
    assert len(sums) == 12 and sums.pop("ln_12") == "-", sums
    assert all(float(v) == 0.0 for v in sums.values()), sums
    assert any("sum_err: max |the sum it wrote" in ln for ln in lines)


@needs_graph
def test_check_vulkan_json_rows_name_each_layers_fused_pattern_and_the_blob_judged(runs):
    """ln_residual_stack --json: each norm's row names the pattern it ran fused in (the "fused" entry listing
    that layer), "blob" is the blob judged, the fused activation's output (its top in the .param), and
    "sum_blob" the sum it wrote, present exactly on the rows with a fused BinaryOp add."""
    res = json.loads(runs[("ln_residual_stack", False)].stdout)
    tops = {}
    for line in Path(model_files("ln_residual_stack")[0]).read_text().splitlines()[2:]:
        t = line.split()
        nb, nt = int(t[2]), int(t[3])
        tops[t[1]] = t[4 + nb:4 + nb + nt]
    by_layer = {name: f for f in res["fused"] for name in f["layers"]}
    assert len(res["layers"]) == 12
    for row in res["layers"]:
        f = by_layer[row["name"]]
        assert row["fused"] == f["pattern"], (row, f)
        assert row["blob"] == tops[f["layers"][-1]][0], (row, f)
        assert (row["sum_blob"] is not None) == f["pattern"].startswith("BinaryOp+"), (row, f)


@needs_graph
def test_check_vulkan_tolerance_can_fail(runs):
    """Negative control: with --atol 0 a kernel whose float32 error is nonzero fails, exit 1."""
    r = runs["atol0"]
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert "FAIL" in r.stdout and r.stdout.splitlines()[-1].startswith("FAIL:")
    res = json.loads(runs["atol0_json"].stdout)
    assert runs["atol0_json"].returncode == 1
    assert res["ok"] is False and res["atol"] == 0
    assert any(x["judged_err"] > 0 and x["ok"] is False for x in res["layers"]), res["layers"]
    assert res["host_round_trips"] == 0  # failing on error alone


# The check's own judgement of the model outputs, with the bound made 0 (any difference from the CPU run fails),
# in the CLI's forked child as a user runs it.
ZERO_OUTPUT_BOUND = ("import sys\n"
                     "import vknorm.check\n"
                     "vknorm.check.output_bound = lambda ref, ncnn_err, atol: 0.0\n"
                     "from vknorm.cli import main\n"
                     "raise SystemExit(main(['check'] + sys.argv[1:]))\n")


@needs_graph
@pytest.mark.parametrize("json_out", [True, False], ids=["json", "text"])
def test_check_vulkan_fails_a_model_output_past_its_bound_even_where_every_layer_passes(json_out):
    """Each layer is judged on the input it saw, so a wrong layer upstream of a norm, or a fusion that feeds a
    norm the wrong blob, can leave every row "ok": the model outputs are judged as well, and one past its bound
    fails the check (exit 1), named in the verdict."""
    p, b = model_files("transformer_block")
    r = cli(p, b, "--input", "in0=16x64", "--vulkan", *(["--json"] if json_out else []), python_code=ZERO_OUTPUT_BOUND)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    if json_out:
        res = json.loads(r.stdout)
        assert all(x["ok"] for x in res["layers"]) and res["host_round_trips"] == 0, res["layers"]
        assert res["outputs"]["out0"] > 0 and res["output_bounds"]["out0"] == 0.0
        assert res["output_judgements"]["out0"] == {"judged_err": res["outputs"]["out0"], "bound": 0.0,
                                                    "unjudged": 0, "ok": False}
        assert res["outputs_ok"] is False and res["ok"] is False
    else:
        lines = r.stdout.splitlines()
        assert next(ln for ln in lines if ln.startswith("out0")).split()[-1] == "FAIL"
        assert lines[-1] == "FAIL: model outputs past their bound: out0", lines[-1]  # no layer named: none failed


def test_output_bound_is_twice_stock_vulkans_error_plus_atol_at_the_outputs_scale():
    ref = np.array([[0.5, -40.0], [np.nan, np.inf]], dtype=np.float32)  # scale 40: the largest finite magnitude
    assert vkcheck.output_bound(ref, 1e-3, 1e-4) == pytest.approx(2e-3 + 40 * 1e-4)
    small = np.array([0.25, -0.5], dtype=np.float32)  # scale at least 1
    assert vkcheck.output_bound(small, 0.0, 1e-3) == pytest.approx(1e-3)


def test_an_output_is_judged_where_stock_vulkans_output_is_as_finite_as_the_cpus():
    """Where stock ncnn Vulkan's output alone is NaN/inf, the model's own layers left float32 there: those
    elements are left out (and counted), the rest still judged, so one such element cannot excuse the others."""
    j = vkcheck.judge_output
    ref = np.array([1.0, 2.0, np.nan, 4.0], dtype=np.float32)
    stock = np.array([1.0, 2.001, np.nan, np.inf], dtype=np.float32)  # off by 1e-3; inf where the CPU is finite
    bound = 2 * (2.001 - 2.0) + 1e-4 * 4  # twice stock's error where judged + atol at the output's scale
    ok = j(ref, np.array([1.0, 2.002, np.nan, 7.0], dtype=np.float32), stock, 1e-4)
    assert ok["ok"] and ok["unjudged"] == 1 and ok["bound"] == pytest.approx(bound, rel=1e-3)
    assert ok["judged_err"] == pytest.approx(0.002, rel=1e-3)  # the element stock lost is not judged
    far = j(ref, np.array([50.0, 2.0, np.nan, 4.0], dtype=np.float32), stock, 1e-4)
    assert not far["ok"] and far["judged_err"] == pytest.approx(49.0)
    nan = j(ref, np.array([1.0, np.nan, np.nan, 4.0], dtype=np.float32), stock, 1e-4)  # NaN where stock is finite
    assert not nan["ok"] and nan["judged_err"] == math.inf
    agree = j(ref, ref.copy(), ref.copy(), 0.0)  # NaN where the CPU has NaN agrees
    assert agree == {"judged_err": 0.0, "bound": 0.0, "unjudged": 0, "ok": True}
    assert not j(ref, ref[:3], stock, 1e-4)["ok"]  # another shape


# ------------------------------------------------------------------------------------ error paths

@pytest.fixture(scope="module")
def error_runs(tmp_path_factory):
    import_graph()
    tmp = tmp_path_factory.mktemp("check_vulkan_errors")
    p, b = model_files("transformer_block")
    (tmp / "trunc.bin").write_bytes(Path(b).read_bytes()[:-10])
    (tmp / "unknown.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nNoSuchLayer nope 1 1 in0 out0\n")
    # stock ncnn runs it; vknorm's layer refuses the input at its forward, logging why
    (tmp / "refused.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nInstanceNorm in_0 1 1 in0 out0 0=64 1=1e-5 2=0\n")
    (tmp / "empty.bin").write_bytes(b"")
    # inputs whose add does not broadcast: stock ncnn gives 24x64 on the CPU, 12x64 on Vulkan
    (tmp / "two.param").write_text("7767517\n4 4\nInput a 0 1 a\nInput b 0 1 b\nBinaryOp add 2 1 a b s 0=0\n"
                                   "LayerNorm ln 1 1 s out0 0=64 1=1e-5 2=0\n")
    args = ("--input", "in0=16x64", "--vulkan")
    jobs = {
        "missing_param": (tmp / "nope.param", b, *args),
        "missing_bin": (p, tmp / "nope.bin", *args),
        "trunc_bin": (p, tmp / "trunc.bin", *args),
        "unknown_layer": (tmp / "unknown.param", b, *args),
        "no_equals": (p, b, "--input", "in0", "--vulkan"),
        "dims_xx": (p, b, "--input", "in0=16xx64", "--vulkan"),
        "dims_zero": (p, b, "--input", "in0=0x64", "--vulkan"),
        "unknown_input": (p, b, "--input", "img=16x64", "--vulkan"),
        "no_input": (p, b, "--vulkan"),
        "atol": (p, b, *args, "--atol", "tiny"),
        "bad_shape": (p, b, "--input", "in0=16x65", "--vulkan"),  # ncnn's MultiHeadAttention: SIGFPE
        "bad_shape_3d": (p, b, "--input", "in0=2x16x64", "--vulkan"),
        "layer_refuses": (tmp / "refused.param", tmp / "empty.bin", "--input", "in0=64", "--vulkan"),
        "shapes_disagree": (tmp / "two.param", tmp / "empty.bin", "--input", "a=8x64", "--input", "b=3x64", "--vulkan"),
    }
    return cli_many(jobs)


@needs_graph
@pytest.mark.parametrize("case, needles", [
    ("missing_param", ["nope.param", "no such file"]),
    ("missing_bin", ["nope.bin", "no such file"]),
    ("trunc_bin", ["trunc.bin", "truncated"]),
    ("unknown_layer", ["unknown.param", "NoSuchLayer"]),
    ("no_equals", ["--input", "NAME=DIMS"]),
    ("dims_xx", ["--input", "malformed DIMS '16xx64'"]),
    ("dims_zero", ["--input", "malformed DIMS '0x64'"]),
    ("unknown_input", ["--input", "'img'", "in0"]),
    ("no_input", ["--input", "in0"]),
    ("atol", ["--atol", "tiny"]),
    ("bad_shape", ["--input in0=16x65"]),
    # refused before stock ncnn runs: past the attention's rows, what memory held decided the outcome run to run
    ("bad_shape_3d", ["--input in0=2x16x64", "MultiHeadAttention 'attention_6'", "takes a sequence of rows"]),
    ("layer_refuses", ["a vknorm layer refused the model", "extracting blob 'out0'",
                       "vknorm InstanceNorm in_0: a dims-1 input is one channel", "as one instance"]),
    ("shapes_disagree", ["from stock ncnn's CPU run and", "from its Vulkan run: do the --input shapes match"]),
])
def test_check_vulkan_error_path(error_runs, case, needles):
    assert_one_line_error(error_runs[case], *needles)


def limit_memory():  # a child's address space at 4 GiB: a regression fails there instead of filling the machine
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize("command", ["check", "check --vulkan", "optimize"])
@pytest.mark.parametrize("which", ["param", "bin"])
def test_a_model_file_that_is_not_a_regular_file_is_one_line_and_exit_2_at_once(tmp_path, command, which):
    """A named pipe would wait for a writer forever, /dev/zero read without end, a directory fails to read:
    each is refused before a byte is read, naming the file and what it is, for check and optimize alike."""
    if "--vulkan" in command:
        import_graph()
    fifo = tmp_path / "model.fifo"
    os.mkfifo(fifo)
    p, b = model_files("layernorm_2d")
    out = tmp_path / "out"
    for path, kind in ((fifo, "a named pipe"), ("/dev/zero", "a device"), (tmp_path, "is a directory")):
        files = (path, b) if which == "param" else (p, path)
        cmd = command.split()
        tail = [out.with_suffix(".param"), out.with_suffix(".bin")] if cmd[0] == "optimize" else ["--input", "in0=8x6x10"]
        r = subprocess.run([sys.executable, "-m", "vknorm", cmd[0], *map(str, files), *map(str, tail), *cmd[1:]],
                           capture_output=True, text=True, timeout=60, preexec_fn=limit_memory,
                           env=dict(os.environ, VKNORM_VALIDATION="1"))
        lines = r.stderr.strip("\n").split("\n")
        assert r.returncode == 2 and len(lines) == 1, (path, r.returncode, r.stderr[-2000:])
        assert lines[0].startswith(f"vknorm {cmd[0]}: error: {path}: {kind}, not the "), lines[0]
        assert (".param" if which == "param" else ".bin") in lines[0].split(", not the ", 1)[1], lines[0]
        assert r.stdout == "" and not list(tmp_path.glob("out*")), r.stdout


def sparse_weights_file(path: Path, size: int = 8 << 30) -> Path:
    """A .bin-like file of `size` bytes (floats first, then a hole): more than the memory the commands get."""
    path.write_bytes(np.random.default_rng(0).standard_normal(64).astype(np.float32).tobytes())
    os.truncate(path, size)
    return path


@pytest.mark.parametrize("command", ["check", "check --vulkan", "optimize", "bench --model"])
def test_weights_given_as_the_param_are_refused_from_their_first_bytes(tmp_path, command):
    """The arguments swapped (an 8 GiB .bin as the .param): one line and exit 2 within a 4 GiB address space,
    at once, where the whole file used to be read first (out of memory, or "out of memory: try smaller
    shapes" from check)."""
    if "--vulkan" in command:
        import_graph()
    big = sparse_weights_file(tmp_path / "weights.bin")
    p, b = model_files("layernorm_2d")
    cmd = command.split()
    tail = ([tmp_path / "out.param", tmp_path / "out.bin"] if cmd[0] == "optimize"
            else ["--input", "in0=8x6x10", "--iters", "1"] if cmd[0] == "bench" else ["--input", "in0=8x6x10"])
    r = subprocess.run([sys.executable, "-m", "vknorm", *cmd[:1], *cmd[1:], *map(str, (big, b)), *map(str, tail)],
                       capture_output=True, text=True, timeout=60, preexec_fn=limit_memory,
                       env=dict(os.environ, VKNORM_VALIDATION="1"))
    lines = r.stderr.strip("\n").split("\n")
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr[-2000:])
    assert lines[0].startswith(f"vknorm {cmd[0]}: error: {big}: not a"), lines[0]
    assert "binary" in lines[0] or "not UTF-8" in lines[0], lines[0]
    assert r.stdout == "" and not list(tmp_path.glob("out*")), r.stdout


NO_GRAPH = ("import sys\n"
            "sys.modules['vknorm._graph'] = None  # as if vknorm were built without ncnn\n"
            "from vknorm.cli import main\n"
            "raise SystemExit(main(['check'] + sys.argv[1:]))\n")


def test_check_vulkan_without_ncnn_build_is_one_line_exit_2():
    p, b = model_files("transformer_block")
    r = cli(p, b, "--input", "in0=16x64", "--vulkan", python_code=NO_GRAPH)
    assert_one_line_error(r, "--vulkan", "built without")


@needs_graph
@pytest.mark.parametrize("dims", ["8x4x4", "16x4x4", "1x4x4"])
def test_check_vulkan_refuses_a_group_norm_fed_fewer_channels_through_a_concat(tmp_path, dims):
    """Stock ncnn's CPU GroupNorm reads as many channels as its param says: given fewer through a Concat (which the
    shape check does not follow) it crashed, corrupted the heap for a later load, or spun in OpenMP and never
    returned. vknorm's layers run the model on ncnn's CPU before any stock run and refuse it, naming both counts."""
    param = tmp_path / "gn_concat.param"
    param.write_text("7767517\n3 3\nInput in0 0 1 in0\nConcat cc 1 1 in0 x 0=0\n"
                     "GroupNorm gn 1 1 x y 0=4 1=64 2=1e-05 3=0\n")
    (tmp_path / "empty.bin").write_bytes(b"")
    r = cli(param, tmp_path / "empty.bin", "--input", f"in0={dims}", "--vulkan", timeout=120)
    assert_one_line_error(r, "channel check", f"vknorm GroupNorm gn: the input has {dims.split('x')[0]} channels, "
                                              "the layer 64")


# ------------------------------------------------------------------------------------ in process; without --vulkan

@needs_graph
def test_check_vulkan_in_process_is_the_same_check():
    """VKNORM_CHECK_INPROCESS=1 (no forked child): same result, clean exit, nothing on stderr."""
    p, b = model_files("layernorm_1d")
    r = cli(p, b, "--input", "in0=64", "--vulkan", "--json", env_extra={"VKNORM_CHECK_INPROCESS": "1"})
    assert r.returncode == 0 and r.stderr == "", (r.returncode, r.stderr)
    res = json.loads(r.stdout)
    assert res["ok"] is True and res["engine"] == "vulkan" and res["host_round_trips"] == 0


@needs_graph
def test_check_vulkan_model_without_norm_layers(tmp_path):
    (tmp_path / "relu.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nReLU relu 1 1 in0 out0\n")
    (tmp_path / "relu.bin").write_bytes(b"")
    r = cli(tmp_path / "relu.param", tmp_path / "relu.bin", "--input", "in0=4x8", "--vulkan", "--json")
    assert r.returncode == 0 and r.stderr == "", (r.stdout, r.stderr)
    res = json.loads(r.stdout)
    assert res["ok"] is True and res["layers"] == [] and "note" in res and res["host_round_trips"] == 0


def test_check_reads_param_ids_as_ncnn_does_a_leading_plus_or_zeros_included(tmp_path):
    """ncnn reads an id as a number ("+0" and "00" are id 0), so a model stock ncnn and vknorm.graph load is not a
    garbled line to check; and 2=2 is affine there (weights unless 0)."""
    (tmp_path / "m.param").write_text("7767517\n3 3\nInput in0 0 1 a\nLayerNorm ln 1 1 a b +0=16 01=0.001 +2=2\n"
                                      "ReLU r 1 1 b y\n")
    (tmp_path / "m.bin").write_bytes(np.linspace(0.5, 1.5, 32, dtype=np.float32).tobytes())
    r = cli(tmp_path / "m.param", tmp_path / "m.bin", "--input", "a=4x16", "--vulkan", "--json")
    assert r.returncode == 0, (r.stdout, r.stderr)
    res = json.loads(r.stdout)
    assert res["ok"] is True and [l["name"] for l in res["layers"]] == ["ln"], res


def test_check_vulkan_accepts_a_norm_the_model_keeps_off_vulkan(tmp_path):
    """A norm with featmask bit 4 (31=16) is meant to run on the CPU inside the Vulkan graph: judged like the
    others, named in a warning, marked "kept_off_vulkan", and not counted as a host round trip."""
    (tmp_path / "m.param").write_text("7767517\n3 3\nInput in0 0 1 a\nLayerNorm cpu_norm 1 1 a b 0=16 1=0.001 2=0 31=16\n"
                                      "LayerNorm gpu_norm 1 1 b y 0=16 1=0.001 2=0\n")
    (tmp_path / "m.bin").write_bytes(b"")
    r = cli(tmp_path / "m.param", tmp_path / "m.bin", "--input", "a=4x16", "--vulkan", "--json")
    assert r.returncode == 0, (r.stdout, r.stderr)
    res = json.loads(r.stdout)
    by_name = {l["name"]: l for l in res["layers"]}
    assert res["ok"] is True and res["host_round_trips"] == 0, res
    assert by_name["cpu_norm"]["kept_off_vulkan"] is True and by_name["cpu_norm"]["cpu_forwards"] >= 1
    assert "kept_off_vulkan" not in by_name["gpu_norm"] and by_name["gpu_norm"]["cpu_forwards"] == 0
    assert any("featmask" in w and "cpu_norm" in w for w in res["warnings"]), res["warnings"]


def test_check_without_vulkan_keeps_todays_output():
    """Today's keys, plus the pass rule's (the one --vulkan applies too: "rule"; per layer f64_abs_err and
    judged_err); none of --vulkan's own."""
    import_or_missing("ncnn")  # today's check runs pyncnn
    r = cli(*model_files("layernorm_4d"), "--input", "in0=4x3x5x8", "--json")
    assert r.returncode == 0 and r.stderr == "", (r.stdout, r.stderr)
    res = json.loads(r.stdout)
    assert set(res) - {"validation_messages"} == TODAY_KEYS | {"rule"}  # no "engine" and nothing else new
    assert res["atol"] == 1e-4
    assert res["rule"] == vkcheck._rule(False, 1e-4, vulkan=False)
    for x in res["layers"]:
        assert set(x) == TODAY_LAYER_KEYS | {"f64_abs_err", "judged_err"}
        assert 0 <= x["judged_err"] <= res["atol"] and x["ok"] is True, x


def test_excess_over_float16_rounding():
    """The fp16 rule's arithmetic: float16 rounding of the output is not the kernel's error; more is. The
    allowance is half the float16 spacing at the output's value: rounding never moves a value into a lower
    binade, so that covers the rounding also at a binade's edge, where the spacing at the float64 value would
    be half as large (a false failure) or twice as large (a missed error)."""
    ref = np.concatenate([np.linspace(-4, 4, 1001), [1e-6, -3e-5, 6e-5, 1000.3, 65000.0]])
    y16 = ref.astype(np.float16).astype(np.float32)
    assert vkcheck._excess(y16, ref, vkcheck.half_fp16_spacing(y16)) == 0.0
    assert vkcheck._excess(y16, ref, 0.0) > 0
    bad = y16.copy()
    bad[10] += 0.01
    assert 0.005 < vkcheck._excess(bad, ref, vkcheck.half_fp16_spacing(bad)) <= 0.01 + 1e-9
    # just below 2^-6 (float16 spacing 2^-17 there), a kernel's exact value rounds up to 2^-6 (spacing 2^-16): a
    # move of 0.75 x 2^-17, more than half the spacing at the reference, within half the spacing at the output
    below_edge = np.array([2.0 ** -6 - 1.5 * 2.0 ** -18])
    up = np.array([2.0 ** -6], np.float32)
    assert vkcheck._excess(up, below_edge, vkcheck.half_fp16_spacing(up)) == 0.0
    assert vkcheck._excess(up, below_edge, vkcheck.half_fp16_spacing(below_edge)) > 0  # the spacing at ref: fails
    # at 1.0, the float16 value below it (1 - 2^-11) is not a rounding of any value within 2^-12 of 1: a kernel
    # error of at least 2^-12, which half the spacing at the reference (2^-11) would hide
    one = np.array([1.0])
    below = np.array([1 - 2.0 ** -11], np.float32)
    assert vkcheck._excess(below, one, vkcheck.half_fp16_spacing(below)) == 2.0 ** -12
    assert vkcheck._excess(below, one, vkcheck.half_fp16_spacing(one)) == 0.0  # the spacing at ref: missed
    # half the spacing of |ref|'s own binade, not 2^-11 |ref|: at 1.999 (spacing 2^-10) an error of 6e-4 is
    # more than rounding explains (half a spacing: 4.88e-4), though under 2^-11 * 1.999 = 9.8e-4
    near_two = np.array([1.999])
    assert vkcheck.half_fp16_spacing(near_two)[0] == 2.0 ** -11
    assert vkcheck._excess(near_two + 6e-4, near_two, vkcheck.half_fp16_spacing(near_two)) == pytest.approx(6e-4 - 2.0 ** -11)
    assert vkcheck.half_fp16_spacing(np.array([1e-7]))[0] == 2.0 ** -25  # float16 subnormals: spacing 2^-24
    nan = y16.copy()
    nan[3] = np.nan
    assert vkcheck._excess(nan, ref, 0.0) == math.inf
    assert vkcheck._excess(y16[:5], ref, 0.0) == math.inf


def test_reference64_groups_as_ncnn():
    """check's float64 reference against the tests' own (reference.norm64, ncnn's grouping rules): rows (8 = w),
    depth slices (40 = w*h on dims 4) and whole channels (120), and an RMSNorm whose 40 != w on dims 3 (a group per
    channel), equal within float64 rounding of values of order 1 (eps 2^-17: a float32, which norm64 rounds to)."""
    x = np.random.default_rng(3).standard_normal((4, 3, 5, 8))
    for affine_size in (8, 40, 120):
        np.testing.assert_allclose(vkcheck._reference64(x, "LayerNorm", 2.0 ** -17, affine_size),
                                   norm64("LayerNorm", x, affine_size, 2.0 ** -17, False), rtol=0, atol=1e-12)
    np.testing.assert_allclose(vkcheck._reference64(x[0], "RMSNorm", 0.0, 5 * 8), norm64("RMSNorm", x[0], 40, 0.0, False),
                               rtol=0, atol=1e-12)



@pytest.mark.parametrize("shape", [(64,), (6, 64)], ids=["dims1", "dims2"])
def test_reference64_normalizes_an_instancenorm_of_a_1d_or_2d_blob_as_one_instance(shape):
    """ncnn's InstanceNorm takes a dims 1-2 blob as one channel: the whole blob is one group (rows are not channels
    there), with the single gamma/beta pair: (x - mean(x)) / std(x) * gamma + beta over the whole blob, eps 0,
    within 1e-12 (float64 rounding of values of order 1)."""
    x = np.random.default_rng(4).standard_normal(shape) * 3 + 2
    whole = (x - x.mean()) / x.std()
    np.testing.assert_allclose(vkcheck._reference64(x, "InstanceNorm", 0.0, 0), whole, rtol=0, atol=1e-12)
    np.testing.assert_allclose(vkcheck._reference64(x, "InstanceNorm", 0.0, 0, gamma=[2.0], beta=[0.5]),
                               whole * 2.0 + 0.5, rtol=0, atol=1e-12)


def test_excess_counts_nan_and_inf_on_both_sides_as_agreement():
    """Where the float64 reference itself is NaN (a group holding Inf or NaN) or +-Inf, a layer giving the same
    is not in error: only one side alone NaN or Inf, or Infs of opposite signs, is."""
    ref = np.array([np.nan, np.inf, -np.inf, 1.0])
    assert vkcheck._excess(ref.astype(np.float32), ref, 0.0) == 0.0
    assert vkcheck._excess(ref.astype(np.float32), ref, vkcheck.half_fp16_spacing(ref)) == 0.0
    flipped = ref.astype(np.float32)
    flipped[1] = -np.inf
    assert vkcheck._excess(flipped, ref, 0.0) == math.inf
    finite = ref.astype(np.float32)
    finite[0] = 0.0
    assert vkcheck._excess(finite, ref, 0.0) == math.inf

@needs_graph
def test_a_norm_whose_every_input_is_nan_or_inf_is_not_judged_but_refused(tmp_path):
    """x / 0 (ncnn's BinaryOp with a scalar) makes every value the LayerNorm reads infinite or NaN in stock ncnn's
    CPU run: no "ok" can say anything of it, so both engines stop with one line naming the layer, exit 2 (as an
    input shape the model cannot take does)."""
    (tmp_path / "m.param").write_text("7767517\n3 3\nInput in0 0 1 in0\nBinaryOp div 1 1 in0 d 0=3 1=1 2=0\n"
                                      "LayerNorm ln 1 1 d out0 0=64 1=1e-5 2=0\n")
    (tmp_path / "m.bin").write_bytes(b"")
    for engine in ([], ["--vulkan"]):
        r = cli(tmp_path / "m.param", tmp_path / "m.bin", "--input", "in0=4x64", *engine)
        assert_one_line_error(r, "LayerNorm 'ln': every value of its input 'd' is NaN/inf in stock ncnn's CPU run "
                                 "(--input in0=4x64)", "do the --input shapes match")


def test_stock_ncnn_runs_that_differ_on_one_input_are_refused_naming_the_blob():
    """A layer reading past its blob (an --input shape the model does not take: transformer_block's attention fed
    2x16x64) gives whatever memory holds, another value each run: check runs stock ncnn's CPU layers twice and
    refuses to judge anything on blobs that differ (NaN equal to NaN), naming the first."""
    ref = {"a": np.array([1.0, np.nan], np.float32), "b": np.array([2.0, 3.0], np.float32)}
    vkcheck.require_repeatable(ref, {k: v.copy() for k, v in ref.items()}, {"in0": np.zeros((2, 16, 64))})
    again = {"a": ref["a"].copy(), "b": np.array([2.0, 3.5], np.float32)}
    with pytest.raises(vkcheck.UsageError, match=r"blob 'b' differs between two runs of stock ncnn's CPU layers on "
                                                 r"the same input \(--input in0=2x16x64\)"):
        vkcheck.require_repeatable(ref, again, {"in0": np.zeros((2, 16, 64))})
    with pytest.raises(vkcheck.UsageError, match="blob 'b' differs"):
        vkcheck.require_repeatable(ref, {"a": ref["a"], "b": ref["b"][:1]}, {"in0": np.zeros((2, 16, 64))})



@needs_graph
def test_check_vulkan_runs_stock_ncnns_cpu_layers_twice_and_refuses_blobs_that_differ(monkeypatch):
    """--vulkan runs stock ncnn's CPU reference a second time in a net of its own, as the check without --vulkan
    does: a blob that differs between the two (a layer reading memory it was not given) is refused by name. Here the
    second run is made to differ in one element; the real runs agree, and the check passes."""
    p, b = model_files("layernorm_1d")
    assert vkcheck.check_model_vulkan(p, b, {"in0": (64,)})["ok"]
    real = vkcheck._graph_extract

    def second_run_differs(graph, net, inputs, blobs, label):
        out = real(graph, net, inputs, blobs, label)
        if label == "ncnn CPU, again":
            out[blobs[0]] = out[blobs[0]].copy()
            out[blobs[0]].flat[0] += 1
        return out

    monkeypatch.setattr(vkcheck, "_graph_extract", second_run_differs)
    with pytest.raises(vkcheck.UsageError, match=r"differs between two runs of stock ncnn's CPU layers on the same "
                                                 r"input \(--input in0=64\)"):
        vkcheck.check_model_vulkan(p, b, {"in0": (64,)})

@needs_graph
def test_outputs_the_reference_run_leaves_nan_are_named_in_a_warning(tmp_path):
    """Weights of NaN (or inf) make stock ncnn's CPU run NaN too; vknorm's run agrees there and passes, so
    the report says which blobs that "ok" covers, in both engines; inf - inf in the comparison warns nothing."""
    (tmp_path / "m.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 out0 0=64 1=1e-5 2=1\n")
    for name, value in (("nan", np.nan), ("inf", np.inf)):
        (tmp_path / f"{name}.bin").write_bytes(np.full(64, value, np.float32).tobytes() + np.zeros(64, np.float32).tobytes())
        for engine in ([], ["--vulkan"]):
            r = cli(tmp_path / "m.param", tmp_path / f"{name}.bin", "--input", "in0=4x64", *engine)
            assert r.returncode == 0 and r.stderr == "", (name, engine, r.stderr[-2000:])
            warnings = [ln for ln in r.stdout.splitlines() if ln.startswith("warning:")]
            assert warnings == ["warning: blob 'out0': 256 of 256 values are NaN/inf in stock ncnn's CPU run itself (the "
                                "weights? the inputs?); where the other runs have them too they count as equal"], r.stdout


def test_fused_add_of_two_shapes_is_judged_on_ncnns_own_broadcast_sum(tmp_path):
    """A fused add whose inputs differ in shape (rows of 64 plus one value per row: ncnn broadcasts that,
    numpy does not) runs through ncnn's Vulkan BinaryOp inside the fused layer; the check rebuilds the sum
    the layer normalized with that same BinaryOp, in the run's storage, and judges the layer on it (a
    garbled model once made this a traceback)."""
    rng = np.random.default_rng(0)
    (tmp_path / "m.param").write_text("7767517\n4 4\nInput in0 0 1 in0\nInput in1 0 1 in1\n"
                                      "BinaryOp add 2 1 in0 in1 s 0=0\nLayerNorm ln 1 1 s out0 0=64 1=1e-5 2=1\n")
    (tmp_path / "m.bin").write_bytes(rng.uniform(0.5, 1.5, 64).astype(np.float32).tobytes()
                                     + rng.uniform(-0.5, 0.5, 64).astype(np.float32).tobytes())
    for storage, atol in (([], 1e-4), (["--fp16"], 1e-3)):
        r = cli(tmp_path / "m.param", tmp_path / "m.bin", "--input", "in0=16x64", "--input", "in1=16", "--vulkan",
                "--json", *storage)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
        res = json.loads(r.stdout)
        assert [f["pattern"] for f in res["fused"]] == ["BinaryOp+LayerNorm"], res["fused"]
        (layer,) = res["layers"]
        assert layer["ok"] and layer["judged_err"] is not None and layer["judged_err"] <= atol, (storage, layer)
        assert not res["warnings"], res["warnings"]


@needs_graph
def test_fused_add_of_model_inputs_in_float16_is_judged_on_the_uploaded_values(tmp_path):
    """A fused add reading the model's inputs themselves, in float16 storage: the layer read the inputs as
    ncnn uploaded them (rounded to float16), so the check judges it, and the sum it wrote for a Split, on
    those values (it once added the float32 inputs and failed an exact kernel)."""
    rng = np.random.default_rng(1)
    (tmp_path / "m.param").write_text("7767517\n7 9\nInput in0 0 1 in0\nInput in1 0 1 in1\n"
                                      "BinaryOp add 2 1 in0 in1 s 0=0\nSplit sp 1 2 s s0 s1\n"
                                      "LayerNorm ln 1 1 s0 y 0=64 1=1e-5 2=1\nReLU relu 1 1 y r\n"
                                      "BinaryOp add2 2 1 r s1 out0 0=0\n")
    (tmp_path / "m.bin").write_bytes(rng.uniform(0.5, 1.5, 64).astype(np.float32).tobytes()
                                     + rng.uniform(-0.5, 0.5, 64).astype(np.float32).tobytes())
    r = cli(tmp_path / "m.param", tmp_path / "m.bin", "--input", "in0=16x64", "--input", "in1=16x64", "--vulkan",
            "--fp16", "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert [f["pattern"] for f in res["fused"]] == ["BinaryOp+Split+LayerNorm+ReLU"], res["fused"]
    (layer,) = res["layers"]
    assert layer["ok"] and layer["judged_err"] <= 1e-3 and layer["sum_err"] == 0, layer


TIMED_KERNELS_SCRIPT = r"""
import json, sys
from vknorm import check, cli
timed = {}
real = check._kernel_gpu_us
def recording(info, x, fp16, ctx, repeats=3, residual=None, write_sum=False):
    timed[info["name"]] = {"residual": residual is not None, "write_sum": write_sum}
    return real(info, x, fp16, ctx, repeats, residual, write_sum)
check._kernel_gpu_us = recording
rc = cli.main(["check", *sys.argv[1:], "--vulkan", "--json"])
print(json.dumps({"rc": rc, "timed": timed}))
"""


@needs_graph
def test_check_vulkan_times_a_fused_layer_s_whole_kernel():
    """gpu_us of a fused add + norm is the fused kernel's (both inputs read, the sum written where the layer
    writes it), not the norm's alone on the summed input."""
    p, b = model_files("transformer_block")
    env = dict(os.environ, VKNORM_CHECK_INPROCESS="1")
    proc = subprocess.run([sys.executable, "-c", TIMED_KERNELS_SCRIPT, str(p), str(b), "--input", "in0=16x64"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rc"] == 0, out
    # ln_3 reads the input alone; ln_4 takes in add_0 and writes its sum for add_1; ln_5 takes in add_1
    assert out["timed"] == {"ln_3": {"residual": False, "write_sum": False},
                            "ln_4": {"residual": True, "write_sum": True},
                            "ln_5": {"residual": True, "write_sum": False}}, out["timed"]


@pytest.mark.parametrize("name, act_type, alpha", [("relu", 1, 0.0), ("leakyrelu", 2, 0.1), ("sigmoid", 4, 0.0),
                                                   ("swish", 7, 0.0), ("gelu", 8, 0.0), ("gelu_fast", 9, 0.0)])
def test_judge_layer_applies_each_fused_activation_by_ncnns_formula(name, act_type, alpha):
    """check's float64 reference of a fused layer applies the activation by its ncnn activation_type: 8 is GELU's
    erf form, 9 its tanh form (ncnn's fast_gelu), which differ by up to ~2e-4 for |y| in 1..3. The layer's own
    float32 CPU output (ncnn's formulas) against it: float32 arithmetic on |y| <= ~4 errs by a few 1e-7, so
    within 1e-5; swapping the two GELU forms would exceed that tenfold."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    layer = vknorm.LayerNorm(affine_size=256, eps=1e-5, affine=False)
    layer.set_activation(name, alpha)
    y = layer(x, device="cpu")
    f64, judged, ok = vkcheck.judge_layer(y, x, "LayerNorm", 1e-5, 256, None, None, False, vkcheck.ATOL_FP32,
                                          activation=(act_type, alpha))
    assert ok and judged <= f64 <= 1e-5, (name, f64)
    if act_type in (8, 9):  # the case tells the two forms apart
        other = vkcheck.judge_layer(y, x, "LayerNorm", 1e-5, 256, None, None, False, vkcheck.ATOL_FP32,
                                    activation=(17 - act_type, 0.0))[0]
        assert other > 1e-4, other


@needs_graph
def test_a_fused_layer_whose_blob_names_hold_unicode_spaces_is_judged_on_its_own_blobs(tmp_path):
    """ncnn splits a .param at C's white space only, so 'p\\u00a0q' (a no-break space) is one blob name, and so
    is one holding U+2028. check --vulkan reads which blobs a fused layer reads and writes the same way: its
    judgement is of the add's inputs and the activation's output (it had split the name and judged the input q as
    the norm's output: FAIL)."""
    for name, space in (("nbsp", "\u00a0"), ("u2028", "\u2028")):
        pq = f"p{space}q"
        param, binp = tmp_path / f"{name}.param", tmp_path / f"{name}.bin"
        param.write_text(f"7767517\n6 7\nInput in0 0 1 p 0=64\nInput in1 0 1 q 0=64\nInput in2 0 1 {pq} 0=64\n"
                         f"BinaryOp add 2 1 {pq} q s 0=0\nLayerNorm ln 1 1 s y 0=64 1=1e-5 2=0\nReLU r 1 1 y out0\n",
                         encoding="utf-8")
        binp.write_bytes(b"")
        r = cli(param, binp, "--input", "p=64", "--input", "q=64", "--input", f"{pq}=64", "--vulkan", "--json")
        assert r.returncode == 0, (name, r.stdout[-2000:], r.stderr[-2000:])
        report = json.loads(r.stdout)
        assert report["fused"] == [{"pattern": "BinaryOp+LayerNorm+ReLU", "layers": ["add", "ln", "r"]}], report
        assert [layer["ok"] for layer in report["layers"]] == [True], report["layers"]

"""Real ncnn models (tests/data, made by tools/make_models.py with pnnx) through vknorm.ncnn.register and
`vknorm check`: every committed model passes in fp32 and fp16; registered, each layer matches stock ncnn's on the
same input within ncnn's derived float32 error and vknorm's float32 rule (reference.ncnn_rule), and the model
output stays within `vknorm check`'s output rule; every error path exits 2 with one line; 20 registered nets
alive in one process give exactly what each gives alone.

The CLI runs as `sys.executable -m vknorm check ...` subprocesses (VKNORM_VALIDATION=1; several at once);
the register() tests run in this process, where conftest.py fails a test on any Vulkan validation message.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import vknorm
from vknorm import _core

from availability import import_or_missing, needs_vulkan

ncnn = import_or_missing("ncnn")
vkncnn = import_or_missing("vknorm.ncnn")
from vknorm import check as vkcheck  # noqa: E402
from reference import (channel_norm64, ncnn_channel_float32_error, ncnn_float32_error, ncnn_rule,  # noqa: E402
                       norm64, storage_rule)

DATA = Path(__file__).resolve().parent / "data"
ROOT = DATA.parent.parent

# model -> its input's DIMS (numpy order, batch dropped)
MODELS = {k: v for k, v in json.loads((DATA / "models.json").read_text()).items() if not k.startswith("_")}


pytestmark = needs_vulkan


def model_files(name: str):
    return str(DATA / f"{name}.ncnn.param"), str(DATA / f"{name}.ncnn.bin")


def norm_layers(name: str, with_bottoms: bool = False):
    """(type, name, top blob) of every norm line of a committed .param, in order; with_bottoms: (type, name,
    bottom blob, top blob)."""
    out = []
    for line in (DATA / f"{name}.ncnn.param").read_text().splitlines()[2:]:
        tok = line.split()
        if tok and tok[0] in ("LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm"):
            out.append((tok[0], tok[1], tok[4], tok[5]) if with_bottoms else (tok[0], tok[1], tok[5]))
    return out


def cli(*args, env_extra=None, timeout=120) -> subprocess.CompletedProcess:
    env = dict(os.environ, VKNORM_VALIDATION="1", PYTHONUNBUFFERED="1")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "vknorm", "check", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def cli_many(jobs: dict) -> dict:
    """Run several CLI invocations at once (lavapipe set-up dominates; two cores)."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {key: pool.submit(cli, *args) for key, args in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0], f"stderr is not one line: {r.stderr!r}"
    assert lines[0].startswith("vknorm check: error: "), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert r.stdout == "", r.stdout
    return lines[0]


# ------------------------------------------------------------------------------------ the CLI, every model

@pytest.fixture(scope="module")
def cli_runs():
    jobs = {}
    for name, dims in MODELS.items():
        p, b = model_files(name)
        jobs[(name, False)] = (p, b, "--input", f"in0={dims}", "--json")
        jobs[(name, True)] = (p, b, "--input", f"in0={dims}", "--json", "--fp16")
    jobs["text"] = (*model_files("transformer_block"), "--input", "in0=16x64")
    jobs["fail"] = (*model_files("transformer_block"), "--input", "in0=16x64", "--atol", "0")
    return cli_many(jobs)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_check_passes_on_committed_model(cli_runs, name, fp16):
    r = cli_runs[(name, fp16)]
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stderr == "", r.stderr  # no ncnn log lines, no validation messages
    res = json.loads(r.stdout)
    assert res["ok"] is True
    assert res["fp16"] is fp16
    atol = 1e-3 if fp16 else 1e-4  # one pass rule with --vulkan (vknorm.check.judge_layer)
    assert res["atol"] == atol
    expected = norm_layers(name)
    assert [(x["type"], x["name"]) for x in res["layers"]] == [(t, n) for t, n, _ in expected]
    for x in res["layers"]:
        assert x["max_abs_err"] is not None and 0 <= x["max_abs_err"] <= (1e-2 if fp16 else atol), x
        assert x["judged_err"] is not None and 0 <= x["judged_err"] <= atol and x["ok"] is True, x
        assert x["gpu_us"] > 0, x
        assert x["group_size"] * x["groups"] == int(np.prod(x["shape"])), x
    assert set(res["outputs"]) == {"out0"}
    if not fp16:
        assert res["outputs"]["out0"] <= 1e-3
    assert res.get("validation_messages", 0) == 0


def test_check_fp16_on_a_device_without_16_bit_storage_is_one_line_and_exit_2():
    """vknorm's layers would store float32 there (VKNORM_NO_FP16_STORAGE=1: as if the device lacked 16-bit
    storage): judged by the float16 rule and labelled fp16, the run would say what did not happen."""
    r = cli(*model_files("layernorm_2d"), "--input", "in0=8x6x10", "--fp16",
            env_extra={"VKNORM_NO_FP16_STORAGE": "1"})
    line = assert_one_line_error(r, "--fp16:", "has no 16-bit storage")
    assert "--vulkan" in line  # what to run instead


def test_check_json_schema(cli_runs):
    res = json.loads(cli_runs[("transformer_block", False)].stdout)
    assert {"ok", "device", "layers", "outputs"} <= set(res)
    assert isinstance(res["ok"], bool)
    assert res["device"] == vknorm.device_info()["name"]
    assert isinstance(res["layers"], list) and len(res["layers"]) == 3
    for x in res["layers"]:
        assert {"name", "type", "shape", "max_abs_err", "gpu_us"} <= set(x)
        assert isinstance(x["name"], str) and x["type"] in ("LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm")
        assert x["shape"] == [16, 64]
        assert isinstance(x["max_abs_err"], float) and isinstance(x["gpu_us"], float)
    assert isinstance(res["outputs"], dict)
    assert all(isinstance(k, str) and isinstance(v, float) for k, v in res["outputs"].items())


def test_check_table(cli_runs):
    r = cli_runs["text"]
    assert r.returncode == 0 and r.stderr == "", (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith("layer"))
    assert header.split() == ["layer", "type", "shape", "group_size", "groups", "max_abs_err", "f64_err", "judged",
                              "gpu_us"]
    for name in ("ln_3", "ln_4", "ln_5"):
        row = next(ln for ln in lines if ln.startswith(name + " ")).split()
        assert row[:5] == [name, "LayerNorm", "16x64", "64", "16"], row
        assert float(row[5]) <= 1e-4 and float(row[6]) <= 1e-4 and float(row[7]) <= 1e-4 and float(row[8]) > 0
    out = next(ln for ln in lines if ln.startswith("out0")).split()
    assert float(out[1]) <= 1e-3
    assert f"device: {vknorm.device_info()['name']}" in lines
    assert lines[-1].startswith("ok:")


def test_check_exit_1_above_tolerance(cli_runs):
    r = cli_runs["fail"]  # a float32 kernel is not exact against float64
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "FAIL" in r.stdout and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------ error paths

@pytest.fixture(scope="module")
def error_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ncnn_errors")
    p, b = model_files("transformer_block")
    param_text = Path(p).read_text()
    (tmp / "junk.param").write_bytes(bytes(range(256)) * 4)
    (tmp / "magic.param").write_text(param_text.replace("7767517", "7767518", 1))
    (tmp / "cut.param").write_text("\n".join(param_text.splitlines()[:7]) + "\n")
    (tmp / "badline.param").write_text(param_text.replace("LayerNorm                ln_4                     1 1",
                                                          "LayerNorm                ln_4                     x 1"))
    (tmp / "unknown.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nNoSuchLayer nope 1 1 in0 out0\n")
    (tmp / "long_name.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 " + "o" * 256 + " 0=64\n")
    (tmp / "empty.param").write_text("")
    (tmp / "trunc.bin").write_bytes(Path(b).read_bytes()[:-10])  # inside ln_5's beta
    (tmp / "half.bin").write_bytes(Path(b).read_bytes()[:50000])
    # A GroupNorm over 12 channels fed the input's shape (through a ReLU and a Split): stock ncnn hangs on a
    # blob of fewer channels, so the shape check refuses it before any run. An InstanceNorm with weights for 4
    # channels given 6 reads past its gamma.
    (tmp / "gn.param").write_text("7767517\n5 6\nInput in0 0 1 in0\nReLU r0 1 1 in0 x\nSplit sp 1 2 x a b\n"
                                  "GroupNorm gn 1 1 a y 0=6 1=12 2=1e-05 3=0\nReLU r 1 1 b z\n")
    (tmp / "in.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nInstanceNorm in 1 1 in0 y 0=4 1=1e-05 2=1\n")
    # The same GroupNorm behind a Concat, which the shape check does not follow: vknorm's layers, run on ncnn's
    # CPU before any stock run, refuse the blob (stock ncnn's spun in OpenMP there, and the check never returned).
    (tmp / "gn_concat.param").write_text("7767517\n3 3\nInput in0 0 1 in0\nConcat cc 1 1 in0 x 0=0\n"
                                         "GroupNorm gn 1 1 x y 0=4 1=64 2=1e-05 3=0\n")
    (tmp / "empty.bin").write_bytes(b"")
    args = ("--input", "in0=16x64")
    jobs = {
        "missing_param": (tmp / "nope.param", b, *args),
        "dir_param": (tmp, b, *args),
        "empty_param": (tmp / "empty.param", b, *args),
        "junk_param": (tmp / "junk.param", b, *args),
        "magic_param": (tmp / "magic.param", b, *args),
        "cut_param": (tmp / "cut.param", b, *args),
        "badline_param": (tmp / "badline.param", b, *args),
        "unknown_layer": (tmp / "unknown.param", b, *args),
        "long_name": (tmp / "long_name.param", b, *args),
        "missing_bin": (p, tmp / "nope.bin", *args),
        "trunc_bin": (p, tmp / "trunc.bin", *args),
        "half_bin": (p, tmp / "half.bin", *args),
        "unknown_input": (p, b, "--input", "img=16x64"),
        "no_input": (p, b),
        "bin_is_param": (p, p, *args),
        "no_equals": (p, b, "--input", "in0"),
        "dims_xx": (p, b, "--input", "in0=16xx64"),
        "dims_zero": (p, b, "--input", "in0=0x64"),
        "dims_five": (p, b, "--input", "in0=1x2x3x4x5"),
        "dims_word": (p, b, "--input", "in0=abc"),
        "dims_neg": (p, b, "--input", "in0=16x-64"),
        "dims_twice": (p, b, "--input", "in0=16x64", "--input", "in0=8x64"),
        "dims_huge": (p, b, "--input", "in0=65536x4097"),  # 2^28 + 2^16 elements: past the 2^28 allowed
        "no_name": (p, b, "--input", "=16x64"),
        "atol": (p, b, *args, "--atol", "tiny"),
        "seed": (p, b, *args, "--seed", "x"),
        "bad_shape": (p, b, "--input", "in0=16x65"),  # ncnn's MultiHeadAttention dies of SIGFPE here
        # a 3-dims input: ncnn's MultiHeadAttention reads past its blobs (other values each run, once "ok")
        "attention_dims": (p, b, "--input", "in0=2x16x64"),
        "norm_input_channels": (tmp / "gn.param", tmp / "empty.bin", "--input", "in0=10x7x7"),
        "norm_weight_channels": (tmp / "in.param", tmp / "empty.bin", "--input", "in0=6x5x5"),
        "norm_channels_behind_concat": (tmp / "gn_concat.param", tmp / "empty.bin", "--input", "in0=8x4x4"),
        # Layers whose weights ncnn indexes by the input's size: 128 values for an InnerProduct of 64 inputs
        # (stock ncnn reads past its weights: NaN, and the check passed), 16 channels for a Convolution of 8
        # (SIGSEGV), 16 for a depthwise convolution of 32 behind a Split
        "weights_values": (*model_files("layernorm_1d"), "--input", "in0=128"),
        "weights_channels": (*model_files("norm_variants"), "--input", "in0=16x6x10"),
        "weights_depthwise": (*model_files("convnext_block"), "--input", "in0=16x14x14"),
    }
    return tmp, cli_many(jobs)


@pytest.mark.parametrize("case, needles", [
    ("missing_param", ["nope.param", "no such file"]),
    ("dir_param", ["is a directory"]),
    ("empty_param", ["empty.param", "empty"]),
    ("junk_param", ["junk.param", "not an ncnn"]),
    ("magic_param", ["magic.param", "7767517"]),
    ("cut_param", ["cut.param", "12 layers"]),
    ("badline_param", ["badline.param", "line"]),
    ("unknown_layer", ["unknown.param", "line 4: layer 'nope' is of type 'NoSuchLayer', which this ncnn does not have"]),
    ("long_name", ["long_name.param", "line 4: layer 'ln': its blob name 'oooo", "is 256 characters; ncnn reads at most 255"]),
    ("missing_bin", ["nope.bin", "no such file"]),
    ("trunc_bin", ["trunc.bin", "truncated"]),
    ("half_bin", ["half.bin", "truncated"]),
    ("bin_is_param", ["the weights .bin is the model .param itself"]),
    ("unknown_input", ["--input", "'img'", "in0"]),
    ("no_input", ["--input", "in0"]),
    ("no_equals", ["--input", "NAME=DIMS"]),
    ("dims_xx", ["--input", "malformed DIMS '16xx64'"]),
    ("dims_zero", ["--input", "malformed DIMS '0x64'"]),
    ("dims_five", ["--input", "malformed DIMS"]),
    ("dims_word", ["--input", "malformed DIMS 'abc'"]),
    ("dims_neg", ["--input", "malformed DIMS"]),
    ("dims_twice", ["--input 'in0=8x64'", "'in0' given twice"]),
    ("dims_huge", ["--input", "DIMS '65536x4097': 268500992 elements is more than", "268435456 allowed"]),
    ("no_name", ["--input '=16x64'", "NAME=DIMS"]),
    ("atol", ["--atol", "tiny"]),
    ("seed", ["--seed"]),
    ("attention_dims", ["--input in0=2x16x64", "MultiHeadAttention 'attention_6'", "line 6",
                        "takes a sequence of rows (dims 1-2), this shape has 3 dims"]),
    ("norm_input_channels", ["--input in0=10x7x7", "GroupNorm 'gn'", "line 6", "as 10 channel(s), its param says 12"]),
    ("norm_weight_channels", ["--input in0=6x5x5", "InstanceNorm 'in'", "line 4", "as 6 channel(s), its param says 4"]),
    ("norm_channels_behind_concat", ["channel check", "vknorm GroupNorm gn: the input has 8 channels, the layer 64"]),
    ("weights_values", ["--input in0=128", "InnerProduct 'linear_1'", "line 4", "take 64 input values",
                        "this shape gives 128"]),
    ("weights_channels", ["--input in0=16x6x10", "Convolution 'conv_0'", "take 8 input channels",
                          "this shape gives 16"]),
    ("weights_depthwise", ["--input in0=16x14x14", "ConvolutionDepthWise", "take 32 input channels",
                           "this shape gives 16"]),
])
def test_check_error_path(error_runs, case, needles):
    line = assert_one_line_error(error_runs[1][case], *needles)
    if case == "dims_huge":  # well formed, only too large: not called malformed
        assert "malformed" not in line, line


def test_param_text_is_read_with_ncnns_whitespace(tmp_path):
    """ncnn reads a .param's bytes with C's whitespace: a form feed or vertical tab separates tokens like a space,
    only \\r and \\n end lines, and Unicode spaces (no-break, U+2028) are part of a blob name. check reads the same
    models ncnn loads (it had refused these as garbled, or read the params after a form feed as missing); an input
    named with '=' is given by the last '='. Bytes that are not UTF-8 are refused by name and line."""
    param, binp = model_files("layernorm_2d")
    text = Path(param).read_text()
    variants = {
        "formfeed": text.replace(" 0=60 1=", " 0=60\f1="),
        "vtab": text.replace(" 0=8 1=3", "\v0=8\v1=3"),
        "cr": text.replace("\n", "\r"),
        "nbsp_blob": text.replace(" 1 0=8", " b\u00a01 0=8").replace(" 1 out0", " b\u00a01 out0"),
        "u2028_blob": text.replace(" 1 0=8", " b\u20281 0=8").replace(" 1 out0", " b\u20281 out0"),
        "equals_input": text.replace("in0", "in=0"),
    }
    jobs = {}
    for name, t in variants.items():
        (tmp_path / f"{name}.param").write_bytes(t.encode())
        given = "in=0" if name == "equals_input" else "in0"
        jobs[name] = (tmp_path / f"{name}.param", binp, "--input", f"{given}=8x6x10", "--json")
    (tmp_path / "latin1.param").write_bytes(text.replace(" 1 out0", " \xe9 out0").encode("latin-1"))
    (tmp_path / "latin1_cr.param").write_bytes(text.replace(" 1 out0", " \xe9 out0").replace("\n", "\r")
                                               .encode("latin-1"))
    jobs["latin1"] = (tmp_path / "latin1.param", binp, "--input", "in0=8x6x10")
    jobs["latin1_cr"] = (tmp_path / "latin1_cr.param", binp, "--input", "in0=8x6x10")
    runs = cli_many(jobs)
    for name in variants:
        r = runs[name]
        assert r.returncode == 0, (name, r.stdout[-2000:], r.stderr[-2000:])
        layers = json.loads(r.stdout)["layers"]
        assert [(layer["name"], layer["ok"]) for layer in layers] == [("ln_1", True)], (name, layers)
    assert_one_line_error(runs["latin1"], "latin1.param: line 5: byte 0xe9 is not UTF-8 text")
    assert_one_line_error(runs["latin1_cr"], "latin1_cr.param: line 5: byte 0xe9 is not UTF-8 text")  # lines as read


@pytest.mark.parametrize("line, shape, refused", [
    # InnerProduct of 64 inputs (weight_data_size 4096 for 64 outputs): rows of 64, or 64 values in all
    ("InnerProduct fc 1 1 x y 0=64 1=1 2=4096", (64,), False),
    ("InnerProduct fc 1 1 x y 0=64 1=1 2=4096", (5, 64), False),
    ("InnerProduct fc 1 1 x y 0=64 1=1 2=4096", (2, 32), False),
    ("InnerProduct fc 1 1 x y 0=64 1=1 2=4096", (4, 4, 4), False),
    ("InnerProduct fc 1 1 x y 0=64 1=1 2=4096", (128,), True),
    ("InnerProduct fc 1 1 x y 0=64 1=1 2=4096", (3, 3, 64), True),
    # Convolution of 8 inputs channels (6=576: 3x3 kernels, 8 outputs); kernel_h defaults to kernel_w
    ("Convolution c 1 1 x y 0=8 1=3 11=3 6=576", (8, 6, 10), False),
    ("Convolution c 1 1 x y 0=8 1=3 6=576", (8, 6, 10), False),
    ("Convolution c 1 1 x y 0=8 1=3 6=576", (4, 6, 10), True),
    ("Convolution c 1 1 x y 0=8 1=3 6=576", (8, 60), False),  # dims 2: not judged
    # depthwise: 32 channels in groups of one (6=1568: 7x7 x 32), and grouped, 2 channels each (6=3136)
    ("ConvolutionDepthWise d 1 1 x y 0=32 1=7 6=1568 7=32", (32, 14, 14), False),
    ("ConvolutionDepthWise d 1 1 x y 0=32 1=7 6=1568 7=32", (16, 14, 14), True),
    ("ConvolutionDepthWise d 1 1 x y 0=32 1=7 6=3136 7=16", (32, 14, 14), False),
    # params ncnn itself refuses at load are left to it
    ("InnerProduct fc 1 1 x y 0=0 2=4096", (3,), False),
    ("Convolution c 1 1 x y 0=8 1=3 6=100", (4, 6, 10), False),
    ("Convolution c 1 1 x y 0=8 1=3 6=576 19=1", (4, 6, 10), False),  # dynamic weights: a second input
    # a weight per channel (the outermost extent: c, the rows, or w of a dims-1 blob)
    ("BatchNorm b 1 1 x y 0=8", (8, 6, 10), False),
    ("BatchNorm b 1 1 x y 0=8", (8, 60), False),
    ("BatchNorm b 1 1 x y 0=8", (16, 6, 10), True),
    ("BatchNorm b 1 1 x y 0=8", (4, 60), True),
    ("PReLU p 1 1 x y 0=8", (8, 6, 10), False),
    ("PReLU p 1 1 x y 0=8", (12, 6, 10), True),
    ("PReLU p 1 1 x y 0=1", (12, 6, 10), False),  # one slope for every channel
])
def test_check_refuses_an_input_shape_that_a_layers_weights_do_not_take(tmp_path, line, shape, refused):
    """Stock ncnn indexes an InnerProduct's, a convolution's, BatchNorm's or PReLU's weights by its input blob's
    size: any other size reads past its weights or short of them, never an error. check and bench --model refuse such an --input
    shape before running, for layers the input reaches through shape-keeping layers."""
    path = tmp_path / "m.param"
    path.write_text(f"7767517\n3 3\nInput in0 0 1 in0\nReLU r 1 1 in0 x\n{line}\n")
    if refused:
        with pytest.raises(vkcheck.UsageError, match="its weights take"):
            vkcheck.parse_model_inputs(str(path), {"in0": shape})
    else:
        vkcheck.parse_model_inputs(str(path), {"in0": shape})


def test_check_survives_a_crashing_shape(error_runs):
    """ncnn's MultiHeadAttention dies of SIGFPE on this shape: check runs ncnn in a child process, so that is one
    line naming the crash and the shape, exit 2, never a signal, a traceback or a verdict on garbage (x86:
    SIGFPE; where integer division by zero does not trap, whatever ncnn then does)."""
    r = error_runs[1]["bad_shape"]
    assert_one_line_error(r, "--input in0=16x65")


def test_a_worker_killed_outright_is_named_as_likely_out_of_memory_not_as_a_shape_ncnn_crashed_on():
    """check and bench --model run the model in a forked worker: SIGKILL there is the kernel's out-of-memory
    killer as a rule (check keeps every blob of three nets), so the line says so rather than asking whether the
    --input shapes fit the model; other signals are ncnn's crashes."""
    from vknorm._fork import crashed_running, run_in_child

    say = crashed_running("m.param", {"in0": (16, 64)})
    assert say("SIGKILL") == ("the worker running m.param with --input in0=16x64 was killed (SIGKILL: out of host "
                              "memory? try smaller --input shapes)")
    assert say("SIGSEGV") == ("ncnn crashed (SIGSEGV) running m.param with --input in0=16x64: do the --input shapes "
                              "match what the model takes?")
    with pytest.raises(vkcheck.UsageError, match=r"was killed \(SIGKILL: out of host memory\?"):
        run_in_child(lambda: os.kill(os.getpid(), signal.SIGKILL), say)



@pytest.mark.parametrize("text, message", [
    # the header on one line, its blob count too small: named at the header's line (it had raised IndexError)
    ("7767517 1 1 Input in0 0 2 a b\n", "line 1: garbled .param: the header says 1 blobs, the layers produce 2"),
    ("7767517\n\n1 1\nInput in0 0 2 a b\n", "line 3: garbled .param: the header says 1 blobs"),
    # a count past ncnn's max_net_count (it had raised OverflowError)
    ("7767517\n1 1\nInput in0 0 99999999999999999999 a\n", "line 3: garbled layer line"),
    ("7767517\n1 1\nInput in0 0 1000001 a\n", "line 3: garbled layer line"),
    # the header's word at fault, wherever its lines break
    ("7767517\nabc\n\n2\n", "line 2: garbled .param: expected 'layer_count blob_count', got 'abc 2'"),
    ("7767517\n2\n\n\n\n", "line 2: garbled .param: expected 'layer_count blob_count', got '2'"),
    ("7767517\n2000000 3\n", "line 2: garbled .param: the header's layer and blob counts must be 1 to 1000000"),
    # ncnn reads a number's word with %31s and refuses a longer one, leading zeros or not
    ("0" * 25 + "7767517\n1 1\n", "line 1: not an ncnn .param (it must start with the magic number 7767517)"),
    ("7767517\n1 1\nInput in0 0 " + "0" * 31 + "1 a\n", "line 3: garbled layer line"),
    ("7767517\n4\n3\nInput in0 0 1 a\n", "line 2: garbled or truncated .param: the header says 4 layers"),
    # a layer's words over lines: the line of the word at fault
    ("7767517\n2 2\nInput in0 0 1 a\nConvolution conv_0\n-1 1 a b 0=8\n", "line 5: garbled layer line"),
])
def test_the_model_reader_refuses_a_garbled_header_or_count_in_one_line(tmp_path, text, message):
    path = tmp_path / "m.param"
    path.write_text(text)
    with pytest.raises(vkcheck.UsageError, match=re.escape(f"{path}: {message}")):
        vkcheck.parse_param(str(path))

def test_the_model_reader_reads_a_param_as_ncnn_reads_it(tmp_path):
    """check, bench --model and optimize read the header's count of layers and nothing after, as ncnn; fewer lines
    and a bottom no layer produces are refused, the latter with the way to an accepted model."""
    path = tmp_path / "m.param"
    path.write_text("7767517\n2 2\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 out0 0=8 1=1e-05 2=0\nnever read\n")
    model = vkcheck.parse_param(str(path))
    assert [layer.name for layer in model.norms] == ["ln"] and model.inputs == ["in0"]
    path.write_text("7767517\n3 3\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 out0 0=8 1=1e-05 2=0\n")
    with pytest.raises(vkcheck.UsageError, match="the header says 3 layers, the file has 2 layer lines"):
        vkcheck.parse_param(str(path))
    path.write_text("7767517\n2 3\nInput in0 0 1 in0\nLayerNorm ln 1 1 x out0 0=8 1=1e-05 2=0\n")
    with pytest.raises(vkcheck.UsageError, match=r"reads blob 'x', which no earlier layer produces \(a misspelt name\? "
                                                 r"ncnn would take it as an input to fill: give it an Input layer"):
        vkcheck.parse_param(str(path))


def test_a_crash_names_the_run_the_worker_was_in_and_its_likely_cause():
    """The worker says which run it starts (stock ncnn's CPU run, its Vulkan run, the run with vknorm inside) and
    what a crash there most likely means; the one-line error names the last such run, and a run that finished
    leaves no trace of its own."""
    from vknorm._fork import LOADING, crashed_running, run_in_child, stage

    say = crashed_running("m.param", {"in0": (16, 64)})

    def crash_in_the_second_run():
        stage("stock ncnn's CPU run")
        stage("stock ncnn's Vulkan run", "stock ncnn's own Vulkan layers fail at these shapes")
        os.kill(os.getpid(), signal.SIGSEGV)

    with pytest.raises(vkcheck.UsageError) as e:
        run_in_child(crash_in_the_second_run, say)
    assert str(e.value) == ("ncnn crashed (SIGSEGV) in stock ncnn's Vulkan run of m.param with --input in0=16x64: "
                            "stock ncnn's own Vulkan layers fail at these shapes")
    with pytest.raises(vkcheck.UsageError, match=r"^ncnn crashed \(SIGFPE\) in stock ncnn's CPU run of m.param with "
                                                  r"--input in0=16x64: do the --input shapes match"):
        run_in_child(lambda: (stage("stock ncnn's CPU run"), os.kill(os.getpid(), signal.SIGFPE)), say)
    assert run_in_child(lambda: (stage("a run"), {"ok": 1})[1], say) == {"ok": 1}
    # a load has seen no input: out of memory there is not the shapes' doing
    loading = ("the load of the net", LOADING)
    assert say("SIGKILL", loading) == ("the worker in the load of the net of m.param with --input in0=16x64 was killed "
                                       "(SIGKILL: out of host memory?)")
    assert say("SIGSEGV", loading).endswith(": ncnn cannot load this model (no input was given yet)")
    stage("outside a worker: nothing")  # no pipe, no error


def test_a_worker_stopped_interrupted_or_gone_without_a_result_is_said_as_such():
    """Not every end of the worker is ncnn crashing: one stopped from outside (SIGTERM) is said to be stopped; one
    interrupted itself (Ctrl-C reached it first) interrupts the parent (exit 130 there); one that left without a
    result gives its exit status (not the raw wait status); a signal the parent ignores (SIGHUP under nohup) the
    worker ignores too; an OSError keeps its number and file name."""
    import errno

    from vknorm._fork import crashed_running, run_in_child

    say = crashed_running("m.param", {"in0": (16, 64)})
    with pytest.raises(vkcheck.UsageError, match=r"^the worker process was stopped by SIGTERM$"):
        run_in_child(lambda: os.kill(os.getpid(), signal.SIGTERM), say)

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_in_child(interrupted, say)
    with pytest.raises(vkcheck.UsageError, match=r"^the worker process exited with status 3 and no result$"):
        run_in_child(lambda: os._exit(3), say)

    def unwritable():
        raise OSError(errno.ENOSPC, "No space left on device", "/some/report.json")

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup: a hang-up is ignored, the worker's too
    try:
        assert run_in_child(lambda: (os.kill(os.getpid(), signal.SIGHUP), {"ok": 1})[1], say) == {"ok": 1}
    finally:
        signal.signal(signal.SIGHUP, previous)
    with pytest.raises(OSError) as e:
        run_in_child(unwritable, say)
    assert (e.value.errno, e.value.strerror, e.value.filename) == (errno.ENOSPC, "No space left on device",
                                                                   "/some/report.json")


def test_check_vulkan_names_stock_ncnns_own_vulkan_crash_as_stocks(tmp_path):
    """Stock ncnn's Vulkan InstanceNorm faults on a dims-2 blob whose h divides by 4 (lavapipe: SIGSEGV) where its
    CPU layer and vknorm's run it: check --vulkan says that run crashed, not that the shapes do not fit. Where
    stock ncnn runs it, the check passes."""
    (tmp_path / "m.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nInstanceNorm in1 1 1 in0 out0 0=1 1=1e-5 2=0\n")
    (tmp_path / "m.bin").write_bytes(b"")
    r = cli(tmp_path / "m.param", tmp_path / "m.bin", "--input", "in0=8x16", "--vulkan")
    if r.returncode == 0:
        assert "ok: all 1 norm layers within atol" in r.stdout, r.stdout
    else:
        assert_one_line_error(r, "in stock ncnn's Vulkan run of", "--input in0=8x16",
                              "its CPU run of the same inputs had finished, but ncnn's CPU layers check few shapes",
                              "If they do, stock ncnn's own Vulkan layers fail at these shapes")
        r = cli(tmp_path / "m.param", tmp_path / "m.bin", "--input", "in0=8x16")  # as the message advises
        assert r.returncode == 0 and "ok: all 1 norm outputs within atol" in r.stdout, (r.stdout, r.stderr)


def test_model_without_norm_layers(tmp_path):
    (tmp_path / "relu.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nReLU relu 1 1 in0 out0\n")
    (tmp_path / "relu.bin").write_bytes(b"")
    r = cli(tmp_path / "relu.param", tmp_path / "relu.bin", "--input", "in0=4x8")
    assert r.returncode == 0 and r.stderr == "", (r.stdout, r.stderr)
    assert "no LayerNorm, RMSNorm, GroupNorm or InstanceNorm layers" in r.stdout
    res = vkcheck.check_model(str(tmp_path / "relu.param"), str(tmp_path / "relu.bin"), {"in0": (4, 8)})
    assert res["ok"] is True and res["layers"] == [] and "note" in res


def test_text_past_the_headers_layer_count_is_a_warning_in_every_command(tmp_path):
    """ncnn reads the header's count of layers and nothing after: a header one short drops the model's last layer
    (here its LayerNorm) without a word from ncnn. Every command warns, naming the line, with or without norms left
    to check; optimize writes the layers ncnn reads and does not call that the model unchanged."""
    p, b = model_files("layernorm_2d")
    lines = Path(p).read_text().splitlines()
    assert lines[1] == "3 3" and lines[-1].startswith("LayerNorm")
    short = tmp_path / "short.param"
    short.write_text("\n".join([lines[0], "2 3"] + lines[2:]) + "\n")
    warning = f"{short}: line {len(lines)}: text after the header's 2 layers, which ncnn does not read"
    env = dict(os.environ, VKNORM_VALIDATION="1")
    runs = {
        "check": ["check", short, b, "--input", "in0=8x6x10"],
        "check --vulkan": ["check", short, b, "--input", "in0=8x6x10", "--vulkan"],
        "bench --model": ["bench", "--model", short, b, "--input", "in0=8x6x10", "--iters", "2", "--warmup-ms", "1"],
        "optimize": ["optimize", short, b, tmp_path / "o.param", tmp_path / "o.bin"],
    }
    for what, args in runs.items():
        r = subprocess.run([sys.executable, "-m", "vknorm", *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, (what, r.stdout, r.stderr)
        assert warning in r.stdout + r.stderr, (what, r.stdout, r.stderr)
        if what == "optimize":
            assert "OUT.param leaves it out" in r.stderr and "unchanged" not in r.stdout, (r.stdout, r.stderr)
            assert "LayerNorm" not in (tmp_path / "o.param").read_text()


def test_binary_params_are_refused_by_every_command_in_one_line(tmp_path):
    """ncnn2mem's .param.bin (its magic number as a binary int) names no layer or blob: check, bench --model and
    optimize say so in one line, exit 2, pointing at the text .param."""
    import struct

    p, b = model_files("layernorm_2d")
    binary = tmp_path / "m.param.bin"
    binary.write_bytes(struct.pack("<iii", 7767517, 3, 3) + bytes(64))
    runs = {
        "check": ["check", binary, b, "--input", "in0=8x6x10"],
        "check --vulkan": ["check", binary, b, "--input", "in0=8x6x10", "--vulkan"],
        "bench": ["bench", "--model", binary, b, "--input", "in0=8x6x10", "--iters", "2"],
        "optimize": ["optimize", binary, b, tmp_path / "o.param", tmp_path / "o.bin"],
    }
    for what, args in runs.items():
        r = subprocess.run([sys.executable, "-m", "vknorm", *map(str, args)], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, env=dict(os.environ, VKNORM_VALIDATION="1"))
        lines = r.stderr.strip("\n").split("\n")
        assert r.returncode == 2 and len(lines) == 1, (what, r.stdout, r.stderr)
        assert lines[0].startswith(f"vknorm {what.split()[0]}: error: {binary}: a binary .param.bin (ncnn2mem's); "
                                   "vknorm check, bench --model and optimize read ncnn's text .param"), lines[0]
    assert not (tmp_path / "o.param").exists()


def test_parse_dims():
    assert vkcheck.parse_dims("197x192") == (197, 192)
    assert vkcheck.parse_dims("96x28x28") == (96, 28, 28)
    assert vkcheck.parse_dims("64") == (64,)
    assert vkcheck.parse_dims("4X3x5x8") == (4, 3, 5, 8)
    assert vkcheck.parse_dims("16384x16384") == (16384, 16384)  # 2^28 elements: the most one input may have
    for bad in ("", "x", "16x", "x16", "16xx64", "0", "1.5", "-3", "1x2x3x4x5", "16 64", "1e3", "16384x16385"):
        with pytest.raises(ValueError):
            vkcheck.parse_dims(bad)


# ------------------------------------------------------------------------------------ register(), in process

def _new_net(vulkan: bool = False):
    net = ncnn.Net()
    net.opt.use_vulkan_compute = vulkan
    net.opt.lightmode = False
    net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = False
    net.opt.use_bf16_storage = False
    return net


def _run(name: str, x: np.ndarray, blobs, option=None, register=True, vulkan=False, norms=None):
    """The blobs of one run of a committed model, on ncnn's CPU (vulkan: stock ncnn's Vulkan) with vknorm's layers
    registered or not, and the registration's records. norms: a dict to fill with each vknorm layer's operator
    by name (it outlives the net)."""
    p, b = model_files(name)
    net = _new_net(vulkan)
    reg = vkncnn.register(net, option) if register else None
    assert net.load_param(p) == 0
    assert net.load_model(b) == 0
    ex = net.create_extractor()
    mat = ncnn.Mat(x).clone()
    assert ex.input("in0", mat) == 0
    out = {}
    for blob in blobs:  # the model output first, then earlier blobs: needs lightmode off
        ret, m = ex.extract(blob)
        assert ret == 0, (name, blob, ret)
        out[blob] = np.array(m, dtype=np.float32)
    records = reg.records() if reg else None
    layers = vkncnn.layers(net) if reg else None
    if norms is not None:
        norms.update({ly.name: ly.norm for ly in layers})
    if reg:
        assert [ly is r for ly, r in zip(layers, reg.layers)] == [True] * len(reg.layers)
        assert reg.errors() == []
    del ex, mat
    net.clear()
    if reg:
        assert reg.layers == []  # ncnn's clear() went through our destroyer
    return out, records


def ncnn_bound(op: str, norm, x) -> tuple:
    """float64 of the layer on x with the weights of vknorm's layer, and the bound of ncnn's float32 layer's error
    against it (reference.py)."""
    gamma = norm.gamma if norm.affine else None
    beta = norm.beta if norm.affine and op != "RMSNorm" else None
    if op in ("LayerNorm", "RMSNorm"):
        return (norm64(op, x, norm.affine_size, norm.eps, norm.affine, gamma, beta),
                ncnn_float32_error(op, x, norm.affine_size, norm.eps, norm.affine, gamma, beta))
    group = getattr(norm, "group", 1)
    return (channel_norm64(op, x, norm.eps, group, gamma, beta),
            ncnn_channel_float32_error(op, x, norm.eps, group, gamma, beta))


@pytest.mark.parametrize("name", list(MODELS))
def test_register_matches_stock_ncnn(name):
    """Each registered layer, in the graph, gives exactly what its vknorm operator gives on the blob it received;
    that operator on the blob stock ncnn's layer received matches stock's output within reference.ncnn_rule
    (ncnn's derived float32 error + vknorm's float32 rule; the bound first checked to hold for stock's output
    against float64) and float64 within the float32 storage rule; the model output is within `vknorm check`'s output
    rule: twice stock ncnn Vulkan's difference from the CPU run + its atol at the output's scale."""
    dims = tuple(int(d) for d in MODELS[name].split("x"))
    x = np.random.default_rng(1).standard_normal(dims, dtype=np.float32)
    norms = norm_layers(name, with_bottoms=True)
    blobs = ["out0"] + sorted({blob for _, _, bottom, top in norms for blob in (bottom, top)})
    stock, _ = _run(name, x, blobs, register=False)
    stock_vulkan, _ = _run(name, x, ["out0"], register=False, vulkan=True)
    operators = {}
    mine, records = _run(name, x, blobs, vknorm.Option(), norms=operators)
    for op, lname, bottom, top in norms:
        norm = operators[lname]
        in_graph = norm(mine[bottom], device="vulkan")
        assert np.array_equal(mine[top], in_graph), (lname, "the graph's output is not the operator's")
        ref, their_error = ncnn_bound(op, norm, stock[bottom])
        assert ncnn_rule(ref, stock[top], their_error)[0] == 0.0, (lname, "ncnn's own error passes its bound")
        ours = norm(stock[bottom], device="vulkan")
        err, bound = ncnn_rule(ours, stock[top], their_error)
        assert err <= bound, (lname, err, bound)
        err, bound = storage_rule(ours, ref, False)  # and within its own, tighter rule of float64
        assert err <= bound, (lname, "against float64", err, bound)
    judged = vkcheck.judge_output(stock["out0"], mine["out0"], stock_vulkan["out0"], vkcheck.ATOL_FP32)
    assert judged["ok"] and judged["unjudged"] == 0, judged
    assert [(r["type"], r["name"]) for r in records] == [(t, n) for t, n, _, _ in norms]
    for r in records:
        assert r["gpu_us"] > 0 and r["shape"] is not None
    assert _core.validation_messages() == []


def test_register_fp16_option_reaches_the_layers():
    """With float16 storage the registered layer's output is float16 values, within the float16 storage rule of
    float64 computed from the float16-rounded input; with float32 storage it is not float16 values."""
    x = np.random.default_rng(2).standard_normal((16, 64), dtype=np.float32)
    (_, lname, bottom, top), *_ = norm_layers("llama_block", with_bottoms=True)
    outputs = {}
    for fp16 in (False, True):
        operators = {}
        run, _ = _run("llama_block", x, [bottom, top], vknorm.Option(use_fp16_storage=fp16), norms=operators)
        y, norm = run[top], operators[lname]
        outputs[fp16] = np.array_equal(y.astype(np.float16).astype(np.float32), y)
        seen = run[bottom].astype(np.float16) if fp16 else run[bottom]
        ref = norm64("RMSNorm", seen, norm.affine_size, norm.eps, norm.affine, norm.gamma if norm.affine else None)
        err, bound = storage_rule(y, ref, fp16)
        assert err <= bound, (fp16, err, bound)
    assert outputs == {False: False, True: True}
    assert _core.validation_messages() == []


def test_check_model_in_process():
    p, b = model_files("layernorm_4d")
    for fp16 in (False, True):
        res = vkcheck.check_model(p, b, {"in0": (4, 3, 5, 8)}, fp16=fp16, seed=3)
        assert res["ok"] is True, res
        assert [x["group_size"] for x in res["layers"]] == [8, 40, 120]
    assert _core.validation_messages() == []


def test_register_rejects_wrong_arguments():
    with pytest.raises(TypeError):
        vkncnn.register(object())
    with pytest.raises(ValueError):
        vkncnn.register(ncnn.Net(), types=("BatchNorm",))
    with pytest.raises(ValueError, match=r"got \['Layernorm'\]"):  # one name, not its letters
        vkncnn.register(ncnn.Net(), types="Layernorm")
    assert vkncnn.register(ncnn.Net(), types="GroupNorm").types == ("GroupNorm",)
    for device in ("gpu", -1, "vulkan:x"):  # said at register(), not as "create_pipeline failed" at load
        with pytest.raises(ValueError, match="device must be"):
            vkncnn.register(ncnn.Net(), device=device)


def test_register_after_load_param_is_refused_not_a_silent_stock_run():
    """The net's layers are made at load_param: registering after it changed none of them, and the model ran
    stock with an empty Registration. Refused, saying when to call it; after net.clear() it works."""
    p, b = model_files("layernorm_1d")
    net = _new_net()
    assert net.load_param(p) == 0
    with pytest.raises(RuntimeError, match="before load_param"):
        vkncnn.register(net)
    net.clear()
    reg = vkncnn.register(net)
    assert net.load_param(p) == 0 and net.load_model(b) == 0
    assert [layer.name for layer in reg.layers] == ["ln_0"], reg


def test_a_failing_host_path_layer_says_why_in_one_line(capfd):
    """ncnn reports only a layer's return code; the layer says its reason on stderr, as ncnn's own do."""
    p, b = model_files("layernorm_2d")
    net = _new_net()
    reg = vkncnn.register(net)
    assert net.load_param(p) == 0 and net.load_model(b) == 0
    capfd.readouterr()
    ex = net.create_extractor()
    assert ex.input("in0", ncnn.Mat(np.ones((8, 6, 7), np.float32)).clone()) == 0  # w 7, the model's 10
    ret, _ = ex.extract("out0")
    assert ret != 0
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("vknorm ")]
    assert lines and "LayerNorm" in lines[0] and "affine_size" in lines[0], err
    assert reg.errors(), "the exception is kept too"
    del ex
    net.clear()


def test_factory_limit_is_an_exception_not_a_crash():
    class OldPyncnnNet(ncnn.Net):  # an older pyncnn: 10 factories per process, then this
        def register_custom_layer(self, *a):
            raise RuntimeError("python version only support 10 custom layers now")

    with pytest.raises(vkncnn.FactoryLimitError, match="custom"):
        vkncnn.register(OldPyncnnNet())


TWENTY_NETS = textwrap.dedent("""
    import numpy as np, ncnn, vknorm, vknorm.ncnn as vkncnn
    from vknorm import _core
    MODELS = {MODELS!r}
    DATA = {DATA!r}
    def new_net():
        net = ncnn.Net()
        net.opt.use_vulkan_compute = False
        net.opt.lightmode = False
        net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = False
        return net
    def load(net, name):
        assert net.load_param(f"{{DATA}}/{{name}}.ncnn.param") == 0
        assert net.load_model(f"{{DATA}}/{{name}}.ncnn.bin") == 0
    def run(net, x):
        ex = net.create_extractor()
        m = ncnn.Mat(x).clone()
        assert ex.input("in0", m) == 0
        ret, out = ex.extract("out0")
        assert ret == 0
        return np.array(out)
    names = list(MODELS)
    def option(i):
        return vknorm.Option(use_fp16_storage=(i % 2 == 1))
    def model_input(i):
        return np.random.default_rng(i).standard_normal(
            tuple(int(d) for d in MODELS[names[i % len(names)]].split("x")), dtype=np.float32)
    alone = []
    for i in range(20):  # each net's output when it is the only one
        net = new_net(); vkncnn.register(net, option(i)); load(net, names[i % len(names)])
        alone.append(run(net, model_input(i))); net.clear(); del net
    nets, regs = [], []
    for i in range(20):  # 20 nets alive at once, 20 more registrations
        name = names[i % len(names)]
        net = new_net()
        regs.append(vkncnn.register(net, option(i)))
        load(net, name)
        nets.append((name, net))
    for i, (name, net) in enumerate(nets):
        got = run(net, model_input(i))
        assert np.array_equal(got, alone[i]), (i, name, float(np.abs(got - alone[i]).max()))  # the same kernels
        assert all(layer.calls == 1 for layer in regs[i].layers)
    for name, net in nets:
        net.clear()
    del nets
    for i in range(20):  # and 20 more, one after another
        net = new_net(); vkncnn.register(net); load(net, "layernorm_2d"); del net
    assert _core.validation_messages() == [], _core.validation_messages()[:3]
    print("OK 60 nets")
""")


def test_register_on_20_nets_in_one_process():
    code = TWENTY_NETS.format(MODELS=MODELS, DATA=str(DATA))
    env = dict(os.environ, VKNORM_VALIDATION="1")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-3000:])
    assert "OK 60 nets" in r.stdout
    assert "overwrite built-in layer" not in r.stderr  # register() keeps ncnn's notice quiet

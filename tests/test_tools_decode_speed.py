"""tools/decode_speed.py, a decoder layer decoded token by token in stock ncnn Vulkan and with vknorm inside ncnn's
graph: every implementation gets a time per token and for the prompt, every decode's outputs are judged against
float64 by check --vulkan's rule (a spoiled one fails the run), and bad sizes are one usage error (exit 2)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from availability import needs_graph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "decode_speed.py")


def run_tool(*args, timeout=300):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=timeout)


@needs_graph
@pytest.mark.parametrize("attention, storage", [("sdpa", "fp32"), ("mha", "fp16")])
def test_each_implementation_is_timed_and_its_outputs_judged(tmp_path, attention, storage):
    out = tmp_path / "decode.json"
    proc = run_tool("--attention", attention, "--dims", "64,4,16,2,128", "--prompt", "5", "--tokens", "3",
                    "--rounds", "2", *(["--fp16"] if storage == "fp16" else []), "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert (r["attention"], r["fp16"], r["prompt"], r["tokens"], r["rounds"]) == (attention, storage == "fp16", 5, 3, 2)
    impls = ["ncnn-vulkan", "vknorm-in-graph", "vknorm-fused"]
    for key in ("token_ms", "prompt_ms", "outputs"):
        assert sorted(r[key]) == sorted(impls), r
    assert all(r["token_ms"][i] > 0 and r["prompt_ms"][i] > 0 for i in impls), r
    assert all(len(r["token_ms_rounds"][i]) == 2 for i in impls), r
    assert r["dims"]["G"] == (4 if attention == "mha" else 2), r  # MultiHeadAttention: every head
    assert all(r["outputs"][i]["ok"] and 0 < r["outputs"][i]["max_err"] < 1e-2 for i in impls), r
    table = proc.stdout.splitlines()
    assert [ln.split()[0] for ln in table[2:]] == impls and all(ln.endswith(" ok") for ln in table[2:]), proc.stdout


def test_a_spoiled_output_is_outside_the_rule():
    spec = importlib.util.spec_from_file_location("decode_speed", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    want = np.linspace(-2, 2, 64).reshape(4, 16)
    stock = want + 1e-6
    for storage_fp16, spoil in ((False, 1e-3), (True, 1e-2), (False, np.nan)):
        bad = want.copy()
        bad[3, 5] += spoil
        j = tool.judge({"ncnn-vulkan": stock, "vknorm-in-graph": stock.copy(), "vknorm-fused": bad}, want, storage_fp16)
        assert j["ncnn-vulkan"]["ok"] and j["vknorm-in-graph"]["ok"] and not j["vknorm-fused"]["ok"], j
    # a decode of something else in every implementation (a harness's own mistake): stock's bound catches it
    for storage_fp16, spoil in ((False, 5e-3), (True, 0.2)):
        wrong = want + spoil
        j = tool.judge({impl: wrong for impl in ("ncnn-vulkan", "vknorm-in-graph", "vknorm-fused")}, want, storage_fp16)
        assert not j["ncnn-vulkan"]["ok"], j


def test_bad_sizes_are_a_usage_error():
    for args in (["--dims", "1,2,3"], ["--dims", "64,4,16,3,128"], ["--dims", "64,4,16,0,128"],
                 ["--attention", "mha", "--dims", "64,4,8,2,128"], ["--tokens", "0"],
                 ["--json", "/nonexistent/decode.json"], ["--json", ROOT]):
        proc = run_tool(*args, timeout=60)
        assert proc.returncode == 2 and "decode_speed.py: error:" in proc.stderr.strip().splitlines()[-1], (
            args, proc.stderr)

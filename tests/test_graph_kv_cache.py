"""Decoders in ncnn's kv-cache form inside vknorm.graph: a LLaMA-style layer (tests/kv_decoder.py) run token by
token, its key and value caches fed back from one step to the next, with vknorm's RMSNorms (fused with the
residual add, and not) in ncnn's Vulkan graph, float32 and float16 storage, and in a CPU net.

The first step gives the past caches as empty Mats, the one place an empty input is taken: an SDPA or
MultiHeadAttention with kv_cache on reads them (its last two bottoms). Each later step gives back the Mats the
step before extracted, as they came: on the CPU they are in ncnn's own layout (x86 packs the keys in panels and
keeps room for the next tokens, which ncnn appends in place), on Vulkan the keys and values row by row.

Tolerances: every step's output against float64 of the whole sequence computed at once (kv_decoder.reference).
Stock ncnn's CPU run within FP32_TOL at the outputs' scale; a vknorm net within `vknorm check --vulkan`'s rule
against stock ncnn in the same configuration: at most twice stock's own difference plus 1e-4 (float32 storage)
or 1e-3 (float16) at the scale. vknorm's CPU nets run ncnn's own CPU layers: stock's results bit for bit.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kv_decoder as kd
from availability import import_graph
from reference import FP32_TOL
from vknorm._stdio import quiet_stderr

pytestmark = pytest.mark.timeout(600)

graph = import_graph()

STEPS = ((0, 5), (5, 6), (6, 7), (7, 8))  # a prompt of 5 tokens, then 3 tokens one at a time
CONFIGS = {"cpu": dict(vulkan=False), "vulkan-fp32": dict(vulkan=True), "vulkan-fp16": dict(vulkan=True, fp16=True)}
NETS = {"stock": dict(vknorm=False), "fused": dict(), "unfused": dict(fuse=False)}
ATOL = {"cpu": 1e-4, "vulkan-fp32": 1e-4, "vulkan-fp16": 1e-3}


def tokens(n: int = 8, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, kd.E)).astype(np.float32)


def load(tmp_path, attention: str, config: str, net_kind: str):
    w = kd.weights(attention)
    p, b = kd.write(tmp_path, attention, w)
    net = graph.configure(graph.Net(**NETS[net_kind]), **CONFIGS[config])
    assert net.load_param(p) == 0 and net.load_model(b) == 0
    return net, w


def decode(net, x, steps=STEPS, hint=None) -> list:
    """Token by token as an ncnn decoder runs: (out0, k_cache, v_cache) of each step, the caches given back."""
    past_k = past_v = graph.Mat()
    runs = []
    for start, end in steps:
        ex = net.create_extractor()
        if hint is not None:
            ex.set_kvcache_max_seqlen_hint(hint)
        assert ex.input("in0", graph.Mat(x[start:end])) == 0
        assert ex.input("mask", graph.Mat(kd.causal_mask(start, end - start))) == 0
        assert ex.input("past_k", past_k) == 0 and ex.input("past_v", past_v) == 0
        (r0, out), (r1, past_k), (r2, past_v) = (ex.extract(b) for b in ("out0", "k_cache", "v_cache"))
        assert (r0, r1, r2) == (0, 0, 0), (start, end)
        runs.append((np.array(out), past_k, past_v))
    return runs


def output_error(runs, want, steps=STEPS) -> float:
    return max(float(np.abs(out - want[start:end]).max()) for (out, _, _), (start, end) in zip(runs, steps))


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("attention", kd.ATTENTIONS)
def test_a_decoder_runs_token_by_token_on_the_caches_each_step_gives_back(tmp_path, attention, config):
    """Every step's output is the whole sequence's row for that token, in stock ncnn and in vknorm's nets fused
    and not; the caches grow by each step's tokens; vknorm's RMSNorms ran on Vulkan in a Vulkan net, the add
    before the second one fused into it."""
    x = tokens()
    want = kd.reference(attention, kd.weights(attention), x)
    scale = max(1.0, float(np.abs(want).max()))
    runs = {}
    for kind in NETS:
        net, _ = load(tmp_path, attention, config, kind)
        runs[kind] = decode(net, x)
        kv_heads = kd.G if attention == "sdpa" else kd.H
        for (_, k, v), (_, end) in zip(runs[kind], STEPS):
            assert (k.w, k.h, k.c) == (v.w, v.h, v.c) == (kd.D, end, kv_heads), kind
        if kind != "stock":
            counters = net.vknorm_counters()
            fused = [f["layers"] for f in net.fused()]
            assert fused == ([["add0", "sp2", "rms_mlp"]] if kind == "fused" else []), fused
            if config != "cpu":
                assert counters["cpu_forwards"] == 0 and counters["vulkan_forwards"] == 2 * len(STEPS), counters
    stock = output_error(runs["stock"], want)
    if config == "cpu":
        assert stock <= FP32_TOL * scale, stock
    for kind in ("fused", "unfused"):
        err = output_error(runs[kind], want)
        assert err <= 2 * stock + ATOL[config] * scale, (kind, err, stock)
        if config == "cpu":  # ncnn's own CPU layers: stock's outputs bit for bit
            assert all(np.array_equal(a[0], b[0]) for a, b in zip(runs[kind], runs["stock"])), kind


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_vulkan_caches_hold_every_tokens_keys_row_by_row(tmp_path, fp16):
    """On Vulkan the SDPA form's key cache reads back as float64 computes the keys of all tokens so far
    (G heads x tokens x D), by the same rule against stock ncnn's as the outputs."""
    x = tokens()
    config = "vulkan-fp16" if fp16 else "vulkan-fp32"
    want = kd.key_cache_reference(kd.weights("sdpa"), x)
    err = {}
    for kind in ("stock", "fused"):
        net, _ = load(tmp_path, "sdpa", config, kind)
        keys = np.array(decode(net, x)[-1][1])
        assert keys.shape == want.shape
        err[kind] = float(np.abs(keys - want).max())
    assert err["fused"] <= 2 * err["stock"] + ATOL[config] * max(1.0, float(np.abs(want).max())), err


@pytest.mark.parametrize("where", ["net.opt", "extractor"])
def test_the_kvcache_hint_gives_a_cpu_cache_room_for_that_many_tokens_at_its_first_step(tmp_path, where):
    """ncnn's kvcache_max_seqlen_hint (Option field, or Extractor.set_kvcache_max_seqlen_hint as in pyncnn): the
    first step's CPU cache is made with room for 64 tokens, where without it ncnn leaves room for 16; the outputs
    are the same either way."""
    x = tokens()
    net, _ = load(tmp_path, "sdpa", "cpu", "fused")
    plain = decode(net, x)
    assert plain[0][1].cstep == 16 * kd.D
    if where == "net.opt":
        net.opt.kvcache_max_seqlen_hint = 64
        assert net.opt.kvcache_max_seqlen_hint == 64
        hinted = decode(net, x)
    else:
        hinted = decode(net, x, hint=64)
    assert all(k.cstep == 64 * kd.D for _, k, _ in hinted)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(plain, hinted))


def test_a_negative_kvcache_hint_is_a_value_error():
    """ncnn ignores a negative hint without a word; here it is refused (0 is ncnn's default: no hint)."""
    net = graph.Net()
    with pytest.raises(ValueError, match=r"Option.kvcache_max_seqlen_hint: expected 0 \(no hint\) or a token count, got -1"):
        net.opt.kvcache_max_seqlen_hint = -1
    assert net.opt.kvcache_max_seqlen_hint == 0


@pytest.mark.parametrize("vulkan", [False, True], ids=["cpu", "vulkan"])
def test_an_empty_mat_is_taken_only_where_a_kv_cache_layer_reads_it_as_its_past(tmp_path, vulkan):
    """An empty Mat for a blob any other layer reads (the tokens, or the attention's mask, which the kv-cache
    layer reads too but not as a cache) is -1 with a message naming the blob: ncnn's stock layers crash on an
    empty blob. The empty past given comes back as given."""
    net, _ = load(tmp_path, "sdpa", "vulkan-fp32" if vulkan else "cpu", "fused")
    x = tokens(3)
    ex = net.create_extractor()
    log: list = []
    with quiet_stderr(log):
        assert ex.input("in0", graph.Mat()) == -1
        assert ex.input("mask", graph.Mat()) == -1
    for blob in ("in0", "mask"):
        assert any(f"Extractor.input {blob}: the Mat is empty (an empty Mat is taken only for a blob read as a past "
                   "kv cache alone" in line for line in log), (blob, log)
    assert ex.input("in0", graph.Mat(x)) == 0 and ex.input("mask", graph.Mat(kd.causal_mask(0, 3))) == 0
    assert ex.input("past_k", graph.Mat()) == 0 and ex.input("past_v", graph.Mat()) == 0
    r, given = ex.extract("past_k")
    assert r == 0 and given.empty()
    r, out = ex.extract("out0")
    assert r == 0 and np.array(out).shape == (3, kd.E)


def test_a_blob_read_as_a_past_cache_and_by_another_layer_is_not_taken_empty(tmp_path):
    """A past cache that another layer reads as well (here a Split feeding it to a Sigmoid beside the attention)
    would reach that layer empty: refused."""
    p, b = kd.write(tmp_path, "sdpa", kd.weights("sdpa"))
    text = open(p).read().replace("mask past_k past_v a0", "mask pk0 past_v a0")
    lines = text.splitlines()
    layer_count, blob_count = map(int, lines[1].split())
    lines[1] = f"{layer_count + 2} {blob_count + 3}"
    at = lines.index("Input past_v 0 1 past_v") + 1
    lines[at:at] = ["Split spk 1 2 past_k pk0 pk1", "Sigmoid side 1 1 pk1 side0"]
    p2 = tmp_path / "shared_past.param"
    p2.write_text("\n".join(lines) + "\n")
    net = graph.configure(graph.Net(), vulkan=False)
    assert net.load_param(str(p2)) == 0 and net.load_model(b) == 0
    ex = net.create_extractor()
    log: list = []
    with quiet_stderr(log):
        assert ex.input("past_k", graph.Mat()) == -1
    assert any("Extractor.input past_k: the Mat is empty" in line for line in log), log
    assert ex.input("past_v", graph.Mat()) == 0


def vknorm_cli(*args, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, VKNORM_VALIDATION="1", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "vknorm", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


FIRST_STEP = ("--input", "in0=5x64", "--input", "mask=5x5", "--input", "past_k=empty", "--input", "past_v=empty")


@pytest.mark.parametrize("attention", kd.ATTENTIONS)
def test_check_and_bench_run_a_decoders_first_step_on_empty_past_caches(tmp_path, attention):
    """`--input NAME=empty` gives a past kv cache as ncnn's empty Mat: check (both engines) judges both RMSNorms
    and the model's output, not the caches (ncnn's own layout on the CPU), and bench --model times the step."""
    p, b = kd.write(tmp_path, attention, kd.weights(attention))
    runs = {"check": ("check", p, b, *FIRST_STEP, "--json"),
            "check --vulkan": ("check", p, b, *FIRST_STEP, "--vulkan", "--json"),
            "bench --model": ("bench", "--model", p, b, *FIRST_STEP, "--iters", "3", "--warmup-ms", "20", "--json",
                              tmp_path / "bench.json")}
    for what, args in runs.items():
        r = vknorm_cli(*args)
        assert r.returncode == 0, (what, r.stdout, r.stderr[-3000:])
        if what == "bench --model":
            report = json.loads((tmp_path / "bench.json").read_text())
            assert [x["impl"] for x in report["results"]] == list(model_bench_impls()), report
            continue
        report = json.loads(r.stdout)
        assert report["ok"] is True, (what, report)
        assert report["inputs"] == {"in0": [5, 64], "mask": [5, 5], "past_k": [], "past_v": []}, report["inputs"]
        assert [x["name"] for x in report["layers"]] == ["rms_attn", "rms_mlp"], report["layers"]
        assert set(report["outputs"]) == {"out0"}, report["outputs"]


def model_bench_impls():
    from vknorm.model_bench import IMPLS

    return IMPLS


@pytest.mark.parametrize("inputs, needles", [
    (("in0=5x64", "mask=5x5", "past_k=2x3x16", "past_v=empty"),
     ["--input past_k=2x3x16: SDPA 'attn'", "line 19) reads it as a past kv cache", "--input past_k=empty"]),
    (("in0=empty", "mask=5x5", "past_k=empty", "past_v=empty"),
     ["--input in0=empty: only a past kv cache may be empty", "Split 'sp0' reads it"]),
    (("in0=5x64", "mask=empty", "past_k=empty", "past_v=empty"),
     ["--input mask=empty: only a past kv cache may be empty", "SDPA 'attn' reads it"]),
], ids=["past-with-a-shape", "tokens-empty", "mask-empty"])
def test_a_past_cache_with_a_shape_or_another_input_empty_is_one_line_and_exit_2(tmp_path, inputs, needles):
    """A past cache given random rows would be read in ncnn's layout (x86 reads past them), and any other layer
    crashes on an empty blob: check says so in one line, exit 2."""
    p, b = kd.write(tmp_path, "sdpa", kd.weights("sdpa"))
    r = vknorm_cli("check", p, b, *(f for x in inputs for f in ("--input", x)))
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    line, = r.stderr.strip("\n").split("\n")
    assert line.startswith("vknorm check: error: ") and all(n in line for n in needles), line

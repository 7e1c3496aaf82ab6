"""Decoders in ncnn's kv-cache form inside vknorm.graph: a LLaMA-style layer (tests/kv_decoder.py) run token by
token, its key and value caches fed back from one step to the next, with vknorm's RMSNorms (fused with the
residual add, and not) in ncnn's Vulkan graph, float32 and float16 storage, and in a CPU net.

The first step gives the past caches as empty Mats, the one place an empty input is taken: an SDPA or
MultiHeadAttention with kv_cache on reads them (its last two bottoms). Each later step gives back the Mats the
step before extracted, as they came: on the CPU they are in ncnn's own layout (x86 packs the keys in panels and
keeps room for the next tokens, which ncnn appends in place), on Vulkan the keys and values row by row. So a CPU
cache goes back only as extract gave it, to the layer and model that made it, and on once where its step grew it in
place; anything else that would read as garbage (a branch, a copy, a cache of the other kind of net) is refused.

Tolerances: every step's output against float64 of the whole sequence computed at once (kv_decoder.reference).
Stock ncnn's CPU run within FP32_TOL at the outputs' scale; a vknorm net within `vknorm check --vulkan`'s rule
against stock ncnn in the same configuration: at most twice stock's own difference plus 1e-4 (float32 storage)
or 1e-3 (float16) at the scale. vknorm's CPU nets run ncnn's own CPU layers: stock's results bit for bit.
"""
from __future__ import annotations

import json
import os
import re
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


def decode(net, x, steps=STEPS, hint=None, past=None) -> list:
    """Token by token as an ncnn decoder runs: (out0, k_cache, v_cache) of each step, the caches given back (from
    `past`, or empty)."""
    past_k, past_v = past or (graph.Mat(), graph.Mat())
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
    with pytest.raises(ValueError,
                       match=r"Option.kvcache_max_seqlen_hint: expected 0 \(no hint\) or a token count, got -1"):
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
        assert report["kv_caches"] == ["k_cache", "v_cache"], report.get("kv_caches")


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


def first_step(net, x, n: int = 5):
    """The prompt's step of n tokens on empty caches: (out0, k_cache, v_cache)."""
    return decode(net, x, steps=((0, n),))[0]


def refused_past(net, x, past_k, past_v, start: int = 5) -> list:
    """The next step given these past caches: both refused (-1), the log lines returned."""
    ex = net.create_extractor()
    assert ex.input("in0", graph.Mat(x[start:start + 1])) == 0
    log: list = []
    with quiet_stderr(log):
        assert ex.input("past_k", past_k) == -1 and ex.input("past_v", past_v) == -1
    return log


@pytest.mark.parametrize("attention", kd.ATTENTIONS)
def test_a_cpu_cache_goes_on_once_and_only_as_extract_gave_it(tmp_path, attention):
    """ncnn keeps a CPU cache in its own layout and appends to it in place: the Mat a step extracted goes to one
    next step; given again (a branch), cloned, or remade from numpy it would read as garbage, and is refused."""
    x = tokens()
    net, _ = load(tmp_path, attention, "cpu", "fused")
    _, k, v = first_step(net, x)
    copies = {"cloned": (k.clone(), v.clone()), "from numpy": (graph.Mat(np.array(k)), graph.Mat(np.array(v)))}
    for what, (ck, cv) in copies.items():
        log = refused_past(net, x, ck, cv)
        assert any("must be the Mat an earlier step's extract gave" in line for line in log), (what, log)
    assert len(decode(net, x, steps=((5, 6),), past=(k, v))) == 1  # the cache goes on
    log = refused_past(net, x, k, v)  # and not a second time
    assert any("this cache went on to a step already" in line for line in log), log


def test_vulkan_caches_are_copies_so_a_decoder_may_branch(tmp_path):
    """A Vulkan net's caches are downloaded copies: two steps from one past cache both give the whole sequence's
    rows for their tokens (within check --vulkan's float32 atol at the outputs' scale)."""
    x = tokens()
    y = x.copy()
    y[5] = -x[5]  # the second branch's next token
    net, w = load(tmp_path, "sdpa", "vulkan-fp32", "fused")
    _, k, v = first_step(net, x)
    for seq in (x, y):
        want = kd.reference("sdpa", w, seq[:6])
        (out, _, _), = decode(net, seq, steps=((5, 6),), past=(k, v))
        assert float(np.abs(out - want[5:6]).max()) <= ATOL["vulkan-fp32"] * max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("attention", kd.ATTENTIONS)
def test_a_cache_goes_back_to_the_kind_of_net_that_made_it(tmp_path, attention):
    """A CPU net's cache (padded past its rows, in ncnn's layout) fed to a Vulkan net's attention is refused: ncnn's
    upload copied the padding past its staging buffer (a heap overflow). A Vulkan net's cache (rows) fed to a CPU
    net's is refused too: ncnn's CPU layer would read it in its own layout."""
    x = tokens()
    cpu, _ = load(tmp_path, attention, "cpu", "fused")
    vk, _ = load(tmp_path, attention, "vulkan-fp32", "fused")
    _, ck, cv = first_step(cpu, x)
    _, vk_k, vk_v = first_step(vk, x)
    log = refused_past(vk, x, ck, cv)
    assert any("a kv cache a host layer made (ncnn's own layout) cannot feed a Vulkan layer" in line
               for line in log), log
    log = refused_past(cpu, x, vk_k, vk_v)
    assert any("must be the Mat an earlier step's extract gave" in line for line in log), log


def test_a_mat_padded_past_its_rows_is_uploaded_as_its_rows(tmp_path):
    """A Mat whose channels lie further apart than its rows need (a CPU net's kv cache) given to a Vulkan layer that
    reads values: uploaded as the rows numpy shows (ncnn's upload alone copied the padding past its staging
    buffer). 16 tokens fill whole panels of x86's layout, so every value numpy shows was written."""
    x = tokens(16)
    cpu, _ = load(tmp_path, "sdpa", "cpu", "fused")
    _, k, _ = first_step(cpu, x, 16)
    assert k.cstep > k.w * k.h and np.isfinite(np.array(k)).all()
    p = tmp_path / "relu.param"
    p.write_text("7767517\n2 2\nInput x 0 1 x\nReLU relu 1 1 x y\n")
    net = graph.configure(graph.Net(), vulkan=True)
    assert net.load_param(str(p)) == 0 and net.load_model(graph.DataReaderFromEmpty()) == 0
    ex = net.create_extractor()
    assert ex.input("x", k) == 0
    r, y = ex.extract("y")
    assert r == 0 and np.array_equal(np.array(y), np.maximum(np.array(k), 0))


def test_an_attention_without_kv_cache_takes_no_empty_mat(tmp_path):
    """An SDPA with three tops but 7=0 reads no past cache: its last two inputs given empty are refused (ncnn's
    Vulkan layer divides by their size), by vknorm.graph and by check."""
    p = tmp_path / "no_kv.param"
    p.write_text("7767517\n4 6\nInput q 0 1 q\nInput k 0 1 k\nInput v 0 1 v\nSDPA attn 3 3 q k v a kc vc 7=0\n")
    net = graph.configure(graph.Net(), vulkan=True)
    assert net.load_param(str(p)) == 0 and net.load_model(graph.DataReaderFromEmpty()) == 0
    ex = net.create_extractor()
    log: list = []
    with quiet_stderr(log):
        assert ex.input("k", graph.Mat()) == -1 and ex.input("v", graph.Mat()) == -1
    assert sum("the Mat is empty (an empty Mat is taken only for a blob read as a past kv cache" in line
               for line in log) == 2, log
    b = tmp_path / "no_kv.bin"
    b.write_bytes(b"")
    r = vknorm_cli("check", p, b, "--input", "q=2x3x16", "--input", "k=empty", "--input", "v=2x3x16")
    assert r.returncode == 2 and "--input k=empty: only a past kv cache may be empty" in r.stderr, r.stderr


def test_a_step_that_did_not_run_leaves_its_cpu_caches_free_to_go_on(tmp_path):
    """A cache goes on when the layer reading it runs, not when it is given: a step whose extract failed before
    the attention ran (its mask left out) leaves the caches to the step tried again."""
    x = tokens()
    net, w = load(tmp_path, "sdpa", "cpu", "fused")
    _, k, v = first_step(net, x)
    ex = net.create_extractor()
    assert ex.input("in0", graph.Mat(x[5:6])) == 0
    assert ex.input("past_k", k) == 0 and ex.input("past_v", v) == 0
    with quiet_stderr():
        assert ex.extract("out0")[0] == -1  # no mask: nothing ran
    (out, _, _), = decode(net, x, steps=((5, 6),), past=(k, v))
    want = kd.reference("sdpa", w, x[:6])
    assert float(np.abs(out - want[5:6]).max()) <= FP32_TOL * max(1.0, float(np.abs(want).max()))


def test_an_earlier_steps_cache_extracted_again_still_does_not_go_on(tmp_path):
    """Step 2 grew step 1's cache in place; extracting step 1's cache again from its extractor (still alive) gives
    the old header of that memory, which is refused, and step 2's caches go on to step 3 exactly."""
    x = tokens()
    net, w = load(tmp_path, "sdpa", "cpu", "fused")
    ex1 = net.create_extractor()
    assert ex1.input("in0", graph.Mat(x[:5])) == 0 and ex1.input("mask", graph.Mat(kd.causal_mask(0, 5))) == 0
    assert ex1.input("past_k", graph.Mat()) == 0 and ex1.input("past_v", graph.Mat()) == 0
    k1, v1 = ex1.extract("k_cache")[1], ex1.extract("v_cache")[1]
    (_, k2, v2), = decode(net, x, steps=((5, 6),), past=(k1, v1))
    k1_again, v1_again = ex1.extract("k_cache")[1], ex1.extract("v_cache")[1]
    assert k1_again.h == 5
    log = refused_past(net, x, k1_again, v1_again)
    assert any("this cache went on to a step already" in line for line in log), log
    (out, _, _), = decode(net, x, steps=((6, 7),), past=(k2, v2))
    want = kd.reference("sdpa", w, x[:7])
    assert float(np.abs(out - want[6:7]).max()) <= FP32_TOL * max(1.0, float(np.abs(want).max()))


def test_a_cpu_cache_goes_on_in_another_net_of_its_model_and_not_in_another_model(tmp_path):
    """A cache outlives its net and goes on in a new net of the same model, fused or not (as ncnn's CPU layer made
    it); a model of other weights refuses it, naming the layer and model that made it, though its layer has the
    same name (a model of wider heads would append them past the cache's rows: a heap overrun in stock ncnn)."""
    x = tokens()
    net, w = load(tmp_path, "sdpa", "cpu", "fused")
    _, k, v = first_step(net, x)
    net.clear()
    del net
    (tmp_path / "again").mkdir()
    again, _ = load(tmp_path / "again", "sdpa", "cpu", "unfused")
    (out, _, _), = decode(again, x, steps=((5, 6),), past=(k, v))
    want = kd.reference("sdpa", w, x[:6])
    assert float(np.abs(out - want[5:6]).max()) <= FP32_TOL * max(1.0, float(np.abs(want).max()))
    other, _ = load(tmp_path, "mha", "cpu", "fused")  # its attention is named attn too
    _, k2, v2 = first_step(again, x)
    log = refused_past(other, x, k2, v2)
    assert any("this is the key cache of layer attn (kv-cache layer 0) of a model of" in line and
               "it goes back there (here: the key cache of layer attn (kv-cache layer 0) of a model of" in line
               for line in log), log


CROSS_ATTENTION = ("7767517\n5 7\nInput q 0 1 q\nInput enc 0 1 enc\nInput past_k 0 1 past_k\nInput past_v 0 1 past_v\n"
                   f"MultiHeadAttention attn 4 3 q enc past_k past_v out0 k_cache v_cache 0={kd.E} 1={kd.H} "
                   f"2={kd.E * kd.E} 7=1\n")


@pytest.mark.parametrize("config", CONFIGS)
def test_a_cross_attention_decoder_reads_its_cache_at_every_step(tmp_path, config):
    """A Whisper-style cross-attention (queries from the decoder, keys and values from the encoder's output): ncnn
    makes the cache at the first step and reads it as it is at every later one (on the CPU the same memory, not
    grown). Every step's output is what the step computes from the encoder output itself (no past)."""
    rng = np.random.default_rng(3)
    p, b = tmp_path / "cross.param", tmp_path / "cross.bin"
    p.write_text(CROSS_ATTENTION)
    tag = np.zeros(1, np.uint32).tobytes()
    b.write_bytes(b"".join(tag + (0.1 * rng.standard_normal(kd.E * kd.E)).astype(np.float32).tobytes()
                           + (0.1 * rng.standard_normal(kd.E)).astype(np.float32).tobytes() for _ in range(4)))
    net = graph.configure(graph.Net(), **CONFIGS[config])
    assert net.load_param(str(p)) == 0 and net.load_model(str(b)) == 0
    enc = rng.standard_normal((7, kd.E)).astype(np.float32)
    queries = rng.standard_normal((5, kd.E)).astype(np.float32)

    def step(t, past_k, past_v):
        ex = net.create_extractor()
        assert ex.input("q", graph.Mat(queries[t:t + 1])) == 0 and ex.input("enc", graph.Mat(enc)) == 0
        assert ex.input("past_k", past_k) == 0 and ex.input("past_v", past_v) == 0
        (r0, out), (r1, k), (r2, v) = (ex.extract(n) for n in ("out0", "k_cache", "v_cache"))
        assert (r0, r1, r2) == (0, 0, 0), t
        return np.array(out), k, v

    past = (graph.Mat(), graph.Mat())
    for t in range(5):
        out, *past = step(t, *past)
        assert past[0].h == 7, t
        want, _, _ = step(t, graph.Mat(), graph.Mat())
        assert np.array_equal(out, want), t


def test_light_mode_off_is_refused_where_a_models_kv_caches_feed_other_layers(tmp_path):
    """With light mode off ncnn still frees kv-cache memory a layer reads; where a cache feeds another layer (here
    a Split to a Sigmoid beside the cache output) vknorm cannot follow which blobs that leaves, so such a net
    extracts in light mode only (otherwise ncnn ran the attention again on its freed past: garbage caches)."""
    p, b = kd.write(tmp_path, "sdpa", kd.weights("sdpa"))
    text = open(p).read().replace("a0 k_cache v_cache", "a0 kc0 v_cache")
    lines = text.splitlines()
    layer_count, blob_count = map(int, lines[1].split())
    lines[1] = f"{layer_count + 2} {blob_count + 3}"
    lines.insert(lines.index(next(ln for ln in lines if ln.startswith("SDPA"))) + 1,
                 "Split spk 1 2 kc0 k_cache kc1\nSigmoid k_stat 1 1 kc1 k_stat0")
    p2 = tmp_path / "fed_cache.param"
    p2.write_text("\n".join(lines) + "\n")
    x = tokens()
    for lightmode in (True, False):
        net = graph.configure(graph.Net(), vulkan=False, lightmode=lightmode)
        assert net.load_param(str(p2)) == 0 and net.load_model(b) == 0
        if lightmode:
            runs = decode(net, x)
            assert [k.h for _, k, _ in runs] == [end for _, end in STEPS]
            continue
        ex = net.create_extractor()
        assert ex.input("in0", graph.Mat(x[:5])) == 0 and ex.input("mask", graph.Mat(kd.causal_mask(0, 5))) == 0
        assert ex.input("past_k", graph.Mat()) == 0 and ex.input("past_v", graph.Mat()) == 0
        log: list = []
        with quiet_stderr(log):
            assert ex.extract("out0")[0] == -1
        assert any("this model's kv caches feed other layers" in line and "turn light mode on" in line
                   for line in log), log


def test_a_model_without_kv_cache_layers_runs_as_before_batches_inside_included(tmp_path):
    """Only nets with a host kv-cache layer get vknorm's kv-cache allocator: ncnn's extract refuses any blob of a
    batch while one is set ("kvcache does not support batch"), which a model batching inside (Reshape 13=0 ... 12=0)
    meets at its second extract with light mode off."""
    p = tmp_path / "batch.param"
    p.write_text("7767517\n4 4\nInput in0 0 1 in0\nReshape split 1 1 in0 b1 0=8 1=2 2=2 13=0\n"
                 "UnaryOp neg 1 1 b1 b2 0=1\nReshape join 1 1 b2 out0 0=8 1=4 12=0\n")
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    net = graph.configure(graph.Net(), vulkan=False, lightmode=False)
    assert net.load_param(str(p)) == 0 and net.load_model(graph.DataReaderFromEmpty()) == 0
    ex = net.create_extractor()
    assert ex.input("in0", graph.Mat(x)) == 0
    for _ in range(2):
        r, out = ex.extract("out0")
        assert r == 0 and np.array_equal(np.array(out), -x)


def two_layer_decoder(tmp_path, rename_second: bool = True):
    """Two SDPA decoder layers, the second's blobs and layers suffixed _2 (its attention named attn too unless
    rename_second), caches past_k/past_v and past_k_2/past_v_2."""
    p, b = kd.write(tmp_path, "sdpa", kd.weights("sdpa"))
    lines = open(p).read().splitlines()
    body = lines[2:]
    inputs = [ln for ln in body if ln.startswith("Input")]
    layers = [ln for ln in body if not ln.startswith("Input")]
    blobs = {w for ln in layers for w in ln.split()[4:4 + int(ln.split()[2]) + int(ln.split()[3])]}
    second = []
    for ln in layers:
        words = ln.split()
        nb, nt = int(words[2]), int(words[3])
        names = [w if w == "mask" else ("out0" if w == "in0" else w + "_2") for w in words[4:4 + nb + nt]]
        layer_name = words[1] if words[0] == "SDPA" and not rename_second else words[1] + "_2"
        second.append(" ".join([words[0], layer_name, words[2], words[3], *names, *words[4 + nb + nt:]]))
    second[-1] = second[-1].replace(" out0_2 ", " out1 ")
    inputs += ["Input past_k_2 0 1 past_k_2", "Input past_v_2 0 1 past_v_2"]
    all_layers = inputs + layers + second
    blob_count = len(blobs | {w for ln in second for w in ln.split()[4:4 + int(ln.split()[2]) + int(ln.split()[3])]}
                     | {"in0", "mask", "past_k", "past_v", "past_k_2", "past_v_2"})
    p2 = tmp_path / "two_layers.param"
    p2.write_text(f"7767517\n{len(all_layers)} {blob_count}\n" + "\n".join(all_layers) + "\n")
    b2 = tmp_path / "two_layers.bin"
    b2.write_bytes(open(b, "rb").read() * 2)
    net = graph.configure(graph.Net(), vulkan=False, lightmode=False)  # both layers read the mask, with no Split
    assert net.load_param(str(p2)) == 0 and net.load_model(str(b2)) == 0
    return net


@pytest.mark.parametrize("rename_second", [True, False], ids=["named-apart", "same-name"])
def test_each_cache_goes_back_to_its_own_slot_of_its_own_layer(tmp_path, rename_second):
    """A CPU cache is the key or the value cache of one kv-cache layer (by its place among them: names may repeat):
    a key given as a value, or layer 1's cache given to layer 2, is refused (ncnn would append rows of its own widths
    to it: garbage, or a heap overrun where the widths differ). The right ones decode."""
    x = tokens()
    net = two_layer_decoder(tmp_path, rename_second)
    ex = net.create_extractor()
    assert ex.input("in0", graph.Mat(x[:5])) == 0 and ex.input("mask", graph.Mat(kd.causal_mask(0, 5))) == 0
    for blob in ("past_k", "past_v", "past_k_2", "past_v_2"):
        assert ex.input(blob, graph.Mat()) == 0
    caches = {blob: ex.extract(blob)[1] for blob in ("k_cache", "v_cache", "k_cache_2", "v_cache_2")}
    assert ex.extract("out1")[0] == 0
    for wrong in ({"past_k": "v_cache", "past_v": "k_cache"}, {"past_k": "k_cache_2", "past_v": "v_cache_2"}):
        ex = net.create_extractor()
        log: list = []
        with quiet_stderr(log):
            for blob, cache in wrong.items():
                assert ex.input(blob, caches[cache]) == -1, (blob, cache)
        assert all("it goes back there" in line for line in log) and len(log) == 2, log
    ex = net.create_extractor()
    assert ex.input("in0", graph.Mat(x[5:6])) == 0 and ex.input("mask", graph.Mat(kd.causal_mask(5, 1))) == 0
    for blob, cache in (("past_k", "k_cache"), ("past_v", "v_cache"), ("past_k_2", "k_cache_2"),
                        ("past_v_2", "v_cache_2")):
        assert ex.input(blob, caches[cache]) == 0
    assert ex.extract("out1")[0] == 0


@pytest.mark.parametrize("lengths", [(5, 7), (5, 5)], ids=["other-lengths", "same-length"])
def test_a_key_and_value_cache_of_two_sequences_are_refused_together(tmp_path, lengths):
    """A layer's key and value caches grow together, so the two given must be one step's: one sequence's key cache
    with another's value cache would be appended to at the key's length inside the other's tokens, or read side by
    side. The extract is refused, and both sequences go on afterwards."""
    x = tokens()
    y = -x  # the second sequence
    net, w = load(tmp_path, "sdpa", "cpu", "fused")
    (_, ka, va), (_, kb, vb) = first_step(net, x, lengths[0]), first_step(net, y, lengths[1])
    ex = net.create_extractor()
    n = lengths[0]
    assert ex.input("in0", graph.Mat(x[n:n + 1])) == 0 and ex.input("mask", graph.Mat(kd.causal_mask(n, 1))) == 0
    assert ex.input("past_k", ka) == 0 and ex.input("past_v", vb) == 0
    log: list = []
    with quiet_stderr(log):
        assert ex.extract("out0")[0] == -1
    assert any(f"the past key and value caches given to layer attn are not one step's ({lengths[0]} and {lengths[1]} "
               "tokens)" in line for line in log), log
    del ex
    for (k, v), seq, n in (((ka, va), x, lengths[0]), ((kb, vb), y, lengths[1])):
        (out, _, _), = decode(net, seq, steps=((n, n + 1),), past=(k, v))
        want = kd.reference("sdpa", w, seq[:n + 1])
        assert float(np.abs(out - want[n:n + 1]).max()) <= FP32_TOL * max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("value", ["unset", "empty", "other-length"])
def test_a_vulkan_nets_key_and_value_caches_of_other_token_counts_are_refused(tmp_path, value):
    """ncnn's Vulkan attention reads the past caches as given, checking neither: a later step whose value cache is
    left unset (given empty), given empty, or of another token count than its key cache read past what it was given
    (errors of 2.5, no error). The extract is refused, naming both counts; the step given both caches runs."""
    x = tokens()
    net, w = load(tmp_path, "sdpa", "vulkan-fp32", "fused")
    (_, k5, v5), (_, _, v4) = first_step(net, x, 5), first_step(net, x, 4)
    ex = net.create_extractor()
    assert ex.input("in0", graph.Mat(x[5:6])) == 0 and ex.input("mask", graph.Mat(kd.causal_mask(5, 1))) == 0
    assert ex.input("past_k", k5) == 0
    if value != "unset":
        assert ex.input("past_v", graph.Mat() if value == "empty" else v4) == 0
    log: list = []
    with quiet_stderr(log):
        assert ex.extract("out0")[0] == -1
    tokens_v = 4 if value == "other-length" else 0
    assert any(f"the past key and value caches given to layer attn are not one step's (5 and {tokens_v} tokens)"
               in line for line in log), log
    (out, _, _), = decode(net, x, steps=((5, 6),), past=(k5, v5))
    want = kd.reference("sdpa", w, x[:6])
    assert float(np.abs(out - want[5:6]).max()) <= ATOL["vulkan-fp32"] * max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("config", ["cpu", "vulkan-fp32"])
def test_a_first_step_may_leave_its_past_caches_unset_as_in_pyncnn(tmp_path, config):
    """ncnn reads an Input left unset as an empty Mat, which a kv-cache layer takes as no past: pyncnn's decoders
    may skip the past inputs at the first step. Given only the tokens and the mask, the prompt's step is the same."""
    x = tokens()
    net, w = load(tmp_path, "sdpa", config, "fused")
    ex = net.create_extractor()
    assert ex.input("in0", graph.Mat(x[:5])) == 0 and ex.input("mask", graph.Mat(kd.causal_mask(0, 5))) == 0
    (r0, out), (r1, k), (r2, v) = (ex.extract(b) for b in ("out0", "k_cache", "v_cache"))
    assert (r0, r1, r2) == (0, 0, 0)
    want = kd.reference("sdpa", w, x[:6])
    scale = max(1.0, float(np.abs(want).max()))
    assert float(np.abs(np.array(out) - want[:5]).max()) <= ATOL[config] * scale
    (out, _, _), = decode(net, x, steps=((5, 6),), past=(k, v))
    assert float(np.abs(out - want[5:6]).max()) <= ATOL[config] * scale


def test_check_refuses_a_model_whose_kv_caches_feed_other_layers(tmp_path):
    """ncnn frees kv-cache memory as layers read it, so such a model's blobs cannot all be compared: one line, exit 2,
    naming the layer that reads the cache."""
    p, b = kd.write(tmp_path, "sdpa", kd.weights("sdpa"))
    text = open(p).read().replace("a0 k_cache v_cache", "a0 kc0 v_cache")
    lines = text.splitlines()
    layer_count, blob_count = map(int, lines[1].split())
    lines[1] = f"{layer_count + 1} {blob_count + 1}"
    lines.insert(lines.index(next(ln for ln in lines if ln.startswith("SDPA"))) + 1, "Sigmoid k_stat 1 1 kc0 k_stat0")
    p2 = tmp_path / "fed.param"
    p2.write_text("\n".join(lines) + "\n")
    r = vknorm_cli("check", p2, b, *FIRST_STEP)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    line, = r.stderr.strip("\n").split("\n")
    assert "Sigmoid 'k_stat'" in line and "reads the kv cache 'kc0' of SDPA 'attn'" in line, line


def test_an_extract_after_a_refused_past_cache_is_refused_not_run_on_no_past(tmp_path):
    """A past cache input() refused is not taken as left unset (an empty past): the step's mask, made for its past
    and new tokens, would be wider than what ncnn's SDPA then reads (its CPU layer overruns its heap there, stock
    ncnn too). The extract is -1, saying the input was refused."""
    x = tokens(17)
    net, _ = load(tmp_path, "sdpa", "cpu", "fused")
    _, k, v = first_step(net, x, 16)
    for _ in range(3):
        ex = net.create_extractor()
        assert ex.input("in0", graph.Mat(x[16:17])) == 0 and ex.input("mask", graph.Mat(kd.causal_mask(16, 1))) == 0
        log: list = []
        with quiet_stderr(log):
            assert ex.input("past_k", graph.Mat(np.array(k))) == -1 and ex.input("past_v", graph.Mat(np.array(v))) == -1
            assert ex.extract("out0")[0] == -1
        assert any(re.search(r"extract out0: the input past_[kv] it depends on was refused", line) for line in log), log


def test_a_vulkan_nets_attention_refuses_a_past_cache_of_other_heads_than_it_makes(tmp_path):
    """ncnn's Vulkan attention reads a past cache as its own whatever its heads and head size: the SDPA model's
    caches (2 heads) given to the MultiHeadAttention model's layer (4 heads) ran, ret 0, its missing heads read from
    past the upload (garbage one run, zeros the next). Once the layer has made a cache in this net, one of another
    shape is refused at extract, naming both; the first step from such a cache, before that, is not told apart."""
    x = tokens()
    sdpa, _ = load(tmp_path, "sdpa", "vulkan-fp32", "fused")  # (decoder_sdpa.*, decoder_mha.*: one directory)
    mha, w = load(tmp_path, "mha", "vulkan-fp32", "fused")
    _, k_other, v_other = first_step(sdpa, x)
    (_, k_own, v_own), = decode(mha, x, steps=((0, 5),))
    assert (k_other.c, k_other.w) != (k_own.c, k_own.w), "the two models' caches should differ in shape"
    ex = mha.create_extractor()
    assert ex.input("in0", graph.Mat(x[5:6])) == 0 and ex.input("mask", graph.Mat(kd.causal_mask(5, 1))) == 0
    assert ex.input("past_k", k_other) == 0 and ex.input("past_v", v_other) == 0
    log: list = []
    with quiet_stderr(log):
        assert ex.extract("out0")[0] == -1
    shape = f"{k_other.c} heads of {k_other.w} (dims 3, w {k_other.w}, c {k_other.c})"
    assert any(f"the past key cache given to layer attn is {shape}, where the caches this layer makes are "
               f"{k_own.c} heads of {k_own.w}" in line for line in log), log
    (out, _, _), = decode(mha, x, steps=((5, 6),), past=(k_own, v_own))  # its own go on
    want = kd.reference("mha", w, x[:6])
    assert float(np.abs(out - want[5:6]).max()) <= ATOL["vulkan-fp32"] * max(1.0, float(np.abs(want).max()))

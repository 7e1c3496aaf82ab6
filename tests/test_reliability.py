"""Reliability of vknorm's own runtime: clean under validation, no leaks, lifetime, threads, very large tensors, faults.

The scenarios live in tests/reliability_lib.py (tools/reliability_report.py runs the same ones for the
figures in docs/reliability.md); the tests here decide. Everything runs under VKNORM_VALIDATION=1
(conftest fails a test on any validation message). Knobs used: VKNORM_MAX_BUFFER_BYTES (plan as if
storage buffers were that small: small tensors take the pieces path), VKNORM_MAX_DEVICE_BYTES (a device
memory cap, read when a context is created), VKNORM_VALIDATION_PRINT (validation messages also to
stderr, as they happen) and VKNORM_DEBUG_LEAK_BUFFER (leak one buffer on purpose: the negative control).
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

import vknorm
from availability import missing
from vknorm import _core
from reference import FP32_TOL, channel_norm64, check_close, norm64, storage_rule
import reliability_lib as R

REPO = Path(__file__).resolve().parent.parent


def run_python(code: str, env_extra: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, VKNORM_VALIDATION="1", VKNORM_VALIDATION_PRINT="1", PYTHONUNBUFFERED="1")
    for k in ("VKNORM_MAX_BUFFER_BYTES", "VKNORM_MAX_DEVICE_BYTES", "VKNORM_DEBUG_LEAK_BUFFER", "VKNORM_PATH"):
        env.pop(k, None)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])


def layer_on(ctx, op="LayerNorm", affine_size=64, seed=0, **kw):
    rng = np.random.default_rng(seed)
    cls = vknorm.LayerNorm if op == "LayerNorm" else vknorm.RMSNorm
    layer = cls(affine_size=affine_size, eps=1e-5, device=ctx, **kw)
    if layer.affine:
        gamma = rng.uniform(0.5, 1.5, affine_size).astype(np.float32)
        beta = rng.uniform(-0.5, 0.5, affine_size).astype(np.float32)
        layer.load_model(gamma, beta) if op == "LayerNorm" else layer.load_model(gamma)
    return layer


def ref_of(layer, x):
    return norm64(type(layer).__name__, x, layer.affine_size, layer.eps, layer.affine,
                  layer.gamma if layer.affine else None,
                  layer.beta if layer.affine and isinstance(layer, vknorm.LayerNorm) else None)


# ============================================================================ validation: every object freed

def test_every_vulkan_object_is_released_validation_reports_no_leak():
    """Contexts, layers (all paths, both storages, pieces, threads, a refused call, a MemoryError) and
    VkMats, then everything dropped: the validation layer reports nothing, including at vkDestroyDevice
    and vkDestroyInstance (leaked objects are reported there, as errors, to vknorm's messenger)."""
    proc = run_python("import sys; sys.path.insert(0, 'tests'); import json, reliability_lib as R; "
                      "print(json.dumps(R.lifecycle()))", {})
    res = last_json(proc)
    assert res["messages"] == [], res["messages"]
    assert "vknorm: validation:" not in proc.stderr, proc.stderr
    assert res["own"] == [0, 0, 0, 0], res["own"]
    assert res["validation"] and res["refused"] == 2, res


def test_leak_report_at_device_destruction_reaches_stderr():
    """The negative control: one buffer leaked on purpose (VKNORM_DEBUG_LEAK_BUFFER=1) on the default
    context, which is destroyed only at interpreter exit (vknorm's atexit hook): the validation layer's
    report of the leaked VkBuffer and VkDeviceMemory still comes out (VKNORM_VALIDATION_PRINT=1)."""
    proc = run_python("""
        import numpy as np, vknorm
        ln = vknorm.LayerNorm(affine_size=8)
        ln.load_model(np.ones(8), np.zeros(8))
        ln(np.ones((2, 8), np.float32))
        del ln
        print("done")
    """, {"VKNORM_DEBUG_LEAK_BUFFER": "1", "VKNORM_TESTS_EXPECT_VALIDATION_MESSAGES": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    leaks = [ln for ln in proc.stderr.splitlines() if ln.startswith("vknorm: validation:")]
    assert any("VkBuffer" in ln and "has not been destroyed" in ln for ln in leaks), proc.stderr
    # The layer's VUID for it: 00378 up to 1.3.2xx (on the message's first line), 05137 in 1.4 (in its last).
    assert "VUID-vkDestroyDevice-device-00378" in proc.stderr or "VUID-vkDestroyDevice-device-05137" in proc.stderr, proc.stderr
    assert any("VkDeviceMemory" in ln for ln in leaks), proc.stderr


def test_a_child_process_with_validation_messages_fails():
    """The negative control of the tests' child processes (tests/child_site/sitecustomize.py): the same leak, not
    expected, makes the child exit 86 with the messages on stderr, however the script itself ends."""
    proc = run_python("""
        import numpy as np, vknorm
        ln = vknorm.LayerNorm(affine_size=8)
        ln.load_model(np.ones(8), np.zeros(8))
        ln(np.ones((2, 8), np.float32))
        del ln  # the default context's device then goes at vknorm's exit work, which reports the leak
        print("done")
    """, {"VKNORM_DEBUG_LEAK_BUFFER": "1", "VKNORM_VALIDATION_PRINT": "0"})
    assert proc.returncode == 86, f"exit {proc.returncode}\n{proc.stderr[-2000:]}"
    assert proc.stdout.strip() == "done"
    assert "Vulkan validation message(s) in child process" in proc.stderr and "VkBuffer" in proc.stderr, proc.stderr


# ============================================================================ lifetime

@pytest.mark.timeout(240)
def test_10000_forwards_device_memory_returns_to_baseline_and_rss_stays_flat():
    r = R.lifetime(10_000)
    assert (r["baseline_bytes"], r["baseline_buffers"]) == (0, 0)
    # After warm-up, every forward left exactly the weights behind: no per-call buffer survives it.
    assert r["drift_forwards"] == 0, r
    assert (r["after_loop_bytes"], r["after_loop_buffers"]) == (r["steady_bytes"], r["steady_buffers"]), r
    assert (r["after_drop_bytes"], r["after_drop_buffers"]) == (0, 0), r
    assert r["rss_growth"] <= 0.05, f"RSS grew {100 * r['rss_growth']:.1f}% after warm-up: {r}"
    # each storage against its own rule (about half the checked forwards each)
    assert r["checked_fp32"] >= 40 and r["worst_rel_err_fp32"] <= FP32_TOL, r
    # float16 inputs, against float64 of those very values: the storage rule, past the output's rounding
    assert r["checked_fp16"] >= 40 and r["worst_rel_excess_fp16"] <= FP32_TOL, r


# ============================================================================ concurrency

def test_8_threads_on_one_layer_match_serial_results_bit_for_bit():
    """8 threads at once on one layer and one context (numpy and VkMat, both storages, varying shapes):
    every result equals the same forward run alone; validation (core, threading, synchronization) is
    silent, so queue submission and descriptor/command-pool use are safe under threads."""
    r = R.threads_vs_serial(n_threads=8, per_thread=50)
    assert r["errors"] == [] and r["hung_threads"] == 0, r
    assert r["forwards"] == 400 and r["mismatches"] == 0, r


def test_load_model_load_param_destroy_pipeline_while_other_threads_forward():
    """Each forward runs on the weights it started with: every result is exactly that of one weight set."""
    r = R.loads_while_forwarding(forwarders=4, per_thread=40)
    assert r["errors"] == [] and r["hung_threads"] == 0, r
    assert r["other"] == 0, r
    assert r["weights1"] + r["weights2"] == r["forwards"] and r["loads"] > 0, r


@pytest.mark.timeout(900)  # 30 processes of their own: minutes on a loaded machine
def test_one_layer_running_vkmats_of_two_contexts_on_four_threads_never_deadlocks():
    """A layer moved between contexts by its callers (VkMats of two contexts, four threads: each call runs where
    its VkMat lives, or says another thread moved the layer) drops the old context's state under its lock, and
    dropping a Context Python made takes the GIL: a thread that waited for that lock holding the GIL deadlocked
    (about 1 run in 10). Every call that takes the lock now releases the GIL first. 30 runs, each in a process
    of its own that must finish."""
    code = textwrap.dedent("""
        import threading, numpy as np, vknorm
        ln = vknorm.LayerNorm(8, 1e-5, affine=False)
        ctxs = [vknorm.Context.default(), vknorm.Context.create(vknorm._core.default_device_index())]
        x = np.arange(32, dtype=np.float32).reshape(4, 8)
        want = ln(x, device="cpu")
        bad = []
        def work(i):
            for _ in range(200):
                try:
                    y = ln(vknorm.to_device(x, device=ctxs[i % 2])).numpy()
                except ValueError as e:  # another thread moved the layer between this call's checks
                    if "another Vulkan context" not in str(e):
                        bad.append(str(e))
                    continue
                if not np.allclose(y, want, atol=1e-5):
                    bad.append("wrong result")
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print("errors", len(bad), bad[:1])
    """)
    for run in range(30):
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"run {run}: four threads on one layer and two contexts hung")
        assert proc.returncode == 0 and "errors 0 []" in proc.stdout, (run, proc.stdout, proc.stderr[-2000:])


def test_gil_is_released_during_gpu_work():
    r = R.gil_released()
    assert r["forward_seconds"] > 0.02, r
    assert r["stamps_in_middle"] > 0, f"a Python thread made no progress during the forward: {r}"


# ============================================================================ large tensors: the plan

def covered_groups(pieces, elemsize):
    """(byte offset of every group) the pieces cover, each piece read as a blob of its own."""
    out = []
    for p in pieces:
        for q in range(p["n_groups"]):
            ch, i = divmod(q, p["gpc"])
            out.append(p["offset"] + (ch * p["cstep"] + i * p["group_size"]) * elemsize)
    return out


PLAN_SHAPES = [  # dims, w, h, d, c (packed counts), elempack, scalar bytes, affine_size
    (1, 1000, 1, 1, 1, 1, 4, 1000), (2, 24, 37, 1, 1, 1, 4, 24), (2, 24, 9, 1, 1, 4, 2, 24),
    (3, 10, 6, 1, 5, 1, 4, 10), (3, 10, 6, 1, 5, 1, 4, 60), (3, 7, 3, 1, 6, 4, 2, 7),
    (4, 5, 4, 3, 2, 1, 4, 5), (4, 5, 4, 3, 2, 1, 4, 20), (4, 5, 4, 3, 2, 4, 4, 60), (4, 6, 2, 7, 3, 4, 2, 6),
]


@pytest.mark.parametrize("shape", PLAN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_plan_pieces_covers_every_group_exactly_once(shape):
    dims, w, h, d, c, pack, sb, affine_size = shape
    elemsize = sb * pack
    whole = _core.plan_pieces(dims, w, h, d, c, pack, sb, affine_size, True, 1 << 40)
    assert len(whole) == 1 and whole[0]["offset"] == 0
    want = sorted(covered_groups(whole, elemsize))
    group_bytes = whole[0]["group_size"] * elemsize
    for max_bytes in sorted({group_bytes, group_bytes + elemsize, 2 * group_bytes + 3, 5 * group_bytes - 1,
                             17 * group_bytes, whole[0]["bytes"] - 1}):
        if max_bytes < group_bytes:
            continue
        pieces = _core.plan_pieces(dims, w, h, d, c, pack, sb, affine_size, True, max_bytes)
        assert sorted(covered_groups(pieces, elemsize)) == want, (max_bytes, pieces)
        for p in pieces:
            assert p["bytes"] <= max_bytes
            # The piece's own layout spans exactly its bytes: no shader index reaches past it.
            span = ((p["n_groups"] // p["gpc"] - 1) * p["cstep"] + p["gpc"] * p["group_size"]) * elemsize
            assert span == p["bytes"], p
    with pytest.raises(ValueError, match="exceeds a piece"):
        _core.plan_pieces(dims, w, h, d, c, pack, sb, affine_size, True, group_bytes - 1)


def test_plan_pieces_keeps_every_piece_under_32_bit_indexing():
    """Shapes far past any device (planning touches no memory): pieces never exceed 2^31 packed
    elements whatever the buffer limit, so no 32-bit index in a shader can wrap; what cannot be split
    that small, or indexed at all, is refused with a message."""
    lim = 1 << 31
    # 2^34 float16 elements in rows of 4096 (32 GiB), a buffer limit of 1 TiB: pieces of <= 2^31 elements.
    pieces = _core.plan_pieces(2, 4096, 1 << 22, 1, 1, 1, 2, 4096, True, 1 << 40)
    assert len(pieces) >= 8
    assert all(p["n_groups"] * p["group_size"] <= lim for p in pieces)
    assert sum(p["n_groups"] for p in pieces) == 1 << 22
    assert all(b["offset"] == a["offset"] + a["bytes"] for a, b in zip(pieces, pieces[1:]))
    # pack4 float32 (16-byte elements), dims 4, groups of w*h: a channel of 2^30 elements split inside.
    pieces = _core.plan_pieces(4, 1 << 15, 1 << 10, 1 << 5, 2, 4, 4, 1 << 25, True, 1 << 40)
    assert all(p["n_groups"] * p["group_size"] <= lim for p in pieces)
    assert sum(p["n_groups"] for p in pieces) == 2 * (1 << 5)
    # One group of 2^31 + 1 elements: cannot be split, refused.
    with pytest.raises(ValueError, match="exceeds a piece"):
        _core.plan_pieces(3, (1 << 16) + 1, 1 << 15, 1, 1, 1, 2, 0, False, 1 << 40)
    # Groups or channel strides past 2^32 cannot even be described in 32 bits: refused.
    with pytest.raises(ValueError, match="32-bit"):
        _core.plan_pieces(3, 1 << 17, 1 << 16, 1, 1, 1, 4, 0, False, 1 << 40)
    with pytest.raises(ValueError, match="32-bit"):
        _core.plan_pieces(4, 1, 1 << 16, 1 << 16, 2, 1, 4, 1, True, 1 << 40)


# ============================================================================ large tensors: running in pieces

PIECE_CASES = [  # op, shape, affine_size (0: affine off), option, VKNORM_MAX_BUFFER_BYTES
    ("LayerNorm", (40, 64), 64, {}, 4096),
    ("LayerNorm", (41, 64), 64, {"use_fp16_storage": True}, 1000),
    ("RMSNorm", (6, 5, 48), 48, {}, 700),
    ("LayerNorm", (6, 5, 48), 240, {}, 2000),
    ("LayerNorm", (8, 5, 48), 48, {"use_packing_layout": False}, 777),
    ("RMSNorm", (4, 3, 5, 8), 8, {"use_fp16_storage": True}, 100),
    ("LayerNorm", (4, 3, 5, 8), 40, {}, 700),
    ("LayerNorm", (4, 3, 5, 8), 120, {}, 1920),
    ("LayerNorm", (2, 9000), 0, {"path": "split"}, 40000),
    ("RMSNorm", (3, 4, 2500), 2500, {"path": "split"}, 20000),
    ("LayerNorm", (2, 12, 2500), 0, {}, 150000),     # one channel, one group per piece
    ("LayerNorm", (2, 12, 2500), 2500, {}, 50000),   # a channel (12 rows) > a piece: its rows split
    ("LayerNorm", (1, 24, 700), 700, {"path": "split", "use_fp16_storage": True}, 3000),
    ("LayerNorm", (300,), 300, {}, 1200),            # one group, exactly one piece
]


@pytest.mark.parametrize("vkmat", [False, True], ids=["numpy", "vkmat"])
@pytest.mark.parametrize("case", PIECE_CASES, ids=lambda c: f"{c[0]}{'x'.join(map(str, c[1]))}_a{c[2]}_{c[4]}B")
def test_tensor_over_the_buffer_limit_runs_in_pieces_and_matches(monkeypatch, case, vkmat):
    op, shape, affine_size, opt_kw, limit = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    layer = layer_on(None, op, affine_size, affine=affine_size > 0)
    opt = vknorm.Option(**opt_kw)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    whole = layer(x, option=opt)
    assert layer.last_dispatch["pieces"] == 1
    monkeypatch.setenv("VKNORM_MAX_BUFFER_BYTES", str(limit))
    if vkmat:
        v = vknorm.to_device(x, option=opt)
        layer.forward_inplace(v, option=opt)
        got = v.download().numpy().reshape(shape)
    else:
        got = layer(x, option=opt)
    info = layer.last_dispatch
    total = x.size * (2 if opt.use_fp16_storage else 4)
    assert (info["pieces"] >= 2) if total > limit else (info["pieces"] == 1), (total, limit, info)
    # float64 of the input as stored (float16 storage rounds it first), by the storage rule
    ref = ref_of(layer, x.astype(np.float16) if opt.use_fp16_storage else x)
    err, bound = storage_rule(got, ref, opt.use_fp16_storage)
    assert err <= bound, f"{case} in {info['pieces']} pieces: error {err:.3e} > {bound:.3e} (the storage rule)"
    if info["path"] != "split":  # the fused kernels do not depend on how many groups a dispatch has
        np.testing.assert_array_equal(got, whole)


def test_group_larger_than_a_buffer_is_refused_before_anything_is_allocated(monkeypatch):
    ctx = _core.Context.create(0)
    layer = vknorm.LayerNorm(affine_size=0, affine=False, device=ctx)
    layer(np.ones((2, 8), np.float32))
    before = (ctx.device_bytes_in_use, ctx.live_buffers, ctx.device_bytes_peak)
    monkeypatch.setenv("VKNORM_MAX_BUFFER_BYTES", "4096")
    x = np.random.default_rng(1).standard_normal((3, 2048)).astype(np.float32)  # groups of 8192 bytes
    with pytest.raises(ValueError) as e:
        layer(x)
    msg = str(e.value)
    assert "8192 bytes" in msg and "4096" in msg and "VKNORM_MAX_BUFFER_BYTES" in msg and "pieces" in msg, msg
    assert (ctx.device_bytes_in_use, ctx.live_buffers, ctx.device_bytes_peak) == before
    v = vknorm.to_device(x, device=ctx)
    with pytest.raises(ValueError, match="8192 bytes"):
        layer.forward_inplace(v)
    del v
    assert (ctx.device_bytes_in_use, ctx.live_buffers) == before[:2]
    monkeypatch.setenv("VKNORM_MAX_BUFFER_BYTES", "-5")
    with pytest.raises(ValueError, match="VKNORM_MAX_BUFFER_BYTES=-5: expected a positive integer"):
        layer(x)
    monkeypatch.delenv("VKNORM_MAX_BUFFER_BYTES")
    check_close(layer(x), ref_of(layer, x), FP32_TOL, "after the refusals")


@pytest.mark.timeout(240)
def test_largest_tensor_1_gib_runs_in_pieces_past_max_storage_buffer_range():
    """1 GiB of float32 (268M elements, rows of 1024; lavapipe binds 128 MiB per storage buffer):
    numpy in and out, processed in pieces; rows on both sides of every piece boundary and a sample of
    the rest match the float64 reference."""
    r = R.largest(gib=1.0)
    assert r["pieces"] == r["planned_pieces"] >= -(-(1 << 30) // r["max_storage_buffer_range"]), r  # 8 on lavapipe
    assert r["all_finite"] and r["sampled_rows"] > 1000, r
    assert r["sampled_rel_err"] <= FP32_TOL, r


@pytest.mark.timeout(240)
def test_resident_vkmat_larger_than_max_storage_buffer_range_runs_in_pieces():
    r = R.largest(gib=0.375, vkmat=True)
    assert r["pieces"] == r["planned_pieces"] >= -(-(3 << 27) // r["max_storage_buffer_range"]), r  # 3 on lavapipe
    assert r["all_finite"] and r["sampled_rel_err"] <= FP32_TOL, r


# ============================================================================ faults: device memory

@pytest.fixture
def capped(monkeypatch):
    """A context of its own with a 256 KiB device-memory cap (VKNORM_MAX_DEVICE_BYTES)."""
    monkeypatch.setenv("VKNORM_MAX_DEVICE_BYTES", str(256 << 10))
    ctx = _core.Context.create(0)
    monkeypatch.delenv("VKNORM_MAX_DEVICE_BYTES")
    return ctx


def test_memory_error_names_the_sizes_and_the_same_layer_works_on_a_smaller_call(capped):
    layer = vknorm.LayerNorm(affine_size=0, affine=False, device=capped)
    ok = np.random.default_rng(2).standard_normal((2, 40, 40)).astype(np.float32)
    check_close(layer(ok), ref_of(layer, ok), FP32_TOL, "before")
    before = (capped.device_bytes_in_use, capped.live_buffers, capped.device_bytes_peak)
    big = np.ones((1, 400, 400), np.float32)  # one group of 640000 bytes: cannot be split
    with pytest.raises(MemoryError) as e:
        layer(big)
    msg = str(e.value)
    assert "640000 bytes" in msg and str(256 << 10) in msg and "VKNORM_MAX_DEVICE_BYTES" in msg, msg
    assert (capped.device_bytes_in_use, capped.live_buffers, capped.device_bytes_peak) == before
    check_close(layer(ok), ref_of(layer, ok), FP32_TOL, "the next, smaller call")
    assert (capped.device_bytes_in_use, capped.live_buffers) == before[:2]


def test_device_allocation_over_the_cap_raises_memory_error_then_recovers(capped):
    """The allocator itself refusing (VkMat upload past the cap): MemoryError naming the request, the
    bytes in use and the cap; nothing is left allocated; a smaller upload and forward work."""
    layer = layer_on(capped, "RMSNorm", 64)
    base = (capped.device_bytes_in_use, capped.live_buffers)
    with pytest.raises(MemoryError) as e:
        vknorm.to_device(np.ones((2000, 64), np.float32), device=capped)  # 512000 bytes
    msg = str(e.value)
    assert "cannot allocate 512000 bytes (0.5 MiB)" in msg and "in use" in msg and f"VKNORM_MAX_DEVICE_BYTES={256 << 10}" in msg
    assert (capped.device_bytes_in_use, capped.live_buffers) == base
    x = np.random.default_rng(3).standard_normal((100, 64)).astype(np.float32)
    v = vknorm.to_device(x, device=capped)
    layer.forward_inplace(v)
    check_close(v.download().numpy(), ref_of(layer, x), FP32_TOL, "after the refused upload")


def test_tensor_larger_than_free_memory_runs_in_pieces_within_the_cap(capped):
    layer = layer_on(capped, "LayerNorm", 128)
    x = np.random.default_rng(4).standard_normal((3000, 128)).astype(np.float32)  # 1.5 MB > 256 KiB
    y = layer(x)
    assert layer.last_dispatch["pieces"] >= 6
    assert capped.device_bytes_peak <= 256 << 10
    check_close(y, ref_of(layer, x), FP32_TOL, "in pieces under the memory cap")
    # 100 KiB of the cap now held by a VkMat (its upload took 200 KiB for a moment where it goes through a
    # staging buffer): smaller pieces.
    v = vknorm.to_device(x[:200], device=capped)
    y = layer(x)
    assert layer.last_dispatch["pieces"] >= 10 and capped.device_bytes_peak <= 256 << 10
    check_close(y, ref_of(layer, x), FP32_TOL, "in pieces next to a resident VkMat")
    del v


def test_cached_buffers_count_within_the_cap_and_make_way_for_new_ones(capped):
    """What the context keeps of freed buffers counts against VKNORM_MAX_DEVICE_BYTES with what is in use:
    a shape that needs most of the cap after another shape's buffers were cached still runs, the cache
    giving them up, and in use plus cached never passes the cap."""
    layer = layer_on(capped, "LayerNorm", 128)
    rng = np.random.default_rng(5)
    for rows in (150, 300, 7, 260, 150):  # blobs of 3584 to 153600 bytes (and a staging buffer each on a GPU)
        x = rng.standard_normal((rows, 128)).astype(np.float32)
        check_close(layer(x), ref_of(layer, x), FP32_TOL, f"{rows} rows")
        assert capped.device_bytes_in_use + capped.device_bytes_cached <= 256 << 10
    assert capped.cached_buffers > 0


@pytest.mark.parametrize("limit", [0, 100 << 10])
def test_buffer_cache_keeps_at_most_VKNORM_BUFFER_CACHE_BYTES(monkeypatch, limit):
    monkeypatch.setenv("VKNORM_BUFFER_CACHE_BYTES", str(limit))
    ctx = _core.Context.create(0)
    monkeypatch.delenv("VKNORM_BUFFER_CACHE_BYTES")
    layer = layer_on(ctx, "RMSNorm", 64)
    rng = np.random.default_rng(6)
    for rows in (10, 300, 10, 600, 10, 300):  # blobs of 2560, 76800 and 153600 bytes
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        before = ctx.device_allocations
        check_close(layer(x), ref_of(layer, x), FP32_TOL, f"{rows} rows")
        assert ctx.device_bytes_cached <= limit
        if limit == 0:
            assert ctx.cached_buffers == 0 and ctx.device_allocations > before  # every forward allocates
    if limit:
        assert 0 < ctx.device_bytes_cached and ctx.cached_buffers > 0
        ctx.release_cached_buffers()
        assert (ctx.cached_buffers, ctx.device_bytes_cached) == (0, 0)
        before = ctx.device_allocations
        layer(rng.standard_normal((10, 64)).astype(np.float32))
        assert ctx.device_allocations > before  # nothing left to reuse


def test_buffer_cache_limit_that_is_not_a_number_is_refused(monkeypatch):
    monkeypatch.setenv("VKNORM_BUFFER_CACHE_BYTES", "256MB")
    with pytest.raises(ValueError, match="VKNORM_BUFFER_CACHE_BYTES=256MB: expected a whole number of bytes"):
        _core.Context.create(0)


def rss_mib() -> float:
    ctypes.CDLL(None).malloc_trim(0)  # glibc hands back what it holds free: what is left is what is in use
    return R.rss_bytes() / 2**20


@pytest.mark.parametrize("kept", [4, 0])
def test_a_context_keeps_only_its_most_recently_used_pipelines(monkeypatch, kept):
    """Every layer size specializes pipelines of its own, shared by the context's layers: a process making layers
    of ever new sizes kept them all (200 sizes: 200 pipelines, ~575 MB more on lavapipe). The context keeps the
    VKNORM_PIPELINE_CACHE_COUNT most recently used; one dropped and used again is made again, and a forward
    holds the pipelines it recorded until its work is done (0: none kept, each forward makes its own; validation
    sees no pipeline destroyed in use)."""
    monkeypatch.setenv("VKNORM_PIPELINE_CACHE_COUNT", str(kept))
    ctx = _core.Context.create(0)
    monkeypatch.delenv("VKNORM_PIPELINE_CACHE_COUNT")
    rng = np.random.default_rng(8)
    sizes = [64 + 4 * i for i in range(12)]
    for i, n in enumerate(sizes):
        layer = layer_on(ctx, "LayerNorm", n, seed=i)
        x = rng.standard_normal((6, n)).astype(np.float32)
        check_close(layer(x), ref_of(layer, x), FP32_TOL, f"size {n}")
        assert ctx.pipelines <= kept
    assert ctx.pipelines_made >= len(sizes)
    last = layer_on(ctx, "LayerNorm", sizes[-1], seed=len(sizes) - 1)
    made = ctx.pipelines_made
    x = rng.standard_normal((6, sizes[-1])).astype(np.float32)
    check_close(last(x), ref_of(last, x), FP32_TOL, "the last size again")
    assert ctx.pipelines_made == made if kept else ctx.pipelines_made > made  # kept: reused; none kept: made again
    made = ctx.pipelines_made
    first = layer_on(ctx, "LayerNorm", sizes[0])
    x = rng.standard_normal((6, sizes[0])).astype(np.float32)
    check_close(first(x), ref_of(first, x), FP32_TOL, "the first size again")
    assert ctx.pipelines_made > made  # dropped long ago: made again
    # The split path's passes in one submission, each pipeline dropped as the next is made when none
    # are kept: the submission holds them all until its work is done.
    gn = vknorm.GroupNorm(4, 8, 1e-5, affine=False, device=ctx, option=vknorm.Option(path="split"))
    x = rng.standard_normal((8, 6, 5)).astype(np.float32)
    for _ in range(2):
        check_close(gn(x), channel_norm64("GroupNorm", x, 1e-5, group=4), FP32_TOL, "GroupNorm, split path")
    assert gn.last_dispatch["path"] == "split" and ctx.pipelines <= kept


def test_layers_of_many_sizes_leave_host_memory_flat_past_the_pipelines_kept(monkeypatch):
    """Short-lived layers of 60 new sizes on a context keeping 8 pipelines: host memory stays nearly flat, the
    pipelines past those kept freed and the driver's pipeline cache started afresh now and then (lavapipe: ~2.9 MB
    a pipeline, ~0.1 MB in that cache: these 60 sizes grew it by 157 MiB with every pipeline kept, by 6 MiB with 8)."""
    monkeypatch.setenv("VKNORM_PIPELINE_CACHE_COUNT", "8")
    ctx = _core.Context.create(0)
    monkeypatch.delenv("VKNORM_PIPELINE_CACHE_COUNT")
    x = np.ones((4, 512), np.float32)

    def layers_of_new_sizes(first):
        for n in range(first, first + 30):
            vknorm.LayerNorm(affine_size=n, affine=False, device=ctx)(x[:, :n])
    layers_of_new_sizes(64)  # the allocator's and driver's own first growth
    before = rss_mib()
    layers_of_new_sizes(100)
    layers_of_new_sizes(200)
    assert ctx.pipelines <= 8 and ctx.pipelines_made >= 90
    assert rss_mib() - before < 40, f"{rss_mib() - before:.0f} MiB more after 60 layers of new sizes"


def test_pipeline_cache_count_that_is_not_a_number_is_refused(monkeypatch):
    monkeypatch.setenv("VKNORM_PIPELINE_CACHE_COUNT", "-1")
    with pytest.raises(ValueError, match="VKNORM_PIPELINE_CACHE_COUNT=-1: expected a whole number of pipelines"):
        _core.Context.create(0)


def test_fence_polling_defaults_to_off_on_cpu_devices_and_on_for_gpus():
    ctx = _core.Context.create(0)
    assert ctx.fence_spin_us == (0 if ctx.info["type"] == "cpu" else 1000)


@pytest.mark.parametrize("spin_us", ["1", "10000000"])
def test_forwards_are_right_whether_the_wait_ends_polling_or_blocking(monkeypatch, spin_us):
    # 1 us: the poll gives up and the blocking wait ends it; 10 s: every submission ends while polling.
    monkeypatch.setenv("VKNORM_FENCE_SPIN_US", spin_us)
    ctx = _core.Context.create(0)
    monkeypatch.delenv("VKNORM_FENCE_SPIN_US")
    assert ctx.fence_spin_us == int(spin_us)
    layer = layer_on(ctx, "LayerNorm", 256)
    rng = np.random.default_rng(7)
    for rows in (3, 197, 1024):
        x = rng.standard_normal((rows, 256)).astype(np.float32)
        check_close(layer(x), ref_of(layer, x), FP32_TOL, f"{rows} rows, spin {spin_us} us")
        v = vknorm.to_device(x, device=ctx)
        layer.forward_inplace(v)
        check_close(v.numpy(), ref_of(layer, x), FP32_TOL, f"{rows} rows resident, spin {spin_us} us")


def test_fence_polling_time_that_is_not_a_number_is_refused(monkeypatch):
    monkeypatch.setenv("VKNORM_FENCE_SPIN_US", "1ms")
    with pytest.raises(ValueError, match="VKNORM_FENCE_SPIN_US=1ms: expected a whole number of microseconds"):
        _core.Context.create(0)


def test_results_read_from_uncached_mapped_memory_are_copied_out_and_right(monkeypatch):
    """Where the host maps memory uncached (write-combined, some integrated GPUs), a result is copied out in one go
    before it is converted. VKNORM_TUNE_UNCACHED_MAPPING=1 takes that path on any device: every way a result comes
    back (numpy forward whole and in pieces, forward_add with its sum, VkMat.numpy, download) gives exactly what a
    context reading it in place gives."""
    plain = _core.Context.create(0)
    monkeypatch.setenv("VKNORM_TUNE_UNCACHED_MAPPING", "1")
    uncached = _core.Context.create(0)
    monkeypatch.delenv("VKNORM_TUNE_UNCACHED_MAPPING")
    assert not uncached.host_reads_cached
    rng = np.random.default_rng(8)
    x = rng.standard_normal((24, 8, 96)).astype(np.float32)
    r = rng.standard_normal((24, 8, 96)).astype(np.float32)
    results = []
    for ctx in (plain, uncached):
        layer = layer_on(ctx, "LayerNorm", 96)
        out = {"forward": layer(x), "forward fp16": layer(x, option=vknorm.Option(use_fp16_storage=True))}
        monkeypatch.setenv("VKNORM_MAX_BUFFER_BYTES", "16384")  # 72 KiB of float32: pieces of 16 KiB at most
        out["forward in pieces"] = layer(x)
        assert layer.last_dispatch["pieces"] > 1, layer.last_dispatch
        monkeypatch.delenv("VKNORM_MAX_BUFFER_BYTES")
        out["forward_add"], out["sum"] = layer.forward_add(x, r, return_sum=True)
        v = vknorm.to_device(x, device=ctx)
        out["VkMat.numpy"] = v.numpy()
        out["download"] = v.download().convert_packing(1).numpy()
        results.append(out)
    for k in results[0]:
        np.testing.assert_array_equal(results[1][k], results[0][k], err_msg=k)
    check_close(results[1]["forward"], ref_of(layer, x), FP32_TOL, "uncached")
    check_close(results[1]["forward in pieces"], ref_of(layer, x), FP32_TOL, "uncached, in pieces")


@pytest.mark.parametrize("spin_us", ["10000000", str(2 ** 63 - 1), str(2 ** 64 - 1)], ids=["10s", "2^63-1", "2^64-1"])
def test_a_fence_polling_time_past_the_clocks_range_polls_until_done(monkeypatch, spin_us):
    """VKNORM_FENCE_SPIN_US takes any whole number up to 2^64 - 1: a time longer than the steady clock can add to
    now polls until the submission is done, as 10 s does, never wrapping round to a deadline already past (that
    would block at once: no polling at all). Told apart by the calling thread's CPU time over one submission of 16
    back-to-back forwards of 512x4096 (forward_repeated), tens of ms on lavapipe: polling spends most of the wall
    time on that thread (55-100% measured: on 2 cores it shares them with lavapipe's threads), blocking little
    (1-2% measured, once 13% on a loaded 2-core machine: the control with 0): >= 35% against < 30%.
    Only on CPU devices: a GPU driver's own blocking wait may spin (NVIDIA's H200 driver: 60% busy blocking)."""
    if _core.Context.create(0).info["type"] != "cpu":
        missing("a GPU driver's blocking fence wait may itself spin: CPU time cannot tell polling from blocking "
                "(lavapipe's can)")
    rows, reps = 512, 16
    x = np.random.default_rng(3).standard_normal((rows, 4096)).astype(np.float32)

    def busy_shares(spin, rounds=3):
        # Several rounds: other processes on the machine take the cores now and then, pushing a round either way.
        monkeypatch.setenv("VKNORM_FENCE_SPIN_US", spin)
        ctx = _core.Context.create(0)
        monkeypatch.delenv("VKNORM_FENCE_SPIN_US")
        assert ctx.fence_spin_us == int(spin)
        layer = vknorm.LayerNorm(affine_size=4096, eps=1e-5, affine=False, device=ctx)
        v = vknorm.to_device(x, device=ctx)
        opt = vknorm.Option._of(vknorm.Option())
        layer._layer.forward_repeated(v, opt, 0, 1)  # pipelines built outside the measurement
        shares = []
        for _ in range(rounds):
            wall, cpu = time.perf_counter(), time.thread_time()
            layer._layer.forward_repeated(v, opt, 0, reps)
            shares.append((time.thread_time() - cpu) / (time.perf_counter() - wall))
        return shares

    control = busy_shares("0")
    assert min(control) < 0.3, control  # blocking waits take (almost) no CPU time of this thread
    polling = busy_shares(spin_us)
    assert max(polling) >= 0.35, polling

"""Reliability scenarios of vknorm's own runtime and of `vknorm check`, shared by tests/test_reliability*.py
and tools/reliability_report.py (which produced the figures in docs/reliability.md); the in-graph ones
are in tests/reliability_graph.py.

Nothing here asserts: every scenario returns the figures it measured and the tests decide.
`python tests/reliability_lib.py check-worker` is the process the `vknorm check` fuzz talks to (below).
"""
from __future__ import annotations

import gc
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import List, Optional

from validation_layer import json_from_stdout, only_ncnn_clone_hazards

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
# Each committed model and an --input shape it takes (tests/test_ncnn_models.py).
MODELS = {k: v for k, v in json.loads((Path(__file__).resolve().parent.parent / "tests" / "data" / "models.json").read_text()).items() if not k.startswith("_")}


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ------------------------------------------------------------------------------------------- lifetime

def lifetime(n: int = 10_000, seed: int = 0, warmup: int = 1_000, check_every: int = 97) -> dict:
    """n forwards on a context of its own: shapes and ops vary, float32 and float16 storage, numpy in
    and out and VkMat (upload, forward, download) alternate. Device memory (vknorm's counters) is
    sampled after every forward and must stay at the weights' bytes; RSS is taken after `warmup`
    forwards and at the end. Every check_every-th result is compared with the float64 reference."""
    import numpy as np

    import vknorm
    from vknorm import _core

    sys.path.insert(0, str(REPO / "tests"))
    from reference import max_abs_err, norm64, scale, storage_rule

    rng = np.random.default_rng(seed)
    ctx = _core.Context.create(0)
    base = (ctx.device_bytes_in_use, ctx.live_buffers)
    widths = (1, 3, 4, 8, 16, 24, 61, 64, 128)
    layers = {}
    for w in widths:
        for op, cls in (("LayerNorm", vknorm.LayerNorm), ("RMSNorm", vknorm.RMSNorm)):
            layer = cls(affine_size=w, eps=1e-5, device=ctx)
            gamma = rng.uniform(0.5, 1.5, w).astype(np.float32)
            beta = rng.uniform(-0.5, 0.5, w).astype(np.float32)
            layer.load_model(gamma, beta) if op == "LayerNorm" else layer.load_model(gamma)
            layers[(op, w)] = (layer, gamma, beta)
    options = (vknorm.Option(), vknorm.Option(use_fp16_storage=True))
    steady = None
    worst_checked = {False: 0.0, True: 0.0}  # by float16 storage
    worst_excess = {False: 0.0, True: 0.0}  # the storage rule's error (float16: past the output's rounding) / scale
    checked = {False: 0, True: 0}
    drift = 0  # forwards after which device memory differed from the steady state
    t0 = time.perf_counter()
    rss_warm = None
    for i in range(n):
        op = ("LayerNorm", "RMSNorm")[i % 2]
        w = widths[int(rng.integers(len(widths)))]
        dims = int(rng.integers(1, 5))
        lead = [int(v) for v in rng.integers(1, 6, size=dims - 1)]
        shape = tuple(lead) + (w,)
        fp16 = bool(i & 2)
        layer, gamma, beta = layers[(op, w)]
        x = rng.standard_normal(shape).astype(np.float16 if fp16 else np.float32)
        opt = options[fp16]
        if i % 3 == 2:  # VkMat: no host round trip inside the forward
            v = vknorm.to_device(x, option=opt, device=ctx)
            layer.forward_inplace(v, option=opt)
            y = v.download().numpy().reshape(shape)
            del v
        else:
            y = layer(x, option=opt)
        if i % check_every == 0:
            ref = norm64(op, x, w, 1e-5, True, gamma, beta if op == "LayerNorm" else None)  # x: the values read
            worst_checked[fp16] = max(worst_checked[fp16], max_abs_err(y, ref) / scale(ref))
            worst_excess[fp16] = max(worst_excess[fp16], storage_rule(y, ref, fp16)[0] / scale(ref))
            checked[fp16] += 1
        now = (ctx.device_bytes_in_use, ctx.live_buffers)
        if i + 1 == warmup:  # every layer has run (and holds its weights) long before this
            gc.collect()
            rss_warm = rss_bytes()
            steady = now
        elif steady is not None and now != steady:
            drift += 1
    seconds = time.perf_counter() - t0
    gc.collect()
    rss_end = rss_bytes()
    after_loop = (ctx.device_bytes_in_use, ctx.live_buffers)
    peak = ctx.device_bytes_peak
    del layer, gamma, beta
    layers.clear()
    gc.collect()
    after_drop = (ctx.device_bytes_in_use, ctx.live_buffers)
    return {
        "forwards": n, "seconds": seconds, "ms_per_forward": 1e3 * seconds / n,
        "baseline_bytes": base[0], "baseline_buffers": base[1],
        "steady_bytes": steady[0] if steady else None, "steady_buffers": steady[1] if steady else None,
        "after_loop_bytes": after_loop[0], "after_loop_buffers": after_loop[1],
        "after_drop_bytes": after_drop[0], "after_drop_buffers": after_drop[1],
        "peak_bytes": peak, "drift_forwards": drift,
        "rss_warm": rss_warm, "rss_end": rss_end,
        "rss_growth": (rss_end - rss_warm) / rss_warm if rss_warm else None,
        "checked": checked[False] + checked[True], "worst_rel_err": max(worst_checked.values()),
        "checked_fp32": checked[False], "worst_rel_err_fp32": worst_checked[False],
        "checked_fp16": checked[True], "worst_rel_err_fp16": worst_checked[True],
        "worst_rel_excess_fp16": worst_excess[True],
    }


# ---------------------------------------------------------------------------------------- concurrency

def _ln(affine_size: int, seed: int, device=None):
    import numpy as np

    import vknorm

    rng = np.random.default_rng(seed)
    layer = vknorm.LayerNorm(affine_size=affine_size, eps=1e-5, device=device)
    gamma = rng.uniform(0.5, 1.5, affine_size).astype(np.float32)
    beta = rng.uniform(-0.5, 0.5, affine_size).astype(np.float32)
    layer.load_model(gamma, beta)
    return layer, gamma, beta


def threads_vs_serial(n_threads: int = 8, per_thread: int = 50, seed: int = 1) -> dict:
    """One LayerNorm, n_threads Python threads each running per_thread forwards at once (numpy and
    VkMat, float32 and float16 storage, varying shapes); every result must be bit-identical to the
    same forward run alone."""
    import numpy as np

    import vknorm

    layer, _, _ = _ln(64, seed)
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(n_threads * per_thread):
        shape = (int(rng.integers(1, 40)), 64) if i % 2 else (int(rng.integers(1, 5)), int(rng.integers(1, 9)), 64)
        jobs.append((rng.standard_normal(shape).astype(np.float32), bool(i % 4 >= 2), i % 3 == 0))

    def run(job):
        x, fp16, vkmat = job
        opt = vknorm.Option(use_fp16_storage=fp16)
        if vkmat:
            v = vknorm.to_device(x, option=opt)
            layer.forward_inplace(v, option=opt)
            return v.download().numpy().reshape(x.shape)
        return layer(x, option=opt)

    serial = [run(j) for j in jobs]
    results, errors, seconds, hung = run_in_threads(n_threads, jobs, lambda t, job: run(job), join_s=120)
    mismatches = sum(1 for a, b in zip(serial, results)
                     if b is None or a.dtype != b.dtype or not np.array_equal(a, b, equal_nan=True))
    return {"threads": n_threads, "forwards": len(jobs), "mismatches": mismatches, "errors": errors,
            "hung_threads": hung, "seconds": seconds}


def run_in_threads(n_threads: int, jobs: list, run, join_s: float) -> tuple:
    """The jobs in n_threads equal shares, the threads released together, thread t calling run(t, job) on
    its share in order: (results in job order, None where none came; errors; seconds; threads still
    running after join_s each)."""
    per_thread = len(jobs) // n_threads
    results: List[Optional[object]] = [None] * len(jobs)
    errors: List[str] = []
    start = threading.Barrier(n_threads)

    def worker(t: int):
        try:
            start.wait()
            for k in range(t * per_thread, (t + 1) * per_thread):
                results[k] = run(t, jobs[k])
        except BaseException as e:  # noqa: BLE001 - reported, not raised in a thread
            errors.append(f"{type(e).__name__}: {e}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    return results, errors, time.perf_counter() - t0, sum(t.is_alive() for t in threads)


def loads_while_forwarding(forwarders: int = 4, per_thread: int = 40, seed: int = 2) -> dict:
    """Forwards on one layer while another thread keeps swapping its weights (load_model), reloading
    its params (load_param) and dropping its pipelines (destroy_pipeline): every result must be exactly
    the result of one of the two weight sets, never a mix, never garbage."""
    import numpy as np

    layer, g1, b1 = _ln(64, seed)
    rng = np.random.default_rng(seed + 1)
    g2 = rng.uniform(-2, 2, 64).astype(np.float32)
    b2 = rng.uniform(-2, 2, 64).astype(np.float32)
    x = rng.standard_normal((33, 64)).astype(np.float32)
    ref1 = layer(x)
    layer.load_model(g2, b2)
    ref2 = layer(x)
    counts = {"weights1": 0, "weights2": 0, "other": 0}
    errors: List[str] = []
    done = threading.Event()
    lock = threading.Lock()

    def forward():
        try:
            for _ in range(per_thread):
                y = layer(x)
                key = "weights1" if np.array_equal(y, ref1) else "weights2" if np.array_equal(y, ref2) else "other"
                with lock:
                    counts[key] += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(f"{type(e).__name__}: {e}")

    loads = 0

    def loader():
        nonlocal loads
        try:
            i = 0
            while not done.is_set():
                if i % 7 == 3:
                    layer.load_param({0: 64, 1: 1e-5, 2: 1})  # same params: a new snapshot, same results
                elif i % 11 == 5:
                    layer._layer.destroy_pipeline()
                layer.load_model(*((g1, b1) if i % 2 else (g2, b2)))
                loads += 1
                i += 1
                time.sleep(0.0005)
        except BaseException as e:  # noqa: BLE001
            errors.append(f"loader: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=forward) for _ in range(forwarders)]
    lt = threading.Thread(target=loader)
    lt.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    lt.join(30)
    return {"forwards": forwarders * per_thread, "loads": loads, **counts, "errors": errors,
            "hung_threads": sum(t.is_alive() for t in threads + [lt])}


def gil_released(shape=(8, 1024, 1024), seed: int = 3) -> dict:
    """A long forward on the main thread while another Python thread counts: the counter must advance
    in the middle half of the forward (it could not if the GIL were held during GPU work)."""
    import numpy as np

    import vknorm

    layer = vknorm.LayerNorm(affine_size=0, affine=False)
    x = np.random.default_rng(seed).random(shape, dtype=np.float32)
    layer(x[:1])  # pipelines and device outside the measured call
    return thread_progress_during(lambda: layer(x))


def thread_progress_during(call) -> dict:
    """call() on the main thread while another Python thread counts: how often the counter advanced in the
    middle half of the call (never, where the call holds the GIL throughout)."""
    stamps: List[float] = []
    stop = threading.Event()

    def count():
        n = 0
        while not stop.is_set():
            n += 1
            if n % 200 == 0:
                stamps.append(time.perf_counter())

    t = threading.Thread(target=count)
    t.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    call()
    t1 = time.perf_counter()
    stop.set()
    t.join()
    lo, hi = t0 + 0.25 * (t1 - t0), t1 - 0.25 * (t1 - t0)
    return {"forward_seconds": t1 - t0, "stamps_in_middle": sum(lo <= s <= hi for s in stamps),
            "stamps_total": len(stamps)}


# --------------------------------------------------------------------------------------- large tensors

def largest(gib: float = 1.0, width: int = 1024, vkmat: bool = False, sample_every: int = 257) -> dict:
    """A float32 tensor of `gib` GiB, rows of `width` (LayerNorm over rows, affine), far beyond
    lavapipe's maxStorageBufferRange (128 MiB): processed in pieces, from numpy or as a VkMat resident
    on the device. Rows on both sides of every piece boundary and a sample of the others are compared
    with the float64 reference; every value must be finite."""
    import numpy as np

    import vknorm
    from vknorm import _core

    sys.path.insert(0, str(REPO / "tests"))
    from reference import max_abs_err, norm64, scale

    rows = int(gib * (1 << 30)) // (4 * width)
    rng = np.random.default_rng(4)
    x = rng.random((rows, width), dtype=np.float32)
    x *= 4
    x -= 1
    layer, gamma, beta = _ln(width, 5)
    t0 = time.perf_counter()
    if vkmat:
        v = vknorm.to_device(x)
        t1 = time.perf_counter()
        layer.forward_inplace(v)
        t2 = time.perf_counter()
    else:
        t1 = time.perf_counter()
        y = layer(x)
        t2 = time.perf_counter()
    info = layer.last_dispatch
    out = {"gib": rows * width * 4 / (1 << 30), "rows": rows, "width": width, "vkmat": vkmat,
           "pieces": info["pieces"], "forward_seconds": t2 - t1, "total_seconds": t2 - t0,
           "max_storage_buffer_range": vknorm.device_info()["max_storage_buffer_range"]}
    if vkmat:
        y = v.download().numpy()
        del v
    # Rows on both sides of every piece boundary, and a sample of the rest, against float64.
    pack = 4 if rows % 4 == 0 else 1  # as the default Option packs rows
    plan = _core.plan_pieces(2, width, rows // pack, 1, 1, pack, 4, width, True, out["max_storage_buffer_range"])
    out["planned_pieces"] = len(plan)
    edges = [p["offset"] // (4 * width) + d for p in plan for d in (-1, 0)]  # first rows of pieces, and before
    sample = sorted({r for r in list(range(0, rows, sample_every)) + edges + [rows - 1] if 0 <= r < rows})
    ref = norm64("LayerNorm", x[sample], width, 1e-5, True, gamma, beta)
    out["sampled_rows"] = len(sample)
    out["sampled_rel_err"] = max_abs_err(y[sample], ref) / scale(ref)
    out["all_finite"] = bool(np.isfinite(y).all())
    return out


# ------------------------------------------------------------------------------ validation: lifecycle

def lifecycle() -> dict:
    """Everything vknorm can create, on a context of its own and on the default one, then all of it
    dropped: both devices and the instance are destroyed inside this call, with the validation layer
    watching (run it in a process of its own, VKNORM_VALIDATION=1; leaks are reported there)."""
    import numpy as np

    import vknorm
    from vknorm import _core

    rng = np.random.default_rng(0)
    ctx = _core.Context.create(0)
    ln = vknorm.LayerNorm(affine_size=64, eps=1e-5, device=ctx)
    ln.load_model(rng.uniform(0.5, 1.5, 64), rng.uniform(-1, 1, 64))
    rms = vknorm.RMSNorm(affine_size=48, device=ctx)
    rms.load_model(rng.uniform(0.5, 1.5, 48))
    plain = vknorm.LayerNorm(affine_size=0, affine=False, device=ctx)
    x = rng.standard_normal((12, 64)).astype(np.float32)
    forwards = 0
    for fp16 in (False, True):
        for path in ("auto", "subgroup", "workgroup", "split"):
            opt = vknorm.Option(use_fp16_storage=fp16, path=path)
            ln(x, option=opt)
            rms(rng.standard_normal((3, 5, 48)).astype(np.float32), option=opt)
            v = vknorm.to_device(x, option=opt, device=ctx)
            ln.forward_inplace(v, option=opt)
            v.download()
            forwards += 3
    plain(rng.standard_normal((2, 3, 300, 70)).astype(np.float32))
    v = vknorm.to_device(x, device=ctx)
    ln._layer.forward_repeated(v, vknorm.Option()._native(), 2, 3)
    _core.copy_repeated(v, 1, 2, True)
    _core.copy_repeated(v, 1, 2, False)
    os.environ["VKNORM_MAX_BUFFER_BYTES"] = "4096"  # pieces, numpy and VkMat
    try:
        ln(rng.standard_normal((40, 64)).astype(np.float32))
        big = vknorm.to_device(rng.standard_normal((40, 64)).astype(np.float32), device=ctx)
        ln.forward_inplace(big)
        refused = 0
        try:
            plain(rng.standard_normal(8192).astype(np.float32))  # one group of 32 KiB > 4096 bytes
        except ValueError:
            refused += 1
    finally:
        del os.environ["VKNORM_MAX_BUFFER_BYTES"]
    ln.load_model(rng.uniform(0.5, 1.5, 64), rng.uniform(-1, 1, 64))
    ln.load_param({0: 64, 1: 1e-3, 2: 1})
    ln.load_model(np.ones(64), np.zeros(64))
    ln(x)
    ln._layer.destroy_pipeline()
    ln(x)
    threads = [threading.Thread(target=lambda: [ln(x) for _ in range(5)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.environ["VKNORM_MAX_DEVICE_BYTES"] = str(64 << 10)  # a second device, with a memory cap
    try:
        capped = _core.Context.create(0)
    finally:
        del os.environ["VKNORM_MAX_DEVICE_BYTES"]
    small = vknorm.LayerNorm(affine_size=0, affine=False, device=capped)
    try:
        small(np.ones((1, 256, 256), np.float32))
    except MemoryError:
        refused += 1
    small(np.ones((1, 16, 16), np.float32))
    del ln, rms, plain, small, v, big, threads
    gc.collect()
    own = [ctx.device_bytes_in_use, ctx.live_buffers, capped.device_bytes_in_use, capped.live_buffers]
    del ctx, capped  # vkDestroyDevice, twice
    gc.collect()
    d = vknorm.LayerNorm(affine_size=64)  # the default context
    d.load_model(np.ones(64), np.zeros(64))
    d(x)
    d(x, option=vknorm.Option(use_fp16_storage=True))
    del d
    gc.collect()
    _core.Context.release_default()  # vkDestroyDevice, then (no context left) vkDestroyInstance
    return {"messages": _core.validation_messages(), "own": own, "refused": refused,
            "validation": _core.validation_enabled()}


def overhead(n: int = 3000, seed: int = 6) -> dict:
    """Milliseconds per small forward (4 x 16), numpy in/out and VkMat, after warm-up."""
    import numpy as np

    import vknorm

    layer, _, _ = _ln(16, seed)
    x = np.random.default_rng(seed).standard_normal((4, 16)).astype(np.float32)
    v = vknorm.to_device(x)
    out = {}
    for name, f in (("numpy_ms", lambda: layer(x)), ("vkmat_ms", lambda: layer.forward_inplace(v)),
                    ("numpy_fp16_ms", lambda: layer(x, option=vknorm.Option(use_fp16_storage=True)))):
        for _ in range(100):
            f()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        out[name] = 1e3 * (time.perf_counter() - t0) / n
    return out


def huge_vkmat_refused(gib: float = 2.5) -> dict:
    """A resident VkMat larger than the device's memory heap (lavapipe: 2 GiB): MemoryError before any
    allocation is attempted (an allocation past the heap is invalid usage, not a driver failure)."""
    import numpy as np

    import vknorm
    from vknorm import _core

    ctx = _core.Context.create(0)
    x = np.zeros(int(gib * (1 << 30)) // 2, np.float16)
    try:
        vknorm.to_device(x.reshape(-1, 1024), option=vknorm.Option(use_fp16_storage=True), device=ctx)
        return {"refused": False}
    except MemoryError as e:
        return {"refused": True, "message": str(e), "live_buffers": ctx.live_buffers,
                "peak": ctx.device_bytes_peak}


# ---------------------------------------------------------------------- garbled models for `vknorm check`

def model_files(name: str):
    return DATA / f"{name}.ncnn.param", DATA / f"{name}.ncnn.bin"


PARAM_MUTATIONS = ("truncate", "drop_line", "dup_line", "swap_lines", "token", "norm_param", "flip_byte",
                   "insert_bytes", "header")
BIN_MUTATIONS = ("truncate", "append", "flip_bytes", "special_floats", "moderate_floats")
_TOKENS = ("0", "-1", "1", "3", "7767517", "99999999999", "2147483648", "-2147483649", "nan", "inf", "-inf",
           "1e40", "1e-45", "0.0", "abc", "=", "0=", "=1", "1=2=3", "\"", "\"x y\"", "LayerNorm", "RMSNorm", "Input",
           "in0", "\t", "#")


def garble_param(text: bytes, kind: str, a: int, b: int, junk: bytes) -> bytes:
    """One mutation of a .param, positioned by the integers a, b (taken modulo what they index)."""
    lines = text.split(b"\n")
    n = len(lines)
    if kind == "truncate":
        return text[: a % (len(text) + 1)]
    if kind == "drop_line":
        del lines[a % n]
    elif kind == "dup_line":
        lines.insert(a % n, lines[b % n])
    elif kind == "swap_lines":
        i, j = a % n, b % n
        lines[i], lines[j] = lines[j], lines[i]
    elif kind in ("token", "norm_param", "header"):
        if kind == "norm_param":
            rows = [i for i, ln in enumerate(lines) if ln.split()[:1] in ([b"LayerNorm"], [b"RMSNorm"])]
            i = rows[a % len(rows)] if rows else a % n
            tok = lines[i].split()
            pid = (b"0=", b"1=", b"2=", b"3=", b"-23300=")[b % 5]
            value = (_TOKENS + ("0", "1", "2", "64", "-64", "1e-30", "0.5", "100000000"))[(a // 7) % (len(_TOKENS) + 8)]
            tok = [t for t in tok if not t.startswith(pid)] + [pid + value.encode()]
            lines[i] = b" ".join(tok)
        else:
            i = (a % 2) % n if kind == "header" else a % n
            tok = lines[i].split() or [b""]
            tok[b % len(tok)] = _TOKENS[(a // 3) % len(_TOKENS)].encode()
            lines[i] = b" ".join(tok)
    elif kind == "flip_byte":
        data = bytearray(text)
        if data:
            data[a % len(data)] ^= 1 << (b % 8)
        return bytes(data)
    elif kind == "insert_bytes":
        k = a % (len(text) + 1)
        return text[:k] + junk + text[k:]
    return b"\n".join(lines)


def garble_bin(data: bytes, kind: str, a: int, b: int, junk: bytes) -> bytes:
    """One mutation of a .bin (float32 weights, ncnn's layout), positioned by a, b."""
    import numpy as np

    if kind == "truncate":
        return data[: a % (len(data) + 1)]
    if kind == "append":
        return data + junk
    buf = bytearray(data)
    if not buf:
        return data
    if kind == "flip_bytes":
        for k in range(1 + b % 4):
            buf[(a + 7919 * k) % len(buf)] ^= 1 << ((b + k) % 8)
        return bytes(buf)
    words = np.frombuffer(bytes(buf[: len(buf) // 4 * 4]), dtype=np.float32).copy()
    if kind == "special_floats":
        specials = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -0.0, 1e-40, 3.4e38], np.float32)
        for k in range(1 + b % 3):
            words[(a + 104729 * k) % words.size] = specials[(b + k) % specials.size]
    elif kind == "moderate_floats":  # garbled but plausible weights: finite, |w| <= 4
        rng = np.random.default_rng(a)
        i = a % words.size
        m = min(words.size - i, 1 + b % 512)
        words[i:i + m] = rng.uniform(-4, 4, m).astype(np.float32)
    return words.tobytes() + bytes(buf[len(buf) // 4 * 4:])


def classify(result: dict) -> str:
    """What one `vknorm check` run came to: ok (0), mismatch (1), error (2, one clear line on stderr), or a
    failure: crash (a signal), hang (past its time bound), validation (a Vulkan validation message; stock
    ncnn's own copy hazard in ncnn's instance is not one: only_ncnn_clone_hazards), garbled (anything else:
    a traceback, several lines, another exit status)."""
    if result.get("timed_out"):
        return "hang"
    if result.get("signal"):
        return "crash"
    rc, err = result.get("rc"), result.get("stderr", "")
    log = result.get("validation_log", "")
    if only_ncnn_clone_hazards(log):
        log = ""  # stock ncnn's own copy hazard, not vknorm's (validation_layer.only_ncnn_clone_hazards)
    if "vknorm: validation:" in err or log.strip():  # vknorm's or ncnn's instance
        return "validation"
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("vknorm: validation:")]
    if "Traceback" in err:
        return "garbled"
    if rc == 0:
        return "ok"
    if rc == 1:
        return "mismatch"
    if rc == 2 and len(lines) == 1 and lines[0].startswith("vknorm check: error: ") and len(lines[0]) > 30:
        return "error"
    return "garbled"


def explain_mismatch(param: str, bin_: str, dims: str, seed: int = 0) -> List[dict]:
    """For a `vknorm check` exit 1: why each LayerNorm/RMSNorm output differed. Runs the model in this
    process (pyncnn) twice stock and once with vknorm on the same seeded input, and per layer records:
    the largest magnitude going in and coming out of the stock layer (`overflow`: |v| >= 1e18, inf or
    NaN, where float32 summation order and vknorm's pivoted statistics legitimately differ from ncnn's
    sums), whether two stock runs fed the layer different inputs (`ncnn_nondeterministic`: garbled shapes
    make ncnn read memory it never wrote), and whether vknorm's output equals the reference algorithm on
    the very input vknorm's layer received (`self_consistent`). A mismatch is explained when the layer
    is self-consistent or in overflow range."""
    import ncnn
    import numpy as np

    from vknorm import check
    from vknorm import ncnn as vkncnn

    model = check.parse_param(param)
    data = Path(bin_).read_bytes()
    shape = check.parse_dims(dims)
    x = np.ascontiguousarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))
    blobs = [b for layer in model.norms for b in (layer.bottoms[0], layer.tops[0])]

    def run(with_vknorm: bool):
        net = check._new_net(ncnn)
        try:
            reg = vkncnn.register(net) if with_vknorm else None
            check._load(net, model, bin_, data, "explain")
            got = check._extract(net, {model.inputs[0]: x}, blobs, "explain")
            own = {}
            if reg is not None:
                for layer in model.norms:
                    mine = reg.by_name(layer.name)
                    if mine is not None and mine.norm is not None:
                        own[layer.name] = mine.norm(got[layer.bottoms[0]], device="cpu")  # ncnn's algorithm
            return got, own
        finally:
            with vkncnn.quiet_stderr():
                net.clear()

    stock, _ = run(False)
    again, _ = run(False)
    vk, own = run(True)
    out = []
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN blobs
        for layer in model.norms:
            xi, yo = stock[layer.bottoms[0]], stock[layer.tops[0]]
            big = lambda a: bool((~np.isfinite(a)).any() or (np.abs(a) >= 1e18).any())  # noqa: E731
            ref, got = own.get(layer.name), vk[layer.tops[0]]
            consistent = ref is not None and check.max_abs_err(ref, got) <= check.ATOL_FP32 * max(
                1.0, float(np.nanmax(np.abs(np.where(np.isfinite(ref), ref, 0)))) if ref.size else 1.0)
            rec = {"layer": layer.name, "max_in": float(np.nanmax(np.abs(xi))) if xi.size else 0.0,
                   "max_out": float(np.nanmax(np.abs(yo))) if yo.size else 0.0, "overflow": big(xi) or big(yo),
                   "ncnn_nondeterministic": check.max_abs_err(xi, again[layer.bottoms[0]]) > 0,
                   "self_consistent": bool(consistent)}
            rec["explained"] = rec["overflow"] or rec["self_consistent"]
            out.append(rec)
    return out


def explain_mismatch_vulkan(param: str, bin_: str, dims: str, seed: int = 0, fp16: bool = False) -> List[dict]:
    """For a `vknorm check --vulkan` exit 1: why each vknorm layer failed the rule (its output against float64
    of the very input it saw). Runs the model with vknorm inside ncnn's graph (vknorm.graph) on the check's
    seeded input and per layer records the largest magnitude going in and out (`overflow`: |v| >= 1e18, inf
    or NaN, past what float32 statistics hold: there vknorm's pivoted sums and float64 legitimately part),
    and whether vknorm's output equals ncnn's float32 algorithm (vknorm's CPU reference) on that input within
    the rule's tolerance scaled to the output (`self_consistent`: the float32 algorithm itself cannot meet
    float64 there, e.g. a group whose spread vanishes next to its mean). Explained when either holds."""
    import numpy as np

    from vknorm import check
    from vknorm import graph
    from vknorm.layers import GroupNorm, InstanceNorm, LayerNorm, RMSNorm

    model = check.parse_param(param)
    shape = check.parse_dims(dims)
    x = np.ascontiguousarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))
    net = check._graph_load(graph, model, bin_, os.path.getsize(bin_), vknorm=True, vulkan=True, fp16=fp16,
                            label="explain")
    blobs = [b for layer in model.norms for b in (layer.bottoms[0], layer.tops[0])]
    try:
        got = check._graph_extract(graph, net, {model.inputs[0]: x}, blobs, "explain")
        infos = {i["name"]: i for i in net.vknorm_layers()}
    finally:
        net.clear()
    out = []
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for layer in model.norms:
            info = infos.get(layer.name)
            xi, yo = got[layer.bottoms[0]], got[layer.tops[0]]
            if fp16:
                xi = xi.astype(np.float16).astype(np.float32)
            big = lambda a: bool((~np.isfinite(a)).any() or (np.abs(a) >= 1e18).any())  # noqa: E731
            ref = None
            if info is not None:
                kw = dict(eps=float(info["eps"]), affine=bool(info["affine"]))
                if info["type"] == "GroupNorm":
                    norm = GroupNorm(group=int(info["group"]), channels=int(info["channels"]), **kw)
                elif info["type"] == "InstanceNorm":
                    norm = InstanceNorm(channels=int(info["channels"]), **kw)
                else:
                    norm = (LayerNorm if info["type"] == "LayerNorm" else RMSNorm)(affine_size=int(info["affine_size"]), **kw)
                if norm.affine:
                    norm.load_model(info["gamma"]) if info["type"] == "RMSNorm" else norm.load_model(info["gamma"], info["beta"])
                try:
                    ref = norm(xi, device="cpu")  # ncnn's float32 algorithm
                except (ValueError, TypeError):
                    ref = None
            atol = check.ATOL_FP16 if fp16 else check.ATOL_FP32
            scale = float(np.nanmax(np.abs(np.where(np.isfinite(ref), ref, 0)))) if ref is not None and ref.size else 1.0
            consistent = ref is not None and check.max_abs_err(ref, yo) <= atol * max(1.0, scale) + (
                2.0 ** -10 * max(1.0, scale) if fp16 else 0.0)
            rec = {"layer": layer.name, "max_in": float(np.nanmax(np.abs(xi))) if xi.size else 0.0,
                   "max_out": float(np.nanmax(np.abs(yo))) if yo.size else 0.0, "overflow": big(xi) or big(yo),
                   "self_consistent": bool(consistent)}
            rec["explained"] = rec["overflow"] or rec["self_consistent"]
            out.append(rec)
    return out


def explain_failing(worker: "CheckWorker", res: dict, param: str, bin_: str, dims: str, vulkan: bool) -> dict:
    """{failing layer: its explain record} for an exit-1 case, run in a forked child of the worker. A model
    output past its bound (--vulkan) is one more record, "model outputs": explained only where a norm's input or
    output left float32's range (overflow), which no two float32 runs keep alike."""
    report = json_from_stdout(res["stdout"])
    failing = {r["name"] for r in report["layers"] if not r["ok"]}
    fn = "explain_mismatch_vulkan" if vulkan else "explain_mismatch"
    ans = worker.call(fn, {"param": param, "bin_": bin_, "dims": dims})
    why = {e["layer"]: e for e in ans.get("result", [])}
    out = {n: why.get(n, {"layer": n, "explained": False, "overflow": False, "self_consistent": False,
                          "ncnn_nondeterministic": False, "why_not": ans.get("error") or ans.get("signal")})
           for n in failing}
    if report.get("outputs_ok") is False:
        over = any(e.get("overflow") for e in why.values())
        out["model outputs"] = {"layer": "model outputs", "explained": over, "overflow": over,
                                "self_consistent": False, "ncnn_nondeterministic": False,
                                "judgements": report.get("output_judgements"),
                                "why_not": None if "result" in ans else ans.get("error") or ans.get("signal")}
    return out


def param_bitflips(stride: int = 5, timeout: float = 60.0, vulkan: bool = False) -> dict:
    """Every single-bit flip of every committed .param: those `vknorm check`'s reader accepts, one in
    `stride` of them (in order) through the whole CLI; outcomes counted, every exit 1 explained."""
    import collections

    from vknorm import check
    from vknorm.cli import UsageError

    counts = collections.Counter()
    failures: List[str] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        accepted = []
        for name in sorted(MODELS):
            text = model_files(name)[0].read_bytes()
            for pos in range(len(text)):
                for bit in range(8):
                    counts["flips"] += 1
                    path = os.path.join(d, f"{name}_{pos}_{bit}.param")
                    Path(path).write_bytes(garble_param(text, "flip_byte", pos, bit, b""))
                    try:
                        check.parse_param(path)
                    except UsageError:
                        counts["refused_by_reader"] += 1
                        os.unlink(path)
                        continue
                    accepted.append((name, path))
        counts["accepted_by_reader"] = len(accepted)
        worker = CheckWorker(graph_validation=vulkan)
        try:
            for name, path in accepted[::stride]:
                res = worker.run(["check", path, str(model_files(name)[1]), "--input", f"in0={MODELS[name]}",
                                  "--json"] + (["--vulkan"] if vulkan else []), timeout)
                outcome = classify(res)
                counts["run"] += 1
                counts[outcome] += 1
                if outcome == "mismatch":
                    why = explain_failing(worker, res, path, str(model_files(name)[1]), MODELS[name], vulkan)
                    for n in why:
                        counts["mismatch_layers"] += 1
                        counts["mismatch_self_consistent"] += why[n]["self_consistent"]
                        counts["mismatch_overflow"] += why[n]["overflow"]
                        counts["mismatch_ncnn_nondeterministic"] += why[n].get("ncnn_nondeterministic", False)
                        if not why[n]["explained"]:
                            counts["mismatch_unexplained"] += 1
                            failures.append(f"{os.path.basename(path)}: {why[n]}")
                elif outcome not in ("ok", "error"):
                    failures.append(f"{os.path.basename(path)}: {outcome}: {res['stderr'][-300:]}")
                counts["max_case_ms"] = max(counts["max_case_ms"], int(1e3 * res["seconds"]))
        finally:
            worker.close()
    return {**counts, "stride": stride, "vulkan": vulkan, "failures": failures[:20], "seconds": time.perf_counter() - t0}


class CheckWorker:
    """A long-lived process (`reliability_lib.py check-worker`) that runs `vknorm check` argument lists the
    way the CLI runs them (cli.main in a forked child, which forks its own guard child), each under a
    time bound, without a Python start-up per case. The worker itself never touches Vulkan or ncnn.

    graph_validation=True (for `check --vulkan`): the Khronos validation layer is loaded into every Vulkan
    instance the cases create, ncnn's included, logging to a file; what a case adds to it comes back as
    its `validation_log` (classify: "validation")."""

    def __init__(self, env: Optional[dict] = None, graph_validation: bool = False):
        e = dict(os.environ)
        self.tmp = tempfile.TemporaryDirectory() if graph_validation else None
        self.log = None
        if self.tmp:
            sys.path.insert(0, str(REPO / "tests"))
            import graph_runs

            self.log = os.path.join(self.tmp.name, "validation.log")
            Path(self.log).touch()
            e = graph_runs.validated_env(self.log, self.tmp.name)
        e.setdefault("VKNORM_VALIDATION", "1")
        e.setdefault("OPENBLAS_NUM_THREADS", "1")
        e["VKNORM_VALIDATION_PRINT"] = "1"
        e.update(env or {})
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "check-worker"], cwd=REPO, env=e,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        # The worker's lines, read by a thread of their own: waiting on the pipe itself (select) would miss an answer
        # that arrived in one read with the line before it, left in the reader's buffer.
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()

        def pump(stdout=self.proc.stdout, lines=self._lines):
            for line in stdout:
                lines.put(line)
            lines.put(None)  # the worker's end
        threading.Thread(target=pump, daemon=True).start()

    def _ask(self, request: dict, timeout: float) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        # The answer is one JSON line; the validation layer may print lines of its own on the worker's stdout
        # first (1.4.309 announces its log file there), which are skipped so answers stay in step.
        deadline = time.monotonic() + timeout + 30
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError("check worker stopped answering") from None
            if line is None:
                raise RuntimeError(f"check worker died (exit {self.proc.poll()})")
            if line.lstrip().startswith("{"):
                return json.loads(line)

    def run(self, argv: List[str], timeout: float = 60.0) -> dict:
        before = os.path.getsize(self.log) if self.log else 0
        res = self._ask({"argv": [str(a) for a in argv], "timeout": timeout}, timeout)
        if self.log:
            with open(self.log, errors="replace") as f:
                f.seek(before)
                res["validation_log"] = f.read(1 << 20)  # whole messages: classify reads every one
        return res

    def call(self, fn: str, kwargs: dict, timeout: float = 120.0) -> dict:
        """A function of this module in a forked child of the worker (a crash cannot take the caller
        down): {"result": ...} or {"error": ...}, and the child's outcome (signal, timed_out)."""
        return self._ask({"call": fn, "kwargs": kwargs, "timeout": timeout}, timeout)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(30)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait()
        if self.tmp:
            self.tmp.cleanup()


def _wait_child(pid: int, t0: float, timeout: float) -> tuple:
    """(wait status, timed out) of a forked child, killed once `timeout` seconds have passed since t0."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status, False
        if time.perf_counter() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None, True
        time.sleep(0.005)


def _run_case(argv: List[str], timeout: float) -> dict:
    """cli.main(argv) in a forked child with stdout/stderr captured; killed past `timeout` seconds."""
    from vknorm import cli

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # child: the CLI exactly as a user runs it
            code = 70
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                code = int(cli.main(argv) or 0)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 2
            except BaseException:  # noqa: BLE001
                import traceback

                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        status, timed_out = _wait_child(pid, t0, timeout)
        seconds = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        res = {"seconds": seconds, "timed_out": timed_out, "rc": None, "signal": None,
               "stdout": out.read().decode("utf-8", "replace")[-20000:],
               "stderr": err.read().decode("utf-8", "replace")[-4000:]}
    if not timed_out:
        if os.WIFSIGNALED(status):
            res["signal"] = os.WTERMSIG(status)
        else:
            res["rc"] = os.WEXITSTATUS(status)
    return res


def _call_case(fn: str, kwargs: dict, timeout: float) -> dict:
    """globals()[fn](**kwargs) in a forked child; its JSON result back through a temporary file."""
    with tempfile.TemporaryFile() as out:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                try:
                    payload = {"result": globals()[fn](**kwargs)}
                except Exception as e:  # noqa: BLE001 - reported to the caller
                    payload = {"error": f"{type(e).__name__}: {e}"}
                os.write(out.fileno(), json.dumps(payload).encode())
            except BaseException:  # noqa: BLE001
                code = 70
            finally:
                os._exit(code)
        status, timed_out = _wait_child(pid, time.perf_counter(), timeout)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    res = json.loads(text) if text else {"error": "no result"}
    res["timed_out"] = timed_out
    res["signal"] = os.WTERMSIG(status) if not timed_out and os.WIFSIGNALED(status) else None
    return res


def check_worker_main() -> None:
    import vknorm.cli  # noqa: F401 - imported once, before any fork (no Vulkan, no ncnn)

    for line in sys.stdin:
        req = json.loads(line)
        if "call" in req:
            res = _call_case(req["call"], req.get("kwargs", {}), float(req.get("timeout", 120)))
        else:
            res = _run_case(req["argv"], float(req.get("timeout", 60)))
        sys.stdout.write(json.dumps(res) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1:2] == ["check-worker"]:
        check_worker_main()
    elif sys.argv[1:2] == ["run"]:  # run NAME ['{"kwarg": value}']: one scenario, its figures as JSON
        kwargs = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
        print(json.dumps(globals()[sys.argv[2]](**kwargs)))
    else:
        sys.exit("usage: reliability_lib.py check-worker | run SCENARIO [JSON_KWARGS]")

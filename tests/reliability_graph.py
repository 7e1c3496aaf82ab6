"""Reliability scenarios of the in-graph path: vknorm's layers inside ncnn's Vulkan graph (vknorm.graph),
shared by tests/test_reliability_graph.py and tools/reliability_report.py (the figures in
docs/reliability.md). Nothing here asserts: every scenario returns what it measured and the tests decide.

Each scenario runs in a process of its own (``run_scenario``) with the Khronos validation layer (core and
synchronization validation) loaded into every Vulkan instance of that process, ncnn's included, logging
to a file the parent reads (tests/graph_runs.py validated_env); ncnn's instance is destroyed before the
process exits, so what the layer reports at teardown (leaked objects) is in the log too.

Device memory is what ncnn holds: vknorm.graph.track_device_memory() counts every VkDeviceMemory ncnn
allocates or frees (blob, workspace, staging and weight allocators; vknorm's layers allocate through them, and
their scratch through an ncnn allocator of their own),
and set_device_memory_limit() makes allocations past a limit fail as on a full device (the faults).

    python tests/reliability_graph.py run SCENARIO '{"kwarg": value}'   # one scenario's figures as JSON
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from reliability_lib import run_in_threads

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA = TESTS / "data"
MODELS = {k: tuple(int(v) for v in dims.split("x"))
          for k, dims in json.loads((DATA / "models.json").read_text()).items() if not k.startswith("_")}

# Input shapes each model takes besides its own (models.json): the plan cache meets new formats under load.
SHAPES = {
    "transformer_block": [(h, 64) for h in (4, 8, 12, 16, 20, 24, 28, 32)],
    "llama_block": [(h, 64) for h in (4, 8, 12, 16, 20, 24, 28, 32)],
    "sd_resblock": [(64, s, s) for s in (8, 10, 12, 14, 16, 18)],
    "instnorm_block": [(16, s, s) for s in (12, 16, 20, 24)],
    "ln_residual_stack": [(h, 768) for h in (7, 16, 33, 64)],
}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# Models made here: a LayerNorm over rows of 40000 (affine off, so any row length; 4 rows: ncnn packs them
# by 4), groups that take the split path (reduce, finalize/apply: vknorm's own workspace allocations) on
# every device. (Rows stay below 65536: ncnn's own float16 conversions dispatch one workgroup per column.)
SYNTHETIC = {"split_layernorm": ("7767517\n2 2\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 out0 0=0 1=1e-5 2=0\n",
                                 (4, 40000))}


def _model(name: str):
    """(param, bin, input shape) of a committed or SYNTHETIC model (the latter written to a temp dir)."""
    if name in SYNTHETIC:
        text, shape = SYNTHETIC[name]
        d = Path(tempfile.gettempdir()) / f"vknorm-reliability-{os.getpid()}"
        d.mkdir(exist_ok=True)
        (d / f"{name}.param").write_text(text)
        (d / f"{name}.bin").write_bytes(b"")
        return str(d / f"{name}.param"), str(d / f"{name}.bin"), shape
    return str(DATA / f"{name}.ncnn.param"), str(DATA / f"{name}.ncnn.bin"), MODELS[name]


def model_files(name: str):
    return _model(name)[:2]


# ------------------------------------------------------------------------------------ in the child

def _graph():
    from vknorm import graph

    return graph


def _quiet():
    from vknorm._stdio import quiet_stderr

    return quiet_stderr()


def _net(name: str, fp16: bool, vknorm: bool = True, lightmode: bool = True):
    graph = _graph()
    with _quiet():  # "overwrite built-in layer type ..."
        net = graph.configure(graph.Net(vknorm=vknorm), vulkan=True, fp16=fp16, lightmode=lightmode)
    param, binp, _ = _model(name)
    if net.load_param(param) != 0 or net.load_model(binp) != 0:
        raise RuntimeError(f"ncnn could not load {name}")
    return net


def _inputs(shape, count: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(count)]


def _infer(net, x) -> tuple:
    """One inference as a user runs it: a new extractor, the input, every output back to numpy.
    (ret, {output: array}); ret is ncnn's first non-zero return, 0 when all went well."""
    import numpy as np

    graph = _graph()
    ex = net.create_extractor()
    r = ex.input("in0", graph.Mat(x))
    out = {}
    if r == 0:
        for name in net.output_names():
            r, m = ex.extract(name)
            if r != 0:
                break
            out[name] = np.array(m)
    del ex
    return r, out


def _same(a: dict, b: dict) -> bool:
    import numpy as np

    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


def _norm_layers(net) -> int:
    return len(net.vknorm_layers())


def lifetime(model: str = "transformer_block", n: int = 10_000, fp16: bool = False, warmup: int = 500,
             inputs: int = 4, vknorm: bool = True) -> dict:
    """n inferences of a committed model through vknorm.graph, as a user runs them (a new extractor each,
    lightmode on), cycling over `inputs` seeded inputs of the model's shape: every output bit-identical to
    that input's first one; ncnn's device memory after every inference (it must stay at the level reached
    after `warmup`); RSS after warmup and at the end; vknorm's counters (every forward on the GPU)."""
    graph = _graph()
    graph.track_device_memory()
    net = _net(model, fp16, vknorm=vknorm)  # vknorm=False: stock ncnn, for comparison
    xs = _inputs(_model(model)[2], inputs, 0)
    first: List[Optional[dict]] = [None] * inputs
    errors, mismatches, drift = 0, 0, 0
    steady = rss_warm = None
    peak_after_warmup = 0
    t0 = time.perf_counter()
    for i in range(n):
        r, out = _infer(net, xs[i % inputs])
        if r != 0:
            errors += 1
        elif first[i % inputs] is None:
            first[i % inputs] = out
        elif not _same(out, first[i % inputs]):
            mismatches += 1
        mem = graph.device_memory()
        now = (mem["bytes"], mem["blocks"])
        if i + 1 == warmup:
            gc.collect()
            rss_warm, steady = rss_bytes(), now
            graph.set_device_memory_limit(0)  # resets the peak: from here on
        elif steady is not None:
            drift += now != steady
            peak_after_warmup = max(peak_after_warmup, mem["peak_bytes"])
    seconds = time.perf_counter() - t0
    gc.collect()
    rss_end = rss_bytes()
    mem = graph.device_memory()
    counters = net.vknorm_counters()
    norms = _norm_layers(net)
    net.clear()
    del net
    gc.collect()
    after_clear = graph.device_memory()
    return {"model": model, "fp16": fp16, "vknorm": vknorm, "inferences": n, "warmup": warmup, "seconds": seconds,
            "ms_per_inference": 1e3 * seconds / n, "errors": errors, "mismatches": mismatches,
            "steady_bytes": steady[0] if steady else None, "steady_blocks": steady[1] if steady else None,
            "end_bytes": mem["bytes"], "end_blocks": mem["blocks"], "peak_after_warmup": peak_after_warmup,
            "drift_inferences": drift, "after_clear_bytes": after_clear["bytes"],
            "rss_warm": rss_warm, "rss_end": rss_end,
            "rss_growth": (rss_end - rss_warm) / rss_warm if rss_warm else None,
            "norm_layers": norms, "vulkan_forwards": counters["vulkan_forwards"],
            "cpu_forwards": counters["cpu_forwards"], "pipelines": counters["pipelines"]}


def reload_cycles(model: str = "transformer_block", cycles: int = 100, fp16: bool = False, warmup: int = 5) -> dict:
    """Net load -> one inference -> clear -> drop, `cycles` times: every output bit-identical to the first
    cycle's; ncnn's device memory and RSS after each cycle (flat after `warmup` cycles); then ncnn's Vulkan
    instance destroyed: what ncnn still holds then, and the validation layer's teardown report (leaks are
    reported at device and instance destruction, to the log the parent reads)."""
    graph = _graph()
    graph.track_device_memory()
    x = _inputs(_model(model)[2], 1, 1)[0]
    first = None
    errors = mismatches = 0
    mem_by_cycle, rss_by_cycle = [], []
    t0 = time.perf_counter()
    for _ in range(cycles):
        net = _net(model, fp16)
        r, out = _infer(net, x)
        if r != 0:
            errors += 1
        elif first is None:
            first = out
        elif not _same(out, first):
            mismatches += 1
        with _quiet():
            net.clear()
        del net
        gc.collect()
        mem_by_cycle.append(graph.device_memory()["bytes"])
        rss_by_cycle.append(rss_bytes())
    seconds = time.perf_counter() - t0
    graph._graph.destroy_gpu_instance()
    after_destroy = graph.device_memory()
    steady = mem_by_cycle[warmup - 1]
    return {"model": model, "fp16": fp16, "cycles": cycles, "warmup": warmup, "seconds": seconds, "errors": errors,
            "mismatches": mismatches, "bytes_after_warmup": steady, "bytes_max_after_warmup": max(mem_by_cycle[warmup:]),
            "bytes_end": mem_by_cycle[-1], "cycles_off_steady": sum(b != steady for b in mem_by_cycle[warmup:]),
            "rss_after_warmup": rss_by_cycle[warmup - 1], "rss_end": rss_by_cycle[-1],
            "rss_growth": (rss_by_cycle[-1] - rss_by_cycle[warmup - 1]) / rss_by_cycle[warmup - 1],
            "bytes_after_instance_destroyed": after_destroy["bytes"],
            "blocks_after_instance_destroyed": after_destroy["blocks"]}


def threads(model: str = "transformer_block", fp16: bool = False, n_threads: int = 8, per_thread: int = 12,
            nets: str = "one") -> dict:
    """n_threads threads at once, each running per_thread inferences of varied input shapes (SHAPES): on one
    Net's extractors (nets="one") or each on a Net of its own (nets="many"). Every output must be
    bit-identical to the same inference run alone, in order, on a net of its own; the nets under load
    are fresh, so the layers plan their formats (the per-format plan cache) and make their pipelines
    under that load, and must end with the same pipelines as the sequential run."""
    shapes = SHAPES.get(model, [_model(model)[2]])
    import numpy as np

    rng = np.random.default_rng(7)
    jobs = [rng.standard_normal(shapes[i % len(shapes)]).astype(np.float32) for i in range(n_threads * per_thread)]
    # The sequential reference: the same inferences in order on fresh nets (one per thread's share with
    # nets="many", since each net then only meets its own shapes).
    serial, serial_pipelines = [], []
    for share in ([jobs] if nets == "one" else [jobs[t * per_thread:(t + 1) * per_thread] for t in range(n_threads)]):
        ref_net = _net(model, fp16)
        serial += [_infer(ref_net, x) for x in share]
        serial_pipelines.append(sorted(v for layer in ref_net.vknorm_layers() for v in layer["variants"]))
        ref_net.clear()
        del ref_net
    serial_errors = sum(r != 0 for r, _ in serial)

    loaded = [_net(model, fp16) for _ in range(n_threads if nets == "many" else 1)]
    results, errors, seconds, hung = run_in_threads(
        n_threads, jobs, lambda t, x: _infer(loaded[t if nets == "many" else 0], x), join_s=600)
    failed = sum(1 for r in results if r is None or r[0] != 0)
    mismatches = sum(1 for a, b in zip(serial, results) if b is None or a[0] != b[0] or not _same(a[1], b[1]))
    pipelines = [sorted(v for layer in net.vknorm_layers() for v in layer["variants"]) for net in loaded]
    counters = [net.vknorm_counters() for net in loaded]
    for net in loaded:
        net.clear()
    return {"model": model, "fp16": fp16, "nets": nets, "threads": n_threads, "inferences": len(jobs),
            "shapes": len(shapes), "seconds": seconds, "errors": errors, "failed": failed, "serial_errors": serial_errors,
            "hung_threads": hung, "mismatches": mismatches,
            "pipelines_like_serial": pipelines == serial_pipelines,
            "pipelines": sum(len(p) for p in pipelines),
            "cpu_forwards": sum(c["cpu_forwards"] for c in counters),
            "vulkan_forwards": sum(c["vulkan_forwards"] for c in counters)}


def faults(model: str = "transformer_block", fp16: bool = False, big=(1024, 64), step_mib: int = 4,
           max_steps: int = 64) -> dict:
    """Device memory exhausted inside an ncnn Net. After one inference at the model's size, ncnn's live
    device memory is limited to what it holds then plus k * step_mib MiB (k = 0, 1, ...), and each step
    runs a large input, then one at the model's size, until the large one fits. The large inference must
    fail with ncnn's error code (never crash) or run right; the normal one must run, bit-identical to its
    output without a limit. Then the limit is lifted and the large input must give the output the first
    successful capped run gave."""
    graph = _graph()
    graph.track_device_memory()
    param, binp, shape = _model(model)
    net = _net(model, fp16)
    x = _inputs(shape, 1, 2)[0]
    xb = _inputs(tuple(big), 1, 3)[0]
    r, want = _infer(net, x)
    base = graph.device_memory()["bytes"]
    outcomes, first_big = [], None
    for k in range(max_steps):
        limit = base + k * (step_mib << 20)
        graph.set_device_memory_limit(limit)
        before = graph.device_memory()["refused"]
        rb, outb = _infer(net, xb)
        rn, outn = _infer(net, x)
        outcomes.append({"limit": limit, "big_ret": rb, "refused_allocations": graph.device_memory()["refused"] - before,
                         "normal_ret": rn, "normal_same": rn == 0 and _same(outn, want)})
        if rb == 0:
            first_big = outb
            break
    graph.set_device_memory_limit(0)
    r_after, out_after = _infer(net, xb)
    counters = net.vknorm_counters()
    net.clear()
    return {"model": model, "fp16": fp16, "big": list(big), "first_ret": r, "base_bytes": base, "step_mib": step_mib,
            "limits": len(outcomes), "outcomes": outcomes,
            "big_failed": sum(o["big_ret"] != 0 for o in outcomes),
            "error_codes": sorted({o["big_ret"] for o in outcomes if o["big_ret"] != 0}),
            "refused_allocations": sum(o["refused_allocations"] for o in outcomes),
            "normal_ok": sum(o["normal_same"] for o in outcomes),
            "big_fitted": first_big is not None,
            "after_limit_lifted_ok": r_after == 0 and first_big is not None and _same(out_after, first_big),
            "cpu_forwards": counters["cpu_forwards"]}


# ------------------------------------------------------------------------------------ in the parent

def run_scenario(name: str, kwargs: Optional[dict] = None, timeout: float = 3600, env: Optional[Dict[str, str]] = None,
                 validation: bool = True) -> dict:
    """One scenario in a child process under the validation layer (validation=False: without it, e.g. for
    RSS figures of the process alone); its figures plus `validation_messages` (lines the layer logged,
    ncnn's instance and its teardown included), `stderr_tail`, `wall_seconds` and `validation`."""
    sys.path.insert(0, str(TESTS))
    import graph_runs

    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "validation.log")
        full = graph_runs.validated_env(log, tmp) if validation else dict(os.environ, VKNORM_VALIDATION="0")
        for k in ("VKNORM_MAX_BUFFER_BYTES", "VKNORM_MAX_DEVICE_BYTES", "VKNORM_PATH", "VKNORM_NO_FP16_STORAGE"):
            full.pop(k, None)
        full.update(env or {})
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "run", name, json.dumps(kwargs or {})],
                              cwd=REPO, env=full, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - t0
        # the layer opens its log when an instance loads it: none from a validated run is a run it never saw
        logged = os.path.exists(log)
        messages = Path(log).read_text(errors="replace") if logged else ""
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    out = json.loads(lines[-1]) if proc.returncode == 0 and lines else {"failed": True}
    out.update(returncode=proc.returncode, wall_seconds=wall, stderr_tail=proc.stderr[-3000:], validation=validation,
               validation_messages=[ln for ln in messages.splitlines() if ln.strip()][:20],
               validation_lines=sum(1 for ln in messages.splitlines() if ln.strip()),
               validation_log_missing=validation and not logged)
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        kwargs = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
        result = globals()[sys.argv[2]](**kwargs)
        # ncnn's Vulkan instance goes before the process does: its teardown is validated with the rest.
        _graph()._graph.destroy_gpu_instance()
        print(json.dumps(result), flush=True)
    else:
        sys.exit("usage: reliability_graph.py run SCENARIO [JSON_KWARGS]")

"""`vknorm bench --model`: whole-model wall time per inference, stock ncnn beside vknorm in one run.

    vknorm bench --model MODEL.param MODEL.bin --input NAME=DIMS [...] [--fp16] [--iters N] [--custom-layers FILE.py]
                 [--json FILE]

Implementations (one process, one device):
  ncnn-cpu         stock ncnn, CPU (ncnn compiled from its pinned source, as below)
  ncnn-vulkan      stock ncnn, Vulkan
  vknorm-in-graph  ncnn Vulkan with vknorm's layers inside ncnn's graph (vknorm.graph), the model as it is
  vknorm-fused     the same with vknorm's graph rewrite: each add -> norm -> activation one kernel
  vknorm-host      pyncnn Vulkan with vknorm.ncnn.register: Python layers on the host (the slow path)
Each inference is what a user runs: a new extractor, the inputs from numpy (uploaded by ncnn), every
output extracted back to numpy. The rounds are interleaved (one inference of each implementation per
round, in a new random order each round) after a warm-up of at least --warmup-ms per implementation, so
every implementation sees the same clocks; the median of --iters rounds is reported. --fp16: float16
storage in every net (ncnn's CPU one too). Stock ncnn's CPU layers run the inputs in two nets first: blobs that
differ between them, or a norm whose every input value is NaN/inf (--input shapes the model does not take, a layer
reading memory it was not given), are refused, as `vknorm check` refuses them, rather than timed.

The implementations that keep the host's cores busy (ncnn-cpu, and vknorm-host's CPU layers) are timed
in rounds of their own, after the GPU ones: ncnn's OpenMP threads spin for a while after a CPU run, and
whatever runs next on a busy host waits longer for the GPU. Interleaved with them, stock ncnn-vulkan (always
right after ncnn-cpu) measured up to 2.5x slower on an H200 host, which no kernel of vknorm's earned.
"""
from __future__ import annotations

import os
import random
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from . import custom_layers
from .check import input_mat

IMPLS = ("ncnn-cpu", "ncnn-vulkan", "vknorm-in-graph", "vknorm-fused", "vknorm-host")
# Timed in rounds of their own, after the others (module docstring).
HOST_BUSY = ("ncnn-cpu", "vknorm-host")


def schedule(impls: Sequence[str], iters: int, seed: int = 0) -> List[List[List[str]]]:
    """The timed rounds, as phases: the GPU implementations' rounds first, then those of the implementations
    that keep the host busy (HOST_BUSY). Each round runs every implementation of its phase once, in an order
    drawn anew each round, so no implementation always follows the same one."""
    rng = random.Random(seed)
    phases = []
    for members in ([i for i in impls if i not in HOST_BUSY], [i for i in impls if i in HOST_BUSY]):
        if members:
            phases.append([rng.sample(members, len(members)) for _ in range(iters)])
    return phases


def time_rounds(runs: Dict[str, Callable[[], object]], iters: int, warmup_ms: float, seed: int = 0,
                progress=None) -> Dict[str, List[float]]:
    """Wall ms of each of `runs` (name -> one inference) over `iters` rounds as `schedule` orders them, each
    phase after a warm-up of at least warmup_ms per implementation (pipelines, allocators, clocks)."""
    samples: Dict[str, List[float]] = {name: [] for name in runs}
    phases = schedule(list(runs), iters, seed)
    done = 0
    for phase in phases:
        for name in phase[0]:
            end = time.perf_counter() + warmup_ms / 1e3
            runs[name]()
            while time.perf_counter() < end:
                runs[name]()
        for order in phase:
            for name in order:
                t0 = time.perf_counter()
                runs[name]()
                samples[name].append((time.perf_counter() - t0) * 1e3)
            done += 1
            if progress:
                progress(done, iters * len(phases))
    return samples


def _load_with_utf8_names(net, param: str, binp: str) -> bool:
    """net.load_param(param) and load_model(binp) for pyncnn, which takes file names as UTF-8 text only: a name that
    is not (bytes Python carries as surrogates) is reached through a link of a plain name, there while it loads."""
    import shutil
    import tempfile

    links = None
    try:
        names = []
        for path, name in ((param, "model.param"), (binp, "model.bin")):
            try:
                path.encode("utf-8")
            except UnicodeEncodeError:
                links = links or tempfile.mkdtemp(prefix="vknorm-bench-")
                path_link = os.path.join(links, name)
                os.symlink(os.path.abspath(path), path_link)
                path = path_link
            names.append(path)
        return net.load_param(names[0]) == 0 and net.load_model(names[1]) == 0
    finally:
        if links:
            shutil.rmtree(links, ignore_errors=True)


class ModelRunner:
    """One loaded net and how to run one inference on it."""

    def __init__(self, impl: str, param: str, binp: str, inputs: Dict[str, np.ndarray], fp16: bool,
                 kv_caches: frozenset = frozenset()):
        self.impl, self.inputs, self.kv_caches = impl, inputs, kv_caches
        if impl == "vknorm-host":
            import ncnn  # type: ignore[import-untyped, import-not-found]  # pyncnn: no types, optional

            import vknorm.ncnn as vkn
            from vknorm import Option

            self.mod = ncnn
            self.net = ncnn.Net()
            self.net.opt.use_vulkan_compute = True
            self.net.opt.use_fp16_storage = self.net.opt.use_fp16_packed = fp16
            self.net.opt.use_fp16_arithmetic = False
            self.registration = vkn.register(self.net, Option(use_fp16_storage=fp16))
            custom_layers.apply(ncnn, self.net)
        else:
            from vknorm import graph

            self.mod = graph
            vk = impl.startswith("vknorm-")
            self.net = graph.configure(graph.Net(vknorm=vk, fuse=impl == "vknorm-fused"), vulkan=impl != "ncnn-cpu",
                                       fp16=fp16)
            custom_layers.apply(graph, self.net)
        if impl == "vknorm-host":
            loaded = _load_with_utf8_names(self.net, param, binp)
        else:
            loaded = self.net.load_param(param) == 0 and self.net.load_model(binp) == 0
        if not loaded:
            bad = self.registration.errors() if impl == "vknorm-host" else []
            if bad:  # a vknorm layer refused its params, weights or device (out of memory): its own reason
                name, e = bad[0]
                raise RuntimeError(f"{impl}: vknorm layer {name!r} could not load: {type(e).__name__}: "
                                   f"{(str(e).splitlines() or [''])[0]}")
            raise RuntimeError(f"{impl}: ncnn could not load {param} / {binp}")
        self.outputs = list(self.net.output_names())  # every blob no layer consumes

    def __call__(self) -> Dict[str, np.ndarray]:
        ex = self.net.create_extractor()
        for name, x in self.inputs.items():
            m = input_mat(self.mod.Mat, x)  # no elements: a decoder's empty past kv cache
            if self.impl == "vknorm-host":
                m = m.clone()  # pyncnn's Mat wraps numpy memory; ncnn must own what it consumes
            if ex.input(name, m) != 0:
                raise RuntimeError(f"{self.impl}: ncnn rejected input {name!r}")
        out = {}
        for name in self.outputs:
            r, m = ex.extract(name)
            if r != 0:
                raise RuntimeError(f"{self.impl}: extracting {name!r} failed ({r}): check --input shapes")
            # a kv cache is kept as the Mat a decoder gives back to its next step (pyncnn's numpy of a packed one
            # crashes)
            out[name] = m if name in self.kv_caches else np.array(m)
        return out


def _first_run_cause(impl: str, finished: List[str]) -> str:
    """The likely cause of a crash in impl's first inference, after those in finished ran the same inputs."""
    from ._fork import SHAPES, VKNORM_CRASH, stock_vulkan_crash

    if "ncnn-cpu" not in finished:
        return SHAPES
    if impl == "ncnn-vulkan":
        return stock_vulkan_crash("ncnn-cpu's run")
    if "ncnn-vulkan" in finished:
        return VKNORM_CRASH
    return f"ncnn-cpu had run the same inputs; {SHAPES}"


def run_model_bench(param: str, binp: str, input_dims: Dict[str, Tuple[int, ...]], fp16: bool = False,
                    iters: int = 30, warmup_ms: float = 300.0, impls=IMPLS, seed: int = 0, progress=None) -> dict:
    from vknorm import graph

    from ._stdio import quiet_stderr
    from .check import (kv_cache_outputs, load_failure, parse_param, random_inputs, refuse_norm_channel_mismatch,
                        refuse_unrepeatable_stock_run, trailing_bytes_warning, unread_text_warnings)

    inputs = random_inputs(np.random.default_rng(seed), input_dims, list(input_dims))

    # ncnn's device banner and notes silenced; its last line joins a failure's message
    def ncnn_reason(step: Callable[[], Any]) -> Any:
        logs: list = []
        try:
            with quiet_stderr(logs):
                return step()
        except RuntimeError as e:
            raise RuntimeError(f"{e}{load_failure(parse_param(param), logs)}") from None  # parsed to name the line

    from ._fork import LOADING, TIMED_CRASH, stage

    # a GroupNorm or InstanceNorm fed other channels than its param says: refused before any net loads; then
    # stock runs that differ or leave a norm nothing finite (input shapes the model does not take) are not timed
    model = parse_param(param)
    refuse_norm_channel_mismatch(model, binp, os.path.getsize(binp), inputs)
    refuse_unrepeatable_stock_run(model, binp, os.path.getsize(binp), inputs)
    kv_caches = frozenset(kv_cache_outputs(model))
    runners = []
    for impl in impls:
        stage(f"the load of {impl}", LOADING)
        try:
            runners.append(ncnn_reason(lambda: ModelRunner(impl, param, binp, inputs, fp16, kv_caches)))
        except ImportError as e:
            print(f"vknorm bench: {impl} skipped: {e}", file=sys.stderr)
    finished: List[str] = []
    for r in runners:  # one inference each first: a model that fails says so in one line, with ncnn's reason
        stage(f"the {r.impl} run", _first_run_cause(r.impl, finished))
        ncnn_reason(r)
        finished.append(r.impl)
    stage("the timed runs", TIMED_CRASH)
    # a .bin longer than the model reads: another model's? (as check and optimize warn; a vknorm.graph net counts)
    read = next((r.net.model_bytes_read for r in runners if hasattr(r.net, "model_bytes_read")), None)
    size = os.path.getsize(binp)
    warnings = unread_text_warnings(model)
    warnings += [trailing_bytes_warning(binp, size - read, param)] if read is not None and read < size else []
    samples = time_rounds({r.impl: r for r in runners}, iters, warmup_ms, seed, progress)
    device = graph.gpu_name()
    driver = ""
    try:
        from . import _core

        # as the kernel bench writes it: the driver's name, then its version string
        driver = next((f"{d['driver_name']} {d['driver_info']}".strip() for d in _core.devices()
                       if d["name"] == device), "")
    except Exception:  # noqa: BLE001 - the driver string is informative only
        pass
    report = {"device": device, "driver": driver, "model": param, "fp16": fp16, "iters": iters,
              "warmup_ms": warmup_ms,
              "method": "median wall ms per inference; rounds in a random order each, GPU implementations first, "
                        "then " + ", ".join(HOST_BUSY) + " in rounds of their own",
              "results": [{"impl": k, "ms": round(statistics.median(v), 4),
                           "min_ms": round(min(v), 4)} for k, v in samples.items()], "warnings": warnings}
    if custom_layers.used():  # the key only where the flag was given: the report is otherwise as it was
        report["custom_layers"] = custom_layers.used()
    return report


def format_table(report: dict) -> str:
    by = {r["impl"]: r["ms"] for r in report["results"]}
    base = by.get("ncnn-vulkan")
    lines = [f"{report['model']} ({'fp16' if report['fp16'] else 'fp32'} storage, median of {report['iters']}) "
             f"on {report['device']}", "", f"{'impl':<16} {'ms/inference':>13} {'vs ncnn-vulkan':>15}"]
    for r in report["results"]:
        ratio = f"{base / r['ms']:.2f}x" if base else "-"
        lines.append(f"{r['impl']:<16} {r['ms']:>13.3f} {ratio:>15}")
    lines.append("")
    lines.append("(vs ncnn-vulkan: > 1 is faster than stock ncnn's Vulkan run)")
    return "\n".join(lines)

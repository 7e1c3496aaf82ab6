"""`vknorm bench`: GPU time of LayerNorm / RMSNorm / GroupNorm / InstanceNorm against the copy roof, ncnn's
Vulkan layer and torch.

LayerNorm/RMSNorm shapes are --rows x --cols (the group size); GroupNorm/InstanceNorm shapes are --channels
x --size HxW (with --groups for GroupNorm), by default the Stable-Diffusion UNet/VAE sizes (GroupNorm(32),
and GroupNorm(2, 640) at 640x16x16) and style-transfer sizes (InstanceNorm).

Method (docs/benchmarks/README.md): each measurement is a batch of >= 100 back-to-back forwards in one
submission, timed with Vulkan timestamp queries, right after --warmup-ms (150 by default) of the same work on the GPU (NVIDIA
drops its clock within ~0.5 s of idling). The copy roof is measured the same way, interleaved with the
kernel, batch by batch; every figure is the median of the batches. Effective bandwidth = streams * bytes(x) / time
(2 streams, x in and y out; 3 with --residual add, 4 with add+sum). --batches and --warmup-ms apply to vknorm
and the copy roof; torch is the median of 5 CUDA-event batches of about --reps forwards replayed from a CUDA graph
(the GPU's time, as vknorm's one command buffer; eager calls where capture fails, then for small layers torch's
launch rate), each after 150 ms of the same work; ncnn is per layer the difference of
two wall-clock times, a chain of k layers' and a chain of one's, each the least of 3 runs (ncnn's host recording
of each layer included, as in a model).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import shutil
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple, Union, cast

import numpy as np

from . import custom_layers

TORCH_GRAPH_CALLS = 200  # forwards captured in one CUDA graph (a --reps batch replays it)
LEAKY_SLOPE = 0.1  # --activation leakyrelu's slope, vknorm's and torch's
DEFAULT_COLS = [32, 64, 128, 256, 512, 768, 1024, 2048, 4096, 8192, 16384, 32768]
LATENCY_SHAPES = [(1, 768), (77, 512), (197, 768), (1, 4096)]
# (channels, h, w, groups): SD UNet/VAE GroupNorm(32) sizes, the UNet up path's 960-channel concatenations
# (30 channels per group: groups inside pack4 lanes), and GroupNorm(2, 640)'s 81920-element groups.
GROUPNORM_SHAPES = [(320, 64, 64, 32), (640, 32, 32, 32), (1280, 16, 16, 32), (1280, 8, 8, 32), (960, 64, 64, 32),
                    (960, 32, 32, 32), (640, 16, 16, 2)]
# style-transfer / GAN generator InstanceNorm sizes (one group per channel plane).
INSTANCENORM_SHAPES = [(32, 224, 224, 0), (64, 128, 128, 0), (128, 64, 64, 0), (256, 32, 32, 0), (512, 7, 7, 0)]
CHANNEL_OPS = ("groupnorm", "instancenorm")
IMPLS = ("ncnn", "copy", "torch")
# The flags of one mode (dest -> default; parser-level defaults): the other mode refuses them, not ignores them.
SWEEP_ONLY = {"op": "layernorm", "rows": None, "cols": None, "channels": None, "size": None, "groups": None,
              "dtype": "both", "compare": "ncnn,copy,torch", "plot": None, "elements": 1 << 25, "no_latency": False,
              "reps": 100, "batches": 5, "path": "auto", "no_packing": False, "no_affine": False, "residual": None,
              "activation": None}
MODEL_ONLY = {"input": [], "fp16": False, "iters": 30, "custom_layers": None}


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="time the norms on the GPU (Vulkan timestamps)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", choices=["layernorm", "rmsnorm", "both", "groupnorm", "instancenorm"],
                   help="default layernorm; both: layernorm and rmsnorm")
    p.add_argument("--rows", type=int, action="append", help="rows of one shape (pair each --rows with a --cols)")
    p.add_argument("--cols", type=int, action="append", help="columns (group size) of one shape")
    p.add_argument("--channels", type=int, action="append",
                   help="groupnorm/instancenorm: channels of one shape (pair each with a --size)")
    p.add_argument("--size", action="append", metavar="HxW", help="groupnorm/instancenorm: the plane of one shape")
    p.add_argument("--groups", type=int, action="append",
                   help="groupnorm: groups of each shape (one for all, or one per --channels; default 32 with --channels; "
                        "without, the default shapes' own; one value without --channels: the default shapes whose "
                        "channels it divides, the others named as skipped)")
    p.add_argument("--dtype", choices=["fp32", "fp16", "both"], help="default both")
    p.add_argument("--compare",
                   help="comma list of ncnn, copy, torch (the default; '' for vknorm alone); unavailable ones are skipped; "
                        "ncnn (timed by wall clock over chains of layers) not at the default sweep's latency shapes")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE ('-': to stdout, instead of the table)")
    p.add_argument("--plot", metavar="FILE", help="draw GB/s against cols per implementation (any format matplotlib writes: .png, .svg, .pdf, ...)")
    p.add_argument("--elements", type=int, help="rows*cols of the default sweep (2^25; rows = max(1, N / cols))")
    p.add_argument("--no-latency", action="store_true", help="skip the latency shapes of the default sweep")
    p.add_argument("--reps", type=int, help="timed forwards per batch (100..1000000, default 100)")
    p.add_argument("--batches", type=int, help="batches per measurement (default 5); the median is reported")
    p.add_argument("--warmup-ms", type=float, default=None,
                   help="GPU work right before each timed batch (default 150); with --model, warm-up per "
                        "implementation (default 300)")
    p.add_argument("--path", help="force a vknorm path: auto (default)|subgroup|workgroup|split|cooperative "
                   "(one that cannot hold a group falls to the next larger, cooperative to split; the report's path "
                   "says what ran)")
    p.add_argument("--no-packing", action="store_true", help="elempack 1 blobs (default: ncnn's pack4)")
    p.add_argument("--no-affine", action="store_true", help="layers without gamma/beta (ncnn's affine=0: param 2, GroupNorm's param 3)")
    p.add_argument("--residual", choices=["add", "add+sum"],
                   help="the fused residual add: y = norm(x + r) (3 tensor streams), add+sum also writes x + r "
                        "(4 streams); GB/s and %% copy count every stream; torch runs x + r then the norm")
    p.add_argument("--activation", choices=["relu", "leakyrelu", "sigmoid", "swish", "gelu", "gelu_fast"],
                   help="fuse this activation into the norm's store (leakyrelu: slope 0.1)")
    m = p.add_argument_group("whole models (--model): wall time per inference, stock ncnn beside vknorm")
    m.add_argument("--model", nargs=2, metavar=("MODEL.param", "MODEL.bin"),
                   help="time a whole ncnn model: ncnn-cpu, ncnn-vulkan, vknorm-in-graph, vknorm-fused, vknorm-host")
    m.add_argument("--input", action="append", metavar="NAME=DIMS", help="a model input, e.g. in0=197x768 (as check's "
                   "--input: numpy order; past_k=empty for a decoder's past kv cache at its first step)")
    m.add_argument("--fp16", action="store_true", help="float16 storage in every net (ncnn's CPU one too)")
    m.add_argument("--iters", type=int, help="timed inferences per implementation (median; default 30)")
    m.add_argument("--custom-layers", metavar="FILE.py", help=custom_layers.help_for("each net the command makes"))
    # None until run() fills in the defaults: a flag given at its default value is still a flag given
    p.set_defaults(func=run, **{dest: False if default is False else None
                                for dest, default in {**SWEEP_ONLY, **MODEL_ONLY}.items()})


def _skip(skipped: list, what: str, why: str) -> None:
    """Leaves `what` out of the run: a line on stderr, and an entry in the JSON's "skipped"."""
    print(f"vknorm bench: {why}: skipping {what}", file=sys.stderr)
    skipped.append({"what": what, "why": why})


def _check_extents(flags: str, *extents: int) -> None:
    """ncnn's Mat extents are int: each must fit 32 bits (checked before any input is made)."""
    from .cli import UsageError

    if any(e > 2**31 - 1 for e in extents):
        raise UsageError(f"{flags}: shape {'x'.join(map(str, extents))}: every dimension must be 1..2^31-1 "
                         "(ncnn's Mat extents are int)")


def _channel_shapes(args, skipped: list):
    """(channels, h, w, groups) of each groupnorm/instancenorm shape (UsageError when malformed)."""
    from .cli import UsageError

    if args.rows or args.cols:
        raise UsageError(f"--rows/--cols are LayerNorm/RMSNorm shapes; --op {args.op} takes --channels and --size HxW")
    if args.op == "instancenorm" and args.groups:
        raise UsageError("--groups: instancenorm has one group per channel")
    if not args.channels and not args.size:
        if args.groups:
            if len(args.groups) != 1 or args.groups[0] < 1:
                raise UsageError("--groups without --channels: one positive value for the default shapes")
            shapes = [(c, h, w, args.groups[0]) for c, h, w, _ in GROUPNORM_SHAPES if c % args.groups[0] == 0]
            if not shapes:
                raise UsageError(f"--groups {args.groups[0]} divides none of the default shapes' channels "
                                 f"({', '.join(str(c) for c, _, _, _ in GROUPNORM_SHAPES)}): "
                                 "give --channels and --size too")
            undivided = [f"{c}x{h}x{w}" for c, h, w, _ in GROUPNORM_SHAPES if c % args.groups[0]]
            if undivided:
                _skip(skipped, ", ".join(undivided), f"--groups {args.groups[0]} divides the channels of {len(shapes)} "
                      f"of the {len(GROUPNORM_SHAPES)} default shapes")
            return shapes
        return GROUPNORM_SHAPES if args.op == "groupnorm" else INSTANCENORM_SHAPES
    channels, sizes = args.channels or [], args.size or []
    if len(channels) != len(sizes):
        raise UsageError("--channels and --size: give one --size HxW for each --channels")
    groups = args.groups or [32]
    if len(groups) not in (1, len(channels)):
        raise UsageError("--groups: one value for every shape, or one per --channels")
    out = []
    for i, (c, size) in enumerate(zip(channels, sizes)):
        try:
            h, w = (int(v) for v in size.lower().split("x"))
        except ValueError:
            raise UsageError(f"--size {size!r}: expected HxW, e.g. 64x64") from None
        g = groups[i if len(groups) > 1 else 0] if args.op == "groupnorm" else 0
        if c < 1 or h < 1 or w < 1:
            raise UsageError(f"--channels/--size: shape {c}x{h}x{w} must be positive")
        _check_extents("--channels/--size", c, h, w)
        if args.op == "groupnorm" and (g < 1 or c % g):
            raise UsageError(f"--groups {g}: {c} channels do not split into {g} groups")
        out.append((c, h, w, g))
    return out


def _shapes(args):
    from .cli import UsageError

    if args.channels or args.size or args.groups:
        raise UsageError("--channels/--size/--groups go with --op groupnorm or instancenorm")
    if args.rows or args.cols:
        rows, cols = args.rows or [], args.cols or []
        if len(rows) != len(cols):
            raise UsageError("--rows and --cols: give one --rows for each --cols")
        for r, c in zip(rows, cols):
            if r < 1 or c < 1:
                raise UsageError(f"--rows/--cols: shape {r}x{c} must be positive")
            _check_extents("--rows/--cols", r, c)
        return [(r, c, "sweep") for r, c in zip(rows, cols)]
    shapes = [(max(1, args.elements // c), c, "sweep") for c in DEFAULT_COLS]
    for r, c, _ in shapes:
        _check_extents("--elements", r, c)
    if not args.no_latency:
        shapes += [(r, c, "latency") for r, c in LATENCY_SHAPES]
    return shapes


def bar_width() -> dict:
    """tqdm's size: the terminal's as it changes, or 80 x 24 where the terminal reports none (a bare pseudo-
    terminal: tqdm would draw nothing there)."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError):
        size = os.terminal_size((0, 0))
    return {"dynamic_ncols": True} if size.columns > 0 and size.lines > 0 else {"ncols": 80, "nrows": 24}


class _Progress:
    """The sweep's progress on stderr where a person watches it (a terminal), as with --model; not into logs."""

    def __init__(self, total: int):
        self._n, self._total, self._shown = 0, total, sys.stderr.isatty()
        try:
            from tqdm import tqdm  # type: ignore[import-untyped]  # tqdm ships no types (types-tqdm has them)

            self._bar = tqdm(total=total, unit="run", file=sys.stderr, disable=not self._shown, **bar_width())
        except ImportError:
            self._bar = None

    def start(self, label: str) -> None:
        """A measurement begins: its label shows while it runs (the count moves when it is done)."""
        if self._bar is not None:
            self._bar.set_description(label)
        elif self._shown:
            print(f"\r[{self._n}/{self._total}] {label:<40}", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self._bar is not None:
            self._bar.update(1)
        else:
            self._n += 1
            if self._shown:
                print(f"\r[{self._n}/{self._total}]", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._shown:
            print(file=sys.stderr)


def write_json(report: dict, path) -> None:
    """The report as JSON to the --json file, or to stdout for '-'; a write that fails names the file."""
    from .cli import UsageError, replaced_file_mode

    if not path:
        return
    if path == "-":
        print(json.dumps(report, indent=1))
        return
    text = json.dumps(report, indent=1)
    real = os.path.realpath(path)  # a symbolic link stays one: its target is replaced
    if os.path.exists(real) and not os.path.isfile(real):  # a FIFO or a device: written as it is
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError as e:
            raise UsageError(f"--json {path}: {e.strerror or e}") from None
        return
    # Into a temporary file beside it, renamed over it once whole: a write that fails (disk full, a file size
    # limit, a signal) leaves the file as it was, not a truncated report.
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".vknorm-bench-", suffix=".json", dir=os.path.dirname(real))
        os.fchmod(fd, replaced_file_mode(real))
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, real)
        tmp = None
    except OSError as e:
        raise UsageError(f"--json {path}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _is_standard_output(path) -> bool:
    """path names what standard output is (/dev/stdout, /proc/self/fd/1, the file stdout was sent to)."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(sys.stdout.fileno()))
    except (OSError, ValueError):  # no such file, or stdout without a descriptor
        return False


def _check_output_path(flag: str, path) -> None:
    """Before the run, not after it: a report that cannot be written is a one-line error up front."""
    from .cli import UsageError, names_a_directory

    if path is None or (flag == "--json" and path == "-"):
        return
    if not path:  # `--json ''` would otherwise run the whole sweep and write nothing
        raise UsageError(f"{flag}: empty file name; name a file")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: a directory; name a file")
    if names_a_directory(path):  # realpath drops a trailing / or /.: the name would pass here and fail at the write
        raise UsageError(f"{flag} {path}: a directory path (trailing /, . or ..); name a file")
    # The format from the name, whatever the file is (matplotlib would write NAME.png beside a FIFO or device).
    if flag == "--plot":
        ext = os.path.splitext(path)[1].lstrip(".").lower()
        try:
            from matplotlib.backend_bases import FigureCanvasBase  # type: ignore[import-not-found, unused-ignore]

            formats = FigureCanvasBase.get_supported_filetypes()
        except ImportError:  # before the sweep: not a run of minutes that ends without its plot
            raise UsageError(f"--plot {path}: needs matplotlib (pip install matplotlib, or vknorm[bench])") from None
        if not ext:
            raise UsageError(f"--plot {path}: no file extension (name a .png, .svg or .pdf file)")
        if ext not in formats:
            raise UsageError(f"--plot {path}: matplotlib cannot write .{ext} files (name a .png, .svg or .pdf file)")
        try:  # a format listed may still need more than matplotlib (.pgf: a TeX installation for its text): tried
            import io

            from matplotlib.figure import Figure  # type: ignore[import-not-found, unused-ignore]

            probe = Figure(figsize=(1, 1))
            probe.text(0.5, 0.5, "x")
            probe.savefig(io.BytesIO(), format=ext)
        except Exception as e:  # noqa: BLE001 - whatever the backend raises, before the sweep rather than after
            raise UsageError(f"--plot {path}: matplotlib cannot write .{ext} files here ({e}); name a .png, .svg "
                             "or .pdf file") from None
    if os.path.exists(path) and not os.path.isfile(path):
        return  # a FIFO, a device, /dev/stdout onto a pipe (whose link names no path): left to the write itself
    parent = os.path.dirname(os.path.realpath(path))  # where a symbolic link's target would be written
    if not os.path.isdir(parent):
        raise UsageError(f"{flag} {path}: no such directory {parent!r}")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{flag} {path}: directory {parent!r} is not writable")
    # What access() cannot tell (/proc, read-only mounts, a file root may not open): a regular file, or none yet,
    # opened and closed with nothing written (a FIFO or a device is left to the write itself: opening one blocks
    # or is seen by its reader). A symbolic link's target is what is opened, and removed again if it was new.
    real = os.path.realpath(path)
    existed = os.path.exists(real)
    try:
        with open(real, "ab"):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot be written ({e.strerror})") from None
    if not existed:
        os.unlink(real)


WARMUP_CHUNK = 20000  # forwards recorded into one warm-up submission at most


def _after_warmup(run, warmup_ms: float, probe_s: float):
    """run(warmup, reps=...) after warmup_ms of the same work on the GPU by the host's clock: submissions of at most
    WARMUP_CHUNK forwards, each waited for, sized from the time the last one took (a cold probe overstates a warm
    forward, and at a few microseconds a forward 20000 of them fall short of the default); the last part of the
    warm-up goes into the timed submission itself, right before the timed forwards. Returns what that run returns."""
    deadline = time.perf_counter() + warmup_ms / 1000.0
    per_forward, measured = max(probe_s, 1e-7), False
    while True:
        left = deadline - time.perf_counter()
        count = math.ceil(max(left, 0.0) / per_forward)
        if left < 0.005 or (measured and count <= WARMUP_CHUNK):  # the rest fits the timed submission
            return run(min(count, WARMUP_CHUNK))
        chunk = min(WARMUP_CHUNK, max(1, count // 2))  # half of what seems left: the rest sized from its time
        start = time.perf_counter()
        run(chunk, reps=1)
        per_forward, measured = max((time.perf_counter() - start) / chunk, 1e-7), True


def _bench_vknorm_and_copy(layer, vkmat, option, args, with_copy: bool, residual=None):
    """Median per-forward GPU time of vknorm and of the copy roofs, interleaved batch by batch.
    residual: a VkMat for the fused add (args.residual says whether the sum is written)."""
    from . import _core

    opt = option._native()
    if residual is None:
        def repeated(warmup, reps):
            return layer._layer.forward_repeated(vkmat, opt, warmup, reps)
    else:
        def repeated(warmup, reps):
            return layer._layer.forward_add_repeated(vkmat, residual, args.residual == "add+sum", opt, warmup, reps)
    probe = repeated(0, 10)
    copy_probe = _core.copy_repeated(vkmat, 0, 10, True) if with_copy else 0.0
    times: list = []
    copies: list = []
    buffer_copies: list = []
    info = probe
    for _ in range(args.batches):
        info = _after_warmup(lambda warm, reps=args.reps: repeated(warm, reps), args.warmup_ms, probe["gpu_us"] * 1e-6)
        times.append(info["gpu_us"])
        if with_copy:
            for shader, into in ((True, copies), (False, buffer_copies)):
                into.append(_after_warmup(lambda warm, reps=args.reps, shader=shader: _core.copy_repeated(
                    vkmat, warm, reps, shader), args.warmup_ms, copy_probe * 1e-6))
    med = statistics.median
    return med(times), info, (med(copies) if copies else None), (med(buffer_copies) if buffer_copies else None)


def _ncnn_param(op: str, rows: int, cols: int, layers: int, affine: bool = True) -> str:
    kind = "LayerNorm" if op == "layernorm" else "RMSNorm"
    lines = ["7767517", f"{layers + 1} {layers + 1}", f"Input in0 0 1 b0 0={cols} 1={rows}"]
    for i in range(layers):
        lines.append(f"{kind} n{i} 1 1 b{i} b{i + 1} 0={cols} 1=1e-05 2={int(affine)}")
    return "\n".join(lines) + "\n"


def _ncnn_channel_param(op: str, c: int, h: int, w: int, groups: int, layers: int, affine: bool = True) -> str:
    lines = ["7767517", f"{layers + 1} {layers + 1}", f"Input in0 0 1 b0 0={w} 1={h} 2={c}"]
    for i in range(layers):
        params = (f"0={groups} 1={c} 2=1e-05 3={int(affine)}" if op == "groupnorm" else f"0={c} 1=1e-05 2={int(affine)}")
        lines.append(f"{'GroupNorm' if op == 'groupnorm' else 'InstanceNorm'} n{i} 1 1 b{i} b{i + 1} {params}")
    return "\n".join(lines) + "\n"


def _bench_ncnn(op: str, rows: int, cols: int, fp16: bool, x: np.ndarray, affine: bool = True,
                shape: Optional[Tuple[int, int, int, int]] = None, packing: bool = True):
    """ncnn's Vulkan layer: (chain of k layers - chain of 1) / (k - 1), wall clock, each chain the least of 3 runs.
    shape: (channels, h, w, groups) for groupnorm/instancenorm; packing: ncnn's use_packing_layout, as vknorm's."""
    import ncnn  # type: ignore[import-untyped, import-not-found]  # pyncnn: no types, optional

    # (run() checked that pyncnn sees a GPU before any shape, and skipped the comparison where it sees none)
    weights_of = cols if shape is None else shape[0]
    per_layer = (1 if op == "rmsnorm" else 2) if affine else 0
    tmp = tempfile.mkdtemp(prefix="vknorm-bench-")

    def run_chain(layers: int, repeat: int = 3) -> float:
        param = os.path.join(tmp, f"chain{layers}.param")
        with open(param, "w") as f:
            f.write(_ncnn_param(op, rows, cols, layers, affine) if shape is None
                    else _ncnn_channel_param(op, *shape, layers, affine))
        weights = os.path.join(tmp, f"chain{layers}.bin")
        w = [np.ones(weights_of, np.float32), np.zeros(weights_of, np.float32)][:per_layer]
        np.tile(np.concatenate(w) if w else np.zeros(0, np.float32), layers).astype(np.float32).tofile(weights)
        net = ncnn.Net()
        net.opt.use_vulkan_compute = True
        net.opt.use_fp16_storage = fp16
        net.opt.use_fp16_packed = fp16
        net.opt.use_fp16_arithmetic = False
        net.opt.use_bf16_storage = False
        net.opt.use_packing_layout = packing
        net.load_param(param)
        net.load_model(weights)
        best = float("inf")
        for attempt in range(repeat + 1):  # the first run builds pipelines
            inp = ncnn.Mat(x).clone()
            ex = net.create_extractor()
            t0 = time.perf_counter()
            ex.input("b0", inp)
            ret, out = ex.extract(f"b{layers}")
            if ret != 0:
                raise RuntimeError(f"ncnn extract failed ({ret})")
            np.asarray(out)
            if attempt:
                best = min(best, time.perf_counter() - t0)
            del ex, out
        net.clear()
        return best

    try:
        t1 = run_chain(1)
        t9 = run_chain(9)
        est = max((t9 - t1) / 8, 1e-6)
        k = int(min(1025, max(17, 0.5 / est)))
        tk = run_chain(k)
    finally:  # the chains' .param/.bin (up to 1025 layers' weights: hundreds of MB at large shapes)
        shutil.rmtree(tmp, ignore_errors=True)
    return max(tk - t1, 0.0) / (k - 1) * 1e6


def _torch_unavailable() -> Optional[str]:
    """Why torch cannot be compared here (None: it can)."""
    try:
        import torch  # type: ignore[import-not-found]  # optional, and not installed where mypy runs
    except ImportError:
        return "torch not installed"
    if not torch.cuda.is_available():
        return "torch has no CUDA device"
    return None


def _bench_torch(op: str, rows: int, cols: int, fp16: bool, reps: int, affine: bool = True, shape=None,
                 residual: bool = False, activation: Optional[str] = None):
    """torch CUDA: the add (residual), the norm and the activation as an unfused graph runs them.

    Returns (us per forward, how it was timed)."""
    import torch
    import torch.nn.functional as F  # type: ignore[import-not-found]  # optional, as torch above

    dt = torch.float16 if fp16 else torch.float32
    if shape is not None:  # (channels, h, w, groups), batch 1 as ncnn runs it
        c, h, w_, g = shape
        x = torch.randn(1, c, h, w_, device="cuda", dtype=dt)
        w = torch.ones(c, device="cuda", dtype=dt) if affine else None
        b = torch.zeros(c, device="cuda", dtype=dt) if affine else None
        norm = ((lambda t: F.group_norm(t, g, w, b, 1e-5)) if op == "groupnorm"
                else (lambda t: F.instance_norm(t, weight=w, bias=b, eps=1e-5)))
    else:
        x = torch.randn(rows, cols, device="cuda", dtype=dt)
        w = torch.ones(cols, device="cuda", dtype=dt) if affine else None
        b = torch.zeros(cols, device="cuda", dtype=dt) if affine else None
        norm = ((lambda t: F.layer_norm(t, (cols,), w, b, 1e-5)) if op == "layernorm"
                else (lambda t: F.rms_norm(t, (cols,), w, 1e-5)))
    r = torch.randn_like(x) if residual else None
    act = {None: lambda t: t, "relu": F.relu, "leakyrelu": lambda t: F.leaky_relu(t, LEAKY_SLOPE), "sigmoid": torch.sigmoid,
           "swish": F.silu, "gelu": F.gelu, "gelu_fast": lambda t: F.gelu(t, approximate="tanh")}[activation]
    fn = (lambda: act(norm(x + r))) if residual else (lambda: act(norm(x)))  # each op a kernel, as unfused
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    # The forwards are replayed from a CUDA graph, as vknorm's are recorded into one command buffer: the GPU's time,
    # not Python's launch rate (which bounds eager calls of small layers). A graph of at most TORCH_GRAPH_CALLS
    # forwards is replayed until the batch holds about `reps` of them.
    calls = min(reps, TORCH_GRAPH_CALLS)
    replays = max(1, round(reps / calls))
    try:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # capture wants its ops warmed up off the default stream
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        batch, method = graph.replay, "CUDA graph replays, CUDA events"
    except RuntimeError as e:  # an op this torch cannot capture: eager calls, launch-bound for small layers
        print(f"vknorm bench: torch CUDA graph capture failed ({str(e).splitlines()[0]}): timing eager calls",
              file=sys.stderr)
        torch.cuda.synchronize()
        calls, replays = reps, 1
        batch, method = (lambda: [fn() for _ in range(reps)]), "eager calls, CUDA events"
    # keep the clock up, then time a batch with CUDA events. Each warm-up batch is waited for: replays are queued
    # far faster than they run, and 150 ms of queueing would be seconds of GPU work ahead of the timed batch.
    samples = []
    for _ in range(5):
        t_end = time.perf_counter() + 0.15
        while time.perf_counter() < t_end:
            batch()
            torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            batch()
        stop.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(stop) * 1000.0 / (calls * replays))
    return statistics.median(samples), method


def run_model(args) -> int:
    from .check import parse_inputs, parse_model_inputs, require_distinct, require_file
    from .cli import UsageError
    from .model_bench import format_table, run_model_bench

    param, binp = args.model
    for path, what in ((param, "model .param"), (binp, "weights .bin")):
        try:
            require_file(path, what)
        except UsageError as e:
            raise UsageError(f"--model {e}") from None
    require_distinct(param, binp)
    if not 1 <= args.iters <= 100000:
        raise UsageError("--iters must be 1..100000")
    dims = parse_inputs(args.input or [])
    parse_model_inputs(param, dims)  # every input of the model named (none where it has no Input layer), and only those
    custom_layers.use(args.custom_layers)
    try:
        from . import graph  # noqa: F401
    except ImportError as e:
        raise UsageError(str(e)) from None
    bar = None
    try:
        from tqdm import tqdm

        # the total (rounds of every phase) comes with the first round's progress
        bar = tqdm(total=None, desc="inferences", unit="round", file=sys.stderr, leave=False,
                   disable=not sys.stderr.isatty(), **bar_width())
    except ImportError:
        pass
    from ._fork import crashed_running, fork_is_safe, run_in_child
    from .cli import require_settings

    def bench():  # in the worker: the parent touches no Vulkan, so that it may fork
        from . import _core

        # vknorm's settings (VKNORM_MAX_SHARED_MEMORY, VKNORM_PATH, ...) checked first: inside ncnn a bad one fails
        # the load or an extract
        _core.devices()
        require_settings()
        try:
            with custom_layers.running():
                return run_model_bench(param, binp, dims, fp16=args.fp16, iters=args.iters,
                                       warmup_ms=args.warmup_ms,
                                       progress=(lambda i, n: (setattr(bar, "total", n), bar.update(1)))
                                       if bar is not None else None)
        except RuntimeError as e:  # ncnn could not load or run the model
            raise UsageError(str(e)) from None
        finally:
            if bar is not None:  # (a bar without a total has no truth value)
                bar.close()

    # In a forked child, as `vknorm check` runs: ncnn crashing on shapes a model cannot take (SIGFPE in
    # its MultiHeadAttention, say) becomes one line and exit 2. VKNORM_BENCH_INPROCESS=1: no child.
    if fork_is_safe("VKNORM_BENCH_INPROCESS"):
        report = run_in_child(bench, crashed_running(param, dims))
    else:
        report = bench()
    for w in report["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    if args.json != "-":
        print(format_table(report))
    write_json(report, args.json)
    return 0


def run(args) -> int:
    from . import GroupNorm, InstanceNorm, LayerNorm, Option, RMSNorm, _core, device_info, to_device
    from .cli import UsageError, same_file
    from .layers import _require_host_memory

    def given(dest: str) -> bool:  # flags are None (store_true ones False) until filled in below; 0 is given
        value = getattr(args, dest)
        return value is not None and value is not False

    other_mode = [f"--{dest.replace('_', '-')}" for dest in (SWEEP_ONLY if args.model else MODEL_ONLY) if given(dest)]
    if other_mode:
        verb = "goes" if len(other_mode) == 1 else "go"
        raise UsageError(f"{', '.join(other_mode)} {verb} with "
                         + ("the kernel sweep, not --model (the model's layers and --input shapes decide there)"
                            if args.model else "--model (the kernel sweep takes --dtype, --reps and --batches)"))
    # --elements and --no-latency shape the default LayerNorm/RMSNorm sweep; refused where another one runs
    default_sweep = [f"--{dest.replace('_', '-')}" for dest in ("elements", "no_latency") if given(dest)]
    if default_sweep and (given("rows") or given("cols")):
        raise UsageError(f"{', '.join(default_sweep)}: for the default sweep, not the shapes --rows/--cols give")
    if default_sweep and args.op in CHANNEL_OPS:
        raise UsageError(f"{', '.join(default_sweep)}: for the default LayerNorm/RMSNorm sweep, not --op {args.op}")
    for dest, default in {**SWEEP_ONLY, **MODEL_ONLY}.items():
        if getattr(args, dest) is None:
            setattr(args, dest, list(default) if isinstance(default, list) else default)
    if args.elements < 1:
        raise UsageError(f"--elements must be >= 1, got {args.elements}")
    if args.warmup_ms is None:
        args.warmup_ms = 300.0 if args.model else 150.0
    if not 0 <= args.warmup_ms <= 60000:
        raise UsageError("--warmup-ms must be 0..60000")
    if args.json and args.json != "-" and _is_standard_output(args.json):
        args.json = "-"  # --json /dev/stdout: the JSON instead of the table, as for '-' (not after it)
    own_files = [*zip(("the model's .param", "its .bin"), args.model or [])]
    if args.custom_layers:
        own_files.append(("the --custom-layers file", args.custom_layers))
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        for what, own in own_files:
            if path and same_file(path, own):
                raise UsageError(f"{flag} {path} is {what}: the report would overwrite it; name another file")
        _check_output_path(flag, path)
    if args.json and args.plot and same_file(args.json, args.plot):
        raise UsageError(f"--json and --plot name the same file {args.plot!r}: the plot would overwrite the JSON")
    if args.model:
        return run_model(args)

    if not 100 <= args.reps <= 1_000_000:
        raise UsageError("--reps: 100..1000000 back-to-back forwards per batch")
    if not 1 <= args.batches <= 1000:
        raise UsageError("--batches must be 1..1000")
    compare = {c.strip() for c in args.compare.split(",") if c.strip()}
    unknown = compare - set(IMPLS)
    if unknown:
        raise UsageError(f"--compare: unknown {', '.join(sorted(unknown))} (choose from {', '.join(IMPLS)})")
    try:
        Option(path=args.path)  # as each measurement builds it: any path it refuses ('' among them) is refused here
    except ValueError as e:
        raise UsageError(f"--path: {e}") from None
    ops = ["layernorm", "rmsnorm"] if args.op == "both" else [args.op]
    dtypes = ["fp32", "fp16"] if args.dtype == "both" else [args.dtype]
    channel_op = args.op in CHANNEL_OPS
    skipped: List[dict] = []  # what the run leaves out, and why: the JSON's "skipped"
    # (rows, cols, kind, channel shape or None): a channel shape is benchmarked as a (c, h, w) blob.
    shapes: List[Tuple[int, int, str, Optional[Tuple[int, int, int, int]]]]
    if channel_op:
        shapes = [(c, h * w, "sweep", (c, h, w, g)) for c, h, w, g in _channel_shapes(args, skipped)]
    else:
        shapes = [(r, c, kind, None) for r, c, kind in _shapes(args)]
    seen = set()
    for rows, cols, kind, cshape in shapes:  # a shape twice would be timed twice and tabled once
        key = (rows, cols, kind, cshape)  # (the default sweep's latency shapes may be sweep shapes too)
        if key in seen:
            raise UsageError(f"shape {f'{rows}x{cols}' if cshape is None else _shape_label(args.op, cshape)} is "
                             "given twice")
        seen.add(key)
    info = device_info()
    if not info["timestamps"]:  # every time would read 0, and every row be dropped: an empty table that exits 0
        raise UsageError(f"{info['name']} has no timestamps on its compute queue: vknorm bench measures GPU time "
                         "with them (vknorm check still judges the layers)")
    # Every shape's peak host memory, before the first input is made: its float32 arrays (input, residual, gamma and
    # beta), each of which also becomes a device buffer by way of a staging one. Where device memory is host memory
    # (a CPU device) that is 3x the arrays, and the copy roof's output on top (lavapipe, 2^24 columns: 3.0x);
    # elsewhere the arrays and their staging copies (the layer checks device memory itself).
    on_host = info["type"] == "cpu"
    for rows, cols, _, cshape in shapes:
        n_weights = 0 if args.no_affine else cols if cshape is None else cshape[0]
        inputs = rows * cols * 4 * (2 if args.residual else 1)
        arrays = inputs + n_weights * 4 * (1 if args.op == "rmsnorm" else 2)
        peak = 3 * arrays + (rows * cols * 4 if "copy" in compare else 0) if on_host else 2 * arrays
        _require_host_memory(f"{rows}x{cols}" if cshape is None else _shape_label(args.op, cshape), peak,
                             "its input and weights, on the host and on the way to the device")
    # and each blob within one storage-buffer binding as the planner takes it (the kernels are timed whole, not in
    # pieces), before the first is timed
    limit, limited_by = _core.binding_limit(info["max_storage_buffer_range"])
    widest = 4 if "fp32" in dtypes else 2
    for rows, cols, _, cshape in shapes:
        blob = rows * cols * widest if cshape is None else \
            cshape[0] * _core.ncnn_cstep(3, cshape[2], cshape[1], 1, widest) * widest
        if blob > limit:
            label = f"{rows}x{cols}" if cshape is None else _shape_label(args.op, cshape)
            raise UsageError(f"shape {label}: its blob of {blob} bytes is larger than one storage buffer "
                             f"({limited_by}: {limit} bytes): vknorm bench times a kernel on one buffer; give a "
                             "smaller shape")
    if "fp16" in dtypes and not info["storage_16bit"]:  # float16 would run as float32 storage: not what is asked
        if args.dtype == "fp16":
            raise UsageError(f"--dtype fp16: {info['name']} has no 16-bit storage (float16 would run as float32 "
                             "storage)")
        _skip(skipped, "fp16", f"{info['name']} has no 16-bit storage")
        dtypes = ["fp32"]
    if "torch" in compare:
        why = _torch_unavailable()
        if why:
            _skip(skipped, "the torch comparison", why)
            compare.discard("torch")
    if "ncnn" in compare and (args.residual or args.activation):
        # ncnn's layer alone is not the fused kernel's counterpart
        _skip(skipped, "the ncnn comparison", "ncnn has no layer that fuses --residual/--activation")
        compare.discard("ncnn")
    if "ncnn" in compare:
        try:
            import ncnn
        except ImportError:
            _skip(skipped, "the ncnn comparison", "ncnn (pip ncnn) not installed")
            compare.discard("ncnn")
        else:
            from ._stdio import quiet_stderr

            with quiet_stderr():  # ncnn prints its device banner when it creates its Vulkan instance
                gpus = ncnn.get_gpu_count()
            if gpus == 0:
                _skip(skipped, "the ncnn comparison", "ncnn (pip ncnn) sees no Vulkan device")
                compare.discard("ncnn")

    results = []
    progress = _Progress(len(ops) * len(dtypes) * len(shapes))
    rng = np.random.default_rng(0)
    try:
        for op in ops:
            for dtype in dtypes:
                fp16 = dtype == "fp16"
                for rows, cols, kind, cshape in shapes:
                    label = f"{rows}x{cols}" if cshape is None else _shape_label(op, cshape)
                    progress.start(f"{op} {dtype} {label}")
                    affine = not args.no_affine
                    option = Option(use_fp16_storage=fp16, use_packing_layout=not args.no_packing, path=args.path)
                    layer: Union[LayerNorm, RMSNorm, GroupNorm, InstanceNorm]
                    if cshape is None:
                        x = rng.standard_normal((rows, cols), dtype=np.float32)
                        layer = (LayerNorm if op == "layernorm" else RMSNorm)(affine_size=cols, eps=1e-5, affine=affine)
                        n_weights = cols
                    else:
                        c, h, w, g = cshape
                        x = rng.standard_normal((c, h, w), dtype=np.float32)
                        layer = GroupNorm(g, c, 1e-5, affine) if op == "groupnorm" else InstanceNorm(c, 1e-5, affine)
                        n_weights = c
                    if not affine:
                        pass  # nothing to load
                    elif op == "rmsnorm":
                        layer.load_model(np.ones(n_weights, np.float32))
                    else:  # not RMSNorm: gamma and beta
                        cast("Union[LayerNorm, GroupNorm, InstanceNorm]", layer).load_model(
                            np.ones(n_weights, np.float32), np.zeros(n_weights, np.float32))
                    if args.activation:
                        layer.set_activation(args.activation, LEAKY_SLOPE if args.activation == "leakyrelu" else 0.0)
                    vkmat = to_device(x, option)
                    residual = to_device(rng.standard_normal(x.shape, dtype=np.float32), option) if args.residual else None
                    nbytes = x.size * (2 if fp16 else 4)
                    # Tensor streams the kernel moves: x in and y out, + the residual in, + the sum out.
                    streams = 2 + (1 if args.residual else 0) + (1 if args.residual == "add+sum" else 0)
                    # the copy shader moves vec4s: a blob under 16 bytes has no copy roof
                    us, disp, copy_us, copybuf_us = _bench_vknorm_and_copy(
                        layer, vkmat, option, args, "copy" in compare and nbytes >= 16, residual)
                    base = {"op": op, "dtype": dtype, "rows": rows, "cols": cols, "kind": kind, "affine": affine,
                            "packing": not args.no_packing, "shape": label}
                    if args.residual or args.activation:
                        base.update(residual=args.residual or "none", activation=args.activation or "none")
                    if cshape is not None:
                        base.update(channels=cshape[0], h=cshape[1], w=cshape[2], groups=cshape[3] or cshape[0])

                    def add(impl, t, dispatches, n_streams=2, **extra):
                        if t is None:
                            return
                        if t <= 0:  # (ncnn's chain difference, within the noise of its wall clock)
                            _skip(skipped, f"{impl} at {label} {dtype}", "its time came out 0 or less")
                            return
                        results.append({**base, "impl": impl, "gpu_us": round(t, 3),
                                        "gbps": float(f"{n_streams * nbytes / (t * 1e3):.4g}"), "streams": n_streams,
                                        "dispatches": dispatches, **extra})

                    add("vknorm", us, disp["dispatches"], streams, path=disp["path"], team=disp["team"], items=disp["items"])
                    if copy_us is not None:
                        add("copy", copy_us, 1)
                        add("copy_buffer", copybuf_us, 1)
                    del vkmat, residual
                    if "ncnn" in compare and kind == "sweep":
                        add("ncnn", _bench_ncnn(op, rows, cols, fp16, x, affine, cshape, not args.no_packing), None,
                            method="chain difference, wall clock")
                    if "torch" in compare:
                        torch_us, torch_method = _bench_torch(op, rows, cols, fp16, args.reps, affine, cshape,
                                                              bool(args.residual), args.activation)
                        add("torch", torch_us, 1 + bool(args.residual) + bool(args.activation), streams,
                            method=torch_method)
                    progress.done()
    finally:  # an error mid-sweep ends the bar first, so its one line stands alone
        progress.close()
    report = {
        "device": info["name"],
        "driver": f"{info['driver_name']} {info['driver_info']}".strip(),
        "date": datetime.date.today().isoformat(),
        "method": f"Vulkan timestamps, batches of {args.reps} back-to-back forwards after {args.warmup_ms:g} ms "
                  "warm-up, median",
        "warmup_ms": args.warmup_ms,
        "skipped": skipped,
        "results": results,
    }
    if args.json != "-":
        print_table(report)
    write_json(report, args.json)
    if args.plot:
        plot(report, args.plot)
    return 0


def _shape_label(op: str, shape) -> str:
    c, h, w, g = shape
    return f"{c}x{h}x{w}" + (f"/{g}" if op == "groupnorm" else "")


def _gbps_text(gbps: float) -> str:
    """GB/s to about three digits: tiny shapes' fractions are not printed as 0."""
    return f"{gbps:.0f}" if gbps >= 100 else f"{gbps:.1f}" if gbps >= 1 else f"{gbps:.3g}"


def print_table(report: dict) -> None:
    rows: Dict[Tuple[str, str, str], Dict[str, Any]] = {}  # (op, dtype, shape) -> impl -> its result
    for r in report["results"]:  # one row per measurement: a latency shape may also be a sweep's
        shape = r.get("shape") or f"{r['rows']}x{r['cols']}"
        if r.get("kind", "sweep") != "sweep":
            shape += f" ({r['kind']})"
        rows.setdefault((r["op"], r["dtype"], shape), {})[r["impl"]] = r
    width = max([16] + [len(shape) for _, _, shape in rows])
    print(f"device: {report['device']} ({report['driver']})")
    head = (f"{'op':<12} {'dtype':<5} {'shape':>{width}} {'vknorm us':>10} {'GB/s':>7} {'% copy':>7} {'x ncnn':>7} "
            f"{'x torch':>8}  path")
    print(head)
    print("-" * len(head))
    for (op, dtype, shape), impls in rows.items():
        v = impls.get("vknorm")
        if v is None:
            continue
        # % of the copy roof by bandwidth: a fused add moves 3 or 4 tensor streams, a copy 2
        pct = (f"{100 * (v.get('streams', 2) / v['gpu_us']) / (2 / impls['copy']['gpu_us']):.0f}"
               if "copy" in impls else "-")
        xn = f"{impls['ncnn']['gpu_us'] / v['gpu_us']:.2f}" if "ncnn" in impls else "-"
        xt = f"{impls['torch']['gpu_us'] / v['gpu_us']:.2f}" if "torch" in impls else "-"
        fused = [v[k] for k in ("residual", "activation") if v.get(k, "none") != "none"]
        print(f"{op:<12} {dtype:<5} {shape:>{width}} {v['gpu_us']:>10.1f} {_gbps_text(v['gbps']):>7} {pct:>7} {xn:>7} {xt:>8}  "
              f"{v['path']} ({v['dispatches']} dispatch{'es' if v['dispatches'] != 1 else ''})" + (f", fused {' + '.join(fused)}" if fused else ""))


def plot(report: dict, path: str) -> None:
    """GB/s against cols per implementation, one panel per (op, dtype), the copy roof dashed (matplotlib: checked
    with the flags, before the sweep)."""
    import matplotlib  # type: ignore[import-not-found, unused-ignore]  # an optional extra

    from .cli import UsageError

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    sweep = [r for r in report["results"] if r.get("kind", "sweep") == "sweep"]
    ops = sorted({r["op"] for r in sweep})
    dtypes = sorted({r["dtype"] for r in sweep}, reverse=True)  # fp32 first
    if not ops:
        return
    fig, axes = plt.subplots(len(ops), len(dtypes), figsize=(6 * len(dtypes), 4.2 * len(ops)), squeeze=False)
    panels = [(op, dt) for op in ops for dt in dtypes]
    styles = {"vknorm": ("C0", "-", "o"), "ncnn": ("C1", "-", "s"), "torch": ("C2", "-", "^"),
              "copy": ("k", "--", None), "copy_buffer": ("0.6", ":", None)}
    for ax, (op, dtype) in zip(axes.flat, panels):
        shapes = list(dict.fromkeys(r["shape"] for r in sweep if r["op"] == op and r["dtype"] == dtype))
        # one point per shape, in run order, for channel shapes, and where one cols comes with several rows
        by_shape = op in CHANNEL_OPS or len({s.split("x")[1] for s in shapes}) < len(shapes)
        for impl, (color, ls, marker) in styles.items():
            mine = [r for r in sweep if r["op"] == op and r["dtype"] == dtype and r["impl"] == impl]
            pts = sorted((shapes.index(r["shape"]), r["gbps"]) for r in mine) if by_shape else sorted(
                (r["cols"], r["gbps"]) for r in mine)
            if pts:
                label = {"copy": "copy shader (roof)", "copy_buffer": "vkCmdCopyBuffer"}.get(impl, impl)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, linestyle=ls, marker=marker, label=label)
        if by_shape:
            ax.set_xticks(range(len(shapes)), shapes, rotation=20, fontsize=8)
            ax.set_xlabel("channels x h x w (/groups)" if op in CHANNEL_OPS else "rows x cols")
        else:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("cols (group size)")
        ax.set_ylabel("effective GB/s (tensor streams x bytes / time)")
        mine = [r for r in sweep if r["op"] == op and r["dtype"] == dtype]
        fused = sorted({f"{k} {r[k]}" for r in mine for k in ("residual", "activation") if r.get(k, "none") != "none"})
        streams = sorted({r["streams"] for r in mine if r["impl"] == "vknorm"})
        ax.set_title(f"{op} {dtype}" + (f" + {', '.join(fused)}" if fused else "")
                     + (f" (vknorm: {'/'.join(map(str, streams))} streams)" if streams and streams != [2] else ""))
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(f"{report['device']} — {report.get('date', '')}", fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except (OSError, RuntimeError) as e:  # the file (not standard output), or what its format needs
        raise UsageError(f"--plot {path}: {getattr(e, 'strerror', None) or e}") from None

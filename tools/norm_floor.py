#!/usr/bin/env python3
"""The most a faster norm can give a whole ncnn model: stock ncnn Vulkan beside the same model with every
norm layer (LayerNorm, RMSNorm, GroupNorm, InstanceNorm) replaced by a 1 -> 1 Split, which ncnn's Vulkan
graph runs as no dispatch at all (the output shares the input blob), and beside vknorm inside the graph,
unfused and fused. Wall ms per inference, timed as `vknorm bench --model` times its GPU implementations
(vknorm.model_bench: a new extractor, inputs from numpy, every output back; rounds in a new random order
each), median.

    python tools/norm_floor.py [--iters 80] [--fp16] [--json OUT.json] [MODEL ...]

MODEL: names in tests/data/models.json (default: the four transformer / UNet blocks). "no-norms" is a
timing figure, not a model: the norms' weights stay in the .bin, so the layers after them load shifted
weights (same shapes, so the same pipelines and the same work).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import numpy as np

from vknorm.cli import positive_int

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
NORMS = {"LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm"}
NETS = ("ncnn-vulkan", "no-norms", "vknorm-in-graph", "vknorm-fused")


def without_norms(param_text: str) -> str:
    """The param text with each norm layer replaced by a Split of one output (same layer and blob names)."""
    lines = param_text.splitlines()
    out = lines[:2]
    for line in lines[2:]:
        f = line.split()
        if f and f[0] in NORMS:
            if f[2] != "1" or f[3] != "1":
                raise ValueError(f"{f[1]}: a norm with {f[2]} inputs and {f[3]} outputs")
            line = f"Split {f[1]} 1 1 {f[4]} {f[5]}"
        out.append(line)
    return "\n".join(out) + "\n"


def measure(name: str, dims, fp16: bool, iters: int, seed: int = 0) -> dict:
    from vknorm.model_bench import ModelRunner, time_rounds

    param, binp = (os.path.join(DATA, f"{name}.ncnn.{e}") for e in ("param", "bin"))
    with open(param) as f:
        stripped = without_norms(f.read())
    with tempfile.NamedTemporaryFile("w", suffix=".param", delete=False) as tmp:
        tmp.write(stripped)
    inputs = {"in0": np.random.default_rng(seed).standard_normal(dims).astype(np.float32)}
    try:  # no-norms is stock ncnn Vulkan on the stripped param (ncnn loads a .bin longer than it reads)
        runs = {net: ModelRunner("ncnn-vulkan" if net == "no-norms" else net,
                                 tmp.name if net == "no-norms" else param, binp, inputs, fp16) for net in NETS}
    finally:
        os.unlink(tmp.name)
    samples = time_rounds(runs, iters, warmup_ms=300.0, seed=seed)
    return {k: round(statistics.median(v), 4) for k, v in samples.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", default=["ln_residual_stack", "transformer_block", "llama_block", "sd_resblock"])
    ap.add_argument("--iters", type=positive_int, default=80, help="timed inferences per net")
    ap.add_argument("--fp16", action="store_true", help="float16 storage")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    with open(os.path.join(DATA, "models.json")) as f:
        known = json.load(f)
    unknown = [m for m in args.models if m not in known or m.startswith("_")]
    if unknown:
        print(f"norm_floor: unknown model {', '.join(unknown)} (tests/data/models.json)", file=sys.stderr)
        return 2
    from vknorm.bench import _check_output_path
    from vknorm.cli import UsageError

    try:  # before the models run, not after
        _check_output_path("--json", args.json)
    except UsageError as e:
        ap.error(str(e))
    report = {"fp16": args.fp16, "iters": args.iters, "results": []}
    print(f"{'model':<20} {'storage':<7} " + " ".join(f"{k:>22}" for k in NETS))
    for name in args.models:
        ms = measure(name, tuple(int(v) for v in known[name].split("x")), args.fp16, args.iters)
        report["results"].append({"model": name, "ms": ms})
        cells = [f"{ms[k]:.3f} ({ms['ncnn-vulkan'] / ms[k]:.2f}x)" for k in NETS]
        print(f"{name:<20} {'fp16' if args.fp16 else 'fp32':<7} " + " ".join(f"{c:>22}" for c in cells), flush=True)
    from vknorm import graph

    report["device"] = graph.gpu_name()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What one more layer costs inside ncnn's Vulkan graph: wall ms per inference of chains of N identical layers
(N = 1, 9, 33) through vknorm.model_bench.ModelRunner (a new extractor, input from numpy, the output back), so
the slope between N = 9 and 33 is the per-layer cost with the fixed cost of an inference taken out.

    python chain.py [--rows 16 --cols 64] [--fp16] [--calls 100] [--rounds 3]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

LAYERS = {  # name -> (impl, layer type, its params)
    "unary-abs (stock)": ("ncnn-vulkan", "UnaryOp", "0=0"),
    "add-scalar (stock)": ("ncnn-vulkan", "BinaryOp", "0=0 1=1 2=1.0"),
    "layernorm (stock)": ("ncnn-vulkan", "LayerNorm", "0={w} 1=1e-5 2=0"),
    "layernorm (vknorm)": ("vknorm-in-graph", "LayerNorm", "0={w} 1=1e-5 2=0"),
    "rmsnorm (stock)": ("ncnn-vulkan", "RMSNorm", "0={w} 1=1e-5 2=0"),
    "rmsnorm (vknorm)": ("vknorm-in-graph", "RMSNorm", "0={w} 1=1e-5 2=0"),
}


def chain_param(layer_type, params, n, rows, cols):
    """A model of n layers of one type in a chain, from in0 (rows x cols) to its output."""
    lines = ["7767517", f"{n + 1} {n + 1}", f"Input in0 0 1 in0 0={cols} 1={rows}"]
    for i in range(n):
        lines.append(f"{layer_type} l{i} 1 1 {'in0' if i == 0 else f'b{i}'} b{i + 1} {params.format(w=cols)}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    from vknorm.model_bench import ModelRunner

    x = np.random.default_rng(0).standard_normal((a.rows, a.cols)).astype(np.float32)
    tmp = tempfile.mkdtemp()
    empty_bin = os.path.join(tmp, "empty.bin")
    open(empty_bin, "wb").close()
    runners = {}
    for name, (impl, t, p) in LAYERS.items():
        for n in (1, 9, 33):
            text = chain_param(t, p, n, a.rows, a.cols)
            path = os.path.join(tmp, f"{t}_{impl}_{n}.param")
            with open(path, "w") as f:
                f.write(text)
            runners[(name, n)] = ModelRunner(impl, path, empty_bin, {"in0": x}, a.fp16)
    times = {k: [] for k in runners}
    for _ in range(a.rounds):
        for k, r in runners.items():
            for _ in range(max(20, a.calls // 2)):
                r()
            for _ in range(a.calls):
                t0 = time.perf_counter()
                r()
                times[k].append((time.perf_counter() - t0) * 1e3)
    out = {}
    storage = "fp16" if a.fp16 else "fp32"
    print(f"{a.rows}x{a.cols} {storage}: median ms per inference; per layer: (N=33 - N=9) / 24 in us")
    for name in LAYERS:
        med = {n: statistics.median(times[(name, n)]) for n in (1, 9, 33)}
        per = (med[33] - med[9]) / 24 * 1e3
        out[name] = {"ms": med, "per_layer_us": round(per, 2)}
        print(f"  {name:22s} N=1 {med[1]:.4f}  N=9 {med[9]:.4f}  N=33 {med[33]:.4f}  per layer {per:6.2f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": a.rows, "cols": a.cols, "fp16": a.fp16, "results": out}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

# Does the order of implementations within a round bias `vknorm bench --model`? Same nets, several orders.
import json, statistics, sys, time
import numpy as np
from vknorm.model_bench import ModelRunner as _Runner
from vknorm._stdio import quiet_stderr
models = json.load(open("tests/data/models.json"))
out = {}
for spec in sys.argv[1].split(","):
    name, st = spec.split(":")
    fp16 = st == "fp16"
    dims = tuple(int(v) for v in models[name].split("x"))
    x = {"in0": np.random.default_rng(0).standard_normal(dims).astype(np.float32)}
    p, b = f"tests/data/{name}.ncnn.param", f"tests/data/{name}.ncnn.bin"
    runners = {}
    with quiet_stderr([]):
        for impl in ("ncnn-cpu", "ncnn-vulkan", "vknorm-in-graph", "vknorm-fused", "vknorm-host"):
            runners[impl] = _Runner(impl, p, b, x, fp16)
    orders = {
        "bench_order": ["ncnn-cpu", "ncnn-vulkan", "vknorm-in-graph", "vknorm-fused", "vknorm-host"],
        "gpu_only": ["ncnn-vulkan", "vknorm-in-graph", "vknorm-fused"],
        "gpu_only_reversed": ["vknorm-fused", "vknorm-in-graph", "ncnn-vulkan"],
        "cpu_before_fused": ["ncnn-vulkan", "vknorm-in-graph", "ncnn-cpu", "vknorm-fused", "vknorm-host"],
        "rotated_all": "rot",
    }
    res = {}
    for oname, order in orders.items():
        impls = list(runners) if order == "rot" else order
        for k in impls:
            end = time.perf_counter() + 0.3
            while time.perf_counter() < end: runners[k]()
        s = {k: [] for k in impls}
        for i in range(60):
            seq = impls[i % len(impls):] + impls[:i % len(impls)] if order == "rot" else impls
            for k in seq:
                t0 = time.perf_counter(); runners[k](); s[k].append((time.perf_counter() - t0) * 1e3)
        med = {k: round(statistics.median(v), 4) for k, v in s.items()}
        st_ = med["ncnn-vulkan"]
        ratios = {k: round(st_ / med[k], 3) for k in ("vknorm-in-graph", "vknorm-fused")}
        res[oname] = {"ms": med, "x_stock": ratios}
        print(spec, f"{oname:18s}", med, ratios, flush=True)
    out[spec] = res
json.dump(out, open(sys.argv[2], "w"), indent=1)

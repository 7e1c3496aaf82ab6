"""Wall time per inference of committed models through vknorm.graph, command buffers kept by the net (default)
against one made and destroyed per extract (VKNORM_TUNE_FRESH_COMMAND_BUFFERS=1, as ncnn's own extract), for
stock ncnn layers and vknorm's fused ones, beside pyncnn (ncnn's wheel, its own extract) in a phase of its own.
One process; every round runs each graph configuration for a batch in a new random order; medians in ms.
Usage (GPU host, after tools/gpu_build.sh): python3 recycled_ab.py OUT.json [ROUNDS] [BATCH] [MODEL...]"""
import json
import os
import random
import sys
import time

import numpy as np

from vknorm import graph

out, rounds, batch = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 15, int(sys.argv[3]) if len(sys.argv) > 3 else 20
only = sys.argv[4:]
models = {k: v for k, v in json.load(open("tests/data/models.json")).items() if not k.startswith("_")}
names = only or ["ln_residual_stack", "transformer_block", "llama_block", "sd_resblock"]
random.seed(0)


def dims_of(name):
    return tuple(int(d) for d in models[name].split("x"))


def graph_net(name, vknorm, fp16):
    net = graph.configure(graph.Net(vknorm=vknorm), vulkan=True, fp16=fp16)
    assert net.load_param(f"tests/data/{name}.ncnn.param") == 0 and net.load_model(f"tests/data/{name}.ncnn.bin") == 0
    return net


def infer_graph(net, x):
    ex = net.create_extractor()
    ex.input("in0", x)
    r, m = ex.extract("out0")
    assert r == 0


def timed(f, n):
    t = []
    for _ in range(n):
        a = time.perf_counter()
        f()
        t.append((time.perf_counter() - a) * 1e3)
    return t


result = {"method": __doc__, "rounds": rounds, "batch": batch, "models": {}}
for name in names:
    for fp16 in (False, True):
        x = np.random.default_rng(0).standard_normal(dims_of(name)).astype(np.float32)
        gx = graph.Mat(x)
        nets = {"stock": graph_net(name, False, fp16), "vknorm-fused": graph_net(name, True, fp16)}
        configs = [(impl, fresh) for impl in nets for fresh in (True, False)]
        times = {f"{impl} {'fresh' if fresh else 'kept'}": [] for impl, fresh in configs}
        for impl, fresh in configs:  # warm
            os.environ["VKNORM_TUNE_FRESH_COMMAND_BUFFERS"] = "1" if fresh else "0"
            timed(lambda: infer_graph(nets[impl], gx), batch)
        for r in range(rounds):
            random.shuffle(configs)
            for impl, fresh in configs:
                os.environ["VKNORM_TUNE_FRESH_COMMAND_BUFFERS"] = "1" if fresh else "0"
                times[f"{impl} {'fresh' if fresh else 'kept'}"] += timed(lambda: infer_graph(nets[impl], gx), batch)
        os.environ.pop("VKNORM_TUNE_FRESH_COMMAND_BUFFERS")
        counters = {k: v for k, v in nets["vknorm-fused"].vknorm_counters().items() if k.startswith("command")}
        del nets
        try:
            import ncnn  # pyncnn, its own ncnn: stock layers, ncnn's extract
            net = ncnn.Net()
            opt = net.opt
            opt.use_vulkan_compute = True
            opt.use_fp16_storage = opt.use_fp16_packed = fp16
            opt.use_fp16_arithmetic = False
            net.load_param(f"tests/data/{name}.ncnn.param")
            net.load_model(f"tests/data/{name}.ncnn.bin")
            px = ncnn.Mat(x)

            def infer_pyncnn():
                ex = net.create_extractor()
                ex.input("in0", px)
                r, m = ex.extract("out0")
                assert r == 0

            timed(infer_pyncnn, batch)
            times["pyncnn stock"] = timed(infer_pyncnn, rounds * batch)
            del net
        except ImportError:
            pass
        med = {k: float(np.median(v)) for k, v in times.items()}
        tag = f"{name} {'fp16' if fp16 else 'fp32'}"
        result["models"][tag] = {"median_ms": med, "counters_fused_net": counters}
        line = "  ".join(f"{k} {v:.3f}" for k, v in med.items())
        print(f"{tag}: {line}  | fused/stock kept {med['stock kept'] / med['vknorm-fused kept']:.2f}x, "
              f"fresh {med['stock fresh'] / med['vknorm-fused fresh']:.2f}x", flush=True)
json.dump(result, open(out, "w"), indent=1)

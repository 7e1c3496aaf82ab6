"""Wall time of vknorm's host round trips (numpy in and out) per call, against torch's on the same GPU.

python3 round_trips.py OUT.json [--torch]   (vknorm from PYTHONPATH; median of repeated calls after a warm-up)
"""
import json
import statistics
import sys
import time

import numpy as np

SHAPES = [(3, 5, 64), (197, 768), (64, 4096), (1024, 4096)]


def median_ms(fn, n):
    for _ in range(3):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def vknorm_rows():
    import vknorm
    from vknorm import _core
    ctx = _core.Context.create(0)
    rows = []
    for shape in SHAPES:
        w = shape[-1]
        n = 20 if np.prod(shape) > 1 << 20 else 100
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        layer = vknorm.LayerNorm(affine_size=w, eps=1e-5, device=ctx)
        layer.load_model(np.ones(w, np.float32), np.zeros(w, np.float32))
        fp16 = vknorm.Option(use_fp16_storage=True)
        v = vknorm.to_device(x, device=ctx)
        calls = {"numpy forward": lambda: layer(x),
                 "numpy forward, fp16 storage": lambda: layer(x, option=fp16),
                 "to_device": lambda: vknorm.to_device(x, device=ctx),
                 "download().numpy()": lambda: v.download().numpy(),
                 "forward_add, numpy": lambda: layer.forward_add(x, x),
                 "resident forward": lambda: layer.forward_inplace(v)}
        if hasattr(v, "numpy"):  # VkMat.numpy(): unpacked as it leaves the staging memory
            calls["VkMat.numpy()"] = lambda: v.numpy()
        for name, fn in calls.items():
            rows.append({"impl": "vknorm", "shape": list(shape), "call": name, "ms": median_ms(fn, n)})
    return rows


def torch_rows():
    import torch
    rows = []
    for shape in SHAPES:
        n = 20 if np.prod(shape) > 1 << 20 else 100
        x = torch.randn(*shape)
        w = (shape[-1],)
        calls = {"numpy forward": lambda: torch.nn.functional.layer_norm(x.cuda(), w).cpu(),
                 "numpy forward, fp16 storage": lambda: torch.nn.functional.layer_norm(x.cuda().half(), w).float().cpu()}
        for name, fn in calls.items():
            rows.append({"impl": "torch", "shape": list(shape), "call": name, "ms": median_ms(fn, n)})
    return rows


if __name__ == "__main__":
    rows = torch_rows() if "--torch" in sys.argv else vknorm_rows()
    json.dump(rows, open(sys.argv[1], "w"), indent=1)
    for r in rows:
        print(f"{r['impl']:7s} {'x'.join(map(str, r['shape'])):>10s} {r['call']:30s} {r['ms']:8.3f} ms")

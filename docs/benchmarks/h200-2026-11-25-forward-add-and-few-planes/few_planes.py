"""numpy round trips of large tensors with few planes (ms, median): the conversions' split within planes.
python3 few_planes.py OUT.json"""
import json, statistics, sys, time
import numpy as np
import vknorm
from vknorm import _core


def median_ms(fn, n=20):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


ctx = _core.Context.create(0)
rows = []
for shape in [(3, 1024, 1024), (1, 2048, 2048), (1 << 22,), (1024, 4096), (64, 256, 256)]:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    if len(shape) <= 2:
        layer = vknorm.LayerNorm(affine_size=shape[-1], eps=1e-5, affine=False, device=ctx)
    else:
        layer = vknorm.InstanceNorm(channels=shape[0], eps=1e-5, affine=False, device=ctx)
    v = vknorm.to_device(x, device=ctx)
    calls = {"numpy forward": lambda: layer(x), "to_device": lambda: vknorm.to_device(x, device=ctx),
             "VkMat.numpy()": lambda: v.numpy()}
    for name, fn in calls.items():
        rows.append({"shape": list(shape), "call": name, "ms": median_ms(fn)})
json.dump(rows, open(sys.argv[1], "w"), indent=1)

"""GroupNorm(32) planned with workgroups capped at 1024 (the device's choice), 512 and 256 invocations
(vknorm.Option.max_workgroup_size), interleaved round by round, vknorm bench's method (batches of 100 back-to-back
forwards after 150 ms of the same work, copy roof beside). Usage: python team_ab.py [--json out.json]"""
import argparse
import json
import statistics
import types

import numpy as np

import vknorm
from vknorm.bench import _bench_vknorm_and_copy

SHAPES = [(640, 32, 32), (1280, 16, 16), (1280, 8, 8), (960, 32, 32), (1920, 16, 16), (2560, 8, 8)]
CAPS = (0, 512, 256)
ROUNDS = 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    args = types.SimpleNamespace(warmup_ms=150, reps=100, batches=3)
    rng = np.random.default_rng(0)
    rows = []
    for c, h, w in SHAPES:
        for fp16 in (False, True):
            layer = vknorm.GroupNorm(group=32, channels=c, eps=1e-5)
            layer.load_model(rng.uniform(0.5, 1.5, c).astype(np.float32), rng.uniform(-1, 1, c).astype(np.float32))
            x = rng.standard_normal((c, h, w)).astype(np.float32)
            times = {cap: [] for cap in CAPS}
            plans, copies = {}, []
            for _ in range(ROUNDS):
                for cap in CAPS:
                    opt = vknorm.Option(use_fp16_storage=fp16, max_workgroup_size=cap)
                    v = vknorm.to_device(x, opt)
                    t, info, copy, _ = _bench_vknorm_and_copy(layer, v, opt, args, with_copy=cap == 0)
                    times[cap].append(t)
                    plans[cap] = f"{info['path']} {info.get('workgroup_size')} x {info.get('items')}"
                    if copy:
                        copies.append(copy)
            copy = statistics.median(copies)
            row = {"shape": f"{c}x{h}x{w}/32", "dtype": "fp16" if fp16 else "fp32", "copy_us": copy,
                   "us": {str(cap): times[cap] for cap in CAPS}, "plans": {str(cap): plans[cap] for cap in CAPS}}
            rows.append(row)
            print(f"{row['shape']:>14} {row['dtype']}  copy {copy:5.2f}  " + "  ".join(
                f"cap {cap or 'device'}: {statistics.median(times[cap]):5.2f} us ({100 * copy / statistics.median(times[cap]):3.0f} %, {plans[cap]})"
                for cap in CAPS), flush=True)
    if a.json:
        json.dump({"device": vknorm.Context.default().device_name if hasattr(vknorm.Context.default(), "device_name") else None,
                   "rows": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()

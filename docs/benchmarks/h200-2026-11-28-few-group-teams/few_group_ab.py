"""GroupNorm/InstanceNorm plans with and without the few-group team rule (VKNORM_TUNE_FEW_GROUP_ITEMS=0: the
latency rule's wide teams), interleaved round by round in one process, with vknorm bench's method (batches of 100
back-to-back forwards after 150 ms of the same work; the copy roof beside). Usage: python few_group_ab.py [--json F]"""
import argparse
import json
import os
import statistics
import types

import numpy as np

import vknorm
from vknorm.bench import _bench_vknorm_and_copy

# (op, channels, h, w, groups): every kind of plan the rule changes, and two it leaves alone (1280x8x8, 320x64x64)
SHAPES = [("GroupNorm", 1280, 16, 16, 32), ("GroupNorm", 640, 32, 32, 32), ("GroupNorm", 2560, 8, 8, 32),
          ("GroupNorm", 1920, 16, 16, 32), ("GroupNorm", 96, 40, 40, 8), ("GroupNorm", 96, 16, 16, 2),
          ("GroupNorm", 64, 16, 16, 2), ("GroupNorm", 32, 40, 40, 32), ("GroupNorm", 960, 7, 7, 8),
          ("InstanceNorm", 64, 56, 56, 0), ("InstanceNorm", 64, 64, 64, 0), ("InstanceNorm", 32, 64, 64, 0),
          ("GroupNorm", 1280, 8, 8, 32), ("GroupNorm", 320, 64, 64, 32)]
SETTINGS = {"wide": "0", "narrow": None}
ROUNDS = 3


def layer_for(op, c, g, rng):
    layer = vknorm.GroupNorm(group=g, channels=c, eps=1e-5) if op == "GroupNorm" else vknorm.InstanceNorm(channels=c, eps=1e-5)
    layer.load_model(rng.uniform(0.5, 1.5, c).astype(np.float32), rng.uniform(-1, 1, c).astype(np.float32))
    return layer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    args = types.SimpleNamespace(warmup_ms=150, reps=100, batches=3)
    rng = np.random.default_rng(0)
    rows = []
    for op, c, h, w, g in SHAPES:
        for fp16 in (False, True):
            layer = layer_for(op, c, g, rng)
            x = rng.standard_normal((c, h, w)).astype(np.float32)
            opt = vknorm.Option(use_fp16_storage=fp16)
            v = vknorm.to_device(x, opt)
            times, plans, copies, outputs = {s: [] for s in SETTINGS}, {}, [], {}
            for _ in range(ROUNDS):
                for s, knob in SETTINGS.items():
                    if knob is None:
                        os.environ.pop("VKNORM_TUNE_FEW_GROUP_ITEMS", None)
                    else:
                        os.environ["VKNORM_TUNE_FEW_GROUP_ITEMS"] = knob
                    t, info, copy, _ = _bench_vknorm_and_copy(layer, v, opt, args, with_copy=s == "wide")
                    times[s].append(t)
                    plans[s] = f"{info['path']} {info.get('workgroup_size')} x {info.get('items')}"
                    outputs[s] = layer(x, option=opt)
                    if copy:
                        copies.append(copy)
            os.environ.pop("VKNORM_TUNE_FEW_GROUP_ITEMS", None)
            copy = statistics.median(copies)
            diff = float(np.max(np.abs(outputs["wide"].astype(np.float64) - outputs["narrow"])))
            label = f"{op} {c}x{h}x{w}" + (f"/{g}" if op == "GroupNorm" else "")
            med = {s: statistics.median(times[s]) for s in SETTINGS}
            rows.append({"layer": label, "dtype": "fp16" if fp16 else "fp32", "copy_us": copy,
                         "us": times, "plans": plans, "max_abs_diff": diff})
            print(f"{label:>26} {'fp16' if fp16 else 'fp32'}  copy {copy:5.2f}  " + "  ".join(
                f"{s}: {med[s]:5.2f} us ({100 * copy / med[s]:3.0f} %, {plans[s]})" for s in SETTINGS) +
                f"  x{med['wide'] / med['narrow']:.2f}  |diff| {diff:.1e}", flush=True)
    if a.json:
        json.dump({"rows": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()

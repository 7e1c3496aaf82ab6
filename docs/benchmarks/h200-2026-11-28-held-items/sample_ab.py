"""Every kind of plan the few-group team rule changes (a sample of the 217 GroupNorm/InstanceNorm shapes of a
sweep whose plans differ), the rule as it was (VKNORM_TUNE_FEW_GROUP_ITEMS=10, latency-bound tensors only)
against the new one, interleaved round by round in one process, with vknorm bench's method (batches of 100
back-to-back forwards after 150 ms of the same work; the copy roof beside). Usage: python sample_ab.py [--json F]"""
import argparse
import json
import os
import statistics
import types

import numpy as np

import vknorm
from vknorm.bench import _bench_vknorm_and_copy

# (op, channels, h, w, groups)
SHAPES = [("GroupNorm", 128, 64, 64, 32), ("GroupNorm", 1280, 28, 28, 32), ("GroupNorm", 1280, 40, 40, 32),
          ("InstanceNorm", 320, 128, 128, 0), ("GroupNorm", 128, 40, 40, 8), ("GroupNorm", 128, 56, 56, 32),
          ("GroupNorm", 256, 64, 64, 32), ("GroupNorm", 1920, 14, 14, 32), ("GroupNorm", 960, 14, 14, 8),
          ("GroupNorm", 960, 16, 16, 8), ("GroupNorm", 1920, 28, 28, 32), ("GroupNorm", 512, 40, 40, 32),
          ("InstanceNorm", 256, 112, 112, 0), ("InstanceNorm", 256, 96, 96, 0), ("GroupNorm", 1280, 16, 16, 16),
          ("GroupNorm", 12, 40, 40, 1), ("GroupNorm", 640, 32, 32, 32), ("GroupNorm", 1280, 32, 32, 32)]
KNOBS = ("VKNORM_TUNE_FEW_GROUP_ITEMS", "VKNORM_TUNE_FEW_GROUP_ANY_SIZE")
SETTINGS = {"old": {"VKNORM_TUNE_FEW_GROUP_ITEMS": "10", "VKNORM_TUNE_FEW_GROUP_ANY_SIZE": "0"}, "new": {}}
ROUNDS = 3


def layer_for(op, c, g, rng):
    layer = vknorm.GroupNorm(group=g, channels=c, eps=1e-5) if op == "GroupNorm" else vknorm.InstanceNorm(channels=c, eps=1e-5)
    layer.load_model(rng.uniform(0.5, 1.5, c).astype(np.float32), rng.uniform(-1, 1, c).astype(np.float32))
    return layer


def setting(values):
    for k in KNOBS:
        os.environ.pop(k, None)
    os.environ.update(values)


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
                for s, value in SETTINGS.items():
                    setting(value)
                    t, info, copy, _ = _bench_vknorm_and_copy(layer, v, opt, args, with_copy=s == "old")
                    times[s].append(t)
                    plans[s] = f"{info['path']} {info.get('workgroup_size')} x {info.get('items')}"
                    outputs[s] = layer(x, option=opt)
                    if copy:
                        copies.append(copy)
            setting({})
            copy = statistics.median(copies)
            diff = max(float(np.max(np.abs(outputs["old"].astype(np.float64) - outputs[s]))) for s in SETTINGS)
            label = f"{op} {c}x{h}x{w}" + (f"/{g}" if op == "GroupNorm" else "")
            med = {s: statistics.median(times[s]) for s in SETTINGS}
            rows.append({"layer": label, "dtype": "fp16" if fp16 else "fp32", "copy_us": copy,
                         "us": times, "plans": plans, "max_abs_diff": diff})
            print(f"{label:>26} {'fp16' if fp16 else 'fp32'}  copy {copy:5.2f}  " + "  ".join(
                f"{s}: {med[s]:5.2f} us ({100 * copy / med[s]:3.0f} %, {plans[s]})" for s in SETTINGS) +
                f"  |diff| {diff:.1e}", flush=True)
    if a.json:
        json.dump({"device": vknorm.device_info() if hasattr(vknorm, "device_info") else None, "rows": rows},
                  open(a.json, "w"), indent=1, default=str)


if __name__ == "__main__":
    main()

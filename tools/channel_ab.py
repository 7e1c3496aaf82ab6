"""GroupNorm/InstanceNorm layers under settings of the dispatcher's knobs (VKNORM_TUNE_*, VKNORM_PATH, ...: read
per plan, so one process measures them all), interleaved round by round with vknorm bench's method: batches of
back-to-back forwards timed with Vulkan timestamps after --warmup-ms of the same work, the copy roof beside (with
the first setting). Prints, per layer and storage, each setting's median time, % of the copy roof and plan, and
the largest difference of any setting's output from the first's.

    python tools/channel_ab.py --setting old:VKNORM_TUNE_FEW_GROUP_ITEMS=10,VKNORM_TUNE_FEW_GROUP_ANY_SIZE=0 \\
        --setting new: gn:640x32x32/32 in:64x56x56 [--rounds 3] [--dtype fp32|fp16|both] [--json out.json]

A layer is gn:CxHxW/GROUPS (GroupNorm) or in:CxHxW (InstanceNorm), affine, ncnn's pack4; a setting is
NAME:VAR=VALUE,VAR=VALUE (nothing after the colon: the defaults). Every variable a setting names is unset for
the others. Only what the dispatcher reads per plan is taken (VKNORM_TUNE_* but UNCACHED_MAPPING and
FRESH_COMMAND_BUFFERS, VKNORM_PATH, VKNORM_COOPERATIVE_WORKGROUPS): a variable read when the context is made
(VKNORM_NO_SUBGROUP, VKNORM_MAX_SHARED_MEMORY, ...) would time the defaults under another name; run one process
per value of those. Each setting is tried on the first layer before anything is timed: a value the runtime
refuses is a one-line error.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import types

import numpy as np

from vknorm.cli import positive_int

LAYER = re.compile(r"^(gn|in):(\d+)x(\d+)x(\d+)(?:/(\d+))?$")
# What a context reads once, when it is made, rather than per plan: not measurable within one process.
READ_AT_CONTEXT = {"VKNORM_TUNE_UNCACHED_MAPPING", "VKNORM_TUNE_FRESH_COMMAND_BUFFERS"}


def parse_layer(text: str) -> tuple[str, int, int, int, int]:
    m = LAYER.match(text)
    if not m or (m.group(1) == "gn") != (m.group(5) is not None):
        raise argparse.ArgumentTypeError(f"{text!r}: expected gn:CxHxW/GROUPS or in:CxHxW")
    op, c, h, w, g = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5) or 0)
    if min(c, h, w) < 1 or (op == "gn" and (g < 1 or c % g)):
        raise argparse.ArgumentTypeError(f"{text!r}: dimensions must be >= 1 and channels divisible by groups")
    return op, c, h, w, g


def parse_setting(text: str) -> tuple[str, dict[str, str]]:
    name, sep, assignments = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME:VAR=VALUE,... (or NAME: for the defaults)")
    env = {}
    for item in filter(None, assignments.split(",")):
        var, eq, value = item.partition("=")
        if not eq or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", var):
            raise argparse.ArgumentTypeError(f"{text!r}: {item!r} is not VAR=VALUE")
        from vknorm.settings import TUNING_KNOBS

        if var not in (TUNING_KNOBS - READ_AT_CONTEXT) | {"VKNORM_PATH", "VKNORM_COOPERATIVE_WORKGROUPS"}:
            raise argparse.ArgumentTypeError(f"{text!r}: {var} is not a knob the dispatcher reads per plan (see "
                                             "--help); run one process per value of it")
        env[var] = value
    return name, env


def warmup_ms(text: str) -> float:
    try:
        ms = float(text)
    except ValueError:
        ms = -1.0
    if not 0 <= ms <= 60000:  # as vknorm bench: NaN and inf are refused too
        raise argparse.ArgumentTypeError(f"{text!r}: expected milliseconds from 0 to 60000")
    return ms


def label(op: str, c: int, h: int, w: int, g: int) -> str:
    return f"GroupNorm {c}x{h}x{w}/{g}" if op == "gn" else f"InstanceNorm {c}x{h}x{w}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("layers", nargs="+", type=parse_layer, metavar="LAYER")
    ap.add_argument("--setting", action="append", type=parse_setting, required=True,
                    help="NAME:VAR=VALUE,... (repeat; the first is the baseline)")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--dtype", choices=["fp32", "fp16", "both"], default="both")
    ap.add_argument("--reps", type=positive_int, default=100, help="timed forwards per batch")
    ap.add_argument("--batches", type=positive_int, default=3, help="batches per measurement (median)")
    ap.add_argument("--warmup-ms", type=warmup_ms, default=150.0)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    names = [n for n, _ in a.setting]
    if len(set(names)) != len(names):
        ap.error("setting names must differ")

    import vknorm
    from vknorm.bench import _bench_vknorm_and_copy, _check_output_path
    from vknorm.cli import UsageError

    try:  # before anything is timed, as vknorm bench checks its --json
        _check_output_path("--json", a.json)
    except UsageError as e:
        ap.error(str(e))
    if a.dtype != "fp32" and not vknorm.device_info()["storage_16bit"]:
        ap.error(f"--dtype {a.dtype}: {vknorm.device_info()['name']} has no 16-bit storage (float16 would run as "
                 "float32 storage); give --dtype fp32")

    knobs = sorted({var for _, env in a.setting for var in env})
    saved = {var: os.environ.get(var) for var in knobs}

    def apply(env):
        for var in knobs:
            os.environ.pop(var, None)
        os.environ.update(env)

    bench_args = types.SimpleNamespace(warmup_ms=a.warmup_ms, reps=a.reps, batches=a.batches)
    rng = np.random.default_rng(0)
    storages = {"fp32": [False], "fp16": [True], "both": [False, True]}[a.dtype]
    rows = []
    try:
        op, c, h, w, g = a.layers[0]  # each setting planned once, small: a value the runtime refuses stops here
        probe = (vknorm.GroupNorm(group=g, channels=c, affine=False) if op == "gn" else
                 vknorm.InstanceNorm(channels=c, affine=False))
        for name, env in a.setting:
            apply(env)
            try:
                probe(np.zeros((c, 1, 1), np.float32), option=vknorm.Option())
            except ValueError as e:
                ap.error(f"setting {name}: {e}")
        for op, c, h, w, g in a.layers:
            for fp16 in storages:
                layer = vknorm.GroupNorm(group=g, channels=c, eps=1e-5) if op == "gn" else vknorm.InstanceNorm(
                    channels=c, eps=1e-5)
                layer.load_model(rng.uniform(0.5, 1.5, c).astype(np.float32), rng.uniform(-1, 1, c).astype(np.float32))
                x = rng.standard_normal((c, h, w)).astype(np.float32)
                opt = vknorm.Option(use_fp16_storage=fp16)
                v = vknorm.to_device(x, opt)
                times, plans, copies, outputs = {n: [] for n in names}, {}, [], {}
                for _ in range(a.rounds):
                    for i, (name, env) in enumerate(a.setting):
                        apply(env)
                        t, info, copy, _ = _bench_vknorm_and_copy(layer, v, opt, bench_args, with_copy=i == 0)
                        times[name].append(t)
                        plans[name] = f"{info['path']} {info.get('workgroup_size')} x {info.get('items')}"
                        outputs[name] = layer(x, option=opt)
                        if copy:
                            copies.append(copy)
                copy = statistics.median(copies)
                base = outputs[names[0]].astype(np.float64)
                diff = max(float(np.max(np.abs(base - outputs[n]))) for n in names)
                med = {n: statistics.median(times[n]) for n in names}
                dtype = "fp16" if fp16 else "fp32"
                rows.append({"layer": label(op, c, h, w, g), "dtype": dtype, "copy_us": copy, "us": times,
                             "plans": plans, "max_abs_diff": diff})
                print(f"{label(op, c, h, w, g):>26} {dtype}  copy {copy:5.2f}  " + "  ".join(
                    f"{n}: {med[n]:5.2f} us ({100 * copy / med[n]:3.0f} %, {plans[n]})" for n in names) +
                    f"  |diff| {diff:.1e}", flush=True)
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": vknorm.device_info(), "settings": dict(a.setting), "rows": rows}, f, indent=1,
                      default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The cooperative kernel: one dispatch in which the workgroups holding the chunks of one group wait for each
other's partial statistics (shaders/norm_cooperative.comp).

* Planning, as data for a described device: auto plans it only where the device says how many workgroups it
  keeps resident (NVIDIA's multiprocessor count), for few large groups (groups too large for the fused kernel
  go split) and for few groups the fused kernel would hold in full teams of many elements each (more of its
  workgroups where float32 full teams would spill); never on CPU drivers; a group's chunks never outnumber the
  resident workgroups; its workgroups halve, down to 128 invocations, where a channel plane is one chunk anyway;
  its counters lie a cache line apart.
* On this machine's lavapipe, in child processes that declare the residency (VKNORM_COOPERATIVE_WORKGROUPS=2
  with LP_NUM_THREADS=2, so both chunks of a group run at once): the forced path against the CPU reference for
  every op, storage and packing, with groups of two chunks that really wait on each other (counters a line apart
  and packed), and with more chunks per group than run at once (8 declared), whose waiting workgroups take over
  the chunks that have not started; the fused residual
  add and activation; large offsets; squares past float32's range; pivots far from a group's bulk, eps = 0 and
  NaN/Inf in one group (the precision cases of the other paths); back-to-back forwards that reuse the counters it leaves zero,
  a wait that gives up included (its item NaN); and inside
  ncnn's Vulkan graph, where a clear pass zeroes them in ncnn's workspace memory.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from availability import needs_graph
from planned import H200, H200_UNKNOWN_RESIDENCY, LAVAPIPE, channels_plan, no_tuning_knobs, rows_plan
from reference import FP16_TOL, FP32_TOL, channel_norm64

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAVAPIPE = dict(LAVAPIPE, compute_units=2)  # a count does not make a CPU driver's workgroups wait safely
pytestmark = pytest.mark.usefixtures("no_tuning_knobs")


def test_few_large_groups_go_cooperative_where_residency_is_known():
    for fp16 in (False, True):
        inorm = channels_plan("InstanceNorm", 64, 128, 128, 64, fp16)  # 16 packed planes of 16384: 16 workgroups fused
        assert inorm["path"] == "cooperative" and inorm["dispatches"] == 1, inorm
        assert 2 <= inorm["chunks"] <= H200["compute_units"] // 2, inorm
        gn = channels_plan("GroupNorm", 320, 64, 64, 32, fp16)
        assert gn["path"] == "cooperative", gn
        # a chunk's weights load during its wait where a group spans channels (H200: GroupNorm -13 %;
        # InstanceNorm lost 0.4-0.5 us in float16 that way)
        assert gn["prefetch"] and not inorm["prefetch"], (gn, inorm)
        # and, in more chunks than multiprocessors, its invocations hold 16 elements, not 8 (GroupNorm
        # 960x64x64/32 fp16 17.7 -> 11.0 us; InstanceNorm 64x128x128 lost 7.3 -> 8.4 that way; GroupNorm
        # 96x64x64/32, 48 chunks at 8, fp32 7.3 -> 10.0)
        assert (gn["items"], inorm["items"]) == (16, 8), (gn, inorm)
        assert channels_plan("GroupNorm", 96, 64, 64, 32, fp16)["items"] == 8
    # smaller groups stay fused; so do large ones that fill the GPU (many rows)
    assert channels_plan("GroupNorm", 640, 32, 32, 32)["path"] == "workgroup"
    assert rows_plan("LayerNorm", 2048, 16384)["path"] == "workgroup"
    assert rows_plan("LayerNorm", 8192, 4096)["path"] == "workgroup"


def test_few_groups_in_full_teams_of_many_elements_go_cooperative(monkeypatch):
    # H200: fused, these run a full team (1024 invocations) holding 12-15 elements each on a handful of
    # multiprocessors; cooperative, 2-5x faster (GroupNorm 960x32x32/32 fp32 35.6 -> 8.5 us, InstanceNorm
    # 32x112x112 12.5 -> 6.9, LayerNorm 64x12288 13.5 -> 8.3). GroupNorm 960x32x32/32 as items of two groups
    # (30 channels each inside pack4 lanes); its items of one group run fused (tests/test_dispatch_policy.py).
    monkeypatch.setenv("VKNORM_TUNE_LANE_GROUPS", "0")
    for fp16 in (False, True):
        for p in (channels_plan("GroupNorm", 960, 32, 32, 32, fp16), channels_plan("GroupNorm", 96, 64, 64, 32, fp16),
                  channels_plan("InstanceNorm", 32, 112, 112, 32, fp16), channels_plan("InstanceNorm", 16, 96, 96, 16, fp16),
                  rows_plan("LayerNorm", 64, 12288, fp16), rows_plan("RMSNorm", 64, 12288, fp16)):
            assert (p["path"], p["dispatches"]) == ("cooperative", 1), p
    # not where that takes more than 2 workgroups per multiprocessor: 32 groups of 15 planes, 480 of them (fp16,
    # held as stored: 9.6 us fused, 9.9 cooperative) ...
    p = channels_plan("GroupNorm", 1920, 32, 32, 32, True)
    assert (p["path"], p["team"], p["items"]) == ("workgroup", 1024, 15), p
    # ... unless float32 vec4s past the register cap would spill there, for groups spanning channels: up to 4
    # per multiprocessor (fp32 15.3 -> 10.3 us; 1280x40x40/32, 1024 x 16: 14.1 -> 9.9), or float16 ones held as
    # stored past 15 each (1280x40x40/32 fp16, 1024 x 16: 10.4 -> 8.9)
    for shape, fp16, chunks in (((1920, 32, 32, 32), False, 15), ((1280, 40, 40, 32), False, 10),
                                ((1280, 40, 40, 32), True, 10)):
        p = channels_plan("GroupNorm", *shape, fp16)
        assert (p["path"], p["chunks"]) == ("cooperative", chunks), p
    # 13 each still fit (InstanceNorm 256x112x112 fp32: 13.1 us fused, 14.7 cooperative); groups of one channel
    # stay fused past that (InstanceNorm 256x120x120, 1024 x 15: 14.7 fused, 15.5 cooperative)
    p = channels_plan("InstanceNorm", 256, 112, 112, 256)
    assert (p["path"], p["team"], p["items"]) == ("workgroup", 1024, 13), p
    p = channels_plan("InstanceNorm", 256, 120, 120, 256)
    assert (p["path"], p["team"], p["items"]) == ("workgroup", 1024, 15), p
    # nor at 8 elements each (RMSNorm 16x8192 fp32 1024 x 8: 7.2 us either way)
    p = rows_plan("RMSNorm", 16, 8192)
    assert (p["path"], p["team"], p["items"]) == ("workgroup", 1024, 8), p


def test_few_groups_of_many_small_channel_planes_go_cooperative(monkeypatch):
    # H200, fp32 / fp16: the fused kernel (a group per workgroup) is far from its speed on groups spanning 20 or
    # more packed planes of a few hundred elements (GroupNorm 1280x16x16/8, 40 planes of 256: 15.4 / 17.9 us
    # fused, 7.7 / 7.6 cooperative; 512x8x8/1, 128 planes of 64: 9.6 / 8.5 -> 6.7 / 6.8)
    for shape in ((1280, 16, 16, 8), (512, 8, 8, 1), (320, 20, 20, 4), (1280, 24, 24, 16), (960, 16, 16, 8)):
        for fp16 in (False, True):
            p = channels_plan("GroupNorm", *shape, fp16)
            assert (p["path"], p["dispatches"]) == ("cooperative", 1), (shape, fp16, p)
    # not for fewer planes (512x32x32/16, 8 of 1024: 6.9 / 5.8 fused, 7.1 / 7.8 cooperative) or fewer elements
    # (640x16x16/8, 20 of 256: 5.4 / 4.6 against 6.9 / 6.9), in float16 below 7680 of them (384x16x16/4, 24 planes
    # of 256: 5.8 fused, 6.7 cooperative; float32 6.9 / 6.8)
    for shape, fp16 in (((512, 32, 32, 16), False), ((512, 32, 32, 16), True), ((640, 16, 16, 8), False),
                        ((640, 16, 16, 8), True), ((384, 16, 16, 4), True)):
        assert channels_plan("GroupNorm", *shape, fp16)["path"] == "workgroup", (shape, fp16)
    assert channels_plan("GroupNorm", 384, 16, 16, 4)["path"] == "cooperative"
    monkeypatch.setenv("VKNORM_TUNE_MANY_PLANES", "0")  # the knob turns it off
    assert channels_plan("GroupNorm", 1280, 16, 16, 8, True)["path"] == "workgroup"
    # (float32's 8 groups of 512 x 20 then go cooperative by the few-wide-teams rule, tests/test_dispatch_policy.py)
    monkeypatch.setenv("VKNORM_TUNE_FEW_WIDE_TEAM_GROUPS", "0")
    assert channels_plan("GroupNorm", 1280, 16, 16, 8)["path"] == "workgroup"


def test_the_full_team_knob_turns_that_off(monkeypatch):
    monkeypatch.setenv("VKNORM_TUNE_FULL_TEAM_MAX_ITEMS", "0")
    monkeypatch.setenv("VKNORM_TUNE_LANE_GROUPS", "0")  # the fused item of two groups, not one per group
    p = channels_plan("GroupNorm", 960, 32, 32, 32)
    assert (p["path"], p["team"], p["items"]) == ("workgroup", 1024, 15), p


def test_the_spill_knob_turns_off_the_wider_limit(monkeypatch):
    monkeypatch.setenv("VKNORM_TUNE_FULL_TEAM_SPILL_ITEMS", "0")
    p = channels_plan("GroupNorm", 1920, 32, 32, 32)
    assert (p["path"], p["team"], p["items"]) == ("workgroup", 1024, 15), p
    monkeypatch.setenv("VKNORM_TUNE_FULL_TEAM_SPILL_ITEMS_HELD", "0")
    p = channels_plan("GroupNorm", 1280, 40, 40, 32, True)
    assert (p["path"], p["team"], p["items"]) == ("workgroup", 1024, 16), p


def test_planes_smaller_than_a_workgroup_s_share_take_smaller_workgroups(monkeypatch):
    # a 1024-element plane is one chunk either way: 128 invocations holding 8 each, not 256 holding 4 (H200,
    # GroupNorm 1280x32x32/32 forced cooperative, fp32: 13.2 -> 8.9 us; 960x32x32/32 auto: 8.5 -> 8.2, in items
    # of two groups)
    monkeypatch.setenv("VKNORM_TUNE_LANE_GROUPS", "0")
    for fp16 in (False, True):
        p = channels_plan("GroupNorm", 960, 32, 32, 32, fp16)
        assert (p["path"], p["workgroup_size"], p["items"], p["chunks"]) == ("cooperative", 128, 8, 15), p
        p = channels_plan("GroupNorm", 1280, 32, 32, 32, fp16, path="cooperative")
        assert (p["workgroup_size"], p["items"]) == (128, 8), p
        # groups spanning channels halve it while a plane fits 16 each (fp32 1920x40x40/32, 1600-element planes:
        # 256 x 7 16.0 us, 128 x 13 11.7)
        p = channels_plan("GroupNorm", 1920, 40, 40, 32, fp16)
        assert (p["path"], p["workgroup_size"], p["items"], p["chunks"]) == ("cooperative", 128, 13, 15), p
        # larger planes keep 256: halving them only makes more chunks (960x64x64/32 fp32 13.5 -> 14.2 us)
        p = channels_plan("GroupNorm", 960, 64, 64, 32, fp16)
        assert (p["path"], p["workgroup_size"], p["items"]) == ("cooperative", 256, 16), p
        # and never below 128 (GroupNorm 1280x32x32/32 in 64s: 11.0 us)
        p = channels_plan("GroupNorm", 1280, 16, 16, 32, fp16, path="cooperative")
        assert p["workgroup_size"] == 128, p
    # CPU drivers keep their workgroups (64 on lavapipe)
    p = channels_plan("GroupNorm", 1280, 32, 32, 32, device=LAVAPIPE, path="cooperative")
    assert p["workgroup_size"] == 64, p


def test_auto_plans_it_only_for_a_few_waves_of_workgroups():
    # H200, rows of 65536 cols: 128 groups in 4096 cooperative workgroups lose to split (LayerNorm fp32 136 vs
    # 109 us, RMSNorm fp16 108 vs 67); one such row (32 workgroups) wins (7.1-7.6 against 10.3-11.2 us)
    for op in ("LayerNorm", "RMSNorm"):
        for fp16 in (False, True):
            assert rows_plan(op, 512, 65536, fp16)["path"] == "split"
            assert rows_plan(op, 256, 131072, fp16)["path"] == "split"
            one = rows_plan(op, 1, 65536, fp16, pack=1)
            assert one["path"] == "cooperative" and one["chunks"] <= 4 * H200["compute_units"], one
    # forced, it still runs wherever an item's chunks fit the resident workgroups
    assert rows_plan("LayerNorm", 512, 65536, path="cooperative")["path"] == "cooperative"


def test_rows_too_large_for_the_fused_kernel_go_split():
    # H200, 1024x32768 fp32: LayerNorm 117 us split (its reduce holding its chunks), 131 cooperative;
    # RMSNorm 109 split, 124 cooperative
    for op in ("LayerNorm", "RMSNorm"):
        assert rows_plan(op, 1024, 32768)["path"] == "split"


def test_counters_lie_a_cache_line_apart(monkeypatch):
    """Each item's two counts (partials published, workgroups done) 128 bytes (32 uints) from the next item's, so
    that workgroups polling one item's count do not contend with another item's atomics, then a claim per chunk,
    packed; VKNORM_TUNE_COUNTER_STRIDE packs the counts too (1 or 2: 2 uints apart)."""
    plan = channels_plan("GroupNorm", 320, 64, 64, 32)  # 16 items of two groups (10 channels each: pack4 lanes)
    assert plan["path"] == "cooperative" and plan["chunks"] == 5, plan
    assert plan["counters_bytes"] == 16 * 128 + 16 * 5 * 4, plan
    # a CPU's lines too; pack4: 2 items, each a packed plane of 4 channels' instances, in one chunk
    plan = channels_plan("InstanceNorm", 8, 30, 30, 8, device=LAVAPIPE, path="cooperative")
    assert plan["path"] == "cooperative" and plan["counters_bytes"] == 2 * 128 + 2 * plan["chunks"] * 4, plan
    assert channels_plan("GroupNorm", 640, 32, 32, 32)["counters_bytes"] == 0  # fused: no counters
    monkeypatch.setenv("VKNORM_TUNE_COUNTER_STRIDE", "1")
    assert channels_plan("GroupNorm", 320, 64, 64, 32)["counters_bytes"] == 16 * 2 * 4 + 16 * 5 * 4


def test_never_planned_without_known_residency():
    assert channels_plan("InstanceNorm", 64, 128, 128, 64, device=H200_UNKNOWN_RESIDENCY)["path"] == "workgroup"
    assert rows_plan("LayerNorm", 1024, 32768, device=H200_UNKNOWN_RESIDENCY)["path"] == "split"
    assert channels_plan("InstanceNorm", 64, 128, 128, 64, device=LAVAPIPE)["path"] != "cooperative"
    # forced where residency is unknown: only groups of one chunk (no workgroup waits on another), else split
    assert rows_plan("LayerNorm", 8, 3000, device=LAVAPIPE, path="cooperative")["chunks"] == 1
    assert rows_plan("LayerNorm", 8, 300000, device=LAVAPIPE, path="cooperative")["path"] == "split"


def test_chunks_never_outnumber_the_resident_workgroups():
    # GroupNorm(2, 640) on 640x16x16: 80 planes per group, more than the 66 resident workgroups, so chunks of
    # 2 whole planes each (512 elements: 128 invocations holding 4)
    for fp16 in (False, True):
        p = channels_plan("GroupNorm", 640, 16, 16, 2, fp16)
        assert (p["path"], p["chunks"], p["workgroup_size"], p["items"]) == ("cooperative", 40, 128, 4), p
        assert not p["prefetch"], p  # a chunk's planes have weights of their own
    # not where groups lie inside pack4 lanes (574 channels per group: the lanes' groups change from plane to
    # plane), which stays split, forced or not
    for path in ("auto", "cooperative"):
        assert channels_plan("GroupNorm", 1148, 8, 8, 2, path=path)["path"] == "split"


DEVICE_SCRIPT = r"""
import json, sys
import numpy as np
import vknorm
sys.path.insert(0, "tests")
from reference import norm64, storage_rule
rng = np.random.default_rng(5)
report = []
def check(name, layer, x, f64=None):
    for fp16 in (False, True):
        # f64: float64 of the input as stored (float16 storage rounds it first), judged by the storage rule (err
        # and bound); else the CPU reference of the float32 input, which saw it unrounded (relative err: FP16_TOL)
        ref = layer(x, device="cpu") if f64 is None else f64(x.astype(np.float16) if fp16 else x)
        for pack in (True, False):
            opt = vknorm.Option(path="cooperative", use_fp16_storage=fp16, use_packing_layout=pack)
            y = layer(x, device="vulkan", option=opt)
            d = layer.last_dispatch
            rec = {"case": name, "fp16": fp16, "pack": pack, "path": d["path"], "chunks": d["chunks"]}
            if f64 is None:
                rec["err"] = float(np.abs(y - ref).max()) / max(1.0, float(np.abs(ref).max()))
            else:
                rec["err"], rec["bound"] = storage_rule(y, ref, fp16)
            report.append(rec)
def weights(layer, n, beta=True):
    g = rng.standard_normal(n).astype(np.float32)
    layer.load_model(g, rng.standard_normal(n).astype(np.float32)) if beta else layer.load_model(g)
    return layer
check("LayerNorm 8x1000", weights(vknorm.LayerNorm(affine_size=1000, eps=1e-5), 1000),
      rng.standard_normal((8, 1000)).astype(np.float32))
x = (rng.standard_normal((4, 700)) * 0.01 + 1e4).astype(np.float32)  # |mean| >> std: judged against float64
def layernorm_f64(x):
    c = x.astype(np.float64) - x.astype(np.float64).mean(axis=1, keepdims=True)
    return c / np.sqrt((c ** 2).mean(axis=1, keepdims=True) + 1e-5)
check("LayerNorm offset 1e4", vknorm.LayerNorm(affine_size=700, eps=1e-5, affine=False), x, f64=layernorm_f64)
check("RMSNorm 4x900", weights(vknorm.RMSNorm(affine_size=900, eps=1e-6), 900, beta=False),
      rng.standard_normal((4, 900)).astype(np.float32))
gn = weights(vknorm.GroupNorm(group=32, channels=64, eps=1e-5), 64)  # 2 channels per group
check("GroupNorm 64x24x24/32", gn, (rng.standard_normal((64, 24, 24)) + 3).astype(np.float32))
gn6 = weights(vknorm.GroupNorm(group=6, channels=12, eps=1e-5), 12)  # 2 channels per group: inside pack4 planes
gn6.set_activation("swish")
check("GroupNorm 12x40x40/6 + Swish", gn6, rng.standard_normal((12, 40, 40)).astype(np.float32))
# 16 channels per group: more planes per group than the 2 declared resident workgroups, so chunks of whole planes
check("GroupNorm 32x6x6/2, chunks of planes", weights(vknorm.GroupNorm(group=2, channels=32, eps=1e-5), 32),
      (rng.standard_normal((32, 6, 6)) * 3 - 5).astype(np.float32))
check("InstanceNorm 8x30x30", weights(vknorm.InstanceNorm(channels=8, eps=1e-5), 8),
      rng.standard_normal((8, 30, 30)).astype(np.float32))
check("constant groups", vknorm.LayerNorm(affine_size=1000, eps=1e-5, affine=False), np.full((4, 1000), 3.5, np.float32))
# squares past float32 (float32 storage only: float16 cannot hold the values): an infinite variance, so y = 0
# as the CPU reference has it, never the NaN of inf * 0 in the merge
big = vknorm.LayerNorm(affine_size=1000, eps=1e-5, affine=False)
x = rng.standard_normal((4, 1000)).astype(np.float32)
x[1, 0], x[1, 600] = 3e19, -3e19
for pack in (True, False):
    y = big(x, device="vulkan", option=vknorm.Option(path="cooperative", use_packing_layout=pack))
    report.append({"case": "squares past float32", "fp16": False, "pack": pack, "path": big.last_dispatch["path"],
                   "chunks": big.last_dispatch["chunks"], "err": float(np.abs(y - big(x, device="cpu")).max())})
# the fused residual add and its sum
ln = weights(vknorm.LayerNorm(affine_size=1000, eps=1e-5), 1000)
x = rng.standard_normal((8, 1000)).astype(np.float32)
r = rng.standard_normal((8, 1000)).astype(np.float32)
for fp16 in (False, True):
    # float16 storage: the inputs as stored, their sum rounded to float16 as the add layer would store it
    as_stored = (lambda a: a.astype(np.float16).astype(np.float32)) if fp16 else (lambda a: a)
    s_want = as_stored(as_stored(x) + as_stored(r))
    y, s = ln.forward_add(x, r, return_sum=True, option=vknorm.Option(path="cooperative", use_fp16_storage=fp16))
    rec = {"case": "add+sum", "fp16": fp16, "pack": True, "path": ln.last_dispatch["path"],
           "chunks": ln.last_dispatch["chunks"], "sum_err": float(np.abs(s.astype(np.float32) - s_want).max())}
    if fp16:  # float64 of the float16 sum the kernel normalized, by the storage rule
        rec["err"], rec["bound"] = storage_rule(y, norm64("LayerNorm", s_want, 1000, 1e-5, True, ln.gamma, ln.beta), True)
    else:
        ref = ln(s_want, device="cpu")
        rec["err"] = float(np.abs(y - ref).max()) / max(1.0, float(np.abs(ref).max()))
    report.append(rec)
# back-to-back forwards over one workspace (forward_repeated: one forward, then warmup + reps more, in place):
# the first clears the counters, each leaves them zero for the next. The ReLU makes every forward's input
# differ from the last one's (a norm of a norm alone would not), so a chunk that did not wait for this forward's
# partials and read the last one's would be seen.
rep = vknorm.LayerNorm(affine_size=1000, eps=1e-5)
rep.load_model(np.full(1000, 1.5, np.float32), np.full(1000, 0.25, np.float32))
rep.set_activation("relu")
x = (rng.standard_normal((8, 1000)) * 2 + 7).astype(np.float32)
want = x.copy()
for _ in range(1 + 2 + 5):
    want = rep(want, device="cpu")
opt = vknorm.Option(path="cooperative", use_packing_layout=False)
v = vknorm.to_device(x, opt)
d = rep._layer.forward_repeated(v, vknorm.Option._of(opt), 2, 5)
got = v.download().cast_fp32().numpy().reshape(x.shape)
report.append({"case": "repeated", "path": d["path"], "chunks": d["chunks"],
               "err": float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))})
print(json.dumps(report))
"""


def run_declaring_residency(script, extra_env=None, cwd=None):
    # the fewest elements per invocation: groups of 1000 split in two chunks on any device (GPU workgroups are wider)
    env = dict(os.environ, VKNORM_COOPERATIVE_WORKGROUPS="2", LP_NUM_THREADS="2", VKNORM_VALIDATION="1",
               VKNORM_TUNE_ITEMS_TARGET_COOPERATIVE="1")
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def within(r):
    """A DEVICE_SCRIPT record's bound: the storage rule's where it was judged against float64 of the input as stored
    (its "bound"); else, against the CPU reference of the float32 input (which float16 storage rounds before the
    kernel reads it, the reference not), FP16_TOL or FP32_TOL, relative to the scale."""
    return r["bound"] if "bound" in r else FP16_TOL if r["fp16"] else FP32_TOL


@pytest.mark.parametrize("counter_stride", [None, "1"], ids=["counters_a_line_apart", "counters_packed"])
def test_forced_cooperative_matches_the_cpu_reference_with_groups_that_wait_on_each_other(counter_stride):
    """Every case, with the counters where the dispatcher puts them (a 128-byte line each) and packed side by side:
    the spacing moves where workgroups count and poll, never what they compute."""
    env = {"VKNORM_TUNE_COUNTER_STRIDE": counter_stride} if counter_stride else {}
    report = json.loads(run_declaring_residency(DEVICE_SCRIPT, env, cwd=ROOT).stdout.strip().splitlines()[-1])
    cases = [r for r in report if r["case"] != "repeated"]
    assert len(cases) == 8 * 4 + 2 + 2
    for r in cases:
        assert r["path"] == "cooperative", r
        assert r["err"] <= within(r), r
        if "sum_err" in r:
            assert r["sum_err"] == 0.0, r  # the add's sum as the add layer stores it, bit for bit
    # most cases run two chunks per group, whose workgroups wait for each other
    assert sum(r["chunks"] == 2 for r in cases) >= 24, [(r["case"], r["chunks"]) for r in cases]
    # chunks of whole planes in both packings (pack4: 2 of 4 packed planes; pack1: 2 of 16 planes)
    planes = [r for r in cases if "chunks of planes" in r["case"]]
    assert len(planes) == 4 and all(r["chunks"] == 2 for r in planes), planes
    repeated = next(r for r in report if r["case"] == "repeated")
    assert repeated["path"] == "cooperative" and repeated["chunks"] == 2, repeated
    assert repeated["err"] <= 8 * FP32_TOL, repeated  # 8 forwards, each within the fp32 rule (of the output scale)


def test_forced_cooperative_with_more_chunks_than_run_at_once_matches_the_cpu_reference():
    """8 resident workgroups declared where lavapipe runs 2 at once: items of up to 8 chunks, whose first workgroups
    wait on chunks that cannot start before they end. A workgroup whose wait runs long claims the chunks no
    workgroup has started and reduces and normalizes them itself; a workgroup that finds its chunk claimed leaves.
    Every case, the fused add and its sum and back-to-back forwards (the claims left zero) as with all chunks
    running at once (a wait on chunks that never start would have written NaN)."""
    report = json.loads(run_declaring_residency(DEVICE_SCRIPT, {"VKNORM_COOPERATIVE_WORKGROUPS": "8"}, cwd=ROOT)
                        .stdout.strip().splitlines()[-1])
    for r in report:
        assert r["path"] == "cooperative", r
        assert r["err"] <= (8 * FP32_TOL if r["case"] == "repeated" else within(r)), r
        assert r.get("sum_err", 0.0) == 0.0, r
    # most cases run items of 4-8 chunks, twice or more the workgroups that run at once
    assert sum(r["chunks"] >= 4 for r in report) >= 24, [(r["case"], r["chunks"]) for r in report]


PRECISION_SCRIPT = r"""
import json, sys
import numpy as np
import vknorm
sys.path.insert(0, "tests")
from reference import FP32_TOL, make_layer, max_abs_err, norm64, scale
rng = np.random.default_rng(8)
size = 1500  # two chunks per group
report = []
def run(layer, x, pack):
    y = layer(x, device="vulkan", option=vknorm.Option(path="cooperative", use_packing_layout=pack))
    return y, layer.last_dispatch
def judged(case, pack, d, err, bound, **extra):
    report.append(dict(case=case, pack=pack, path=d["path"], chunks=d["chunks"], err=err, bound=bound, **extra))
for pack in (True, False):
    # pivots far from the group's bulk: the first element, or the first four, a massive activation
    for first in (1, 4):
        x = rng.standard_normal((8, size)).astype(np.float32)
        x[:, :first] = 1000.0
        layer = make_layer("LayerNorm", size, 1e-5, False)
        ref = norm64("LayerNorm", x, size, 1e-5, False)
        y, d = run(layer, x, pack)
        judged(f"massive pivot x{first}", pack, d, max_abs_err(y, ref), FP32_TOL * scale(ref))
    # eps = 0 on groups that are not constant, against float64 and the CPU reference
    for op in ("LayerNorm", "RMSNorm"):
        x = (rng.standard_normal((8, size)) * rng.uniform(0.01, 10, (8, 1)) + rng.uniform(-5, 5, (8, 1))).astype(np.float32)
        gamma = rng.uniform(0.5, 1.5, size).astype(np.float32)
        beta = rng.uniform(-1, 1, size).astype(np.float32)
        layer = make_layer(op, size, 0.0, True, gamma, beta)
        y, d = run(layer, x, pack)
        for label, r in (("float64", norm64(op, x, size, 0.0, True, gamma, beta)), ("cpu", layer(x, device="cpu"))):
            judged(f"{op} eps=0 vs {label}", pack, d, max_abs_err(y, r), FP32_TOL * scale(r))
    # NaN / Inf in one group, at its pivot and in its second chunk: that group as the CPU reference has it,
    # every other group untouched
    for op in ("LayerNorm", "RMSNorm"):
        base = rng.standard_normal((8, size)).astype(np.float32)
        gamma = rng.uniform(0.5, 1.5, size).astype(np.float32)
        beta = rng.uniform(-1, 1, size).astype(np.float32)
        layer = make_layer(op, size, 1e-5, True, gamma, beta)
        others = [r for r in range(8) if r != 5]
        ref_others = norm64(op, base[others], size, 1e-5, True, gamma, beta)
        for value in (np.nan, np.inf, -np.inf):
            for pos in (0, size - 7):
                x = base.copy()
                x[5, pos] = value
                cpu = layer(x, device="cpu")
                y, d = run(layer, x, pack)
                cpu_nan, vk_nan = np.isnan(cpu[5]), np.isnan(y[5])
                finite_err = max_abs_err(y[5][~cpu_nan], cpu[5][~cpu_nan]) if (~cpu_nan).any() else 0.0
                judged(f"{op} {value} at {pos}", pack, d, max_abs_err(y[others], ref_others),
                       FP32_TOL * scale(ref_others), same_nan=bool(np.array_equal(cpu_nan, vk_nan)),
                       cpu_nan=int(cpu_nan.sum()), finite_err=finite_err)
print(json.dumps(report))
"""


def test_forced_cooperative_keeps_the_precision_cases_of_the_other_paths():
    """What test_vulkan_precision.py holds the other paths to, on the cooperative kernel with groups of two chunks
    that wait on each other: pivots far from the group's bulk (a massive activation first, or four), eps = 0 on
    groups that are not constant (against float64 and the CPU reference), and NaN / Inf in one group (at its
    pivot, and in its second chunk): that group NaN exactly where the CPU reference has NaN and its finite values
    the reference's, every other group within the fp32 rule."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    report = json.loads(run_declaring_residency(PRECISION_SCRIPT, cwd=root).stdout.strip().splitlines()[-1])
    assert len(report) == 2 * (2 + 4 + 12)
    for r in report:
        assert (r["path"], r["chunks"]) == ("cooperative", 2), r
        assert r["err"] <= r["bound"], r
        if "same_nan" in r:
            assert r["same_nan"] and r["finite_err"] <= 1e-5, r
    # the poisoned group: all NaN for LayerNorm and for NaN (the CPU reference's behaviour, asserted, not assumed)
    assert all(r["cpu_nan"] == 1500 for r in report if "same_nan" in r and ("LayerNorm" in r["case"] or "nan" in r["case"]))


GIVE_UP_SCRIPT = r"""
import json, os
import numpy as np
import vknorm
rng = np.random.default_rng(21)
report = []
layers = [("LayerNorm 8x1000", vknorm.LayerNorm(affine_size=1000, eps=1e-5), 1000, (8, 1000)),
          ("GroupNorm 32x20x20/4", vknorm.GroupNorm(group=4, channels=32, eps=1e-5), 32, (32, 20, 20))]
for name, layer, n, shape in layers:
    layer.load_model(rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32))
    for fp16 in (False, True):
        opt = vknorm.Option(path="cooperative", use_fp16_storage=fp16)
        first, second = (rng.standard_normal(shape).astype(np.float32) * k + k for k in (1, 3))
        os.environ["VKNORM_TUNE_WAIT_ROUNDS"] = "0"  # every wait gives up at once
        y1 = layer(first, device="vulkan", option=opt)
        gave_up = dict(layer.last_dispatch)
        del os.environ["VKNORM_TUNE_WAIT_ROUNDS"]
        y2 = layer(second, device="vulkan", option=opt)
        ref = layer(second, device="cpu")
        report.append({"case": name, "fp16": fp16, "path": gave_up["path"], "chunks": gave_up["chunks"],
                       "nan_first": int(np.isnan(y1).sum()), "size": int(y1.size),
                       "path_next": layer.last_dispatch["path"],
                       "err_next": float(np.abs(y2 - ref).max()) / max(1.0, float(np.abs(ref).max()))})
print(json.dumps(report))
"""


def test_a_wait_that_gives_up_writes_nan_and_the_next_forward_is_right():
    """A wait that outlives its poll budget (a claimed chunk never published: a stalled device) writes NaN for its
    item, a visible failure rather than a hang; the layer's next forward is right. The poll budget is set to 0
    rounds for the first forward (VKNORM_TUNE_WAIT_ROUNDS), where a real give-up needs a device that stalls. (A
    forward over the scratch of one that gave up, its clear pass skipped: test_deploy_engine.py, --give-up-first.)"""
    report = json.loads(run_declaring_residency(GIVE_UP_SCRIPT).stdout.strip().splitlines()[-1])
    assert len(report) == 4
    for r in report:
        assert r["path"] == r["path_next"] == "cooperative" and r["chunks"] == 2, r
        assert r["nan_first"] == r["size"], r  # every item waits on its other chunk, so every element is NaN
        # against the CPU reference of the float32 input (float16 storage rounds it, the reference does not)
        assert r["err_next"] <= (FP16_TOL if r["fp16"] else FP32_TOL), r


SMALL_WORKGROUPS_SCRIPT = r"""
import json
import numpy as np
import vknorm
rng = np.random.default_rng(11)
gn = vknorm.GroupNorm(group=4, channels=32, eps=1e-5)  # 8 channels per group: 2 packed planes of 400
gn.load_model(rng.standard_normal(32).astype(np.float32), rng.standard_normal(32).astype(np.float32))
x = (rng.standard_normal((32, 20, 20)) + 2).astype(np.float32)
ref = gn(x, device="cpu")
out = []
for fp16 in (False, True):
    y = gn(x, device="vulkan", option=vknorm.Option(path="cooperative", use_fp16_storage=fp16))
    d = gn.last_dispatch
    out.append({"fp16": fp16, "path": d["path"], "wg": d["workgroup_size"], "items": d["items"], "chunks": d["chunks"],
                "err": float(np.abs(y - ref).max()) / max(1.0, float(np.abs(ref).max()))})
print(json.dumps(out))
"""


def test_forced_cooperative_in_smaller_workgroups_matches_the_cpu_reference():
    """Workgroups halved for a plane smaller than a workgroup's share (on GPUs 256 -> 128 by default): down to 32
    here, for 16 elements each, so a plane of 400 is one chunk of 32 invocations holding 13 each (lavapipe and
    GPUs alike), and the 2 chunks of a group wait on each other."""
    proc = run_declaring_residency(SMALL_WORKGROUPS_SCRIPT, {"VKNORM_TUNE_ITEMS_TARGET_COOPERATIVE": "16",
                                                             "VKNORM_TUNE_ITEMS_TARGET_COOPERATIVE_CHANNELS": "16",
                                                             "VKNORM_TUNE_COOPERATIVE_MIN_WORKGROUP": "32"})
    for r in json.loads(proc.stdout.strip().splitlines()[-1]):
        assert (r["path"], r["wg"], r["items"], r["chunks"]) == ("cooperative", 32, 13, 2), r
        # against the CPU reference of the float32 input (float16 storage rounds it, the reference does not)
        assert r["err"] <= (FP16_TOL if r["fp16"] else FP32_TOL), r


@pytest.mark.parametrize("workgroup, cols", [(1, 33), (1, 48), (2, 66), (4, 129), (4, 256)])
def test_forced_cooperative_in_workgroups_narrower_than_a_subgroup_runs_another_path_and_matches(workgroup, cols):
    """The cooperative kernel runs whole subgroups: Option.max_workgroup_size below the device's subgroup size
    (lavapipe: 8) gives the forced path to the next one down. There, workgroups of 1-4 holding more than 32
    elements each came out wrong (LayerNorm 1x33: errors of 0.6), with no error."""
    import numpy as np
    import vknorm

    subgroup = vknorm.device_info()["subgroup_size"]
    ln = vknorm.LayerNorm(cols, affine=False)
    x = np.random.default_rng(cols).standard_normal((4, cols)).astype(np.float32)
    y = ln(x, option=vknorm.Option(path="cooperative", max_workgroup_size=workgroup))
    ran = ln.last_dispatch
    assert workgroup < subgroup and ran["path"] != "cooperative" and ran["workgroup_size"] <= workgroup, ran
    ref = ln(x, device="cpu")
    assert float(np.abs(y - ref).max()) <= FP32_TOL * max(1.0, float(np.abs(ref).max())), ran


UNREPORTED_SUBGROUP_SCRIPT = r"""
import json
import numpy as np
import vknorm
out = []
for workgroup, cols in ((1, 33), (1, 48), (2, 66), (4, 129), (4, 256), (0, 40)):
    ln = vknorm.LayerNorm(cols, affine=False)
    x = (np.random.default_rng(cols).standard_normal((30, cols)) + 5).astype(np.float32)
    y = ln(x, option=vknorm.Option(path="cooperative", max_workgroup_size=workgroup))
    ref = ln(x, device="cpu")
    out.append({"cap": workgroup, "cols": cols, "path": ln.last_dispatch["path"],
                "wg": ln.last_dispatch["workgroup_size"],
                "err": float(np.abs(y - ref).max()) / max(1.0, float(np.abs(ref).max()))})
print(json.dumps({"subgroup_size": vknorm.device_info()["subgroup_size"], "runs": out}))
"""


@pytest.mark.parametrize("shared", [None, "512"], ids=["vulkan_1_0", "vulkan_1_0_shared_512"])
def test_forced_cooperative_on_a_device_that_reports_no_subgroup_size_runs_whole_subgroups_of_any_width(shared):
    """Vulkan 1.0 reports no subgroup size (VKNORM_VULKAN_API=1.0 over lavapipe, whose subgroups are still 8 wide):
    the cooperative kernel's workgroups are then whole subgroups of any width up to 64, and narrower ones give the
    forced path to the next one down. They were planned as if any width were whole: workgroups of 1-4 (or 8 of
    lavapipe's 512 B shared memory profile) left each invocation's elements but its first as the input."""
    env = dict(os.environ, VKNORM_VULKAN_API="1.0", VKNORM_VALIDATION="1")
    if shared:
        env["VKNORM_MAX_SHARED_MEMORY"] = shared
    proc = subprocess.run([sys.executable, "-c", UNREPORTED_SUBGROUP_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["subgroup_size"] == 0, report
    for r in report["runs"]:
        if r["cap"]:  # capped below any whole subgroup: another path, within the cap
            assert r["path"] != "cooperative" and r["wg"] <= r["cap"], r
        else:  # uncapped: whole subgroups of any width, or (512 B of shared memory) another path
            assert (r["path"] == "cooperative" and r["wg"] % 64 == 0) == (shared is None), r
        assert r["err"] <= FP32_TOL, r


INSIDE_NCNN = ["-m", "vknorm", "check", "tests/data/instnorm_block.ncnn.param", "tests/data/instnorm_block.ncnn.bin",
               "--input", "in0=16x24x24", "--vulkan", "--json"]


@needs_graph
def test_inside_ncnn_graph_with_counters_in_the_layers_scratch():
    """ncnn's graph (VKNORM_PATH forces the path there): InstanceNorm planes of 576 elements, two chunks each, a
    clear pass zeroing the counters in the layer's scratch before each forward; judged by vknorm check."""
    env = dict(os.environ, VKNORM_COOPERATIVE_WORKGROUPS="2", LP_NUM_THREADS="2", VKNORM_VALIDATION="1",
               VKNORM_PATH="cooperative")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable] + INSIDE_NCNN, env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    report = json.loads(proc.stdout)
    assert report["ok"] and report["host_round_trips"] == 0, report


def test_forced_cooperative_past_the_workgroup_count_limit_leaves_no_chunk_to_a_second_workgroup():
    """More chunks than a dispatch's x dimension holds (lavapipe: 65,535): the grid folds into rows of whole
    x extents, so workgroups past the last chunk run too. They must take no chunk (when they took tickets after
    the last ticket had reset the count, they re-normalized chunks 0, 1, ... in place: 2,300 of 65,600 channels
    wrong, error 0.15)."""
    import numpy as np

    import vknorm

    c = 65600
    x = np.random.default_rng(9).standard_normal((c, 2, 2)).astype(np.float32)
    layer = vknorm.InstanceNorm(channels=c, eps=1e-5, affine=False)
    y = layer(x, device="vulkan", option=vknorm.Option(path="cooperative", use_packing_layout=False))
    assert layer.last_dispatch["path"] == "cooperative"
    x64 = x.astype(np.float64).reshape(c, -1)
    ref = ((x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)).reshape(x.shape)
    assert float(np.abs(y - ref).max()) <= FP32_TOL * max(1.0, float(np.abs(ref).max()))


def run_in_pieces(monkeypatch, group, channels, hw, piece_groups, seed=12):
    """GroupNorm(group, channels) on a channels x hw x hw float32 pack1 blob, storage buffers made to look
    piece_groups groups large (VKNORM_MAX_BUFFER_BYTES), path cooperative: its output, its record, and float64's
    (not the CPU reference's: ncnn's float32 sum over a group of 131072 is itself off by more than the rule)."""
    import numpy as np

    import vknorm

    rng = np.random.default_rng(seed)
    layer = vknorm.GroupNorm(group=group, channels=channels, eps=1e-5)
    layer.load_model(rng.uniform(0.5, 1.5, channels).astype(np.float32), rng.uniform(-1, 1, channels).astype(np.float32))
    x = (rng.standard_normal((channels, hw, hw)) + 3).astype(np.float32)
    monkeypatch.setenv("VKNORM_MAX_BUFFER_BYTES", str(piece_groups * (channels // group) * hw * hw * 4))
    y = layer(x, device="vulkan", option=vknorm.Option(path="cooperative", use_packing_layout=False))
    return y, layer.last_dispatch, channel_norm64("GroupNorm", x, layer.eps, group, layer.gamma, layer.beta)


@pytest.mark.parametrize("group, pieces", [(4, "2 + 2 groups"), (5, "3 + 2 groups")])
def test_a_forward_in_pieces_matches_float64_whether_or_not_its_counters_move(monkeypatch, group, pieces):
    """A forward too large for one storage buffer runs in pieces over one counters buffer. A piece whose counters
    lie as the last piece left them (2 + 2 groups) skips its clear pass; one whose counters lie elsewhere (3 + 2)
    clears them again. Every piece matches float64."""
    import numpy as np

    y, ran, ref = run_in_pieces(monkeypatch, group, 2 * group, 16, int(pieces[0]))
    assert ran["path"] == "cooperative" and ran["pieces"] == 2, ran
    assert float(np.abs(y - ref).max()) <= FP32_TOL * max(1.0, float(np.abs(ref).max())), ran


def test_pieces_whose_counters_fill_as_many_bytes_at_other_places_clear_them(monkeypatch):
    """On a device that reports its multiprocessors (H200: 66 resident workgroups declared for the kernel), GroupNorm
    5 groups x 8 channels of 128x128 in pieces of 3 + 2 groups plans 32 and 64 chunks per group: counters of 3 x (32
    + 32) and 2 x (32 + 64) uints, the same 768 bytes, but the second piece's claims lie on the first's padding
    between counts, which no clear had written. That buffer first held a freed layer's weights (1.0f, not zero), so
    a piece that trusted the bytes alone found its chunks claimed: they kept their input, and the waits gave up
    (NaN). Each layout now clears its own."""
    import gc

    import numpy as np

    import vknorm

    if not vknorm.device_info()["compute_units"]:  # the default device, which the layer runs on
        pytest.skip("the device reports no multiprocessors (lavapipe): its pieces plan chunks alike")
    # a freed 768-byte device buffer of nonzero words, for the context's buffer cache to hand out again
    weights = vknorm.RMSNorm(affine_size=192, eps=1e-5, affine=True)
    weights.load_model(np.ones(192, np.float32))
    weights(np.ones((4, 192), np.float32), device="vulkan")
    del weights
    gc.collect()
    y, ran, ref = run_in_pieces(monkeypatch, 5, 40, 128, 3)
    assert ran["path"] == "cooperative" and ran["pieces"] == 2, ran
    assert float(np.abs(y - ref).max()) <= FP32_TOL * max(1.0, float(np.abs(ref).max())), ran

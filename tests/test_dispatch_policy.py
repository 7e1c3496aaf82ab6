"""The dispatcher's float16 rules, as data, for a GPU this machine need not have.

`_core.plan_for_device` plans a blob for a described device (no device is touched), so the rules that only
GPUs take (measured on an NVIDIA H200, docs/benchmarks) are pinned here on any machine:

* float16 elements that travel as uvec2s (pack4, or pack1 rows read as vec4s) are held in registers as stored
  and unpacked where used (half the registers of float32 values), float32 ones never;
* float16 rows: teams of at most 512 invocations while 16 elements each suffice, up to 32 held elements per
  invocation before the split path; float32 rows keep their plans;
* RMSNorm's small float16 groups in one subgroup, unless the tensor is latency-bound;
* GroupNorm/InstanceNorm keep 16 elements per invocation (their few large groups run faster split); a group
  per workgroup keeps its planes' weights in shared memory in float32 (any storage on CPU drivers);
* fewer such groups than multiprocessors, latency-bound: the narrowest team down to 256 invocations that holds a
  group in 10 float32 vec4s each (16 float16 held as stored), not the latency rule's wide team; not for groups
  inside pack4 lanes held as items of several, nor where the multiprocessor count is unknown, nor on CPU drivers;
* pack4 GroupNorm of 2 mod 4 channels per group, at least 6 (192, 320 or 960 channels in 32 groups): an item per
  group, not per two, where it runs fused and the items of two would run fused, or cooperative for want of
  registers (GPUs).

The last test runs the held kernels on the real device: holding float16 as stored changes no bit.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import vknorm
from vknorm import _core

from planned import H200 as H200_KNOWN_RESIDENCY, H200_UNKNOWN_RESIDENCY, LAVAPIPE, channels_plan as _channels_plan
from planned import declared_shared, no_tuning_knobs, rows_plan as _rows_plan, shared_bytes
from reference import FP32_TOL, half_fp16_spacing, scale

# The rules below were measured on an H200; these tests pin the fused and split ones (tests/test_cooperative.py
# the cooperative kernel's, planned where the multiprocessor count is known).
H200 = H200_UNKNOWN_RESIDENCY
pytestmark = pytest.mark.usefixtures("no_tuning_knobs")


def rows_plan(op, rows, cols, fp16, device=H200, pack=4):
    return _rows_plan(op, rows, cols, fp16, device, pack)


def channels_plan(op, c, h, w, group, fp16, device=H200):
    return _channels_plan(op, c, h, w, group, fp16, device)


@pytest.mark.parametrize("shared", [16384, 32768, 49152])
def test_no_plan_declares_more_shared_memory_than_the_device_has(no_tuning_knobs, shared):
    """A GPU with 16 KB (Vulkan's minimum), 32 KB or 48 KB of shared memory and 132 multiprocessors: every plan
    of a grid (rows up to 1024-wide fused teams, few GroupNorm/InstanceNorm groups in teams that keep their planes'
    weights, the cooperative kernel) declares at most that, counted from the shaders' declarations. At 16 KB a
    1024-wide fused team (16 KB of reductions besides its weight slots) and a 256-wide cooperative workgroup
    (16 KB besides its own values) did not fit."""
    per_shader = shared_bytes()
    device = dict(H200_KNOWN_RESIDENCY, max_shared_memory=shared)
    seen = set()
    for rows, cols in ((2048, 16384), (1024, 32768), (64, 65536), (8, 1 << 20), (32768, 1024)):
        for fp16 in (False, True):
            plan = rows_plan("LayerNorm", rows, cols, fp16, device)
            seen.add(plan["path"])
            assert declared_shared(per_shader, plan) <= shared, (rows, cols, fp16, plan)
    for op, c, h, w, group in (("GroupNorm", 320, 64, 64, 32), ("GroupNorm", 1280, 16, 16, 32),
                               ("GroupNorm", 1280, 8, 8, 32), ("GroupNorm", 640, 32, 32, 32),
                               ("GroupNorm", 256, 32, 32, 1), ("InstanceNorm", 64, 128, 128, 64),
                               ("InstanceNorm", 256, 32, 32, 256)):
        for fp16 in (False, True):
            plan = channels_plan(op, c, h, w, group, fp16, device)
            seen.add(plan["path"] + (" plane weights" if plan["plane_weights"] else ""))
            assert declared_shared(per_shader, plan) <= shared, (op, c, h, w, group, fp16, plan)
    # the grid reaches each kind of plan (at 16 KB no group keeps its planes' weights: its plans take other teams)
    assert {"workgroup", "cooperative"} | ({"workgroup plane weights"} if shared > 16384 else set()) <= seen, seen


def test_float16_that_travels_as_uvec2_is_held_as_stored_float32_never():
    assert rows_plan("LayerNorm", 32768, 1024, True)["hold_storage"]  # pack4
    assert rows_plan("LayerNorm", 43690, 768, True, pack=1)["hold_storage"]  # pack1 rows read as vec4s
    assert not rows_plan("LayerNorm", 32768, 1024, False)["hold_storage"]
    # pack1 rows of an odd width are read as single float16 values: nothing to hold as uvec2
    odd = rows_plan("RMSNorm", 8, 1001, True, pack=1)
    assert not odd["vec4"] and not odd["hold_storage"], odd
    assert not rows_plan("LayerNorm", 1024, 32768, False)["hold_storage"]  # the split path holds nothing


def test_float16_rows_take_teams_of_at_most_512_while_16_elements_each_suffice():
    # H200, 8192 cols: LayerNorm 41 -> 58 % of the copy roof, RMSNorm 52 -> 62 % (1024 x 8 at the register cap)
    for op in ("LayerNorm", "RMSNorm"):
        p = rows_plan(op, 4096, 8192, True)
        assert (p["path"], p["team"], p["items"]) == ("workgroup", 512, 16), p
    # 16384 cols: 512 x 32 measured slower than 1024 x 16 (LayerNorm 40 vs 50 %)
    p = rows_plan("LayerNorm", 2048, 16384, True)
    assert (p["team"], p["items"]) == (1024, 16), p
    # float32 rows aim for 16 elements each: 512 x 16 at 8192 cols (LayerNorm 72 -> 82 %)
    p = rows_plan("LayerNorm", 4096, 8192, False)
    assert (p["team"], p["items"]) == (512, 16), p


def test_float16_groups_inside_lanes_keep_full_teams(monkeypatch):
    # pack4 GroupNorm whose channels per group are not a multiple of 4, in items of several groups: the 512 cap of
    # float16 rows does not apply (H200, 320x32x32/32: 512 x 10 10.3 us, 1024 x 5 7.1); groups that fill the
    # lanes keep it. (Without the knob 320 channels take an item per group: the next test.)
    monkeypatch.setenv("VKNORM_TUNE_LANE_GROUPS", "0")
    p = channels_plan("GroupNorm", 320, 32, 32, 32, True)
    assert (p["path"], p["team"], p["items"]) == ("workgroup", 1024, 5), p
    p = channels_plan("GroupNorm", 640, 32, 32, 32, True)
    assert (p["path"], p["team"], p["items"]) == ("workgroup", 512, 10), p


def test_groups_of_6_or_more_channels_inside_pack4_lanes_take_an_item_each_where_fused():
    # pack4 GroupNorm of 2 mod 4 channels per group (>= 6): an item per group (its planes, the other group's
    # lanes loaded and left alone) wherever the items of two groups would run fused, or cooperative for want of
    # registers, and the item per group runs fused. H200, fp32 / fp16, us: 320x32x32/32 7.76 / 7.07 -> 4.93 / 4.83,
    # 960x16x16/32 9.34 / 9.36 -> 4.42 / 4.24, 192x48x48/32 17.57 / 19.18 -> 5.73 / 6.79; cooperative before:
    # 960x24x24/32 7.71 / 8.16 -> 5.45 / 7.59
    for fp16 in (False, True):
        for c, h, w, team, items in ((320, 32, 32, 256, 12), (320, 16, 16, 256, 3), (320, 8, 8, 128, 2),
                                     (960, 16, 16, 256, 8), (960, 8, 8, 256, 2), (960, 24, 24, 256, 18),
                                     (960, 32, 32, 512, 16), (320, 48, 48, 512, 14), (192, 32, 32, 256, 8),
                                     (192, 16, 16, 256, 2), (192, 48, 48, 256, 18), (192, 64, 64, 512, 16)):
            p = channels_plan("GroupNorm", c, h, w, 32, fp16, device=H200_KNOWN_RESIDENCY)
            assert (p["path"], p["team"], p["items"], p["lane_groups"]) == ("workgroup", team, items, True), (c, h, w, fp16, p)
        # Few large groups stay cooperative in items of two groups (320x64x64/32: 80 chunks of 256 x 16)
        for c, h, w in ((320, 64, 64), (960, 48, 48), (960, 64, 64)):
            p = channels_plan("GroupNorm", c, h, w, 32, fp16, device=H200_KNOWN_RESIDENCY)
            assert (p["path"], p["lane_groups"]) == ("cooperative", False), (c, h, w, fp16, p)
    # Not at 2 channels per group (each group would read every element of its planes: 12x7x7/6 2.85 -> 2.97 us,
    # 64x32x32/32 3.52 -> 4.00),
    # nor groups of odd or whole-element channel counts, nor LayerNorm rows; nor on CPU drivers (lavapipe:
    # 320x32x32/32 fp32 1.5 -> 2.8-3.6 ms)
    others = [channels_plan("GroupNorm", 12, 7, 7, 6, False, device=H200_KNOWN_RESIDENCY),
              channels_plan("GroupNorm", 64, 32, 32, 32, False, device=H200_KNOWN_RESIDENCY),
              channels_plan("GroupNorm", 160, 16, 16, 32, False, device=H200_KNOWN_RESIDENCY),
              channels_plan("GroupNorm", 384, 32, 32, 32, False, device=H200_KNOWN_RESIDENCY),
              rows_plan("LayerNorm", 64, 768, False), channels_plan("GroupNorm", 320, 32, 32, 32, False, device=LAVAPIPE)]
    assert [p["lane_groups"] for p in others] == [False] * 6, others
    # Forced paths: the fused ones take it where it fits, the split and cooperative ones never
    for path, want in (("workgroup", True), ("subgroup", True), ("split", False), ("cooperative", False)):
        p = _channels_plan("GroupNorm", 320, 8, 8, 32, False, H200_KNOWN_RESIDENCY, path=path)
        assert p["lane_groups"] is want, (path, p)


def test_the_lane_groups_knob_sets_the_least_channels_per_group(monkeypatch):
    monkeypatch.setenv("VKNORM_TUNE_LANE_GROUPS", "0")
    assert not channels_plan("GroupNorm", 320, 16, 16, 32, False, device=H200_KNOWN_RESIDENCY)["lane_groups"]
    monkeypatch.setenv("VKNORM_TUNE_LANE_GROUPS", "2")
    assert channels_plan("GroupNorm", 12, 7, 7, 6, False, device=H200_KNOWN_RESIDENCY)["lane_groups"]
    assert channels_plan("GroupNorm", 320, 16, 16, 32, False, device=LAVAPIPE)["lane_groups"]
    assert not channels_plan("GroupNorm", 20, 7, 7, 4, False, device=LAVAPIPE)["lane_groups"]  # 5 per group: odd


def test_an_item_per_group_runs_in_the_vec4_variant():
    """An item per group inside pack4 lanes holds one group, as the vec4 reads of whole planes do, so it runs in
    that variant of the fused kernel (one float per statistic); items of two groups keep the pack4 one
    (statistics in vec4 slots)."""
    plan = channels_plan("GroupNorm", 320, 32, 32, 32, False, device=H200_KNOWN_RESIDENCY)
    assert plan["lane_groups"] and plan["vec4"] and plan["variants"] == ["norm_fused_fp0_pv4_sg1"], plan
    two = channels_plan("GroupNorm", 320, 64, 64, 32, False, device=H200_KNOWN_RESIDENCY)
    assert not two["lane_groups"] and not two["vec4"], two


def test_float16_rows_hold_up_to_32_elements_before_the_split_path():
    # 32768 cols in pack4: the fused kernel (1024 x 32) measured 50 % against the split path's 40 % (LayerNorm)
    p = rows_plan("LayerNorm", 1024, 32768, True)
    assert (p["path"], p["dispatches"], p["team"], p["items"]) == ("workgroup", 1, 1024, 32), p
    assert rows_plan("LayerNorm", 1024, 32768, False)["path"] == "split"
    assert rows_plan("LayerNorm", 256, 65536, True)["path"] == "split"  # 64 elements each: past 32
    # CPU devices keep one limit for both storages (registers are memory there)
    cpu16, cpu32 = (rows_plan("LayerNorm", 4, 65536, fp16, device=LAVAPIPE) for fp16 in (True, False))
    assert (cpu16["path"], cpu16["items"]) == (cpu32["path"], cpu32["items"]), (cpu16, cpu32)


def test_rmsnorm_small_float16_groups_run_in_one_subgroup():
    # H200, 256 and 768 cols: 76 -> 85 % in a subgroup team of 32 rather than a workgroup team of 64
    for rows, cols, pack in ((131072, 256, 4), (43690, 768, 1)):
        p = rows_plan("RMSNorm", rows, cols, True, pack=pack)
        assert (p["path"], p["team"]) == ("subgroup", 32), p
        # float32 RMSNorm keeps its workgroup team
        assert rows_plan("RMSNorm", rows, cols, False, pack=pack)["team"] == 64
    # LayerNorm's one reduction needs the workgroup team (it lost 3-4 points in a subgroup)
    p = rows_plan("LayerNorm", 131072, 256, True)
    assert (p["path"], p["team"], p["one_reduction"]) == ("workgroup", 64, True), p
    # latency-bound tensors keep their wide teams (197x768: 3.0 us, 3.9 in a subgroup)
    p = rows_plan("RMSNorm", 197, 768, True, pack=1)
    assert p["team"] > 32 and p["path"] == "workgroup", p


def test_layernorm_float16_rows_take_teams_of_256_while_16_elements_each_suffice():
    # H200, 8192x4096 pack4: 512 x 8 49.5 us, 256 x 16 43.7 us (69 -> 79 % of the copy roof)
    p = rows_plan("LayerNorm", 8192, 4096, True)
    assert (p["team"], p["items"]) == (256, 16), p
    # RMSNorm keeps 8 each (16 lost 4-10 points at 1024-4096 cols); 2048 cols stays 256 x 8 (128 x 16 lost 4 points)
    p = rows_plan("RMSNorm", 8192, 4096, True)
    assert (p["team"], p["items"]) == (512, 8), p
    p = rows_plan("LayerNorm", 16384, 2048, True)
    assert (p["team"], p["items"]) == (256, 8), p
    # float32 rows and per-channel weights are not held this way
    assert rows_plan("LayerNorm", 8192, 4096, False)["team"] == 256
    p = channels_plan("GroupNorm", 640, 32, 32, 32, True)
    assert (p["team"], p["items"]) == (512, 10), p


def test_latency_bound_teams_wider_than_256_take_4_elements_each():
    # H200: LayerNorm 1x4096 fp32 3.43 us as 512 x 2 vec4s, 3.18 us as 256 x 4; 1x8192 4.93 -> 4.02 us;
    # GroupNorm 1280x8x8/32 3.69 -> 3.37 us; InstanceNorm 256x32x32 4.22 -> 3.64 us
    for op in ("LayerNorm", "RMSNorm"):
        for fp16 in (False, True):
            p = rows_plan(op, 1, 4096, fp16, pack=1)
            assert (p["team"], p["items"], p["vec4"]) == (256, 4, True), p
    assert (rows_plan("LayerNorm", 1, 8192, False, pack=1)["team"], rows_plan("LayerNorm", 1, 8192, False, pack=1)["items"]) == (512, 4)
    p = channels_plan("GroupNorm", 1280, 8, 8, 32, False)
    assert (p["team"], p["items"]) == (256, 3), p
    p = channels_plan("InstanceNorm", 256, 32, 32, 1, False)
    assert (p["team"], p["items"]) == (256, 4), p
    # narrower teams keep 2 each (77x512 in a subgroup of 32 x 4 lost: 2.99 -> 3.23 us)
    for rows, cols, team in ((77, 512, 64), (197, 768, 128), (1, 768, 128)):
        p = rows_plan("LayerNorm", rows, cols, False, pack=1)
        assert (p["team"], p["items"]) == (team, 2), p


def test_the_split_reduce_holds_layernorm_type_chunks_where_they_fit():
    # float32 rows: chunks of at most 256 x 8, held (LayerNorm 1024x32768: 140 -> 117 us)
    p = rows_plan("LayerNorm", 1024, 32768, False)
    assert (p["path"], p["team"], p["items"], p["chunks"]) == ("split", 256, 8, 16), p
    # RMSNorm's reduce reads x once anyway: its chunks as before, nothing held
    p = rows_plan("RMSNorm", 1024, 32768, False)
    assert (p["path"], p["items"], p["chunks"]) == ("split", 1, 4), p
    # float16 rows keep larger chunks, re-read (512x65536: 87 us, 97 in held chunks)
    p = rows_plan("LayerNorm", 512, 65536, True)
    assert (p["path"], p["items"], p["chunks"]) == ("split", 1, 8), p
    # per-channel weights: chunks as before, held (GroupNorm 640x16x16/2 fp32 13.8 -> 11.7 us)
    for fp16 in (False, True):
        p = channels_plan("GroupNorm", 640, 16, 16, 2, fp16)
        assert (p["path"], p["team"], p["items"], p["chunks"]) == ("split", 32, 8, 80), p


def test_the_hold_reduce_knob_restores_re_reading(monkeypatch):
    monkeypatch.setenv("VKNORM_TUNE_HOLD_REDUCE", "0")
    p = rows_plan("LayerNorm", 1024, 32768, False)
    assert (p["items"], p["chunks"]) == (1, 4), p
    assert channels_plan("GroupNorm", 640, 16, 16, 2, False)["items"] == 1


def test_group_and_instance_norm_keep_16_elements_per_invocation():
    # GroupNorm 320x64x64/32 fp16: 14.3 us split, 87.9 fused at 32 elements per invocation (H200)
    p = channels_plan("GroupNorm", 320, 64, 64, 32, True)
    assert p["path"] == "split", p
    assert channels_plan("GroupNorm", 640, 16, 16, 2, True)["path"] == "split"
    p = channels_plan("InstanceNorm", 64, 128, 128, 1, True)  # group: unused by InstanceNorm
    assert p["path"] == "workgroup" and p["items"] <= 16, p


def test_a_group_per_workgroup_keeps_its_planes_weights_in_shared_memory_float32_or_on_cpu_drivers():
    # H200: GroupNorm 640x32x32/32 fp32 6.85 -> 6.55 us, float16 mixed; lavapipe: 20-40 % faster, both storages
    for op, c, h, w, group in (("GroupNorm", 640, 32, 32, 32), ("InstanceNorm", 128, 64, 64, 128)):
        p = channels_plan(op, c, h, w, group, False)
        assert p["path"] == "workgroup" and p["plane_weights"] and not p["prefetch"], p
        assert not channels_plan(op, c, h, w, group, True)["plane_weights"]
        assert channels_plan(op, c, h, w, group, True, device=LAVAPIPE)["plane_weights"]
    # latency-bound tensors load their weights with x; rows have weights by position; teams in subgroups
    assert channels_plan("GroupNorm", 1280, 8, 8, 32, False)["prefetch"]
    assert not channels_plan("GroupNorm", 1280, 8, 8, 32, False)["plane_weights"]
    assert not rows_plan("LayerNorm", 8192, 4096, False)["plane_weights"]
    assert not channels_plan("InstanceNorm", 512, 7, 7, 512, False)["plane_weights"]


def test_few_groups_with_channel_weights_take_the_narrowest_team_holding_20_vec4s_each():
    # H200, fp32 / fp16, us: GroupNorm 640x32x32/32 1024 x 5 6.50 / 512 x 10 4.94 -> 256 x 20 5.69 / 4.74;
    # 1280x16x16/32 1024 x 3 5.66 / 512 x 5 4.45 -> 256 x 10 4.53 / 3.74 -> 128 x 20 4.09 / 3.81; 1920x16x16/32
    # 512 x 8 5.29 -> 256 x 15 4.83; 1280x32x32/32 1024 x 10 9.46 / 7.91 -> 512 x 20 8.59 / 6.40; 2560x8x8/32
    # 256 x 5 3.56 / 3.45 -> 128 x 10 3.51 / 3.33. Not past 20 each, float16 held as stored too (256x64x64/32
    # fp16 512 x 16 5.7 us, 256 x 32 9.9; 1920x32x32/32 keeps 1024 x 15); down to teams of 128
    want = {(1280, 16, 16, False): (128, 20), (1280, 16, 16, True): (128, 20), (2560, 8, 8, False): (128, 10),
            (2560, 8, 8, True): (128, 10), (1920, 16, 16, False): (256, 15), (1920, 16, 16, True): (256, 15),
            (1280, 8, 8, False): (128, 5), (1280, 8, 8, True): (128, 5), (640, 8, 8, False): (128, 3),
            (640, 32, 32, False): (256, 20), (640, 32, 32, True): (256, 20), (1280, 32, 32, False): (512, 20),
            (1280, 32, 32, True): (512, 20), (1920, 32, 32, True): (1024, 15), (256, 64, 64, True): (512, 16)}
    for (c, h, w, fp16), (team, items) in want.items():
        p = channels_plan("GroupNorm", c, h, w, 32, fp16, device=H200_KNOWN_RESIDENCY)
        assert (p["path"], p["team"], p["items"]) == ("workgroup", team, items), (c, h, w, fp16, p)
    for c, h, team, items in ((64, 64, 256, 16), (256, 32, 128, 8), (64, 28, 128, 7)):
        p = channels_plan("InstanceNorm", c, h, h, c, False, device=H200_KNOWN_RESIDENCY)
        assert (p["path"], p["team"], p["items"]) == ("workgroup", team, items), (c, h, p)
    # float32 groups that even 512 invocations would hold in more than 20 each keep the full team, which then
    # goes cooperative (1920x32x32/32 fp32: 512 x 30 12.1 us, cooperative 10.3)
    assert channels_plan("GroupNorm", 1920, 32, 32, 32, False, device=H200_KNOWN_RESIDENCY)["path"] == "cooperative"
    # Groups inside pack4 lanes narrow to 256 at most (320x16x16/32 fp32: 256 x 3 3.60 us, 128 x 6 3.70)
    p = channels_plan("GroupNorm", 320, 16, 16, 32, False, device=H200_KNOWN_RESIDENCY)
    assert (p["team"], p["items"]) == (256, 3), p
    # Plans as without the rule elsewhere: groups inside pack4 lanes (320 channels in 32 groups: 10 each), an
    # unknown multiprocessor count, CPU drivers, and as many groups as multiprocessors (528 channels: 132 items)
    elsewhere = [("GroupNorm", 320, 16, 16, 32, H200_KNOWN_RESIDENCY), ("GroupNorm", 1280, 16, 16, 32, H200),
                 ("GroupNorm", 1280, 16, 16, 32, LAVAPIPE), ("InstanceNorm", 528, 24, 24, 528, H200_KNOWN_RESIDENCY),
                 ("GroupNorm", 640, 32, 32, 32, H200), ("GroupNorm", 640, 32, 32, 32, LAVAPIPE)]
    plans = [channels_plan(op, c, h, w, g, False, device=d) for op, c, h, w, g, d in elsewhere]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VKNORM_TUNE_FEW_GROUP_ITEMS", "0")
        assert plans == [channels_plan(op, c, h, w, g, False, device=d) for op, c, h, w, g, d in elsewhere]
    assert plans[1]["team"] == 1024 and plans[2]["team"] <= 64 and plans[4]["team"] == 1024


def test_teams_capped_at_512_by_16_kb_of_shared_memory_plan_few_groups_as_the_uncapped_device():
    """16 KB of shared memory caps teams at 512 invocations, which are not full teams: the few-group rule narrows
    them as it does on the H200 (not to the cooperative kernel as if 512 were the register-bound full team), and
    few groups that no team then holds go cooperative rather than split. Emulated on the H200
    (VKNORM_MAX_SHARED_MEMORY=16384), fp32 / fp16, us: GroupNorm 640x32x32/32 7.5 / 8.3 -> 5.7 / 4.8,
    960x32x32/32 12.4 / 11.9 -> 8.2 / 7.8, 1280x32x32/32 13.4 / 12.7 -> 8.6 / 6.3, 1920x32x32/32 13.7 / 12.9 ->
    9.5 / 9.4, 1280x40x40/32 14.4 / 13.7 -> 10.0 / 8.9, 64x48x48/8 6.8 / 7.4 -> 5.1 / 4.6 (lost in float16: a
    group or two, 64x32x32/2 7.7 -> 8.0, 12x56x56/1 10.5 -> 12.3; float32 goes cooperative there, next test)."""
    small = dict(H200_KNOWN_RESIDENCY, max_shared_memory=16384)
    for fp16 in (False, True):
        for c, h in ((640, 32), (960, 32), (1280, 32)):  # the H200's own plans
            mine = channels_plan("GroupNorm", c, h, h, 32, fp16, device=small)
            theirs = channels_plan("GroupNorm", c, h, h, 32, fp16, device=H200_KNOWN_RESIDENCY)
            assert (mine["path"], mine["team"], mine["items"]) == (theirs["path"], theirs["team"], theirs["items"])
            assert mine["path"] == "workgroup", mine
        for c, h in ((1920, 32), (1280, 40)):  # no team of 512 holds them
            assert channels_plan("GroupNorm", c, h, h, 32, fp16, device=small)["path"] == "cooperative"
    # where the multiprocessor count is unknown (no cooperative kernel planned), still split
    unknown = dict(H200, max_shared_memory=16384)
    assert channels_plan("GroupNorm", 1920, 32, 32, 32, False, device=unknown)["path"] == "split"


def test_cooperative_waits_give_up_after_2_pow_22_polls_on_gpus_and_2_pow_26_on_cpu_devices(monkeypatch,
                                                                                            no_tuning_knobs):
    """A wait counts polls (rounds of 4096), not time: on a CPU device the workgroups are the driver's threads, which
    the OS may preempt mid-chunk for tens of milliseconds on a busy machine, so they wait 16 times longer."""
    monkeypatch.setenv("VKNORM_COOPERATIVE_WORKGROUPS", "2")  # lavapipe plans the kernel only where declared
    for device, rounds in ((H200_KNOWN_RESIDENCY, 1024), (LAVAPIPE, 16384)):
        for op, c, hw, group in (("GroupNorm", 32, 20, 4), ("GroupNorm", 32, 64, 4), ("InstanceNorm", 8, 32, 8)):
            p = _channels_plan(op, c, hw, hw, group, device=device, path="cooperative")
            assert (p["path"], p["wait_rounds"]) == ("cooperative", rounds), (device["type"], op, p)
    monkeypatch.setenv("VKNORM_TUNE_WAIT_ROUNDS", "0")  # how tests make every wait give up at once
    assert _channels_plan("GroupNorm", 32, 20, 20, 4, device=LAVAPIPE, path="cooperative")["wait_rounds"] == 0


def test_a_handful_of_float32_groups_in_teams_wider_than_256_of_more_than_12_each_go_cooperative(monkeypatch):
    """At most 8 groups, per-channel weights, whose narrowest team is still 512 wide holding more than 12 float32
    vec4s each: a few multiprocessors would each load a large group; the cooperative kernel spreads it. H200, us,
    fused -> cooperative: GroupNorm 64x32x32/2 9.14 -> 6.88, 256x32x32/8 9.43 -> 6.98, 96x24x24/2 (512 x 14) 8.30
    -> 6.77, 32x28x28/1 (512 x 13) 7.33 -> 6.56; teams capped at 512: 12x56x56/1 11.44 -> 7.02, InstanceNorm
    16x96x96 7.29 -> 6.84."""
    small = dict(H200_KNOWN_RESIDENCY, max_shared_memory=16384)
    for op, c, h, w, g, device in (("GroupNorm", 64, 32, 32, 2, H200_KNOWN_RESIDENCY),
                                   ("GroupNorm", 128, 32, 32, 4, H200_KNOWN_RESIDENCY),
                                   ("GroupNorm", 256, 32, 32, 8, H200_KNOWN_RESIDENCY),
                                   ("GroupNorm", 96, 24, 24, 2, H200_KNOWN_RESIDENCY),
                                   ("GroupNorm", 32, 28, 28, 1, H200_KNOWN_RESIDENCY),
                                   ("GroupNorm", 12, 56, 56, 1, small), ("InstanceNorm", 16, 96, 96, 16, small)):
        assert channels_plan(op, c, h, w, g, False, device=device)["path"] == "cooperative", (op, c, h, w, g)
        monkeypatch.setenv("VKNORM_TUNE_FEW_WIDE_TEAM_GROUPS", "0")  # the rule off: the fused team it replaced
        p = channels_plan(op, c, h, w, g, False, device=device)
        assert (p["path"], p["team"]) == ("workgroup", 512) and p["items"] > 12, (op, c, h, w, g, p)
        monkeypatch.delenv("VKNORM_TUNE_FEW_WIDE_TEAM_GROUPS")
    # Stay fused: 12 each (48x32x32/2 6.64 against 6.81), 16 groups (512x32x32/16 6.91 against 7.11), teams of 256
    # (32x32x32/2 4.47 against 6.60), float16 held as stored (64x32x32/2 7.96 against 7.70, 512x7x7/1 6.42
    # against 6.84), an unknown multiprocessor count (no cooperative kernel), CPU drivers
    for op, c, h, w, g, fp16, device in (("GroupNorm", 48, 32, 32, 2, False, H200_KNOWN_RESIDENCY),
                                         ("GroupNorm", 512, 32, 32, 16, False, H200_KNOWN_RESIDENCY),
                                         ("GroupNorm", 32, 32, 32, 2, False, H200_KNOWN_RESIDENCY),
                                         ("GroupNorm", 64, 32, 32, 2, True, H200_KNOWN_RESIDENCY),
                                         ("GroupNorm", 512, 7, 7, 1, True, H200_KNOWN_RESIDENCY),
                                         ("GroupNorm", 64, 32, 32, 2, False, H200),
                                         ("GroupNorm", 64, 32, 32, 2, False, LAVAPIPE)):
        assert channels_plan(op, c, h, w, g, fp16, device=device)["path"] == "workgroup", (op, c, h, w, g, fp16)
    monkeypatch.setenv("VKNORM_TUNE_FEW_WIDE_TEAM_ITEMS", "11")  # the threshold is the knob's
    assert channels_plan("GroupNorm", 48, 32, 32, 2, False, device=H200_KNOWN_RESIDENCY)["path"] == "cooperative"


def test_the_few_group_knobs_restore_the_wide_teams(monkeypatch):
    monkeypatch.setenv("VKNORM_TUNE_FEW_GROUP_ANY_SIZE", "0")
    # latency-bound tensors only: 640x32x32/32 (32 x 640 invocations at 8 each) keeps the size rule's team
    p = channels_plan("GroupNorm", 640, 32, 32, 32, False, device=H200_KNOWN_RESIDENCY)
    assert (p["team"], p["items"]) == (1024, 5), p
    p = channels_plan("GroupNorm", 1280, 16, 16, 32, False, device=H200_KNOWN_RESIDENCY)
    assert (p["team"], p["items"]) == (128, 20), p
    monkeypatch.setenv("VKNORM_TUNE_FEW_GROUP_MIN_TEAM", "256")
    p = channels_plan("GroupNorm", 1280, 16, 16, 32, False, device=H200_KNOWN_RESIDENCY)
    assert (p["team"], p["items"]) == (256, 10), p
    monkeypatch.setenv("VKNORM_TUNE_FEW_GROUP_ITEMS", "0")
    p = channels_plan("GroupNorm", 1280, 16, 16, 32, False, device=H200_KNOWN_RESIDENCY)
    assert (p["team"], p["items"]) == (1024, 3), p


def test_the_plane_weights_knob_turns_them_off(monkeypatch):
    monkeypatch.setenv("VKNORM_TUNE_PLANE_WEIGHTS", "0")
    assert not channels_plan("GroupNorm", 640, 32, 32, 32, False)["plane_weights"]


def test_float32_rows_aim_for_16_elements_per_invocation_and_nothing_else_moves_with_them(monkeypatch):
    # H200, float32 rows: 16 elements per invocation in teams half as wide (4096 cols 78 -> 91 % of the
    # copy roof, 8192 cols 72 -> 82 %); 1024 cols as 64 x 16
    p = rows_plan("LayerNorm", 8192, 4096, False)
    assert (p["team"], p["items"]) == (256, 16), p
    assert rows_plan("RMSNorm", 32768, 1024, False)["items"] == 16
    channels = [channels_plan("GroupNorm", 640, 32, 32, 32, False), channels_plan("InstanceNorm", 128, 64, 64, 1, False),
                channels_plan("GroupNorm", 320, 64, 64, 32, False)]  # the last one split: its reduce team too
    # the rows' target is its own: per-channel weights and the split path's reduce pass keep 8
    monkeypatch.setenv("VKNORM_TUNE_ITEMS_TARGET", "8")
    assert rows_plan("LayerNorm", 8192, 4096, False)["items"] == 8
    assert [channels_plan("GroupNorm", 640, 32, 32, 32, False), channels_plan("InstanceNorm", 128, 64, 64, 1, False),
            channels_plan("GroupNorm", 320, 64, 64, 32, False)] == channels


# Shapes of every kind the planner tells apart: rows small and large, latency-bound and not, pack1 and pack4; groups
# spanning channels, inside pack4 lanes, of one channel, few and many; each path forced on the channel shapes.
ODD_KNOB_ROWS = (("LayerNorm", 16, 64, 1), ("LayerNorm", 4096, 8192, 4), ("RMSNorm", 197, 768, 1),
                 ("LayerNorm", 1, 65536, 1), ("RMSNorm", 8, 4096, 4))
ODD_KNOB_CHANNELS = (("GroupNorm", 320, 64, 64, 32), ("GroupNorm", 1280, 8, 8, 32), ("GroupNorm", 12, 7, 7, 6),
                     ("InstanceNorm", 32, 224, 224, 32), ("GroupNorm", 640, 16, 16, 2), ("InstanceNorm", 512, 7, 7, 512))


def test_odd_values_of_every_tuning_knob_still_plan_teams_that_halve(monkeypatch):
    """The knobs are for measuring other choices, so any whole number may be tried: whatever it is, the team
    reductions halve a power-of-two team inside a power-of-two workgroup of at most 1024, and each invocation holds at
    least one element (a team of 3 held float16 rows of 64 wrong by ~1, since rounded down to a power of two)."""
    from vknorm import settings

    def pow2(v):
        return 0 < v <= 1024 and v & (v - 1) == 0

    wrong = []
    for knob in sorted(settings.TUNING_KNOBS):
        for value in ("0", "1", "3", "7", "100", "100000"):
            monkeypatch.setenv(knob, value)
            for device in (H200_KNOWN_RESIDENCY, LAVAPIPE):
                for fp16 in (False, True):
                    plans = [(shape, rows_plan(*shape[:3], fp16, device, shape[3])) for shape in ODD_KNOB_ROWS]
                    plans += [((*shape, path), _channels_plan(*shape, fp16, device, path)) for shape in ODD_KNOB_CHANNELS
                              for path in ("auto", "workgroup", "subgroup", "split", "cooperative")]
                    wrong += [(knob, value, fp16, shape, {k: p[k] for k in ("path", "team", "workgroup_size", "items")})
                              for shape, p in plans
                              if not (pow2(p["team"]) and pow2(p["workgroup_size"]) and p["team"] <= p["workgroup_size"]
                                      and p["items"] >= 1)]
        monkeypatch.delenv(knob)
    assert not wrong, wrong[:10]


# The knobs read outside the planner: the host conversions' (positive, whole), and two switches read by a context.
KNOBS_OUTSIDE_THE_PLANNER = {"VKNORM_TUNE_CONVERSION_BYTES_PER_THREAD", "VKNORM_TUNE_CONVERSION_THREADS",
                             "VKNORM_TUNE_UNCACHED_MAPPING", "VKNORM_TUNE_FRESH_COMMAND_BUFFERS"}


@pytest.mark.parametrize("value", ["x", "-5", "8x", "1.5", " 3"])
def test_a_planner_knob_that_is_not_a_whole_number_is_refused_by_name(monkeypatch, value):
    """A knob read as atoi reads it took "x" for 0 and "8x" for 8 without a word, planning something else than what
    was meant to be measured: each planner knob is a whole number, or the next plan is refused naming it, and the
    runtime's list of refused settings (what `vknorm info` shows) has it."""
    from vknorm import settings

    unlisted, unrefused = [], []
    for knob in sorted(settings.TUNING_KNOBS - KNOBS_OUTSIDE_THE_PLANNER):
        monkeypatch.setenv(knob, value)
        if {"name": knob, "error": f"{knob}={value}: expected a whole number (a tuning knob, docs/benchmarks)"} \
                not in _core.setting_problems():
            unlisted.append(knob)
        with pytest.raises(ValueError) as e:
            rows_plan("LayerNorm", 16, 64, False)
        if f"{knob}={value}: expected a whole number" not in str(e.value):
            unrefused.append((knob, str(e.value)))
        monkeypatch.delenv(knob)
    assert not unlisted and not unrefused, (unlisted, unrefused)
    assert rows_plan("LayerNorm", 16, 64, False)["team"] >= 1  # unset again: planned


def test_the_hold_knob_turns_holding_off(monkeypatch):
    monkeypatch.setenv("VKNORM_TUNE_HOLD_STORAGE", "0")
    p = rows_plan("LayerNorm", 4096, 8192, True)
    assert not p["hold_storage"] and (p["team"], p["items"]) == (1024, 8), p  # the float32 limits apply


def test_plan_for_device_refuses_an_unknown_op():
    with pytest.raises(ValueError, match="op must be"):
        _core.plan_for_device("BatchNorm", 8, 1, 0, 2, 8, 2, 1, 1, 1, False, H200)


def test_plan_for_device_refuses_an_empty_blob_on_every_device():
    # one row packed by 4 is no packed row at all: an error, not a division by zero in the planner
    for device in (H200, dict(H200, compute_units=132), LAVAPIPE):
        with pytest.raises(ValueError, match="empty"):
            rows_plan("LayerNorm", 1, 4096, False, device)


# The device scripts below (run in a child with a knob set): `run` forwards a layer in each storage and packing
# asked, with the fused residual add and its sum where `add`, keeping every output (saved at the end) and what
# the layer's last dispatch says it ran (printed last, as JSON).
SCRIPT_HEAD = r"""
import json
import sys
import numpy as np
import vknorm
out, dispatched = [], []
def run(layer, x, add=False, storages=(False, True)):
    for fp16 in storages:
        for pack in (True, False):
            opt = vknorm.Option(use_fp16_storage=fp16, use_packing_layout=pack)
            out.append(layer(x, option=opt))
            d = layer.last_dispatch
            dispatched.append({"op": type(layer).__name__, "items": d["items"], "hold_storage": d["hold_storage"],
                               "plane_weights": d["plane_weights"], "apply_last_first": d["apply_last_first"]})
            if add:
                y, s = layer.forward_add(x, x[::-1].copy(), return_sum=True, option=opt)
                out.extend([y, s])
def weighted(layer, n, beta=True):
    g = rng.standard_normal(n).astype(np.float32)
    layer.load_model(g, rng.standard_normal(n).astype(np.float32)) if beta else layer.load_model(g)
    return layer
"""
SCRIPT_TAIL = r"""
np.savez(sys.argv[1], *[np.ascontiguousarray(a) for a in out])
print(json.dumps(dispatched))
"""

HELD_SCRIPT = SCRIPT_HEAD + r"""
rng = np.random.default_rng(7)
cases = [("LayerNorm", (64, 32)), ("LayerNorm", (43, 768)), ("LayerNorm", (8, 1024)), ("RMSNorm", (64, 256)),
         ("RMSNorm", (4, 4096)), ("LayerNorm", (7, 20))]
for op, shape in cases:
    c = shape[1]
    x = (rng.standard_normal(shape) * 3 + 100).astype(np.float32)
    layer = vknorm.LayerNorm(affine_size=c, eps=1e-5) if op == "LayerNorm" else vknorm.RMSNorm(affine_size=c, eps=1e-5)
    run(weighted(layer, c, beta=op == "LayerNorm"), x, add=True, storages=(True,))
gn = weighted(vknorm.GroupNorm(group=32, channels=320, eps=1e-5), 320)
gn.set_activation("swish")
run(gn, rng.standard_normal((320, 8, 8)).astype(np.float32), storages=(True,))
""" + SCRIPT_TAIL


def run_script_under(script, knob, value, tmp_path, **more_env):
    """Runs a device script in a child process with the tuning knob set (the dispatcher reads knobs per plan):
    its saved outputs and the JSON it printed last. The cooperative kernel stays off (a GPU plans it where the
    knob's other value leaves a group too large for the fused kernel), so both runs take the kernels compared."""
    path = tmp_path / f"{knob}_{value}.npz"
    env = dict(os.environ, VKNORM_COOPERATIVE_WORKGROUPS="0", **{knob: value}, **more_env)
    proc = subprocess.run([sys.executable, "-c", script, str(path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(path), json.loads(proc.stdout.strip().splitlines()[-1])


def assert_bit_identical(a_run, b_run):
    assert len(a_run.files) == len(b_run.files) >= 20
    for k in a_run.files:
        a, b = a_run[k], b_run[k]
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes(), k


def test_holding_float16_as_stored_changes_no_bit(tmp_path):
    """The held kernels (float16 kept as its bits, unpacked where used) against the same kernels keeping float32
    values, on this machine's device: every output bit-identical (LayerNorm, RMSNorm, GroupNorm + Swish, pack4
    and pack1, the fused residual add and its sum)."""
    runs = {}
    for hold in ("0", "1"):
        runs[hold], dispatched = run_script_under(HELD_SCRIPT, "VKNORM_TUNE_HOLD_STORAGE", hold, tmp_path)
        held = [d["hold_storage"] for d in dispatched]
        assert any(held) if hold == "1" else not any(held), (hold, held)
    assert_bit_identical(runs["0"], runs["1"])


UNSPECIALIZED_SCRIPT = SCRIPT_HEAD + r"""
rng = np.random.default_rng(9)
for c in (20, 37, 300, 768):  # items of 3, 5, 38, 96 on a CPU driver's 8-wide teams: rounded to 4, 8, 64, 128
    run(weighted(vknorm.LayerNorm(affine_size=c, eps=1e-5), c), (rng.standard_normal((12, c)) * 3 + 50).astype(np.float32),
        add=True)
run(weighted(vknorm.RMSNorm(affine_size=300, eps=1e-5), 300, beta=False), rng.standard_normal((8, 300)).astype(np.float32))
gn = weighted(vknorm.GroupNorm(group=4, channels=16, eps=1e-5), 16)
gn.set_activation("swish")
run(gn, rng.standard_normal((16, 9, 11)).astype(np.float32))
run(weighted(vknorm.InstanceNorm(channels=8, eps=1e-5), 8), (rng.standard_normal((8, 13, 7)) + 20).astype(np.float32))
""" + SCRIPT_TAIL


def test_plans_without_the_group_size_as_a_constant_hold_items_rounded_to_a_power_of_two_and_agree(tmp_path):
    """Past the shapes a layer in an ncnn net specializes (VKNORM_TUNE_SPECIALIZE=0 here: none), the fused kernel
    holds a power of two of elements per invocation where the cap allows, so group sizes share pipelines; the
    elements past the group are masked, and every output (each norm, both storages and packings, the fused add and
    its sum) agrees with the specialized plan's within float32 rounding (float16 storage: one float16 step). Bit for
    bit on lavapipe; a GPU's compiler may contract or order the unrolled and the looped sums differently (H200)."""
    runs, items = {}, {}
    for value in ("1", "0"):
        runs[value], dispatched = run_script_under(UNSPECIALIZED_SCRIPT, "VKNORM_TUNE_SPECIALIZE", value, tmp_path)
        items[value] = [d["items"] for d in dispatched]
    assert all(i & (i - 1) == 0 for i in items["0"]), items["0"]
    assert items["0"] != items["1"]  # the rounding was exercised
    a_run, b_run = runs["1"], runs["0"]
    assert len(a_run.files) == len(b_run.files) >= 20
    for k in a_run.files:
        a, b = a_run[k].astype(np.float64), b_run[k].astype(np.float64)
        assert a_run[k].dtype == b_run[k].dtype and a.shape == b.shape
        step = 2 * half_fp16_spacing(np.maximum(np.abs(a), np.abs(b))) if a_run[k].dtype == np.float16 else 0.0
        assert (np.abs(a - b) <= 2 * FP32_TOL * scale(a) + step).all(), (k, float(np.abs(a - b).max()))
    if vknorm.device_info()["type"] == "cpu":
        assert_bit_identical(a_run, b_run)


SPLIT_SCRIPT = SCRIPT_HEAD + r"""
rng = np.random.default_rng(11)
x = (rng.standard_normal((8, 3000)) * 3 + 1e4).astype(np.float32)
x[:, 0] += 50  # an outlier first element: the pivot far from every chunk's mean
run(weighted(vknorm.LayerNorm(affine_size=3000, eps=1e-5), 3000), x, add=True)
run(weighted(vknorm.RMSNorm(affine_size=3000, eps=1e-5), 3000, beta=False), x - 1e4, add=True)
gn = weighted(vknorm.GroupNorm(group=32, channels=320, eps=1e-5), 320)  # 10 channels per group: pack4 lanes of two groups
gn.set_activation("swish")
run(gn, (rng.standard_normal((320, 24, 24)) - 30).astype(np.float32))
run(weighted(vknorm.InstanceNorm(channels=8, eps=1e-5), 8), (rng.standard_normal((8, 40, 40)) * 2 + 500).astype(np.float32))
""" + SCRIPT_TAIL


def test_the_split_reduce_holding_its_chunks_changes_no_bit(tmp_path):
    """The split path's reduce holding each chunk for its second pass against re-reading it, same chunks, on this
    machine's device: every output bit-identical (LayerNorm with a large offset and an outlier pivot, its fused
    residual add and sum; GroupNorm with groups inside pack4 lanes + Swish; InstanceNorm; RMSNorm, which holds
    nothing; both storages and packings). Chunks of 16 elements per invocation on any device, so that a CPU
    driver holds them too."""
    runs = {}
    for hold in ("0", "1"):
        runs[hold], dispatched = run_script_under(SPLIT_SCRIPT, "VKNORM_TUNE_HOLD_REDUCE", hold, tmp_path,
                                                  VKNORM_PATH="split", VKNORM_TUNE_ITEMS_TARGET_REDUCE="16")
        items = [(d["op"], d["items"]) for d in dispatched]
        centred = [i for op, i in items if op != "RMSNorm"]
        assert all(i > 1 for i in centred) if hold == "1" else all(i == 1 for i in centred), (hold, items)
        assert all(i == 1 for op, i in items if op == "RMSNorm"), items
    assert_bit_identical(runs["0"], runs["1"])


def test_the_split_apply_pass_last_to_first_changes_no_bit(tmp_path):
    """The split path's apply pass over rows walking the elements last to first (GPUs: the end of x is what the
    reduce pass left in the L2) against first to last, on this machine's device: LayerNorm and RMSNorm, both
    storages and packings, with the fused residual add and its sum (and the per-channel norms, whose apply
    pass works chunk by chunk either way)."""
    runs = {}
    for v in ("0", "1"):
        runs[v], dispatched = run_script_under(SPLIT_SCRIPT, "VKNORM_TUNE_APPLY_LAST_FIRST", v, tmp_path,
                                               VKNORM_PATH="split")
        order = {(d["op"], d["apply_last_first"]) for d in dispatched}
        # the rows' apply pass takes the knob; the per-channel norms' goes chunk by chunk either way
        assert order == {("LayerNorm", v == "1"), ("RMSNorm", v == "1"), ("GroupNorm", False),
                         ("InstanceNorm", False)}, (v, order)
    assert_bit_identical(runs["0"], runs["1"])


PLANE_WEIGHTS_SCRIPT = SCRIPT_HEAD + r"""
rng = np.random.default_rng(5)
for c, group, hw in ((320, 32, 32), (640, 32, 32), (96, 12, 24), (48, 4, 32)):  # 10, 20, 8, 12 channels per group
    gn = weighted(vknorm.GroupNorm(group=group, channels=c, eps=1e-5), c)
    gn.set_activation("swish")
    run(gn, (rng.standard_normal((c, hw, hw)) * 2 - 40).astype(np.float32))
run(weighted(vknorm.InstanceNorm(channels=8, eps=1e-5), 8), (rng.standard_normal((8, 64, 64)) * 2 + 500).astype(np.float32))
""" + SCRIPT_TAIL


def test_the_planes_weights_in_shared_memory_change_no_bit(tmp_path):
    """The fused kernel reading each plane's per-channel weights from shared memory against loading them per
    element after the reduction, on this machine's device: GroupNorm with groups inside pack4 lanes (10
    channels per group) and across whole lanes (20, 8, 12), + Swish; InstanceNorm; both storages and packings. Not
    as latency-bound tensors (GPUs would load these small tensors' weights with x instead)."""
    runs = {}
    for on in ("0", "1"):
        runs[on], dispatched = run_script_under(PLANE_WEIGHTS_SCRIPT, "VKNORM_TUNE_PLANE_WEIGHTS", on, tmp_path,
                                                VKNORM_TUNE_LATENCY_THREADS="0")
        used = [d["plane_weights"] for d in dispatched]
        assert (sum(used) >= 4) if on == "1" else not any(used), (on, used)
    assert_bit_identical(runs["0"], runs["1"])

"""vknorm inside ncnn's Vulkan graph: vknorm's LayerNorm/RMSNorm/GroupNorm/InstanceNorm layers recorded into ncnn's command buffer
on ncnn's blobs (C++ ncnn::Net, ncnn compiled from its pinned source, through vknorm.graph).

Every committed model (tests/data/models.json, the LayerNorm-dominated ln_residual_stack included) runs in
one child process under the Khronos validation layer (tests/graph_runs.py): stock ncnn CPU fp32 (the
reference), stock ncnn Vulkan, and ncnn Vulkan with vknorm's layers, float32 and float16 storage, packing
option on and off. (ncnn's Vulkan graph packs a blob by 4 whenever its outer extent divides by 4, whatever
``use_packing_layout`` says; blobs whose outer extent does not divide reach the layer with elempack 1, so
both layouts are exercised by the models' shapes — asserted below.)

Tolerances:
* each vknorm layer against float64 computed from the very input it saw, by the storage rule: float32,
  1e-5 x max(1, max|y|); float16 storage, what the output's rounding to float16 (half a spacing) cannot
  explain, within the same bound. A fixed absolute tolerance against the float32 CPU run would be wrong here (a
  LayerNorm fed 100 + 3y loses 0.03 to storage alone).
* each norm blob and model output against stock CPU fp32, by `vknorm check --vulkan`'s rule: at most twice stock
  ncnn Vulkan's own difference there (the layer's input already carries the other Vulkan layers'), plus the layer
  rule's atol (1e-4 float32, 1e-3 float16) at the blob's scale.
"""
from __future__ import annotations

import gc
import json
import re
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import graph_runs
import validation_layer
from availability import import_graph, import_or_missing, missing
from reference import FP32_TOL
from reliability_lib import thread_progress_during
from vknorm._stdio import quiet_stderr

pytestmark = pytest.mark.timeout(900)

graph = import_graph()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """graph_runs.py in a child process with the validation layer loaded into ncnn's Vulkan instance."""
    tmp = tmp_path_factory.mktemp("graph")
    log = tmp / "validation.log"
    out = tmp / "runs.json"
    env = graph_runs.validated_env(str(log), str(tmp))
    proc = subprocess.run([sys.executable, graph_runs.__file__, str(out)], env=env, capture_output=True, text=True,
                          timeout=800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(out) as f:
        result = json.load(f)
    assert log.exists(), "the validation layer wrote no log: not loaded into ncnn's instance"
    result["validation_log"] = log.read_text()
    return result


def configs(runs):
    return [(m["model"], m["fp16"], m["packing"], m) for m in runs["models"]]


def test_every_committed_model_ran_in_every_configuration(runs):
    names = set(graph_runs.models())
    assert {"ln_residual_stack"} <= names
    seen = {(m, fp16, pack) for m, fp16, pack, _ in configs(runs)}
    assert seen == {(n, f, p) for n in names for f in (False, True) for p in (False, True)}


def test_validation_layer_reports_nothing_for_stock_or_vknorm_nets(runs):
    assert runs["validation_log"].strip() == "", runs["validation_log"][:4000]


def test_validation_capture_catches_errors_in_an_instance_the_test_did_not_create(tmp_path):
    """Negative control for the mechanism above: the same environment, a Vulkan instance made by a library
    (vknorm's own context, its own messenger off), one buffer leaked on purpose: the log must report it."""
    log = tmp_path / "validation.log"
    env = graph_runs.validated_env(str(log), str(tmp_path))
    env.update(VKNORM_VALIDATION="0", VKNORM_DEBUG_LEAK_BUFFER="1")
    code = ("import numpy as np, vknorm\n"
            "ln = vknorm.LayerNorm(affine_size=8, affine=0)\n"
            "ln(np.ones((2, 8), np.float32))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = log.read_text()
    assert "VkBuffer" in text or "VkDeviceMemory" in text, text[:2000]


def test_no_host_round_trip_every_norm_forward_ran_on_vulkan(runs):
    for model, fp16, pack, m in configs(runs):
        c = m["counters"]
        assert c["cpu_forwards"] == 0, (model, fp16, pack, c)
        assert c["vulkan_forwards"] == len(m["layers"]) > 0, (model, fp16, pack, c)
        for layer in m["layers"]:
            assert layer["vulkan_forwards"] == 1 and layer["cpu_forwards"] == 0, (model, layer["name"])


def test_pack1_and_pack4_blobs_and_both_storages_reach_the_layer(runs):
    variants = {v.split("/")[0] for *_, m in configs(runs) for layer in m["layers"] for v in layer["variants"]}
    for storage in ("fp0", "fp1"):
        assert any(f"_{storage}_p4_" in v for v in variants), variants
        assert any(f"_{storage}_p1_" in v or f"_{storage}_pv4_" in v for v in variants), variants


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_every_norm_layer_matches_float64_of_its_own_input(runs, fp16):
    """The storage rule (reference.storage_rule): float32, max |y - float64| <= FP32_TOL x max(1, max|y|); float16,
    what the output's rounding to float16 cannot explain within the same bound."""
    for model, f, pack, m in configs(runs):
        if f != fp16:
            continue
        for layer in m["layers"]:
            bound = FP32_TOL * max(1.0, layer["ref_max"])
            assert layer["vknorm_excess_f64" if fp16 else "vknorm_vs_f64"] <= bound, (model, pack, layer)


def test_every_norm_layer_is_as_close_to_stock_cpu_as_stock_ncnn_vulkan(runs):
    """By `vknorm check --vulkan`'s rule (graph_runs.stock_bound)."""
    for model, fp16, pack, m in configs(runs):
        for layer in m["layers"]:
            assert layer["vknorm_vs_cpu"] <= layer["bound"], (model, fp16, pack, layer)


def test_every_model_output_is_as_close_to_stock_cpu_as_stock_ncnn_vulkan(runs):
    for model, fp16, pack, m in configs(runs):
        for o in m["outputs"]:
            assert o["vknorm_vs_cpu"] <= o["bound"], (model, fp16, pack, o)


def test_large_offset_groups_stay_exact_through_ncnn(runs):
    """1e4 + N(0, 1e-2) groups (LayerNorm rows, GroupNorm groups straddling pack4): vknorm within the float32
    rule of float64 (as on its own path); stock ncnn's Vulkan layer, measured beside it, is far off (its sums
    lose the small deviations)."""
    cases = runs["large_offset"]
    assert {c["type"] for c in cases} == {"LayerNorm", "GroupNorm"} and len(cases) == 4
    for case in cases:
        assert case["counters"]["cpu_forwards"] == 0 and case["counters"]["vulkan_forwards"] == 1
        assert case["vknorm_vs_f64"] <= FP32_TOL * case["scale"], case
    for t in ("LayerNorm", "GroupNorm"):  # the case is hard: stock ncnn loses it
        assert max(c["stock_vs_f64"] for c in cases if c["type"] == t) > 1e-2, cases


def test_groupnorm_and_instancenorm_models_ran_inside_the_graph(runs):
    """The SD-style residual blocks (GroupNorm + Swish; 2 and 10 channels per group) and the style blocks
    (InstanceNorm, with and without affine) ran their norms in ncnn's graph, pack4 kernels included."""
    types = {}
    for model, fp16, pack, m in configs(runs):
        for layer in m["layers"]:
            types.setdefault(layer["type"], set()).update(v.split("/")[0] for v in layer["variants"])
    for t in ("GroupNorm", "InstanceNorm"):
        assert t in types, sorted(types)
        assert any("_p4_" in v or "_pv4_" in v for v in types[t]), types[t]
    models = {m for m, *_ in configs(runs)}
    assert {"sd_resblock", "sd_resblock_c320", "instnorm_block", "instnorm_noaffine"} <= models


LANE_GROUPS_SCRIPT = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import graph_runs
from vknorm import graph
param, binp = sys.argv[2], sys.argv[3]
x = np.random.default_rng(5).standard_normal((320, 8, 8)).astype(np.float32)
blobs = graph_runs.output_blobs(param) + [n[3] for n in graph_runs.norm_layers(param)]
cpu, _ = graph_runs.run_net(graph, param, binp, {"in0": x}, blobs, vknorm=False, vulkan=False)
for fp16 in (False, True):
    stock, _ = graph_runs.run_net(graph, param, binp, {"in0": x}, blobs, False, True, fp16)
    vk, info = graph_runs.run_net(graph, param, binp, {"in0": x}, blobs, True, True, fp16)
    for l in info["layers"]:
        # "<variant>/<constants>": the fused kernel's 17th constant (id 16) is 1 for an item per group
        lanes = [v for v in l["variants"] if v.startswith("norm_fused") and v.split("/")[1:][16:] == ["1"]]
        vec4 = sum("_pv4_" in v for v in lanes)  # the fused kernel's vec4 variant
        print("layer", l["name"], fp16, len(lanes), vec4, l["vulkan_forwards"], l["cpu_forwards"])
    for b in blobs:
        print("err", b, fp16, graph_runs.max_err(vk[b], cpu[b]), graph_runs.stock_bound(cpu[b], stock[b], fp16))
"""


def test_groups_inside_pack4_lanes_run_an_item_per_group_inside_the_graph(tmp_path):
    """sd_resblock_c320 (GroupNorm(32) of 320 channels: 10 per group, inside pack4 lanes) in ncnn's Vulkan graph
    with an item per group, as GPUs plan it (forced here: VKNORM_TUNE_LANE_GROUPS=2), in both storages under
    validation: every norm ran the fused kernel's vec4 variant with an item per group on Vulkan, and every norm
    and output blob is as close to stock CPU float32 as stock ncnn Vulkan's (`vknorm check --vulkan`'s rule, as
    above)."""
    param = os.path.join(graph_runs.DATA, "sd_resblock_c320.ncnn.param")
    binp = os.path.join(graph_runs.DATA, "sd_resblock_c320.ncnn.bin")
    proc, log = graph_runs.run_validated(tmp_path, LANE_GROUPS_SCRIPT, os.path.dirname(graph_runs.__file__), param, binp,
                                         env={"VKNORM_TUNE_LANE_GROUPS": "2"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    layers = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith("layer ")]
    assert len(layers) == 4 and all(int(n) >= 1 and int(v) >= 1 and int(c) == 0 for *_, n, _, v, c in layers), layers
    assert all(int(vec4) == int(n) for *_, n, vec4, _, _ in layers), layers
    errs = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith("err ")]
    assert errs
    for _, blob, fp16, mine, bound in errs:
        assert float(mine) <= float(bound), (blob, fp16, mine, bound)
    assert log.strip() == "", log[:3000]


@pytest.mark.parametrize("order", ["pyncnn_first", "graph_first", "pyncnn_first_rtld_global"])
def test_pyncnn_and_vknorm_graph_in_one_process_keep_their_own_ncnn(order):
    """Two copies of ncnn in one process (pyncnn's and vknorm's): each net gives its own copy's answer —
    even when pyncnn is loaded RTLD_GLOBAL, vknorm's module exports no ncnn symbol to interpose. The answers
    agree (the same CPU algorithm), so what ran is checked too: vknorm's layers in the vknorm=True net (its CPU
    forwards counted), none in the vknorm=False one."""
    param, binp = (os.path.join(graph_runs.DATA, "transformer_block.ncnn." + e) for e in ("param", "bin"))
    code = f"""
import os, sys, numpy as np
if {order!r} == "pyncnn_first_rtld_global":
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_GLOBAL)
if {order!r}.startswith("pyncnn_first"):
    import ncnn
    from vknorm import graph
else:
    from vknorm import graph
    import ncnn
x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
outs = []
for mod, kw in ((ncnn, {{}}), (graph, {{"vknorm": False}}), (graph, {{"vknorm": True}})):
    net = mod.Net(**kw)
    net.opt.use_vulkan_compute = False
    assert net.load_param({param!r}) == 0 and net.load_model({binp!r}) == 0
    ex = net.create_extractor()
    ex.input("in0", mod.Mat(x).clone() if mod is ncnn else mod.Mat(x))
    r, out = ex.extract("out0")
    assert r == 0
    outs.append(np.array(out))
    if mod is graph:
        print("vknorm" if kw["vknorm"] else "stock", len(net.vknorm_layers()), net.vknorm_counters()["cpu_forwards"])
print(max(float(np.abs(o - outs[0]).max()) for o in outs))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert float(lines[-1]) <= 1e-5
    ran = {ln.split()[0]: (int(ln.split()[1]), int(ln.split()[2])) for ln in lines[:-1]}
    assert ran["stock"] == (0, 0) and ran["vknorm"][0] == 3 and ran["vknorm"][1] >= 3, ran  # transformer_block: 3 LayerNorms


def test_vknorm_graph_module_exports_no_ncnn_symbols():
    import vknorm._graph as mod

    nm = subprocess.run(["nm", "-D", "--defined-only", mod.__file__], capture_output=True, text=True)
    assert nm.returncode == 0, nm.stderr
    exported = [ln.split()[-1] for ln in nm.stdout.splitlines() if ln.strip()]
    assert any(s.startswith("PyInit__graph") for s in exported)
    leaked = [s for s in exported if "ncnn" in s or "glslang" in s or "vknorm" in s]
    assert leaked == [], leaked[:20]


DIMS1_FP16_SCRIPT = r"""
import json, sys, numpy as np
from vknorm import graph
w, tmp = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(5)
gamma = rng.uniform(0.5, 1.5, w).astype(np.float32)
beta = rng.uniform(-0.5, 0.5, w).astype(np.float32)
with open(f"{tmp}/m.param", "w") as f:
    f.write(f"7767517\n2 2\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 out0 0={w} 1=1e-5 2=1\n")
with open(f"{tmp}/m.bin", "wb") as f:
    f.write(gamma.tobytes() + beta.tobytes())
net = graph.Net()
o = net.opt
o.use_vulkan_compute = True
o.use_fp16_storage = False   # what ncnn runs with on a device without 16-bit storage:
o.use_fp16_packed = True     # float16 only in pack4 blobs, read as packed uvec2 halves
o.use_fp16_arithmetic = False
o.use_packing_layout = True
assert net.load_param(f"{tmp}/m.param") == 0 and net.load_model(f"{tmp}/m.bin") == 0
x = (3 * rng.standard_normal(w) + 1).astype(np.float32)
ex = net.create_extractor()
assert ex.input("in0", graph.Mat(x)) == 0
r, m = ex.extract("out0")
assert r == 0, r
y = np.array(m)
xs = x.astype(np.float16).astype(np.float64)  # the blob ncnn uploads is float16
ref = (xs - xs.mean()) / np.sqrt(xs.var() + 1e-5) * gamma + beta
half_spacing = np.exp2(np.floor(np.log2(np.maximum(np.abs(y), 2.0 ** -14))) - 11)  # at the float16 output
excess = float(np.max(np.abs(y - ref) - half_spacing))
layer = net.vknorm_layers()[0]
print(json.dumps({"excess": excess, "scale": max(1.0, float(np.abs(ref).max())), "variants": layer["variants"], "vulkan_forwards": layer["vulkan_forwards"],
                  "cpu_forwards": layer["cpu_forwards"]}))
"""


@pytest.mark.parametrize("w", [4096, 196608], ids=["fused", "split"])
@pytest.mark.parametrize("storage16", [True, False], ids=["16bit_storage", "no_16bit_storage"])
def test_dims1_float16_blob_on_a_device_without_16bit_storage(tmp_path, w, storage16):
    """ncnn packs a dims-1 float16 blob by 4 (elemsize 8: packed halves, no 16-bit storage needed); vknorm reads
    it as one elempack-1 group. The fused kernel reads that as vec4s (packed halves again). A group too large
    for it (131072 elements: beyond what a workgroup holds on any device) takes the split path, which reads
    single float16 values: storageBuffer16BitAccess. Without it (VKNORM_NO_FP16_STORAGE=1: the layers plan as
    if ncnn's device lacked it) the layer converts the blob to float32 with ncnn's packing and back, so no
    pipeline reads single float16 values; with it, the float16 split kernels run. Both match float64 of the
    float16 input within the float16 storage rule, with no validation message."""
    proc, log = graph_runs.run_validated(tmp_path, DIMS1_FP16_SCRIPT, w, tmp_path, unset=["VKNORM_NO_FP16_STORAGE"],
                                         env={} if storage16 else {"VKNORM_NO_FP16_STORAGE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert log.strip() == ""
    assert r["vulkan_forwards"] == 1 and r["cpu_forwards"] == 0, r
    assert r["excess"] <= FP32_TOL * r["scale"], r  # the float16 storage rule
    kernels = {v.split("/")[0] for v in r["variants"]}
    single_halves = {k for k in kernels if "_fp1_p1_" in k}  # elempack-1 float16 kernels: 16-bit storage
    if w == 4096:
        # out of place, as vknorm's layers run in ncnn's graph
        assert kernels == {"norm_fused_oop_fp1_pv4_sg1"} or kernels == {"norm_fused_oop_fp1_pv4_sg0"}, kernels
    elif storage16:
        # the split passes, or on GPUs that plan it, the cooperative kernel (and the clear of its counters)
        large = ("norm_reduce", "norm_finalize", "norm_apply", "norm_cooperative", "norm_clear")
        assert single_halves and all(k.startswith(large) for k in kernels), kernels
    else:
        assert not single_halves, kernels
        split = "norm_reduce_fp0_p1_sg0" in kernels and "norm_apply_fp0_p1_sg0" in kernels  # in place, on ncnn's float32 copy
        assert split or any(k.startswith("norm_cooperative_fp0_p1") for k in kernels), kernels


PROFILE_SCRIPT = r"""
import json, sys
import numpy as np
from vknorm import graph
param, binp, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
# ln_residual_stack, fused (its adds and GELUs run in vknorm's kernels, with ncnn's CPU formulas), float32
x = np.random.default_rng(3).standard_normal((197, 768)).astype(np.float32)
# and a float16 net whose rows (766) do not divide by 4: ncnn stores them elempack 1, and the kernels read single
# float16 values, where vknorm may (16-bit storage) or runs them through ncnn's float32 copy (not, or hidden)
w = 766
rng = np.random.default_rng(4)
gamma, beta = rng.uniform(0.5, 1.5, w).astype(np.float32), rng.uniform(-0.5, 0.5, w).astype(np.float32)
with open(f"{tmp}/odd.param", "w") as f:
    f.write(f"7767517\n2 2\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 out0 0={w} 1=1e-5 2=1\n")
with open(f"{tmp}/odd.bin", "wb") as f:
    f.write(gamma.tobytes() + beta.tobytes())
xo = (rng.standard_normal((197, w)) * 2 + 1).astype(np.float32)
result = {"loaded": {}, "err": {}, "variants": {}}
for run, model, inp, vk, fp16 in (("cpu", (param, binp), x, False, False), ("vknorm", (param, binp), x, True, False),
                                   ("odd_fp16", (f"{tmp}/odd.param", f"{tmp}/odd.bin"), xo, True, True)):
    net = graph.configure(graph.Net(vknorm=True), vulkan=vk, fp16=fp16)
    result["loaded"][run] = net.load_param(model[0]) == 0 and net.load_model(model[1]) == 0
    if not result["loaded"][run]:
        continue
    ex = net.create_extractor()
    assert ex.input("in0", graph.Mat(inp)) == 0
    r, m = ex.extract("out0")
    assert r == 0, (run, r)
    y = np.array(m).astype(np.float64)
    if run == "cpu":
        ref = y
    elif run == "vknorm":
        result["err"][run] = float(np.max(np.abs(y - ref)))
    else:  # float64 of the float16 input, judged after the output's own float16 rounding (the float16 storage rule)
        xs = xo.astype(np.float16).astype(np.float64)
        mu, var = xs.mean(1, keepdims=True), xs.var(1, keepdims=True)
        want = (xs - mu) / np.sqrt(var + 1e-5) * gamma + beta
        half_spacing = np.exp2(np.floor(np.log2(np.maximum(np.abs(y), 2.0 ** -14))) - 11)  # at the float16 output
        result["err"][run] = float(np.max(np.abs(y - want) - half_spacing))
        result["scale"] = max(1.0, float(np.abs(want).max()))
    if vk:
        result["variants"][run] = sorted({v for layer in net.vknorm_layers() for v in layer["variants"]})
print(json.dumps(result))
"""


# A shared-memory cap as a number, or "subgroup": a subgroup's worth for the split passes (64 B per invocation),
# the least under which ncnn can run every plan (it rounds workgroups up to its subgroup size)
@pytest.mark.parametrize("profile", [{}, {"VKNORM_NO_SUBGROUP": "1"}, {"VKNORM_VULKAN_API": "1.0"},
                                     {"VKNORM_NO_FP16_STORAGE": "1"}, {"VKNORM_MAX_SHARED_MEMORY": "subgroup"},
                                     {"VKNORM_MAX_SHARED_MEMORY": "100"}],
                         ids=["device", "no_subgroup", "vulkan_1_0", "no_fp16_storage", "shared_small", "shared_bad"])
def test_capability_profiles_apply_to_the_layers_inside_ncnn(tmp_path, profile, vulkan_device):
    """The capability-profile variables make vknorm's layers in ncnn's graph plan as on the smaller device, as
    vknorm's own context does: no subgroup reductions (sg0 variants) without subgroup operations or on Vulkan
    1.0, workgroups within a shared-memory cap (16 B per invocation at most), and without 16-bit storage a
    float16 blob that would be read as single float16 values goes through ncnn's float32 copy (fp0 kernels)
    while ncnn keeps its float16 storage. ln_residual_stack fused still matches ncnn's CPU run (float32: 1e-4
    over 12 blocks; its adds and GELUs run in vknorm's kernels with ncnn's CPU formulas), and the float16 net
    float64 within the float16 storage rule. A value the profile cannot read fails the
    net's load, naming it, with no crash."""
    profile = dict(profile)
    if profile.get("VKNORM_MAX_SHARED_MEMORY") == "subgroup":
        profile["VKNORM_MAX_SHARED_MEMORY"] = str(64 * max(vulkan_device["subgroup_size"], 4))
    param, binp = (os.path.join(graph_runs.DATA, "ln_residual_stack.ncnn" + e) for e in (".param", ".bin"))
    proc, log = graph_runs.run_validated(
        tmp_path, PROFILE_SCRIPT, param, binp, tmp_path, env=profile,
        unset=["VKNORM_NO_SUBGROUP", "VKNORM_VULKAN_API", "VKNORM_MAX_SHARED_MEMORY", "VKNORM_NO_FP16_STORAGE"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert log.strip() == ""
    if profile.get("VKNORM_MAX_SHARED_MEMORY") == "100":
        assert r["loaded"] == {"cpu": True, "vknorm": False, "odd_fp16": False}, r
        assert "VKNORM_MAX_SHARED_MEMORY=100: at least 256 bytes" in proc.stderr, proc.stderr[-2000:]
        return
    assert r["err"]["vknorm"] <= 1e-4 and r["err"]["odd_fp16"] <= FP32_TOL * r["scale"], r
    variants = r["variants"]["vknorm"] + r["variants"]["odd_fp16"]
    kernels = {v.split("/")[0] for v in variants}
    assert kernels and all(k.startswith("norm_") for k in kernels), kernels
    subgroups = {"arithmetic", "shuffle"} <= set(vulkan_device["subgroup_ops"])
    if not profile and subgroups:
        assert all(k.endswith("_sg1") for k in kernels), kernels
    if "VKNORM_NO_SUBGROUP" in profile or "VKNORM_VULKAN_API" in profile:
        assert all(k.endswith("_sg0") for k in kernels), kernels
    if "VKNORM_MAX_SHARED_MEMORY" in profile:
        assert max(int(v.split("/")[1]) for v in variants) * 16 <= int(profile["VKNORM_MAX_SHARED_MEMORY"]), variants
    odd = {v.split("/")[0] for v in r["variants"]["odd_fp16"]}
    if "VKNORM_NO_FP16_STORAGE" in profile or "VKNORM_VULKAN_API" in profile:
        assert all("_fp0_" in k for k in odd), odd  # ncnn's float32 copy
    elif vulkan_device["storage_16bit"]:
        assert any("_fp1_p1_" in k for k in odd), odd  # single float16 values


BELOW_SUBGROUP_SCRIPT = r"""
import sys
import numpy as np
from vknorm import graph
net = graph.configure(graph.Net(vknorm=True, fuse=False), vulkan=True)
assert net.load_param(sys.argv[1]) == 0 and net.load_model(sys.argv[2]) == 0
ex = net.create_extractor()
assert ex.input("in0", graph.Mat(np.random.default_rng(0).standard_normal((197, 768)).astype(np.float32))) == 0
print("extract", ex.extract("out0")[0])
"""


def test_a_plan_of_workgroups_below_ncnns_subgroup_size_is_refused_in_ncnns_graph(tmp_path, vulkan_device):
    """ncnn runs every pipeline with its workgroup rounded up to a multiple of its subgroup size, rewriting the
    shader's: a plan of smaller workgroups (only a shared-memory cap below a subgroup's worth makes one: the
    split passes at 64 B per invocation, forced) would run invocations the kernel does not count, which gave
    NaN on lavapipe and errors of 22 on an H200. The layer refuses such a plan, naming the kernel, both sizes
    and the variable: extract returns -1, with no validation message."""
    subgroup = vulkan_device["subgroup_size"]
    if subgroup < 2:
        missing("the device reports no subgroup size to round to (lavapipe: 8)")
    param, binp = (os.path.join(graph_runs.DATA, "ln_residual_stack.ncnn" + e) for e in (".param", ".bin"))
    proc, log = graph_runs.run_validated(tmp_path, BELOW_SUBGROUP_SCRIPT, param, binp,
                                         env={"VKNORM_PATH": "split",
                                              "VKNORM_MAX_SHARED_MEMORY": str(max(256, 32 * subgroup))})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "extract -1", proc.stdout
    assert f"fewer than the {subgroup} that ncnn runs it with" in proc.stderr, proc.stderr[-2000:]
    assert "VKNORM_MAX_SHARED_MEMORY" in proc.stderr
    assert log.strip() == ""


# Three extracts of each net of a model (fused and unfused, lightmode on, so ncnn's blocks are recycled) on each
# path named (VKNORM_PATH), the input ROWSxCOLS: per net, the fused layers and the kernels that ran.
RECYCLED_BLOCKS_SCRIPT = r"""
import os, sys
import numpy as np
from vknorm import graph
param, binp, rows, cols, paths = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
for path in paths.split(","):
    os.environ["VKNORM_PATH"] = path
    for fuse in (True, False):
        net = graph.configure(graph.Net(fuse=fuse), vulkan=True)
        assert net.load_param(param) == 0 and net.load_model(binp) == 0
        for _ in range(3):
            ex = net.create_extractor()
            for name in net.input_names():
                assert ex.input(name, graph.Mat(x)) == 0
            r, out = ex.extract("out0")
            assert r == 0 and np.isfinite(np.array(out)).all()
            del ex
        fused = sum(1 for l in net.vknorm_layers() if l["layer_type"].startswith("vknorm."))
        kernels = sorted({v.split("_")[1] for l in net.vknorm_layers() for v in l["variants"]})
        print(f"{path} fused layers: {fused} kernels: {' '.join(kernels)}", flush=True)
        del net
"""


def test_a_norm_on_a_shared_input_writes_a_blob_of_its_own_with_no_unsynchronized_copy(tmp_path):
    """vknorm's layers read their input and write a new blob. An in-place layer on a blob that a Split shares
    makes ncnn copy the blob first into a block from its pool, and ncnn does not synchronize that copy with
    the shader writes the recycled block last saw. ln_residual_stack with its third add turned into a multiply
    (fused: LayerNorm+GELU right after a Split) hit exactly that; under synchronization validation in
    ncnn's instance, vknorm's nets of that model (fused and unfused, lightmode on, so blocks are recycled)
    must now run with an empty log. (Stock ncnn's own in-place layers still make that copy: stock nets are
    not run here.)"""
    param = open(os.path.join(graph_runs.DATA, "ln_residual_stack.ncnn.param")).read()
    line = next(ln for ln in param.splitlines() if ln.split()[:2] == ["BinaryOp", "add_2"])
    assert line.endswith("0=0"), line
    garbled = tmp_path / "mul.param"
    garbled.write_text(param.replace(line, line[:-3] + "0=2"))
    binp = os.path.join(graph_runs.DATA, "ln_residual_stack.ncnn.bin")
    proc, log = graph_runs.run_validated(tmp_path, RECYCLED_BLOCKS_SCRIPT, garbled, binp, 197, 768, "auto")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fused = [int(ln.split()[3]) for ln in proc.stdout.splitlines() if ln.startswith("auto fused layers:")]
    assert len(fused) == 2 and fused[0] > 0 and fused[1] == 0, proc.stdout
    assert log.strip() == "", log[:3000]


def test_a_norms_output_in_a_block_a_layer_just_read_waits_for_that_read(tmp_path):
    """ncnn's pool hands a block out again once the layers recorded before it have let it go, and the barrier
    ncnn records for a block just handed out waits for nothing. Here the LayerNorm's output lands in in1's block,
    which the BinaryOp before it reads, and the LayerNorm's input was last touched by a copy (ncnn's clone of the
    Split-shared blob for the in-place ReLU): no other barrier of the LayerNorm's dispatch waits for compute, so
    the barrier for its output must wait for that read. Under synchronization validation in ncnn's instance,
    vknorm's nets (fused and unfused) run with an empty log."""
    param = tmp_path / "m.param"
    param.write_text("7767517\n7 8\nInput in1 0 1 in1\nInput in0 0 1 in0\nSplit sp 1 2 in0 a1 a2\nReLU r1 1 1 a1 b\n"
                     "BinaryOp m1 2 1 in1 b c 0=0\nLayerNorm ln 1 1 a2 r 0=32 1=1e-5 2=0\n"
                     "BinaryOp add 2 1 c r out0 0=0\n")
    (tmp_path / "m.bin").write_bytes(b"")
    proc, log = graph_runs.run_validated(tmp_path, RECYCLED_BLOCKS_SCRIPT, param, tmp_path / "m.bin", 8, 32, "auto")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("auto fused layers:") == 2, proc.stdout
    assert log.strip() == "", log[:3000]


def test_a_norms_scratch_memory_is_not_handed_out_again_while_its_command_buffer_runs(tmp_path):
    """The cooperative and split kernels keep statistics and counters in scratch memory, and the cooperative kernel
    writes it last (its counters back to zero). Had that memory gone back to ncnn's pool when the layer had
    recorded, the copy ncnn makes for an in-place layer on a Split-shared blob (the Sigmoid here) could be handed
    it in the same command buffer, unsynchronized with those writes (a race on a GPU). Under synchronization
    validation in ncnn's instance, vknorm's nets run this graph on both scratch paths with an empty log."""
    param = tmp_path / "m.param"
    param.write_text("7767517\n9 12\nInput in0 0 1 in0\nSplit sp0 1 2 in0 x1 x2\n"
                     "LayerNorm ln1 1 1 x1 a 0=36 1=1e-5 2=0\nGELU g1 1 1 a a2\nBinaryOp add 2 1 a2 x2 s 0=0\n"
                     "LayerNorm ln2 1 1 s b 0=36 1=1e-5 2=0\nSplit sp 1 2 b c d\nSigmoid sg 1 1 c e\n"
                     "BinaryOp mul 2 1 e d out0 0=2\n")
    (tmp_path / "m.bin").write_bytes(b"")
    proc, log = graph_runs.run_validated(tmp_path, RECYCLED_BLOCKS_SCRIPT, param, tmp_path / "m.bin", 11, 36,
                                         "cooperative,split")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    kernels = [ln.split("kernels: ")[1].split() for ln in proc.stdout.splitlines() if "kernels: " in ln]
    assert len(kernels) == 4 and all("cooperative" in k for k in kernels[:2]), proc.stdout
    assert all("reduce" in k for k in kernels[2:]), proc.stdout
    assert log.strip() == "", log[:3000]


SCRATCH_GROWTH_SCRIPT = r"""
import os, sys
os.environ["VKNORM_PATH"] = "split"
import numpy as np
from vknorm import graph
param, binp = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
# statistics per row: 48 KiB and 192 KiB of scratch, each more than half the layer's 64 KiB blocks can spare
small, big = (rng.standard_normal((rows, 64)).astype(np.float32) for rows in (4096, 16384))
graph.track_device_memory()
net = graph.configure(graph.Net(fuse=False), vulkan=True)

def run(x):
    ex = net.create_extractor()
    assert ex.input("in0", graph.Mat(x)) == 0
    return ex.extract("out0")[0]

def load():
    assert net.load_param(param) == 0 and net.load_model(binp) == 0

load()
assert run(big) == 0  # ncnn's pools now hold the big input's blobs
net.clear()
load()  # a layer of its own again: scratch for the small input only
assert run(small) == 0
graph.set_device_memory_limit(graph.device_memory()["bytes"])  # nothing more
print("big under the limit:", run(big))
print("small after it:", run(small))
graph.set_device_memory_limit(0)
print("big without a limit:", run(big))
"""


def test_scratch_that_cannot_grow_leaves_the_scratch_held_before_usable(tmp_path):
    """A layer's scratch grows with the input (the split path: statistics per row). Where device memory runs out as
    it grows, that forward fails with ncnn's -100, and a forward of the size that ran before still runs on the
    scratch it had; once memory is there, the large one runs."""
    (tmp_path / "m.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 out0 0=64 1=1e-5 2=0\n")
    (tmp_path / "m.bin").write_bytes(b"")
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-c", SCRATCH_GROWTH_SCRIPT, str(tmp_path / "m.param"),
                           str(tmp_path / "m.bin")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("big", "small"))]
    assert lines == ["big under the limit: -100", "small after it: 0", "big without a limit: 0"], proc.stdout


CONVOLUTION_SWITCHES = ("use_winograd_convolution", "use_winograd23_convolution", "use_winograd43_convolution",
                        "use_winograd63_convolution", "use_sgemm_convolution")


@pytest.mark.parametrize("vulkan", [False, True], ids=["cpu", "vulkan"])
def test_the_convolution_switches_reach_ncnns_own_convolutions(vulkan):
    """pyncnn's Option.use_winograd_convolution and its kin choose how ncnn's own Convolution layers compute: on
    sd_resblock's 3x3 convolutions of 64 channels, winograd off gives other roundings than ncnn's default (on), within
    float32's reach of each other, and a CPU net with vknorm's layers gives stock ncnn's result bit for bit either
    way."""
    x = graph.Mat(np.random.default_rng(0).standard_normal((64, 16, 16)).astype(np.float32))
    assert graph.Option().use_winograd_convolution and graph.Option().use_sgemm_convolution  # ncnn's defaults

    def run(vknorm_layers=True, **switches):
        net = graph.configure(graph.Net(vknorm=vknorm_layers), vulkan=vulkan)
        for name, on in switches.items():
            setattr(net.opt, name, on)
        prefix = os.path.join(graph_runs.DATA, "sd_resblock.ncnn.")
        assert net.load_param(prefix + "param") == 0 and net.load_model(prefix + "bin") == 0
        ex = net.create_extractor()
        ex.input("in0", x)
        r, out = ex.extract("out0")
        assert r == 0
        return np.array(out)

    default, direct = run(), run(use_winograd_convolution=False)
    assert not np.array_equal(default, direct)
    np.testing.assert_allclose(direct, default, rtol=0, atol=1e-4 * max(1.0, float(np.abs(default).max())))
    if not vulkan:
        assert np.array_equal(direct, run(vknorm_layers=False, use_winograd_convolution=False))


def test_an_extractor_needs_a_loaded_model_with_the_options_it_was_loaded_with(tmp_path):
    """ncnn builds every layer's pipelines in load_model, for the options it finds then; an extractor of a net
    whose model did not load, or whose format options changed after that, would run layers without pipelines
    (ncnn crashes: SIGSEGV). vknorm.graph refuses to make one, saying what to do; after a proper load it runs."""
    from vknorm import graph

    param, binp = (os.path.join(graph_runs.DATA, "transformer_block.ncnn." + e) for e in ("param", "bin"))
    short = tmp_path / "short.bin"
    short.write_bytes(open(binp, "rb").read()[:64])
    x = graph.Mat(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32))

    def refused(net, needle):
        with pytest.raises(RuntimeError, match=needle):
            net.create_extractor()

    net = graph.configure(graph.Net(), vulkan=True)
    refused(net, "load_param has not succeeded")
    assert net.load_param(param) == 0
    refused(net, "load_model has not succeeded")
    assert net.load_model(str(short)) != 0
    refused(net, "load_model has not succeeded")
    assert net.load_model(binp) == 0
    net.opt.use_vulkan_compute = False
    refused(net, r"net.opt changed after load_model \(use_vulkan_compute=1 .* -> use_vulkan_compute=0")
    net.opt.use_vulkan_compute = True
    net.opt.use_bf16_packed = True  # each format option counts (this one ran stock ncnn off by up to 5)
    refused(net, r"net.opt changed after load_model \(.*use_bf16_packed=0.* -> .*use_bf16_packed=1")
    net.opt.use_bf16_packed = False
    threads = net.opt.num_threads
    net.opt.num_threads = -3
    refused(net, r"num_threads must be 1\.\.1024, got -3")
    net.opt.num_threads = threads
    # ncnn turns these off at load_param where the device lacks them (lavapipe prefers no shader local memory)
    # and builds no pipelines for them: on again, an extract crashed in its Convolution
    # and the convolution's switches, whose weights and pipelines load_model builds and ncnn's Vulkan forward
    # reads the switches again
    for name in ("use_shader_local_memory", "use_subgroup_ops", "use_cooperative_matrix", *CONVOLUTION_SWITCHES):
        loaded = getattr(net.opt, name)
        setattr(net.opt, name, not loaded)
        refused(net, rf"net.opt changed after load_model \(.*{name}={int(loaded)}.* -> .*{name}={int(not loaded)}")
        setattr(net.opt, name, loaded)
    ex = net.create_extractor()
    assert ex.input("in0", x) == 0
    r, out = ex.extract("out0")
    assert r == 0 and np.isfinite(np.array(out)).all()
    del ex
    net.clear()
    refused(net, "load_param has not succeeded")


OPT_AND_LOAD_SCRIPT = r"""
import sys
import numpy as np
from vknorm import graph
param, binp, case = sys.argv[1], sys.argv[2], sys.argv[3]
x = graph.Mat(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32))
def loaded(net):
    assert net.load_param(param) == 0 and net.load_model(binp) == 0
    return net
if case == "opt_copied":  # another net's options, then that net cleared
    first = loaded(graph.configure(graph.Net(), vulkan=True))
    second = graph.Net()
    second.opt = first.opt
    loaded(second)
    first.clear()
    del first
    ex = second.create_extractor()
    ex.input("in0", x)
    r, out = ex.extract("out0")
    print("extract", r, bool(np.isfinite(np.array(out)).all()))
elif case == "threads":  # OpenMP made that many threads in load_model's CPU layers: -1 ended the process
    net = graph.configure(graph.Net(), vulkan=False)
    net.opt.num_threads = -1
    print("load", net.load_param(param), net.load_model(binp))
else:  # load_model after a load_param that failed: ncnn loaded the weights into the earlier model's layers
    net = loaded(graph.configure(graph.Net(), vulkan=False))
    print("load", net.load_param("/nonexistent.param"), net.load_model(binp))
"""


@pytest.mark.parametrize("case", ["opt_copied", "threads", "after_failed_param"])
def test_options_and_loads_that_crashed_or_misled_are_refused_or_safe(case):
    """Net.opt = other.opt copies what Python sees, not the other net's pipeline cache and allocators (ncnn's
    load_model stores its own there: used after the other net freed it, the extract crashed); num_threads out of
    1..1024 is refused at load_model, not only by create_extractor; load_model after a failed load_param is -1
    with a message (ncnn said 0, and the net then refused to run)."""
    param, binp = (os.path.join(graph_runs.DATA, "transformer_block.ncnn." + e) for e in ("param", "bin"))
    proc = subprocess.run([sys.executable, "-c", OPT_AND_LOAD_SCRIPT, param, binp, case], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    want = {"opt_copied": "extract 0 True", "threads": "load 0 -1", "after_failed_param": "load -1 -1"}[case]
    assert proc.stdout.strip().splitlines()[-1] == want, proc.stdout
    if case == "threads":
        assert "num_threads must be 1..1024, got -1" in proc.stderr, proc.stderr
    if case == "after_failed_param":
        assert "load_model: load_param has not succeeded on this Net" in proc.stderr, proc.stderr


RECYCLED_INPUT_SCRIPT = r"""
import json, sys
import numpy as np
from vknorm import graph
tmp, case = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
import graph_runs
W = 20
rng = np.random.default_rng(1)
if case == "lightmode":  # the fused layer's input a is freed after it; GELU in place makes ncnn clone y1 into a block
    text = ("7767517\n7 9\nInput in0 0 1 a\nInput in1 0 1 r\nBinaryOp add 2 1 a r s 0=0\n"
            f"LayerNorm ln 1 1 s y 0={W} 1=1e-5 2=0\nSplit sp 1 2 y y1 y2\nGELU g 1 1 y1 o1 0=0\n"
            "BinaryOp mul 2 1 y2 o1 out0 0=2\n")
    weights, inputs = b"", {"a": rng.standard_normal((7, W)), "r": rng.standard_normal((7, W))}
else:  # float16 packed only (no float16 storage): the fused layer's unused slots beside ncnn's own layers
    text = ("7767517\n6 8\nInput in0 0 1 a\nSplit sp0 1 2 a a1 a2\nBinaryOp add 2 1 a1 a2 s 0=0\n"
            f"Split sp 1 2 s s1 s2\nLayerNorm ln 1 1 s1 y 0={W} 1=1e-5 2=1\nBinaryOp add2 2 1 y s2 out0 0=0\n")
    weights = np.concatenate([1 + 0.2 * rng.standard_normal(W), 0.2 * rng.standard_normal(W)]).astype(np.float32).tobytes()
    inputs = {"a": rng.standard_normal((6, W))}
open(f"{tmp}/m.param", "w").write(text)
open(f"{tmp}/m.bin", "wb").write(weights)
out = {}
for mode in ("cpu", "stock", "fused"):
    net = graph.configure(graph.Net(vknorm=mode == "fused"), vulkan=mode != "cpu", lightmode=True)
    if case == "fp16_packed":
        net.opt.use_fp16_packed = True
    assert net.load_param(f"{tmp}/m.param") == 0 and net.load_model(f"{tmp}/m.bin") == 0
    ex = net.create_extractor()
    for k, v in inputs.items():
        assert ex.input(k, graph.Mat(v.astype(np.float32))) == 0
    r, m = ex.extract("out0")
    assert r == 0, r
    out[mode] = np.array(m).astype(np.float64)
    if mode == "fused":
        fused = [f["pattern"] for f in net.fused()]
        variants = sorted({v.split("/")[0] for l in net.vknorm_layers() for v in l["variants"]})
    del ex, net
print(json.dumps({"err": float(np.abs(out["fused"] - out["cpu"]).max()),
                  "bound": graph_runs.stock_bound(out["cpu"], out["stock"], case == "fp16_packed"), "fused": fused,
                  "variants": variants}))
"""


@pytest.mark.parametrize("case", ["lightmode", "fp16_packed"])
def test_fused_layers_read_their_inputs_and_write_only_their_outputs_as_validation_sees_them(tmp_path, case):
    """Synchronization validation judges a dispatch by what its kernel declares for each binding. A fused add
    reads its inputs and writes its output elsewhere, so its kernel is the out-of-place variant, whose input
    binding is read-only: with it writable, ncnn's copy into the input's memory once light mode recycled it
    was reported as a write-after-write with the norm. Its unused writable slots hold its own output, not
    ncnn's dummy buffer that every layer binds (a dispatch reading the dummy was reported as reading after
    the norm's write). Both graphs, fused, under validation in ncnn's instance: an empty log, and the
    output of ncnn's CPU run as closely as stock ncnn Vulkan's (`vknorm check --vulkan`'s rule; ncnn's Vulkan GELU
    itself is 1.3e-3 from its CPU one here)."""
    proc, log = graph_runs.run_validated(tmp_path, RECYCLED_INPUT_SCRIPT, tmp_path, case,
                                         os.path.dirname(graph_runs.__file__))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert log.strip() == ""
    assert r["fused"] == ["BinaryOp+LayerNorm" if case == "lightmode" else "BinaryOp+Split+LayerNorm"], r
    assert r["variants"] and all("_oop_" in v for v in r["variants"]), r
    assert r["err"] <= r["bound"], r


LIGHT_MODE_SCRIPT = r"""
import json, sys
import numpy as np
from vknorm import graph
x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
codes = {}
for mode in ("unfused", "fused"):
    net = graph.configure(graph.Net(fuse=mode == "fused"), vulkan=True, lightmode=True)
    net.load_param(sys.argv[1])
    net.load_model(sys.argv[2])
    for blob in ("3", "8", "9"):  # ln_3's and ln_4's outputs and the Gemm after ln_4: blobs both nets have
        ex = net.create_extractor()
        ex.input("in0", graph.Mat(x))
        first, _ = ex.extract("out0")
        then, _ = ex.extract(blob)
        codes[f"{mode} {blob}"] = [first, then]
print(json.dumps(codes))
"""


def test_light_mode_extracting_a_freed_blob_after_the_output_is_refused_in_fused_and_unfused_nets():
    """In light mode ncnn frees every intermediate blob once read, so extracting one after the model's output
    would make ncnn run its producers again on freed inputs (stock ncnn's Vulkan layers crash there). The
    extract is refused first, -1 with a message, in the fused net as in the unfused one; vknorm's layers are
    never handed the empty blob (no "unsupported blob" from them)."""
    param, binp = (os.path.join(graph_runs.DATA, f"transformer_block.ncnn.{ext}") for ext in ("param", "bin"))
    proc = subprocess.run([sys.executable, "-c", LIGHT_MODE_SCRIPT, param, binp], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert codes and all(v == [0, -1] for v in codes.values()), codes
    assert proc.stderr.count("a blob it needs was freed by a layer that ran before") == len(codes), proc.stderr[-2000:]
    assert "unsupported blob" not in proc.stderr, proc.stderr[-2000:]


def blob_names(param_text: str) -> list:
    """The blobs by ncnn's index: in the order a .param first names them (bottoms, then tops, layer by layer)."""
    order = []
    for line in param_text.splitlines()[2:]:
        t = line.split()
        if len(t) < 4:
            continue
        for blob in t[4:4 + int(t[2]) + int(t[3])]:
            if blob not in order:
                order.append(blob)
    return order


def blob_index(param_text: str, name: str) -> int:
    return blob_names(param_text).index(name)


@pytest.mark.parametrize("vulkan", [True, False], ids=["vulkan", "cpu"])
def test_a_blob_index_means_the_models_own_blob_in_a_fused_net_too(vulkan):
    """An index is the model's as its .param numbers it (what pyncnn code holds): the rewrite removes blobs and
    renumbers the rest, so a fused net resolves indices through the model as written. Every index gives the blob
    of that name, as by name in the unfused net; one the rewrite removed gives -1 naming Net(fuse=False)."""
    param, binp = (os.path.join(graph_runs.DATA, f"transformer_block.ncnn.{ext}") for ext in ("param", "bin"))
    x = graph.Mat(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32))
    text = open(param).read()
    names = blob_names(text)
    kept = set(blob_names(graph._graph.fuse_param(text)[0]))
    nets = {}
    for fuse in (False, True):
        nets[fuse] = graph.configure(graph.Net(fuse=fuse), vulkan=vulkan, lightmode=False)
        assert nets[fuse].load_param(param) == 0 and nets[fuse].load_model(binp) == 0
    assert len(nets[True].fused()) == 2 and len(kept) < len(names)
    for i, name in enumerate(names):
        unfused = nets[False].create_extractor()
        assert unfused.input(names.index("in0"), x) == 0
        r, want = unfused.extract(name)
        assert r == 0, name
        fused = nets[True].create_extractor()
        assert fused.input(names.index("in0"), x) == 0
        log = []
        with quiet_stderr(log):
            r, got = fused.extract(i)
        if name in kept:
            w = np.array(want)  # the fused kernels' float32 rounding only, carried downstream
            assert r == 0 and np.abs(np.array(got) - w).max() <= FP32_TOL * max(1.0, float(np.abs(w).max())), name
        else:
            assert r == -1 and any("Net(fuse=False)" in ln for ln in log), (name, log)
    assert nets[True].create_extractor().extract(len(names))[0] == -1  # past the model's blobs


@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "fused"])
def test_a_blob_index_whose_name_an_earlier_blob_has_is_refused_not_read_by_name(tmp_path, fuse):
    """AbsVal writes a blob named as its input (ncnn gives it index 1): blobs are reached by name here, and the name
    finds blob 0, so extract(1) is -1 with a message rather than the input's values; indices of names of their
    own work."""
    (tmp_path / "m.param").write_text("7767517\n3 3\nInput in 0 1 x\nAbsVal abs 1 1 x x\nReLU r 1 1 x y\n")
    (tmp_path / "m.bin").write_bytes(b"")
    net = graph.configure(graph.Net(fuse=fuse), vulkan=True, lightmode=False)
    assert net.load_param(str(tmp_path / "m.param")) == 0 and net.load_model(str(tmp_path / "m.bin")) == 0
    x = np.array([0.5, -1.5, 2.0, -0.25], np.float32)
    ex = net.create_extractor()
    assert ex.input(0, graph.Mat(x)) == 0
    log = []
    with quiet_stderr(log):
        r, _ = ex.extract(1)
    assert r == -1 and any("blob index 1 is named 'x' as blob 0 is" in ln for ln in log), log
    r, y = ex.extract(2)  # ReLU reads blob 0 by name, as in ncnn: relu(x)
    assert r == 0 and np.array_equal(np.array(y), np.maximum(x, 0))
    # blobs the header declares past those the layers make: out of range, counted alike fused or not
    (tmp_path / "m.param").write_text("7767517\n2 5\nInput in0 0 1 in0\nReLU r 1 1 in0 out0\n")
    net = graph.configure(graph.Net(fuse=fuse), vulkan=True)
    assert net.load_param(str(tmp_path / "m.param")) == 0 and net.load_model(str(tmp_path / "m.bin")) == 0
    for index in (2, 3, 5):
        log = []
        with quiet_stderr(log):
            assert net.create_extractor().extract(index)[0] == -1
        assert any(f"blob index {index} out of range (2 blobs)" in ln for ln in log), (index, log)


def test_an_extractor_runs_on_the_options_the_net_had_when_it_was_made():
    """ncnn's Extractor copies the net's options when it is made; its uploads and downloads here do too. Options
    changed afterwards (bfloat16 and float16 storage, packing) left an extractor made before them reading the
    live ones for its downloads: r 0, an output off by 1075."""
    param, binp = (os.path.join(graph_runs.DATA, f"transformer_block.ncnn.{ext}") for ext in ("param", "bin"))
    x = graph.Mat(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32))
    net = graph.configure(graph.Net(), vulkan=True)
    assert net.load_param(param) == 0 and net.load_model(binp) == 0
    ex = net.create_extractor()
    assert ex.input("in0", x) == 0
    r, want = ex.extract("out0")
    assert r == 0
    ex = net.create_extractor()
    assert ex.input("in0", x) == 0
    net.opt.use_bf16_storage = net.opt.use_fp16_storage = net.opt.use_fp16_packed = True
    net.opt.use_packing_layout = False
    r, got = ex.extract("out0")
    assert r == 0 and np.array_equal(np.array(got), np.array(want))


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("vulkan", [True, False], ids=["vulkan", "cpu"])
def test_pyncnn_s_net_and_extractor_calls_work_as_in_pyncnn(vulkan, fuse):
    """Code written for pyncnn also calls load_param_mem, input/extract by blob index, Extractor.set_light_mode
    and uses Net and Extractor as context managers (leaving one clears it). load_param_mem fuses as load_param
    does, and every route gives the same output."""
    param, binp = (os.path.join(graph_runs.DATA, f"transformer_block.ncnn.{ext}") for ext in ("param", "bin"))
    x = graph.Mat(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32))

    def loaded(from_text):
        net = graph.configure(graph.Net(fuse=fuse), vulkan=vulkan)
        assert (net.load_param_mem(open(param).read()) if from_text else net.load_param(param)) == 0
        assert net.load_model(binp) == 0
        return net

    by_path, by_text = loaded(False), loaded(True)
    assert by_text.fused() == by_path.fused() and len(by_text.fused()) == (2 if fuse else 0)
    as_bytes = graph.configure(graph.Net(fuse=fuse), vulkan=vulkan)
    assert as_bytes.load_param_mem(open(param, "rb").read()) == 0 and as_bytes.fused() == by_path.fused()
    ex = by_path.create_extractor()
    ex.input("in0", x)
    r, want = ex.extract("out0")
    assert r == 0
    text = open(param).read()
    with by_text as net:
        with net.create_extractor() as ex:
            assert ex.input(0, x) == 0  # in0 is blob 0
            r, got = ex.extract(blob_index(text, "out0"))  # the model's own numbering, fused or not
            assert r == 0 and np.array_equal(np.array(got), np.array(want))
            assert ex.extract(10_000)[0] == -1 and ex.input(-1, x) == -1
        assert ex.extract("out0")[0] == -1  # leaving the with block cleared the extractor: its input is gone
    assert net.layers() == [] and net.input_names() == []  # and the net

    net = loaded(True)
    ex = net.create_extractor()
    given = graph.Mat(np.array(x))
    ex.input("in0", given)
    r, back = ex.extract("in0")
    back.fill(-1.0)  # the result is the caller's own copy, as in pyncnn: the input is untouched
    assert r == 0 and np.array_equal(np.array(given), np.array(x))
    with pytest.raises(ValueError, match="type 1 .* is not supported"):
        ex.extract("out0", type=1)

    net = loaded(True)
    ex = net.create_extractor()
    ex.set_light_mode(False)  # every blob stays: an intermediate after the output still comes back
    ex.input("in0", x)
    assert ex.extract("out0")[0] == 0 and ex.extract("3")[0] == 0
    net.opt.lightmode = False
    ex = net.create_extractor()
    ex.set_light_mode(True)
    ex.input("in0", x)
    assert ex.extract("out0")[0] == 0 and ex.extract("3")[0] == -1


@pytest.mark.parametrize("vknorm", [True, False], ids=["vknorm", "stock"])
def test_vulkan_extracts_reuse_the_nets_command_buffers_and_give_what_fresh_nets_give(vknorm):
    """ncnn's own extract makes a command pool, buffer and fence every time; a Vulkan Net keeps them for its next
    extracts (from any of its extractors, threads too), and every result is the one a fresh net gives."""
    import threading

    param, binp = (os.path.join(graph_runs.DATA, f"transformer_block.ncnn.{ext}") for ext in ("param", "bin"))
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((16, 64)).astype(np.float32) for _ in range(3)]

    def loaded(vulkan=True):
        net = graph.configure(graph.Net(vknorm=vknorm), vulkan=vulkan)
        assert net.load_param(param) == 0 and net.load_model(binp) == 0
        return net

    def run(net, x, blob="out0"):
        ex = net.create_extractor()
        assert ex.input("in0", graph.Mat(x)) == 0
        r, m = ex.extract(blob)
        assert r == 0
        return np.array(m)

    want = [run(loaded(), x) for x in xs]  # each from a net of its own: one extract each
    net = loaded()
    for i in range(7):
        assert np.array_equal(run(net, xs[i % 3]), want[i % 3]), i
    counters = net.vknorm_counters()
    assert (counters["command_buffers_made"], counters["command_buffers_reused"]) == (1, 6)

    # Several extracts of one extractor (light mode off: the intermediates stay), then another extractor.
    ex = net.create_extractor()
    ex.set_light_mode(False)
    ex.input("in0", graph.Mat(xs[1]))
    assert ex.extract("3")[0] == 0 and np.array_equal(np.array(ex.extract("out0")[1]), want[1])
    assert np.array_equal(run(net, xs[2]), want[2])

    wrong = []

    def extracts(t):
        for i in range(6):
            if not np.array_equal(run(net, xs[(t + i) % 3]), want[(t + i) % 3]):
                wrong.append((t, i))

    threads = [threading.Thread(target=extracts, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counters = net.vknorm_counters()
    assert not wrong
    assert counters["command_buffers_made"] <= 1 + 4  # at most one more per thread extracting at once
    assert counters["command_buffers_made"] + counters["command_buffers_reused"] == 7 + 3 + 24

    cpu = loaded(vulkan=False)  # nothing to record on the host
    run(cpu, xs[0])
    assert (cpu.vknorm_counters()["command_buffers_made"], cpu.vknorm_counters()["command_buffers_reused"]) == (0, 0)


LAYERNORM_RELU = "7767517\n3 3\nInput in 0 1 x\nLayerNorm n 1 1 x y 0=4 1=0.001 2=1\nReLU r 1 1 y z\n"


def small_net(tmp_path, param, weights, vulkan=True):
    """A Net from a .param text and its weights (float32), options as vknorm's tools set them."""
    binp = tmp_path / "weights.bin"
    binp.write_bytes(np.asarray(weights, np.float32).tobytes())
    net = graph.configure(graph.Net(), vulkan=vulkan)
    assert net.load_param_mem(param) == 0 and net.load_model(str(binp)) == 0
    return net


def extract_once(net, x, blob="z"):
    ex = net.create_extractor()
    assert ex.input("x", graph.Mat(x)) == 0
    r, m = ex.extract(blob)
    return r, (np.array(m) if r == 0 else None)


@pytest.mark.parametrize("vulkan", [False, True], ids=["cpu", "vulkan"])
def test_any_nonzero_affine_param_means_weights_as_in_stock_ncnn(tmp_path, vulkan):
    """ncnn's layers load weights unless affine is 0, so a .param's 2=2 runs in stock ncnn: vknorm's layers read it
    the same way (the net loads, and gives what 2=1 gives, bit for bit), rather than refusing a model stock runs."""
    x = np.linspace(-2, 2, 6 * 5 * 4, dtype=np.float32).reshape(6, 5, 4)
    weights = 0.5 + 0.1 * np.arange(8)
    outputs = []
    for affine in (1, 2):
        (tmp_path / str(affine)).mkdir()
        net = small_net(tmp_path / str(affine), LAYERNORM_RELU.replace("2=1", f"2={affine}"), weights, vulkan)
        r, y = extract_once(net, x)
        assert r == 0, affine
        outputs.append(y)
    assert np.array_equal(outputs[0], outputs[1])
    assert not np.array_equal(outputs[0], extract_once(small_net(tmp_path, LAYERNORM_RELU.replace("2=1", "2=0"),
                                                                 [], vulkan), x)[1])  # the weights do matter


HOST_LAYER_NET = ("7767517\n4 4\nInput in 0 1 x\nLayerNorm n 1 1 x y 0=4 1=0.001 2=1 31=16\nReLU r 1 1 y z\n"
                  "Sigmoid s 1 1 z out\n")  # the LayerNorm on the host (featmask bit 4), the rest on Vulkan


@pytest.mark.parametrize("vknorm_layers", [False, True], ids=["stock", "vknorm"])
def test_a_host_layers_blob_extracts_as_that_layer_wrote_it_before_or_after_its_upload(tmp_path, vknorm_layers):
    """A blob a host layer made comes back as ncnn's extract gives it, float32 as the layer wrote it, also after
    a later extract uploaded it for the Vulkan layers after it (in float16 storage: the copy was float16, which a
    recorded extract read back)."""
    binp = tmp_path / "weights.bin"
    binp.write_bytes((0.5 + 0.1 * np.arange(8, dtype=np.float32)).tobytes())
    net = graph.configure(graph.Net(vknorm=vknorm_layers), fp16=True, lightmode=False)
    assert net.load_param_mem(HOST_LAYER_NET) == 0 and net.load_model(str(binp)) == 0
    x = np.linspace(-2, 2, 6 * 5 * 4, dtype=np.float32).reshape(6, 5, 4)
    first = extract_once(net, x, "y")
    ex = net.create_extractor()
    assert ex.input("x", graph.Mat(x)) == 0
    assert ex.extract("out")[0] == 0
    r, y = ex.extract("y")
    assert r == 0 and np.array_equal(np.array(y), first[1])
    assert not np.array_equal(first[1], first[1].astype(np.float16).astype(np.float32))  # float16 would show


def test_a_layer_fed_inputs_of_many_sizes_keeps_a_bounded_number_of_pipelines(tmp_path):
    """An app feeding images of any size (style transfer's InstanceNorm): the group size is a specialization
    constant for a layer's first 16 shapes only; later ones share the pipelines of their kernel, team and items (it
    made one per size before: 40 sizes, 40 pipelines, and lavapipe compiled for seconds): the 24 later sizes make at
    most one for every two (lavapipe 3, H200 7). Every size stays exact."""
    from reference import channel_norm64, scale

    gamma, beta = np.linspace(0.5, 1.5, 8).astype(np.float32), np.linspace(-1, 1, 8).astype(np.float32)
    binp = tmp_path / "weights.bin"
    binp.write_bytes(gamma.tobytes() + beta.tobytes())
    net = graph.configure(graph.Net())
    assert net.load_param_mem("7767517\n2 2\nInput in 0 1 x\nInstanceNorm n 1 1 x y 0=8 1=1e-05 2=1\n") == 0
    assert net.load_model(str(binp)) == 0
    made = []
    for i in range(40):
        x = np.random.default_rng(i).standard_normal((8, 7 + i, 9 + 2 * i)).astype(np.float32)
        r, y = extract_once(net, x, "y")
        ref = channel_norm64("InstanceNorm", x, 1e-5, gamma=gamma, beta=beta)
        assert r == 0 and float(np.abs(y - ref).max()) <= FP32_TOL * scale(ref), i
        made.append(net.vknorm_layers()[0]["pipelines"])
    assert made[15] <= 16 and made[-1] - made[15] <= 12, made


def test_a_command_buffer_whose_extract_failed_is_dropped_and_the_next_extract_makes_one(tmp_path):
    """An extract that fails inside the recorded forward (here: an input whose rows do not match the
    LayerNorm's affine size, -1) may leave its command buffer half recorded: the Net never hands that one out
    again. The next extract makes a new one and gives what it gave before the failure, bit for bit."""
    net = small_net(tmp_path, LAYERNORM_RELU, 0.5 + 0.1 * np.arange(8))
    x = np.linspace(-2, 2, 6 * 5 * 4, dtype=np.float32).reshape(6, 5, 4)
    r, want = extract_once(net, x)
    assert r == 0
    counts = lambda: (net.vknorm_counters()["command_buffers_made"], net.vknorm_counters()["command_buffers_reused"])
    assert counts() == (1, 0)
    assert extract_once(net, np.ones((6, 5, 5), np.float32))[0] == -1  # took the kept one, and failed
    assert counts() == (1, 1)
    r, got = extract_once(net, x)
    assert r == 0 and np.array_equal(got, want)
    assert counts() == (2, 1)  # a new one: the failed extract's was not given back
    r, got = extract_once(net, x)
    assert r == 0 and np.array_equal(got, want) and counts() == (2, 2)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("vulkan", [True, False], ids=["vulkan", "cpu"])
def test_an_unknown_blob_name_is_minus_1_and_the_extractor_goes_on(tmp_path, vulkan, fuse):
    """A name the net has no blob for (a typo, "", or a blob inside a fused pattern: the LayerNorm's output y,
    which the fused layer no longer writes) is ncnn's -1 with a message, before anything is recorded: the same
    extractor then extracts what a fresh one gives, on a Vulkan net as on a CPU net, and no command buffer is
    spent on it."""
    from vknorm._stdio import quiet_stderr

    binp = tmp_path / "weights.bin"
    binp.write_bytes((0.5 + 0.1 * np.arange(8, dtype=np.float32)).tobytes())
    net = graph.configure(graph.Net(fuse=fuse), vulkan=vulkan)
    assert net.load_param_mem(LAYERNORM_RELU) == 0 and net.load_model(str(binp)) == 0
    x = np.linspace(-2, 2, 6 * 5 * 4, dtype=np.float32).reshape(6, 5, 4)
    r, want = extract_once(net, x)
    assert r == 0
    ex = net.create_extractor()
    assert ex.input("x", graph.Mat(x)) == 0
    log = []
    with quiet_stderr(log):
        for name in ["no_such_blob", ""] + (["y"] if fuse else []):
            assert ex.extract(name)[0] == -1, name
    assert any("no_such_blob" in line and "no blob of that name" in line for line in log), log
    r, got = ex.extract("z")
    assert r == 0 and np.array_equal(np.array(got), want)
    if vulkan:
        assert net.vknorm_counters()["command_buffers_made"] == 1


def test_a_cleared_net_holds_no_command_buffer_so_ncnns_instance_can_go_before_it():
    """clear() frees the command buffers a Vulkan Net kept: destroying ncnn's GPU instance (what the module does
    at exit) with the cleared net still alive, then dropping the net, is clean (it crashed with them kept)."""
    code = f"""
import numpy as np
from vknorm import graph
net = graph.configure(graph.Net(), vulkan=True)
assert net.load_param({os.path.join(graph_runs.DATA, "layernorm_2d.ncnn.param")!r}) == 0
assert net.load_model({os.path.join(graph_runs.DATA, "layernorm_2d.ncnn.bin")!r}) == 0
for _ in range(2):
    ex = net.create_extractor()
    assert ex.input("in0", graph.Mat(np.ones((8, 6, 10), np.float32))) == 0 and ex.extract("out0")[0] == 0
    del ex
assert net.vknorm_counters()["command_buffers_made"] == 1
net.clear()
graph._graph.destroy_gpu_instance()
del net
print("clean")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "clean", (proc.returncode, proc.stderr[-2000:])


@pytest.mark.parametrize("value,kept", [("1", False), ("yes", False), ("0", True), ("", True)])
def test_fresh_command_buffers_knob_makes_one_for_every_extract(tmp_path, monkeypatch, value, kept):
    """VKNORM_TUNE_FRESH_COMMAND_BUFFERS (a measurement knob, read at each extract): set to anything but "" or
    "0", no command buffer is kept, one is made for every extract as in ncnn's own extract; the results are the
    same either way, bit for bit."""
    net = small_net(tmp_path, LAYERNORM_RELU, 0.5 + 0.1 * np.arange(8))
    x = np.linspace(-2, 2, 6 * 5 * 4, dtype=np.float32).reshape(6, 5, 4)
    monkeypatch.delenv("VKNORM_TUNE_FRESH_COMMAND_BUFFERS", raising=False)
    r, want = extract_once(net, x)
    assert r == 0
    monkeypatch.setenv("VKNORM_TUNE_FRESH_COMMAND_BUFFERS", value)
    outs = [extract_once(net, x) for _ in range(3)]
    assert all(r == 0 and np.array_equal(got, want) for r, got in outs)
    c = net.vknorm_counters()
    # the first extract (knob unset) kept its buffer: the next one reuses it either way
    assert (c["command_buffers_made"], c["command_buffers_reused"]) == ((1, 3) if kept else (3, 1))


@pytest.mark.parametrize("vknorm", [True, False], ids=["vknorm", "stock"])
def test_an_int8_blob_from_a_vulkan_net_comes_back_as_float32_as_from_a_cpu_net(tmp_path, vknorm):
    """ncnn's Quantize runs on the host inside a Vulkan net and gives an int8 blob, which ncnn uploads and the
    extract downloads as int8: it comes back cast to float32 (ncnn's extract does the same), the quantized
    values the CPU net gives, exactly (integers)."""
    param = "7767517\n2 2\nInput in 0 1 x\nQuantize q 1 1 x y 0=1\n"
    x = ((np.arange(2 * 3 * 8, dtype=np.float32) - 20) / 7).reshape(2, 3, 8)
    outs = []
    for vulkan in (False, True):
        binp = tmp_path / "scale.bin"
        binp.write_bytes(np.float32(10.0).tobytes())  # scale: x * 10, rounded, clamped to [-127, 127]
        net = graph.configure(graph.Net(vknorm=vknorm), vulkan=vulkan)
        assert net.load_param_mem(param) == 0 and net.load_model(str(binp)) == 0
        r, y = extract_once(net, x, "y")
        assert r == 0 and y.dtype == np.float32 and y.shape == x.shape
        outs.append(y)
    assert np.array_equal(outs[0], np.clip(np.round(x * 10), -127, 127))
    assert np.array_equal(outs[1], outs[0])


def test_load_param_mem_refuses_what_load_param_refuses(tmp_path):
    """A garbled text, and a fused model in a net without vknorm's layers (naming the line and the layer)."""
    fused_text = graph._graph.fuse_param(open(os.path.join(graph_runs.DATA, "transformer_block.ncnn.param")).read())[0]
    code = f"""
from vknorm import graph
print("garbled", graph.Net().load_param_mem("7767517\\n2 1\\nInput in0 0 1\\n"))
print("stock", graph.Net(vknorm=False).load_param_mem({fused_text!r}))
print("fused net", graph.Net().load_param_mem({fused_text!r}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "garbled -1" in proc.stdout and "stock -1" in proc.stdout and "fused net 0" in proc.stdout, proc.stdout
    assert "load_param_mem line" in proc.stderr and "a fused vknorm layer" in proc.stderr, proc.stderr[-2000:]


LOAD_MODEL_MEM_SCRIPT = r"""
import gc, json, sys, numpy as np
from vknorm import graph
param, binp, vulkan = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
weights = open(binp, "rb").read()
x = graph.Mat(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32))

def load(how):
    net = graph.Net()
    net.opt.use_vulkan_compute = vulkan
    net.load_param(param)
    return net, how(net), net.model_bytes_read

def infer(net):
    ex = net.create_extractor()
    ex.input("in0", x)
    return np.array(ex.extract("out0")[1]).tolist()

net, r, read = load(lambda n: n.load_model(binp))
from_file = infer(net)
mem = bytearray(weights)
net_mem, r_mem, _ = load(lambda n: n.load_model_mem(mem))
mem[:] = b"\xff" * len(mem)  # the caller's buffer overwritten after the load, before the inference
gc.collect()
print(json.dumps({
    "file": [r, read], "mem": r_mem, "same_as_file": infer(net_mem) == from_file,
    "bytes": infer(load(lambda n: n.load_model_mem(weights))[0]) == from_file,
    "array": infer(load(lambda n: n.load_model_mem(np.frombuffer(weights, np.uint8)))[0]) == from_file,
    "short": load(lambda n: n.load_model_mem(weights[:-40]))[1:],  # (ncnn's code, the bytes read: all of them)
    "longer": load(lambda n: n.load_model_mem(weights + b"\0" * 64))[1:],
}))
"""


@pytest.mark.parametrize("vulkan", [True, False], ids=["vulkan", "cpu"])
def test_load_model_mem_takes_the_bins_bytes_reads_no_further_and_keeps_its_own_copy(vulkan):
    """pyncnn's Net.load_model_mem: the .bin's bytes (bytes, bytearray, a uint8 array) load as load_model loads the
    file, and the inference is the same. The net copies the weights (it keeps no reference to the caller's bytes,
    so overwriting them after changes nothing); a buffer too short fails as a file too short does (pyncnn's reader
    has no end and reads past it); model_bytes_read counts what the layers read, so a longer buffer shows."""
    param = os.path.join(graph_runs.DATA, "transformer_block.ncnn.param")
    binp = os.path.join(graph_runs.DATA, "transformer_block.ncnn.bin")
    proc = subprocess.run([sys.executable, "-c", LOAD_MODEL_MEM_SCRIPT, param, binp, "1" if vulkan else "0"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    size = os.path.getsize(binp)
    assert r["file"] == [0, size] and r["mem"] == 0
    assert r["same_as_file"] and r["bytes"] and r["array"], r
    assert r["short"][0] != 0 and r["short"][1] == size - 40, r  # ncnn's error code, nothing read past the end
    assert r["longer"] == [0, size], r
    with pytest.raises(TypeError, match="uint8 array"):
        graph.Net().load_model_mem(np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="not a str"):  # pyncnn encodes a str as UTF-8: other weights, silently
        graph.Net().load_model_mem(open(binp, "rb").read().decode("latin-1"))


def test_mat_fill_clone_and_reshape_as_pyncnn():
    """Mat.fill sets every element, clone copies (a later fill leaves the copy alone), reshape takes pyncnn's
    (w), (w, h), (w, h, c), (w, h, d, c) and refuses a shape of another element count."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    m = graph.Mat(x)
    copy = m.clone()
    m.fill(7.5)
    assert np.all(np.array(m) == 7.5) and np.array_equal(np.array(copy), x)
    assert np.array_equal(np.array(copy.reshape(24)), x.ravel())
    assert np.array_equal(np.array(copy.reshape(6, 4)), x.reshape(4, 6))
    assert np.array_equal(np.array(copy.reshape(2, 3, 4)), x.reshape(4, 3, 2))
    assert np.array_equal(np.array(copy.reshape(2, 3, 2, 2)), x.reshape(2, 2, 3, 2))
    assert np.array_equal(np.array(copy.reshape((6, 4))), x.reshape(4, 6))  # pyncnn's tuple form
    with pytest.raises(ValueError, match="does not hold the Mat's 24 elements"):
        copy.reshape(5, 5)
    with pytest.raises(ValueError, match="the Mat is empty"):
        graph.Mat().reshape(1)
    # channel planes of 3x3 floats are padded to 16-byte steps (cstep 12): reshape reads the elements, not the pad
    padded = np.arange(18, dtype=np.float32).reshape(2, 3, 3)
    assert np.array_equal(np.array(graph.Mat(padded).reshape(9, 2)), padded.reshape(2, 9))
    assert np.array_equal(np.array(graph.Mat(padded).reshape(3, 3, 2)), padded)
    # elemsize, cstep and total() as ncnn's (and pyncnn's): the padded planes counted
    pm = graph.Mat(padded)
    assert (pm.elemsize, pm.cstep, pm.total()) == (4, 12, 24)
    pyncnn = import_or_missing("ncnn")
    for shape in ((8,), (4, 8), (3, 4, 5), (2, 3, 4, 5)):
        a = np.zeros(shape, np.float32)
        ours, theirs = graph.Mat(a), pyncnn.Mat(a)
        assert (ours.elemsize, ours.cstep, ours.total()) == (theirs.elemsize, theirs.cstep, theirs.total()), shape


FIELDS = ("dims", "w", "h", "d", "c", "elemsize", "elempack", "cstep")


def fields(m):
    return tuple(getattr(m, f) for f in FIELDS)


def test_mat_create_create_like_clone_from_release_and_shape_as_pyncnn():
    """pyncnn's way of making a Mat again: create's overloads and tuple form, create_like, clone_from, release and
    shape give pyncnn's fields; create's memory is zeroed (pyncnn's is what the heap held)."""
    pyncnn = import_or_missing("ncnn")
    for args in ((7,), (5, 3), (3, 4, 5), (2, 3, 4, 5), ((3, 4, 5),)):
        ours, theirs = graph.Mat(np.ones(3, np.float32)), pyncnn.Mat()
        ours.create(*args)
        theirs.create(*args)
        assert fields(ours) == fields(theirs), args
        assert not np.array(ours).any(), args
        like, theirs_like = graph.Mat(), pyncnn.Mat()
        like.create_like(ours)
        theirs_like.create_like(theirs)
        assert fields(like) == fields(theirs_like), args
        assert fields(ours.shape()) == fields(theirs.shape()) and ours.shape().empty(), args
        from_shape, theirs_from_shape = graph.Mat(), pyncnn.Mat()  # a shape is what create_like reads
        from_shape.create_like(ours.shape())
        theirs_from_shape.create_like(theirs.shape())
        assert fields(from_shape) == fields(theirs_from_shape) and not from_shape.empty(), args
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    m = graph.Mat()
    m.clone_from(graph.Mat(x))
    assert np.array_equal(np.array(m), x) and fields(m) == fields(pyncnn.Mat(x).clone())
    m.release()
    assert m.empty() and repr(m) == "Mat(empty)"
    for call, match in ((lambda: m.create(3, elempack=4), "elempack 4: vknorm.graph's Mats are unpacked"),
                        (lambda: m.create(3, n=2), "n 2: vknorm.graph's Mats are one batch"),
                        (lambda: m.create(3, elemsize=2), "elemsize 2: vknorm.graph's Mats hold float32"),
                        (lambda: m.create(0, 3), "every dimension must be 1..2"),
                        (lambda: m.create_like(graph.Mat()), "Mat.create_like: the Mat given has no shape"),
                        (lambda: graph.Mat(np.ones((2, 3), np.float32)).shape().fill(1.0), "a shape but no memory")):
        with pytest.raises(ValueError, match=match):
            call()
    with pytest.raises(TypeError, match="no allocators: allocator=None only"):
        m.create(3, allocator=object())
    assert m.empty()  # a refused create leaves the Mat as it was


REMADE_SCRIPT = r"""
import sys
import numpy as np
from vknorm import graph
# 64 MiB planes: the allocator maps them apart and unmaps them when freed, so a view left on freed memory faults
x = np.arange(2 * 4096 * 4096, dtype=np.float32).reshape(2, 4096, 4096)
m = graph.Mat(x)
views = {"channel": m.channel(1), "channel_range": m.channel_range(0, 2), "row_range": m.row_range(5, 2),
         "range": m.range(3, 10), "reshape": m.reshape(4096, 8192)}
row = m.row(7)
{"create": lambda: m.create(3, 3), "create_like": lambda: m.create_like(graph.Mat(np.ones(4, np.float32))),
 "clone_from": lambda: m.clone_from(graph.Mat(np.ones(4, np.float32))), "release": m.release}[sys.argv[1]]()
m.fill(5.0) if not m.empty() else None
assert np.array_equal(np.array(views["channel"]), x[1])
assert np.array_equal(np.array(views["channel_range"]), x)
assert np.array_equal(np.array(views["row_range"]), x[0, 5:7])
assert np.array_equal(np.array(views["range"]), x[0].ravel()[3:13])
assert np.array_equal(np.array(views["reshape"]), x.reshape(8192, 4096))
assert np.array_equal(row, x[0, 7])
views["channel"].fill(1.0)  # a view's writes go to the memory it holds
assert np.array(views["channel_range"])[1].min() == 1.0
print("OK")
"""


def test_an_in_place_layer_given_a_view_leaves_the_callers_mat_alone(tmp_path):
    """ncnn lets an in-place layer (ReLU) write its input where no other reference to it counts: a view's count does
    not see its Mat's, so the extractor copies a view, and the Mat it came from keeps its values (as a whole Mat
    given does: its count is the caller's and the extractor's)."""
    (tmp_path / "relu.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nReLU relu 1 1 in0 out0\n")
    (tmp_path / "relu.bin").write_bytes(b"")
    x = -np.arange(1, 3 * 4 * 8 + 1, dtype=np.float32).reshape(3, 4, 8)
    for vulkan in (False, True):
        net = graph.configure(graph.Net(), vulkan=vulkan)
        assert net.load_param(str(tmp_path / "relu.param")) == 0 and net.load_model(str(tmp_path / "relu.bin")) == 0
        src = graph.Mat(x)
        for given in (lambda: src.channel(1), lambda: src.channel(1).reshape(32), lambda: src):
            ex = net.create_extractor()
            assert ex.input("in0", given()) == 0
            r, out = ex.extract("out0")
            assert r == 0 and not np.array(out).any(), vulkan
            assert np.array_equal(np.array(src), x), vulkan


@pytest.mark.parametrize("how", ["create", "create_like", "clone_from", "release"])
def test_views_made_before_a_mat_is_made_again_keep_the_memory_they_were_made_on(how):
    """A view (channel, row, range, a reshape) shares its Mat's memory; the Mat made again or released leaves the
    view on that memory (ncnn's refcounting for its copies), not on freed memory. A child process: a view left on
    unmapped memory ends it with SIGSEGV."""
    proc = subprocess.run([sys.executable, "-c", REMADE_SCRIPT, how], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["OK"], (proc.returncode, proc.stderr[-2000:])


def test_mat_views_read_what_pyncnn_s_read_and_write_through_to_the_mat():
    """channel, channel_range, depth, depth_range, row, row_range, range and [i] as pyncnn's (ncnn's views: the same
    elements, the same dims), over the Mat's own memory: writes through row() and [i] reach it."""
    pyncnn = import_or_missing("ncnn")
    x4 = np.arange(2 * 3 * 5 * 7, dtype=np.float32).reshape(2, 3, 5, 7)  # c, d, h, w
    x3 = np.arange(3 * 3 * 5, dtype=np.float32).reshape(3, 3, 5)  # planes of 15 floats: cstep 16, padded
    views = {
        "channel": lambda m: m.channel(1), "channel_range": lambda m: m.channel_range(1, 1),
        "depth": lambda m: m.depth(2), "depth_range": lambda m: m.depth_range(1, 2),
        "channel.depth": lambda m: m.channel(1).depth(2), "row_range": lambda m: m.row_range(1, 2),
        "range": lambda m: m.range(4, 9),
    }
    for x in (x4, x3):
        ours, theirs = graph.Mat(x), pyncnn.Mat(x)
        for name, view in views.items():
            if "depth" in name and x.ndim == 3:
                continue  # a padded dims-3 Mat has no depth planes (refused below)
            a, b = view(ours), view(theirs)
            assert (a.dims, a.w, a.h, a.d, a.c, a.cstep) == (b.dims, b.w, b.h, b.d, b.c, b.cstep), (x.ndim, name)
            assert np.array_equal(np.array(a), np.array(b)), (x.ndim, name)
        assert np.array_equal(ours.row(2), np.asarray(theirs.row(2))) and ours.row(2).shape == (x.shape[-1],)
        # within the first channel: pyncnn's Mat(array) leaves its planes unpadded (cstep 15 where ncnn's is 16)
        assert [ours[i] for i in (0, 7, 14)] == [theirs[i] for i in (0, 7, 14)]
        assert (len(ours), ours.elembits()) == (len(theirs), theirs.elembits()) == (x.shape[-1], 32)
    m = graph.Mat(x3)
    m.row(2)[1] = -1.0  # row 2 of channel 0
    m[16 + 3] = -2.0  # element 3 of channel 1 (cstep 16)
    m.channel(2).fill(9.0)
    want = x3.copy()
    want[0, 2, 1], want[1, 0, 3], want[2] = -1.0, -2.0, 9.0
    assert np.array_equal(np.array(m), want)


def test_channel_range_of_a_view_whose_planes_lie_w_times_h_apart_reads_them_there():
    """A dims 4 Mat's channel is a dims 3 view with its planes w*h apart (35 floats), not at ncnn's aligned cstep (36),
    which ncnn's channel_range would give the range."""
    x = np.arange(4 * 5 * 7, dtype=np.float32).reshape(1, 4, 5, 7)
    view = graph.Mat(x).channel(0)
    assert (view.dims, view.cstep) == (3, 35)
    got = view.channel_range(1, 3)
    assert got.cstep == 35 and np.array_equal(np.array(got), x[0, 1:4])


def test_a_mat_view_holds_its_mats_memory_and_an_input_view_is_copied(tmp_path):
    """ncnn's views own no memory (pyncnn's read freed memory once their Mat is gone): a view holds its Mat's memory,
    and a view given to Extractor.input is copied, so the extract reads what the view held when it was given."""
    import gc

    x = np.random.default_rng(3).standard_normal((4, 6, 32)).astype(np.float32)
    m = graph.Mat(x)
    view, row = m.channel(2), m.row(5)
    flat = graph.Mat(x).channel(3).reshape(6 * 32)  # a view's reshape shares its memory too
    del m
    gc.collect()
    others = [graph.Mat(np.full((4, 6, 32), 7.0, np.float32)) for _ in range(4)]  # memory a freed Mat held
    assert np.array_equal(np.array(view), x[2]) and np.array_equal(row, x[0, 5])
    assert np.array_equal(np.array(flat), x[3].reshape(-1)) and others
    (tmp_path / "ln.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 out0 0=32 1=1e-5 2=0\n")
    (tmp_path / "ln.bin").write_bytes(b"")
    for vulkan in (True, False):
        net = graph.configure(graph.Net(), vulkan=vulkan)
        assert net.load_param(str(tmp_path / "ln.param")) == 0 and net.load_model(str(tmp_path / "ln.bin")) == 0
        src = graph.Mat(x)
        ex = net.create_extractor()
        assert ex.input("in0", src.channel(1)) == 0
        src.fill(0.0)  # after input(): the extractor holds the view's values as given
        del src
        gc.collect()
        r, out = ex.extract("out0")
        d = x[1].astype(np.float64)
        want = (d - d.mean(-1, keepdims=True)) / np.sqrt(d.var(-1, keepdims=True) + 1e-5)
        assert r == 0 and np.abs(np.array(out) - want).max() < FP32_TOL, vulkan


def test_mat_views_outside_the_mat_are_index_errors_naming_the_numbers():
    """pyncnn reads and writes past the Mat; here a view or element outside it is an IndexError naming what was
    asked and what the Mat has, and a view the Mat's dims do not have is a ValueError."""
    m = graph.Mat(np.zeros((3, 4, 5), np.float32))  # c 3, h 4, w 5: cstep 20
    for call, message in [
        (lambda: m.channel(3), "Mat.channel: channel 3 out of range: the Mat has 3 channels"),
        (lambda: m.channel(-1), "channel -1 out of range"),
        (lambda: m.channel(2 ** 40), f"channel {2 ** 40} out of range"),
        (lambda: m.channel_range(2, 2), "Mat.channel_range: 2 channels from channel 2 out of range: the Mat has 3"),
        (lambda: m.channel_range(1, 2 ** 63 - 1), "channels from channel 1 out of range"),
        (lambda: m.channel_range(0, 0), "a count of 0 channels: at least 1"),
        (lambda: m.row(4), "Mat.row: row 4 out of range: the Mat has 4 rows"),
        (lambda: m.row_range(3, 2), "2 rows from row 3 out of range"),
        (lambda: m.range(18, 3), "3 elements from element 18 out of range: the Mat has 20 elements in its first"),
        (lambda: m[60], "Mat[i]: element 60 out of range: the Mat has 60 elements, cstep padding included"),
        (lambda: m[-1], "element -1 out of range"),
    ]:
        with pytest.raises(IndexError, match=re.escape(message)):
            call()
    with pytest.raises(IndexError, match="out of range"):
        m[60] = 1.0
    padded = graph.Mat(np.zeros((3, 3, 5), np.float32))  # cstep 16: its planes are not depth planes
    with pytest.raises(ValueError, match="a dims-3 Mat whose planes are padded has no depth planes"):
        padded.depth(1)
    with pytest.raises(IndexError, match=re.escape("Mat.channel: channel 1 out of range: the Mat has 1 channels")):
        graph.Mat(np.zeros((4, 5), np.float32)).channel(1)
    with pytest.raises(IndexError, match=re.escape("Mat.depth: depth plane 1 out of range: the Mat has 1 depth")):
        m.channel(1).depth(1)
    with pytest.raises(ValueError, match="Mat.row: the Mat is empty"):
        graph.Mat().row(0)


def test_a_dims_1_or_2_mat_is_its_one_channel_and_depth_plane_as_pyncnns_loops_read_it():
    """pyncnn's model zoo walks outputs as ``for p in range(out.c): out.channel(p).row(y)[x]``: on a dims-2 output
    (c is 1) channel(0) is the whole Mat, its rows reachable (ncnn relabels the same memory dims - 1)."""
    pyncnn = import_or_missing("ncnn")
    x = np.arange(6 * 5, dtype=np.float32).reshape(6, 5)
    ours, theirs = graph.Mat(x), pyncnn.Mat(x)
    for p in range(ours.c):
        for y in range(ours.h):
            assert np.array_equal(ours.channel(p).row(y), np.asarray(theirs.channel(p).row(y)))
    for k, view in enumerate((ours.channel(0), ours.channel_range(0, 1), ours.depth(0), ours.depth_range(0, 1))):
        assert np.array_equal(np.array(view), x)
        view.row(1)[k] = -1.0  # the Mat's own memory
        x[1, k] = -1.0
    assert np.array_equal(ours.numpy(), x)
    line = graph.Mat(np.arange(7, dtype=np.float32))
    assert np.array_equal(np.array(line.channel(0)), np.arange(7))


def test_iterating_a_mat_gives_its_elements_without_the_padding_between_channels():
    """Mat[i] counts ncnn's cstep padding (pyncnn's does, unbounded); iteration gives the elements np.array(m) holds,
    in ncnn's order (pyncnn's crashes)."""
    x = np.arange(21, dtype=np.float32).reshape(1, 3, 7)  # planes of 21 floats: cstep 24
    m = graph.Mat(x)
    assert m.total() == 24 and list(m) == x.ravel().tolist()
    assert list(graph.Mat(np.arange(8, dtype=np.float32))) == list(range(8))
    assert list(graph.Mat(np.arange(60, dtype=np.float32).reshape(2, 3, 2, 5))) == list(range(60))
    it = iter(graph.Mat(np.arange(5, dtype=np.float32)))  # one element at a time, not a list made first
    assert next(it) == 0.0 and next(it) == 1.0


def test_a_reshape_of_a_view_whose_planes_lie_w_times_h_apart_reads_them_there():
    """ncnn's reshape takes channels to lie at its aligned cstep; a dims 4 Mat's channel has its planes w*h apart
    (35 floats, where ncnn's cstep would be 36)."""
    x = np.arange(3 * 5 * 7, dtype=np.float32).reshape(1, 3, 5, 7)
    view = graph.Mat(x).channel(0)
    for shape, want in (((7, 5, 3), x[0]), ((35, 3), x[0].reshape(3, 35)), ((5, 7, 1, 3), x[0].reshape(3, 1, 7, 5))):
        assert np.array_equal(np.array(view.reshape(*shape)), want), shape


def test_pyncnns_keyword_names_cpu_helpers_and_version():
    pyncnn = import_or_missing("ncnn")
    data = os.path.join(os.path.dirname(__file__), "data")
    net = graph.Net()
    net.set_vulkan_device(device_index=0)
    assert net.load_param(protopath=os.path.join(data, "layernorm_1d.ncnn.param")) == 0
    assert net.load_model(modelpath=os.path.join(data, "layernorm_1d.ncnn.bin")) == 0
    for name in ("get_cpu_count", "get_little_cpu_count", "get_big_cpu_count", "get_physical_cpu_count",
                 "get_physical_little_cpu_count", "get_physical_big_cpu_count", "get_cpu_powersave",
                 "get_kmp_blocktime", "cpu_support_arm_neon", "cpu_support_arm_vfpv4", "cpu_support_arm_asimdhp",
                 "cpu_support_x86_avx", "cpu_support_x86_avx2"):
        assert getattr(graph, name)() == getattr(pyncnn, name)(), name
    for layer_type in ("LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm", "Convolution", "SDPA", "NoSuchLayer"):
        assert graph.layer_to_index(layer_type) == pyncnn.layer_to_index(layer_type), layer_type
    assert graph.layer_to_index("NoSuchLayer") == -1
    assert graph.Option().num_threads == graph.get_physical_big_cpu_count()  # pyncnn's test_option checks it so
    pinned = re.search(r"^VERSION=(\S+)$", open(os.path.join(data, "..", "..", "tools", "build_ncnn.sh")).read(), re.M)
    assert graph.__version__ == pinned.group(1) == pyncnn.__version__
    assert graph.Mat(4, allocator=None).allocator is None
    # values ncnn would take and do nothing with (pyncnn: -1, or nothing said) are refused
    for bad in (lambda: graph.set_cpu_powersave(3), lambda: graph.set_omp_num_threads(0)):
        with pytest.raises(ValueError, match=r"set_(cpu_powersave|omp_num_threads): .*got (3|0)"):
            bad()


@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "fused"])
def test_input_and_output_indexes_number_the_blobs_as_the_models_param_does(fuse):
    """pyncnn's Net.input_indexes / output_indexes on every committed model; a fused net's blobs are renumbered by
    the rewrite, and its indexes are still the model's own, the ones input and extract by index take."""
    pyncnn = import_or_missing("ncnn")
    with open(os.path.join(graph_runs.DATA, "models.json")) as f:
        models = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    for name in models:
        param = os.path.join(graph_runs.DATA, f"{name}.ncnn.param")
        ours, stock = graph.Net(fuse=fuse), pyncnn.Net()
        assert ours.load_param(param) == 0 and stock.load_param(param) == 0
        assert list(ours.input_indexes()) == list(stock.input_indexes()), name
        assert list(ours.output_indexes()) == list(stock.output_indexes()), name
    net = graph.configure(graph.Net(fuse=fuse), vulkan=True)
    prefix = os.path.join(graph_runs.DATA, "transformer_block.ncnn.")
    assert net.load_param(prefix + "param") == 0 and net.load_model(prefix + "bin") == 0
    x = graph.Mat(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32))
    by_index, by_name = net.create_extractor(), net.create_extractor()
    assert by_index.input(net.input_indexes()[0], x) == 0 and by_name.input("in0", x) == 0
    (r1, a), (r2, b) = by_index.extract(net.output_indexes()[0]), by_name.extract("out0")
    assert r1 == r2 == 0 and np.array_equal(np.array(a), np.array(b))
    assert bool(net.fused()) == fuse  # the fused case renumbered something


def test_blobs_as_pyncnns_and_a_fused_nets_own():
    """Net.blobs(): the model's blobs as pyncnn gives them (name, producer, consumer; the shape hint as a list) on every
    committed model; a fused net lists its own, fewer, each made by one of its layers."""
    pyncnn = import_or_missing("ncnn")
    with open(os.path.join(graph_runs.DATA, "models.json")) as f:
        models = [k for k in json.load(f) if not k.startswith("_")]
    for name in models:
        param = os.path.join(graph_runs.DATA, f"{name}.ncnn.param")
        ours, fused, stock = graph.Net(fuse=False), graph.Net(), pyncnn.Net()
        assert ours.load_param(param) == 0 and fused.load_param(param) == 0 and stock.load_param(param) == 0
        mine = [(b.name, b.producer, b.consumer, b.shape) for b in ours.blobs()]
        assert mine == [(b.name, b.producer, b.consumer, hint(b.shape)) for b in stock.blobs()], name
        own = fused.blobs()
        assert {b.name for b in own} <= {b.name for b in ours.blobs()}
        assert len(own) < len(mine) or not fused.fused(), name
        assert all(0 <= b.producer < len(fused.layers()) for b in own)
    assert repr(ours.blobs()[0]).startswith("Blob(name='in0', producer=0, consumer=")
    assert graph.Net().blobs() == []
    # shape hints of each rank (ncnn's -23330: dims, w, h, c, or dims, w, h, d, c, for each top)
    hinted = ("7767517\n4 4\nInput a 0 1 a -23330=4,1,8,0,0\nInput b 0 1 b -23330=4,2,8,6,0\n"
              "Input c 0 1 c -23330=4,3,8,6,2\nInput d 0 1 d -23330=5,4,8,6,3,2\n")
    ours, stock = graph.Net(), pyncnn.Net()
    assert ours.load_param_mem(hinted) == 0 and stock.load_param_mem(hinted) == 0
    assert [b.shape for b in ours.blobs()] == [[8], [8, 6], [8, 6, 2], [8, 6, 3, 2]]
    assert [b.shape for b in ours.blobs()] == [hint(b.shape) for b in stock.blobs()]


def hint(shape) -> list:
    """pyncnn's shape hint (a Mat without memory) as vknorm.graph's Blob.shape gives it."""
    return {0: [], 1: [shape.w], 2: [shape.w, shape.h], 3: [shape.w, shape.h, shape.c],
            4: [shape.w, shape.h, shape.d, shape.c]}[shape.dims]


def test_the_module_exports_what_it_names_and_every_pyncnn_name_it_binds():
    """__all__ (what `from vknorm.graph import *` gives) names only what is there, and every name of pyncnn's that the
    compiled module binds is exported, but destroy_gpu_instance: ncnn's instance is made and destroyed for you."""
    pyncnn = import_or_missing("ncnn")
    assert all(hasattr(graph, name) for name in graph.__all__)
    bound = {n for n in dir(graph._graph) if not n.startswith("_")} & set(dir(pyncnn))
    assert bound - set(graph.__all__) == {"destroy_gpu_instance"}


def test_mat_shape_constructors_as_pyncnn_and_a_single_value_refused():
    """Mat(w), Mat(w, h), Mat(w, h, c), Mat(w, h, d, c) and Mat((w, ...)) make zeroed float32 Mats of that shape
    (pyncnn's; numpy order is the reverse); a lone number is not taken for a one-element array."""
    assert np.array(graph.Mat(5)).shape == (5,)
    assert np.array(graph.Mat(5, 3)).shape == (3, 5)
    assert np.array(graph.Mat(5, 3, 2)).shape == (2, 3, 5)
    made = np.array(graph.Mat(5, 3, 4, 2))
    assert made.shape == (2, 4, 3, 5) and not made.any()
    assert np.array(graph.Mat((5, 3, 2))).shape == (2, 3, 5)
    for bad in (5.0, np.float64(2.5), True):
        with pytest.raises(TypeError, match="a single value is not an array"):
            graph.Mat(bad)
    with pytest.raises(TypeError, match="1 to 4 dimensions"):
        graph.Mat((1, 2, 3, 4, 5))
    for bad in (0, np.int64(0), np.int64(2 ** 31)):
        with pytest.raises(ValueError, match="every dimension must be"):
            graph.Mat(bad)
    # an integer of numpy's (np.prod(shape), arr.size) is a w as a Python int is
    for w in (np.int64(5), np.int32(5), np.uint8(5), np.array(5)):
        made = np.array(graph.Mat(w))
        assert made.shape == (5,) and not made.any(), type(w)
    assert np.array(graph.Mat((np.int64(5), 3))).shape == (3, 5)
    assert np.array(graph.Mat(np.int64(5), np.int32(3))).shape == (3, 5)
    with pytest.raises(TypeError, match="dimensions are ints"):
        graph.Mat((5, True))
    # pyncnn's keywords: float32's elemsize and ncnn's own allocator (None) are what every Mat here has
    assert np.array(graph.Mat(5, 3, elemsize=4, allocator=None)).shape == (3, 5)
    assert np.array(graph.Mat((5, 3), elemsize=4)).shape == (3, 5)
    with pytest.raises(ValueError, match="elemsize 2: vknorm.graph's Mats hold float32"):
        graph.Mat(5, 3, elemsize=2)
    with pytest.raises(TypeError, match="no allocator objects"):
        graph.Mat(5, allocator=object())
    assert repr(graph.Mat(5, 3)) == "Mat(dims=2, w=5, h=3, d=1, c=1, elemsize=4, elempack=1)"
    assert repr(graph.Mat()) == "Mat(empty)"
    # dimensions each in range whose bytes wrap round size_t: ncnn allocated 32 bytes, which m[i] ran past
    for shape in ((1824726041, 842443544, 3), (67992, 37171, 1824726041, 1)):
        with pytest.raises(ValueError, match="more bytes than memory can hold"):
            graph.Mat(*shape)
        with pytest.raises(ValueError, match="more bytes than memory can hold"):
            graph.Mat(shape)


def test_switches_take_what_pyncnn_takes_and_name_the_field_they_refuse():
    """Option's switches, Net(vknorm=, fuse=) and Extractor.set_light_mode take True/False, numpy's bool and numbers
    by their truth value, as pyncnn does (graph.configure(net, vulkan=np.True_) failed: "(): incompatible function
    arguments"; opt.use_vulkan_compute = ncnn.get_gpu_count() is 2 on a host of two GPUs); None (pyncnn's False)
    and anything else are a TypeError naming what was set."""
    net = graph.Net(vknorm=1, fuse=np.bool_(False))
    assert net.vknorm is True and net.fuse is False
    for value, want in ((1, True), (0, False), (np.True_, True), (np.False_, False), (np.int64(1), True), (2, True),
                        (-1, True), (1.0, True), (0.0, False), (np.int32(0), False)):
        net.opt.use_vulkan_compute = value
        assert net.opt.use_vulkan_compute is want, value
    assert graph.configure(graph.Net(), vulkan=np.False_).opt.use_vulkan_compute is False
    for bad in ("yes", None, [1]):
        with pytest.raises(TypeError, match=r"Option\.lightmode: expected True or False \(or a number\), got"):
            net.opt.lightmode = bad
    with pytest.raises(TypeError, match=r"Net\(fuse=\): expected True or False"):
        graph.Net(fuse="no")
    param, binp = (os.path.join(graph_runs.DATA, "layernorm_2d.ncnn." + e) for e in ("param", "bin"))
    loaded = graph.configure(graph.Net(), vulkan=False)
    assert loaded.load_param(param) == 0 and loaded.load_model(binp) == 0
    ex = loaded.create_extractor()
    ex.set_light_mode(0)
    with pytest.raises(TypeError, match=r"Extractor\.set_light_mode: expected True or False"):
        ex.set_light_mode(None)


def test_a_mat_from_an_array_has_zeros_in_its_channel_padding():
    """3x3 planes pad to 4 floats' multiple (cstep 12): the padding is zero, not stale heap (m[i] runs over total(),
    padding included, as pyncnn's)."""
    m = graph.Mat(np.ones((2, 3, 3), np.float32))
    assert m.cstep == 12 and [m[i] for i in range(m.total())] == ([1.0] * 9 + [0.0] * 3) * 2


@pytest.mark.parametrize("direction", ["numpy to Mat", "Mat to numpy"])
def test_large_mat_copies_let_other_python_threads_run(direction):
    """A 128 MiB copy between numpy and a Mat lets another Python thread advance during it, as numpy's own copies
    do (the GIL let go around the copy)."""
    a = np.ones((32, 1024, 1024), np.float32)
    m = graph.Mat(a)
    r = thread_progress_during((lambda: graph.Mat(a)) if direction == "numpy to Mat" else (lambda: np.array(m)))
    assert r["forward_seconds"] > 0.01, r
    assert r["stamps_in_middle"] > 0, f"a Python thread made no progress during the copy: {r}"


def test_a_graph_mat_given_to_a_vknorm_layer_is_read_and_written_in_place_as_a_pyncnn_mat():
    """vknorm's own layers take a vknorm.graph.Mat as they take pyncnn's: through numpy's view of its memory
    (channels cstep apart), so forward_inplace writes the Mat; an empty one is a ValueError naming it."""
    import vknorm

    ln = vknorm.LayerNorm(affine_size=3, affine=False)
    x = np.random.default_rng(2).standard_normal((2, 3, 3)).astype(np.float32)  # 3x3 planes: cstep 12, padded
    m = graph.Mat(x)
    np.testing.assert_array_equal(ln(m), ln(x))
    assert ln.forward_inplace(m) is m
    np.testing.assert_array_equal(np.array(m), ln(x))
    for call in (ln, ln.forward_inplace):
        with pytest.raises(ValueError, match=r"the vknorm.graph Mat is empty"):
            call(graph.Mat())
    with pytest.raises(TypeError, match=r"needs a numpy array or a VkMat, got Net$"):  # not every graph type a Mat
        ln.forward_inplace(graph.Net())


def test_mat_numpy_takes_pyncnns_format_argument():
    m = graph.Mat(np.arange(6, dtype=np.float32).reshape(2, 3))
    for fmt in ("", "f"):
        assert np.array_equal(m.numpy(fmt), np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(ValueError, match="format 'i'"):
        m.numpy("i")


def test_mat_numpy_is_a_view_of_the_mats_memory_as_pyncnns(tmp_path):
    """pyncnn code fills an input through m.numpy() (a view there): the net sees the values. The view follows
    ncnn's layout (channels cstep apart), sees the Mat's later writes, and holds its memory once the Mat is gone."""
    (tmp_path / "m.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nReLU r 1 1 in0 out0\n")
    (tmp_path / "m.bin").write_bytes(b"")
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    for vulkan in (False, True):
        net = graph.configure(graph.Net(), vulkan=vulkan)
        assert net.load_param(str(tmp_path / "m.param")) == 0 and net.load_model(str(tmp_path / "m.bin")) == 0
        m = graph.Mat(8, 4)
        m.numpy()[:] = x
        ex = net.create_extractor()
        assert ex.input("in0", m) == 0
        r, y = ex.extract("out0")
        assert r == 0 and np.array_equal(np.array(y), np.maximum(x, 0)), vulkan
    m = graph.Mat(5, 3, 3)  # planes of 15 floats, cstep 16
    v = m.numpy()
    assert v.shape == (3, 3, 5) and v.strides == (16 * 4, 5 * 4, 4)
    m.fill(2.0)
    v[1, 2, 4] = -1.0
    assert v.sum() == 2.0 * 45 - 3 and m[16 + 14] == -1.0
    m4 = graph.Mat(np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5))
    assert np.array_equal(m4.numpy(), np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5))
    del m, m4
    gc.collect()
    assert v.sum() == 2.0 * 45 - 3
    with pytest.raises(ValueError, match="Mat.numpy: the Mat is empty"):
        graph.Mat().numpy()


def test_pyncnn_s_other_signatures_work_as_there(tmp_path):
    """Mat(m) is ncnn's copy constructor (the same memory; an empty Mat gives an empty one); elempack=1 and
    allocator=None are taken where pyncnn's signatures have them, anything else refused; extract(blob, feat) fills
    the Mat given and returns the code; Option.openmp_blocktime is ncnn's field."""
    a = graph.Mat(3)
    a.fill(1.0)
    b = graph.Mat(a)
    b[0] = 9.0
    assert a[0] == 9.0 and graph.Mat(graph.Mat()).empty() and graph.Mat(m=a).w == 3
    assert (graph.Mat(3, elemsize=4, elempack=1).w, graph.Mat(3, 2, elempack=1).h, graph.Mat(2, 3, 4, elempack=1).c) \
        == (3, 2, 4)
    with pytest.raises(ValueError, match="Mat: elempack 4: vknorm.graph's Mats are unpacked"):
        graph.Mat(3, elempack=4)
    assert graph.Mat(3).clone(allocator=None).w == 3 and graph.Mat(4).reshape(2, 2, allocator=None).h == 2
    with pytest.raises(TypeError, match="Mat.reshape: vknorm.graph has no allocators"):
        graph.Mat(4).reshape(4, allocator=object())
    opt = graph.Option()
    assert opt.openmp_blocktime == 20  # ncnn's default
    opt.openmp_blocktime = 0
    assert opt.openmp_blocktime == 0
    (tmp_path / "m.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nReLU r 1 1 in0 out0\n")
    (tmp_path / "m.bin").write_bytes(b"")
    for vulkan in (False, True):
        net = graph.configure(graph.Net(), vulkan=vulkan)
        assert net.load_param(str(tmp_path / "m.param")) == 0 and net.load_model(str(tmp_path / "m.bin")) == 0
        ex = net.create_extractor()
        assert ex.input("in0", graph.Mat(np.array([-1.0, 2.0], np.float32))) == 0
        by_name, by_index, untouched = graph.Mat(), graph.Mat(), graph.Mat(5)
        assert ex.extract("out0", by_name) == 0 and ex.extract(1, by_index, 0) == 0
        assert np.array_equal(np.array(by_name), [0.0, 2.0]) and np.array_equal(np.array(by_index), [0.0, 2.0])
        with quiet_stderr():
            assert ex.extract("nosuch", untouched) == -1
        assert untouched.w == 5  # left as it was on failure


def test_a_mat_exports_its_memory_as_pyncnns_buffer_does():
    """np.asarray(m), memoryview(m) and numpy's functions read the Mat's own memory (channels cstep apart) and write
    it, as pyncnn's buffer export does; np.array(m) is the caller's copy. An export holds the memory it was made on
    when the Mat is made again. A padded Mat has no contiguous memory to give struct or a plain memoryview cast."""
    x = np.arange(2 * 3 * 3, dtype=np.float32).reshape(2, 3, 3)  # 3x3 planes: cstep 12, padded
    m = graph.Mat(x)
    a = np.asarray(m)
    assert a.flags.writeable and a.strides == (48, 12, 4) and np.array_equal(a, x)
    a[1, 2, 2] = -1.0
    np.reshape(m, (2, 9))[0, 0] = -2.0
    assert m[12 + 8] == -1.0 and m[0] == -2.0
    b = np.array(m)
    b[:] = 5.0
    assert m[1] == 1.0
    assert np.asarray(m, copy=False).base is not None and np.asarray(m, dtype=np.float64).dtype == np.float64
    view = memoryview(m)
    assert (view.format, view.shape, view.strides, view.readonly) == ("f", (2, 3, 3), (48, 12, 4), False)
    assert len(bytes(m)) == 18 * 4
    pyncnn = import_or_missing("ncnn")
    flat = np.arange(4, dtype=np.float32)
    assert struct.unpack_from("3f", graph.Mat(flat)) == struct.unpack_from("3f", pyncnn.Mat(flat)) == (0.0, 1.0, 2.0)
    assert np.array_equal(np.frombuffer(graph.Mat(flat), np.float32), flat)
    with pytest.raises(BufferError, match="cstep apart .* np.array\\(mat\\) is a contiguous copy"):
        struct.unpack_from("3f", m)
    # C-contiguous requests of a padded Mat, and Fortran-order ones of any Mat of several rows, are refused
    import ctypes
    for mat, order in ((m, "C"), (m, "A"), (graph.Mat(np.ones((2, 3), np.float32)), "F")):
        flag = {"C": 0x20, "F": 0x40, "A": 0x80}[order] | 0x18  # PyBUF_*_CONTIGUOUS
        buf = (ctypes.c_char * ctypes.sizeof(ctypes.c_void_p) * 16)()
        get = ctypes.pythonapi.PyObject_GetBuffer
        get.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
        with pytest.raises(BufferError):
            get(mat, ctypes.addressof(buf), flag)
    assert memoryview(graph.Mat(np.ones((2, 3), np.float32))).c_contiguous
    assert np.shares_memory(m.__array__(copy=False), m.numpy())  # numpy's protocol: copy=False is its own memory
    kept = np.asarray(m)
    m.create(5)  # given other memory: the export keeps the memory it was made on
    gc.collect()
    assert kept[0, 0, 1] == 1.0 and m.w == 5
    with pytest.raises(ValueError, match="Mat is empty"):
        np.array(graph.Mat())


def test_an_input_that_is_not_a_graph_mat_and_fusion_without_vknorm_are_one_line_errors():
    """A numpy array or a pyncnn Mat given to Extractor.input: a TypeError naming what was given and the wrap it
    needs (not nanobind's list of overloads). Net(vknorm=False, fuse=True): fusion makes vknorm's layers, which
    a stock net does not have; a ValueError, not a net that silently does not fuse."""
    net = graph.Net()
    param, binp = (os.path.join(graph_runs.DATA, "transformer_block.ncnn." + e) for e in ("param", "bin"))
    assert net.load_param(param) == 0 and net.load_model(binp) == 0
    ex = net.create_extractor()
    with pytest.raises(TypeError) as e:
        ex.input("in0", np.zeros(4, np.float32))
    assert str(e.value) == ("Extractor.input: the input must be a vknorm.graph.Mat, got numpy.ndarray: wrap it, "
                            "vknorm.graph.Mat(np.asarray(x))")
    with pytest.raises(TypeError, match="the blob is a name \\(str\\) or an index \\(int\\), got float"):
        ex.input(1.5, graph.Mat(np.zeros(4, np.float32)))
    pyncnn = import_or_missing("ncnn")  # beside vknorm.graph in one process: test_pyncnn_and_vknorm_graph_in_one_process
    with pytest.raises(TypeError, match="must be a vknorm.graph.Mat, got NoneType"):
        ex.input("in0", None)
    with pytest.raises(TypeError, match="must be a vknorm.graph.Mat, got ncnn.ncnn.Mat"):
        ex.input(0, pyncnn.Mat(np.zeros((16, 64), np.float32)))
    x = graph.Mat(np.zeros((16, 64), np.float32))
    assert ex.input("in0", x) == 0 and ex.input(0, x) == 0 and ex.input(np.int64(0), x) == 0  # as pyncnn takes them
    assert ex.input(blob_name="in0", mat=x) == 0 and ex.input(blob_index=0, mat=x) == 0
    for bad in (True, 1.5, None):
        with pytest.raises(TypeError, match="the blob is a name"):
            ex.input(bad, x)
        with pytest.raises(TypeError, match=rf"Extractor.extract: the blob is a name .*, got {type(bad).__name__}"):
            ex.extract(bad)  # True extracted blob 1 before
    log: list = []
    with quiet_stderr(log):  # an index past int: -1, named as given (it was clamped to 2147483647)
        assert ex.input(2 ** 40, x) == -1 and ex.extract(2 ** 40)[0] == -1
    assert sum("blob index 1099511627776 out of range" in ln for ln in log) == 2, log
    assert ex.extract(np.int64(13))[0] == 0
    with pytest.raises(ValueError, match="Net\\(vknorm=False, fuse=True\\)"):
        graph.Net(vknorm=False, fuse=True)
    assert graph.Net(vknorm=False).fuse is False and graph.Net(vknorm=False, fuse=False).fuse is False
    assert graph.Net().fuse is True and graph.Net(fuse=False).fuse is False


def test_paths_with_a_nul_byte_are_refused_as_python_s_open_refuses_them():
    """In C the path would end at the NUL and load another file (here, the model that precedes it); so would a
    param text (the layers past it dropped unseen) and a blob name (another blob looked up)."""
    net = graph.Net()
    for load, ext in ((net.load_param, "param"), (net.load_model, "bin")):
        with pytest.raises(ValueError, match="embedded null byte"):
            load(os.path.join(graph_runs.DATA, "transformer_block.ncnn." + ext) + "\0.other")
    text = open(os.path.join(graph_runs.DATA, "transformer_block.ncnn.param")).read()
    for mem in (text + "\0junk", (text + "\0junk").encode()):
        with pytest.raises(ValueError, match="load_param_mem: embedded null byte in the text"):
            net.load_param_mem(mem)
    assert net.load_param_mem(text) == 0
    assert net.load_model(os.path.join(graph_runs.DATA, "transformer_block.ncnn.bin")) == 0
    ex = net.create_extractor()
    with pytest.raises(ValueError, match="Extractor.input: embedded null byte in the blob name"):
        ex.input("in0\0junk", graph.Mat(np.zeros((16, 64), np.float32)))
    with pytest.raises(ValueError, match="Extractor.extract: embedded null byte in the blob name"):
        ex.extract("out0\0junk")


def test_model_files_are_names_or_paths_as_python_s_open_takes_them(tmp_path):
    """str, bytes and os.PathLike, and names that are not UTF-8 (legal on Linux: str holds them surrogate-escaped,
    as os.listdir gives them)."""
    import shutil
    from pathlib import Path

    net = graph.configure(graph.Net(), vulkan=True)
    data = Path(graph_runs.DATA)
    assert net.load_param(data / "transformer_block.ncnn.param") == 0
    assert net.load_model(data / "transformer_block.ncnn.bin") == 0
    for load in (net.load_param, net.load_model):
        for bad, needle in ((None, "NoneType"), (3, "int")):
            with pytest.raises(TypeError, match=needle):
                load(bad)
    odd = os.fsencode(tmp_path) + b"/m\xff"  # not UTF-8
    for ext in (".param", ".bin"):
        shutil.copy(data / f"transformer_block.ncnn{ext}", odd + ext.encode())
    x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    outs = []
    for name in (odd, os.fsdecode(odd), Path(os.fsdecode(odd))):
        net = graph.configure(graph.Net(), vulkan=True)
        assert net.load_param(name + b".param" if isinstance(name, bytes) else f"{name}.param") == 0, name
        assert net.load_model(name + b".bin" if isinstance(name, bytes) else f"{name}.bin") == 0, name
        ex = net.create_extractor()
        ex.input("in0", graph.Mat(x))
        ret, out = ex.extract("out0")
        assert ret == 0
        outs.append(np.array(out))
    assert all(np.array_equal(o, outs[0]) for o in outs)
    assert graph.get_gpu_count() >= 1 and 0 <= graph.get_default_gpu_index() < graph.get_gpu_count()


GPU_INFO_SCRIPT = """
import json, ncnn, vknorm
from vknorm import graph
ours, theirs = graph.get_gpu_info(0), ncnn.get_gpu_info(0)
pyncnn_getters = ("device_name", "api_version", "driver_version", "vendor_id", "device_id", "type")
own = {d["name"]: d for d in vknorm.devices()}[ours.device_name()]
device = graph.get_gpu_device(0)
print(json.dumps({
    "pyncnn": [getattr(ours, g)() == getattr(theirs, g)() for g in pyncnn_getters],
    "uuid": [ours.pipeline_cache_uuid()[:1] == bytes(theirs.pipeline_cache_uuid())[:1],
             len(ours.pipeline_cache_uuid())],
    "own": [ours.vendor_id() == own["vendor_id"], ours.device_id() == own["device_id"],
            ours.driver_version() == own["driver_version"], ours.driver_name() == own["driver_name"],
            ours.subgroup_size() == own["subgroup_size"], ours.max_shared_memory_size() == own["max_shared_memory"],
            ours.max_workgroup_invocations() == own["max_workgroup_invocations"],
            ours.support_fp16_storage() == own["storage_16bit"],
            ours.timestamp_period() == own["timestamp_period_ns"]],
    "budget": [device.get_heap_budget(), ncnn.get_gpu_device(0).get_heap_budget()],
    "device": [device == graph.VulkanDevice(0), device.info().as_dict() == ours.as_dict(), repr(device)],
}))
graph._graph.destroy_gpu_instance()  # the values were taken: they outlive ncnn's own GpuInfo
print(json.dumps({"after_destroy": [ours.device_name(), graph.get_gpu_info(0).device_name()]}))
"""


def test_gpu_info_and_device_are_pyncnns_and_agree_with_vknorms_own_device():
    """pyncnn's get_gpu_info / get_gpu_device: each getter pyncnn has gives pyncnn's value, and ncnn's others agree
    with what vknorm's own Vulkan context reads from the same device (not its api_version: vknorm gives the version
    it uses, which an older Vulkan loader caps below the device's). (pyncnn's pipeline_cache_uuid steps 16 bytes
    per element, so past its first byte it reads beyond the uuid; here it is the uuid's 16 bytes.) The values are
    taken at the call, so a GpuInfo outlives ncnn's instance, where pyncnn's would read freed memory."""
    import_or_missing("ncnn")
    proc = subprocess.run([sys.executable, "-c", GPU_INFO_SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(ln) for ln in proc.stdout.splitlines()]
    got = lines[0]
    assert got["pyncnn"] == [True] * 6 and got["uuid"] == [True, 16], got
    assert got["own"] == [True] * 9, got
    ours_mb, pyncnn_mb = got["budget"]
    assert ours_mb > 0 and abs(ours_mb - pyncnn_mb) <= 0.1 * pyncnn_mb, got  # the same heap, read moments apart
    assert got["device"] == [True, True, "VulkanDevice(0)"], got
    name = lines[1]["after_destroy"]
    assert name[0] == name[1] and name[0], lines


def test_a_nets_vulkan_device_is_none_until_it_has_one():
    """pyncnn's Net.vulkan_device(): None before set_vulkan_device or a Vulkan net's load_param, and for a CPU
    net; then the device the net runs on."""
    param = os.path.join(graph_runs.DATA, "transformer_block.ncnn.param")
    assert graph.Net().vulkan_device() is None
    cpu = graph.configure(graph.Net(), vulkan=False)
    assert cpu.load_param(param) == 0 and cpu.vulkan_device() is None
    vk = graph.configure(graph.Net(), vulkan=True)
    assert vk.load_param(param) == 0
    assert vk.vulkan_device() == graph.get_gpu_device(graph.get_default_gpu_index())
    picked = graph.Net()
    picked.set_vulkan_device(0)
    assert picked.vulkan_device() == graph.VulkanDevice(0)
    assert picked.vulkan_device().info().device_name() == graph.gpu_name(0)
    for form in ((graph.get_gpu_device(0),), {"vkdev": graph.VulkanDevice(0)}, (np.int64(0),), {"device_index": 0}):
        given = graph.Net()  # pyncnn's two forms: the index or the device itself, by position or keyword
        given.set_vulkan_device(*form) if isinstance(form, tuple) else given.set_vulkan_device(**form)
        assert given.vulkan_device() == graph.VulkanDevice(0)
    for bad, needle in ((("0",), "device_index must be an integer"), ({"vkdev": 0}, "vkdev must be"),
                        ({"device_index": graph.VulkanDevice(0)}, "device_index must be an integer"),
                        ({"device_index": 0, "vkdev": graph.VulkanDevice(0)}, "takes one device"),
                        ((), "takes one device")):
        with pytest.raises(TypeError, match=needle):  # pyncnn: TypeError for each
            graph.Net().set_vulkan_device(*bad) if isinstance(bad, tuple) else graph.Net().set_vulkan_device(**bad)
    with pytest.raises(AttributeError):  # a misspelt option is no new field of the net, as with pyncnn
        graph.Net().use_vulkan_compute = True


@pytest.mark.parametrize("call", ["get_gpu_info", "get_gpu_device", "VulkanDevice", "gpu_name"])
def test_a_gpu_index_outside_ncnns_devices_is_a_value_error_naming_the_call(call):
    """pyncnn reads past ncnn's device table there (get_gpu_device: gives None, which fails later and elsewhere)."""
    for index in (-1, graph.get_gpu_count(), 2**40):
        with pytest.raises(ValueError, match=f"^{call}: device index {index} out of range"):
            getattr(graph, call)(index)
    for bad in (0.5, "0")[:1 if call == "gpu_name" else 2]:
        with pytest.raises(TypeError):
            getattr(graph, call)(bad)


def test_an_extractor_used_after_clear_says_so():
    """ncnn's Extractor.clear() (and the end of a with block) drops its blobs: an input or extract after it is -1,
    with a message saying why (it was -1 alone, and the next extract blamed a missing input)."""
    script = (f"import numpy as np\nfrom vknorm import graph\nnet = graph.Net()\n"
              f"net.load_param({os.path.join(graph_runs.DATA, 'transformer_block.ncnn.param')!r})\n"
              f"net.load_model({os.path.join(graph_runs.DATA, 'transformer_block.ncnn.bin')!r})\n"
              "with net.create_extractor() as ex:\n    pass\n"
              "x = graph.Mat(np.ones((16, 64), np.float32))\n"
              "print(ex.input('in0', x), ex.extract('out0')[0])\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["-1", "-1"], proc.stdout
    assert proc.stderr.count("this extractor was cleared") == 2, proc.stderr[-2000:]


FEATMASK_NORMS = {
    "LayerNorm": ("LayerNorm norm 1 1 a y 0=4 1=0.001 2=1 31=16", 4),
    "RMSNorm": ("RMSNorm norm 1 1 a y 0=4 1=0.001 2=1 31=16", 4),
    "GroupNorm": ("GroupNorm norm 1 1 a y 0=3 1=6 2=0.001 3=1 31=16", 6),
    "InstanceNorm": ("InstanceNorm norm 1 1 a y 0=6 1=0.001 2=1 31=16", 6),
}


@pytest.mark.parametrize("norm", sorted(FEATMASK_NORMS))
def test_a_norm_with_featmask_bit_4_runs_on_the_cpu_inside_a_vulkan_net(tmp_path, norm):
    """Param 31 (featmask) bit 4 keeps one layer off Vulkan in a Vulkan net: ncnn downloads its input and runs
    the layer on the CPU. vknorm's layers do so (they crashed, SIGSEGV: ncnn recorded their Vulkan forward with no
    pipelines), equal to stock ncnn's CPU net, counted as CPU forwards."""
    line, weights = FEATMASK_NORMS[norm]
    (tmp_path / "m.param").write_text(f"7767517\n2 2\nInput in0 0 1 a\n{line}\n")
    rng = np.random.default_rng(3)
    w = np.concatenate([rng.uniform(0.5, 1.5, weights), rng.uniform(-0.5, 0.5, weights)]).astype(np.float32)
    if norm == "RMSNorm":
        w = w[:weights]
    (tmp_path / "m.bin").write_bytes(w.tobytes())
    x = rng.standard_normal((6, 5, 4)).astype(np.float32)

    def run(vknorm, vulkan):
        net = graph.configure(graph.Net(vknorm=vknorm, fuse=False), vulkan=vulkan)
        assert net.load_param(str(tmp_path / "m.param")) == 0 and net.load_model(str(tmp_path / "m.bin")) == 0
        ex = net.create_extractor()
        ex.input("a", graph.Mat(x))
        r, y = ex.extract("y")
        assert r == 0
        return net, np.array(y)

    net, got = run(True, True)
    _, want = run(False, False)
    np.testing.assert_array_equal(got, want)  # ncnn's own CPU layer on the same float32 input
    assert net.vknorm_counters()["cpu_forwards"] == 1 and net.vknorm_counters()["vulkan_forwards"] == 0
    assert [l[3] for l in net.layers() if l[0] == "norm"] == [False]  # not on Vulkan


def test_mat_copies_every_array_pyncnn_s_mat_takes_read_only_ones_too(tmp_path):
    """Mat(array) only reads its array, so read-only arrays (a memory map, np.frombuffer, np.broadcast_to,
    setflags(write=False)) are copied as pyncnn's Mat copies them; other dtypes, byte orders, layouts and nested
    lists are converted; what is not real numbers is a TypeError naming its dtype."""
    from vknorm import graph

    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    frozen = x.copy()
    frozen.setflags(write=False)
    arrays = {"memory map": np.load(tmp_path / "x.npy", mmap_mode="r"),
              "frombuffer": np.frombuffer(x.tobytes(), np.float32).reshape(x.shape),
              "write=False": frozen,
              "broadcast_to": np.broadcast_to(x[0], x.shape),
              "float64": x.astype(np.float64),
              "transposed": np.ascontiguousarray(x.transpose(0, 2, 1)).transpose(0, 2, 1),
              "big-endian float32": x.astype(">f4"),
              "big-endian float64": x.astype(">f8"),
              "nested lists": x.tolist()}
    for name, a in arrays.items():
        assert np.array_equal(np.array(graph.Mat(a)), np.asarray(a, np.float32)), name
    for bad in ("abc", np.ones(3, complex), None, np.array([object()])):
        with pytest.raises(TypeError, match="Mat: expected an array of real numbers .* got dtype"):
            graph.Mat(bad)


BF16_SCRIPT = r"""
import sys
import vknorm
from vknorm import graph
if vknorm.device_info()["type"] != "cpu":
    print("not a CPU device")  # stock ncnn's own bfloat16 shaders fail to build on NVIDIA's driver: nothing to test
    sys.exit(0)
net = graph.Net()
net.opt.use_vulkan_compute = True
net.opt.use_bf16_packed = True
print("load", net.load_param(sys.argv[1]), net.load_model(sys.argv[2]))
"""


def test_bfloat16_storage_is_refused_at_load_naming_the_option():
    """vknorm's kernels read float32 or float16: a net asking for bfloat16 storage (lavapipe takes bf16 packed)
    fails load_model with a message that names the option, instead of running on blobs it would misread."""
    param, binp = (os.path.join(graph_runs.DATA, f"layernorm_2d.ncnn.{ext}") for ext in ("param", "bin"))
    proc = subprocess.run([sys.executable, "-c", BF16_SCRIPT, param, binp], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if "not a CPU device" in proc.stdout:
        missing("stock ncnn itself fails to build its bfloat16 shaders on this GPU's driver (lavapipe runs them)")
    assert "load 0 -1" in proc.stdout, proc.stdout
    assert "bfloat16 storage is not supported" in proc.stderr and "use_bf16_packed" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_an_affine_norm_whose_size_reads_as_0_is_named_at_load_model_not_blamed_on_the_bin(tmp_path, fuse):
    """ncnn reads an int param written as a float (0=8.0) as not given: affine_size 0. With weights, load_model
    fails (ncnn: -100 at the first layer that cannot load); the line says why instead of 'the model file ends'."""
    from vknorm import graph

    param, binp = tmp_path / "m.param", tmp_path / "m.bin"
    param.write_text("7767517\n2 2\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 out0 0=8.0 1=1e-5 2=1\n")
    np.ones(16, np.float32).tofile(binp)
    net = graph.configure(graph.Net(fuse=fuse), vulkan=True)
    assert net.load_param(str(param)) == 0
    log: list = []
    with quiet_stderr(log):
        assert net.load_model(str(binp)) != 0
    assert any("LayerNorm ln: affine with affine_size 0: no weights to read" in ln and "0=8.0" in ln for ln in log), log

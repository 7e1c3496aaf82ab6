"""Capability fallbacks: lavapipe forced into the shape of a smaller device, one profile at a
time, and the operator's parity set run under each.

A profile is environment variables (read when the Vulkan instance/device is created, so each profile runs
in its own process: ``python tests/test_capabilities.py --json [--option k=v ...]``, with
VKNORM_VALIDATION=1) plus Option fields:

==========================  ===============================================  ==============================
profile                     forced how                                       what must happen
==========================  ===============================================  ==============================
no_subgroup_env             VKNORM_NO_SUBGROUP=1                             shared-memory reductions only
no_subgroup_option          Option(use_subgroup_ops=False)                   the same, per call
subgroup_size_required      VKNORM_SUBGROUP_SIZE=<each size the device       pipelines require that size
                            allows; lavapipe: 8 only>                        (other sizes are refused)
shared_16k                  VKNORM_MAX_SHARED_MEMORY=16384 (Vulkan's         every shader's shared memory
                            guaranteed minimum)                              fits
shared_512                  VKNORM_MAX_SHARED_MEMORY=512 (scaled down: on    workgroups shrink until it
                            lavapipe workgroups are <= 64, 16 KB never       fits
                            binds)
wg_128                      Option(max_workgroup_size=128)                   workgroups <= 128
wg_16                       Option(max_workgroup_size=16) (binds on          workgroups <= 16
                            lavapipe, whose workgroups are <= 64 anyway)
wg_8                        Option(max_workgroup_size=8): no larger than     workgroups <= 8, each one
                            lavapipe's subgroup (as 16 is on a GPU with      subgroup: a forced workgroup
                            subgroups of 32)                                 path runs as the subgroup one
no_fp16_storage             VKNORM_NO_FP16_STORAGE=1                         fp16 requested -> fp32 storage,
                                                                             one warning on stderr
vulkan_1_0                  VKNORM_VULKAN_API=1.0                            instance and device as 1.0: no
                                                                             subgroup, no fp16 variants
==========================  ===============================================  ==============================

The parity set is tests/test_vulkan_ncnn_cases.py's (which runs all of it on the device as it is): here each profile
runs every other ncnn LayerNorm/RMSNorm case (62 of 124; the profiles alternate between the odd and the even ones) x
{fp32, fp16 storage requested} x {packing off, on} x {auto, subgroup, workgroup, split}, against float64 of the
input as fed (float16 input: the rounded values) by the storage rule, against the CPU reference (its float16 output
rounded too) by ncnn's rule (its float32 algorithm's a-priori error and both roundings; tests/reference.py), and
check_dispatch's path rules, plus fp16 requested on float32
input (bit-identical to fp32 storage where the device stores no float16). Every profile must leave zero
validation messages. The profiles run two at a time (45-90 s each on a 2-core host's lavapipe, run alone: the
time is lavapipe making each case's pipelines).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS_DIR)
SHADERS = os.path.join(ROOT, "shaders")

PROFILES = {
    "no_subgroup_env": {"env": {"VKNORM_NO_SUBGROUP": "1"}},
    "no_subgroup_option": {"option": {"use_subgroup_ops": False}},
    "shared_16k": {"env": {"VKNORM_MAX_SHARED_MEMORY": "16384"}},
    "shared_512": {"env": {"VKNORM_MAX_SHARED_MEMORY": "512"}},
    "wg_128": {"option": {"max_workgroup_size": 128}},
    "wg_16": {"option": {"max_workgroup_size": 16}},
    "wg_8": {"option": {"max_workgroup_size": 8}},
    "no_fp16_storage": {"env": {"VKNORM_NO_FP16_STORAGE": "1"}},
    "vulkan_1_0": {"env": {"VKNORM_VULKAN_API": "1.0"}},
}
# Knobs a profile run must not inherit from the caller's environment.
SCRUB = ("VKNORM_NO_SUBGROUP", "VKNORM_SUBGROUP_SIZE", "VKNORM_MAX_SHARED_MEMORY", "VKNORM_NO_FP16_STORAGE",
         "VKNORM_VULKAN_API", "VKNORM_PATH", "VKNORM_MAX_DEVICE_BYTES")
# Each profile runs every CASE_STRIDE-th case of the parity set, the profiles taking turns at the offsets: together
# they cover every case, and the fixture's time on a 2-core host stays within its limit.
CASE_STRIDE = 2
FP16_WARNING = "vknorm: float16 storage is not supported on this device; using float32 storage"


# ---------------------------------------------------------------- the parity run (in the profile's process)

def run_parity(option_fields: dict, every: int, offset: int = 0) -> dict:
    import numpy as np

    import vknorm
    from vknorm import _core
    from planned import declared_shared, shared_bytes
    from reference import (PATHS, all_cases, case_data, case_name, check_dispatch, group_size, make_layer,
                           ncnn_float32_error, ncnn_rule, norm64, storage_rule)

    device = vknorm.device_info()
    per_shader = shared_bytes()
    failures, dispatches = [], []
    checked = 0
    cases = all_cases()
    for seed, (op, case) in enumerate(cases):
        if seed % every != offset:
            continue
        x, gamma, beta = case_data(op, case, seed)
        layer = make_layer(op, case["affine_size"], case["eps"], case["affine"], gamma, beta)
        args = (case["affine_size"], case["eps"], case["affine"], gamma, beta)
        gs = group_size(x.shape, case["affine_size"])
        for fp16 in (False, True):
            xin = x.astype(np.float16) if fp16 else x
            ref64 = norm64(op, xin, *args)
            cpu = layer(xin, device="cpu")
            cpu_err = ncnn_float32_error(op, xin, *args)  # what ncnn's float32 algorithm may be off float64 by
            for packing in (False, True):
                for path in PATHS:
                    opt = vknorm.Option(use_fp16_storage=fp16, use_packing_layout=packing, path=path, **option_fields)
                    what = f"{case_name(op, case)} fp16={fp16} packing={packing} path={path}"
                    y = layer(xin, device="vulkan", option=opt)
                    info = layer.last_dispatch
                    checked += 1
                    if y.dtype != xin.dtype or y.shape != xin.shape:
                        failures.append(f"{what}: returned {y.dtype}{y.shape}")
                        continue
                    # float64 of the input the kernel read (float16: the rounded input) by the storage rule; the
                    # CPU reference by ncnn's rule (its float32 error, and in float16 both outputs' rounding)
                    err, bound = storage_rule(y, ref64, fp16)
                    if not err <= bound:
                        failures.append(f"{what}: vs float64 error {err:.3e} > {bound:.3e} (the storage rule)")
                    err, bound = ncnn_rule(y, cpu, cpu_err, ours_fp16=fp16, theirs_fp16=fp16)
                    if not err <= bound:
                        failures.append(f"{what}: vs CPU reference {err:.3e} past ncnn's rule > {bound:.3e}")
                    problem = check_dispatch(info, path, gs, device)
                    if problem:
                        failures.append(f"{what}: {problem}")
                    dispatches.append({"path": info["path"], "wg": info["workgroup_size"], "subgroup": info["subgroup"],
                                       "shared": declared_shared(per_shader, info)})
        # fp16 storage requested with float32 input: either float16 on the device (values are fp16 values)
        # or, where the device has none, exactly the float32-storage result.
        y32 = layer(x, device="vulkan", option=vknorm.Option(**option_fields))
        y16 = layer(x, device="vulkan", option=vknorm.Option(use_fp16_storage=True, **option_fields))
        checked += 2
        dispatches.append({"path": layer.last_dispatch["path"], "wg": layer.last_dispatch["workgroup_size"],
                           "subgroup": layer.last_dispatch["subgroup"], "shared": 0})
        err, bound = storage_rule(y32, norm64(op, x, *args), False)
        if not err <= bound:
            failures.append(f"{case_name(op, case)}: fp32 storage, float32 input: error {err:.3e} > {bound:.3e}")
        if not device["storage_16bit"] or os.environ.get("VKNORM_NO_FP16_STORAGE"):
            if not np.array_equal(y16, y32, equal_nan=True):
                failures.append(f"{case_name(op, case)}: fp16 requested without 16-bit storage differs from fp32 storage")
        else:  # float16 on the device: the float32 input rounded on upload, float16 values out, by the fp16 rule
            err, bound = storage_rule(y16, norm64(op, x.astype(np.float16), *args), True)
            if not np.array_equal(y16, y16.astype(np.float16).astype(np.float32), equal_nan=True) or not err <= bound:
                failures.append(f"{case_name(op, case)}: fp16 storage, float32 input: error {err:.3e} > {bound:.3e}"
                                " or values that are not float16")
    messages = _core.validation_messages()
    return {
        "device": device,
        "validation_enabled": bool(_core.validation_enabled()),
        "checked": checked,
        "cases": len(range(offset, len(cases), every)),
        "of_cases": len(cases),
        "offset": offset,
        "failures": failures,
        "validation_messages": messages[:10],
        "n_validation_messages": len(messages),
        "max_wg": max(d["wg"] for d in dispatches),
        "max_shared": max(d["shared"] for d in dispatches),
        "any_subgroup": any(d["subgroup"] for d in dispatches),
        "paths": sorted({d["path"] for d in dispatches}),
        "wgs": sorted({d["wg"] for d in dispatches}),
    }


# ---------------------------------------------------------------- pytest: one process per profile

def run_profile(env: dict, option: dict | None = None, timeout: int = 300,
                offset: int = 0) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in SCRUB}
    full.update(env)
    full["VKNORM_VALIDATION"] = "1"
    cmd = [sys.executable, os.path.abspath(__file__), "--json", "--every", str(CASE_STRIDE), "--offset", str(offset)]
    for k, v in (option or {}).items():
        cmd += ["--option", f"{k}={int(v)}"]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def summary_of(proc: subprocess.CompletedProcess, what: str) -> dict:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"{what}: no summary (rc {proc.returncode})\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])


def subgroup_size_range() -> tuple:
    """(min, max) compute subgroup size the device lets a pipeline require, from vknorm's refusal of size 1."""
    full = {k: v for k, v in os.environ.items() if k not in SCRUB}
    full["VKNORM_SUBGROUP_SIZE"] = "1"
    proc = subprocess.run([sys.executable, "-c", "import vknorm; vknorm.device_info()"], env=full,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, "VKNORM_SUBGROUP_SIZE=1 was accepted"
    m = re.search(r"runs compute subgroups of (\d+) to (\d+) invocations", proc.stderr)
    if m is None:  # no subgroup size control at all
        assert "cannot" in proc.stderr, proc.stderr[-2000:]
        return None
    return int(m.group(1)), int(m.group(2))


if "pytest" in sys.modules:
    import pytest

    from availability import missing
    from planned import shared_bytes
    from reference import PATHS

    pytestmark = pytest.mark.timeout(900)  # the module fixture runs every profile (5-10 min on 2 cores)

    @pytest.fixture(scope="module")
    def profile_runs(vulkan_device):
        """Every profile's run, two processes at a time; plus the required-subgroup-size runs."""
        jobs = {name: (spec.get("env", {}), spec.get("option")) for name, spec in PROFILES.items()}
        sizes = subgroup_size_range()
        default = vulkan_device["subgroup_size"]
        if sizes:
            lo, hi = sizes
            for n in (1 << k for k in range(12)):
                if lo <= n <= hi:  # every size the device allows, its default included
                    jobs[f"subgroup_size_{n}"] = ({"VKNORM_SUBGROUP_SIZE": str(n)}, None)
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {name: pool.submit(run_profile, env, opt, offset=i % CASE_STRIDE)
                       for i, (name, (env, opt)) in enumerate(jobs.items())}
            runs = {name: f.result() for name, f in futures.items()}
        return {"runs": runs, "sizes": sizes, "default_subgroup_size": default}

    def check_run(profile_runs, name, workgroup_cap: int = 0) -> dict:
        """The profile's parity run passed, validation-clean, on every path the device has under it. A
        workgroup cap no larger than the device's subgroup makes every workgroup one subgroup: the planner
        then names every fused team "subgroup" (e.g. 16 invocations on a GPU with subgroups of 32)."""
        proc = profile_runs["runs"][name]
        s = summary_of(proc, name)
        assert s["validation_enabled"], f"{name}: ran without the validation layer"
        assert s["of_cases"] == 124 and s["cases"] == len(range(s["offset"], 124, CASE_STRIDE)), \
            f"{name}: {s['cases']} of {s['of_cases']} cases"
        # per case: 2 storages x 2 packings x each path, and fp16 requested on float32 input twice
        assert s["checked"] >= s["cases"] * (4 * len(PATHS) + 2), f"{name}: only {s['checked']} forwards"
        assert not s["failures"], f"{name}: {len(s['failures'])} parity failure(s):\n" + "\n".join(s["failures"][:30])
        assert s["n_validation_messages"] == 0, f"{name}: validation messages:\n" + "\n".join(s["validation_messages"])
        assert proc.returncode == 0, f"{name}: rc {proc.returncode}\n{proc.stderr[-2000:]}"
        one_subgroup = 0 < workgroup_cap <= s["device"]["subgroup_size"]
        want = ["split", "subgroup"] if one_subgroup else ["split", "subgroup", "workgroup"]
        assert s["paths"] == want, f"{name}: paths {s['paths']}"
        assert s["max_shared"] <= s["device"]["max_shared_memory"]
        return s

    @pytest.mark.parametrize("name", ["no_subgroup_env", "no_subgroup_option"])
    def test_no_subgroup_arithmetic_uses_shared_memory_reductions(profile_runs, name, vulkan_device):
        s = check_run(profile_runs, name)
        assert not s["any_subgroup"], f"{name}: a dispatch used subgroup reductions"
        if name == "no_subgroup_env":  # reported as a device without them would report: what is planned for
            assert s["device"]["subgroup_ops"] == [] and not s["device"]["subgroup_compute"], s["device"]
            assert s["device"]["subgroup_size"] == vulkan_device["subgroup_size"]
        else:
            assert s["device"]["subgroup_ops"] == vulkan_device["subgroup_ops"]  # a per-call choice: the device has them

    def test_subgroup_sizes_the_device_allows(profile_runs, vulkan_device):
        """Each size the device lets a compute pipeline require runs the parity set with subgroup reductions.

        lavapipe: VK_EXT_subgroup_size_control is there (core 1.3) but min = max = 8, so no size other than its
        default can be chosen; the run with 8 still exercises the required-size pipelines (validated), and
        every other size is refused with the device's range.
        """
        sizes = profile_runs["sizes"]
        if sizes is None:
            missing("the device cannot require a subgroup size (no subgroup size control; lavapipe can)")
        lo, hi = sizes
        default = profile_runs["default_subgroup_size"]
        assert lo <= default <= hi
        if "llvmpipe" in vulkan_device["name"].lower():
            assert (lo, hi) == (default, default), "lavapipe's subgroup size used to be fixed: update the docstring"
        ran = [k for k in profile_runs["runs"] if k.startswith("subgroup_size_")]
        assert ran
        for name in ran:
            s = check_run(profile_runs, name)
            n = int(name.rsplit("_", 1)[1])
            assert s["device"]["subgroup_size"] == n
            assert s["any_subgroup"], f"{name}: no dispatch used subgroup reductions"
            # a workgroup holds at most maxComputeWorkgroupSubgroups subgroups of a required size: the context
            # reports (and plans for) no wider workgroups (lavapipe: 32 subgroups, 256 of its 1024 at 8 wide)
            assert s["device"]["max_workgroup_invocations"] <= vulkan_device["max_workgroup_invocations"]
            assert s["max_wg"] <= s["device"]["max_workgroup_invocations"]
            if "llvmpipe" in vulkan_device["name"].lower():
                assert s["device"]["max_workgroup_invocations"] == min(n * 32, vulkan_device["max_workgroup_invocations"])
        # a size outside the range is refused at device creation, naming the range
        proc = run_profile({"VKNORM_SUBGROUP_SIZE": str(2 * hi)}, timeout=120)
        assert proc.returncode != 0 and f"subgroups of {lo} to {hi}" in proc.stderr, proc.stderr[-2000:]

    def test_shaders_never_assume_a_subgroup_size():
        """Shaders take the subgroup size from gl_SubgroupSize only: no literal 8/16/32/64/128 anywhere."""
        offenders = []
        for name in sorted(os.listdir(SHADERS)):
            with open(os.path.join(SHADERS, name)) as f:
                for i, line in enumerate(f, 1):
                    code = re.sub(r"constant_id\s*=\s*[0-9]+", "", line.split("//", 1)[0])  # ids are no sizes
                    code = re.sub(r"^\s*#define ACT_\w+ [0-9]+u", "", code)  # nor are the activation ids
                    if re.search(r"\b(8|16|32|64|128)u?\b", code):
                        offenders.append(f"{name}:{i}: {line.strip()}")
        assert not offenders, "\n".join(offenders)

    @pytest.mark.parametrize("name,cap", [("shared_16k", 16384), ("shared_512", 512)])
    def test_max_shared_memory_cap(profile_runs, name, cap):
        s = check_run(profile_runs, name)
        assert s["device"]["max_shared_memory"] == cap
        assert s["max_shared"] <= cap, f"{name}: a dispatch declared {s['max_shared']} B of shared memory"
        if cap == 512:  # binds on lavapipe (64-invocation workgroups): workgroups shrank
            assert max(s["wgs"]) <= 32 and min(s["wgs"]) <= 8, s["wgs"]

    def test_shared_memory_budget_matches_the_shaders():
        """The dispatcher budgets, per invocation, 16 B (fused, reduce) and 64 B (finalize, apply, which merges
        partials as finalize does, and the cooperative kernel), and besides that 32 B for the fused kernel (one
        slot of each plane weight, kFusedSharedFixed) and 64 B for the cooperative kernel
        (kCooperativeSharedFixed): the shaders' shared declarations must stay within that (dispatch.cpp)."""
        per = shared_bytes()
        budget = {"norm_fused": (16, 32), "norm_reduce": (16, 0), "norm_finalize": (64, 0), "norm_apply": (64, 0),
                  "norm_cooperative": (64, 64), "norm_clear": (16, 0), "copy": (0, 0)}
        assert set(per) == set(budget), per
        for shader, (per_invocation, fixed) in budget.items():
            assert per[shader][0] <= per_invocation and per[shader][1] <= fixed, (shader, per[shader])

    def test_the_shared_memory_count_sees_every_declaration(tmp_path):
        """The count itself: a scalar, a comma list and a fixed-size array are counted or refused, never skipped
        (a comma list of fixed arrays went uncounted once)."""
        (tmp_path / "a.comp").write_text("shared vec4 x[gl_WorkGroupSize.x];\nshared uint s, t; shared bool b;\n"
                                         "shared wfp g[PLANE_WEIGHT_SLOTS], h[PLANE_WEIGHT_SLOTS];\n"
                                         "// shared memory in a comment\n")
        assert shared_bytes(str(tmp_path)) == {"a": (16, 4 + 4 + 4 + 16 + 16)}
        (tmp_path / "a.comp").write_text("shared vec4 x[64];\n")
        with pytest.raises(AssertionError, match="a size unknown to this test"):
            shared_bytes(str(tmp_path))

    @pytest.mark.parametrize("name,cap", [("wg_128", 128), ("wg_16", 16), ("wg_8", 8)])
    def test_max_workgroup_invocations(profile_runs, name, cap):
        s = check_run(profile_runs, name, workgroup_cap=cap)
        assert s["max_wg"] <= cap, s["wgs"]
        if cap <= 16:
            assert s["wgs"] == [cap], s["wgs"]

    def test_no_16bit_storage_falls_back_to_float32_with_a_warning(profile_runs, vulkan_device):
        s = check_run(profile_runs, "no_fp16_storage")
        assert not s["device"]["storage_16bit"], s["device"]  # reported as planned for
        stderr = profile_runs["runs"]["no_fp16_storage"].stderr
        assert stderr.count(FP16_WARNING) == 1, f"expected the warning once on stderr, got:\n{stderr[-2000:]}"

    def test_vulkan_1_0_device(profile_runs):
        s = check_run(profile_runs, "vulkan_1_0")
        d = s["device"]
        assert d["api_version"].startswith("1.0."), d["api_version"]
        assert d["subgroup_size"] == 0 and d["subgroup_ops"] == [] and not d["storage_16bit"]
        assert not s["any_subgroup"]
        assert profile_runs["runs"]["vulkan_1_0"].stderr.count(FP16_WARNING) == 1

    def test_capability_knobs_refuse_bad_values():
        script = (
            "import os, vknorm\n"
            "for k, v in [('VKNORM_VULKAN_API', '2.0'), ('VKNORM_MAX_SHARED_MEMORY', '100'),"
            " ('VKNORM_MAX_SHARED_MEMORY', 'lots')]:\n"
            "    os.environ[k] = v\n"
            "    try:\n"
            "        vknorm.devices()\n"
            "        print('accepted', k, v)\n"
            "    except ValueError as e:\n"
            "        print('refused', k, v, '|', e)\n"
            "    del os.environ[k]\n")
        full = {k: v for k, v in os.environ.items() if k not in SCRUB}
        proc = subprocess.run([sys.executable, "-c", script], env=full, capture_output=True, text=True, timeout=120)
        lines = proc.stdout.splitlines()
        assert len(lines) == 3 and all(ln.startswith("refused") for ln in lines), proc.stdout + proc.stderr[-2000:]
        assert "expected 1.0, 1.1, 1.2 or 1.3" in lines[0] and "at least 256" in lines[1], lines

    @pytest.mark.parametrize("k,v,says", [
        ("VKNORM_COOPERATIVE_WORKGROUPS", "abc", "expected a whole number of workgroups"),
        ("VKNORM_COOPERATIVE_WORKGROUPS", "-3", "expected a whole number of workgroups"),
        ("VKNORM_DEVICE", "-1", "expected a device index 0 to"),
        ("VKNORM_DEVICE", "99", "expected a device index 0 to"),
    ])
    def test_planning_and_device_knobs_refuse_bad_values(k, v, says):
        """VKNORM_COOPERATIVE_WORKGROUPS is read when a forward is planned, VKNORM_DEVICE when the default device
        is picked: a value neither can read is a ValueError naming it and what it takes, never a silent 0."""
        script = ("import numpy as np, vknorm\n"
                  "try:\n"
                  "    vknorm.LayerNorm(affine_size=8, affine=False)(np.ones((2, 8), np.float32), device='vulkan',"
                  " option=vknorm.Option(path='cooperative'))\n"
                  "    print('accepted')\n"
                  "except ValueError as e:\n"
                  "    print('refused |', e)\n")
        full = {key: val for key, val in os.environ.items()
                if key not in SCRUB and key not in ("VKNORM_DEVICE", "VKNORM_COOPERATIVE_WORKGROUPS")}
        full[k] = v
        proc = subprocess.run([sys.executable, "-c", script], env=full, capture_output=True, text=True, timeout=120)
        out = proc.stdout.strip()
        assert out.startswith("refused") and f"{k}={v}" in out and says in out, out + proc.stderr[-2000:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run the parity set under the current environment (a capability "
                                 "profile) and print a summary.")
    ap.add_argument("--option", action="append", default=[], help="Option field=value (int or 0/1 for bools)")
    ap.add_argument("--every", type=int, default=1, help="every k-th ncnn case (default all; for quick looks)")
    ap.add_argument("--offset", type=int, default=0, help="with --every k: the cases whose index is offset mod k")
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = ap.parse_args(argv)
    fields = {}
    for kv in args.option:
        k, v = kv.split("=", 1)
        fields[k] = bool(int(v)) if k.startswith("use_") else int(v)
    summary = run_parity(fields, args.every, args.offset)
    if args.json:
        print(json.dumps(summary))
    else:
        d = summary["device"]
        print(f"{d['name']}: Vulkan {d['api_version']}, subgroup size {d['subgroup_size']}, "
              f"16-bit storage {d['storage_16bit']}, shared memory {d['max_shared_memory']} B")
        print(f"{summary['checked']} forwards over {summary['cases']} cases: {len(summary['failures'])} failure(s), "
              f"{summary['n_validation_messages']} validation message(s); workgroups {summary['wgs']}, "
              f"max shared {summary['max_shared']} B, subgroup reductions used: {summary['any_subgroup']}")
        for f in summary["failures"][:20] + summary["validation_messages"]:
            print("  " + f)
    return 1 if summary["failures"] or summary["n_validation_messages"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""tools/channel_ab.py, the A/B of dispatcher settings for GroupNorm/InstanceNorm: each setting's environment applies
to its own measurements only, every layer and storage gets a row with each setting's plan and time beside the
copy roof, outputs are compared with the first setting's, and bad arguments are one usage error (exit 2)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from availability import needs_vulkan
from reference import FP32_TOL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "channel_ab.py")
QUICK = ["--rounds", "2", "--reps", "100", "--batches", "1", "--warmup-ms", "1"]


def run_tool(*args, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "VKNORM_PATH" and not k.startswith("VKNORM_TUNE_")}
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=timeout, env=env)


@needs_vulkan
def test_each_setting_plans_and_times_its_own_runs(tmp_path):
    out = tmp_path / "ab.json"
    proc = run_tool("--setting", "auto:", "--setting", "split:VKNORM_PATH=split", "gn:64x8x8/4", "in:8x7x7",
                    "--dtype", "fp32", *QUICK, "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["layer"], r["dtype"]) for r in rows] == [("GroupNorm 64x8x8/4", "fp32"), ("InstanceNorm 8x7x7", "fp32")]
    for r in rows:  # plans as of the last round: auto's ran after split's first
        assert not r["plans"]["auto"].startswith("split") and r["plans"]["split"].startswith("split"), r
        assert r["copy_us"] > 0 and all(len(t) == 2 and min(t) > 0 for t in r["us"].values()), r
        assert r["max_abs_diff"] <= FP32_TOL, r  # the split path normalizes the same groups
    assert len(proc.stdout.splitlines()) == 2 and "split: " in proc.stdout


def test_bad_arguments_are_a_usage_error():
    for args in (["--setting", "nocolon", "gn:8x4x4/2"], ["--setting", "a:", "gn:8x4x4"], ["--setting", "a:", "in:8x4x4/2"],
                 ["--setting", "a:", "gn:6x4x4/4"], ["--setting", "a:", "--setting", "a:X=1", "in:8x4x4"],
                 ["--setting", "a:NOT_AN_ASSIGNMENT", "in:8x4x4"], ["--setting", "a:", "--rounds", "0", "in:8x4x4"],
                 ["--setting", "a:", "--reps", "-1", "in:8x4x4"]):
        proc = run_tool(*args, timeout=60)
        assert proc.returncode == 2 and "error:" in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)


@needs_vulkan
def test_what_the_tool_cannot_measure_as_asked_is_refused_before_any_timing(tmp_path):
    """A variable read when a context is made (VKNORM_NO_SUBGROUP) would be timed as the defaults under its name;
    float16 on a device without 16-bit storage would run as float32 labelled fp16; a value the runtime refuses, a
    warm-up that is no time and a --json that cannot be written would fail after the runs (a traceback): each is
    one usage error up front, exit 2."""
    cases = [
        (["--setting", "a:VKNORM_NO_SUBGROUP=1"], {}, "VKNORM_NO_SUBGROUP is not a knob the dispatcher reads per plan"),
        (["--setting", "a:VKNORM_PATH=bogus"], {}, "setting a: VKNORM_PATH=bogus: unknown path 'bogus'"),
        (["--setting", "a:", "--warmup-ms", "nan"], {}, "expected milliseconds from 0 to 60000"),
        (["--setting", "a:", "--json", str(tmp_path / "missing" / "ab.json")], {}, "no such directory"),
        (["--setting", "a:", "--dtype", "fp16"], {"VKNORM_NO_FP16_STORAGE": "1"}, "has no 16-bit storage"),
    ]
    for args, env, message in cases:
        proc = subprocess.run([sys.executable, TOOL, *args, "in:4x4x4", *QUICK[:-2]], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, **env))
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert proc.stdout == "", (args, proc.stdout)  # nothing was timed

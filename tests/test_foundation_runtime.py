"""Runtime: device enumeration and selection, `vknorm info`, VKNORM_DEVICE, no driver, on whatever devices
the machine has (lavapipe, a GPU, both).

The default Vulkan context is process-wide, so everything that depends on environment variables read
at start-up (VKNORM_DEVICE, VK_ICD_FILENAMES / VK_DRIVER_FILES) runs in a subprocess.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import vknorm
from availability import has_graph, needs_graph, requirement
from vknorm import _core

REPO = Path(__file__).resolve().parent.parent
# The loader's own reports of the missing driver reach the debug messenger: expected here (tests/child_site).
NO_DRIVER_ENV = {"VK_ICD_FILENAMES": "/nonexistent.json", "VK_DRIVER_FILES": "/nonexistent.json",
                 "VKNORM_TESTS_EXPECT_VALIDATION_MESSAGES": "1"}
INFO_FIELDS = {
    "name": str, "type": str, "driver_name": str, "driver_info": str, "api_version": str, "subgroup_size": int,
    "subgroup_ops": list, "storage_16bit": bool, "float16_arithmetic": bool, "max_shared_memory": int,
    "max_workgroup_invocations": int, "timestamp_period_ns": float,
}

# what a switch (VKNORM_VALIDATION, VKNORM_NO_SUBGROUP, ...) set to another word is refused with
SWITCH_WORDS = "expected 1, true, on or yes (on), or 0, false, off, no or nothing (off)"


def vknorm_cli() -> list:
    """The installed console script (next to this interpreter), else `python -m vknorm`."""
    script = Path(sys.executable).with_name("vknorm")
    if script.exists():
        return [str(script)]
    found = shutil.which("vknorm")
    return [found] if found else [sys.executable, "-m", "vknorm"]


def run(cmd, env_extra=None, timeout=120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.setdefault("VKNORM_VALIDATION", "1")
    env.update(env_extra or {})
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def run_python(code: str, env_extra=None) -> subprocess.CompletedProcess:
    return run([sys.executable, "-c", textwrap.dedent(code)], env_extra)


def json_tail(proc: subprocess.CompletedProcess) -> dict:
    """The last stdout line of a helper script, as JSON (drivers may print their own lines first)."""
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return json.loads(lines[-1])


# ------------------------------------------------------------------------------ enumeration

DEVICE_TYPES = {"discrete", "integrated", "virtual", "cpu", "other"}
LAVAPIPE_ICDS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")


def test_device_enumeration_lists_what_the_vulkan_loader_offers():
    """vknorm enumerates every device the loader offers, in the loader's order: the same list ncnn (another
    Vulkan client in a process of its own) sees, where vknorm was built with ncnn."""
    devs = vknorm.devices()
    assert devs, "no Vulkan device enumerated"
    assert [d["index"] for d in devs] == list(range(len(devs)))
    assert all(d["type"] in DEVICE_TYPES and d["name"] for d in devs), devs
    if has_graph():
        proc = run_python("""
            import json
            from vknorm import graph
            print(json.dumps([graph.gpu_name(i) for i in range(graph.gpu_count())]))
        """)
        assert json_tail(proc) == [d["name"] for d in devs]


def lavapipe_icd_offered() -> bool:
    """Mesa's lavapipe ICD is installed and the environment does not narrow the loader to other drivers."""
    if any(os.environ.get(k) for k in ("VK_ICD_FILENAMES", "VK_DRIVER_FILES")):
        return False
    return any(f.startswith("lvp_icd") for d in LAVAPIPE_ICDS if os.path.isdir(d) for f in os.listdir(d))


@requirement(lavapipe_icd_offered(), "needs Mesa's lavapipe ICD offered to the loader")
def test_lavapipe_is_enumerated_as_a_cpu_device_where_its_driver_is_installed():
    lava = [d for d in vknorm.devices() if "llvmpipe" in d["name"].lower()]
    assert lava, f"lavapipe (llvmpipe) not among {[d['name'] for d in vknorm.devices()]}"
    assert all(d["type"] == "cpu" for d in lava)


def test_device_info_reports_what_vknorm_info_promises():
    for d in vknorm.devices():
        for key, typ in INFO_FIELDS.items():
            assert key in d, f"device dict lacks {key}"
            assert isinstance(d[key], typ), f"{key}={d[key]!r} is not {typ.__name__}"
        assert d["subgroup_size"] >= 1 and d["max_workgroup_invocations"] >= 128
        assert d["max_shared_memory"] >= 16384


def test_default_device_prefers_discrete_then_integrated_then_virtual_then_cpu():
    rank = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3}
    devs = vknorm.devices()
    best = min(rank.get(d["type"], 4) for d in devs)
    if "VKNORM_DEVICE" in os.environ:
        pytest.skip("VKNORM_DEVICE overrides the default device")
    default = vknorm.device_info()
    assert default["index"] == _core.default_device_index()
    assert rank.get(default["type"], 4) == best


def test_validation_layer_is_enabled_for_the_suite():
    assert _core.validation_enabled(), "tests must run with VKNORM_VALIDATION=1 (conftest sets it)"


def test_the_layer_hides_no_structure_chain_error_on_a_cpu_device_no_newer_than_it():
    """The notices of a layer older than what it validates (unknown structures in a pNext chain) share their VUIDs
    with real errors in vknorm's own chains: the suite filters them only where they can come (a GPU driver, or a
    device newer than the layer), not on lavapipe under Debian's layer (1.3.230 against 1.3.239)."""
    import validation_layer

    with open(os.path.join(os.environ["VK_LAYER_SETTINGS_PATH"], "vk_layer_settings.txt")) as f:
        settings = f.read()
    layer = validation_layer.layer_api_version()
    assert layer is not None, "make setup installs the validation layer"
    expected = any(d["type"] != "cpu" or tuple(int(p) for p in d["api_version"].split(".")) > layer
                   for d in vknorm.devices())
    assert ("message_id_filter" in settings) is expected, (layer, vknorm.devices(), settings)


# ------------------------------------------------------------------------------ vknorm info

def test_vknorm_info_json_lists_every_enumerated_device():
    proc = run(vknorm_cli() + ["info", "--json"])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert isinstance(data["devices"], list) and data["devices"]
    assert 0 <= data["default"] < len(data["devices"])
    for d in data["devices"]:
        for key, typ in INFO_FIELDS.items():
            assert isinstance(d[key], typ if typ is not float else (int, float)), f"{key} in {d}"
    assert [d["name"] for d in data["devices"]] == [d["name"] for d in vknorm.devices()]


@needs_graph
def test_vknorm_info_names_the_device_ncnns_nets_run_on():
    """vknorm's layers and ncnn's nets pick their default devices by their own rules: info shows both."""
    from vknorm import graph

    proc = run(vknorm_cli() + ["info", "--json"])
    assert proc.returncode == 0, proc.stderr
    ncnn = json.loads(proc.stdout)["ncnn"]
    assert ncnn["default"] == graph.get_default_gpu_index()
    assert [d["device_name"] for d in ncnn["devices"]] == [graph.gpu_name(i) for i in range(graph.get_gpu_count())]
    assert all(len(bytes.fromhex(d["pipeline_cache_uuid"])) == 16 for d in ncnn["devices"])
    text = run(vknorm_cli() + ["info"])
    assert text.returncode == 0 and not text.stderr.strip(), text.stderr  # ncnn's banner kept off the terminal
    assert f"run on ncnn's [{ncnn['default']}] {graph.gpu_name(ncnn['default'])}" in text.stdout, text.stdout


def test_vknorm_info_prints_one_block_per_device_with_every_capability():
    proc = run(vknorm_cli() + ["info"])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for d in vknorm.devices():
        assert d["name"] in out
    for label in ("driver", "Vulkan API", "subgroup size", "subgroup ops", "16-bit storage", "float16 arithmetic",
                  "max shared memory", "max workgroup invocations", "timestamp period"):
        assert label in out, f"`vknorm info` lacks {label!r}:\n{out}"


def test_vknorm_info_lists_the_vknorm_variables_set_and_names_a_misspelled_one():
    """A misspelled setting is otherwise ignored without a word: info lists every VKNORM_ variable set (in any case),
    says which the runtime does not read, and names the setting or knob it was likely meant to be, never one of the
    opposite meaning (NO_); exit 0: a warning."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("VKNORM_")}
    env.update(VKNORM_VALIDATION="1", VKNORM_VALIDATON="1", VKNORM_BUFER_CACHE_BYTES="0", VKNORM_TUNE_WORKGROUP="64",
               VKNORM_TUNE_WORKGRUOP="32", VKNORM_FENCE_SPIN_US="5", VKNORM_SOMETHING="x", vknorm_device="0",
               VKNORM_FP16_STORAGE="1")
    proc = subprocess.run(vknorm_cli() + ["info"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("VKNORM_ variables set:\n")[1].splitlines()
    assert lines == [
        "  VKNORM_BUFER_CACHE_BYTES=0  not read by vknorm at run time (meant VKNORM_BUFFER_CACHE_BYTES?)",
        "  VKNORM_FENCE_SPIN_US=5  how long a submission's fence is polled before blocking on it",
        "  VKNORM_FP16_STORAGE=1  not read by vknorm at run time",
        "  VKNORM_SOMETHING=x  not read by vknorm at run time",
        "  VKNORM_TUNE_WORKGROUP=64  a tuning knob (docs/benchmarks)",
        "  VKNORM_TUNE_WORKGRUOP=32  not read by vknorm at run time (meant VKNORM_TUNE_WORKGROUP?)",
        "  VKNORM_VALIDATION=1  Khronos validation layer on (1)",
        "  VKNORM_VALIDATON=1  not read by vknorm at run time (meant VKNORM_VALIDATION?)",
        "  vknorm_device=0  not read by vknorm at run time (meant VKNORM_DEVICE?)",
    ], proc.stdout
    proc = subprocess.run(vknorm_cli() + ["info", "--json"], capture_output=True, text=True, timeout=120, env=env)
    data = json.loads(proc.stdout)
    assert data["settings"]["VKNORM_FENCE_SPIN_US"] == "5" and len(data["settings"]) == 9
    assert data["unknown_settings"] == [{"name": "VKNORM_BUFER_CACHE_BYTES", "meant": "VKNORM_BUFFER_CACHE_BYTES"},
                                        {"name": "VKNORM_FP16_STORAGE", "meant": None},
                                        {"name": "VKNORM_SOMETHING", "meant": None},
                                        {"name": "VKNORM_TUNE_WORKGRUOP", "meant": "VKNORM_TUNE_WORKGROUP"},
                                        {"name": "VKNORM_VALIDATON", "meant": "VKNORM_VALIDATION"},
                                        {"name": "vknorm_device", "meant": "VKNORM_DEVICE"}]
    clean = {k: v for k, v in env.items() if not k.upper().startswith("VKNORM_")}
    proc = subprocess.run(vknorm_cli() + ["info"], capture_output=True, text=True, timeout=120, env=clean)
    assert "VKNORM_ variables set" not in proc.stdout  # nothing set, nothing said


def test_vknorm_info_says_a_switch_set_to_off_is_off():
    """VKNORM_NO_SUBGROUP=0 is set but off: listed as off, not as the profile it would turn on (the device table
    above it still shows the subgroup operations)."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("VKNORM_")}
    env.update(VKNORM_NO_SUBGROUP="0", VKNORM_NO_FP16_STORAGE="", VKNORM_VALIDATION="yes")
    proc = subprocess.run(vknorm_cli() + ["info"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("VKNORM_ variables set:\n")[1].splitlines() == [
        "  VKNORM_NO_FP16_STORAGE=  off (capability profile: no 16-bit storage, when on)",
        "  VKNORM_NO_SUBGROUP=0  off (capability profile: no subgroup operations, when on)",
        "  VKNORM_VALIDATION=yes  Khronos validation layer on (1)",
    ], proc.stdout


BAD_SETTINGS = [("VKNORM_PATH", "bogus", "unknown path 'bogus'"),
                ("VKNORM_FENCE_SPIN_US", "abc", "a whole number of microseconds"),
                ("VKNORM_BUFFER_CACHE_BYTES", "x", "a whole number of bytes"),
                ("VKNORM_PIPELINE_CACHE_COUNT", "-1", "a whole number of pipelines"),
                ("VKNORM_COOPERATIVE_WORKGROUPS", "abc", "a whole number of workgroups"),
                ("VKNORM_MAX_DEVICE_BYTES", "-5", "a positive integer"),
                ("VKNORM_MAX_BUFFER_BYTES", "0", "a positive integer"),
                ("VKNORM_SUBGROUP_SIZE", "1.5", "a positive integer"),
                ("VKNORM_SUBGROUP_SIZE", "3", "the device"),  # no device runs 3: its context says why (its range)
                ("VKNORM_MAX_SHARED_MEMORY", "12", "at least 256 bytes"),
                ("VKNORM_VULKAN_API", "2.0", "expected 1.0, 1.1, 1.2 or 1.3"),
                ("VKNORM_TUNE_CONVERSION_THREADS", "abc", "a whole number of threads"),
                ("VKNORM_TUNE_WORKGROUP", "8x", "a whole number (a tuning knob"),  # atoi had read 8
                ("VKNORM_TUNE_HOLD_STORAGE", "off", "a whole number (a tuning knob"),  # ... and 0 (knobs take numbers)
                ("VKNORM_NO_SUBGROUP", "maybe", SWITCH_WORDS),  # switches: no word guessed at
                ("VKNORM_NO_FP16_STORAGE", "enabled", SWITCH_WORDS)]


@pytest.mark.parametrize("name,value,words", BAD_SETTINGS, ids=[f"{b[0]}={b[1]}" for b in BAD_SETTINGS])
def test_vknorm_info_names_a_setting_the_runtime_would_refuse_then_exits_2_with_one_line(name, value, words):
    """info is where a user checks their settings: a value the runtime refuses (when a context, plan or forward
    reads it) is marked on its line, listed in the JSON's refused_settings, and the run ends as every command's
    does with it: one line, exit 2. A layer's forward refuses the same value with the same message."""
    proc = run(vknorm_cli() + ["info"], {name: value})
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert err[0].startswith(f"vknorm info: error: {name}={value}") and words in err[0], err
    assert f"  {name}={value}  refused: " in proc.stdout and words in proc.stdout.split("refused: ")[1], proc.stdout
    proc = run(vknorm_cli() + ["info", "--json"], {name: value})
    refused = json.loads(proc.stdout)["refused_settings"]
    assert proc.returncode == 2 and [r["name"] for r in refused] == [name] and words in refused[0]["error"], refused
    forward = run_python("""
        import numpy as np, vknorm
        try:
            vknorm.LayerNorm(64, 1e-5, affine=False)(np.ones((4, 64), np.float32), device="vulkan")
            print("ran")
        except ValueError as e:
            print(e)
    """, {name: value})
    assert forward.stdout.strip().endswith(refused[0]["error"]), (forward.stdout, forward.stderr[-2000:])


@pytest.mark.parametrize("value, on", [("false", False), ("OFF", False), ("no", False), ("0", False),
                                       ("true", True), ("On", True), ("yes", True), ("1", True)])
def test_a_switch_reads_the_words_people_write_for_on_and_off(value, on):
    """VKNORM_NO_FP16_STORAGE=false had switched 16-bit storage off: anything but "" or "0" read as on."""
    def storage_16bit(setting):
        proc = run(vknorm_cli() + ["info"], {"VKNORM_NO_FP16_STORAGE": setting})
        assert proc.returncode == 0, proc.stderr
        return next(ln for ln in proc.stdout.splitlines() if "16-bit storage" in ln).split()[-1]

    assert storage_16bit(value) == ("no" if on else storage_16bit(""))  # off: what the device itself reports


def test_the_package_switches_are_refused_as_the_runtimes_are():
    """The CLI's own switches (VKNORM_CHECK_INPROCESS, VKNORM_BENCH_INPROCESS) take the same words: another value is
    marked by info and refused by the command that reads it, one line and exit 2."""
    proc = run(vknorm_cli() + ["info", "--json"], {"VKNORM_CHECK_INPROCESS": "sometimes"})
    refused = json.loads(proc.stdout)["refused_settings"]
    refused_switch = f"VKNORM_CHECK_INPROCESS=sometimes: {SWITCH_WORDS}"
    assert proc.returncode == 2 and refused == [{"name": "VKNORM_CHECK_INPROCESS", "error": refused_switch}]
    proc = run(vknorm_cli() + ["check", "tests/data/layernorm_2d.ncnn.param", "tests/data/layernorm_2d.ncnn.bin",
                               "--input", "in0=8x6x10"], {"VKNORM_CHECK_INPROCESS": "sometimes"})
    assert proc.returncode == 2 and proc.stderr.strip() == f"vknorm check: error: {refused_switch}", proc.stderr


def test_vknorm_info_names_every_refused_setting_at_once():
    proc = run(vknorm_cli() + ["info", "--json"], {n: v for n, v, _ in BAD_SETTINGS[:3]})
    assert sorted(r["name"] for r in json.loads(proc.stdout)["refused_settings"]) == sorted(
        n for n, _, _ in BAD_SETTINGS[:3])
    assert proc.returncode == 2 and proc.stderr.strip().endswith("(and 2 more, listed above)"), proc.stderr


def test_every_variable_the_runtime_reads_is_a_known_setting_or_knob_and_every_known_one_is_read():
    """The lists info checks against (vknorm.settings) are the code's: the names read through getenv and vknorm's
    env helpers (C++) and os.environ / fork_is_safe (Python) are exactly RUNTIME_SETTINGS and TUNING_KNOBS, and no
    other VKNORM_ name is quoted in the runtime's sources (one read some other way would be)."""
    import re

    from vknorm import settings

    sources = [p for d in ("src", "include", "python") for p in (REPO / d).rglob("*")
               if p.suffix in (".cpp", ".cc", ".c", ".h", ".hpp", ".py") and p.name != "settings.py"]
    text = "\n".join(p.read_text() for p in sources)
    read = set(re.findall(r'(?:getenv|env_count|env_flag|env_positive|environ\.get|environ\[|fork_is_safe|tune)'
                          r'\(?\s*"(VKNORM_[A-Z0-9_]+)"', text))
    assert {n for n in read if not n.startswith(settings.TUNING_PREFIX)} == set(settings.RUNTIME_SETTINGS)
    assert {n for n in read if n.startswith(settings.TUNING_PREFIX)} == settings.TUNING_KNOBS
    quoted = set(re.findall(r"[\"'](VKNORM_[A-Z0-9_]+)", text)) - {settings.TUNING_PREFIX}
    assert quoted <= read, quoted - read


def test_vknorm_info_into_a_pipe_its_reader_closed_stops_quietly():
    """`vknorm info | head -3`: the reader goes away early; no traceback, the shell's 141 for SIGPIPE."""
    r, w = os.pipe()
    os.close(r)  # the reader has gone before vknorm writes
    try:
        proc = subprocess.run(vknorm_cli() + ["info"], stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    assert proc.returncode == 141 and "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("args", [["info"], ["info", "--json"], ["demo"], ["--help"]],
                         ids=["info", "info-json", "demo", "help"])
def test_standard_output_held_in_pythons_buffer_fails_inside_main_not_at_exit(args):
    """As users run it (PYTHONUNBUFFERED unset), a report small enough for Python's buffer is written when the
    process exits, after main() returned: a reader that left or a full disk then printed "Exception ignored ...
    BrokenPipeError" and exit 120. main() flushes it itself: 141 and nothing said for a reader that left; one
    line naming standard output and exit 2 for a full disk."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run(vknorm_cli() + args, stdout=w, stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    finally:
        os.close(w)
    assert proc.returncode == 141, (proc.returncode, proc.stderr[-2000:])
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(vknorm_cli() + args, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
                              env=env)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    prog = "vknorm" if args == ["--help"] else f"vknorm {args[0]}"
    assert proc.stderr.splitlines() == [f"{prog}: error: writing standard output: No space left on device"]


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
@pytest.mark.parametrize("args", [["--help"], ["check", "--help"], ["bench", "-h"]], ids=["vknorm", "check", "bench"])
def test_help_onto_a_full_disk_is_one_line_and_exit_2(args, unbuffered):
    """argparse drops a help text it fails to write: with standard output unbuffered (PYTHONUNBUFFERED=1, as in
    many containers), --help onto a full disk exited 0 having written nothing."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run(vknorm_cli() + args, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
                              env=dict(os.environ, PYTHONUNBUFFERED=unbuffered))
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.splitlines() == ["vknorm: error: writing standard output: No space left on device"]


def test_an_error_exit_with_a_report_half_printed_keeps_its_one_line_and_its_status():
    """bench prints its table, then fails to write its --json (a full disk): the error line and exit 2 stand, and
    the table still in Python's buffer, for a reader that has left, goes nowhere rather than into "Exception
    ignored" and exit 120 at exit."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    r, w = os.pipe()
    os.close(r)
    try:
        args = ["bench", "--rows", "4", "--cols", "64", "--dtype", "fp32", "--compare", "", "--reps", "100",
                "--batches", "1", "--warmup-ms", "0", "--json", "/dev/full"]
        proc = subprocess.run(vknorm_cli() + args, stdout=w, stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    finally:
        os.close(w)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.splitlines() == ["vknorm bench: error: --json /dev/full: No space left on device"], proc.stderr


def test_sigterm_runs_the_commands_clean_up_then_exits_as_the_signal_would(monkeypatch):
    """SIGTERM or SIGHUP (a terminal closed, a service stopped) raise inside the command, so that what it cleans up in
    `finally` (optimize's temporary files, bench's, a worker process) is cleaned up; the exit status is then 128 +
    the signal's number, and main() leaves the handlers as it found them."""
    import signal
    import time

    from vknorm import cli

    for sig in (signal.SIGTERM, signal.SIGHUP):
        assert signal.getsignal(sig) == signal.SIG_DFL, "the test process must not handle the signal itself"
        cleaned = []

        def work(args, sig=sig):
            try:
                os.kill(os.getpid(), sig)
                time.sleep(30)  # the handler raises here
            finally:
                cleaned.append(sig)

        monkeypatch.setattr(cli, "_demo", work)  # build_parser takes _demo as the demo command's func
        with pytest.raises(SystemExit) as e:
            cli.main(["demo"])
        assert e.value.code == 128 + sig and cleaned == [sig], (e.value.code, cleaned)
        assert signal.getsignal(sig) == signal.SIG_DFL


@pytest.mark.parametrize("args", [["info"], ["info", "--json"]], ids=["text", "json"])
def test_vknorm_info_onto_a_full_disk_is_one_line_naming_standard_output(args):
    with open("/dev/full", "w") as full:
        proc = subprocess.run(vknorm_cli() + args, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0] == "vknorm info: error: writing standard output: No space left on device", lines


@pytest.mark.parametrize("args", [["info"], ["check", "nope.param", "nope.bin"], ["optimize", "a.param", "a.bin",
                                                                                  "b.param", "b.bin"]],
                         ids=["info", "check", "optimize"])
def test_a_closed_standard_output_is_one_line_and_exit_2_before_any_work(args):
    """`vknorm check ... >&-`: Python starts with sys.stdout None; the report has nowhere to go, so the command
    refuses at once (it ended in a traceback and exit 1, check's "a layer failed", after all the work)."""
    proc = subprocess.run(vknorm_cli() + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=120, preexec_fn=lambda: os.close(1))
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"vknorm {args[0]}: error: standard output is closed: nowhere to write the report"], proc.stderr[-2000:]
    quiet = subprocess.run(vknorm_cli() + args, capture_output=True, timeout=120, preexec_fn=lambda: os.close(2))
    assert quiet.returncode == 2 and quiet.stdout == b"", quiet.stdout[-2000:]


@pytest.mark.parametrize("args, line", [
    (["info", "--bogus"], "vknorm info: error: unrecognized arguments: --bogus (see vknorm info --help)"),
    (["--bogus", "info"], "vknorm: error: unrecognized arguments: --bogus (see vknorm --help)"),
    # without a command: the flag named, and the commands, not only that the command is missing
    (["--bogus"], "vknorm: error: unrecognized arguments: --bogus; commands: info, demo, check, bench, optimize "
                  "(see vknorm --help)"),
    (["nosuch"], "vknorm: error: argument command: invalid choice: 'nosuch'"),
    # a misspelt command with flags after it: the command is what is wrong
    (["chek", "m.param", "m.bin", "--input", "in0=64"], "vknorm: error: argument command: invalid choice: 'chek'"),
])
def test_usage_errors_are_one_line_from_the_parser_they_were_given_to(args, line):
    proc = subprocess.run(vknorm_cli() + args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), proc.stderr




@pytest.mark.parametrize("args", [["-h"], ["--help"], ["--he"], ["-h", "--bogus"]])
def test_help_and_its_abbreviations_print_the_usage_even_beside_an_unknown_flag(args):
    proc = subprocess.run(vknorm_cli() + args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: vknorm") and proc.stderr == "", proc

def test_a_file_name_with_a_line_break_stays_one_error_line(tmp_path):
    """A file's name may hold a line break; the error naming it is still the one line tools read (the break
    written as \\n), from the commands' own checks and from argparse's alike."""
    param = tmp_path / "two\nlines.param"
    param.write_text("7767517\n2 2\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 out0 0=64 1=1e-5 2=0\n")
    for args, line in ((["check", str(param), str(param), "--input", "in0=64"],
                        f"vknorm check: error: {tmp_path}/two\\nlines.param: the weights .bin is the model .param "
                        "itself"),
                       (["info", "--x\ny"], "vknorm info: error: unrecognized arguments: --x\\ny (see"),
                       (["info", "--x\u2028y\x1cz"], "vknorm info: error: unrecognized arguments: --x\\u2028y\\x1cz")):
        proc = subprocess.run(vknorm_cli() + args, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout)
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(line), proc.stderr  # Python's lines

def test_python_m_vknorm_runs_the_same_cli():
    proc = run([sys.executable, "-m", "vknorm", "info", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["devices"]


def test_vknorm_demo_prints_a_layernorm_against_the_cpu_reference():
    proc = run(vknorm_cli() + ["demo"])
    assert proc.returncode == 0, proc.stderr
    assert "LayerNorm" in proc.stdout
    # the kernel's shape, and whether its reductions used subgroup operations (a "subgroup" team may not)
    assert any(f"({r} reductions)" in proc.stdout for r in ("subgroup", "shared-memory")), proc.stdout
    line = [ln for ln in proc.stdout.splitlines() if "cpu reference" in ln]
    assert line, proc.stdout
    assert float(line[-1].rsplit("=", 1)[1]) < 1e-4


# ------------------------------------------------------------------------------ VKNORM_DEVICE

PICK_SCRIPT = """
    import json, numpy as np, vknorm
    from vknorm import _core
    info = vknorm.device_info()
    ln = vknorm.LayerNorm(8, 1e-5, affine=False)
    y = ln(np.arange(16, dtype=np.float32).reshape(2, 8), device="vulkan")
    print(json.dumps({"index": info["index"], "name": info["name"], "ok": bool(np.isfinite(y).all()),
                      "validation": _core.validation_messages()}))
"""


def device_pick(kind: str):
    """(VKNORM_DEVICE value, index it must pick) for a kind of value, from the devices this machine has:
    an index, the last device's full name, the same upper-cased, a lower-cased piece of it. A name picks the
    first device whose name contains it, ignoring case."""
    devs = vknorm.devices()
    last = devs[-1]
    value = {"first_index": "0", "last_index": str(last["index"]), "full_name": last["name"],
             "name_upper": last["name"].upper(), "name_piece": last["name"].split()[0][:4].lower(),
             # surrounding white space is ignored, before and after alike
             "index_spaced": f" {last['index']} ", "index_trailing_space": f"{last['index']} ",
             "name_spaced": f"  {last['name'].split()[0]}\t"}[kind]
    if value.strip().isdigit():
        return value, int(value)
    return value, next(d["index"] for d in devs if value.strip().lower() in d["name"].lower())


@pytest.mark.parametrize("kind", ["first_index", "last_index", "full_name", "name_upper", "name_piece",
                                  "index_spaced", "index_trailing_space", "name_spaced"])
def test_vknorm_device_picks_by_index_or_name_substring(kind):
    value, want = device_pick(kind)
    res = json_tail(run_python(PICK_SCRIPT, {"VKNORM_DEVICE": value}))
    assert res["index"] == want and res["ok"], (value, res)
    assert res["validation"] == []


BAD_DEVICE_SCRIPT = """
    import json, numpy as np, vknorm
    out = {}
    for what, call in (("device_info", lambda: vknorm.device_info()),
                       ("forward", lambda: vknorm.LayerNorm(4, affine=False)(np.ones((1, 4), np.float32), device="vulkan"))):
        try:
            call()
            out[what] = None
        except Exception as e:
            out[what] = [type(e).__name__, str(e)]
    print(json.dumps(out))
"""


@pytest.mark.parametrize("value", ["99", "no-such-gpu"])
def test_bad_vknorm_device_gives_a_clear_python_error(value):
    res = json_tail(run_python(BAD_DEVICE_SCRIPT, {"VKNORM_DEVICE": value}))
    for what in ("device_info", "forward"):
        assert res[what] is not None, f"{what} with VKNORM_DEVICE={value} did not raise"
        kind, msg = res[what]
        assert kind in ("ValueError", "VulkanUnavailableError", "RuntimeError", "LookupError", "IndexError"), res
        assert "VKNORM_DEVICE" in msg and value in msg, f"unclear message: {msg!r}"


@pytest.mark.parametrize("value", ["99", "no-such-gpu"])
@pytest.mark.parametrize("json_out", [False, True], ids=["table", "json"])
def test_vknorm_info_with_bad_vknorm_device_lists_the_devices_then_exits_2_with_one_line(value, json_out):
    """The error says `vknorm info` lists the devices: so it does, with no default marked, and then fails as
    every command does with a VKNORM_DEVICE that names none (one line, exit 2, no traceback)."""
    proc = run(vknorm_cli() + ["info"] + (["--json"] if json_out else []), {"VKNORM_DEVICE": value})
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, f"exit {proc.returncode}, stderr:\n{proc.stderr}"
    assert len(err) == 1 and "VKNORM_DEVICE" in err[0] and "vknorm info lists them" in err[0], proc.stderr
    assert "Traceback" not in proc.stderr
    if json_out:
        data = json.loads(proc.stdout)
        assert data["default"] is None
        assert [d["name"] for d in data["devices"]] == [d["name"] for d in vknorm.devices()]
    else:
        for d in vknorm.devices():
            assert f"  [{d['index']}] {d['name']}" in proc.stdout, proc.stdout
        assert "* [" not in proc.stdout, "a default marked although VKNORM_DEVICE picks none"


# ------------------------------------------------------------------------------ no Vulkan driver

NO_DRIVER_SCRIPT = """
    import json, numpy as np, vknorm
    out = {"is_runtime_error": issubclass(vknorm.VulkanUnavailableError, RuntimeError)}
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    ln = vknorm.LayerNorm(4, 1e-5, affine=False)
    for what, call in (("devices", vknorm.devices),
                       ("device_info", vknorm.device_info),
                       ("forward_vulkan", lambda: ln(x, device="vulkan")),
                       ("to_device", lambda: vknorm.to_device(x)),
                       ("bad_index", lambda: vknorm._core.Context.create(-2))):
        try:
            r = call()
            out[what] = ["returned", repr(r)]
        except vknorm.VulkanUnavailableError as e:
            out[what] = ["VulkanUnavailableError", str(e)]
        except Exception as e:
            out[what] = [type(e).__name__, str(e)]
    # With no device, the default device is the CPU reference.
    y = ln(x)
    out["default_forward_is_cpu"] = bool(np.array_equal(y, ln(x, device="cpu")))
    print(json.dumps(out))
"""


def test_no_vulkan_driver_raises_vulkan_unavailable_naming_what_to_install():
    res = json_tail(run_python(NO_DRIVER_SCRIPT, NO_DRIVER_ENV))
    assert res["is_runtime_error"]
    for what in ("forward_vulkan", "to_device", "device_info"):
        kind, msg = res[what]
        assert kind == "VulkanUnavailableError", f"{what}: {res[what]}"
        assert "mesa-vulkan-drivers" in msg, f"{what}: message does not say what to install: {msg!r}"
    # devices() may raise the same error or report an empty list, nothing else.
    kind, msg = res["devices"]
    assert (kind == "VulkanUnavailableError" and "mesa-vulkan-drivers" in msg) or (kind == "returned" and msg == "[]")
    assert res["default_forward_is_cpu"]
    # a device index that is no index is the caller's error with or without Vulkan
    assert res["bad_index"] == ["ValueError", "device index -2: a device index >= 0, or -1 for the default"], res


@pytest.mark.parametrize("args", [["info"], ["info", "--json"]], ids=["table", "json"])
def test_vknorm_info_without_driver_exits_2_with_one_line(args):
    proc = run(vknorm_cli() + args, NO_DRIVER_ENV)
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr}"
    assert len(err) == 1, f"expected one line on stderr, got:\n{proc.stderr}"
    assert "mesa-vulkan-drivers" in err[0]
    assert proc.stdout.strip() == ""


def test_a_command_interrupted_by_ctrl_c_exits_130_without_a_traceback(monkeypatch, capsys):
    """Ctrl-C during any command: main() returns the shell's 130 for SIGINT and prints nothing (no traceback,
    no error line), as for a reader that left (141)."""
    from vknorm import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_demo", interrupted)  # build_parser takes _demo as the demo command's func
    try:
        rc = cli.main(["demo"])
    except KeyboardInterrupt:  # escaping main() would end the test session, not this test
        rc = "KeyboardInterrupt escaped main()"
    assert rc == 130
    out, err = capsys.readouterr()
    assert out == "" and err == "", (out, err)

"""`vknorm bench --model`: whole-model wall time per inference for stock ncnn (CPU, Vulkan) beside vknorm inside
ncnn's Vulkan graph and vknorm's host path, in one run; its JSON is a contract other tools read. Timings
are never asserted (lavapipe's vary with load); the shape of the report and the error paths are."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from availability import import_graph
from vknorm import check as vkcheck

import_graph()

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
PARAM, BIN = (os.path.join(DATA, "transformer_block.ncnn." + e) for e in ("param", "bin"))


def vknorm(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "vknorm", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_bench_model_reports_every_implementation_as_json(tmp_path, fp16):
    out = tmp_path / "bench.json"
    args = ["bench", "--model", PARAM, BIN, "--input", "in0=16x64", "--iters", "3", "--warmup-ms", "20",
            "--json", str(out)]
    proc = vknorm(*args, *(["--fp16"] if fp16 else []))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"device", "driver", "model", "results"} <= set(report)
    assert isinstance(report["device"], str) and report["device"]
    from vknorm import device_info

    info = device_info()  # the driver as the kernel bench writes it
    assert report["driver"] == f"{info['driver_name']} {info['driver_info']}".strip() and report["model"] == PARAM
    assert report["warmup_ms"] == 20 and report["iters"] == 3  # the flags reach the whole-model bench
    assert "rounds of their own" in report["method"] and report["warnings"] == []
    impls = [r["impl"] for r in report["results"]]
    assert impls == ["ncnn-cpu", "ncnn-vulkan", "vknorm-in-graph", "vknorm-fused", "vknorm-host"]
    for r in report["results"]:
        assert isinstance(r["ms"], float) and r["ms"] > 0, r
    for impl in impls:  # the table names every implementation with its ratio to stock ncnn Vulkan
        assert impl in proc.stdout
    assert "vs ncnn-vulkan" in proc.stdout


def test_a_model_whose_file_names_are_not_utf8_runs_every_implementation(tmp_path):
    """File names are bytes: one that is not UTF-8 (Python carries it as surrogates) reaches pyncnn, which takes
    names as UTF-8 text only (vknorm-host's run), through a link of a plain name; every row is timed. The table
    names the file as the bytes it is, also where the locale's standard output is strict UTF-8 (en_US.UTF-8: it
    refused the surrogates, exit 2), as does check's."""
    base = os.path.join(os.fsencode(str(tmp_path)), b"model\xff")
    param, binp = base + b".param", base + b".bin"
    shutil.copy(PARAM, param)
    shutil.copy(BIN, binp)
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONIOENCODING="utf-8:strict")  # a UTF-8 locale other than C.UTF-8
    proc = subprocess.run([sys.executable, "-m", "vknorm", "bench", "--model", param, binp, "--input", "in0=16x64",
                           "--iters", "2", "--warmup-ms", "0", "--json", str(out)], capture_output=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert base + b".param (fp32 storage" in proc.stdout, proc.stdout[:500]
    check = subprocess.run([sys.executable, "-m", "vknorm", "check", param, binp, "--input", "in0=16x64"],
                           capture_output=True, timeout=300, env=env)
    assert check.returncode == 0 and b"ok: all 3 norm outputs" in check.stdout, check.stderr[-3000:]
    assert [r["impl"] for r in json.loads(out.read_text())["results"]] == [
        "ncnn-cpu", "ncnn-vulkan", "vknorm-in-graph", "vknorm-fused", "vknorm-host"]
    assert sorted(os.listdir(tmp_path)) == ["bench.json", "model\udcff.bin", "model\udcff.param"]  # no links left


def test_a_bin_longer_than_the_model_reads_is_a_warning_in_check_vulkan_and_bench_model(tmp_path):
    """Bytes after the weights the .param reads (another model's .bin?): check (both engines) and bench --model say
    so in their JSON (bench on stderr too, beside its table) and go on, as optimize does (check --vulkan and bench
    --model said nothing)."""
    longer = tmp_path / "longer.bin"
    longer.write_bytes(open(BIN, "rb").read() * 2)
    extra = os.path.getsize(BIN)
    warning = f"warning: {longer}: {extra} bytes after the weights {PARAM} reads (a .bin for another .param?)"
    runs = {
        "bench --model": (["bench", "--model", PARAM, str(longer), "--input", "in0=16x64", "--iters", "1",
                           "--warmup-ms", "0", "--json", str(tmp_path / "b.json")], tmp_path / "b.json"),
        "check --vulkan": (["check", PARAM, str(longer), "--input", "in0=16x64", "--vulkan", "--json"], None),
        "check": (["check", PARAM, str(longer), "--input", "in0=16x64", "--json"], None),
    }
    for what, (args, json_file) in runs.items():
        proc = vknorm(*args)
        assert proc.returncode == 0, (what, proc.stderr[-3000:])
        assert (warning in proc.stderr.splitlines()) == (what == "bench --model"), (what, proc.stderr[-3000:])
        report = json.loads(json_file.read_text() if json_file else proc.stdout)
        assert report["warnings"] == [warning[len("warning: "):]], (what, report["warnings"])


def test_bench_model_times_the_gpu_implementations_apart_from_the_host_busy_ones():
    """ncnn's CPU threads spin on after a CPU run and slow whatever runs next: ncnn-cpu and vknorm-host are
    timed in rounds of their own, after the GPU implementations, and no implementation always runs right
    after the same one."""
    from vknorm.model_bench import HOST_BUSY, IMPLS, schedule

    gpu_rounds, host_rounds = schedule(IMPLS, 40, seed=1)
    assert len(gpu_rounds) == len(host_rounds) == 40
    assert all(sorted(r) == ["ncnn-vulkan", "vknorm-fused", "vknorm-in-graph"] for r in gpu_rounds)
    assert all(sorted(r) == sorted(HOST_BUSY) for r in host_rounds)
    firsts = {r[0] for r in gpu_rounds}
    assert firsts == {"ncnn-vulkan", "vknorm-fused", "vknorm-in-graph"}  # orders drawn anew each round
    assert schedule(IMPLS, 40, seed=1) == [gpu_rounds, host_rounds]  # reproducible from the seed
    assert schedule(["ncnn-vulkan", "vknorm-fused"], 3) == schedule(["ncnn-vulkan", "vknorm-fused"], 3)[:1]


def test_norm_floor_times_the_model_without_its_norms_beside_stock_and_vknorm(tmp_path):
    """tools/norm_floor.py: the bound on what any norm can give a model (its norms replaced by pass-through
    Splits, which ncnn's Vulkan graph runs as no dispatch)."""
    sys.path.insert(0, os.path.join(DATA, "..", "..", "tools"))
    try:
        import norm_floor
    finally:
        sys.path.pop(0)
    with open(PARAM) as f:
        text = f.read()
    stripped = norm_floor.without_norms(text)
    assert "LayerNorm" not in stripped and stripped.count("\n") == text.count("\n")
    assert "Split                    splitncnn_0" in stripped and "Split ln_3 1 1 2 3" in stripped
    out = tmp_path / "floor.json"
    proc = subprocess.run([sys.executable, os.path.join(DATA, "..", "..", "tools", "norm_floor.py"), "transformer_block",
                           "--iters", "2", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["results"]
    assert row["model"] == "transformer_block"
    assert set(row["ms"]) == {"ncnn-vulkan", "no-norms", "vknorm-in-graph", "vknorm-fused"}
    assert all(v > 0 for v in row["ms"].values())
    bad = subprocess.run([sys.executable, os.path.join(DATA, "..", "..", "tools", "norm_floor.py"), "nosuch"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown model nosuch" in bad.stderr


def test_each_implementation_runs_the_net_its_name_says():
    """ncnn-cpu: stock ncnn on the CPU; ncnn-vulkan: stock ncnn on Vulkan; vknorm-in-graph: vknorm's layers in
    ncnn's Vulkan graph, the model as it is (nothing fused); vknorm-fused: the same after the graph rewrite
    (transformer_block: two add -> LayerNorm pairs fused). Their difference is what the report measures, so each
    computes the model: every output within the model-output rule of `vknorm check --vulkan` (2x stock ncnn
    Vulkan's max |error| against the CPU run, + 1e-4 x max(1, max |CPU output|))."""
    import numpy as np

    from vknorm._stdio import quiet_stderr
    from vknorm.model_bench import ModelRunner

    inputs = {"in0": np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)}
    with quiet_stderr():
        runners = {impl: ModelRunner(impl, PARAM, BIN, inputs, fp16=False)
                   for impl in ("ncnn-cpu", "ncnn-vulkan", "vknorm-in-graph", "vknorm-fused")}
        outputs = {impl: r() for impl, r in runners.items()}
    vulkan = {impl: r.net.opt.use_vulkan_compute for impl, r in runners.items()}
    assert vulkan == {"ncnn-cpu": False, "ncnn-vulkan": True, "vknorm-in-graph": True, "vknorm-fused": True}
    assert runners["ncnn-vulkan"].net.vknorm_layers() == [] and runners["ncnn-cpu"].net.vknorm_layers() == []
    assert runners["vknorm-in-graph"].net.fused() == []
    assert [f["pattern"] for f in runners["vknorm-fused"].net.fused()] == ["BinaryOp+Split+LayerNorm", "BinaryOp+LayerNorm"]
    for impl in ("vknorm-in-graph", "vknorm-fused"):
        assert runners[impl].net.vknorm_counters()["vulkan_forwards"] >= 1, impl
    assert all(set(o) == set(outputs["ncnn-cpu"]) for o in outputs.values())
    for name, cpu in outputs["ncnn-cpu"].items():
        err = {impl: float(np.abs(np.asarray(o[name], np.float64) - cpu).max()) for impl, o in outputs.items()}
        bound = vkcheck.output_bound(np.asarray(cpu, np.float64), err["ncnn-vulkan"], vkcheck.ATOL_FP32)
        assert err["vknorm-in-graph"] <= bound and err["vknorm-fused"] <= bound, (name, err, bound)


@pytest.mark.parametrize("args, message", [
    (["--model", "missing.param", BIN, "--input", "in0=16x64"], "no such file"),
    (["--model", PARAM, ".", "--input", "in0=16x64"], "--model .: is a directory, not the weights .bin"),
    (["--model", "/dev/zero", BIN, "--input", "in0=16x64"], "--model /dev/zero: a device, not the model .param"),
    (["--model", PARAM, BIN], "--input"),
    (["--model", PARAM, PARAM, "--input", "in0=16x64"], "the weights .bin is the model .param itself"),
    (["--model", PARAM, BIN, "--input", "in0=16xx64"], "malformed"),
    (["--model", PARAM, BIN, "--input", "in0=16x64", "--iters", "0"], "--iters"),
    (["--model", PARAM, BIN, "--input", "in0=16x64", "--warmup-ms", "-1"], "--warmup-ms"),
    (["--model", PARAM, BIN, "--input", "in0=16x64", "--cols", "64", "--dtype", "fp16"],
     "--cols, --dtype go with the kernel sweep, not --model"),
    (["--model", PARAM, BIN, "--input", "nosuch=16x64", "--iters", "1"], "input"),
    # a sweep flag at its default value is still given: refused, not ignored
    (["--model", PARAM, BIN, "--input", "in0=16x64", "--reps", "100"], "--reps goes with the kernel sweep"),
    (["--model", PARAM, BIN, "--input", "in0=16x64", "--dtype", "both"], "--dtype goes with the kernel sweep"),
    # the report over the model it times
    (["--model", PARAM, BIN, "--input", "in0=16x64", "--json", PARAM], "is the model's .param: the report would"),
    (["--model", PARAM, BIN, "--input", "in0=16x64", "--json", BIN], "is its .bin: the report would overwrite"),
])
def test_bench_model_bad_input_is_one_line_and_exit_2(args, message):
    proc = vknorm("bench", *args)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("vknorm bench")]
    assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]


def test_a_report_over_the_commands_own_files_is_refused_under_any_name(tmp_path):
    """--json naming the model's .param, its .bin or the --custom-layers file, by a hard link too (a write through it
    changes the file), or a directory path (trailing /, . or ..): one line before anything runs, the files intact."""
    param, binp, layers = tmp_path / "m.param", tmp_path / "m.bin", tmp_path / "layers.py"
    shutil.copy(PARAM, param)
    shutil.copy(BIN, binp)
    layers.write_text("def register(ncnn, net):\n    pass\n")
    before = {p: p.read_bytes() for p in (param, binp, layers)}
    for target, what in ((param, "the model's .param"), (binp, "its .bin"), (layers, "the --custom-layers file")):
        link = tmp_path / f"link-{target.name}.json"
        os.link(target, link)
        for path in (target, link):
            proc = vknorm("bench", "--model", str(param), str(binp), "--input", "in0=16x64", "--iters", "1",
                          "--warmup-ms", "0", "--custom-layers", str(layers), "--json", str(path))
            lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("vknorm bench")]
            assert proc.returncode == 2 and len(lines) == 1, (path, proc.returncode, proc.stderr[-2000:])
            assert f"is {what}: the report would overwrite it" in lines[0], lines
    (tmp_path / "out").mkdir()
    for flag, path in (("--json", "missing.json/"), ("--json", str(tmp_path / "out") + "/r.json/"),
                       ("--json", str(tmp_path / "r.json") + "/.")):
        proc = vknorm("bench", "--model", str(param), str(binp), "--input", "in0=16x64", "--iters", "1", flag, path)
        assert proc.returncode == 2 and "a directory path (trailing /, . or ..)" in proc.stderr and "ncnn-cpu" not in \
            proc.stdout, (path, proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert {p: p.read_bytes() for p in before} == before


def test_bench_model_names_the_line_and_layer_of_a_type_ncnn_does_not_have(tmp_path):
    """ncnn's own message names the type alone: the error names where it is."""
    param, binp = tmp_path / "unknown.param", tmp_path / "unknown.bin"
    param.write_text("7767517\n2 2\nInput in0 0 1 a\nFooLayer foo 1 1 a b\n")
    binp.write_bytes(b"")
    proc = vknorm("bench", "--model", str(param), str(binp), "--input", "a=4x8", "--iters", "1")
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "line 4: layer 'foo' is of type 'FooLayer', which this ncnn does not have" in lines[0], \
        proc.stderr[-2000:]


def test_bench_model_runs_a_model_without_inputs_as_check_does(tmp_path):
    """A model whose data is its own (MemoryData -> LayerNorm) takes no --input: every implementation runs it."""
    param, binp = tmp_path / "md.param", tmp_path / "md.bin"
    param.write_text("7767517\n2 2\nMemoryData md 0 1 m 0=64 1=4\nLayerNorm ln 1 1 m out 0=64 1=1e-5 2=0\n")
    binp.write_bytes(np.random.default_rng(0).standard_normal(256).astype(np.float32).tobytes())
    out = tmp_path / "r.json"
    proc = vknorm("bench", "--model", str(param), str(binp), "--iters", "2", "--warmup-ms", "0", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["impl"] for r in json.loads(out.read_text())["results"]] == ["ncnn-cpu", "ncnn-vulkan", "vknorm-in-graph",
                                                                           "vknorm-fused", "vknorm-host"]


def test_bench_model_needs_a_shape_for_every_input_of_the_model(tmp_path):
    """Checked before any net runs (ncnn dies of SIGFPE on an input it was never given)."""
    param, binp = tmp_path / "two.param", tmp_path / "two.bin"
    param.write_text("7767517\n4 5\nInput in0 0 1 in0\nInput in1 0 1 in1\nBinaryOp add 2 1 in0 in1 s 0=0\n"
                     "LayerNorm ln 1 1 s out0 0=64 1=1e-05 2=0\n")
    binp.write_bytes(b"")
    proc = vknorm("bench", "--model", str(param), str(binp), "--input", "in0=16x64", "--iters", "1")
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no shape for the model's input 'in1'" in lines[0], proc.stderr[-2000:]


@pytest.mark.parametrize("env, message", [
    ({"VKNORM_DEVICE": "nosuch"}, "VKNORM_DEVICE=nosuch matches no device"),
    ({"VKNORM_MAX_BUFFER_BYTES": "0"}, "VKNORM_MAX_BUFFER_BYTES=0: expected a positive integer"),
    ({"VKNORM_MAX_DEVICE_BYTES": "10"}, "cannot allocate"),
    ({"VKNORM_MAX_DEVICE_BYTES": "abc"}, "VKNORM_MAX_DEVICE_BYTES=abc: expected a positive integer"),
    ({"VKNORM_PATH": "bogus"}, "VKNORM_PATH=bogus: unknown path 'bogus'"),  # the variable named, set long ago maybe
    # read where vknorm's layers inside ncnn make their pipelines: it was a load failure blamed on the .bin
    ({"VKNORM_MAX_SHARED_MEMORY": "0"}, "VKNORM_MAX_SHARED_MEMORY=0: expected a positive integer"),
    ({"VKNORM_VULKAN_API": "9.9"}, "VKNORM_VULKAN_API=9.9: expected 1.0, 1.1, 1.2 or 1.3"),
])
def test_settings_refused_in_the_worker_process_are_one_line_and_exit_2(env, message):
    """The model runs in a forked worker: what the worker refuses reaches the user as it would from the
    command's own process (a ValueError or MemoryError there was a traceback and exit 1)."""
    for cmd in (["bench", "--model", PARAM, BIN, "--input", "in0=16x64", "--iters", "1", "--warmup-ms", "0"],
                ["check", PARAM, BIN, "--input", "in0=16x64", "--vulkan"]):
        proc = subprocess.run([sys.executable, "-m", "vknorm", *cmd], capture_output=True, text=True, timeout=300,
                              env={**os.environ, **env})
        if cmd[0] == "check" and "VKNORM_MAX_DEVICE_BYTES" in env and message == "cannot allocate":
            # vknorm's own contexts only time the layers beside ncnn's graph: the verdict stands, the times are -
            assert proc.returncode == 0, (cmd, proc.returncode, proc.stderr[-2000:])
            warned = [ln for ln in proc.stdout.splitlines() if "was not measured on vknorm's own context" in ln]
            assert warned and all("cannot allocate" in ln for ln in warned), proc.stdout[-2000:]
            continue
        assert proc.returncode == 2, (cmd, proc.returncode, proc.stderr[-2000:])
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"vknorm {cmd[0]}: error:") and message in lines[0], \
            (cmd, proc.stderr[-2000:])
        assert "--input shapes" not in lines[0], lines[0]  # a setting, not the shapes


def test_bench_model_refuses_a_group_norm_fed_fewer_channels_through_a_concat(tmp_path):
    """A GroupNorm of 64 channels fed 8 through a Concat (a layer the shape check does not follow): stock ncnn's CPU
    layer reads past the blob (a crash, or a spin that never returns). vknorm's layers run on ncnn's CPU first, where
    a model has a GroupNorm or InstanceNorm, and refuse it: one line naming the layer and both counts, exit 2."""
    param, binp = tmp_path / "gn_concat.param", tmp_path / "gn_concat.bin"
    param.write_text("7767517\n3 3\nInput in0 0 1 in0\nConcat cc 1 1 in0 x 0=0\n"
                     "GroupNorm gn 1 1 x out0 0=4 1=64 2=1e-05 3=0\n")
    binp.write_bytes(b"")
    proc = vknorm("bench", "--model", str(param), str(binp), "--input", "in0=8x4x4", "--iters", "1", timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "vknorm GroupNorm gn: the input has 8 channels, the layer 64" in lines[0], \
        proc.stderr[-2000:]


def test_bench_model_survives_ncnn_crashing_on_an_input_shape():
    """ncnn's MultiHeadAttention dies of SIGFPE on rows of 65 where the model was made for 64: the bench runs
    in a forked child, as `vknorm check` does, so that is one line on stderr and exit 2, not a dead process."""
    proc = vknorm("bench", "--model", PARAM, BIN, "--input", "in0=16x65", "--iters", "2")
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("vknorm bench: error: ncnn crashed (SIGFPE)"), proc.stderr[-2000:]
    assert "--input in0=16x65" in lines[0] and "do the --input shapes match" in lines[0], lines[0]
    # the first runs the worker began: stock ncnn's CPU layers, in the two nets whose blobs must agree
    assert "in stock ncnn's CPU runs of" in lines[0], lines[0]


# bench --model in this process, stock ncnn's CPU blobs made to differ between its two runs, or NaN in both
SPOILED_STOCK_RUN = """
import sys
import numpy as np
from vknorm import check, cli
real = check._graph_extract
def spoiled(graph, net, inputs, blobs, label):
    out = real(graph, net, inputs, blobs, label)
    if sys.argv[1] == "nan" or label == "ncnn CPU, again":
        out = {b: np.full_like(v, np.nan) if sys.argv[1] == "nan" else v + 1 for b, v in out.items()}
    return out
check._graph_extract = spoiled
sys.exit(cli.main(["bench", "--model", *sys.argv[2:4], "--input", "in0=16x64", "--iters", "2"]))
"""


@pytest.mark.parametrize("spoil, message", [
    ("differ", "blob '2' differs between two runs of stock ncnn's CPU layers on the same input (--input in0=16x64)"),
    ("nan", "LayerNorm 'ln_3': every value of its input '2' is NaN/inf in stock ncnn's CPU run (--input in0=16x64)"),
])
def test_bench_model_refuses_to_time_what_check_refuses_to_judge(spoil, message):
    """Input shapes a model does not take make a layer read memory it was not given: stock ncnn's CPU blobs then
    differ from run to run, or are NaN throughout (transformer_block fed one row of 64, on lavapipe's host; another
    host's allocator may repeat the same garbage). The bench runs stock ncnn's CPU layers in two nets first, as
    check judges them, and refuses to time the model: one line, exit 2, nothing timed. Here the runs are spoiled on
    purpose, so that the refusal does not depend on what the host's memory holds."""
    env = dict(os.environ, VKNORM_BENCH_INPROCESS="1")
    proc = subprocess.run([sys.executable, "-c", SPOILED_STOCK_RUN, spoil, PARAM, BIN], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"vknorm bench: error: {message}"), proc.stderr[-2000:]
    assert "do the --input shapes match what the model takes?" in lines[0], lines[0]

def _state_and_parent(pid: int):
    """(state letter, parent pid) from /proc, or None for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # past the command name, which may hold spaces
    except OSError:
        return None
    return fields[0], int(fields[1])


def _alive(pid: int) -> bool:
    """Running still: a zombie (killed, not yet reaped) is not."""
    stat = _state_and_parent(pid)
    return stat is not None and stat[0] != "Z"


def _children(pid: int) -> list:
    """The live processes whose parent is pid."""
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        stat = _state_and_parent(int(entry))
        if stat is not None and stat[1] == pid and stat[0] != "Z":
            out.append(int(entry))
    return out


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_bench_killed_or_interrupted_leaves_no_worker_running(sig):
    """The model runs in a forked worker (so an ncnn crash is one line): a CLI told to stop (SIGTERM: exit 143, 128 +
    the signal, once the worker is killed) or interrupted (SIGINT to the CLI alone: exit 130 likewise) leaves no
    worker benchmarking on."""
    import signal
    import time

    workers = []
    proc = subprocess.Popen([sys.executable, "-m", "vknorm", "bench", "--model", PARAM, BIN, "--input", "in0=16x64",
                             "--iters", "100000", "--warmup-ms", "0"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            # SIGINT as a terminal delivers it, even where this run inherited it ignored (nohup)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not workers and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            workers = _children(proc.pid)
        assert workers, "no worker process appeared"
        time.sleep(1)  # the worker past its start, into the model runs
        os.kill(proc.pid, getattr(signal, sig))
        rc = proc.wait(timeout=60)
        assert rc == (130 if sig == "SIGINT" else 128 + signal.SIGTERM), rc
        deadline = time.monotonic() + 30
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers), f"worker(s) {workers} still running after the CLI's {sig}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for w in workers:  # where the test failed: none left behind by it
            if _alive(w):
                os.kill(w, signal.SIGKILL)


def _on_a_terminal(args, columns: int) -> str:
    """The command's stderr as a terminal of `columns` columns shows it (0: a bare pseudo-terminal that reports no
    size), carriage returns as line breaks."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24 if columns else 0, columns, 0, 0))
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    try:
        while True:
            if select.select([master], [], [], 300)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the terminal closed: the command has ended
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        proc.wait(timeout=300)
    assert proc.returncode == 0, out.decode(errors="replace")[-2000:]
    return out.decode(errors="replace").replace("\r", "\n")


@pytest.mark.parametrize("columns", [80, 0], ids=["80_columns", "no_size"])
def test_bench_model_shows_its_progress_on_a_terminal_and_nothing_when_piped(columns):
    """A progress bar on stderr where a person watches it: every round of both phases (GPU implementations, then
    the host-busy ones) counted against their total from the first round on, also on a terminal that reports no
    size; nothing of it when stderr is a pipe (logs)."""
    args = [sys.executable, "-m", "vknorm", "bench", "--model", PARAM, BIN, "--input", "in0=16x64", "--iters", "150",
            "--warmup-ms", "0"]
    shown = [ln for ln in _on_a_terminal(args, columns).splitlines() if ln.startswith("inferences:")]
    counts = [ln for ln in shown if "/300 " in ln]
    assert counts and all("/150 " not in ln for ln in shown), shown[:5]
    assert "inferences" not in vknorm(*args[3:]).stderr

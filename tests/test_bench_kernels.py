"""`vknorm bench` kernel sweeps: vknorm timed with Vulkan timestamps beside the copy roof, per op, storage
and shape, as a table and as JSON (a contract other tools read). Timings are never asserted (lavapipe's
vary with load); what was run and how it is reported are."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SHAPES = ["--rows", "8", "--cols", "64", "--rows", "3", "--cols", "768"]
QUICK = ["--reps", "100", "--batches", "1", "--warmup-ms", "1"]


def vknorm(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "vknorm", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_affine"])
def test_bench_sweep_reports_vknorm_and_the_copy_roof_per_shape_as_json(tmp_path, affine):
    out = tmp_path / "bench.json"
    proc = vknorm("bench", "--op", "both", *SHAPES, "--compare", "copy", *QUICK, "--json", str(out),
                  *([] if affine else ["--no-affine"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"device", "driver", "date", "method", "warmup_ms", "skipped", "results"} <= set(report)
    assert report["skipped"] == [], report["skipped"]  # copy and both storages (lavapipe has 16-bit storage)
    seen = {}
    for r in report["results"]:
        assert r["affine"] is affine, r
        assert r["gpu_us"] > 0 and r["gbps"] > 0, r  # to 4 significant digits: tiny shapes are not 0
        seen.setdefault((r["op"], r["dtype"], r["rows"], r["cols"]), set()).add(r["impl"])
        if r["impl"] == "vknorm":
            assert r["path"] in ("subgroup", "workgroup", "split", "cooperative") and r["dispatches"] >= 1, r
    expected = {(op, dt, rows, cols) for op in ("layernorm", "rmsnorm") for dt in ("fp32", "fp16")
                for rows, cols in ((8, 64), (3, 768))}
    assert set(seen) == expected
    assert all({"vknorm", "copy"} <= impls for impls in seen.values()), seen
    assert "layernorm" in proc.stdout and "rmsnorm" in proc.stdout  # the table


@pytest.mark.parametrize("op", ["groupnorm", "instancenorm"])
def test_bench_groupnorm_and_instancenorm_shapes_report_channels_planes_and_groups(tmp_path, op):
    out = tmp_path / "bench.json"
    shapes = ["--channels", "64", "--size", "8x8", "--channels", "320", "--size", "4x6"]
    groups = ["--groups", "32"] if op == "groupnorm" else []
    proc = vknorm("bench", "--op", op, *shapes, *groups, "--compare", "copy", *QUICK, "--json", str(out),
                  "--plot", str(tmp_path / "bench.png"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    seen = {}
    for r in report["results"]:
        assert r["op"] == op and r["gpu_us"] > 0, r
        seen.setdefault((r["dtype"], r["channels"], r["h"], r["w"], r["groups"]), set()).add(r["impl"])
    g = 32 if op == "groupnorm" else None
    expected = {(dt, c, h, w, g or c) for dt in ("fp32", "fp16") for c, h, w in ((64, 8, 8), (320, 4, 6))}
    assert set(seen) == expected and all({"vknorm", "copy"} <= v for v in seen.values()), seen
    label = "320x4x6/32" if op == "groupnorm" else "320x4x6"
    assert label in proc.stdout and (tmp_path / "bench.png").stat().st_size > 0


def test_one_groups_value_for_the_default_shapes_names_those_it_skips(capsys):
    """--groups G without --channels runs the default shapes whose channels G divides, and says which it skips."""
    import argparse

    from vknorm import bench

    args = argparse.Namespace(rows=None, cols=None, op="groupnorm", groups=[3], channels=None, size=None)
    skipped: list = []
    shapes = bench._channel_shapes(args, skipped)
    assert shapes == [(c, h, w, 3) for c, h, w, _ in bench.GROUPNORM_SHAPES if c % 3 == 0] and shapes
    err = capsys.readouterr().err
    left_out = ", ".join(f"{c}x{h}x{w}" for c, h, w, _ in bench.GROUPNORM_SHAPES if c % 3)
    why = f"--groups 3 divides the channels of {len(shapes)} of the {len(bench.GROUPNORM_SHAPES)} default shapes"
    assert err == f"vknorm bench: {why}: skipping {left_out}\n"
    assert skipped == [{"what": left_out, "why": why}]  # the JSON's "skipped" says it too
    args.groups = [32]  # divides them all: nothing to say
    skipped.clear()
    assert len(bench._channel_shapes(args, skipped)) == len(bench.GROUPNORM_SHAPES) and capsys.readouterr().err == ""
    assert skipped == []


def test_bench_groupnorm_takes_one_groups_value_per_channels(tmp_path):
    """--groups once per --channels: each shape is benchmarked with its own group count (one value: every shape)."""
    out = tmp_path / "bench.json"
    proc = vknorm("bench", "--op", "groupnorm", "--channels", "64", "--size", "4x4", "--groups", "32",
                  "--channels", "48", "--size", "4x4", "--groups", "8", "--dtype", "fp32", *QUICK, "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = {(r["channels"], r["groups"]) for r in json.loads(out.read_text())["results"] if r["impl"] == "vknorm"}
    assert groups == {(64, 32), (48, 8)}, groups
    assert "64x4x4/32" in proc.stdout and "48x4x4/8" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--op", "groupnorm", "--channels", "10", "--size", "4x4", "--groups", "3"], "do not split into 3 groups"),
    (["--op", "groupnorm", "--rows", "3", "--cols", "4"], "--channels and --size"),
    (["--op", "instancenorm", "--channels", "8", "--size", "4"], "expected HxW"),
    (["--op", "instancenorm", "--channels", "8", "--size", "4x4", "--groups", "2"], "one group per channel"),
    (["--op", "instancenorm", "--groups", "2"], "one group per channel"),
    (["--op", "layernorm", "--channels", "8", "--size", "4x4"], "--op groupnorm or instancenorm"),
    (["--rows", "8"], "--rows"),
    (["--rows", "0", "--cols", "8"], "positive"),
    (["--rows", "8", "--cols", "8", "--reps", "5"], "--reps"),
    (["--rows", "8", "--cols", "8", "--warmup-ms", "-1"], "--warmup-ms"),
    (["--rows", "8", "--cols", "8", "--warmup-ms", "inf"], "--warmup-ms"),
    (["--rows", "8", "--cols", "8", "--iters", "5"], "--iters goes with --model"),
    (["--elements", "0"], "--elements must be >= 1"),
    (["--rows", "8", "--cols", "8", "--reps", "99999999999"], "--reps"),
    (["--rows", "8", "--cols", "8", "--batches", "9999999999"], "--batches"),
    (["--rows", "8", "--cols", "8", "--json", "/nonexistent-dir/x.json"], "no such directory"),
    (["--rows", "8", "--cols", "8", "--plot", "."], "a directory"),
    (["--rows", "8", "--cols", "8", "--plot", "sweep.txt"], "matplotlib cannot write .txt files"),
    (["--op", "groupnorm", "--groups", "7"], "--groups 7 divides none of the default shapes' channels"),
    (["--rows", "8", "--cols", "8", "--compare", "nosuch"], "--compare"),
    (["--rows", "3000000000", "--cols", "1"], "every dimension must be 1..2^31-1"),
    (["--rows", "1", "--cols", "3000000000"], "every dimension must be 1..2^31-1"),
    (["--op", "groupnorm", "--channels", "3000000000", "--size", "1x1", "--groups", "1"], "every dimension"),
    (["--rows", "8", "--cols", "8", "--json", "same.png", "--plot", "same.png"], "name the same file"),
    (["--rows", "8", "--cols", "8", "--plot", "sweep"], "no file extension"),
    (["--rows", "8", "--cols", "8", "--json", ""], "--json: empty file name"),  # not a sweep that writes nothing
    (["--rows", "8", "--cols", "8", "--plot", ""], "--plot: empty file name"),
    (["--rows", "8", "--cols", "8", "--path", ""], "--path: path must be one of auto"),
    (["--rows", "8", "--cols", "8", "--path", "AUTO"], "--path: path must be one of auto"),
    # a file that cannot be created: known before the run, not after it (root: access() lets /proc pass and open()
    # refuses it, "cannot be written"; other users: "not writable")
    (["--rows", "8", "--cols", "8", "--json", "/proc/vknorm-report.json"], "--json /proc/vknorm-report.json: "),
    # flags of the default LayerNorm/RMSNorm sweep where another sweep runs: refused, not ignored
    (["--rows", "8", "--cols", "8", "--elements", "64"], "--elements: for the default sweep, not the shapes"),
    (["--rows", "8", "--cols", "8", "--no-latency"], "--no-latency: for the default sweep, not the shapes"),
    (["--op", "groupnorm", "--elements", "64"], "--elements: for the default LayerNorm/RMSNorm sweep, not --op"),
    # argparse's own errors, one line too, said by bench
    (["--op", "nosuch"], "vknorm bench: error: argument --op: invalid choice: 'nosuch'"),
    (["--rows", "x"], "vknorm bench: error: argument --rows: invalid int value: 'x'"),
    (["--model", "only.param"], "vknorm bench: error: argument --model: expected 2 arguments"),
    (["--rows", "8", "--cols", "8", "stray"], "vknorm bench: error: unrecognized arguments: stray"),
    # a shape twice would be timed twice and tabled once
    (["--rows", "4", "--cols", "64", "--rows", "4", "--cols", "64"], "shape 4x64 is given twice"),
    (["--op", "groupnorm", "--channels", "8", "--size", "4x4", "--channels", "8", "--size", "4x4", "--groups", "2"],
     "shape 8x4x4/2 is given twice"),
])
def test_bench_bad_input_is_one_line_and_exit_2(args, message):
    proc = vknorm("bench", *args)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_a_shape_past_one_storage_buffer_is_refused_before_any_is_timed(tmp_path):
    """The kernels are timed on one buffer: a shape that needs more (here the binding limit made 64 KiB) is named in
    one line before the first shape is timed, so nothing is measured to be thrown away."""
    proc = subprocess.run([sys.executable, "-m", "vknorm", "bench", "--rows", "4", "--cols", "64", "--rows", "64",
                           "--cols", "1024", "--compare", "", *QUICK, "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, VKNORM_MAX_BUFFER_BYTES="65536"))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert ("shape 64x1024: its blob of 262144 bytes is larger than one storage buffer (VKNORM_MAX_BUFFER_BYTES: "
            "65536 bytes)" in lines[0]), lines
    assert proc.stdout == "" and not (tmp_path / "r.json").exists()


def test_a_blob_under_16_bytes_has_no_copy_roof(tmp_path):
    """The copy shader moves vec4s: under 16 bytes it would time an empty dispatch as the roof. Such a shape is
    reported without one ("% copy" "-"), the others with it."""
    out = tmp_path / "r.json"
    proc = vknorm("bench", "--rows", "1", "--cols", "3", "--rows", "2", "--cols", "8", "--dtype", "fp32",
                  "--compare", "copy", *QUICK, "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    impls = {}
    for r in json.loads(out.read_text())["results"]:
        impls.setdefault(r["shape"], set()).add(r["impl"])
    assert impls == {"1x3": {"vknorm"}, "2x8": {"vknorm", "copy", "copy_buffer"}}, impls
    row = next(line for line in proc.stdout.splitlines() if " 1x3 " in line)
    assert row.split()[5] == "-", row  # op, dtype, shape, vknorm us, GB/s, % copy


def test_the_plot_labels_shapes_whose_cols_repeat_by_shape(tmp_path, monkeypatch):
    """GB/s against cols draws one line through a sweep of cols; shapes that share cols with other rows are points of
    their own, labelled rows x cols, not a vertical jump on one cols."""
    pytest.importorskip("matplotlib")
    from vknorm import bench

    def result(rows, cols, impl, gbps):
        return {"op": "layernorm", "dtype": "fp32", "rows": rows, "cols": cols, "shape": f"{rows}x{cols}",
                "kind": "sweep", "impl": impl, "gbps": gbps, "streams": 2}

    report = {"device": "d", "date": "today", "results": [result(2, 64, "vknorm", 1.0), result(512, 64, "vknorm", 3.0),
                                                          result(8, 256, "vknorm", 2.0)]}
    import matplotlib.figure

    seen = {}
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, path, **kw: seen.update(
                            ticks=[t.get_text() for t in fig.axes[0].get_xticklabels()],
                            xlabel=fig.axes[0].get_xlabel(),
                            x=list(fig.axes[0].lines[0].get_xdata())))
    bench.plot(report, str(tmp_path / "p.png"))
    assert seen["ticks"] == ["2x64", "512x64", "8x256"] and seen["xlabel"] == "rows x cols", seen
    assert seen["x"] == [0, 1, 2], seen


def test_the_table_has_a_row_per_measurement_where_a_latency_shape_is_also_a_sweeps(tmp_path):
    """--elements 4096 makes the sweep's 1x4096 as well as the latency shape's: two rows, the latency one named so,
    each with its own time (one row had shown one's time beside the other's ratios)."""
    out = tmp_path / "bench.json"
    proc = vknorm("bench", "--op", "layernorm", "--elements", "4096", "--dtype", "fp32", *QUICK, "--compare", "",
                  "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = {ln.split()[2] + (" " + ln.split()[3] if ln.split()[3].startswith("(") else ""): ln
             for ln in proc.stdout.splitlines() if ln.startswith("layernorm")}
    results = {(r["shape"], r["kind"]): r for r in json.loads(out.read_text())["results"]}
    for label, kind in (("1x4096", "sweep"), ("1x4096 (latency)", "latency")):
        assert f"{results[('1x4096', kind)]['gpu_us']:.1f}" == table[label].split(label, 1)[1].split()[0], \
            (label, table[label])


def test_a_plot_named_without_an_extension_is_refused_whatever_the_file_is(tmp_path):
    """A FIFO (or a device) named without an extension: the format is the name's, so the run is refused up front
    rather than matplotlib writing NAME.png beside it."""
    fifo = tmp_path / "plotpipe"
    os.mkfifo(fifo)
    proc = vknorm("bench", "--rows", "8", "--cols", "8", "--plot", str(fifo))
    assert proc.returncode == 2 and proc.stderr.strip() == (f"vknorm bench: error: --plot {fifo}: no file extension "
                                                            "(name a .png, .svg or .pdf file)"), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plotpipe"]


def test_float16_on_a_device_without_16_bit_storage_is_refused_or_skipped_not_mislabelled(tmp_path):
    """float16 storage would run as float32 there (VKNORM_NO_FP16_STORAGE=1: as if the device lacked it): asked for
    alone it is a one-line error; in the default --dtype both it is skipped, said once, and no fp16 row is made."""
    env = dict(os.environ, VKNORM_NO_FP16_STORAGE="1")
    run = [sys.executable, "-m", "vknorm", "bench", "--rows", "2", "--cols", "64", *QUICK, "--compare", ""]
    proc = subprocess.run([*run, "--dtype", "fp16"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--dtype fp16:" in proc.stderr and "no 16-bit storage" in proc.stderr, proc.stderr
    out = tmp_path / "bench.json"
    proc = subprocess.run([*run, "--json", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("no 16-bit storage: skipping fp16") == 1, proc.stderr
    report = json.loads(out.read_text())
    assert {r["dtype"] for r in report["results"]} == {"fp32"}
    assert [s["what"] for s in report["skipped"]] == ["fp16"] and "no 16-bit storage" in report["skipped"][0]["why"]


@pytest.mark.parametrize("target", ["-", "/dev/stdout"])
def test_json_to_stdout_replaces_the_table(tmp_path, target):
    """--json - and --json /dev/stdout (onto a pipe, whose link names no path) write the JSON alone to stdout."""
    proc = subprocess.run([sys.executable, "-m", "vknorm", "bench", "--rows", "2", "--cols", "64", "--dtype", "fp32",
                           *QUICK, "--compare", "", "--json", target], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)  # the whole of stdout: no table around it
    assert [(r["impl"], r["rows"], r["cols"]) for r in report["results"]] == [("vknorm", 2, 64)]
    assert list(tmp_path.iterdir()) == []  # no file named "-"


def test_an_ncnn_without_a_vulkan_device_is_a_skipped_comparison_not_a_missing_row(tmp_path):
    """pyncnn seeing no GPU has no Vulkan layer to time: said once, up front, and in the JSON's "skipped" (its rows
    went missing without a word)."""
    script = ("import sys\nimport ncnn\nncnn.get_gpu_count = lambda: 0  # as on a machine where pyncnn sees no GPU\n"
              "from vknorm.cli import main\nraise SystemExit(main(sys.argv[1:]))\n")
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-c", script, "bench", "--rows", "4", "--cols", "64", "--dtype", "fp32",
                           *QUICK, "--compare", "ncnn", "--json", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["skipped"] == [{"what": "the ncnn comparison", "why": "ncnn (pip ncnn) sees no Vulkan device"}]
    assert {r["impl"] for r in report["results"]} == {"vknorm"}
    assert "sees no Vulkan device: skipping the ncnn comparison" in proc.stderr


def test_a_plot_that_cannot_be_written_is_one_error_line_naming_it(tmp_path):
    """The plot is written after the sweep: a file size limit (or a full disk) there is one line naming the plot's
    file, exit 2, not a traceback and not "standard output"."""
    import resource

    out = tmp_path / "bench.png"
    proc = subprocess.run([sys.executable, "-m", "vknorm", "bench", "--rows", "4", "--cols", "64", "--dtype", "fp32",
                           *QUICK, "--compare", "", "--plot", str(out)], capture_output=True, text=True, timeout=600,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192)))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [f"vknorm bench: error: --plot {out}: File too large"], proc.stderr[-2000:]


def test_a_report_that_cannot_be_written_is_one_error_line(tmp_path):
    """Where the --json file's directory is checked before the run (a link to a missing one), and where the
    write itself fails after it (a full disk: /dev/full; after the progress bar)."""
    link = tmp_path / "report.json"
    link.symlink_to(tmp_path / "missing-dir" / "report.json")
    for target, message in [(link, "no such directory"), ("/dev/full", "No space left on device")]:
        proc = vknorm("bench", "--rows", "8", "--cols", "64", *QUICK, "--compare", "copy", "--json", str(target))
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
        assert len(errors) == 1 and errors[0].startswith("vknorm bench: error:") and message in errors[0], proc.stderr
        assert str(target) in errors[0], errors  # the file named


class FakeGpu:
    """Forwards of `cost` seconds each on a clock of its own (the bench's clock is replaced by it): what the
    warm-up ran, without timing anything real."""

    def __init__(self, cost: float):
        self.now, self.cost, self.calls = 0.0, cost, []

    def clock(self) -> float:
        return self.now

    def run(self, warmup: int, reps: int = 100) -> str:
        self.calls.append((warmup, reps))
        self.now += (warmup + reps) * self.cost + 50e-6  # and a submission's fixed cost
        return "timed"


@pytest.mark.parametrize("cost, probe", [(3e-6, 6e-6), (20e-6, 40e-6), (1e-3, 2e-3), (3e-6, 1e-6)],
                         ids=["3us-latency", "20us", "1ms", "probe-understated"])
@pytest.mark.parametrize("warmup_ms", [0.0, 1.0, 150.0, 2000.0])
def test_the_warmup_runs_the_time_asked_for_whatever_a_forward_costs(monkeypatch, cost, probe, warmup_ms):
    """--warmup-ms is the GPU's time at the work before a timed batch, not a count of forwards from a cold probe:
    submissions of at most WARMUP_CHUNK forwards, the last part in the timed submission itself (which times its
    reps after it). Within 5 ms (or one forward) of what was asked, never a fraction of it."""
    from vknorm import bench

    gpu = FakeGpu(cost)
    monkeypatch.setattr(bench.time, "perf_counter", gpu.clock)
    assert bench._after_warmup(gpu.run, warmup_ms, probe) == "timed"
    *warm_chunks, (last_warm, last_reps) = gpu.calls
    assert last_reps == 100 and all(reps == 1 for _, reps in warm_chunks), gpu.calls
    assert all(w <= bench.WARMUP_CHUNK for w, _ in gpu.calls), gpu.calls
    warmed = sum(w + r for w, r in warm_chunks) * cost + last_warm * cost
    assert warmup_ms / 1000 - max(0.005, cost) <= warmed <= warmup_ms / 1000 + max(0.005, cost), (warmed, gpu.calls)


def test_bench_a_shape_too_large_for_memory_is_one_error_line_before_any_input_is_made():
    """Every shape's input is checked against the host memory available before the first is made (numpy
    once filled 12 GB for a shape refused afterwards): within a 4 GiB address space, the one line still says so."""
    from test_check_vulkan import limit_memory

    proc = subprocess.run([sys.executable, "-m", "vknorm", "bench", "--rows", "64", "--cols", "64", "--rows",
                           "2000000000", "--cols", "2000000000", *QUICK, "--compare", "copy"],
                          capture_output=True, text=True, timeout=600, preexec_fn=limit_memory)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("vknorm bench: error: out of memory (2000000000x2000000000 needs"), lines


def test_bench_counts_device_copies_in_a_shapes_memory_before_making_it():
    """A GroupNorm whose input takes 60 % of the host memory available: with the staging copy each array takes on
    its way to the device (and, on a CPU device, the device buffer itself) it cannot fit. Refused in one line
    before any array is made (counting the input alone let such shapes through, to the out-of-memory killer)."""
    from test_check_vulkan import limit_memory

    from vknorm.layers import _available_host_memory

    channels = int(_available_host_memory() * 0.6) // (4 * 64 * 64)  # float32 planes of 64x64
    proc = subprocess.run([sys.executable, "-m", "vknorm", "bench", "--op", "groupnorm", "--channels", str(channels),
                           "--size", "64x64", "--groups", "1", *QUICK, "--dtype", "fp32", "--compare", ""],
                          capture_output=True, text=True, timeout=600, preexec_fn=limit_memory)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"vknorm bench: error: out of memory ({channels}x64x64/1 needs"), lines
    assert "its input and weights" in lines[0], lines


def test_bench_says_which_comparisons_it_skips_and_keeps_ncnns_banner_quiet(tmp_path):
    """--compare torch without torch is one note, like ncnn's, and an entry in the JSON's "skipped" (a row left out
    is told from one never asked for); ncnn's device banner stays off stderr."""
    script = ("import sys\nsys.modules['torch'] = None  # as without torch\n"
              "from vknorm.cli import main\nraise SystemExit(main(sys.argv[1:]))\n")
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-c", script, "bench", "--rows", "4", "--cols", "64", *QUICK,
                           "--dtype", "fp32", "--compare", "copy,ncnn,torch", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # (ncnn's wall-clock chain difference at a shape this small may come out 0 or less on a fast GPU: an H200's
    # 4x64; that row is then skipped, and said so too)
    noise = "vknorm bench: its time came out 0 or less: skipping ncnn at 4x64 fp32"
    notes = [ln for ln in proc.stderr.splitlines() if ln.startswith("vknorm bench:") and ln != noise]
    assert notes == ["vknorm bench: torch not installed: skipping the torch comparison"], proc.stderr[-2000:]
    assert not any(ln.lstrip().startswith("[0 ") for ln in proc.stderr.splitlines()), proc.stderr[-2000:]
    report = json.loads(out.read_text())
    torch = {"what": "the torch comparison", "why": "torch not installed"}
    ncnn_noise = {"what": "ncnn at 4x64 fp32", "why": "its time came out 0 or less"}
    assert report["skipped"] in ([torch], [torch, ncnn_noise]), report["skipped"]
    impls = {r["impl"] for r in report["results"]}
    assert {"vknorm", "copy"} <= impls and ("ncnn" in impls) == (len(report["skipped"]) == 1), impls


def test_bench_plot_without_matplotlib_is_refused_before_the_sweep(tmp_path):
    """--plot needs matplotlib (an optional extra): said in one line and exit 2 before any shape runs, not after a
    sweep that ends without its plot."""
    script = ("import sys\nsys.modules['matplotlib'] = None  # as without matplotlib\n"
              "from vknorm.cli import main\nraise SystemExit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", script, "bench", "--rows", "4", "--cols", "64", *QUICK,
                           "--compare", "copy", "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "p.png")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [f"vknorm bench: error: --plot {tmp_path / 'p.png'}: needs matplotlib (pip install matplotlib, "
                     "or vknorm[bench])"], proc.stderr[-2000:]
    assert not (tmp_path / "r.json").exists()  # nothing ran


# The comparisons run the same work as vknorm: a recording stand-in for torch (no CUDA here) and ncnn's Net
# wrapped to log its packing option, then `vknorm bench` in the same process.
COMPARE_SCRIPT = r"""
import contextlib, json, os, sys, types
import ncnn
calls, packing = [], []

class T:
    def __init__(self, shape):
        self.shape = tuple(shape)
    def __add__(self, other):
        calls.append("add")
        return T(self.shape)

def recorded(name):
    def op(t, *args, **kwargs):
        calls.append(name + ("(tanh)" if kwargs.get("approximate") == "tanh" else ""))
        return T(t.shape)
    return op

class Event:
    def __init__(self, enable_timing=False): pass
    def record(self): pass
    def elapsed_time(self, other): return 1.0

torch = types.ModuleType("torch")
torch.float16, torch.float32 = "float16", "float32"
torch.randn = lambda *shape, device=None, dtype=None: T(shape)
torch.randn_like = lambda t: T(t.shape)
torch.ones = torch.zeros = lambda *shape, device=None, dtype=None: T(shape)
torch.sigmoid = recorded("sigmoid")
class Stream:
    def wait_stream(self, other): pass

class CUDAGraph:
    replays = 0
    def replay(self): CUDAGraph.replays += 1

@contextlib.contextmanager
def graph(g):
    if os.environ.get("STAND_IN_CAPTURE_FAILS"):
        raise RuntimeError("operation not permitted when stream is capturing")
    yield

torch.cuda = types.SimpleNamespace(is_available=lambda: True, synchronize=lambda: None, Event=Event, Stream=Stream,
                                   current_stream=Stream, stream=lambda s: contextlib.nullcontext(),
                                   CUDAGraph=CUDAGraph, graph=graph)
F = types.ModuleType("torch.nn.functional")
for name in ("layer_norm", "rms_norm", "group_norm", "instance_norm", "relu", "leaky_relu", "silu", "gelu"):
    setattr(F, name, recorded(name))
torch.nn = types.ModuleType("torch.nn")
torch.nn.functional = F
sys.modules.update({"torch": torch, "torch.nn": torch.nn, "torch.nn.functional": F})

class LoggedNet(ncnn.Net):
    def load_param(self, path):
        packing.append(bool(self.opt.use_packing_layout))
        return super().load_param(path)
ncnn.Net = LoggedNet

from vknorm import cli
rc = cli.main(sys.argv[1:])
print(json.dumps({"rc": rc, "torch_ops": sorted(set(calls)), "ncnn_packing": sorted(set(packing)),
                  "graph_replays": CUDAGraph.replays}))
"""


def bench_recording_comparisons(*args, env=None, stderr=None):
    proc = subprocess.run([sys.executable, "-c", COMPARE_SCRIPT, "bench", *args], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if stderr is not None:
        stderr.append(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("activation, op_name", [("gelu", "gelu"), ("gelu_fast", "gelu(tanh)"), ("swish", "silu"),
                                                  ("sigmoid", "sigmoid"), ("relu", "relu")])
def test_the_torch_comparison_runs_the_fused_add_and_activation_too(tmp_path, activation, op_name):
    out = tmp_path / "bench.json"
    seen = bench_recording_comparisons("--rows", "8", "--cols", "64", "--dtype", "fp32", *QUICK, "--compare", "torch",
                                       "--residual", "add", "--activation", activation, "--json", str(out))
    assert seen["rc"] == 0 and seen["torch_ops"] == sorted(["add", "layer_norm", op_name]), seen
    torch_row = next(r for r in json.loads(out.read_text())["results"] if r["impl"] == "torch")
    assert torch_row["dispatches"] == 3 and torch_row["streams"] == 3, torch_row


def test_torch_is_timed_from_a_cuda_graph_as_vknorm_from_one_command_buffer(tmp_path):
    """Eager calls of a small layer time Python's launch rate; replays of captured forwards time the GPU."""
    out = tmp_path / "bench.json"
    seen = bench_recording_comparisons("--rows", "8", "--cols", "64", "--dtype", "fp32", *QUICK, "--compare", "torch",
                                       "--json", str(out))
    torch_row = next(r for r in json.loads(out.read_text())["results"] if r["impl"] == "torch")
    assert torch_row["method"] == "CUDA graph replays, CUDA events", torch_row
    assert seen["graph_replays"] > 0, seen


def test_torch_falls_back_to_eager_calls_with_a_note_where_capture_fails(tmp_path):
    out, stderr = tmp_path / "bench.json", []
    seen = bench_recording_comparisons("--rows", "8", "--cols", "64", "--dtype", "fp32", *QUICK, "--compare", "torch",
                                       "--json", str(out), env={**os.environ, "STAND_IN_CAPTURE_FAILS": "1"},
                                       stderr=stderr)
    torch_row = next(r for r in json.loads(out.read_text())["results"] if r["impl"] == "torch")
    assert torch_row["method"] == "eager calls, CUDA events" and seen["graph_replays"] == 0, (torch_row, seen)
    assert ("vknorm bench: torch CUDA graph capture failed (operation not permitted when stream is capturing): "
            "timing eager calls") in stderr[0].splitlines(), stderr[0][-2000:]


def test_the_ncnn_comparison_is_skipped_with_a_reason_where_the_kernel_fuses_more_than_a_norm(tmp_path):
    """ncnn has no layer that fuses a residual add or an activation: its column would not be the fused kernel's
    counterpart, so it is left out, and stderr says so (as for a missing torch)."""
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-c", COMPARE_SCRIPT, "bench", "--rows", "8", "--cols", "64", "--dtype",
                           "fp32", *QUICK, "--compare", "ncnn", "--residual", "add", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["rc"] == 0 and seen["ncnn_packing"] == [], seen  # no ncnn net was even loaded
    assert "ncnn has no layer that fuses --residual/--activation: skipping the ncnn comparison" in proc.stderr
    report = json.loads(out.read_text())
    assert {r["impl"] for r in report["results"]} == {"vknorm"}
    assert report["skipped"] == [{"what": "the ncnn comparison",
                                  "why": "ncnn has no layer that fuses --residual/--activation"}], report["skipped"]


def test_the_table_says_what_a_fused_run_fused():
    proc = vknorm("bench", "--rows", "2", "--cols", "64", "--dtype", "fp32", *QUICK, "--compare", "",
                  "--residual", "add+sum", "--activation", "swish")
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = next(ln for ln in proc.stdout.splitlines() if ln.startswith("layernorm"))
    assert row.endswith("fused add+sum + swish"), row


@pytest.mark.parametrize("packing", [True, False])
def test_the_ncnn_comparison_runs_the_packing_vknorm_runs(tmp_path, packing):
    out = tmp_path / "bench.json"
    seen = bench_recording_comparisons("--rows", "8", "--cols", "64", "--dtype", "fp32", *QUICK, "--compare", "ncnn",
                                       *([] if packing else ["--no-packing"]), "--json", str(out))
    assert seen["rc"] == 0 and seen["ncnn_packing"] == [packing], seen
    rows = json.loads(out.read_text())["results"]
    # ncnn's row is absent where its chain difference comes out at 0 (tiny shapes on a fast GPU)
    assert {r["impl"] for r in rows} <= {"vknorm", "ncnn"} and all(r["packing"] is packing for r in rows), rows


COPY_ROOF_SCRIPT = r"""
import json, sys
import numpy as np
import vknorm
fp16, pack = sys.argv[1] == "1", sys.argv[2] == "1"
v = vknorm.to_device(np.zeros((512, 7, 7), np.float32), vknorm.Option(use_fp16_storage=fp16, use_packing_layout=pack))
try:
    vknorm._core.copy_repeated(v, 0, 1, True)
    copied = True
except ValueError as e:
    copied = str(e)
print(json.dumps({"element_bytes": v.element_bytes, "bytes": v.bytes, "copied": copied}))
"""


@pytest.mark.parametrize("fp16, pack", [(False, False), (True, False), (True, True)])
def test_the_copy_roof_moves_the_elements_not_the_cstep_padding(fp16, pack):
    """7x7 planes pad to 52 (float32) or 56 (float16) elements per channel: 6-14 % more than the elements (2 %
    in float16 pack4). The copy shader moves the elements alone: bound to one binding of exactly their bytes
    (VKNORM_MAX_BUFFER_BYTES), it runs; one byte less and it is refused, naming the elements' bytes."""
    def copy_with_a_binding_of(limit):
        env = dict(os.environ, VKNORM_MAX_BUFFER_BYTES=str(limit))
        proc = subprocess.run([sys.executable, "-c", COPY_ROOF_SCRIPT, str(int(fp16)), str(int(pack))], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    elements = 512 * 49 * (2 if fp16 else 4)
    fits = copy_with_a_binding_of(elements)
    assert fits["element_bytes"] == elements and fits["bytes"] > elements and fits["copied"] is True, fits
    short = copy_with_a_binding_of(elements - 1)
    assert short["copied"] == f"copy_repeated: {elements} bytes exceed one storage buffer ({elements - 1} bytes)", short

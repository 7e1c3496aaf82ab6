"""``vknorm check`` and ``vknorm bench --model`` on a model with a layer type of its own (pyncnn's custom Python
layers): ``--custom-layers FILE.py`` names a file defining ``register(ncnn, net)``, called for each net the command
makes with that net's module (pyncnn for check's default engine and bench's vknorm-host, vknorm.graph for the rest),
so one layer code serves every run. The model here: a Python layer that doubles its input, then a LayerNorm (then
Swish, which vknorm.graph fuses into it). The layer file logs each registration and forward, so the tests see that
each engine ran it. Bad files and a layer's own exception are one-line errors (exit 2) naming the file.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from availability import import_or_missing, needs_graph, needs_vulkan
from test_ncnn_models import ROOT, assert_one_line_error

pytestmark = [needs_vulkan, needs_graph, pytest.mark.timeout(600)]

W = 16

LAYERS = '''
import os

import numpy as np

KEPT = []  # pyncnn's nets hold no layer they made: kept here


def log(what):
    with open(os.environ["CUSTOM_LAYERS_LOG"], "a") as f:
        f.write(what + "\\n")


def register(ncnn, net):
    log("register " + ncnn.__name__)

    class TimesK(ncnn.Layer):
        def __init__(self):
            ncnn.Layer.__init__(self)
            self.one_blob_only = True
            self.support_inplace = True

        def load_param(self, pd):
            self.k = pd.get(0, 1.0)
            return 0

        def forward_inplace(self, bottom_top_blob, opt):
            log("forward " + ncnn.__name__)
            bottom_top_blob.clone_from(ncnn.Mat(np.array(bottom_top_blob) * self.k))
            return 0

    def make():
        KEPT.append(TimesK())
        return KEPT[-1]

    net.register_custom_layer("TimesK", make, None)
'''


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("custom")
    rng = np.random.default_rng(0)
    (d / "m.param").write_text(f"7767517\n4 4\nInput in0 0 1 in0\nTimesK s 1 1 in0 s0 0=2.0\n"
                               f"LayerNorm ln 1 1 s0 n0 0={W} 1=1e-5 2=1\nSwish act 1 1 n0 out0\n")
    gamma, beta = rng.uniform(0.5, 1.5, W).astype(np.float32), rng.standard_normal(W).astype(np.float32)
    (d / "m.bin").write_bytes(gamma.tobytes() + beta.tobytes())
    (d / "layers.py").write_text(LAYERS)
    return {"dir": d, "param": d / "m.param", "bin": d / "m.bin", "layers": d / "layers.py"}


def vknorm(*args, log: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, VKNORM_VALIDATION="1", PYTHONUNBUFFERED="1")
    if log is not None:
        env["CUSTOM_LAYERS_LOG"] = str(log)
    return subprocess.run([sys.executable, "-m", "vknorm", *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def logged(log: Path) -> set:
    return set(log.read_text().split("\n")) - {""}


@pytest.mark.parametrize("engine", ["pyncnn", "vulkan"])
def test_check_runs_the_models_own_layer_in_every_net(model, engine, tmp_path):
    if engine == "pyncnn":
        import_or_missing("ncnn")
    log = tmp_path / "log"
    flags = ["--vulkan"] if engine == "vulkan" else []
    r = vknorm("check", *flags, model["param"], model["bin"], "--input", f"in0=8x{W}", "--custom-layers",
               model["layers"], "--json", log=log)
    assert r.returncode == 0, (r.stdout, r.stderr)
    result = json.loads(r.stdout)
    assert result["ok"] and result["custom_layers"] == str(model["layers"])
    assert [row["name"] for row in result["layers"]] == ["ln"]
    module = "ncnn" if engine == "pyncnn" else "vknorm.graph"
    assert {f"register {module}", f"forward {module}"} <= logged(log)
    if engine == "vulkan":  # the Swish after the norm still fuses into it, beside the Python layer
        assert result["fused"] and result["fused"][0]["layers"] == ["ln", "act"]
        assert result["host_round_trips"] == 0  # vknorm's layer stayed on the GPU; the Python one is ncnn's to move


def test_bench_model_runs_it_in_each_implementation(model, tmp_path):
    import_or_missing("ncnn")
    log = tmp_path / "log"
    r = vknorm("bench", "--model", model["param"], model["bin"], "--input", f"in0=8x{W}", "--iters", "2",
               "--custom-layers", model["layers"], "--json", "-", log=log)
    assert r.returncode == 0, (r.stdout, r.stderr)
    report = json.loads(r.stdout)
    assert {x["impl"] for x in report["results"]} == {"ncnn-cpu", "ncnn-vulkan", "vknorm-in-graph", "vknorm-fused",
                                                      "vknorm-host"}
    assert all(x["ms"] > 0 for x in report["results"]) and report["custom_layers"] == str(model["layers"])
    assert {"register ncnn", "forward ncnn", "register vknorm.graph", "forward vknorm.graph"} <= logged(log)


def test_without_the_flag_the_type_is_named_with_the_flag_to_give(model):
    r = vknorm("check", "--vulkan", model["param"], model["bin"], "--input", f"in0=8x{W}")
    assert_one_line_error(r, "line 4: layer 's' is of type 'TimesK'", "--custom-layers FILE.py")


def test_bad_layer_files_and_what_their_layers_do_wrong_are_one_line_errors(model, tmp_path):
    broken_forward = "1 / 0\n            bottom_top_blob.clone_from("
    files = {
        "missing.py": None,
        "imports.py": "import no_such_module_here\n",
        "nothing.py": "register = 3\n",
        "refuses.py": "def register(ncnn, net):\n    raise KeyError('not this net')\n",
        "registers_nothing.py": "def register(ncnn, net):\n    pass\n",
        "raises.py": LAYERS.replace("bottom_top_blob.clone_from(", broken_forward),
        "exits.py": LAYERS.replace("bottom_top_blob.clone_from(", "raise SystemExit(3)\n            ("),
        "returns_none.py": LAYERS.replace("            return 0\n\n    def make", "\n    def make"),
    }
    for name, text in files.items():
        if text is not None:
            (tmp_path / name).write_text(text)
    forward_line = "            bottom_top_blob.clone_from(ncnn.Mat(np.array(bottom_top_blob) * self.k))"
    line = LAYERS.split("\n").index(forward_line)
    want = {
        "missing.py": "no such file",
        "imports.py": "importing it raised ModuleNotFoundError: No module named 'no_such_module_here' at line 1",
        "nothing.py": "defines no register(ncnn, net)",
        "refuses.py": "register(vknorm.graph, net) raised KeyError: 'not this net' at line 2 (register)",
        "registers_nothing.py": "of type 'TimesK', which this ncnn does not have (nor vknorm's layers; "
                                f"--custom-layers {tmp_path / 'registers_nothing.py'} did not register it)",
        "raises.py": f"a layer raised ZeroDivisionError: division by zero at line {line + 1} (forward_inplace)",
        "exits.py": f"a layer raised SystemExit: 3 at line {line + 1} (forward_inplace)",
        "returns_none.py": "a layer raised TypeError: Python layer s (TimesK).forward_inplace returned NoneType",
    }
    for name, needle in want.items():
        r = vknorm("check", "--vulkan", model["param"], model["bin"], "--input", f"in0=8x{W}", "--custom-layers",
                   tmp_path / name, log=tmp_path / "log")
        assert_one_line_error(r, str(tmp_path / name), needle)
    assert_one_line_error(vknorm("check", model["param"], model["bin"], "--custom-layers", model["param"]),
                          "a Python file (FILE.py)")
    for name, needle in (("raises.py", "ZeroDivisionError"), ("returns_none.py", "pyncnn cannot take")):
        r = vknorm("check", model["param"], model["bin"], "--input", f"in0=8x{W}", "--custom-layers", tmp_path / name,
                   log=tmp_path / "log")  # pyncnn's engine
        assert_one_line_error(r, str(tmp_path / name), needle)
    r = vknorm("bench", "--model", model["param"], model["bin"], "--input", f"in0=8x{W}", "--iters", "2",
               "--custom-layers", tmp_path / "raises.py", log=tmp_path / "log")
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    assert r.stderr.strip().startswith("vknorm bench: error: --custom-layers") and "ZeroDivisionError" in r.stderr
    r = vknorm("bench", "--custom-layers", model["layers"])
    assert r.returncode == 2 and "--custom-layers goes with --model" in r.stderr


def test_optimize_fuses_around_the_models_own_layer(model, tmp_path):
    """optimize loads the fused model to check it: with the file's layers registered there."""
    out = tmp_path / "o.param", tmp_path / "o.bin"
    r = vknorm("optimize", model["param"], model["bin"], *out)
    assert r.returncode == 2 and "(--custom-layers FILE.py registers a model's own types)" in r.stderr
    code = open(model["layers"]).read()
    for outputs in ((model["layers"], out[1]), (out[0], model["layers"])):  # the file's code is not replaced
        r = vknorm("optimize", model["param"], model["bin"], *outputs, "--custom-layers", model["layers"])
        assert r.returncode == 2 and "is the --custom-layers file: the model would replace its code" in r.stderr
    assert open(model["layers"]).read() == code
    r = vknorm("optimize", model["param"], model["bin"], *out, "--custom-layers", model["layers"], "--json",
               log=tmp_path / "log")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert [f["layers"] for f in json.loads(r.stdout)["fused"]] == [["ln", "act"]]
    types = [line.split()[0] for line in out[0].read_text().splitlines()[2:]]
    assert "TimesK" in types and "Swish" not in types and "LayerNorm" not in types
    assert "register vknorm.graph" in logged(tmp_path / "log")
    # the layers let go as the check's net goes: what their destroy_pipeline raises is one line, its prints on stderr
    let_go = LAYERS.replace("        def forward_inplace(", "        def destroy_pipeline(self, opt):\n"
                            "            print('destroying')\n            return 0\n\n        def forward_inplace(")
    (tmp_path / "prints.py").write_text(let_go)
    (tmp_path / "raises.py").write_text(let_go.replace("            return 0\n\n        def forward_inplace(",
                                                      "            raise KeyError('let go')\n\n"
                                                      "        def forward_inplace("))
    r = vknorm("optimize", model["param"], model["bin"], *out, "--custom-layers", tmp_path / "prints.py", "--json",
               log=tmp_path / "log")
    assert r.returncode == 0 and "destroying" in r.stderr, (r.stdout, r.stderr)
    json.loads(r.stdout)
    r = vknorm("optimize", model["param"], model["bin"], *out, "--custom-layers", tmp_path / "raises.py",
               log=tmp_path / "log")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == ["destroying", r.stderr.splitlines()[-1]], r.stderr  # its print, then one line
    assert r.stderr.splitlines()[-1].startswith("vknorm optimize: error: --custom-layers") and "'let go'" in r.stderr


def test_the_files_prints_stay_out_of_the_json_report_and_it_loads_in_the_worker(model, tmp_path):
    """FILE.py imported in the worker (pyncnn's examples import ncnn at the top: that must not keep the command in the
    process that judges a crash), its prints sent to stderr, not into a report on stdout."""
    import_or_missing("ncnn")
    noisy = tmp_path / "noisy.py"
    noisy.write_text("import ncnn  # noqa: F401\n"
                     + LAYERS.replace("    log(\"register \" + ncnn.__name__)",
                                      "    print('registering')\n    log(\"register \" + ncnn.__name__)")
                     + "\nprint('imported')\nlog(f'importer {os.getppid()}')  # the parent of the importing process\n")
    for flags in ((), ("--vulkan",)):
        log = tmp_path / f"log{len(flags)}"
        r = vknorm("check", *flags, model["param"], model["bin"], "--input", f"in0=8x{W}", "--custom-layers", noisy,
                   "--json", log=log)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert json.loads(r.stdout)["ok"]
        # imported by a process whose parent is the command's (its worker), not by the command itself
        importers = {int(line.split()[1]) for line in logged(log) if line.startswith("importer ")}
        assert importers and os.getpid() not in importers, importers
    r = vknorm("bench", "--model", model["param"], model["bin"], "--input", f"in0=8x{W}", "--iters", "2",
               "--custom-layers", noisy, "--json", "-", log=tmp_path / "log")
    assert r.returncode == 0 and "imported" in r.stderr and "registering" in r.stderr, (r.stdout, r.stderr)
    assert len(json.loads(r.stdout)["results"]) == 5
    # every call's print, also those made while the command captures ncnn's log around a net's load
    calls = [line for line in (tmp_path / "log").read_text().splitlines() if line.startswith("register ")]
    assert len(calls) >= 5 and r.stderr.splitlines().count("registering") == len(calls), (calls, r.stderr)

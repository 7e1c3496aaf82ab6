"""vknorm's ncnn layers from C++: the library is configured WITH ncnn (-DVKNORM_NCNN=ON, -Dncnn_DIR=<the ncnn
that `make setup` builds from source>), built and installed to build/cxx-ncnn-install; examples/ (a standalone
CMake project) is built against that install and that ncnn through find_package(vknorm) + find_package(ncnn),
and examples/ncnn_example.cpp runs committed models in an ncnn::Net with vknorm::ncnn::register_layers(net).

What is asserted, for transformer_block (16x64, 3 LayerNorms), ln_residual_stack (197x768, 12 LayerNorms)
and sd_resblock_c320 (320x8x8, 2 GroupNorms of 10 channels per group):
* the install is a CMake package that exports vknorm::vknorm_ncnn and installs vknorm/ncnn.h; the example's
  build found both packages where this test put them;
* the program's input pattern (documented in ncnn_example.cpp) is reproduced by numpy bit for bit;
* (a) C++ vknorm output == vknorm.graph's (Python; the same C++ layers in the same ncnn, same device, same
  options) on the same input, float32 and float16 storage: bit for bit (one code path, one device; a
  difference means the Python extension was built from other sources than build/cxx-ncnn-build: rerun
  `make setup`);
* (b) every vknorm layer ran on Vulkan exactly once: cpu_forwards 0, vulkan_forwards == the .param's
  LayerNorm/RMSNorm count (per layer and in total); stock runs report no vknorm layer;
* (c) C++ vknorm Vulkan vs C++ stock Vulkan, measured against C++ stock CPU fp32 with `vknorm check --vulkan`'s
  model-output rule: err(vknorm) <= 2 * err(stock Vulkan) + atol (1e-4 fp32 | 1e-3 fp16) x max(1, max|out|);
* (d) C++ --cpu with vknorm (vknorm's CPU forward = ncnn's own CPU layers) vs stock ncnn CPU bit for bit,
  every vknorm forward on the CPU;
* every Vulkan run of the program under the Khronos validation layer loaded into ncnn's own instance
  (graph_runs.validated_env, synchronization validation on): the layer wrote its log file (so it was
  loaded) and the log is empty;
* ncnn errors and bad arguments give non-zero exit codes (1 and 2);
* ncnn's binary params (as ncnn2mem writes them, tests/param_bin.py) through load_param_bin: the norms by ncnn's
  type index, a fused model's vknorm types under the custom indexes ncnn2mem numbers them by
  (vknorm::ncnn::register_layer), blobs by index, a Runner's extract too: the text params' run bit for bit; a
  fused type in binary params that register_layer did not name is refused at load, not guessed.

Skipped (whole module) only where the ncnn prefix does not exist, outside `make test` (under it, a failure). The
prefix: NCNN_PREFIX in the environment, else the Makefile's. Build directories persist under build/
(cxx-ncnn-build, cxx-ncnn-install, cxx-ncnn-example): the first library build takes ~1 min on 2 cores, later
runs only rebuild what changed.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import graph_runs
import param_bin
from availability import missing
from test_deploy_cpp import ROOT, cmake_env, configure_consumer, generator_args, run

pytestmark = pytest.mark.timeout(900)


def ncnn_prefix() -> str:
    """NCNN_PREFIX from the environment, else the Makefile's (the ncnn `make setup` builds), under
    VKNORM_CACHE instead of ~/.cache/vknorm when that is set (tools/build_ncnn.sh's cache, as
    tools/gpu_build.sh uses it)."""
    if os.environ.get("NCNN_PREFIX"):
        return os.environ["NCNN_PREFIX"]
    with open(os.path.join(ROOT, "Makefile")) as f:
        m = re.search(r"^NCNN_PREFIX\s*:?=\s*(\S+)", f.read(), re.M)
    value = m.group(1) if m else "$(VKNORM_CACHE)/ncnn-1.0.20261020"
    cache = os.environ.get("VKNORM_CACHE") or "$(HOME)/.cache/vknorm"
    value = value.replace("$(VKNORM_CACHE)", cache)
    return value.replace("$(HOME)", os.path.expanduser("~"))


NCNN_PREFIX = ncnn_prefix()
NCNN_DIR = os.path.join(NCNN_PREFIX, "lib", "cmake", "ncnn")
if not os.path.isfile(os.path.join(NCNN_DIR, "ncnnConfig.cmake")):
    missing(f"no ncnn at {NCNN_PREFIX} (make setup builds it with tools/build_ncnn.sh)")

BUILD = os.path.join(ROOT, "build", "cxx-ncnn-build")
PREFIX = os.path.join(ROOT, "build", "cxx-ncnn-install")
EXAMPLE_BUILD = os.path.join(ROOT, "build", "cxx-ncnn-example")
EXE = os.path.join(EXAMPLE_BUILD, "ncnn_example")

MODELS = {"transformer_block": (16, 64), "ln_residual_stack": (197, 768), "sd_resblock_c320": (320, 8, 8)}
# (name, flags): the program's runs per model
RUNS = {
    "vknorm_fp32": [],
    "vknorm_fp16": ["--fp16"],
    "stock_fp32": ["--stock"],
    "stock_fp16": ["--stock", "--fp16"],
    "vknorm_cpu": ["--cpu"],
    "fused_fp32": ["--fuse"],
    "fused_fp16": ["--fuse", "--fp16"],
    "stock_cpu": ["--stock", "--cpu"],
}
CPU_TOL = 0.0  # (d) ncnn's own CPU layers: stock's output bit for bit


def model_files(name):
    return tuple(os.path.join(graph_runs.DATA, f"{name}.ncnn.{e}") for e in ("param", "bin"))


def pattern(dims) -> np.ndarray:
    """ncnn_example's input: k = i * 7919 mod 4099 (integers), x = float32((k - 2049) / 1000.0) in float64."""
    n = int(np.prod(dims))
    k = np.arange(n, dtype=np.int64) * 7919 % 4099
    return ((k - 2049) / 1000.0).astype(np.float32).reshape(dims)


def max_err(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@pytest.fixture(scope="module")
def installed():
    """Configure + build + install the C++ library with its ncnn layers into build/cxx-ncnn-install."""
    env = cmake_env()
    run(["cmake", "-S", ROOT, "-B", BUILD, *generator_args(BUILD), "-DVKNORM_PYTHON=OFF", "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_INSTALL_PREFIX={PREFIX}", "-DVKNORM_NCNN=ON", f"-Dncnn_DIR={NCNN_DIR}"], "configure vknorm", env=env)
    run(["cmake", "--build", BUILD], "build vknorm", env=env)
    shutil.rmtree(PREFIX, ignore_errors=True)  # a clean prefix: only what install puts there
    run(["cmake", "--install", BUILD], "install vknorm", env=env)
    return PREFIX


@pytest.fixture(scope="module")
def example(installed):
    """examples/ configured from scratch against the install and the same ncnn; ncnn_example built."""
    env = cmake_env()
    shutil.rmtree(EXAMPLE_BUILD, ignore_errors=True)
    run(["cmake", "-S", os.path.join(ROOT, "examples"), "-B", EXAMPLE_BUILD, *generator_args(EXAMPLE_BUILD),
         f"-DCMAKE_PREFIX_PATH={installed}", f"-Dncnn_DIR={NCNN_DIR}"], "configure the examples", env=env)
    run(["cmake", "--build", EXAMPLE_BUILD, "--target", "ncnn_example"], "build ncnn_example", env=env)
    assert os.access(EXE, os.X_OK)
    return EXE


CONTRACTS_BUILD = os.path.join(ROOT, "build", "cxx-ncnn-contracts")


def test_ncnn_layer_contracts_hold(installed):
    """tests/cpp/ncnn_contracts.cpp against the install and this ncnn: a float16 blob reaching a layer's CPU forward
    (a layer kept off Vulkan by featmask bit 4 in a Vulkan net, on a discrete GPU) gives the float32 result of the
    same values, bit for bit, for each norm and the fused add; vknorm::ncnn::Runner gives what ncnn's extract
    gives from one command buffer (Vulkan float32 and float16, CPU), an input as given, -1 for an unknown blob (no
    command buffer used), a new command buffer after a failed extract, an int8 blob cast to float32 as ncnn does, a
    host layer's blob as that layer wrote it, light mode recomputing from an earlier download as ncnn does;
    extract_recorded given an opt without VkAllocators (use_vulkan_compute on or off) is -1, not a crash, and
    records an extractor not given opt's allocators with them; a bfloat16 net's every extract is -1, said as such;
    load_param_fused with a null path is -1; register_layers after load_param is -1 (the layers made stock already)
    and registers after clear(); a Runner made before load_param keeps one command buffer too; register_layer takes
    custom type indexes only, before load_param, and text params naming a type whose index it gave another are
    refused; by blob index, computed_on_host names the Input's blob alone and
    a Runner gives it back as given, ncnn's result for a layer's blob, -1 outside the blobs; name_by_index names
    binary params' blobs and layers by index and their types as ncnn and vknorm name them, and a Runner extracts by
    those names what it extracts by index; builtin_type_name is ncnn's name of a built-in index alone; a Vulkan
    forward records at most one pipeline barrier per buffer (not one per slot), the barrier of each blob it writes
    waiting for the compute work before it, and an in-place one on a blob only read since its last barrier barriers
    it and marks it written."""
    env = cmake_env()
    run(["cmake", "-S", os.path.join(ROOT, "tests", "cpp"), "-B", CONTRACTS_BUILD, *generator_args(CONTRACTS_BUILD),
         f"-DCMAKE_PREFIX_PATH={installed}", f"-Dncnn_DIR={NCNN_DIR}", "-DVKNORM_CPP_TESTS_NCNN=ON"],
        "configure tests/cpp", env=env)
    run(["cmake", "--build", CONTRACTS_BUILD, "--target", "ncnn_contracts"], "build ncnn_contracts", env=env)
    proc = launch(os.path.join(CONTRACTS_BUILD, "ncnn_contracts"), [])
    lines = proc.stdout.strip().splitlines()
    # the bfloat16 check runs on CPU devices only (on an H200 stock ncnn cannot run a bfloat16 net itself)
    import vknorm

    want = 41 if vknorm.device_info()["type"] == "cpu" else 40
    assert proc.returncode == 0 and len(lines) == want and all(l.startswith("ok: ") for l in lines), \
        proc.stdout + proc.stderr[-2000:]
    if "bfloat16 storage: every extract is -1" in proc.stdout:  # said at the forward too, not a plan never made
        assert proc.stderr.count("bfloat16 storage is not supported") >= 2, proc.stderr[-2000:]
        assert "plans workgroups" not in proc.stderr, proc.stderr[-2000:]


def launch(exe, args, env=None, timeout=180):
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc


def parse(out: str) -> dict:
    m = re.search(r"^vknorm counters: vulkan_forwards (\d+), cpu_forwards (\d+), pipelines (\d+)$", out, re.M)
    assert m, out
    layers = {name: {"type": t, "vulkan_forwards": int(v), "cpu_forwards": int(c), "variants": p.split()}
              for name, t, v, c, p in re.findall(r"^vknorm layer (\S+) (\S+): vulkan_forwards (\d+), "
                                                 r"cpu_forwards (\d+), pipelines(.*)$", out, re.M)}
    n = re.search(r"^model: .*, (\d+) vknorm layers", out, re.M)
    storage = re.search(r"^options: vulkan (on|off), storage (fp16|fp32)", out, re.M)
    assert n and storage, out
    return {"vulkan_forwards": int(m.group(1)), "cpu_forwards": int(m.group(2)), "pipelines": int(m.group(3)),
            "layers": layers, "vknorm_layers": int(n.group(1)), "vulkan": storage.group(1) == "on",
            "storage": storage.group(2)}


@pytest.fixture(scope="module")
def cxx_runs(example, tmp_path_factory):
    """Every (model, run) of the program, each Vulkan run under the validation layer with its own log."""
    tmp = tmp_path_factory.mktemp("ncnn_cpp")
    results = {}
    for model, dims in MODELS.items():
        param, binp = model_files(model)
        for run_name, flags in RUNS.items():
            d = tmp / f"{model}-{run_name}"
            d.mkdir()
            log = d / "validation.log"
            env = graph_runs.validated_env(str(log), str(d))
            env.pop("VKNORM_VALIDATION", None)  # vknorm's own context is not used here; ncnn's instance is
            out, inp = d / "out.bin", d / "in.bin"
            proc = launch(example, [param, binp, "x".join(map(str, dims)), *flags, "--out", str(out),
                                    "--dump-input", str(inp)], env=env)
            assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), \
                f"{model} {run_name}: rc {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
            results[(model, run_name)] = {
                "stdout": proc.stdout, **parse(proc.stdout),
                "out": np.fromfile(out, np.float32), "input": np.fromfile(inp, np.float32),
                "log_exists": log.exists(), "log": log.read_text() if log.exists() else ""}
    return results


PY_CHILD = r"""
import json, sys
import numpy as np
from vknorm import graph
jobs = json.load(open(sys.argv[1]))
for j in jobs:
    net = graph.configure(graph.Net(vknorm=True, fuse=j["fuse"]), vulkan=True, fp16=j["fp16"])  # as the C++ run loads it
    assert net.load_param(j["param"]) == 0 and net.load_model(j["bin"]) == 0, j
    ex = net.create_extractor()
    assert ex.input("in0", graph.Mat(np.load(j["input"]))) == 0
    r, m = ex.extract("out0")
    assert r == 0, r
    np.save(j["out"], np.array(m))
    j["counters"] = net.vknorm_counters()
    j["variants"] = {l["name"]: l["variants"] for l in net.vknorm_layers()}
    j["device"] = graph.gpu_name()
    del ex, net
json.dump(jobs, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def py_runs(tmp_path_factory):
    """vknorm.graph (Python) on the same models, inputs and options, in a child process (its own ncnn instance)."""
    tmp = tmp_path_factory.mktemp("ncnn_py")
    jobs = []
    for model, dims in MODELS.items():
        param, binp = model_files(model)
        inp = tmp / f"{model}-in.npy"
        np.save(inp, pattern(dims))
        for fp16 in (False, True):
            for fuse in (False, True):
                jobs.append({"model": model, "fp16": fp16, "fuse": fuse, "param": param, "bin": binp,
                             "input": str(inp), "out": str(tmp / f"{model}-{int(fp16)}-{int(fuse)}-out.npy")})
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    proc = subprocess.run([sys.executable, "-c", PY_CHILD, str(tmp / "jobs.json"), str(tmp / "done.json")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, "vknorm.graph run failed (is vknorm built with ncnn? make setup)\n" + proc.stderr[-4000:]
    done = json.loads((tmp / "done.json").read_text())
    return {(j["model"], j["fp16"]) + (("fused",) if j["fuse"] else ()): {**j, "out": np.load(j["out"])} for j in done}


# ------------------------------------------------------------------------------ the package and the build

def test_install_exports_the_ncnn_layers(installed):
    lib = sorted(f for f in os.listdir(os.path.join(installed, "lib")) if f.startswith("libvknorm"))
    assert lib == ["libvknorm.a", "libvknorm_ncnn.a"], lib
    assert os.path.isfile(os.path.join(installed, "include", "vknorm", "ncnn.h"))
    cfg = os.path.join(installed, "lib", "cmake", "vknorm")
    with open(os.path.join(cfg, "vknormTargets.cmake")) as f:
        targets = f.read()
    assert "vknorm::vknorm_ncnn" in targets, targets[:2000]
    with open(os.path.join(cfg, "vknormConfig.cmake")) as f:
        config = f.read()
    assert re.search(r"set\(_vknorm_has_ncnn (TRUE|ON|1)\)", config), config


@pytest.mark.parametrize("component", ["ncnn", "vknorm_ncnn"])
def test_package_with_ncnn_layers_has_its_ncnn_component(installed, tmp_path, component):
    """find_package(vknorm COMPONENTS ncnn) (or the target's name, vknorm_ncnn) succeeds on an install with the
    layers, given the same ncnn."""
    proc = configure_consumer(tmp_path, f"0.1 CONFIG REQUIRED COMPONENTS {component}",
                              f"-DCMAKE_PREFIX_PATH={installed}", f"-Dncnn_DIR={NCNN_DIR}")
    assert proc.returncode == 0, proc.stderr
    assert "vknorm_FOUND=1 vknorm_ncnn_FOUND=TRUE" in proc.stdout, proc.stdout


def test_package_with_ncnn_layers_needs_no_ncnn_unless_its_component_is_asked_for(installed, tmp_path):
    """An install with the layers, no ncnn to be found: vknorm::vknorm alone is found; OPTIONAL_COMPONENTS ncnn is
    found without it (vknorm_ncnn_FOUND false); COMPONENTS ncnn fails, naming ncnn."""
    for args, ok, said in (("0.1 CONFIG REQUIRED", True, "vknorm_FOUND=1 vknorm_ncnn_FOUND=FALSE"),
                           ("0.1 CONFIG REQUIRED OPTIONAL_COMPONENTS ncnn", True, "vknorm_FOUND=1 vknorm_ncnn_FOUND=0"),
                           ("0.1 CONFIG REQUIRED COMPONENTS ncnn", False, "ncnn")):
        proc = configure_consumer(tmp_path / str(len(args)), args, f"-DCMAKE_PREFIX_PATH={installed}",
                                  "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF")
        assert (proc.returncode == 0) == ok and said in proc.stdout + proc.stderr, (args, proc.stdout, proc.stderr)


def test_the_ncnn_layers_target_without_any_ncnn_stops_the_configure_step(installed, tmp_path):
    """vknorm::vknorm_ncnn linked where no ncnn target exists (neither the component nor the consumer found ncnn)
    would link a bare -lncnn, perhaps another ncnn: the generate step stops, naming what to ask for. With the
    component, or with ncnn found by the consumer after vknorm, it links."""
    proc = configure_consumer(tmp_path, "0.1 CONFIG REQUIRED", f"-DCMAKE_PREFIX_PATH={installed}",
                              "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF", links="vknorm::vknorm_ncnn")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "vknorm::vknorm_ncnn_needs_find_package_COMPONENTS_ncnn" in proc.stderr, proc.stderr
    proc = configure_consumer(tmp_path / "with", "0.1 CONFIG REQUIRED COMPONENTS ncnn",
                              f"-DCMAKE_PREFIX_PATH={installed}", f"-Dncnn_DIR={NCNN_DIR}", links="vknorm::vknorm_ncnn")
    assert proc.returncode == 0, proc.stderr
    proc = configure_consumer(tmp_path / "after", "0.1 CONFIG REQUIRED", f"-DCMAKE_PREFIX_PATH={installed}",
                              f"-Dncnn_DIR={NCNN_DIR}", links="vknorm::vknorm_ncnn",
                              then="find_package(ncnn CONFIG REQUIRED)\n")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("flag", ["", "-fno-rtti", "-fno-exceptions"], ids=["rtti-and-exceptions", "no-rtti",
                                                                           "no-exceptions"])
def test_an_ncnn_without_rtti_or_exceptions_stops_the_configure_step_saying_so(tmp_path, flag):
    """ncnn's Android and iOS builds hand -fno-rtti / -fno-exceptions to what links it, which vknorm's layers cannot
    compile under: configuring against such an ncnn (a package config of this ncnn's headers, with the flag) stops
    with the ncnn options to build it with; without the flag it configures."""
    fake = tmp_path / "ncnn"
    fake.mkdir()
    options = f'INTERFACE_COMPILE_OPTIONS "$<$<COMPILE_LANGUAGE:CXX>:{flag}>"' if flag else ""
    (fake / "ncnnConfig.cmake").write_text(
        "set(NCNN_VULKAN ON)\nadd_library(ncnn STATIC IMPORTED)\n"
        f'set_target_properties(ncnn PROPERTIES IMPORTED_LOCATION "{NCNN_PREFIX}/lib/libncnn.a"\n'
        f'  INTERFACE_INCLUDE_DIRECTORIES "{NCNN_PREFIX}/include/ncnn" {options})\n')
    build = tmp_path / "build"
    proc = subprocess.run(["cmake", "-S", ROOT, "-B", str(build), *generator_args(str(build)), "-DVKNORM_PYTHON=OFF",
                           "-DVKNORM_NCNN=ON", f"-Dncnn_DIR={fake}"], capture_output=True, text=True, env=cmake_env())
    if not flag:
        assert proc.returncode == 0, proc.stderr[-3000:]
        return
    assert proc.returncode != 0, proc.stdout[-2000:]
    said = " ".join(proc.stderr.split())
    assert (f"vknorm's ncnn layers need an ncnn built with RTTI and exceptions, but {fake} hands {flag} to what links "
            "it: build ncnn with -DNCNN_DISABLE_RTTI=OFF -DNCNN_DISABLE_EXCEPTION=OFF") in said, proc.stderr[-3000:]


def test_example_found_this_install_and_this_ncnn(example):
    with open(os.path.join(EXAMPLE_BUILD, "CMakeCache.txt")) as f:
        cache = f.read()
    for var, want in (("vknorm_DIR", os.path.join(PREFIX, "lib", "cmake", "vknorm")), ("ncnn_DIR", NCNN_DIR)):
        m = re.search(rf"^{var}:[A-Z]+=(.*)$", cache, re.M)
        assert m and os.path.realpath(m.group(1)) == os.path.realpath(want), (var, m and m.group(1))
    # ...and links those archives: vknorm's two from the install, ncnn's from the ncnn prefix
    link = ""
    for f in ("build.ninja", os.path.join("CMakeFiles", "ncnn_example.dir", "link.txt")):
        if os.path.exists(os.path.join(EXAMPLE_BUILD, f)):
            with open(os.path.join(EXAMPLE_BUILD, f)) as fh:
                link += fh.read()
    for lib in (os.path.join(PREFIX, "lib", "libvknorm_ncnn.a"), os.path.join(PREFIX, "lib", "libvknorm.a"),
                os.path.join(NCNN_PREFIX, "lib", "libncnn.a")):
        assert lib in link, f"{lib} is not on ncnn_example's link line"
    if shutil.which("readelf"):  # ncnn (simplevk) and vknorm both open the Vulkan loader at run time
        needed = subprocess.run(["readelf", "-d", example], capture_output=True, text=True).stdout
        assert "libvulkan" not in needed, needed


def test_input_pattern_is_reproduced_by_numpy_bit_for_bit(cxx_runs):
    for (model, run_name), r in cxx_runs.items():
        want = pattern(MODELS[model]).ravel()
        assert r["input"].shape == want.shape and r["input"].tobytes() == want.tobytes(), (model, run_name)


# ------------------------------------------------------------------------------ the runs

def validation_messages(log: str) -> list[tuple[str, str]]:
    """(name, text) of each message of a layer log: its '[ VUID or name ]' and the rest of that line and the
    next (older layers write the text on the header line, newer ones below it)."""
    return re.findall(r"\[ ([A-Za-z0-9_-]+) \]([^\n]*\n?[^\n]*)", log)


def test_validation_layer_loaded_into_ncnns_instance_and_silent(cxx_runs):
    """vknorm's runs log nothing. Stock ncnn is the control that the layer is loaded; its own in-place layers
    on a blob that a Split shares make ncnn copy the blob into a pool block with no barrier against the copy
    that block last saw (newer layers report it as a write-after-write of two vkCmdCopyBuffer): that message,
    and only that one, is allowed in a stock run."""
    for (model, run_name), r in cxx_runs.items():
        if not r["vulkan"]:
            continue
        assert r["log_exists"], (f"{model} {run_name}: the validation layer wrote no log: not loaded "
                                 "(make setup installs vulkan-validationlayers)")
        stock = run_name.startswith("stock")
        assert not unexpected_messages(r["log"], stock), f"{model} {run_name}:\n{r['log'][:4000]}"


def unexpected_messages(log: str, stock: bool) -> list:
    """What fails a run's validation log: anything in it, but in a stock run ncnn's own copy hazard (the test
    above)."""
    if not stock:
        return [log] if log.strip() else []
    return [(name, text) for name, text in validation_messages(log)
            if not (name == "SYNC-HAZARD-WRITE-AFTER-WRITE" and "vkCmdCopyBuffer writes" in text
                    and "another vkCmdCopyBuffer" in text)]


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_cxx_output_equals_vknorm_graph_output(cxx_runs, py_runs, model, fp16):
    """(a) The same layers, ncnn, device and options from C++ and from Python: bit for bit expected."""
    c = cxx_runs[(model, "vknorm_fp16" if fp16 else "vknorm_fp32")]
    p = py_runs[(model, fp16)]
    y_c, y_p = c["out"], p["out"].ravel()
    assert p["out"].shape == MODELS[model] and y_c.shape == y_p.shape, (p["out"].shape, y_c.shape)
    assert c["storage"] == ("fp16" if fp16 else "fp32"), c["stdout"]
    identical = y_c.tobytes() == y_p.tobytes()
    err = max_err(y_c, y_p)
    print(f"{model} {'fp16' if fp16 else 'fp32'}: C++ vs vknorm.graph "
          f"{'bit-identical' if identical else f'max |diff| {err:.3e} (NOT bit-identical)'}")
    cxx_variants = {name: l["variants"] for name, l in c["layers"].items()}
    hint = ("" if cxx_variants == p["variants"] else
            f"\nthe two builds plan differently (stale Python extension? make setup):\nC++ {cxx_variants}\nPy  {p['variants']}")
    assert identical, f"{model} fp16={fp16}: max |diff| {err:.3e}{hint}"


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_cxx_fused_output_equals_vknorm_graph_fused_output(cxx_runs, py_runs, model, fp16):
    """vknorm::ncnn::load_param_fused from C++ and vknorm.graph.Net() (fusing by default) from Python: the
    same rewrite and the same kernels, bit for bit."""
    c = cxx_runs[(model, "fused_fp16" if fp16 else "fused_fp32")]
    p = py_runs[(model, fp16, "fused")]
    n = int(re.search(r"^fused: (\d+)$", c["stdout"], re.M).group(1))
    assert n == {"transformer_block": 2, "ln_residual_stack": 12, "sd_resblock_c320": 2}[model], c["stdout"]
    assert c["out"].tobytes() == p["out"].ravel().tobytes(), max_err(c["out"], p["out"].ravel())


@pytest.mark.parametrize("model", list(MODELS))
def test_every_norm_layer_ran_once_on_vulkan(cxx_runs, py_runs, model):
    """(b) No host round trip: per layer and in total, vulkan_forwards == the .param's norm layers, cpu 0."""
    norms = graph_runs.norm_layers(model_files(model)[0])
    assert norms
    for run_name in ("vknorm_fp32", "vknorm_fp16"):
        r = cxx_runs[(model, run_name)]
        assert r["vknorm_layers"] == len(norms), r["stdout"]
        assert r["cpu_forwards"] == 0 and r["vulkan_forwards"] == len(norms), r["stdout"]
        assert set(r["layers"]) == {n[0] for n in norms}, r["stdout"]
        for name, layer in r["layers"].items():
            assert layer["vulkan_forwards"] == 1 and layer["cpu_forwards"] == 0 and layer["variants"], (name, layer)
    for fp16 in (False, True):  # vknorm.graph counts the same
        c = py_runs[(model, fp16)]["counters"]
        assert c["cpu_forwards"] == 0 and c["vulkan_forwards"] == len(norms), c
    for run_name in ("stock_fp32", "stock_fp16", "stock_cpu"):
        r = cxx_runs[(model, run_name)]
        assert r["vknorm_layers"] == 0 and r["vulkan_forwards"] == r["cpu_forwards"] == 0, r["stdout"]


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_vknorm_is_as_close_to_stock_cpu_as_stock_vulkan(cxx_runs, model, fp16):
    """(c) `vknorm check --vulkan`'s rule for a model output (graph_runs.stock_bound: twice stock ncnn Vulkan's
    difference from the CPU run plus the layer rule's atol at the output's scale), all three runs from the C++
    program."""
    sfx = "fp16" if fp16 else "fp32"
    cpu = cxx_runs[(model, "stock_cpu")]["out"]
    vk, stock = cxx_runs[(model, f"vknorm_{sfx}")], cxx_runs[(model, f"stock_{sfx}")]
    assert stock["storage"] == sfx and stock["vulkan"], stock["stdout"]
    e_vk, e_stock = max_err(vk["out"], cpu), max_err(stock["out"], cpu)
    print(f"{model} {sfx}: vs stock CPU fp32: vknorm {e_vk:.3e}, stock Vulkan {e_stock:.3e}; "
          f"vknorm vs stock Vulkan {max_err(vk['out'], stock['out']):.3e}")
    assert e_vk <= graph_runs.stock_bound(cpu, stock["out"], fp16), (model, sfx, e_vk, e_stock)


@pytest.mark.parametrize("model", list(MODELS))
def test_cpu_forward_matches_stock_cpu(cxx_runs, model):
    """(d) --cpu: vknorm's layers run ncnn's own CPU layers, as stock ncnn does."""
    v, s = cxx_runs[(model, "vknorm_cpu")], cxx_runs[(model, "stock_cpu")]
    n = len(graph_runs.norm_layers(model_files(model)[0]))
    assert not v["vulkan"] and v["cpu_forwards"] == n and v["vulkan_forwards"] == 0, v["stdout"]
    err = max_err(v["out"], s["out"])
    print(f"{model}: --cpu vknorm vs stock {err:.3e}")
    assert err <= CPU_TOL, (model, err)


@pytest.mark.parametrize("flags", [["--fuse"], ["--fuse", "--fp16"], ["--stock"], ["--cpu"]],
                         ids=["fused_fp32", "fused_fp16", "stock_fp32", "vknorm_cpu"])
def test_a_runner_keeps_one_command_buffer_and_gives_what_ncnns_extract_gives(example, cxx_runs, tmp_path, flags):
    """vknorm::ncnn::Runner: repeated inferences, an extractor each, through one kept command buffer (none on the
    CPU), every output the single ncnn-extract run's bit for bit; under the validation layer."""
    model, dims = "transformer_block", MODELS["transformer_block"]
    param, binp = model_files(model)
    log, out = tmp_path / "validation.log", tmp_path / "out.bin"
    env = graph_runs.validated_env(str(log), str(tmp_path))
    env.pop("VKNORM_VALIDATION", None)
    proc = launch(example, [param, binp, "x".join(map(str, dims)), *flags, "--runner", "--repeat", "4",
                            "--out", str(out)], env=env)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), proc.stdout + proc.stderr[-3000:]
    made = 0 if "--cpu" in flags else 1
    assert re.search(rf"^inferences: 4, median [0-9.]+ ms each, every output identical; runner command buffers "
                     rf"made: {made}$", proc.stdout, re.M), proc.stdout
    single = {"--fuse": "fused", "--stock": "stock", "--cpu": "vknorm"}[flags[0]] + \
        ("_cpu" if "--cpu" in flags else "_fp16" if "--fp16" in flags else "_fp32")
    assert np.array_equal(np.fromfile(out, np.float32), cxx_runs[(model, single)]["out"])
    if "--cpu" not in flags:
        assert log.exists() and log.read_text() == ""


def test_errors_give_nonzero_exit_codes(example, tmp_path):
    param, binp = model_files("transformer_block")
    bad_args = [[], [param, binp], [param, binp, "16x0"], [param, binp, "1x2x3x4x5"], [param, binp, "16x64", "--nope"],
                [str(tmp_path / "missing.param"), binp, "16x64"], [param, binp, "16x64", "--repeat", "0"],
                [param, binp, "16x64", "--repeat", "2x"], [param, binp, "16x64", "--repeat"]]
    for args in bad_args:
        proc = launch(example, args, timeout=60)
        assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
    helped = launch(example, ["--help"], timeout=60)  # the usage on stdout, exit 0
    assert helped.returncode == 0 and helped.stdout.startswith("usage: ncnn_example"), (helped.stdout, helped.stderr)
    # ncnn errors: a .param ncnn rejects; a model without the blob out0 (extract fails)
    garbage = tmp_path / "garbage.param"
    garbage.write_text("not an ncnn param\n")
    no_out0 = tmp_path / "no_out0.param"
    no_out0.write_text("7767517\n2 2\nInput in0 0 1 in0\nReLU relu 1 1 in0 y\n")
    empty_bin = tmp_path / "empty.bin"
    empty_bin.write_bytes(b"")
    for p, what in ((garbage, "load_param"), (no_out0, "extract out0")):
        proc = launch(example, [str(p), str(empty_bin), "16x64", "--cpu"], timeout=60)
        assert proc.returncode == 1 and what in proc.stderr, (what, proc.returncode, proc.stderr)
        assert "OK" not in proc.stdout.split(), proc.stdout
    # an input that cannot be allocated (its bytes past the address space, or past size_t): an error, not an abort.
    # (Merely past this host's memory is not refused where the kernel overcommits: the H200 host began filling 4 TB.)
    for dims in ("1073741824x1073741824", "3x1073741824x1073741824", "1073741824x1073741824x1073741824x1073741824"):
        proc = launch(example, [param, binp, dims, "--cpu"], timeout=60)
        assert proc.returncode == 1, (dims, proc.returncode, proc.stderr)
        assert proc.stderr.strip().splitlines()[-1] == f"ncnn_example: cannot allocate the input {dims}", proc.stderr


# ------------------------------------------------------------------------------ binary params (ncnn2mem)

# run -> (its flags besides --param-bin and --custom-type, the text params' run it must equal, inferences)
BINARY_RUNS = {
    "vknorm_fp32": ([], "vknorm_fp32", 1),
    "vknorm_fp16": (["--fp16"], "vknorm_fp16", 1),
    "fused_fp32": ([], "fused_fp32", 1),
    "fused_fp16": (["--fp16", "--runner", "--repeat", "2"], "fused_fp16", 2),
    "stock_fp32": (["--stock"], "stock_fp32", 1),
    "vknorm_cpu": (["--cpu"], "vknorm_cpu", 1),
}


def binary_model(model: str, fused: bool, tmp_path) -> tuple[str, int, int, list[str]]:
    """The model's binary params (of vknorm's fused rewrite where `fused`, as vknorm optimize writes it), the blob
    indexes of in0 and out0, and its custom types by j (ncnn2mem's TYPEINDEX_ is 256 | j)."""
    from vknorm import graph
    from vknorm.optimize import custom_type_indexes
    with open(model_files(model)[0]) as f:
        text = f.read()
    if fused:
        text = graph._graph.fuse_param(text)[0]
    data, blobs, custom = param_bin.to_param_bin(text, graph.layer_to_index)
    # the indexes `vknorm optimize` reports for binary params are those ncnn2mem gives
    assert custom_type_indexes(text) == {t: 256 | j for j, t in enumerate(custom)}
    path = tmp_path / f"{model}{'-fused' if fused else ''}.param.bin"
    path.write_bytes(data)
    return str(path), blobs.index("in0"), blobs.index("out0"), custom


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("run_name", list(BINARY_RUNS))
def test_binary_params_run_as_their_text_params(example, cxx_runs, tmp_path, model, run_name):
    """load_param_bin on the model's binary params: vknorm's layers replace the norms by ncnn's type index; a fused
    model's vknorm type goes under the custom index ncnn2mem gives it (--custom-type: vknorm::ncnn::register_layer);
    blobs by index (through a Runner too). The text params' run bit for bit, the same vknorm layers run as often;
    the validation layer silent."""
    flags, text_run, inferences = BINARY_RUNS[run_name]
    path, in0, out0, custom = binary_model(model, run_name.startswith("fused"), tmp_path)
    assert len(custom) == run_name.startswith("fused"), custom  # each model's norms are of one type
    registered = [arg for j, t in enumerate(custom) for arg in ("--custom-type", f"{256 | j}={t}")]
    log, out = tmp_path / "validation.log", tmp_path / "out.bin"
    env = graph_runs.validated_env(str(log), str(tmp_path))
    env.pop("VKNORM_VALIDATION", None)
    proc = launch(example, [path, model_files(model)[1], "x".join(map(str, MODELS[model])),
                            "--param-bin", f"{in0},{out0}", *registered, *flags, "--out", str(out)], env=env)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), proc.stdout + proc.stderr[-3000:]
    got, want = parse(proc.stdout), cxx_runs[(model, text_run)]
    assert np.fromfile(out, np.float32).tobytes() == want["out"].tobytes(), max_err(np.fromfile(out, np.float32),
                                                                                    want["out"])
    assert (got["vknorm_layers"], got["vulkan_forwards"], got["cpu_forwards"]) == (
        want["vknorm_layers"], want["vulkan_forwards"] * inferences, want["cpu_forwards"] * inferences), proc.stdout
    assert sorted(layer["type"] for layer in got["layers"].values()) == \
        sorted(layer["type"] for layer in want["layers"].values()), proc.stdout
    if got["vulkan"]:
        assert log.exists() and not unexpected_messages(log.read_text(), "--stock" in flags), log.read_text()[:4000]


def test_binary_params_errors(example, tmp_path):
    """A fused type in binary params that register_layer did not name is refused at load (even where the index
    happens to be the one register_layers holds that type at by name), not guessed; register_layer's refusals and
    blob indexes outside the net are ncnn errors (exit 1); malformed flags are usage errors (exit 2). The Input's
    blob by index comes back as given through a Runner."""
    dims = {m: "x".join(map(str, d)) for m, d in MODELS.items()}
    fused = {m: binary_model(m, True, tmp_path) for m in ("transformer_block", "sd_resblock_c320")}
    for model, (path, in0, out0, custom) in fused.items():
        proc = launch(example, [path, model_files(model)[1], dims[model], "--param-bin", f"{in0},{out0}"], timeout=60)
        assert proc.returncode == 1 and "load_param" in proc.stderr, (model, proc.returncode, proc.stderr)
        assert f'vknorm::ncnn::register_layer(net, 256, "vknorm.<type>")' in proc.stderr, proc.stderr
    path, in0, out0, _ = fused["sd_resblock_c320"]
    base = [path, model_files("sd_resblock_c320")[1], dims["sd_resblock_c320"]]
    for extra, message in ((["--custom-type", "256=vknorm.Nope"], "is not one of vknorm's layer types"),
                           (["--custom-type", "5=vknorm.GroupNorm"], "is not a custom one"),
                           (["--custom-type", "256=vknorm.GroupNorm", "--param-bin", f"{in0},999"],
                            "extract blob 999 failed"),
                           (["--custom-type", "256=vknorm.GroupNorm", "--param-bin", f"999,{out0}"],
                            "input blob 999 failed")):
        proc = launch(example, [*base, "--param-bin", f"{in0},{out0}", *extra], timeout=60)
        assert proc.returncode == 1 and message in proc.stderr, (extra, proc.returncode, proc.stderr)
    text_params = [model_files("sd_resblock_c320")[0], *base[1:], "--param-bin", "0,9"]
    proc = launch(example, text_params, timeout=60)  # text params given as binary ones: ncnn refuses them
    assert proc.returncode == 1 and "load_param" in proc.stderr, (proc.returncode, proc.stderr)
    for flags in (["--param-bin", "0"], ["--param-bin", "a,b"], ["--param-bin", "-1,9"], ["--param-bin", "0,9,1"],
                  ["--param-bin", "0,9", "--fuse"], ["--custom-type", "256=vknorm.GroupNorm"],
                  ["--param-bin", "0,9", "--custom-type", "256"], ["--param-bin", "0,9", "--custom-type", "x=y"],
                  ["--param-bin", "0,9", "--custom-type", "256="],
                  ["--param-bin", "0,9", "--stock", "--custom-type", "256=vknorm.GroupNorm"]):
        proc = launch(example, [*base, *flags], timeout=60)
        assert proc.returncode == 2 and proc.stderr.startswith("ncnn_example: "), (flags, proc.returncode,
                                                                                   proc.stderr)
    out = tmp_path / "in0.bin"
    proc = launch(example, [*base, "--param-bin", f"{in0},{in0}", "--custom-type", "256=vknorm.GroupNorm",
                            "--runner", "--out", str(out)], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert np.fromfile(out, np.float32).tobytes() == pattern(MODELS["sd_resblock_c320"]).tobytes()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

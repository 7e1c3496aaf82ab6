"""The C++ API: the plain C++ library is configured with VKNORM_PYTHON=OFF, built, installed to
build/cxx-install, and examples/ (a standalone CMake project) is built against the installed package through
find_package(vknorm), then run: a LayerNorm from an ncnn-style .param line and a raw float32 .bin, on a host
Mat and on a device VkMat, each compared with the CPU reference.

Build directories persist under build/ (cxx-build, cxx-example), so after the first run (~1 min on 2 cores)
only what changed is rebuilt. Ninja when it works, else Unix Makefiles.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Parallel runs (pytest-xdist) give each worker its own library build, install and example build: the install
# fixture empties the prefix first, which must not happen under another worker's tests.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
BUILD = os.path.join(ROOT, "build", "cxx-build" + (f"-{_WORKER}" if _WORKER else ""))
PREFIX = os.path.join(ROOT, "build", "cxx-install" + (f"-{_WORKER}" if _WORKER else ""))
EXAMPLE_BUILD = os.path.join(ROOT, "build", "cxx-example" + (f"-{_WORKER}" if _WORKER else ""))
EXE = os.path.join(EXAMPLE_BUILD, "layernorm_example")

pytestmark = pytest.mark.timeout(900)


def run(cmd, what, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, (f"{what} failed (rc {proc.returncode}): {' '.join(cmd)}\n"
                                  f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def configure_consumer(directory, find_package_args, *cmake_args, links=None, then=""):
    """Configures a consumer whose CMakeLists calls find_package(vknorm <find_package_args>) and prints
    vknorm_ncnn_FOUND (then the CMake text `then`; with `links`, a target: an executable linking it too); returns
    the CompletedProcess (not asserted: some calls must fail)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "CMakeLists.txt"), "w") as f:
        f.write("cmake_minimum_required(VERSION 3.18)\nproject(consumer LANGUAGES CXX)\n"
                f"find_package(vknorm {find_package_args})\n"
                'message(STATUS "vknorm_FOUND=${vknorm_FOUND} vknorm_ncnn_FOUND=${vknorm_ncnn_FOUND}")\n' + then)
        if links:
            f.write(f"add_executable(app main.cpp)\ntarget_link_libraries(app PRIVATE {links})\n")
    with open(os.path.join(directory, "main.cpp"), "w") as f:
        f.write("int main() { return 0; }\n")
    build = os.path.join(directory, "build")
    shutil.rmtree(build, ignore_errors=True)
    return subprocess.run(["cmake", "-S", directory, "-B", build, *generator_args(build), *cmake_args],
                          capture_output=True, text=True, env=cmake_env())


def generator_args(build_dir):
    """-G Ninja for a new build directory when ninja runs here; an existing one keeps its generator."""
    if os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        return []
    ninja = shutil.which("ninja")
    if ninja and subprocess.run([ninja, "--version"], capture_output=True).returncode == 0:
        return ["-G", "Ninja"]
    return ["-G", "Unix Makefiles"]


def cmake_env():
    env = dict(os.environ)
    env.pop("CMAKE_PREFIX_PATH", None)  # the installed package must be found through our prefix only
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    return env


@pytest.fixture(scope="module")
def installed():
    """Configure + build + install the C++ library (VKNORM_PYTHON=OFF) into build/cxx-install."""
    env = cmake_env()
    run(["cmake", "-S", ROOT, "-B", BUILD, *generator_args(BUILD), "-DVKNORM_PYTHON=OFF",
         "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_INSTALL_PREFIX={PREFIX}"], "configure vknorm", env=env)
    build = run(["cmake", "--build", BUILD], "build vknorm", env=env)
    shutil.rmtree(PREFIX, ignore_errors=True)  # a clean prefix: only what install puts there
    run(["cmake", "--install", BUILD], "install vknorm", env=env)
    return build.stdout


@pytest.fixture(scope="module")
def example(installed):
    """examples/ configured from scratch against the installed package, built."""
    env = cmake_env()
    shutil.rmtree(EXAMPLE_BUILD, ignore_errors=True)
    run(["cmake", "-S", os.path.join(ROOT, "examples"), "-B", EXAMPLE_BUILD, *generator_args(EXAMPLE_BUILD),
         f"-DCMAKE_PREFIX_PATH={PREFIX}"], "configure the example", env=env)
    run(["cmake", "--build", EXAMPLE_BUILD], "build the example", env=env)
    assert os.access(EXE, os.X_OK)
    return EXE


def test_install_tree_is_a_cmake_package_without_vulkan(installed):
    lib = [f for f in os.listdir(os.path.join(PREFIX, "lib")) if f.startswith("libvknorm")]
    assert lib == ["libvknorm.a"], lib
    cfg = os.path.join(PREFIX, "lib", "cmake", "vknorm")
    assert {"vknormConfig.cmake", "vknormConfigVersion.cmake", "vknormTargets.cmake"} <= set(os.listdir(cfg))
    headers = sorted(os.listdir(os.path.join(PREFIX, "include", "vknorm")))
    assert headers == ["context.h", "mat.h", "norm.h", "option.h", "recorder.h", "vknorm.h"], headers
    for h in headers:  # consumers need no Vulkan headers
        with open(os.path.join(PREFIX, "include", "vknorm", h)) as f:
            text = f.read()
        assert not re.search(r"#\s*include\s*[<\"]vulkan", text), f"{h} includes a Vulkan header"
    with open(os.path.join(cfg, "vknormTargets.cmake")) as f:
        targets = f.read()
    assert "vknorm::vknorm" in targets
    assert "vulkan" not in targets.lower(), "the exported target mentions Vulkan"
    m = re.search(r'INTERFACE_LINK_LIBRARIES "([^"]*)"', targets)
    assert m and set(m.group(1).split(";")) == {"dl", "Threads::Threads"}, m and m.group(1)


def test_package_without_ncnn_layers_lacks_its_ncnn_component(installed, tmp_path):
    """The component ncnn names vknorm's layers for ncnn nets: an install built without ncnn refuses
    REQUIRED COMPONENTS ncnn, and OPTIONAL_COMPONENTS ncnn finds the core with vknorm_ncnn_FOUND false."""
    prefix = f"-DCMAKE_PREFIX_PATH={PREFIX}"
    required = configure_consumer(tmp_path / "required", "0.1 CONFIG REQUIRED COMPONENTS ncnn", prefix)
    assert required.returncode != 0 and "vknorm_FOUND to FALSE" in required.stderr, required.stderr
    assert "built without its ncnn layers" in required.stderr and "-DVKNORM_NCNN=ON" in required.stderr, required.stderr
    optional = configure_consumer(tmp_path / "optional", "0.1 CONFIG REQUIRED OPTIONAL_COMPONENTS ncnn", prefix)
    assert optional.returncode == 0, optional.stderr
    assert "vknorm_FOUND=1 vknorm_ncnn_FOUND=FALSE" in optional.stdout, optional.stdout


def test_example_finds_the_installed_package(example):
    with open(os.path.join(EXAMPLE_BUILD, "CMakeCache.txt")) as f:
        cache = f.read()
    m = re.search(r"^vknorm_DIR:PATH=(.*)$", cache, re.M)
    assert m and os.path.realpath(m.group(1)) == os.path.realpath(os.path.join(PREFIX, "lib", "cmake", "vknorm")), \
        m and m.group(1)
    # the loader is opened at run time: the program does not link libvulkan
    if shutil.which("readelf"):
        needed = subprocess.run(["readelf", "-d", example], capture_output=True, text=True).stdout
        assert "libvulkan" not in needed, needed


def parse_errors(out):
    errs = [float(x) for x in re.findall(r"max abs error vs CPU reference ([0-9.eE+-]+|nan|inf)", out)]
    assert len(errs) == 2, out
    return errs


def test_example_runs_layernorm_from_param_and_bin(example, tmp_path):
    """An ncnn .param (LayerNorm line among others) and a raw float32 .bin: gamma then beta."""
    affine_size = 48
    rng = np.random.default_rng(7)
    gamma = rng.uniform(-1.2, 1.2, affine_size).astype(np.float32)
    beta = rng.uniform(-1.2, 1.2, affine_size).astype(np.float32)
    param = tmp_path / "model.param"
    param.write_text("7767517\n2 2\nInput in0 0 1 in0\n"
                     f"LayerNorm ln0 1 1 in0 out0 0={affine_size} 1=1.000000e-06 2=1\n")
    binf = tmp_path / "model.bin"
    binf.write_bytes(gamma.tobytes() + beta.tobytes())
    env = dict(os.environ, VKNORM_VALIDATION="1")
    for extra in ([], ["--no-packing", "--path", "split"], ["--fp16", "--h", "3", "--c", "8"]):
        proc = run([example, *extra, str(param), str(binf)], f"example {extra}", env=env, timeout=120)
        out = proc.stdout
        assert f"affine_size={affine_size} eps=1e-06 affine=1" in out, out
        assert "validation messages: 0" in out and out.rstrip().splitlines()[-1].startswith("OK"), out
        tol = 4e-3 if "--fp16" in extra else 1e-5
        assert all(e <= tol * 10 for e in parse_errors(out)), out  # |y| stays below ~10 here


@pytest.mark.parametrize("op,line,channels", [
    ("GroupNorm", "GroupNorm gn0 1 1 in0 out0 0=32 1=320 2=1.000000e-05 3=1", 320),  # 10 channels per group
    ("InstanceNorm", "InstanceNorm in0n 1 1 in0 out0 0=12 1=1.000000e-05 2=1", 12),
])
def test_example_runs_groupnorm_and_instancenorm_from_param_and_bin(example, tmp_path, op, line, channels):
    """The C++ layers vknorm::Norm(GroupNorm / InstanceNorm): ncnn's params and per-channel weights."""
    rng = np.random.default_rng(8)
    weights = rng.uniform(0.5, 1.5, 2 * channels).astype(np.float32)
    param = tmp_path / "model.param"
    param.write_text(f"7767517\n2 2\nInput in0 0 1 in0\n{line}\n")
    binf = tmp_path / "model.bin"
    binf.write_bytes(weights.tobytes())
    env = dict(os.environ, VKNORM_VALIDATION="1")
    for extra in ([], ["--no-packing", "--path", "split"], ["--fp16", "--h", "5", "--w", "7"]):
        proc = run([example, *extra, str(param), str(binf)], f"example {op} {extra}", env=env, timeout=120)
        out = proc.stdout
        assert f"layer: {op} " in out and f"channels={channels} eps=1e-05 affine=1" in out, out
        assert "validation messages: 0" in out and out.rstrip().splitlines()[-1].startswith("OK"), out
    short = tmp_path / "short.bin"
    short.write_bytes(weights[:channels + 3].tobytes())  # gamma, and a few floats of beta
    proc = subprocess.run([example, str(param), str(short)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "too short for beta" in proc.stderr, proc.stderr


def test_example_on_a_forced_small_device(example):
    """The C++ program on lavapipe forced to Vulkan 1.0, 16 KB shared memory, no subgroups: fp16 requested
    falls back to float32 storage with the warning, and the results still pass."""
    env = dict(os.environ, VKNORM_VALIDATION="1", VKNORM_VULKAN_API="1.0", VKNORM_MAX_SHARED_MEMORY="16384",
               VKNORM_NO_SUBGROUP="1")
    proc = run([example, "--fp16", "--h", "5", "--c", "8"], "example on a Vulkan 1.0 profile", env=env, timeout=120)
    assert "Vulkan 1.0.0, subgroup size 0" in proc.stdout, proc.stdout
    assert "float16 storage is not supported on this device; using float32 storage" in proc.stderr, proc.stderr
    assert "validation messages: 0" in proc.stdout and proc.stdout.rstrip().splitlines()[-1].startswith("OK")


def test_example_defaults_and_exit_codes(example, tmp_path):
    proc = run([example], "example without files", timeout=120)
    assert "affine_size=64" in proc.stdout and proc.stdout.rstrip().splitlines()[-1].startswith("OK"), proc.stdout
    # a tolerance no float32 run meets: exit 1 and FAIL
    strict = subprocess.run([example, "--tol", "1e-30"], capture_output=True, text=True, timeout=120)
    assert strict.returncode == 1 and "FAIL" in strict.stdout, strict.stdout + strict.stderr
    # bad input: exit 2 with a message
    bad = subprocess.run([example, str(tmp_path / "missing.param"), str(tmp_path / "missing.bin")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "cannot open" in bad.stderr, bad.stderr
    short = tmp_path / "short.bin"
    short.write_bytes(b"\0" * 8)
    param = tmp_path / "ln.param"
    param.write_text("LayerNorm ln 1 1 a b 0=16\n")
    bad = subprocess.run([example, str(param), str(short)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "too short for gamma" in bad.stderr, bad.stderr
    # a layer that loads but cannot take the input (GroupNorm without channels, no weights to read): exit 2, not
    # an uncaught exception
    param.write_text("GroupNorm gn 1 1 a b 0=1 1=0 3=0\n")
    bad = subprocess.run([example, str(param), str(short), "--c", "4"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "channels=0 cannot split an input of 4 channels" in bad.stderr, bad.stderr
    # a value or id that is not a number, or an id ncnn's ParamDict has no slot for: the file, the pair and the line
    for kv in ("0=abc", "0=16x", "x=16", "40=1", "1=1e-5y", "0=99999999999"):
        param.write_text(f"LayerNorm ln 1 1 a b {kv}\n")
        bad = subprocess.run([example, str(param), str(short)], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2, (kv, bad.returncode, bad.stderr)
        assert f"{param}: bad " in bad.stderr and f"in '{kv}'" in bad.stderr and "on the line: LayerNorm ln" in bad.stderr, \
            bad.stderr
    # a flag's value that is not wholly a number, or not one the flag takes: exit 2, not run as its leading digits
    for flag, value in (("--h", "5x"), ("--c", "3abc"), ("--w", "7.9"), ("--device", "0junk"), ("--device", "-2"),
                        ("--tol", "-3"), ("--tol", "nan"), ("--tol", "1e-5x"), ("--tol", "0")):
        bad = subprocess.run([example, flag, value], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and bad.stderr.startswith("layernorm_example: ") and flag in bad.stderr, \
            (flag, value, bad.returncode, bad.stderr)
    # --help: the usage on stdout, exit 0 (2 is for bad arguments)
    helped = subprocess.run([example, "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: layernorm_example") and not helped.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


CPP_TESTS_BUILD = os.path.join(ROOT, "build", "cxx-tests" + (f"-{_WORKER}" if _WORKER else ""))


@pytest.fixture(scope="module")
def cpp_tests(installed):
    """tests/cpp configured from scratch against the installed package, built; its build directory."""
    env = cmake_env()
    shutil.rmtree(CPP_TESTS_BUILD, ignore_errors=True)
    run(["cmake", "-S", os.path.join(ROOT, "tests", "cpp"), "-B", CPP_TESTS_BUILD, *generator_args(CPP_TESTS_BUILD),
         f"-DCMAKE_PREFIX_PATH={PREFIX}"], "configure tests/cpp", env=env)
    run(["cmake", "--build", CPP_TESTS_BUILD], "build tests/cpp", env=env)
    return CPP_TESTS_BUILD


def test_cpp_api_promises_no_example_shows(cpp_tests):
    """tests/cpp/api_contracts.cpp against the installed package: load_param after create_pipeline(ctx)
    keeps the layer on ctx; forward_inplace(Mat&) writes into the Mat's own storage (shared by its shallow
    copies) also where the device needs a converted copy (pack4, float16 storage), and so does
    forward_inplace_cpu (also on a float16 Mat::external whose dense cstep is not ncnn's); a dims 1-2 Mat::external
    over a dense array is written no further than its last element; forward(bottom, top) leaves bottom as it was,
    allocates top or writes a fitting one
    (dense channels) where it lies, also over bottom's own memory at another cstep (in pieces too), and leaves
    top as it was when it throws; forward(VkMat bottom, top) leaves bottom as it was and writes a top of its layout
    where it lies, else one of its own (also where top shared bottom's buffer); a host
    Mat without memory or with fields past it is refused by forward, forward_inplace, forward_inplace_cpu and upload,
    and by the conversions (cast_fp16, cast_fp32, convert_packing, converted, convert_into); negative extents and
    elempack 4 on a dims-1 Mat are refused;
    download(Mat&) converts into the caller's Mat; forward_add's sum may be written over x or the residual;
    public fields written directly after a forward take effect (checked: wrong weight counts named, unknown
    activations refused) at the next one; a VkMat whose fields were edited past its buffer, or whose buffer is
    not its context's, is refused; Mat::create and blob_span_bytes refuse
    sizes that are negative or wrap 64 bits; layout_as, converted and ncnn_cstep refuse packings and element sizes
    they would divide by (0, 3; 6 channels by 4; elemsize 0); moved-from Mats and VkMats are empty; create_pipeline
    uploads complete weights; forward_add refuses an empty VkMat, and a forward a layer without its weights, before
    binding the layer to a device; an op, Option.path or Option.max_workgroup_size that names no value is refused;
    NormParams::check reads each type's own fields; a Mat's extents edited past its cstep are named as such;
    ParamDict reads a float set for an int param as not given, as ncnn's does (a .param's 0=16.0 is affine_size 0);
    the headers compile after X11's None macro. Each check prints ok or FAIL. It makes a
    context of its own beside the default one and exits cleanly under the validation layer (the default
    context, released after the layer's own teardown, crashed it at exit: SIGSEGV)."""
    proc = subprocess.run([os.path.join(cpp_tests, "api_contracts")], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, VKNORM_VALIDATION="1"))
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and not any(ln.startswith("FAIL") for ln in lines), proc.stdout + proc.stderr
    assert sum(ln.startswith("ok: ") for ln in lines) == 75, proc.stdout


def test_the_static_library_defines_nothing_in_vulkan_hpps_own_namespace(installed):
    """Vulkan-Hpp's classes are inline: every object using them emits them as weak symbols, and a program that
    compiles Vulkan-Hpp itself (another version, other macros, as engines do) would share them with vknorm under
    whichever definition the linker keeps (a heap overflow in vknorm's instance, seen). vknorm compiles it in
    namespaces of its own: libvknorm.a defines no vk:: symbol, and does define its own namespace's."""
    nm = shutil.which("nm")
    assert nm, "nm (binutils) is needed to read the library's symbols"
    lib = os.path.join(PREFIX, "lib", "libvknorm.a")
    proc = run([nm, "-C", "--defined-only", lib], "nm libvknorm.a")
    names = [ln.split(" ", 2)[2] for ln in proc.stdout.splitlines() if ln.count(" ") >= 2]
    in_vk = [n for n in names if re.search(r"(?<![\w:])vk::", n)]  # typeinfo/vtable for vk::..., arguments too
    assert not in_vk, f"{len(in_vk)} symbols in namespace vk::, e.g. {in_vk[:3]}"
    assert any(re.search(r"(?<![\w:])vknorm_vk::", n) for n in names), "expected Vulkan-Hpp's symbols in vknorm_vk::"


def test_layers_and_contexts_held_by_statics_at_exit_leave_cleanly_under_validation(cpp_tests):
    """tests/cpp/static_exit.cpp: a function-local static layer made before the first Vulkan call and a
    namespace-scope context (with a VkMat) are destroyed after the driver and the validation layer tore
    themselves down. vknorm leaves their device to the process's end then: the process exits with main's
    status (it crashed there: SIGSEGV in the validation layer)."""
    proc = subprocess.run([os.path.join(cpp_tests, "static_exit")], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, VKNORM_VALIDATION="1"))
    assert proc.returncode == 0 and proc.stdout.startswith("ok: "), (proc.returncode, proc.stdout, proc.stderr)

"""The Python API across threads and fork(): a fork()ed child of a process that used Vulkan gets a clear
error instead of a wait that never returns, and exits with its status instead of hanging in the teardown of
the parent's device (vknorm's or ncnn's); one graph Extractor (and a Net being reloaded) may be used from
several threads; CPU forwards racing load_model see one weight set; an extract whose inputs were not given, or
whose blobs light mode freed, is an error code, not a crash; a graph Net is quiet on stderr. Each case runs in a child process of its own, so a
crash or a hang fails the test instead of the run."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from availability import needs_graph, needs_vulkan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")


def run_script(code: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, VKNORM_VALIDATION="1", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


NCNN_BANNER = re.compile(r"^\[\d+ ")  # ncnn's device lines, printed when it creates its Vulkan instance


def assert_clean(proc: subprocess.CompletedProcess):
    """Exit 0 and nothing on stderr but ncnn's device banner."""
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    unexpected = [ln for ln in proc.stderr.splitlines() if ln.strip() and not NCNN_BANNER.match(ln)]
    assert not unexpected, proc.stderr[-3000:]


LAYER_SETUP = """
import numpy as np, vknorm
x = np.random.default_rng(0).standard_normal((64, 256, 64)).astype(np.float32)
ln = vknorm.LayerNorm(64, 1e-5)
ln.load_model(np.ones(64, np.float32), np.zeros(64, np.float32))
def work():
    return ln(x)
"""

GRAPH_SETUP = f"""
import numpy as np
from vknorm import graph
net = graph.configure(graph.Net())
net.load_param({os.path.join(DATA, "transformer_block.ncnn.param")!r})
net.load_model({os.path.join(DATA, "transformer_block.ncnn.bin")!r})
x = graph.Mat(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32))
def work():
    ex = net.create_extractor()
    ex.input("in0", x)
    r, out = ex.extract("out0")
    assert r == 0
    return np.array(out)
"""


FORK_CHILD = """
import os
used = work()  # the parent has used Vulkan
pid = os.fork()
if pid == 0:
    try:
        work()
        print("child: ran")
    except RuntimeError as e:
        print("child: RuntimeError:", e)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("parent: child exit", os.waitstatus_to_exitcode(status))
print("parent: still runs", work().shape == used.shape)
"""


# The child clears the net the parent loaded: ncnn's clear would free the parent's device memory (on NVIDIA the
# parent's next extract never returned).
GRAPH_CLEAR_SETUP = GRAPH_SETUP + """
import os
parent, extract = os.getpid(), work
def work():
    if os.getpid() != parent:
        net.clear()
        print("child: cleared")
    return extract()
"""


HEAP_BUDGET_SETUP = """
import numpy as np
from vknorm import graph
def work():
    return np.array([graph.get_gpu_device(0).get_heap_budget()])
"""


VKMAT_SETUP = """
import numpy as np, vknorm
x = np.random.default_rng(0).standard_normal((64, 256, 64)).astype(np.float32)
v = vknorm.to_device(x)
def work():
    return v.numpy()
"""


@needs_vulkan
@pytest.mark.parametrize("setup", ["layer", "vkmat", pytest.param("graph", marks=needs_graph),
                                   pytest.param("graph_clear", marks=needs_graph),
                                   pytest.param("heap_budget", marks=needs_graph)])
def test_a_forked_child_of_a_process_that_used_vulkan_gets_a_clear_error_not_a_hang(setup):
    """The child inherits the device's handles but not the driver's threads: its first wait never
    returned. It is refused at once, naming the start methods that work; the parent runs on. A VkMat's download
    too, which on a device with host-visible memory reads the mapping without waiting on anything, a Vulkan net's
    clear (the parent's device memory), and ncnn's device's heap budget, a driver call on the inherited device."""
    setups = {"layer": LAYER_SETUP, "vkmat": VKMAT_SETUP, "graph": GRAPH_SETUP, "graph_clear": GRAPH_CLEAR_SETUP,
              "heap_budget": HEAP_BUDGET_SETUP}
    proc = run_script(setups[setup] + FORK_CHILD, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    child = [ln for ln in lines if ln.startswith("child:")]
    assert len(child) == 1 and "fork()" in child[0] and "'spawn'" in child[0], proc.stdout
    assert "parent: child exit 0" in lines and "parent: still runs True" in lines, proc.stdout


@needs_vulkan
@pytest.mark.parametrize("setup", ["layer", pytest.param("graph", marks=needs_graph)])
def test_a_forked_child_of_a_process_that_used_vulkan_exits_with_its_status(setup, tmp_path):
    """The child inherits the parent's device (vknorm's, or ncnn's instance) but not the driver's threads: what
    waits on that device at the child's exit hung it (ncnn's exit handler destroy_gpu_instance; freeing the
    layer's buffers as Python drops them, on NVIDIA). A child leaving with sys.exit (or the end of its script)
    leaves the parent's device alone and exits with its status, once Python's own exit work is done (its
    atexit functions run, its buffered output is written); the parent runs on."""
    code = (LAYER_SETUP if setup == "layer" else GRAPH_SETUP) + """
import atexit, os, sys, time
used = work()
pid = os.fork()
if pid == 0:
    atexit.register(lambda: print("child: atexit ran"))
    print("child: leaving")  # block-buffered (stdout is a file): written by Python's own exit
    sys.exit(3)
for _ in range(600):  # 60 s, then the child counts as hung (and is killed, not left behind)
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("parent: child exit", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.1)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("parent: child hung")
print("parent: still runs", work().shape == used.shape)
"""
    out = tmp_path / "stdout.txt"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["VKNORM_VALIDATION"] = "1"
    with open(out, "w") as f:  # a file, not a pipe: nothing of the child's output is written before its exit
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=f, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=ROOT, start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the forked child too
            proc.communicate()
            raise
    lines = out.read_text().splitlines()
    assert proc.returncode == 0, stderr[-3000:]
    assert "child: leaving" in lines and "child: atexit ran" in lines, lines
    assert "parent: child exit 3" in lines and "parent: still runs True" in lines, lines


@needs_vulkan
def test_a_forked_child_of_a_process_that_never_used_vulkan_runs():
    code = """
import os, numpy as np, vknorm
pid = os.fork()
if pid == 0:
    ln = vknorm.LayerNorm(16, 1e-5)
    ln.load_model(np.ones(16, np.float32), np.zeros(16, np.float32))
    x = np.arange(32, dtype=np.float64).reshape(2, 16)
    want = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + float(np.float32(1e-5)))
    y = ln(x.astype(np.float32))
    os._exit(0 if np.abs(y - want).max() <= 1e-5 * max(1.0, np.abs(want).max()) else 3)  # the float32 rule
_, status = os.waitpid(pid, 0)
print("child exit", os.waitstatus_to_exitcode(status))
"""
    proc = run_script(code, timeout=120)
    assert proc.returncode == 0 and "child exit 0" in proc.stdout, proc.stdout + proc.stderr[-3000:]


@needs_graph
@needs_vulkan
@pytest.mark.parametrize("vulkan", [True, False], ids=["vulkan", "cpu"])
def test_one_extractor_used_from_two_threads_gives_the_sequential_results(vulkan):
    """ncnn's Extractor is not thread-safe (heap corruption, SIGSEGV, SIGFPE): each call holds it."""
    code = GRAPH_SETUP.replace("graph.configure(graph.Net())", f"graph.configure(graph.Net(), vulkan={vulkan})") + """
import threading
want = work()
bad = []
for rep in range(25):
    ex = net.create_extractor(); ex.input("in0", x)
    def take():
        r, m = ex.extract("out0")
        if r != 0 or not np.array_equal(np.array(m), want):
            bad.append((rep, r))
    ts = [threading.Thread(target=take) for _ in range(3)]
    [t.start() for t in ts]; [t.join() for t in ts]
print("bad", bad)
"""
    proc = run_script(code)
    assert_clean(proc)
    assert "bad []" in proc.stdout, proc.stdout


@needs_graph
@needs_vulkan
def test_a_net_cleared_and_reloaded_while_other_threads_extract_never_crashes():
    """clear / load_param / load_model wait for running extracts; an extractor made before a clear fails
    with an error code, never a crash; results are the model's whenever a run succeeds."""
    code = GRAPH_SETUP + f"""
import threading
want = work()
stop = False
import time
outcomes = {{"ok": 0, "refused": 0, "wrong": 0}}
def extracting():
    while not stop:
        try:
            ex = net.create_extractor()
        except RuntimeError:  # between clear and load_model: refused with a message
            outcomes["refused"] += 1
            continue
        ex.input("in0", x)
        r, out = ex.extract("out0")
        if r != 0:
            outcomes["refused"] += 1
        elif np.array_equal(np.array(out), want):
            outcomes["ok"] += 1
        else:
            outcomes["wrong"] += 1
ts = [threading.Thread(target=extracting) for _ in range(2)]
[t.start() for t in ts]
for _ in range(15):
    net.clear()
    net.load_param({os.path.join(DATA, "transformer_block.ncnn.param")!r})
    net.load_model({os.path.join(DATA, "transformer_block.ncnn.bin")!r})
# the net stays loaded now: give the threads time to run it at least once (the reloads may have left them none)
deadline = time.monotonic() + 60
while outcomes["ok"] == 0 and time.monotonic() < deadline:
    time.sleep(0.01)
stop = True
[t.join() for t in ts]
print(outcomes)
"""
    proc = run_script(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'wrong': 0" in proc.stdout and "'ok': 0" not in proc.stdout, proc.stdout


@needs_graph
@pytest.mark.parametrize("vulkan", [True, False], ids=["vulkan", "cpu"])
def test_a_net_described_while_another_thread_reloads_it_never_crashes(vulkan):
    """layers(), vknorm_layers(), input_names(), output_names(), fused() and vknorm_counters() see the net
    before or after a clear / load, never halfway: each answer is the loaded model's or an empty net's (it
    crashed, SIGSEGV, when they read the net as a load replaced it)."""
    code = f"""
import threading, time
from vknorm import graph
net = graph.configure(graph.Net(), vulkan={vulkan})
param, binp = {os.path.join(DATA, "sd_resblock.ncnn.param")!r}, {os.path.join(DATA, "sd_resblock.ncnn.bin")!r}
net.load_param(param); net.load_model(binp)
want = (len(net.layers()), len(net.vknorm_layers()), net.input_names(), net.output_names(), len(net.fused()))
stop = False
seen = {{"loaded": 0, "empty": 0, "torn": []}}
def describing():
    while not stop:
        got = (len(net.layers()), len(net.vknorm_layers()), net.input_names(), net.output_names(), len(net.fused()))
        net.vknorm_counters()
        # each call sees one state (calls apart may see different ones)
        if all(g in (w, type(w)()) for g, w in zip(got, want)):
            seen["loaded" if got == want else "empty"] += 1
        else:
            seen["torn"].append(got)
ts = [threading.Thread(target=describing) for _ in range(2)]
[t.start() for t in ts]
for _ in range(40):
    net.clear()
    net.load_param(param)
    net.load_model(binp)
# the net stays loaded now: give the threads time to see it so at least once (the reloads may have left them none)
deadline = time.monotonic() + 60
while seen["loaded"] == 0 and time.monotonic() < deadline:
    time.sleep(0.01)
stop = True
[t.join() for t in ts]
print(seen["loaded"] > 0, seen["torn"][:3])
"""
    proc = run_script(code)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip().endswith("True []"), proc.stdout


def test_stderr_silenced_on_several_threads_at_once_comes_back_to_the_terminal():
    """ncnn's log lines are silenced by swapping fd 2 for a temporary file (vknorm.ncnn.register, check, bench):
    four threads doing so at once left fd 2 on a deleted temporary file for good in 2 of 3 runs, and every later
    error went nowhere. Afterwards fd 2 is the one the process started with, and a line written there arrives."""
    proc = run_script("""
import os, threading
from vknorm._stdio import quiet_stderr
before = os.readlink('/proc/self/fd/2')
def swap():
    for _ in range(300):
        with quiet_stderr():
            os.write(2, b'ncnn says\\n')
threads = [threading.Thread(target=swap) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print('same' if os.readlink('/proc/self/fd/2') == before else 'moved to ' + os.readlink('/proc/self/fd/2'))
os.write(2, b'still here\\n')
""")
    assert proc.returncode == 0 and proc.stdout.strip() == "same", proc.stdout + proc.stderr
    assert proc.stderr.strip() == "still here", proc.stderr


@needs_vulkan
def test_cpu_forwards_racing_load_model_see_one_weight_set():
    """The CPU forward runs on a snapshot of the weights, as the Vulkan forwards do (it read them while
    load_model replaced them: rows of both sets, and freed memory)."""
    code = """
import threading, time, numpy as np, vknorm
C = 1024
x = np.random.default_rng(0).standard_normal((16, C)).astype(np.float32)
ln = vknorm.LayerNorm(C, 1e-5)
W = [(np.full(C, 1.0 + k, np.float32), np.full(C, float(k), np.float32)) for k in range(2)]
refs = []
for g, b in W:
    ln.load_model(g, b)
    refs.append(ln(x, device="cpu"))
stop, n, torn = False, 0, 0
def forwards():
    global n, torn
    while not stop:
        y = ln(x, device="cpu")
        n += 1
        torn += not any(np.array_equal(y, r) for r in refs)
t = threading.Thread(target=forwards)
t.start()
i, deadline = 0, time.monotonic() + 60
while i < 6000 or (n < 20 and time.monotonic() < deadline):  # loads until the forwards have raced them a while
    ln.load_model(*W[i % 2])
    i += 1
stop = True
t.join()
print("forwards", n, "torn", torn)
"""
    proc = run_script(code)
    assert_clean(proc)
    words = proc.stdout.split()
    assert int(words[1]) > 0 and words[3] == "0", proc.stdout


@needs_graph
@pytest.mark.parametrize("vknorm_layers", [True, False], ids=["vknorm", "stock"])
@pytest.mark.parametrize("vulkan", [True, False], ids=["vulkan", "cpu"])
def test_an_extract_whose_input_was_not_given_is_an_error_code(vknorm_layers, vulkan):
    """ncnn's stock layers crash on the empty blob of an unset input (SIGFPE, SIGSEGV); the extract says which
    input it lacks instead. A misspelled input name is refused by input() and leaves the input unset."""
    code = f"""
import numpy as np
from vknorm import graph
net = graph.configure(graph.Net(vknorm={vknorm_layers}), vulkan={vulkan})
net.load_param({os.path.join(DATA, "layernorm_2d.ncnn.param")!r})
net.load_model({os.path.join(DATA, "layernorm_2d.ncnn.bin")!r})
ex = net.create_extractor()
print("no input:", ex.extract("out0")[0])
ex = net.create_extractor()
print("misspelled:", ex.input("nope", graph.Mat(np.ones((8, 6, 10), np.float32))), ex.extract("out0")[0])
"""
    proc = run_script(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no input: -1" in proc.stdout and "misspelled: -1 -1" in proc.stdout, proc.stdout
    assert "extract out0: the input in0 it depends on was not given" in proc.stderr, proc.stderr[-2000:]


@needs_graph
@pytest.mark.parametrize("vknorm_layers", [True, False], ids=["vknorm", "stock"])
@pytest.mark.parametrize("vulkan", [True, False], ids=["vulkan", "cpu"])
@pytest.mark.parametrize("model", ["convnext_block", "llama_block"])
def test_a_blob_freed_by_light_mode_is_an_error_code(model, vknorm_layers, vulkan):
    """In light mode (ncnn's default) each layer frees its inputs, so after extracting the output every blob
    upstream of it is gone. Extracting one then is -1 with a message, where ncnn returned an empty Mat as a
    success, -100, or crashed in its Vulkan layers (SIGFPE, convnext_block). A blob that can be made again
    without a freed one (llama_block's MemoryData mask) still comes back, equal to a fresh extract; with light
    mode off every blob does. Before the output, an intermediate is extracted as usual, and the output after it."""
    code = f"""
import json
import numpy as np
from vknorm import graph
param = {os.path.join(DATA, model + ".ncnn.param")!r}
shape = tuple(int(s) for s in json.load(open({os.path.join(DATA, "models.json")!r}))[{model!r}].split("x"))
x = graph.Mat(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
blobs = []
for line in open(param).read().splitlines()[2:]:
    t = line.split()
    blobs += t[4 + int(t[2]):4 + int(t[2]) + int(t[3])]
for lightmode in (True, False):
    net = graph.configure(graph.Net(vknorm={vknorm_layers}, fuse=False), vulkan={vulkan}, lightmode=lightmode)
    assert net.load_param(param) == 0 and net.load_model(param[:-5] + "bin") == 0
    def extractor():
        ex = net.create_extractor()
        assert ex.input("in0", x) == 0
        return ex
    out = net.output_names()[0]
    fine, refused = [], []
    for blob in blobs:
        r0, want = extractor().extract(blob)
        assert r0 == 0, (blob, r0)
        ex = extractor()
        assert ex.extract(out)[0] == 0
        r, got = ex.extract(blob)
        if r == 0:
            assert np.array_equal(np.array(got), np.array(want)), blob
            fine.append(blob)
        else:
            assert r == -1, (blob, r)
            refused.append(blob)
    middle = blobs[len(blobs) // 2]
    ex = extractor()
    assert ex.extract(middle)[0] == 0 and ex.extract(out)[0] == 0
    print(json.dumps({{"lightmode": lightmode, "fine": fine, "refused": refused}}))
"""
    proc = run_script(code)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    light, heavy = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    recomputable = ["3", "19"] if model == "llama_block" else []  # the causal mask and its reshape
    assert sorted(light["fine"]) == sorted(["out0"] + recomputable), light
    assert heavy["refused"] == [], heavy
    assert "a blob it needs was freed by a layer that ran before" in proc.stderr, proc.stderr[-2000:]


@needs_graph
@pytest.mark.parametrize("vulkan", [True, False], ids=["vulkan", "cpu"])
def test_an_extract_after_one_that_failed_partway_is_an_error_code_not_a_crash(vulkan):
    """An extract that fails in a later layer has already run (and in light mode freed the inputs of) the layers
    before it. A following extract that needs one of those freed blobs is -1, where it crashed (SIGSEGV). In a
    Vulkan net the failed forward's recorded work never ran, so every later extract of that extractor is -1."""
    code = f"""
import tempfile
import numpy as np
from vknorm import graph
param = \"\"\"7767517
4 4
Input in0 0 1 in0
ReLU relu 1 1 in0 r0
GroupNorm bad 1 1 r0 bad 0=2 1=6 2=0.00001 3=0
Softmax soft 1 1 in0 out1
\"\"\"
empty_bin = tempfile.NamedTemporaryFile(suffix=".bin", delete=False).name
net = graph.configure(graph.Net(fuse=False), vulkan={vulkan})
assert net.load_param_mem(param) == 0 and net.load_model(empty_bin) == 0
ex = net.create_extractor()
x = np.random.default_rng(0).standard_normal((4, 8, 16)).astype(np.float32)
ex.input("in0", graph.Mat(x))
print("bad", ex.extract("bad")[0])  # 4 channels into a GroupNorm of 6: the layer refuses it
print("out1", ex.extract("out1")[0])
ex = net.create_extractor()
ex.set_light_mode(False)  # nothing freed; a CPU net computed r0, a Vulkan net only recorded it
ex.input("in0", graph.Mat(x))
ex.extract("bad")
r, r0 = ex.extract("r0")
print("r0 after a failed extract", r, r == 0 and np.array_equal(np.array(r0), np.maximum(x, 0)))
"""
    proc = run_script(code)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "bad -1" in proc.stdout and "out1 -1" in proc.stdout, proc.stdout
    # A Vulkan forward that failed never ran what it recorded: the extractor refuses anything more (its results
    # were garbage with 0); a CPU forward ran every layer before the failing one.
    assert ("r0 after a failed extract -1 False" if vulkan else "r0 after a failed extract 0 True") in proc.stdout, \
        proc.stdout
    assert "the input has 4 channels, the layer 6" in proc.stderr, proc.stderr[-2000:]
    reason = "an earlier extract of this extractor failed" if vulkan else "a blob it needs was freed by a layer"
    assert reason in proc.stderr, proc.stderr[-2000:]


@needs_graph
def test_a_host_allocation_refused_is_ncnn_s_code_and_nothing_more_on_stderr():
    """A CPU layer asking for more host memory than there is (a Padding of 2^22 on every side: a petabyte, past
    the address space, so no overcommit policy grants it) is ncnn's -100. The extractor's host memory keeps no record of the failed block, so dropping it prints
    nothing (ncnn's pool allocator printed "FATAL ERROR! ... destroyed too early" there)."""
    code = f"""
import tempfile
import numpy as np
from vknorm import graph
param = "7767517\\n2 2\\nInput in0 0 1 in0\\nPadding pad 1 1 in0 out0 0=4194304 1=4194304 2=4194304 3=4194304\\n"
net = graph.configure(graph.Net(), vulkan=False)
assert net.load_param_mem(param) == 0 and net.load_model(tempfile.NamedTemporaryFile(delete=False).name) == 0
ex = net.create_extractor()
ex.input("in0", graph.Mat(np.ones((4, 8, 16), np.float32)))
print("huge", ex.extract("out0")[0])
del ex
"""
    proc = run_script(code)
    assert proc.returncode == 0 and "huge -100" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "FATAL" not in proc.stderr and "still in use" not in proc.stderr, proc.stderr[-2000:]


@needs_graph
@pytest.mark.parametrize("vulkan", [True, False], ids=["vulkan", "cpu"])
def test_blobs_given_by_hand_and_blobs_read_twice_follow_what_ncnn_holds(vulkan):
    """In light mode: an intermediate blob set with input() and freed since is -1, not silently made again from
    upstream (another value); a blob extracted before its consumer ran comes back again from a Vulkan net, which
    keeps what it downloaded (as pyncnn), and is -1 from a CPU net; a blob given after it was computed comes back as given, not as the device's older
    copy; a layer that reads one blob twice with no Split (Concat(a, Sigmoid(a))) is -1, where ncnn freed the
    first input while making the second (an empty Mat, or SIGSEGV in a Vulkan net); a layer with several outputs
    is not run where it would overwrite one set with input() (ncnn replaced the given value silently)."""
    code = f"""
import tempfile
import numpy as np
from vknorm import graph
empty_bin = tempfile.NamedTemporaryFile(suffix=".bin", delete=False).name
def net(body):
    lines = body.strip().splitlines()
    n = graph.configure(graph.Net(fuse=False), vulkan={vulkan})
    blobs = {{b for l in lines for b in l.split()[4:] if "=" not in b}}
    assert n.load_param_mem("7767517\\n%d %d\\n" % (len(lines), len(blobs)) + "\\n".join(lines) + "\\n") == 0
    assert n.load_model(empty_bin) == 0
    return n
rng = np.random.default_rng(0)
x, v = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(2))
chain = net(\"\"\"
Input in 0 1 in
ReLU relu 1 1 in a
Sigmoid sig 1 1 a b
\"\"\")
ex = chain.create_extractor()
ex.input("in", graph.Mat(x)); ex.input("a", graph.Mat(v))
r, b = ex.extract("b")
print("b from the given a", r, np.allclose(np.array(b), 1 / (1 + np.exp(-v)), atol=1e-5))
print("given a after its consumer ran", ex.extract("a")[0])
ex = chain.create_extractor()
ex.set_light_mode(False)
ex.input("in", graph.Mat(x))
ex.extract("a")
ex.input("a", graph.Mat(v))
r, a = ex.extract("a")
print("a given after it was computed", r, np.array_equal(np.array(a), v))
r, b = ex.extract("b")
print("b after a was given again", r, np.allclose(np.array(b), 1 / (1 + np.exp(-v)), atol=1e-5))
ex = chain.create_extractor()
ex.input("in", graph.Mat(x))
first = np.array(ex.extract("a")[1]); ex.extract("b")
r, again = ex.extract("a")
print("a again after its consumer ran", r, r == 0 and np.array_equal(np.array(again), first))
twice = net(\"\"\"
Input in 0 1 in
ReLU relu 1 1 in a
Sigmoid sig 1 1 a b
Concat cat 2 1 a b c 0=0
\"\"\")
ex = twice.create_extractor()
ex.input("in", graph.Mat(x))
print("read twice", ex.extract("c")[0])
ex = twice.create_extractor()
ex.set_light_mode(False)
ex.input("in", graph.Mat(x))
r, c = ex.extract("c")
print("read twice, light mode off", r, np.array(c).shape)
sliced = net(\"\"\"
Input in 0 1 in
Slice sl 1 2 in a b -23300=2,2,-233 1=0
Sigmoid sig 1 1 b sb
\"\"\")
ex = sliced.create_extractor()
ex.input("in", graph.Mat(np.concatenate([x, x]))); ex.input("b", graph.Mat(v))
print("a beside a given b", ex.extract("a")[0])
r, sb = ex.extract("sb")
print("sb from the given b", r, np.allclose(np.array(sb), 1 / (1 + np.exp(-v)), atol=1e-5))
"""
    proc = run_script(code)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stderr[-3000:]}"
    # A Vulkan net downloaded a and keeps that copy (as ncnn's own extract does); a CPU net's a is gone.
    again = "a again after its consumer ran 0 True" if vulkan else "a again after its consumer ran -1 False"
    for line in ("b from the given a 0 True", "given a after its consumer ran -1", "a given after it was computed 0 True",
                 "b after a was given again 0 True",
                 again, "read twice -1", "read twice, light mode off 0 (4, 3, 4)",
                 "a beside a given b -1", "sb from the given b 0 True"):
        assert line in proc.stdout, proc.stdout


@needs_graph
def test_a_graph_net_is_quiet_on_stderr():
    """Registering vknorm's layers over ncnn's built-in ones is what a graph Net is for: ncnn's notice of
    it ("overwrite built-in layer type ...", four lines a Net) stays off stderr."""
    proc = run_script("from vknorm import graph\nnets = [graph.Net() for _ in range(3)]\nprint(len(nets))\n")
    assert_clean(proc)


GRAPH_MISUSE = f"""
import numpy as np
from vknorm import graph
P, B = {os.path.join(DATA, "layernorm_2d.ncnn.param")!r}, {os.path.join(DATA, "layernorm_2d.ncnn.bin")!r}
x = graph.Mat(np.random.default_rng(0).standard_normal((8, 6, 10)).astype(np.float32))
def loaded(vulkan, vknorm=True):
    net = graph.configure(graph.Net(vknorm=vknorm), vulkan=vulkan)
    net.load_param(P)
    net.load_model(B)
    return net
"""


@needs_graph
@pytest.mark.parametrize("vknorm_layers", [True, False], ids=["vknorm", "stock"])
@pytest.mark.parametrize("vulkan", [True, False], ids=["vulkan", "cpu"])
def test_graph_misuse_is_an_error_code_or_exception_never_a_crash(vknorm_layers, vulkan):
    """Each of these crashed ncnn (SIGFPE, SIGSEGV) or freed memory twice: an empty Mat as input; an
    extractor of a CPU net dropped after Net.clear; an output kept past its extractor and the net's clear;
    set_vulkan_device out of range or after load_param; net.opt changed between load_param and load_model."""
    code = GRAPH_MISUSE + f"""
vulkan, vk = {vulkan}, {vknorm_layers}
net = loaded(vulkan, vk)
ex = net.create_extractor()
print("empty input:", ex.input("in0", graph.Mat()), ex.extract("out0")[0])
ex = net.create_extractor(); ex.input("in0", x)
r, out = ex.extract("out0")
want = np.array(out)
net.clear()
del ex
print("output kept:", np.array_equal(np.array(out), want))
net.load_param(P); net.load_model(B)
print("fused after reload:", [f["pattern"] for f in net.fused()])
net.clear()
print("fused after clear:", net.fused())
for index in (-1, graph.gpu_count()):
    try:
        graph.Net().set_vulkan_device(index)
        print("set_vulkan_device", index, "accepted")
    except ValueError as e:
        print("set_vulkan_device refused:", "out of range" in str(e))
late = graph.configure(graph.Net(vknorm=vk), vulkan=vulkan)
late.load_param(P)
try:
    late.set_vulkan_device(0)
    print("after load_param accepted")
except RuntimeError as e:
    print("after load_param refused:", "before load_param" in str(e))
late.opt.use_vulkan_compute = not vulkan
print("opt changed:", late.load_model(B))
"""
    proc = run_script(code)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    out = proc.stdout
    assert "empty input: -1 -1" in out and "output kept: True" in out and "fused after clear: []" in out, out
    assert out.count("set_vulkan_device refused: True") == 2 and "after load_param refused: True" in out, out
    assert "opt changed: -1" in out, out
    assert "load_model: net.opt changed after load_param" in proc.stderr, proc.stderr[-2000:]


@needs_vulkan
def test_ctrl_c_during_a_pyncnn_extract_loop_stops_it_and_the_net_runs_on():
    """pyncnn runs vknorm's layers as Python callbacks inside its C++ extract, where Ctrl-C mostly lands: the
    callback caught the KeyboardInterrupt (it must not cross into ncnn's C++) and returned -1, so the user's loop
    went on as if nothing had been pressed. The interrupt is now given to the main thread again once the
    callback is back in C++: the loop stops with KeyboardInterrupt, and the net then gives the same output."""
    code = f"""
import signal, time
import numpy as np, ncnn, vknorm.ncnn
net = ncnn.Net()
reg = vknorm.ncnn.register(net)
net.load_param({os.path.join(DATA, "transformer_block.ncnn.param")!r})
net.load_model({os.path.join(DATA, "transformer_block.ncnn.bin")!r})
x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
def run():
    ex = net.create_extractor()
    ex.input("in0", ncnn.Mat(x))
    ret, out = ex.extract("out0")
    return ret, np.array(out) if ret == 0 else None  # (pyncnn's empty Mat crashes numpy's conversion)
ret, before = run()
assert ret == 0
# Ctrl-C pressed while the first norm's forward runs (where it mostly lands), on its 5th call: the same each run
layer = reg.layers[0]
forward, calls = layer.norm.forward_inplace, []
def pressed_during(*args, **kwargs):
    calls.append(1)
    if len(calls) == 5:
        signal.raise_signal(signal.SIGINT)
    return forward(*args, **kwargs)
layer.norm.forward_inplace = pressed_during
start, extracts = time.monotonic(), 0
try:
    while time.monotonic() - start < 10:
        run()
        extracts += 1
    print("not interrupted after", extracts, "extracts")
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - start, 1), "s")
layer.norm.forward_inplace = forward
ret, after = run()
print("afterwards", ret, np.array_equal(after, before))
"""
    proc = run_script(code, timeout=120)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert lines[0].startswith("interrupted after") and float(lines[0].split()[2]) < 5, proc.stdout
    assert lines[1] == "afterwards 0 True", proc.stdout


@needs_vulkan
def test_a_child_forked_while_another_thread_used_vknorm_exits_without_a_leak_report():
    """The threads of the parent do not run in a forked child, but their frames, and the layers and tensors they
    hold, are copied into it: nanobind listed those at the child's exit, some 80 lines of "leaked instances"
    and "likely caused by a reference counting issue", for objects that are no leak."""
    code = """
import os, sys, threading, time, numpy as np, vknorm
ln = vknorm.LayerNorm(affine_size=8, eps=1e-5)
ln.load_model(np.ones(8, np.float32), np.zeros(8, np.float32))
stop, running = threading.Event(), threading.Event()
def worker():
    v = vknorm.to_device(np.ones((2, 8), np.float32))
    while not stop.is_set():
        ln(v)
        running.set()
t = threading.Thread(target=worker)
t.start()
running.wait()
pid = os.fork()
if pid == 0:
    sys.exit(0)
print("child exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
stop.set()
t.join()
"""
    proc = run_script(code, timeout=120)
    assert proc.returncode == 0 and "child exit 0" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "leaked" not in proc.stderr, proc.stderr[-3000:]  # (Python 3.12 warns of the fork itself: not asserted)

"""ncnn's binary params (ncnn2mem's ``.param.bin``) in vknorm.graph: ``Net.load_param_bin`` and ``Net.register_layer``.

* Every committed model's binary params (written as ncnn2mem writes them, tests/param_bin.py) run as its text params
  in the same process, under the Khronos validation layer: the same outputs bit for bit, the same layers (vknorm's
  replacing the norms by ncnn's type index) run as often. Six ways: vknorm in float32 and float16 storage, stock
  ncnn, vknorm's CPU path, and a fused model (vknorm's fuse_param, as ``vknorm optimize`` writes it) whose fused
  types ``register_layer`` puts under the custom indexes ncnn2mem gives them, in both storages.
* Binary params name no blob, layer or type: blobs and layers are named by their indexes ("0", "1", ...; the numbers
  of ncnn2mem's .id.h), types by ncnn's names, so inputs, outputs and extracts go by either.
* Binary params that are malformed, that ncnn's forward would crash on, or whose fused types were not registered
  are refused at load with the reason; so are registrations that cannot work.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import graph_runs
import param_bin
import validation_layer
from availability import import_graph

pytestmark = pytest.mark.timeout(900)

graph = import_graph()
MODELS = graph_runs.models()
INPUT, BINARY_OP, ABS_VAL = (graph.layer_to_index(t) for t in ("Input", "BinaryOp", "AbsVal"))

# run -> (vknorm's layers, fused, Vulkan, float16 storage)
RUNS = {
    "vknorm_fp32": (True, False, True, False),
    "vknorm_fp16": (True, False, True, True),
    "fused_fp32": (True, True, True, False),
    "fused_fp16": (True, True, True, True),
    "stock_fp32": (False, False, True, False),
    "vknorm_cpu": (True, False, False, False),
}

RUNS_SCRIPT = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import graph_runs, param_bin, test_graph_param_bin as t
from vknorm import graph

out_json, tmp = sys.argv[2], sys.argv[3]
results = []
for model, dims in graph_runs.models().items():
    for run, (vknorm, fused, vulkan, fp16) in t.RUNS.items():
        results.append(t.compare(graph, model, dims, run, vknorm, fused, vulkan, fp16, tmp))
with open(out_json, "w") as f:
    json.dump(results, f)
"""


def model_text(model: str, fused: bool) -> str:
    with open(os.path.join(graph_runs.DATA, model + ".ncnn.param")) as f:
        text = f.read()
    return graph._graph.fuse_param(text)[0] if fused else text


def load(g, param: str, binary: bool, vknorm: bool, fuse: bool, vulkan: bool, fp16: bool, custom=()):
    """A net of `param` (text, or binary params at that path), its model loaded; `custom`: the fused types by j."""
    net = g.configure(g.Net(vknorm=vknorm, fuse=fuse), vulkan=vulkan, fp16=fp16, lightmode=False)
    for j, t in enumerate(custom):
        assert net.register_layer(256 | j, t) == 0
    assert (net.load_param_bin(param) if binary else net.load_param(param)) == 0, param
    return net


def compare(g, model: str, dims, run: str, vknorm: bool, fused: bool, vulkan: bool, fp16: bool, tmp: str) -> dict:
    """The model's text params (fused by the net as it loads, where `fused`) and the binary params of the same
    text (fuse_param's rewrite, where `fused`), one input: what each gave."""
    text = model_text(model, fused)
    data, blob_names, custom = param_bin.to_param_bin(text, g.layer_to_index)
    path = os.path.join(tmp, f"{model}-{run}.param.bin")
    with open(path, "wb") as f:
        f.write(data)
    weights = os.path.join(graph_runs.DATA, model + ".ncnn.bin")
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    nets = {"text": load(g, os.path.join(graph_runs.DATA, model + ".ncnn.param"), False, vknorm, fused, vulkan, fp16),
            "binary": load(g, path, True, vknorm, False, vulkan, fp16, custom)}
    found = {}
    for kind, net in nets.items():
        assert net.load_model(weights) == 0, (model, kind)
        ex = net.create_extractor()
        outputs = {}
        if kind == "text":
            assert ex.input("in0", g.Mat(x)) == 0
            names = [blob_names[i] for i in nets["binary"].output_indexes()]  # the binary net's outputs
            for name in names:
                r, m = ex.extract(name)
                outputs[name] = (r, np.array(m).tobytes().hex())
        else:
            assert ex.input(blob_names.index("in0"), g.Mat(x)) == 0
            for i in net.output_indexes():
                r, m = ex.extract(i)
                outputs[blob_names[i]] = (r, np.array(m).tobytes().hex())
        del ex
        counters = net.vknorm_counters()
        found[kind] = {"outputs": outputs, "layers": [list(layer) for layer in net.layers()],
                       "blobs": [b.name for b in net.blobs()], "inputs": net.input_names(),
                       "input_indexes": net.input_indexes(), "output_names": net.output_names(),
                       "forwards": [counters["vulkan_forwards"], counters["cpu_forwards"]]}
    return {"model": model, "run": run, "custom": custom, "blob_names": blob_names, **found}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every model x run in one child process with the validation layer loaded into ncnn's Vulkan instance."""
    tmp = tmp_path_factory.mktemp("param_bin")
    out = tmp / "runs.json"
    proc, log = graph_runs.run_validated(tmp, RUNS_SCRIPT, os.path.dirname(__file__), out, tmp, timeout=800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(out) as f:
        results = {(r["model"], r["run"]): r for r in json.load(f)}
    return results, log


def test_validation_layer_silent(runs):
    """Nothing in the log but, on some drivers, stock ncnn's own clone hazard (tests/validation_layer.py)."""
    _, log = runs
    assert log.strip() == "" or validation_layer.only_ncnn_clone_hazards(log), log[:4000]


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("run", list(RUNS))
def test_binary_params_run_as_their_text_params(runs, model, run):
    """The same outputs bit for bit, the same layers of the same types (vknorm's where the text net has them, on
    Vulkan where it has them there) run as often. A fused model's only custom types are vknorm's fused types."""
    r = runs[0][(model, run)]
    text, binary = r["text"], r["binary"]
    assert all(t.startswith("vknorm.") for t in r["custom"]) and (RUNS[run][1] or not r["custom"]), r["custom"]
    assert binary["outputs"] == text["outputs"] and all(code == 0 for code, _ in binary["outputs"].values())
    assert [layer[1:] for layer in binary["layers"]] == [layer[1:] for layer in text["layers"]]
    assert binary["forwards"] == text["forwards"]
    if RUNS[run][0]:
        assert sum(layer[2] for layer in binary["layers"]) > 0  # vknorm's layers ran: every model has a norm


@pytest.mark.parametrize("model", list(MODELS))
def test_binary_params_are_named_by_index(runs, model):
    """Layers and blobs by index, as ncnn2mem's .id.h numbers them; inputs and outputs named and numbered so."""
    r = runs[0][(model, "vknorm_fp32")]
    binary, names = r["binary"], r["blob_names"]
    assert [layer[0] for layer in binary["layers"]] == [str(i) for i in range(len(binary["layers"]))]
    assert binary["blobs"] == [str(i) for i in range(len(names))]
    assert binary["inputs"] == [str(names.index("in0"))] and binary["input_indexes"] == [names.index("in0")]
    assert [names[int(b)] for b in binary["output_names"]] == r["text"]["output_names"]


def abs_net(tops=(0, 1), bottom=0, blob_count=2, second=None) -> bytes:
    """Binary params: an Input making blob tops[0], an AbsVal reading `bottom` making tops[1]; `second`: one more
    AbsVal's (bottom, top)."""
    layers = [[INPUT, 0, 1, tops[0], -233], [ABS_VAL, 1, 1, bottom, tops[1], -233]]
    if second:
        layers.append([ABS_VAL, 1, 1, *second, -233])
    return param_bin.words_bytes([7767517, len(layers), blob_count, *(w for layer in layers for w in layer)])


def cpu_net(vknorm=True):
    return graph.configure(graph.Net(vknorm=vknorm), vulkan=False)


class Twice(graph.Layer):
    def __init__(self):
        graph.Layer.__init__(self)
        self.one_blob_only = True

    def forward(self, bottom, top, opt):
        top.clone_from(graph.Mat(2 * np.array(bottom)), opt.blob_allocator)
        return 0


class Thrice(Twice):
    def forward(self, bottom, top, opt):
        top.clone_from(graph.Mat(3 * np.array(bottom)), opt.blob_allocator)
        return 0


def run_one(net, blob_in, blob_out, x):
    assert net.load_model(graph.DataReaderFromEmpty()) == 0
    ex = net.create_extractor()
    assert ex.input(blob_in, graph.Mat(x)) == 0
    r, out = ex.extract(blob_out)
    assert r == 0
    return np.array(out)


def test_blob_indexes_no_layer_makes(tmp_path, capfd):
    """Blobs the header counts but no layer makes have no name and no extract; the others go by index and name."""
    path = tmp_path / "gap.param.bin"
    path.write_bytes(abs_net(tops=(0, 2), blob_count=3))
    net = cpu_net()
    assert net.load_param_bin(str(path)) == 0 and net.load_model(graph.DataReaderFromEmpty()) == 0
    assert [b.name for b in net.blobs()] == ["0", "", "2"] and net.output_indexes() == [2]
    x = np.array([-1.5, 2.0, -0.25], np.float32)
    ex = net.create_extractor()
    assert ex.input(0, graph.Mat(x)) == 0
    r, out = ex.extract(2)
    assert r == 0 and np.array_equal(np.array(out), np.abs(x))
    r, out = ex.extract("2")
    assert r == 0 and np.array_equal(np.array(out), np.abs(x))
    capfd.readouterr()
    assert ex.extract(1)[0] == -1 and ex.extract(3)[0] == -1
    err = capfd.readouterr().err
    assert "blob index 1 out of range (3 blobs; no layer makes that one)" in err and "blob index 3 out of range" in err


def test_a_blob_no_layer_makes_is_an_input_of_its_own(tmp_path, capfd):
    """A blob a layer reads that no layer makes is an input, as a bottom no earlier line makes is in text params:
    named by its index, given by index or name, and an extract that needs it says so while it is not given."""
    path = tmp_path / "other.param.bin"
    path.write_bytes(param_bin.words_bytes([7767517, 2, 3, INPUT, 0, 1, 0, -233, BINARY_OP, 2, 1, 0, 2, 1, -233]))
    net = cpu_net()
    assert net.load_param_bin(str(path)) == 0 and net.load_model(graph.DataReaderFromEmpty()) == 0
    assert [b.name for b in net.blobs()] == ["0", "1", "2"]
    a, b = np.array([1.0, 2.0], np.float32), np.array([0.5, -4.0], np.float32)
    ex = net.create_extractor()
    assert ex.input(0, graph.Mat(a)) == 0
    capfd.readouterr()
    assert ex.extract(1)[0] == -1
    assert "the input 2 it depends on was not given" in capfd.readouterr().err
    for other in (2, "2"):
        ex = net.create_extractor()
        assert ex.input(0, graph.Mat(a)) == 0 and ex.input(other, graph.Mat(b)) == 0
        r, out = ex.extract(1)
        assert r == 0 and np.array_equal(np.array(out), a + b)


@pytest.mark.parametrize("words, message", [
    (abs_net(bottom=1), "cyclic dependency at layer 1"),
    (abs_net(blob_count=3, tops=(0, 1), bottom=2, second=(0, 2)),
     "layer 1 reads blob 2, which it or a later layer makes"),
    (abs_net(blob_count=3, tops=(0, 2), second=(0, 2)), "layers 1 and 2 both make blob 2"),
    (param_bin.words_bytes([7767518, 1, 1, INPUT, 0, 1, 0, -233]), "param is too old"),
    (abs_net()[:-8], "read"),
    (b"7767517\n1 1\nInput in0 0 1 in0\n", ""),
], ids=["reads-own-output", "reads-later-blob", "made-twice", "magic", "truncated", "text-params"])
def test_malformed_binary_params_are_refused(tmp_path, capfd, words, message):
    """ncnn's reader refuses what it cannot read and a layer reading its own output; a layer reading a later layer's
    output (text params cannot say that: a name not made yet is an input of its own) and a blob two layers make (it
    would hold whichever ran last) are refused too. The net is left without a model: create_extractor says so."""
    path = tmp_path / "bad.param.bin"
    path.write_bytes(words)
    net = cpu_net()
    capfd.readouterr()
    assert net.load_param_bin(str(path)) == -1
    assert message in capfd.readouterr().err
    assert net.layers() == []
    with pytest.raises(RuntimeError, match="load_param has not succeeded"):
        net.create_extractor()


def test_missing_file(tmp_path, capfd):
    assert cpu_net().load_param_bin(str(tmp_path / "none.param.bin")) == -1
    assert "none.param.bin" in capfd.readouterr().err


def fused_bin(tmp_path, model="sd_resblock_c320"):
    data, names, custom = param_bin.to_param_bin(model_text(model, True), graph.layer_to_index)
    path = tmp_path / f"{model}-fused.param.bin"
    path.write_bytes(data)
    return str(path), custom


@pytest.mark.parametrize("vknorm", [True, False])
def test_fused_types_need_register_layer(tmp_path, capfd, vknorm):
    """A fused type in binary params is refused without register_layer, never run as whatever type holds its custom
    index (register_layers' vknorm.LayerNorm holds 256 by name; a stock net has nothing there)."""
    path, custom = fused_bin(tmp_path)
    assert custom == ["vknorm.GroupNorm"]
    net = cpu_net(vknorm)
    assert net.load_param_bin(path) == -1
    err = capfd.readouterr().err
    assert ("Net.register_layer" in err) if vknorm else ("layer 256 not exists or registered" in err), err
    if vknorm:
        net = cpu_net()
        assert net.register_layer(256, "vknorm.GroupNorm") == 0
        assert net.load_param_bin(path) == 0
        assert [t for _, t, *_ in net.layers()].count("vknorm.GroupNorm") == 2


def test_custom_indexes_stay_one_types_each(tmp_path):
    """ncnn numbers a net's own types 256 + j, j counting them as registered, up to 256 of them; register_layer's index
    counts too. An index a Python type holds is not register_layer's to take, and a Python type that would number
    past 256 (its index aliasing another's) is refused."""

    net = cpu_net()
    assert net.register_custom_layer("Twice", Twice) == 0  # after vknorm's 4 fused types: 260
    with pytest.raises(ValueError, match=r"the index is held by a Python layer type \(Twice, "):
        net.register_layer(260, "vknorm.GroupNorm")
    assert net.register_layer(261, "vknorm.GroupNorm") == 0
    net = cpu_net()
    assert net.register_layer(511, "vknorm.GroupNorm") == 0
    with pytest.raises(ValueError, match="at most 256 layer types of a net's own"):
        net.register_custom_layer("Twice", Twice)


def test_register_layer_refusals(tmp_path):
    path, _ = fused_bin(tmp_path)
    net = cpu_net()
    for index in (5, 255, 512, -1):
        with pytest.raises(ValueError, match="the index is a custom type's, 256"):
            net.register_layer(index, "vknorm.GroupNorm")
    for type_ in ("GroupNorm", "vknorm.Nope", "Convolution"):
        with pytest.raises(ValueError, match="one of vknorm's fused types"):
            net.register_layer(256, type_)
    with pytest.raises(ValueError, match=r"a stock net \(Net\(vknorm=False\)\)"):
        cpu_net(False).register_layer(256, "vknorm.GroupNorm")
    assert net.register_layer(256, "vknorm.GroupNorm") == 0 and net.load_param_bin(path) == 0
    with pytest.raises(RuntimeError, match="call it before load_param_bin, or after clear"):
        net.register_layer(257, "vknorm.LayerNorm")
    net.clear()
    assert net.register_layer(257, "vknorm.LayerNorm") == 0


def test_python_layer_in_binary_params(tmp_path, capfd):
    """A Python layer type is a custom index as ncnn numbers it (the net's types in the order registered: a stock
    net's first is 256, a vknorm net's 260, after its fused types); the layer gets its type's name."""

    text = "7767517\n2 2\nInput in0 0 1 in0\nTwice t 1 1 in0 out0\n"
    data, _, custom = param_bin.to_param_bin(text, graph.layer_to_index)
    assert custom == ["Twice"]
    path = tmp_path / "twice.param.bin"
    path.write_bytes(data)
    vknorm_net = cpu_net()  # 256 is a fused type's there: refused, saying where a type of one's own loads
    vknorm_net.register_custom_layer("Twice", Twice)
    capfd.readouterr()
    assert vknorm_net.load_param_bin(str(path)) == -1
    assert "a type of your own needs a net without vknorm's fused types (Python: Net(vknorm=False))" in \
        capfd.readouterr().err
    net = cpu_net(False)
    net.register_custom_layer("Twice", Twice)
    assert net.load_param_bin(str(path)) == 0
    assert [layer[:2] for layer in net.layers()] == [("0", "Input"), ("1", "Twice")]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(run_one(net, 0, 1, x), 2 * x)


def test_python_layer_registered_by_index_in_binary_params(tmp_path, capfd):
    """pyncnn's register_custom_layer(index, ...): a Python type under the custom index ncnn2mem gave a model's own
    type (256 here, which a Net() gives vknorm's fused LayerNorm by name) runs binary params as its text params run
    with the type registered by name. The index is the Python type's from then on: register_layer refuses it, and text
    params that reach it by the fused type's name are refused at load."""
    text = "7767517\n3 3\nInput in0 0 1 in0\nTwice t 1 1 in0 a\nLayerNorm n 1 1 a out0 0=3 1=0.001 2=0\n"
    data, names, custom = param_bin.to_param_bin(text, graph.layer_to_index)
    assert custom == ["Twice"]
    path = tmp_path / "twice.param.bin"
    path.write_bytes(data)
    x = np.array([[1.0, 2.0, 4.0], [0.5, -1.0, 3.0]], np.float32)
    by_name = cpu_net()
    by_name.register_custom_layer("Twice", Twice)
    assert by_name.load_param_mem(text) == 0
    want = run_one(by_name, "in0", "out0", x)
    net = cpu_net()
    assert net.register_custom_layer(256, Twice) == 0
    assert net.load_param_bin(str(path)) == 0
    assert [layer[1:3] for layer in net.layers()] == [("Input", False), ("", False), ("LayerNorm", True)]
    assert run_one(net, 0, 2, x).tobytes() == want.tobytes()
    with pytest.raises(ValueError, match=r"held by a Python layer type \(registered by index 256, "):
        net.register_layer(256, "vknorm.LayerNorm")
    capfd.readouterr()
    assert net.load_param_mem("7767517\n3 3\nInput in0 0 1 in0\nLayerNorm n 1 1 in0 a 0=3 1=0.001 2=0\n"
                              "GELU g 1 1 a out0\n") == -1  # fused: a vknorm.LayerNorm
    assert "of type vknorm.LayerNorm: its index 256 runs a Python layer type registered by that index" in \
        capfd.readouterr().err
    assert net.layers() == []


def test_register_custom_layer_by_index_as_pyncnn(capfd):
    """A built-in type's index registers that type by name; an index a type registered by name holds registers that
    type again (its new creator runs); indexes ncnn has no type for, or types vknorm runs, are refused."""
    net = cpu_net()
    assert net.register_custom_layer(ABS_VAL, Thrice) == 0  # AbsVal, by its index
    assert net.register_custom_layer("Twice", Twice) == 0  # after vknorm's 4 fused types: 260
    assert net.register_custom_layer(260, Thrice) == 0
    assert net.load_param_mem("7767517\n3 3\nInput in0 0 1 in0\nAbsVal a 1 1 in0 b\nTwice t 1 1 b out0\n") == 0
    x = np.array([1.0, -2.0], np.float32)
    assert np.array_equal(run_one(net, "in0", "out0", x), 9 * x)
    for index, message in ((250, "ncnn has no built-in type of that index"), (-1, "a custom one, 256 \\+ j"),
                           (512, "a custom one, 256 \\+ j"), (graph.layer_to_index("LayerNorm"),
                                                             "vknorm's layers run LayerNorm in this net")):
        with pytest.raises(ValueError, match=message):
            net.register_custom_layer(index, Twice)
    with pytest.raises(TypeError, match="the creator must be callable"):
        net.register_custom_layer(300, 5)


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.parametrize("register", ["by_index", "builtin_by_name"])
def test_layers_made_before_their_index_is_registered_again_are_freed(register):
    """ncnn destroys a layer with the destroyer its index has when the layer goes: a Python type registered over an
    index whose layers are loaded (vknorm's fused LayerNorm at 256, ncnn's own InnerProduct) gets them, and deletes
    what it did not make (they were kept, 8 MiB of weights a net)."""
    c = 1 << 20
    lines = {"by_index": [f"LayerNorm n 1 1 in0 a 0={c} 1=0.001 2=1", "GELU g 1 1 a out0"],
             "builtin_by_name": [f"InnerProduct f 1 1 in0 out0 0={c // 2} 1=1 2={c}"]}[register]
    count = 1 + len(lines)
    text = f"7767517\n{count} {count}\nInput in0 0 1 in0\n" + "".join(line + "\n" for line in lines)
    before = None
    for i in range(21):
        net = cpu_net(register == "by_index")
        assert net.load_param_mem(text) == 0 and net.load_model(graph.DataReaderFromEmpty()) == 0
        if register == "by_index":
            assert net.register_custom_layer(256, Twice) == 0
        else:
            assert net.register_custom_layer("InnerProduct", Twice) == 0
        net.clear()
        del net
        if i == 0:  # after the first: the allocator's and the module's own memory is there
            before = resident_mib()
    assert resident_mib() - before < 80, f"{resident_mib() - before:.0f} MiB kept by 20 nets of 8 MiB of weights"

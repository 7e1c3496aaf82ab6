"""pyncnn's custom Python layers in vknorm.graph: a ``Layer`` subclass made by a creator registered with
``Net.register_custom_layer`` runs inside the net beside vknorm's layers, on the host (a Vulkan net downloads its
inputs and uploads its outputs, as ncnn does for any layer without Vulkan), given ncnn's ParamDict at load_param,
ncnn's ModelBin at load_model, and float32 Mats of elempack 1 at forward. pyncnn's own layer code (its model zoo's
YoloV5Focus) runs unchanged with ``from vknorm import graph as ncnn``.

The model below has every form ncnn calls: a one-blob forward (the Focus), a one-blob forward_inplace reading its
params and weights (ScaleBias), a multi-blob forward (Concat2), a multi-blob forward_inplace (SumDiff), around a
BinaryOp add that the net fuses into vknorm's LayerNorm.

Tolerances, against float64 numpy of the same model: float32 storage, FP32_TOL at the outputs' scale (a LayerNorm
of float32 inputs; the Python layers compute in float32, a rounding each); float16 storage (a Vulkan net's blobs
between layers), each blob stored once in float16 and the norm's inputs amplified no more than 1/std (about 1
here), a handful of roundings: 8 x 2^-11 at the scale. vknorm's CPU net runs ncnn's own CPU layers, and pyncnn runs
the same Python code: stock pyncnn's results bit for bit there.
"""
from __future__ import annotations

import gc
import sys
import threading
import weakref

import numpy as np
import pytest

from availability import import_graph, import_or_missing
from reference import FP32_TOL
from test_python_processes import assert_clean, run_script

pytestmark = pytest.mark.timeout(300)

graph = import_graph()

FP16_TOL = 8 * 2.0 ** -11
W = 16  # the LayerNorm's and ScaleBias's width (the Focus halves the input's 32)

PARAM = f"""7767517
9 11
Input in0 0 1 in0
Input in1 0 1 in1
YoloV5Focus focus 1 1 in0 f0
ScaleBias sb 1 1 f0 s0 0={W} 1=0.5 -23302=3,1.0,2.0,3.0 3=tag
Split sp 1 2 s0 s1 s2
BinaryOp add 2 1 s1 in1 a0 0=0
LayerNorm ln 1 1 a0 n0 0={W} 1=1e-5 2=1
SumDiff sd 2 2 n0 s2 d0 d1
Concat2 cat 2 1 d0 d1 out0
"""


def layer_types(ncnn):
    """The model's Python layers written against a pyncnn-like module (vknorm.graph or pyncnn itself)."""

    class YoloV5Focus(ncnn.Layer):  # pyncnn's model zoo's, as written there
        yolov5FocusLayers: list = []

        def __init__(self):
            ncnn.Layer.__init__(self)
            self.one_blob_only = True
            self.yolov5FocusLayers.append(self)

        def forward(self, bottom_blob, top_blob, opt):
            x = np.array(bottom_blob)
            x = np.concatenate([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]])
            top_blob.clone_from(ncnn.Mat(x), opt.blob_allocator)
            if top_blob.empty():
                return -100
            return 0

    class ScaleBias(ncnn.Layer):
        def __init__(self):
            super().__init__()
            self.one_blob_only = True
            self.support_inplace = True

        def load_param(self, pd):
            self.w = pd.get(0, 0)
            self.gain = pd.get(1, 1.0)
            self.offsets = np.array(pd.get(2, ncnn.Mat()))
            self.tag = pd.get(3, "") if ncnn is graph else None  # pyncnn reads no string params
            return 0

        def load_model(self, mb):
            self.scale = np.array(mb.load(self.w, 1))
            self.bias = np.array(mb.load(self.w, 1))
            return 0 if self.scale.shape == (self.w,) and self.bias.shape == (self.w,) else -100

        def forward_inplace(self, bottom_top_blob, opt):
            x = bottom_top_blob.numpy()  # the Mat's memory: written in place
            x *= self.scale * np.float32(self.gain)
            x += self.bias + np.float32(self.offsets.sum())
            return 0

    class Concat2(ncnn.Layer):
        def forward(self, bottom_blobs, top_blobs, opt):
            top_blobs[0].clone_from(ncnn.Mat(np.concatenate([np.array(b) for b in bottom_blobs])))
            return 0

    class SumDiff(ncnn.Layer):
        def __init__(self):
            super().__init__()
            self.support_inplace = True

        def forward_inplace(self, bottom_top_blobs, opt):
            a, b = (np.array(m) for m in bottom_top_blobs)
            bottom_top_blobs[0].clone_from(ncnn.Mat(a + b))
            bottom_top_blobs[1].clone_from(ncnn.Mat(a - b))
            return 0

    return YoloV5Focus, ScaleBias, Concat2, SumDiff


def weights():
    rng = np.random.default_rng(7)
    return {"scale": rng.uniform(0.5, 1.5, W).astype(np.float32), "bias": rng.standard_normal(W).astype(np.float32),
            "gamma": rng.uniform(0.5, 1.5, W).astype(np.float32), "beta": rng.standard_normal(W).astype(np.float32)}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("custom")
    w = weights()
    (d / "m.param").write_text(PARAM)
    # .bin order: ScaleBias's scale and bias (raw, type 1), then LayerNorm's gamma and beta
    (d / "m.bin").write_bytes(b"".join(w[k].tobytes() for k in ("scale", "bias", "gamma", "beta")))
    return str(d / "m.param"), str(d / "m.bin"), w


def inputs():
    rng = np.random.default_rng(3)
    return rng.standard_normal((3, 8, 2 * W)).astype(np.float32), rng.standard_normal((12, 4, W)).astype(np.float32)


def reference(x0, x1, w):
    """float64 of the model."""
    x = x0.astype(np.float64)
    f = np.concatenate([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]])
    s = f * w["scale"] * 0.5 + w["bias"] + 6.0
    a = s + x1
    n = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5) * w["gamma"] + w["beta"]
    return np.concatenate([n + s, n - s])


def register(ncnn, net, types, kept=None):
    """Each type's creator. pyncnn holds no reference to a layer it made (its model zoo keeps them in a list, as
    `kept` does here; a layer collected meanwhile crashes it); vknorm.graph holds them itself. pyncnn takes a
    destroyer always."""
    for cls in types:
        def creator(cls=cls):
            layer = cls()
            if kept is not None:
                kept.append(layer)
            return layer
        assert net.register_custom_layer(cls.__name__, creator, lambda layer: None) == 0


def run(ncnn, net, x0, x1, name="out0") -> np.ndarray:
    ex = net.create_extractor()
    # (pyncnn's Mat(array) wraps the array's memory, which its net may then write or free: cloned)
    assert ex.input("in0", ncnn.Mat(x0).clone()) == 0 and ex.input("in1", ncnn.Mat(x1).clone()) == 0
    r, out = ex.extract(name)
    assert r == 0
    return np.array(out)


def vknorm_net(model, vulkan, fp16=False):
    p, b, _ = model
    net = graph.configure(graph.Net(), vulkan=vulkan, fp16=fp16)
    register(graph, net, layer_types(graph))
    assert net.load_param(p) == 0 and net.load_model(b) == 0
    return net


CONFIGS = {"cpu": dict(vulkan=False), "vulkan-fp32": dict(vulkan=True), "vulkan-fp16": dict(vulkan=True, fp16=True)}


@pytest.mark.parametrize("config", CONFIGS)
def test_python_layers_run_inside_a_vknorm_net_as_ncnn_calls_them(model, config):
    net = vknorm_net(model, **CONFIGS[config])
    x0, x1 = inputs()
    out = run(graph, net, x0, x1)
    ref = reference(x0, x1, model[2])
    tol = FP16_TOL if config == "vulkan-fp16" else FP32_TOL
    assert out.shape == ref.shape == (24, 4, W)
    np.testing.assert_allclose(out, ref, rtol=0, atol=tol * max(1.0, float(np.abs(ref).max())))
    # the add went into vknorm's LayerNorm; the norm ran on the device in a Vulkan net, the Python layers on the host
    assert [f["pattern"] for f in net.fused()] == ["BinaryOp+LayerNorm"]
    layers = {name: (kind, on_vulkan) for name, kind, _, on_vulkan in net.layers()}
    assert layers["focus"] == ("YoloV5Focus", False) and layers["sd"] == ("SumDiff", False)
    assert layers["ln"][1] is CONFIGS[config]["vulkan"]
    counters = net.vknorm_counters()
    assert (counters["vulkan_forwards"], counters["cpu_forwards"]) == ((1, 0) if CONFIGS[config]["vulkan"] else (0, 1))


@pytest.mark.parametrize("vulkan", [False, True], ids=["cpu", "vulkan"])
def test_the_same_layer_code_gives_pyncnns_results(model, vulkan):
    """pyncnn runs the very same Python code, within the float32 rule (another build of ncnn; on Vulkan vknorm's
    fused LayerNorm replaces ncnn's BinaryOp and LayerNorm). Compared up to the norm's output: pyncnn hands a
    multi-blob layer copies of its top blobs, so what SumDiff and Concat2 write never reaches its net (vknorm.graph
    takes back what the layer left in the lists)."""
    pyncnn = import_or_missing("ncnn")
    p, b, _ = model
    stock = pyncnn.Net()
    stock.opt.use_vulkan_compute = vulkan
    stock.opt.use_fp16_storage = stock.opt.use_fp16_packed = stock.opt.use_fp16_arithmetic = False
    stock.opt.use_bf16_storage = False
    kept: list = []
    register(pyncnn, stock, layer_types(pyncnn), kept)
    assert stock.load_param(p) == 0 and stock.load_model(b) == 0
    x0, x1 = inputs()
    ours = vknorm_net(model, vulkan)
    for blob in ("s0", "n0"):
        theirs, mine = run(pyncnn, stock, x0, x1, blob), run(graph, ours, x0, x1, blob)
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=2 * FP32_TOL * max(1.0, float(np.abs(theirs).max())))
    del stock, kept
    gc.collect()


def test_a_cpu_net_gives_stock_ncnns_results_bit_for_bit(model):
    """vknorm's CPU net runs ncnn's own CPU layers around the Python ones: stock ncnn of the same build
    (Net(vknorm=False)) gives the same bits, the multi-blob layers' outputs included."""
    p, b, _ = model
    stock = graph.configure(graph.Net(vknorm=False), vulkan=False)
    register(graph, stock, layer_types(graph))
    assert stock.load_param(p) == 0 and stock.load_model(b) == 0
    x0, x1 = inputs()
    np.testing.assert_array_equal(run(graph, vknorm_net(model, vulkan=False), x0, x1), run(graph, stock, x0, x1))


def test_the_destroyer_gets_each_layer_once_as_the_net_lets_it_go(model):
    p, b, _ = model
    made, destroyed = [], []
    Focus, ScaleBias, Concat2, SumDiff = layer_types(graph)

    def creator():
        layer = ScaleBias()
        made.append(layer)
        return layer

    net = graph.Net()
    for cls in (Focus, Concat2, SumDiff):
        net.register_custom_layer(cls.__name__, cls)
    net.register_custom_layer("ScaleBias", creator, destroyed.append)
    assert net.load_param(p) == 0 and net.load_model(b) == 0
    assert len(made) == 1 and (made[0].name, made[0].type, made[0].tag) == ("sb", "ScaleBias", "tag")
    assert destroyed == []
    net.clear()
    assert destroyed == made
    assert net.load_param(p) == 0
    del net
    gc.collect()
    assert len(made) == 2 and destroyed == made


def test_a_layers_exception_fails_the_call_that_ran_it(model):
    """As in pyncnn, the Python exception comes out of the load or extract, noted with the layer; the net stays
    usable for another extractor, and nothing crashes or hangs."""
    p, b, _ = model
    Focus, ScaleBias, Concat2, SumDiff = layer_types(graph)
    fail = {"forward": True}

    class Flaky(SumDiff):
        def forward_inplace(self, bottom_top_blobs, opt):
            if fail["forward"]:
                raise KeyError("no such key")
            return super().forward_inplace(bottom_top_blobs, opt)

    net = graph.configure(graph.Net(), vulkan=True)
    register(graph, net, (Focus, ScaleBias, Concat2))
    net.register_custom_layer("SumDiff", Flaky)
    assert net.load_param(p) == 0 and net.load_model(b) == 0
    x0, x1 = inputs()
    ex = net.create_extractor()
    ex.input("in0", graph.Mat(x0)), ex.input("in1", graph.Mat(x1))
    with pytest.raises(KeyError, match="no such key") as info:
        ex.extract("out0")
    assert info.value.__notes__ == ["raised in Python layer sd (SumDiff).forward_inplace"]
    fail["forward"] = False
    ref = reference(x0, x1, model[2])
    np.testing.assert_allclose(run(graph, net, x0, x1), ref, rtol=0, atol=FP32_TOL * float(np.abs(ref).max()))

    class BadParams(ScaleBias):
        def load_param(self, pd):
            raise ValueError("bad params")

    net = graph.Net()
    register(graph, net, (Focus, Concat2, SumDiff))
    net.register_custom_layer("ScaleBias", BadParams)
    with pytest.raises(ValueError, match="bad params"):
        net.load_param(p)
    with pytest.raises(RuntimeError, match="load_param has not succeeded"):
        net.create_extractor()

    def destroyer(layer):
        raise OSError("destroyer failed")

    net = graph.Net()
    register(graph, net, (Focus, Concat2, SumDiff))
    net.register_custom_layer("ScaleBias", ScaleBias, destroyer)
    assert net.load_param(p) == 0
    with pytest.raises(OSError, match="destroyer failed"):
        net.clear()


def one_layer_net(cls, vulkan=False, param_line="Custom c 1 1 in0 out0", name="Custom"):
    net = graph.configure(graph.Net(), vulkan=vulkan)
    net.register_custom_layer(name, cls)
    text = f"7767517\n2 2\nInput in0 0 1 in0\n{param_line}\n"
    assert net.load_param_mem(text) == 0 and net.load_model(graph.DataReaderFromEmpty()) == 0
    return net


def extract_one(net, x=None):
    ex = net.create_extractor()
    ex.input("in0", graph.Mat(np.ones((2, 3, 4), np.float32) if x is None else x))
    return ex.extract("out0")


class OneBlob(graph.Layer):
    def __init__(self):
        super().__init__()
        self.one_blob_only = True


class Copy(OneBlob):
    def forward(self, bottom_blob, top_blob, opt):
        top_blob.clone_from(bottom_blob)
        return 0


@pytest.mark.parametrize("vulkan", [False, True], ids=["cpu", "vulkan"])
def test_what_a_forward_returns_is_checked(vulkan):
    class Code(OneBlob):
        def forward(self, bottom_blob, top_blob, opt):
            return -7

    r, out = extract_one(one_layer_net(Code, vulkan))
    assert r == -7 and out.empty()

    class NoCode(OneBlob):
        def forward(self, bottom_blob, top_blob, opt):
            top_blob.clone_from(bottom_blob)

    with pytest.raises(TypeError, match=r"Python layer c \(Custom\).forward returned NoneType: ncnn's layer methods "
                                        r"return an int, 0 on success"):
        extract_one(one_layer_net(NoCode, vulkan))

    class Unfilled(OneBlob):
        def forward(self, bottom_blob, top_blob, opt):
            return 0

    with pytest.raises(ValueError, match="top_blob is empty after a forward that returned 0"):
        extract_one(one_layer_net(Unfilled, vulkan))

    class WrongTops(graph.Layer):
        def forward(self, bottom_blobs, top_blobs, opt):
            top_blobs.append(graph.Mat(1))
            return 0

    with pytest.raises(ValueError, match=r"top_blobs holds 2 Mats after the forward, not the 1 the layer makes"):
        extract_one(one_layer_net(WrongTops, vulkan))

    class NotAMat(graph.Layer):
        def forward(self, bottom_blobs, top_blobs, opt):
            top_blobs[0] = np.ones(3, np.float32)
            return 0

    with pytest.raises(TypeError, match=r"top_blobs\[0\] holds numpy.ndarray, not a Mat"):
        extract_one(one_layer_net(NotAMat, vulkan))

    class NumpyCode(OneBlob):  # a code that stands for an int (numpy's), as pyncnn takes it
        def forward(self, bottom_blob, top_blob, opt):
            top_blob.clone_from(bottom_blob)
            return np.int32(0)

    assert extract_one(one_layer_net(NumpyCode, vulkan))[0] == 0

    class SetOnTheInstance(OneBlob):  # pybind11 finds a method set on the instance too
        def __init__(self):
            super().__init__()
            self.forward = self.halve

        def halve(self, bottom_blob, top_blob, opt):
            top_blob.clone_from(graph.Mat(np.array(bottom_blob) / 2))
            return 0

    r, out = extract_one(one_layer_net(SetOnTheInstance, vulkan))
    assert r == 0 and np.array_equal(np.array(out), np.full((2, 3, 4), 0.5, np.float32))

    class Unprintable(Exception):
        def __str__(self):
            raise AttributeError("no message")

    class RaisesUnprintable(OneBlob):
        def forward(self, bottom_blob, top_blob, opt):
            raise Unprintable()

    with pytest.raises(Unprintable):
        extract_one(one_layer_net(RaisesUnprintable, vulkan))

    class Assigned(graph.Layer):  # a list's item replaced, not filled: taken as well
        def forward(self, bottom_blobs, top_blobs, opt):
            top_blobs[0] = graph.Mat(np.array(bottom_blobs[0]) * 2)
            return 0

    r, out = extract_one(one_layer_net(Assigned, vulkan))
    assert r == 0 and np.array_equal(np.array(out), np.full((2, 3, 4), 2, np.float32))


def test_a_layer_cannot_use_a_net_while_it_runs():
    """A layer's code runs while the net that called it is held (a Vulkan net's extract, a load): a net's methods
    called from there would wait for ever; they are a RuntimeError, raised out of the call that ran the layer."""
    nets = []

    class Reentrant(OneBlob):
        def forward(self, bottom_blob, top_blob, opt):
            nets[0].input_names()
            return 0

    nets.append(one_layer_net(Reentrant, vulkan=True))
    with pytest.raises(RuntimeError, match="a Python layer's code .* cannot call a Net's or an Extractor's methods"):
        extract_one(nets[0])
    extractors = [nets[0].create_extractor()]

    class ChangesAnExtractor(OneBlob):
        def forward(self, bottom_blob, top_blob, opt):
            extractors[0].set_light_mode(False)
            return 0

    changing = one_layer_net(ChangesAnExtractor, vulkan=True)
    extractors[0] = changing.create_extractor()
    extractors[0].input("in0", graph.Mat(np.ones(4, np.float32)))
    with pytest.raises(RuntimeError, match="cannot call a Net's or an Extractor's methods"):
        extractors[0].extract("out0")
    extractors = []

    def creator():
        extractors.append(nets[0].create_extractor())
        return OneBlob()

    net = graph.Net()
    net.register_custom_layer("Custom", creator)
    with pytest.raises(RuntimeError, match="cannot call a Net's or an Extractor's methods"):
        net.load_param_mem("7767517\n2 2\nInput in0 0 1 in0\nCustom c 1 1 in0 out0\n")
    assert extractors == []

    class DropsAnExtractor(OneBlob):  # an extractor let go from a layer's code goes, of its own net or another
        def forward(self, bottom_blob, top_blob, opt):
            extractors.clear()
            top_blob.clone_from(bottom_blob)
            return 0

    own = one_layer_net(DropsAnExtractor, vulkan=True)
    extractors.extend([own.create_extractor(), one_layer_net(OneBlob).create_extractor()])
    assert extract_one(own)[0] == 0 and extractors == []


@pytest.mark.parametrize("vulkan", [False, True], ids=["cpu", "vulkan"])
def test_a_layer_may_keep_what_its_forward_is_given(vulkan):
    """The blobs and the option a forward gets are the layer's to keep: copies of the blobs, and an option without
    the extractor's allocators (ncnn's Mat functions allocate through them), so what is made with it after the
    extractor and the net went is made in memory of its own."""
    kept = []

    class Keeps(OneBlob):
        def forward(self, bottom_blob, top_blob, opt):
            kept.append((bottom_blob, opt, graph.copy_make_border(bottom_blob, 1, 1, 1, 1, opt=opt)))
            top_blob.clone_from(bottom_blob)
            return 0

    net = one_layer_net(Keeps, vulkan)
    for _ in range(2):
        assert extract_one(net)[0] == 0
    del net
    gc.collect()
    for bottom, opt, bordered in kept:
        again = graph.copy_make_border(bottom, 2, 2, 2, 2, opt=opt)
        assert np.array(again).shape == (2, 7, 8) and np.array(bordered).shape == (2, 5, 6)
        assert np.array_equal(np.array(bottom), np.ones((2, 3, 4), np.float32))
    assert kept[0][1].blob_allocator is None


def test_a_registration_from_a_layers_code_is_refused_whole():
    tried = []
    net = graph.Net()

    def creator():
        try:
            net.register_custom_layer("Other", OneBlob)
        except RuntimeError as e:
            tried.append(str(e))
        return OneBlob()

    net.register_custom_layer("Custom", creator)
    assert net.load_param_mem("7767517\n2 2\nInput in0 0 1 in0\nCustom c 1 1 in0 out0\n") == 0
    assert len(tried) == 1 and "cannot call a Net's or an Extractor's methods" in tried[0]
    # nothing of it was kept: registered now, the type loads
    assert net.register_custom_layer("Other", OneBlob) == 0
    assert net.load_param_mem("7767517\n2 2\nInput in0 0 1 in0\nOther c 1 1 in0 out0\n") == 0


def test_layers_on_two_threads_letting_each_others_extractors_go_never_wait():
    """Each thread loads its net (holding it) while its layer's creator lets go the last extractor of the net the
    other thread is loading: neither waits for the other's net (that extractor is freed at its net's next load)."""
    both = threading.Barrier(2)
    extractors, errors = {}, []

    def net_named(name, other):
        def creator():
            if other in extractors:
                both.wait(timeout=30)  # both threads inside a load, each holding its own net
                del extractors[other]
            return Copy()
        net = graph.Net()
        net.register_custom_layer("Custom", creator)
        return net

    nets = {"a": net_named("a", "b"), "b": net_named("b", "a")}
    text = "7767517\n2 2\nInput in0 0 1 in0\nCustom c 1 1 in0 out0\n"
    for name, net in nets.items():
        assert net.load_param_mem(text) == 0 and net.load_model(graph.DataReaderFromEmpty()) == 0
    extractors.update({name: net.create_extractor() for name, net in nets.items()})

    def reload(net):
        try:
            assert net.load_param_mem(text) == 0
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=reload, args=(net,), daemon=True) for net in nets.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and errors == [] and extractors == {}
    for net in nets.values():  # the orphaned extractors freed here, then the nets run again
        assert net.load_model(graph.DataReaderFromEmpty()) == 0 and extract_one(net)[0] == 0


def test_layers_that_hold_each_others_extractors_let_go_on_two_threads_never_wait():
    """Two threads clear two nets at once, each net's layer holding the last extractor of the other net: the layer goes
    (after its destroy_pipeline, without a destroyer) while its thread holds its net, and so does that extractor,
    which is then never waited for."""
    both = threading.Barrier(2)
    made = {}

    class Holder(Copy):
        def destroy_pipeline(self, opt):
            both.wait(timeout=30)  # both threads inside a clear, each holding its own net
            return 0

    def net_named(name):
        def creator():
            made[name] = Holder()
            return made[name]
        net = graph.Net()
        net.register_custom_layer("Custom", creator)
        assert net.load_param_mem("7767517\n2 2\nInput in0 0 1 in0\nCustom c 1 1 in0 out0\n") == 0
        assert net.load_model(graph.DataReaderFromEmpty()) == 0
        return net

    nets = {"a": net_named("a"), "b": net_named("b")}
    made["a"].keep, made["b"].keep = nets["b"].create_extractor(), nets["a"].create_extractor()
    made.clear()
    threads = [threading.Thread(target=net.clear, daemon=True) for net in nets.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)


def test_paramdict_and_modelbin_are_ncnns_for_the_call():
    kept = {}

    class Keeps(OneBlob):
        def load_param(self, pd):
            kept["pd"] = pd
            kept["values"] = (pd.get(0, 0), pd.get(1, 0.0), pd.get(2, 0), pd.get(5, 1.5), pd.type(0), pd.type(1),
                              pd.type(9), np.array(pd.get(3, graph.Mat())).tolist(), pd.get(4, "none"))
            for bad_id in (-1, 32):
                with pytest.raises(IndexError, match="ParamDict ids are 0..31"):
                    pd.get(bad_id, 0)
            with pytest.raises(TypeError, match="default is an int, float, str or Mat"):
                pd.get(0, [1])
            return 0

        def load_model(self, mb):
            kept["mb"] = mb
            kept["weights"] = np.array(mb.load(2, 3, 1))
            with pytest.raises(ValueError, match="type is 0"):
                mb.load(4, 2)
            with pytest.raises(ValueError, match="w must be 1"):
                mb.load(0, 1)
            with pytest.raises(ValueError, match="more than 2"):
                mb.load(2 ** 16, 2 ** 16, 1)
            kept["past the end"] = mb.load(1000, 1).empty()
            return 0

        def forward(self, bottom_blob, top_blob, opt):
            top_blob.clone_from(bottom_blob)
            return 0

    net = graph.Net()
    net.register_custom_layer("Custom", Keeps)
    assert net.load_param_mem("7767517\n2 2\nInput in0 0 1 in0\n"
                              "Custom c 1 1 in0 out0 0=7 1=0.25 2=3 -23303=2,4,5 4=text\n") == 0
    w = np.arange(6, dtype=np.float32)
    assert net.load_model_mem(w.tobytes()) == 0
    # an int param read as a float gives its value, an int array float32 values (a Mat here holds float32)
    assert kept["values"] == (7, 0.25, 3, 1.5, 2, 3, 0, [4.0, 5.0], "text")
    assert kept["weights"].tolist() == w.reshape(3, 2).tolist() and kept["past the end"]
    with pytest.raises(RuntimeError, match="ParamDict is ncnn's for the one call it was given to"):
        kept["pd"].get(0, 0)
    with pytest.raises(RuntimeError, match="ModelBin is ncnn's for the one call it was given to"):
        kept["mb"].load(1, 1)
    with pytest.raises(RuntimeError, match="the ParamDict ncnn gives load_param is read-only"):
        kept["pd"].set(0, 1)
    # pyncnn's ParamDict(), filled by hand, to call a layer's load_param outside a net
    pd = graph.ParamDict()
    for i, value in enumerate((np.int64(7), np.float32(0.25), 3)):  # numpy's scalars as Python's
        pd.set(i, value)
    pd.set(3, graph.Mat(np.array([4, 5], np.float32)))
    pd.set(4, "text")
    with pytest.raises(TypeError, match="value is an int, float, str, Mat, or a list"):
        pd.set(5, None)
    assert Keeps().load_param(pd) == 0 and kept["values"] == (7, 0.25, 3, 1.5, 2, 3, 0, [4.0, 5.0], "text")
    assert (pd.get(0, np.int32(0)), pd.get(1, np.float64(0))) == (7, 0.25)
    pd.set(5, np.True_)  # a switch, as pyncnn stores it: an int
    assert (pd.type(5), pd.get(5, 0)) == (2, 1)
    pd.set(5, np.ones(2))  # a float array, as a .param's -23306= list
    assert pd.type(5) == 6 and np.array(pd.get(5, graph.Mat())).tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match="value is an int, float, str, Mat, or a list .*, got dict"):
        pd.set(5, {})


def test_what_cannot_be_a_python_layer_is_refused():
    Focus = layer_types(graph)[0]
    with pytest.raises(ValueError, match=r"vknorm's layers run LayerNorm in this net: a Python LayerNorm needs "
                                         r"Net\(vknorm=False\)"):
        graph.Net().register_custom_layer("LayerNorm", Focus)
    with pytest.raises(ValueError, match=r"this net fuses GELU layers into vknorm's norms as it loads: a Python GELU "
                                         r"needs Net\(fuse=False\)"):
        graph.Net().register_custom_layer("GELU", Focus)
    for bad in ("", "two words", "x" * 256):
        with pytest.raises(ValueError, match="one word of 1..255 characters"):
            graph.Net().register_custom_layer(bad, Focus)
    with pytest.raises(TypeError, match="the creator must be callable"):
        graph.Net().register_custom_layer("Custom", Focus())
    with pytest.raises(TypeError, match="the destroyer must be callable or None"):
        graph.Net().register_custom_layer("Custom", Focus, 3)
    for flag in ("support_vulkan", "support_packing", "support_fp16_storage", "support_bf16_storage",
                 "support_int8_storage", "support_any_packing", "support_vulkan_packing", "support_batch"):
        layer = Focus()
        with pytest.raises(ValueError, match=f"Layer.{flag}: a Python layer runs on the host"):
            setattr(layer, flag, True)
        setattr(layer, flag, False)
        assert getattr(layer, flag) is False

    shared = OneBlob()
    for creator, error, message in ((lambda: 3, TypeError, "returned int, not a vknorm.graph.Layer"),
                                    (lambda: shared, ValueError, "returned a layer a net holds already")):
        net = graph.Net()
        net.register_custom_layer("Custom", creator)
        with pytest.raises(error, match=f"the creator of Python layer type Custom {message}"):
            net.load_param_mem("7767517\n3 3\nInput in0 0 1 in0\nCustom a 1 1 in0 a0\nCustom b 1 1 a0 out0\n")

    class NoInit(graph.Layer):
        def __init__(self):
            pass

    net = graph.Net()
    net.register_custom_layer("Custom", NoInit)
    with pytest.raises(TypeError, match="whose __init__ did not call Layer.__init__"):
        net.load_param_mem("7767517\n2 2\nInput in0 0 1 in0\nCustom c 1 1 in0 out0\n")


def test_registering_a_type_again_replaces_its_creator_and_ncnns_type_count_is_kept():
    net = graph.Net()

    def first():
        return OneBlob()

    seen = weakref.ref(first)
    net.register_custom_layer("Custom", first)
    net.register_custom_layer("Custom", OneBlob)
    del first
    gc.collect()
    assert seen() is None  # the superseded creator is let go
    # ncnn numbers a net's own types below 256 (past that they alias another's); vknorm's fused types take 4
    for own, make in ((252, graph.Net), (256, lambda: graph.Net(vknorm=False))):
        net = make()
        for i in range(own):
            net.register_custom_layer(f"T{i}", OneBlob)
        with pytest.raises(ValueError, match="ncnn takes at most 256 layer types of a net's own"):
            net.register_custom_layer("OneMore", OneBlob)
        assert net.register_custom_layer("T0", OneBlob) == 0  # one of them again: no new type


def test_an_error_stays_with_the_call_that_ran_the_layer(monkeypatch):
    """A net's creator fails while its destroyer lets another net with Python layers go: the load raises the
    creator's error, and nothing is reported for the other net."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    def other_net():
        b = graph.Net()
        box = [b]  # held by its own creator: collected only by the collector
        b.register_custom_layer("Custom", lambda: (box, OneBlob())[1])
        assert b.load_param_mem("7767517\n2 2\nInput in0 0 1 in0\nCustom c 1 1 in0 out0\n") == 0

    made = []

    def creator():
        if made:
            raise KeyError("the second layer cannot be made")
        made.append(OneBlob())
        return made[-1]

    gc.collect()
    gc.disable()
    try:
        other_net()
        net = graph.Net()
        net.register_custom_layer("Custom", creator, lambda layer: gc.collect())
        with pytest.raises(KeyError, match="the second layer cannot be made"):
            net.load_param_mem("7767517\n3 3\nInput in0 0 1 in0\nCustom a 1 1 in0 a0\nCustom b 1 1 a0 out0\n")
    finally:
        gc.enable()
    assert unraisable == []


def test_a_built_in_type_taken_over_where_nothing_fuses_it():
    """ncnn lets a registered layer replace a built-in type: a Python ReLU runs in a net that does not fuse."""

    class Doubling(OneBlob):
        def forward(self, bottom_blob, top_blob, opt):
            top_blob.clone_from(graph.Mat(np.array(bottom_blob) * 2))
            return 0

    for vulkan in (False, True):
        net = graph.configure(graph.Net(fuse=False), vulkan=vulkan)
        net.register_custom_layer("ReLU", Doubling)
        assert net.load_param_mem("7767517\n2 2\nInput in0 0 1 in0\nReLU r 1 1 in0 out0\n") == 0
        assert net.load_model(graph.DataReaderFromEmpty()) == 0
        x = -np.ones((2, 3, 4), np.float32)
        r, out = extract_one(net, x)
        assert r == 0 and np.array_equal(np.array(out), 2 * x)


@pytest.mark.parametrize("vulkan", [False, True], ids=["cpu", "vulkan"])
def test_extracts_on_several_threads_run_python_layers(model, vulkan):
    net = vknorm_net(model, vulkan)
    x0, x1 = inputs()
    expected = run(graph, net, x0, x1)
    results, errors = [], []

    def work():
        try:
            for _ in range(5):
                results.append(run(graph, net, x0, x1))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and len(results) == 15
    for got in results:
        np.testing.assert_array_equal(got, expected)


def test_a_net_with_python_layers_is_collected_and_quiet_at_exit(model):
    """A creator defined in a script holds the script's globals, which hold the net, its extractors and its opt: a
    cycle the garbage collector sees (nothing is reported leaked at exit), whether the net is cleared or still
    loaded; a destroyer is not run as Python ends (it would meet the script's globals gone)."""
    p, b, _ = model
    code = f"""
import numpy as np
from vknorm import graph as ncnn
class Twice(ncnn.Layer):
    def __init__(self):
        ncnn.Layer.__init__(self)
        self.one_blob_only = True
    def forward(self, bottom_blob, top_blob, opt):
        top_blob.clone_from(ncnn.Mat(np.array(bottom_blob) * 2), opt.blob_allocator)
        return 0
def creator():
    return Twice()
gone = []
nets = []
def destroyer(layer):  # at exit this module's globals are gone: a destroyer is not run as Python ends
    gone.append(layer)
for vulkan in (False, True):
    net = ncnn.Net()
    o = net.opt  # held too (it keeps its net alive)
    o.use_vulkan_compute = vulkan
    net.register_custom_layer("Twice", creator, destroyer)
    net.load_param_mem("7767517\\n2 2\\nInput in0 0 1 in0\\nTwice t 1 1 in0 out0\\n")
    net.load_model(ncnn.DataReaderFromEmpty())
    ex = net.create_extractor()
    ex.input("in0", ncnn.Mat(np.ones((2, 3), np.float32)))
    ret, out = ex.extract("out0")
    assert ret == 0 and np.array(out).tolist() == [[2.0] * 3] * 2
    nets.append(net)
nets[0].clear()
assert len(gone) == 1
print("ok")
"""
    proc = run_script(code)
    assert_clean(proc)
    assert proc.stdout.strip() == "ok"

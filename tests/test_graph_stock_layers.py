"""ncnn's own layers run from Python, as pyncnn runs them: ``create_layer(type)`` makes ncnn's CPU layer of that type,
which takes ``load_param(pd)``, ``load_model(mb)`` (weights from ``ModelBinFromMatArray``, a list of Mats),
``create_pipeline(opt)`` and ``forward`` / ``forward_inplace`` on this module's Mats (float32, elempack 1). pyncnn's
model zoo runs a Softmax so after an extract (shufflenetv2), and that code runs unchanged here. A Python layer's
``super().forward(...)`` (and the other methods) run ncnn's base Layer's, as in pyncnn.

Where pyncnn crashes, this refuses: steps out of ncnn's order (load_param, load_model, create_pipeline, forward; a
forward after load_param takes the two between as a net would; a pipeline made again reads its weights again, which
ncnn's layers may free as they make one), weights of the wrong size or too few, empty inputs, lists shorter than the
layer's type and params index, threads outside 1..1024, types this ncnn is built without. Views at offsets ncnn's
aligned vector loads cannot take run on a copy, the result written back through the view.

Tolerances: the same build's net runs the same CPU code on the same float32 data: bit for bit. Against float64 numpy:
FP32_TOL at the outputs' scale (a softmax: a handful of float32 roundings; a 3x3x3 convolution: 27 products summed).
pyncnn is another build of ncnn (its CPU dispatch may differ): within FP32_TOL too, where pyncnn runs the layer (its
one-blob ``forward`` of a layer create_layer made crashes: compared on ``forward_inplace``).
"""
from __future__ import annotations

import gc
import struct

import numpy as np
import pytest

from availability import import_graph, import_or_missing
from reference import FP32_TOL

pytestmark = pytest.mark.timeout(300)

ncnn = import_graph()


def softmax_rows(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def conv3x3(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float64 valid 3x3 convolution of (c, h, w) by (o, c, 3, 3) plus bias."""
    c, h, wd = x.shape
    out = np.zeros((w.shape[0], h - 2, wd - 2))
    for i in range(h - 2):
        for j in range(wd - 2):
            out[:, i, j] = np.tensordot(w.astype(np.float64), x[:, i:i + 3, j:j + 3].astype(np.float64), 3)
    return out + b.astype(np.float64)[:, None, None]


def conv_param(module, outputs: int, inputs: int):
    pd = module.ParamDict()
    pd.set(0, outputs)  # num_output
    pd.set(1, 3)  # kernel
    pd.set(5, 1)  # bias
    pd.set(6, outputs * inputs * 9)  # weight_data_size
    return pd


def test_softmax_after_an_extract_as_pyncnns_model_zoo_runs_it():
    """shufflenetv2's code: extract, then ncnn's Softmax in place with the net's option. The net here is one
    InnerProduct-free identity (a Noop) on a 1-D blob, as the zoo's fc output is."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1000) * 4).astype(np.float32)
    net = ncnn.Net()
    net.load_param_mem("7767517\n2 2\nInput in0 0 1 in0\nNoop fc 1 1 in0 fc\n")
    net.load_model(ncnn.DataReaderFromEmpty())
    ex = net.create_extractor()
    ex.input("in0", ncnn.Mat(x))
    ret, mat_out = ex.extract("fc")
    assert ret == 0

    softmax = ncnn.create_layer("Softmax")
    pd = ncnn.ParamDict()
    assert softmax.load_param(pd) == 0
    assert softmax.forward_inplace(mat_out, net.opt) == 0
    mat_out = mat_out.reshape(mat_out.w * mat_out.h * mat_out.c)
    got = np.array(mat_out)
    assert np.abs(got - softmax_rows(x)).max() <= FP32_TOL * np.abs(softmax_rows(x)).max()

    pyncnn = import_or_missing("ncnn")
    theirs = pyncnn.create_layer("Softmax")
    theirs.load_param(pyncnn.ParamDict())
    held = x.copy()  # pyncnn's Mat wraps the array's memory: held while it is used
    m = pyncnn.Mat(held)
    assert theirs.forward_inplace(m, pyncnn.Option()) == 0
    assert np.abs(np.array(m) - got).max() <= FP32_TOL * np.abs(got).max()


def test_a_convolution_given_its_weights_matches_the_same_layer_in_a_net_bit_for_bit(tmp_path):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    x = rng.standard_normal((3, 9, 11)).astype(np.float32)

    conv = ncnn.create_layer("Convolution")
    assert (conv.type, conv.one_blob_only) == ("Convolution", True)
    assert conv.load_param(conv_param(ncnn, 4, 3)) == 0
    assert conv.load_model(ncnn.ModelBinFromMatArray([ncnn.Mat(w.reshape(-1)), ncnn.Mat(b)])) == 0
    opt = ncnn.Option()
    assert conv.create_pipeline(opt) == 0
    top = ncnn.Mat()
    assert conv.forward(ncnn.Mat(x), top, opt) == 0
    got = np.array(top)
    want = conv3x3(x, w, b)
    assert got.shape == want.shape == (4, 7, 9)
    assert np.abs(got - want).max() <= FP32_TOL * max(1.0, np.abs(want).max())

    # the same layer in a CPU net of this build, float32 elempack 1 throughout: the same code, bit for bit
    (tmp_path / "c.param").write_text("7767517\n2 2\nInput in0 0 1 in0\n"
                                      "Convolution conv 1 1 in0 out0 0=4 1=3 5=1 6=108\n")
    (tmp_path / "c.bin").write_bytes(struct.pack("<I", 0) + w.tobytes() + b.tobytes())
    net = ncnn.Net()
    net.opt.use_packing_layout = False
    net.opt.use_fp16_storage = net.opt.use_fp16_packed = net.opt.use_fp16_arithmetic = False
    assert net.load_param(str(tmp_path / "c.param")) == 0
    assert net.load_model(str(tmp_path / "c.bin")) == 0
    ex = net.create_extractor()
    ex.input("in0", ncnn.Mat(x))
    ret, out = ex.extract("out0")
    assert ret == 0
    np.testing.assert_array_equal(got, np.array(out))

    # pyncnn's ModelBinFromMatArray takes one Mat (a second read runs past it): taken here too
    nobias = ncnn.create_layer("Convolution")
    pd = conv_param(ncnn, 4, 3)
    pd.set(5, 0)
    assert nobias.load_param(pd) == 0
    assert nobias.load_model(ncnn.ModelBinFromMatArray(ncnn.Mat(w.reshape(-1)))) == 0
    assert nobias.forward(ncnn.Mat(x), top, opt) == 0
    want = conv3x3(x, w, np.zeros(4, np.float32))
    assert np.abs(np.array(top) - want).max() <= FP32_TOL * max(1.0, np.abs(want).max())


def test_multi_blob_forms_fill_the_lists_given():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    c = rng.standard_normal((5, 3, 4)).astype(np.float32)
    opt = ncnn.Option()

    concat = ncnn.create_layer("Concat")
    assert concat.load_param(ncnn.ParamDict()) == 0
    kept = ncnn.Mat()
    tops = [kept]
    assert concat.forward([ncnn.Mat(a), ncnn.Mat(c)], tops, opt) == 0
    np.testing.assert_array_equal(np.array(tops[0]), np.concatenate([a, c]))
    assert tops[0] is kept  # written into the Mat given, as a caller holding it expects

    split = ncnn.create_layer("Split")
    assert split.load_param(ncnn.ParamDict()) == 0
    tops = [ncnn.Mat(), ncnn.Mat(), ncnn.Mat()]
    assert split.forward([ncnn.Mat(a)], tops, opt) == 0
    for t in tops:
        np.testing.assert_array_equal(np.array(t), a)

    relu = ncnn.create_layer("ReLU")  # one blob only: the form ncnn's net calls it by, as for every layer
    assert relu.load_param(ncnn.ParamDict()) == 0
    with pytest.raises(TypeError, match=r"ReLU takes one blob \(one_blob_only\): forward_inplace\(bottom_top_blob"):
        relu.forward_inplace([ncnn.Mat(a)], opt)
    with pytest.raises(TypeError, match=r"Concat takes lists of blobs: forward\(bottom_blobs, top_blobs, opt\)"):
        concat.forward(ncnn.Mat(a), ncnn.Mat(), opt)
    m = ncnn.Mat(a)
    assert relu.forward_inplace(m, opt) == 0
    np.testing.assert_array_equal(np.array(m), np.maximum(a, 0))


def test_steps_out_of_ncnns_order_and_bad_weights_are_refused():
    opt = ncnn.Option()
    x = ncnn.Mat(np.ones((3, 5, 5), np.float32))

    with pytest.raises(ValueError, match="no layer type 'NoSuchLayer'"):
        ncnn.create_layer("NoSuchLayer")
    with pytest.raises(ValueError, match="type index -1"):
        ncnn.create_layer(-1)
    assert ncnn.create_layer(ncnn.layer_to_index("ReLU")).typeindex == ncnn.layer_to_index("ReLU")

    conv = ncnn.create_layer("Convolution")
    with pytest.raises(RuntimeError, match=r"load_param\(pd\) has not succeeded"):
        conv.forward(x, ncnn.Mat(), opt)
    with pytest.raises(RuntimeError, match=r"load_param\(pd\) has not succeeded"):
        conv.load_model(ncnn.ModelBinFromMatArray([]))
    assert conv.load_param(conv_param(ncnn, 2, 3)) == 0
    with pytest.raises(RuntimeError, match="this layer has weights"):
        conv.forward(x, ncnn.Mat(), opt)  # no load_model: the net's empty read fails, as ncnn's would
    with pytest.raises(ValueError, match="weight 0 holds 53 values, the layer reads 54"):
        conv.load_model(ncnn.ModelBinFromMatArray([ncnn.Mat(np.ones(53, np.float32)), ncnn.Mat(np.ones(2))]))
    with pytest.raises(ValueError, match="reads weight 1 .* the list holds 1"):
        conv.load_model(ncnn.ModelBinFromMatArray([ncnn.Mat(np.ones(54, np.float32))]))
    with pytest.raises(ValueError, match="empty Mat"):
        ncnn.ModelBinFromMatArray([ncnn.Mat()])
    with pytest.raises(TypeError, match=r"weights\[1\] is .*int.*, not a Mat"):
        ncnn.ModelBinFromMatArray([ncnn.Mat(np.ones(54, np.float32)), 3])
    with pytest.raises(TypeError, match="a list of Mats or one Mat, got .*ndarray"):
        ncnn.ModelBinFromMatArray(np.ones(54, np.float32))
    # weights as (o, c, kh, kw) and (o,): only their count is read, as ncnn's own ModelBin reads them
    assert conv.load_model(ncnn.ModelBinFromMatArray([ncnn.Mat(np.ones((2, 3, 9), np.float32)),
                                                      ncnn.Mat(np.zeros(2, np.float32))])) == 0
    with pytest.raises(ValueError, match="bottom_blob is empty"):
        conv.forward(ncnn.Mat(), ncnn.Mat(), opt)
    top = ncnn.Mat()
    assert conv.forward(x, top, opt) == 0  # its pipeline made here, with this option
    np.testing.assert_array_equal(np.array(top), np.full((2, 3, 3), 27.0, np.float32))
    with pytest.raises(RuntimeError, match=r"destroy_pipeline\(opt\) first"):
        conv.load_param(conv_param(ncnn, 2, 3))
    assert conv.destroy_pipeline(opt) == 0
    assert conv.load_param(conv_param(ncnn, 2, 3)) == 0  # and the steps after it again
    with pytest.raises(RuntimeError, match="this layer has weights"):
        conv.forward(x, ncnn.Mat(), opt)  # the weights read again first
    with pytest.raises(TypeError, match=r"bottom_blobs\[0\] is .*, not a Mat"):
        conv.forward([np.ones(3)], [ncnn.Mat()], opt)
    del conv, top
    gc.collect()


def test_a_creator_returns_a_layer_subclass_not_one_create_layer_made():
    net = ncnn.Net()
    net.register_custom_layer("Mine", lambda: ncnn.create_layer("ReLU"))
    with pytest.raises(TypeError, match="a layer create_layer made"):
        net.load_param_mem("7767517\n2 2\nInput in0 0 1 in0\nMine m 1 1 in0 out0\n")


def test_a_python_layer_calls_ncnns_base_layer_through_super():
    """ncnn's base forward of a layer that supports in-place clones the input and runs forward_inplace; without
    in-place support it returns -1, as do the base forward_inplace. load_param ... create_pipeline return 0."""
    opt = ncnn.Option()

    calls: list = []

    class Double(ncnn.Layer):
        def __init__(self):
            super().__init__()
            self.one_blob_only = True
            self.support_inplace = True

        def load_param(self, pd):
            return super().load_param(pd)

        def forward(self, bottom_blob, top_blob, opt):
            calls.append("forward")
            return super().forward(bottom_blob, top_blob, opt)

        def forward_inplace(self, bottom_top_blob, opt):
            calls.append("forward_inplace")
            bottom_top_blob.clone_from(ncnn.Mat(np.array(bottom_top_blob) * 2))
            return 0

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    layer = Double()
    assert layer.load_param(ncnn.ParamDict()) == 0
    assert layer.create_pipeline(opt) == 0 and layer.destroy_pipeline(opt) == 0
    top = ncnn.Mat()
    assert layer.forward(ncnn.Mat(x), top, opt) == 0
    np.testing.assert_array_equal(np.array(top), x * 2)

    layer.support_inplace = False
    assert layer.forward(ncnn.Mat(x), ncnn.Mat(), opt) == -1
    assert ncnn.Layer.forward_inplace(layer, ncnn.Mat(x), opt) == -1

    class Pair(ncnn.Layer):  # the list forms: tops cloned from bottoms, then forward_inplace on them
        def __init__(self):
            super().__init__()
            self.support_inplace = True

        def forward(self, bottom_blobs, top_blobs, opt):
            return super().forward(bottom_blobs, top_blobs, opt)

        def forward_inplace(self, bottom_top_blobs, opt):
            a, b = (np.array(m) for m in bottom_top_blobs)
            bottom_top_blobs[0].clone_from(ncnn.Mat(a + b))
            bottom_top_blobs[1].clone_from(ncnn.Mat(a - b))
            return 0


    tops = [ncnn.Mat()]  # ncnn's base makes as many tops as bottoms
    assert Pair().forward([ncnn.Mat(x), ncnn.Mat(x + 1)], tops, opt) == 0
    assert len(tops) == 2
    np.testing.assert_array_equal(np.array(tops[0]), 2 * x + 1)
    np.testing.assert_array_equal(np.array(tops[1]), -np.ones_like(x))

    # in a net without light mode ncnn calls forward, whose super() runs forward_inplace (light mode: the latter)
    net = ncnn.Net()
    net.opt.lightmode = False
    net.register_custom_layer("Double", Double)
    assert net.load_param_mem("7767517\n2 2\nInput in0 0 1 in0\nDouble d 1 1 in0 out0\n") == 0
    net.load_model(ncnn.DataReaderFromEmpty())
    ex = net.create_extractor()
    ex.input("in0", ncnn.Mat(x))
    calls.clear()
    ret, out = ex.extract("out0")
    assert ret == 0 and calls == ["forward", "forward_inplace"]
    np.testing.assert_array_equal(np.array(out), x * 2)

    class Raises(Double):
        def forward_inplace(self, bottom_top_blob, opt):
            raise ArithmeticError("from forward_inplace")

    with pytest.raises(ArithmeticError, match="from forward_inplace"):
        Raises().forward(ncnn.Mat(x), ncnn.Mat(), opt)  # raised by the super() call that ran it


def test_paramdict_takes_pyncnns_keywords():
    pd = ncnn.ParamDict()
    pd.set(0, i=3)
    pd.set(1, f=0.5)
    pd.set(2, v=ncnn.Mat(np.array([1.0, 2.0], np.float32)))
    pd.set(3, value=7)
    pd.set(4, f=2)  # an int taken as a float, as pyncnn's overload takes it
    assert [pd.type(i) for i in range(5)] == [2, 3, 4, 2, 3]
    with pytest.raises(TypeError, match=r"set\(id, v=...\): a Mat, or a list .*, got int"):
        pd.set(2, v=5)
    with pytest.raises(TypeError, match=r"set\(id, i=...\): an int, got float"):
        pd.set(0, i=1.5)
    assert pd.get(0, 0) == 3 and pd.get(1, 0.0) == 0.5
    assert pd.get(3, default=0) == 7
    np.testing.assert_array_equal(np.array(pd.get(2, ncnn.Mat())), [1.0, 2.0])


def test_a_pipeline_made_again_reads_its_weights_again():
    """ncnn's x86 InnerProduct frees its weights as it makes its pipeline (opt.lightmode, the default): after
    destroy_pipeline the weights are loaded again before another pipeline (the forward refuses, naming the step)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((5, 12)).astype(np.float32)
    x = rng.standard_normal(12).astype(np.float32)
    ip = ncnn.create_layer("InnerProduct")
    pd = ncnn.ParamDict()
    pd.set(0, 5)
    pd.set(2, 60)
    assert ip.load_param(pd) == 0
    assert ip.load_model(ncnn.ModelBinFromMatArray(ncnn.Mat(w.reshape(-1)))) == 0
    opt = ncnn.Option()
    assert opt.lightmode
    first = ncnn.Mat()
    assert ip.forward(ncnn.Mat(x), first, opt) == 0
    assert np.abs(np.array(first) - w.astype(np.float64) @ x).max() <= FP32_TOL * max(1.0, np.abs(w @ x).max())
    assert ip.destroy_pipeline(opt) == 0
    with pytest.raises(RuntimeError, match="this layer has weights"):
        ip.forward(ncnn.Mat(x), ncnn.Mat(), opt)
    assert ip.load_model(ncnn.ModelBinFromMatArray(ncnn.Mat(w.reshape(-1)))) == 0
    again = ncnn.Mat()
    assert ip.forward(ncnn.Mat(x), again, opt) == 0
    np.testing.assert_array_equal(np.array(again), np.array(first))


def test_views_off_ncnns_alignment_run_on_a_copy_written_back():
    values = np.linspace(-3, 3, 64).astype(np.float32)
    base = ncnn.Mat(values)
    view = base.range(1, 45)  # one float past the allocation's alignment
    relu = ncnn.create_layer("ReLU")
    assert relu.load_param(ncnn.ParamDict()) == 0
    assert relu.forward_inplace(view, ncnn.Option()) == 0
    want = values.copy()
    want[1:46] = np.maximum(want[1:46], 0)
    np.testing.assert_array_equal(np.array(base), want)  # written through the view, the rest untouched

    rows = np.arange(5 * 7, dtype=np.float32).reshape(5, 7)
    m = ncnn.Mat(rows)
    eltwise = ncnn.create_layer("Eltwise")
    pd = ncnn.ParamDict()
    pd.set(0, 1)  # sum
    assert eltwise.load_param(pd) == 0
    tops = [ncnn.Mat()]
    assert eltwise.forward((m.row_range(1, 3), m.row_range(2, 3)), tops, ncnn.Option()) == 0
    np.testing.assert_array_equal(np.array(tops[0]), rows[1:4] + rows[2:5])


def test_lists_threads_and_types_ncnn_would_crash_on_are_refused():
    opt = ncnn.Option()
    x = ncnn.Mat(np.ones((2, 3, 4), np.float32))

    def made(type_: str, **params):
        layer = ncnn.create_layer(type_)
        pd = ncnn.ParamDict()
        for k, v in params.items():
            pd.set(int(k[1:]), v)
        assert layer.load_param(pd) == 0
        return layer

    with pytest.raises(ValueError, match="BinaryOp with its params takes at least 2 Mat"):
        made("BinaryOp").forward([x], [ncnn.Mat()], opt)
    scalar = made("BinaryOp", p0=2, p1=1, p2=3.0)  # with_scalar: one blob, times 3 (ncnn's x86 list form would
    top = ncnn.Mat()  # read a second)
    assert scalar.one_blob_only and scalar.forward(x, top, opt) == 0
    np.testing.assert_array_equal(np.array(top), np.full((2, 3, 4), 3.0, np.float32))
    with pytest.raises(TypeError, match="BinaryOp takes one blob"):
        scalar.forward([x], [ncnn.Mat()], opt)
    with pytest.raises(ValueError, match="Eltwise with its params takes at least 2"):
        made("Eltwise").forward([x], [ncnn.Mat()], opt)
    with pytest.raises(ValueError, match="SDPA with its params takes at least 3"):
        made("SDPA").forward([x, x], [ncnn.Mat()], opt)
    with pytest.raises(ValueError, match="takes at least 1 Mat.* got 0"):
        made("Concat").forward([], [ncnn.Mat()], opt)
    with pytest.raises(ValueError, match="makes at least 1 Mat.*top_blobs holds 0"):
        made("Concat").forward([x], [], opt)
    with pytest.raises(ValueError, match="Slice with its params makes 1..2 Mat.*holds 3"):
        made("Slice", p0=[1, -233]).forward([x], [ncnn.Mat(), ncnn.Mat(), ncnn.Mat()], opt)
    with pytest.raises(ValueError, match=r"makes no Mat: it takes its slices \(param 0\) or indices"):  # ncnn's reads
    # a null array without them
        made("Slice").forward([x], [ncnn.Mat()], opt)
    for threads in (0, -1, 1025):
        bad = ncnn.Option()
        bad.num_threads = threads
        with pytest.raises(ValueError, match=f"num_threads must be 1..1024, got {threads}"):
            made("ReLU").forward_inplace(x, bad)
    with pytest.raises(ValueError, match="built without layer type 'ArgMax'"):
        ncnn.create_layer("ArgMax")  # named in ncnn's registry, compiled out of this build
    with pytest.raises(ValueError, match="no layer type"):
        ncnn.create_layer("ReLU\0x")
    with pytest.raises(RuntimeError, match="load_param.* has not succeeded"):
        ncnn.create_layer("ReLU").forward_inplace(x, opt)
    with pytest.raises(TypeError, match=r"top_blobs is tuple, not a list of Mats"):
        made("Concat").forward([x], (ncnn.Mat(),), opt)


def test_array_params_from_lists_and_numpy_as_a_param_file_gives_them():
    """ncnn reads an int array's bits as int32 (a .param's -23300 lists): a list or numpy array of ints is one, a
    Mat's float32 values are not (pyncnn's Mat of int32 keeps the bits; this module's Mats are float32)."""
    x = np.arange(2 * 6 * 4, dtype=np.float32).reshape(2, 6, 4)
    pd = ncnn.ParamDict()
    pd.set(0, np.array([2, -233], np.int32))  # slices: 2 rows, then the rest
    pd.set(1, 1)  # axis: rows
    assert pd.type(0) == 5 and np.array(pd.get(0, ncnn.Mat())).tolist() == [2.0, -233.0]
    pd.set(5, [0.5, 1.5])
    assert pd.type(5) == 6
    pd.set(5, 7)
    assert pd.type(5) == 2  # set again: the new value's type
    sl = ncnn.create_layer("Slice")
    assert sl.load_param(pd) == 0
    tops = [ncnn.Mat(), ncnn.Mat()]
    assert sl.forward([ncnn.Mat(x)], tops, ncnn.Option()) == 0
    np.testing.assert_array_equal(np.array(tops[0]), x[:, :2])
    np.testing.assert_array_equal(np.array(tops[1]), x[:, 2:])
    with pytest.raises(TypeError, match="holds ints or floats, item 1 is str"):
        pd.set(0, [1, "2"])
    with pytest.raises(ValueError, match="1-d"):
        pd.set(0, np.ones((2, 2), np.int32))


def test_a_refused_set_leaves_the_param_and_ncnns_form_flag_its_own():
    pd = ncnn.ParamDict()
    pd.set(0, [2, -233])
    with pytest.raises(TypeError):
        pd.set(0, {})
    assert pd.type(0) == 5 and np.array(pd.get(0, ncnn.Mat())).tolist() == [2.0, -233.0]
    scalar = ncnn.create_layer("BinaryOp")
    pd = ncnn.ParamDict()
    pd.set(1, 1)  # with_scalar: one blob
    assert scalar.load_param(pd) == 0
    scalar.one_blob_only = False  # Python's copy of the flag: ncnn's layer still takes one blob
    x = ncnn.Mat(np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match="BinaryOp takes one blob"):
        scalar.forward([x], [ncnn.Mat()], ncnn.Option())
    assert ncnn.create_layer(ncnn.layer_to_index("Slice")).forward.__self__ is not None
    with pytest.raises(RuntimeError, match=r"^\(layer of type index \d+\)\.forward: load_param"):
        ncnn.create_layer(ncnn.layer_to_index("Slice")).forward([x], [ncnn.Mat()], ncnn.Option())

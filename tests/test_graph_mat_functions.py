"""vknorm.graph's Mat functions, as pyncnn's: copy_make_border and copy_make_border_3d, copy_cut_border (and its _3d),
resize_nearest / resize_bilinear / resize_bicubic and flatten, each returning the new Mat or writing it into a dst
given second (which may be src); and DataReaderFromEmpty, a model's weights all zero, for a net made from its .param
alone. So the pre- and post-processing of pyncnn code (its model zoo pads with copy_make_border, resizes with
resize_bilinear, times param-only nets with DataReaderFromEmpty) moves over by changing its import.

They are ncnn's own functions (its Padding, Crop, Interp and Flatten layers; the ncnn compiled into vknorm is the
version pyncnn ships): results equal pyncnn's bit for bit, but for bicubic resizing and the bilinear resize of a 1-wide
or 1-high Mat, whose float32 sums the two builds round differently, and where pyncnn is wrong (its Mat of a dims 3 array leaves planes of 35 floats unpadded,
which ncnn's Crop then reads across; its cut of a dims 4 Mat has depth 0): there the result is numpy's slice. A result is float32 of elempack 1,
as every Mat of vknorm.graph (pyncnn's flatten may return one packed 16 wide). A result that needs no change is src
itself, as in ncnn (writes reach both).

What would make ncnn read or write past a buffer, or return a wrong Mat, is a ValueError or TypeError naming the
numbers: negative widths, an unknown border type, a reflection as wide as the Mat, a border along an axis the Mat
lacks, a cut that leaves nothing, sizes below 1 or past ncnn's int coefficient tables, a dims 4 Mat to resize (ncnn's
Interp would resize its first depth slice only), results past ncnn's int element counts, an empty Mat,
opt.num_threads outside 1..1024. A dims 3 view whose planes lie w*h apart (a dims 4 Mat's channel) is read where they
lie."""
from __future__ import annotations

import os

import numpy as np
import pytest

from availability import import_graph, import_or_missing

graph = import_graph()
Mat = graph.Mat

SHAPES = {1: (11,), 2: (5, 7), 3: (3, 5, 7), 4: (2, 3, 5, 7)}  # numpy order; 5x7 planes are padded (cstep 36)
EPS32 = float(np.finfo(np.float32).eps)


def array(dims: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPES[dims]).astype(np.float32)


def pyncnn():
    return import_or_missing("ncnn")


def assert_bits_equal(ours, theirs) -> None:
    a, b = np.array(ours), np.array(theirs)
    assert a.shape == b.shape
    assert a.tobytes() == b.tobytes(), f"max |difference| {np.abs(a - b).max()}"


def test_border_types_are_pyncnns_and_ncnns():
    theirs = pyncnn().BorderType
    assert int(graph.BorderType.BORDER_CONSTANT) == int(theirs.BORDER_CONSTANT) == 0
    assert int(graph.BorderType.BORDER_REPLICATE) == int(theirs.BORDER_REPLICATE) == 1
    assert int(graph.BorderType.BORDER_REFLECT) == 2  # ncnn's mat.h; pyncnn names only the first two


@pytest.mark.parametrize("dims", [1, 2, 3, 4])
@pytest.mark.parametrize("border", [0, 1, 2])
def test_copy_make_border_equals_pyncnn(dims, border):
    ncnn, x = pyncnn(), array(dims)
    rows = (1, 2) if dims >= 2 else (0, 0)
    ours = graph.copy_make_border(Mat(x), *rows, 3, 1, graph.BorderType(border), 2.5)
    assert_bits_equal(ours, ncnn.copy_make_border(ncnn.Mat(x), *rows, 3, 1, border, 2.5))
    assert np.array(ours).shape[-1] == x.shape[-1] + 4
    if border == 0:  # the constant lies around the Mat, which sits unchanged inside
        inner = np.array(ours)[..., rows[0]:rows[0] + x.shape[-2], 3:-1] if dims >= 2 else np.array(ours)[3:-1]
        assert (inner == x).all() and (np.array(ours)[..., 0] == 2.5).all()


@pytest.mark.parametrize("dims", [3, 4])
@pytest.mark.parametrize("border", [0, 1, 2])
def test_copy_make_border_3d_pads_channels_of_dims_3_and_depth_of_dims_4_as_pyncnn(dims, border):
    ncnn, x = pyncnn(), array(dims)
    ours = graph.copy_make_border_3d(Mat(x), 1, 2, 3, 1, 1, 2, border, -1.0)
    assert_bits_equal(ours, ncnn.copy_make_border_3d(ncnn.Mat(x), 1, 2, 3, 1, 1, 2, border, -1.0))
    assert np.array(ours).shape[-3] == x.shape[-3] + 3


@pytest.mark.parametrize("dims", [1, 2, 3, 4])
def test_copy_cut_border_is_the_slice_inside_and_pyncnns_where_pyncnn_is_right(dims):
    x = array(dims)
    if dims == 1:
        ours, inside = graph.copy_cut_border(Mat(x), 0, 0, 3, 1), x[3:-1]
    else:
        ours, inside = graph.copy_cut_border(Mat(x), 1, 2, 3, 1), x[..., 1:-2, 3:-1]
    assert_bits_equal(ours, inside)
    if dims <= 2:
        ncnn = pyncnn()
        rows = (0, 0) if dims == 1 else (1, 2)
        assert_bits_equal(ours, ncnn.copy_cut_border(ncnn.Mat(x), *rows, 3, 1))


def test_copy_cut_border_3d_cuts_the_depth_of_dims_4():
    x = array(4)
    assert_bits_equal(graph.copy_cut_border_3d(Mat(x), 1, 2, 3, 1, 1, 1), x[:, 1:-1, 1:-2, 3:-1])
    assert_bits_equal(graph.copy_cut_border_3d(Mat(x[0]), 1, 2, 3, 1, 0, 0), x[0][:, 1:-2, 3:-1])


NARROW = {2: (5, 1), 3: (3, 1, 7)}  # 1 wide; 1 high: ncnn resizes these by its small-input path


@pytest.mark.parametrize("dims", [1, 2, 3, "2 narrow", "3 narrow"])
@pytest.mark.parametrize("size", [(9, 4), (3, 2), (1, 1)])
@pytest.mark.parametrize("name", ["resize_nearest", "resize_bilinear", "resize_bicubic"])
def test_resizes_equal_pyncnn(dims, size, name):
    ncnn = pyncnn()
    narrow = isinstance(dims, str)
    x = np.random.default_rng(0).standard_normal(NARROW[int(dims[0])]).astype(np.float32) if narrow else array(dims)
    ours = np.array(getattr(graph, name)(Mat(x), *size))
    theirs = np.array(getattr(ncnn, name)(ncnn.Mat(x), *size))
    assert ours.shape == theirs.shape
    # ncnn's rules: a dims 1 Mat becomes w channels of h x w filled with its values; a dims 2 Mat has each row resized
    assert ours.shape == {1: (x.shape[0], size[1], size[0]), 2: (x.shape[0], size[0]),
                          3: (x.shape[0], size[1], size[0])}[x.ndim]
    if name == "resize_nearest" or (name == "resize_bilinear" and not narrow):
        assert ours.tobytes() == theirs.tobytes()
    else:
        # Each output is a sum of at most 16 float32 products whose weights' magnitudes sum to at most 1.25^2; two
        # builds rounding (or fusing) them differently differ by at most a rounding per term, of at most max|x| each.
        assert np.abs(ours - theirs).max() <= 16 * EPS32 * 1.25 ** 2 * np.abs(x).max()


@pytest.mark.parametrize("dims", [1, 2, 3, 4])
def test_flatten_is_numpys_ravel_of_elempack_1(dims):
    x = array(dims)
    flat = graph.flatten(Mat(x))
    assert flat.dims == 1 and flat.elempack == 1
    assert_bits_equal(flat, x.ravel())


def test_a_result_ncnn_would_pack_comes_back_with_elempack_1():
    x = np.random.default_rng(1).standard_normal((8, 4, 4)).astype(np.float32)
    # x86 ncnn packs a flattened 128 elements by its widest vector: 16 with AVX-512, 8 with AVX, 4 with SSE
    assert pyncnn().flatten(pyncnn().Mat(x)).elempack in (4, 8, 16)
    flat = graph.flatten(Mat(x))
    assert flat.elempack == 1 and flat.elemsize == 4
    assert_bits_equal(flat, x.ravel())


def test_a_view_whose_planes_lie_w_times_h_apart_is_read_where_they_lie():
    """A dims 4 Mat's channel, or a depth_range, is a dims 3 view whose planes are w*h apart (35 floats here), where
    ncnn's Crop would read them at its aligned cstep (36)."""
    x = np.arange(2 * 3 * 5 * 7, dtype=np.float32).reshape(2, 3, 5, 7)
    for view, inside in ((Mat(x).channel(1), x[1]), (Mat(x).channel(0).depth_range(1, 2), x[0, 1:3])):
        assert view.dims == 3 and view.cstep == 35
        assert_bits_equal(graph.copy_cut_border(view, 1, 2, 3, 1), inside[:, 1:-2, 3:-1])
        assert_bits_equal(graph.copy_cut_border_3d(view, 1, 2, 3, 1, 0, 0), inside[:, 1:-2, 3:-1])
        for name, call in CALLS.items():
            assert_bits_equal(call(getattr(graph, name), view), call(getattr(graph, name), Mat(inside))), name
        assert_bits_equal(view, inside)  # src is left as it was


CALLS = {
    "copy_make_border": lambda f, src, *dst: f(src, *dst, 1, 1, 2, 2, graph.BorderType.BORDER_REPLICATE, 0.0),
    "copy_make_border_3d": lambda f, src, *dst: f(src, *dst, 1, 1, 2, 2, 1, 0, 0, 7.0),
    "copy_cut_border": lambda f, src, *dst: f(src, *dst, 1, 1, 2, 2),
    "copy_cut_border_3d": lambda f, src, *dst: f(src, *dst, 1, 1, 2, 2, 0, 0),
    "resize_nearest": lambda f, src, *dst: f(src, *dst, 13, 3),
    "resize_bilinear": lambda f, src, *dst: f(src, *dst, 13, 3),
    "resize_bicubic": lambda f, src, *dst: f(src, *dst, 13, 3),
    "flatten": lambda f, src, *dst: f(src, *dst),
}


@pytest.mark.parametrize("name", CALLS)
def test_the_dst_form_writes_the_result_into_dst_even_when_dst_is_src(name):
    call, f, x = CALLS[name], getattr(graph, name), array(3)
    returned = call(f, Mat(x))
    dst = Mat()
    assert call(f, Mat(x), dst) is None
    assert_bits_equal(dst, returned)
    m = Mat(x)
    view = m.numpy()  # made before: keeps the memory it was made on
    call(f, m, m)
    assert_bits_equal(m, returned)
    assert (view == x).all()


def test_a_result_that_needs_no_change_is_src_itself_as_in_ncnn():
    m = Mat(array(3))
    for same in (graph.copy_make_border(m, 0, 0, 0, 0), graph.resize_bilinear(m, 7, 5)):
        same.numpy()[0, 0, 0] = 99.0
        assert m.numpy()[0, 0, 0] == 99.0


@pytest.mark.parametrize("name", CALLS)
def test_a_float16_vulkan_nets_options_give_the_float32_host_result(name):
    opt = graph.configure(graph.Net(), vulkan=True, fp16=True).opt  # pyncnn's model zoo passes net.opt
    opt.use_fp16_arithmetic = opt.use_bf16_storage = opt.use_bf16_packed = True
    opt.num_threads = 2
    call, f, x = CALLS[name], getattr(graph, name), array(3)
    ours = call(lambda *a: f(*a, opt), Mat(x))
    assert ours.elemsize == 4 and ours.elempack == 1
    assert_bits_equal(ours, call(f, Mat(x)))


def test_threads_outside_1_to_1024_are_refused():
    x = array(3)
    opt = graph.Option()
    for threads in (0, -1, 1025):
        opt.num_threads = threads
        with pytest.raises(ValueError, match=rf"resize_bilinear: opt.num_threads must be 1..1024, got {threads}"):
            graph.resize_bilinear(Mat(x), 20, 20, opt)


REFUSED = [
    (lambda: graph.copy_make_border(Mat(array(2)), -1, 0, 0, 0), r"border widths must be >= 0, got top=-1"),
    (lambda: graph.copy_make_border(Mat(array(2)), 0, 0, 1, 0, 3), r"type must be BorderType.BORDER_CONSTANT \(0\)"),
    (lambda: graph.copy_make_border(Mat(array(2)), 0, 0, 0, 0, -233), r"got -233"),
    (lambda: graph.copy_make_border(Mat(array(2)), 0, 0, 7, 0, 2), r"BORDER_REFLECT needs each border narrower than "
                                                                     r"the Mat \(w=7, h=5\) along it, got .*left=7"),
    (lambda: graph.copy_make_border(Mat(array(2)), 5, 0, 0, 0, 2), r"narrower .* top=5"),
    (lambda: graph.copy_make_border_3d(Mat(array(3)), 0, 0, 0, 0, 3, 0, 2), r"narrower .* front=3"),
    (lambda: graph.copy_make_border(Mat(array(1)), 1, 0, 0, 0), r"a Mat of dims 1 has no rows: top and bottom must "
                                                                  r"be 0, got top=1 bottom=0"),
    (lambda: graph.copy_make_border_3d(Mat(array(2)), 0, 0, 0, 0, 1, 0), r"front and behind apply to a Mat of dims 3 "
                                                                           r"or 4, not dims 2"),
    (lambda: graph.copy_make_border(Mat(np.ones(4, np.float32)), 0, 0, 2**31 - 3, 0),
     r"2147483649 x 1 x 1 x 1 elements, more than ncnn's int element counts reach"),
    (lambda: graph.copy_make_border(Mat(np.ones((3, 70000), np.float32)), 0, 40000, 0, 0), r"70000 x 40003 x 1 x 1"),
    (lambda: graph.copy_make_border_3d(Mat(np.ones((1, 1, 1, 1), np.float32)), 2**29 - 2**15, 0, 2**29 + 2**15, 0,
                                       15, 0), r"536903681 x 536838145 x 16 x 1 elements"),  # w*h*d*4 is 2^64 + 64
    (lambda: graph.copy_make_border(Mat(np.ones((1, 1), np.float32)), 2**31 - 2, 0, 2**31 - 2, 0),
     r"2147483647 x 2147483647 x 1 x 1 elements"),
    (lambda: graph.resize_nearest(Mat(array(3)), 2**31 - 1, 2**31 - 1), r"2147483647 x 2147483647 x 1 x 3"),
    (lambda: graph.resize_bicubic(Mat(np.ones((1, 4), np.float32)), 900_000_000, 1),
     r"resize_bicubic: w \+ h must be at most 429496729 \(ncnn counts its coefficient tables in int\), got w=900000000"),
    (lambda: graph.resize_bilinear(Mat(np.ones((1, 4), np.float32)), 1_500_000_000, 1), r"at most 715827882"),
    (lambda: graph.copy_cut_border(Mat(array(2)), 0, 0, 4, 3), r"cutting top=0 bottom=0 left=4 right=3 from a Mat "
                                                                 r"\(w=7, h=5\) leaves nothing"),
    (lambda: graph.copy_cut_border(Mat(array(3)), 3, 2, 0, 0), r"leaves nothing"),
    (lambda: graph.copy_cut_border(Mat(array(2)), 0, 0, -1, 0), r"borders must be >= 0"),
    (lambda: graph.copy_cut_border(Mat(array(1)), 1, 0, 0, 0), r"dims 1 has no rows"),
    (lambda: graph.copy_cut_border_3d(Mat(array(3)), 0, 0, 0, 0, 1, 0), r"front and behind apply to a Mat of dims 4, "
                                                                          r"not dims 3"),
    (lambda: graph.copy_cut_border_3d(Mat(array(4)), 0, 0, 0, 0, 2, 1), r"leaves nothing"),
    (lambda: graph.resize_bilinear(Mat(array(3)), 0, 0), r"w and h must be >= 1, got w=0 h=0"),
    (lambda: graph.resize_nearest(Mat(array(3)), 5, -2), r"resize_nearest: w and h must be >= 1"),
    (lambda: graph.resize_bicubic(Mat(array(4)), 5, 5), r"a Mat of dims 4 \(w=7, h=5, d=3, c=2\) is not resized"),
    (lambda: graph.resize_bilinear(Mat(array(3)), 2**16, 2**16), r"65536 x 65536 x 1 x 3 elements"),
    (lambda: graph.flatten(Mat()), r"flatten: src is an empty Mat"),
    (lambda: graph.copy_cut_border(Mat(), 0, 0, 0, 0), r"copy_cut_border: src is an empty Mat"),
]


@pytest.mark.parametrize("call, message", REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_what_would_make_ncnn_read_or_write_past_a_buffer_is_a_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_mat_of_another_library_is_a_type_error_naming_both_forms():
    with pytest.raises(TypeError, match=r"flatten\(src: vknorm._graph.Mat, opt"):
        graph.flatten(pyncnn().Mat(array(1)))


MODEL = os.path.join(os.path.dirname(__file__), "data", "transformer_block.ncnn")


def test_data_reader_from_empty_loads_the_weights_a_bin_of_zeros_would():
    x = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32)  # its input (models.json)
    bin_size = os.path.getsize(MODEL + ".bin")
    outputs = []
    for load in (lambda n: n.load_model(graph.DataReaderFromEmpty()), lambda n: n.load_model_mem(bytes(bin_size))):
        net = graph.configure(graph.Net(), vulkan=True)
        assert net.load_param(MODEL + ".param") == 0
        assert load(net) == 0
        assert net.model_bytes_read == bin_size  # the layers read as much as from the model's own .bin
        with net.create_extractor() as ex:
            assert ex.input("in0", Mat(x)) == 0
            ret, out = ex.extract("out0")
        assert ret == 0
        outputs.append(np.array(out))
    assert_bits_equal(outputs[0], outputs[1])
    ncnn = pyncnn()
    theirs = ncnn.Net()
    theirs.opt.use_vulkan_compute = False
    theirs.load_param(MODEL + ".param")
    assert theirs.load_model(ncnn.DataReaderFromEmpty()) == 0
    ex = theirs.create_extractor()
    ex.input("in0", ncnn.Mat(x))
    assert_bits_equal(outputs[0], ex.extract("out0")[1])  # zero weights: every output 0 in both


def test_data_reader_from_empty_before_load_param_is_refused_as_other_loads():
    assert graph.Net().load_model(graph.DataReaderFromEmpty()) == -1

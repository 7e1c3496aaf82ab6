"""Tensors: vknorm.Mat has ncnn's layout and converts to/from numpy as pyncnn's Mat does.

ncnn's rule is taken from the pinned ncnn itself (pip ncnn 1.0.20261020): a Mat created with
``Mat.create(shape, elemsize, elempack)`` has ``cstep = alignSize(w*h*d*elemsize, 16) / elemsize``
for every dims (1-4), elemsize counting the packed lanes. numpy shapes are (w), (h, w), (c, h, w),
(c, d, h, w).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ncnn
import vknorm

SHAPES = [
    (1,), (7,), (8,), (13,),
    (1, 1), (3, 5), (4, 4), (5, 3),
    (1, 1, 1), (3, 5, 7), (8, 3, 3), (2, 4, 6), (5, 1, 3),
    (1, 1, 1, 1), (2, 3, 5, 7), (8, 2, 3, 5), (3, 1, 1, 3),
]


def ncnn_created(shape_ncnn_order, elemsize: int, elempack: int):
    m = ncnn.Mat()
    m.create(tuple(shape_ncnn_order), elemsize=elemsize, elempack=elempack)
    return m


def align_rule(plane: int, elemsize: int) -> int:
    return (plane * elemsize + 15) // 16 * 16 // elemsize


def plane_of(shape) -> int:
    """w*h*d: elements of one channel (the whole blob for dims 1 and 2)."""
    if len(shape) <= 2:
        return int(np.prod(shape))
    return int(np.prod(shape[1:]))


def channels_of(shape) -> int:
    return shape[0] if len(shape) >= 3 else 1


def unpack_raw(mat, dtype) -> np.ndarray:
    """The raw bytes as (channels, cstep) scalars for elempack 1."""
    buf = np.frombuffer(mat.raw(), dtype=dtype)
    ch = mat.c if mat.dims >= 3 else 1
    return buf.reshape(ch, -1)


def sample(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------------------ numpy -> Mat

@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_mat_from_numpy_has_ncnn_fields(shape, dtype):
    x = sample(shape, dtype)
    m = vknorm.Mat.from_numpy(x)
    es = np.dtype(dtype).itemsize
    dims = len(shape)
    w = shape[-1]
    h = shape[-2] if dims >= 2 else 1
    d = shape[-3] if dims == 4 else 1
    c = shape[0] if dims >= 3 else 1
    assert (m.dims, m.w, m.h, m.d, m.c) == (dims, w, h, d, c)
    assert (m.elemsize, m.elempack) == (es, 1)
    assert m.cstep >= plane_of(shape)
    assert len(m.raw()) == m.cstep * channels_of(shape) * es
    if dims >= 3:  # dims 1/2: see test_cstep_of_dims1_and_dims2_is_rounded_like_ncnn
        assert m.cstep == align_rule(plane_of(shape), es) == ncnn_created(tuple(reversed(shape)), es, 1).cstep


CSTEP_12_CASES = [((7,), 4, 1), ((13,), 2, 1), ((3, 5), 4, 1), ((5, 3), 2, 1), ((4, 5), 4, 4), ((4, 5), 2, 4),
                  ((8, 3), 2, 4), ((8,), 4, 1), ((4, 4), 4, 1)]


@pytest.mark.parametrize("shape,scalar,pack", CSTEP_12_CASES,
                         ids=[f"{'x'.join(map(str, s))}-{'fp32' if b == 4 else 'fp16'}-pack{p}" for s, b, p in CSTEP_12_CASES])
def test_cstep_of_dims1_and_dims2_is_rounded_like_ncnn(shape, scalar, pack):
    """The pinned ncnn rounds cstep to 16 bytes for every dims: Mat(7) has cstep 8, Mat(5, 3) has 16."""
    x = sample(shape, np.float32 if scalar == 4 else np.float16, seed=7)
    m = vknorm.Mat.from_numpy(x)
    if pack == 4:
        m = m.convert_packing(4)
    ncnn_shape = (m.w,) if m.dims == 1 else (m.w, m.h)
    ref = ncnn_created(ncnn_shape, m.elemsize, pack)
    assert ref.cstep == align_rule(m.w * m.h, m.elemsize)
    assert m.cstep == ref.cstep, (
        f"dims {m.dims} w={m.w} h={m.h} elemsize={m.elemsize} elempack={pack}: cstep {m.cstep}, "
        f"ncnn's Mat::create gives {ref.cstep}")
    assert len(m.raw()) == ref.cstep * m.elemsize


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", [s for s in SHAPES if len(s) >= 3], ids=lambda s: "x".join(map(str, s)))
def test_mat_channels_start_cstep_apart_on_16_byte_boundaries(shape, dtype):
    x = sample(shape, dtype, seed=1)
    m = vknorm.Mat.from_numpy(x)
    es = np.dtype(dtype).itemsize
    assert (m.cstep * es) % 16 == 0
    assert m.cstep >= plane_of(shape)
    rows = unpack_raw(m, dtype)
    np.testing.assert_array_equal(rows[:, : plane_of(shape)], x.reshape(shape[0], -1))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_numpy_mat_numpy_round_trip_is_exact(shape, dtype):
    x = sample(shape, dtype, seed=2)
    x.reshape(-1)[0] = np.nan
    if x.size > 1:
        x.reshape(-1)[-1] = -np.inf
    y = vknorm.Mat.from_numpy(x).numpy()
    assert y.dtype == dtype and y.shape == x.shape
    assert np.array_equal(x.view(np.uint32 if dtype == np.float32 else np.uint16),
                          y.view(np.uint32 if dtype == np.float32 else np.uint16))


def test_numpy_without_copy_views_an_unpadded_unpacked_mat_and_keeps_it_alive():
    x = sample((4, 6, 8), np.float32, seed=3)  # planes of 48 floats: no cstep padding
    m = vknorm.Mat.from_numpy(x)
    view, copy = m.numpy(copy=False), m.numpy()
    view[...] = 1.0
    np.testing.assert_array_equal(m.numpy(), np.ones_like(x))  # the view is the Mat's memory
    np.testing.assert_array_equal(copy, x)  # a copy is its own
    del m
    np.testing.assert_array_equal(view + 0, np.ones_like(x))  # still alive through the view
    # padded planes (5x7 floats, cstep 36) or pack4: a dense copy, whatever copy says
    p = vknorm.Mat.from_numpy(sample((3, 5, 7), np.float32, seed=4))
    for a in (p.numpy(copy=False), vknorm.Mat.from_numpy(x).convert_packing(4).numpy(copy=False)):
        assert a.flags["C_CONTIGUOUS"] and a.flags["OWNDATA"] is False
    np.testing.assert_array_equal(vknorm.Mat.from_numpy(x).convert_packing(4).numpy(copy=False), x)


def test_numpy_converts_a_mat_as_its_numpy_method_does():
    """np.array / np.asarray take a vknorm.Mat through numpy's protocol (it was a 0-d object array): the data,
    unpacked; copy=False views an unpadded unpacked Mat and is numpy's ValueError where only a copy can do; repr
    names the shape numpy sees."""
    x = sample((4, 6, 8), np.float32, seed=5)
    m = vknorm.Mat.from_numpy(x)
    np.testing.assert_array_equal(np.array(m), x)
    assert np.asarray(m, dtype=np.float64).dtype == np.float64
    view = np.asarray(m, copy=False)
    view[0, 0, 0] = 7.0
    assert m.numpy()[0, 0, 0] == 7.0  # the Mat's own memory
    assert np.array(m) is not view and np.array(m)[0, 0, 0] == 7.0
    packed = vknorm.Mat.from_numpy(x).convert_packing(4)
    np.testing.assert_array_equal(np.asarray(packed), x)
    with pytest.raises(ValueError, match="needs a copy"):
        np.asarray(packed, copy=False)
    with pytest.raises(ValueError, match="copy=False: this Mat holds float32; numpy needs a copy of it for another"):
        np.asarray(m, dtype=np.float64, copy=False)  # as numpy's own arrays: another dtype is a copy
    assert np.shares_memory(np.asarray(m, dtype=np.float32, copy=False), view)
    assert repr(packed) == "Mat(shape=(4, 6, 8), dtype=float32, elempack=4)"
    assert repr(vknorm.Mat.from_numpy(np.ones(5, np.float16))) == "Mat(shape=(5,), dtype=float16, elempack=1)"


@pytest.mark.parametrize("shape", [(7,), (3, 5), (3, 5, 7), (2, 3, 5, 7)], ids=lambda s: "x".join(map(str, s)))
def test_mat_fields_match_pyncnn_mat_from_the_same_numpy(shape):
    """pyncnn's Mat(numpy) (cloned into its own storage) has the same dims/w/h/d/c/elemsize/cstep."""
    x = sample(shape, np.float32, seed=3)
    ours = vknorm.Mat.from_numpy(x)
    theirs = ncnn.Mat(x).clone()
    assert (ours.dims, ours.w, ours.h, ours.d, ours.c, ours.elemsize, ours.elempack) == (
        theirs.dims, theirs.w, theirs.h, theirs.d, theirs.c, theirs.elemsize, theirs.elempack)
    if len(shape) >= 3:  # dims 1/2: test_cstep_of_dims1_and_dims2_is_rounded_like_ncnn
        assert ours.cstep == theirs.cstep, f"cstep {ours.cstep} != pyncnn's {theirs.cstep} for {shape}"
    np.testing.assert_array_equal(ours.numpy(), np.array(theirs))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int16, np.uint16, np.float64, np.bool_])
def test_mat_from_numpy_refuses_anything_but_float32_and_float16(dtype):
    """Integer data is never reinterpreted as float bits (uint16 included: it is not float16)."""
    with pytest.raises((TypeError, ValueError)):
        vknorm.Mat.from_numpy(np.arange(1, 7).astype(dtype).reshape(2, 3))


@pytest.mark.parametrize("given, named", [(np.ones(4, ">f4"), "an array of dtype >f4"), ([1.0, 2.0], "list")],
                         ids=["big-endian", "list"])
def test_what_from_numpy_and_upload_cannot_take_is_named_with_the_conversion(given, named):
    """Not nanobind's list of overloads: the call, what it takes, what it got, and the conversion that works."""
    for call, where in ((lambda: vknorm.Mat.from_numpy(given), "Mat.from_numpy"),
                        (lambda: vknorm.VkMat.upload(given, vknorm.Context.default(), vknorm.Option()._native()),
                         "VkMat.upload")):
        with pytest.raises(TypeError, match=rf"^{where}: expected a float32 or float16 numpy array in native byte "
                                            rf"order, got {named} \(np.ascontiguousarray\(a, np.float32\)"):
            call()
    np.testing.assert_array_equal(vknorm.Mat.from_numpy(np.ascontiguousarray(given, np.float32)).numpy(),
                                  np.asarray(given, np.float32))


def test_mat_from_numpy_refuses_more_than_4_dims():
    with pytest.raises((TypeError, ValueError)):
        vknorm.Mat.from_numpy(np.zeros((1, 2, 3, 4, 5), np.float32))


# ------------------------------------------------------------------------------ pack4

PACK_SHAPES = [(4, 5), (8, 3), (12, 1), (4, 3, 5), (8, 2, 3), (8, 1, 1), (4, 2, 3, 5), (8, 2, 1, 3)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", PACK_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_pack4_interleaves_four_channels_or_rows_and_round_trips(shape, dtype):
    x = sample(shape, dtype, seed=4)
    es = np.dtype(dtype).itemsize
    m = vknorm.Mat.from_numpy(x).convert_packing(4)
    dims = len(shape)
    outer = shape[0]
    assert m.elempack == 4 and m.elemsize == 4 * es
    if dims == 2:  # rows are packed: h is the packed count
        assert (m.dims, m.w, m.h, m.c) == (2, shape[1], outer // 4, 1)
        plane = shape[1]
    else:
        assert m.c == outer // 4 and m.w == shape[-1] and m.h == shape[-2]
        plane = plane_of(shape)
    if dims >= 3:  # dims 2: test_cstep_of_dims1_and_dims2_is_rounded_like_ncnn
        ref = ncnn_created(tuple(reversed((outer // 4,) + tuple(shape[1:]))), 4 * es, 4)
        assert m.cstep == ref.cstep == align_rule(plane, 4 * es), f"pack4 cstep {m.cstep}, ncnn {ref.cstep}"
    assert len(m.raw()) == m.cstep * (m.c if dims >= 3 else 1) * m.elemsize
    # Layout: packed outer q, element i, lane l holds x[4q + l, i].
    raw = np.frombuffer(m.raw(), dtype=dtype)
    if dims == 2:
        packed = raw[: (outer // 4) * plane * 4].reshape(outer // 4, plane, 4)
    else:
        packed = raw.reshape(outer // 4, m.cstep, 4)[:, :plane, :]
    expect = x.reshape(outer // 4, 4, plane).transpose(0, 2, 1)
    np.testing.assert_array_equal(packed, expect)
    back = m.convert_packing(1)
    assert back.elempack == 1 and back.elemsize == es
    np.testing.assert_array_equal(back.numpy(), x)
    np.testing.assert_array_equal(m.numpy(), x)  # numpy() unpacks


def test_pack4_refuses_what_ncnn_cannot_pack():
    with pytest.raises(ValueError):
        vknorm.Mat.from_numpy(sample((6, 5), np.float32)).convert_packing(4)  # 6 rows
    with pytest.raises(ValueError):
        vknorm.Mat.from_numpy(sample((3, 2, 5), np.float32)).convert_packing(4)  # 3 channels
    with pytest.raises(ValueError):
        vknorm.Mat.from_numpy(sample((8,), np.float32)).convert_packing(4)  # dims 1 stays unpacked


# ------------------------------------------------------------------------------ fp16 casts

def special_floats() -> np.ndarray:
    """float32 values that exercise float16 rounding: ties, subnormals, overflow, inf, signed zero."""
    v = [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e5, 6.1035156e-05, 6.0e-05, 5.9604645e-08,
         2.9802322e-08, 2.98023259e-08, 1e-8, 1e-45, 1.0009766, 1.00048828125, 1.00146484375, 2049.0, 2051.0,
         np.inf, -np.inf, 3.14159265, -2.718281828, 1e-3, 0.1, 1 / 3]
    return np.array(v, np.float32)


def test_cast_fp16_rounds_like_numpy_on_special_and_random_values():
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    rand = bits.view(np.float32)
    rand = rand[~np.isnan(rand)]
    x = np.concatenate([special_floats(), rand, rng.standard_normal(10_000).astype(np.float32) * 1e-5])
    m = vknorm.Mat.from_numpy(x).cast_fp16()
    assert m.elemsize == 2 and m.elempack == 1
    got = m.numpy()
    assert got.dtype == np.float16
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    bad = np.flatnonzero(got.view(np.uint16) != want.view(np.uint16))
    assert bad.size == 0, f"{bad.size} mismatches, e.g. {x[bad[:5]]!r} -> {got[bad[:5]]!r}, numpy {want[bad[:5]]!r}"


def test_cast_fp16_one_scalar_at_a_time_rounds_like_numpy():
    """Runs shorter than a vector (and CPUs without F16C) take the scalar conversion: the same results."""
    rng = np.random.default_rng(7)
    rand = rng.integers(0, 2**32, size=3000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([special_floats(), rand[~np.isnan(rand)]])
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    got = np.array([vknorm.Mat.from_numpy(x[i:i + 1]).cast_fp16().numpy()[0] for i in range(x.size)])
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    back = np.array([vknorm.Mat.from_numpy(want[i:i + 1]).cast_fp32().numpy()[0] for i in range(x.size)])
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(back[finite], want[finite].astype(np.float32))


def test_cast_fp16_keeps_nan_and_fp32_widening_is_exact():
    x = np.array([np.nan, -np.nan, 1.0], np.float32)
    got = vknorm.Mat.from_numpy(x).cast_fp16().numpy()
    assert np.isnan(got[:2]).all() and got[2] == 1.0
    every_half = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    widened = vknorm.Mat.from_numpy(every_half).cast_fp32().numpy()
    assert widened.dtype == np.float32
    finite = ~np.isnan(every_half)
    np.testing.assert_array_equal(widened[finite], every_half[finite].astype(np.float32))
    assert np.isnan(widened[~finite]).all()


CAST_CASES = [((3, 5, 7), 1), ((2, 3, 5, 7), 1), ((4, 5), 1), ((8, 2, 3), 4), ((4, 3, 5, 7), 4), ((4, 5), 4)]


@pytest.mark.parametrize("shape,pack", CAST_CASES, ids=[f"{'x'.join(map(str, s))}-pack{p}" for s, p in CAST_CASES])
def test_fp16_cast_round_trip_keeps_layout_and_recomputes_cstep(shape, pack):
    x = sample(shape, np.float32, seed=6)
    m32 = vknorm.Mat.from_numpy(x).convert_packing(pack)
    m16 = m32.cast_fp16()
    assert (m16.dims, m16.w, m16.h, m16.d, m16.c, m16.elempack) == (m32.dims, m32.w, m32.h, m32.d, m32.c, pack)
    assert m16.elemsize == 2 * pack
    if len(shape) >= 3:  # dims 2: test_cstep_of_dims1_and_dims2_is_rounded_like_ncnn
        ref = ncnn_created(tuple(reversed((m16.c,) + tuple(shape[1:]))), m16.elemsize, pack)
        assert m16.cstep == ref.cstep
    np.testing.assert_array_equal(m16.numpy(), x.astype(np.float16))
    back = m16.cast_fp32()
    assert back.elemsize == 4 * pack and back.elempack == pack
    np.testing.assert_array_equal(back.numpy(), x.astype(np.float16).astype(np.float32))


# ------------------------------------------------------------------------------ property test

@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    dims=st.integers(1, 4),
    ext=st.lists(st.integers(1, 9), min_size=4, max_size=4),
    fp16=st.booleans(),
    pack=st.booleans(),
)
def test_any_shape_round_trips_through_packing_and_casts(dims, ext, fp16, pack):
    shape = tuple(ext[:dims])
    if pack and dims >= 2:
        shape = (shape[0] * 4,) + shape[1:]
    dtype = np.float16 if fp16 else np.float32
    x = sample(shape, dtype, seed=sum(ext))
    m = vknorm.Mat.from_numpy(x)
    if pack and dims >= 2:
        m = m.convert_packing(4)
    es = np.dtype(dtype).itemsize * m.elempack
    outer_packed = m.c if dims >= 3 else 1
    if dims >= 3:  # dims 1/2: test_cstep_of_dims1_and_dims2_is_rounded_like_ncnn
        assert m.cstep == align_rule(plane_of(shape), es)
    assert len(m.raw()) == m.cstep * outer_packed * es
    np.testing.assert_array_equal(m.numpy(), x)
    other = m.cast_fp32() if fp16 else m.cast_fp16()
    np.testing.assert_array_equal(other.numpy(), x.astype(np.float32) if fp16 else x.astype(np.float16))


@pytest.mark.parametrize("shape", [(1 << 21,), (1, 1500, 1100), (4, 1024, 1100)], ids=str)
def test_large_conversions_of_few_planes_split_within_planes_give_numpys_values(shape):
    """A large tensor of fewer planes than threads (a dims-1 blob, one channel, four channels packed into one
    plane) is split within its planes too: every part still lands where it belongs."""
    x = sample(shape, np.float32, seed=6)
    m = vknorm.Mat.from_numpy(x)
    half = m.cast_fp16()
    np.testing.assert_array_equal(half.numpy(), x.astype(np.float16))
    np.testing.assert_array_equal(half.cast_fp32().numpy(), x.astype(np.float16).astype(np.float32))
    if shape[0] % 4 == 0 and len(shape) >= 2:
        packed = m.convert_packing(4)
        assert packed.elempack == 4 and packed.c == 1
        np.testing.assert_array_equal(packed.convert_packing(1).numpy(), x)
        np.testing.assert_array_equal(packed.cast_fp16().convert_packing(1).numpy(), x.astype(np.float16))


@pytest.mark.parametrize("shape", [(52, 150, 151), (1024, 1536), (20, 4, 100, 150)], ids=str)
def test_large_conversions_split_among_threads_give_numpys_values(shape):
    """Conversions of 4 MiB and more run on several threads, each a run of planes (52 channels do not divide
    evenly among them): every packing and storage change still gives numpy's values, padding zeroed."""
    x = sample(shape, np.float32, seed=5)
    m = vknorm.Mat.from_numpy(x)
    packed = m.convert_packing(4)
    half = packed.cast_fp16()
    np.testing.assert_array_equal(packed.convert_packing(1).numpy(), x)
    np.testing.assert_array_equal(half.numpy(), x.astype(np.float16))
    np.testing.assert_array_equal(half.cast_fp32().convert_packing(1).numpy(), x.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(m.cast_fp16().convert_packing(4).numpy(), x.astype(np.float16))
    if len(shape) >= 3:  # float16 planes of 22650 values: padded to 22656
        narrow = half.convert_packing(1)
        plane = int(np.prod(shape[1:]))
        raw = np.frombuffer(narrow.raw(), np.float16).reshape(narrow.c, narrow.cstep)
        assert not raw[:, plane:].any()


@pytest.mark.parametrize("convert", ["cast_fp16", "cast_fp32", "convert_packing(1)"])
def test_cstep_padding_is_zeroed_in_recycled_host_memory(convert):
    """A conversion writes into host memory that may come back from an earlier Mat (the pool hands out the newest
    block of the same size, as it was left): every channel's cstep padding, the last one's included, is zeroed,
    never the bytes some earlier Mat held there."""
    x = sample((8, 5, 5), np.float32, seed=7)  # planes of 25: float32 cstep 28, float16 cstep 32
    src = {"cast_fp16": lambda: vknorm.Mat.from_numpy(x),
           "cast_fp32": lambda: vknorm.Mat.from_numpy(x).cast_fp16(),
           "convert_packing(1)": lambda: vknorm.Mat.from_numpy(x).convert_packing(4)}[convert]()
    run = {"cast_fp16": lambda m: m.cast_fp16(), "cast_fp32": lambda m: m.cast_fp32(),
           "convert_packing(1)": lambda m: m.convert_packing(1)}[convert]
    out = run(src)
    nbytes, plane, itemsize = len(out.raw()), 25, 2 if out.elemsize == 2 else 4
    del out
    for _ in range(2):
        dirty = vknorm.Mat.from_numpy(np.full(nbytes // 2, 7.0, np.float16))  # the same size, every byte nonzero
        assert len(dirty.raw()) == nbytes
        del dirty
        out = run(src)
        raw = np.frombuffer(out.raw(), np.float16 if itemsize == 2 else np.float32).reshape(out.c, out.cstep)
        assert out.cstep > plane and not raw[:, plane:].any(), raw[:, plane:]
        np.testing.assert_array_equal(out.numpy(), src.numpy().astype(out.numpy().dtype))



@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_arrays_at_misaligned_addresses_are_copied_by_the_layers_and_refused_by_the_core(dtype):
    """np.frombuffer(buf, offset=1) makes an array whose scalars straddle their natural alignment. The layers take
    an aligned copy; the low-level Mat.from_numpy / to-Mat conversions refuse it by name rather than read it
    through misaligned pointers."""
    n = 4 * 64
    size = np.dtype(dtype).itemsize
    values = sample((4, 64), dtype, seed=9)
    buf = bytearray(n * size + 1)
    odd = np.frombuffer(buf, dtype=dtype, count=n, offset=1).reshape(4, 64)
    odd[...] = values
    assert not odd.flags.aligned
    with pytest.raises(ValueError, match=f"not aligned to its {size}-byte scalars"):
        vknorm.Mat.from_numpy(odd)
    layer = vknorm.LayerNorm(affine_size=64, eps=1e-5, affine=False)
    np.testing.assert_array_equal(layer(odd), layer(values))
    np.testing.assert_array_equal(layer(odd, device="cpu"), layer(values, device="cpu"))


_CONVERSIONS = """
import numpy as np, vknorm
rng = np.random.default_rng(8)
for shape in [(1 << 21,), (4, 300, 1100), (3, 7)]:
    x = rng.standard_normal(shape).astype(np.float32)
    m = vknorm.Mat.from_numpy(x)
    assert np.array_equal(m.cast_fp16().numpy(), x.astype(np.float16)), shape
    if len(shape) == 3:
        assert np.array_equal(m.convert_packing(4).cast_fp16().convert_packing(1).numpy(), x.astype(np.float16))
print("converted")
"""


@pytest.mark.parametrize("knob, value, refused", [
    ("VKNORM_TUNE_CONVERSION_THREADS", "0", False),  # 0 and 1: one thread
    ("VKNORM_TUNE_CONVERSION_THREADS", "1", False),
    ("VKNORM_TUNE_CONVERSION_THREADS", str(2 ** 64 - 1), False),  # capped by the CPUs there are
    ("VKNORM_TUNE_CONVERSION_THREADS", "eight", True),
    ("VKNORM_TUNE_CONVERSION_THREADS", "-1", True),
    ("VKNORM_TUNE_CONVERSION_BYTES_PER_THREAD", "1", False),  # every conversion split, however small
    ("VKNORM_TUNE_CONVERSION_BYTES_PER_THREAD", str(2 ** 64 - 1), False),  # none split
    ("VKNORM_TUNE_CONVERSION_BYTES_PER_THREAD", "0", True),
    ("VKNORM_TUNE_CONVERSION_BYTES_PER_THREAD", "2MiB", True),
    ("VKNORM_TUNE_CONVERSION_BYTES_PER_THREAD", "-1", True),
    ("VKNORM_TUNE_CONVERSION_BYTES_PER_THREAD", "1" + "0" * 20, True),  # past 64 bits
], ids=lambda v: v.split("_")[-1] if str(v).startswith("VKNORM") else str(v)[:8])
def test_conversion_tuning_knobs_give_numpys_values_or_are_refused_by_name(knob, value, refused):
    """The host conversion knobs (read once per process) take whole numbers: any such value converts exactly as
    numpy does (dims 1, pack4 <-> pack1 with a float16 cast, a tensor too small to split); anything else (words,
    signs, units, 0 bytes per thread, past 64 bits) is refused with a ValueError naming the knob, never a crash
    of the process (0 bytes per thread was a division by zero: SIGFPE)."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, **{knob: value})
    code = _CONVERSIONS if not refused else (
        "import numpy as np, vknorm, pytest\n"
        f"with pytest.raises(ValueError, match='{knob}={value}'):\n"
        "    vknorm.Mat.from_numpy(np.ones((1 << 21,), np.float32)).cast_fp16()\n"
        "print('converted')\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "converted" in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-2000:])

"""vknorm.graph.Mat's pixel helpers, as pyncnn's: an 8-bit image (numpy uint8) into a float32 Mat by ncnn's own
conversions (from_pixels, from_pixels_resize, from_pixels_roi, from_pixels_roi_resize, each with or without a row
stride), then substract_mean_normalize, so that an image model's pyncnn code moves over by changing its import.

They are ncnn's functions (the ncnn compiled into vknorm is the version pyncnn ships): the conversions equal pyncnn's
bit for bit, the channel reorders numpy's. What pyncnn leaves to chance is refused instead: a buffer shorter than the
image (pyncnn reads past it), a non-uint8 array (pyncnn reads its bytes as pixels), a type ncnn does not convert, an
roi outside the image, images and targets past ncnn's int arithmetic (2^31 bytes: it writes past its buffers), means
or norms of the wrong length (pyncnn reads past the list)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from availability import import_graph, import_or_missing

graph = import_graph()
Mat = graph.Mat
T = Mat.PixelType

CHANNELS = {"RGB": 3, "BGR": 3, "GRAY": 1, "RGBA": 4, "BGRA": 4}
TYPES = [name for name in T.__members__ if name.startswith("PIXEL_") and "MASK" not in name and "SHIFT" not in name]


def source_channels(name: str) -> int:
    return CHANNELS[name[len("PIXEL_"):].split("2")[0]]


def image(h: int, w: int, channels: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, channels), dtype=np.uint8)


def pyncnn_type(name: str):
    ncnn = import_or_missing("ncnn")
    return getattr(ncnn.Mat.PixelType, name)


def test_every_pixel_type_of_pyncnn_is_there_with_its_value():
    ncnn = import_or_missing("ncnn")
    theirs = {n: int(v) for n, v in ncnn.Mat.PixelType.__members__.items()}
    assert {n: int(v) for n, v in T.__members__.items()} == theirs
    assert len(TYPES) == 25


@pytest.mark.parametrize("name", TYPES)
def test_from_pixels_equals_pyncnn_for_every_conversion(name):
    ncnn = import_or_missing("ncnn")
    h, w = 13, 29  # a row of 29 pixels is no multiple of 4 or 16 bytes
    img = image(h, w, source_channels(name), seed=len(name))
    mine = Mat.from_pixels(img, getattr(T, name), w, h)
    theirs = ncnn.Mat.from_pixels(img, pyncnn_type(name), w, h)
    assert (mine.w, mine.h, mine.c) == (theirs.w, theirs.h, theirs.c)
    np.testing.assert_array_equal(np.array(mine), np.array(theirs))


@pytest.mark.parametrize("name, order", [("PIXEL_RGB", [0, 1, 2]), ("PIXEL_BGR2RGB", [2, 1, 0]),
                                         ("PIXEL_RGBA2RGB", [0, 1, 2]), ("PIXEL_BGRA2RGBA", [2, 1, 0, 3]),
                                         ("PIXEL_GRAY2RGB", [0, 0, 0]), ("PIXEL_GRAY", [0])])
def test_channel_reorders_equal_numpy(name, order):
    img = image(7, 11, source_channels(name), seed=3)
    got = np.array(Mat.from_pixels(img, getattr(T, name), 11, 7))
    np.testing.assert_array_equal(got, img[:, :, order].transpose(2, 0, 1).astype(np.float32))


def test_a_row_stride_skips_the_padding_at_the_end_of_each_row():
    img = image(9, 10, 3, seed=4)
    padded = np.zeros((9, 37), np.uint8)  # 30 bytes of pixels, then 7 of padding per row
    padded[:, :30] = img.reshape(9, 30)
    padded[:, 30:] = 255
    want = np.array(Mat.from_pixels(img, T.PIXEL_BGR2RGB, 10, 9))
    np.testing.assert_array_equal(np.array(Mat.from_pixels(padded, T.PIXEL_BGR2RGB, 10, 9, 37)), want)
    resized = Mat.from_pixels_resize(img, T.PIXEL_BGR2RGB, 10, 9, 6, 5)
    np.testing.assert_array_equal(np.array(Mat.from_pixels_resize(padded, T.PIXEL_BGR2RGB, 10, 9, 37, 6, 5)),
                                  np.array(resized))


@pytest.mark.parametrize("name", ["PIXEL_BGR2RGB", "PIXEL_GRAY", "PIXEL_RGBA2BGR", "PIXEL_RGB2GRAY"])
@pytest.mark.parametrize("target", [(20, 30), (111, 7), (53, 37)], ids=["down", "mixed", "same"])
def test_resize_roi_and_both_equal_pyncnn(name, target):
    ncnn = import_or_missing("ncnn")
    h, w, ch = 37, 53, source_channels(name)
    img = image(h, w, ch, seed=7)
    tw, th = target
    pairs = [
        (Mat.from_pixels_resize(img, getattr(T, name), w, h, tw, th),
         ncnn.Mat.from_pixels_resize(img, pyncnn_type(name), w, h, tw, th)),
        (Mat.from_pixels_roi(img, getattr(T, name), w, h, 5, 3, 31, 22),
         ncnn.Mat.from_pixels_roi(img, pyncnn_type(name), w, h, 5, 3, 31, 22)),
        (Mat.from_pixels_roi_resize(img, getattr(T, name), w, h, 5, 3, 31, 22, tw, th),
         ncnn.Mat.from_pixels_roi_resize(img, pyncnn_type(name), w, h, 5, 3, 31, 22, tw, th)),
        (Mat.from_pixels_roi_resize(img, getattr(T, name), w, h, w * ch, 5, 3, 31, 22, tw, th),
         ncnn.Mat.from_pixels_roi_resize(img, pyncnn_type(name), w, h, w * ch, 5, 3, 31, 22, tw, th)),
    ]
    for i, (mine, theirs) in enumerate(pairs):
        assert (mine.w, mine.h, mine.c) == (theirs.w, theirs.h, theirs.c), i
        np.testing.assert_array_equal(np.array(mine), np.array(theirs), err_msg=str(i))


def test_the_stride_overloads_of_roi_and_roi_resize_read_padded_rows_as_pyncnn():
    ncnn = import_or_missing("ncnn")
    img = image(21, 30, 3, seed=13)
    padded = np.full((21, 97), 255, np.uint8)  # 90 bytes of pixels, 7 of padding per row
    padded[:, :90] = img.reshape(21, 90)
    t, pt = T.PIXEL_BGR2RGB, pyncnn_type("PIXEL_BGR2RGB")
    mine = Mat.from_pixels_roi(padded, t, 30, 21, 97, 3, 2, 19, 15)
    np.testing.assert_array_equal(np.array(mine), np.array(Mat.from_pixels_roi(img, t, 30, 21, 3, 2, 19, 15)))
    np.testing.assert_array_equal(np.array(mine), np.array(ncnn.Mat.from_pixels_roi(padded, pt, 30, 21, 97, 3, 2, 19, 15)))
    mine = Mat.from_pixels_roi_resize(padded, t, 30, 21, 97, 3, 2, 19, 15, 8, 11)
    np.testing.assert_array_equal(np.array(mine), np.array(Mat.from_pixels_roi_resize(img, t, 30, 21, 3, 2, 19, 15, 8, 11)))
    np.testing.assert_array_equal(
        np.array(mine), np.array(ncnn.Mat.from_pixels_roi_resize(padded, pt, 30, 21, 97, 3, 2, 19, 15, 8, 11)))


def test_a_strided_image_needs_its_last_row_only_up_to_its_last_pixel():
    """stride x (h - 1) + w x channels bytes: the last row's padding may be missing, one byte less is refused."""
    img = image(6, 10, 3, seed=14)
    padded = np.zeros((6, 40), np.uint8)
    padded[:, :30] = img.reshape(6, 30)
    flat = padded.reshape(-1)
    need = 40 * 5 + 30
    want = np.array(Mat.from_pixels(img, T.PIXEL_BGR, 10, 6))
    np.testing.assert_array_equal(np.array(Mat.from_pixels(flat[:need], T.PIXEL_BGR, 10, 6, 40)), want)
    with pytest.raises(ValueError, match=f"stride 40 need {need} bytes; the array holds {need - 1}"):
        Mat.from_pixels(flat[:need - 1], T.PIXEL_BGR, 10, 6, 40)
    with pytest.raises(ValueError, match=f"need {need} bytes"):
        Mat.from_pixels_resize(flat[:need - 1], T.PIXEL_BGR, 10, 6, 40, 5, 3)


GUARD_PAGE_SCRIPT = textwrap.dedent("""
    import ctypes, mmap, sys, numpy as np
    from vknorm import graph
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = mmap.PAGESIZE
    m = mmap.mmap(-1, 2 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    assert libc.mprotect(base, page, 0) == 0  # the page before the image: any read of it is a SIGSEGV
    h, ch = 40, 3
    img = np.frombuffer(m, np.uint8, count=h * ch, offset=page)
    img[:] = np.arange(h * ch) % 251
    out = graph.Mat.from_pixels_resize(img, graph.Mat.PixelType.PIXEL_BGR2RGB, 1, h, 5, 17)
    roi = graph.Mat.from_pixels_roi_resize(img, graph.Mat.PixelType.PIXEL_BGR2RGB, 1, h, 0, 3, 1, 30, 4, 9)
    # one source column: every target column is it, resized along h only
    col = np.array(graph.Mat.from_pixels_resize(img, graph.Mat.PixelType.PIXEL_BGR2RGB, 1, h, 1, 17))
    print("ok", bool(np.array_equal(np.array(out), np.repeat(col, 5, axis=2))), out.w, out.h, roi.w, roi.h)
""")


def test_a_source_one_pixel_wide_resizes_without_reading_before_the_image():
    """ncnn's resize reads the byte before each row of a source one pixel wide (with weight 0): an image at the start
    of a page whose previous page is unreadable crashed the process. The image is given zeros before it."""
    proc = subprocess.run([sys.executable, "-c", GUARD_PAGE_SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.stdout.split() == ["ok", "True", "5", "17", "4", "9"], proc.stdout


def test_a_crop_view_given_its_row_stride_converts_as_pyncnns_does():
    """pyncnn's idiom for part of an image: the numpy view with its own row stride (crop.strides[0])."""
    ncnn = import_or_missing("ncnn")
    img = image(60, 80, 3, seed=4)
    crop = img[10:50, 20:70]  # 50x40, rows 240 bytes apart
    want = Mat.from_pixels(np.ascontiguousarray(crop), T.PIXEL_BGR2RGB, 50, 40)
    for ours, theirs in (
            (Mat.from_pixels(crop, T.PIXEL_BGR2RGB, 50, 40, stride=crop.strides[0]),
             ncnn.Mat.from_pixels(crop, pyncnn_type("PIXEL_BGR2RGB"), 50, 40, stride=crop.strides[0])),
            (Mat.from_pixels_resize(crop, T.PIXEL_BGR2RGB, 50, 40, crop.strides[0], 30, 20),
             ncnn.Mat.from_pixels_resize(crop, pyncnn_type("PIXEL_BGR2RGB"), 50, 40, crop.strides[0], 30, 20))):
        assert np.array_equal(np.array(ours), np.array(theirs))
    assert np.array_equal(np.array(Mat.from_pixels(crop, T.PIXEL_BGR2RGB, 50, 40, stride=crop.strides[0])),
                          np.array(want))
    flipped, gray = img[::-1], np.ascontiguousarray(img[..., 0])[5:30, 3:40]
    for view, t, w, h in ((flipped, "PIXEL_BGR", 80, 60), (gray, "PIXEL_GRAY", 37, 25)):
        assert np.array_equal(np.array(Mat.from_pixels(view, getattr(T, t), w, h, stride=view.strides[0])),
                              np.array(ncnn.Mat.from_pixels(view, pyncnn_type(t), w, h, stride=view.strides[0])))
    # Read as numpy shows it: rows whose bytes are not next to each other, or narrower than w, are refused (pyncnn
    # reads the bytes around the view in the image it was cut from)
    for view, w in ((crop, 60), (img[10:50, 20:70:2], 25), (img[..., ::-1], 80), (img[..., 0][:, :40], 40)):
        with pytest.raises(ValueError, match=rf"a numpy view given with its own row stride \({view.strides[0]}\) is "
                                             rf"read as numpy shows it: .* \(it has \({view.shape[0]}, "):
            Mat.from_pixels(view, T.PIXEL_GRAY if view.ndim == 2 else T.PIXEL_BGR, w, view.shape[0],
                            stride=view.strides[0])


def test_allocator_none_bytes_and_keywords_as_pyncnn_takes_them():
    img = image(5, 7, 3, seed=15)
    want = np.array(Mat.from_pixels(img, T.PIXEL_BGR2RGB, 7, 5))
    for got in (Mat.from_pixels(img, T.PIXEL_BGR2RGB, 7, 5, None),  # pyncnn's fifth argument: its allocator
                Mat.from_pixels(array=img, type=T.PIXEL_BGR2RGB, w=7, h=5, allocator=None),
                Mat.from_pixels(img.tobytes(), T.PIXEL_BGR2RGB, 7, 5),
                Mat.from_pixels(bytearray(img.tobytes()), T.PIXEL_BGR2RGB, 7, 5)):
        np.testing.assert_array_equal(np.array(got), want)
    resized = np.array(Mat.from_pixels_resize(img, T.PIXEL_BGR2RGB, 7, 5, 3, 2))
    np.testing.assert_array_equal(np.array(Mat.from_pixels_resize(img, T.PIXEL_BGR2RGB, 7, 5, 3, 2, None)), resized)
    np.testing.assert_array_equal(np.array(Mat.from_pixels_resize(img, T.PIXEL_BGR2RGB, 7, 5, 21, 3, 2, None)), resized)
    with pytest.raises(TypeError, match="no allocators"):
        Mat.from_pixels(img, T.PIXEL_BGR2RGB, 7, 5, allocator=object())


def test_an_roi_is_the_image_sliced_first():
    img = image(20, 30, 3, seed=8)
    roi = Mat.from_pixels_roi(img, T.PIXEL_BGR2RGB, 30, 20, 4, 6, 17, 9)
    cut = np.ascontiguousarray(img[6:15, 4:21])
    np.testing.assert_array_equal(np.array(roi), np.array(Mat.from_pixels(cut, T.PIXEL_BGR2RGB, 17, 9)))


@pytest.mark.parametrize("mean, norm", [([127.5, 120.0, 110.25], [1 / 127.5, 1 / 64, 0.017]),
                                        ([127.5, 120.0, 110.25], []), ([], [1 / 255.0] * 3)],
                         ids=["both", "mean", "norm"])
def test_substract_mean_normalize_is_x_minus_mean_times_norm_per_channel(mean, norm):
    """ncnn computes x * norm + (-mean * norm) in float32 (a Scale layer; its x86 kernels may fuse the multiply-add):
    within 2 float32 roundings of the float64 value, and within as much of pyncnn's."""
    ncnn = import_or_missing("ncnn")
    img = image(15, 17, 3, seed=9)
    mine = Mat.from_pixels(img, T.PIXEL_BGR2RGB, 17, 15)
    theirs = ncnn.Mat.from_pixels(img, pyncnn_type("PIXEL_BGR2RGB"), 17, 15)
    x = np.array(mine).astype(np.float64)
    mine.substract_mean_normalize(mean, norm)
    theirs.substract_mean_normalize(mean, norm)
    # the values ncnn is given: float32
    m = np.array(mean or [0.0] * 3, np.float32).astype(np.float64)[:, None, None]
    n = np.array(norm or [1.0] * 3, np.float32).astype(np.float64)[:, None, None]
    want = (x - m) * n
    tol = 2 * np.finfo(np.float32).eps * np.maximum(np.abs(want), np.abs(m * n))
    assert np.all(np.abs(np.array(mine) - want) <= tol)
    assert np.all(np.abs(np.array(mine) - np.array(theirs)) <= tol)


def test_a_pixel_mat_goes_into_a_net_like_any_other(tmp_path):
    """A style-transfer app's first steps: image -> resized RGB Mat -> normalized -> the net's input."""
    img = image(48, 64, 3, seed=10)
    m = Mat.from_pixels_resize(img, T.PIXEL_BGR2RGB, 64, 48, 32, 24)
    m.substract_mean_normalize([0, 0, 0], [1 / 255.0] * 3)
    x = np.array(m)
    assert x.shape == (3, 24, 32) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
    net = graph.Net()
    net.load_param_mem("7767517\n1 1\nInput in0 0 1 in0\n")
    (tmp_path / "none.bin").write_bytes(b"")  # an Input layer has no weights
    net.load_model(str(tmp_path / "none.bin"))
    ex = net.create_extractor()
    assert ex.input("in0", m) == 0
    r, out = ex.extract("in0")
    assert r == 0
    np.testing.assert_array_equal(np.array(out), x)


@pytest.mark.parametrize("call, error, match", [
    (lambda img: Mat.from_pixels(img[:5], T.PIXEL_BGR, 30, 20), ValueError,
     r"30x20 pixels of 3 bytes need 1800 bytes; the array holds 450"),
    (lambda img: Mat.from_pixels(img, T.PIXEL_RGBA, 30, 20), ValueError, r"pixels of 4 bytes need 2400 bytes"),
    (lambda img: Mat.from_pixels(img, T.PIXEL_BGR, 30, 20, 89), ValueError, r"stride 89 is shorter than a row"),
    (lambda img: Mat.from_pixels(img.astype(np.float32), T.PIXEL_BGR, 30, 20), TypeError,
     r"pixels are uint8 .* got dtype float32"),
    (lambda img: Mat.from_pixels(img, 7, 30, 20), ValueError, r"type 7 is not one of Mat.PixelType's conversions"),
    (lambda img: Mat.from_pixels(img, T.PIXEL_CONVERT_MASK, 30, 20), ValueError, r"not one of Mat.PixelType"),
    (lambda img: Mat.from_pixels(img, T.PIXEL_BGR, 0, 20), ValueError, r"w and h must be >= 1"),
    (lambda img: Mat.from_pixels_resize(img, T.PIXEL_BGR, 30, 20, 0, 5), ValueError,
     r"target_width and target_height must be >= 1"),
    (lambda img: Mat.from_pixels_roi(img, T.PIXEL_BGR, 30, 20, 20, 0, 11, 5), ValueError,
     r"roi 11x5 at \(20, 0\) lies outside the 30x20 image"),
    (lambda img: Mat.from_pixels_roi_resize(img, T.PIXEL_BGR, 30, 20, -1, 0, 5, 5, 3, 3), ValueError,
     r"lies outside the 30x20 image"),
    (lambda img: Mat.from_pixels(img, T.PIXEL_GRAY, 50000, 50000), ValueError,
     r"an image of 2500000000 bytes passes ncnn's limit of 2\^31 - 1"),
    (lambda img: Mat.from_pixels_resize(img, T.PIXEL_BGR, 30, 20, 100000, 100000), ValueError,
     r"a target of 100000x100000 pixels passes ncnn's limit"),
    (lambda img: Mat.from_pixels_roi_resize(img, T.PIXEL_BGR, 30, 20, 0, 0, 5, 5, 30000, 20000), ValueError,
     r"a target of 30000x20000 pixels"),
])
def test_bad_pixels_are_refused_naming_the_numbers(call, error, match):
    with pytest.raises(error, match=match):
        call(image(20, 30, 3))


def test_means_and_norms_of_the_wrong_length_are_refused():
    m = Mat.from_pixels(image(4, 5, 3), T.PIXEL_BGR, 5, 4)
    before = np.array(m)
    with pytest.raises(ValueError, match=r"mean holds 2 values for the Mat's 3 channels"):
        m.substract_mean_normalize([1.0, 2.0], [])
    with pytest.raises(ValueError, match=r"norm holds 4 values for the Mat's 3 channels"):
        m.substract_mean_normalize([], [1.0] * 4)
    np.testing.assert_array_equal(np.array(m), before)  # nothing done
    with pytest.raises(ValueError, match="the Mat is empty"):
        Mat().substract_mean_normalize([1.0], [1.0])


def test_norms_on_mats_of_one_or_two_dims_are_refused_means_work():
    """ncnn's Scale layer, which applies the norms, takes a value per element (dims 1) or per row (dims 2), where
    substract_mean_normalize gives one per channel: pyncnn reads past it. Means (ncnn's Bias) are per channel."""
    rows = Mat(np.arange(12, dtype=np.float32).reshape(3, 4))
    with pytest.raises(ValueError, match="norm on a Mat of dims 2 .* reshape it to \\(w, h, 1\\) first"):
        rows.substract_mean_normalize([], [2.0])
    with pytest.raises(ValueError, match="norm on a Mat of dims 1"):
        Mat(np.ones(5, np.float32)).substract_mean_normalize([1.0], [2.0])
    rows.substract_mean_normalize([1.5], [])
    np.testing.assert_array_equal(np.array(rows), np.arange(12, dtype=np.float32).reshape(3, 4) - 1.5)
    plane = Mat(np.arange(12, dtype=np.float32).reshape(1, 3, 4))
    plane.substract_mean_normalize([1.5], [2.0])
    np.testing.assert_array_equal(np.array(plane), (np.arange(12, dtype=np.float32).reshape(1, 3, 4) - 1.5) * 2)


def test_an_image_of_any_memory_layout_is_read_as_numpy_indexes_it():
    """A view (every other column, a flipped image) is copied contiguous first: the pixels numpy shows, where pyncnn
    would read the memory under the view."""
    img = image(10, 24, 3, seed=11)
    for view in (img[:, ::2], img[::-1], np.asfortranarray(img)):
        h, w = view.shape[:2]
        got = np.array(Mat.from_pixels(view, T.PIXEL_RGB, w, h))
        np.testing.assert_array_equal(got, view.transpose(2, 0, 1).astype(np.float32))


def test_conversions_on_four_threads_at_once_agree():
    import threading

    img = image(300, 400, 3, seed=12)
    want = np.array(Mat.from_pixels_resize(img, T.PIXEL_BGR2RGB, 400, 300, 224, 224))
    bad = []

    def convert():
        for _ in range(10):
            got = np.array(Mat.from_pixels_resize(img, T.PIXEL_BGR2RGB, 400, 300, 224, 224))
            if not np.array_equal(got, want):
                bad.append(1)
    ts = [threading.Thread(target=convert) for _ in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not bad


def test_every_type_converts_some_pixels_into_the_target_channel_count():
    for name in TYPES:
        target = name[len("PIXEL_"):].split("2")[-1]
        img = image(3, 5, source_channels(name))
        assert Mat.from_pixels(img, getattr(T, name), 5, 3).c == CHANNELS[target], name


def test_pixel_types_combine_as_ints_as_in_ncnn():
    assert int(T.PIXEL_BGR2RGB) == int(T.PIXEL_BGR) | (int(T.PIXEL_RGB) << int(T.PIXEL_CONVERT_SHIFT))
    img = image(4, 6, 3)
    by_int = Mat.from_pixels(img, int(T.PIXEL_BGR) | (int(T.PIXEL_RGB) << 16), 6, 4)
    np.testing.assert_array_equal(np.array(by_int), np.array(Mat.from_pixels(img, T.PIXEL_BGR2RGB, 6, 4)))

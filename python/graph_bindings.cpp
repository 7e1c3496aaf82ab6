// nanobind module vknorm._graph: ncnn (compiled from its pinned source) with vknorm's layers inside its
// Vulkan graph, shaped like pyncnn where the two overlap (Net, opt, load_param, load_model,
// create_extractor, input, extract, Mat). python/vknorm/graph.py is the public face.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <cstring>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>  // std::shared_lock
#include <stdexcept>
#include <unordered_map>

#include <fcntl.h>
#include <unistd.h>

#include <ncnn/command.h>
#include <ncnn/cpu.h>
#include <ncnn/datareader.h>
#include <ncnn/gpu.h>
#include <ncnn/layer_type.h>
#include <ncnn/net.h>

#include "vknorm/context.h"
#include "vknorm/ncnn.h"
#include "graph_custom_layers.h"
#include "graph_mat_functions.h"
#include "mat_layout.h"
#include "numpy_shape.h"
#include "py_values.h"
#include "release_gil.h"

namespace nb = nanobind;
using vknorm_python::PythonLayerTypes;
using vknorm_python::ReleaseGil;
using vknorm_python::as_index;
using vknorm_python::type_of;
using vknorm_python::element_strides;
using vknorm_python::kMaxThreads;
using vknorm_python::thread_count_ok;
using namespace nb::literals;

namespace {

// const: Mat(array) only reads, so read-only arrays (np.load(mmap_mode="r"), np.frombuffer) are taken as pyncnn takes them.
using Array = nb::ndarray<nb::numpy, const float, nb::c_contig, nb::device::cpu>;

// numpy (w), (h, w), (c, h, w), (c, d, h, w) float32 -> an ncnn::Mat that owns a copy (pyncnn's order).
nb::dict counters_dict(const vknorm::ncnn::Counters& c) {
  nb::dict d;
  d["vulkan_forwards"] = c.vulkan_forwards;
  d["cpu_forwards"] = c.cpu_forwards;
  d["pipelines"] = c.pipelines;
  d["unfused_adds"] = c.unfused_adds;
  return d;
}

// Copies of at least this many floats (1 MiB) between numpy and a Mat let other Python threads run meanwhile.
constexpr size_t kReleaseGilElements = size_t(1) << 18;

::ncnn::Mat mat_from_numpy(const Array& a) {
  const size_t nd = a.ndim();
  if (nd < 1 || nd > 4) throw std::invalid_argument("Mat: expected a 1-4 dim float32 array, got " + std::to_string(nd) + " dims");
  for (size_t i = 0; i < nd; ++i)
    if (a.shape(i) == 0 || a.shape(i) > 0x7fffffff) throw std::invalid_argument("Mat: every dimension must be 1..2^31-1");
  int s[4] = {1, 1, 1, 1};  // w, h, d, c
  const int order[4][4] = {{0}, {1, 0}, {3, 1, 0}, {3, 2, 1, 0}};
  for (size_t i = 0; i < nd; ++i) s[order[nd - 1][i]] = int(a.shape(i));
  ::ncnn::Mat m;
  if (nd == 1) m.create(s[0]);
  else if (nd == 2) m.create(s[0], s[1]);
  else if (nd == 3) m.create(s[0], s[1], s[3]);
  else m.create(s[0], s[1], s[2], s[3]);
  if (m.empty()) throw std::bad_alloc();
  const size_t plane = size_t(s[0]) * s[1] * s[2];
  const int channels = nd >= 3 ? s[3] : 1;
  // Other Python threads run during a large copy, as during numpy's own (the array's export keeps it in place).
  std::optional<ReleaseGil> release;
  if (plane * channels >= kReleaseGilElements) release.emplace();
  for (int q = 0; q < channels; ++q) {
    float* channel = m.channel(q);
    std::memcpy(channel, a.data() + q * plane, plane * sizeof(float));
    if (nd >= 3) std::fill(channel + plane, channel + m.cstep, 0.f);  // the padding: no stale heap in m[i]
  }
  return m;
}

// A path with a NUL in it names another file in C (what precedes the NUL): Python's open() refuses it too.
// ncnn reads names, paths and param text as C strings: a NUL would end them early, silently (another file, another
// blob, layers dropped unseen).
void refuse_nul(const std::string& s, const std::string& what = "the path", const std::string& call = "") {
  if (s.find('\0') != std::string::npos) throw std::invalid_argument(call + "embedded null byte in " + what);
}

// A file name as str, bytes or any os.PathLike (pathlib.Path), as Python's open() takes it: the bytes the file
// system has (os.fsencode), so a name that is not UTF-8 (legal on Linux; str holds it surrogate-escaped) opens too.
std::string path_of(nb::handle file) {
  const nb::bytes p = nb::cast<nb::bytes>(nb::module_::import_("os").attr("fsencode")(file));  // TypeError otherwise
  std::string path(p.c_str(), p.size());
  refuse_nul(path);
  return path;
}

nb::ndarray<nb::numpy, float> mat_to_numpy(const ::ncnn::Mat& m) {
  if (m.empty()) throw std::invalid_argument("Mat is empty");
  if (m.elempack != 1 || m.elemsize != 4) throw std::invalid_argument("Mat: only elempack-1 float32 Mats convert to numpy");
  const std::vector<size_t> shape = numpy_shape(m.dims, m.w, m.h, m.d, m.c);
  const size_t plane = size_t(m.w) * m.h * m.d;
  const int channels = m.dims >= 3 ? m.c : 1;
  auto* out = new float[plane * channels];
  {
    // A reference of our own: the Python Mat may be given other data by another thread while this one copies.
    const ::ncnn::Mat held = m;
    std::optional<ReleaseGil> release;
    if (plane * channels >= kReleaseGilElements) release.emplace();
    for (int q = 0; q < channels; ++q) std::memcpy(out + q * plane, held.channel(q).data, plane * sizeof(float));
  }
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  return nb::ndarray<nb::numpy, float>(out, shape.size(), shape.data(), owner);
}

int dimension(long long n) {
  if (n < 1 || n > 0x7fffffff) throw std::invalid_argument("Mat: every dimension must be 1..2^31-1");
  return int(n);
}

// A shape given as a tuple: 1 to 4 ints (TypeError otherwise, as for any other argument of the wrong type).
std::vector<int> ints(const nb::tuple& shape) {
  if (shape.size() < 1 || shape.size() > 4)
    throw nb::type_error(("Mat: a shape has 1 to 4 dimensions (w, h, d, c order), got " +
                          std::to_string(shape.size())).c_str());
  std::vector<int> r;
  for (nb::handle v : shape) {
    const std::optional<long long> n = as_index(v);
    if (!n) throw nb::type_error("Mat: a shape's dimensions are ints");
    r.push_back(dimension(*n));
  }
  return r;
}

// ncnn ignores a negative kv-cache hint; 0 is its default (no hint).
void check_seqlen_hint(int hint, const char* what) {
  if (hint < 0)
    throw std::invalid_argument(std::string(what) + ": expected 0 (no hint) or a token count, got " +
                                std::to_string(hint));
}

// A switch as pyncnn (pybind11) takes one: True/False, numpy's bool, or a number by its truth value (an integer of
// numpy's too; opt.use_vulkan_compute = ncnn.get_gpu_count()). nanobind's bool takes the first only, so
// Option.use_vulkan_compute = 1 was an error that named no field. None (pyncnn's False) and anything else are
// refused, naming what was set.
bool as_switch(nb::handle v, const std::string& what) {
  if (v.ptr() == Py_True || v.ptr() == Py_False) return v.ptr() == Py_True;
  const nb::handle type = v.type();
  if (nb::hasattr(type, "__module__") && nb::str(type.attr("__module__")).equal(nb::str("numpy")) &&
      (nb::str(type.attr("__name__")).equal(nb::str("bool")) || nb::str(type.attr("__name__")).equal(nb::str("bool_"))))
    return PyObject_IsTrue(v.ptr()) == 1;
  if (PyIndex_Check(v.ptr()) || PyFloat_Check(v.ptr())) {
    const int truth = PyObject_IsTrue(v.ptr());
    if (truth < 0) throw nb::python_error();
    return truth == 1;
  }
  throw nb::type_error((what + ": expected True or False (or a number), got " + nb::repr(v).c_str()).c_str());
}

// pyncnn's allocator argument: vknorm.graph has no allocator objects, so None only (ncnn's own).
void check_no_allocator(const char* fn, nb::handle allocator) {
  if (!allocator.is_none())
    throw nb::type_error((std::string(fn) + ": vknorm.graph has no allocators: allocator=None only, ncnn's own (it "
                                            "takes no allocator objects)").c_str());
}

// pyncnn's Mat(w), Mat(w, h), Mat(w, h, c), Mat(w, h, d, c): float32, elempack 1, zeroed. Its elemsize and
// allocator keywords: the host Mats here are float32 in ncnn's own memory.
::ncnn::Mat mat_of_shape(const std::vector<int>& shape, size_t elemsize = 4, nb::handle allocator = nb::none()) {
  if (elemsize != 4)
    throw std::invalid_argument("Mat: elemsize " + std::to_string(elemsize) + ": vknorm.graph's Mats hold float32 "
                                "(elemsize 4); the net converts them to the storage it runs in");
  check_no_allocator("Mat", allocator);
  for (int s : shape)
    if (s < 1) throw std::invalid_argument("Mat: every dimension must be 1..2^31-1");
  // ncnn sizes the Mat in size_t (cstep x c x 4): a shape past that wraps round to a small allocation that every
  // access then runs past. Sized here without wrapping first.
  unsigned __int128 bytes = 4;
  for (size_t i = 0; i + (shape.size() >= 3 ? 1 : 0) < shape.size(); ++i) bytes *= unsigned(shape[i]);
  if (shape.size() >= 3) bytes = (bytes + 15) / 16 * 16 * unsigned(shape.back());
  if (bytes > PTRDIFF_MAX)
    throw std::invalid_argument("Mat: a shape of more bytes than memory can hold (" + std::to_string(shape.size()) +
                                " dims)");
  ::ncnn::Mat m;
  if (shape.size() == 1) m.create(shape[0]);
  if (shape.size() == 2) m.create(shape[0], shape[1]);
  if (shape.size() == 3) m.create(shape[0], shape[1], shape[2]);
  if (shape.size() == 4) m.create(shape[0], shape[1], shape[2], shape[3]);
  if (m.empty()) throw std::bad_alloc();
  m.fill(0.f);
  return m;
}

// pyncnn's DataReaderFromEmpty: every weight zero, for timing or checking a model from its .param alone.
struct DataReaderFromEmpty {};
class ZeroReader : public ::ncnn::DataReader {
 public:
  size_t read(void* buf, size_t size) const override {
    std::memset(buf, 0, size);
    consumed_ += size;
    return size;
  }
  size_t consumed() const { return consumed_; }

 private:
  mutable size_t consumed_ = 0;
};

// ncnn's DataReader over bytes in memory, reading no further than their end. It hands out no references into them:
// every weight is copied, so the bytes may go once the load returns.
class BoundedMemoryReader : public ::ncnn::DataReader {
 public:
  BoundedMemoryReader(const unsigned char* data, size_t size) : at_(data), begin_(data), end_(data + size) {}
  size_t read(void* buf, size_t size) const override {
    const size_t n = std::min(size, size_t(end_ - at_));
    if (n) std::memcpy(buf, at_, n);
    at_ += n;
    return n;
  }
  size_t reference(size_t, const void**) const override { return 0; }  // ncnn then reads (copies) instead
  size_t consumed() const { return size_t(at_ - begin_); }

 private:
  mutable const unsigned char* at_;
  const unsigned char *begin_, *end_;
};

// pyncnn's pixel helpers run ncnn's own conversions (mat_pixel.cpp) on a uint8 image checked first to hold every
// byte they read (pyncnn reads whatever lies past a short buffer), with a type ncnn converts (it logs and returns
// an empty Mat for others).
using PixelType = ::ncnn::Mat::PixelType;
// Every conversion ncnn makes, under pyncnn's name (Mat.PixelType's values).
constexpr std::pair<const char*, PixelType> kPixelTypes[] = {
    {"PIXEL_RGB", PixelType::PIXEL_RGB},             {"PIXEL_BGR", PixelType::PIXEL_BGR},
    {"PIXEL_GRAY", PixelType::PIXEL_GRAY},           {"PIXEL_RGBA", PixelType::PIXEL_RGBA},
    {"PIXEL_BGRA", PixelType::PIXEL_BGRA},           {"PIXEL_RGB2BGR", PixelType::PIXEL_RGB2BGR},
    {"PIXEL_RGB2GRAY", PixelType::PIXEL_RGB2GRAY},   {"PIXEL_RGB2RGBA", PixelType::PIXEL_RGB2RGBA},
    {"PIXEL_RGB2BGRA", PixelType::PIXEL_RGB2BGRA},   {"PIXEL_BGR2RGB", PixelType::PIXEL_BGR2RGB},
    {"PIXEL_BGR2GRAY", PixelType::PIXEL_BGR2GRAY},   {"PIXEL_BGR2RGBA", PixelType::PIXEL_BGR2RGBA},
    {"PIXEL_BGR2BGRA", PixelType::PIXEL_BGR2BGRA},   {"PIXEL_GRAY2RGB", PixelType::PIXEL_GRAY2RGB},
    {"PIXEL_GRAY2BGR", PixelType::PIXEL_GRAY2BGR},   {"PIXEL_GRAY2RGBA", PixelType::PIXEL_GRAY2RGBA},
    {"PIXEL_GRAY2BGRA", PixelType::PIXEL_GRAY2BGRA}, {"PIXEL_RGBA2RGB", PixelType::PIXEL_RGBA2RGB},
    {"PIXEL_RGBA2BGR", PixelType::PIXEL_RGBA2BGR},   {"PIXEL_RGBA2GRAY", PixelType::PIXEL_RGBA2GRAY},
    {"PIXEL_RGBA2BGRA", PixelType::PIXEL_RGBA2BGRA}, {"PIXEL_BGRA2RGB", PixelType::PIXEL_BGRA2RGB},
    {"PIXEL_BGRA2BGR", PixelType::PIXEL_BGRA2BGR},   {"PIXEL_BGRA2GRAY", PixelType::PIXEL_BGRA2GRAY},
    {"PIXEL_BGRA2RGBA", PixelType::PIXEL_BGRA2RGBA}};

// 8-bit data given from Python, as pyncnn takes it (bytes, bytearray, a uint8 array or what numpy reads as one):
// contiguous, with its address. `copy`: the caller's memory copied unless immutable (bytes), for work that lets the
// GIL go while another thread could write it. A str is refused: pyncnn encodes it as UTF-8, other bytes silently.
struct Uint8Data {
  nb::object array;  // owns or refers to the memory: keep it while `data` is read
  const unsigned char* data = nullptr;
  size_t size = 0;
};

Uint8Data uint8_data(const std::string& what, nb::handle obj, bool copy) {
  if (PyUnicode_Check(obj.ptr())) throw nb::type_error((what + ", not a str").c_str());
  nb::module_ np = nb::module_::import_("numpy");
  const bool immutable = PyBytes_Check(obj.ptr());
  Uint8Data d;
  d.array = immutable || PyByteArray_Check(obj.ptr()) ? np.attr("frombuffer")(obj, "dtype"_a = np.attr("uint8"))
                                                      : np.attr("asarray")(obj);
  d.array = copy && !immutable ? np.attr("array")(d.array, "order"_a = "C") : np.attr("ascontiguousarray")(d.array);
  const std::string dtype = nb::cast<std::string>(d.array.attr("dtype").attr("name"));
  if (dtype != "uint8") throw nb::type_error((what + ", got dtype " + dtype).c_str());
  d.data = reinterpret_cast<const unsigned char*>(nb::cast<uintptr_t>(d.array.attr("ctypes").attr("data")));
  d.size = nb::cast<size_t>(d.array.attr("nbytes"));
  return d;
}

struct Pixels {
  nb::object array;  // keeps the contiguous copy alive while ncnn reads it
  const unsigned char* data = nullptr;
  int stride = 0;    // bytes from one row to the next
};

// ncnn addresses an image's bytes, and a resize's output, with int.
constexpr int64_t kMaxImageBytes = INT_MAX;

// The image a conversion reads: w x h pixels of the type's source format, rows stride bytes apart (w x channels
// when not given). `lead` bytes of zeros go before it where ncnn reads before the first pixel (a resize of a
// source one pixel wide reads the byte before each row, with weight 0).
Pixels pixels_of(const char* fn, nb::handle obj, long long type, int w, int h, std::optional<int> stride, int lead = 0) {
  const std::string where = std::string("Mat.") + fn + ": ";
  if (type < 0 || type > INT_MAX ||
      std::none_of(std::begin(kPixelTypes), std::end(kPixelTypes), [&](const auto& t) { return t.second == type; }))
    throw std::invalid_argument(where + "type " + std::to_string(type) + " is not one of Mat.PixelType's conversions");
  const int from = int(type) & PixelType::PIXEL_FORMAT_MASK;
  const int channels = from == PixelType::PIXEL_GRAY ? 1 : from == PixelType::PIXEL_RGB || from == PixelType::PIXEL_BGR ? 3 : 4;
  if (w <= 0 || h <= 0)
    throw std::invalid_argument(where + "w and h must be >= 1 (got " + std::to_string(w) + "x" + std::to_string(h) + ")");
  const int64_t row = int64_t(w) * channels;
  // pyncnn's crop idiom: a numpy view of part of an image given with its own row stride (crop.strides[0]), which
  // pyncnn reads in place. The view is made contiguous below (its rows then as long as the view's): taken where its
  // rows' bytes lie next to each other, as numpy shows them, and hold the w pixels asked for.
  if (stride && nb::isinstance(obj, nb::module_::import_("numpy").attr("ndarray")) && nb::cast<int>(obj.attr("ndim")) >= 2 &&
      nb::cast<std::string>(obj.attr("dtype").attr("name")) == "uint8" &&
      !nb::cast<bool>(obj.attr("flags").attr("c_contiguous")) &&
      nb::cast<long long>(obj.attr("strides")[0]) == *stride) {
    const bool has_rows = nb::cast<long long>(obj.attr("shape")[0]) >= h;
    nb::object first = nb::none();
    if (has_rows) first = obj.attr("__getitem__")(nb::int_(0));  // a row as the view shows it
    const long long row_bytes = has_rows ? nb::cast<long long>(first.attr("nbytes")) : 0;
    if (!has_rows || !nb::cast<bool>(first.attr("flags").attr("c_contiguous")) || row_bytes < row)
      throw std::invalid_argument(where + "a numpy view given with its own row stride (" + std::to_string(*stride) +
                                  ") is read as numpy shows it: its rows' bytes must lie next to each other and hold "
                                  "the " + std::to_string(w) + "x" + std::to_string(h) + " pixels asked for (it has " +
                                  nb::cast<std::string>(nb::repr(obj.attr("shape"))) + "); pass "
                                  "np.ascontiguousarray(view) without a stride");
    stride = int(row_bytes);
  }
  const int64_t step = stride ? int64_t(*stride) : row;
  if (step < row)
    throw std::invalid_argument(where + "stride " + std::to_string(step) + " is shorter than a row of " + std::to_string(w) +
                                " pixels of " + std::to_string(channels) + " bytes");
  const int64_t need = step * (h - 1) + row;
  if (need > kMaxImageBytes)
    throw std::invalid_argument(where + "an image of " + std::to_string(need) + " bytes passes ncnn's limit of 2^31 - 1");
  const Uint8Data image = uint8_data(where + "pixels are uint8 (an 8-bit image)", obj, false);
  const int64_t have = int64_t(image.size);
  if (have < need)
    throw std::invalid_argument(where + std::to_string(w) + "x" + std::to_string(h) + " pixels of " +
                                std::to_string(channels) + " bytes" + (stride ? ", stride " + std::to_string(step) : std::string()) +
                                " need " + std::to_string(need) + " bytes; the array holds " + std::to_string(have));
  Pixels p;
  p.array = image.array, p.data = image.data;
  if (lead) {
    nb::module_ np = nb::module_::import_("numpy");
    nb::object padded = np.attr("zeros")(lead + have, "dtype"_a = np.attr("uint8"));
    padded[nb::slice(nb::int_(lead), nb::none(), nb::none())] = image.array.attr("reshape")(-1);
    p.array = padded;
    p.data = reinterpret_cast<const unsigned char*>(nb::cast<uintptr_t>(padded.attr("ctypes").attr("data"))) + lead;
  }
  p.stride = int(step);
  return p;
}

void check_target(const char* fn, int target_width, int target_height) {
  if (target_width <= 0 || target_height <= 0)
    throw std::invalid_argument(std::string("Mat.") + fn + ": target_width and target_height must be >= 1 (got " +
                                std::to_string(target_width) + "x" + std::to_string(target_height) + ")");
  if (int64_t(target_width) * target_height * 4 > kMaxImageBytes)  // 4: the widest pixel
    throw std::invalid_argument(std::string("Mat.") + fn + ": a target of " + std::to_string(target_width) + "x" +
                                std::to_string(target_height) + " pixels passes ncnn's limit of 2^31 - 1 bytes");
}

void check_roi(const char* fn, int w, int h, int roix, int roiy, int roiw, int roih) {
  if (roix < 0 || roiy < 0 || roiw <= 0 || roih <= 0 || int64_t(roix) + roiw > w || int64_t(roiy) + roih > h)
    throw std::invalid_argument(std::string("Mat.") + fn + ": roi " + std::to_string(roiw) + "x" + std::to_string(roih) +
                                " at (" + std::to_string(roix) + ", " + std::to_string(roiy) + ") lies outside the " +
                                std::to_string(w) + "x" + std::to_string(h) + " image");
}

// The conversion without the GIL (a large image takes milliseconds); an empty result is ncnn's failed allocation.
template <typename F>
::ncnn::Mat converted(F&& convert) {
  ::ncnn::Mat m;
  {
    ReleaseGil release;
    m = convert();
  }
  if (m.empty()) throw std::bad_alloc();
  return m;
}

::ncnn::Mat pixels_resized(nb::handle array, long long type, int w, int h, std::optional<int> stride, int target_width,
                           int target_height, nb::handle allocator) {
  check_no_allocator("Mat.from_pixels_resize", allocator);
  check_target("from_pixels_resize", target_width, target_height);
  const Pixels p = pixels_of("from_pixels_resize", array, type, w, h, stride, w == 1 ? 4 : 0);
  return converted([&] { return ::ncnn::Mat::from_pixels_resize(p.data, int(type), w, h, p.stride, target_width, target_height); });
}

// from_pixels_roi, and with a target from_pixels_roi_resize
::ncnn::Mat pixels_roi(nb::handle array, long long type, int w, int h, std::optional<int> stride, int roix, int roiy,
                       int roiw, int roih, std::optional<std::pair<int, int>> target, nb::handle allocator) {
  const char* fn = target ? "from_pixels_roi_resize" : "from_pixels_roi";
  check_no_allocator(target ? "Mat.from_pixels_roi_resize" : "Mat.from_pixels_roi", allocator);
  check_roi(fn, w, h, roix, roiy, roiw, roih);
  if (target) check_target(fn, target->first, target->second);
  const Pixels p = pixels_of(fn, array, type, w, h, stride, target && roiw == 1 ? 4 : 0);
  return converted([&] {
    return target ? ::ncnn::Mat::from_pixels_roi_resize(p.data, int(type), w, h, p.stride, roix, roiy, roiw, roih,
                                                        target->first, target->second)
                  : ::ncnn::Mat::from_pixels_roi(p.data, int(type), w, h, p.stride, roix, roiy, roiw, roih);
  });
}

// pyncnn's Mat.substract_mean_normalize (ncnn's spelling): per channel, (x - mean) * norm, either list may be empty.
void substract_mean_normalize(::ncnn::Mat& m, const std::vector<float>& mean, const std::vector<float>& norm) {
  if (m.empty()) throw std::invalid_argument("Mat.substract_mean_normalize: the Mat is empty");
  if (m.elemsize != 4 || m.elempack != 1)
    throw std::invalid_argument("Mat.substract_mean_normalize: only float32 Mats of elempack 1");
  for (const auto* v : {&mean, &norm})
    if (!v->empty() && v->size() != size_t(m.c))
      throw std::invalid_argument(std::string("Mat.substract_mean_normalize: ") + (v == &mean ? "mean" : "norm") +
                                  " holds " + std::to_string(v->size()) + " values for the Mat's " + std::to_string(m.c) +
                                  " channels (one each, or none)");
  if (!norm.empty() && m.dims < 3)
    throw std::invalid_argument("Mat.substract_mean_normalize: norm on a Mat of dims " + std::to_string(m.dims) +
                                " (ncnn's Scale takes a value per element or row there, not per channel): reshape it to "
                                "(w, h, 1) first");
  if (mean.empty() && norm.empty()) return;  // ncnn would run no layer
  ::ncnn::Mat held = m;  // its memory stays referenced while the GIL is let go
  ReleaseGil release;
  held.substract_mean_normalize(mean.empty() ? nullptr : mean.data(), norm.empty() ? nullptr : norm.data());
}

// Mat::reshape to (w), (w, h), (w, h, c) or (w, h, d, c); a ValueError where the element count differs (ncnn
// returns an empty Mat there).
::ncnn::Mat reshaped(const ::ncnn::Mat& m, std::vector<int> shape) {
  if (m.empty()) throw std::invalid_argument("Mat.reshape: the Mat is empty");
  if (m.elempack != 1) throw std::invalid_argument("Mat.reshape: only elempack-1 Mats reshape");
  unsigned __int128 count = 1;  // four dimensions below 2^31 each do not overflow it
  std::string asked;
  for (int s : shape) {
    if (s <= 0) throw std::invalid_argument("Mat.reshape: every dimension must be >= 1");
    count *= unsigned(s);
    asked += (asked.empty() ? "" : "x") + std::to_string(s);
  }
  const size_t have = size_t(m.w) * m.h * m.d * m.c;
  if (count != have)
    throw std::invalid_argument("Mat.reshape: " + asked + " (w, h, d, c order) does not hold the Mat's " +
                                std::to_string(have) + " elements");
  const ::ncnn::Mat from = vknorm_python::in_ncnn_layout(m);  // ncnn's reshape takes channels at the aligned cstep
  ::ncnn::Mat r = shape.size() == 1 ? from.reshape(shape[0])
                  : shape.size() == 2 ? from.reshape(shape[0], shape[1])
                  : shape.size() == 3 ? from.reshape(shape[0], shape[1], shape[2])
                                      : from.reshape(shape[0], shape[1], shape[2], shape[3]);
  if (r.empty()) throw std::bad_alloc();
  return r;
}

// A view (or a reshape that shares memory) that holds the memory it lies in, as ncnn's copies of a Mat do: its refcount
// and allocator are a HeldMemory's, which holds a reference to its Mat's memory until the last copy of the view goes
// (ncnn's release() hands it back through fastFree). A Mat made again, cloned into or released while views of it live
// leaves them on the memory they were made on. (The count is the view's own, blind to its Mat's: Extractor.input
// copies a view rather than let ncnn read a count of 1 as leave to write in place.)
class HeldMemory final : public ::ncnn::Allocator {
 public:
  explicit HeldMemory(const ::ncnn::Mat& of) : memory_(of) {}
  void* fastMalloc(size_t) override { return nullptr; }  // never asked: a Mat allocates from the allocator it is given
  void fastFree(void*) override { delete this; }          // the view's last copy went; the memory is the Mat's to free
  int count = 1;

 private:
  ::ncnn::Mat memory_;
};

::ncnn::Mat held_view(const ::ncnn::Mat& of, ::ncnn::Mat view) {
  if (view.refcount) return view;  // a reshape sharing the Mat's memory counts itself in already
  auto* held = new HeldMemory(of);
  view.refcount = &held->count;
  view.allocator = held;
  return view;
}

// pyncnn's Mat.reshape (allocator=None only): a view holding the Mat's memory, or ncnn's copy where it makes one.
::ncnn::Mat reshaped_view(const ::ncnn::Mat& mat, const std::vector<int>& shape, nb::handle allocator) {
  check_no_allocator("Mat.reshape", allocator);
  return held_view(mat, reshaped(mat, shape));
}

// A Mat's shape as the shape constructors take it: (w), (w, h), (w, h, c), (w, h, d, c).
std::vector<int> shape_of(const ::ncnn::Mat& m) {
  if (m.dims == 1) return {m.w};
  if (m.dims == 2) return {m.w, m.h};
  if (m.dims == 3) return {m.w, m.h, m.c};
  return {m.w, m.h, m.d, m.c};
}

// Mat.create's and the shape constructors' Mat: float32 of elempack 1 and a batch of one (what this module's Mats
// are), zeroed; `where` names the call in messages.
::ncnn::Mat created(const std::vector<int>& shape, size_t elemsize, int elempack, int n, nb::handle allocator,
                    const std::string& where = "Mat.create") {
  if (elempack != 1)
    throw std::invalid_argument(where + ": elempack " + std::to_string(elempack) + ": vknorm.graph's Mats are "
                                "unpacked (elempack 1); the net packs them as it runs");
  if (n != 1) throw std::invalid_argument(where + ": n " + std::to_string(n) + ": vknorm.graph's Mats are one batch (n 1)");
  return mat_of_shape(shape, elemsize, allocator);
}

// pyncnn's views into a Mat (channel, depth, row, their ranges, range, [i]): ncnn's own, which share the Mat's memory,
// after checks ncnn leaves out (pyncnn reads and writes past the Mat). The binding makes each hold the Mat's memory
// (held_view). where: the call ("Mat.channel"), for the messages.
void check_view(const ::ncnn::Mat& m, const char* where) {
  if (m.empty()) throw std::invalid_argument(std::string(where) + ": the Mat is empty");
  // as every Mat this module makes is (Mat(array), extract's float32 copies); the element access below assumes it
  if (m.elemsize != 4 || m.elempack != 1)
    throw std::invalid_argument(std::string(where) + ": only float32 elempack-1 Mats have views here");
}
// Items [at, at + count) of `size` (one item where count is empty): IndexError otherwise, naming them by `noun`
// (channel, row, ...) and the Mat's size by `size_of` (channels, rows, ...).
void check_span(long long at, std::optional<long long> count, long long size, const char* where, const std::string& noun,
                const std::string& size_of) {
  const std::string call = std::string(where) + ": ";
  if (count && *count < 1)
    throw nb::index_error((call + "a count of " + std::to_string(*count) + " " + noun + "s: at least 1").c_str());
  if (at >= 0 && at < size && count.value_or(1) <= size - at) return;
  const std::string asked = (count ? std::to_string(*count) + " " + noun + "s from " : std::string()) + noun + " " +
                            std::to_string(at);
  throw nb::index_error((call + asked + " out of range: the Mat has " + std::to_string(size) + " " + size_of).c_str());
}
// A dims-3/4 Mat's channel c (one: channel) or channels c.. (channel_range).
::ncnn::Mat channel_view(::ncnn::Mat& m, long long c, std::optional<long long> channels) {
  const char* where = channels ? "Mat.channel_range" : "Mat.channel";
  check_view(m, where);
  check_span(c, channels, m.c, where, "channel", "channels");
  // A dims-1 or dims-2 Mat is its one channel (ncnn's channel(0) relabels the same memory dims - 1, keeping h:
  // pyncnn's per-channel loops then read its rows)
  if (m.dims < 3) return m;
  if (!channels) return m.channel(int(c));
  // ncnn's channel_range gives its channels the aligned cstep: the Mat's own, but for a dims-3 view of a dims-4 Mat's
  // channel, whose planes are w*h apart
  ::ncnn::Mat view = m.channel_range(int(c), int(*channels));
  view.cstep = m.cstep;
  return view;
}
// Depth plane z (depth) or planes z.. (depth_range): a dims-4 Mat's (of its first channel, as ncnn), or a dims-3
// one's whose planes lie next to each other (a dims-4 Mat's channel: cstep is w*h).
::ncnn::Mat depth_view(::ncnn::Mat& m, long long z, std::optional<long long> depths) {
  const char* where = depths ? "Mat.depth_range" : "Mat.depth";
  check_view(m, where);
  if (m.dims == 3 && m.cstep != size_t(m.w) * m.h)
    throw std::invalid_argument(std::string(where) + ": a dims-3 Mat whose planes are padded has no depth planes "
                                "(dims 4 has; a dims-3 Mat's planes: channel)");
  check_span(z, depths, m.dims == 4 ? m.d : m.dims == 3 ? m.c : 1, where, "depth plane", "depth planes");
  if (m.dims < 3) return m;  // a dims-1 or dims-2 Mat is its one depth plane
  return depths ? m.depth_range(int(z), int(*depths)) : m.depth(int(z));
}
// Rows of the first channel (as ncnn); a dims-1 Mat is one row.
::ncnn::Mat row_range_view(::ncnn::Mat& m, long long y, long long rows) {
  check_view(m, "Mat.row_range");
  check_span(y, rows, m.h, "Mat.row_range", "row", "rows");
  return m.row_range(int(y), int(rows));
}
// A numpy array over `data`, inside m's memory, which the array holds as held_view's views do (every Mat check_view
// takes counts its references). strides in elements (null: contiguous).
nb::ndarray<nb::numpy, float> array_over(const ::ncnn::Mat& m, void* data, size_t ndim, const size_t* shape,
                                         const int64_t* strides) {
  auto* held = new ::ncnn::Mat(m);
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<::ncnn::Mat*>(p); });
  return nb::ndarray<nb::numpy, float>(data, ndim, shape, owner, strides);
}
// Row y of the first channel (as ncnn) as a numpy array over the Mat's memory, which keeps the Mat alive (pyncnn: a
// memoryview).
nb::ndarray<nb::numpy, float> row_view(::ncnn::Mat& m, long long y) {
  check_view(m, "Mat.row");
  check_span(y, std::nullopt, m.h, "Mat.row", "row", "rows");
  const size_t shape[1] = {size_t(m.w)};
  return array_over(m, m.row(int(y)), 1, shape, nullptr);
}
// The whole Mat as a numpy array over its memory (channels cstep apart), which keeps the memory alive (pyncnn's
// Mat.numpy: a view).
nb::ndarray<nb::numpy, float> numpy_view(::ncnn::Mat& m) {
  check_view(m, "Mat.numpy");
  const std::vector<size_t> shape = numpy_shape(m.dims, m.w, m.h, m.d, m.c);
  return array_over(m, m.data, shape.size(), shape.data(), element_strides(m, shape).data());
}
// pyncnn's buffer protocol: memoryview(m), np.asarray(m), bytes(m) read (and write) the Mat's own memory, channels
// cstep apart. Each export holds a reference to that memory (as numpy()'s arrays do), so the buffer stays valid
// whatever the Python Mat is given later, and ncnn sees the Mat as shared (an input it would otherwise reuse in place
// is copied). An empty Mat, or one of another element type, exports nothing (numpy then asks __array__).
struct MatExport {
  ::ncnn::Mat held;
  Py_ssize_t shape[4];
  Py_ssize_t strides[4];
};
int mat_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  view->obj = nullptr;
  const ::ncnn::Mat* m = nb::inst_ptr<::ncnn::Mat>(self);
  if (m->empty() || m->elemsize != 4 || m->elempack != 1) {
    PyErr_SetString(PyExc_BufferError, m->empty() ? "Mat: an empty Mat has no memory to export"
                                                  : "Mat: only float32 Mats of elempack 1 export their memory");
    return -1;
  }
  const std::vector<size_t> shape = numpy_shape(m->dims, m->w, m->h, m->d, m->c);
  const int ndim = int(shape.size());
  // A request for contiguous memory (no strides, or C, Fortran or any order) of a Mat whose channels are cstep apart
  // (padded), or Fortran order of a Mat of more than one row, is refused as pyncnn's export refuses it.
  const bool c_order = m->dims < 3 || m->c == 1 || m->cstep == size_t(m->w) * m->h * m->d;
  const bool f_order = c_order && std::count_if(shape.begin(), shape.end(), [](size_t n) { return n > 1; }) <= 1;
  if ((!c_order && (flags & PyBUF_STRIDES) != PyBUF_STRIDES) ||
      (!c_order && (flags & (PyBUF_C_CONTIGUOUS & ~PyBUF_STRIDES))) ||
      (!f_order && (flags & (PyBUF_F_CONTIGUOUS & ~PyBUF_STRIDES))) ||
      (!c_order && !f_order && (flags & (PyBUF_ANY_CONTIGUOUS & ~PyBUF_STRIDES)))) {
    PyErr_SetString(PyExc_BufferError, c_order ? "Mat: its memory is in C order, not Fortran order"
                                               : "Mat: its channels are cstep apart (padded), so its memory is not "
                                                 "contiguous: np.array(mat) is a contiguous copy");
    return -1;
  }
  auto* e = new MatExport{*m, {}, {}};
  const std::vector<int64_t> strides = element_strides(*m, shape);
  Py_ssize_t count = 1;
  for (int k = 0; k < ndim; ++k) {
    e->shape[k] = Py_ssize_t(shape[k]);
    e->strides[k] = Py_ssize_t(strides[k]) * 4;
    count *= e->shape[k];
  }
  const bool nd = (flags & PyBUF_ND) == PyBUF_ND;
  view->buf = e->held.data;
  view->obj = self;
  Py_INCREF(self);
  view->len = count * 4;
  view->readonly = 0;
  view->itemsize = 4;
  view->format = (flags & PyBUF_FORMAT) ? const_cast<char*>("f") : nullptr;
  view->ndim = nd ? ndim : 1;
  view->shape = nd ? e->shape : nullptr;
  view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? e->strides : nullptr;
  view->suboffsets = nullptr;
  view->internal = e;
  return 0;
}
void mat_releasebuffer(PyObject*, Py_buffer* view) { delete static_cast<MatExport*>(view->internal); }
PyType_Slot kMatSlots[] = {{Py_bf_getbuffer, reinterpret_cast<void*>(mat_getbuffer)},
                           {Py_bf_releasebuffer, reinterpret_cast<void*>(mat_releasebuffer)},
                           {0, nullptr}};

// Elements of the first channel, next to each other (as ncnn).
::ncnn::Mat range_view(::ncnn::Mat& m, long long x, long long n) {
  check_view(m, "Mat.range");
  check_span(x, n, (long long)m.w * m.h * (m.dims == 4 ? m.d : 1), "Mat.range", "element", "elements in its first channel");
  return m.range(int(x), int(n));
}
// Element i of the Mat's memory, cstep padding included (ncnn's operator[]).
float& element(::ncnn::Mat& m, long long i) {
  check_view(m, "Mat[i]");
  check_span(i, std::nullopt, (long long)m.total(), "Mat[i]", "element", "elements, cstep padding included");
  return static_cast<float*>(m.data)[i];
}

// ncnn's Vulkan instance belongs to the process that made it: a fork()ed child inherits its handles but not the
// driver's threads. Its first wait never returns (check_vulkan_process refuses such a child); so does the exit
// handler ncnn registered when it made the instance (destroy_gpu_instance waits for the inherited device to go
// idle), which vknorm::arm_forked_child_exit has such a child skip; and freeing the net's device memory there
// frees the parent's (on NVIDIA the parent's next extract never returned): this module owns ncnn's objects that
// hold any through ForkSafe, which leaves them to such a child's end.
long g_ncnn_instance_pid = 0;  // the process that made ncnn's instance through this module
bool in_forked_child() { return g_ncnn_instance_pid && g_ncnn_instance_pid != long(getpid()); }
// ncnn's device count, its Vulkan instance made if need be (get_gpu_count makes it) and the early exit of forked
// children armed after it. Every path of this module to ncnn's instance starts here.
int ncnn_gpu_count() {
  const int n = ::ncnn::get_gpu_count();
  static const bool armed = [] {
    g_ncnn_instance_pid = long(getpid());
    vknorm::arm_forked_child_exit();
    return true;
  }();
  (void)armed;
  return n;
}
// Deletes, but in a fork()ed child (in_forked_child), where what it holds on the device is the parent's.
struct DeleteUnlessForked {
  template <class T>
  void operator()(T* p) const {
    if (!in_forked_child()) delete p;
  }
};
// How this module owns ncnn's objects that hold device memory, pipelines or command buffers.
template <class T>
using ForkSafe = std::unique_ptr<T, DeleteUnlessForked>;
// Refuses a fork()ed child's use of ncnn's devices (the instance made here first if need be).
void refuse_forked_child() {
  ncnn_gpu_count();  // ncnn's instance made here, before a load makes it
  if (g_ncnn_instance_pid != long(getpid()))
    throw std::runtime_error(
        "vknorm.graph: this process was fork()ed from one that had already started ncnn's Vulkan instance (ran a "
        "Vulkan net, or asked for its GPUs), whose device does not survive fork(): start workers with "
        "multiprocessing's 'spawn' or 'forkserver' method, or load the net only after the fork");
}
void check_vulkan_process(const ::ncnn::Option& opt) {
  if (opt.use_vulkan_compute) refuse_forked_child();
}

// A device index ncnn has, or an error naming the call (pyncnn's get_gpu_info reads past ncnn's device table).
int checked_gpu_index(long long index, const std::string& where) {
  const int count = ncnn_gpu_count();
  if (index < 0 || index >= count)
    throw std::invalid_argument(where + ": device index " + std::to_string(index) + " out of range (" +
                                std::to_string(count) + " Vulkan devices)");
  return int(index);
}
// ncnn's GpuInfo of a device as values taken now (pyncnn's GpuInfo refers to ncnn's own, freed with its instance):
// pyncnn's getters and those of ncnn's that say what a norm kernel meets (storage types, subgroups, workgroups).
nb::dict gpu_info_fields(long long index) {
  const ::ncnn::GpuInfo& g = ::ncnn::get_gpu_info(checked_gpu_index(index, "get_gpu_info"));
  nb::dict d;
  d["device_index"] = g.device_index();
  d["device_name"] = std::string(g.device_name());
  d["api_version"] = g.api_version();
  d["driver_version"] = g.driver_version();
  d["driver_id"] = g.driver_id();
  d["driver_name"] = std::string(g.driver_name());
  d["vendor_id"] = g.vendor_id();
  d["device_id"] = g.device_id();
  d["pipeline_cache_uuid"] = nb::bytes(reinterpret_cast<const char*>(g.pipeline_cache_uuid()), VK_UUID_SIZE);
  d["type"] = g.type();
  d["max_shared_memory_size"] = g.max_shared_memory_size();
  d["max_workgroup_invocations"] = g.max_workgroup_invocations();
  d["max_workgroup_size_x"] = g.max_workgroup_size_x();
  d["max_workgroup_count_x"] = g.max_workgroup_count_x();
  d["subgroup_size"] = g.subgroup_size();
  d["timestamp_period"] = g.timestamp_period();
  d["compute_queue_count"] = g.compute_queue_count();
  d["support_fp16_packed"] = g.support_fp16_packed();
  d["support_fp16_storage"] = g.support_fp16_storage();
  d["support_fp16_arithmetic"] = g.support_fp16_arithmetic();
  d["support_bf16_storage"] = g.support_bf16_storage();
  d["support_int8_storage"] = g.support_int8_storage();
  d["support_subgroup_ops"] = g.support_subgroup_ops();
  d["support_cooperative_matrix"] = g.support_cooperative_matrix();
  return d;
}
// ncnn's VulkanDevice::get_heap_budget (MB) of the device ncnn's nets of that index share, made if need be.
uint32_t gpu_heap_budget(long long device_index) {
  const int index = checked_gpu_index(device_index, "VulkanDevice.get_heap_budget");
  refuse_forked_child();  // the driver's call there may wait on threads the child does not have
  const ::ncnn::VulkanDevice* device = ::ncnn::get_gpu_device(index);
  if (!device || !device->is_valid())
    throw std::runtime_error("VulkanDevice.get_heap_budget: ncnn could not create Vulkan device " +
                             std::to_string(index));
  return device->get_heap_budget();
}

// stderr sent to /dev/null for a scope: ncnn notes every layer registered over a built-in one
// ("overwrite built-in layer type LayerNorm"), four lines for each Net that is expected to do exactly that.
class QuietStderr {
 public:
  QuietStderr() : saved_(dup(2)) {
    const int null = open("/dev/null", O_WRONLY);
    if (saved_ >= 0 && null >= 0) dup2(null, 2);
    if (null >= 0) close(null);
  }
  ~QuietStderr() {
    if (saved_ < 0) return;
    dup2(saved_, 2);
    close(saved_);
  }
  QuietStderr(const QuietStderr&) = delete;
  QuietStderr& operator=(const QuietStderr&) = delete;

 private:
  int saved_;
};

// A Python layer's code runs while the net that called it is held (loading, clearing or extracting, an extractor's
// lock held too): what waits for a net or an extractor is refused there, where waiting could never end.
void refuse_inside_python_layer() {
  if (vknorm_python::inside_python_layer())
    throw std::runtime_error("vknorm.graph: a Python layer's code (creator, destroyer, load_param, load_model, "
                             "forward, ...) cannot call a Net's or an Extractor's methods, which wait for a net: it "
                             "runs while the net that called it is held, loading, clearing or extracting");
}

// A shared lock whose writers go first: loads and clears wait only for the extracts already running.
// (std::shared_mutex on glibc prefers readers: two threads extracting in turn kept a load waiting forever.)
// Taken from a Python layer's code, it is refused (refuse_inside_python_layer).
class NetLock {
 public:
  void lock() {
    refuse_inside_python_layer();
    std::unique_lock<std::mutex> l(m_);
    ++writers_waiting_;
    cv_.wait(l, [&] { return !writing_ && readers_ == 0; });
    --writers_waiting_;
    writing_ = true;
    held().push_back(this);
  }
  void unlock() {
    forget();
    std::lock_guard<std::mutex> l(m_);
    writing_ = false;
    cv_.notify_all();
  }
  void lock_shared() {
    refuse_inside_python_layer();
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return !writing_ && writers_waiting_ == 0; });
    ++readers_;
    held().push_back(this);
  }
  // lock_shared where it is free now, without waiting (an extractor let go by a Python layer's code)
  bool try_lock_shared() {
    std::lock_guard<std::mutex> l(m_);
    if (writing_ || writers_waiting_ != 0) return false;
    ++readers_;
    held().push_back(this);
    return true;
  }
  void unlock_shared() {
    forget();
    std::lock_guard<std::mutex> l(m_);
    if (--readers_ == 0) cv_.notify_all();
  }
  bool held_by_this_thread() const { return std::find(held().begin(), held().end(), this) != held().end(); }
  static bool this_thread_holds_one() { return !held().empty(); }

 private:
  static std::vector<const NetLock*>& held() {
    thread_local std::vector<const NetLock*> locks;
    return locks;
  }
  void forget() {
    auto& h = held();
    h.erase(std::find(h.begin(), h.end(), this));
  }
  std::mutex m_;
  std::condition_variable cv_;
  int readers_ = 0, writers_waiting_ = 0;
  bool writing_ = false;
};

// Command buffers for Vulkan extracts, kept and reset between them. ncnn's Extractor::extract makes a VkCompute (a
// command pool, its buffer, a fence) for every extract and destroys it after: 0.43-0.56 ms on the H200's driver,
// most of what a small model's inference costs there, where resetting one costs microseconds.
class RecycledCommands {
 public:
  // A reset VkCompute of vkdev's (a new one where none is idle).
  ForkSafe<::ncnn::VkCompute> take(const ::ncnn::VulkanDevice* vkdev) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (vkdev == device_ && !idle_.empty()) {
        ForkSafe<::ncnn::VkCompute> cmd = std::move(idle_.back());
        idle_.pop_back();
        ++reused_;
        return cmd;
      }
      ++made_;
    }
    return ForkSafe<::ncnn::VkCompute>(new ::ncnn::VkCompute(vkdev));
  }
  // Frees the kept ones.
  void drop() {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.clear();
  }
  // How many extracts made a new one, and how many reused one.
  std::pair<uint64_t, uint64_t> counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {made_, reused_};
  }
  // Back after its submission completed (one that failed, or never ran, may still be pending or half recorded:
  // the caller drops it). Reset here, outside the lock; kept where it resets.
  void give_back(ForkSafe<::ncnn::VkCompute> cmd, const ::ncnn::VulkanDevice* vkdev) {
    // Measurement knob: VKNORM_TUNE_FRESH_COMMAND_BUFFERS=1 keeps none (one made for every extract, as ncnn's).
    const char* fresh = std::getenv("VKNORM_TUNE_FRESH_COMMAND_BUFFERS");
    if (fresh && *fresh && std::strcmp(fresh, "0") != 0) return;
    if (cmd->reset() != 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (vkdev != device_) {
      idle_.clear();
      device_ = vkdev;
    }
    if (idle_.size() < kMaxIdle) idle_.push_back(std::move(cmd));
  }

 private:
  static constexpr size_t kMaxIdle = 8;  // as many as threads extract at once, about
  std::mutex mutex_;
  const ::ncnn::VulkanDevice* device_ = nullptr;
  std::vector<ForkSafe<::ncnn::VkCompute>> idle_;
  uint64_t made_ = 0, reused_ = 0;
};

// A Net that owns its ncnn::Net; vknorm=true registers vknorm's layers before anything is loaded, and
// fuse=true (with vknorm) loads every .param through vknorm's graph rewrite (vknorm::ncnn::fuse_param).

// ncnn's Option switches this module knows: bound on Option by name where settable, and those ncnn's load fixes:
// load_param and load_model decide formats, weights and pipelines from them, so a change after load_param is refused.
enum class FixedAtLoad { No, Always, InVulkanNet };
struct OptionSwitch {
  const char* name;
  bool ::ncnn::Option::*field;
  bool settable;
  FixedAtLoad fixed;
};
constexpr OptionSwitch kOptionSwitches[] = {
    {"use_vulkan_compute", &::ncnn::Option::use_vulkan_compute, true, FixedAtLoad::Always},
    {"use_fp16_storage", &::ncnn::Option::use_fp16_storage, true, FixedAtLoad::Always},
    {"use_fp16_packed", &::ncnn::Option::use_fp16_packed, true, FixedAtLoad::Always},
    {"use_fp16_arithmetic", &::ncnn::Option::use_fp16_arithmetic, true, FixedAtLoad::Always},
    {"use_bf16_storage", &::ncnn::Option::use_bf16_storage, true, FixedAtLoad::Always},
    {"use_bf16_packed", &::ncnn::Option::use_bf16_packed, true, FixedAtLoad::Always},
    {"use_packing_layout", &::ncnn::Option::use_packing_layout, true, FixedAtLoad::Always},
    {"use_int8_inference", &::ncnn::Option::use_int8_inference, false, FixedAtLoad::Always},  // no int8 in this ncnn
    // how ncnn's own Convolution / Deconvolution layers compute, CPU and Vulkan: load_model builds weights and
    // pipelines for them, and the Vulkan forward reads them again (on after the load: pipelines never built)
    {"use_winograd_convolution", &::ncnn::Option::use_winograd_convolution, true, FixedAtLoad::Always},
    {"use_winograd23_convolution", &::ncnn::Option::use_winograd23_convolution, true, FixedAtLoad::Always},
    {"use_winograd43_convolution", &::ncnn::Option::use_winograd43_convolution, true, FixedAtLoad::Always},
    {"use_winograd63_convolution", &::ncnn::Option::use_winograd63_convolution, true, FixedAtLoad::Always},
    {"use_sgemm_convolution", &::ncnn::Option::use_sgemm_convolution, true, FixedAtLoad::Always},
    // ncnn turns these off at load_param where the device lacks them, and builds no pipelines for them: on again
    // after the load, an extract crashed (a CPU net ignores them)
    {"use_shader_local_memory", &::ncnn::Option::use_shader_local_memory, true, FixedAtLoad::InVulkanNet},
    {"use_subgroup_ops", &::ncnn::Option::use_subgroup_ops, true, FixedAtLoad::InVulkanNet},
    {"use_cooperative_matrix", &::ncnn::Option::use_cooperative_matrix, true, FixedAtLoad::InVulkanNet},
    {"lightmode", &::ncnn::Option::lightmode, true, FixedAtLoad::No},
};

// A kv cache's shape as a Mat gives it: tokens (h; 0: empty), and its heads and head size (dims, w, c).
struct CacheShape {
  int tokens = 0, dims = 0, w = 0, c = 0;
  bool same_heads(const CacheShape& o) const { return dims == o.dims && w == o.w && c == o.c; }
  std::string describe() const {
    return dims == 3 ? std::to_string(c) + " heads of " + std::to_string(w) + " (dims 3, w " + std::to_string(w) +
                           ", c " + std::to_string(c) + ")"
                     : "of dims " + std::to_string(dims) + ", w " + std::to_string(w) + ", c " + std::to_string(c);
  }
};

struct Net {
  // first: it outlives the layers made from it (owned_net's)
  PythonLayerTypes python_layers;
  Net(bool vknorm, bool fuse) : vknorm(vknorm), fuse(vknorm && fuse) {
    if (vknorm) {
      int r;
      {
        QuietStderr quiet;
        r = vknorm::ncnn::register_layers(net);
      }
      if (r != 0) throw std::runtime_error("registering vknorm's layers failed");
      using vknorm::NormOp;
      for (const NormOp op : {NormOp::LayerNorm, NormOp::RMSNorm, NormOp::GroupNorm, NormOp::InstanceNorm})
        custom_slots = std::max(custom_slots, net.custom_layer_to_index(vknorm::ncnn::fused_name(op)) + 1);
    }
    option_owners()[&net.opt] = this;
  }
  ~Net() {
    option_owners().erase(&net.opt);
    free_orphans();
    vknorm_python::NetGoing going;
    owned_net.reset();  // its layers go now, Python's among them: what they raise is this net's
  }
  // An extractor of this net let go while its thread held another net and this one was busy (~Extractor), with the
  // allocators its blobs came from: freed where the net is held whole, or at its end.
  struct Orphan {
    ForkSafe<::ncnn::Extractor> ex;
    std::shared_ptr<void> allocators, host_blobs, host_workspace;
  };
  void orphan(Orphan o) {
    std::lock_guard<std::mutex> l(orphans_mutex);
    orphans.push_back(std::move(o));
  }
  void free_orphans() {
    std::vector<Orphan> gone;
    {
      std::lock_guard<std::mutex> l(orphans_mutex);
      gone.swap(orphans);
    }
    for (Orphan& o : gone) o.ex.reset();  // before its allocators (the members after it)
  }
  std::mutex orphans_mutex;
  std::vector<Orphan> orphans;
  // The caches a Vulkan net's attention layers hand out, by (layer index, slot: 1 key, 2 value), in this generation
  // of the net: ncnn's Vulkan attention reads a past cache as its own whatever its heads and head size, so one of
  // another shape than the layer makes is refused once that is known (a first step from such a cache is not).
  void made_device_cache(int layer, int slot, const CacheShape& shape) {
    std::lock_guard<std::mutex> l(device_caches_mutex);
    if (device_caches_generation != generation) device_caches.clear(), device_caches_generation = generation;
    device_caches[{layer, slot}] = shape;
  }
  std::optional<CacheShape> device_cache_shape(int layer, int slot) {
    std::lock_guard<std::mutex> l(device_caches_mutex);
    if (device_caches_generation != generation) return std::nullopt;
    const auto it = device_caches.find({layer, slot});
    return it == device_caches.end() ? std::nullopt : std::optional<CacheShape>(it->second);
  }
  std::mutex device_caches_mutex;
  uint64_t device_caches_generation = 0;
  std::map<std::pair<int, int>, CacheShape> device_caches;
  Net(const Net&) = delete;
  Net& operator=(const Net&) = delete;
  // The net whose ncnn::Net holds an Option (Net.opt gives it, keeping the net alive): for the garbage collector.
  static std::unordered_map<const ::ncnn::Option*, const Net*>& option_owners() {
    static auto* owners = new std::unordered_map<const ::ncnn::Option*, const Net*>;
    return *owners;
  }
  // Loading and clearing take it whole; extractors share it while they run (ncnn's Net is not safe to
  // load or clear under a running extractor).
  mutable NetLock lock;
  // Counts loads and clears: an extractor made before one runs on layers that are gone (ncnn hangs or crashes).
  uint64_t generation = 0;
  // path: a .param file; text: its contents (load_param_mem)
  int load_param(const std::string& path) { return load_param_from(path, nullptr); }
  int load_param_mem(const std::string& text) {
    refuse_nul(text, "the text", "load_param_mem: ");
    return load_param_from("load_param_mem", &text);
  }
  int load_param_from(const std::string& path, const std::string* text) {
    return load_param_by([&] { return read_param(path, text); });
  }
  // ncnn2mem's .param.bin: read by ncnn's own load_param_bin, then named by index (blobs and layers "0", "1", ...)
  int load_param_bin(const std::string& path) { return load_param_by([&] { return read_param_bin(path); }); }
  template <class Read>
  int load_param_by(Read&& read) {
    ++generation;
    model_loaded = false;
    const int r = read();
    param_loaded = r == 0;
    param_options = param_loaded ? format_options(net.opt) : "";
    return r;
  }
  int load_model(const std::string& path) {
    if (!begin_model_load("load_model")) return -1;
    // As ncnn's load_model(path), and how far its layers read (a .bin longer than that: one for another model?)
    FILE* fp = std::fopen(path.c_str(), "rb");
    if (!fp) {
      NCNN_LOGE("fopen %s failed", path.c_str());
      return -1;
    }
    ::ncnn::DataReaderFromStdio reader(fp);
    const int r = net.load_model(reader);
    const long at = std::ftell(fp);
    std::fclose(fp);
    return model_read(r, at > 0 ? size_t(at) : 0);
  }
  // pyncnn's load_model_mem: the weights from bytes in memory, read no further than their end (pyncnn's reader has
  // no end: a short buffer is read past) and copied (the net keeps no reference to the caller's bytes).
  int load_model_mem(const unsigned char* data, size_t size) {
    return load_model_reading("load_model_mem", BoundedMemoryReader(data, size));
  }
  int load_model_zeros() { return load_model_reading("load_model", ZeroReader()); }
  // A reader that counts what the layers read (consumed()).
  template <class Reader>
  int load_model_reading(const char* call, const Reader& reader) {
    if (!begin_model_load(call)) return -1;
    const int r = net.load_model(reader);
    return model_read(r, reader.consumed());
  }
  // A load starts: the net holds no model until it succeeds. ncnn picks the device and each layer's kind (Vulkan or
  // not) at load_param: a model loaded under other options crashes it (in load_model, or at the first extract).
  bool begin_model_load(const char* call) {
    ++generation;
    model_loaded = false;
    model_bytes_read = 0;
    if (!param_loaded) {  // ncnn would load the weights into an earlier model's layers and say 0
      NCNN_LOGE("vknorm.graph: %s: load_param has not succeeded on this Net", call);
      return false;
    }
    if (!threads_ok(call)) return false;
    if (format_options(net.opt) == param_options) return true;
    NCNN_LOGE("vknorm.graph: %s: net.opt changed after load_param (%s -> %s); set options before load_param, as in "
              "ncnn", call, param_options.c_str(), format_options(net.opt).c_str());
    return false;
  }
  int model_read(int r, size_t bytes_read) {
    model_bytes_read = bytes_read;
    model_loaded = param_loaded && r == 0;
    return r;
  }
  void clear() {
    ++generation;
    commands.drop();  // a cleared net holds nothing on the device (ncnn's instance may go next)
    net.clear();
    fused.clear(), unfused_blobs.clear();
    param_loaded = model_loaded = false;
    model_bytes_read = 0;
  }
  // ncnn builds every layer's pipelines in load_model, for the options it finds then: an extractor of a net
  // whose model did not load, or whose format options changed after it, runs layers with no pipelines
  // (ncnn crashes there). Refused with what to do instead.
  void check_runnable() const {
    if (!param_loaded) throw std::runtime_error("create_extractor: load_param has not succeeded on this Net");
    if (!model_loaded) throw std::runtime_error("create_extractor: load_model has not succeeded on this Net");
    if (!threads_in_range())
      throw std::runtime_error("create_extractor: net.opt.num_threads must be 1.." + std::to_string(kMaxThreads) +
                               ", got " + std::to_string(net.opt.num_threads));
    if (format_options(net.opt) != param_options)
      throw std::runtime_error("create_extractor: net.opt changed after load_model (" + param_options + " -> " +
                               format_options(net.opt) + "); set options before load_param, as in ncnn");
  }
  // num_threads within 1..kMaxThreads (mat_layout.h): load_model's CPU layers make that many threads already.
  bool threads_in_range() const { return thread_count_ok(net.opt.num_threads); }
  bool threads_ok(const char* call) const {
    if (threads_in_range()) return true;
    NCNN_LOGE("vknorm.graph: %s: net.opt.num_threads must be 1..%d, got %d", call, kMaxThreads, net.opt.num_threads);
    return false;
  }
  static std::string format_options(const ::ncnn::Option& o) {
    std::string s;
    for (const OptionSwitch& sw : kOptionSwitches)
      if (sw.fixed == FixedAtLoad::Always || (sw.fixed == FixedAtLoad::InVulkanNet && o.use_vulkan_compute))
        s += std::string(s.empty() ? "" : " ") + sw.name + "=" + (o.*sw.field ? "1" : "0");
    return s;
  }
  int read_param(const std::string& path, const std::string* text) {
    const int ret = read_param_text(path, text);
    // A type registered by a custom index alone is binary params' numbering: text params reach its index only by
    // the name of the type that held it before (one of vknorm's fused types), which it does not run.
    for (size_t i = 0; ret == 0 && i < net.layers().size(); ++i)
      if (python_layers.made_by_index(net.layers()[i])) {
        const ::ncnn::Layer* layer = net.layers()[i];
        NCNN_LOGE("%s: layer %s of type %s: its index %d runs a Python layer type registered by that index "
                  "(Net.register_custom_layer): load text params on a net without that registration", path.c_str(),
                  layer->name.c_str(), layer->type.c_str(), layer->typeindex);
        net.clear();
        fused.clear(), unfused_blobs.clear();
        return -1;
      }
    return ret;
  }
  int read_param_text(const std::string& path, const std::string* text) {
    fused.clear(), unfused_blobs.clear();
    if (fuse)
      return text ? vknorm::ncnn::load_param_mem_fused(net, text->c_str(), &fused, &unfused_blobs)
                  : vknorm::ncnn::load_param_fused(net, path.c_str(), &fused, &unfused_blobs);
    const int ret = text ? net.load_param_mem(text->c_str()) : net.load_param(path.c_str());
    // A bottom named by an empty word (a NUL at its start) finds the next blob ncnn makes
    if (ret == 0 && !blobs_in_order(path, " (a blob name that starts with a NUL byte?)")) return -1;
    if (ret != 0 && !vknorm) {  // a fused model in a stock net: say what it needs ("not exists or registered")
      const std::string layer = text ? vknorm::ncnn::first_fused_layer(*text)
                                     : vknorm::ncnn::first_fused_layer_in_file(path.c_str());
      if (!layer.empty())
        NCNN_LOGE("%s %s, a fused vknorm layer: load this model with vknorm's layers registered (vknorm.graph.Net(), "
                  "vknorm::ncnn::register_layers)", path.c_str(), layer.c_str());
    }
    return ret;
  }
  int read_param_bin(const std::string& path) {
    fused.clear(), unfused_blobs.clear();
    const int ret = net.load_param_bin(path.c_str());  // (ncnn logs why it fails)
    if (ret != 0) return ret;
    vknorm::ncnn::name_by_index(net);
    return blobs_in_order(path, "") ? 0 : -1;
  }
  // Each blob made by one layer, before any layer reads it, as text params say: ncnn's forward crashes on a layer that
  // reads its own output (a cycle), a later layer's is out of the order text params give, and a blob two layers make
  // (binary params) holds whichever ran last. Refused (the net cleared).
  bool blobs_in_order(const std::string& path, const char* hint) {
    const std::vector<::ncnn::Layer*>& layers = net.layers();
    const std::vector<::ncnn::Blob>& blobs = net.blobs();
    for (size_t i = 0; i < layers.size(); ++i) {
      for (const int b : layers[i]->bottoms)
        if (blobs[size_t(b)].producer >= int(i)) {
          NCNN_LOGE("%s: layer %s reads blob %s, which it or a later layer makes%s", path.c_str(),
                    layers[i]->name.c_str(), blobs[size_t(b)].name.c_str(), hint);
          net.clear();
          return false;
        }
      for (const int t : layers[i]->tops)
        if (blobs[size_t(t)].producer != int(i)) {
          NCNN_LOGE("%s: layers %s and %s both make blob %s", path.c_str(), layers[i]->name.c_str(),
                    layers[size_t(blobs[size_t(t)].producer)]->name.c_str(), blobs[size_t(t)].name.c_str());
          net.clear();
          return false;
        }
    }
    return true;
  }
  ForkSafe<::ncnn::Net> owned_net{new ::ncnn::Net};
  ::ncnn::Net& net = *owned_net;
  RecycledCommands commands;  // ncnn's devices outlive it and the net, whichever goes first
  bool vknorm, fuse;
  // ncnn's count of the net's own (custom) types: a type registered by name takes the next index (256 + that
  // count), and register_layer's index raises the count to past its own. ncnn numbers at most 256 of them.
  int custom_slots = 0;
  void count_custom_index(int typeindex) {  // a type registered by that index (256 + j) counts up to j
    custom_slots = std::max(custom_slots, typeindex - ::ncnn::LayerType::CustomBit + 1);
  }
  std::vector<vknorm::ncnn::FusedPattern> fused;  // what the last load_param fused
  // A fused net's blobs by the unfused model's index (what an index from the model's own .param means; the
  // rewrite renumbers blobs): extract/input by index go through it. Empty when not fused.
  std::vector<std::string> unfused_blobs;
  bool param_loaded = false;
  // format_options at the last successful load_param; load_model refuses others, so a loaded model has them
  std::string param_options;
  bool model_loaded = false;
  size_t model_bytes_read = 0;  // of the last load_model's file or load_model_mem's bytes, what the layers read
};

// Runs f with the net held shared (no clear or load halfway through) and the GIL released while waiting for
// it; f builds plain C++ values, turned into Python objects after.
template <class F>
auto reading(const Net& n, F&& f) {
  ReleaseGil release;
  std::shared_lock<NetLock> lock(n.lock);
  return f();
}

// Runs f with the net held whole (no extract running: loads, clears, option and device changes), the GIL
// released while waiting for it.
template <class F>
auto writing(Net& n, F&& f) {
  ReleaseGil release;
  std::unique_lock<NetLock> lock(n.lock);
  n.free_orphans();
  return f();
}

// load_param / load_param_mem / load_model: in the process that first ran a Vulkan net (check_vulkan_process).
// What a Python layer raised as it was made, loaded or destroyed is raised after.
template <class F>
int loading(Net& n, F&& f) {
  const int r = writing(n, [&] {
    check_vulkan_process(n.net.opt);
    return f();
  });
  vknorm_python::raise_python_layer_error();
  return r;
}

// A FusedPattern copied under the net's lock, as a type of this module's own (a std::vector of vknorm's type
// here would instantiate templates this module exports).
struct FusedCopy {
  std::string pattern;
  std::vector<std::string> layers;
};

template <class Patterns>
nb::list fused_list(const Patterns& fused) {
  nb::list out;
  for (const auto& f : fused) {
    nb::dict d;
    d["pattern"] = f.pattern;
    d["layers"] = f.layers;
    out.append(d);
  }
  return out;
}

// The blob and staging allocators a Vulkan extractor uses, acquired from ncnn's device as ncnn's
// Extractor acquires them itself, and given back when the extractor goes.
struct Allocators {
  const ::ncnn::VulkanDevice* vkdev = nullptr;
  ::ncnn::VkAllocator* blob = nullptr;
  ::ncnn::VkAllocator* staging = nullptr;
  explicit Allocators(const ::ncnn::VulkanDevice* d)
      : vkdev(d), blob(d->acquire_blob_allocator()), staging(d->acquire_staging_allocator()) {}
  ~Allocators() {
    vkdev->reclaim_blob_allocator(blob);
    vkdev->reclaim_staging_allocator(staging);
  }
  Allocators(const Allocators&) = delete;
  Allocators& operator=(const Allocators&) = delete;
};

// ncnn's kv-cache form (SDPA or MultiHeadAttention with 7=1): three tops (the output, then the key and value caches)
// and the past caches read as the last two bottoms. A decoder's first step gives those past caches empty. ncnn keeps
// no params after load; these two layers' load_param sets support_batch exactly when kv_cache is on.
bool is_kv_cache_layer(const ::ncnn::Layer& layer) {
  return (layer.type == "SDPA" || layer.type == "MultiHeadAttention") && layer.support_batch &&
         layer.tops.size() == 3 && layer.bottoms.size() >= 3;
}

// Where a layer runs in this net: ncnn's host layer in a CPU net, or one a Vulkan net keeps on the host.
bool runs_on_host(const ::ncnn::Layer& layer, bool vulkan_net) {
  return !vulkan_net || vknorm::ncnn::runs_on_host(layer);
}

// The element count from one channel to the next of a Mat of m's shape made plain (ncnn's create).
size_t plain_cstep(const ::ncnn::Mat& m) {
  if (m.dims <= 2) return size_t(m.w) * size_t(m.h);
  return ::ncnn::alignSize(size_t(m.w) * m.h * m.d * m.elemsize, 16) / m.elemsize;
}

// The kv caches host layers make. Extractors of nets with such a layer give ncnn this allocator as kvcache_allocator,
// so ncnn treats the caches as caches (no layout conversion; an SDPA appends the next tokens in place) and vknorm
// knows each one's memory for as long as it lives (process-wide: a cache outlives its net, and may go on in another
// net of its model). ncnn keeps such a cache in its own layout (x86 packs the keys in panels; its capacity past h is
// room for the next tokens), so only the Mat extract gave reads right, in the slot of the layer that made it, and once
// where a step grows it in place: a second step from it would append over the first's tokens.
class HostKvCaches final : public ::ncnn::Allocator {
 public:
  void* fastMalloc(size_t size) override { return ::ncnn::fastMalloc(size); }
  void fastFree(void* ptr) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      entries_.erase(ptr);
    }
    ::ncnn::fastFree(ptr);
  }
  // Which cache of which layer of which model: the layer by its place among the net's kv-cache layers (the same in
  // every net of a model, fused or not; names may repeat), key (1) or value (2) as the layer's tops number them, and
  // the model by its weight bytes (two sizes of one model family share names). A cache of other head sizes would be
  // appended to past its rows; another's, read as garbage.
  struct Maker {
    int kv_layer, slot;
    size_t model_bytes;
    std::string name;  // the layer's, for messages
    bool operator==(const Maker& o) const {
      return kv_layer == o.kv_layer && slot == o.slot && model_bytes == o.model_bytes;
    }
    std::string describe() const {
      return std::string(slot == 1 ? "key" : "value") + " cache of layer " + name + " (kv-cache layer " +
             std::to_string(kv_layer) + ") of a model of " + std::to_string(model_bytes) + " weight bytes";
    }
  };
  // The extract of extractor `step` (a serial) gave m, a cache `maker` made: a new one, or one grown in place past
  // what its memory held before (an extract of an earlier step's header of the same memory changes nothing).
  void made(const ::ncnn::Mat& m, const Maker& maker, uint64_t step) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = entries_.find(m.data);
    if (it != entries_.end() && it->second.h >= m.h) return;
    entries_[m.data] = Entry{m.w, m.h, m.c, m.cstep, m.elemsize, maker, step};
  }
  // The serial of the extractor whose step made m as it is (0: not a cache known here).
  uint64_t made_in(const ::ncnn::Mat& m) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = entries_.find(m.data);
    return it == entries_.end() ? 0 : it->second.made_in;
  }
  // Why m cannot go on as the past cache `reader` reads ("" when it can).
  std::string usable(const ::ncnn::Mat& m, const Maker& reader) {
    std::lock_guard<std::mutex> lock(mutex_);
    return refusal(m, reader, nullptr);
  }
  // usable(), and then m is `step`'s until it ran (went_on) or did not (release): another step that would run on it
  // meanwhile is refused, in whatever thread.
  std::string claim(const ::ncnn::Mat& m, const Maker& reader, const void* step) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string why = refusal(m, reader, step);
    if (why.empty()) entries_.at(m.data).step = step;
    return why;
  }
  void release(const ::ncnn::Mat& m, const void* step) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = entries_.find(m.data);
    if (it != entries_.end() && it->second.step == step) it->second.step = nullptr;
  }
  // `step` ran on m and appended its tokens to m's memory in place: that memory as it was at m.h is gone.
  void went_on(const ::ncnn::Mat& m, const void* step) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = entries_.find(m.data);
    if (it == entries_.end() || it->second.step != step) return;
    it->second.step = nullptr;
    if (it->second.h == m.h) it->second.gone_on = true;
  }

 private:
  struct Entry {
    int w, h, c;
    size_t cstep, elemsize;
    Maker maker;
    uint64_t made_in;            // the serial of the extractor whose step made it
    bool gone_on = false;        // a step appended to this memory as it was at h
    const void* step = nullptr;  // the step running on it now (claim)
  };
  std::string refusal(const ::ncnn::Mat& m, const Maker& reader, const void* step) const {
    const auto it = entries_.find(m.data);
    const Entry* e = it == entries_.end() ? nullptr : &it->second;
    if (!e || e->w != m.w || e->c != m.c || e->cstep != m.cstep || e->elemsize != m.elemsize || m.h > e->h)
      return "a past kv cache read by a host layer must be the Mat an earlier step's extract gave, as it came: ncnn "
             "keeps it in its own layout (one made from numpy, cloned, or downloaded from a Vulkan net reads as "
             "garbage)";
    if (!(e->maker == reader))
      return "this is the " + e->maker.describe() + "; it goes back there (here: the " + reader.describe() + ")";
    if (m.h < e->h || e->gone_on || (e->step && e->step != step))
      return "this cache went on to a step already: ncnn appends the next tokens to a CPU cache in place, so it goes "
             "on once; give the latest step's cache (decode branches in a Vulkan net, whose caches are copies)";
    return "";
  }
  std::mutex mutex_;
  std::unordered_map<void*, Entry> entries_;  // by the memory's address, while it lives
};

HostKvCaches& host_kv_caches() {
  static HostKvCaches* caches = new HostKvCaches;  // never destroyed: caches may be freed after static destruction
  return *caches;
}

// Which blobs an extractor holds, followed as ncnn's forward_layer changes them: extract(X) runs X's producer
// after its inputs' producers, recursively, and in light mode (ncnn's default) each layer then frees its inputs.
// An extract that would need a blob an earlier extract freed (a given input included) is refused here: ncnn
// would recompute from the freed blob and return an empty Mat as a success, -100, or crash in a stock Vulkan
// layer (SIGFPE).
class HeldBlobs {
 public:
  // input(name) sets the first blob of that name, as ncnn's name lookup finds it (a later top may reuse the name).
  void give(const ::ncnn::Net& net, const std::string& name) {
    size_to(net);
    const int i = vknorm::ncnn::blob_index(net, name.c_str());
    if (i >= 0) held_[size_t(i)] = given_[size_t(i)] = 1;
  }
  // An extract's plan: the blobs held after it (per blob index) and the layers it runs (per layer index).
  struct Plan {
    std::vector<char> held, ran;
  };
  // Why extracting `name` cannot run ("" when it can; what it would do then goes to `after`).
  std::string plan(const ::ncnn::Net& net, const std::string& name, bool lightmode, bool vulkan_net, Plan& after) {
    size_to(net);
    after.held = held_;
    after.ran.assign(net.layers().size(), 0);
    for (int i = 0; i < int(after.held.size()); ++i)
      if (net.blobs()[i].name == name) return compute(net, i, lightmode, vulkan_net, after);
    return "";  // an unknown name: ncnn's own error
  }
  void commit(Plan&& after) { held_ = std::move(after.held); }
  // After an extract that failed partway: the layers that ran had freed their inputs, a leading part of the
  // plan's order, so every blob freed is among the plan's. Held now only where held before and after the plan.
  void commit_failed(const Plan& after) {
    for (size_t i = 0; i < held_.size() && i < after.held.size(); ++i) held_[i] = held_[i] && after.held[i];
  }
  void clear() { held_.clear(), given_.clear(); }
  // Whether input() set blob b (by index), or the blob this name finds (its first).
  bool given(int b) const { return b >= 0 && b < int(given_.size()) && given_[b]; }
  bool given(const ::ncnn::Net& net, const std::string& name) const {
    return given(vknorm::ncnn::blob_index(net, name.c_str()));
  }

 private:
  void size_to(const ::ncnn::Net& net) { held_.resize(net.blobs().size()), given_.resize(net.blobs().size()); }
  std::string compute(const ::ncnn::Net& net, int b, bool lightmode, bool vulkan_net, Plan& plan) const {
    std::vector<char>& held = plan.held;
    static const std::string freed =
        "a blob it needs was freed by a layer that ran before (light mode: each layer frees its inputs); extract it "
        "before the blobs that depend on it, from a new extractor, or with light mode off (net.opt.lightmode, "
        "Extractor.set_light_mode)";
    if (held[b]) return "";
    // A blob set with input() and freed since is not made again from upstream: that would be another value.
    if (given_[b])
      return lightmode ? freed : "ncnn frees a kv-cache layer's past caches once it ran, whatever light mode says; "
                                 "the Mat given is the caller's";
    const int p = net.blobs()[b].producer;
    if (p < 0 || p >= int(net.layers().size())) return freed;
    const ::ncnn::Layer* layer = net.layers()[p];
    if (layer->type == "Input") return freed;  // given by input(), or freed since
    // A layer with several outputs writes them all: one set with input() would silently become the layer's value.
    // A fused layer's later outputs are the sum its norm is computed from: one given there, even if freed since,
    // stood for the norm's input in the model, which running the layer would replace with the sum of upstream.
    for (int top : layer->tops)
      if (top >= 0 && top < int(held.size()) && given_[top] &&
          (held[top] || (vknorm::ncnn::is_vknorm_layer(layer) && top != layer->tops[0])))
        return "layer " + layer->name + " (" + layer->type + ") would overwrite blob " + net.blobs()[top].name +
               ", set with input(); give the blobs it needs instead, or use a new extractor";
    for (int bottom : layer->bottoms) {
      if (bottom < 0 || bottom >= int(held.size())) return freed;
      if (std::string why = compute(net, bottom, lightmode, vulkan_net, plan); !why.empty()) return why;
    }
    // A blob read twice by one layer with no Split between: making the second input may have freed the first.
    for (int bottom : layer->bottoms)
      if (!held[bottom]) return freed;
    for (int top : layer->tops)
      if (top >= 0 && top < int(held.size())) held[top] = 1;
    plan.ran[size_t(p)] = 1;
    if (lightmode)
      for (int bottom : layer->bottoms) held[bottom] = 0;
    // ncnn frees a host kv layer's past caches (memory of its kvcache_allocator) whatever light mode says
    if (!lightmode && is_kv_cache_layer(*layer) && runs_on_host(*layer, vulkan_net))
      for (size_t i = layer->bottoms.size() - 2; i < layer->bottoms.size(); ++i) held[layer->bottoms[i]] = 0;
    return "";
  }
  std::vector<char> held_, given_;  // per blob index
};

// Host memory for one extractor's blobs and scratch: ncnn's aligned malloc, no pool. (ncnn's pool allocators
// record a failed allocation as a block in use, and print "FATAL ERROR! ... destroyed too early" when dropped
// after a model asked for more memory than the host has.)
class HostAllocator final : public ::ncnn::Allocator {
 public:
  void* fastMalloc(size_t size) override { return ::ncnn::fastMalloc(size); }
  void fastFree(void* ptr) override { ::ncnn::fastFree(ptr); }
};

struct Extractor {
  std::shared_ptr<Net> owner;  // the net outlives its extractors
  ForkSafe<::ncnn::Extractor> ex;
  std::shared_ptr<Allocators> allocators;  // Vulkan nets; released after ex (declared after it)
  // Host blobs and scratch of this extractor's own, not the net's: Net.clear deletes the net's, and an
  // extractor made before it would free its blobs into them when dropped (a use after free). An output
  // in them is copied out (extract).
  std::shared_ptr<HostAllocator> host_blobs = std::make_shared<HostAllocator>();
  std::shared_ptr<HostAllocator> host_workspace = std::make_shared<HostAllocator>();
  std::unique_ptr<std::mutex> mutex = std::make_unique<std::mutex>();  // one call at a time (ncnn's Extractor is not thread-safe)
  HeldBlobs held;                                                      // blobs ncnn's extractor holds now, and those input() set
  // the net's when this was made (its lightmode: set_light_mode's since): ncnn's extractor runs on its own copy, so
  // do its uploads here
  ::ncnn::Option opt;
  // Vulkan nets: what extract downloaded, by blob name. ncnn's own extract keeps the downloaded copy, so a blob
  // extracted before comes back after light mode freed its device copy (pyncnn's behaviour).
  std::map<std::string, ::ncnn::Mat> downloaded;
  bool failed = false;  // a Vulkan extract failed (extractor_extract)
  // Host kv caches given to input(), by blob index, until the layer reading them runs (HostKvCaches: once)
  std::map<int, ::ncnn::Mat> given_caches;
  // Past caches given to a Vulkan net's attention (input(), or left unset and given empty), by blob index: their
  // shapes (tokens 0: empty)
  std::map<int, CacheShape> given_device_caches;
  // Blobs whose last input() was refused: never taken as left unset (give_unset_past_caches), so an extract that needs
  // one is refused rather than run on an empty past beside the step's own mask (ncnn's SDPA overruns its heap there)
  std::set<int> refused_inputs;
  // clear() or the end of its with block: ncnn's extractor holds no blobs any more (atomic: blob_name reads it
  // under the net's lock alone)
  std::unique_ptr<std::atomic<bool>> cleared = std::make_unique<std::atomic<bool>>(false);
  uint64_t generation = 0;                                             // the net's, when this was made
  // this extractor's among all made in the process: which step made a kv cache (HostKvCaches)
  uint64_t serial = next_serial();
  // whether a host kv-cache layer's caches feed other layers (kv_caches_read_by_layers), for light mode off
  bool kv_caches_fed = false;
  static uint64_t next_serial() {
    static std::atomic<uint64_t> last{0};
    return ++last;
  }

  // Whether the net was loaded or cleared since this extractor was made (logged; the caller returns -1).
  bool stale(const char* call) const {
    if (*cleared) {
      NCNN_LOGE("vknorm.graph: Extractor.%s: this extractor was cleared (clear(), or the end of its with block); "
                "create a new one", call);
      return true;
    }
    if (generation == owner->generation) return false;
    NCNN_LOGE("vknorm.graph: Extractor.%s: the net was loaded or cleared after this extractor was created; "
              "create a new one", call);
    return true;
  }

  // ncnn's extractor gives its blobs back to the net's allocators: not while the net loads or clears.
  ~Extractor() {
    if (!ex || in_forked_child()) return;  // moved from; or left alone (ForkSafe), the net's lock not waited for
    if (owner->lock.held_by_this_thread()) {  // let go by a Python layer of this net: the lock is this thread's
      ex.reset();
      return;
    }
    if (NetLock::this_thread_holds_one()) {
      // Let go while this thread holds another net (by a Python layer's code, or with a layer or its error as the
      // net lets them go): another thread may hold this one's net and wait for the first (its layer letting an
      // extractor of it go). Never waited for: where the net is busy, it frees this one at its next load or clear,
      // or at its end.
      if (!owner->lock.try_lock_shared()) {
        owner->orphan({std::move(ex), allocators, host_blobs, host_workspace});
        return;
      }
      ex.reset();
      owner->lock.unlock_shared();
      return;
    }
    std::optional<ReleaseGil> release;
    if (PyGILState_Check()) release.emplace();  // never wait for the net's lock holding the GIL
    std::shared_lock<NetLock> lock(owner->lock);
    ex.reset();
  }
  Extractor(std::shared_ptr<Net> n, ForkSafe<::ncnn::Extractor> e, std::shared_ptr<Allocators> a)
      : owner(std::move(n)), ex(std::move(e)), allocators(std::move(a)) {}
  Extractor(Extractor&&) = default;
};

// The layers that read blob b as their past kv cache, when nothing else reads it (the one place ncnn's layers take an
// empty blob): those running on the host (the first of them named) and on Vulkan.
struct PastCacheReaders {
  const ::ncnn::Layer* host = nullptr;
  int host_index = -1;  // host's, in net.layers()
  bool device = false;
  bool any() const { return host || device; }
};
PastCacheReaders past_cache_readers(const ::ncnn::Net& net, int b, bool vulkan_net) {
  PastCacheReaders readers;
  for (size_t l = 0; l < net.layers().size(); ++l) {
    const ::ncnn::Layer* layer = net.layers()[l];
    for (size_t i = 0; i < layer->bottoms.size(); ++i) {
      if (layer->bottoms[i] != b) continue;
      if (!is_kv_cache_layer(*layer) || i + 2 < layer->bottoms.size()) return {};
      if (!runs_on_host(*layer, vulkan_net)) {
        readers.device = true;
      } else if (!readers.host) {
        readers.host = layer;
        readers.host_index = int(l);
      }
    }
  }
  return readers;
}

// The kv-cache layer whose cache blob b is (directly, or through Splits, which share its memory), and which of its
// caches (1: key, 2: value, as its tops number them); null otherwise.
const ::ncnn::Layer* kv_cache_maker(const ::ncnn::Net& net, int b, int* slot = nullptr) {
  while (b >= 0 && b < int(net.blobs().size())) {
    const int p = net.blobs()[size_t(b)].producer;
    if (p < 0 || p >= int(net.layers().size())) return nullptr;
    const ::ncnn::Layer* layer = net.layers()[size_t(p)];
    if (is_kv_cache_layer(*layer)) {
      if (layer->tops[1] != b && layer->tops[2] != b) return nullptr;
      if (slot) *slot = layer->tops[1] == b ? 1 : 2;
      return layer;
    }
    if (layer->type != "Split" || layer->bottoms.size() != 1) return nullptr;
    b = layer->bottoms[0];
  }
  return nullptr;
}

// A kv-cache layer's place among the net's kv-cache layers.
int kv_layer_ordinal(const ::ncnn::Net& net, const ::ncnn::Layer* layer) {
  int n = 0;
  for (const ::ncnn::Layer* l : net.layers()) {
    if (l == layer) return n;
    n += is_kv_cache_layer(*l);
  }
  return -1;
}

// The slot of a kv-cache layer's past cache bottom b: 1 for the key (its second-to-last bottom), 2 for the value (its
// last); also the top it grows that cache into.
int past_slot(const ::ncnn::Layer& reader, int b) { return reader.bottoms[reader.bottoms.size() - 2] == b ? 1 : 2; }

// The cache a host layer reads from its bottom b, as HostKvCaches names the one it must be.
HostKvCaches::Maker past_cache_slot(const ::ncnn::Net& net, const ::ncnn::Layer* reader, int b, size_t model_bytes) {
  return {kv_layer_ordinal(net, reader), past_slot(*reader, b), model_bytes, reader->name};
}

// Whether a host kv-cache layer's caches are read by another layer. With light mode off ncnn still frees every blob
// of kv-cache memory a layer reads (its Splits' and what else shares that memory), which vknorm's account of the blobs
// held (HeldBlobs) cannot follow through every layer: such a net runs in light mode only.
bool kv_caches_read_by_layers(const ::ncnn::Net& net, bool vulkan_net) {
  for (const ::ncnn::Layer* layer : net.layers())
    for (int b : layer->bottoms) {
      const ::ncnn::Layer* maker = kv_cache_maker(net, b);
      if (maker && runs_on_host(*maker, vulkan_net)) return true;
    }
  return false;
}

// Whether the net has a kv-cache layer running on the host: its extractors get HostKvCaches as kvcache_allocator
// (others none: ncnn's extract refuses blobs of a batch whenever one is set).
bool has_host_kv_layer(const ::ncnn::Net& net, bool vulkan_net) {
  for (const ::ncnn::Layer* layer : net.layers())
    if (is_kv_cache_layer(*layer) && runs_on_host(*layer, vulkan_net)) return true;
  return false;
}

// Why `in` cannot be given for a blob these layers read ("" when it can): an empty Mat anywhere but a past kv cache
// (stock layers crash on an empty blob), and a past cache of the wrong kind or state for the layers reading it.
// Whether `name` is a blob of the model that fusion took out of the net (the norm's input, an activation's).
bool fused_away(const Net& n, const std::string& name) {
  return n.fuse && vknorm::ncnn::blob_index(n.net, name.c_str()) < 0 &&
         std::find(n.unfused_blobs.begin(), n.unfused_blobs.end(), name) != n.unfused_blobs.end();
}

std::string input_refusal(const ::ncnn::Net& net, int b, const ::ncnn::Mat& in, const PastCacheReaders& readers,
                          size_t model_bytes) {
  if (in.empty())
    return readers.any() ? "" : "the Mat is empty (an empty Mat is taken only for a blob read as a past kv cache "
                                "alone, by an SDPA or MultiHeadAttention with kv_cache on)";
  if (readers.device && (in.cstep != plain_cstep(in) || host_kv_caches().made_in(in) != 0))
    return "a kv cache a host layer made (ncnn's own layout) cannot feed a Vulkan layer: a cache goes back to the "
           "kind of net that made it";
  if (readers.host) return host_kv_caches().usable(in, past_cache_slot(net, readers.host, b, model_bytes));
  return "";
}

// The input blob (an Input's, or one no layer makes) that `name` depends on and that input() did not set, or "". ncnn's stock layers crash on the
// empty blob an input left unset becomes (SIGFPE, SIGSEGV); ncnn's CPU net returns -100 there.
std::string missing_input(const ::ncnn::Net& net, const HeldBlobs& held, const std::string& name) {
  const std::vector<::ncnn::Blob>& blobs = net.blobs();
  const std::vector<::ncnn::Layer*>& layers = net.layers();
  std::vector<int> todo{vknorm::ncnn::blob_index(net, name.c_str())};  // the blob the name finds
  std::vector<bool> seen(blobs.size());
  while (!todo.empty()) {
    const int b = todo.back();
    todo.pop_back();
    if (b < 0 || b >= int(blobs.size()) || seen[b] || held.given(b)) continue;
    seen[b] = true;
    const int p = blobs[b].producer;
    // an Input's blob, or one no layer makes (a bottom no earlier layer produced: ncnn's input to fill)
    if (p < 0 || p >= int(layers.size()) || layers[p]->type == "Input") return blobs[b].name;
    todo.insert(todo.end(), layers[p]->bottoms.begin(), layers[p]->bottoms.end());
  }
  return "";
}

// A decoder's first step in pyncnn may leave its past caches unset: ncnn reads an unset Input as an empty Mat, which
// a kv-cache layer takes as no past. Such Inputs (read only as past caches) are given empty here, as by input().
void give_unset_past_caches(Extractor& e) {
  const ::ncnn::Net& net = e.owner->net;
  for (const ::ncnn::Layer* layer : net.layers()) {
    if (layer->type != "Input") continue;
    for (int t : layer->tops) {
      if (e.held.given(t) || e.refused_inputs.count(t) || !past_cache_readers(net, t, e.allocators != nullptr).any())
        continue;
      const std::string& name = net.blobs()[size_t(t)].name;
      if (vknorm::ncnn::blob_index(net, name.c_str()) != t || e.ex->input(name.c_str(), ::ncnn::Mat()) != 0) continue;
      e.held.give(net, name);
      e.given_device_caches[t] = CacheShape{};
    }
  }
}

// The input the blob `name` depends on that was not given ("" when none), once the unset Inputs read only as past
// caches are given empty (give_unset_past_caches).
std::string input_not_given(Extractor& e, const std::string& name) {
  give_unset_past_caches(e);
  return missing_input(e.owner->net, e.held, name);
}

// Given past caches and the host kv-cache layer that reads each: (blob, Mat, layer).
using CachesRun = std::vector<std::tuple<int, ::ncnn::Mat, const ::ncnn::Layer*>>;

// The host kv caches given to e that the layers `plan` runs read, with each one's reader.
CachesRun caches_run_on(const Extractor& e, const HeldBlobs::Plan& plan) {
  CachesRun out;
  for (const auto& [b, mat] : e.given_caches) {
    const PastCacheReaders readers = past_cache_readers(e.owner->net, b, e.allocators != nullptr);
    if (readers.host && plan.ran[size_t(readers.host_index)]) out.emplace_back(b, mat, readers.host);
  }
  return out;
}

// Why an extract that runs `plan` cannot, for the host kv caches given to its extractor ("" when it can): one that
// went on to another step since input(), or is going on in one now, would be appended to over that step's tokens.
// Those it can run on are claimed for it until it ended (caches_ran).
std::string claim_given_caches(Extractor& e, const HeldBlobs::Plan& plan, CachesRun& caches) {
  caches = caches_run_on(e, plan);
  // A layer's key and value caches grow together, so the two given must be one step's: two sequences' caches would
  // be appended to at the key's length, inside the other's tokens, or read side by side.
  for (const auto& [b, mat, reader] : caches) {
    const int key = reader->bottoms[reader->bottoms.size() - 2], value = reader->bottoms.back();
    if (b != key && e.given_caches.count(key)) continue;  // the pair is checked at its key
    const auto k = e.given_caches.find(key), v = e.given_caches.find(value);
    const bool has_k = k != e.given_caches.end(), has_v = v != e.given_caches.end();
    if (has_k != has_v || (has_k && host_kv_caches().made_in(k->second) != host_kv_caches().made_in(v->second)))
      return "the past key and value caches given to layer " + reader->name + " are not one step's (" +
             std::to_string(has_k ? k->second.h : 0) + " and " + std::to_string(has_v ? v->second.h : 0) +
             " tokens): give the two one extract made";
  }
  for (size_t i = 0; i < caches.size(); ++i) {
    const auto& [b, mat, reader] = caches[i];
    const HostKvCaches::Maker slot = past_cache_slot(e.owner->net, reader, b, e.owner->model_bytes_read);
    if (std::string why = host_kv_caches().claim(mat, slot, &e); !why.empty()) {
      for (size_t j = 0; j < i; ++j) host_kv_caches().release(std::get<1>(caches[j]), &e);
      caches.clear();
      return "the past kv cache given for " + e.owner->net.blobs()[size_t(b)].name + ": " + why;
    }
  }
  return "";
}

// Why an extract that runs `plan` cannot, for the past caches given to a Vulkan net's attention ("" when it can).
// ncnn's Vulkan layers read the two as given, checking neither: a key of some tokens beside an empty value (one left
// unset) or one of other tokens reads past what was given, with no error. The two must hold one token count. (Which
// step made them is not known there: a Vulkan net's caches are downloaded copies, which carry nothing of it.)
std::string device_cache_pair_refusal(const Extractor& e, const HeldBlobs::Plan& plan) {
  if (!e.allocators) return "";
  const ::ncnn::Net& net = e.owner->net;
  for (size_t l = 0; l < net.layers().size(); ++l) {
    const ::ncnn::Layer& layer = *net.layers()[l];
    if (!plan.ran[l] || !is_kv_cache_layer(layer) || runs_on_host(layer, true)) continue;
    const auto k = e.given_device_caches.find(layer.bottoms[layer.bottoms.size() - 2]);
    const auto v = e.given_device_caches.find(layer.bottoms.back());
    if (k == e.given_device_caches.end() || v == e.given_device_caches.end()) continue;  // not inputs: the graph's
    if (k->second.tokens != v->second.tokens)
      return "the past key and value caches given to layer " + layer.name + " are not one step's (" +
             std::to_string(k->second.tokens) + " and " + std::to_string(v->second.tokens) +
             " tokens): give the two one extract made";
    for (const auto& [slot, given] : {std::make_pair(1, k->second), std::make_pair(2, v->second)}) {
      const std::optional<CacheShape> made = e.owner->device_cache_shape(int(l), slot);
      if (given.tokens == 0 || !made || given.same_heads(*made)) continue;
      return "the past " + std::string(slot == 1 ? "key" : "value") + " cache given to layer " + layer.name + " is " +
             given.describe() + ", where the caches this layer makes are " + made->describe() +
             ": a cache of another model or layer (ncnn's Vulkan attention would read it as its own)";
    }
  }
  return "";
}

// After the extract that ran `plan`: a cache its layer grew in place (the layer's cache out in the same memory with
// more rows: an SDPA's, not a cross-attention's, which reads its past as it is) has gone on; the others are free again.
void caches_ran(Extractor& e, const HeldBlobs::Plan& plan, const CachesRun& claimed, bool succeeded) {
  for (const auto& [b, mat, reader] : claimed) {
    // Not grown only where the cache out is seen in HostKvCaches' memory, elsewhere than mat's or at mat's h; as grown
    // where it cannot be (freed, or converted by ncnn's extract), or where its rows changed at all.
    bool grown = succeeded;
    const int top = reader->tops[size_t(past_slot(*reader, b))];
    if (succeeded && plan.held[size_t(top)]) {
      ::ncnn::Mat out;  // held: ncnn's extract hands it over without running anything
      if (e.ex->extract(top, out) == 0 && out.allocator == &host_kv_caches())
        grown = out.data == mat.data && out.h != mat.h;
    }
    if (grown) host_kv_caches().went_on(mat, &e);
    else host_kv_caches().release(mat, &e);
    if (succeeded) e.given_caches.erase(b);
  }
}

// A Vulkan extractor uploads an input when extract() first needs it: a staging buffer, then the device
// blob in the consumer's packing. ncnn drops a failed allocation there without an error, and the next
// in-place layer then dereferences the empty blob's null reference count (a crash, stock layers as
// vknorm's). Allocating both once here, then freeing them into this extractor's allocators (which keep
// the memory and hand it to the upload), turns device memory running out at the upload into ncnn's
// error code -100 from input(), before anything is recorded.
int reserve_upload(const Extractor& e, const ::ncnn::Mat& in) {
  if (!e.allocators || in.empty()) return 0;
  const ::ncnn::Option& opt = e.opt;
  const ::ncnn::GpuInfo& info = e.allocators->vkdev->info;
  // record_upload's staging: float16 (or bfloat16) already on the host for a discrete GPU, else as given.
  ::ncnn::Mat staged_like = in;
  if (in.elemsize == size_t(in.elempack) * 4u && info.type() == 0 &&
      (opt.use_bf16_storage || opt.use_bf16_packed || opt.use_fp16_storage || opt.use_fp16_packed))
    staged_like.elemsize = size_t(in.elempack) * 2u;
  ::ncnn::VkMat staging, blob;
  staging.create_like(staged_like, e.allocators->staging);
  blob.create_like(in, e.allocators->blob);  // float32 elempack 1: no smaller than any packed or float16 copy
  if (staging.empty() || blob.empty()) {
    NCNN_LOGE("vknorm.graph: out of device memory uploading an input of %zu bytes", size_t(in.total()) * in.elemsize);
    return -100;
  }
  return 0;
}

// The extract recorded into a command buffer the net kept (RecycledCommands), given back once its submission
// completed; dropped on every other way out (half recorded, or pending on a lost device).
int extract_reserving_download(Extractor& e, const std::string& name, ::ncnn::Mat& out) {
  // A blob given with input() (an Input, or an intermediate set by hand) is on the host already: ncnn hands it
  // back as given (its device copy may be an older value, made before the input() call).
  // (An Input blob not given never gets here: extractor_extract refuses it first, missing_input.)
  if (e.held.given(e.owner->net, name)) return e.ex->extract(name.c_str(), out);
  // A blob a host layer made (featmask bit 4): ncnn's extract gives it as that layer wrote it, a recorded one
  // the copy uploaded for the layers after it (float16 where the net stores float16).
  if (vknorm::ncnn::computed_on_host(e.owner->net, name.c_str())) return e.ex->extract(name.c_str(), out);
  const ::ncnn::VulkanDevice* vkdev = e.allocators->vkdev;
  ::ncnn::Option opt = e.opt;
  opt.blob_vkallocator = opt.workspace_vkallocator = e.allocators->blob;
  opt.staging_vkallocator = e.allocators->staging;
  ForkSafe<::ncnn::VkCompute> cmd = e.owner->commands.take(vkdev);
  const int r = vknorm::ncnn::extract_recorded(*e.ex, name.c_str(), out, *cmd, opt);
  if (r == 0) e.owner->commands.give_back(std::move(cmd), vkdev);
  return r;
}

// Runs f with the net held shared, then the extractor, the GIL released (so no thread waits for either while
// holding the GIL another needs): Extractor.input, extract and clear.
template <class F>
auto holding(Extractor& e, F&& f) {
  ReleaseGil release;
  std::shared_lock<NetLock> net_lock(e.owner->lock);
  std::lock_guard<std::mutex> lock(*e.mutex);
  return f();
}

// Extractor.input and extract, with holding()'s locks held.
int input_held(Extractor& e, const std::string& name, const ::ncnn::Mat& in) {
  check_vulkan_process(e.opt);
  if (e.stale("input")) return -1;
  const int b = vknorm::ncnn::blob_index(e.owner->net, name.c_str());
  if (b < 0 && fused_away(*e.owner, name)) {  // (an unknown name: ncnn's own message, which lists the inputs)
    NCNN_LOGE("vknorm.graph: Extractor.input %s: the model's blob, inside a fused pattern, is not in the fused net "
              "(its fused layer reads the add's inputs); load with Net(fuse=False) to set it", name.c_str());
    return -1;
  }
  const PastCacheReaders readers = past_cache_readers(e.owner->net, b, e.allocators != nullptr);
  if (const std::string why = input_refusal(e.owner->net, b, in, readers, e.owner->model_bytes_read); !why.empty()) {
    NCNN_LOGE("vknorm.graph: Extractor.input %s: %s", name.c_str(), why.c_str());
    if (b >= 0) e.refused_inputs.insert(b);
    return -1;
  }
  if (int r = reserve_upload(e, in)) return r;
  // The extractor outlives the Python objects: it shares a Mat's memory (ncnn copies a blob before an in-place layer
  // writes it where another reference counts), and copies a view, whose count does not see its Mat's (an in-place
  // layer would write into the caller's Mat), or a Mat that counts no references.
  const bool view = dynamic_cast<const HeldMemory*>(in.allocator) != nullptr;
  // ncnn's upload copies cstep x c elements into staging sized by w x h: a Mat padded further than its rows need is
  // copied plain first, unless a host layer reads it as its past kv cache (ncnn's own layout: nothing uploads it).
  const bool padded = e.allocators && !readers.host && in.cstep > plain_cstep(in);
  const ::ncnn::Mat owned = in.refcount && !view && !padded ? in : in.clone();
  if (owned.empty() && !in.empty()) throw std::bad_alloc();
  const int r = e.ex->input(name.c_str(), owned);
  if (r != 0) return r;
  e.held.give(e.owner->net, name);
  e.refused_inputs.erase(b);
  e.given_caches.erase(b);
  if (readers.host && !in.empty()) e.given_caches[b] = in;
  e.given_device_caches.erase(b);
  if (readers.device) e.given_device_caches[b] = in.empty() ? CacheShape{} : CacheShape{in.h, in.dims, in.w, in.c};
  if (e.allocators) {
    // A device copy made before this input() would feed the layers after it (ncnn reads the device copy
    // first): dropped, so they upload what was given.
    e.ex->input(name.c_str(), ::ncnn::VkMat());
    // Downloads made before may depend on the blob given now.
    e.downloaded.clear();
  }
  return 0;
}

std::tuple<int, ::ncnn::Mat> extract_held(Extractor& e, const std::string& name) {
  ::ncnn::Mat out;
  int r;
  std::string why;  // a refused plan's reason
  CachesRun claimed;  // the given past caches this extract runs, claimed until it ends
  check_vulkan_process(e.opt);
  if (e.stale("extract")) {
    r = -1;
  } else if (vknorm::ncnn::blob_index(e.owner->net, name.c_str()) < 0) {  // ncnn's -1, before anything is recorded: the extractor stays usable
    NCNN_LOGE("vknorm.graph: extract %s: the net has no blob of that name%s", name.c_str(),
              fused_away(*e.owner, name) ? " (the model's, inside a fused pattern: Net(fuse=False) keeps it)" : "");
    r = -1;
  } else if (e.failed) {
    NCNN_LOGE("vknorm.graph: extract %s: an earlier extract of this extractor failed, leaving ncnn's device "
              "blobs recorded but never computed; create a new extractor", name.c_str());
    r = -1;
  } else if (const std::string missing = input_not_given(e, name); !missing.empty()) {
    const bool refused = e.refused_inputs.count(vknorm::ncnn::blob_index(e.owner->net, missing.c_str())) != 0;
    NCNN_LOGE("vknorm.graph: extract %s: the input %s it depends on was %s", name.c_str(), missing.c_str(),
              refused ? "refused (Extractor.input said why)" : "not given (Extractor.input)");
    r = -1;
  } else if (auto kept = e.downloaded.find(name); kept != e.downloaded.end() && !e.held.given(e.owner->net, name)) {
    out = kept->second;
    r = 0;
  } else if (!e.opt.lightmode && e.kv_caches_fed) {
    NCNN_LOGE("vknorm.graph: extract %s: this model's kv caches feed other layers, and with light mode off ncnn frees "
              "blobs of kv-cache memory as they are read, which vknorm cannot follow: turn light mode on "
              "(net.opt.lightmode, Extractor.set_light_mode)", name.c_str());
    r = -1;
  } else if (HeldBlobs::Plan after;
             !(why = e.held.plan(e.owner->net, name, e.opt.lightmode, e.allocators != nullptr, after)).empty() ||
             !(why = device_cache_pair_refusal(e, after)).empty() ||
             !(why = claim_given_caches(e, after, claimed)).empty()) {
    NCNN_LOGE("vknorm.graph: extract %s: %s", name.c_str(), why.c_str());
    r = -1;
  } else {
    r = e.allocators ? extract_reserving_download(e, name, out) : e.ex->extract(name.c_str(), out);
    // ncnn's success with nothing in it (an empty past cache given comes back as given)
    if (r == 0 && out.empty() && !e.held.given(e.owner->net, name)) {
      NCNN_LOGE("vknorm.graph: extract %s: ncnn produced an empty blob", name.c_str());
      r = -1;
    }
    caches_ran(e, after, claimed, r == 0);
    if (r == 0) e.held.commit(std::move(after));
    else e.held.commit_failed(after);
    // A Vulkan forward that failed dropped its command buffer: the device blobs ncnn now holds were never
    // computed, so nothing more is extracted here.
    if (r != 0 && e.allocators) e.failed = true;
    if (r == 0 && e.allocators && !e.held.given(e.owner->net, name)) e.downloaded[name] = out;
  }
  // An output in this extractor's own memory is copied out: it outlives the extractor. So is one shared with
  // anything else (an input blob is the caller's own Mat): the result is the caller's alone, as pyncnn's.
  // Inside the lock: freeing into this extractor's pool races with another thread's extract.
  // A kv cache a host layer made is the exception: in HostKvCaches' memory, not this extractor's, and a copy would
  // lose ncnn's layout of it (a net whose caches feed other layers runs in light mode only: nothing writes it after).
  const bool ours = out.allocator == e.host_blobs.get() || out.allocator == e.host_workspace.get();
  const bool host_cache = r == 0 && out.allocator == &host_kv_caches();
  if (host_cache) {
    // (one a layer other than a Split made of a cache's memory is not a cache to give back: left unknown)
    int slot = 0;
    const ::ncnn::Net& net = e.owner->net;
    if (const ::ncnn::Layer* maker = kv_cache_maker(net, vknorm::ncnn::blob_index(net, name.c_str()), &slot))
      host_kv_caches().made(out, {kv_layer_ordinal(net, maker), slot, e.owner->model_bytes_read, maker->name},
                            e.serial);
  }
  if (r == 0 && e.allocators && !host_cache && !out.empty()) {
    // a Vulkan attention's cache, downloaded: the shape of the past caches that layer reads (device_cache_pair_refusal)
    int slot = 0;
    const ::ncnn::Net& net = e.owner->net;
    if (const ::ncnn::Layer* maker = kv_cache_maker(net, vknorm::ncnn::blob_index(net, name.c_str()), &slot);
        maker && !runs_on_host(*maker, true)) {
      const auto at = std::find(net.layers().begin(), net.layers().end(), maker) - net.layers().begin();
      e.owner->made_device_cache(int(at), slot, CacheShape{out.h, out.dims, out.w, out.c});
    }
  }
  if (r == 0 && !host_cache && (ours || (out.refcount && *out.refcount > 1))) out = out.clone();
  return std::make_tuple(r, out);
}

int extractor_input(Extractor& e, const std::string& name, const ::ncnn::Mat& in) {
  refuse_nul(name, "the blob name", "Extractor.input: ");
  const ::ncnn::Mat given = in;  // taken with the GIL held: another thread may make the Python Mat again meanwhile
  return holding(e, [&] { return input_held(e, name, given); });
}

std::tuple<int, ::ncnn::Mat> extractor_extract(Extractor& e, const std::string& name) {
  refuse_nul(name, "the blob name", "Extractor.extract: ");
  auto result = holding(e, [&] { return extract_held(e, name); });
  vknorm_python::raise_python_layer_error();  // what a Python layer's forward raised: the extract fails with it
  return result;
}

// pyncnn's extract(blob, feat): the blob into feat (left as it was on failure), ncnn's code back.
int extract_into(Extractor& e, const std::string& name, ::ncnn::Mat& feat) {
  auto [r, out] = extractor_extract(e, name);
  if (r == 0) feat = out;
  return r;
}

// A blob's name from its index (pyncnn's input/extract by index) as the model's own .param numbers it (a fused
// net's renumbered blobs through the unfused model's names); "" (logged) when no layer makes a blob of that index,
// or when its name finds an earlier blob.
std::string blob_name(Extractor& e, long long index, const char* call) {
  ReleaseGil release;
  std::shared_lock<NetLock> net_lock(e.owner->lock);
  if (e.stale(call)) return "";
  const std::vector<std::string>& unfused = e.owner->unfused_blobs;
  const std::vector<::ncnn::Blob>& blobs = e.owner->net.blobs();
  // ncnn keeps the header's count of blobs; those no layer makes have no name (text params: the last ones; a fused
  // net's list holds only the made ones)
  int made = int(blobs.size());
  while (made > 0 && blobs[size_t(made - 1)].name.empty()) --made;
  const int count = unfused.empty() ? made : int(unfused.size());
  auto name_of = [&](long long i) -> const std::string& {
    return unfused.empty() ? blobs[size_t(i)].name : unfused[size_t(i)];
  };
  if (index < 0 || index >= count || name_of(index).empty()) {
    NCNN_LOGE("vknorm.graph: Extractor.%s: blob index %lld out of range (%d blobs%s)", call, index, count,
              index >= 0 && index < count ? "; no layer makes that one" : "");
    return "";
  }
  // Blobs are reached by name here, and a name finds its first blob (ncnn's lookup): a later top given the same
  // name cannot be named.
  for (long long first = 0; first < index; ++first)
    if (name_of(first) == name_of(index)) {
      NCNN_LOGE("vknorm.graph: Extractor.%s: blob index %lld is named '%s' as blob %lld is, and vknorm.graph reaches "
                "blobs by name, which finds blob %lld: give the model's blobs names of their own", call, index,
                name_of(index).c_str(), first, first);
      return "";
    }
  return name_of(index);
}

// A blob given by anything the str and int overloads did not take: an index type (a numpy integer, one past
// int) goes on as an index (out of range: "", named as given); anything else is one line naming its type.
std::string blob_of(Extractor& e, nb::handle blob, const char* call) {
  const std::optional<long long> index = as_index(blob);
  if (!index)
    throw nb::type_error((std::string("Extractor.") + call + ": the blob is a name (str) or an index (int), got " +
                          type_of(blob)).c_str());
  return blob_name(e, *index, call);
}

void check_extract_type(int type) {
  if (type != 0)
    throw std::invalid_argument("Extractor.extract: type " + std::to_string(type) +
                                " (ncnn's blob as stored: packed, float16) is not supported; type 0 gives it as float32");
}

void extractor_clear(Extractor& e) {
  holding(e, [&] {
    e.ex->clear();
    e.held.clear();
    e.downloaded.clear();
    e.given_caches.clear();
    e.given_device_caches.clear();
    e.refused_inputs.clear();
    e.failed = false;
    *e.cleared = true;
  });
}

// The Python objects a net holds for its Python layers (their creators, destroyers and layers), for Python's
// garbage collector: a creator defined in a module holds the module's globals, which hold the net.
int net_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  return nb::inst_ptr<Net>(self)->python_layers.traverse(visit, arg);
}
int net_clear_references(PyObject* self) {
  if (nb::inst_ready(self)) nb::inst_ptr<Net>(self)->python_layers.clear();
  return 0;
}
// An extractor holds its net's Python object (the shared_ptr nanobind made of it): said to the collector, so a net
// and its extractors that only a cycle through a Python layer's creator keeps are collected.
int extractor_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  if (const Extractor* e = nb::inst_ptr<Extractor>(self); e->owner) {
    nb::object net = nb::find(e->owner.get());
    Py_VISIT(net.ptr());
  }
  return 0;
}
PyType_Slot kExtractorSlots[] = {{Py_tp_traverse, reinterpret_cast<void*>(extractor_traverse)}, {0, nullptr}};
// Net.opt's Option keeps its net alive (nanobind's keep-alive, which the collector does not see): said to it, so a
// net held only by a cycle through a Python layer's creator and by its own opt is collected.
int option_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  const auto& owners = Net::option_owners();
  if (auto it = owners.find(nb::inst_ptr<::ncnn::Option>(self)); it != owners.end()) {
    nb::object net = nb::find(it->second);
    Py_VISIT(net.ptr());
  }
  return 0;
}
PyType_Slot kOptionSlots[] = {{Py_tp_traverse, reinterpret_cast<void*>(option_traverse)}, {0, nullptr}};
PyType_Slot kNetSlots[] = {{Py_tp_traverse, reinterpret_cast<void*>(net_traverse)},
                           {Py_tp_clear, reinterpret_cast<void*>(net_clear_references)},
                           {0, nullptr}};

void net_clear(Net& n) {
  writing(n, [&] {
    check_vulkan_process(n.net.opt);  // a fork()ed child's clear would free its parent's device memory
    n.clear();
  });
  vknorm_python::raise_python_layer_error();  // a Python layer's destroy_pipeline or destroyer
}

// Device memory ncnn holds. Every allocation ncnn makes (its blob, workspace, staging and weight
// allocators, and the VkBlobAllocator each vknorm layer keeps for its scratch) goes through ncnn::vkAllocateMemory / vkFreeMemory,
// function pointers ncnn fills when it creates its Vulkan instance; tracking swaps in counting wrappers.
// A limit makes the wrapper answer VK_ERROR_OUT_OF_DEVICE_MEMORY past it, as a full device answers:
// what ncnn then does is what a user meets when the GPU runs out of memory.
struct MemoryTracker {
  std::mutex mutex;
  std::unordered_map<uint64_t, uint64_t> live;  // VkDeviceMemory -> bytes
  uint64_t bytes = 0, peak = 0, allocations = 0, refused = 0, limit = 0;
  PFN_vkAllocateMemory allocate = nullptr;
  PFN_vkFreeMemory free = nullptr;
};

MemoryTracker& tracker() {
  static MemoryTracker* t = new MemoryTracker;  // never destroyed: ncnn may free memory at process exit
  return *t;
}

uint64_t memory_key(VkDeviceMemory m) { return uint64_t(reinterpret_cast<uintptr_t>(m)); }

VkResult VKAPI_CALL counting_allocate(VkDevice device, const VkMemoryAllocateInfo* info, const VkAllocationCallbacks* cb,
                                      VkDeviceMemory* memory) {
  MemoryTracker& t = tracker();
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    if (t.limit && t.bytes + info->allocationSize > t.limit) {
      ++t.refused;
      return VK_ERROR_OUT_OF_DEVICE_MEMORY;
    }
  }
  const VkResult r = t.allocate(device, info, cb, memory);
  if (r == VK_SUCCESS) {
    std::lock_guard<std::mutex> lock(t.mutex);
    t.live[memory_key(*memory)] = info->allocationSize;
    t.bytes += info->allocationSize;
    t.peak = std::max(t.peak, t.bytes);
    ++t.allocations;
  }
  return r;
}

void VKAPI_CALL counting_free(VkDevice device, VkDeviceMemory memory, const VkAllocationCallbacks* cb) {
  MemoryTracker& t = tracker();
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    auto it = t.live.find(memory_key(memory));
    if (it != t.live.end()) t.bytes -= it->second, t.live.erase(it);  // memory from before tracking: not counted
  }
  t.free(device, memory, cb);
}

// Starts ncnn's Vulkan instance if needed, then counts from here on (again after the instance was recreated).
void track_device_memory() {
  if (ncnn_gpu_count() <= 0) throw std::runtime_error("ncnn finds no Vulkan device");
  MemoryTracker& t = tracker();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (::ncnn::vkAllocateMemory == counting_allocate) return;
  t.allocate = ::ncnn::vkAllocateMemory;
  t.free = ::ncnn::vkFreeMemory;
  ::ncnn::vkAllocateMemory = counting_allocate;
  ::ncnn::vkFreeMemory = counting_free;
}

// The names of these blobs of the net (ncnn's input_names() and output_names() are its text loader's: empty for
// binary params).
std::vector<std::string> blob_names(const ::ncnn::Net& net, const std::vector<int>& indexes) {
  std::vector<std::string> r;
  for (const int i : indexes) r.push_back(net.blobs()[size_t(i)].name);
  return r;
}

// The index of each named blob as the model's own .param numbers it: its first blob of that name (a fused net's
// through the unfused model's names).
std::vector<int> model_indexes(const Net& n, const std::vector<std::string>& names) {
  std::vector<int> r;
  for (const std::string& name : names) {
    if (n.unfused_blobs.empty()) {
      r.push_back(vknorm::ncnn::blob_index(n.net, name.c_str()));
      continue;
    }
    const auto it = std::find(n.unfused_blobs.begin(), n.unfused_blobs.end(), name);
    r.push_back(it == n.unfused_blobs.end() ? -1 : int(it - n.unfused_blobs.begin()));
  }
  return r;
}

// The names of these blobs in the model's own order: a fused net numbers its blobs otherwise (the fused layer's outputs
// come norm first, then the sum), and pyncnn code may take outputs by position.
std::vector<std::string> model_ordered_names(const Net& n, const std::vector<int>& indexes) {
  std::vector<std::string> names = blob_names(n.net, indexes);
  if (n.unfused_blobs.empty()) return names;
  const std::vector<int> order = model_indexes(n, names);
  std::vector<size_t> by(names.size());
  for (size_t i = 0; i < by.size(); ++i) by[i] = i;
  std::stable_sort(by.begin(), by.end(), [&](size_t a, size_t b) { return unsigned(order[a]) < unsigned(order[b]); });
  std::vector<std::string> r;
  for (size_t i : by) r.push_back(names[i]);
  return r;
}

// Registrations change the net's types (ncnn's registry and its Python types) with the net held whole (no load,
// extract or other registration meanwhile) and the GIL held inside (the creators and the types' list are Python's).
template <class F>
auto registering(Net& n, F&& f) {
  refuse_inside_python_layer();  // the net is held by the code that runs the layer
  return writing(n, [&] {
    nb::gil_scoped_acquire gil;
    return f();
  });
}

// pyncnn's register_custom_layer(type, ...), with the net held (registering): loads from then on make `type`'s
// layers with creator() (a vknorm.graph.Layer), and hand each to destroyer (None: nothing) as the net lets it go.
int register_type_held(Net& n, const std::string& type, nb::handle creator, nb::handle destroyer) {
  const vknorm_python::PythonLayerType* t =
      n.python_layers.add(type, creator, destroyer, n.vknorm, n.fuse, n.custom_slots);
  if (!t) return 0;
  const int r = PythonLayerTypes::register_with(n.net, *t);
  if (r == 0 && ::ncnn::layer_to_index(type.c_str()) == -1) ++n.custom_slots;
  return r;
}

int register_python_type(Net& n, const std::string& type, nb::handle creator, nb::handle destroyer) {
  return registering(n, [&] { return register_type_held(n, type, creator, destroyer); });
}

// pyncnn's register_custom_layer(index, ...): a built-in type's index is that type's name; a custom one (256 + j, as
// binary params number a model's own types) that a type registered by name holds is that type's; another is the
// index's alone (taking it from vknorm's fused type there, if any: text params naming that type are refused then).
int register_python_index(Net& n, long long index, nb::handle creator, nb::handle destroyer) {
  const std::string call = "Net.register_custom_layer(" + std::to_string(index) + "): ";
  constexpr int kCustom = ::ncnn::LayerType::CustomBit;
  if (index >= 0 && index < kCustom) {
    const std::string type = vknorm::ncnn::builtin_type_name(int(index));
    if (type.empty())
      throw nb::value_error((call + "ncnn has no built-in type of that index (layer_to_index)").c_str());
    return register_python_type(n, type, creator, destroyer);
  }
  if (index < 0 || index >= 2 * kCustom)
    throw nb::value_error((call + "an index is a built-in type's (layer_to_index) or a custom one, 256 + j (as "
                                  "ncnn2mem numbers a model's own types)").c_str());
  const int slot = int(index) - kCustom;
  return registering(n, [&] {
    const vknorm_python::PythonLayerType* held = n.python_layers.registered_at(n.net, slot);
    if (held && held->index < 0) return register_type_held(n, held->type, creator, destroyer);
    const vknorm_python::PythonLayerType* t = n.python_layers.add_at(int(index), creator, destroyer);
    if (!t) return 0;
    QuietStderr quiet;  // ncnn's note that the index had a type (one of vknorm's fused types) before
    const int r = PythonLayerTypes::register_with(n.net, *t);
    if (r == 0) n.count_custom_index(int(index));
    return r;
  });
}

// vknorm::ncnn::register_layer: vknorm's layer `type` under the custom type index ncnn2mem gave it in binary params.
int register_layer(Net& n, long long index, const std::string& type) {
  const std::string call = "Net.register_layer(" + std::to_string(index) + ", " + type + "): ";
  if (!n.vknorm) throw nb::value_error((call + "a stock net (Net(vknorm=False)) has no vknorm layers").c_str());
  const int typeindex = index < INT_MIN || index > INT_MAX ? -1 : int(index);
  if (const std::string why = vknorm::ncnn::register_layer_refusal(typeindex, type); !why.empty())
    throw nb::value_error((call + why).c_str());
  const int slot = int(index) - ::ncnn::LayerType::CustomBit;
  return registering(n, [&] {
    if (const vknorm_python::PythonLayerType* t = n.python_layers.registered_at(n.net, slot))
      throw nb::value_error((call + "the index is held by a Python layer type (" + t->label() +
                                    ", Net.register_custom_layer)").c_str());
    if (!n.net.layers().empty())
      throw std::runtime_error(call + "the net's layers are made already: call it before load_param_bin, or after "
                                      "clear()");
    QuietStderr quiet;  // ncnn's note that the index had a type (register_layers' by name) before
    const int ret = vknorm::ncnn::register_layer(n.net, int(index), type);
    if (ret == 0) n.count_custom_index(int(index));
    return ret;
  });
}

// ncnn's device for the net's layers, before load_param as in ncnn.
void set_vulkan_device(Net& n, long long device_index) {
  const int index = checked_gpu_index(device_index, "set_vulkan_device");
  writing(n, [&] {
    if (n.param_loaded)  // its layers were made for the device it had then
      throw std::runtime_error("set_vulkan_device: call it before load_param, as in ncnn");
    n.net.set_vulkan_device(index);
  });
}

}  // namespace

NB_MODULE(_graph, m) {
  vknorm_python::define_leak_warning_switch(m);
  m.doc() = "ncnn's Vulkan graph with vknorm's norm layers inside (ncnn compiled from source)";

  auto option = nb::class_<::ncnn::Option>(m, "Option", nb::type_slots(kOptionSlots));
  option.def(nb::init<>())
      .def_rw("num_threads", &::ncnn::Option::num_threads)
      .def_rw("openmp_blocktime", &::ncnn::Option::openmp_blocktime)
      .def_prop_rw(
          "kvcache_max_seqlen_hint", [](const ::ncnn::Option& o) { return o.kvcache_max_seqlen_hint; },
          [](::ncnn::Option& o, int hint) {
            check_seqlen_hint(hint, "Option.kvcache_max_seqlen_hint");
            o.kvcache_max_seqlen_hint = hint;
          });
  // pyncnn's allocator fields, which its Python layers pass on (top_blob.clone_from(x, opt.blob_allocator)): this
  // module's Mats take None only, ncnn's own memory
  for (const char* name : {"blob_allocator", "workspace_allocator"})
    option.def_prop_rw(
        name, [](const ::ncnn::Option&) { return nb::none(); },
        [what = std::string("Option.") + name](::ncnn::Option&, nb::handle v) { check_no_allocator(what.c_str(), v); },
        nb::for_setter(nb::arg("value").none()));
  // The setters' signatures for stubs (they take any object, to refuse None and the like with a message);
  // nanobind keeps the pointers, so the strings live as long as the module.
  static std::deque<std::string> setter_sigs;
  for (const OptionSwitch& sw : kOptionSwitches) {
    if (!sw.settable) continue;
    setter_sigs.push_back(std::string("def ") + sw.name + "(self, value: bool, /) -> None");
    option.def_prop_rw(
        sw.name, [field = sw.field](const ::ncnn::Option& o) { return o.*field; },
        [field = sw.field, what = std::string("Option.") + sw.name](::ncnn::Option& o, nb::handle v) {
          o.*field = as_switch(v, what);
        },
        nb::for_setter(nb::arg("value").none()), nb::for_setter(nb::sig(setter_sigs.back().c_str())));
  }

  nb::class_<::ncnn::Mat>(m, "Mat", nb::type_slots(kMatSlots))
      .def(nb::init<>())
      // ncnn's copy constructor, as pyncnn's Mat(m): the same memory (an empty Mat gives an empty one)
      .def(nb::init<const ::ncnn::Mat&>(), "m"_a)
      .def("__init__", [](::ncnn::Mat* self, const Array& a) { new (self) ::ncnn::Mat(mat_from_numpy(a)); }, "array"_a)
      // pyncnn's shape constructors: Mat(w), Mat(w, h), Mat(w, h, c), Mat(w, h, d, c), Mat((w, ...)); float32,
      // zeroed (pyncnn leaves the memory as it was)
      .def("__init__",
           [](::ncnn::Mat* self, int w, size_t e, int p, nb::handle a) {
             new (self) ::ncnn::Mat(created({w}, e, p, 1, a, "Mat"));
           },
           "w"_a, nb::kw_only(), "elemsize"_a = 4, "elempack"_a = 1, "allocator"_a.none() = nb::none())
      .def("__init__",
           [](::ncnn::Mat* self, int w, int h, size_t e, int p, nb::handle a) {
             new (self) ::ncnn::Mat(created({w, h}, e, p, 1, a, "Mat"));
           },
           "w"_a, "h"_a, nb::kw_only(), "elemsize"_a = 4, "elempack"_a = 1, "allocator"_a.none() = nb::none())
      .def("__init__",
           [](::ncnn::Mat* self, int w, int h, int c, size_t e, int p, nb::handle a) {
             new (self) ::ncnn::Mat(created({w, h, c}, e, p, 1, a, "Mat"));
           },
           "w"_a, "h"_a, "c"_a, nb::kw_only(), "elemsize"_a = 4, "elempack"_a = 1, "allocator"_a.none() = nb::none())
      .def("__init__",
           [](::ncnn::Mat* self, int w, int h, int d, int c, size_t e, int p, nb::handle a) {
             new (self) ::ncnn::Mat(created({w, h, d, c}, e, p, 1, a, "Mat"));
           },
           "w"_a, "h"_a, "d"_a, "c"_a, nb::kw_only(), "elemsize"_a = 4, "elempack"_a = 1,
           "allocator"_a.none() = nb::none())
      .def("__init__",
           [](::ncnn::Mat* self, const nb::tuple& shape, size_t e, int p, nb::handle a) {
             new (self) ::ncnn::Mat(created(ints(shape), e, p, 1, a, "Mat"));
           },
           "shape"_a, nb::kw_only(), "elemsize"_a = 4, "elempack"_a = 1, "allocator"_a.none() = nb::none())
      // Anything else numpy reads as real numbers (other byte orders, nested lists) becomes float32 first;
      // the rest is a TypeError that names the dtype.
      .def("__init__",
           [](::ncnn::Mat* self, nb::handle obj) {
             // An integer of another type (numpy's): Mat(w), as for a Python int
             if (const std::optional<long long> w = as_index(obj)) {
               new (self) ::ncnn::Mat(mat_of_shape({dimension(*w)}));
               return;
             }
             nb::module_ np = nb::module_::import_("numpy");
             nb::object a = np.attr("asarray")(obj);
             const nb::object dtype = a.attr("dtype");
             const std::string kind = nb::cast<std::string>(nb::object(dtype.attr("kind")));
             if (kind.empty() || std::string("biuf").find(kind[0]) == std::string::npos) {
               const std::string name = nb::cast<std::string>(nb::str(dtype));
               throw nb::type_error(("Mat: expected an array of real numbers (float32, or a type that converts to "
                                     "it), got dtype " + name).c_str());
             }
             if (nb::cast<int>(a.attr("ndim")) == 0)
               throw nb::type_error("Mat: a single value is not an array: Mat(w) makes a Mat of w elements, "
                                    "Mat(np.array([v], np.float32)) one that holds v");
             a = np.attr("ascontiguousarray")(a, "dtype"_a = np.attr("float32"));
             new (self) ::ncnn::Mat(mat_from_numpy(nb::cast<Array>(a)));
           },
           nb::arg("array").none())
      .def_ro("dims", &::ncnn::Mat::dims)
      .def_ro("w", &::ncnn::Mat::w)
      .def_ro("h", &::ncnn::Mat::h)
      .def_ro("d", &::ncnn::Mat::d)
      .def_ro("c", &::ncnn::Mat::c)
      .def_ro("elempack", &::ncnn::Mat::elempack)
      .def_ro("elemsize", &::ncnn::Mat::elemsize)
      .def_ro("cstep", &::ncnn::Mat::cstep)
      .def("total", [](const ::ncnn::Mat& mat) { return mat.total(); })  // cstep x c, padding included, as ncnn's
      .def("empty", &::ncnn::Mat::empty)
      // pyncnn's Mat.fill, clone and reshape, on the host Mats this module makes (float32, elempack 1)
      .def("fill",
           [](::ncnn::Mat& mat, float v) {
             if (!mat.data && mat.total())  // shape()'s Mat: a shape, no memory
               throw std::invalid_argument("Mat.fill: the Mat has a shape but no memory (Mat.shape()'s)");
             mat.fill(v);
           },
           "v"_a)
      .def("clone",
           [](const ::ncnn::Mat& mat, nb::handle a) {
             check_no_allocator("Mat.clone", a);
             return mat.clone();
           },
           "allocator"_a.none() = nb::none())
      // A reshape may share the Mat's memory (ncnn's), and a view does: each holds that memory (held_view), so
      // that the Mat dropped, made again (create, clone_from) or released leaves them on their own.
      .def("reshape",
           [](const ::ncnn::Mat& mat, int w, nb::handle a) { return reshaped_view(mat, {w}, a); },
           "w"_a, nb::kw_only(), "allocator"_a.none() = nb::none())
      .def("reshape",
           [](const ::ncnn::Mat& mat, const nb::tuple& shape, nb::handle a) { return reshaped_view(mat, ints(shape), a); },
           "shape"_a, nb::kw_only(), "allocator"_a.none() = nb::none())
      .def("reshape",
           [](const ::ncnn::Mat& mat, int w, int h, nb::handle a) { return reshaped_view(mat, {w, h}, a); },
           "w"_a, "h"_a, nb::kw_only(), "allocator"_a.none() = nb::none())
      .def("reshape",
           [](const ::ncnn::Mat& mat, int w, int h, int c, nb::handle a) { return reshaped_view(mat, {w, h, c}, a); },
           "w"_a, "h"_a, "c"_a, nb::kw_only(), "allocator"_a.none() = nb::none())
      .def("reshape",
           [](const ::ncnn::Mat& mat, int w, int h, int d, int c, nb::handle a) {
             return reshaped_view(mat, {w, h, d, c}, a);
           },
           "w"_a, "h"_a, "d"_a, "c"_a, nb::kw_only(), "allocator"_a.none() = nb::none())
      // pyncnn's views: they share the Mat's memory (writes reach it)
      .def("channel", [](::ncnn::Mat& m, long long c) { return held_view(m, channel_view(m, c, std::nullopt)); },
           "c"_a)
      .def("channel_range",
           [](::ncnn::Mat& m, long long c, long long n) { return held_view(m, channel_view(m, c, n)); }, "c"_a,
           "channels"_a)
      .def("depth", [](::ncnn::Mat& m, long long z) { return held_view(m, depth_view(m, z, std::nullopt)); }, "z"_a)
      .def("depth_range", [](::ncnn::Mat& m, long long z, long long n) { return held_view(m, depth_view(m, z, n)); },
           "z"_a, "depths"_a)
      .def("row", &row_view, "y"_a)
      .def("row_range",
           [](::ncnn::Mat& m, long long y, long long rows) { return held_view(m, row_range_view(m, y, rows)); },
           "y"_a, "rows"_a)
      .def("range", [](::ncnn::Mat& m, long long x, long long n) { return held_view(m, range_view(m, x, n)); },
           "x"_a, "n"_a)
      // pyncnn's create, create_like, clone_from, release and shape: the Mat made again (float32, elempack 1,
      // zeroed, as the constructors make it), a copy of another's, emptied, or its shape without memory. Views and
      // reshapes made before keep the memory they were made on.
      .def("create", [](::ncnn::Mat& m, int w, size_t e, int p, int n, nb::handle a) { m = created({w}, e, p, n, a); },
           "w"_a, nb::kw_only(), "elemsize"_a = 4, "elempack"_a = 1, "n"_a = 1, "allocator"_a.none() = nb::none())
      .def("create",
           [](::ncnn::Mat& m, int w, int h, size_t e, int p, int n, nb::handle a) { m = created({w, h}, e, p, n, a); },
           "w"_a, "h"_a, nb::kw_only(), "elemsize"_a = 4, "elempack"_a = 1, "n"_a = 1, "allocator"_a.none() = nb::none())
      .def("create",
           [](::ncnn::Mat& m, int w, int h, int c, size_t e, int p, int n, nb::handle a) {
             m = created({w, h, c}, e, p, n, a);
           },
           "w"_a, "h"_a, "c"_a, nb::kw_only(), "elemsize"_a = 4, "elempack"_a = 1, "n"_a = 1,
           "allocator"_a.none() = nb::none())
      .def("create",
           [](::ncnn::Mat& m, int w, int h, int d, int c, size_t e, int p, int n, nb::handle a) {
             m = created({w, h, d, c}, e, p, n, a);
           },
           "w"_a, "h"_a, "d"_a, "c"_a, nb::kw_only(), "elemsize"_a = 4, "elempack"_a = 1, "n"_a = 1,
           "allocator"_a.none() = nb::none())
      .def("create",
           [](::ncnn::Mat& m, const nb::tuple& shape, size_t e, int p, int n, nb::handle a) {
             m = created(ints(shape), e, p, n, a);
           },
           "shape"_a, nb::kw_only(), "elemsize"_a = 4, "elempack"_a = 1, "n"_a = 1, "allocator"_a.none() = nb::none())
      .def("create_like",
           [](::ncnn::Mat& m, const ::ncnn::Mat& like, nb::handle a) {
             if (like.dims == 0) throw std::invalid_argument("Mat.create_like: the Mat given has no shape");
             m = created(shape_of(like), like.elemsize / like.elempack, 1, 1, a);
           },
           "m"_a, "allocator"_a.none() = nb::none())
      .def("clone_from",
           [](::ncnn::Mat& m, const ::ncnn::Mat& from, nb::handle a) {
             check_no_allocator("Mat.clone_from", a);
             ::ncnn::Mat copy = from.clone();
             if (copy.empty() && !from.empty()) throw std::bad_alloc();
             m = copy;
           },
           "mat"_a, "allocator"_a.none() = nb::none())
      .def("release", [](::ncnn::Mat& m) { m.release(); })
      .def("shape", [](const ::ncnn::Mat& m) { return m.shape(); })
      .def("__getitem__", [](::ncnn::Mat& m, long long i) { return element(m, i); }, "i"_a)
      .def("__setitem__", [](::ncnn::Mat& m, long long i, float v) { element(m, i) = v; }, "i"_a, "v"_a)
      .def("__len__", [](const ::ncnn::Mat& m) { return m.w; })  // pyncnn's: w
      // The elements in ncnn's order, without the cstep padding between channels that Mat[i] counts (and that
      // Python's iteration through __getitem__ would read)
      .def("__iter__",
           [](::ncnn::Mat& m) {
             check_view(m, "iter(Mat)");
             return nb::iter(numpy_view(m).cast().attr("flat"));
           })
      .def_prop_ro("allocator", [](const ::ncnn::Mat&) { return nb::none(); })  // pyncnn's: None for its Mats
      .def("elembits", [](const ::ncnn::Mat& m) { return m.elembits(); })
      // pyncnn's: a view of the Mat's memory (a write through it reaches the Mat), which holds that memory; its
      // format argument "" or "f" (float32, what every Mat here holds)
      .def("numpy",
           [](::ncnn::Mat& mat, const std::string& format) {
             if (!format.empty() && format != "f")
               throw std::invalid_argument("Mat.numpy: format '" + format + "': vknorm.graph's Mats hold float32 ('f')");
             return numpy_view(mat);
           },
           "format"_a = "")
      .def("__repr__",
           [](const ::ncnn::Mat& m) {
             if (m.empty()) return std::string("Mat(empty)");
             return "Mat(dims=" + std::to_string(m.dims) + ", w=" + std::to_string(m.w) + ", h=" + std::to_string(m.h) +
                    ", d=" + std::to_string(m.d) + ", c=" + std::to_string(m.c) + ", elemsize=" +
                    std::to_string(m.elemsize) + ", elempack=" + std::to_string(m.elempack) + ")";
           })
      // numpy takes the buffer export first (kMatSlots); this answers what that refuses (an empty Mat: ValueError)
      // and other array libraries: copy=False is the Mat's own memory, as numpy's protocol asks
      .def("__array__",
           [](::ncnn::Mat& mat, nb::handle dtype, nb::handle copy) {
             nb::module_ np = nb::module_::import_("numpy");
             const bool other_type = dtype.is_valid() && !dtype.is_none() &&
                                     !nb::cast<bool>(np.attr("dtype")(dtype).attr("__eq__")(np.attr("float32")));
             if (copy.ptr() == Py_False) {
               if (other_type)
                 throw std::invalid_argument("Mat: copy=False with another dtype than float32 would need a copy");
               return nb::cast(numpy_view(mat));
             }
             nb::object a = nb::cast(mat_to_numpy(mat));
             return other_type ? a.attr("astype")(dtype) : a;
           },
           "dtype"_a = nb::none(), "copy"_a = nb::none())
      // pyncnn's pixel helpers (mat_pixel.cpp), with pyncnn's arguments: an 8-bit image (numpy uint8, h x w x
      // channels or flat; bytes) to a float32 Mat of the target format's channels; stride in bytes, w x channels when
      // not given. A resize of a source one pixel wide reads the byte before each row: given zeros there. The
      // overloads with a stride come first: given ints only they take the call, given pyncnn's allocator (None)
      // last they fail on it and the one without a stride takes it.
      .def_static(
          "from_pixels",
          [](nb::handle array, long long type, int w, int h, std::optional<int> stride, nb::handle allocator) {
            check_no_allocator("Mat.from_pixels", allocator);
            const Pixels p = pixels_of("from_pixels", array, type, w, h, stride);
            return converted([&] { return ::ncnn::Mat::from_pixels(p.data, int(type), w, h, p.stride); });
          },
          "array"_a, "type"_a, "w"_a, "h"_a, "stride"_a = nb::none(), "allocator"_a = nb::none())
      .def_static(
          "from_pixels_resize",
          [](nb::handle array, long long type, int w, int h, int stride, int target_width, int target_height,
             nb::handle allocator) {
            return pixels_resized(array, type, w, h, stride, target_width, target_height, allocator);
          },
          "array"_a, "type"_a, "w"_a, "h"_a, "stride"_a, "target_width"_a, "target_height"_a, "allocator"_a = nb::none())
      .def_static(
          "from_pixels_resize",
          [](nb::handle array, long long type, int w, int h, int target_width, int target_height, nb::handle allocator) {
            return pixels_resized(array, type, w, h, std::nullopt, target_width, target_height, allocator);
          },
          "array"_a, "type"_a, "w"_a, "h"_a, "target_width"_a, "target_height"_a, "allocator"_a = nb::none())
      .def_static(
          "from_pixels_roi",
          [](nb::handle array, long long type, int w, int h, int stride, int roix, int roiy, int roiw, int roih,
             nb::handle allocator) {
            return pixels_roi(array, type, w, h, stride, roix, roiy, roiw, roih, std::nullopt, allocator);
          },
          "array"_a, "type"_a, "w"_a, "h"_a, "stride"_a, "roix"_a, "roiy"_a, "roiw"_a, "roih"_a, "allocator"_a = nb::none())
      .def_static(
          "from_pixels_roi",
          [](nb::handle array, long long type, int w, int h, int roix, int roiy, int roiw, int roih, nb::handle allocator) {
            return pixels_roi(array, type, w, h, std::nullopt, roix, roiy, roiw, roih, std::nullopt, allocator);
          },
          "array"_a, "type"_a, "w"_a, "h"_a, "roix"_a, "roiy"_a, "roiw"_a, "roih"_a, "allocator"_a = nb::none())
      .def_static(
          "from_pixels_roi_resize",
          [](nb::handle array, long long type, int w, int h, int stride, int roix, int roiy, int roiw, int roih,
             int target_width, int target_height, nb::handle allocator) {
            return pixels_roi(array, type, w, h, stride, roix, roiy, roiw, roih,
                              std::pair<int, int>{target_width, target_height}, allocator);
          },
          "array"_a, "type"_a, "w"_a, "h"_a, "stride"_a, "roix"_a, "roiy"_a, "roiw"_a, "roih"_a, "target_width"_a,
          "target_height"_a, "allocator"_a = nb::none())
      .def_static(
          "from_pixels_roi_resize",
          [](nb::handle array, long long type, int w, int h, int roix, int roiy, int roiw, int roih, int target_width,
             int target_height, nb::handle allocator) {
            return pixels_roi(array, type, w, h, std::nullopt, roix, roiy, roiw, roih,
                              std::pair<int, int>{target_width, target_height}, allocator);
          },
          "array"_a, "type"_a, "w"_a, "h"_a, "roix"_a, "roiy"_a, "roiw"_a, "roih"_a, "target_width"_a, "target_height"_a,
          "allocator"_a = nb::none())
      .def("substract_mean_normalize", &substract_mean_normalize, "mean"_a, "norm"_a);
  {
    nb::enum_<PixelType> pixel_type(m.attr("Mat"), "PixelType", nb::is_arithmetic());
    // pyncnn's names, the masks included
    pixel_type.value("PIXEL_CONVERT_SHIFT", PixelType::PIXEL_CONVERT_SHIFT)
        .value("PIXEL_FORMAT_MASK", PixelType::PIXEL_FORMAT_MASK)
        .value("PIXEL_CONVERT_MASK", PixelType::PIXEL_CONVERT_MASK);
    for (const auto& [name, value] : kPixelTypes) pixel_type.value(name, value);
  }

  // Each call holds the net shared, then the extractor, with the GIL released (so no thread waits for
  // either while holding the GIL another needs).
  nb::class_<Extractor>(m, "Extractor", nb::type_slots(kExtractorSlots))
      .def("input", &extractor_input, "blob_name"_a, "mat"_a)
      .def("input",
           [](Extractor& e, int index, const ::ncnn::Mat& in) {
             const std::string name = blob_name(e, index, "input");
             return name.empty() ? -1 : extractor_input(e, name, in);
           },
           "blob_index"_a, "mat"_a)
      // Last, for what the two above do not take. nanobind tries every overload without conversions first, so
      // this one also meets index types the int overload would have converted (numpy integers): those go on as an
      // index. Anything else is one line naming the type (nanobind's own error lists every overload), with the wrap
      // a numpy array or a pyncnn Mat needs.
      .def("input",
           [](Extractor& e, nb::handle blob, nb::handle mat) -> int {
             if (!nb::isinstance<::ncnn::Mat>(mat))
               throw nb::type_error(("Extractor.input: the input must be a vknorm.graph.Mat, got " + type_of(mat) +
                                     ": wrap it, vknorm.graph.Mat(np.asarray(x))").c_str());
             const std::string name = blob_of(e, blob, "input");
             return name.empty() ? -1 : extractor_input(e, name, nb::cast<const ::ncnn::Mat&>(mat));
           },
           "blob_name"_a.none(), "mat"_a.none())
      // type: pyncnn's; 0 (the blob unpacked to float32) is the one this module gives
      .def("extract",
           [](Extractor& e, const std::string& name, int type) {
             check_extract_type(type);
             return extractor_extract(e, name);
           },
           "blob_name"_a, "type"_a = 0)
      // pyncnn's extract(blob, feat): the blob into the Mat given (made again, as ncnn's extract does), the code back
      .def("extract",
           [](Extractor& e, const std::string& name, ::ncnn::Mat& feat, int type) {
             check_extract_type(type);
             return extract_into(e, name, feat);
           },
           "blob_name"_a, "feat"_a, "type"_a = 0)
      .def("extract",
           [](Extractor& e, int index, ::ncnn::Mat& feat, int type) {
             check_extract_type(type);
             const std::string name = blob_name(e, index, "extract");
             return name.empty() ? -1 : extract_into(e, name, feat);
           },
           "blob_index"_a, "feat"_a, "type"_a = 0)
      .def("extract",
           [](Extractor& e, int index, int type) {
             check_extract_type(type);
             const std::string name = blob_name(e, index, "extract");
             return name.empty() ? std::make_tuple(-1, ::ncnn::Mat()) : extractor_extract(e, name);
           },
           "blob_index"_a, "type"_a = 0)
      // Last, as for input: a numpy integer or one past int goes on as an index (out of range, named as given), and
      // anything else (True, None, a float) is one line naming its type.
      .def("extract",
           [](Extractor& e, nb::handle blob, int type) {
             check_extract_type(type);
             const std::string name = blob_of(e, blob, "extract");
             return name.empty() ? std::make_tuple(-1, ::ncnn::Mat()) : extractor_extract(e, name);
           },
           "blob_name"_a.none(), "type"_a = 0)
      // ncnn's light mode for this extractor alone (net.opt.lightmode is every new extractor's)
      .def("set_light_mode",
           [](Extractor& e, nb::handle value) {
             const bool enable = as_switch(value, "Extractor.set_light_mode");
             refuse_inside_python_layer();
             ReleaseGil release;
             std::lock_guard<std::mutex> lock(*e.mutex);
             e.ex->set_light_mode(enable);
             e.opt.lightmode = enable;
           },
           "enable"_a.none())
      // ncnn's: room for this many tokens in a kv cache a host layer makes first (0: ncnn's own growth)
      .def("set_kvcache_max_seqlen_hint",
           [](Extractor& e, int hint) {
             check_seqlen_hint(hint, "Extractor.set_kvcache_max_seqlen_hint");
             refuse_inside_python_layer();
             ReleaseGil release;
             std::lock_guard<std::mutex> lock(*e.mutex);
             e.ex->set_kvcache_max_seqlen_hint(hint);
             e.opt.kvcache_max_seqlen_hint = hint;
           },
           "max_seqlen_hint"_a)
      .def("__enter__", [](Extractor& e) -> Extractor& { return e; }, nb::rv_policy::reference)
      .def("__exit__", [](Extractor& e, nb::args) { extractor_clear(e); })
      .def("clear", &extractor_clear);

  nb::class_<Net>(m, "Net", nb::type_slots(kNetSlots))
      .def("__init__",
           [](Net* self, nb::handle vknorm_on, nb::handle fuse_on) {
             const bool vknorm = as_switch(vknorm_on, "Net(vknorm=)");
             const std::optional<bool> fuse =
                 fuse_on.is_none() ? std::nullopt : std::optional<bool>(as_switch(fuse_on, "Net(fuse=)"));
             // fuse defaults to on with vknorm's layers; asked for without them it would be silently off
             if (!vknorm && fuse.value_or(false))
               throw nb::value_error("Net(vknorm=False, fuse=True): fusion rewrites models into vknorm's layers, "
                                     "which a stock net does not have");
             new (self) Net(vknorm, fuse.value_or(true));
           },
           "vknorm"_a = nb::bool_(true), "fuse"_a.none() = nb::none())
      .def_ro("vknorm", &Net::vknorm)
      .def_ro("fuse", &Net::fuse)
      .def("fused", [](const Net& n) {
        return fused_list(reading(n, [&] {
          std::vector<FusedCopy> r;
          for (const auto& f : n.fused) r.push_back({f.pattern, f.layers});
          return r;
        }));
      })
      .def_prop_rw(
          "opt", [](Net& n) -> ::ncnn::Option& { return n.net.opt; },
          [](Net& n, const ::ncnn::Option& o) {  // not halfway through a load
            writing(n, [&] {
              // What Python cannot see stays this net's: its allocators, pipeline cache (ncnn's load_model puts
              // its own there: another net's, copied, was used after that net freed it) and device.
              const ::ncnn::Option own = n.net.opt;
              n.net.opt = o;
              n.net.opt.blob_allocator = own.blob_allocator, n.net.opt.workspace_allocator = own.workspace_allocator;
              n.net.opt.kvcache_allocator = own.kvcache_allocator;
              n.net.opt.blob_vkallocator = own.blob_vkallocator, n.net.opt.workspace_vkallocator = own.workspace_vkallocator;
              n.net.opt.staging_vkallocator = own.staging_vkallocator, n.net.opt.kvcache_vkallocator = own.kvcache_vkallocator;
              n.net.opt.pipeline_cache = own.pipeline_cache, n.net.opt.vulkan_device_index = own.vulkan_device_index;
            });
          },
          nb::rv_policy::reference_internal)
      .def("set_vulkan_device", &set_vulkan_device, "device_index"_a)
      .def("register_layer", &register_layer, "index"_a, "type"_a)
      // pyncnn's two forms: by a type's name, and by its index (binary params')
      .def("register_custom_layer", &register_python_type, "type"_a, "creator"_a, "destroyer"_a.none() = nb::none())
      .def("register_custom_layer", &register_python_index, "index"_a, "creator"_a, "destroyer"_a.none() = nb::none())
      // The index of the device the net runs on, None until set_vulkan_device or a Vulkan net's load_param picks
      // one (vknorm.graph.Net.vulkan_device gives it as pyncnn's VulkanDevice)
      .def("_vulkan_device_index",
           [](Net& n) -> std::optional<int> {
             const ::ncnn::VulkanDevice* device = reading(n, [&] { return n.net.vulkan_device(); });
             if (!device) return std::nullopt;
             return device->info.device_index();
           })
      .def("load_param",
           [](Net& n, nb::handle file) {
             const std::string path = path_of(file);
             return loading(n, [&] { return n.load_param(path); });
           },
           "protopath"_a.none())
      .def("load_param_mem",
           [](Net& n, const std::string& text) { return loading(n, [&] { return n.load_param_mem(text); }); },
           "mem"_a)
      // pyncnn's: ncnn2mem's binary params, loaded as they are (fusion reads text params: vknorm optimize fuses a
      // model before ncnn2mem converts it); blobs and layers are named by their indexes, "0", "1", ...
      .def("load_param_bin",
           [](Net& n, nb::handle file) {
             const std::string path = path_of(file);
             return loading(n, [&] { return n.load_param_bin(path); });
           },
           "protopath"_a.none())
      .def("load_param_mem",  // the text as bytes (a file read in binary mode), as pyncnn's const char* takes
           [](Net& n, const nb::bytes& text) {
             const std::string t(text.c_str(), text.size());
             return loading(n, [&] { return n.load_param_mem(t); });
           },
           "mem"_a)
      .def("load_model",  // pyncnn's load_model(DataReaderFromEmpty()): every weight zero
           [](Net& n, const DataReaderFromEmpty&) { return loading(n, [&] { return n.load_model_zeros(); }); }, "dr"_a)
      .def("load_model",
           [](Net& n, nb::handle file) {
             const std::string path = path_of(file);
             return loading(n, [&] { return n.load_model(path); });
           },
           "modelpath"_a.none())
      // pyncnn's load_model_mem: the .bin's bytes (bytes, bytearray, or a numpy uint8 array); 0 or ncnn's error code
      // (pyncnn's gives None). Copied unless bytes: the load waits for running extracts with the GIL let go.
      .def("load_model_mem",
           [](Net& n, nb::handle mem) {
             const Uint8Data bin = uint8_data("Net.load_model_mem: the .bin's bytes (bytes, bytearray or a uint8 array)",
                                              mem, true);
             return loading(n, [&] { return n.load_model_mem(bin.data, bin.size); });
           },
           "mem"_a)
      .def_prop_ro("model_bytes_read",
                   [](Net& n) { return reading(n, [&] { return n.model_bytes_read; }); })
      .def("input_names",
           [](Net& n) { return reading(n, [&] { return model_ordered_names(n, n.net.input_indexes()); }); })
      .def("output_names",
           [](Net& n) { return reading(n, [&] { return model_ordered_names(n, n.net.output_indexes()); }); })
      // pyncnn's: the input and output blobs by index, as the model's own .param numbers them (what input and
      // extract by index take; a fused net's blobs are renumbered, so its indexes go through the unfused names)
      .def("input_indexes",
           [](Net& n) {
             return reading(n, [&] { return model_indexes(n, model_ordered_names(n, n.net.input_indexes())); });
           })
      .def("output_indexes",
           [](Net& n) {
             return reading(n, [&] { return model_indexes(n, model_ordered_names(n, n.net.output_indexes())); });
           })
      // (name, type, vknorm's layer?, runs on Vulkan?) per layer, in param order.
      .def("layers",
           [](Net& n) {
             return reading(n, [&] {
               std::vector<std::tuple<std::string, std::string, bool, bool>> r;
               for (const ::ncnn::Layer* l : n.net.layers())
                 r.emplace_back(l->name, l->type, vknorm::ncnn::is_vknorm_layer(l),
                                l->support_vulkan && n.net.opt.use_vulkan_compute);
               return r;
             });
           })
      // pyncnn's: the blobs of the net as loaded (a fused net's own, as layers() lists its layers), copies
      .def("blobs", [](Net& n) { return reading(n, [&] { return n.net.blobs(); }); })
      // vknorm's layers: name, type, params, weights (numpy copies) and counters.
      .def("vknorm_layers",
           [](Net& n) {
             struct Described {
               std::string name, layer_type;
               vknorm::ncnn::LayerInfo info;
               std::optional<std::vector<float>> gamma, beta;  // copied while the layer exists
             };
             const std::vector<Described> described = reading(n, [&] {
               std::vector<Described> r;
               for (const ::ncnn::Layer* l : n.net.layers()) {
                 Described d;
                 if (!vknorm::ncnn::describe_layer(l, d.info)) continue;
                 d.name = l->name;
                 d.layer_type = l->type;
                 auto copy = [&](const float* p) -> std::optional<std::vector<float>> {
                   if (!p) return std::nullopt;
                   return std::vector<float>(p, p + d.info.weight_count);
                 };
                 d.gamma = copy(d.info.gamma);
                 d.beta = copy(d.info.beta);
                 d.info.gamma = d.info.beta = nullptr;
                 r.push_back(std::move(d));
               }
               return r;
             });
             nb::list out;
             for (const Described& l : described) {
               const vknorm::ncnn::LayerInfo& i = l.info;
               nb::dict d;
               d["name"] = l.name;
               d["type"] = i.type;  // the norm; layer_type: the ncnn type it was loaded as
               d["layer_type"] = l.layer_type;
               d["residual"] = i.residual;
               d["activation_type"] = i.activation_type;
               d["activation_alpha"] = i.activation_alpha;
               d["affine_size"] = i.affine_size;
               if (i.type == "GroupNorm") d["group"] = i.group;
               if (i.type == "GroupNorm" || i.type == "InstanceNorm") d["channels"] = i.channels;
               d["eps"] = i.eps;
               d["affine"] = i.affine;
               auto vec = [&](const std::optional<std::vector<float>>& v) -> nb::object {
                 if (!v) return nb::none();
                 ::ncnn::Mat m(int(v->size()));
                 std::memcpy(m.data, v->data(), sizeof(float) * v->size());
                 return nb::cast(mat_to_numpy(m));
               };
               d["gamma"] = vec(l.gamma);
               d["beta"] = vec(l.beta);
               d["vulkan_forwards"] = i.counters.vulkan_forwards;
               d["cpu_forwards"] = i.counters.cpu_forwards;
               d["pipelines"] = i.counters.pipelines;
               d["variants"] = i.pipelines;
               out.append(d);
             }
             return out;
           })
      .def("vknorm_counters",
           [](Net& n) {
             nb::dict d = counters_dict(reading(n, [&] { return vknorm::ncnn::counters(n.net); }));
             const auto [made, reused] = n.commands.counts();
             d["command_buffers_made"] = made;
             d["command_buffers_reused"] = reused;
             return d;
           })
      .def("create_extractor",
           [](std::shared_ptr<Net> n) {
             ReleaseGil release;  // never wait for the net's lock holding the GIL: its holder may need it
             std::shared_lock<NetLock> lock(n->lock);
             check_vulkan_process(n->net.opt);
             n->check_runnable();
             auto ex = ForkSafe<::ncnn::Extractor>(new ::ncnn::Extractor(n->net.create_extractor()));
             std::shared_ptr<Allocators> allocators;
             if (n->net.opt.use_vulkan_compute && n->net.vulkan_device()) {
               allocators = std::make_shared<Allocators>(n->net.vulkan_device());
               ex->set_blob_vkallocator(allocators->blob);
               ex->set_workspace_vkallocator(allocators->blob);
               ex->set_staging_vkallocator(allocators->staging);
             }
             Extractor e(n, std::move(ex), std::move(allocators));
             e.ex->set_blob_allocator(e.host_blobs.get());
             e.ex->set_workspace_allocator(e.host_workspace.get());
             if (has_host_kv_layer(n->net, e.allocators != nullptr)) e.ex->set_kvcache_allocator(&host_kv_caches());
             e.kv_caches_fed = kv_caches_read_by_layers(n->net, e.allocators != nullptr);
             e.generation = n->generation;
             e.opt = n->net.opt;
             return e;
           })
      .def("clear", &net_clear)
      .def("__enter__", [](Net& n) -> Net& { return n; }, nb::rv_policy::reference)
      .def("__exit__", [](Net& n, nb::args) { net_clear(n); });

  nb::class_<::ncnn::Blob>(m, "Blob",
                           "pyncnn's Blob: a blob of a net as loaded, as it was when Net.blobs() was called.")
      .def_ro("name", &::ncnn::Blob::name)
      .def_ro("producer", &::ncnn::Blob::producer, "The index in Net.layers() of the layer that makes it.")
      .def_ro("consumer", &::ncnn::Blob::consumer, "The index in Net.layers() of a layer that reads it, -1 if none.")
      // ncnn's shape hint is a Mat without memory (numpy reads garbage from pyncnn's): its shape instead
      .def_prop_ro(
          "shape", [](const ::ncnn::Blob& b) { return b.shape.dims ? shape_of(b.shape) : std::vector<int>(); },
          "The .param's shape hint as Mat's constructors take it, [w], [w, h], [w, h, c] or [w, h, d, c]; [] "
          "when it gives none.")
      .def("__repr__", [](const ::ncnn::Blob& b) {
        return std::string("Blob(name=") + nb::repr(nb::str(b.name.c_str())).c_str() + ", producer=" +
               std::to_string(b.producer) + ", consumer=" + std::to_string(b.consumer) + ")";
      });
  nb::class_<DataReaderFromEmpty>(m, "DataReaderFromEmpty").def(nb::init<>());
  // pyncnn's CPU and OpenMP queries and settings, of the ncnn compiled in here
  const std::pair<const char*, int (*)()> cpu_queries[] = {
      {"get_cpu_count", ::ncnn::get_cpu_count},
      {"get_little_cpu_count", ::ncnn::get_little_cpu_count},
      {"get_big_cpu_count", ::ncnn::get_big_cpu_count},
      {"get_physical_cpu_count", ::ncnn::get_physical_cpu_count},
      {"get_physical_little_cpu_count", ::ncnn::get_physical_little_cpu_count},
      {"get_physical_big_cpu_count", ::ncnn::get_physical_big_cpu_count},
      {"get_cpu_powersave", ::ncnn::get_cpu_powersave},
      {"get_omp_num_threads", ::ncnn::get_omp_num_threads},
      {"get_omp_dynamic", ::ncnn::get_omp_dynamic},
      {"get_omp_thread_num", ::ncnn::get_omp_thread_num},
      {"get_kmp_blocktime", ::ncnn::get_kmp_blocktime},
      {"cpu_support_arm_neon", ::ncnn::cpu_support_arm_neon},
      {"cpu_support_arm_vfpv4", ::ncnn::cpu_support_arm_vfpv4},
      {"cpu_support_arm_asimdhp", ::ncnn::cpu_support_arm_asimdhp},
      {"cpu_support_x86_avx", ::ncnn::cpu_support_x86_avx},
      {"cpu_support_x86_avx2", ::ncnn::cpu_support_x86_avx2}};
  for (const auto& [name, query] : cpu_queries) m.def(name, query);
  // pyncnn's: the index of a layer type in ncnn's own registry (-1 for a type ncnn does not have)
  m.def("layer_to_index", [](const std::string& type) { return ::ncnn::layer_to_index(type.c_str()); }, "type"_a);
  m.def("set_cpu_powersave", [](int powersave) {
    if (powersave < 0 || powersave > 2)
      throw std::invalid_argument("set_cpu_powersave: 0 (all cores), 1 (little ones) or 2 (big ones), got " +
                                  std::to_string(powersave));
    return ::ncnn::set_cpu_powersave(powersave);
  }, "powersave"_a);
  m.def("set_omp_num_threads", [](int n) {
    if (!thread_count_ok(n))
      throw std::invalid_argument("set_omp_num_threads: 1.." + std::to_string(kMaxThreads) + ", got " +
                                  std::to_string(n));
    ::ncnn::set_omp_num_threads(n);
  }, "num_threads"_a);
  m.def("set_omp_dynamic", &::ncnn::set_omp_dynamic, "dynamic"_a);
  m.def("set_kmp_blocktime", &::ncnn::set_kmp_blocktime, "time_ms"_a);
  vknorm_python::define_mat_functions(m);
  vknorm_python::define_custom_layers(m);

  // The graph rewrite on .param text: (fused text, [{"pattern", "layers"}]); ValueError on a malformed file.
  m.def("fuse_param", [](const std::string& text) {
    const auto r = vknorm::ncnn::fuse_param(text);
    return std::make_tuple(r.param, fused_list(r.fused));
  });
  m.def("gpu_count", [] { return ncnn_gpu_count(); });
  m.def("gpu_name",
        [](long long i) { return std::string(::ncnn::get_gpu_info(checked_gpu_index(i, "gpu_name")).device_name()); });
  m.def("gpu_info", &gpu_info_fields, "device_index"_a);
  m.def("check_gpu_index", &checked_gpu_index, "device_index"_a, "caller"_a);
  m.def("gpu_heap_budget", &gpu_heap_budget, "device_index"_a);
  m.def("default_gpu_index", [] { return ::ncnn::get_default_gpu_index(); });
  // Every vknorm layer of the process, nets cleared or destroyed included (vknorm::ncnn::counters()).
  m.def("process_counters", [] { return counters_dict(vknorm::ncnn::counters()); });
  m.def("track_device_memory", &track_device_memory);
  m.def("device_memory", [] {
    MemoryTracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    nb::dict d;
    d["tracking"] = ::ncnn::vkAllocateMemory == counting_allocate;
    d["bytes"] = t.bytes;
    d["blocks"] = t.live.size();
    d["peak_bytes"] = t.peak;
    d["allocations"] = t.allocations;
    d["refused"] = t.refused;
    d["limit"] = t.limit;
    return d;
  });
  m.def("set_device_memory_limit", [](uint64_t limit) {
    MemoryTracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.limit = limit;
    t.peak = t.bytes;  // the peak from here on
  }, "limit"_a);
  // Destroys ncnn's Vulkan instance: call once no Net is left (a process that reloads ncnn's GPU state, as the
  // reliability runs do; ncnn otherwise leaves the instance to process exit).
  m.def("destroy_gpu_instance", [] { ::ncnn::destroy_gpu_instance(); });
}

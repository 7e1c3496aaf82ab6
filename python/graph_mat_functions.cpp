// ncnn's Mat functions that pyncnn offers beside its Net (copy_make_border and its _3d, copy_cut_border and its _3d,
// resize_nearest / resize_bilinear / resize_bicubic, flatten): ncnn's own code (its Padding, Crop, Interp and Flatten
// layers) on the host Mats of vknorm._graph, so pre- and post-processing written for pyncnn moves over too.
// Arguments that would make ncnn read or write past a buffer, or return a silently wrong Mat, are refused first.
#include <nanobind/nanobind.h>

#include <climits>
#include <cstdint>
#include <string>

#include <ncnn/mat.h>
#include <ncnn/option.h>

#include "graph_mat_functions.h"
#include "mat_layout.h"
#include "release_gil.h"

namespace nb = nanobind;
using namespace nb::literals;
using ::ncnn::Mat;
using ::ncnn::Option;

namespace {

[[noreturn]] void refuse(const std::string& what) { throw nb::value_error(what.c_str()); }

std::string shape_of(const Mat& m) {
  std::string s = "(w=" + std::to_string(m.w);
  if (m.dims >= 2) s += ", h=" + std::to_string(m.h);
  if (m.dims == 4) s += ", d=" + std::to_string(m.d);
  if (m.dims >= 3) s += ", c=" + std::to_string(m.c);
  return s + ")";
}

// ncnn fills and walks a Mat with int element counts (Mat::fill, its layers' loops): a Mat past INT_MAX elements,
// cstep padding included, would be read or written past its end. Counted step by step so that nothing overflows.
bool fits_int(long long w, long long h, long long d, long long c) {
  if (w > INT_MAX || h > INT_MAX || d > INT_MAX || c > INT_MAX) return false;
  if (w * h > INT_MAX || w * h * d > INT_MAX) return false;
  const long long cstep = (long long)(::ncnn::alignSize(size_t(w * h * d) * 4, 16) / 4);
  return cstep * c <= INT_MAX;
}
void check_result_size(long long w, long long h, long long d, long long c, const char* fn) {
  if (!fits_int(w, h, d, c))
    refuse(std::string(fn) + ": the result would have " + std::to_string(w) + " x " + std::to_string(h) + " x " +
           std::to_string(d) + " x " + std::to_string(c) + " elements, more than ncnn's int element counts reach (2^31 - 1)");
}

// The Mats this module makes are float32 of elempack 1; ncnn's layers would take others, but the numpy side of
// vknorm.graph reads only these.
void check_source(const Mat& src, const char* fn) {
  if (src.empty()) refuse(std::string(fn) + ": src is an empty Mat");
  if (src.elemsize != 4 || src.elempack != 1)
    throw nb::type_error((std::string(fn) + ": expected a float32 Mat of elempack 1, got elemsize " +
                          std::to_string(src.elemsize) + ", elempack " + std::to_string(src.elempack))
                             .c_str());
  if (!fits_int(src.w, src.h, src.d, src.c))
    refuse(std::string(fn) + ": src " + shape_of(src) + " has more elements than ncnn's int counts reach (2^31 - 1)");
}

// num_threads as a Net takes it (mat_layout.h). A net's options may be given (pyncnn's model zoo passes net.opt):
// these functions run on the host in float32 whatever storage or device the net uses.
Option host_float32(const Option& opt, const char* fn) {
  if (!vknorm_python::thread_count_ok(opt.num_threads))
    refuse(std::string(fn) + ": opt.num_threads must be 1.." + std::to_string(vknorm_python::kMaxThreads) + ", got " +
           std::to_string(opt.num_threads));
  Option o = opt;
  o.use_vulkan_compute = false;
  o.use_fp16_storage = o.use_fp16_packed = o.use_fp16_arithmetic = false;
  o.use_bf16_storage = o.use_bf16_packed = false;
  return o;
}

// ncnn's layer ran into out; empty there means its allocation failed. A packed result (the x86 layers pack where
// opt.use_packing_layout allows) comes back as elempack 1, as every Mat of this module is.
Mat finished(Mat out, const Option& opt, const char* fn) {
  if (out.empty()) {
    PyErr_SetString(PyExc_MemoryError, (std::string(fn) + ": ncnn could not allocate the result").c_str());
    throw nb::python_error();
  }
  if (out.elempack != 1) {
    Mat unpacked;
    ::ncnn::convert_packing(out, unpacked, 1, opt);
    out = unpacked;
  }
  return out;
}

// run(source, out) with the GIL let go. Each function below takes src by value: it keeps the memory ncnn reads
// whatever Python does with the Mat object meanwhile, and dst may be src. A source whose channels are not at ncnn's
// aligned cstep (a dims 3 view of a dims 4 Mat's channel), which ncnn's Crop assumes, is given to ncnn copied into
// that layout.
template <class Run>
Mat run_released(const Mat& src, const Option& opt, const char* fn, Run&& run) {
  Mat out;
  {
    vknorm_python::ReleaseGil released;
    run(vknorm_python::in_ncnn_layout(src), out);
  }
  return finished(out, opt, fn);
}

std::string widths_of(int top, int bottom, int left, int right, int front, int behind, bool three_d) {
  return "top=" + std::to_string(top) + " bottom=" + std::to_string(bottom) + " left=" + std::to_string(left) +
         " right=" + std::to_string(right) +
         (three_d ? " front=" + std::to_string(front) + " behind=" + std::to_string(behind) : std::string());
}

// Borders along an axis the Mat lacks: ncnn ignores them (or, cutting, refuses some and not others); refused here.
// Left and right are along w, top and bottom along h (dims 2 up), front and behind along what padding_3d pads: the
// channels of dims 3 and the depth of dims 4 (cutting: the depth of dims 4 only, as ncnn's Crop).
// Checked before both padding and cutting: `what` names the widths in the message; the widths as text are returned.
std::string checked_borders(const Mat& src, int top, int bottom, int left, int right, int front, int behind,
                            bool three_d, int front_from_dims, const char* what, const char* fn) {
  const std::string widths = widths_of(top, bottom, left, right, front, behind, three_d);
  if (top < 0 || bottom < 0 || left < 0 || right < 0 || front < 0 || behind < 0)
    refuse(std::string(fn) + ": " + what + " must be >= 0, got " + widths);
  if (src.dims < 2 && (top || bottom))
    refuse(std::string(fn) + ": a Mat of dims 1 has no rows: top and bottom must be 0, got top=" +
           std::to_string(top) + " bottom=" + std::to_string(bottom));
  if (src.dims < front_from_dims && (front || behind))
    refuse(std::string(fn) + ": front and behind apply to a Mat of dims " + std::to_string(front_from_dims) +
           (front_from_dims == 3 ? " or 4" : "") + ", not dims " + std::to_string(src.dims) + ": got front=" +
           std::to_string(front) + " behind=" + std::to_string(behind));
  return widths;
}

// Padding (type 0 constant, 1 replicate, 2 reflect) by ncnn's Padding layer.
Mat make_border(Mat src, int top, int bottom, int left, int right, int front, int behind, long long type, float v,
                const Option& given, bool three_d) {
  const char* fn = three_d ? "copy_make_border_3d" : "copy_make_border";
  check_source(src, fn);
  const Option opt = host_float32(given, fn);
  const std::string widths =
      checked_borders(src, top, bottom, left, right, front, behind, three_d, 3, "border widths", fn);
  if (type < 0 || type > 2)
    refuse(std::string(fn) + ": type must be BorderType.BORDER_CONSTANT (0), BORDER_REPLICATE (1) or "
           "BORDER_REFLECT (2), got " + std::to_string(type));
  const long long extent = src.dims == 4 ? src.d : src.dims == 3 ? src.c : 1;  // what front and behind pad
  // A reflection reads as far into the Mat as the border is wide: it must be narrower than the Mat.
  if (type == 2 && (left >= src.w || right >= src.w || top >= src.h || bottom >= src.h || front >= extent ||
                    behind >= extent))
    refuse(std::string(fn) + ": BORDER_REFLECT needs each border narrower than the Mat " + shape_of(src) +
           " along it, got " + widths);
  const long long w = (long long)src.w + left + right, h = (long long)src.h + top + bottom;
  const long long d = src.dims == 4 ? (long long)src.d + front + behind : 1;
  const long long c = src.dims == 3 ? (long long)src.c + front + behind : src.c;
  check_result_size(w, h, d, c, fn);
  return run_released(src, opt, fn, [&](const Mat& source, Mat& out) {
    if (three_d)
      ::ncnn::copy_make_border_3d(source, out, top, bottom, left, right, front, behind, int(type), v, opt);
    else
      ::ncnn::copy_make_border(source, out, top, bottom, left, right, int(type), v, opt);
  });
}

// Cropping by ncnn's Crop layer.
Mat cut_border(Mat src, int top, int bottom, int left, int right, int front, int behind, const Option& given,
               bool three_d) {
  const char* fn = three_d ? "copy_cut_border_3d" : "copy_cut_border";
  check_source(src, fn);
  const Option opt = host_float32(given, fn);
  const std::string widths = checked_borders(src, top, bottom, left, right, front, behind, three_d, 4, "borders", fn);
  // ncnn checks only that the cuts do not overlap; cutting all of a side away leaves it a Mat of no elements.
  if ((long long)left + right >= src.w || (src.dims >= 2 && (long long)top + bottom >= src.h) ||
      (src.dims == 4 && (long long)front + behind >= src.d))
    refuse(std::string(fn) + ": cutting " + widths + " from a Mat " + shape_of(src) + " leaves nothing");
  return run_released(src, opt, fn, [&](const Mat& source, Mat& out) {
    // ncnn's copy_cut_border gives a dims 4 Mat of depth 0 (it sets no depth for Crop): the 3d form with no depth
    // cut is what it means
    if (three_d || src.dims == 4)
      ::ncnn::copy_cut_border_3d(source, out, top, bottom, left, right, front, behind, opt);
    else
      ::ncnn::copy_cut_border(source, out, top, bottom, left, right, opt);
  });
}

// Interp's resize types, as ncnn's resize_nearest (1), resize_bilinear (2) and resize_bicubic (3).
Mat resized(Mat src, int w, int h, int resize_type, const Option& given) {
  const char* fn = resize_type == 1 ? "resize_nearest" : resize_type == 2 ? "resize_bilinear" : "resize_bicubic";
  check_source(src, fn);
  const Option opt = host_float32(given, fn);
  // ncnn's Interp reads 0 as "keep the size" only when both are 0, and w x h of a negative size
  if (w < 1 || h < 1) refuse(std::string(fn) + ": w and h must be >= 1, got w=" + std::to_string(w) + " h=" + std::to_string(h));
  // Interp takes a dims 4 Mat for a dims 3 one: it would resize each channel's first depth slice only
  if (src.dims == 4) refuse(std::string(fn) + ": a Mat of dims 4 " + shape_of(src) + " is not resized by ncnn (dims 1-3)");
  // ncnn's rules for the other dims: a dims 1 Mat becomes w channels of h x w, each filled with its value; a dims 2
  // Mat has each of its rows resized to w (h is not used)
  const long long c = src.dims == 1 ? src.w : src.dims == 3 ? src.c : 1;
  check_result_size(w, src.dims == 2 ? src.h : h, 1, c, fn);
  // ncnn's x86 Interp sizes its coefficient tables in int: 3 (bilinear) or 5 (bicubic) ints per output column and row
  const long long per = resize_type == 2 ? 3 : resize_type == 3 ? 5 : 0;
  if (per * ((long long)w + h) > INT_MAX)
    refuse(std::string(fn) + ": w + h must be at most " + std::to_string(INT_MAX / per) + " (ncnn counts its "
           "coefficient tables in int), got w=" + std::to_string(w) + " h=" + std::to_string(h));
  return run_released(src, opt, fn, [&](const Mat& source, Mat& out) {
    if (resize_type == 1)
      ::ncnn::resize_nearest(source, out, w, h, opt);
    else if (resize_type == 2)
      ::ncnn::resize_bilinear(source, out, w, h, opt);
    else
      ::ncnn::resize_bicubic(source, out, w, h, opt);
  });
}

Mat flattened(Mat src, const Option& given) {
  check_source(src, "flatten");
  const Option opt = host_float32(given, "flatten");
  check_result_size((long long)src.w * src.h * src.d * src.c, 1, 1, 1, "flatten");  // src fits: no overflow
  return run_released(src, opt, "flatten", [&](const Mat& source, Mat& out) { ::ncnn::flatten(source, out, opt); });
}

}  // namespace

namespace vknorm_python {

void define_mat_functions(nb::module_& m) {
  nb::enum_<::ncnn::BorderType>(m, "BorderType", nb::is_arithmetic())
      .value("BORDER_CONSTANT", ::ncnn::BORDER_CONSTANT)
      .value("BORDER_REPLICATE", ::ncnn::BORDER_REPLICATE)
      .value("BORDER_REFLECT", ::ncnn::BORDER_REFLECT);

  // pyncnn's two forms of each: the result returned, or written into dst (which may be src).
  m.def(
      "copy_make_border",
      [](const Mat& src, Mat& dst, int top, int bottom, int left, int right, long long type, float v, const Option& opt) {
        dst = make_border(src, top, bottom, left, right, 0, 0, type, v, opt, false);
      },
      "src"_a, "dst"_a, "top"_a, "bottom"_a, "left"_a, "right"_a, "type"_a, "v"_a, "opt"_a = Option());
  m.def(
      "copy_make_border",
      [](const Mat& src, int top, int bottom, int left, int right, long long type, float v, const Option& opt) {
        return make_border(src, top, bottom, left, right, 0, 0, type, v, opt, false);
      },
      "src"_a, "top"_a, "bottom"_a, "left"_a, "right"_a, "type"_a = 0, "v"_a = 0.f, "opt"_a = Option());
  m.def(
      "copy_make_border_3d",
      [](const Mat& src, Mat& dst, int top, int bottom, int left, int right, int front, int behind, long long type,
         float v, const Option& opt) {
        dst = make_border(src, top, bottom, left, right, front, behind, type, v, opt, true);
      },
      "src"_a, "dst"_a, "top"_a, "bottom"_a, "left"_a, "right"_a, "front"_a, "behind"_a, "type"_a, "v"_a,
      "opt"_a = Option());
  m.def(
      "copy_make_border_3d",
      [](const Mat& src, int top, int bottom, int left, int right, int front, int behind, long long type, float v,
         const Option& opt) { return make_border(src, top, bottom, left, right, front, behind, type, v, opt, true); },
      "src"_a, "top"_a, "bottom"_a, "left"_a, "right"_a, "front"_a, "behind"_a, "type"_a = 0, "v"_a = 0.f,
      "opt"_a = Option());
  m.def(
      "copy_cut_border",
      [](const Mat& src, Mat& dst, int top, int bottom, int left, int right, const Option& opt) {
        dst = cut_border(src, top, bottom, left, right, 0, 0, opt, false);
      },
      "src"_a, "dst"_a, "top"_a, "bottom"_a, "left"_a, "right"_a, "opt"_a = Option());
  m.def(
      "copy_cut_border",
      [](const Mat& src, int top, int bottom, int left, int right, const Option& opt) {
        return cut_border(src, top, bottom, left, right, 0, 0, opt, false);
      },
      "src"_a, "top"_a, "bottom"_a, "left"_a, "right"_a, "opt"_a = Option());
  m.def(
      "copy_cut_border_3d",
      [](const Mat& src, Mat& dst, int top, int bottom, int left, int right, int front, int behind, const Option& opt) {
        dst = cut_border(src, top, bottom, left, right, front, behind, opt, true);
      },
      "src"_a, "dst"_a, "top"_a, "bottom"_a, "left"_a, "right"_a, "front"_a, "behind"_a, "opt"_a = Option());
  m.def(
      "copy_cut_border_3d",
      [](const Mat& src, int top, int bottom, int left, int right, int front, int behind, const Option& opt) {
        return cut_border(src, top, bottom, left, right, front, behind, opt, true);
      },
      "src"_a, "top"_a, "bottom"_a, "left"_a, "right"_a, "front"_a, "behind"_a, "opt"_a = Option());
  const std::pair<const char*, int> resizes[] = {{"resize_nearest", 1}, {"resize_bilinear", 2}, {"resize_bicubic", 3}};
  for (const auto& [name, resize_type] : resizes) {
    m.def(
        name,
        [resize_type = resize_type](const Mat& src, Mat& dst, int w, int h, const Option& opt) {
          dst = resized(src, w, h, resize_type, opt);
        },
        "src"_a, "dst"_a, "w"_a, "h"_a, "opt"_a = Option());
    m.def(
        name,
        [resize_type = resize_type](const Mat& src, int w, int h, const Option& opt) {
          return resized(src, w, h, resize_type, opt);
        },
        "src"_a, "w"_a, "h"_a, "opt"_a = Option());
  }
  m.def(
      "flatten", [](const Mat& src, Mat& dst, const Option& opt) { dst = flattened(src, opt); }, "src"_a, "dst"_a,
      "opt"_a = Option());
  m.def(
      "flatten", [](const Mat& src, const Option& opt) { return flattened(src, opt); }, "src"_a, "opt"_a = Option());
}

}  // namespace vknorm_python

// nanobind module vknorm._core: the C++ core as Python sees it. Argument policy (dtypes, defaults,
// device strings) lives in python/vknorm/layers.py; this file only converts and releases the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/stl/map.h>

#include <algorithm>
#include <array>
#include <climits>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <string>

#include "dispatch.h"
#include "numpy_shape.h"
#include "release_gil.h"
#include "shaders.h"
#include "vknorm/vknorm.h"

namespace nb = nanobind;
using vknorm_python::ReleaseGil;
using namespace nb::literals;
using namespace vknorm;

namespace {

// nb::ro: from_numpy, VkMat.upload and forward_numpy only read, so read-only arrays (a memory map, np.frombuffer,
// np.broadcast_to) are taken too.
using Array = nb::ndarray<nb::numpy, nb::ro, nb::c_contig, nb::device::cpu>;

// Weights as float32 numpy arrays both ways: a Python list of them costs ~90 bytes a value (bench's widest rows,
// 2^28 values of gamma and beta, took the host's memory before the input was made).
using Weights = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
std::vector<float> weight_vector(const Weights& w) { return std::vector<float>(w.data(), w.data() + w.shape(0)); }
nb::ndarray<nb::numpy, float> weight_array(const std::vector<float>& v) {
  auto* data = new float[v.size()];
  std::copy(v.begin(), v.end(), data);
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  const size_t shape[1] = {v.size()};
  return nb::ndarray<nb::numpy, float>(data, 1, shape, owner);
}

// A numpy shape (w), (h, w), (c, h, w), (c, d, h, w) as ncnn's extents {w, h, d, c} (1 where absent).
std::array<int, 4> ncnn_extents(const std::vector<int64_t>& shape) {
  const size_t nd = shape.size();
  if (nd < 1 || nd > 4) throw std::invalid_argument("expected 1-4 dims, got " + std::to_string(nd));
  std::array<int, 4> out{1, 1, 1, 1};
  const int order[4][4] = {{0}, {1, 0}, {3, 1, 0}, {3, 2, 1, 0}};
  for (size_t i = 0; i < nd; ++i) {
    if (shape[i] < 1 || shape[i] > int64_t(INT32_MAX)) {  // ncnn's Mat sizes are int
      std::string dims;
      for (size_t k = 0; k < nd; ++k) dims += (k ? ", " : "") + std::to_string(shape[k]);
      throw std::invalid_argument("every dimension must be 1..2^31-1 (ncnn's Mat sizes are int), got shape (" +
                                  dims + ")");
    }
    out[order[nd - 1][i]] = int(shape[i]);
  }
  return out;
}

// m's shape as numpy lays it out: unpacked, in `scalar_bytes`, dense (cstep w*h*d: no padding anywhere).
Mat numpy_layout(const Mat& m, size_t scalar_bytes) {
  Mat l = layout_as(m, scalar_bytes, 1);
  l.cstep = size_t(l.w) * l.h * l.d;
  return l;
}

// A C-contiguous numpy array of (w), (h, w), (c, h, w), (c, d, h, w), as a Mat over its memory (it is only read).
Mat numpy_view(const Array& a) {
  const size_t nd = a.ndim();
  if (nd < 1 || nd > 4) throw std::invalid_argument("expected 1-4 dims, got " + std::to_string(nd));
  const bool f16 = a.dtype().code == uint8_t(nb::dlpack::dtype_code::Float) && a.dtype().bits == 16;
  const bool f32 = a.dtype() == nb::dtype<float>();
  if (!f16 && !f32) throw std::invalid_argument("expected float32 or float16 data");
  // Read as float / uint16_t: an array at an odd address (np.frombuffer(buf, offset=1)) is copied first by the
  // layers; here it is refused rather than read through misaligned pointers.
  if (reinterpret_cast<uintptr_t>(a.data()) % (f16 ? 2 : 4) != 0)
    throw std::invalid_argument(std::string("the array's data is not aligned to its ") + (f16 ? "2" : "4") +
                                "-byte scalars; np.require(a, requirements='CA') gives an aligned copy");
  std::vector<int64_t> dims(nd);
  for (size_t i = 0; i < nd; ++i) dims[i] = int64_t(a.shape(i));
  const std::array<int, 4> shape = ncnn_extents(dims);
  const Mat l = Mat::layout(int(nd), shape[0], shape[1], shape[2], shape[3], f16 ? 2 : 4, 1);
  return Mat::external(numpy_layout(l, l.scalar_bytes()), const_cast<void*>(a.data()));
}

// numpy -> elempack-1 Mat of its own (ncnn's cstep), as pyncnn's Mat(numpy) does.
Mat mat_from_numpy(const Array& a) {
  const Mat view = numpy_view(a);
  return converted(view, view.scalar_bytes(), 1);
}

// An array as from_numpy and upload take it: numpy's conversions made (a broadcast or strided view made contiguous),
// or what cannot be taken named (nanobind's own message lists the overloads).
Array converted_array(const char* call, nb::handle a) {
  try {
    return nb::cast<Array>(a);  // with numpy's conversions
  } catch (const nb::cast_error&) {
  }
  std::string got = nb::type_name(a.type()).c_str();
  if (nb::hasattr(a, "dtype") && nb::hasattr(a, "shape"))
    got = "an array of dtype " + nb::cast<std::string>(a.attr("dtype").attr("str"));
  throw nb::type_error((std::string(call) + ": expected a float32 or float16 numpy array in native byte order, got " +
                        got + " (np.ascontiguousarray(a, np.float32) converts it)").c_str());
}

// A Mat already laid out as numpy's array would be (unpacked, no padding between channels): viewed where it lies.
bool numpy_viewable(const Mat& m) { return m.elempack == 1 && (m.dims <= 2 || m.cstep == m.outer_elems()) && m.data(); }

nb::ndarray<nb::numpy> mat_to_numpy(const Mat& m, bool copy) {
  const size_t sb = m.scalar_bytes();
  nb::dlpack::dtype dt = sb == 2 ? nb::dtype<uint16_t>() : nb::dtype<float>();
  if (sb == 2) dt.code = uint8_t(nb::dlpack::dtype_code::Float);
  const Mat dense = numpy_layout(m, sb);
  const std::vector<size_t> shape = numpy_shape(dense.dims, dense.w, dense.h, dense.d, dense.c);
  const bool view = !copy && numpy_viewable(m);
  std::shared_ptr<const void> memory = view ? m.storage() : std::make_shared<HostMemory>(dense.bytes(), false);
  unsigned char* data = view ? const_cast<unsigned char*>(m.data()) : static_cast<const HostMemory*>(memory.get())->data;
  if (data != m.data()) convert_into(m, dense, data);  // every byte of the array written
  auto* keep = new std::shared_ptr<const void>(std::move(memory));
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<const void>*>(p); });
  return nb::ndarray<nb::numpy>(data, shape.size(), shape.data(), owner, nullptr, dt);
}

nb::dict device_dict(const DeviceInfo& d) {
  nb::dict r;
  r["index"] = d.index;
  r["name"] = d.name;
  r["type"] = d.type;
  r["vendor_id"] = d.vendor_id;
  r["device_id"] = d.device_id;
  r["driver_name"] = d.driver_name;
  r["driver_info"] = d.driver_info;
  r["driver_version"] = d.driver_version;
  r["api_version"] = d.api_version;
  r["subgroup_size"] = d.subgroup_size;
  r["subgroup_ops"] = d.subgroup_ops;
  r["subgroup_compute"] = d.subgroup_compute;
  r["storage_16bit"] = d.storage_16bit;
  r["float16_arithmetic"] = d.float16_arithmetic;
  r["max_shared_memory"] = d.max_shared_memory;
  r["compute_units"] = d.compute_units;
  r["max_workgroup_invocations"] = d.max_workgroup_invocations;
  r["max_storage_buffer_range"] = d.max_storage_buffer_range;
  r["device_local_bytes"] = d.device_local_bytes;
  r["timestamp_period_ns"] = d.timestamp_period_ns;
  r["timestamps"] = d.timestamps;
  return r;
}

NormOp op_from_name(const std::string& op) {
  for (NormOp o : {NormOp::LayerNorm, NormOp::RMSNorm, NormOp::GroupNorm, NormOp::InstanceNorm})
    if (op == op_name(o)) return o;
  throw std::invalid_argument("op must be LayerNorm, RMSNorm, GroupNorm or InstanceNorm, got " + op);
}

nb::dict dispatch_dict(const DispatchInfo& i) {
  nb::dict r;
  r["path"] = path_name(i.path);
  r["dispatches"] = i.dispatches;
  r["workgroup_size"] = i.workgroup_size;
  r["team"] = i.team;
  r["items"] = i.items;
  r["chunks"] = i.chunks;
  r["subgroup"] = i.subgroup;
  r["vec4"] = i.vec4;
  r["one_reduction"] = i.one_reduction;
  r["hold_storage"] = i.hold_storage;
  r["prefetch"] = i.prefetch;
  r["plane_weights"] = i.plane_weights;
  r["lane_groups"] = i.lane_groups;
  r["apply_last_first"] = i.apply_last_first;
  r["gpu_us"] = i.gpu_us;
  r["pieces"] = i.pieces;
  return r;
}

// A VkMat's blob as stored (its packing and scalar size), no memory: what numpy() unpacks, shape and dtype say.
Mat stored_layout(const VkMat& v) {
  return Mat::layout(v.dims, v.w, v.h, v.d, v.c, v.elemsize / std::max(v.elempack, 1), v.elempack);
}
nb::tuple vkmat_shape(const VkMat& v) {
  const Mat l = numpy_layout(stored_layout(v), 4);
  nb::list shape;
  for (size_t e : numpy_shape(l.dims, l.w, l.h, l.d, l.c)) shape.append(e);
  return nb::tuple(shape);
}
std::string vkmat_dtype(const VkMat& v) { return stored_layout(v).scalar_bytes() == 2 ? "float16" : "float32"; }

}  // namespace

NB_MODULE(_core, m) {
  vknorm_python::define_leak_warning_switch(m);
  nb::exception<VulkanUnavailable>(m, "VulkanUnavailableError", PyExc_RuntimeError);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const DeviceOutOfMemory& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    }
  });

  m.def("devices", [] {
    std::vector<nb::dict> out;
    for (const auto& d : enumerate_devices()) out.push_back(device_dict(d));
    return out;
  });
  m.def("default_device_index", &default_device_index);
  m.def("validation_enabled", &validation_enabled);
  m.def("validation_messages", &validation_messages);
  m.def("clear_validation_messages", &clear_validation_messages);
  // The SPIR-V embedded in this build (tests validate it where no build tree is at hand).
  m.def("shader_variants", [] {
    std::vector<std::string> out;
    for (const char* n : shaders::names()) out.emplace_back(n);
    return out;
  });
  m.def("shader_spirv", [](const std::string& name) {
    const shaders::Spirv spv = shaders::find(name.c_str());
    if (!spv.words) throw std::invalid_argument("no embedded shader variant named " + name);
    return nb::bytes(reinterpret_cast<const char*>(spv.words), spv.count * sizeof(uint32_t));
  }, "name"_a);

  nb::class_<Context>(m, "Context")
      .def_static(
          "create",
          [](nb::handle index) {  // an integer (numpy's too): True is not device 1
            if (PyBool_Check(index.ptr()) || !PyIndex_Check(index.ptr()))
              throw nb::type_error(("Context.create: index must be an int (a device index, or -1 for the default), "
                                    "got " + std::string(Py_TYPE(index.ptr())->tp_name)).c_str());
            nb::object value = nb::steal(PyNumber_Index(index.ptr()));
            if (!value.is_valid()) throw nb::python_error();
            int overflow = 0;
            const long long i = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
            if (overflow || i < INT_MIN || i > INT_MAX)  // past any device count: said as Context::create says it
              throw nb::value_error((std::string("device index ") + nb::str(value).c_str() + " out of range").c_str());
            return Context::create(int(i));
          },
          "index"_a = -1, nb::sig("def create(index: int = -1) -> Context"))
      .def_static("default", &Context::default_context)
      .def_static("release_default", &Context::release_default)
      .def_prop_ro("info", [](const Context& c) { return device_dict(c.info()); })
      .def_prop_ro("device_bytes_in_use", &Context::device_bytes_in_use)
      .def_prop_ro("device_bytes_peak", &Context::device_bytes_peak)
      .def_prop_ro("live_buffers", &Context::live_buffers)
      .def_prop_ro("pipelines", &Context::pipelines)
      .def_prop_ro("pipelines_made", &Context::pipelines_made)
      .def_prop_ro("device_bytes_cached", &Context::device_bytes_cached)
      .def_prop_ro("cached_buffers", &Context::cached_buffers)
      .def_prop_ro("fence_spin_us", &Context::fence_spin_us)
      .def_prop_ro("host_reads_cached", &Context::host_reads_cached)
      .def_prop_ro("device_allocations", &Context::device_allocations)
      .def("release_cached_buffers", &Context::release_cached_buffers);

  nb::enum_<Path>(m, "Path")
      .value("auto", Path::Auto)
      .value("subgroup", Path::Subgroup)
      .value("workgroup", Path::Workgroup)
      .value("split", Path::Split)
      .value("cooperative", Path::Cooperative);
  m.def("parse_path", &parse_path);
  // pyncnn calls a Python layer's methods from ncnn's C++, where no exception may go: not even the KeyboardInterrupt
  // Python raises on entering a method (Ctrl-C pressed while ncnn's own layers ran), before any try inside it. What
  // fn raises is dropped for ncnn's -1; an interrupt is given back to the main thread, where it surfaces in the next
  // Python code run outside such a call (the user's, once the extract is back).
  m.def("call_from_cpp", [](nb::callable fn, nb::args args) -> int {
    try {
      return nb::cast<int>(fn(*args));
    } catch (nb::python_error& e) {
      if (e.matches(PyExc_KeyboardInterrupt))
        PyErr_SetInterruptEx(SIGINT);
      else
        e.discard_as_unraisable("a vknorm layer called from ncnn");
    } catch (const std::exception& e) {  // (fn's result not an int)
      PySys_WriteStderr("vknorm: a layer called from ncnn: %s\n", e.what());
    }
    return -1;
  });
  m.def("env_flag", &env_flag, "name"_a);  // a switch as the runtime reads it (ValueError for a word it does not take)
  m.def("setting_problems", [] {  // what the runtime would refuse of the VKNORM_ settings set now
    nb::list out;
    for (const auto& [name, error] : setting_problems()) {
      nb::dict d;
      d["name"] = name, d["error"] = error;
      out.append(d);
    }
    return out;
  });

  nb::class_<Option>(m, "Option")
      .def(nb::init<>())
      .def_rw("use_fp16_storage", &Option::use_fp16_storage)
      .def_rw("use_packing_layout", &Option::use_packing_layout)
      .def_rw("path", &Option::path)
      .def_rw("use_subgroup_ops", &Option::use_subgroup_ops)
      .def_rw("max_workgroup_size", &Option::max_workgroup_size);

  nb::class_<Mat>(m, "Mat")
      .def_static("from_numpy", [](nb::handle a) { return mat_from_numpy(converted_array("Mat.from_numpy", a)); },
                  "array"_a)
      .def("numpy", &mat_to_numpy, "copy"_a = true,
           "A numpy array of the blob, unpacked; copy=False views the Mat's own memory where it is unpacked and has "
           "no padding between channels (the array then keeps that memory alive)")
      // numpy's protocol (np.asarray(m), np.array(m)): m.numpy(); copy=False where only a copy can give the array is
      // numpy's ValueError
      .def("__array__",
           [](const Mat& self, nb::handle dtype, nb::handle copy) {
             const bool must_copy = !copy.is_none() && nb::cast<bool>(copy);
             if (!copy.is_none() && !must_copy && !numpy_viewable(self))
               throw nb::value_error("this Mat is packed or has padding between channels: numpy needs a copy of it");
             nb::object a = nb::cast(mat_to_numpy(self, must_copy));
             if (dtype.is_none()) return a;
             nb::object as = a.attr("astype")(dtype, "copy"_a = must_copy);
             if (!copy.is_none() && !must_copy && !as.is(a))  // astype copied: numpy's own arrays refuse this too
               throw nb::value_error(("copy=False: this Mat holds " + nb::cast<std::string>(a.attr("dtype").attr("name")) +
                                      "; numpy needs a copy of it for another dtype").c_str());
             return as;
           },
           "dtype"_a = nb::none(), "copy"_a = nb::none())
      .def("__repr__",
           [](const Mat& self) {
             const Mat dense = numpy_layout(self, self.scalar_bytes());
             const nb::object shape = nb::tuple(nb::cast(numpy_shape(dense.dims, dense.w, dense.h, dense.d, dense.c)));
             return "Mat(shape=" + nb::cast<std::string>(nb::repr(shape)) + ", dtype=" +
                    (self.scalar_bytes() == 2 ? "float16" : "float32") + ", elempack=" + std::to_string(self.elempack) + ")";
           })
      .def("convert_packing", [](const Mat& self, int elempack) { return convert_packing(self, elempack); }, "elempack"_a)
      .def("cast_fp16", [](const Mat& self) { return cast_fp16(self); })
      .def("cast_fp32", [](const Mat& self) { return cast_fp32(self); })
      .def("raw", [](const Mat& self) {  // the bytes as stored, cstep padding included
        return nb::bytes(reinterpret_cast<const char*>(self.data()), self.bytes());
      })
      .def_ro("dims", &Mat::dims)
      .def_ro("w", &Mat::w)
      .def_ro("h", &Mat::h)
      .def_ro("d", &Mat::d)
      .def_ro("c", &Mat::c)
      .def_ro("elemsize", &Mat::elemsize)
      .def_ro("elempack", &Mat::elempack)
      .def_ro("cstep", &Mat::cstep);

  nb::class_<VkMat>(m, "VkMat")
      .def_static("upload", &VkMat::upload, "mat"_a, "context"_a, "option"_a, nb::call_guard<ReleaseGil>())
      .def_static(
          "upload",
          [](nb::handle a, std::shared_ptr<Context> ctx, const Option& opt) {
            const Array converted = converted_array("VkMat.upload", a);  // read where it lies (or numpy's copy)
            const Mat view = numpy_view(converted);
            ReleaseGil release;
            return VkMat::upload(view, std::move(ctx), opt);
          },
          "array"_a, "context"_a, "option"_a)
      .def("download", nb::overload_cast<>(&VkMat::download, nb::const_), nb::call_guard<ReleaseGil>())
      .def(
          "numpy",
          [](const VkMat& v, nb::handle dtype) {
            // Unpacked, in the VkMat's storage or the dtype asked for, converted as it leaves the staging memory.
            const Mat stored = stored_layout(v);
            size_t scalar = stored.scalar_bytes();
            if (!dtype.is_none()) {
              const std::string name = nb::cast<std::string>(nb::module_::import_("numpy").attr("dtype")(dtype).attr("name"));
              if (name != "float32" && name != "float16")
                throw std::invalid_argument("VkMat.numpy: dtype must be float32 or float16, got " + name);
              scalar = name == "float16" ? 2 : 4;
            }
            Mat out = Mat::create_for_overwrite(numpy_layout(stored, scalar));
            {
              ReleaseGil release;
              v.download(out);
            }
            return mat_to_numpy(out, false);
          },
          "dtype"_a = nb::none(),
          "The blob as a numpy array, unpacked, in the VkMat's storage (or dtype: float32 / float16)")
      .def_prop_ro("context", &VkMat::context)
      // What numpy() gives: the unpacked shape in numpy's order, and the storage's dtype name.
      .def_prop_ro("shape", [](const VkMat& v) { return vkmat_shape(v); })
      .def_prop_ro("dtype", [](const VkMat& v) { return vkmat_dtype(v); })
      .def("__repr__",
           [](const VkMat& v) {
             const std::string shape = nb::cast<std::string>(nb::repr(vkmat_shape(v)));
             return "VkMat(shape=" + shape + ", dtype=" + vkmat_dtype(v) + ", elempack=" + std::to_string(v.elempack) +
                    ", device='" + (v.context() ? v.context()->info().name : std::string("none")) + "')";
           })
      // A GPU array converts to numpy only when asked (as cupy's): np.asarray(v) made a 0-d object array.
      .def("__array__",
           [](const VkMat&, nb::args, nb::kwargs) {
             throw nb::type_error("a VkMat lives on the device: download it with v.numpy() (numpy does not convert "
                                  "it implicitly)");
           })
      .def_prop_ro("bytes", &VkMat::bytes)
      .def_prop_ro("element_bytes", &VkMat::element_bytes)
      .def_ro("dims", &VkMat::dims)
      .def_ro("w", &VkMat::w)
      .def_ro("h", &VkMat::h)
      .def_ro("d", &VkMat::d)
      .def_ro("c", &VkMat::c)
      .def_ro("elemsize", &VkMat::elemsize)
      .def_ro("elempack", &VkMat::elempack)
      .def_ro("cstep", &VkMat::cstep);

  m.def("copy_repeated", &copy_repeated, "mat"_a, "warmup"_a, "reps"_a, "shader"_a,
        nb::call_guard<ReleaseGil>());
  // The bytes one storage-buffer binding may hold on a device of this maxStorageBufferRange, as the planner takes
  // it (VKNORM_MAX_BUFFER_BYTES lowers it), and which of the two applies.
  m.def("binding_limit", [](uint64_t max_storage_buffer_range) {
    const BindingLimit l = binding_limit(max_storage_buffer_range);
    return std::make_tuple(l.bytes, std::string(l.why));
  }, "max_storage_buffer_range"_a);
  // ncnn's cstep (elements between channels) of a blob of this shape and element size.
  m.def("ncnn_cstep", &ncnn_cstep, "dims"_a, "w"_a, "h"_a, "d"_a, "elemsize"_a);
  // How a blob of this shape (ncnn order, packed counts) splits into pieces of at most max_bytes; no
  // memory is touched, so the 32-bit limits can be tested on shapes far larger than any device.
  m.def("plan_pieces", [](int dims, int w, int h, int d, int c, int elempack, int scalar_bytes, int affine_size,
                          bool affine, uint64_t max_bytes) {
    if (scalar_bytes != 2 && scalar_bytes != 4) throw std::invalid_argument("scalar_bytes must be 2 or 4");
    const size_t elemsize = size_t(scalar_bytes) * elempack;
    const size_t cstep = ncnn_cstep(dims, w, h, d, elemsize);
    const GroupLayout g = group_layout(dims, w, h, d, c, cstep, elempack, affine_size, affine);
    std::vector<nb::dict> out;
    for (const Piece& p : plan_pieces(g, elemsize, uint64_t(cstep) * (dims >= 3 ? c : 1) * elemsize, max_bytes)) {
      nb::dict r;
      r["offset"] = p.offset;
      r["bytes"] = p.bytes;
      r["group_size"] = p.layout.group_size;
      r["gpc"] = p.layout.gpc;
      r["cstep"] = p.layout.cstep;
      r["n_groups"] = p.layout.n_groups;
      out.push_back(r);
    }
    return out;
  }, "dims"_a, "w"_a, "h"_a, "d"_a, "c"_a, "elempack"_a, "scalar_bytes"_a, "affine_size"_a, "affine"_a, "max_bytes"_a);
  // The dispatcher's plan for a blob of this shape on a device described by `device` (the fields of
  // DeviceInfo that planning reads, plus subgroup_reduce): the policy as data, for any GPU, without one.
  m.def("plan_for_device", [](const std::string& op, int affine_size, int group, int channels, int dims, int w,
                              int h, int d, int c, int elempack, bool fp16, nb::dict device, const std::string& path) {
    NormParams p;
    p.op = op_from_name(op);
    p.affine_size = affine_size, p.group = group, p.channels = channels;
    p.check();
    DeviceInfo info;
    info.type = nb::cast<std::string>(device["type"]);
    info.subgroup_size = nb::cast<uint32_t>(device["subgroup_size"]);
    info.max_shared_memory = nb::cast<uint32_t>(device["max_shared_memory"]);
    info.max_workgroup_invocations = nb::cast<uint32_t>(device["max_workgroup_invocations"]);
    info.max_workgroup_size_x = nb::cast<uint32_t>(device["max_workgroup_size_x"]);
    info.max_workgroup_count_x = nb::cast<uint32_t>(device["max_workgroup_count_x"]);
    if (device.contains("compute_units")) info.compute_units = nb::cast<uint32_t>(device["compute_units"]);
    Option opt;
    opt.use_fp16_storage = fp16;
    opt.use_packing_layout = elempack == 4;
    opt.path = parse_path(path);
    const size_t cstep = ncnn_cstep(dims, w, h, d, size_t(fp16 ? 2 : 4) * elempack);
    const GroupLayout g = p.layout(dims, w, h, d, c, cstep, elempack);
    const ForwardPlan fp = plan_forward(p.op, p.affine != 0, p.eps, g, fp16,
                                        device_caps(info, nb::cast<bool>(device["subgroup_reduce"]), opt), opt);
    nb::dict r = dispatch_dict(dispatch_info(fp));
    std::vector<std::string> variants;
    for (const Pass& pass : fp.passes) variants.push_back(pass.variant);
    r["variants"] = variants;
    r["counters_bytes"] = fp.counters ? fp.coefs_bytes : 0;  // the cooperative kernel's counters (slot 4)
    // channel planes one item spans (constant id 8 of the kernel, the last pass): what plane weights hold
    r["planes"] = fp.passes.empty() ? 0u : fp.passes.back().specialization.at(8);
    // how many rounds of polls the cooperative kernel's waits take before giving up (its constant id 19)
    if (!fp.passes.empty() && fp.passes.back().variant.rfind("norm_cooperative", 0) == 0)
      r["wait_rounds"] = fp.passes.back().specialization.at(19);
    return r;
  }, "op"_a, "affine_size"_a, "group"_a, "channels"_a, "dims"_a, "w"_a, "h"_a, "d"_a, "c"_a, "elempack"_a, "fp16"_a,
     "device"_a, "path"_a = "auto");
  m.def("group_layout", [](const Mat& x, int affine_size, bool affine) {
    GroupLayout g = group_layout(x.dims, x.w, x.h, x.d, x.c, x.cstep, x.elempack, affine_size, affine);
    nb::dict r;
    r["group_size"] = g.group_size;
    r["groups"] = g.groups();
    r["groups_per_channel"] = g.gpc;
    return r;
  });

  nb::class_<Norm>(m, "Norm")
      .def("__init__", [](Norm* self, const std::string& op) { new (self) Norm(op_from_name(op)); })
      .def_prop_ro("op", [](const Norm& n) { return op_name(n.op); })
      .def_ro("affine_size", &Norm::affine_size)
      .def_ro("group", &Norm::group)
      .def_ro("channels", &Norm::channels)
      // How an elempack-1 input of this numpy shape splits into groups under this layer's params (no memory
      // is touched: the shape alone decides).
      .def("group_layout", [](const Norm& n, const std::vector<int64_t>& shape) {
        const int nd = int(shape.size());
        const std::array<int, 4> s = ncnn_extents(shape);  // w, h, d, c
        const GroupLayout g = n.layout(nd, s[0], s[1], s[2], s[3], ncnn_cstep(nd, s[0], s[1], s[2], 4), 1);
        nb::dict r;
        r["group_size"] = g.group_size;  // elempack 1: elements of one group
        r["groups"] = g.groups();
        r["planes"] = g.planes;
        return r;
      })
      .def_ro("eps", &Norm::eps)
      .def_ro("affine", &Norm::affine)
      .def_prop_ro("gamma_data", [](const Norm& n) { return weight_array(n.gamma_data); }, nb::rv_policy::move)
      .def_prop_ro("beta_data", [](const Norm& n) { return weight_array(n.beta_data); }, nb::rv_policy::move)
      // Every call that takes the layer's lock releases the GIL first: a thread holding that lock may need the
      // GIL (dropping the layer's device state drops a Context that Python made), so one holding the GIL must not
      // wait for the lock (two threads running VkMats of two contexts through one layer deadlocked).
      .def("load_param", [](Norm& n, const std::map<int, nb::object>& params) {
        ParamDict pd;
        for (const auto& [id, v] : params) {
          if (nb::isinstance<nb::float_>(v)) pd.set(id, float(nb::cast<double>(v)));
          else pd.set(id, nb::cast<int>(v));
        }
        ReleaseGil release;
        n.load_param(pd);
      })
      .def("load_model",
           [](Norm& n, const Weights& gamma, std::optional<Weights> beta) {
             std::vector<float> g = weight_vector(gamma), b = beta ? weight_vector(*beta) : std::vector<float>{};
             ReleaseGil release;
             n.load_model(std::move(g), std::move(b));
           },
           "gamma"_a, "beta"_a = nb::none())
      .def("create_pipeline", &Norm::create_pipeline, "context"_a, "option"_a, nb::call_guard<ReleaseGil>())
      .def("destroy_pipeline", &Norm::destroy_pipeline, nb::call_guard<ReleaseGil>())
      .def("forward_inplace_cpu", &Norm::forward_inplace_cpu, nb::call_guard<ReleaseGil>())
      .def("forward_inplace", nb::overload_cast<Mat&, const Option&>(&Norm::forward_inplace), "mat"_a, "option"_a,
           nb::call_guard<ReleaseGil>())
      .def("forward_inplace", nb::overload_cast<VkMat&, const Option&>(&Norm::forward_inplace), "mat"_a, "option"_a,
           nb::call_guard<ReleaseGil>())
      .def(
          "forward",
          [](Norm& n, const VkMat& bottom, const Option& opt) {
            ReleaseGil release;
            VkMat top;
            n.forward(bottom, top, opt);
            return top;
          },
          "bottom"_a, "option"_a, "The layer on a VkMat, which is only read: a new VkMat on its device")
      .def("forward_numpy",
           [](Norm& n, const Array& a, const Option& opt) {
             // The array is read where it lies (the caller's reference keeps it alive through the call).
             const Mat bottom = numpy_view(a);
             Mat top = Mat::create_for_overwrite(bottom);  // numpy's layout too: the result is viewed, not copied
             {
               ReleaseGil release;
               n.forward(bottom, top, opt);
             }
             return top;
           },
           "array"_a, "option"_a, "The layer on a C-contiguous float32/float16 array, which is only read; a new Mat")
      .def("forward_repeated",
           [](Norm& n, VkMat& m, const Option& opt, int warmup, int reps) {
             DispatchInfo i;
             {
               ReleaseGil release;
               i = n.forward_repeated(m, opt, warmup, reps);
             }
             return dispatch_dict(i);
           },
           "mat"_a, "option"_a, "warmup"_a, "reps"_a)
      .def("set_activation",
           [](Norm& n, int type, float alpha) {
             const Activation a = activation_from_int(type);
             ReleaseGil release;
             n.set_activation(a, alpha);
           },
           "activation_type"_a, "alpha"_a = 0.f)
      .def_prop_ro("activation_type", [](const Norm& n) { return int(n.activation); })
      .def_ro("activation_alpha", &Norm::activation_alpha)
      .def("forward_add",
           [](Norm& n, const VkMat& x, const VkMat& r, bool write_sum, const Option& opt) {
             ReleaseGil release;
             VkMat sum;
             VkMat out = n.forward_add(x, r, write_sum ? &sum : nullptr, opt);
             return std::make_tuple(out, sum);
           },
           "x"_a, "residual"_a, "write_sum"_a, "option"_a)
      .def("forward_add_numpy",
           [](Norm& n, const Array& x, const Array& r, bool write_sum, const Option& opt) {
             // Both arrays are read where they lie; the results are Mats of their own in numpy's layout.
             const Mat bx = numpy_view(x), br = numpy_view(r);
             Mat top = Mat::create_for_overwrite(bx), sum = write_sum ? Mat::create_for_overwrite(bx) : Mat();
             {
               ReleaseGil release;
               n.forward_add(bx, br, top, write_sum ? &sum : nullptr, opt);
             }
             return std::make_tuple(top, sum);
           },
           "x"_a, "residual"_a, "write_sum"_a, "option"_a,
           "forward_add on two C-contiguous float32/float16 arrays of one shape (only read): new Mats")
      .def("forward_add_repeated",
           [](Norm& n, const VkMat& x, const VkMat& r, bool write_sum, const Option& opt, int warmup, int reps) {
             DispatchInfo i;
             {
               ReleaseGil release;
               i = n.forward_add_repeated(x, r, write_sum, opt, warmup, reps);
             }
             return dispatch_dict(i);
           },
           "x"_a, "residual"_a, "write_sum"_a, "option"_a, "warmup"_a, "reps"_a)
      .def_prop_ro("context",
                   [](const Norm& n) {
                     std::shared_ptr<Context> ctx;
                     {
                       ReleaseGil release;
                       ctx = n.context();
                     }
                     return ctx;
                   })
      .def_prop_ro("last_dispatch", [](const Norm& n) {
        DispatchInfo info;
        {
          ReleaseGil release;
          info = n.last_dispatch();
        }
        return dispatch_dict(info);
      });
  m.def("activation_name", [](int type) { return std::string(activation_name(activation_from_int(type))); });
}

// pyncnn's custom Python layers (Layer, ParamDict, ModelBin, Net.register_custom_layer) on vknorm._graph's nets.
//
// ncnn owns nothing of a Python layer: the creator's object lives in Python, the net's PythonLayerTypes holds it while
// its ncnn::Net holds the layer, and lets it go when ncnn destroys the layer (after the destroyer, if any). Every call from ncnn into Python takes the GIL (ncnn runs with it
// released) and catches what Python raises: ncnn's C++ is never unwound by a Python exception; the layer returns -1
// and the binding that ran it (load, extract, clear) raises the exception afterwards. Blobs are given to Python as
// copies (a layer may keep them; the extractor's memory goes with the extractor) and taken back as the Mats Python
// left in top_blob(s).
#include "graph_custom_layers.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/trampoline.h>

#include <climits>
#include <memory>
#include <initializer_list>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include <ncnn/layer.h>
#include <ncnn/modelbin.h>
#include <ncnn/option.h>
#include <ncnn/paramdict.h>

#include "py_values.h"
#include "vknorm/ncnn.h"

namespace nb = nanobind;
using namespace nb::literals;
using ::ncnn::Mat;

namespace vknorm_python {
namespace {

thread_local int t_python_layer_depth = 0;
thread_local std::optional<nb::python_error> t_layer_error;  // the first a layer raised, until raised again

struct InsidePythonLayer {
  InsidePythonLayer() { ++t_python_layer_depth; }
  ~InsidePythonLayer() { --t_python_layer_depth; }
  InsidePythonLayer(const InsidePythonLayer&) = delete;
  InsidePythonLayer& operator=(const InsidePythonLayer&) = delete;
};

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Python is finalizing and this thread is not the one doing it (a daemon thread there never gets the GIL back):
// Python objects are left to their end.
bool finalizing_elsewhere() { return finalizing() && !PyGILState_Check(); }

[[noreturn]] void raise(PyObject* type, const std::string& what) {
  PyErr_SetString(type, what.c_str());
  throw nb::python_error();
}

// Kept for the binding that ran the layer, noted with where it was raised (Python 3.11's add_note).
void keep(nb::python_error& raised, const std::string& where) {
  // Before Python 3.12 an error may be held unnormalized (its value a str): normalized here, not by what(), which
  // runs str() on it and ends the process where that raises.
  raised.restore();
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback) PyException_SetTraceback(value, traceback);
  PyErr_Restore(type, value, traceback);
  nb::python_error e;
  if (nb::hasattr(e.value(), "add_note")) {
    try {
      e.value().attr("add_note")("raised in " + where);
    } catch (nb::python_error&) {  // a note is not worth a second error
    }
  }
  if (!t_layer_error) t_layer_error.emplace(std::move(e));
}

// What ncnn could not be told in Python terms (a C++ exception past the calls below) as a Python RuntimeError.
void keep(const std::exception& e, const std::string& where) {
  PyErr_SetString(PyExc_RuntimeError, e.what());
  nb::python_error error;
  keep(error, where);
}

// The layers any net holds (a creator that returns one of them again would have ncnn hold it twice).
std::unordered_set<const ::ncnn::Layer*>& layers_held() {
  static auto* held = new std::unordered_set<const ::ncnn::Layer*>;
  return *held;
}

std::string label(const ::ncnn::Layer& layer) {
  return "Python layer " + (layer.name.empty() ? std::string("(not named yet)") : layer.name) + " (" + layer.type + ")";
}

// ncnn's ParamDict and ModelBin, lent to a layer's load_param / load_model for the call (of: null after it).
struct ParamDictView {
  const ::ncnn::ParamDict* of = nullptr;
  std::shared_ptr<::ncnn::ParamDict> own;  // one made in Python (pyncnn's ParamDict(), to try a layer): set() fills it
};
struct ModelBinView {
  const ::ncnn::ModelBin* of = nullptr;
};

template <class View, class T>
class Lent {
 public:
  explicit Lent(const T* of) : obj_(nb::cast(View{of})) {}
  ~Lent() { nb::inst_ptr<View>(obj_)->of = nullptr; }
  nb::handle obj() const { return obj_; }

 private:
  nb::object obj_;
};

template <class View>
const auto& lent(const View& v, const char* what) {
  if (!v.of)
    raise(PyExc_RuntimeError, std::string(what) + " is ncnn's for the one call it was given to (Layer.load_param / "
                                                   "load_model): it cannot be used after that call returned");
  return *v.of;
}

int param_id(int id) {
  if (id < 0 || id >= NCNN_MAX_PARAM_COUNT)
    raise(PyExc_IndexError, "ParamDict ids are 0.." + std::to_string(NCNN_MAX_PARAM_COUNT - 1) + " (the .param's "
                                "id=value), got " + std::to_string(id));
  return id;
}

// A Mat taken back from Python for ncnn: a Mat over memory of its own (a view, holding another Mat's, is copied:
// ncnn may make blobs again through a Mat's allocator).
Mat taken(nb::handle obj, const std::string& what) {
  if (!nb::isinstance<Mat>(obj)) raise(PyExc_TypeError, what + " holds " + type_of(obj) + ", not a Mat");
  const Mat& m = nb::cast<const Mat&>(obj);
  return m.allocator ? m.clone() : m;
}

// A blob given to Python: a copy in memory of its own, float32 of elempack 1 as every Mat of this module (ncnn
// converts a layer's inputs to that for a layer that supports no packing and no float16 or bfloat16 storage).
nb::object given(const Mat& m, const std::string& what) {
  if (!m.empty() && (m.elempack != 1 || m.elemsize != 4))
    raise(PyExc_RuntimeError, what + " reached the layer as elempack " + std::to_string(m.elempack) + ", " +
                                  std::to_string(m.elemsize) + "-byte elements, not float32 of elempack 1");
  return nb::cast(m.clone());
}

nb::list given(const std::vector<Mat>& blobs, const std::string& what) {
  nb::list out;
  for (const Mat& m : blobs) out.append(given(m, what));
  return out;
}

// n as ncnn's int, or an OverflowError naming `what`.
int within_int(long long n, const std::string& what) {
  if (n < INT_MIN || n > INT_MAX) raise(PyExc_OverflowError, what + " past int");
  return int(n);
}

// ncnn's code from what a layer's method returned: an int, or what stands for one (numpy's); 0: success.
int code_of(nb::handle r, const std::string& where) {
  const std::optional<long long> code = as_index(r);
  if (!code)
    raise(PyExc_TypeError, where + " returned " + type_of(r) + ": ncnn's layer methods return an int, 0 on success");
  return within_int(*code, where + " returned a code");
}

// The Mats a forward left in top_blob(s) that returned 0, into ncnn's blobs: each one made (an empty blob would
// crash the stock layer after it).
void take_back(nb::handle obj, Mat& blob, const std::string& what) {
  blob = taken(obj, what);
  if (blob.empty())
    raise(PyExc_ValueError, what + " is empty after a forward that returned 0: fill it (top_blob.clone_from(...)) "
                                   "or return an error code");
}

void take_back(const nb::list& objs, std::vector<Mat>& blobs, const std::string& what) {
  if (objs.size() != blobs.size())
    raise(PyExc_ValueError, what + " holds " + std::to_string(objs.size()) + " Mats after the forward, not the " +
                                std::to_string(blobs.size()) + " the layer makes");
  for (size_t i = 0; i < blobs.size(); ++i) take_back(objs[i], blobs[i], what + "[" + std::to_string(i) + "]");
}

// The layer ncnn holds for a Layer subclass defined in Python: each virtual calls the Python method of that name
// where the subclass defines one, else ncnn's own.
class PythonLayer : public ::ncnn::Layer {
 public:
  NB_TRAMPOLINE(::ncnn::Layer, 1);

  int load_param(const ::ncnn::ParamDict& pd) override {
    return call_lending<ParamDictView>("load_param", pd, [&] { return ::ncnn::Layer::load_param(pd); });
  }
  int load_model(const ::ncnn::ModelBin& mb) override {
    return call_lending<ModelBinView>("load_model", mb, [&] { return ::ncnn::Layer::load_model(mb); });
  }
  int create_pipeline(const ::ncnn::Option& opt) override {
    return call(
        "create_pipeline", [&](nb::handle f, const std::string& where) { return code_of(f(option(opt)), where); },
        [&] { return ::ncnn::Layer::create_pipeline(opt); });
  }
  int destroy_pipeline(const ::ncnn::Option& opt) override {
    return call(
        "destroy_pipeline", [&](nb::handle f, const std::string& where) { return code_of(f(option(opt)), where); },
        [&] { return ::ncnn::Layer::destroy_pipeline(opt); });
  }
  int forward(const Mat& bottom_blob, Mat& top_blob, const ::ncnn::Option& opt) const override {
    return call(
        "forward", [&](nb::handle f, const std::string& where) {
          nb::object top = nb::cast(Mat());
          const int code = code_of(f(given(bottom_blob, "bottom_blob"), top, option(opt)), where);
          if (code == 0) take_back(top, top_blob, "top_blob");
          return code;
        },
        [&] { return ::ncnn::Layer::forward(bottom_blob, top_blob, opt); });
  }
  int forward(const std::vector<Mat>& bottom_blobs, std::vector<Mat>& top_blobs,
              const ::ncnn::Option& opt) const override {
    return call(
        "forward", [&](nb::handle f, const std::string& where) {
          nb::list tops;
          for (size_t i = 0; i < top_blobs.size(); ++i) tops.append(nb::cast(Mat()));
          const int code = code_of(f(given(bottom_blobs, "bottom_blobs"), tops, option(opt)), where);
          if (code == 0) take_back(tops, top_blobs, "top_blobs");
          return code;
        },
        [&] { return ::ncnn::Layer::forward(bottom_blobs, top_blobs, opt); });
  }
  int forward_inplace(Mat& bottom_top_blob, const ::ncnn::Option& opt) const override {
    return call(
        "forward_inplace", [&](nb::handle f, const std::string& where) {
          nb::object blob = given(bottom_top_blob, "bottom_top_blob");
          const int code = code_of(f(blob, option(opt)), where);
          if (code == 0) take_back(blob, bottom_top_blob, "bottom_top_blob");
          return code;
        },
        [&] { return ::ncnn::Layer::forward_inplace(bottom_top_blob, opt); });
  }
  int forward_inplace(std::vector<Mat>& bottom_top_blobs, const ::ncnn::Option& opt) const override {
    return call(
        "forward_inplace", [&](nb::handle f, const std::string& where) {
          nb::list blobs = given(bottom_top_blobs, "bottom_top_blobs");
          const int code = code_of(f(blobs, option(opt)), where);
          if (code == 0) take_back(blobs, bottom_top_blobs, "bottom_top_blobs");
          return code;
        },
        [&] { return ::ncnn::Layer::forward_inplace(bottom_top_blobs, opt); });
  }

 private:
  // A copy of ncnn's option, without what points into the extractor or net (its allocators, the pipeline cache): the
  // layer may keep it, or make Mats with it (ncnn's Mat functions allocate through its blob_allocator), past them.
  static nb::object option(const ::ncnn::Option& opt) {
    ::ncnn::Option own = opt;
    own.blob_allocator = own.workspace_allocator = own.kvcache_allocator = nullptr;
    own.blob_vkallocator = own.workspace_vkallocator = own.staging_vkallocator = own.kvcache_vkallocator = nullptr;
    own.pipeline_cache = nullptr;
    return nb::cast(own);
  }

  // The layer's own method `name` (its class's, or set on the instance, as pybind11 finds one), or none where it
  // has none (Layer's no-op, or nothing of that name).
  nb::object overriding(const char* name) const {
    nb::object mine = nb::getattr(nb_trampoline.base(), name, nb::none());
    nb::object stock = nb::getattr(nb::type<::ncnn::Layer>(), name, nb::none());
    if (mine.is_none() || (!stock.is_none() && nb::getattr(mine, "__func__", nb::none()).is(stock))) return {};
    return mine;
  }

  // call() for a method given ncnn's ParamDict or ModelBin, lent for the call (View).
  template <class View, class T, class Stock>
  int call_lending(const char* name, const T& lent, Stock&& stock) {
    return call(
        name, [&](nb::handle f, const std::string& where) {
          Lent<View, T> view(&lent);
          return code_of(f(view.obj()), where);
        },
        stock);
  }

  template <class Invoke, class Stock>
  int call(const char* name, Invoke&& invoke, Stock&& stock) const {
    nb::gil_scoped_acquire gil;
    const std::string where = label(*this) + "." + name;
    if (finalizing()) return stock();  // a net going as Python ends (its globals gone): the layer's code is not run
    try {
      nb::object f = overriding(name);
      if (!f.is_valid()) return stock();
      InsidePythonLayer inside;
      return invoke(f, where);
    } catch (nb::python_error& e) {
      keep(e, where);
    } catch (const std::exception& e) {
      keep(e, where);
    }
    return -1;
  }
};

// ncnn's layer_creator_func and layer_destroyer_func for a PythonLayerType (the userdata).
::ncnn::Layer* create_python_layer(void* userdata) {
  const auto& t = *static_cast<const PythonLayerType*>(userdata);
  nb::gil_scoped_acquire gil;
  const std::string where = "the creator of Python layer type " + t.type;
  try {
    InsidePythonLayer inside;
    const nb::object creator = t.creator;  // held for the call: a registration meanwhile may replace t's
    nb::object obj = creator();
    if (!nb::isinstance<::ncnn::Layer>(obj))
      raise(PyExc_TypeError, where + " returned " + type_of(obj) + ", not a vknorm.graph.Layer");
    if (!nb::inst_ready(obj))
      raise(PyExc_TypeError, where + " returned a " + type_of(obj) + " whose __init__ did not call Layer.__init__");
    ::ncnn::Layer* layer = nb::inst_ptr<::ncnn::Layer>(obj);
    if (!layers_held().insert(layer).second)
      raise(PyExc_ValueError, where + " returned a layer a net holds already: make a new Layer in each call");
    t.owner->layers.emplace(layer, std::move(obj));
    return layer;
  } catch (nb::python_error& e) {
    keep(e, where);
  } catch (const std::exception& e) {
    keep(e, where);
  }
  return nullptr;
}

void destroy_python_layer(::ncnn::Layer* layer, void* userdata) {
  const auto& t = *static_cast<const PythonLayerType*>(userdata);
  if (finalizing_elsewhere()) return;
  nb::gil_scoped_acquire gil;
  auto& layers = t.owner->layers;
  auto it = layers.find(layer);
  if (it == layers.end()) return;  // not one of ours (cannot happen: ncnn destroys what the creator made)
  nb::object obj = std::move(it->second);
  layers.erase(it);
  layers_held().erase(layer);
  if (t.destroyer.is_none() || finalizing()) return;  // as Python ends, the layer goes without its destroyer
  const std::string where = "the destroyer of Python layer type " + t.type;
  try {
    InsidePythonLayer inside;
    const nb::object destroyer = t.destroyer;
    destroyer(obj);
  } catch (nb::python_error& e) {
    keep(e, where);
  } catch (const std::exception& e) {
    keep(e, where);
  }
}

// pyncnn's Layer flags that would hand a layer other Mats than float32 of elempack 1, or put it on Vulkan.
using Flag = bool ::ncnn::Layer::*;
constexpr std::pair<const char*, Flag> kHostOnlyFlags[] = {
    {"support_vulkan", &::ncnn::Layer::support_vulkan},
    {"support_packing", &::ncnn::Layer::support_packing},
    {"support_bf16_storage", &::ncnn::Layer::support_bf16_storage},
    {"support_fp16_storage", &::ncnn::Layer::support_fp16_storage},
    {"support_int8_storage", &::ncnn::Layer::support_int8_storage},
    {"support_tensor_storage", &::ncnn::Layer::support_tensor_storage},
    {"support_vulkan_packing", &::ncnn::Layer::support_vulkan_packing},
    {"support_any_packing", &::ncnn::Layer::support_any_packing},
    {"support_vulkan_any_packing", &::ncnn::Layer::support_vulkan_any_packing},
    {"support_batch", &::ncnn::Layer::support_batch},
};

// A ParamDict array as float32 (ncnn keeps an int array's items as int32, which a Mat here never holds).
Mat param_array(const ::ncnn::ParamDict& pd, int id, const Mat& def) {
  Mat v = pd.get(id, def);
  if (pd.type(id) != 5 || v.empty()) return v;
  Mat out(v.w, size_t(4));
  if (out.empty()) throw std::bad_alloc();
  for (int i = 0; i < v.w; ++i) static_cast<float*>(out.data)[i] = float(static_cast<const int*>(v.data)[i]);
  return out;
}

Mat loaded(Mat m) {
  if (!m.empty() && (m.elemsize != 4 || m.elempack != 1))
    raise(PyExc_ValueError, "ModelBin.load read weights of " + std::to_string(m.elemsize) + "-byte elements (int8 "
                                "quantized?): a Python layer takes float32 ones");
  return m;
}

// numpy's scalars and 0-d arrays as the Python scalar they hold (np.True_ a bool, so an int, as pyncnn takes it).
nb::object scalar_of(nb::handle v) {
  if (nb::hasattr(v, "dtype") && nb::hasattr(v, "ndim") && nb::cast<long long>(v.attr("ndim")) == 0)
    return v.attr("item")();
  return nb::borrow(v);
}

// A ParamDict value that is an int (a bool too), as ncnn's int; none otherwise.
std::optional<int> param_int(nb::handle given, const std::string& what) {
  const nb::object v = scalar_of(given);
  if (!PyLong_Check(v.ptr())) return std::nullopt;
  return within_int(PyBool_Check(v.ptr()) ? v.ptr() == Py_True : *as_index(v), what);
}

// A ParamDict value that is a float, as ncnn's float; none otherwise.
std::optional<float> param_float(nb::handle given) {
  const nb::object v = scalar_of(given);
  if (!PyFloat_Check(v.ptr())) return std::nullopt;
  return float(PyFloat_AsDouble(v.ptr()));
}

// ModelBin.load's extents (each 1..INT_MAX, in all no more than INT_MAX weights), as ncnn's int.
std::vector<int> extents(std::initializer_list<std::pair<long long, const char*>> given) {
  std::vector<int> out;
  long long total = 1;
  for (const auto& [n, what] : given) {
    if (n < 1 || n > INT_MAX)
      raise(PyExc_ValueError, std::string("ModelBin.load: ") + what + " must be 1.." + std::to_string(INT_MAX) +
                                  ", got " + std::to_string(n));
    if (total > INT_MAX / n) raise(PyExc_ValueError, "ModelBin.load: more than 2^31 - 1 weights at once");
    total *= n;
    out.push_back(int(n));
  }
  return out;
}

int weight_type(int type) {
  if (type != 0 && type != 1)
    raise(PyExc_ValueError, "ModelBin.load: type is 0 (ncnn's tagged weights: float32, float16 or int8 by their "
                            "flag) or 1 (raw float32), got " + std::to_string(type));
  return type;
}

}  // namespace

bool inside_python_layer() { return t_python_layer_depth > 0; }

void raise_python_layer_error() {
  if (!t_layer_error) return;
  nb::python_error e = std::move(*t_layer_error);
  t_layer_error.reset();
  throw e;
}

PythonLayerTypes::~PythonLayerTypes() {
  if (finalizing_elsewhere()) {  // left to Python's end, as the objects are
    for (auto& [layer, obj] : layers) obj.release();
    for (PythonLayerType& t : types_) t.creator.release(), t.destroyer.release();
  }
}

NetGoing::NetGoing() : own_errors_(PyGILState_Check() != 0) {
  if (own_errors_ && t_layer_error) outer_.emplace(std::move(*t_layer_error)), t_layer_error.reset();
}

NetGoing::~NetGoing() {
  if (!own_errors_) return;
  if (t_layer_error) {
    nb::python_error e = std::move(*t_layer_error);
    t_layer_error.reset();
    if (!finalizing()) e.discard_as_unraisable("a Python layer of a vknorm.graph.Net that went");
  }
  if (outer_) t_layer_error.emplace(std::move(*outer_));
}

const PythonLayerType* PythonLayerTypes::add(const std::string& type, nb::handle creator, nb::handle destroyer,
                                             bool vknorm, bool fuse) {
  const std::string call = "Net.register_custom_layer(" + type + "): ";
  if (type.empty() || type.size() > 255 || type.find_first_of(" \t\r\n\v\f") != std::string::npos ||
      type.find('\0') != std::string::npos)
    throw nb::value_error((call + "a layer type is one word of 1..255 characters, as a .param names it").c_str());
  if (!PyCallable_Check(creator.ptr()))
    throw nb::type_error((call + "the creator must be callable (it returns a new Layer), got " +
                          type_of(creator)).c_str());
  if (!destroyer.is_none() && !PyCallable_Check(destroyer.ptr()))
    throw nb::type_error((call + "the destroyer must be callable or None, got " + type_of(destroyer)).c_str());
  if (vknorm && vknorm::ncnn::is_vknorm_type(type))
    throw nb::value_error((call + "vknorm's layers run " + type + " in this net: a Python " + type +
                           " needs Net(vknorm=False)").c_str());
  if (fuse && vknorm::ncnn::fusion_folds(type))
    throw nb::value_error((call + "this net fuses " + type + " layers into vknorm's norms as it loads: a Python " +
                           type + " needs Net(fuse=False)").c_str());
  for (PythonLayerType& t : types_)
    if (t.type == type) {  // registered again: ncnn's registry has t already; the superseded callables go
      t.creator = nb::borrow(creator), t.destroyer = nb::borrow(destroyer);
      return nullptr;
    }
  // ncnn numbers a net's types that are not built in below 256 (its CustomBit; past it they alias another's), and
  // vknorm's fused types are 4 of them
  if (::ncnn::layer_to_index(type.c_str()) == -1) {
    size_t own = vknorm ? 4 : 0;
    for (const PythonLayerType& t : types_) own += ::ncnn::layer_to_index(t.type.c_str()) == -1;
    if (own >= 256)
      throw nb::value_error((call + "ncnn takes at most 256 layer types of a net's own (vknorm's fused types are " +
                             std::to_string(vknorm ? 4 : 0) + " of them)").c_str());
  }
  types_.push_back({type, nb::borrow(creator), nb::borrow(destroyer), this});
  return &types_.back();
}

int PythonLayerTypes::traverse(visitproc visit, void* arg) const {
  for (const PythonLayerType& t : types_) {
    Py_VISIT(t.creator.ptr());
    Py_VISIT(t.destroyer.ptr());
  }
  for (const auto& [layer, obj] : layers) Py_VISIT(obj.ptr());
  return 0;
}

void PythonLayerTypes::clear() {
  for (PythonLayerType& t : types_) t.creator = nb::none(), t.destroyer = nb::none();
}

int PythonLayerTypes::register_with(::ncnn::Net& net, const PythonLayerType& t) {
  // ncnn keeps the type's name by pointer: t's, which lives as long as this net's owner
  return net.register_custom_layer(t.type.c_str(), create_python_layer, destroy_python_layer,
                                   const_cast<PythonLayerType*>(&t));
}

void define_custom_layers(nb::module_& m) {
  auto layer = nb::class_<::ncnn::Layer, PythonLayer>(
      m, "Layer",
      "pyncnn's Layer: subclass it, set one_blob_only / support_inplace in __init__, and define forward (or "
      "forward_inplace), load_param(pd), load_model(mb), create_pipeline(opt) / destroy_pipeline(opt) as ncnn's "
      "layers do; register a creator with Net.register_custom_layer. It runs on the host on float32 Mats of "
      "elempack 1 (its support_vulkan, support_packing, ... stay False).");
  layer.def(nb::init<>())
      .def_prop_rw(
          "one_blob_only", [](const ::ncnn::Layer& l) { return l.one_blob_only; },
          [](::ncnn::Layer& l, bool v) { l.one_blob_only = v; })
      .def_prop_rw(
          "support_inplace", [](const ::ncnn::Layer& l) { return l.support_inplace; },
          [](::ncnn::Layer& l, bool v) { l.support_inplace = v; });
  for (const auto& [name, flag] : kHostOnlyFlags) {
    const std::string flag_name = name;
    layer.def_prop_rw(
        name, [flag](const ::ncnn::Layer& l) { return l.*flag; },
        [flag, flag_name](::ncnn::Layer& l, bool v) {
          if (v)
            throw nb::value_error(("Layer." + flag_name + ": a Python layer runs on the host, on float32 Mats of "
                                   "elempack 1 (ncnn converts its inputs to that): it stays False").c_str());
          l.*flag = false;
        });
  }
  layer.def_prop_ro("typeindex", [](const ::ncnn::Layer& l) { return l.typeindex; })
      .def_prop_ro("type", [](const ::ncnn::Layer& l) { return l.type; })
      .def_prop_ro("name", [](const ::ncnn::Layer& l) { return l.name; })
      .def_prop_ro("featmask", [](const ::ncnn::Layer& l) { return l.featmask; })
      .def_prop_ro("bottoms", [](const ::ncnn::Layer& l) { return l.bottoms; })
      .def_prop_ro("tops", [](const ::ncnn::Layer& l) { return l.tops; })
      .def_prop_ro("bottom_shapes", [](const ::ncnn::Layer& l) { return l.bottom_shapes; })
      .def_prop_ro("top_shapes", [](const ::ncnn::Layer& l) { return l.top_shapes; })
      // ncnn's own: nothing to read, build or free
      .def("load_param", [](::ncnn::Layer&, const ParamDictView&) { return 0; }, "pd"_a)
      .def("load_model", [](::ncnn::Layer&, const ModelBinView&) { return 0; }, "mb"_a)
      .def("create_pipeline", [](::ncnn::Layer&, const ::ncnn::Option&) { return 0; }, "opt"_a)
      .def("destroy_pipeline", [](::ncnn::Layer&, const ::ncnn::Option&) { return 0; }, "opt"_a);

  nb::class_<ParamDictView>(m, "ParamDict",
                            "ncnn's ParamDict as a Python layer's load_param gets it: the layer's id=value params of "
                            "the .param, for that call only (read-only). ParamDict() makes one to fill with set(), "
                            "to call a layer's load_param with by hand.")
      .def("__init__",
           [](ParamDictView* self) {
             new (self) ParamDictView();
             self->own = std::make_shared<::ncnn::ParamDict>();
             self->of = self->own.get();
           })
      .def(
          "set",
          [](ParamDictView& v, int id, nb::handle value) {
            if (!v.own)
              raise(PyExc_RuntimeError, "ParamDict.set: the ParamDict ncnn gives load_param is read-only (const in "
                                        "ncnn); ParamDict() makes one to fill");
            param_id(id);
            if (std::optional<int> i = param_int(value, "ParamDict.set: value")) {
              v.own->set(id, *i);
            } else if (std::optional<float> f = param_float(value)) {
              v.own->set(id, *f);
            } else if (PyUnicode_Check(value.ptr())) {
              v.own->set(id, nb::cast<std::string>(value));
            } else if (nb::isinstance<Mat>(value)) {
              v.own->set(id, nb::cast<const Mat&>(value).clone());
            } else {
              raise(PyExc_TypeError, "ParamDict.set(id, value): value is an int, float, str or Mat, got " +
                                         type_of(value));
            }
          },
          "id"_a, "value"_a.none(), "Sets param id (a ParamDict made with ParamDict() only).")
      .def("type", [](const ParamDictView& v, int id) { return lent(v, "ParamDict").type(param_id(id)); }, "id"_a,
           "ncnn's type of param id: 0 not given, 2 int, 3 float, 4 array (set from a Mat), 5 int array, 6 float "
           "array, 7 string.")
      .def(
          "get",
          [](const ParamDictView& v, int id, nb::handle def) -> nb::object {
            const ::ncnn::ParamDict& pd = lent(v, "ParamDict");
            param_id(id);
            if (std::optional<int> i = param_int(def, "ParamDict.get: default")) return nb::int_(pd.get(id, *i));
            if (std::optional<float> f = param_float(def)) return nb::float_(pd.get(id, *f));
            if (PyUnicode_Check(def.ptr())) return nb::str(pd.get(id, nb::cast<std::string>(def)).c_str());
            if (nb::isinstance<Mat>(def)) return nb::cast(param_array(pd, id, nb::cast<const Mat&>(def)));
            raise(PyExc_TypeError, "ParamDict.get(id, default): default is an int, float, str or Mat (its type is "
                                   "the type read), got " + type_of(def));
          },
          "id"_a, "default"_a.none(),
          "Param id as default's type (default where the .param does not give it); an int array as float32.");

  nb::class_<ModelBinView>(m, "ModelBin",
                           "ncnn's ModelBin as a Python layer's load_model gets it: the layer's weights from the "
                           ".bin, in order, for that call only.")
      .def(
          "load",
          [](const ModelBinView& v, long long w, int type) {
            const std::vector<int> e = extents({{w, "w"}});
            return loaded(lent(v, "ModelBin").load(e[0], weight_type(type)));
          },
          "w"_a, "type"_a)
      .def(
          "load",
          [](const ModelBinView& v, long long w, long long h, int type) {
            const std::vector<int> e = extents({{w, "w"}, {h, "h"}});
            return loaded(lent(v, "ModelBin").load(e[0], e[1], weight_type(type)));
          },
          "w"_a, "h"_a, "type"_a)
      .def(
          "load",
          [](const ModelBinView& v, long long w, long long h, long long c, int type) {
            const std::vector<int> e = extents({{w, "w"}, {h, "h"}, {c, "c"}});
            return loaded(lent(v, "ModelBin").load(e[0], e[1], e[2], weight_type(type)));
          },
          "w"_a, "h"_a, "c"_a, "type"_a)
      .def(
          "load",
          [](const ModelBinView& v, long long w, long long h, long long d, long long c, int type) {
            const std::vector<int> e = extents({{w, "w"}, {h, "h"}, {d, "d"}, {c, "c"}});
            return loaded(lent(v, "ModelBin").load(e[0], e[1], e[2], e[3], weight_type(type)));
          },
          "w"_a, "h"_a, "d"_a, "c"_a, "type"_a);
}

}  // namespace vknorm_python

// pyncnn's custom Python layers (Layer, ParamDict, ModelBin, Net.register_custom_layer) on vknorm._graph's nets, and
// pyncnn's create_layer: ncnn's own layers run from Python (StockLayer below).
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
#include <cstdint>
#include <cstring>
#include <memory>
#include <initializer_list>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ncnn/layer.h>
#include <ncnn/layer_type.h>
#include <ncnn/modelbin.h>
#include <ncnn/option.h>
#include <ncnn/paramdict.h>

#include "mat_layout.h"
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
  // ids set() filled from a list or numpy array, with the type a .param gives them (5 int array, 6 float array): ncnn
  // stores any array set() gives as type 4 and its bits as they are, which its layers read as the .param's type
  std::unordered_map<int, int> array_types;
  int type(int id) const {
    auto it = array_types.find(id);
    return it != array_types.end() ? it->second : of->type(id);
  }
};
struct ModelBinView {
  const ::ncnn::ModelBin* of = nullptr;
};
// pyncnn's ModelBinFromMatArray(weights): a ModelBin made in Python, to call a layer's load_model with by hand.
struct ModelBinFromMatArrayView : ModelBinView {
  std::shared_ptr<const ::ncnn::ModelBin> own;
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

// A copy of ncnn's option without what points into the extractor or net (its allocators, the pipeline cache): whoever
// holds it may keep it, or make Mats with it (ncnn's Mat functions allocate through its blob_allocator), past them.
::ncnn::Option detached(const ::ncnn::Option& opt) {
  ::ncnn::Option own = opt;
  own.blob_allocator = own.workspace_allocator = own.kvcache_allocator = nullptr;
  own.blob_vkallocator = own.workspace_vkallocator = own.staging_vkallocator = own.kvcache_vkallocator = nullptr;
  own.pipeline_cache = nullptr;
  return own;
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
  // The option a Python layer gets: detached, so the layer may keep it.
  static nb::object option(const ::ncnn::Option& opt) { return nb::cast(detached(opt)); }

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

// ncnn's weights from a list of Mats (pyncnn's ModelBinFromMatArray): copies its caller made (the layer keeps its
// weights; the Mats may be views of numpy memory), each read once, in order, so handed to the layer as they are.
// ncnn's own reads past the array's end and takes any size;
// this one gives an empty Mat there (ncnn's layers return -100 on it) and notes why, which its caller raises.
class MatArrayModelBin : public ::ncnn::ModelBin {
 public:
  explicit MatArrayModelBin(std::vector<Mat> weights) : weights_(std::move(weights)) {}
  Mat load(int w, int /*type: the Mats are float32 already*/) const override {
    const size_t i = next_++;
    if (i >= weights_.size()) {
      note("ModelBinFromMatArray: the layer reads weight " + std::to_string(i) + " (" + std::to_string(w) +
           " values), the list holds " + std::to_string(weights_.size()));
      return Mat();
    }
    const Mat& m = weights_[i];
    const size_t values = size_t(m.w) * m.h * m.d * m.c;  // not total(): that counts each plane's padding
    if (m.empty() || values != size_t(w)) {
      note("ModelBinFromMatArray: weight " + std::to_string(i) + " holds " + std::to_string(values) +
           " values, the layer reads " + std::to_string(w));
      return Mat();
    }
    Mat values_only = m.reshape(w);  // the values alone, in order (a copy where planes are padded)
    if (values_only.empty()) throw std::bad_alloc();
    return values_only;
  }
  // What went wrong in the reads so far (the first), once.
  std::optional<std::string> take_error() const { return std::exchange(error_, std::nullopt); }

 private:
  void note(std::string what) const {
    if (!error_) error_ = std::move(what);
  }
  std::vector<Mat> weights_;
  mutable size_t next_ = 0;
  mutable std::optional<std::string> error_;
};

// What a ModelBinFromMatArray could not give in the reads so far, raised as a ValueError (after `prefix`); nothing for
// any other ModelBin.
void raise_array_error(const ::ncnn::ModelBin& mb, const std::string& prefix = "") {
  if (const auto* array = dynamic_cast<const MatArrayModelBin*>(&mb))
    if (std::optional<std::string> error = array->take_error()) raise(PyExc_ValueError, prefix + *error);
}

// What ncnn's net reads for a layer whose .bin has nothing: empty Mats.
struct NoWeights : ::ncnn::ModelBin {
  Mat load(int, int) const override { return Mat(); }
};

// One of ncnn's own layers, made by create_layer and run from Python, as pyncnn's model zoo does (create_layer,
// load_param, forward), in ncnn's order. A step the forward needs and Python skipped is taken as ncnn's Net takes it
// (an empty ModelBin, a pipeline with the forward's option); steps out of order are refused: ncnn's layers crash on
// them.
// It runs on float32 Mats of elempack 1, this module's: its option's storage and packing switches are turned off.
class StockLayer : public ::ncnn::Layer {
 public:
  explicit StockLayer(::ncnn::Layer* inner, std::string type_name) : inner_(inner) {
    type = std::move(type_name);
    typeindex = inner->typeindex;
    take_flags();
  }
  ~StockLayer() override {
    if (stage_ == Stage::kPipeline) inner_->destroy_pipeline(pipeline_opt_);
  }

  int load_param(const ::ncnn::ParamDict& pd) override {
    if (stage_ == Stage::kPipeline) refuse("load_param", "its pipeline is made: destroy_pipeline(opt) first");
    const int code = inner_->load_param(pd);
    take_flags();
    stage_ = code == 0 ? Stage::kParam : Stage::kMade;
    if (code == 0) arity_ = arity_of(typeindex, pd, inner_->one_blob_only);
    return code;
  }
  int load_model(const ::ncnn::ModelBin& mb) override {
    if (stage_ == Stage::kMade) refuse("load_model", kParamFirst);
    if (stage_ == Stage::kPipeline) refuse("load_model", "its pipeline is made: destroy_pipeline(opt) first");
    const int code = inner_->load_model(mb);
    take_flags();
    raise_array_error(mb, label() + ": ");
    stage_ = code == 0 ? Stage::kModel : Stage::kParam;
    return code;
  }
  int create_pipeline(const ::ncnn::Option& opt) override {
    if (stage_ == Stage::kMade) refuse("create_pipeline", kParamFirst);
    if (stage_ == Stage::kPipeline) return 0;  // made already, as ncnn's net makes it once
    threads(opt);
    if (stage_ == Stage::kParam) {  // as ncnn's net: every layer reads its weights, none for a layer without
      const NoWeights none;
      const int code = load_model(none);
      if (code != 0)
        raise(PyExc_RuntimeError, label() + ".load_model with no weights returned " + std::to_string(code) +
                                      ": this layer has weights; load_model(ModelBinFromMatArray([...])) first");
    }
    pipeline_opt_ = on_host(opt);
    const int code = inner_->create_pipeline(pipeline_opt_);
    take_flags();
    // ncnn's layers may free their weights as they make the pipeline (opt.lightmode): read again for another
    stage_ = code == 0 ? Stage::kPipeline : Stage::kParam;
    return code;
  }
  int destroy_pipeline(const ::ncnn::Option&) override {
    if (stage_ != Stage::kPipeline) return 0;
    stage_ = Stage::kParam;  // the weights again before another pipeline: it may have freed them (above)
    return inner_->destroy_pipeline(pipeline_opt_);  // with the option it was made with, as ncnn's layers assume
  }

  // The list forms' lengths this layer's type and params take (ncnn reads past the lists otherwise).
  void check_lists(const char* bottoms_what, size_t bottoms, const char* tops_what, size_t tops) const {
    if (bottoms < arity_.min_bottoms)
      raise(PyExc_ValueError, label() + " with its params takes at least " + std::to_string(arity_.min_bottoms) +
                                  " Mat(s) in " + bottoms_what + ", got " + std::to_string(bottoms));
    if (tops_what && arity_.max_tops == 0)
      raise(PyExc_ValueError, label() + " with its params makes no Mat: it takes its slices (param 0) or indices "
                                        "(param 2)");
    if (tops_what && (tops < 1 || tops > arity_.max_tops))
      raise(PyExc_ValueError, label() + " with its params makes " +
                                  (arity_.max_tops == SIZE_MAX ? std::string("at least 1")
                                                               : "1.." + std::to_string(arity_.max_tops)) +
                                  " Mat(s): " + tops_what + " holds " + std::to_string(tops));
  }
  std::string label() const {
    return type.empty() ? "(layer of type index " + std::to_string(typeindex) + ")" : type;
  }
  // The forms ncnn's net calls this layer by (its one_blob_only: one blob, or lists): the other form reads past its
  // blobs in some of ncnn's layers (a BinaryOp with a scalar given a list).
  void check_form(bool lists, const char* method) const {
    const bool one_blob_only = inner_->one_blob_only;  // ncnn's layer's, not what Python may have set on this one
    if (lists == !one_blob_only) return;
    const bool forward = std::string(method) == "forward";
    const std::string args = one_blob_only ? (forward ? "(bottom_blob, top_blob, opt)" : "(bottom_top_blob, opt)")
                                           : (forward ? "(bottom_blobs, top_blobs, opt)" : "(bottom_top_blobs, opt)");
    raise(PyExc_TypeError, label() + (one_blob_only ? " takes one blob (one_blob_only): " : " takes lists of blobs: ") +
                               method + args);
  }

  // The forwards, after the steps before them (create_pipeline with the forward's option where Python made none),
  // with the pipeline's option (ncnn's layers assume the one they were made with) and the forward's threads.
  template <class Run>
  int forward_with(const ::ncnn::Option& opt, Run&& run) {
    if (stage_ == Stage::kMade) refuse("forward", kParamFirst);
    threads(opt);
    if (stage_ != Stage::kPipeline) {
      const int code = create_pipeline(opt);
      if (code != 0)
        raise(PyExc_RuntimeError, label() + ".create_pipeline returned " + std::to_string(code) +
                                      " before the forward");
    }
    ::ncnn::Option o = pipeline_opt_;
    o.num_threads = opt.num_threads;
    return run(*inner_, o);
  }

 private:
  enum class Stage { kMade, kParam, kModel, kPipeline };
  static constexpr const char* kParamFirst = "load_param(pd) has not succeeded (ParamDict() for the defaults)";

  // The least bottoms and the most tops of the list forms, where ncnn's layer indexes past its lists otherwise.
  struct Arity {
    size_t min_bottoms = 1;
    size_t max_tops = SIZE_MAX;
  };
  // From ncnn's layers' sources (1.0.20261020): the inputs each indexes without looking at the count.
  static Arity arity_of(int typeindex, const ::ncnn::ParamDict& pd, bool one_blob) {
    const auto is = [typeindex](const char* t) { return typeindex == ::ncnn::layer_to_index(t); };
    const auto any_of = [&](std::initializer_list<const char*> types) {
      for (const char* t : types)
        if (is(t)) return true;
      return false;
    };
    Arity a;
    if (is("BinaryOp")) a.min_bottoms = pd.get(1, 0) ? 1 : 2;  // with_scalar: one input
    if (any_of({"Eltwise", "CopyTo", "MatMul", "GridSample", "PSROIPooling", "ROIAlign", "ROIPooling",
                "DeformableConv2D"}))
      a.min_bottoms = 2;
    if (any_of({"Crop", "Interp"}) && !one_blob) a.min_bottoms = 2;  // the second: the shape to take
    if (any_of({"Convolution", "Convolution1D", "ConvolutionDepthWise", "ConvolutionDepthWise1D", "Deconvolution",
                "Deconvolution1D", "DeconvolutionDepthWise", "DeconvolutionDepthWise1D"}) &&
        !one_blob)  // dynamic weights: the weights, and the bias where it has one, as inputs
      a.min_bottoms = 2 + (pd.get(5, 0) ? 1 : 0);
    if (is("PriorBox")) {  // the image's size from a second input where its params leave it -233, but mxnet's style
      const bool from_input = pd.get(9, 0) == -233 || pd.get(10, 0) == -233;
      const bool mxnet = pd.get(9, 0) == -233 && pd.get(10, 0) == -233 && pd.get(1, Mat()).empty();
      a.min_bottoms = from_input && !mxnet ? 2 : 1;
    }
    if (any_of({"RotaryEmbed", "Proposal", "DetectionOutput"})) a.min_bottoms = 3;
    if (is("SDPA")) a.min_bottoms = 3 + (pd.get(5, 0) ? 1 : 0) + (pd.get(7, 0) ? 2 : 0);  // attn_mask, kv_cache
    if (is("Gemm")) a.min_bottoms = (pd.get(4, 0) ? 0 : 1) + (pd.get(5, 0) ? 0 : 1);  // constantA, constantB
    if (is("Slice")) {  // a top per slice, or per index and one past the last
      const int slices = pd.get(0, Mat()).w, indices = pd.get(2, Mat()).w;
      a.max_tops = size_t(indices > 0 ? indices + 1 : slices);
    }
    return a;
  }
  void threads(const ::ncnn::Option& opt) const {
    if (!thread_count_ok(opt.num_threads))
      raise(PyExc_ValueError, label() + ": opt.num_threads must be 1.." + std::to_string(kMaxThreads) + ", got " +
                                  std::to_string(opt.num_threads));
  }

  [[noreturn]] void refuse(const char* step, const std::string& why) const {
    raise(PyExc_RuntimeError, label() + "." + step + ": " + why + " (ncnn's order: load_param, load_model, "
                                                                  "create_pipeline, forward)");
  }
  // The option detached, for a layer on the host, on float32 Mats of elempack 1.
  static ::ncnn::Option on_host(const ::ncnn::Option& given) {
    ::ncnn::Option o = detached(given);
    o.use_vulkan_compute = o.use_packing_layout = false;
    o.use_fp16_packed = o.use_fp16_storage = o.use_fp16_arithmetic = false;
    o.use_bf16_packed = o.use_bf16_storage = false;
    return o;
  }
  // What ncnn's layer says of itself that a caller reads (the form of its forward); the rest stays False here.
  void take_flags() {
    one_blob_only = inner_->one_blob_only;
    support_inplace = inner_->support_inplace;
  }

  std::unique_ptr<::ncnn::Layer> inner_;
  Stage stage_ = Stage::kMade;
  Arity arity_;
  ::ncnn::Option pipeline_opt_;
};

// ncnn's layer_creator_func and layer_destroyer_func for a PythonLayerType (the userdata).
::ncnn::Layer* create_python_layer(void* userdata) {
  const auto& t = *static_cast<const PythonLayerType*>(userdata);
  nb::gil_scoped_acquire gil;
  const std::string where = "the creator of Python layer type " + t.label();
  try {
    InsidePythonLayer inside;
    const nb::object creator = t.creator;  // held for the call: a registration meanwhile may replace t's
    nb::object obj = creator();
    if (!nb::isinstance<::ncnn::Layer>(obj))
      raise(PyExc_TypeError, where + " returned " + type_of(obj) + ", not a vknorm.graph.Layer");
    if (!nb::inst_ready(obj))
      raise(PyExc_TypeError, where + " returned a " + type_of(obj) + " whose __init__ did not call Layer.__init__");
    ::ncnn::Layer* layer = nb::inst_ptr<::ncnn::Layer>(obj);
    if (dynamic_cast<const StockLayer*>(layer))
      raise(PyExc_TypeError, where + " returned a layer create_layer made: ncnn's own layers come from the .param "
                                     "by their type; a creator returns a new Layer subclass");
    if (!layers_held().insert(layer).second)
      raise(PyExc_ValueError, where + " returned a layer a net holds already: make a new Layer in each call");
    t.owner->layers.emplace(layer, PythonLayerTypes::Made{std::move(obj), &t});
    if (layer->type.empty()) layer->type = t.type;  // binary params give none (a text .param's replaces it)
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
  if (it == layers.end()) {
    // Not made by a Python type: one made before this type was registered where its maker was (ncnn destroys a
    // layer with the destroyer its index has when it goes). ncnn's own layers and vknorm's go with delete.
    if (!layers_held().count(layer)) delete layer;
    return;
  }
  nb::object obj = std::move(it->second.obj);
  layers.erase(it);
  layers_held().erase(layer);
  if (t.destroyer.is_none() || finalizing()) return;  // as Python ends, the layer goes without its destroyer
  const std::string where = "the destroyer of Python layer type " + t.label();
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
Mat param_array(const ::ncnn::ParamDict& pd, int type, int id, const Mat& def) {
  Mat v = pd.get(id, def);
  if (type != 5 || v.empty()) return v;
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
    for (auto& [layer, made] : layers) made.obj.release();
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

namespace {
void check_callables(const std::string& call, nb::handle creator, nb::handle destroyer) {
  if (!PyCallable_Check(creator.ptr()))
    throw nb::type_error((call + "the creator must be callable (it returns a new Layer), got " +
                          type_of(creator)).c_str());
  if (!destroyer.is_none() && !PyCallable_Check(destroyer.ptr()))
    throw nb::type_error((call + "the destroyer must be callable or None, got " + type_of(destroyer)).c_str());
}
}  // namespace

const PythonLayerType* PythonLayerTypes::add(const std::string& type, nb::handle creator, nb::handle destroyer,
                                             bool vknorm, bool fuse, int custom_slots) {
  const std::string call = "Net.register_custom_layer(" + type + "): ";
  if (type.empty() || type.size() > 255 || type.find_first_of(" \t\r\n\v\f") != std::string::npos ||
      type.find('\0') != std::string::npos)
    throw nb::value_error((call + "a layer type is one word of 1..255 characters, as a .param names it").c_str());
  check_callables(call, creator, destroyer);
  if (vknorm && vknorm::ncnn::is_vknorm_type(type))
    throw nb::value_error((call + "vknorm's layers run " + type + " in this net: a Python " + type +
                           " needs Net(vknorm=False)").c_str());
  if (fuse && vknorm::ncnn::fusion_folds(type))
    throw nb::value_error((call + "this net fuses " + type + " layers into vknorm's norms as it loads: a Python " +
                           type + " needs Net(fuse=False)").c_str());
  for (PythonLayerType& t : types_)
    if (t.index < 0 && t.type == type) {  // registered again: ncnn's registry has t already; the old callables go
      t.creator = nb::borrow(creator), t.destroyer = nb::borrow(destroyer);
      return nullptr;
    }
  // ncnn numbers a net's types that are not built in below 256 (its CustomBit; past it they alias another's)
  if (::ncnn::layer_to_index(type.c_str()) == -1 && custom_slots >= 256)
    throw nb::value_error((call + "ncnn takes at most 256 layer types of a net's own, counted up to the highest "
                                  "index Net.register_layer or register_custom_layer(index) gave (vknorm's fused "
                                  "types are " +
                           std::to_string(vknorm ? 4 : 0) + " of them)").c_str());
  types_.push_back({type, nb::borrow(creator), nb::borrow(destroyer), this});
  return &types_.back();
}

const PythonLayerType* PythonLayerTypes::add_at(int index, nb::handle creator, nb::handle destroyer) {
  check_callables("Net.register_custom_layer(" + std::to_string(index) + "): ", creator, destroyer);
  for (PythonLayerType& t : types_)
    if (t.index == index) {
      t.creator = nb::borrow(creator), t.destroyer = nb::borrow(destroyer);
      return nullptr;
    }
  types_.push_back({"", nb::borrow(creator), nb::borrow(destroyer), this, index});
  return &types_.back();
}

const PythonLayerType* PythonLayerTypes::registered_at(::ncnn::Net& net, int slot) const {
  // the last registration of a slot is what ncnn holds there
  for (auto t = types_.rbegin(); t != types_.rend(); ++t)
    if (t->index >= 0 ? t->index == ::ncnn::LayerType::CustomBit + slot
                      : ::ncnn::layer_to_index(t->type.c_str()) == -1 &&
                            net.custom_layer_to_index(t->type.c_str()) == slot)
      return &*t;
  return nullptr;
}

int PythonLayerTypes::traverse(visitproc visit, void* arg) const {
  for (const PythonLayerType& t : types_) {
    Py_VISIT(t.creator.ptr());
    Py_VISIT(t.destroyer.ptr());
  }
  for (const auto& [layer, made] : layers) Py_VISIT(made.obj.ptr());
  return 0;
}

void PythonLayerTypes::clear() {
  for (PythonLayerType& t : types_) t.creator = nb::none(), t.destroyer = nb::none();
}

int PythonLayerTypes::register_with(::ncnn::Net& net, const PythonLayerType& t) {
  void* userdata = const_cast<PythonLayerType*>(&t);
  if (t.index >= 0) return net.register_custom_layer(t.index, create_python_layer, destroy_python_layer, userdata);
  // ncnn keeps the type's name by pointer: t's, which lives as long as this net's owner
  return net.register_custom_layer(t.type.c_str(), create_python_layer, destroy_python_layer, userdata);
}

namespace {

// A Layer method called from Python: ncnn's own layer's where create_layer made it; ncnn's base Layer's otherwise (a
// Python subclass calling it through super(): a qualified call, as its own would call it again). What the subclass's
// other methods raised meanwhile (ncnn's forward calls its forward_inplace) is raised here.
template <class Stock, class Base>
int own_method(::ncnn::Layer& l, Stock&& stock, Base&& base) {
  if (auto* s = dynamic_cast<StockLayer*>(&l)) return stock(*s);
  const int code = base();
  raise_python_layer_error();
  return code;
}

bool is_sequence(nb::handle h) { return PyList_Check(h.ptr()) || PyTuple_Check(h.ptr()); }

// The Mats of a list (or tuple) given for a multi-blob form (shared: a forward_inplace writes into their memory).
std::vector<Mat> mats_in(nb::handle seq, const char* what) {
  if (!is_sequence(seq)) raise(PyExc_TypeError, std::string(what) + " is " + type_of(seq) + ", not a list of Mats");
  std::vector<Mat> out;
  const size_t n = size_t(PySequence_Size(seq.ptr()));
  for (size_t i = 0; i < n; ++i) {
    nb::object item = nb::steal(PySequence_GetItem(seq.ptr(), Py_ssize_t(i)));
    if (!nb::isinstance<Mat>(item))
      raise(PyExc_TypeError, std::string(what) + "[" + std::to_string(i) + "] is " + type_of(item) + ", not a Mat");
    out.push_back(nb::cast<const Mat&>(item));
  }
  return out;
}

// A multi-blob form's Mats back into the list (or tuple) given: into its Mats (a caller holding them sees the
// result), a list grown or cut to what the layer made.
void mats_out(const std::vector<Mat>& mats, nb::handle seq) {
  const size_t n = size_t(PySequence_Size(seq.ptr()));
  for (size_t i = 0; i < mats.size() && i < n; ++i)
    nb::cast<Mat&>(nb::steal(PySequence_GetItem(seq.ptr(), Py_ssize_t(i)))) = mats[i];
  if (!PyList_Check(seq.ptr())) return;
  nb::list list = nb::borrow<nb::list>(seq);
  for (size_t i = n; i < mats.size(); ++i) list.append(nb::cast(mats[i]));
  if (n > mats.size()) PySequence_DelSlice(list.ptr(), Py_ssize_t(mats.size()), PY_SSIZE_T_MAX);
}

// An input of ncnn's own layer: a Mat with data (ncnn's layers do not check), in memory as ncnn allocates it (its
// x86 kernels load and store aligned vectors): a view at another offset (Mat.range, row_range, ...) as a copy.
Mat blob_for_stock(const Mat& m, const StockLayer& s, const std::string& what) {
  if (m.empty()) raise(PyExc_ValueError, s.label() + " forward: " + what + " is empty");
  const bool aligned = reinterpret_cast<uintptr_t>(m.data) % NCNN_MALLOC_ALIGN == 0 &&
                       (m.c <= 1 || (m.cstep * m.elemsize) % 16 == 0);
  if (aligned) return m;
  Mat copy = m.clone();
  if (copy.empty()) throw std::bad_alloc();
  return copy;
}

// An output of ncnn's own layer, as this module's Mats are (its option asked for that).
Mat blob_from_stock(const Mat& m, const StockLayer& s, const std::string& what) {
  if (!m.empty() && (m.elempack != 1 || m.elemsize != 4))
    raise(PyExc_RuntimeError, s.label() + " forward: " + what + " came out as elempack " +
                                  std::to_string(m.elempack) + ", " + std::to_string(m.elemsize) +
                                  "-byte elements, not float32 of elempack 1");
  return m;
}

// An in-place forward's result into the Mat given: into its memory where the layer ran on it, else copied there
// (the layer ran on an aligned copy of a view: the view's Mat sees the result, as with any other in-place write).
void put_in_place(const Mat& result, Mat& given, const StockLayer& s, const std::string& what) {
  const Mat out = blob_from_stock(result, s, what);
  if (out.data == given.data) return;
  if (out.dims != given.dims || out.w != given.w || out.h != given.h || out.d != given.d || out.c != given.c) {
    given = out;  // a layer that made another shape in place: the Mat given is that result
    return;
  }
  const size_t bytes = size_t(out.w) * out.h * out.d * out.elemsize;
  for (int q = 0; q < out.c; ++q)
    std::memcpy(static_cast<unsigned char*>(given.data) + q * given.cstep * given.elemsize,
                static_cast<const unsigned char*>(out.data) + q * out.cstep * out.elemsize, bytes);
}

// Layer's forward and forward_inplace, one blob or lists of them (pyncnn's two overloads of each).
int forward_one(::ncnn::Layer& l, const Mat& bottom_blob, Mat& top_blob, const ::ncnn::Option& opt) {
  return own_method(
      l,
      [&](StockLayer& s) {
        s.check_form(false, "forward");
        const Mat bottom = blob_for_stock(bottom_blob, s, "bottom_blob");
        return s.forward_with(opt, [&](const ::ncnn::Layer& in, const ::ncnn::Option& o) {
          Mat top;
          const int code = in.forward(bottom, top, o);
          if (code == 0) top_blob = blob_from_stock(top, s, "top_blob");
          return code;
        });
      },
      [&] { return l.::ncnn::Layer::forward(bottom_blob, top_blob, opt); });
}

int forward_many(::ncnn::Layer& l, const nb::handle bottom_blobs, const nb::list& top_blobs,
                 const ::ncnn::Option& opt) {
  std::vector<Mat> bottoms = mats_in(bottom_blobs, "bottom_blobs");
  std::vector<Mat> tops = mats_in(top_blobs, "top_blobs");
  const int code = own_method(
      l,
      [&](StockLayer& s) {
        s.check_form(true, "forward");
        s.check_lists("bottom_blobs", bottoms.size(), "top_blobs", tops.size());
        for (size_t i = 0; i < bottoms.size(); ++i)
          bottoms[i] = blob_for_stock(bottoms[i], s, "bottom_blobs[" + std::to_string(i) + "]");
        return s.forward_with(opt, [&](const ::ncnn::Layer& in, const ::ncnn::Option& o) {
          for (Mat& m : tops) m.release();
          const int code = in.forward(bottoms, tops, o);
          if (code == 0)
            for (Mat& m : tops) m = blob_from_stock(m, s, "top_blobs");
          return code;
        });
      },
      [&] { return l.::ncnn::Layer::forward(bottoms, tops, opt); });
  if (code == 0) mats_out(tops, top_blobs);
  return code;
}

int forward_inplace_one(::ncnn::Layer& l, Mat& bottom_top_blob, const ::ncnn::Option& opt) {
  return own_method(
      l,
      [&](StockLayer& s) {
        s.check_form(false, "forward_inplace");
        Mat blob = blob_for_stock(bottom_top_blob, s, "bottom_top_blob");
        return s.forward_with(opt, [&](const ::ncnn::Layer& in, const ::ncnn::Option& o) {
          const int code = in.forward_inplace(blob, o);
          if (code == 0) put_in_place(blob, bottom_top_blob, s, "bottom_top_blob");
          return code;
        });
      },
      [&] { return l.::ncnn::Layer::forward_inplace(bottom_top_blob, opt); });
}

int forward_inplace_many(::ncnn::Layer& l, const nb::handle bottom_top_blobs, const ::ncnn::Option& opt) {
  std::vector<Mat> blobs = mats_in(bottom_top_blobs, "bottom_top_blobs");
  const int code = own_method(
      l,
      [&](StockLayer& s) {
        s.check_form(true, "forward_inplace");
        s.check_lists("bottom_top_blobs", blobs.size(), nullptr, 0);
        std::vector<Mat> work(blobs.size());
        for (size_t i = 0; i < blobs.size(); ++i)
          work[i] = blob_for_stock(blobs[i], s, "bottom_top_blobs[" + std::to_string(i) + "]");
        return s.forward_with(opt, [&](const ::ncnn::Layer& in, const ::ncnn::Option& o) {
          const int code = in.forward_inplace(work, o);
          if (code == 0)
            for (size_t i = 0; i < blobs.size(); ++i)
              put_in_place(work[i], blobs[i], s, "bottom_top_blobs[" + std::to_string(i) + "]");
          return code;
        });
      },
      [&] { return l.::ncnn::Layer::forward_inplace(blobs, opt); });
  if (code == 0) mats_out(blobs, bottom_top_blobs);
  return code;
}

// A forward's arguments, by position or by pyncnn's names: the one-blob form's, or the list form's where the first
// is a list. Bound as one signature (*args, **kwargs), so a subclass may define either form (a type checker takes
// any override of such a method).
struct FormArgs {
  bool lists = false;
  std::vector<nb::handle> values;  // in the order of the form's names
};

FormArgs form_args(const char* method, const nb::args& args, const nb::kwargs& kwargs,
                   const std::vector<const char*>& one, const std::vector<const char*>& many) {
  FormArgs f;
  const nb::handle first = args.size() > 0 ? args[0] : nb::handle();
  f.lists = first ? is_sequence(first) : PyDict_Contains(kwargs.ptr(), nb::str(many[0]).ptr()) == 1;
  const std::vector<const char*>& names = f.lists ? many : one;
  const std::string call = std::string("Layer.") + method + "(" + [&] {
    std::string list;
    for (const char* n : names) list += (list.empty() ? "" : ", ") + std::string(n);
    return list;
  }() + ")";
  if (args.size() > names.size())
    raise(PyExc_TypeError, call + " takes " + std::to_string(names.size()) + " arguments, got " +
                               std::to_string(args.size()));
  f.values.assign(names.size(), nb::handle());
  for (size_t i = 0; i < args.size(); ++i) f.values[i] = args[i];
  for (auto [key, value] : kwargs) {
    const std::string k = nb::cast<std::string>(key);
    size_t i = 0;
    while (i < names.size() && k != names[i]) ++i;
    if (i == names.size() || f.values[i]) raise(PyExc_TypeError, call + ": unexpected or repeated argument " + k);
    f.values[i] = value;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (!f.values[i]) raise(PyExc_TypeError, call + ": missing " + names[i]);
    const bool want_list = f.lists && i + 1 < names.size();
    const bool is_option = i + 1 == names.size();
    const bool filled = want_list && std::string(names[i]) == "top_blobs";  // written: a list, grown or cut
    const bool ok = is_option ? nb::isinstance<::ncnn::Option>(f.values[i])
                    : filled  ? PyList_Check(f.values[i].ptr()) != 0
                    : want_list ? is_sequence(f.values[i])
                                : nb::isinstance<Mat>(f.values[i]);
    const char* wanted = is_option ? "an Option"
                         : filled  ? "a list of Mats"
                         : want_list ? "a list (or tuple) of Mats"
                                     : "a Mat";
    if (!ok) raise(PyExc_TypeError, call + ": " + names[i] + " is " + type_of(f.values[i]) + ", not " + wanted);
  }
  return f;
}

int forward_form(::ncnn::Layer& l, nb::args args, nb::kwargs kwargs) {
  const FormArgs f = form_args("forward", args, kwargs, {"bottom_blob", "top_blob", "opt"},
                               {"bottom_blobs", "top_blobs", "opt"});
  const auto& opt = nb::cast<const ::ncnn::Option&>(f.values[2]);
  if (f.lists) return forward_many(l, f.values[0], nb::borrow<nb::list>(f.values[1]), opt);
  return forward_one(l, nb::cast<const Mat&>(f.values[0]), nb::cast<Mat&>(f.values[1]), opt);
}

int forward_inplace_form(::ncnn::Layer& l, nb::args args, nb::kwargs kwargs) {
  const FormArgs f = form_args("forward_inplace", args, kwargs, {"bottom_top_blob", "opt"},
                               {"bottom_top_blobs", "opt"});
  const auto& opt = nb::cast<const ::ncnn::Option&>(f.values[1]);
  if (f.lists) return forward_inplace_many(l, f.values[0], opt);
  return forward_inplace_one(l, nb::cast<Mat&>(f.values[0]), opt);
}

// ModelBin.load's read (of ncnn's .bin, or a ModelBinFromMatArray's list, which notes what it could not give).
template <class Load>
Mat read(const ModelBinView& v, Load&& load) {
  const ::ncnn::ModelBin& b = lent(v, "ModelBin");
  Mat m = load(b);
  raise_array_error(b);
  return loaded(std::move(m));
}

// A list, tuple or 1-d numpy array of numbers as ncnn's int array (every item an int; type 5) or float array (type
// 6), or none where value is none of those.
std::optional<std::pair<Mat, int>> param_list(nb::handle value) {
  nb::object items = nb::borrow(value);
  if (nb::hasattr(value, "dtype") && nb::hasattr(value, "tolist")) {
    if (nb::cast<long long>(value.attr("ndim")) != 1)
      raise(PyExc_ValueError, "ParamDict.set: an array param is 1-d, got " +
                                  std::to_string(nb::cast<long long>(value.attr("ndim"))) + " dims");
    items = value.attr("tolist")();
  }
  if (!is_sequence(items)) return std::nullopt;
  const size_t n = size_t(PySequence_Size(items.ptr()));
  if (n == 0 || n > size_t(INT_MAX)) raise(PyExc_ValueError, "ParamDict.set: an array param holds 1..2^31-1 values");
  std::vector<nb::object> values;
  bool ints = true;
  for (size_t i = 0; i < n; ++i) {
    values.push_back(scalar_of(nb::steal(PySequence_GetItem(items.ptr(), Py_ssize_t(i)))));
    if (PyFloat_Check(values.back().ptr())) {
      ints = false;
    } else if (!PyLong_Check(values.back().ptr())) {
      raise(PyExc_TypeError, "ParamDict.set: an array param holds ints or floats, item " + std::to_string(i) +
                                 " is " + type_of(values.back()));
    }
  }
  Mat m(int(n), size_t(4));
  if (m.empty()) throw std::bad_alloc();
  for (size_t i = 0; i < n; ++i) {
    if (ints)
      static_cast<int*>(m.data)[i] = *param_int(values[i], "ParamDict.set: item " + std::to_string(i));
    else
      static_cast<float*>(m.data)[i] = float(PyFloat_AsDouble(nb::float_(values[i]).ptr()));
  }
  return std::make_pair(m, ints ? 5 : 6);
}

// What ParamDict.set takes: any value (`value`), or pyncnn's keywords' kinds (`i` an int, `f` a float, `v` an
// array: a Mat, a list or a numpy array).
enum class ParamKind { kAny, kInt, kFloat, kArray };

void param_set_kind(ParamDictView& v, int id, nb::handle value, ParamKind kind) {
  if (!v.own)
    raise(PyExc_RuntimeError, "ParamDict.set: the ParamDict ncnn gives load_param is read-only (const in "
                              "ncnn); ParamDict() makes one to fill");
  param_id(id);
  // every check before the value is set: a refused set leaves the param as it was. The type a .param gives an array
  // of set()'s (5, 6) is kept beside it; any other value's is ncnn's own (a Mat's: 4, its bits as they are).
  const auto put = [&](const auto& x, std::optional<int> array_type = std::nullopt) {
    v.own->set(id, x);
    if (array_type) v.array_types[id] = *array_type;
    else v.array_types.erase(id);
  };
  if (kind == ParamKind::kAny || kind == ParamKind::kInt)
    if (std::optional<int> i = param_int(value, "ParamDict.set: value")) return put(*i);
  if (kind == ParamKind::kAny || kind == ParamKind::kFloat) {
    std::optional<float> f = param_float(value);
    if (!f && kind == ParamKind::kFloat)
      if (std::optional<int> i = param_int(value, "ParamDict.set: f")) f = float(*i);  // as pyncnn's overload takes
    if (f) return put(*f);
  }
  if (kind == ParamKind::kAny && PyUnicode_Check(value.ptr())) return put(nb::cast<std::string>(value));
  if ((kind == ParamKind::kAny || kind == ParamKind::kArray) && nb::isinstance<Mat>(value))
    return put(nb::cast<const Mat&>(value).clone());
  if (kind == ParamKind::kAny || kind == ParamKind::kArray) {
    std::optional<std::pair<Mat, int>> array = param_list(value);
    if (!array)
      raise(PyExc_TypeError, kind == ParamKind::kArray
                                 ? "ParamDict.set(id, v=...): a Mat, or a list or 1-d numpy array of ints or floats, "
                                   "got " + type_of(value)
                                 : "ParamDict.set(id, value): value is an int, float, str, Mat, or a list or 1-d "
                                   "numpy array of ints (an int array) or floats, got " + type_of(value));
    return put(array->first, array->second);
  }
  raise(PyExc_TypeError, std::string("ParamDict.set(id, ") + (kind == ParamKind::kInt ? "i" : "f") + "=...): " +
                             (kind == ParamKind::kInt ? "an int" : "a float") + ", got " + type_of(value));
}

void param_set(ParamDictView& v, int id, nb::handle value) { param_set_kind(v, id, value, ParamKind::kAny); }

// ParamDict.get: param id as default's type.
nb::object param_get(const ParamDictView& v, int id, nb::handle def) {
  const ::ncnn::ParamDict& pd = lent(v, "ParamDict");
  param_id(id);
  if (std::optional<int> i = param_int(def, "ParamDict.get: default")) return nb::int_(pd.get(id, *i));
  if (std::optional<float> f = param_float(def)) return nb::float_(pd.get(id, *f));
  if (PyUnicode_Check(def.ptr())) return nb::str(pd.get(id, nb::cast<std::string>(def)).c_str());
  if (nb::isinstance<Mat>(def)) return nb::cast(param_array(pd, v.type(id), id, nb::cast<const Mat&>(def)));
  raise(PyExc_TypeError, "ParamDict.get(id, default): default is an int, float, str or Mat (its type is "
                         "the type read), got " + type_of(def));
}

}  // namespace

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
      .def(
          "load_param",
          [](::ncnn::Layer& l, const ParamDictView& pd) {
            const ::ncnn::ParamDict& d = lent(pd, "ParamDict");
            return own_method(l, [&](StockLayer& s) { return s.load_param(d); },
                              [&] { return l.::ncnn::Layer::load_param(d); });
          },
          "pd"_a)
      .def(
          "load_model",
          [](::ncnn::Layer& l, const ModelBinView& mb) {
            const ::ncnn::ModelBin& b = lent(mb, "ModelBin");
            return own_method(l, [&](StockLayer& s) { return s.load_model(b); },
                              [&] { return l.::ncnn::Layer::load_model(b); });
          },
          "mb"_a)
      .def(
          "create_pipeline",
          [](::ncnn::Layer& l, const ::ncnn::Option& opt) {
            return own_method(l, [&](StockLayer& s) { return s.create_pipeline(opt); },
                              [&] { return l.::ncnn::Layer::create_pipeline(opt); });
          },
          "opt"_a)
      .def(
          "destroy_pipeline",
          [](::ncnn::Layer& l, const ::ncnn::Option& opt) {
            return own_method(l, [&](StockLayer& s) { return s.destroy_pipeline(opt); },
                              [&] { return l.::ncnn::Layer::destroy_pipeline(opt); });
          },
          "opt"_a)
      .def("forward", forward_form, "pyncnn's forward(bottom_blob, top_blob, opt) or forward(bottom_blobs, "
           "top_blobs, opt): ncnn's layer's where create_layer made it; ncnn's base Layer's through super() (where "
           "support_inplace, the tops cloned from the bottoms and forward_inplace run on them; -1 otherwise). Returns "
           "ncnn's code, 0 on success, the tops filled.")
      .def("forward_inplace", forward_inplace_form,
           "pyncnn's forward_inplace(bottom_top_blob, opt) or forward_inplace(bottom_top_blobs, opt): ncnn's "
           "layer's where create_layer made it; ncnn's base Layer's (-1) through super().");

  m.def(
      "create_layer",
      [](const std::string& type) -> ::ncnn::Layer* {
        const int index = type.find('\0') == std::string::npos ? ::ncnn::layer_to_index(type.c_str()) : -1;
        if (index < 0)
          raise(PyExc_ValueError, "create_layer: ncnn has no layer type '" + type + "' (a net's own types, Python "
                                  "layers and vknorm's among them, are not made here)");
        ::ncnn::Layer* inner = ::ncnn::create_layer(index);
        if (!inner)
          raise(PyExc_ValueError, "create_layer: this ncnn is built without layer type '" + type + "'");
        return new StockLayer(inner, type);
      },
      "type"_a, nb::rv_policy::take_ownership,
      "pyncnn's create_layer: ncnn's own CPU layer of that type (ncnn's LayerNorm ... too, not vknorm's), to run "
      "from Python in ncnn's order: load_param(pd), load_model(mb) where it has weights (ModelBinFromMatArray), "
      "create_pipeline(opt), forward / forward_inplace. Steps before a forward that were skipped are taken as a net "
      "takes them; it runs on float32 Mats of elempack 1 (the option's storage and packing switches are off).");
  m.def(
      "create_layer",
      [](int index) -> ::ncnn::Layer* {
        ::ncnn::Layer* inner = ::ncnn::create_layer(index);
        if (!inner)
          raise(PyExc_ValueError, "create_layer: ncnn has no layer of type index " + std::to_string(index) +
                                      " (or is built without it)");
        return new StockLayer(inner, "");
      },
      "index"_a, nb::rv_policy::take_ownership, "create_layer(type) by ncnn's type index (layer_to_index).");

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
      .def("set", param_set, "id"_a, "value"_a.none(),
           "Sets param id (a ParamDict made with ParamDict() only): an int, a float, a str, a Mat (an array as its "
           "bits), or a list or 1-d numpy array of ints (ncnn's int array) or of floats (its float array).")
      // pyncnn's keywords for the same (its get's, `def`, is a Python keyword: not taken)
      .def("set", [](ParamDictView& v, int id, nb::handle i) { param_set_kind(v, id, i, ParamKind::kInt); }, "id"_a,
           "i"_a.none())
      .def("set", [](ParamDictView& v, int id, nb::handle f) { param_set_kind(v, id, f, ParamKind::kFloat); },
           "id"_a, "f"_a.none())
      .def("set", [](ParamDictView& v, int id, nb::handle a) { param_set_kind(v, id, a, ParamKind::kArray); },
           "id"_a, "v"_a.none())
      .def(
          "type",
          [](const ParamDictView& v, int id) {
            lent(v, "ParamDict");
            return v.type(param_id(id));
          },
          "id"_a,
           "ncnn's type of param id: 0 not given, 2 int, 3 float, 4 array (set from a Mat), 5 int array, 6 float "
           "array, 7 string.")
      .def("get", param_get, "id"_a, "default"_a.none(),
           "Param id as default's type (default where the .param does not give it); an int array as float32.");

  nb::class_<ModelBinView>(m, "ModelBin",
                           "ncnn's ModelBin as a Python layer's load_model gets it: the layer's weights from the "
                           ".bin, in order, for that call only.")
      .def(
          "load",
          [](const ModelBinView& v, long long w, int type) {
            const std::vector<int> e = extents({{w, "w"}});
            return read(v, [&](const ::ncnn::ModelBin& b) { return b.load(e[0], weight_type(type)); });
          },
          "w"_a, "type"_a)
      .def(
          "load",
          [](const ModelBinView& v, long long w, long long h, int type) {
            const std::vector<int> e = extents({{w, "w"}, {h, "h"}});
            return read(v, [&](const ::ncnn::ModelBin& b) { return b.load(e[0], e[1], weight_type(type)); });
          },
          "w"_a, "h"_a, "type"_a)
      .def(
          "load",
          [](const ModelBinView& v, long long w, long long h, long long c, int type) {
            const std::vector<int> e = extents({{w, "w"}, {h, "h"}, {c, "c"}});
            return read(v, [&](const ::ncnn::ModelBin& b) { return b.load(e[0], e[1], e[2], weight_type(type)); });
          },
          "w"_a, "h"_a, "c"_a, "type"_a)
      .def(
          "load",
          [](const ModelBinView& v, long long w, long long h, long long d, long long c, int type) {
            const std::vector<int> e = extents({{w, "w"}, {h, "h"}, {d, "d"}, {c, "c"}});
            return read(v,
                        [&](const ::ncnn::ModelBin& b) { return b.load(e[0], e[1], e[2], e[3], weight_type(type)); });
          },
          "w"_a, "h"_a, "d"_a, "c"_a, "type"_a);

  nb::class_<ModelBinFromMatArrayView, ModelBinView>(
      m, "ModelBinFromMatArray",
      "pyncnn's ModelBinFromMatArray(weights): a ModelBin over a list of Mats (or one Mat), each load taking the next "
      "(a copy), to "
      "call a layer's load_model with by hand (a layer create_layer made, or a Python one). A load past the list's "
      "end or of another size than the next Mat's is a ValueError.")
      .def(
          "__init__",
          [](ModelBinFromMatArrayView* self, nb::handle weights) {
            // pyncnn's takes one Mat (a pointer to it: a second read runs past it); a list holds them all
            std::vector<Mat> copies;
            if (nb::isinstance<Mat>(weights))
              copies.push_back(nb::cast<const Mat&>(weights));
            else if (is_sequence(weights))
              copies = mats_in(weights, "ModelBinFromMatArray: weights");
            else
              raise(PyExc_TypeError, "ModelBinFromMatArray(weights): a list of Mats or one Mat, got " +
                                         type_of(weights));
            for (Mat& w : copies) {  // the list's Mats may be views of memory the caller lets go
              w = w.clone();
              if (w.empty()) raise(PyExc_ValueError, "ModelBinFromMatArray: weights holds an empty Mat");
            }
            new (self) ModelBinFromMatArrayView();
            auto own = std::make_shared<const MatArrayModelBin>(std::move(copies));
            self->of = own.get();
            self->own = std::move(own);
          },
          "weights"_a);
}

}  // namespace vknorm_python

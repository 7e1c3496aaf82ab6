// pyncnn's custom Python layers in vknorm._graph: a vknorm.graph.Layer subclass, made by a creator registered with
// Net.register_custom_layer, runs on the host inside ncnn's net (ncnn downloads and uploads around it in a Vulkan
// net), given ncnn's ParamDict and ModelBin at load and float32 Mats of elempack 1 at forward.
#pragma once
#include <nanobind/nanobind.h>

#include <deque>
#include <optional>
#include <string>
#include <unordered_map>

#include <ncnn/net.h>

namespace vknorm_python {

class PythonLayerTypes;

// One Python layer type registered with a net: what ncnn's registry calls (its userdata) to make and destroy
// layers of it.
struct PythonLayerType {
  std::string type;                     // "" for one registered by a custom index alone
  nanobind::object creator, destroyer;  // destroyer: None, or called with each layer before the net lets it go
  PythonLayerTypes* owner;
  int index = -1;  // the custom index (256 + j) it was registered by; -1: by its name
  std::string label() const { return index < 0 ? type : "registered by index " + std::to_string(index); }
};

// A net's Python layer types, and the Python objects of the layers its ncnn::Net holds. Declared in the net's owner
// ahead of its ncnn::Net, so they outlive the layers made from them. The net's Python type traverses them for the
// garbage collector (a creator defined in a module holds the module's globals, which hold the net).
class PythonLayerTypes {
 public:
  PythonLayerTypes() = default;
  PythonLayerTypes(const PythonLayerTypes&) = delete;
  PythonLayerTypes& operator=(const PythonLayerTypes&) = delete;
  ~PythonLayerTypes();
  // A type to register (register_with), after the checks that raise: a name ncnn's .param cannot hold, a creator or
  // destroyer that cannot be called, a type vknorm runs (vknorm) or folds into its norms as it loads (fuse), more
  // types than ncnn numbers (past 256 an index would alias another's; custom_slots: the net's count of its own types
  // so far, the next new one's index 256 + it). Null where the type was registered before: its creator and
  // destroyer are replaced, and ncnn has it already. With the GIL held.
  const PythonLayerType* add(const std::string& type, nanobind::handle creator, nanobind::handle destroyer,
                             bool vknorm, bool fuse, int custom_slots);
  // A type registered by a custom index alone (256 + j: pyncnn's register_custom_layer(index, ...), as binary params
  // number a model's own types), after the checks on the callables. Null where that index was registered so before.
  const PythonLayerType* add_at(int index, nanobind::handle creator, nanobind::handle destroyer);
  // The type whose custom index (256 + slot) is this one in `net`, registered by name or by index; null for none.
  const PythonLayerType* registered_at(::ncnn::Net& net, int slot) const;
  // Whether a type registered by index made this layer.
  bool made_by_index(const ::ncnn::Layer* layer) const {
    const auto it = layers.find(layer);
    return it != layers.end() && it->second.type->index >= 0;
  }
  // ncnn's register_custom_layer of t on net (its code): loads from then on make t's layers.
  static int register_with(::ncnn::Net& net, const PythonLayerType& t);
  // tp_traverse / tp_clear of the net's Python object: clear drops the creators and destroyers (an unreachable net
  // loads nothing again); the layers stay the net's until it goes.
  int traverse(visitproc visit, void* arg) const;
  void clear();

  // The layers' Python objects and the types that made them, by ncnn's pointer to them (made by the creators, let go
  // by the destroyer).
  struct Made {
    nanobind::object obj;
    const PythonLayerType* type;
  };
  std::unordered_map<const ::ncnn::Layer*, Made> layers;

 private:
  std::deque<PythonLayerType> types_;  // stable addresses: ncnn holds them as userdata
};

// Held while a net's ncnn::Net goes: what its layers raise meanwhile is reported as unraisable (nothing is there to
// raise it), and an error another call on this thread is still to raise stays that call's.
class NetGoing {
 public:
  NetGoing();
  ~NetGoing();
  NetGoing(const NetGoing&) = delete;
  NetGoing& operator=(const NetGoing&) = delete;

 private:
  bool own_errors_;
  std::optional<nanobind::python_error> outer_;
};

// True while a Python layer's creator, destroyer or method runs on this thread: the net that called it is held
// (loading, clearing or extracting), so a net's lock is not taken again from there (NetLock refuses it).
bool inside_python_layer();

// Raises (with the GIL held) the first Python exception a layer's code raised on this thread since the last call:
// the load, extract or clear that ran the layer fails with it, as in pyncnn.
void raise_python_layer_error();

// Layer, ParamDict, ModelBin, ModelBinFromMatArray and create_layer on the module.
void define_custom_layers(nanobind::module_& m);

}  // namespace vknorm_python

// Python values as vknorm._graph's bindings read them, shared by its source files.
#pragma once
#include <nanobind/nanobind.h>

#include <climits>
#include <optional>
#include <string>

namespace vknorm_python {

// A Python object's type for a message, module-qualified: numpy.ndarray, vknorm._graph.Mat (int for builtins).
inline std::string type_of(nanobind::handle h) {
  const nanobind::handle t = h.type();
  const std::string module = nanobind::hasattr(t, "__module__") ? nanobind::str(t.attr("__module__")).c_str() : "";
  const std::string name = nanobind::type_name(t).c_str();
  return module.empty() || module == "builtins" || name.rfind(module, 0) == 0 ? name : module + "." + name;
}

// An integer as operator.index takes it (Python's, numpy's: Mat(arr.size)), never a bool; none otherwise. Past long
// long: LLONG_MAX, out of any range its callers take.
inline std::optional<long long> as_index(nanobind::handle v) {
  if (PyBool_Check(v.ptr())) return std::nullopt;
  PyObject* index = PyNumber_Index(v.ptr());
  if (!index) {
    PyErr_Clear();
    return std::nullopt;
  }
  long long n = PyLong_AsLongLong(index);
  Py_DECREF(index);
  if (n == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    n = LLONG_MAX;
  }
  return n;
}

}  // namespace vknorm_python

// The GIL released around native work, for both extension modules (_core, _graph), and what a thread other
// than the main one does there once the interpreter is exiting.
//
// Python ends a daemon thread that wants the GIL back after finalization has begun by unwinding it from
// inside PyEval_RestoreThread (or PyGILState_Ensure, which nanobind calls to drop a Python-owned object);
// unwound through this destructor (noexcept) and nanobind's catch-all, that aborts the process ("terminate
// called without an active exception"). So once vknorm's exit hook has run (python/vknorm/__init__.py), a
// thread other than the main one (which finalizes, and may still run a forward from a __del__) starts no
// native work and does not take the GIL back after it: it parks until the process ends, as Python 3.14
// parks its own.
#pragma once
#include <nanobind/nanobind.h>

#include <unistd.h>

#include <atomic>

namespace vknorm_python {

struct ExitState {
  std::atomic<bool> exiting{false};
  unsigned long main_thread = 0;
};
inline ExitState& exit_state() {
  static ExitState state;
  return state;
}

// Called from each module's init: the interpreter's main thread, the one that finalizes it; and the hook
// vknorm's atexit handler calls.
inline void define_exit_hooks(nanobind::module_& m) {
  exit_state().main_thread =
      nanobind::cast<unsigned long>(nanobind::module_::import_("threading").attr("main_thread")().attr("ident"));
  m.def("_begin_exit", [] { exit_state().exiting = true; });
  // Objects a parked thread still holds are not leaks: nanobind would list each at exit.
  m.def("_quiet_leak_warnings", [] { nanobind::set_leak_warnings(false); });
}

[[noreturn]] inline void park() {
  for (;;) pause();
}

class ReleaseGil {
 public:
  ReleaseGil() : state_(PyEval_SaveThread()) {
    if (exiting_elsewhere(false)) park();
  }
  ~ReleaseGil() {
    if (exiting_elsewhere(true)) park();
    PyEval_RestoreThread(state_);
  }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  // The interpreter is exiting (finalizing counts only on the way back) and this is not the main thread.
  static bool exiting_elsewhere(bool or_finalizing) {
    const bool exiting = exit_state().exiting || (or_finalizing && finalizing());
    return exiting && PyThread_get_thread_ident() != exit_state().main_thread;
  }
  static bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
  }
  PyThreadState* state_;
};

}  // namespace vknorm_python

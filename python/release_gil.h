// The GIL released around native work, for both extension modules (_core, _graph).
//
// Python ends a daemon thread that wants the GIL back once finalization has begun: PyEval_RestoreThread
// calls pthread_exit, which unwinds the thread. Unwound through this destructor (noexcept) and nanobind's
// catch-all, that aborted the process ("terminate called without an active exception"). Such a thread
// parks instead, until the process ends, as Python 3.14 parks its own: it catches the unwind and never
// leaves the handler (a forced unwind must not be swallowed; this one is not, it just never ends).
#pragma once
#include <nanobind/nanobind.h>

#include <cxxabi.h>
#include <unistd.h>

namespace vknorm_python {

[[noreturn]] inline void park() {
  for (;;) pause();
}

inline void define_leak_warning_switch(nanobind::module_& m) {
  // Objects a parked thread still holds are not leaks: nanobind would list each at exit.
  m.def("_quiet_leak_warnings", [] { nanobind::set_leak_warnings(false); });
}

class ReleaseGil {
 public:
  ReleaseGil() : state_(PyEval_SaveThread()) {}
  ~ReleaseGil() {
    try {
      PyEval_RestoreThread(state_);
    } catch (abi::__forced_unwind&) {
      park();
    }
  }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace vknorm_python

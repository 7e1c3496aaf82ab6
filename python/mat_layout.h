// ncnn's host Mat layout as vknorm._graph's bindings meet it (graph_bindings.cpp, graph_mat_functions.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include <ncnn/mat.h>

#include "numpy_shape.h"

namespace vknorm_python {

// ncnn's CPU layers divide work by num_threads (SIGFPE at 0) and OpenMP makes that many threads (-1 ends the process,
// 100000 crashes it): the thread counts vknorm.graph takes.
constexpr int kMaxThreads = 1024;
inline bool thread_count_ok(int n) { return n >= 1 && n <= kMaxThreads; }

// The channel step ncnn gives a Mat of this shape: its planes rounded up to 16 bytes.
inline size_t aligned_cstep(const ::ncnn::Mat& m) {
  return ::ncnn::alignSize(size_t(m.w) * m.h * m.d * m.elemsize, 16) / m.elemsize;
}

// m, or a copy in ncnn's own layout where m's channels are not at the aligned cstep: a dims-3 view of a dims-4 Mat's
// channel (or a depth_range) has its planes w*h apart, where ncnn's layers and reshape take the aligned step.
inline ::ncnn::Mat in_ncnn_layout(const ::ncnn::Mat& m) {
  return m.dims >= 3 && m.cstep != aligned_cstep(m) ? m.clone() : m;
}

// numpy's strides of m's elements, in elements, for numpy_shape's order (channels cstep apart).
inline std::vector<int64_t> element_strides(const ::ncnn::Mat& m, const std::vector<size_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);  // innermost last
  for (size_t k = shape.size() - 1; k-- > 0;) strides[k] = strides[k + 1] * int64_t(shape[k + 1]);
  if (m.dims >= 3) strides[0] = int64_t(m.cstep);
  return strides;
}

}  // namespace vknorm_python

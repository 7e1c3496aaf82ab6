// numpy's shape of an ncnn-layout blob (unpacked extents): (w), (h, w), (c, h, w), (c, d, h, w), as pyncnn.
#pragma once
#include <cstddef>
#include <vector>

inline std::vector<size_t> numpy_shape(int dims, int w, int h, int d, int c) {
  switch (dims) {
    case 1: return {size_t(w)};
    case 2: return {size_t(h), size_t(w)};
    case 3: return {size_t(c), size_t(h), size_t(w)};
    default: return {size_t(c), size_t(d), size_t(h), size_t(w)};
  }
}

// The group model and ncnn's CPU algorithm, the reference every Vulkan path is checked against.
#include <cmath>
#include <stdexcept>
#include <string>

#include "vknorm/norm.h"

namespace vknorm {

int ParamDict::get(int id, int def) const {
  if (auto it = ints_.find(id); it != ints_.end()) return it->second;
  if (auto it = floats_.find(id); it != floats_.end()) return int(it->second);
  return def;
}

float ParamDict::get(int id, float def) const {
  if (auto it = floats_.find(id); it != floats_.end()) return it->second;
  if (auto it = ints_.find(id); it != ints_.end()) return float(it->second);
  return def;
}

GroupLayout group_layout(int dims, int w, int h, int d, int c, size_t cstep, int elempack, int affine_size,
                         bool affine) {
  GroupLayout g;
  g.elempack = elempack;
  uint64_t size = 0, gpc = 1, channels = 1, step = 0;
  std::string trailing;
  switch (dims) {
    case 1:  // one group of w
      size = w, step = w, trailing = "w=" + std::to_string(w);
      break;
    case 2:  // h groups of w; each (packed) row is a "channel"
      size = w, channels = h, step = w, trailing = "w=" + std::to_string(w);
      break;
    case 3:  // affine_size == w: rows; else the whole channel
      channels = c, step = cstep;
      if (affine_size == w) size = w, gpc = h;
      else size = uint64_t(w) * h;
      trailing = "h=" + std::to_string(h) + ", w=" + std::to_string(w);
      break;
    case 4:  // affine_size == w: rows; == w*h: depth slices; else the whole channel
      channels = c, step = cstep;
      if (affine_size == w) size = w, gpc = uint64_t(h) * d;
      else if (affine_size == w * h) size = uint64_t(w) * h, gpc = d;
      else size = uint64_t(w) * h * d;
      trailing = "d=" + std::to_string(d) + ", h=" + std::to_string(h) + ", w=" + std::to_string(w);
      break;
    default:
      throw std::invalid_argument("dims must be 1-4, got " + std::to_string(dims));
  }
  if (affine && uint64_t(affine_size) != size)
    throw std::invalid_argument("affine_size " + std::to_string(affine_size) +
                                " does not match the input's trailing dims (" + trailing + "): the groups have " +
                                std::to_string(size) + " elements");
  const uint64_t n_groups = channels * gpc;
  if (size > 0xffffffffull || n_groups > 0xffffffffull || step > 0xffffffffull)
    throw std::invalid_argument("tensor too large for 32-bit group indexing");
  g.group_size = uint32_t(size);
  g.gpc = uint32_t(gpc);
  g.cstep = uint32_t(step);
  g.n_groups = uint32_t(n_groups);
  return g;
}

namespace {

// ncnn's order: two float32 passes, then y = (x * a + b) * gamma + beta.
void layernorm_group(float* x, size_t n, float eps, const float* gamma, const float* beta) {
  float sum = 0.f;
  for (size_t i = 0; i < n; ++i) sum += x[i];
  const float mean = sum / n;
  float sqsum = 0.f;
  for (size_t i = 0; i < n; ++i) {
    const float t = x[i] - mean;
    sqsum += t * t;
  }
  const float var = sqsum / n;
  const float a = 1.f / std::sqrt(var + eps);
  const float b = -mean * a;
  for (size_t i = 0; i < n; ++i) x[i] = gamma ? (x[i] * a + b) * gamma[i] + beta[i] : x[i] * a + b;
}

void rmsnorm_group(float* x, size_t n, float eps, const float* gamma) {
  float sqsum = 0.f;
  for (size_t i = 0; i < n; ++i) sqsum += x[i] * x[i];
  const float rms = sqsum / n;
  const float a = 1.f / std::sqrt(rms + eps);
  for (size_t i = 0; i < n; ++i) x[i] = gamma ? x[i] * a * gamma[i] : x[i] * a;
}

}  // namespace

void reference_forward(NormOp op, float* base, const GroupLayout& g, float eps, const float* gamma, const float* beta) {
  for (uint32_t q = 0; q < g.n_groups; ++q) {
    const uint32_t ch = q / g.gpc;
    float* x = base + size_t(ch) * g.cstep + size_t(q - ch * g.gpc) * g.group_size;
    if (op == NormOp::LayerNorm) layernorm_group(x, g.group_size, eps, gamma, beta);
    else rmsnorm_group(x, g.group_size, eps, gamma);
  }
}

void Norm::forward_inplace_cpu(Mat& m) const {
  if (m.empty()) throw std::invalid_argument("empty input");
  if (m.elempack != 1 || m.is_fp16()) {
    Mat f = convert_packing(cast_fp32(m), 1);
    forward_inplace_cpu(f);
    Mat back = convert_packing(f, m.elempack);
    m = m.is_fp16() ? cast_fp16(back) : back;
    return;
  }
  const GroupLayout g = group_layout(m.dims, m.w, m.h, m.d, m.c, m.cstep, 1, affine_size, affine != 0);
  check_ready(g);
  const float* gamma = affine ? gamma_data.data() : nullptr;
  const float* beta = affine && op == NormOp::LayerNorm ? beta_data.data() : nullptr;
  reference_forward(op, reinterpret_cast<float*>(m.data()), g, eps, gamma, beta);
}

}  // namespace vknorm

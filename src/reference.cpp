// The group model and ncnn's CPU algorithm, the reference every Vulkan path is checked against.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "vknorm/norm.h"

namespace vknorm {

int ParamDict::get(int id, int def) const {
  // As ncnn's: a float where an int is read counts as not given (a .param's "0=16.0" is affine_size 0 there).
  if (auto it = ints_.find(id); it != ints_.end()) return it->second;
  return def;
}

float ParamDict::get(int id, float def) const {
  if (auto it = floats_.find(id); it != floats_.end()) return it->second;
  if (auto it = ints_.find(id); it != ints_.end()) return float(it->second);
  return def;
}

namespace {
// Products of extents that may pass 64 bits (four of 2^31 - 1): held at UINT64_MAX, which no check passes, and
// said as such in messages.
uint64_t times(uint64_t a, uint64_t b) {
  uint64_t out;
  return __builtin_mul_overflow(a, b, &out) ? UINT64_MAX : out;
}
std::string count(uint64_t n) { return n == UINT64_MAX ? "over 2^64" : std::to_string(n); }
}  // namespace

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
      else if (int64_t(affine_size) == int64_t(w) * h) size = uint64_t(w) * h, gpc = d;
      else size = times(uint64_t(w) * h, uint64_t(d));
      trailing = "d=" + std::to_string(d) + ", h=" + std::to_string(h) + ", w=" + std::to_string(w);
      break;
    default:
      throw std::invalid_argument("dims must be 1-4, got " + std::to_string(dims));
  }
  if (affine && uint64_t(affine_size) != size) {
    // ncnn's rule by dims: what its LayerNorm normalizes as one group.
    static const char* const rule[] = {"", "the whole blob", "each row of w", "each row where affine_size is w, else each channel",
                                       "each row where affine_size is w, each depth slice where w*h, else each channel"};
    std::string why = "affine_size " + std::to_string(affine_size) + " does not match the input's trailing dims (" +
                      trailing + "): ncnn's LayerNorm and RMSNorm normalize " + rule[dims] + " here, groups of " +
                      count(size) + " elements";
    const uint64_t whole = times(times(uint64_t(w) * h, uint64_t(d) * c), uint64_t(elempack));
    if (dims >= 2 && uint64_t(affine_size) == whole && whole != size)
      why += "; " + std::to_string(affine_size) + " is the whole " + std::to_string(dims) +
             "-d blob, which they cannot normalize as one group (stock ncnn would use the first " + std::to_string(size) +
             " weights on each of its groups: not what the model was exported for)";
    throw std::invalid_argument(why);
  }
  const uint64_t n_groups = times(channels, gpc);
  if (size > 0xffffffffull || n_groups > 0xffffffffull || step > 0xffffffffull)
    throw std::invalid_argument("tensor too large for 32-bit group indexing: groups of " + count(size) +
                                " elements, " + count(n_groups) + " groups, channel step " + count(step) +
                                " (each at most 2^32 - 1)");
  g.group_size = uint32_t(size);
  g.gpc = uint32_t(gpc);
  g.cstep = uint32_t(step);
  g.n_groups = uint32_t(n_groups);
  return g;
}

const char* op_name(NormOp op) {
  switch (op) {
    case NormOp::LayerNorm: return "LayerNorm";
    case NormOp::RMSNorm: return "RMSNorm";
    case NormOp::GroupNorm: return "GroupNorm";
    default: return "InstanceNorm";
  }
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::None: return "none";
    case Activation::ReLU: return "relu";
    case Activation::LeakyReLU: return "leakyrelu";
    case Activation::Sigmoid: return "sigmoid";
    case Activation::Swish: return "swish";
    case Activation::GELU: return "gelu";
    case Activation::FastGELU: return "gelu_fast";
  }
  return "?";
}

Activation activation_from_int(int v) {
  for (Activation a : {Activation::None, Activation::ReLU, Activation::LeakyReLU, Activation::Sigmoid, Activation::Swish,
                       Activation::GELU, Activation::FastGELU})
    if (int(a) == v) return a;
  throw std::invalid_argument("activation_type=" + std::to_string(v) +
                              ": expected 0 none, 1 ReLU, 2 leaky ReLU, 4 Sigmoid, 7 Swish, 8 GELU or 9 fast GELU");
}

std::string Fusion::describe() const {
  std::string s = residual == Add ? "add" : residual == AddWriteSum ? "add+sum" : residual == OutOfPlace ? "out of place" : "";
  if (activation != Activation::None) s += std::string(s.empty() ? "" : ", then ") + activation_name(activation);
  return s.empty() ? "none" : s;
}

void activation_forward(Activation a, float alpha, float* p, size_t n) {
  // ncnn's CPU layers: ReLU (slope), Sigmoid, Swish, GELU (erfc form, and fast_gelu's tanh form).
  for (size_t i = 0; i < n; ++i) {
    const float x = p[i];
    switch (a) {
      case Activation::None: break;
      case Activation::ReLU: p[i] = x < 0.f ? 0.f : x; break;
      case Activation::LeakyReLU: p[i] = x < 0.f ? x * alpha : x; break;
      case Activation::Sigmoid: p[i] = 1.f / (1.f + std::exp(-x)); break;
      case Activation::Swish: p[i] = x / (1.f + std::exp(-x)); break;
      case Activation::GELU: p[i] = 0.5f * x * std::erfc(-0.70710678f * x); break;
      case Activation::FastGELU: p[i] = 0.5f * x * (1.0f + std::tanh(0.79788452f * (x + 0.044715f * x * x * x))); break;
    }
  }
}

namespace {
uint32_t gcd(uint32_t a, uint32_t b) { return b ? gcd(b, a % b) : a; }
}  // namespace

GroupLayout channel_group_layout(int dims, int w, int h, int d, int c, size_t cstep, int elempack, int channels,
                                 int group, bool instance, const std::string& layer) {
  if (dims < 1 || dims > 4) throw std::invalid_argument(layer + ": dims must be 1-4, got " + std::to_string(dims));
  if (elempack != 1 && elempack != 4) throw std::invalid_argument(layer + ": elempack must be 1 or 4");
  // Channels (unpacked) and the elements of one channel plane, in packed elements.
  uint64_t in_channels = 1, plane = 0, step = 0;
  const char* what = "channels";
  if (instance && dims <= 2) {
    // ncnn's InstanceNorm: the whole blob is one channel and one group (pack4 rows: every lane in it).
    if (dims == 1 && elempack != 1) throw std::invalid_argument(layer + ": a dims-1 blob must be unpacked");
    if (channels > 1)
      throw std::invalid_argument(layer + ": a dims-" + std::to_string(dims) + " input is one channel, the layer has " +
                                  std::to_string(channels) + " (ncnn's InstanceNorm normalizes a dims 1-2 blob as one "
                                  "instance; rows are not channels there)");
    GroupLayout g;
    g.elempack = elempack;
    g.weights = GroupLayout::Single;
    g.channels_per_group = uint32_t(elempack);
    g.gpc = g.n_groups = 1;
    const uint64_t size = dims == 1 ? uint64_t(w) : uint64_t(w) * h;
    if (size > 0xffffffffull)
      throw std::invalid_argument(layer + ": tensor too large for 32-bit group indexing: one group of " +
                                  std::to_string(size) + " elements (at most 2^32 - 1)");
    g.group_size = g.cstep = uint32_t(size);
    return g;
  } else if (dims == 1) {  // every element is a channel
    if (elempack != 1) throw std::invalid_argument(layer + ": a dims-1 blob must be unpacked");
    in_channels = uint64_t(w), plane = 1, step = 1, what = "channels (w)";
  } else if (dims == 2) {  // rows are channels
    in_channels = uint64_t(h) * elempack, plane = uint64_t(w), step = uint64_t(w), what = "channels (rows)";
  } else {
    in_channels = uint64_t(c) * elempack, plane = times(uint64_t(w) * h, uint64_t(d)), step = cstep;
  }
  if (channels > 0 && in_channels != uint64_t(channels))
    throw std::invalid_argument(layer + ": the input has " + std::to_string(in_channels) + " " + what + ", the layer " +
                                std::to_string(channels) +
                                // a torch-style N x C x H x W array read as ncnn's c x d x h x w
                                (dims == 4 && uint64_t(d) == uint64_t(channels)
                                     ? " (a 4-D input is c x d x h x w, as in ncnn; drop a leading batch axis)"
                                     : ""));
  if (!instance && channels <= 0)
    throw std::invalid_argument(layer + ": channels=0 cannot split an input of " + std::to_string(in_channels) + " " +
                                what + " into groups");
  const uint64_t groups = instance ? in_channels : uint64_t(group);
  if (groups == 0 || in_channels % groups)
    throw std::invalid_argument(layer + ": " + std::to_string(in_channels) + " channels do not split into " +
                                std::to_string(groups) + " groups");
  const uint32_t cpg = uint32_t(in_channels / groups);
  GroupLayout g;
  g.elempack = elempack;
  g.weights = GroupLayout::ByChannel;
  g.channels_per_group = cpg;
  g.gpc = 1;
  // pack1: an item is a group of cpg planes. pack4: a run of lcm(cpg, 4) channels (whole groups and
  // whole packed planes); cpg / 4 planes when cpg divides by 4.
  const uint64_t planes = elempack == 1 ? cpg : uint64_t(cpg) / gcd(cpg, 4);  // lcm(cpg, 4) / 4
  const uint64_t items = in_channels / elempack / planes;
  if (times(plane, planes) > 0xffffffffull || step > 0xffffffffull || items > 0xffffffffull)
    throw std::invalid_argument(layer + ": tensor too large for 32-bit group indexing: items of " +
                                count(times(plane, planes)) + " elements, " + count(items) + " items, channel step " +
                                count(step) + " (each at most 2^32 - 1)");
  g.planes = uint32_t(planes);
  g.group_size = uint32_t(plane * planes);
  g.cstep = uint32_t(step);
  g.n_groups = uint32_t(items);
  return g;
}

GroupLayout norm_layout(NormOp op, int affine_size, int group, int channels, bool affine, int dims, int w, int h, int d,
                        int c, size_t cstep, int elempack) {
  if (op == NormOp::GroupNorm || op == NormOp::InstanceNorm)
    return channel_group_layout(dims, w, h, d, c, cstep, elempack, channels, group, op == NormOp::InstanceNorm,
                                op_name(op));
  try {
    return group_layout(dims, w, h, d, c, cstep, elempack, affine_size, affine);
  } catch (const std::invalid_argument& e) {  // named as the channel norms' messages are
    throw std::invalid_argument(std::string(op_name(op)) + ": " + e.what());
  }
}

std::string NormParams::describe() const {
  char eps_text[32];
  std::snprintf(eps_text, sizeof(eps_text), "%g", double(eps));
  const std::string tail = " affine=" + std::to_string(affine) + " eps=" + eps_text;
  if (op == NormOp::GroupNorm) return "group=" + std::to_string(group) + " channels=" + std::to_string(channels) + tail;
  if (op == NormOp::InstanceNorm) return "channels=" + std::to_string(channels) + tail;
  return "affine_size=" + std::to_string(affine_size) + tail;
}

void NormParams::check() const {
  if (int(op) < int(NormOp::LayerNorm) || int(op) > int(NormOp::InstanceNorm))  // op written directly
    throw std::invalid_argument("op " + std::to_string(int(op)) + " is not one of NormOp's values");
  const std::string layer = op_name(op);
  auto bad = [&](const std::string& why) { return std::invalid_argument(layer + ": " + why + " (" + describe() + ")"); };
  // Each type's own fields, as ncnn's layer of that type has them: the others are not read (InstanceNorm's groups
  // are its channels), whatever they hold.
  if (!per_channel() && affine_size < 0) throw bad("affine_size must be >= 0, got " + std::to_string(affine_size));
  if (!std::isfinite(eps) || eps < 0) throw bad("eps must be finite and >= 0");
  if (affine != 0 && affine != 1) throw bad("affine must be 0 or 1, got " + std::to_string(affine));
  if (op == NormOp::GroupNorm && group <= 0) throw bad("group must be > 0, got " + std::to_string(group));
  if (per_channel() && channels < 0) throw bad("channels must be >= 0, got " + std::to_string(channels));
  if (op == NormOp::GroupNorm && channels % group)
    throw bad("channels=" + std::to_string(channels) + " do not divide into group=" + std::to_string(group) + " groups");
  if (per_channel() && affine && channels == 0) throw bad("affine=1 needs channels > 0 (one gamma and beta per channel)");
}

void NormParams::check_weights(size_t gamma_count, size_t beta_count) const {
  if (weights_complete(gamma_count, beta_count)) return;
  const std::string layer = op_name(op);
  if (gamma_count == 0 && beta_count == 0)
    throw std::invalid_argument(layer + ": affine=1 but no weights loaded: call load_model first");
  // Loaded, but for other params (load_param after load_model), or written directly with other counts.
  const std::string want = std::to_string(weight_count()) + " (" + describe() + ")";
  if (gamma_count != weight_count())
    throw std::invalid_argument(layer + ": gamma has " + std::to_string(gamma_count) + " values, expected " + want +
                                ": load_model again with weights for these params");
  throw std::invalid_argument(layer + ": beta has " + std::to_string(beta_count) + " values, expected " + want +
                              ": load_model again with weights for these params");
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

// ncnn's GroupNorm (InstanceNorm: one plane per group) over `planes` channel planes of `size`
// elements, cstep apart: two float32 passes in channel order, then per channel
// GroupNorm y = (x * a + b) * gamma + beta, InstanceNorm y = x * a' + b' with a' = gamma / sqrt(var + eps).
void channel_group(NormOp op, float* x, size_t planes, size_t size, size_t cstep, float eps, const float* gamma,
                   const float* beta) {
  float sum = 0.f;
  for (size_t q = 0; q < planes; ++q)
    for (size_t i = 0; i < size; ++i) sum += x[q * cstep + i];
  const float mean = sum / (planes * size);
  float sqsum = 0.f;
  for (size_t q = 0; q < planes; ++q)
    for (size_t i = 0; i < size; ++i) {
      const float t = x[q * cstep + i] - mean;
      sqsum += t * t;
    }
  const float var = sqsum / (planes * size);
  for (size_t q = 0; q < planes; ++q) {
    float* p = x + q * cstep;
    float a, b;
    if (op == NormOp::InstanceNorm) {
      a = gamma ? gamma[q] / std::sqrt(var + eps) : 1.f / std::sqrt(var + eps);
      b = gamma ? -mean * a + beta[q] : -mean * a;
      for (size_t i = 0; i < size; ++i) p[i] = p[i] * a + b;
    } else {
      a = 1.f / std::sqrt(var + eps);
      b = -mean * a;
      for (size_t i = 0; i < size; ++i) p[i] = gamma ? (p[i] * a + b) * gamma[q] + beta[q] : p[i] * a + b;
    }
  }
}

}  // namespace

void reference_forward(NormOp op, float* base, const GroupLayout& g, float eps, const float* gamma, const float* beta) {
  if (g.elempack != 1) throw std::invalid_argument("reference_forward: needs an elempack-1 layout");
  for (uint32_t q = 0; q < g.n_groups; ++q) {
    const uint32_t ch = q / g.gpc;
    if (g.weights != GroupLayout::ByPosition) {  // a group of planes channels, from channel q * planes
      const size_t first = size_t(q) * g.planes;
      channel_group(op, base + first * g.cstep, g.planes, g.plane_size(), g.cstep, eps, gamma ? gamma + first : nullptr,
                    beta ? beta + first : nullptr);
      continue;
    }
    float* x = base + size_t(ch) * g.cstep + size_t(q - ch * g.gpc) * g.group_size;
    if (op == NormOp::LayerNorm) layernorm_group(x, g.group_size, eps, gamma, beta);
    else rmsnorm_group(x, g.group_size, eps, gamma);
  }
}

void Norm::forward_inplace_cpu(Mat& m) const {
  check_host_mat(m, "forward_inplace_cpu");
  if (m.elempack != 1 || m.is_fp16()) {
    Mat f = converted(m, 4, 1);
    forward_inplace_cpu(f);
    // In place: into m's own storage, which its shallow copies share (as forward_inplace), converted back at
    // m's own cstep (a Mat::external's need not be ncnn's).
    convert_into(f, m, m.data());
    return;
  }
  // A snapshot, as the Vulkan forwards take one: a load_model in another thread replaces the weights.
  NormParams p;
  Activation act;
  float alpha;
  std::vector<float> gamma_now, beta_now;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    p = *this, act = activation, alpha = activation_alpha, gamma_now = gamma_data, beta_now = beta_data;
  }
  p.check();  // fields written directly are checked as load_param checks them
  (void)activation_from_int(int(act));
  const GroupLayout g = p.layout(m.dims, m.w, m.h, m.d, m.c, m.cstep, 1);
  p.check_weights(gamma_now.size(), beta_now.size());
  const float* gamma = p.affine ? gamma_now.data() : nullptr;
  const float* beta = p.affine && centres(p.op) ? beta_now.data() : nullptr;
  reference_forward(p.op, reinterpret_cast<float*>(m.data()), g, p.eps, gamma, beta);
  if (act != Activation::None)
    for (int q = 0; q < (m.dims >= 3 ? m.c : 1); ++q)
      activation_forward(act, alpha, reinterpret_cast<float*>(m.data()) + q * m.cstep, size_t(m.w) * m.h * m.d);
}

}  // namespace vknorm

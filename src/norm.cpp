// The layer: parameters and weights as ncnn's, pipelines per device, and the recording of a forward.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>

#include "dispatch.h"
#include "vk.h"

namespace vknorm {

struct Norm::Gpu {
  std::shared_ptr<Context> ctx;
  std::mutex mutex;  // weights are uploaded once, by whichever call needs them first
  std::shared_ptr<Buffer> gamma, beta, unused;
};

namespace {

std::shared_ptr<Buffer> upload_floats(const std::shared_ptr<Context>& ctx, const std::vector<float>& v) {
  auto& impl = ctx->impl();
  const size_t bytes = std::max<size_t>(v.size() * sizeof(float), 16);
  auto dev = Buffer::create(ctx, bytes, Buffer::Kind::Device);
  if (impl.direct_host_access) {
    std::memcpy(dev->mapped, v.data(), v.size() * sizeof(float));
    return dev;
  }
  auto staging = Buffer::create(ctx, bytes, Buffer::Kind::Staging);
  std::memcpy(staging->mapped, v.data(), v.size() * sizeof(float));
  Submission s(impl, 1);
  s.copy(*staging, *dev, bytes);
  s.submit_and_wait();
  return dev;
}

void warn_once(const char* what) {
  static std::mutex m;
  static std::map<std::string, bool> seen;
  std::lock_guard<std::mutex> lock(m);
  if (!seen[what]) std::fprintf(stderr, "vknorm: %s\n", what), seen[what] = true;
}

// Storage and packing a blob takes on the device, given the Option and what the device can do.
struct DeviceFormat {
  bool fp16;
  int elempack;
};

DeviceFormat device_format(const Context& ctx, const Mat& m, const Option& opt) {
  DeviceFormat f{opt.use_fp16_storage, 1};
  if (f.fp16 && !const_cast<Context&>(ctx).impl().fp16_storage) {
    warn_once("float16 storage is not supported on this device; using float32 storage");
    f.fp16 = false;
  }
  // ncnn packs channels (dims 3/4) and rows (dims 2) by 4 when they divide; dims 1 stays unpacked.
  if (opt.use_packing_layout && m.dims >= 2 && m.unpacked_outer() % 4 == 0) f.elempack = 4;
  return f;
}

Mat to_format(const Mat& m, DeviceFormat f) {
  Mat unpacked = convert_packing(m, 1);
  Mat typed = f.fp16 ? cast_fp16(unpacked) : cast_fp32(unpacked);
  return convert_packing(typed, f.elempack);
}

Mat from_format(const Mat& dev, const Mat& like) {
  Mat unpacked = convert_packing(dev, 1);
  Mat typed = like.is_fp16() ? cast_fp16(unpacked) : cast_fp32(unpacked);
  return convert_packing(typed, like.elempack);
}

void check_indexing(const GroupLayout& g, size_t packed_elements, const DeviceInfo& info, size_t bytes) {
  // Shaders index in 32-bit packed elements; refuse what would wrap instead of computing garbage.
  if (packed_elements > 0xffffffffull || uint64_t(g.n_groups) * g.group_size > 0xffffffffull)
    throw std::invalid_argument("tensor of " + std::to_string(packed_elements) +
                                " elements exceeds 32-bit shader indexing");
  if (bytes > info.max_storage_buffer_range)
    throw std::invalid_argument("tensor of " + std::to_string(bytes) + " bytes exceeds the device's maxStorageBufferRange (" +
                                std::to_string(info.max_storage_buffer_range) + " bytes)");
}

}  // namespace

Norm::Norm(NormOp op_) : op(op_) {}
Norm::~Norm() = default;

void Norm::load_param(const ParamDict& pd) {
  const int new_affine_size = pd.get(0, 0);
  const float new_eps = pd.get(1, 0.001f);
  const int new_affine = pd.get(2, 1);
  if (new_affine_size < 0) throw std::invalid_argument("affine_size must be >= 0, got " + std::to_string(new_affine_size));
  if (!std::isfinite(new_eps) || new_eps < 0)
    throw std::invalid_argument("eps must be finite and >= 0, got " + std::to_string(new_eps));
  if (new_affine != 0 && new_affine != 1) throw std::invalid_argument("affine must be 0 or 1, got " + std::to_string(new_affine));
  std::lock_guard<std::mutex> lock(mutex_);
  affine_size = new_affine_size, eps = new_eps, affine = new_affine;
  gpu_.reset();
}

void Norm::load_model(std::vector<float> gamma, std::vector<float> beta) {
  if (!affine) {
    if (!gamma.empty() || !beta.empty()) throw std::invalid_argument("affine=0: this layer takes no weights");
    return;
  }
  auto check = [&](const std::vector<float>& v, const char* name) {
    if (v.size() != size_t(affine_size))
      throw std::invalid_argument(std::string(name) + " has " + std::to_string(v.size()) + " values, expected affine_size=" +
                                  std::to_string(affine_size));
  };
  check(gamma, "gamma");
  if (op == NormOp::LayerNorm) check(beta, "beta");
  else if (!beta.empty()) throw std::invalid_argument("RMSNorm takes gamma only");
  std::lock_guard<std::mutex> lock(mutex_);
  gamma_data = std::move(gamma);
  beta_data = std::move(beta);
  if (gpu_) gpu_->gamma.reset(), gpu_->beta.reset();
}

void Norm::check_ready(const GroupLayout&) const {
  if (affine && (gamma_data.size() != size_t(affine_size) ||
                 (op == NormOp::LayerNorm && beta_data.size() != size_t(affine_size))))
    throw std::invalid_argument("affine=1 but no weights loaded: call load_model first");
}

void Norm::create_pipeline(std::shared_ptr<Context> ctx, const Option&) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (gpu_ && gpu_->ctx == ctx) return;
  gpu_ = std::make_unique<Gpu>();
  gpu_->ctx = std::move(ctx);
}

void Norm::destroy_pipeline() {
  std::lock_guard<std::mutex> lock(mutex_);
  gpu_.reset();
}

std::shared_ptr<Context> Norm::context() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return gpu_ ? gpu_->ctx : nullptr;
}

DispatchInfo Norm::last_dispatch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_;
}

namespace {

// Split-path scratch (partials, coefficients), allocated once per submission and reused by every
// forward recorded into it.
struct Workspace {
  std::shared_ptr<Buffer> partials, coefs;
};

// Records one forward over `blob` (already on the device, in `g`'s layout) into `s`.
DispatchInfo record(Norm& layer, Norm::Gpu& gpu, Submission& s, const Buffer& blob, const GroupLayout& g, bool fp16,
                    const Option& opt, Workspace& ws) {
  const Plan plan = plan_dispatch(g, device_caps(*gpu.ctx, opt), opt, fp16);
  Context::Impl& impl = gpu.ctx->impl();
  const uint32_t op = layer.op == NormOp::RMSNorm ? 1 : 0;
  const uint32_t affine = layer.affine ? 1 : 0;
  {
    std::lock_guard<std::mutex> lock(gpu.mutex);
    if (!gpu.unused) gpu.unused = Buffer::create(gpu.ctx, 16, Buffer::Kind::Device);
    if (affine && !gpu.gamma) gpu.gamma = upload_floats(gpu.ctx, layer.gamma_data);
    if (affine && !gpu.beta)
      gpu.beta = layer.op == NormOp::LayerNorm ? upload_floats(gpu.ctx, layer.beta_data) : gpu.unused;
  }
  const Buffer* gamma = affine ? gpu.gamma.get() : gpu.unused.get();
  const Buffer* beta = affine ? gpu.beta.get() : gpu.unused.get();
  PushConstants pc{g.group_size, g.gpc, g.cstep, g.n_groups, plan.chunk_size, plan.n_chunks, plan.team, layer.eps};
  const std::string pack = g.elempack == 4 ? "4" : "1";

  DispatchInfo info;
  info.path = plan.path;
  info.workgroup_size = plan.wg;
  const int dispatches_before = s.dispatches();
  if (plan.path != Path::Split) {
    if (plan.vec4) pc.group_size /= 4, pc.cstep /= 4;  // the kernel counts vec4s
    const Specialization spec{plan.wg, op, affine, plan.items, plan.prefetch ? 1u : 0u};
    const auto& p = impl.pipeline(variant_name("norm_fused", fp16, plan.vec4 ? "v4" : pack, plan.subgroup), spec);
    s.dispatch(p, {&blob, gamma, beta, gpu.unused.get(), gpu.unused.get()}, pc, plan.fused_workgroups(g));
    info.team = plan.team, info.items = plan.items, info.subgroup = plan.subgroup, info.vec4 = plan.vec4;
  } else {
    const uint64_t items = uint64_t(g.n_groups) * plan.n_chunks;
    if (2 * items * g.elempack > 0xffffffffull) throw std::invalid_argument("too many chunks for 32-bit indexing");
    if (!ws.partials) ws.partials = Buffer::create(gpu.ctx, 2 * items * g.elempack * sizeof(float), Buffer::Kind::Device);
    if (!ws.coefs) ws.coefs = Buffer::create(gpu.ctx, 3ull * g.n_groups * g.elempack * sizeof(float), Buffer::Kind::Device);
    const std::array<const Buffer*, kBindings> bind{&blob, gamma, beta, ws.partials.get(), ws.coefs.get()};
    pc.team = plan.reduce_team;
    const Specialization spec{plan.wg, op, affine, 1, 0};
    s.dispatch(impl.pipeline(variant_name("norm_reduce", fp16, pack, false), spec), bind, pc, plan.reduce_workgroups(g));
    s.barrier();
    pc.team = plan.finalize_team;
    s.dispatch(impl.pipeline(variant_name("norm_finalize", fp16, pack, false), spec), bind, pc,
               plan.finalize_workgroups(g));
    s.barrier();
    pc.team = 1;
    s.dispatch(impl.pipeline(variant_name("norm_apply", fp16, pack, false), spec), bind, pc, plan.apply_workgroups(g));
    info.team = plan.reduce_team, info.chunks = plan.n_chunks;
  }
  info.dispatches = s.dispatches() - dispatches_before;
  return info;
}

}  // namespace

void Norm::forward_inplace(Mat& m, const Option& opt) {
  if (m.empty()) throw std::invalid_argument("empty input");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!gpu_) gpu_ = std::make_unique<Gpu>(), gpu_->ctx = Context::default_context();
  }
  Gpu& gpu = *gpu_;
  auto& impl = gpu.ctx->impl();
  const DeviceFormat fmt = device_format(*gpu.ctx, m, opt);
  Mat dev_mat = to_format(m, fmt);
  const GroupLayout g = group_layout(dev_mat.dims, dev_mat.w, dev_mat.h, dev_mat.d, dev_mat.c, dev_mat.cstep,
                                     dev_mat.elempack, affine_size, affine != 0);
  check_ready(g);
  check_indexing(g, dev_mat.total(), gpu.ctx->info(), dev_mat.bytes());

  const size_t bytes = dev_mat.bytes();
  Workspace ws;
  auto blob = Buffer::create(gpu.ctx, bytes, Buffer::Kind::Device);
  std::shared_ptr<Buffer> staging = impl.direct_host_access ? blob : Buffer::create(gpu.ctx, bytes, Buffer::Kind::Staging);
  std::memcpy(staging->mapped, dev_mat.data(), bytes);

  Submission s(impl, 3);
  if (!impl.direct_host_access) s.copy(*staging, *blob, bytes), s.barrier();
  s.timestamp(0);
  DispatchInfo info = record(*this, gpu, s, *blob, g, fmt.fp16, opt, ws);
  s.timestamp(1);
  s.barrier();
  if (!impl.direct_host_access) s.copy(*blob, *staging, bytes), s.barrier();
  s.submit_and_wait();
  info.gpu_us = s.gpu_us();
  std::memcpy(dev_mat.data(), staging->mapped, bytes);
  m = from_format(dev_mat, m);
  std::lock_guard<std::mutex> lock(mutex_);
  last_ = info;
}

void Norm::forward_inplace(VkMat& v, const Option& opt) {
  if (!v.buffer || v.dims == 0) throw std::invalid_argument("empty VkMat");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!gpu_) gpu_ = std::make_unique<Gpu>(), gpu_->ctx = v.context();
    if (gpu_->ctx != v.context()) throw std::invalid_argument("VkMat lives on another device than this layer");
  }
  Gpu& gpu = *gpu_;
  const GroupLayout g = group_layout(v.dims, v.w, v.h, v.d, v.c, v.cstep, v.elempack, affine_size, affine != 0);
  check_ready(g);
  check_indexing(g, v.bytes() / v.elemsize, gpu.ctx->info(), v.bytes());
  Workspace ws;
  Submission s(gpu.ctx->impl(), 3);
  s.timestamp(0);
  DispatchInfo info = record(*this, gpu, s, *v.buffer, g, v.elemsize == 2u * v.elempack, opt, ws);
  s.timestamp(1);
  s.submit_and_wait();
  info.gpu_us = s.gpu_us();
  std::lock_guard<std::mutex> lock(mutex_);
  last_ = info;
}

DispatchInfo Norm::forward_repeated(VkMat& v, const Option& opt, int warmup, int reps) {
  if (reps < 1 || warmup < 0) throw std::invalid_argument("forward_repeated: reps >= 1 and warmup >= 0");
  forward_inplace(v, opt);  // validates, creates pipelines and uploads weights outside the timed batch
  Gpu& gpu = *gpu_;
  const GroupLayout g = group_layout(v.dims, v.w, v.h, v.d, v.c, v.cstep, v.elempack, affine_size, affine != 0);
  const bool fp16 = v.elemsize == 2u * v.elempack;
  Workspace ws;
  Submission s(gpu.ctx->impl(), 3);
  DispatchInfo info;
  // Back-to-back forwards, each ordered after the last by a barrier, as consecutive layers would be.
  for (int i = 0; i < warmup; ++i) record(*this, gpu, s, *v.buffer, g, fp16, opt, ws), s.barrier();
  s.timestamp(0);
  for (int i = 0; i < reps; ++i) info = record(*this, gpu, s, *v.buffer, g, fp16, opt, ws), s.barrier();
  s.timestamp(1);
  s.submit_and_wait();
  info.gpu_us = s.gpu_us() / reps;
  return info;
}

double copy_repeated(const VkMat& src, int warmup, int reps, bool shader) {
  if (!src.buffer) throw std::invalid_argument("empty VkMat");
  auto ctx = src.context();
  auto& impl = ctx->impl();
  const vk::DeviceSize bytes = src.bytes();
  auto dst = Buffer::create(ctx, bytes, Buffer::Kind::Device);
  const uint32_t wg = impl.info.type == "cpu" ? 64 : 256;
  const Pipeline& p = impl.pipeline(variant_name("copy", false, "1", false), Specialization{wg, 0, 0, 1, 0});
  PushConstants pc{};
  pc.group_size = uint32_t(bytes / 16);  // vec4s; the tail (< 16 bytes) is not worth a second kernel
  const uint64_t workgroups = std::min<uint64_t>((pc.group_size + wg - 1) / wg, 1u << 16);
  Submission s(impl, 1);
  const std::array<const Buffer*, kBindings> bind{src.buffer.get(), dst.get(), dst.get(), dst.get(), dst.get()};
  auto one = [&] {
    if (shader) s.dispatch(p, bind, pc, workgroups);
    else s.copy(*src.buffer, *dst, bytes);
    s.barrier();
  };
  for (int i = 0; i < warmup; ++i) one();
  s.timestamp(0);
  for (int i = 0; i < reps; ++i) one();
  s.timestamp(1);
  s.submit_and_wait();
  return s.gpu_us() / reps;
}

size_t VkMat::bytes() const {
  return cstep * (dims >= 3 ? c : 1) * elemsize;
}

VkMat VkMat::upload(const Mat& m, std::shared_ptr<Context> ctx, const Option& opt) {
  if (m.empty()) throw std::invalid_argument("empty input");
  if (!ctx) ctx = Context::default_context();
  Mat dev = to_format(m, device_format(*ctx, m, opt));
  VkMat v;
  v.dims = dev.dims, v.w = dev.w, v.h = dev.h, v.d = dev.d, v.c = dev.c;
  v.elemsize = dev.elemsize, v.elempack = dev.elempack, v.cstep = dev.cstep;
  v.ctx_ = ctx;
  auto& impl = ctx->impl();
  v.buffer = Buffer::create(ctx, dev.bytes(), Buffer::Kind::Device);
  if (impl.direct_host_access) {
    std::memcpy(v.buffer->mapped, dev.data(), dev.bytes());
  } else {
    auto staging = Buffer::create(ctx, dev.bytes(), Buffer::Kind::Staging);
    std::memcpy(staging->mapped, dev.data(), dev.bytes());
    Submission s(impl, 1);
    s.copy(*staging, *v.buffer, dev.bytes());
    s.submit_and_wait();
  }
  return v;
}

Mat VkMat::download() const {
  if (!buffer) throw std::invalid_argument("empty VkMat");
  Mat m = Mat::create(dims, w, h, d, c, elemsize / elempack, elempack);
  auto& impl = ctx_->impl();
  if (impl.direct_host_access) {
    std::memcpy(m.data(), buffer->mapped, m.bytes());
    return m;
  }
  auto staging = Buffer::create(ctx_, m.bytes(), Buffer::Kind::Staging);
  Submission s(impl, 1);
  s.copy(*buffer, *staging, m.bytes());
  s.barrier();
  s.submit_and_wait();
  std::memcpy(m.data(), staging->mapped, m.bytes());
  return m;
}

}  // namespace vknorm

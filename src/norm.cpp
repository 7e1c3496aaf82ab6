// The layer: parameters and weights as ncnn's, pipelines per device, and the recording of a forward.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <stdexcept>

#include "dispatch.h"
#include "vk.h"

namespace vknorm {

// What a forward runs on: the device and a snapshot of the layer's parameters and weights, taken
// under Norm::mutex_. load_param / load_model / create_pipeline replace the layer's snapshot with a new
// one; forwards already running keep theirs (shared_ptr), so nothing they read changes under them.
struct Norm::Gpu : NormParams {
  std::shared_ptr<Context> ctx;
  Activation activation = Activation::None;
  float activation_alpha = 0.f;
  std::vector<float> gamma_data, beta_data;
  std::mutex mutex;  // weights are uploaded once, by whichever call needs them first
  std::shared_ptr<Buffer> gamma, beta, unused;
  SpecializedSizes specialized;  // the group sizes its plans take as a constant
};

namespace {

std::shared_ptr<Buffer> upload_floats(const std::shared_ptr<Context>& ctx, const std::vector<float>& v) {
  auto& impl = ctx->impl();
  // Whole vec4s: kernels reading weights as vec4s may touch the last one whole.
  const size_t bytes = std::max<size_t>((v.size() * sizeof(float) + 15) / 16 * 16, 16);
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

// How m lies on the device in format f (no storage).
Mat device_layout(const Mat& m, DeviceFormat f) { return layout_as(m, f.fp16 ? 2 : 4, f.elempack); }

// The device-format copy of src that a forward in pieces goes through, piece by piece: dst's own memory where dst
// is laid out so and either is src or does not overlap it (converting src into memory it shares laid out otherwise
// would overwrite what is still to be read), else memory of its own.
Mat pieces_copy(const Mat& src, Mat& dst, const Mat& device) {
  const unsigned char *s0 = src.data(), *d0 = dst.data();
  const bool overlap = s0 < d0 + dst.bytes() && d0 < s0 + src.bytes();
  const bool same_memory = s0 == d0 && src.elemsize == dst.elemsize && src.elempack == dst.elempack && src.cstep == dst.cstep;
  const bool dst_is_device = dst.elemsize == device.elemsize && dst.elempack == device.elempack &&
                             dst.cstep == device.cstep;
  if (!dst_is_device || (overlap && !same_memory)) return converted(src, device.scalar_bytes(), device.elempack);
  if (!same_memory) convert_into(src, device, dst.data());
  return dst;
}

// Where a host forward writes an output shaped like `like` (as ncnn's Mat::create): `out` itself where it already
// holds that shape, storage and packing, else a new Mat, given to the caller only once written (a forward that
// throws leaves its output as it was, not a Mat of unwritten memory).
Mat output_like(const Mat& out, const Mat& like) {
  if (holds_shape(out, like) && out.elemsize == like.elemsize && out.elempack == like.elempack) return out;
  return Mat::create_for_overwrite(layout_as(like, like.scalar_bytes(), like.elempack));
}

// Mapped memory laid out as `layout`, to convert from: viewed where it lies, or first copied out in one go
// where the host does not cache it.
Mat mapped_source(const Context::Impl& impl, const Buffer& b, const Mat& layout) {
  const Mat view = Mat::external(layout, b.mapped);
  const bool cached = b.kind == Buffer::Kind::Staging ? impl.staging_memory_cached : impl.device_memory_cached;
  return cached ? view : view.clone();
}

std::string describe_blob(int dims, int w, int h, int d, int c, size_t elemsize, int elempack) {
  std::string s = "dims=" + std::to_string(dims) + " w=" + std::to_string(w);
  if (dims >= 2) s += " h=" + std::to_string(h);
  if (dims == 4) s += " d=" + std::to_string(d);
  if (dims >= 3) s += " c=" + std::to_string(c);
  s += " elempack=" + std::to_string(elempack) + " (" + std::to_string(elemsize / elempack) + "-byte scalars)";
  if (elempack == 1 || dims < 2 || dims > 4) return s;
  // packed: the shape as numpy (VkMat.shape) gives it, the outer extent unpacked
  const std::string outer = std::to_string(int64_t(dims == 2 ? h : c) * elempack);
  const std::string rest = dims == 2   ? std::to_string(w)
                           : dims == 3 ? std::to_string(h) + ", " + std::to_string(w)
                                       : std::to_string(d) + ", " + std::to_string(h) + ", " + std::to_string(w);
  return s + ", shape (" + outer + ", " + rest + ")";
}

// Two VkMats of one layout: the same extents, packing, storage and channel step.
bool same_layout(const VkMat& a, const VkMat& b) {
  return a.dims == b.dims && a.w == b.w && a.h == b.h && a.d == b.d && a.c == b.c && a.elemsize == b.elemsize &&
         a.elempack == b.elempack && a.cstep == b.cstep;
}

template <class M>
[[noreturn]] void refuse_unfused_add(const M& x, const M& r) {
  auto blob = [](const M& m) { return describe_blob(m.dims, m.w, m.h, m.d, m.c, m.elemsize, std::max(m.elempack, 1)); };
  throw std::invalid_argument("forward_add: x (" + blob(x) + ") and residual (" + blob(r) +
                              ") differ in shape, packing or storage (a broadcasting add is not fused)");
}

// A VkMat's fields are public (as ncnn's): before anything reads or writes its buffer, they must describe a
// blob vknorm can hold that lies inside that buffer (fields edited after upload would run kernels and copies
// past it).
void check_vkmat(const VkMat& v, const char* what) {
  if (!v.buffer || v.dims == 0) throw std::invalid_argument(std::string(what) + ": empty VkMat");
  // `buffer` is public too: one taken from a VkMat of another context (or a VkMat assembled field by field, which
  // has none) would be bound on a device it does not belong to.
  if (v.buffer->ctx != v.context())
    throw std::invalid_argument(std::string(what) + ": the VkMat's buffer lives on another Vulkan context than the VkMat " +
                                (v.context() ? "(a buffer taken from a VkMat of another context)"
                                             : "(a VkMat assembled field by field has no context: make it with "
                                               "VkMat::upload or VkMat::create_like, or copy a whole VkMat)"));
  auto blob = [&] {
    return std::string(what) + ": VkMat " + describe_blob(v.dims, v.w, v.h, v.d, v.c, v.elemsize, std::max(v.elempack, 1));
  };
  if (!valid_blob_fields(v.dims, v.w, v.h, v.d, v.c, v.elemsize, v.elempack))
    throw std::invalid_argument(blob() + ", elemsize " + std::to_string(v.elemsize) +
                                ": dims 1-4 with extents >= 1 (and 1 past its dims), elempack 1 or 4 (4 only for "
                                "dims 2-4) of float32 or float16 scalars");
  const uint64_t plane = uint64_t(v.w) * uint64_t(v.h) * uint64_t(v.d);
  if (v.cstep < plane)
    throw std::invalid_argument(blob() + ": cstep " + std::to_string(v.cstep) + " is less than a channel's " +
                                std::to_string(plane) + " elements");
  const long double described = (long double)v.cstep * (v.dims >= 3 ? v.c : 1) * v.elemsize;
  if (described > (long double)v.buffer->size)
    throw std::invalid_argument(blob() + " (cstep " + std::to_string(v.cstep) + ") spans " +
                                std::to_string((unsigned long long)described) + " bytes, its buffer holds " +
                                std::to_string(v.buffer->size) + ": were its fields changed after it was made?");
}

// How one forward executes: the pieces, the buffer each is processed in, the split path's scratch.
struct Run {
  std::vector<Piece> pieces;
  uint64_t piece_buffer = 0;         // bytes of the buffer pieces are copied into; 0: the blob in place
  uint64_t partials = 0, coefs = 0;  // split-path workspace, the largest any piece needs
};

struct WorkspaceNeed {
  uint64_t partials = 0, coefs = 0;
};

WorkspaceNeed workspace_need(const Norm::Gpu& gpu, const GroupLayout& g, const DeviceCaps& caps, const Option& opt,
                             bool fp16) {
  const ForwardPlan fp = plan_forward(gpu.op, gpu.affine != 0, gpu.eps, g, fp16, caps, opt);
  return {fp.partials_bytes, fp.coefs_bytes};
}

// Chooses pieces so that every buffer fits the device's storage-buffer range and all of them the
// free device memory. Throws before anything is allocated when even one group per piece does not fit.
Run plan_run(const Norm::Gpu& gpu, const GroupLayout& g, size_t elemsize, uint64_t blob_bytes, bool fp16,
             const Option& opt, bool resident, const std::string& what) {
  Context::Impl& impl = gpu.ctx->impl();
  const DeviceInfo& info = impl.info;
  const BindingLimit limit = binding_limit(info.max_storage_buffer_range);
  const uint64_t max_buffer = limit.bytes;
  const std::string buffer_why = limit.why == std::string("maxStorageBufferRange") ? "the device's maxStorageBufferRange" : limit.why;
  const uint64_t group_bytes = uint64_t(g.group_size) * elemsize;
  // A pack4 item holds 4 / gcd(channels per group, 4) groups: unpacked, each is that many times smaller (a group
  // of 4 or more whole channels is the item itself).
  const uint32_t groups_per_item = g.elempack == 4 ? 4 / std::gcd(g.channels_per_group, 4u) : 1;
  if (group_bytes > max_buffer || g.group_size > kMaxPieceElements)
    throw std::invalid_argument(
        std::string(op_name(gpu.op)) + ": " + (g.elempack == 4 ? "a pack4 item (4 channels or rows stored interleaved) of " : "a group of ") +
        what + " is " + std::to_string(group_bytes) + " bytes (" + std::to_string(g.group_size) +
        " packed elements of " + std::to_string(elemsize) + " bytes), more than one storage buffer can hold on " +
        info.name + " (" + std::to_string(std::min<uint64_t>(max_buffer, kMaxPieceElements * elemsize)) + " bytes: " +
        (group_bytes > max_buffer ? buffer_why : std::string("2^31 elements, 32-bit indexing")) +
        "); a group is normalized whole, so this tensor cannot be processed in pieces" +
        (groups_per_item > 1 ? " (without the packing layout its groups are " + std::to_string(groups_per_item) +
                                   " times smaller)"
                             : std::string()));

  // Free memory as vknorm counts it: VKNORM_MAX_DEVICE_BYTES, else the device-local heap, less what
  // vknorm holds now (weights included: they are uploaded before planning).
  const uint64_t cap = impl.max_device_bytes ? impl.max_device_bytes : info.device_local_bytes ? info.device_local_bytes : ~0ull;
  const uint64_t in_use = impl.bytes_in_use;
  const uint64_t free = cap > in_use ? cap - in_use : 0;
  const bool staging = !resident && !impl.direct_host_access;
  const DeviceCaps caps = device_caps(*gpu.ctx, opt);

  auto out_of_memory = [&](uint64_t need) {
    return DeviceOutOfMemory(
        "vknorm: " + what + " (" + std::to_string(blob_bytes) + " bytes) needs at least " + std::to_string(need) +
        " bytes of device memory even one group (" + std::to_string(group_bytes) + " bytes) at a time; " +
        std::to_string(free) + " bytes are free (" + std::to_string(in_use) + " in use of " + std::to_string(cap) +
        (impl.max_device_bytes ? ", VKNORM_MAX_DEVICE_BYTES" : ", the device-local heap") + ")");
  };
  uint64_t max_piece = max_buffer;
  const bool in_place = resident && blob_bytes <= max_buffer && blob_bytes / elemsize <= kMaxPieceElements;
  if (!in_place) {  // the blob, or each piece of it, takes a buffer (and a staging one) of its own
    const uint64_t per_byte = staging ? 2 : 1;
    if (free / per_byte < group_bytes) throw out_of_memory(group_bytes * per_byte);
    max_piece = std::min(max_piece, std::max(free / per_byte, group_bytes));
  }
  for (;;) {
    // A million submissions is no way to run one layer: refuse rather than plan them.
    if (blob_bytes / max_piece > (1u << 20))
      throw DeviceOutOfMemory("vknorm: " + what + " (" + std::to_string(blob_bytes) + " bytes) would take more than " +
                              std::to_string(1u << 20) + " pieces of at most " + std::to_string(max_piece) +
                              " bytes (" + std::to_string(free) + " bytes of device memory free)");
    Run run;
    run.pieces = plan_pieces(g, elemsize, blob_bytes, max_piece);
    uint64_t largest = 0;
    uint64_t last_groups = 0;
    for (const Piece& p : run.pieces) {
      largest = std::max(largest, p.bytes);
      if (p.layout.n_groups == last_groups) continue;  // same workspace as the piece before
      last_groups = p.layout.n_groups;
      const WorkspaceNeed w = workspace_need(gpu, p.layout, caps, opt, fp16);
      run.partials = std::max(run.partials, w.partials), run.coefs = std::max(run.coefs, w.coefs);
    }
    const bool whole = run.pieces.size() == 1;
    run.piece_buffer = in_place && whole ? 0 : largest;
    const uint64_t need = run.piece_buffer * (staging ? 2 : 1) + run.partials + run.coefs;
    const bool buffers_fit = run.partials <= max_buffer && run.coefs <= max_buffer &&
                             run.partials / sizeof(float) <= 0xffffffffull;
    if (buffers_fit && need <= free) return run;
    if (largest <= group_bytes) {  // one group per piece and still too much
      if (!buffers_fit)
        throw std::invalid_argument("vknorm: the split path's scratch for " + what + " (" + std::to_string(run.partials) +
                                    " + " + std::to_string(run.coefs) + " bytes) exceeds one storage buffer (" +
                                    std::to_string(max_buffer) + " bytes: " + buffer_why + ")");
      throw out_of_memory(need);
    }
    max_piece = std::max(group_bytes, largest / 2);
  }
}

}  // namespace

std::vector<Piece> plan_pieces(const GroupLayout& g, size_t elemsize, uint64_t blob_bytes, uint64_t max_bytes) {
  if (!elemsize || !g.group_size || !g.gpc || !g.n_groups || g.n_groups % g.gpc ||
      g.planes == 0 || g.group_size % g.planes || (g.planes > 1 && g.cstep < g.plane_size()) ||
      (g.planes == 1 && g.n_groups > g.gpc && g.cstep < uint64_t(g.gpc) * g.group_size))
    throw std::invalid_argument("plan_pieces: not a group layout");
  const uint64_t max_elems = std::min<uint64_t>(max_bytes / elemsize, kMaxPieceElements);
  if (blob_bytes <= max_bytes && (blob_bytes + elemsize - 1) / elemsize <= kMaxPieceElements)
    return {Piece{0, blob_bytes, g}};
  if (g.group_size > max_elems)
    throw std::invalid_argument("plan_pieces: a group of " + std::to_string(g.group_size) + " packed elements (" +
                                std::to_string(uint64_t(g.group_size) * elemsize) + " bytes) exceeds a piece of " +
                                std::to_string(max_elems) + " elements (" + std::to_string(max_bytes) + " bytes)");
  // An item of several planes is handled as a channel of its own: planes * cstep apart.
  const uint64_t channels = g.n_groups / g.gpc;
  const uint64_t step = uint64_t(g.planes) * g.cstep;
  const uint64_t in_channel = g.planes > 1 ? (g.planes - 1) * uint64_t(g.cstep) + g.plane_size()
                                           : uint64_t(g.gpc) * g.group_size;  // elements of one channel's items
  std::vector<Piece> out;
  if (g.planes > 1 && in_channel > max_elems)
    throw std::invalid_argument("plan_pieces: a group spanning " + std::to_string(g.planes) + " channel planes (" +
                                std::to_string(in_channel * elemsize) + " bytes) exceeds a piece of " +
                                std::to_string(max_bytes) + " bytes");
  if (in_channel <= max_elems) {
    // Runs of whole channels: k of them span (k - 1) * step + in_channel elements.
    const uint64_t k = std::min<uint64_t>(channels, 1 + (max_elems - in_channel) / std::max<uint64_t>(step, 1));
    out.reserve(size_t((channels + k - 1) / k));
    for (uint64_t c0 = 0; c0 < channels; c0 += k) {
      const uint64_t kk = std::min(k, channels - c0);
      Piece p{c0 * step * elemsize, ((kk - 1) * step + in_channel) * elemsize, g, c0 * g.planes * g.elempack};
      p.layout.n_groups = uint32_t(kk * g.gpc);
      out.push_back(p);
    }
  } else {
    // A channel exceeds a piece: runs of its groups, each run a one-channel blob.
    const uint64_t k = max_elems / g.group_size;
    out.reserve(size_t(channels * ((g.gpc + k - 1) / k)));
    for (uint64_t ch = 0; ch < channels; ++ch)
      for (uint64_t g0 = 0; g0 < g.gpc; g0 += k) {
        const uint64_t kk = std::min<uint64_t>(k, g.gpc - g0);
        Piece p{(ch * g.cstep + g0 * g.group_size) * elemsize, kk * g.group_size * elemsize, g};
        p.layout.gpc = uint32_t(kk);
        p.layout.cstep = uint32_t(kk * g.group_size);
        p.layout.n_groups = uint32_t(kk);
        out.push_back(p);
      }
  }
  return out;
}

Norm::Norm(NormOp op_) { op = op_; }
Norm::~Norm() = default;

namespace {
// A snapshot of `n` on `ctx`; the caller holds n's mutex.
std::shared_ptr<Norm::Gpu> make_gpu(const Norm& n, std::shared_ptr<Context> ctx) {
  n.check();  // the public fields may have been written directly, past load_param's checks
  (void)activation_from_int(int(n.activation));  // so may the activation (any int cast to Activation)
  auto gpu = std::make_shared<Norm::Gpu>();
  gpu->ctx = std::move(ctx);
  static_cast<NormParams&>(*gpu) = n;
  gpu->activation = n.activation, gpu->activation_alpha = n.activation_alpha;
  gpu->gamma_data = n.gamma_data, gpu->beta_data = n.beta_data;
  return gpu;
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}
bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Whether `gpu` still mirrors n's public fields (bit for bit: a NaN weight is no change), or they were
// written directly since, ncnn style.
bool mirrors(const Norm::Gpu& gpu, const Norm& n) {
  return gpu.op == n.op && gpu.affine_size == n.affine_size && gpu.group == n.group && gpu.channels == n.channels &&
         same_bits(gpu.eps, n.eps) && gpu.affine == n.affine && gpu.activation == n.activation &&
         same_bits(gpu.activation_alpha, n.activation_alpha) && same_floats(gpu.gamma_data, n.gamma_data) &&
         same_floats(gpu.beta_data, n.beta_data);
}

void ensure_weights(Norm::Gpu& gpu) {
  std::lock_guard<std::mutex> lock(gpu.mutex);
  if (!gpu.unused) gpu.unused = Buffer::create(gpu.ctx, 16, Buffer::Kind::Device);
  if (gpu.affine && !gpu.gamma) gpu.gamma = upload_floats(gpu.ctx, gpu.gamma_data);
  if (gpu.affine && !gpu.beta)
    gpu.beta = centres(gpu.op) ? upload_floats(gpu.ctx, gpu.beta_data) : gpu.unused;
}
}  // namespace

void Norm::load_param(const ParamDict& pd) {
  const NormParams params = NormParams::read(op, pd);
  std::lock_guard<std::mutex> lock(mutex_);
  static_cast<NormParams&>(*this) = params;
  if (gpu_) gpu_ = make_gpu(*this, gpu_->ctx);  // same device (create_pipeline's); running forwards keep their snapshot
}

void Norm::load_model(std::vector<float> gamma, std::vector<float> beta) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string layer = op_name(op);
  if (!affine) {
    if (!gamma.empty() || !beta.empty()) throw std::invalid_argument(layer + ": affine=0: this layer takes no weights");
    return;
  }
  auto check = [&](const std::vector<float>& v, const char* name) {
    if (v.size() != weight_count())
      throw std::invalid_argument(layer + ": " + name + " has " + std::to_string(v.size()) + " values, expected " +
                                  (per_channel() ? "channels=" : "affine_size=") + std::to_string(weight_count()));
  };
  check(gamma, "gamma");
  if (centres(op)) check(beta, "beta");
  else if (!beta.empty()) throw std::invalid_argument("RMSNorm takes gamma only");
  gamma_data = std::move(gamma);
  beta_data = std::move(beta);
  if (gpu_) gpu_ = make_gpu(*this, gpu_->ctx);  // same device, new weights; running forwards keep the old
}


void Norm::create_pipeline(std::shared_ptr<Context> ctx, const Option&) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!ctx) ctx = Context::default_context();
  if (!gpu_ || gpu_->ctx != ctx || !mirrors(*gpu_, *this)) gpu_ = make_gpu(*this, std::move(ctx));
  // The weights go up now, as in ncnn's create_pipeline, where they are all there; else the first forward
  // uploads them or says what is missing (check_weights).
  if (gpu_->weights_complete(gpu_->gamma_data.size(), gpu_->beta_data.size())) ensure_weights(*gpu_);
}

void Norm::destroy_pipeline() {
  std::lock_guard<std::mutex> lock(mutex_);
  gpu_.reset();
}

std::shared_ptr<Norm::Gpu> Norm::gpu_for(const std::shared_ptr<Context>& ctx) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!gpu_) {
    auto gpu = make_gpu(*this, ctx ? ctx : Context::default_context());
    gpu->check_weights(gpu->gamma_data.size(), gpu->beta_data.size());  // a forward that cannot run binds no device
    gpu_ = std::move(gpu);
  } else if (ctx && gpu_->ctx != ctx)
    throw std::invalid_argument("VkMat lives on another Vulkan context than this layer's (another device, or the same device "
                                "opened again): upload it to the layer's device, or call create_pipeline with the VkMat's");
  else if (!mirrors(*gpu_, *this)) gpu_ = make_gpu(*this, gpu_->ctx);  // fields written directly since
  return gpu_;
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

// Split-path and cooperative scratch (partials; coefficients or counters), allocated once per forward
// (at the largest size its pieces need) and reused by every dispatch recorded over it.
struct Workspace {
  std::shared_ptr<Buffer> partials, coefs;
  std::shared_ptr<Buffer> gamma, beta;  // a piece's per-channel weights (record)
  CountersState counters;  // of coefs
  void reserve(const std::shared_ptr<Context>& ctx, uint64_t partials_bytes, uint64_t coefs_bytes) {
    if (partials_bytes && (!partials || partials->size < partials_bytes))
      partials = Buffer::create(ctx, partials_bytes, Buffer::Kind::Device);
    if (coefs_bytes && (!coefs || coefs->size < coefs_bytes))
      coefs = Buffer::create(ctx, coefs_bytes, Buffer::Kind::Device), counters = {};
  }
};

// A fused residual add's buffers: the second input, the output, and the sum (null: not written).
struct AddBuffers {
  const Buffer* residual = nullptr;
  const Buffer* out = nullptr;
  const Buffer* sum = nullptr;
};

Fusion fusion_of(const Norm::Gpu& gpu, const AddBuffers* add) {
  Fusion f;
  f.activation = gpu.activation, f.alpha = gpu.activation_alpha;
  if (add) f.residual = add->sum ? Fusion::AddWriteSum : Fusion::Add;
  return f;
}

// The executor for vknorm's own context: records the plan's passes over `blob` (already on the device,
// in `g`'s layout) into `s`, with a barrier wherever a pass reads what the one before wrote.
DispatchInfo record(Norm::Gpu& gpu, Submission& s, const Buffer& blob, const GroupLayout& g, bool fp16,
                    const Option& opt, Workspace& ws, uint64_t first_channel = 0, const AddBuffers* add = nullptr) {
  const ForwardPlan fp =
      plan_forward(gpu.op, gpu.affine != 0, gpu.eps, g, fp16, gpu.specialized.admit(device_caps(*gpu.ctx, opt), g.group_size), opt,
                    fusion_of(gpu, add));
  Context::Impl& impl = gpu.ctx->impl();
  ensure_weights(gpu);
  ws.reserve(gpu.ctx, fp.partials_bytes, fp.coefs_bytes);
  const Buffer* unused = gpu.unused.get();
  // A piece that starts past channel 0 reads per-channel weights from its own first channel on.
  const Buffer* gamma = gpu.affine ? gpu.gamma.get() : unused;
  const Buffer* beta = gpu.affine ? gpu.beta.get() : unused;
  if (gpu.affine && first_channel && g.weights == GroupLayout::ByChannel) {
    auto tail = [&](const std::vector<float>& v) { return std::vector<float>(v.begin() + long(first_channel), v.end()); };
    ws.gamma = upload_floats(gpu.ctx, tail(gpu.gamma_data));
    ws.beta = centres(gpu.op) ? upload_floats(gpu.ctx, tail(gpu.beta_data)) : gpu.unused;
    gamma = ws.gamma.get(), beta = ws.beta.get();
  }
  const std::array<const Buffer*, kBindings> bind{&blob, gamma, beta,
                                                  fp.partials_bytes ? ws.partials.get() : unused,
                                                  fp.coefs_bytes ? ws.coefs.get() : unused,
                                                  add ? add->residual : unused,
                                                  add ? add->out : unused,
                                                  add && add->sum ? add->sum : unused};
  bool recorded = false;
  for (const Pass& pass : fp.passes) {
    if (ws.counters.skips(pass, fp)) continue;
    if (pass.after_previous && recorded) s.barrier();
    s.dispatch(impl.pipeline(pass.variant, Specialization::of(pass)), bind, pass.push, pass.workgroups);
    recorded = true;
  }
  ws.counters.recorded(fp);
  return dispatch_info(fp);
}

// Adds one piece's record to the forward's.
void accumulate(DispatchInfo& total, const DispatchInfo& piece, bool first) {
  const int dispatches = first ? piece.dispatches : total.dispatches + piece.dispatches;
  const double us = first ? piece.gpu_us : total.gpu_us + piece.gpu_us;
  const int pieces = first ? 1 : total.pieces + 1;
  total = piece;
  total.dispatches = dispatches, total.gpu_us = us, total.pieces = pieces;
}

}  // namespace

void Norm::forward_inplace(Mat& m, const Option& opt) {
  check_host_mat(m, "forward_inplace");
  forward_host(m, m, opt);
}

void Norm::forward(const Mat& bottom, Mat& top, const Option& opt) {
  check_host_mat(bottom, "forward (bottom)");
  Mat out = output_like(top, bottom);
  forward_host(bottom, out, opt);
  top = out;
}

void Norm::forward_host(const Mat& src, Mat& dst, const Option& opt) {
  const std::shared_ptr<Gpu> gpu = gpu_for(nullptr);
  auto& impl = gpu->ctx->impl();
  const DeviceFormat fmt = device_format(*gpu->ctx, src, opt);
  // The blob's layout on the device, worked out before anything is converted or allocated.
  const Mat device = device_layout(src, fmt);
  const size_t elemsize = device.elemsize, cstep = device.cstep;
  const uint64_t bytes = device.bytes();
  const GroupLayout g = gpu->layout(device.dims, device.w, device.h, device.d, device.c, cstep, fmt.elempack);
  gpu->check_weights(gpu->gamma_data.size(), gpu->beta_data.size());
  ensure_weights(*gpu);
  const Run run = plan_run(*gpu, g, elemsize, bytes, fmt.fp16, opt, false,
                           "the tensor " + describe_blob(device.dims, device.w, device.h, device.d, device.c, elemsize,
                                                         fmt.elempack));
  Workspace ws;
  ws.reserve(gpu->ctx, run.partials, run.coefs);
  auto blob = Buffer::create(gpu->ctx, run.piece_buffer, Buffer::Kind::Device);
  std::shared_ptr<Buffer> staging =
      impl.direct_host_access ? blob : Buffer::create(gpu->ctx, run.piece_buffer, Buffer::Kind::Staging);
  auto* mapped = static_cast<unsigned char*>(staging->mapped);
  // One piece: src converted straight into the memory the device reads, the result straight out of it into dst.
  // Pieces: a whole device-format copy of src (dst's own memory where it already is one) goes piece by piece.
  const bool whole = run.pieces.size() == 1;
  Mat work = whole ? Mat() : pieces_copy(src, dst, device);
  DispatchInfo info;
  for (size_t i = 0; i < run.pieces.size(); ++i) {
    const Piece& p = run.pieces[i];
    if (whole)
      convert_into(src, device, mapped);
    else
      std::memcpy(mapped, work.data() + p.offset, p.bytes);
    Submission s(impl, 3);
    if (!impl.direct_host_access) s.copy(*staging, *blob, p.bytes), s.barrier();
    s.timestamp(0);
    DispatchInfo piece = record(*gpu, s, *blob, p.layout, fmt.fp16, opt, ws, p.first_channel);
    s.timestamp(1);
    if (!impl.direct_host_access) s.barrier(), s.copy(*blob, *staging, p.bytes);
    s.submit_and_wait();
    piece.gpu_us = s.gpu_us();
    if (whole)
      convert_into(mapped_source(impl, *staging, device), dst, dst.data());
    else
      std::memcpy(work.data() + p.offset, mapped, p.bytes);
    accumulate(info, piece, i == 0);
  }
  // In place as ncnn's forward_inplace: into dst's own storage, which its shallow copies share.
  if (!whole && work.data() != dst.data()) convert_into(work, dst, dst.data());
  std::lock_guard<std::mutex> lock(mutex_);
  last_ = info;
}

void Norm::forward_inplace(VkMat& v, const Option& opt) {
  check_vkmat(v, "forward_inplace");
  forward_device(v, v, opt);
}

void Norm::forward(const VkMat& bottom, VkMat& top, const Option& opt) {
  check_vkmat(bottom, "forward (bottom)");
  // top's own buffer where it already holds bottom's layout on bottom's device (not bottom's buffer), else a new
  // one, given to top only once written.
  const bool reuse =
      top.buffer && top.buffer != bottom.buffer && top.context() == bottom.context() && same_layout(top, bottom);
  if (reuse) check_vkmat(top, "forward (top)");
  VkMat out = reuse ? top : VkMat::create_like(bottom);
  forward_device(bottom, out, opt);
  top = std::move(out);
}

// src normalized into dst (dst: src's layout on src's device; may be src): one submission a piece, dst's copy of
// the blob (or of each piece) made on the device within it.
void Norm::forward_device(const VkMat& src, VkMat& dst, const Option& opt) {
  const std::shared_ptr<Gpu> gpu = gpu_for(src.context());
  auto& impl = gpu->ctx->impl();
  const GroupLayout g = gpu->layout(src.dims, src.w, src.h, src.d, src.c, src.cstep, src.elempack);
  gpu->check_weights(gpu->gamma_data.size(), gpu->beta_data.size());
  ensure_weights(*gpu);
  const bool fp16 = src.elemsize == 2u * src.elempack;
  const Run run = plan_run(*gpu, g, src.elemsize, src.bytes(), fp16, opt, true,
                           "the VkMat " + describe_blob(src.dims, src.w, src.h, src.d, src.c, src.elemsize, src.elempack));
  Workspace ws;
  ws.reserve(gpu->ctx, run.partials, run.coefs);
  // Too large for one storage buffer: each piece is copied into a buffer of its own and back.
  std::shared_ptr<Buffer> piece_buffer =
      run.piece_buffer ? Buffer::create(gpu->ctx, run.piece_buffer, Buffer::Kind::Device) : nullptr;
  const bool copy = src.buffer != dst.buffer;
  DispatchInfo info;
  for (size_t i = 0; i < run.pieces.size(); ++i) {
    const Piece& p = run.pieces[i];
    Submission s(impl, 3);
    if (piece_buffer) s.copy(*src.buffer, *piece_buffer, p.bytes, p.offset, 0), s.barrier();
    else if (copy && i == 0) s.copy(*src.buffer, *dst.buffer, src.bytes()), s.barrier();
    s.timestamp(0);
    DispatchInfo piece = record(*gpu, s, piece_buffer ? *piece_buffer : *dst.buffer, p.layout, fp16, opt, ws, p.first_channel);
    s.timestamp(1);
    if (piece_buffer) s.barrier(), s.copy(*piece_buffer, *dst.buffer, p.bytes, 0, p.offset);
    s.submit_and_wait();
    piece.gpu_us = s.gpu_us();
    accumulate(info, piece, i == 0);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  last_ = info;
}

DispatchInfo Norm::forward_repeated(VkMat& v, const Option& opt, int warmup, int reps) {
  if (reps < 1 || warmup < 0) throw std::invalid_argument("forward_repeated: reps >= 1 and warmup >= 0");
  forward_inplace(v, opt);  // validates, creates pipelines and uploads weights outside the timed batch
  const std::shared_ptr<Gpu> gpu = gpu_for(v.context());
  const GroupLayout g = gpu->layout(v.dims, v.w, v.h, v.d, v.c, v.cstep, v.elempack);
  gpu->check_weights(gpu->gamma_data.size(), gpu->beta_data.size());
  const bool fp16 = v.elemsize == 2u * v.elempack;
  const Run run = plan_run(*gpu, g, v.elemsize, v.bytes(), fp16, opt, true, "the VkMat");
  if (run.pieces.size() != 1 || run.piece_buffer)
    throw std::invalid_argument("forward_repeated: this VkMat is processed in " + std::to_string(run.pieces.size()) +
                                " pieces (larger than one storage buffer); benchmark a smaller one");
  Workspace ws;
  Submission s(gpu->ctx->impl(), 3);
  DispatchInfo info;
  // Back-to-back forwards, each ordered after the last by a barrier, as consecutive layers would be.
  for (int i = 0; i < warmup; ++i) record(*gpu, s, *v.buffer, g, fp16, opt, ws), s.barrier();
  s.timestamp(0);
  for (int i = 0; i < reps; ++i) info = record(*gpu, s, *v.buffer, g, fp16, opt, ws), s.barrier();
  s.timestamp(1);
  s.submit_and_wait();
  info.gpu_us = s.gpu_us() / reps;
  return info;
}

void Norm::set_activation(Activation a, float alpha) {
  (void)activation_from_int(int(a));  // std::invalid_argument for a value that is none of Activation's
  std::lock_guard<std::mutex> lock(mutex_);
  activation = a, activation_alpha = alpha;
  if (gpu_) gpu_ = make_gpu(*this, gpu_->ctx);  // running forwards keep their snapshot
}

namespace {
// The fused add takes no pieces: each of its blobs must fit one binding (as the norms plan them: the device's
// range, or VKNORM_MAX_BUFFER_BYTES where that is lower).
void check_fused_add_fits(const Context::Impl& impl, uint64_t bytes) {
  const BindingLimit limit = binding_limit(impl.info.max_storage_buffer_range);
  if (bytes > limit.bytes)
    throw std::invalid_argument("forward_add: " + std::to_string(bytes) + " bytes exceed one storage buffer (" +
                                std::to_string(limit.bytes) + " bytes, " + limit.why +
                                "); the fused add takes no pieces: add first (x + residual), then run the "
                                "layer, which takes a tensor in pieces");
}

// The checks every fused add makes on its inputs, before the layer takes their device (an empty x would otherwise
// bind the layer to the default one): one layout for both, one device.
void check_add_inputs(const VkMat& x, const VkMat& r) {
  check_vkmat(x, "forward_add");
  check_vkmat(r, "forward_add (residual)");
  if (x.context() != r.context()) throw std::invalid_argument("forward_add: x and residual live on different devices");
  if (!same_layout(x, r)) refuse_unfused_add(x, r);
}

// ... and on the layer, once it is on their device (the inputs checked): one binding for x, its weights complete.
GroupLayout add_layout(const Norm::Gpu& gpu, const VkMat& x) {
  check_fused_add_fits(gpu.ctx->impl(), x.bytes());
  gpu.check_weights(gpu.gamma_data.size(), gpu.beta_data.size());
  return gpu.layout(x.dims, x.w, x.h, x.d, x.c, x.cstep, x.elempack);
}
}  // namespace

VkMat Norm::forward_add(const VkMat& x, const VkMat& residual, VkMat* sum, const Option& opt) {
  check_add_inputs(x, residual);
  const std::shared_ptr<Gpu> gpu = gpu_for(x.context());
  const GroupLayout g = add_layout(*gpu, x);
  ensure_weights(*gpu);
  const bool fp16 = x.elemsize == 2u * x.elempack;
  // `sum` may name x or residual (x = x + r): their buffers are held until the kernel has run.
  const std::shared_ptr<VkMat::Buffer> x_buffer = x.buffer, residual_buffer = residual.buffer;
  VkMat out = VkMat::create_like(x);
  VkMat written_sum = sum ? VkMat::create_like(x) : VkMat();
  Workspace ws;
  Submission s(gpu->ctx->impl(), 3);
  const AddBuffers add{residual_buffer.get(), out.buffer.get(), sum ? written_sum.buffer.get() : nullptr};
  s.timestamp(0);
  DispatchInfo info = record(*gpu, s, *x_buffer, g, fp16, opt, ws, 0, &add);
  s.timestamp(1);
  s.submit_and_wait();
  info.gpu_us = s.gpu_us();
  if (sum) *sum = std::move(written_sum);
  std::lock_guard<std::mutex> lock(mutex_);
  last_ = info;
  return out;
}

void Norm::forward_add(const Mat& x, const Mat& residual, Mat& top, Mat* sum, const Option& opt) {
  check_host_mat(x, "forward_add");
  check_host_mat(residual, "forward_add (residual)");
  if (!same_shape(x, residual) || x.elemsize != residual.elemsize || x.elempack != residual.elempack)
    refuse_unfused_add(x, residual);
  // One Mat as both outputs: however each is allocated, the sum (assigned last) would take the result's place.
  if (sum == &top) throw std::invalid_argument("forward_add: top and sum are one Mat; give them Mats of their own");
  const std::shared_ptr<Gpu> gpu = gpu_for(nullptr);
  auto& impl = gpu->ctx->impl();
  const DeviceFormat fmt = device_format(*gpu->ctx, x, opt);
  const Mat device = device_layout(x, fmt);
  const uint64_t bytes = device.bytes();
  check_fused_add_fits(impl, bytes);
  gpu->check_weights(gpu->gamma_data.size(), gpu->beta_data.size());
  const GroupLayout g = gpu->layout(device.dims, device.w, device.h, device.d, device.c, device.cstep, fmt.elempack);
  ensure_weights(*gpu);
  // Both inputs are read (into the memory the device reads) before either output is written, so an output may be
  // x or the residual; the two outputs must not share memory.
  Mat out = output_like(top, x), sum_out = sum ? output_like(*sum, x) : Mat();
  if (sum && out.data() < sum_out.data() + sum_out.bytes() && sum_out.data() < out.data() + out.bytes())
    throw std::invalid_argument("forward_add: top and sum share memory; give them Mats of their own");
  // One submission: both inputs in, the fused kernel, both outputs out.
  using Kind = Buffer::Kind;
  auto device_buffer = [&] { return Buffer::create(gpu->ctx, bytes, Kind::Device); };
  const auto xb = device_buffer(), rb = device_buffer(), ob = device_buffer();
  const auto sb = sum ? device_buffer() : nullptr;
  auto staging_for = [&](const std::shared_ptr<Buffer>& b) {
    return !b || impl.direct_host_access ? b : Buffer::create(gpu->ctx, bytes, Kind::Staging);
  };
  const auto x_in = staging_for(xb), r_in = staging_for(rb);
  // Staging of the inputs serves the outputs on the way back.
  const auto o_back = impl.direct_host_access ? ob : x_in, s_back = !sum || impl.direct_host_access ? sb : r_in;
  convert_into(x, device, static_cast<unsigned char*>(x_in->mapped));
  convert_into(residual, device, static_cast<unsigned char*>(r_in->mapped));
  Workspace ws;
  Submission s(impl, 3);
  if (!impl.direct_host_access) s.copy(*x_in, *xb, bytes), s.copy(*r_in, *rb, bytes), s.barrier();
  const AddBuffers add{rb.get(), ob.get(), sb.get()};
  s.timestamp(0);
  DispatchInfo info = record(*gpu, s, *xb, g, fmt.fp16, opt, ws, 0, &add);
  s.timestamp(1);
  if (!impl.direct_host_access) {
    s.barrier();
    s.copy(*ob, *o_back, bytes);
    if (sum) s.copy(*sb, *s_back, bytes);
  }
  s.submit_and_wait();
  info.gpu_us = s.gpu_us();
  // Both sources first (copies where the host does not cache them): one that cannot be had leaves both outputs
  // unwritten.
  const Mat o_source = mapped_source(impl, *o_back, device);
  const Mat s_source = sum ? mapped_source(impl, *s_back, device) : Mat();
  convert_into(o_source, out, out.data());
  if (sum) convert_into(s_source, sum_out, sum_out.data());
  top = out;
  if (sum) *sum = sum_out;
  std::lock_guard<std::mutex> lock(mutex_);
  last_ = info;
}

DispatchInfo Norm::forward_add_repeated(const VkMat& x, const VkMat& residual, bool write_sum, const Option& opt,
                                        int warmup, int reps) {
  if (reps < 1 || warmup < 0) throw std::invalid_argument("forward_add_repeated: reps >= 1 and warmup >= 0");
  VkMat sum;
  VkMat out = forward_add(x, residual, write_sum ? &sum : nullptr, opt);  // validates, pipelines, weights
  const std::shared_ptr<Gpu> gpu = gpu_for(x.context());
  const GroupLayout g = add_layout(*gpu, x);
  const bool fp16 = x.elemsize == 2u * x.elempack;
  const AddBuffers add{residual.buffer.get(), out.buffer.get(), write_sum ? sum.buffer.get() : nullptr};
  Workspace ws;
  Submission s(gpu->ctx->impl(), 3);
  DispatchInfo info;
  for (int i = 0; i < warmup; ++i) record(*gpu, s, *x.buffer, g, fp16, opt, ws, 0, &add), s.barrier();
  s.timestamp(0);
  for (int i = 0; i < reps; ++i) info = record(*gpu, s, *x.buffer, g, fp16, opt, ws, 0, &add), s.barrier();
  s.timestamp(1);
  s.submit_and_wait();
  info.gpu_us = s.gpu_us() / reps;
  return info;
}

VkMat VkMat::create_like(const VkMat& m) {
  check_vkmat(m, "create_like");
  VkMat v = m;
  v.buffer = Buffer::create(m.ctx_, m.bytes(), Buffer::Kind::Device);
  return v;
}

double copy_repeated(const VkMat& src, int warmup, int reps, bool shader) {
  check_vkmat(src, "copy_repeated");
  if (warmup < 0 || reps < 1)
    throw std::invalid_argument("copy_repeated: warmup must be >= 0 and reps >= 1, got " + std::to_string(warmup) + " and " +
                                std::to_string(reps));
  auto ctx = src.context();
  auto& impl = ctx->impl();
  // Not src.bytes(): cstep padding (up to 14 % more at small planes) is not moved by a norm.
  const vk::DeviceSize bytes = src.element_bytes();
  const uint64_t max_buffer = binding_limit(impl.info.max_storage_buffer_range).bytes;  // as the norms bind
  if (shader && bytes > max_buffer)
    throw std::invalid_argument("copy_repeated: " + std::to_string(bytes) + " bytes exceed one storage buffer (" +
                                std::to_string(max_buffer) + " bytes)");
  // The shader binds the whole buffer, padding included: that must be within what the device binds.
  if (shader && src.buffer->size > impl.info.max_storage_buffer_range)
    throw std::invalid_argument("copy_repeated: the buffer of " + std::to_string(src.buffer->size) +
                                " bytes (cstep padding included) exceeds one storage buffer of the device (" +
                                std::to_string(impl.info.max_storage_buffer_range) + " bytes)");
  auto dst = Buffer::create(ctx, bytes, Buffer::Kind::Device);
  const uint32_t wg = impl.info.type == "cpu" ? 64 : 256;
  const std::shared_ptr<const Pipeline> p = impl.pipeline(variant_name("copy", false, "1", false), Specialization{{wg}});
  PushConstants pc{};
  pc.group_size = uint32_t(bytes / 16);  // vec4s; the tail (< 16 bytes) is not worth a second kernel
  const uint64_t workgroups = std::min<uint64_t>((pc.group_size + wg - 1) / wg, 1u << 16);
  Submission s(impl, 1);
  const std::array<const Buffer*, kBindings> bind{src.buffer.get(), dst.get(), dst.get(), dst.get(),
                                                  dst.get(), dst.get(), dst.get(), dst.get()};
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

size_t VkMat::element_bytes() const {
  return size_t(w) * h * d * c * elemsize;  // lower dims' extents are 1
}

VkMat VkMat::upload(const Mat& m, std::shared_ptr<Context> ctx, const Option& opt) {
  check_host_mat(m, "upload");
  if (!ctx) ctx = Context::default_context();
  // Converted straight into the mapped memory the device reads (or copies) from: no host copy in between.
  const Mat dev = device_layout(m, device_format(*ctx, m, opt));
  VkMat v;
  v.dims = dev.dims, v.w = dev.w, v.h = dev.h, v.d = dev.d, v.c = dev.c;
  v.elemsize = dev.elemsize, v.elempack = dev.elempack, v.cstep = dev.cstep;
  v.ctx_ = ctx;
  auto& impl = ctx->impl();
  v.buffer = Buffer::create(ctx, dev.bytes(), Buffer::Kind::Device);
  if (impl.direct_host_access) {
    convert_into(m, dev, static_cast<unsigned char*>(v.buffer->mapped));
  } else {
    auto staging = Buffer::create(ctx, dev.bytes(), Buffer::Kind::Staging);
    convert_into(m, dev, static_cast<unsigned char*>(staging->mapped));
    Submission s(impl, 1);
    s.copy(*staging, *v.buffer, dev.bytes());
    s.submit_and_wait();
  }
  return v;
}

Mat VkMat::download() const {
  Mat m;
  download(m);
  return m;
}

void VkMat::download(Mat& out) const {
  check_vkmat(*this, "download");
  const Mat stored = Mat::layout(dims, w, h, d, c, elemsize / elempack, elempack);
  // The VkMat's channel stride must be ncnn's for its shape, as every VkMat vknorm makes has.
  if (stored.cstep != cstep)  // (check_vkmat: cstep x channels fits the buffer)
    throw std::invalid_argument("download: VkMat cstep " + std::to_string(cstep) + " is not ncnn's " +
                                std::to_string(stored.cstep) + " for its shape: were its fields changed after it was made?");
  // A new Mat reaches the caller only once written (a failed download leaves out as it was).
  Mat into = holds_shape(out, stored) ? out : Mat::create_for_overwrite(stored);
  auto& impl = ctx_->impl();
  // In a fork()ed child too, where a mapped read would need no device call to look as if it worked.
  impl.instance->check_same_process();
  if (impl.direct_host_access) {
    convert_into(mapped_source(impl, *buffer, stored), into, into.data());
  } else {
    auto staging = Buffer::create(ctx_, stored.bytes(), Buffer::Kind::Staging);
    Submission s(impl, 1);
    s.copy(*buffer, *staging, stored.bytes());
    s.submit_and_wait();
    convert_into(mapped_source(impl, *staging, stored), into, into.data());
  }
  out = into;
}

}  // namespace vknorm

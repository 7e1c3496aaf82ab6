// LayerNorm, RMSNorm, GroupNorm and InstanceNorm with ncnn's layer interface: load_param -> load_model -> create_pipeline ->
// forward_inplace. forward_inplace_cpu is the reference that follows ncnn's CPU layer exactly.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "vknorm/context.h"
#include "vknorm/mat.h"
#include "vknorm/option.h"

// X11's <X11/Xlib.h> (which <vulkan/vulkan.h> includes under VK_USE_PLATFORM_XLIB_KHR) defines None as a
// macro: it is set aside while this header is read, so either may be included first. Code that sees that macro
// names the enumerators below Activation::Identity and Fusion::InPlace.
#pragma push_macro("None")
#undef None

namespace vknorm {

// ncnn's ParamDict: id -> int or float.
class ParamDict {
 public:
  void set(int id, int v) { ints_[id] = v; floats_.erase(id); }
  void set(int id, float v) { floats_[id] = v; ints_.erase(id); }
  int get(int id, int def) const;  // a float set here: def, as ncnn's ParamDict (its type is float)
  float get(int id, float def) const;
  bool has(int id) const { return ints_.count(id) || floats_.count(id); }

 private:
  std::map<int, int> ints_;
  std::map<int, float> floats_;
};

// How one blob splits into groups (ncnn's rules), in packed elements. A kernel's team works on one
// item: a group (LayerNorm, RMSNorm: part of one channel; InstanceNorm: a channel plane), or for
// GroupNorm `planes` consecutive channel planes. In pack4 a packed element holds 4 channels (or rows);
// lane j of the item's plane q belongs to its group (4q + j) / channels_per_group, so one item holds
// 4 / gcd(channels_per_group, 4) groups, or one when channels_per_group divides by 4.
struct GroupLayout {
  uint32_t group_size = 0;  // packed elements of one item
  uint32_t gpc = 0;         // items per packed channel (1 when an item spans planes)
  uint32_t cstep = 0;       // packed elements between packed channels
  uint32_t n_groups = 0;    // items in the blob
  int elempack = 1;         // 4: ncnn's pack4
  uint32_t planes = 1;              // channel planes an item spans, cstep apart, group_size / planes elements each
  uint32_t channels_per_group = 1;  // unpacked channels of one group (GroupNorm); 1 otherwise
  enum Weights : uint32_t { ByPosition = 0, ByChannel = 1, Single = 3 };
  Weights weights = ByPosition;     // gamma/beta by position in the group (LayerNorm, RMSNorm), per channel
                                    // (GroupNorm, InstanceNorm), or one pair for the blob (InstanceNorm, dims 1-2)
  uint32_t plane_size() const { return group_size / planes; }
  uint64_t groups() const { return uint64_t(n_groups) * elempack * planes / channels_per_group; }
};

// Throws std::invalid_argument (naming affine_size and the trailing dims) when affine weights of
// affine_size cannot index the groups.
GroupLayout group_layout(int dims, int w, int h, int d, int c, size_t cstep, int elempack,
                         int affine_size, bool affine);

// GroupNorm (group groups of channels / group channels each) and InstanceNorm (group == channels, one
// group per channel plane): the channels are w for dims 1, rows for dims 2, c for dims 3 and 4
// (InstanceNorm: dims 1 and 2 are one channel, as ncnn's CPU layer). Throws std::invalid_argument
// naming `layer` and the numbers when the input's channel count is not `channels`.
GroupLayout channel_group_layout(int dims, int w, int h, int d, int c, size_t cstep, int elempack, int channels,
                                 int group, bool instance, const std::string& layer);

enum class NormOp { LayerNorm, RMSNorm, GroupNorm, InstanceNorm };
const char* op_name(NormOp op);

// An activation applied to the norm's output as it is stored, with ncnn's CPU formulas. The values are
// ncnn's fused activation_type where ncnn has one (ReLU 1, leaky ReLU 2, Sigmoid 4), then vknorm's:
// Swish x * sigmoid(x), GELU 0.5 x erfc(-x / sqrt 2), and GELU's tanh form (ncnn's GELU fast_gelu=1).
enum class Activation : int {
  None = 0,
  Identity = None,  // None's other name, for code that includes Xlib
  ReLU = 1,
  LeakyReLU = 2,
  Sigmoid = 4,
  Swish = 7,
  GELU = 8,
  FastGELU = 9
};
const char* activation_name(Activation a);  // "none", "relu", "leakyrelu", "sigmoid", "swish", "gelu", "gelu_fast"
// Throws std::invalid_argument for a value that is not one of the above.
Activation activation_from_int(int v);

// What one kernel does beside the norm: the residual add that feeds it (BinaryOp add of two blobs of
// one shape), and the activation after it.
struct Fusion {
  enum Residual : int {
    None = 0,         // in place: y = act(norm(x)) over x
    InPlace = None,   // None's other name, for code that includes Xlib
    Add = 1,          // y = act(norm(x + r)) into a blob of its own; x and r stay as they are
    AddWriteSum = 2,  // the same, and x + r is written too (the add's output has other consumers)
    OutOfPlace = 3,   // y = act(norm(x)) into a blob of its own; x stays as it is (no add)
  };
  int residual = None;
  Activation activation = Activation::None;
  float alpha = 0.f;  // LeakyReLU's slope
  bool any() const { return residual != None || activation != Activation::None; }
  std::string describe() const;  // "add+sum, then gelu"
};

// The groups of a blob under a layer's params: group_layout for LayerNorm/RMSNorm (affine_size),
// channel_group_layout for GroupNorm (group, channels) and InstanceNorm (channels).
GroupLayout norm_layout(NormOp op, int affine_size, int group, int channels, bool affine, int dims, int w, int h, int d,
                        int c, size_t cstep, int elempack);
// Mean and variance (LayerNorm, GroupNorm, InstanceNorm) rather than the mean of squares (RMSNorm).
inline bool centres(NormOp op) { return op != NormOp::RMSNorm; }

// A layer's ncnn params, read and checked in one place for vknorm's layer and its ncnn layer. Ids:
// LayerNorm/RMSNorm 0 affine_size, 1 eps, 2 affine; GroupNorm 0 group, 1 channels, 2 eps, 3 affine;
// InstanceNorm 0 channels, 1 eps, 2 affine.
struct NormParams {
  NormOp op = NormOp::LayerNorm;
  int affine_size = 0;  // LayerNorm, RMSNorm
  int group = 1;        // GroupNorm
  int channels = 0;     // GroupNorm, InstanceNorm
  float eps = 0.001f;
  int affine = 1;

  // Reads ncnn's ids from any ParamDict (get(id, int default), get(id, float default)), then check().
  template <class Dict>
  static NormParams read(NormOp op, const Dict& pd) {
    NormParams p;
    p.op = op;
    const int eps_id = op == NormOp::GroupNorm ? 2 : 1;
    if (op == NormOp::GroupNorm) p.group = pd.get(0, 1), p.channels = pd.get(1, 0);
    else if (op == NormOp::InstanceNorm) p.channels = pd.get(0, 0);
    else p.affine_size = pd.get(0, 0);
    p.eps = pd.get(eps_id, 0.001f);
    p.affine = pd.get(eps_id + 1, 1) != 0;  // as ncnn's layers read it: weights unless 0 (2=2 runs there)
    p.check();
    return p;
  }
  // Throws std::invalid_argument, naming the layer and its params, on what ncnn's validation refuses
  // (and eps that is not finite and >= 0) in the fields of the op's type: affine_size (LayerNorm, RMSNorm), group
  // (GroupNorm), channels (GroupNorm, InstanceNorm); the others are not read.
  void check() const;
  bool per_channel() const { return op == NormOp::GroupNorm || op == NormOp::InstanceNorm; }
  // Floats in gamma (and beta): affine_size, or channels.
  size_t weight_count() const { return size_t(per_channel() ? channels : affine_size); }
  // Whether gamma (and beta, all but RMSNorm) of these counts are the weights these params take (or none are).
  bool weights_complete(size_t gamma_count, size_t beta_count) const {
    return !affine || (gamma_count == weight_count() && (!centres(op) || beta_count == weight_count()));
  }
  // Throws std::invalid_argument, saying what is missing, unless weights_complete.
  void check_weights(size_t gamma_count, size_t beta_count) const;
  // The groups of a blob of this shape (packed as given).
  GroupLayout layout(int dims, int w, int h, int d, int c, size_t cstep, int elempack) const {
    return norm_layout(op, affine_size, group, channels, affine != 0, dims, w, h, d, c, cstep, elempack);
  }
  std::string describe() const;  // "group=32 channels=320 affine=1 eps=1e-05"
};

// ncnn's CPU algorithm over every group of a float32, elempack-1 blob at `base` (gamma/beta null: no
// affine; indexed by position in the group, or by channel (g.weights)).
void reference_forward(NormOp op, float* base, const GroupLayout& g, float eps, const float* gamma, const float* beta);
// ncnn's CPU activation layers over n floats, in place.
void activation_forward(Activation a, float alpha, float* data, size_t n);

struct DispatchInfo {  // what the last forward did
  Path path = Path::Auto;
  int dispatches = 0;
  uint32_t workgroup_size = 0, team = 0, items = 0, chunks = 0;
  bool subgroup = false;
  bool vec4 = false;  // pack1 blob read as vec4s
  bool one_reduction = false;  // LayerNorm statistics from one team reduction (fused kernel)
  bool hold_storage = false;   // float16 elements held in registers as stored (fused kernel)
  bool prefetch = false;       // weights loaded early: with x (fused), during the wait (cooperative)
  bool plane_weights = false;  // fused, a group per workgroup: per-channel weights in shared memory up front
  bool lane_groups = false;    // fused, pack4 GroupNorm of 2 mod 4 channels per group: an item per group
  bool apply_last_first = false;  // split, rows: the apply pass walks each row's elements last to first
  double gpu_us = 0;  // from timestamp queries; 0 when the device has none
  int pieces = 1;     // submissions the blob was split into (plan_pieces); 1: processed whole
};

// A blob larger than one storage buffer (maxStorageBufferRange, or VKNORM_MAX_BUFFER_BYTES when
// lower) or than the free device memory is processed in pieces of whole groups (whole channels
// when they fit, else runs of groups of one channel), each a blob of its own in a buffer of at most
// max_bytes and at most kMaxPieceElements packed elements, so no 32-bit shader index can wrap.
constexpr uint64_t kMaxPieceElements = 1ull << 31;
struct Piece {
  uint64_t offset = 0;         // bytes into the blob
  uint64_t bytes = 0;          // bytes the piece spans
  GroupLayout layout;          // its groups, as a blob of its own
  uint64_t first_channel = 0;  // its first (unpacked) channel: where per-channel weights start
};
// One piece (the whole blob) when blob_bytes <= max_bytes. Throws std::invalid_argument when a single
// group exceeds max_bytes or kMaxPieceElements (a group is normalized whole, never split).
std::vector<Piece> plan_pieces(const GroupLayout& g, size_t elemsize, uint64_t blob_bytes, uint64_t max_bytes);

class VkMat;

class Norm : public NormParams {
 public:
  explicit Norm(NormOp op);
  virtual ~Norm();
  Norm(const Norm&) = delete;
  Norm& operator=(const Norm&) = delete;

  // The params (op, affine_size, group, channels, eps, affine) are NormParams'.
  std::vector<float> gamma_data, beta_data;

  // ncnn's params by id (NormParams::read). Throws std::invalid_argument on values ncnn's validation refuses.
  void load_param(const ParamDict& pd);
  // affine: gamma (and beta, all but RMSNorm) of affine_size values, or channels for GroupNorm/InstanceNorm.
  void load_model(std::vector<float> gamma, std::vector<float> beta = {});
  // Takes the device (ctx; the default context when null) and uploads the weights there, where load_model has
  // given them all (else the first forward does, or says what is missing). Pipelines depend on the blob's shape:
  // each is built at the first forward of its shape and kept by the context; `opt` is taken for ncnn's signature
  // and not read (each forward's Option picks its storage and path).
  void create_pipeline(std::shared_ptr<Context> ctx, const Option& opt = {});
  void destroy_pipeline();

  // ncnn's CPU algorithm on a float32 elempack-1 Mat (other storages are converted and back).
  void forward_inplace_cpu(Mat& m) const;
  // Vulkan. Host Mat: one upload, one submission, one download. VkMat: one submission, no host copy.
  // A blob too large for one buffer or for the free device memory runs in pieces (plan_pieces); one
  // that cannot be split is refused before anything is allocated (std::invalid_argument past the
  // device's buffer range, DeviceOutOfMemory past its memory). A host Mat without memory (Mat::layout) or
  // whose fields describe more than it holds is refused (std::invalid_argument), as is a VkMat's.
  //
  // Threads: forward_inplace, forward, forward_inplace_cpu, forward_repeated, last_dispatch and context may be
  // called from any number of threads at once, also while another thread runs load_param / load_model /
  // create_pipeline / destroy_pipeline: each forward runs on the parameters, weights and device the
  // layer had when it started (a snapshot). The public fields above are written by load_param /
  // load_model; read them only while no load runs at the same time. Fields written directly (ncnn
  // style: gamma_data, eps, activation, ...) take effect at the next forward, checked as load_param
  // checks them.
  void forward_inplace(Mat& m, const Option& opt = {});
  void forward_inplace(VkMat& m, const Option& opt = {});
  // As ncnn's Layer::forward: bottom is only read; top is written where it already has bottom's shape,
  // storage and packing (any cstep that holds its planes: a Mat::external over an array works; a top that
  // lies over bottom's own memory, as a shallow copy `Mat top = bottom` does, is written there too, as ncnn's
  // Mat::create keeps such a top: bottom then holds the result), else
  // allocated so (given to top only once written: a forward that throws leaves such a top as it was). The host
  // copies are the least there can be where the tensor runs whole: bottom converted straight into the memory
  // the device reads and the result straight out of it into top (in pieces, through a device-format copy).
  void forward(const Mat& bottom, Mat& top, const Option& opt = {});
  // The same on the device: bottom is only read; top is written where it already has bottom's layout on
  // bottom's device in a buffer of its own (not bottom's, nor a shallow copy's), else it becomes a new VkMat.
  // One submission (one a piece), no host copy.
  void forward(const VkMat& bottom, VkMat& top, const Option& opt = {});

  // Benchmarking: `warmup` untimed then `reps` timed forwards in one submission, barriers between;
  // gpu_us is per forward (Vulkan timestamps).
  DispatchInfo forward_repeated(VkMat& m, const Option& opt, int warmup, int reps);

  // Fusion. The activation is applied to the output of every forward (ncnn's CPU formulas; alpha is
  // LeakyReLU's slope). forward_add is a BinaryOp add and this layer in one kernel: it returns
  // act(norm(x + residual)) in a new VkMat and leaves x and residual as they are; `sum`, when given,
  // also receives x + residual as the add would store it. x and residual must match in shape, packing
  // and storage and fit one storage buffer (std::invalid_argument otherwise).
  Activation activation = Activation::None;
  float activation_alpha = 0.f;
  void set_activation(Activation a, float alpha = 0.f);
  VkMat forward_add(const VkMat& x, const VkMat& residual, VkMat* sum = nullptr, const Option& opt = {});
  // The same on host Mats, in one submission: x and residual converted straight into the memory the device reads,
  // top (and *sum) written as forward writes top; an output may be x or the residual, not the other output.
  void forward_add(const Mat& x, const Mat& residual, Mat& top, Mat* sum = nullptr, const Option& opt = {});
  DispatchInfo forward_add_repeated(const VkMat& x, const VkMat& residual, bool write_sum, const Option& opt,
                                    int warmup, int reps);

  DispatchInfo last_dispatch() const;
  std::shared_ptr<Context> context() const;

  struct Gpu;

 private:
  // The snapshot a forward runs on (mutex_ held inside); ctx null: the layer's device, else the default.
  std::shared_ptr<Gpu> gpu_for(const std::shared_ptr<Context>& ctx);
  void forward_host(const Mat& src, Mat& dst, const Option& opt);  // dst: src's shape and format (may be src)
  void forward_device(const VkMat& src, VkMat& dst, const Option& opt);  // dst: src's layout and device (may be src)
  std::shared_ptr<Gpu> gpu_;
  mutable std::mutex mutex_;
  DispatchInfo last_;
};

struct LayerNorm : Norm {
  LayerNorm() : Norm(NormOp::LayerNorm) {}
};
struct RMSNorm : Norm {
  RMSNorm() : Norm(NormOp::RMSNorm) {}
};
struct GroupNorm : Norm {
  GroupNorm() : Norm(NormOp::GroupNorm) {}
};
struct InstanceNorm : Norm {
  InstanceNorm() : Norm(NormOp::InstanceNorm) {}
};

// A blob in device memory with ncnn's layout (VkMat): consecutive layers need no host round trip.
class VkMat {
 public:
  int dims = 0, w = 0, h = 0, d = 0, c = 0;
  size_t elemsize = 0;
  int elempack = 1;
  size_t cstep = 0;

  VkMat() = default;
  VkMat(const VkMat&) = default;
  VkMat& operator=(const VkMat&) = default;
  // A moved-from VkMat is empty (dims 0, no buffer), as a moved-from Mat.
  VkMat(VkMat&& o) noexcept { take(o); }
  VkMat& operator=(VkMat&& o) noexcept {
    if (this != &o) take(o);
    return *this;
  }

  // Converts to the Option's storage and packing, then copies to the device.
  static VkMat upload(const Mat& m, std::shared_ptr<Context> ctx, const Option& opt = {});
  Mat download() const;  // as stored (packing and storage of the VkMat)
  // Into `out`, converted in the same pass to out's storage and packing where out already holds this shape
  // (same_shape; any cstep that holds its planes), else allocated as stored (given to out once written).
  void download(Mat& out) const;
  static VkMat create_like(const VkMat& m);  // same shape, packing, storage and device; contents undefined
  size_t bytes() const;          // the allocation: cstep padding included
  size_t element_bytes() const;  // the elements alone (w*h*d*c packed elements): what a norm reads or writes
  std::shared_ptr<Context> context() const { return ctx_; }

  struct Buffer;
  std::shared_ptr<Buffer> buffer;

 private:
  void take(VkMat& o) noexcept {
    move_blob_fields(*this, o);
    buffer = std::move(o.buffer), ctx_ = std::move(o.ctx_);
  }
  std::shared_ptr<Context> ctx_;
  friend class Norm;
};

// The roof for benchmarks: src.element_bytes() (not the cstep padding between channels, which a norm never
// moves) through a vec4 copy shader (shader=true) or vkCmdCopyBuffer, timed like
// Norm::forward_repeated. Returns microseconds per copy.
double copy_repeated(const VkMat& src, int warmup, int reps, bool shader);

}  // namespace vknorm

#pragma pop_macro("None")

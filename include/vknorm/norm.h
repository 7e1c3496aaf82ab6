// LayerNorm and RMSNorm with ncnn's layer interface: load_param -> load_model -> create_pipeline ->
// forward_inplace. forward_inplace_cpu is the reference that follows ncnn's CPU layer exactly.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "vknorm/context.h"
#include "vknorm/mat.h"
#include "vknorm/option.h"

namespace vknorm {

// ncnn's ParamDict: id -> int or float.
class ParamDict {
 public:
  void set(int id, int v) { ints_[id] = v; floats_.erase(id); }
  void set(int id, float v) { floats_[id] = v; ints_.erase(id); }
  int get(int id, int def) const;
  float get(int id, float def) const;
  bool has(int id) const { return ints_.count(id) || floats_.count(id); }

 private:
  std::map<int, int> ints_;
  std::map<int, float> floats_;
};

// How one blob splits into groups (ncnn's rules), in packed elements.
struct GroupLayout {
  uint32_t group_size = 0;  // elements normalized together
  uint32_t gpc = 0;         // groups per packed channel
  uint32_t cstep = 0;       // packed elements between packed channels
  uint32_t n_groups = 0;    // packed groups in the blob
  int elempack = 1;         // groups sharing one packed element
  uint64_t groups() const { return uint64_t(n_groups) * elempack; }
};

// Throws std::invalid_argument (naming affine_size and the trailing dims) when affine weights of
// affine_size cannot index the groups.
GroupLayout group_layout(int dims, int w, int h, int d, int c, size_t cstep, int elempack,
                         int affine_size, bool affine);

enum class NormOp { LayerNorm, RMSNorm };

// ncnn's CPU algorithm over every group of a float32, elempack-1 blob at `base` (gamma/beta null: no affine).
void reference_forward(NormOp op, float* base, const GroupLayout& g, float eps, const float* gamma, const float* beta);

struct DispatchInfo {  // what the last forward did
  Path path = Path::Auto;
  int dispatches = 0;
  uint32_t workgroup_size = 0, team = 0, items = 0, chunks = 0;
  bool subgroup = false;
  bool vec4 = false;  // pack1 blob read as vec4s
  bool one_reduction = false;  // LayerNorm statistics from one team reduction (fused kernel)
  double gpu_us = 0;  // from timestamp queries; 0 when the device has none
  int pieces = 1;     // submissions the blob was split into (plan_pieces); 1: processed whole
};

// A blob larger than one storage buffer (maxStorageBufferRange, or VKNORM_MAX_BUFFER_BYTES when
// lower) or than the free device memory is processed in pieces of whole groups (whole channels
// when they fit, else runs of groups of one channel), each a blob of its own in a buffer of at most
// max_bytes and at most kMaxPieceElements packed elements, so no 32-bit shader index can wrap.
constexpr uint64_t kMaxPieceElements = 1ull << 31;
struct Piece {
  uint64_t offset = 0;  // bytes into the blob
  uint64_t bytes = 0;   // bytes the piece spans
  GroupLayout layout;   // its groups, as a blob of its own
};
// One piece (the whole blob) when blob_bytes <= max_bytes. Throws std::invalid_argument when a single
// group exceeds max_bytes or kMaxPieceElements (a group is normalized whole, never split).
std::vector<Piece> plan_pieces(const GroupLayout& g, size_t elemsize, uint64_t blob_bytes, uint64_t max_bytes);

class VkMat;

class Norm {
 public:
  explicit Norm(NormOp op);
  virtual ~Norm();
  Norm(const Norm&) = delete;
  Norm& operator=(const Norm&) = delete;

  NormOp op;
  int affine_size = 0;
  float eps = 0.001f;
  int affine = 1;
  std::vector<float> gamma_data, beta_data;

  void load_param(const ParamDict& pd);  // 0 affine_size, 1 eps, 2 affine
  void load_model(std::vector<float> gamma, std::vector<float> beta = {});
  // Builds the pipelines this device needs (also done lazily on first forward).
  void create_pipeline(std::shared_ptr<Context> ctx, const Option& opt = {});
  void destroy_pipeline();

  // ncnn's CPU algorithm on a float32 elempack-1 Mat (other storages are converted and back).
  void forward_inplace_cpu(Mat& m) const;
  // Vulkan. Host Mat: one upload, one submission, one download. VkMat: one submission, no host copy.
  // A blob too large for one buffer or for the free device memory runs in pieces (plan_pieces); one
  // that cannot be split is refused before anything is allocated (std::invalid_argument past the
  // device's buffer range, DeviceOutOfMemory past its memory).
  //
  // Threads: forward_inplace, forward_repeated, last_dispatch and context may be called from any
  // number of threads at once, also while another thread runs load_param / load_model /
  // create_pipeline / destroy_pipeline: each forward runs on the parameters, weights and device the
  // layer had when it started (a snapshot). The public fields above are written by load_param /
  // load_model; read them, and run forward_inplace_cpu, only while no load runs at the same time.
  void forward_inplace(Mat& m, const Option& opt = {});
  void forward_inplace(VkMat& m, const Option& opt = {});

  // Benchmarking: `warmup` untimed then `reps` timed forwards in one submission, barriers between;
  // gpu_us is per forward (Vulkan timestamps).
  DispatchInfo forward_repeated(VkMat& m, const Option& opt, int warmup, int reps);

  DispatchInfo last_dispatch() const;
  std::shared_ptr<Context> context() const;

  struct Gpu;

 private:
  void check_ready(const GroupLayout& layout) const;
  // The snapshot a forward runs on (mutex_ held inside); ctx null: the layer's device, else the default.
  std::shared_ptr<Gpu> gpu_for(const std::shared_ptr<Context>& ctx);
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

// A blob in device memory with ncnn's layout (VkMat): consecutive layers need no host round trip.
class VkMat {
 public:
  int dims = 0, w = 0, h = 0, d = 0, c = 0;
  size_t elemsize = 0;
  int elempack = 1;
  size_t cstep = 0;

  // Converts to the Option's storage and packing, then copies to the device.
  static VkMat upload(const Mat& m, std::shared_ptr<Context> ctx, const Option& opt = {});
  Mat download() const;  // as stored (packing and storage of the VkMat)
  size_t bytes() const;
  std::shared_ptr<Context> context() const { return ctx_; }

  struct Buffer;
  std::shared_ptr<Buffer> buffer;

 private:
  std::shared_ptr<Context> ctx_;
  friend class Norm;
};

// The roof for benchmarks: the same bytes through a vec4 copy shader (shader=true) or
// vkCmdCopyBuffer, timed like Norm::forward_repeated. Returns microseconds per copy.
double copy_repeated(const VkMat& src, int warmup, int reps, bool shader);

}  // namespace vknorm

// Internal: Vulkan-Hpp RAII objects behind the public Context/VkMat, and the one recording helper.
// Every handle has exactly one owner here; nothing is destroyed by hand.
#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <mutex>
#include <optional>
#include <vector>
// Vulkan-Hpp in a namespace of vknorm's own: its classes are inline, emitted as weak symbols in every object that
// uses them, and an application that compiles Vulkan-Hpp itself (another version, other macros) would otherwise
// share them with vknorm under whichever definition the linker keeps. recorder.cpp has a namespace of its own too.
#define VULKAN_HPP_NAMESPACE vknorm_vk
#include <vulkan/vulkan_raii.hpp>
namespace vk = vknorm_vk;

#include "dispatch.h"
#include "reuse_cache.h"
#include "vknorm/context.h"
#include "vknorm/norm.h"

namespace vknorm {

// What a context keeps of the buffers it no longer holds, unless VKNORM_BUFFER_CACHE_BYTES says otherwise.
constexpr uint64_t kBufferCacheBytes = uint64_t(256) << 20;
// How many pipelines a context keeps, unless VKNORM_PIPELINE_CACHE_COUNT says otherwise: a model's layers use tens.
constexpr uint64_t kPipelineCacheCount = 128;
constexpr uint64_t kFenceSpinUs = 1000;  // VKNORM_FENCE_SPIN_US default on GPUs

constexpr uint32_t kBindings = kSlotCount;  // blob, gamma, beta, partials, coefficients, residual, out, sum (dispatch.h)

// The loader and instance, shared by every context of the process.
struct Instance {
  vk::raii::Context context;
  vk::raii::Instance instance = nullptr;
  std::optional<vk::raii::DebugUtilsMessengerEXT> messenger;
  uint32_t api_version = VK_API_VERSION_1_0;
  bool validation = false;
  long pid = 0;  // the process that created it: a fork()ed child inherits the handles, not the driver's threads
  static std::shared_ptr<Instance> get();
  bool in_creating_process() const;
  // Whether Vulkan handles may be destroyed now: in the creating process, and not after its exit() has reached the
  // handlers registered before the first device was made (by then the driver and layers loaded with the instance
  // may have torn themselves down: a static layer or context is left to the process's end instead).
  bool destroys_handles() const;
  // std::runtime_error in a process fork()ed from the one that created this instance (its waits would
  // never return there).
  void check_same_process() const;
};

struct Context::Impl {
  std::shared_ptr<Instance> instance;
  DeviceInfo info;
  vk::raii::PhysicalDevice physical = nullptr;
  vk::raii::Device device = nullptr;
  vk::raii::Queue queue = nullptr;
  uint32_t queue_family = 0;
  uint32_t timestamp_bits = 0;
  bool fp16_storage = false;  // enabled on the device
  bool subgroup_reduce = false;  // arithmetic + shuffle in compute
  bool pipeline_stats = false;  // VKNORM_PIPELINE_STATS: print each pipeline's driver statistics
  uint32_t required_subgroup_size = 0;  // VKNORM_SUBGROUP_SIZE, 0: the device's default
  bool direct_host_access = false;  // device memory is host memory (CPU / integrated): no staging
  uint32_t device_memory_type = 0, staging_memory_type = 0;
  // Whether a mapped buffer of that memory is cached on the host: reading uncached (write-combined) memory
  // element by element is many times slower than copying it out in one go.
  bool device_memory_cached = false, staging_memory_cached = false;
  vk::raii::DescriptorSetLayout set_layout = nullptr;
  vk::raii::PipelineLayout pipeline_layout = nullptr;
  vk::raii::PipelineCache pipeline_cache = nullptr;
  std::mutex queue_mutex;
  // Pipelines depend only on (variant, specialization), so layers on this device share them. The most recently
  // used VKNORM_PIPELINE_CACHE_COUNT (default kPipelineCacheCount) are kept: each layer size specializes its own, and
  // a process making layers of ever new sizes would otherwise keep them all. A submission holds those it records.
  struct KeptPipeline {
    std::shared_ptr<const struct Pipeline> pipeline;
    uint64_t last_use = 0;
  };
  std::mutex pipeline_mutex;
  std::map<std::string, KeptPipeline> pipelines;
  uint64_t pipeline_uses = 0, pipelines_made = 0, pipeline_cache_count = 0;
  // variant: <shader>_fp<0|1>_p<1|4|v4>_sg<0|1> (cmake/shaders.cmake)
  std::shared_ptr<const struct Pipeline> pipeline(const std::string& variant, const struct Specialization& spec);
  std::atomic<uint64_t> bytes_in_use{0}, bytes_peak{0}, live_buffers{0}, allocations{0};
  uint64_t max_device_bytes = 0;  // VKNORM_MAX_DEVICE_BYTES, 0: none
  // How long a submission polls its fence before blocking on it (Context::fence_spin_us).
  uint64_t fence_spin_us = 0;
  // Buffers no longer held, kept for the next request of the same kind and size (buffer.cpp): a discrete
  // GPU's driver takes ~0.3 ms to allocate, and fresh host memory faults in page by page on first write.
  // At most VKNORM_BUFFER_CACHE_BYTES (default kBufferCacheBytes), oldest dropped first. Declared after
  // the device: freed before it.
  struct CachedBuffer {
    vk::raii::Buffer buffer = nullptr;
    vk::raii::DeviceMemory memory = nullptr;
    void* mapped = nullptr;
  };
  ReuseCache<std::pair<int, vk::DeviceSize>, CachedBuffer> cache;  // by kind and size
  uint64_t cache_limit = 0;
  // Command pools, fences and descriptor/query pools of finished submissions, reused by later ones
  // (pipeline.cpp). Declared last: destroyed before the device.
  std::mutex kit_mutex;
  std::vector<std::unique_ptr<struct SubmissionKit>> kits;
};

// What one Submission records into: created on demand, handed back to the context when the
// submission is done (reset there) and reused; one thread at a time uses a kit.
struct SubmissionKit {
  uint32_t max_sets = 0;
  vk::raii::CommandPool pool = nullptr;
  vk::raii::CommandBuffer cmd = nullptr;
  vk::raii::DescriptorPool descriptors = nullptr;
  vk::raii::Fence fence = nullptr;
  std::optional<vk::raii::QueryPool> queries;
};

struct VkMat::Buffer {
  std::shared_ptr<Context> ctx;
  vk::raii::Buffer buffer = nullptr;
  vk::raii::DeviceMemory memory = nullptr;
  vk::DeviceSize size = 0;
  void* mapped = nullptr;  // host-visible buffers stay mapped
  ~Buffer();  // hands the buffer to the context's cache, or frees it
  enum class Kind { Device, Staging };
  Kind kind = Kind::Device;
  static std::shared_ptr<Buffer> create(std::shared_ptr<Context> ctx, vk::DeviceSize size, Kind kind);
};
using Buffer = VkMat::Buffer;

// Specialization constants, values for constant ids 0..n-1 (shaders/common.glsl).
struct Specialization {
  std::vector<uint32_t> values;
  std::string key() const;
  static Specialization of(const Pass& pass) { return {pass.specialization}; }
};

struct Pipeline {
  vk::raii::Pipeline pipeline = nullptr;
  Pipeline(Context::Impl& ctx, const std::string& variant, const Specialization& spec);
  void print_statistics(Context::Impl& ctx, const std::string& name) const;
};

// Records transfers and dispatches into one command buffer, submits once and waits (Kompute's Sequence).
class Submission {
 public:
  explicit Submission(Context::Impl& ctx, uint32_t max_dispatches = 4);
  void copy(const Buffer& src, const Buffer& dst, vk::DeviceSize bytes, vk::DeviceSize src_offset = 0,
            vk::DeviceSize dst_offset = 0);
  // Every earlier transfer/shader write is visible to every later transfer/shader access (host: and to the host).
  // submit_and_wait records one with host first: no call site ends a submission with a barrier of its own.
  void barrier(bool host = false);
  void dispatch(std::shared_ptr<const Pipeline> p, const std::array<const Buffer*, kBindings>& bindings,
                const PushConstants& pc, uint64_t workgroups);
  void timestamp(uint32_t slot);  // 0 before the dispatches, 1 after
  void submit_and_wait();
  double gpu_us() const;  // between the two timestamps; 0 when unsupported
  int dispatches() const { return dispatches_; }

 private:
  vk::DescriptorSet write_set(const std::array<const Buffer*, kBindings>& bindings);
  Context::Impl& ctx_;
  std::array<const Buffer*, kBindings> last_bindings_{};
  vk::DescriptorSet last_set_{};
  // The pipelines recorded, held until the submission is destroyed (its work done, or the device lost): declared
  // before the kit, so they go after its command buffer.
  std::vector<std::shared_ptr<const Pipeline>> pipelines_;
  std::unique_ptr<SubmissionKit> kit_;
  vk::raii::CommandBuffer& cmd_;
  int dispatches_ = 0;
  bool submitted_ = false;
  bool pending_ = false;  // submitted and not yet waited for: the kit cannot be reused

 public:
  ~Submission();
  Submission(const Submission&) = delete;
  Submission& operator=(const Submission&) = delete;
};

}  // namespace vknorm

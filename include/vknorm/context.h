// The Vulkan device vknorm runs on: instance, device, one compute queue, pools, pipeline cache.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace vknorm {

struct DeviceInfo {
  int index = 0;
  std::string name;
  std::string type;  // "discrete" | "integrated" | "virtual" | "cpu" | "other"
  uint32_t vendor_id = 0, device_id = 0;
  std::string driver_name, driver_info;
  uint32_t driver_version = 0;
  std::string api_version;
  uint32_t subgroup_size = 0;
  std::vector<std::string> subgroup_ops;  // "basic", "vote", "arithmetic", "ballot", "shuffle", ...
  bool subgroup_compute = false;          // subgroup operations available in compute shaders
  bool storage_16bit = false;             // storageBuffer16BitAccess
  bool float16_arithmetic = false;        // shaderFloat16
  uint32_t max_shared_memory = 0;
  // Multiprocessors, where the device reports them (NVIDIA: VK_NV_shader_sm_builtins); 0: unknown. Each
  // keeps at least one workgroup resident: the dispatcher sizes the cooperative kernel's items by them.
  uint32_t compute_units = 0;
  uint32_t max_workgroup_invocations = 0;
  uint32_t max_workgroup_size_x = 0;
  uint32_t max_workgroup_count_x = 0;
  uint64_t max_storage_buffer_range = 0;
  uint64_t device_local_bytes = 0;
  float timestamp_period_ns = 0.f;
  bool timestamps = false;
};

// Thrown when no Vulkan loader or device exists; the message says what to install.
struct VulkanUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Thrown when a device allocation fails or would pass VKNORM_MAX_DEVICE_BYTES.
struct DeviceOutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<DeviceInfo> enumerate_devices();
// The device chosen by default: VKNORM_DEVICE (index or name substring) if set, else
// discrete > integrated > virtual > cpu.
int default_device_index();

// At process exit: a Context still held when exit() runs (by a static or global layer, VkMat or context) is
// destroyed with the statics. One made before the first Vulkan call is destroyed after the driver and the
// validation layer have torn themselves down: vknorm then leaves its device and buffers to the process's end
// (nothing freed, nothing for the validation layer to check). Drop such objects, or call the layer's
// destroy_pipeline(), before main returns to have the device destroyed (and checked) in order.
class Context {
 public:
  // index -1: default_device_index(); other negative indexes are refused (std::invalid_argument).
  static std::shared_ptr<Context> create(int index = -1);
  // One process-wide context on the default device, created on first use.
  static std::shared_ptr<Context> default_context();
  // Drops the process-wide reference (the device goes once no layer or VkMat holds it); Python
  // calls this at exit so the device is destroyed before the driver's own teardown.
  static void release_default();
  ~Context();

  const DeviceInfo& info() const;
  // Device memory in buffers vknorm holds now (tensors, weights, a forward's staging and scratch), the
  // most it ever held, and how many buffers.
  uint64_t device_bytes_in_use() const;
  uint64_t device_bytes_peak() const;
  uint64_t live_buffers() const;
  // Compute pipelines this context keeps (one per kernel variant and specialization, shared by its layers): the
  // VKNORM_PIPELINE_CACHE_COUNT (default 128, 0: none) most recently used, so that layers of ever new sizes do not
  // pile theirs up. pipelines_made counts every one made so far: one dropped and used again is made again.
  uint64_t pipelines() const;
  uint64_t pipelines_made() const;
  // Buffers no longer held are kept for reuse by the next request of the same kind and size (repeated
  // forwards of one shape allocate nothing), up to VKNORM_BUFFER_CACHE_BYTES (default 256 MiB, 0: none),
  // oldest dropped first, and within VKNORM_MAX_DEVICE_BYTES together with what is in use.
  uint64_t device_bytes_cached() const;
  uint64_t cached_buffers() const;
  void release_cached_buffers();  // frees every cached buffer now
  uint64_t device_allocations() const;  // device memory allocations made so far (cache misses)
  // How long a submission polls its fence before it blocks on it, in microseconds: a driver's blocking wait
  // can wake tens of microseconds after the GPU is done, more than a small forward takes. VKNORM_FENCE_SPIN_US
  // (0: never poll; up to 2^64 - 1, a time past the steady clock's range polling until the work is done);
  // default 1000 on GPUs, 0 on CPU devices (their work runs on the cores polling would take).
  uint64_t fence_spin_us() const;
  // Whether the host memory results are read from (staging, or the device memory itself where the host maps it)
  // is cached: where it is not (some integrated GPUs map theirs write-combined), a result is copied out in one go
  // before it is converted, since reading such memory element by element is many times slower.
  bool host_reads_cached() const;

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit Context(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A process fork()ed from one that runs Vulkan inherits its devices' handles but not the driver's threads: the
// C exit handlers that the driver and ncnn registered (their teardown waits on those threads, or frees the
// parent's memory) hang or crash it at exit(). Once armed, a child forked after that leaves at exit() with
// exit()'s status, stdio flushed, before any C exit handler registered before the fork, as os._exit would
// (glibc; elsewhere nothing is armed). vknorm arms it when it makes its Vulkan instance; a program that makes
// ncnn's (or another) instance itself may call it after. Idempotent; the arming process is unaffected.
void arm_forked_child_exit();

// Validation layer (VKNORM_VALIDATION=1 before the first Vulkan call): messages seen so far. validation_enabled
// throws std::invalid_argument for a value the switch does not take (1/true/on/yes, 0/false/off/no, empty).
bool validation_enabled();
std::vector<std::string> validation_messages();
void clear_validation_messages();

}  // namespace vknorm

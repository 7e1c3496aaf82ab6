// vknorm on a caller's own Vulkan objects: for engines that are not ncnn (MNN-style, or an application's
// own). vknorm creates no instance, device, queue or command pool: it makes its objects on the caller's
// VkDevice and records into the caller's VkCommandBuffer, on a blob in the caller's VkBuffer at an offset.
// The caller submits, waits and synchronizes, as for any compute dispatch of its own.
//
//   vknorm::VulkanHandles vk{instance, physical_device, device,
//                            reinterpret_cast<vknorm::VoidFunction>(vkGetInstanceProcAddr),  // or nullptr
//                            VK_API_VERSION_1_1,  // VkApplicationInfo::apiVersion of the instance
//                            true};               // storageBuffer16BitAccess enabled on the device
//   vknorm::Recorder ln(vk, vknorm::NormOp::LayerNorm, /*affine_size=*/768, /*eps=*/1e-5f);
//   ln.load_model(gamma, beta);
//   vknorm::NormParams gp;  // GroupNorm and InstanceNorm: ncnn's params as NormParams
//   gp.op = vknorm::NormOp::GroupNorm, gp.group = 32, gp.channels = 320, gp.eps = 1e-5f;
//   vknorm::Recorder gn(vk, gp);
//   gn.load_model(gamma_per_channel, beta_per_channel);
//   // ... the engine's own writes of the blob, then its own barrier (see "Barriers") ...
//   ln.record(cmd, {buffer, offset, bytes}, /*dims=*/3, w, h, /*d=*/1, c, cstep, /*elempack=*/4, /*fp16=*/false);
//   // ... the engine's own barrier, then its own reads of the blob; vkEndCommandBuffer, vkQueueSubmit ...
//   // once every command buffer recorded so far has completed (fence / vkQueueWaitIdle):
//   ln.release_descriptors();
//
// The blob is in ncnn's layout (the fields of ncnn's VkMat, or vknorm::VkMat): dims 1-4, w/h/d/c as
// ncnn counts them (c, or h for dims 2, already divided by elempack), cstep in packed elements between
// channels, elempack 1 or 4, float32 or float16 storage. Groups follow ncnn's rules (vknorm/norm.h,
// NormParams::layout): LayerNorm and RMSNorm by affine_size, GroupNorm by group and channels, InstanceNorm one
// group per channel. It is normalized in place.
//
// Requirements on the caller's objects
// - The device has a queue family with compute; `cmd` is a primary or secondary command buffer in the
//   recording state, outside a render pass, for a queue family with compute: the same family for every
//   command buffer one Recorder records into (its weights and scratch are VK_SHARING_MODE_EXCLUSIVE buffers,
//   which another family may use only after a queue family ownership transfer).
// - The blob's VkBuffer was created with VK_BUFFER_USAGE_STORAGE_BUFFER_BIT. BufferRef::offset is a
//   multiple of VkPhysicalDeviceLimits::minStorageBufferOffsetAlignment; range, the bytes the caller
//   owns from there, must cover the blob (blob_span_bytes; kWholeSize: not checked).
// - A blob larger than one storage buffer binding (maxStorageBufferRange; VKNORM_MAX_BUFFER_BYTES lowers
//   it, as for vknorm's own context) or than 2^31 packed elements is recorded in pieces of whole groups
//   (plan_pieces: runs of whole channels, else runs of rows of one channel), each bound at its own offset
//   of the caller's buffer; DispatchInfo::pieces says how many. Every piece's offset must then be a
//   multiple of minStorageBufferOffsetAlignment, and a single group must fit one binding: otherwise the
//   blob is refused. GroupNorm/InstanceNorm pieces also bind the per-channel weights from their first
//   channel on: that channel times 4 bytes must be a multiple of 16 and of minStorageBufferOffsetAlignment.
// - float16 blobs need a Vulkan 1.1 device. Elempack-1 float16 blobs need storageBuffer16BitAccess
//   enabled on the device (VulkanHandles::fp16_storage_enabled); pack4 float16 blobs, and elempack-1 ones
//   read as vec4s, do not, except dims-1 pack4 blobs read unpacked as single float16 values: one on the split or
//   cooperative path (forced by Option::path, or planned: a group too large for the fused kernel, or the
//   cooperative kernel on a GPU that reports its multiprocessors), and any GroupNorm (its channels are single
//   elements); record those as float32. Refused inputs throw std::invalid_argument before anything is recorded.
//
// Barriers
// vknorm records no barrier on the blob before its first dispatch and none after its last (the barriers below
// order its own scratch and weights, not your writes of the blob). Order your own writes of
// the blob before record() and your own reads (or the next layer) after it with your own barriers, as for
// any compute dispatch: vknorm's dispatches run in VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT and access the
// blob with VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT. E.g. after a transfer write:
// TRANSFER/TRANSFER_WRITE -> COMPUTE_SHADER/SHADER_READ|SHADER_WRITE; before a transfer read:
// COMPUTE_SHADER/SHADER_WRITE -> TRANSFER/TRANSFER_READ.
// Inside one forward, vknorm orders its own passes (the split path's reduce -> finalize -> apply) with
// vkCmdPipelineBarrier(COMPUTE_SHADER -> COMPUTE_SHADER) and one VkMemoryBarrier SHADER_WRITE ->
// SHADER_READ|SHADER_WRITE, only between passes where the later reads what the earlier wrote. A split-path or
// cooperative forward (and each of its pieces) also starts with that barrier: its scratch is shared with every
// earlier forward of this Recorder, so forwards of one Recorder may share it in any number of command buffers on
// one queue. A fused forward (one dispatch, no scratch) records no barrier at all.
// The first record() after load_model() also records the weights' upload before its dispatches: a barrier
// COMPUTE_SHADER|TRANSFER/TRANSFER_WRITE -> TRANSFER/TRANSFER_WRITE on the weights (a resubmitted command buffer
// copies again, after its earlier submission's reads), a vkCmdCopyBuffer from a staging buffer and a
// TRANSFER/TRANSFER_WRITE -> COMPUTE_SHADER/SHADER_READ barrier. Submit that command buffer first (or before any
// other that uses this Recorder). One that will never be submitted (a dropped frame) leaves the weights unloaded:
// call load_model() again, and the next record() uploads (and clears the counters below).
// A cooperative forward (one dispatch in which workgroups wait for each other; planned only on GPUs that report
// their multiprocessors) keeps counters in the scratch and leaves them zero. One that finds them other than the
// last forward left them (the scratch just made, a split forward since, or a shape whose counters sit elsewhere
// in the scratch) also records a dispatch that zeroes them first. What they hold is known when recording, so the
// same rule holds: command buffers run in the order recorded, each submission (a resubmitted one too) after the
// one recorded before it for this Recorder. After a dropped frame call load_model() again: it also forgets what
// the counters held, and the next cooperative forward clears them.
//
// Lifetime
// - vknorm never destroys the caller's instance, device, buffers or command buffers; they must outlive
//   the Recorder (the device and instance), or the command buffers that use them (the blob's buffer).
// - A Recorder owns: shader modules, a descriptor set layout (8 storage buffers, compute), a pipeline
//   layout (a 32-byte compute push-constant range), pipelines, descriptor pools, a device-local buffer
//   of gamma/beta and one of split-path scratch. Destroy it only after every command buffer it recorded
//   into has completed (the destructor calls no vkDeviceWaitIdle).
// - Descriptor sets are cached per distinct blob binding (buffer, offset, the blob's size) and the scratch
//   its plan uses (the same bytes recorded at another shape may get a set of their own), and reused by
//   later record()s; command buffers recorded with them may be submitted again. The cache grows by one set
//   per binding not seen before: an engine that binds ever new offsets (a ring allocator over frames in
//   flight) calls release_descriptors() at a point where its frames have all completed (a resize, a model
//   switch, every N frames after a wait), or cached_descriptor_sets() grows without bound. release_descriptors()
//   frees every set, and also what load_model() or a larger scratch replaced (the old weights, the staging
//   buffer, the old scratch): call it only when every command buffer that used them has completed, and
//   record those command buffers again before submitting them again. Call it too before recording on a
//   buffer created after one vknorm recorded on was destroyed (Vulkan may reuse the handle value).
// - record() leaves vknorm's compute pipeline, descriptor set 0 and push constants bound in `cmd`: bind
//   yours again before your next dispatch, as after any other library's recording.
//
// GPU time
// record() cannot know it (the caller submits later): DispatchInfo::gpu_us stays 0. With set_timing(true)
// each record() also writes two timestamps into `cmd` (vkCmdResetQueryPool of its pair, then
// vkCmdWriteTimestamp at COMPUTE_SHADER before its first dispatch and after its last, into a query pool of
// the Recorder's), and gpu_times_us() returns, once those command buffers have completed, each timed
// forward's GPU time in microseconds, in recording order (a command buffer submitted again overwrites its
// forwards' times). Reading them frees the pairs for later record()s: a command buffer timed before a read and
// submitted again after it writes over later forwards' pairs (record it again instead). Read only once those
// command buffers have completed: a pair's reset is recorded in the command buffer itself, so before it runs the
// pair still holds its previous result (or, never used, is not reset at all: invalid usage to read). release_descriptors()
// drops the pairs not read yet: after a timed command buffer that will never run (a dropped frame), the way to
// time again (read the others first).
//
// Threads: a Recorder is used by one thread at a time (like the command buffer it records into);
// different Recorders on one device may record on different threads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "vknorm/context.h"
#include "vknorm/norm.h"
#include "vknorm/option.h"

// Vulkan's handle types, declared exactly as <vulkan/vulkan_core.h> declares them (a typedef may be
// repeated), so that this header needs no Vulkan header and either may be included first.
#ifndef VKNORM_VK_HANDLES_DECLARED
#define VKNORM_VK_HANDLES_DECLARED
typedef struct VkInstance_T* VkInstance;
typedef struct VkPhysicalDevice_T* VkPhysicalDevice;
typedef struct VkDevice_T* VkDevice;
typedef struct VkCommandBuffer_T* VkCommandBuffer;
#if defined(VK_USE_64_BIT_PTR_DEFINES)
#define VKNORM_VK_64_BIT_HANDLES VK_USE_64_BIT_PTR_DEFINES
#elif defined(__LP64__) || defined(_WIN64) || (defined(__x86_64__) && !defined(__ILP32__)) || defined(_M_X64) || \
    defined(__ia64) || defined(_M_IA64) || defined(__aarch64__) || defined(__powerpc64__) ||              \
    (defined(__riscv) && __riscv_xlen == 64)
#define VKNORM_VK_64_BIT_HANDLES 1
#else
#define VKNORM_VK_64_BIT_HANDLES 0
#endif
#if VKNORM_VK_64_BIT_HANDLES
typedef struct VkBuffer_T* VkBuffer;
#else
typedef uint64_t VkBuffer;
#endif
#endif

namespace vknorm {

// Any function pointer; VulkanHandles::get_instance_proc_addr holds a PFN_vkGetInstanceProcAddr.
using VoidFunction = void (*)();

// The caller's objects; vknorm never destroys them.
struct VulkanHandles {
  VkInstance instance = nullptr;
  VkPhysicalDevice physical_device = nullptr;
  VkDevice device = nullptr;  // created from physical_device
  // reinterpret_cast<VoidFunction>(vkGetInstanceProcAddr) of the loader the caller uses; nullptr:
  // vknorm opens the system loader (libvulkan) itself and takes its vkGetInstanceProcAddr.
  VoidFunction get_instance_proc_addr = nullptr;
  // VkApplicationInfo::apiVersion of the caller's instance (0: 1.0). vknorm uses Vulkan 1.1 features
  // (subgroup kernels, float16 storage) only when this and the device's version are both >= 1.1.
  uint32_t api_version = 0;
  bool fp16_storage_enabled = false;  // VkPhysicalDevice16BitStorageFeatures::storageBuffer16BitAccess enabled
};

constexpr uint64_t kWholeSize = ~0ull;  // VK_WHOLE_SIZE

// A blob in the caller's buffer: `range` bytes from `offset` (a multiple of minStorageBufferOffsetAlignment).
struct BufferRef {
  VkBuffer buffer{};
  uint64_t offset = 0;
  uint64_t range = kWholeSize;
};

// Bytes a blob in ncnn's layout spans from its first element to the end of its last group (the range
// record() needs at least): dims 1/2: w (* h) elements; dims 3/4: (c - 1) * cstep + w*h*d elements.
// Throws std::invalid_argument for dims outside 1-4, an extent below 1 or elempack other than 1 or 4.
uint64_t blob_span_bytes(int dims, int w, int h, int d, int c, size_t cstep, int elempack, bool fp16);

// One norm layer (ncnn's parameters, as NormParams) on the caller's device.
class Recorder {
 public:
  // Any of the four norms. Throws std::invalid_argument for parameters ncnn refuses (NormParams::check: each type's
  // own fields; group and channels of a LayerNorm, say, are not read) or
  // missing handles, VulkanUnavailable when no loader can be opened (get_instance_proc_addr null and no
  // libvulkan).
  Recorder(const VulkanHandles& handles, const NormParams& params);
  // LayerNorm or RMSNorm by their params (GroupNorm/InstanceNorm: std::invalid_argument, use NormParams).
  Recorder(const VulkanHandles& handles, NormOp op, int affine_size, float eps = 0.001f, int affine = 1);
  ~Recorder();
  Recorder(Recorder&&) noexcept;
  Recorder& operator=(Recorder&&) noexcept;
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // gamma and (all but RMSNorm) beta of affine_size float32 each, or one per channel (GroupNorm,
  // InstanceNorm); nothing with affine=0. The next record() records their upload. Throws
  // std::invalid_argument on wrong sizes.
  void load_model(const std::vector<float>& gamma, const std::vector<float>& beta = {});

  // Records one forward of the blob at `blob` into `cmd` (see the top of this file). `opt` gives the
  // kernel choices (path, use_subgroup_ops, max_workgroup_size); storage and packing are the blob's own
  // (fp16, elempack), so use_fp16_storage and use_packing_layout are not read. Returns what the
  // dispatcher chose (gpu_us stays 0: see set_timing; pieces: the bindings the blob was split into).
  // Throws std::invalid_argument for a bad shape, one the params refuse (NormParams::layout: affine_size, or
  // the channels of a GroupNorm/InstanceNorm), a misaligned offset, a range too small for the blob, a blob
  // past one binding that cannot be split at aligned group boundaries (or whose pieces' per-channel weights
  // would start off 16 bytes), or a float16 blob the device cannot store; nothing is recorded then.
  DispatchInfo record(VkCommandBuffer cmd, const BufferRef& blob, int dims, int w, int h, int d, int c, size_t cstep,
                      int elempack, bool fp16, const Option& opt = {});

  // Timestamps around every later record() (see "GPU time" above). Throws std::invalid_argument when a
  // compute queue family of the device has no timestamps (timestampValidBits 0).
  void set_timing(bool on);
  // The GPU time of each record() timed since the last call, in µs, in recording order; call only when
  // every command buffer recorded with timing on has completed (std::logic_error where a submitted one has
  // not yet written its times; before submission, see "GPU time" above).
  std::vector<double> gpu_times_us();

  // Frees every cached descriptor set and what load_model() or a larger scratch retired, and drops the GPU time
  // pairs not read yet. Every command buffer recorded before the call, submitted or not, must have completed or
  // be dropped: none is submitted afterwards (see Lifetime above). One dropped that held the weights' upload (the
  // first record() after load_model()): call load_model() again too.
  void release_descriptors();

  NormOp op() const;
  const NormParams& params() const;
  int affine_size() const;
  float eps() const;
  int affine() const;
  // The caller's device as vknorm plans for it (name, type, subgroup size, limits).
  const DeviceInfo& device_info() const;
  uint64_t storage_offset_alignment() const;  // minStorageBufferOffsetAlignment
  size_t cached_descriptor_sets() const;      // live sets, until release_descriptors()
  // Compute pipelines kept: one per kernel variant, team and, for the first 16 group sizes recorded, group size
  // (a constant the kernels' loops unroll on); later sizes, as an engine's of any input size, share them.
  size_t pipelines() const;

  struct Impl;

 private:
  Impl& impl() const;  // throws std::logic_error on a moved-from Recorder
  std::unique_ptr<Impl> impl_;
};

}  // namespace vknorm

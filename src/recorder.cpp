// The third executor: the dispatcher's plan (plan_forward) recorded into a caller's VkCommandBuffer, on
// the caller's VkDevice and VkBuffer (include/vknorm/recorder.h). vknorm's own executor is norm.cpp's
// record(), ncnn's is ncnn_layers.cpp.
//
// This file's Vulkan-Hpp lives in a namespace of its own, built without Vulkan-Hpp's dynamic loader tool,
// so that vk::raii::Context can start from the caller's vkGetInstanceProcAddr. A separate namespace keeps
// it apart from the classes the rest of the library compiles with the tool on (src/vk.h, namespace vknorm_vk):
// the two definitions of vk::raii::Context differ, and sharing a name would break the one-definition rule.
#define VULKAN_HPP_NAMESPACE vknorm_vkhpp
#define VULKAN_HPP_ENABLE_DYNAMIC_LOADER_TOOL 0
#include <vulkan/vulkan_raii.hpp>

#include "vknorm/recorder.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "device_names.h"
#include "dispatch.h"
#include "shaders.h"

namespace vk = ::vknorm_vkhpp;

namespace vknorm {
namespace {

// The loader's vkGetInstanceProcAddr, opened once and kept for the life of the process (as context.cpp
// pins it: unloading it while a driver's threads run crashed NVIDIA's driver at exit).
PFN_vkGetInstanceProcAddr system_loader() {
  static const PFN_vkGetInstanceProcAddr gipa = []() -> PFN_vkGetInstanceProcAddr {
    for (const char* name : {"libvulkan.so.1", "libvulkan.so", "libvulkan.1.dylib", "libMoltenVK.dylib"})
      if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE))
        if (void* f = dlsym(h, "vkGetInstanceProcAddr")) return reinterpret_cast<PFN_vkGetInstanceProcAddr>(f);
    return nullptr;
  }();
  if (!gipa)
    throw VulkanUnavailable(
        "vknorm::Recorder: VulkanHandles::get_instance_proc_addr is null and no Vulkan loader (libvulkan) could be "
        "opened; pass the vkGetInstanceProcAddr your engine uses");
  return gipa;
}

uint32_t version_of(uint32_t major, uint32_t minor) { return VK_MAKE_API_VERSION(0, major, minor, 0); }
uint32_t major_minor(uint32_t v) { return version_of(VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v)); }

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string describe_blob(int dims, int w, int h, int d, int c, size_t cstep, int elempack, bool fp16) {
  std::string s = "dims=" + std::to_string(dims) + " w=" + std::to_string(w);
  if (dims >= 2) s += " h=" + std::to_string(h);
  if (dims == 4) s += " d=" + std::to_string(d);
  if (dims >= 3) s += " c=" + std::to_string(c) + " cstep=" + std::to_string(cstep);
  return s + " elempack=" + std::to_string(elempack) + (fp16 ? " float16" : " float32");
}

// The caller's instance, physical device and device, wrapped so that vk::raii calls reach them through
// their own dispatch tables. Never destroyed here: the destructor releases the handles.
struct Borrowed {
  vk::raii::Context loader;
  vk::raii::Instance instance = nullptr;
  vk::raii::PhysicalDevice physical = nullptr;
  vk::raii::Device device = nullptr;

  explicit Borrowed(const VulkanHandles& h)
      : loader(h.get_instance_proc_addr ? reinterpret_cast<PFN_vkGetInstanceProcAddr>(h.get_instance_proc_addr)
                                        : system_loader()) {
    try {
      instance = vk::raii::Instance(loader, h.instance);
      physical = vk::raii::PhysicalDevice(instance, h.physical_device);
      device = vk::raii::Device(physical, h.device);  // allocates its dispatch table: may throw bad_alloc
    } catch (...) {
      release();  // the members' destructors would destroy the caller's instance
      throw;
    }
  }
  ~Borrowed() { release(); }
  void release() {
    (void)device.release();
    (void)physical.release();
    (void)instance.release();
  }
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
};

// A buffer vknorm owns, with its memory.
struct OwnedBuffer {
  vk::raii::Buffer buffer = nullptr;
  vk::raii::DeviceMemory memory = nullptr;
  uint64_t size = 0;
  void* mapped = nullptr;  // host-visible buffers stay mapped
};

struct PipelineEntry {
  vk::raii::ShaderModule module = nullptr;
  vk::raii::Pipeline pipeline = nullptr;
};

// A cached descriptor set: the blob's binding, the scratch buffer it was written with and the plan's ranges of
// that scratch. The same bytes at another shape (an engine's allocator hands them out again) may need more
// partials, or its coefficients at another offset: a set of its own.
using SetKey = std::tuple<uint64_t /*blob buffer*/, uint64_t /*offset*/, uint64_t /*range*/, uint64_t /*scratch*/,
                          uint64_t /*partials bytes*/, uint64_t /*coefficients bytes*/, uint64_t /*first channel*/>;

constexpr uint32_t kSetsPerPool = 32;
constexpr uint32_t kTimedPerPool = 64;  // timed record()s per query pool

uint64_t handle_bits(VkBuffer b) {
#if VKNORM_VK_64_BIT_HANDLES
  return reinterpret_cast<uint64_t>(b);
#else
  return b;
#endif
}

}  // namespace

uint64_t blob_span_bytes(int dims, int w, int h, int d, int c, size_t cstep, int elempack, bool fp16) {
  if (w < 1 || (dims >= 2 && h < 1) || (dims == 4 && d < 1) || (dims >= 3 && c < 1) || (elempack != 1 && elempack != 4))
    throw std::invalid_argument("blob_span_bytes: extents must be >= 1 and elempack 1 or 4");
  const uint64_t elemsize = uint64_t(fp16 ? 2 : 4) * uint64_t(elempack);
  // Every product checked: a span that wraps would let a blob far larger than its binding pass as small.
  auto mul = [](uint64_t a, uint64_t b) {
    uint64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) throw std::invalid_argument("blob_span_bytes: the blob's size overflows 64 bits");
    return r;
  };
  auto add = [](uint64_t a, uint64_t b) {
    uint64_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) throw std::invalid_argument("blob_span_bytes: the blob's size overflows 64 bits");
    return r;
  };
  uint64_t elems = 0;
  switch (dims) {
    case 1: elems = uint64_t(w); break;
    case 2: elems = mul(uint64_t(w), uint64_t(h)); break;
    case 3: elems = add(mul(uint64_t(c - 1), cstep), mul(uint64_t(w), uint64_t(h))); break;
    case 4: elems = add(mul(uint64_t(c - 1), cstep), mul(mul(uint64_t(w), uint64_t(h)), uint64_t(d))); break;
    default: throw std::invalid_argument("dims must be 1-4, got " + std::to_string(dims));
  }
  return mul(elems, elemsize);
}

struct Recorder::Impl {
  Borrowed caller;  // first: released last, after every object below that was made on it
  NormParams params;
  std::vector<float> gamma, beta;

  DeviceInfo info;
  uint32_t api = 0;  // min(the caller's api_version, the device's), major.minor
  bool subgroup_reduce = false;
  bool fp16_storage = false;
  bool fp16_storage_hidden = false;  // enabled by the caller, hidden by the capability profile
  uint64_t alignment = 1;  // minStorageBufferOffsetAlignment
  uint32_t max_count_y = 65535;
  vk::PhysicalDeviceMemoryProperties memory_properties;

  vk::raii::DescriptorSetLayout set_layout = nullptr;
  vk::raii::PipelineLayout pipeline_layout = nullptr;
  std::map<std::string, PipelineEntry> pipelines;
  SpecializedSizes specialized;  // the group sizes its plans take as a constant (a bounded number of pipelines)
  std::map<std::string, SpirvNeeds> needs;

  // gamma | beta | 16 bytes for unused slots, each at an aligned offset and padded to whole vec4s (kernels
  // reading per-channel weights as vec4s may touch the last one whole).
  OwnedBuffer weights, staging;
  uint64_t gamma_offset = 0, beta_offset = 0, unused_offset = 0, weight_bytes = 0;
  bool upload_pending = false;  // the next record() copies staging -> weights
  OwnedBuffer scratch;          // split path: partials at 0, coefficients at an aligned offset
  CountersState counters;       // of the scratch's slot 4 (command buffers run in the order recorded)
  std::vector<OwnedBuffer> retired;  // replaced while command buffers may still use them

  // Timing (set_timing): a pair of timestamp queries per timed record(), until gpu_times_us() reads them.
  bool timing = false;
  uint32_t timestamp_bits = 0;  // valid bits on every compute queue family; 0: no timing on this device
  std::vector<vk::raii::QueryPool> query_pools;  // kTimedPerPool pairs each
  uint32_t timed = 0;                           // pairs handed out since the last read

  std::vector<vk::raii::DescriptorPool> pools;
  uint32_t sets_in_last_pool = kSetsPerPool;
  size_t live_sets = 0;
  std::map<SetKey, VkDescriptorSet> sets;
  std::mutex mutex;

  Impl(const VulkanHandles& h, const NormParams& p) : caller(h), params(p) {
    describe(h);
    std::array<vk::DescriptorSetLayoutBinding, kSlotCount> bindings;
    for (uint32_t b = 0; b < kSlotCount; ++b)
      bindings[b] = vk::DescriptorSetLayoutBinding{.binding = b, .descriptorType = vk::DescriptorType::eStorageBuffer,
                                                   .descriptorCount = 1, .stageFlags = vk::ShaderStageFlagBits::eCompute};
    set_layout = vk::raii::DescriptorSetLayout(
        caller.device, vk::DescriptorSetLayoutCreateInfo{.bindingCount = kSlotCount, .pBindings = bindings.data()});
    const vk::PushConstantRange range{.stageFlags = vk::ShaderStageFlagBits::eCompute, .offset = 0,
                                      .size = sizeof(PushConstants)};
    const vk::DescriptorSetLayout layout = *set_layout;
    pipeline_layout = vk::raii::PipelineLayout(
        caller.device, vk::PipelineLayoutCreateInfo{.setLayoutCount = 1, .pSetLayouts = &layout,
                                                .pushConstantRangeCount = 1, .pPushConstantRanges = &range});
  }

  // The caller's device as the dispatcher sees it (context.cpp's describe, from the caller's handles).
  void describe(const VulkanHandles& h) {
    const vk::PhysicalDeviceProperties props = caller.physical.getProperties();
    const uint32_t requested = h.api_version ? major_minor(h.api_version) : version_of(1, 0);
    api = std::min(requested, major_minor(props.apiVersion));
    read_properties(props, info);
    info.api_version = version_string(api == major_minor(props.apiVersion) ? props.apiVersion : api);
    max_count_y = props.limits.maxComputeWorkGroupCount[1];
    alignment = std::max<uint64_t>(props.limits.minStorageBufferOffsetAlignment, 1);
    memory_properties = caller.physical.getMemoryProperties();
    info.device_local_bytes = device_local_bytes(memory_properties);
    if (api >= version_of(1, 1) && caller.instance.getDispatcher()->vkGetPhysicalDeviceProperties2) {
      const auto chain = caller.physical.getProperties2<vk::PhysicalDeviceProperties2, vk::PhysicalDeviceSubgroupProperties>();
      const auto& sg = chain.get<vk::PhysicalDeviceSubgroupProperties>();
      read_subgroup(sg, info);
      const auto need = vk::SubgroupFeatureFlagBits::eBasic | vk::SubgroupFeatureFlagBits::eArithmetic |
                        vk::SubgroupFeatureFlagBits::eShuffle;
      subgroup_reduce = info.subgroup_compute && (sg.supportedOperations & need) == need;
      info.compute_units =
          multiprocessor_count<vk::PhysicalDeviceProperties2, vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV>(caller.physical);
    }
    // The driver and float16 arithmetic, as vknorm's own context reports them (Vulkan 1.2 structures).
    const auto* d = caller.instance.getDispatcher();
    if (api >= version_of(1, 2) && d->vkGetPhysicalDeviceProperties2 && d->vkGetPhysicalDeviceFeatures2) {
      using Driver = vk::PhysicalDeviceDriverProperties;
      using Float16 = vk::PhysicalDeviceShaderFloat16Int8Features;
      const auto chain = caller.physical.getProperties2<vk::PhysicalDeviceProperties2, Driver>();
      info.driver_name = chain.get<Driver>().driverName.data();
      info.driver_info = chain.get<Driver>().driverInfo.data();
      const auto feats = caller.physical.getFeatures2<vk::PhysicalDeviceFeatures2, Float16>();
      info.float16_arithmetic = feats.get<Float16>().shaderFloat16;
    }
    // Timestamps on whichever compute queue the caller records for: every compute family must have them.
    timestamp_bits = props.limits.timestampPeriod > 0 ? 64u : 0u;
    for (const auto& f : caller.physical.getQueueFamilyProperties())
      if (f.queueFlags & vk::QueueFlagBits::eCompute) timestamp_bits = std::min(timestamp_bits, f.timestampValidBits);
    info.timestamps = timestamp_bits > 0;  // what set_timing(true) takes
    // 16-bit storage only as the caller enabled it, and only where the SPIR-V 1.3 variants can run.
    const bool enabled = h.fp16_storage_enabled && api >= version_of(1, 1);
    info.storage_16bit = enabled;
    apply_capability_profile(info);  // VKNORM_NO_SUBGROUP, ...: as vknorm's own context plans
    subgroup_reduce = subgroup_reduce && info.subgroup_compute;
    fp16_storage = info.storage_16bit;
    fp16_storage_hidden = enabled && !fp16_storage;
  }

  uint32_t memory_type(uint32_t allowed, vk::MemoryPropertyFlags want, vk::MemoryPropertyFlags fallback) const {
    for (auto flags : {want, fallback})
      for (uint32_t i = 0; i < memory_properties.memoryTypeCount; ++i)
        if ((allowed & (1u << i)) && (memory_properties.memoryTypes[i].propertyFlags & flags) == flags) return i;
    throw std::runtime_error("vknorm::Recorder: no suitable memory type on " + info.name);
  }

  OwnedBuffer make_buffer(uint64_t size, vk::BufferUsageFlags usage, bool host) {
    OwnedBuffer b;
    b.size = size;
    b.buffer = vk::raii::Buffer(caller.device, vk::BufferCreateInfo{.size = size, .usage = usage,
                                                                .sharingMode = vk::SharingMode::eExclusive});
    const vk::MemoryRequirements req = b.buffer.getMemoryRequirements();
    using M = vk::MemoryPropertyFlagBits;
    const uint32_t type = host ? memory_type(req.memoryTypeBits, M::eHostVisible | M::eHostCoherent, M::eHostVisible | M::eHostCoherent)
                               : memory_type(req.memoryTypeBits, M::eDeviceLocal, {});
    try {
      b.memory = vk::raii::DeviceMemory(caller.device, vk::MemoryAllocateInfo{.allocationSize = req.size, .memoryTypeIndex = type});
    } catch (const vk::OutOfDeviceMemoryError&) {
      throw DeviceOutOfMemory("vknorm::Recorder: " + std::to_string(size) + " bytes of device memory could not be allocated on " +
                              info.name);
    } catch (const vk::OutOfHostMemoryError&) {
      throw DeviceOutOfMemory("vknorm::Recorder: out of host memory allocating " + std::to_string(size) + " bytes");
    }
    b.buffer.bindMemory(*b.memory, 0);
    if (host) b.mapped = b.memory.mapMemory(0, VK_WHOLE_SIZE);
    return b;
  }

  const SpirvNeeds& needs_of(const std::string& variant) {
    auto it = needs.find(variant);
    if (it != needs.end()) return it->second;
    return needs.emplace(variant, spirv_needs(variant)).first->second;
  }

  const vk::raii::Pipeline& pipeline(const Pass& pass) {
    std::string key = pass.variant;
    for (uint32_t v : pass.specialization) key += "/" + std::to_string(v);
    auto it = pipelines.find(key);
    if (it != pipelines.end()) return it->second.pipeline;
    const shaders::Spirv spv = shaders::find(pass.variant.c_str());
    if (!spv.words) throw std::logic_error("vknorm: no shader variant " + pass.variant);
    PipelineEntry e;
    e.module = vk::raii::ShaderModule(caller.device, vk::ShaderModuleCreateInfo{.codeSize = spv.count * 4, .pCode = spv.words});
    // Constant ids 0..n-1, as the plan gives them (dispatch.h, Pass::specialization).
    const std::vector<uint32_t>& values = pass.specialization;
    std::vector<vk::SpecializationMapEntry> entries;
    for (uint32_t i = 0; i < values.size(); ++i) entries.push_back({i, 4 * i, 4});
    const vk::SpecializationInfo spec{.mapEntryCount = uint32_t(entries.size()), .pMapEntries = entries.data(),
                                      .dataSize = values.size() * 4, .pData = values.data()};
    e.pipeline = vk::raii::Pipeline(
        caller.device, nullptr,
        vk::ComputePipelineCreateInfo{.stage = {.stage = vk::ShaderStageFlagBits::eCompute, .module = *e.module,
                                                .pName = "main", .pSpecializationInfo = &spec},
                                      .layout = *pipeline_layout});
    return pipelines.emplace(key, std::move(e)).first->second.pipeline;
  }

  // The weights buffer (and its staging copy, uploaded by the next record()), made on first use.
  void ensure_weights() {
    if (*weights.buffer) return;
    weight_bytes = params.affine ? align_up(gamma.size() * sizeof(float), 16) : 0;
    const uint64_t gbytes = weight_bytes;
    const uint64_t bbytes = params.affine && centres(params.op) ? weight_bytes : 0;
    gamma_offset = 0;
    beta_offset = align_up(gbytes, alignment);
    unused_offset = align_up(beta_offset + bbytes, alignment);
    const uint64_t total = unused_offset + 16;
    using U = vk::BufferUsageFlagBits;
    OwnedBuffer w = make_buffer(total, U::eStorageBuffer | U::eTransferDst, false);
    if (gbytes) {
      OwnedBuffer s = make_buffer(beta_offset + bbytes, U::eTransferSrc, true);
      std::memset(s.mapped, 0, beta_offset + bbytes);  // the padding of the last vec4
      std::memcpy(static_cast<char*>(s.mapped) + gamma_offset, gamma.data(), gamma.size() * sizeof(float));
      if (bbytes) std::memcpy(static_cast<char*>(s.mapped) + beta_offset, beta.data(), beta.size() * sizeof(float));
      staging = std::move(s);
      upload_pending = true;
    }
    weights = std::move(w);
  }

  // The query pool holding the next timed record()'s pair (the pair: 2 * ((timed - 1) % kTimedPerPool)).
  vk::QueryPool next_queries() {
    if (timed / kTimedPerPool >= query_pools.size())
      query_pools.emplace_back(caller.device,
                               vk::QueryPoolCreateInfo{.queryType = vk::QueryType::eTimestamp, .queryCount = 2 * kTimedPerPool});
    return *query_pools[timed++ / kTimedPerPool];
  }

  void retire(OwnedBuffer& b) {
    if (*b.buffer) retired.push_back(std::move(b));
    b = OwnedBuffer{};
  }

  // Where slot 4 (coefficients, or counters) starts in the scratch, after a plan's partials.
  uint64_t coefs_offset(uint64_t partials) const { return align_up(partials, alignment); }

  // first_channel: a piece past channel 0 of per-channel weights binds them from its own first channel on.
  VkDescriptorSet descriptor_set(const BufferRef& blob, uint64_t range, uint64_t partials, uint64_t coefs,
                                 uint64_t first_channel) {
    const bool split = partials || coefs;
    const uint64_t scratch_bits = split ? handle_bits(static_cast<VkBuffer>(*scratch.buffer)) : 0;
    const SetKey key{handle_bits(blob.buffer), blob.offset, range, scratch_bits, partials, coefs, first_channel};
    if (auto it = sets.find(key); it != sets.end()) return it->second;
    if (sets_in_last_pool == kSetsPerPool) {
      const vk::DescriptorPoolSize size{.type = vk::DescriptorType::eStorageBuffer, .descriptorCount = kSlotCount * kSetsPerPool};
      pools.emplace_back(caller.device, vk::DescriptorPoolCreateInfo{.maxSets = kSetsPerPool, .poolSizeCount = 1, .pPoolSizes = &size});
      sets_in_last_pool = 0;
    }
    const vk::DescriptorSetLayout layout = *set_layout;
    const vk::DescriptorSet set = (*caller.device).allocateDescriptorSets(
        vk::DescriptorSetAllocateInfo{.descriptorPool = *pools.back(), .descriptorSetCount = 1, .pSetLayouts = &layout},
        *caller.device.getDispatcher())[0];
    ++sets_in_last_pool;
    ++live_sets;
    const vk::Buffer w = *weights.buffer;
    const bool has_beta = params.affine && centres(params.op);
    const uint64_t partials_offset = 0;
    const uint64_t skip = first_channel * sizeof(float);  // record() checked it keeps the binding aligned
    const vk::DescriptorBufferInfo blob_range{.buffer = vk::Buffer(blob.buffer), .offset = blob.offset, .range = range};
    const std::array<vk::DescriptorBufferInfo, kSlotCount> infos{
        blob_range,
        params.affine ? vk::DescriptorBufferInfo{w, gamma_offset + skip, weight_bytes - skip}
               : vk::DescriptorBufferInfo{w, unused_offset, 16},
        has_beta ? vk::DescriptorBufferInfo{w, beta_offset + skip, weight_bytes - skip}
                 : vk::DescriptorBufferInfo{w, unused_offset, 16},
        partials ? vk::DescriptorBufferInfo{*scratch.buffer, partials_offset, partials}
                 : vk::DescriptorBufferInfo{w, unused_offset, 16},
        coefs ? vk::DescriptorBufferInfo{*scratch.buffer, coefs_offset(partials), coefs}
              : vk::DescriptorBufferInfo{w, unused_offset, 16},
        // No fused residual add here. Its three slots (which the shaders declare as read and written) hold the
        // blob's own range: a shared dummy range would make disjoint pieces, recorded without barriers between
        // them, look like a write-after-read hazard to synchronization validation.
        blob_range, blob_range, blob_range};
    std::array<vk::WriteDescriptorSet, kSlotCount> writes;
    for (uint32_t b = 0; b < kSlotCount; ++b)
      writes[b] = vk::WriteDescriptorSet{.dstSet = set, .dstBinding = b, .descriptorCount = 1,
                                         .descriptorType = vk::DescriptorType::eStorageBuffer, .pBufferInfo = &infos[b]};
    caller.device.updateDescriptorSets(writes, {});
    sets.emplace(key, static_cast<VkDescriptorSet>(set));
    return set;
  }
};

namespace {
NormParams row_params(NormOp op, int affine_size, float eps, int affine) {
  if (op != NormOp::LayerNorm && op != NormOp::RMSNorm)
    throw std::invalid_argument(std::string("vknorm::Recorder(handles, op, affine_size, ...) takes LayerNorm or RMSNorm; ") +
                                op_name(op) + " takes group and channels: construct it from NormParams");
  NormParams p;
  p.op = op, p.affine_size = affine_size, p.eps = eps, p.affine = affine;
  return p;
}
}  // namespace

Recorder::Recorder(const VulkanHandles& handles, NormOp op, int affine_size, float eps, int affine)
    : Recorder(handles, row_params(op, affine_size, eps, affine)) {}

Recorder::Recorder(const VulkanHandles& handles, const NormParams& params) {
  if (!handles.instance || !handles.physical_device || !handles.device)
    throw std::invalid_argument("vknorm::Recorder: VulkanHandles needs the caller's instance, physical_device and device");
  params.check();  // ncnn's validation, naming the layer and its params
  impl_ = std::make_unique<Impl>(handles, params);
}

Recorder::~Recorder() = default;
Recorder::Recorder(Recorder&&) noexcept = default;
Recorder& Recorder::operator=(Recorder&&) noexcept = default;

void Recorder::load_model(const std::vector<float>& gamma, const std::vector<float>& beta) {
  Impl& m = impl();
  std::lock_guard<std::mutex> lock(m.mutex);
  // A dropped frame's remedy (recorder.h, Barriers), with weights or without: what the counters hold is no longer
  // known, since a clear recorded into a command buffer that never runs never zeroed them. The next cooperative
  // forward clears.
  m.counters = {};
  if (!m.params.affine) {
    if (!gamma.empty() || !beta.empty()) throw std::invalid_argument("affine=0: this layer takes no weights");
    return;
  }
  const char* count_name = m.params.per_channel() ? "channels" : "affine_size";
  auto check = [&](const std::vector<float>& v, const char* name) {
    if (v.size() != m.params.weight_count())
      throw std::invalid_argument(std::string(name) + " has " + std::to_string(v.size()) + " values, expected " +
                                  count_name + "=" + std::to_string(m.params.weight_count()));
  };
  check(gamma, "gamma");
  if (centres(m.params.op)) check(beta, "beta");
  else if (!beta.empty()) throw std::invalid_argument("RMSNorm takes gamma only");
  m.gamma = gamma;
  m.beta = centres(m.params.op) ? beta : std::vector<float>{};
  // Command buffers recorded before may still read the old weights: they go with the next release.
  m.retire(m.weights);
  m.retire(m.staging);
  m.upload_pending = false;
  m.sets.clear();  // every cached set names the old weights; the sets themselves live until release
}

Recorder::Impl& Recorder::impl() const {
  if (!impl_) throw std::logic_error("vknorm::Recorder: used after it was moved from");
  return *impl_;
}

DispatchInfo Recorder::record(VkCommandBuffer cmd, const BufferRef& blob_in, int dims, int w, int h, int d, int c,
                              size_t cstep, int elempack, bool fp16, const Option& opt) {
  Impl& m = impl();
  std::lock_guard<std::mutex> lock(m.mutex);
  const std::string what = describe_blob(dims, w, h, d, c, cstep, elempack, fp16);
  auto refuse = [&](const std::string& why) { return std::invalid_argument("vknorm::Recorder::record (" + what + "): " + why); };

  // ---- everything is checked before anything is created or recorded
  if (!cmd) throw refuse("no command buffer");
  if (!blob_in.buffer) throw refuse("no buffer");
  if (dims < 1 || dims > 4) throw refuse("dims must be 1-4");
  if (w < 1 || (dims >= 2 && h < 1) || (dims == 4 && d < 1) || (dims >= 3 && c < 1)) throw refuse("every extent must be >= 1");
  if (dims < 2) h = 1;
  if (dims < 4) d = 1;
  if (dims < 3) c = 1;
  if (elempack != 1 && elempack != 4) throw refuse("elempack must be 1 or 4");
  if (dims >= 3 && cstep < size_t(w) * size_t(h) * size_t(d))
    throw refuse("cstep " + std::to_string(cstep) + " is less than a channel's w*h*d elements");
  try {
    m.params.check_weights(m.gamma.size(), m.beta.size());
  } catch (const std::invalid_argument& e) {
    throw refuse(e.what());
  }
  if (blob_in.offset % m.alignment)
    throw refuse("offset " + std::to_string(blob_in.offset) + " is not a multiple of the device's minStorageBufferOffsetAlignment (" +
                 std::to_string(m.alignment) + ")");
  if (fp16 && m.api < version_of(1, 1))
    throw refuse("float16 storage needs a Vulkan 1.1 device (the kernels are SPIR-V 1.3); VulkanHandles::api_version and the "
                 "device give " + m.info.api_version);
  const uint64_t span = blob_span_bytes(dims, w, h, d, c, cstep, elempack, fp16);
  if (blob_in.range != kWholeSize && blob_in.range < span)
    throw refuse("range " + std::to_string(blob_in.range) + " bytes is smaller than the blob's " + std::to_string(span) + " bytes");

  const bool dims1_packed = dims == 1 && elempack == 4;
  int pw = w, ppack = elempack;
  size_t pcstep = cstep;
  if (dims == 1 && !unpack_dims1(pw, pcstep, ppack))
    throw refuse("a dims-1 blob of " + std::to_string(w) + " packed elements: past 32-bit element counts");
  GroupLayout g;
  try {
    g = m.params.layout(dims, pw, h, d, c, dims >= 3 ? pcstep : size_t(pw) * h, ppack);
  } catch (const std::invalid_argument& e) {
    throw refuse(e.what());
  }

  // One binding holds at most maxStorageBufferRange bytes (VKNORM_MAX_BUFFER_BYTES lowers it, as for
  // vknorm's own context) and a kernel indexes at most 2^31 packed elements: a larger blob is recorded in
  // pieces of whole groups (plan_pieces, as Norm splits), each bound at its own offset of the caller's buffer.
  uint64_t max_buffer = 0;
  std::string limit;
  try {
    const BindingLimit b = binding_limit(m.info.max_storage_buffer_range);
    max_buffer = b.bytes, limit = b.why;
  } catch (const std::invalid_argument& e) {
    throw refuse(e.what());
  }
  const uint64_t elemsize = uint64_t(fp16 ? 2 : 4) * uint64_t(ppack);
  std::vector<Piece> pieces;
  try {
    pieces = plan_pieces(g, elemsize, span, max_buffer);
  } catch (const std::invalid_argument& e) {
    throw refuse("the blob's " + std::to_string(span) + " bytes exceed one storage buffer binding (" + limit + " " +
                 std::to_string(max_buffer) + ") and cannot be split, a group being normalized whole: " + e.what());
  }
  for (const Piece& p : pieces) {
    // Per-channel weights of a piece past channel 0 are bound from its first channel on: whole vec4s, aligned.
    const uint64_t skip = g.weights == GroupLayout::ByChannel && m.params.affine ? p.first_channel * sizeof(float) : 0;
    if (skip % std::max<uint64_t>(m.alignment, 16))
      throw refuse("the blob's " + std::to_string(span) + " bytes exceed one storage buffer binding (" + limit + " " +
                   std::to_string(max_buffer) + "), and its piece of whole groups from channel " +
                   std::to_string(p.first_channel) + " would bind the per-channel weights at byte " + std::to_string(skip) +
                   ", not a multiple of 16 and of the device's minStorageBufferOffsetAlignment (" +
                   std::to_string(m.alignment) + "): split the blob yourself at such channels");
    if ((blob_in.offset + p.offset) % m.alignment)
      throw refuse("the blob's " + std::to_string(span) + " bytes exceed one storage buffer binding (" + limit + " " +
                   std::to_string(max_buffer) + "), and its piece of whole groups at byte " + std::to_string(p.offset) +
                   " would be bound at offset " + std::to_string(blob_in.offset + p.offset) +
                   ", not a multiple of the device's minStorageBufferOffsetAlignment (" + std::to_string(m.alignment) +
                   "): split the blob yourself at aligned group boundaries");
  }

  // The group size takes a slot of its own only once nothing below refuses the forward.
  const DeviceCaps caps = m.specialized.peek(device_caps(m.info, m.subgroup_reduce, opt), g.group_size);
  std::vector<ForwardPlan> plans;  // one per piece
  uint64_t partials = 0, coefs = 0;
  for (const Piece& p : pieces) {
    plans.push_back(plans.empty() || p.layout.n_groups != plans.back().layout.n_groups
                        ? plan_forward(m.params.op, m.params.affine != 0, m.params.eps, p.layout, fp16, caps, opt)
                        : plans.back());
    const ForwardPlan& fp = plans.back();
    for (const Pass& pass : fp.passes) {
      const SpirvNeeds& needs = m.needs_of(pass.variant);
      if (needs.vulkan_1_1 && m.api < version_of(1, 1))
        throw refuse("kernel " + pass.variant + " needs a Vulkan 1.1 device; this one is used as " + m.info.api_version);
      if (needs.storage_16bit && !m.fp16_storage)
        throw refuse(m.fp16_storage_hidden
                         ? "this float16 blob is read as single float16 values (kernel " + pass.variant +
                               "), and the capability profile (VKNORM_NO_FP16_STORAGE or VKNORM_VULKAN_API below 1.1 "
                               "in the environment) plans as if the device had no storageBuffer16BitAccess: unset it, "
                               "or record the blob as float32"
                     : dims1_packed
                         ? std::string("this dims-1 float16 blob is read unpacked, ") +
                               (m.params.op == NormOp::GroupNorm
                                    ? "its " + std::to_string(pw) + " channels single elements,"
                                    : "one group of " + std::to_string(pw) + " elements, on the " +
                                          std::string(path_name(fp.kernel.path)) + " path,") +
                               " as single float16 values (kernel " + pass.variant +
                               "), which needs storageBuffer16BitAccess enabled on the device "
                               "(VulkanHandles::fp16_storage_enabled); record it as float32, or enable the feature"
                         : "this float16 blob is read as single float16 values (kernel " + pass.variant +
                               "), which needs storageBuffer16BitAccess enabled on the device (VulkanHandles::fp16_storage_enabled); "
                               "pack4 float16 blobs, and elempack-1 ones whose groups are read as vec4s, do not");
      const uint64_t max_x = std::max<uint32_t>(m.info.max_workgroup_count_x, 1);
      if ((pass.workgroups + max_x - 1) / max_x > m.max_count_y) throw refuse("too many workgroups for one dispatch");
    }
    partials = std::max(partials, fp.partials_bytes), coefs = std::max(coefs, fp.coefs_bytes);
  }
  const uint64_t scratch_bytes = coefs ? m.coefs_offset(partials) + coefs : partials;
  if (partials > m.info.max_storage_buffer_range || coefs > m.info.max_storage_buffer_range)
    throw refuse("the split path's scratch exceeds one storage buffer binding");
  (void)m.specialized.admit(caps, g.group_size);  // as planned: peek gave the same while nothing else admits

  // ---- vknorm's objects: weights, scratch, pipelines, the descriptor sets, the timestamp queries
  m.ensure_weights();
  if (scratch_bytes > m.scratch.size) {
    m.retire(m.scratch);
    m.scratch = m.make_buffer(scratch_bytes, vk::BufferUsageFlagBits::eStorageBuffer, false);
    m.counters = {};
  }
  std::vector<std::vector<vk::Pipeline>> pipelines;
  std::vector<vk::DescriptorSet> sets;
  for (size_t i = 0; i < pieces.size(); ++i) {
    pipelines.emplace_back();
    for (const Pass& pass : plans[i].passes) pipelines.back().push_back(*m.pipeline(pass));
    // The binding covers exactly the piece's span: what the kernels touch, within the binding limit.
    const uint64_t first_channel = g.weights == GroupLayout::ByChannel && m.params.affine ? pieces[i].first_channel : 0;
    sets.push_back(m.descriptor_set({blob_in.buffer, blob_in.offset + pieces[i].offset, pieces[i].bytes}, pieces[i].bytes,
                                    plans[i].partials_bytes, plans[i].coefs_bytes, first_channel));
  }
  const vk::QueryPool queries = m.timing ? m.next_queries() : vk::QueryPool{};
  const uint32_t first_query = m.timing ? 2 * ((m.timed - 1) % kTimedPerPool) : 0;

  // ---- recording
  const auto& dispatcher = *m.caller.device.getDispatcher();
  const vk::CommandBuffer cb(cmd);
  using S = vk::PipelineStageFlagBits;
  using A = vk::AccessFlagBits;
  if (m.upload_pending) {
    const uint64_t bytes = m.staging.size;
    // Only the weights: a global barrier would also order the caller's own transfers around vknorm's, hiding a
    // barrier the caller left out (discrete GPUs upload weights this way; unified memory maps them).
    auto weights_barrier = [&](vk::PipelineStageFlags from, vk::AccessFlags from_access, vk::PipelineStageFlags to,
                               vk::AccessFlags to_access) {
      const vk::BufferMemoryBarrier b{.srcAccessMask = from_access,
                                      .dstAccessMask = to_access,
                                      .srcQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED,
                                      .dstQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED,
                                      .buffer = *m.weights.buffer,
                                      .offset = 0,
                                      .size = bytes};
      cb.pipelineBarrier(from, to, {}, {}, b, {}, dispatcher);
    };
    // A command buffer submitted again copies again: after the dispatches (and the copy) of its earlier
    // submission that may still be reading the weights.
    weights_barrier(S::eComputeShader | S::eTransfer, A::eTransferWrite, S::eTransfer, A::eTransferWrite);
    cb.copyBuffer(*m.staging.buffer, *m.weights.buffer, vk::BufferCopy{.srcOffset = 0, .dstOffset = 0, .size = bytes}, dispatcher);
    weights_barrier(S::eTransfer, A::eTransferWrite, S::eComputeShader, A::eShaderRead);
    m.upload_pending = false;
  }
  if (queries) {
    cb.resetQueryPool(queries, first_query, 2, dispatcher);
    cb.writeTimestamp(S::eComputeShader, queries, first_query, dispatcher);
  }
  const vk::MemoryBarrier between{.srcAccessMask = A::eShaderWrite, .dstAccessMask = A::eShaderRead | A::eShaderWrite};
  DispatchInfo info;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const ForwardPlan& fp = plans[k];
    const uint64_t counters_at = m.coefs_offset(fp.partials_bytes);  // where this piece's set binds slot 4
    // The scratch is shared by the pieces and by every forward of this Recorder: a split forward first
    // waits for the earlier ones' passes (reads of it included) to finish.
    if (fp.partials_bytes || fp.coefs_bytes) cb.pipelineBarrier(S::eComputeShader, S::eComputeShader, {}, between, {}, {}, dispatcher);
    cb.bindDescriptorSets(vk::PipelineBindPoint::eCompute, *m.pipeline_layout, 0, sets[k], {}, dispatcher);
    bool recorded = false;
    for (size_t i = 0; i < fp.passes.size(); ++i) {
      const Pass& pass = fp.passes[i];
      if (m.counters.skips(pass, fp, counters_at)) continue;
      if (pass.after_previous && recorded) cb.pipelineBarrier(S::eComputeShader, S::eComputeShader, {}, between, {}, {}, dispatcher);
      recorded = true;
      cb.bindPipeline(vk::PipelineBindPoint::eCompute, pipelines[k][i], dispatcher);
      cb.pushConstants(*m.pipeline_layout, vk::ShaderStageFlagBits::eCompute, 0, sizeof(PushConstants), &pass.push, dispatcher);
      // Counts past the x limit fold into y; the shaders rebuild the linear id (common.glsl).
      const Grid grid = fold_workgroups(pass.workgroups, m.info.max_workgroup_count_x);
      cb.dispatch(grid.x, grid.y, 1, dispatcher);
    }
    m.counters.recorded(fp, counters_at, /*partials_before_counters=*/true);
    const DispatchInfo piece = dispatch_info(fp);
    const int dispatches = info.dispatches + piece.dispatches;
    info = piece;
    info.dispatches = dispatches;
  }
  if (queries) cb.writeTimestamp(S::eComputeShader, queries, first_query + 1, dispatcher);
  info.pieces = int(pieces.size());
  return info;
}

void Recorder::set_timing(bool on) {
  Impl& m = impl();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (on && !m.timestamp_bits)
    throw std::invalid_argument("vknorm::Recorder::set_timing: " + m.info.name +
                                " has a compute queue family without timestamps (timestampValidBits 0) or no timestamp "
                                "period: GPU time cannot be measured on it");
  m.timing = on;
}

std::vector<double> Recorder::gpu_times_us() {
  Impl& m = impl();
  std::lock_guard<std::mutex> lock(m.mutex);
  std::vector<double> out;
  const uint64_t mask = m.timestamp_bits >= 64 ? ~0ull : (1ull << m.timestamp_bits) - 1;
  for (uint32_t i = 0; i < m.timed; ++i) {
    auto [result, t] = m.query_pools[i / kTimedPerPool].getResults<uint64_t>(2 * (i % kTimedPerPool), 2, 2 * sizeof(uint64_t),
                                                                            sizeof(uint64_t), vk::QueryResultFlagBits::e64);
    if (result != vk::Result::eSuccess)
      throw std::logic_error("vknorm::Recorder::gpu_times_us: timed forward " + std::to_string(i + 1) + " of " +
                             std::to_string(m.timed) + " has not completed; read the times once every command buffer "
                             "recorded with timing on has completed");
    out.push_back(double((t[1] - t[0]) & mask) * m.info.timestamp_period_ns / 1000.0);
  }
  m.timed = 0;
  return out;
}

void Recorder::release_descriptors() {
  Impl& m = impl();
  std::lock_guard<std::mutex> lock(m.mutex);
  m.sets.clear();
  m.pools.clear();
  m.sets_in_last_pool = kSetsPerPool;
  m.live_sets = 0;
  m.retired.clear();
  m.counters = {};  // command buffers recorded before are not submitted again: nothing known of what ran last
  m.timed = 0;      // nor read: a pair of one that never ran (a dropped frame) would block every later read
  if (!m.upload_pending) m.retire(m.staging), m.retired.clear();  // the upload was recorded and has completed
}

NormOp Recorder::op() const { return impl().params.op; }
const NormParams& Recorder::params() const { return impl().params; }
int Recorder::affine_size() const { return impl().params.affine_size; }
float Recorder::eps() const { return impl().params.eps; }
int Recorder::affine() const { return impl().params.affine; }
const DeviceInfo& Recorder::device_info() const { return impl().info; }
uint64_t Recorder::storage_offset_alignment() const { return impl().alignment; }
size_t Recorder::cached_descriptor_sets() const { return impl().live_sets; }
size_t Recorder::pipelines() const { return impl().pipelines.size(); }

}  // namespace vknorm

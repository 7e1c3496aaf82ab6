// vknorm inside an engine of its own (include/vknorm/recorder.h): a tiny "engine" owns its Vulkan instance,
// device, queue, command pool and one VkBuffer holding two blobs at different offsets. Into ONE command
// buffer of its own it records: its upload (a staging copy of the whole buffer) -> its barrier ->
// vknorm LayerNorm on blob A and vknorm RMSNorm on blob B -> its barrier -> its copy back. It submits
// once, then checks every output against float64 and that no byte outside the blobs' groups changed;
// B also against vknorm's CPU reference (vknorm::reference_forward, ncnn's float32 algorithm). A is not:
// at |mean| >> std that algorithm's float32 sum is itself off by ~0.26 (printed for information).
//
//   blob A  LayerNorm, affine_size 768, dims 3 c=8 h=5 w=768, float32 pack4; x = 1e4 + N(0, 1e-2)
//           (|mean| >> std: the fused kernel's pivot keeps it exact)
//   blob B  RMSNorm, affine_size 3003 (whole channels), dims 3 c=3 h=3 w=1001 float32 pack1 (cstep 3004:
//           a padding element per channel), on the split path (reduce -> finalize -> apply), forced by
//           Option::path = Path::Split
// With --channel-norms, the same two blobs as the other two norms (gamma and beta per channel):
//   blob A  GroupNorm, group 6, channels 12 (2 channels per group: groups inside pack4 lanes), dims 3 c=12
//           h=5 w=7, float32 pack4; x = 1e4 + N(0, 1e-2)
//   blob B  InstanceNorm, channels 3, dims 3 c=3 h=3 w=1001 float32 pack1, on the split path
//
// Tolerance, from float32: |y - y_float64| <= 84 float32 ulps (84 * 2^-23 = 1.0e-5) x max(1, max|y|), per
// blob: a few ulps per rounding step of the reductions over up to 3003 elements and of the affine step.
//
// Usage: engine_example [--channel-norms] [--misalign] [--skip-rmsnorm] [--corrupt] [--no-barrier]
//                       [--system-loader] [--refusals] [--timing] [--repeat N] [--cooperative-reuse] [--rebind]
//                       [--reload] [--give-up-first] [--sizes N] [--resubmit] [--split-between]
//                       [--drop-cooperative]
//   --channel-norms  blobs A and B as GroupNorm and InstanceNorm (above); every flag but --rebind works with it
//                    (a channel norm's channel count is fixed: --cooperative-reuse then records all of B twice)
//   --misalign       put blob B at an offset that is not a multiple of minStorageBufferOffsetAlignment:
//                    vknorm refuses it (std::invalid_argument, exit 2)
//   --skip-rmsnorm   do not record B's norm (negative control: B stays un-normalized, exit 1)
//   --corrupt        change one output element of A after the copy back (negative control, exit 1)
//   --no-barrier     leave out the engine's barrier between its upload and vknorm (negative control:
//                    with VKNORM_VALIDATION=1, synchronization validation reports the hazard, exit 1)
//   --system-loader  give vknorm no vkGetInstanceProcAddr: it opens the system loader itself
//   --refusals       first try record() calls vknorm must refuse (bad shapes, affine_size, offset, range,
//                    missing weights, float16 pack1 without 16-bit storage or with it hidden by the
//                    capability profile, a group larger than one binding, pieces at misaligned offsets) on
//                    the same command buffer;
//                    each must throw std::invalid_argument and record nothing (exit 1 otherwise)
//   --repeat N       record both forwards N times in the command buffer, the engine's barrier between
//                    rounds (vknorm's scratch and descriptor sets are shared by the rounds)
//   --timing         Recorder::set_timing(true): after the submission, each forward's GPU time
//                    (Recorder::gpu_times_us) and the submission's wall time on the host; then B once more,
//                    in a command buffer of its own, on the query pair the first read freed: one time
//   --cooperative-reuse  B is a LayerNorm (InstanceNorm with --channel-norms), recorded as two forwards of its
//                    Recorder, Option::path
//                    cooperative: its first 2 channels, then its last one; the second reuses the first's
//                    scratch at another layout
//   --reload         first load other weights into both Recorders and record them into a command buffer that is
//                    never submitted, then load the real weights: the forwards that run must read the weights
//                    loaded last, not the ones an earlier record saw
//   --give-up-first  B is a LayerNorm (InstanceNorm with --channel-norms), recorded with Option::path cooperative
//                    after a forward of its Recorder over the same blob whose waits all gave up
//                    (VKNORM_TUNE_WAIT_ROUNDS=0: its output NaN, copied aside and counted); the engine then
//                    uploads B again. The second forward skips its clear pass, trusting the first to have left
//                    the counters zero
//   --sizes N        with --channel-norms: another frame, B's Recorder (InstanceNorm) over N inputs of other sizes
//                    (c=3 h=1 w=100..99+N, pack1, each in a region of its own buffer), each checked against float64
//                    as B is; prints how many pipelines the Recorder keeps (a bounded number: the group size is a
//                    specialization constant for the first 16 sizes only)
//   --split-between  with --channel-norms --cooperative-reuse: a split forward of B between its two cooperative
//                    ones, its partials in the Recorder's scratch (where an apply that merges them writes no
//                    coefficients: over the bytes the first forward's counters used)
//   --drop-cooperative  with --channel-norms: first a split forward of B, submitted and completed (its partials
//                    in the Recorder's scratch), then a cooperative one recorded into a command buffer never
//                    submitted (a dropped frame: its clear of the counters never runs), then load_model() again
//                    as "Barriers" in recorder.h says for a dropped frame; B's forward below is cooperative
//   --resubmit       submit the command buffer a second time once the first has completed (not one-time-submit):
//                    vknorm's weight upload recorded in it runs again after the first submission's forwards
//   --rebind         a second frame after the first completed and the Recorders released their descriptor
//                    sets, as an engine's next inference whose allocator hands out B's bytes again at other
//                    shapes: B's channels 0 and 2 (a blob of cstep 2 x 3004), then all three, then channel 1.
//                    The first two bind the same bytes (B's offset and span) at 2 groups, then at 3, within
//                    the scratch the first frame left; every channel of B is normalized twice more
//
// VKNORM_MAX_BUFFER_BYTES=N (as for vknorm's own context) makes the Recorders bind at most N bytes per
// storage buffer: the blobs are then recorded in pieces of whole groups ("pieces: A n, B m").
//
// VKNORM_VALIDATION=1: the Khronos validation layer with synchronization validation, when installed,
// and a debug messenger; any message fails the run (exit 1) and is printed.
// Exit: 0 OK, 1 an error past the tolerance / a changed byte / a validation message / a Vulkan call that failed
// during the run, 2 vknorm refused an input or bad arguments, 3 no Vulkan device (the engine could not set one
// up), 4 --misalign on a device that aligns every offset.
#include <vulkan/vulkan.h>

#include <vknorm/norm.h>
#include <vknorm/recorder.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// ------------------------------------------------------------------------------------- validation
std::mutex g_messages_mutex;
std::vector<std::string> g_messages;

VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
                                          const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
  if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
    std::lock_guard<std::mutex> lock(g_messages_mutex);
    // "[ID name] message": newer layers keep the ID (SYNC-HAZARD-..., VUID-...) out of the message text.
    std::string text = data && data->pMessageIdName ? std::string("[") + data->pMessageIdName + "] " : std::string();
    text += data && data->pMessage ? data->pMessage : "(no message)";
    g_messages.push_back(std::move(text));
  }
  return VK_FALSE;
}

struct VulkanError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The engine could not set up a device at all (exit 3); a Vulkan call failing later is a failed run (exit 1).
struct NoVulkanDevice : VulkanError {
  using VulkanError::VulkanError;
};

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) throw VulkanError(std::string(what) + " failed: VkResult " + std::to_string(int(r)));
}

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// A zeroed Vulkan struct with its sType.
template <class T>
T make(VkStructureType type) {
  T t{};
  t.sType = type;
  return t;
}

// ------------------------------------------------------------------------------------- the engine
// Everything the engine owns, destroyed in reverse order (after the device is idle).
struct Engine {
  VkInstance instance = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t queue_family = 0;
  uint32_t api_version = VK_API_VERSION_1_0;
  bool validation = false, fp16_storage = false;
  VkPhysicalDeviceProperties props{};
  VkPhysicalDeviceMemoryProperties memory{};
  VkCommandPool pool = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  struct Buffer {
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;
    void* mapped = nullptr;
  };
  std::vector<Buffer> buffers;

  // A constructor that throws runs no destructor: what it made so far is destroyed here.
  Engine() {
    try {
      open();
    } catch (const VulkanError& e) {
      close();
      throw NoVulkanDevice(e.what());
    } catch (...) {
      close();
      throw;
    }
  }
  ~Engine() { close(); }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void open() {
    uint32_t loader = VK_API_VERSION_1_0;
    auto enumerate_version =
        reinterpret_cast<PFN_vkEnumerateInstanceVersion>(vkGetInstanceProcAddr(nullptr, "vkEnumerateInstanceVersion"));
    if (enumerate_version) enumerate_version(&loader);
    api_version = std::min<uint32_t>(loader, VK_API_VERSION_1_3);

    std::vector<const char*> layers, extensions;
    const char* env = std::getenv("VKNORM_VALIDATION");
    if (env && std::strcmp(env, "1") == 0) {
      uint32_t n = 0;
      vkEnumerateInstanceLayerProperties(&n, nullptr);
      std::vector<VkLayerProperties> all(n);
      vkEnumerateInstanceLayerProperties(&n, all.data());
      for (const auto& l : all) validation = validation || std::strcmp(l.layerName, "VK_LAYER_KHRONOS_validation") == 0;
      if (validation) {
        layers.push_back("VK_LAYER_KHRONOS_validation");
        extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
      } else {
        std::printf("validation: VKNORM_VALIDATION=1 but VK_LAYER_KHRONOS_validation is not installed; running without\n");
      }
    }
    auto mi = make<VkDebugUtilsMessengerCreateInfoEXT>(VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
    mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    mi.pfnUserCallback = on_message;
    // Core validation plus synchronization validation; the messenger is also chained into
    // vkCreateInstance so that instance creation and destruction report to it.
    const VkValidationFeatureEnableEXT enables[] = {VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
    auto features = make<VkValidationFeaturesEXT>(VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT);
    features.pNext = &mi;
    features.enabledValidationFeatureCount = 1;
    features.pEnabledValidationFeatures = enables;
    auto app = make<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
    app.pApplicationName = "engine_example";
    app.pEngineName = "tiny engine";
    app.apiVersion = api_version;
    auto ici = make<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
    ici.pNext = validation ? &features : nullptr;
    ici.pApplicationInfo = &app;
    ici.enabledLayerCount = uint32_t(layers.size());
    ici.ppEnabledLayerNames = layers.data();
    ici.enabledExtensionCount = uint32_t(extensions.size());
    ici.ppEnabledExtensionNames = extensions.data();
    check(vkCreateInstance(&ici, nullptr, &instance), "vkCreateInstance");
    if (validation) {
      auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
          vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT"));
      check(create ? create(instance, &mi, nullptr, &messenger) : VK_ERROR_EXTENSION_NOT_PRESENT,
            "vkCreateDebugUtilsMessengerEXT");
    }

    // The first device with a compute queue, discrete > integrated > virtual > cpu.
    uint32_t n = 0;
    vkEnumeratePhysicalDevices(instance, &n, nullptr);
    std::vector<VkPhysicalDevice> devices(n);
    vkEnumeratePhysicalDevices(instance, &n, devices.data());
    auto rank = [](VkPhysicalDeviceType t) {
      switch (t) {
        case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
        case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
        case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
        case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
        default: return 4;
      }
    };
    int best = 99;
    for (VkPhysicalDevice pd : devices) {
      VkPhysicalDeviceProperties p;
      vkGetPhysicalDeviceProperties(pd, &p);
      uint32_t nq = 0;
      vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, nullptr);
      std::vector<VkQueueFamilyProperties> families(nq);
      vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, families.data());
      for (uint32_t q = 0; q < nq; ++q)
        if ((families[q].queueFlags & VK_QUEUE_COMPUTE_BIT) && rank(p.deviceType) < best) {
          best = rank(p.deviceType), physical = pd, queue_family = q, props = p;
          break;
        }
    }
    if (!physical) throw VulkanError("no Vulkan device with a compute queue");
    vkGetPhysicalDeviceMemoryProperties(physical, &memory);
    // The API version the engine uses: its instance's, capped by the device's.
    api_version = std::min(api_version, props.apiVersion);

    // 16-bit storage when the device has it (vknorm's elempack-1 float16 kernels need it).
    auto storage16 = make<VkPhysicalDevice16BitStorageFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES);
    if (api_version >= VK_API_VERSION_1_1) {
      auto f2 = make<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
      f2.pNext = &storage16;
      vkGetPhysicalDeviceFeatures2(physical, &f2);
      fp16_storage = storage16.storageBuffer16BitAccess;
      storage16 = make<VkPhysicalDevice16BitStorageFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES);
      storage16.storageBuffer16BitAccess = fp16_storage;
    }
    const float priority = 1.f;
    auto qci = make<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
    qci.queueFamilyIndex = queue_family;
    qci.queueCount = 1;
    qci.pQueuePriorities = &priority;
    auto dci = make<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
    dci.pNext = fp16_storage ? &storage16 : nullptr;
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    check(vkCreateDevice(physical, &dci, nullptr, &device), "vkCreateDevice");
    vkGetDeviceQueue(device, queue_family, 0, &queue);
    auto pci = make<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
    pci.queueFamilyIndex = queue_family;
    check(vkCreateCommandPool(device, &pci, nullptr, &pool), "vkCreateCommandPool");
    auto fci = make<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
    check(vkCreateFence(device, &fci, nullptr, &fence), "vkCreateFence");
  }

  void close() {
    if (device) {
      vkDeviceWaitIdle(device);
      for (auto& b : buffers) {
        if (b.buffer) vkDestroyBuffer(device, b.buffer, nullptr);
        if (b.memory) vkFreeMemory(device, b.memory, nullptr);
      }
      buffers.clear();
      if (fence) vkDestroyFence(device, fence, nullptr);
      if (pool) vkDestroyCommandPool(device, pool, nullptr);
      vkDestroyDevice(device, nullptr);
      fence = VK_NULL_HANDLE, pool = VK_NULL_HANDLE, device = VK_NULL_HANDLE;
    }
    if (messenger) {
      auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
          vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT"));
      if (destroy) destroy(instance, messenger, nullptr);
      messenger = VK_NULL_HANDLE;
    }
    if (instance) vkDestroyInstance(instance, nullptr);
    instance = VK_NULL_HANDLE;
  }

  Buffer buffer(VkDeviceSize size, VkBufferUsageFlags usage, VkMemoryPropertyFlags want) {
    buffers.emplace_back();
    Buffer& b = buffers.back();  // owned (and destroyed) by the engine from here on
    auto bci = make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
    bci.size = size;
    bci.usage = usage;
    check(vkCreateBuffer(device, &bci, nullptr, &b.buffer), "vkCreateBuffer");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(device, b.buffer, &req);
    uint32_t type = UINT32_MAX;
    for (uint32_t i = 0; i < memory.memoryTypeCount && type == UINT32_MAX; ++i)
      if ((req.memoryTypeBits & (1u << i)) && (memory.memoryTypes[i].propertyFlags & want) == want) type = i;
    if (type == UINT32_MAX) throw VulkanError("no memory type for a buffer");
    auto mai = make<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
    mai.allocationSize = req.size;
    mai.memoryTypeIndex = type;
    check(vkAllocateMemory(device, &mai, nullptr, &b.memory), "vkAllocateMemory");
    check(vkBindBufferMemory(device, b.buffer, b.memory, 0), "vkBindBufferMemory");
    if (want & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) check(vkMapMemory(device, b.memory, 0, VK_WHOLE_SIZE, 0, &b.mapped), "vkMapMemory");
    return b;
  }
};

// A buffer barrier of the engine's own: everything before in `src` stage/access, before everything after.
void barrier(VkCommandBuffer cmd, VkBuffer buffer, VkPipelineStageFlags src_stage, VkAccessFlags src_access,
             VkPipelineStageFlags dst_stage, VkAccessFlags dst_access) {
  auto b = make<VkBufferMemoryBarrier>(VK_STRUCTURE_TYPE_BUFFER_MEMORY_BARRIER);
  b.srcAccessMask = src_access;
  b.dstAccessMask = dst_access;
  b.srcQueueFamilyIndex = b.dstQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED;
  b.buffer = buffer;
  b.offset = 0;
  b.size = VK_WHOLE_SIZE;
  vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 0, nullptr, 1, &b, 0, nullptr);
}

// ------------------------------------------------------------------------------------- the blobs
// A blob in ncnn's layout, as the engine keeps it: dims 3, (c, h, w) with c packed by elempack.
size_t ncnn_cstep(int w, int h, size_t elemsize) { return align_up(uint64_t(w) * h * elemsize, 16) / elemsize; }

struct Blob {
  vknorm::NormParams p;  // op, affine_size (LayerNorm, RMSNorm) or group and channels (GroupNorm, InstanceNorm)
  int c, h, w, elempack;
  size_t cstep;         // packed elements between packed channels (ncnn: w*h*elemsize rounded up to 16 bytes)
  size_t cstep1;        // the same blob's cstep at elempack 1
  uint64_t offset = 0;  // in the engine's buffer
  std::vector<float> x, gamma, beta;  // x unpacked: c channels of cstep1 floats (padding included)
  Blob(const vknorm::NormParams& p_, int c_, int h_, int w_, int elempack_)
      : p(p_), c(c_), h(h_), w(w_), elempack(elempack_), cstep(ncnn_cstep(w_, h_, 4u * elempack_)),
        cstep1(ncnn_cstep(w_, h_, 4u)) {}
  int packed_c() const { return c / elempack; }
  uint64_t span() const { return vknorm::blob_span_bytes(3, w, h, 1, packed_c(), cstep, elempack, false); }
  // Every group's elements as (index into x, index of its gamma/beta): LayerNorm/RMSNorm rows (affine_size w) or
  // whole channels (w*h), weights by position; GroupNorm channels/group whole channels, InstanceNorm one channel,
  // weights by channel.
  std::vector<std::vector<std::pair<size_t, int>>> groups() const {
    std::vector<std::vector<std::pair<size_t, int>>> out;
    const int plane = w * h;
    if (!p.per_channel()) {
      for (int q = 0; q < c; ++q)
        for (int g0 = 0; g0 < plane; g0 += p.affine_size) {
          out.emplace_back();
          for (int i = 0; i < p.affine_size; ++i) out.back().push_back({size_t(q) * cstep1 + g0 + i, i});
        }
      return out;
    }
    const int per_group = p.op == vknorm::NormOp::GroupNorm ? c / p.group : 1;
    for (int q0 = 0; q0 < c; q0 += per_group) {
      out.emplace_back();
      for (int q = q0; q < q0 + per_group; ++q)
        for (int i = 0; i < plane; ++i) out.back().push_back({size_t(q) * cstep1 + i, q});
    }
    return out;
  }
};

vknorm::NormParams row_norm(vknorm::NormOp op, int affine_size, float eps) {
  vknorm::NormParams p;
  p.op = op, p.affine_size = affine_size, p.eps = eps;
  return p;
}
vknorm::NormParams channel_norm(vknorm::NormOp op, int group, int channels, float eps) {
  vknorm::NormParams p;
  p.op = op, p.group = group, p.channels = channels, p.eps = eps;
  return p;
}

// The blob's packed float32 image at `dst` (ncnn's pack4 interleaves 4 channels per element).
void pack(const Blob& b, float* dst) {
  const int plane = b.w * b.h;
  for (int q = 0; q < b.packed_c(); ++q)
    for (int i = 0; i < plane; ++i)
      for (int k = 0; k < b.elempack; ++k)
        dst[(size_t(q) * b.cstep + i) * b.elempack + k] = b.x[size_t(q * b.elempack + k) * b.cstep1 + i];
}

std::vector<float> unpack(const Blob& b, const float* src) {
  std::vector<float> out(b.x.size(), 0.f);
  const int plane = b.w * b.h;
  for (int q = 0; q < b.packed_c(); ++q)
    for (int i = 0; i < plane; ++i)
      for (int k = 0; k < b.elempack; ++k)
        out[size_t(q * b.elempack + k) * b.cstep1 + i] = src[(size_t(q) * b.cstep + i) * b.elempack + k];
  return out;
}

// y in float64 from the float32 inputs: two-pass mean and variance (every norm but RMSNorm) or mean square
// (RMSNorm), applied `times` times (--repeat: each forward normalizes the previous one's output).
std::vector<double> reference64(const Blob& b, int times) {
  std::vector<double> x(b.x.begin(), b.x.end());
  const bool centred = vknorm::centres(b.p.op);
  for (int t = 0; t < times; ++t)
    for (const auto& group : b.groups()) {
      const double n = double(group.size());
      double mean = 0, ss = 0;
      for (const auto& [k, wi] : group) mean += x[k];
      mean /= n;
      for (const auto& [k, wi] : group) {
        const double d = centred ? x[k] - mean : x[k];
        ss += d * d;
      }
      const double a = 1.0 / std::sqrt(ss / n + double(b.p.eps));
      for (const auto& [k, wi] : group)
        x[k] = centred ? (x[k] - mean) * a * b.gamma[wi] + b.beta[wi] : x[k] * a * b.gamma[wi];
    }
  return x;
}

// vknorm's CPU reference: ncnn's float32 algorithm (vknorm::reference_forward) on the unpacked blob.
std::vector<float> reference_cpu(const Blob& b, int times) {
  std::vector<float> y = b.x;
  const vknorm::GroupLayout g = b.p.layout(3, b.w, b.h, 1, b.c, b.cstep1, 1);
  for (int t = 0; t < times; ++t)
    vknorm::reference_forward(b.p.op, y.data(), g, b.p.eps, b.gamma.data(), vknorm::centres(b.p.op) ? b.beta.data() : nullptr);
  return y;
}

template <class Ref>
double max_abs_err(const Blob& b, const std::vector<float>& y, const Ref& ref) {
  double e = 0;
  for (int q = 0; q < b.c; ++q)
    for (int i = 0; i < b.w * b.h; ++i) {
      const size_t k = size_t(q) * b.cstep1 + i;
      const double d = std::fabs(double(y[k]) - double(ref[k]));
      if (!(d <= e)) e = d;  // NaN propagates
    }
  return e;
}

template <class Ref>
double scale_of(const Blob& b, const Ref& ref) {
  double s = 1;
  for (int q = 0; q < b.c; ++q)
    for (int i = 0; i < b.w * b.h; ++i) s = std::max(s, std::fabs(double(ref[size_t(q) * b.cstep1 + i])));
  return s;
}

constexpr double kUlps = 84;  // the tolerance: kUlps * FLT_EPSILON (2^-23) * max(1, max|y|)

struct Args {
  bool channel_norms = false;
  bool misalign = false, skip_rmsnorm = false, corrupt = false, no_barrier = false, system_loader = false;
  bool refusals = false, timing = false, cooperative_reuse = false, rebind = false, reload = false;
  bool give_up_first = false, resubmit = false, split_between = false, drop_cooperative = false;
  int repeat = 1;
  int sizes = 0;  // --sizes N
};

// An environment variable set for a scope, its previous value (or absence) restored after.
struct ScopedEnv {
  const char* name;
  bool had;
  std::string old;
  ScopedEnv(const char* n, const char* value) : name(n), had(std::getenv(n) != nullptr), old(had ? std::getenv(n) : "") {
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had) setenv(name, old.c_str(), 1);
    else unsetenv(name);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

// A call vknorm must refuse with std::invalid_argument, recording nothing.
struct Case {
  const char* what;
  std::function<void()> call;
};

// Tries every case, printing what vknorm said; returns how many were not refused as they should be.
int refused_all(const std::vector<Case>& cases) {
  int unexpected = 0;
  for (const Case& c : cases) {
    try {
      c.call();
      std::printf("refusal %s: NOT refused\n", c.what);
      ++unexpected;
    } catch (const std::invalid_argument& e) {
      std::printf("refusal %s: %s\n", c.what, e.what());
    } catch (const std::exception& e) {
      std::printf("refusal %s: wrong exception: %s\n", c.what, e.what());
      ++unexpected;
    }
  }
  return unexpected;
}

// --refusals: record() calls vknorm must refuse with std::invalid_argument, recording nothing. Each is
// tried on the command buffer the run then uses, so validation and the results show nothing was left.
int try_refusals(VkCommandBuffer cmd, const vknorm::VulkanHandles& handles, VkBuffer buffer, uint64_t align,
                 uint64_t max_range, vknorm::Recorder& ln, const Blob& a) {
  const vknorm::BufferRef at{buffer, a.offset, a.span()};
  vknorm::VulkanHandles no16 = handles;
  no16.fp16_storage_enabled = false;
  const std::vector<Case> cases{
      {"affine_size 768 against rows of 700", [&] { ln.record(cmd, at, 3, 700, 5, 1, 2, 3504, 4, false); }},
      {"dims 5", [&] { ln.record(cmd, at, 5, a.w, a.h, 1, 2, a.cstep, 4, false); }},
      {"elempack 8", [&] { ln.record(cmd, at, 3, a.w, a.h, 1, 1, a.cstep, 8, false); }},
      {"a zero extent", [&] { ln.record(cmd, at, 3, a.w, 0, 1, 2, a.cstep, 4, false); }},
      {"cstep below w*h", [&] { ln.record(cmd, at, 3, a.w, a.h, 1, 2, 100, 4, false); }},
      {"an offset off minStorageBufferOffsetAlignment",
       [&] { ln.record(cmd, {buffer, a.offset + (align > 1 ? align / 2 : 1), a.span()}, 3, a.w, a.h, 1, 2, a.cstep, 4, false); }},
      {"a range smaller than the blob", [&] { ln.record(cmd, {buffer, a.offset, a.span() - 16}, 3, a.w, a.h, 1, 2, a.cstep, 4, false); }},
      {"no weights loaded (affine=1)",
       [&] {
         vknorm::Recorder fresh(handles, a.p);
         fresh.record(cmd, at, 3, a.w, a.h, 1, 2, a.cstep, 4, false);
       }},
      {"float16 elempack-1 groups of odd size without storageBuffer16BitAccess",
       [&] {
         vknorm::Recorder fp16(no16, vknorm::NormOp::RMSNorm, 1001, 1e-5f, 0);
         fp16.record(cmd, {buffer, a.offset, a.span()}, 2, 1001, 8, 1, 1, 0, 1, true);
       }},
      {"float16 elempack-1 groups with 16-bit storage hidden by the capability profile",
       [&] {  // the engine enabled the feature; VKNORM_NO_FP16_STORAGE (read when a Recorder is made) hides it
         if (!handles.fp16_storage_enabled) throw std::invalid_argument("the capability profile: not enabled anyway");
         std::optional<ScopedEnv> hidden(std::in_place, "VKNORM_NO_FP16_STORAGE", "1");
         vknorm::Recorder fp16(handles, vknorm::NormOp::RMSNorm, 1001, 1e-5f, 0);
         hidden.reset();
         fp16.record(cmd, {buffer, a.offset, a.span()}, 2, 1001, 8, 1, 1, 0, 1, true);
       }},
      {"a dims-1 float16 group past the fused kernel without storageBuffer16BitAccess",
       [&] {  // 262144 elements in pack4 (packed halves): the split path would read single float16 values
         vknorm::Recorder fp16(no16, vknorm::NormOp::LayerNorm, 0, 1e-5f, 0);
         fp16.record(cmd, {buffer, a.offset, vknorm::kWholeSize}, 1, 65536, 1, 1, 1, 65536, 4, true);
       }},
      {"a group larger than one storage buffer binding",
       [&] {  // one row one element past maxStorageBufferRange: a group is never split
         const uint64_t range = max_range;
         const int w = int(std::min<uint64_t>(range / 4 + 1, 0x7fffffff));
         vknorm::Recorder row(handles, vknorm::NormOp::RMSNorm, 0, 1e-5f, 0);
         row.record(cmd, {buffer, a.offset, vknorm::kWholeSize}, 2, w, 1, 1, 1, size_t(w), 1, false);
       }},
      {"pieces at offsets off minStorageBufferOffsetAlignment",
       [&] {  // two rows of 4004 bytes, one per binding: the second would be bound at offset + 4004
         if (align <= 4) throw std::invalid_argument("not applicable: every multiple of 4 bytes is aligned here");
         const ScopedEnv limit("VKNORM_MAX_BUFFER_BYTES", "4004");
         vknorm::Recorder rows(handles, vknorm::NormOp::RMSNorm, 0, 1e-5f, 0);
         rows.record(cmd, {buffer, a.offset, 8008}, 2, 1001, 2, 1, 1, 2002, 1, false);
       }},
      {"gamma of the wrong size", [&] { ln.load_model(std::vector<float>(10, 1.f), a.beta); }},
      {"no device", [&] { vknorm::Recorder none(vknorm::VulkanHandles{}, vknorm::NormOp::LayerNorm, 768); }},
  };
  return refused_all(cases);
}

// --refusals with --channel-norms: what GroupNorm/InstanceNorm Recorders must refuse (std::invalid_argument),
// recording nothing.
int try_channel_refusals(VkCommandBuffer cmd, const vknorm::VulkanHandles& handles, VkBuffer buffer, vknorm::Recorder& gn,
                         const Blob& a) {
  const vknorm::BufferRef at{buffer, a.offset, a.span()};
  const std::vector<Case> cases{
      {"8 channels into a GroupNorm of 12", [&] { gn.record(cmd, at, 3, a.w, a.h, 1, 2, a.cstep, 4, false); }},
      {"channels that do not divide into the groups",
       [&] { vknorm::Recorder r(handles, channel_norm(vknorm::NormOp::GroupNorm, 5, 12, 1e-5f)); }},
      {"affine with no channels", [&] { vknorm::Recorder r(handles, channel_norm(vknorm::NormOp::InstanceNorm, 1, 0, 1e-5f)); }},
      {"GroupNorm by affine_size", [&] { vknorm::Recorder r(handles, vknorm::NormOp::GroupNorm, 12, 1e-5f); }},
      {"gamma of the wrong size", [&] { gn.load_model(std::vector<float>(10, 1.f), a.beta); }},
      {"beta missing", [&] { gn.load_model(a.gamma); }},
      {"no weights loaded (affine=1)",
       [&] {
         vknorm::Recorder fresh(handles, a.p);
         fresh.record(cmd, at, 3, a.w, a.h, 1, a.packed_c(), a.cstep, a.elempack, false);
       }},
      {"a dims-1 float16 GroupNorm without storageBuffer16BitAccess",
       [&] {  // ncnn packs dims 1 by 4; GroupNorm's channels are then single elements, read as single float16 values
         vknorm::VulkanHandles no16 = handles;
         no16.fp16_storage_enabled = false;
         vknorm::NormParams p = channel_norm(vknorm::NormOp::GroupNorm, 2, 8, 1e-5f);
         p.affine = 0;
         vknorm::Recorder gn8(no16, p);
         gn8.record(cmd, {buffer, a.offset, 16}, 1, 2, 1, 1, 1, 2, 4, true);
       }},
      {"pieces whose per-channel weights would start off 16 bytes",
       [&] {  // one channel of 4 floats per binding: the second piece's weights would start at byte 4
         const ScopedEnv limit("VKNORM_MAX_BUFFER_BYTES", "16");
         vknorm::Recorder in(handles, channel_norm(vknorm::NormOp::InstanceNorm, 1, 2, 1e-5f));
         in.load_model({1.f, 1.f}, {0.f, 0.f});
         in.record(cmd, {buffer, a.offset, 32}, 3, 4, 1, 1, 2, 4, 1, false);
       }},
  };
  return refused_all(cases);
}

int run(const Args& args) {
  Engine e;
  std::printf("device: %s, Vulkan %u.%u, minStorageBufferOffsetAlignment %llu, 16-bit storage %s\n",
              e.props.deviceName, VK_API_VERSION_MAJOR(e.api_version), VK_API_VERSION_MINOR(e.api_version),
              (unsigned long long)e.props.limits.minStorageBufferOffsetAlignment, e.fp16_storage ? "enabled" : "off");
  std::printf("validation: %s\n", e.validation ? "on (VK_LAYER_KHRONOS_validation, synchronization validation)" : "off");

  // ---- the blobs and their weights
  std::mt19937 rng(20240917);
  std::normal_distribution<float> normal(0.f, 1.f);
  const float eps_a = 1e-5f, eps_b = 1e-6f;
  using vknorm::NormOp;
  Blob a = args.channel_norms ? Blob(channel_norm(NormOp::GroupNorm, 6, 12, eps_a), 12, 5, 7, 4)
                              : Blob(row_norm(NormOp::LayerNorm, 768, eps_a), 8, 5, 768, 4);
  // --cooperative-reuse, --give-up-first: B as a LayerNorm, whose partials (unlike RMSNorm's) are nonzero words
  // throughout
  Blob b = args.channel_norms ? Blob(channel_norm(NormOp::InstanceNorm, 1, 3, eps_b), 3, 3, 1001, 1)
                              : Blob(row_norm(args.cooperative_reuse || args.give_up_first ? NormOp::LayerNorm : NormOp::RMSNorm, 3003, eps_b),
                                     3, 3, 1001, 1);
  for (Blob* blob : {&a, &b}) {
    blob->x.assign(size_t(blob->c) * blob->cstep1, 0.f);
    for (int q = 0; q < blob->c; ++q)
      for (int i = 0; i < blob->w * blob->h; ++i)
        blob->x[size_t(q) * blob->cstep1 + i] =
            blob == &a ? 1e4f + 1e-2f * normal(rng) : 0.3f + 2.f * normal(rng);
    const int weights = int(blob->p.weight_count());
    for (int i = 0; i < weights; ++i) blob->gamma.push_back(1.f + 0.5f * normal(rng));
    if (vknorm::centres(blob->p.op))
      for (int i = 0; i < weights; ++i) blob->beta.push_back(0.5f * normal(rng));
  }

  // ---- one buffer: a header, blob A, a gap, blob B, a tail; offsets aligned for storage buffers
  const uint64_t align = std::max<uint64_t>(e.props.limits.minStorageBufferOffsetAlignment, 1);
  a.offset = align_up(64, align);
  b.offset = align_up(a.offset + a.span() + 100, align);
  if (args.misalign) {
    if (align < 2) {
      std::printf("minStorageBufferOffsetAlignment is 1: every offset is aligned, nothing to misalign\n");
      return 4;
    }
    b.offset += align / 2;
  }
  const uint64_t total = align_up(b.offset + b.span() + 64, 4);
  std::printf("buffer: one VkBuffer of %llu bytes; blob A at offset %llu (%llu bytes), blob B at offset %llu (%llu bytes)\n",
              (unsigned long long)total, (unsigned long long)a.offset, (unsigned long long)a.span(),
              (unsigned long long)b.offset, (unsigned long long)b.span());

  const uint8_t kSentinel = 0xA5;  // every byte outside the blobs' groups must come back unchanged
  const Engine::Buffer storage = e.buffer(
      total, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
      VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  const Engine::Buffer upload =
      e.buffer(total, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
  const Engine::Buffer readback =
      e.buffer(total, VK_BUFFER_USAGE_TRANSFER_DST_BIT, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
  const VkBuffer storage_buffer = storage.buffer, upload_buffer = upload.buffer, readback_buffer = readback.buffer;
  void* upload_mapped = upload.mapped;
  const unsigned char* out = static_cast<const unsigned char*>(readback.mapped);
  std::vector<unsigned char> image(total, kSentinel);
  std::vector<bool> owned(total, false);  // bytes of the blobs' groups (not the cstep padding)
  for (const Blob* blob : {&a, &b}) {
    std::vector<float> packed(blob->span() / sizeof(float));
    pack(*blob, packed.data());
    for (int q = 0; q < blob->packed_c(); ++q) {
      const uint64_t begin = blob->offset + uint64_t(q) * blob->cstep * 4 * blob->elempack;
      const uint64_t bytes = uint64_t(blob->w) * blob->h * 4 * blob->elempack;
      std::memcpy(&image[begin], reinterpret_cast<const unsigned char*>(packed.data()) + (begin - blob->offset), bytes);
      std::fill(owned.begin() + begin, owned.begin() + begin + bytes, true);
    }
  }
  std::memcpy(upload_mapped, image.data(), total);

  // ---- vknorm's layers on the engine's device
  vknorm::VulkanHandles handles;
  handles.instance = e.instance;
  handles.physical_device = e.physical;
  handles.device = e.device;
  handles.get_instance_proc_addr = args.system_loader ? nullptr : reinterpret_cast<vknorm::VoidFunction>(vkGetInstanceProcAddr);
  handles.api_version = e.api_version;
  handles.fp16_storage_enabled = e.fp16_storage;
  double err_a = 0, err_b = 0, err_b_cpu = 0, err_a_cpu_vs64 = 0, scale_a = 1, scale_b = 1;
  int refusal_failures = 0, timing_failures = 0, sizes_failures = 0;
  size_t changed = 0;
  {
    vknorm::Recorder norm_a(handles, a.p);  // A's norm (LayerNorm, or GroupNorm)
    norm_a.load_model(a.gamma, a.beta);
    vknorm::Recorder norm_b(handles, b.p);  // B's (RMSNorm, a LayerNorm, or InstanceNorm)
    norm_b.load_model(b.gamma, b.beta);

    // ---- ONE command buffer: upload -> barrier -> LayerNorm(A), RMSNorm(B) -> barrier -> copy back
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    auto cai = make<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    cai.commandPool = e.pool;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(e.device, &cai, &cmd), "vkAllocateCommandBuffers");
    auto begin = make<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
    begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    if (args.resubmit) begin.flags = 0;  // submitted twice
    check(vkBeginCommandBuffer(cmd, &begin), "vkBeginCommandBuffer");
    const VkBufferCopy whole{0, 0, total};
    vkCmdCopyBuffer(cmd, upload_buffer, storage_buffer, 1, &whole);
    if (!args.no_barrier)  // the engine's writes before vknorm's dispatches (compute shader, read/write)
      barrier(cmd, storage_buffer, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
              VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    int unexpected = args.refusals && !args.channel_norms
                         ? try_refusals(cmd, handles, storage_buffer, align, e.props.limits.maxStorageBufferRange, norm_a, a)
                     : args.refusals ? try_channel_refusals(cmd, handles, storage_buffer, norm_a, a)
                                     : 0;
    if (args.timing) {
      const vknorm::DeviceInfo& d = norm_a.device_info();
      std::printf("recorder's device: %s, driver %s, timestamps %s\n", d.name.c_str(), d.driver_name.c_str(),
                  d.timestamps ? "yes" : "no");
      norm_a.set_timing(true), norm_b.set_timing(true);
    }
    vknorm::Option split, cooperative;
    split.path = vknorm::Path::Split;
    cooperative.path = vknorm::Path::Cooperative;
    // B's packed channels first, first + stride, ... (n of them) as a blob of its own.
    auto record_b = [&](int first, int n, const vknorm::Option& opt, int stride = 1) {
      const uint64_t at = b.offset + uint64_t(first) * b.cstep * b.elempack * sizeof(float);
      const size_t cstep = b.cstep * size_t(stride);
      return norm_b.record(cmd, {storage_buffer, at, vknorm::blob_span_bytes(3, b.w, b.h, 1, n, cstep, b.elempack, false)},
                        3, b.w, b.h, 1, n, cstep, b.elempack, false, opt);
    };
    auto between_layers = [&] {  // the engine's barrier between two layers, the later reading what the earlier wrote
      barrier(cmd, storage_buffer, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
              VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    };
    // The end of the command buffer; submit and wait (the wall time of both, us)
    auto submit = [&] {
      auto si = make<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
      si.commandBufferCount = 1;
      si.pCommandBuffers = &cmd;
      const auto t0 = std::chrono::steady_clock::now();
      check(vkResetFences(e.device, 1, &e.fence), "vkResetFences");
      check(vkQueueSubmit(e.queue, 1, &si, e.fence), "vkQueueSubmit");
      check(vkWaitForFences(e.device, 1, &e.fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    };
    auto end_and_submit = [&] {
      check(vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
      return submit();
    };
    // vknorm's writes before the engine's copy back, the copy, the end of the command buffer; submit and wait
    auto copy_back_and_submit = [&] {
      barrier(cmd, storage_buffer, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
              VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT);
      vkCmdCopyBuffer(cmd, storage_buffer, readback_buffer, 1, &whole);
      barrier(cmd, readback_buffer, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
              VK_ACCESS_HOST_READ_BIT);
      return end_and_submit();
    };
    if (args.reload) {  // other weights, recorded into a command buffer never submitted; then the real ones
      auto other = [](const std::vector<float>& v) {
        std::vector<float> o(v.size());
        for (size_t i = 0; i < v.size(); ++i) o[i] = 2.f * v[i] + 1.f;
        return o;
      };
      norm_a.load_model(other(a.gamma), other(a.beta));
      norm_b.load_model(other(b.gamma), other(b.beta));
      VkCommandBuffer unused = VK_NULL_HANDLE;
      check(vkAllocateCommandBuffers(e.device, &cai, &unused), "vkAllocateCommandBuffers");
      check(vkBeginCommandBuffer(unused, &begin), "vkBeginCommandBuffer");
      norm_a.record(unused, {storage_buffer, a.offset, a.span()}, 3, a.w, a.h, 1, a.packed_c(), a.cstep, a.elempack, false);
      norm_b.record(unused, {storage_buffer, b.offset, vknorm::blob_span_bytes(3, b.w, b.h, 1, b.packed_c(), b.cstep, b.elempack, false)},
                    3, b.w, b.h, 1, b.packed_c(), b.cstep, b.elempack, false, split);
      check(vkEndCommandBuffer(unused), "vkEndCommandBuffer");
      vkFreeCommandBuffers(e.device, e.pool, 1, &unused);
      // the forwards below, at the same blobs, must read these weights, not the ones recorded above
      norm_a.load_model(a.gamma, a.beta);
      norm_b.load_model(b.gamma, b.beta);
      std::printf("weights reloaded after a record\n");
    }
    if (args.drop_cooperative) {
      const uint64_t span_b = vknorm::blob_span_bytes(3, b.w, b.h, 1, b.packed_c(), b.cstep, b.elempack, false);
      VkCommandBuffer first = VK_NULL_HANDLE, dropped = VK_NULL_HANDLE;
      check(vkAllocateCommandBuffers(e.device, &cai, &first), "vkAllocateCommandBuffers");
      check(vkBeginCommandBuffer(first, &begin), "vkBeginCommandBuffer");
      vkCmdCopyBuffer(first, upload_buffer, storage_buffer, 1, &whole);
      barrier(first, storage_buffer, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
              VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
      norm_b.record(first, {storage_buffer, b.offset, span_b}, 3, b.w, b.h, 1, b.packed_c(), b.cstep, b.elempack, false,
                    split);
      check(vkEndCommandBuffer(first), "vkEndCommandBuffer");
      auto si = make<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
      si.commandBufferCount = 1;
      si.pCommandBuffers = &first;
      check(vkResetFences(e.device, 1, &e.fence), "vkResetFences");
      check(vkQueueSubmit(e.queue, 1, &si, e.fence), "vkQueueSubmit");
      check(vkWaitForFences(e.device, 1, &e.fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
      vkFreeCommandBuffers(e.device, e.pool, 1, &first);
      check(vkAllocateCommandBuffers(e.device, &cai, &dropped), "vkAllocateCommandBuffers");
      check(vkBeginCommandBuffer(dropped, &begin), "vkBeginCommandBuffer");
      norm_b.record(dropped, {storage_buffer, b.offset, span_b}, 3, b.w, b.h, 1, b.packed_c(), b.cstep, b.elempack, false,
                    cooperative);
      check(vkEndCommandBuffer(dropped), "vkEndCommandBuffer");
      vkFreeCommandBuffers(e.device, e.pool, 1, &dropped);
      norm_b.load_model(b.gamma, b.beta);  // the dropped frame's remedy
      std::printf("a cooperative forward dropped after a split one\n");
    }
    vknorm::DispatchInfo da, db;
    Engine::Buffer gave_up;  // --give-up-first: what the forward whose waits gave up wrote
    for (int r = 0; r < args.repeat; ++r) {
      if (r > 0) between_layers();  // the next forwards read what these wrote
      da = norm_a.record(cmd, {storage_buffer, a.offset, a.span()}, 3, a.w, a.h, 1, a.packed_c(), a.cstep, a.elempack, false);
      if (args.skip_rmsnorm) continue;
      if (args.cooperative_reuse && args.channel_norms) {  // a channel norm takes all its channels every time
        record_b(0, b.packed_c(), cooperative);
        between_layers();  // the second forward reads what the first wrote
        if (args.split_between) {  // its partials in the Recorder's scratch, where the counters were
          record_b(0, b.packed_c(), split);
          between_layers();
        }
        db = record_b(0, b.packed_c(), cooperative);
      } else if (args.cooperative_reuse) {
        record_b(0, b.packed_c() - 1, cooperative);
        db = record_b(b.packed_c() - 1, 1, cooperative);
      } else if (args.give_up_first) {
        {
          const ScopedEnv give_up("VKNORM_TUNE_WAIT_ROUNDS", "0");
          record_b(0, b.packed_c(), cooperative);
        }
        // what that forward wrote, copied aside; then the engine writes B's input again over it
        barrier(cmd, storage_buffer, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
        gave_up = e.buffer(b.span(), VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                           VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
        const VkBufferCopy aside{b.offset, 0, b.span()};
        vkCmdCopyBuffer(cmd, storage_buffer, gave_up.buffer, 1, &aside);
        barrier(cmd, gave_up.buffer, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
        barrier(cmd, storage_buffer, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT,
                VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT);
        const VkBufferCopy blob_b{b.offset, b.offset, b.span()};
        vkCmdCopyBuffer(cmd, upload_buffer, storage_buffer, 1, &blob_b);
        barrier(cmd, storage_buffer, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
        db = record_b(0, b.packed_c(), cooperative);
      } else {
        db = record_b(0, b.packed_c(), args.drop_cooperative ? cooperative : split);
      }
    }
    std::printf("descriptor sets cached: %s %zu, %s%s %zu\n", vknorm::op_name(a.p.op), norm_a.cached_descriptor_sets(),
                vknorm::op_name(b.p.op), b.p.op == a.p.op ? " (B)" : "", norm_b.cached_descriptor_sets());
    const double wall_us = copy_back_and_submit();
    // --resubmit: all of it once more (the engine's upload of the inputs included, so the outputs come out the same),
    // the weights' copy rewriting what the first submission's forwards read
    if (args.resubmit) submit(), std::printf("command buffer submitted again\n");
    if (gave_up.mapped) {  // B pack1: channel planes cstep apart
      const float* y = static_cast<const float*>(gave_up.mapped);
      size_t nan = 0, n = 0;
      for (int q = 0; q < b.c; ++q)
        for (int i = 0; i < b.w * b.h; ++i, ++n) nan += std::isnan(y[size_t(q) * b.cstep + i]);
      std::printf("B after the forward whose waits gave up: %zu of %zu values NaN\n", nan, n);
    }
    if (args.timing) {
      auto print = [](const char* what, const std::vector<double>& t) {
        std::printf("gpu time %s (us):", what);
        for (double v : t) std::printf(" %.3f", v);
        std::printf("\n");
      };
      print("A", norm_a.gpu_times_us());
      print("B", norm_b.gpu_times_us());
      print("A again", norm_a.gpu_times_us());  // read once: nothing is left
      std::printf("submission wall time (us): %.3f\n", wall_us);
    }
    norm_a.release_descriptors();  // the command buffer completed
    norm_b.release_descriptors();
    vkFreeCommandBuffers(e.device, e.pool, 1, &cmd);
    if (args.rebind && !args.skip_rmsnorm) {  // the second frame: B's bytes at other shapes
      check(vkAllocateCommandBuffers(e.device, &cai, &cmd), "vkAllocateCommandBuffers");
      check(vkBeginCommandBuffer(cmd, &begin), "vkBeginCommandBuffer");
      record_b(0, 2, split, /*stride=*/2);
      between_layers();
      db = record_b(0, 3, split);
      between_layers();
      record_b(1, 1, split);
      std::printf("descriptor sets cached in the second frame: %s %zu\n", vknorm::op_name(b.p.op), norm_b.cached_descriptor_sets());
      copy_back_and_submit();
      norm_b.release_descriptors();
      vkFreeCommandBuffers(e.device, e.pool, 1, &cmd);
    }
    if (args.sizes) {  // another frame: B's Recorder over inputs of N sizes, each a blob of its own in one buffer
      std::vector<Blob> blobs;
      const size_t pipelines_before = norm_b.pipelines();
      uint64_t bytes = 0;
      for (int k = 0; k < args.sizes; ++k) {
        Blob& r = blobs.emplace_back(b.p, b.c, 1, 100 + k, 1);  // c=3 h=1 w=100+k, pack1: group size w
        r.gamma = b.gamma, r.beta = b.beta, r.offset = bytes;
        r.x.assign(size_t(r.c) * r.cstep1, 0.f);
        for (int q = 0; q < r.c; ++q)
          for (int i = 0; i < r.w; ++i) r.x[size_t(q) * r.cstep1 + i] = float(q) + std::sin(0.37f * float(i));
        bytes = align_up(bytes + r.span(), align);
      }
      Engine::Buffer many = e.buffer(bytes, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                                     VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
      auto at = [&](const Blob& r) { return static_cast<float*>(many.mapped) + r.offset / sizeof(float); };
      for (const Blob& r : blobs) pack(r, at(r));
      check(vkAllocateCommandBuffers(e.device, &cai, &cmd), "vkAllocateCommandBuffers");
      check(vkBeginCommandBuffer(cmd, &begin), "vkBeginCommandBuffer");
      barrier(cmd, many.buffer, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
              VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
      for (const Blob& r : blobs)
        norm_b.record(cmd, {many.buffer, r.offset, r.span()}, 3, r.w, r.h, 1, r.packed_c(), r.cstep, r.elempack, false);
      barrier(cmd, many.buffer, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
              VK_ACCESS_HOST_READ_BIT);
      end_and_submit();
      if (args.timing) (void)norm_b.gpu_times_us();  // this frame's times: not the ones --timing prints
      double worst = 0;  // in units of the tolerance
      for (const Blob& r : blobs) {
        const std::vector<double> ref = reference64(r, 1);
        worst = std::max(worst, max_abs_err(r, unpack(r, at(r)), ref) / (kUlps * FLT_EPSILON * scale_of(r, ref)));
      }
      std::printf("sizes: %s over %d group sizes (w = 100..%d): %zu pipelines kept (%zu before); max error %.3f of the "
                  "bound\n", vknorm::op_name(b.p.op), args.sizes, 99 + args.sizes, norm_b.pipelines(), pipelines_before, worst);
      if (!(worst <= 1)) sizes_failures = 1;
      norm_b.release_descriptors();
      vkFreeCommandBuffers(e.device, e.pool, 1, &cmd);
    }
    if (args.timing && !args.skip_rmsnorm) {  // a second submission, timed on the pairs the read freed
      check(vkAllocateCommandBuffers(e.device, &cai, &cmd), "vkAllocateCommandBuffers");
      check(vkBeginCommandBuffer(cmd, &begin), "vkBeginCommandBuffer");
      record_b(0, b.packed_c(), split);
      copy_back_and_submit();
      const std::vector<double> t = norm_b.gpu_times_us();
      std::printf("gpu time B, second submission (us):");
      for (double v : t) std::printf(" %.3f", v);
      std::printf("\n");
      if (t.size() != 1 || !(t[0] > 0)) timing_failures = 1;
      norm_b.release_descriptors();
      vkFreeCommandBuffers(e.device, e.pool, 1, &cmd);
    }

    std::printf("A %s dims=3 c=%d h=%d w=%d float32 pack%d, x = 1e4 + N(0, 1e-2): path %s (%s reductions), %d dispatch(es) x %d\n",
                vknorm::op_name(a.p.op), a.c, a.h, a.w, a.elempack, vknorm::path_name(da.path),
                da.subgroup ? "subgroup" : "shared-memory", da.dispatches, args.repeat);
    std::printf("pieces: A %d, B %d\n", da.pieces, args.skip_rmsnorm ? 0 : db.pieces);
    if (args.skip_rmsnorm) std::printf("B %s: not recorded (--skip-rmsnorm)\n", vknorm::op_name(b.p.op));
    else
      std::printf("B %s dims=3 c=%d h=%d w=%d float32 pack%d (cstep %zu), Option::path %s: path %s, %d dispatch(es) x %d\n",
                  vknorm::op_name(b.p.op), b.c, b.h, b.w, b.elempack, b.cstep,
                  args.split_between     ? "cooperative, split, cooperative"
                  : args.cooperative_reuse ? "cooperative (2 forwards)"
                  : args.give_up_first   ? "cooperative (after a forward that gave up)"
                  : args.drop_cooperative ? "cooperative (after a dropped one)"
                  : args.rebind          ? "split (2 frames)"
                                         : "split",
                  vknorm::path_name(db.path), db.dispatches, args.repeat);

    // ---- check
    std::vector<float> ya = unpack(a, reinterpret_cast<const float*>(out + a.offset));
    const std::vector<float> yb = unpack(b, reinterpret_cast<const float*>(out + b.offset));
    if (args.corrupt) ya[size_t(a.w) * 2 + 17] += 0.5f;
    // forwards of each of B's channels
    const int times_b = args.repeat * (args.cooperative_reuse && args.channel_norms ? 2 + args.split_between : 1) +
                        (args.rebind ? 2 : 0) +
                        (args.timing ? 1 : 0);
    const std::vector<double> ra = reference64(a, args.repeat), rb = reference64(b, times_b);
    scale_a = scale_of(a, ra), scale_b = scale_of(b, rb);
    err_a = max_abs_err(a, ya, ra);
    err_b = max_abs_err(b, yb, rb);
    err_b_cpu = max_abs_err(b, yb, reference_cpu(b, times_b));
    err_a_cpu_vs64 = max_abs_err(a, reference_cpu(a, args.repeat), ra);
    if (unexpected) std::printf("refusals: %d call(s) were not refused as expected\n", unexpected);
    refusal_failures = unexpected;
    for (uint64_t i = 0; i < total; ++i) changed += !owned[i] && out[i] != kSentinel;
  }
  const double ulp = kUlps * FLT_EPSILON;
  const double bound_a = ulp * scale_a, bound_b = ulp * scale_b;
  std::printf("A max abs error %.3e vs float64, bound %.3e = %g float32 ulps (2^-23) x max(1, max|y|) %.4g\n", err_a, bound_a,
              kUlps, scale_a);
  std::printf("A (information) vknorm::reference_forward, ncnn's float32 algorithm, vs float64: %.3e\n", err_a_cpu_vs64);
  std::printf("B max abs error %.3e vs float64, bound %.3e = %g float32 ulps (2^-23) x max(1, max|y|) %.4g\n", err_b, bound_b,
              kUlps, scale_b);
  std::printf("B max abs error %.3e vs CPU reference, bound %.3e = %g float32 ulps (2^-23) x max(1, max|y|) %.4g\n", err_b_cpu,
              bound_b, kUlps, scale_b);
  std::printf("bytes outside the blobs' groups changed: %zu\n", changed);
  const bool ok = err_a <= bound_a && err_b <= bound_b && err_b_cpu <= bound_b && changed == 0 && refusal_failures == 0 &&
                  timing_failures == 0 && sizes_failures == 0;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines in order with stderr's when both go to one pipe
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--channel-norms") args.channel_norms = true;
    else if (s == "--misalign") args.misalign = true;
    else if (s == "--skip-rmsnorm") args.skip_rmsnorm = true;
    else if (s == "--corrupt") args.corrupt = true;
    else if (s == "--no-barrier") args.no_barrier = true;
    else if (s == "--system-loader") args.system_loader = true;
    else if (s == "--refusals") args.refusals = true;
    else if (s == "--timing") args.timing = true;
    else if (s == "--cooperative-reuse") args.cooperative_reuse = true;
    else if (s == "--rebind") args.rebind = true;
    else if (s == "--reload") args.reload = true;
    else if (s == "--give-up-first") args.give_up_first = true;
    else if (s == "--resubmit") args.resubmit = true;
    else if (s == "--split-between") args.split_between = true;
    else if (s == "--drop-cooperative") args.drop_cooperative = true;
    else if (s == "--repeat" && i + 1 < argc && std::atoi(argv[i + 1]) >= 1) args.repeat = std::atoi(argv[++i]);
    else if (s == "--sizes" && i + 1 < argc && std::atoi(argv[i + 1]) >= 1 && std::atoi(argv[i + 1]) <= 1000)
      args.sizes = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "engine_example: unknown argument %s\nusage: engine_example [--channel-norms] [--misalign] "
                           "[--skip-rmsnorm] [--corrupt] [--no-barrier] [--system-loader] [--refusals] [--timing] "
                           "[--repeat N] [--cooperative-reuse] [--rebind] [--reload] [--give-up-first] [--sizes N] "
                           "[--resubmit] [--split-between] [--drop-cooperative]\n",
                   s.c_str());
      return 2;
    }
  }
  if (args.give_up_first && (args.cooperative_reuse || args.rebind || args.repeat > 1)) {
    std::fprintf(stderr, "engine_example: --give-up-first records all of B after one forward: not with --cooperative-reuse, "
                         "--rebind or --repeat\n");
    return 2;
  }
  if (args.split_between && !(args.channel_norms && args.cooperative_reuse)) {
    std::fprintf(stderr, "engine_example: --split-between records B split between its cooperative forwards: with "
                         "--channel-norms --cooperative-reuse\n");
    return 2;
  }
  if (args.drop_cooperative && !(args.channel_norms && !args.cooperative_reuse && !args.give_up_first)) {
    std::fprintf(stderr, "engine_example: --drop-cooperative records B's InstanceNorm: with --channel-norms, not with "
                         "--cooperative-reuse or --give-up-first\n");
    return 2;
  }
  if (args.sizes && !args.channel_norms) {
    std::fprintf(stderr, "engine_example: --sizes records B's InstanceNorm (its group size is its channel's plane): "
                         "with --channel-norms\n");
    return 2;
  }
  if (args.channel_norms && args.rebind) {
    std::fprintf(stderr, "engine_example: --rebind records parts of B's channels, which a channel norm cannot take\n");
    return 2;
  }
  int rc;
  try {
    rc = run(args);  // the engine and vknorm's objects are gone when it returns: teardown is validated too
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "engine_example: vknorm refused an input: %s\n", e.what());
    rc = 2;
  } catch (const vknorm::VulkanUnavailable& e) {
    std::fprintf(stderr, "engine_example: %s\n", e.what());
    rc = 3;
  } catch (const NoVulkanDevice& e) {
    std::fprintf(stderr, "engine_example: %s\n", e.what());
    rc = 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_example: %s\n", e.what());
    rc = 1;
  }
  {
    std::lock_guard<std::mutex> lock(g_messages_mutex);
    std::printf("validation messages: %zu\n", g_messages.size());
    for (const auto& m : g_messages) std::printf("  %s\n", m.c_str());
    if (!g_messages.empty() && rc == 0) rc = 1;
  }
  std::printf("%s\n", rc == 0 ? "OK" : "FAIL");
  return rc;
}

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "device_names.h"
#include "vk.h"

namespace vknorm {
namespace {

const char* kInstallHint =
    "no Vulkan device found: install a Vulkan driver (on Debian: apt-get install libvulkan1 "
    "mesa-vulkan-drivers for the CPU driver lavapipe, or your GPU vendor's driver)";

std::mutex g_validation_mutex;
std::vector<std::string> g_validation_messages;

// The loader's notice that an environment variable added a layer (VK_INSTANCE_LAYERS,
// VK_LOADER_LAYERS_ENABLE: how a test watches an instance it does not create, ncnn's) is no finding.
bool layer_from_environment_notice(VkDebugUtilsMessageTypeFlagsEXT type, const VkDebugUtilsMessengerCallbackDataEXT* data) {
  return type == VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT && data && data->pMessage &&
         data->pMessageIdName && std::strcmp(data->pMessageIdName, "Loader Message") == 0 &&
         std::strstr(data->pMessage, "env var '") && std::strstr(data->pMessage, "ayer");
}

VKAPI_ATTR VkBool32 VKAPI_CALL on_validation_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                     VkDebugUtilsMessageTypeFlagsEXT type,
                                                     const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
  if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT && !layer_from_environment_notice(type, data)) {
    std::lock_guard<std::mutex> lock(g_validation_mutex);
    g_validation_messages.emplace_back(data->pMessage ? data->pMessage : "(no message)");
    // VKNORM_VALIDATION_PRINT=1: also to stderr as it happens, so that messages from the device's and
    // the instance's destruction (leaked objects), possibly at process exit, are seen too.
    // (Inside the driver's call nothing may throw: a value env_flag refuses reads as off here, and the instance's
    // creation has refused it already.)
    bool print = false;
    try {
      print = env_flag("VKNORM_VALIDATION_PRINT");
    } catch (const std::invalid_argument&) {
    }
    if (print) std::fprintf(stderr, "vknorm: validation: %s\n", g_validation_messages.back().c_str()), std::fflush(stderr);
  }
  return VK_FALSE;
}

bool has_layer(const vk::raii::Context& ctx, const char* name) {
  for (const auto& l : ctx.enumerateInstanceLayerProperties())
    if (std::strcmp(l.layerName, name) == 0) return true;
  return false;
}

int type_rank(const std::string& t) {  // lower is preferred
  if (t == "discrete") return 0;
  if (t == "integrated") return 1;
  if (t == "virtual") return 2;
  if (t == "cpu") return 3;
  return 4;
}

uint32_t compute_queue_family(const vk::raii::PhysicalDevice& pd) {
  auto families = pd.getQueueFamilyProperties();
  // Prefer a compute-only family (async compute); any compute family will do.
  for (uint32_t i = 0; i < families.size(); ++i)
    if ((families[i].queueFlags & vk::QueueFlagBits::eCompute) && !(families[i].queueFlags & vk::QueueFlagBits::eGraphics))
      return i;
  for (uint32_t i = 0; i < families.size(); ++i)
    if (families[i].queueFlags & vk::QueueFlagBits::eCompute) return i;
  return UINT32_MAX;
}

DeviceInfo describe(const Instance& inst, const vk::raii::PhysicalDevice& pd, int index) {
  DeviceInfo info;
  info.index = index;
  const auto props = pd.getProperties();
  const uint32_t api = std::min(props.apiVersion, inst.api_version);
  read_properties(props, info);
  // The version vknorm uses: the device's, unless the instance is capped below its minor version
  // (VKNORM_VULKAN_API, or an older loader).
  info.api_version = VK_API_VERSION_MINOR(api) < VK_API_VERSION_MINOR(props.apiVersion) ||
                             VK_API_VERSION_MAJOR(api) < VK_API_VERSION_MAJOR(props.apiVersion)
                         ? version_string(api)
                         : version_string(props.apiVersion);
  const uint32_t qf = compute_queue_family(pd);
  info.timestamps = qf != UINT32_MAX && pd.getQueueFamilyProperties()[qf].timestampValidBits > 0;
  info.device_local_bytes = device_local_bytes(pd.getMemoryProperties());

  if (api >= VK_API_VERSION_1_1) {
    auto chain = pd.getProperties2<vk::PhysicalDeviceProperties2, vk::PhysicalDeviceSubgroupProperties>();
    const auto& sg = chain.get<vk::PhysicalDeviceSubgroupProperties>();
    read_subgroup(sg, info);
    auto feats = pd.getFeatures2<vk::PhysicalDeviceFeatures2, vk::PhysicalDevice16BitStorageFeatures>();
    info.storage_16bit = feats.get<vk::PhysicalDevice16BitStorageFeatures>().storageBuffer16BitAccess;
    info.compute_units = multiprocessor_count<vk::PhysicalDeviceProperties2, vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV>(pd);
  }  // 16-bit storage shaders target Vulkan 1.1 (cmake/shaders.cmake): a 1.0 device stores float32
  if (api >= VK_API_VERSION_1_2) {
    auto chain = pd.getProperties2<vk::PhysicalDeviceProperties2, vk::PhysicalDeviceDriverProperties>();
    const auto& drv = chain.get<vk::PhysicalDeviceDriverProperties>();
    info.driver_name = drv.driverName.data();
    info.driver_info = drv.driverInfo.data();
    auto feats = pd.getFeatures2<vk::PhysicalDeviceFeatures2, vk::PhysicalDeviceShaderFloat16Int8Features>();
    info.float16_arithmetic = feats.get<vk::PhysicalDeviceShaderFloat16Int8Features>().shaderFloat16;
  }
  apply_capability_profile(info);  // VKNORM_NO_SUBGROUP, ...: what is reported is what is planned for
  return info;
}

uint32_t find_memory_type(const vk::PhysicalDeviceMemoryProperties& mp, uint32_t allowed,
                          std::initializer_list<vk::MemoryPropertyFlags> preferences) {
  for (auto want : preferences)
    for (uint32_t i = 0; i < mp.memoryTypeCount; ++i)
      if ((allowed & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want) return i;
  throw std::runtime_error("no suitable Vulkan memory type");
}

}  // namespace

bool Instance::in_creating_process() const { return long(getpid()) == pid; }

namespace {
// Set by an exit handler registered once the first device exists, so that it runs before the teardown of what
// the driver and layers registered up to then (handlers run in reverse order): an object destroyed after it, a
// static made before the first Vulkan call, finds them gone.
std::atomic<bool> g_exit_passed_driver{false};
}  // namespace

bool Instance::destroys_handles() const { return in_creating_process() && !g_exit_passed_driver; }

namespace {
void leave_with_status(int status, void*) {
  std::fflush(nullptr);
  _exit(status);
}
}  // namespace

void arm_forked_child_exit() {
#ifdef __GLIBC__
  // Registered in the child, at the fork: the last exit handler registered, so the first to run (the driver's
  // register when it loads, or as late as device creation). A fork while another thread registers an exit
  // handler could leave glibc's lock for them taken in the child; libraries register theirs as they load.
  static const bool armed = pthread_atfork(nullptr, nullptr, [] { (void)on_exit(leave_with_status, nullptr); }) == 0;
  (void)armed;
#endif
}

void Instance::check_same_process() const {
  if (!in_creating_process())
    throw std::runtime_error(
        "vknorm: this process was fork()ed from one that had already used Vulkan, whose devices do not survive "
        "fork(): start workers with multiprocessing's 'spawn' or 'forkserver' method, or use vknorm only after "
        "the fork");
}

std::shared_ptr<Instance> Instance::get() {
  static std::mutex m;
  static std::weak_ptr<Instance> current;
  std::lock_guard<std::mutex> lock(m);
  if (auto p = current.lock()) {
    p->check_same_process();
    return p;
  }
  // Pin the loader for the life of the process: unloading it at exit, while a GPU driver's threads
  // still run, crashed the process on NVIDIA's driver.
  // Android ships libvulkan.so only (no .1); the desktop loader package has both.
  static void* pinned = [] {
    void* h = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_NODELETE);
    return h ? h : dlopen("libvulkan.so", RTLD_NOW | RTLD_NODELETE);
  }();
  (void)pinned;
  auto inst = std::make_shared<Instance>();  // vk::raii::Context dlopens libvulkan.so, else libvulkan.so.1
  inst->pid = long(getpid());
  arm_forked_child_exit();  // its children leave before the driver's exit handlers
  try {
    (void)inst->context.enumerateInstanceExtensionProperties();
  } catch (const std::exception&) {
    throw VulkanUnavailable(kInstallHint);
  }
  // A Vulkan 1.0 loader (Android before API 28) has no vkEnumerateInstanceVersion.
  const uint32_t loader_version = inst->context.getDispatcher()->vkEnumerateInstanceVersion
                                      ? inst->context.enumerateInstanceVersion()
                                      : VK_API_VERSION_1_0;
  inst->api_version = std::min<uint32_t>(loader_version, env_api_cap());
  vk::ApplicationInfo app{.pApplicationName = "vknorm", .applicationVersion = 1, .pEngineName = "vknorm",
                          .engineVersion = 1, .apiVersion = inst->api_version};
  std::vector<const char*> layers, extensions;
  inst->validation = env_flag("VKNORM_VALIDATION");
  env_flag("VKNORM_VALIDATION_PRINT");  // refused here: the messenger that reads it cannot throw
  if (inst->validation) {
    if (!has_layer(inst->context, "VK_LAYER_KHRONOS_validation"))
      throw VulkanUnavailable("VKNORM_VALIDATION is set but VK_LAYER_KHRONOS_validation is missing: "
                              "apt-get install vulkan-validationlayers");
    layers.push_back("VK_LAYER_KHRONOS_validation");
    extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
  }
  // The messenger; also chained into vkCreateInstance so that vkCreateInstance / vkDestroyInstance
  // (objects still alive when the instance goes) report to it.
  const vk::DebugUtilsMessengerCreateInfoEXT mi{
      .messageSeverity = vk::DebugUtilsMessageSeverityFlagBitsEXT::eWarning | vk::DebugUtilsMessageSeverityFlagBitsEXT::eError,
      .messageType = vk::DebugUtilsMessageTypeFlagBitsEXT::eGeneral | vk::DebugUtilsMessageTypeFlagBitsEXT::eValidation |
                     vk::DebugUtilsMessageTypeFlagBitsEXT::ePerformance,
      .pfnUserCallback = on_validation_message};
  // Synchronization validation on top of the core checks.
  const vk::ValidationFeatureEnableEXT enables[] = {vk::ValidationFeatureEnableEXT::eSynchronizationValidation};
  vk::ValidationFeaturesEXT features{.pNext = &mi, .enabledValidationFeatureCount = 1, .pEnabledValidationFeatures = enables};
  vk::InstanceCreateInfo ci{.pNext = inst->validation ? &features : nullptr,
                            .pApplicationInfo = &app,
                            .enabledLayerCount = uint32_t(layers.size()),
                            .ppEnabledLayerNames = layers.data(),
                            .enabledExtensionCount = uint32_t(extensions.size()),
                            .ppEnabledExtensionNames = extensions.data()};
  try {
    inst->instance = vk::raii::Instance(inst->context, ci);
  } catch (const vk::SystemError& e) {
    throw VulkanUnavailable(std::string(kInstallHint) + " (" + e.what() + ")");  // what(): "vkCreateInstance: ..."
  }
  if (inst->validation) inst->messenger.emplace(inst->instance, mi);
  current = inst;
  return inst;
}

std::vector<DeviceInfo> enumerate_devices() {
  auto inst = Instance::get();
  std::vector<DeviceInfo> out;
  int i = 0;
  for (const auto& pd : inst->instance.enumeratePhysicalDevices()) out.push_back(describe(*inst, pd, i++));
  return out;
}

int default_device_index() {
  auto devices = enumerate_devices();
  if (devices.empty()) throw VulkanUnavailable(kInstallHint);
  // Surrounding white space ignored, on either side alike (strtol alone skipped it before an index only).
  std::string want = std::getenv("VKNORM_DEVICE") ? std::getenv("VKNORM_DEVICE") : "";
  want.erase(0, want.find_first_not_of(" \t\n\r\f\v"));
  want.erase(want.find_last_not_of(" \t\n\r\f\v") + 1);
  if (!want.empty()) {
    char* end = nullptr;
    const long idx = std::strtol(want.c_str(), &end, 10);
    if (*end == '\0') {
      if (idx < 0 || idx >= long(devices.size()))
        throw std::invalid_argument("VKNORM_DEVICE=" + want + ": expected a device index 0 to " +
                                    std::to_string(devices.size() - 1) + " or part of a device's name (vknorm info lists them)");
      return int(idx);
    }
    auto lower = [](std::string text) {
      for (char& ch : text) ch = char(std::tolower(static_cast<unsigned char>(ch)));
      return text;
    };
    const std::string needle = lower(want);
    for (const auto& d : devices)
      if (lower(d.name).find(needle) != std::string::npos) return d.index;
    throw std::invalid_argument("VKNORM_DEVICE=" + want + " matches no device (vknorm info lists them)");
  }
  auto best = std::min_element(devices.begin(), devices.end(), [](const DeviceInfo& a, const DeviceInfo& b) {
    return type_rank(a.type) < type_rank(b.type);
  });
  return best->index;
}

Context::Context(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Context::~Context() {
  // In a fork()ed child the device's handles are the parent's: destroying them waits on driver threads the
  // child does not have (a hang at its exit). The child leaves them to the process's end instead, and so does a
  // process whose exit has passed the driver's teardown (a context held by a static made before any Vulkan call:
  // destroying it then crashed in the validation layer).
  // The instance it holds stays too (its destruction waits as well). Kept in a list that is never destroyed, so
  // that leak checkers see it as reachable.
  if (impl_ && impl_->instance && !impl_->instance->destroys_handles()) {
    static auto* kept = new std::vector<Impl*>;
    static auto* kept_mutex = new std::mutex;
    std::lock_guard<std::mutex> lock(*kept_mutex);
    kept->push_back(impl_.release());
  }
}

std::shared_ptr<Context> Context::create(int index) {
  if (index < -1)  // -1 alone means the default device; a bad argument is one wherever Vulkan is
    throw std::invalid_argument("device index " + std::to_string(index) +
                                ": a device index >= 0, or -1 for the default");
  auto impl = std::make_unique<Impl>();
  impl->instance = Instance::get();
  auto physical = impl->instance->instance.enumeratePhysicalDevices();
  if (physical.empty()) throw VulkanUnavailable(kInstallHint);
  if (index < 0) index = default_device_index();
  if (index >= int(physical.size()))
    throw std::invalid_argument("device index " + std::to_string(index) + " out of range (" +
                                std::to_string(physical.size()) + " devices)");
  impl->physical = std::move(physical[index]);
  impl->info = describe(*impl->instance, impl->physical, index);
  const auto& pd = impl->physical;
  const uint32_t api = std::min(pd.getProperties().apiVersion, impl->instance->api_version);

  impl->queue_family = compute_queue_family(pd);
  if (impl->queue_family == UINT32_MAX) throw VulkanUnavailable("device " + impl->info.name + " has no compute queue");
  impl->timestamp_bits = pd.getQueueFamilyProperties()[impl->queue_family].timestampValidBits;

  const float priority = 1.0f;
  vk::DeviceQueueCreateInfo qci{.queueFamilyIndex = impl->queue_family, .queueCount = 1, .pQueuePriorities = &priority};
  std::vector<const char*> extensions;
  void* features = nullptr;  // the pNext chain of enabled feature structs
  vk::PhysicalDevice16BitStorageFeatures storage16{};
  const bool want16 = impl->info.storage_16bit;  // after the capability profile (describe)
  if (want16) storage16.storageBuffer16BitAccess = VK_TRUE, storage16.pNext = features, features = &storage16;
  // VKNORM_SUBGROUP_SIZE=N: subgroup pipelines require subgroups of N invocations, where the device
  // lets a compute shader choose (subgroupSizeControl, Vulkan 1.3 or VK_EXT_subgroup_size_control).
  vk::PhysicalDeviceSubgroupSizeControlFeatures size_control{};
  if (const uint64_t want = env_subgroup_size()) {
    const std::string what = "VKNORM_SUBGROUP_SIZE=" + std::to_string(want) + " on " + impl->info.name + ": ";
    bool ext = false;
    for (const auto& e : pd.enumerateDeviceExtensionProperties())
      ext = ext || std::strcmp(e.extensionName, VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME) == 0;
    if (api < VK_API_VERSION_1_1 || (api < VK_API_VERSION_1_3 && !ext))
      throw std::invalid_argument(what + "the device cannot choose its subgroup size (needs Vulkan 1.3 or "
                                  "VK_EXT_subgroup_size_control)");
    const auto props = pd.getProperties2<vk::PhysicalDeviceProperties2, vk::PhysicalDeviceSubgroupSizeControlProperties>()
                           .get<vk::PhysicalDeviceSubgroupSizeControlProperties>();
    const bool feature = pd.getFeatures2<vk::PhysicalDeviceFeatures2, vk::PhysicalDeviceSubgroupSizeControlFeatures>()
                             .get<vk::PhysicalDeviceSubgroupSizeControlFeatures>()
                             .subgroupSizeControl;
    if (!feature || !(props.requiredSubgroupSizeStages & vk::ShaderStageFlagBits::eCompute))
      throw std::invalid_argument(what + "the device cannot require a subgroup size in compute shaders");
    if (want < props.minSubgroupSize || want > props.maxSubgroupSize || (want & (want - 1)))
      throw std::invalid_argument(what + "the device runs compute subgroups of " + std::to_string(props.minSubgroupSize) +
                                  " to " + std::to_string(props.maxSubgroupSize) +
                                  " invocations (a power of two; VkPhysicalDeviceSubgroupSizeControlProperties)");
    if (api < VK_API_VERSION_1_3) extensions.push_back(VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
    size_control.subgroupSizeControl = VK_TRUE, size_control.pNext = features, features = &size_control;
    impl->required_subgroup_size = uint32_t(want);
    impl->info.subgroup_size = uint32_t(want);  // what the dispatcher plans for
    // A workgroup of a required subgroup size holds at most maxComputeWorkgroupSubgroups of them (Intel: 8 x 32
    // would allow 256 of 1024 invocations): the dispatcher plans no wider.
    if (props.maxComputeWorkgroupSubgroups)
      impl->info.max_workgroup_invocations =
          uint32_t(std::min<uint64_t>(impl->info.max_workgroup_invocations, want * props.maxComputeWorkgroupSubgroups));
  }
  // VKNORM_PIPELINE_STATS=1: the driver's statistics of every pipeline vknorm builds (registers,
  // spills, ...) on stderr, where the device offers VK_KHR_pipeline_executable_properties. A profiling
  // aid for kernel work; nothing else changes.
  vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR executable_props{};
  if (env_flag("VKNORM_PIPELINE_STATS")) {
    for (const auto& e : pd.enumerateDeviceExtensionProperties())
      if (std::strcmp(e.extensionName, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME) == 0) {
        extensions.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
        executable_props.pipelineExecutableInfo = VK_TRUE, executable_props.pNext = features, features = &executable_props;
        impl->pipeline_stats = true;
      }
    if (!impl->pipeline_stats)
      std::fprintf(stderr, "vknorm: VKNORM_PIPELINE_STATS: %s has no VK_KHR_pipeline_executable_properties\n",
                   impl->info.name.c_str());
  }
  vk::DeviceCreateInfo dci{.pNext = features,
                           .queueCreateInfoCount = 1,
                           .pQueueCreateInfos = &qci,
                           .enabledExtensionCount = uint32_t(extensions.size()),
                           .ppEnabledExtensionNames = extensions.data()};
  impl->device = vk::raii::Device(pd, dci);
  static const bool exit_marked = (std::atexit([] { g_exit_passed_driver = true; }), true);
  (void)exit_marked;
  impl->queue = impl->device.getQueue(impl->queue_family, 0);
  impl->fp16_storage = want16;
  const auto& ops = impl->info.subgroup_ops;
  auto has_op = [&](const char* n) { return std::find(ops.begin(), ops.end(), n) != ops.end(); };
  impl->subgroup_reduce = api >= VK_API_VERSION_1_1 && impl->info.subgroup_compute && has_op("arithmetic") &&
                          has_op("shuffle");

  const auto mp = pd.getMemoryProperties();
  using M = vk::MemoryPropertyFlagBits;
  // The types a buffer of vknorm's one usage may live in (the same for every such buffer, whatever its size):
  // a driver need not allow every type of the wanted properties.
  using U = vk::BufferUsageFlagBits;
  const uint32_t allowed = vk::raii::Buffer(impl->device, vk::BufferCreateInfo{
                                                              .size = 16,
                                                              .usage = U::eStorageBuffer | U::eTransferSrc | U::eTransferDst,
                                                              .sharingMode = vk::SharingMode::eExclusive})
                               .getMemoryRequirements()
                               .memoryTypeBits;
  impl->device_memory_type = find_memory_type(mp, allowed, {M::eDeviceLocal, {}});
  impl->staging_memory_type = find_memory_type(mp, allowed, {M::eHostVisible | M::eHostCoherent | M::eHostCached,
                                                             M::eHostVisible | M::eHostCoherent});
  if (impl->info.type == "cpu" || impl->info.type == "integrated") {
    // Unified memory: the device buffer itself is mapped and no staging copy is recorded.
    const auto unified = M::eDeviceLocal | M::eHostVisible | M::eHostCoherent;
    for (uint32_t i = 0; i < mp.memoryTypeCount; ++i)
      if ((allowed & (1u << i)) && (mp.memoryTypes[i].propertyFlags & unified) == unified) {
        impl->device_memory_type = i;
        impl->direct_host_access = true;
        break;
      }
  }
  auto cached = [&](uint32_t type) { return bool(mp.memoryTypes[type].propertyFlags & M::eHostCached); };
  // VKNORM_TUNE_UNCACHED_MAPPING=1: read results as from uncached memory (copied out first) whatever the device
  // maps, so that path runs where no device needs it (tests on lavapipe).
  const bool uncached = env_flag("VKNORM_TUNE_UNCACHED_MAPPING");
  impl->device_memory_cached = !uncached && cached(impl->device_memory_type);
  impl->staging_memory_cached = !uncached && cached(impl->staging_memory_type);
  impl->max_device_bytes = env_max_device_bytes();
  impl->cache_limit = env_buffer_cache_bytes().value_or(kBufferCacheBytes);
  impl->pipeline_cache_count = env_pipeline_cache_count().value_or(kPipelineCacheCount);
  // A CPU device's work runs on the host's cores: polling there would take one from it.
  impl->fence_spin_us = env_fence_spin_us().value_or(impl->info.type == "cpu" ? 0 : kFenceSpinUs);

  std::array<vk::DescriptorSetLayoutBinding, kBindings> bindings;
  for (uint32_t b = 0; b < kBindings; ++b)
    bindings[b] = vk::DescriptorSetLayoutBinding{.binding = b, .descriptorType = vk::DescriptorType::eStorageBuffer, .descriptorCount = 1,
                   .stageFlags = vk::ShaderStageFlagBits::eCompute};
  impl->set_layout = vk::raii::DescriptorSetLayout(
      impl->device, vk::DescriptorSetLayoutCreateInfo{.bindingCount = kBindings, .pBindings = bindings.data()});
  vk::PushConstantRange range{.stageFlags = vk::ShaderStageFlagBits::eCompute, .offset = 0, .size = sizeof(PushConstants)};
  vk::DescriptorSetLayout set_layout = *impl->set_layout;
  impl->pipeline_layout = vk::raii::PipelineLayout(
      impl->device, vk::PipelineLayoutCreateInfo{.setLayoutCount = 1, .pSetLayouts = &set_layout,
                                                 .pushConstantRangeCount = 1, .pPushConstantRanges = &range});
  impl->pipeline_cache = vk::raii::PipelineCache(impl->device, vk::PipelineCacheCreateInfo{});
  return std::shared_ptr<Context>(new Context(std::move(impl)));
}

namespace {
std::mutex g_default_mutex;
std::shared_ptr<Context> g_default;
}  // namespace

std::shared_ptr<Context> Context::default_context() {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  if (!g_default) {
    g_default = create(-1);
    // Released at exit before what was loaded while creating it (the driver, layers) tears itself down:
    // g_default itself, a static made before them, would go after them. With the validation layer, a
    // program that had another context besides the default one crashed in the layer at exit.
    static const bool released_at_exit = (std::atexit([] { release_default(); }), true);
    (void)released_at_exit;
  }
  return g_default;
}

void Context::release_default() {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  g_default.reset();
}

const DeviceInfo& Context::info() const { return impl_->info; }
uint64_t Context::device_bytes_in_use() const { return impl_->bytes_in_use; }
uint64_t Context::device_bytes_peak() const { return impl_->bytes_peak; }
uint64_t Context::live_buffers() const { return impl_->live_buffers; }
uint64_t Context::pipelines() const {
  std::lock_guard<std::mutex> lock(impl_->pipeline_mutex);
  return impl_->pipelines.size();
}
uint64_t Context::pipelines_made() const {
  std::lock_guard<std::mutex> lock(impl_->pipeline_mutex);
  return impl_->pipelines_made;
}
uint64_t Context::device_bytes_cached() const { return impl_->cache.bytes(); }
uint64_t Context::cached_buffers() const { return impl_->cache.count(); }
uint64_t Context::fence_spin_us() const { return impl_->fence_spin_us; }
bool Context::host_reads_cached() const {
  return impl_->direct_host_access ? impl_->device_memory_cached : impl_->staging_memory_cached;
}
uint64_t Context::device_allocations() const { return impl_->allocations; }
void Context::release_cached_buffers() { (void)impl_->cache.trim(0); }

bool validation_enabled() { return env_flag("VKNORM_VALIDATION"); }

std::vector<std::string> validation_messages() {
  std::lock_guard<std::mutex> lock(g_validation_mutex);
  return g_validation_messages;
}

void clear_validation_messages() {
  std::lock_guard<std::mutex> lock(g_validation_mutex);
  g_validation_messages.clear();
}

}  // namespace vknorm

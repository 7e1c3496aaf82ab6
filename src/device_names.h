// Internal: how a device's facts are written in DeviceInfo, shared by the two executors that read them from
// Vulkan-Hpp in different namespaces (context.cpp through src/vk.h, recorder.cpp its own): C types only
// (each namespace's property structs convert to them).
#pragma once
#include <vulkan/vulkan_core.h>

#include <string>
#include <utility>

#include "vknorm/context.h"

namespace vknorm {

inline std::string version_string(uint32_t v) {
  return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) + "." +
         std::to_string(VK_API_VERSION_PATCH(v));
}

inline const char* device_type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

// What the core properties say: names, ids and the limits the dispatcher plans with.
inline void read_properties(const VkPhysicalDeviceProperties& p, DeviceInfo& info) {
  info.name = p.deviceName;
  info.type = device_type_name(p.deviceType);
  info.vendor_id = p.vendorID;
  info.device_id = p.deviceID;
  info.driver_version = p.driverVersion;
  info.max_shared_memory = p.limits.maxComputeSharedMemorySize;
  info.max_workgroup_invocations = p.limits.maxComputeWorkGroupInvocations;
  info.max_workgroup_size_x = p.limits.maxComputeWorkGroupSize[0];
  info.max_workgroup_count_x = p.limits.maxComputeWorkGroupCount[0];
  info.max_storage_buffer_range = p.limits.maxStorageBufferRange;
  info.timestamp_period_ns = p.limits.timestampPeriod;
}

inline uint64_t device_local_bytes(const VkPhysicalDeviceMemoryProperties& m) {
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < m.memoryHeapCount; ++i)
    if (m.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) bytes += m.memoryHeaps[i].size;
  return bytes;
}

inline void read_subgroup(const VkPhysicalDeviceSubgroupProperties& sg, DeviceInfo& info) {
  info.subgroup_size = sg.subgroupSize;
  info.subgroup_compute = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;
  const std::pair<VkSubgroupFeatureFlagBits, const char*> ops[] = {
      {VK_SUBGROUP_FEATURE_BASIC_BIT, "basic"},         {VK_SUBGROUP_FEATURE_VOTE_BIT, "vote"},
      {VK_SUBGROUP_FEATURE_ARITHMETIC_BIT, "arithmetic"}, {VK_SUBGROUP_FEATURE_BALLOT_BIT, "ballot"},
      {VK_SUBGROUP_FEATURE_SHUFFLE_BIT, "shuffle"},     {VK_SUBGROUP_FEATURE_SHUFFLE_RELATIVE_BIT, "shuffle_relative"},
      {VK_SUBGROUP_FEATURE_CLUSTERED_BIT, "clustered"}, {VK_SUBGROUP_FEATURE_QUAD_BIT, "quad"}};
  for (auto [bit, name] : ops)
    if (sg.supportedOperations & bit) info.subgroup_ops.push_back(name);
}

// Multiprocessors the device reports (NVIDIA: VK_NV_shader_sm_builtins), 0 where it does not; PhysicalDevice is
// either Vulkan-Hpp's raii::PhysicalDevice, Props2 / SmBuiltins that namespace's property structs.
template <class Props2, class SmBuiltins, class PhysicalDevice>
uint32_t multiprocessor_count(const PhysicalDevice& pd) {
  for (const auto& e : pd.enumerateDeviceExtensionProperties())
    if (std::string(e.extensionName.data()) == VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME)
      return pd.template getProperties2<Props2, SmBuiltins>().template get<SmBuiltins>().shaderSMCount;
  return 0;
}

}  // namespace vknorm

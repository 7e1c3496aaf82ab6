// Internal: how a device's facts are written in DeviceInfo, shared by the two executors that read them from
// Vulkan-Hpp in different namespaces (context.cpp through src/vk.h, recorder.cpp its own): C types only.
#pragma once
#include <vulkan/vulkan_core.h>

#include <string>

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

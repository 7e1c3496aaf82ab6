// vknorm's LayerNorm, RMSNorm, GroupNorm and InstanceNorm as ncnn layers. In a Vulkan net they run inside ncnn's graph: pipelines
// on the net's VulkanDevice, recorded into ncnn's VkCompute on the VkMat ncnn hands over (elempack 1 or
// 4, float32 or float16 storage as the net chose), with no host copy and no submission of their own.
// In a CPU net they run ncnn's CPU algorithm (vknorm's reference).
//
//   ncnn::Net net;
//   net.opt.use_vulkan_compute = true;
//   vknorm::ncnn::register_layers(net);   // before load_param
//   net.load_param("model.param");
//   net.load_model("model.bin");
//
// Needs the library target vknorm::vknorm_ncnn (built when CMake finds ncnn, see docs/android.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ncnn {
class Net;
class Layer;
}  // namespace ncnn

namespace vknorm {
namespace ncnn {

// Makes the net's LayerNorm, RMSNorm, GroupNorm and InstanceNorm layers vknorm's (ncnn's register_custom_layer, which replaces
// the built-in types). Call before load_param. Returns 0, or the error of the registration that failed.
int register_layers(::ncnn::Net& net);

// How vknorm layers ran. In a Vulkan net every forward is recorded on the GPU: cpu_forwards stays 0 (no
// host round trip). pipelines counts ncnn::Pipeline objects created (a new one only for a new variant).
struct Counters {
  uint64_t vulkan_forwards = 0;
  uint64_t cpu_forwards = 0;
  uint64_t pipelines = 0;
};
Counters counters(const ::ncnn::Net& net);  // this net's vknorm layers, since load_param
Counters counters();                        // every vknorm layer of the process, since it started

// True for a layer created by register_layers.
bool is_vknorm_layer(const ::ncnn::Layer* layer);

// A vknorm layer's parameters and weights as loaded (gamma/beta: weight_count floats, or null), and its
// counters. Returns false for any other layer.
struct LayerInfo {
  std::string type;       // "LayerNorm", "RMSNorm", "GroupNorm" or "InstanceNorm"
  bool rmsnorm = false;
  int affine_size = 0;    // LayerNorm, RMSNorm
  int group = 1;          // GroupNorm
  int channels = 0;       // GroupNorm, InstanceNorm
  float eps = 0.f;
  int affine = 0;
  int weight_count = 0;   // floats in gamma (and beta): affine_size, or channels
  const float* gamma = nullptr;
  const float* beta = nullptr;
  Counters counters;
  std::vector<std::string> pipelines;  // "<variant>/<specialization...>" of each pipeline made
};
bool describe_layer(const ::ncnn::Layer* layer, LayerInfo& out);

}  // namespace ncnn
}  // namespace vknorm

// Per-call choices, as ncnn's Option: precision and layout ride here, not on the layer.
#pragma once
#include <string>

namespace vknorm {

// Subgroup and Workgroup are the single-dispatch (fused) kernels; Split is reduce -> finalize -> normalize;
// Cooperative is one dispatch whose workgroups hold a group's chunks and wait for each other's statistics
// (planned by Auto only on GPUs that report their multiprocessors).
enum class Path { Auto, Subgroup, Workgroup, Split, Cooperative };

struct Option {
  bool use_fp16_storage = false;   // float16 blob on the device, float32 arithmetic
  bool use_packing_layout = true;  // pack4 when the outer extent divides by 4 (dims 2-4)
  Path path = Path::Auto;          // Auto: the dispatcher decides (VKNORM_PATH overrides Auto);
                                   // a forced path that cannot hold the group falls to the next larger one
  bool use_subgroup_ops = true;    // false: shared-memory reductions only
  int max_workgroup_size = 0;      // 0: device limit; otherwise a cap, rounded down to a power of two
};

// "auto" (or "") | "subgroup" | "workgroup" | "split" | "cooperative"; throws std::invalid_argument otherwise.
Path parse_path(const std::string& name);
const char* path_name(Path p);

}  // namespace vknorm

// The dispatch policy: which kernel runs a given group layout on a given device. All rules live in
// plan_dispatch (dispatch.cpp); the rest of the code only executes a Plan.
#pragma once
#include <cstdint>

#include "vknorm/context.h"
#include "vknorm/norm.h"
#include "vknorm/option.h"

namespace vknorm {

struct DeviceCaps {
  uint32_t max_workgroup = 256;        // invocations, after device limits and Option caps
  uint32_t preferred_workgroup = 256;  // for many small teams and the split passes
  uint32_t max_items = 16;             // elements one invocation holds in the fused kernel
  uint32_t items_target = 8;           // elements per invocation the team size aims for (fp32)
  uint32_t items_target_fp16 = 8;      // the same for float16 storage (half the bytes per element)
  uint64_t latency_threads = 0;        // fewer invocations than this: latency-bound, spread groups wide
  uint32_t min_team = 1;               // smallest team for groups at least this large (CPU: a subgroup)
  uint32_t subgroup_size = 0;    // 0: unknown
  bool subgroup_reduce = false;  // subgroup arithmetic + shuffle usable in compute
  bool cpu = false;              // a CPU implementation (lavapipe)
};

struct Plan {
  Path path = Path::Split;
  uint32_t wg = 64;        // workgroup size
  bool subgroup = false;   // fused kernel with subgroup reductions
  bool vec4 = false;       // fused, pack1: read 4 consecutive elements per load (team/items count vec4s)
  bool prefetch = false;   // fused: load gamma/beta with x (latency-bound tensors; costs registers)
  uint32_t team = 1;       // fused: invocations per group
  uint32_t items = 1;      // fused: elements per invocation (registers)
  uint32_t chunk_size = 0, n_chunks = 1;  // split: chunks per group
  uint32_t reduce_team = 1, finalize_team = 1;
  uint64_t fused_workgroups(const GroupLayout& g) const;
  uint64_t reduce_workgroups(const GroupLayout& g) const;
  uint64_t finalize_workgroups(const GroupLayout& g) const;
  uint64_t apply_workgroups(const GroupLayout& g) const;
};

DeviceCaps device_caps(const Context& ctx, const Option& opt);
Plan plan_dispatch(const GroupLayout& g, const DeviceCaps& dev, const Option& opt, bool fp16 = false);

}  // namespace vknorm

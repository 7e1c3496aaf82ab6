// The dispatch policy: which kernel runs a given group layout on a given device. All rules live in
// plan_dispatch (dispatch.cpp); the rest of the code only executes a Plan.
#pragma once
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "vknorm/context.h"
#include "vknorm/norm.h"
#include "vknorm/option.h"

namespace vknorm {

struct DeviceCaps {
  uint32_t max_workgroup = 256;        // invocations, after device limits and Option caps
  uint32_t max_shared = 16384;         // bytes of shared memory a workgroup may declare (device_caps)
  uint32_t preferred_workgroup = 256;  // for many small teams and the split passes
  uint32_t max_items = 16;             // elements one invocation holds in the fused kernel
  uint32_t max_items_held = 32;        // the same for float16 elements held as stored (half the registers)
  uint32_t max_team_held = 512;        // float16 held as stored: larger teams only past max_items_held
  uint32_t max_team_held_layernorm = 256;  // ... LayerNorm rows: larger teams only past max_items
  uint32_t items_target = 8;           // elements per invocation the team size aims for (fp32 rows)
  uint32_t items_target_fp16 = 8;      // the same for float16 storage (half the bytes per element)
  uint32_t items_target_channels = 8;  // the same for per-channel weights (GroupNorm, InstanceNorm)
  uint32_t items_target_reduce = 8;    // split path: chunk elements per invocation of the reduce pass
  uint32_t small_group = 256;          // GPUs: groups of at most this many packed elements (or vec4s) ...
  uint32_t items_target_small = 4;     // ... aim for this many elements per invocation
  uint64_t latency_threads = 0;        // fewer invocations than this: latency-bound, spread groups wide
  uint32_t latency_items = 2;          // ... with this many elements per invocation,
  uint32_t latency_team = 256;         // ... twice as many where the team would be wider than this
  uint32_t min_team = 1;               // smallest team for groups at least this large (CPU: a subgroup)
  // The cooperative kernel (norm_cooperative.comp): at most this many chunks per item, so that an item's
  // workgroups run at once with room to spare (half the device's multiprocessors) and their waits stay short
  // (a chunk whose workgroup has not started is taken over by one that waits: this is speed, not safety);
  // 0: unknown, planned only when forced, in items of one chunk (CPU drivers run a workgroup to its end
  // before starting the next).
  uint32_t cooperative_workgroups = 0;
  uint32_t compute_units = 0;              // DeviceInfo::compute_units (0: unknown)
  uint32_t cooperative_min_group = 16384;  // auto: few groups of at least this many packed elements go cooperative
  // ... and few pack4 groups of whole packed planes (channels a multiple of 4) over at least many_planes of them,
  // of at least many_planes_min_group packed elements (float16: _fp16) (many_planes 0: never)
  uint32_t many_planes = 20, many_planes_min_group = 6144, many_planes_min_group_fp16 = 7680;
  uint32_t items_target_cooperative = 8;   // elements each of its invocations holds, at least
  uint32_t items_target_cooperative_channels = 16;  // ... up to this many for groups spanning channels, in many
                                                    // chunks (GPUs; CPU drivers: items_target_cooperative)
  uint32_t cooperative_max_per_unit = 4;   // auto: at most this many of its workgroups per multiprocessor
  // Its workgroups are preferred_workgroup invocations, halved down to this many while a channel plane still
  // fits the smaller one at its items target (CPU drivers: preferred_workgroup, never halved)
  uint32_t cooperative_min_workgroup = 128;
  // auto: a fused plan of fewer groups than multiprocessors in full teams (full_team) holding more than
  // this many elements each goes cooperative, in at most cooperative_max_per_unit_full_teams workgroups per
  // multiprocessor (0: never)
  uint32_t full_team_max_items = 8;
  // The widest team the device's invocation limits allow (at most 1024): a full team shares a multiprocessor's
  // register file among that many invocations. A narrower max_workgroup (shared memory, Option's cap) does not
  // make a narrower team full.
  uint32_t full_team = 1024;
  uint32_t cooperative_max_per_unit_full_teams = 2;
  // ... and in up to cooperative_max_per_unit for groups spanning channels whose teams hold more float32 vec4s
  // each than this: 1024 invocations share the register file at 64 each, and more spill (0: never)
  uint32_t full_team_spill_items = 13;
  // ... the same for float16 held as stored, two to a register: past 15 vec4s each (0: never)
  uint32_t full_team_spill_items_held = 15;
  // Fused, fewer groups than multiprocessors with per-channel weights (GroupNorm, InstanceNorm): the narrowest
  // team down to few_group_min_team that holds a group in at most this many elements each (vec4s where the
  // kernel reads them; float16 held as stored: at least max_items); 0: the size rules' wide teams.
  // Latency-bound tensors only where few_group_any_size is false.
  uint32_t few_group_items = 20;
  uint32_t few_group_min_team = 128;
  bool few_group_any_size = true;
  // ... and where that narrowest team is still wider than preferred_workgroup and holds more than
  // few_wide_team_items elements each (vec4s where it reads them), float32 storage only, at most
  // few_wide_team_groups groups go cooperative instead (0: never)
  uint32_t few_wide_team_groups = 8, few_wide_team_items = 12;
  bool poll_loads = true;                  // its waits poll with atomic loads (CPU drivers: read-modify-writes)
  uint32_t wait_rounds = 1024;             // its waits give up after this many rounds of 4096 polls (CPUs: 16384)
  uint32_t subgroup_size = 0;    // 0: unknown
  bool subgroup_reduce = false;  // subgroup arithmetic + shuffle usable in compute
  bool cpu = false;              // a CPU implementation (lavapipe)
  bool specialize_shape = true;  // fused kernel: team and group size as specialization constants
  bool one_reduction = true;     // fused LayerNorm: sum and sum of squares in one reduction
  bool apply_merges = true;      // split path, per-channel weights: apply merges partials (no finalize)
  bool hold_reduce = true;       // split reduce, LayerNorm-type: the chunk held for its second pass, not re-read
  bool apply_last_first = false;  // split apply by element: last to first, where norm_reduce left x in cache
  // fused, float16 vec4s held in registers as stored (common.glsl id 15): half the registers (H200 +7 to +11
  // points at 1024-4096 cols); on lavapipe the same within its noise (4096x768 fp16: 8.3-14.3 ms either way)
  bool hold_storage = true;
  bool plane_weights = true;     // fused, per-channel weights, a group per workgroup: loaded per plane up front
  // fused, pack4 GroupNorm of 2 mod 4 channels per group, at least this many: an item per group
  // (lane_group_view, the fused kernel's vec4 variant) where the items of two groups run fused (0: never; CPU drivers)
  uint32_t lane_groups_min_channels = 6;
  // cooperative: uints from one item's counters to the next, at least its two counts (common.glsl)
  uint32_t counter_stride = 32;
};

struct Plan {
  Path path = Path::Split;
  uint32_t wg = 64;        // workgroup size
  bool subgroup = false;   // fused kernel with subgroup reductions
  bool vec4 = false;       // fused, pack1: read 4 consecutive elements per load (team/items count vec4s)
  bool prefetch = false;   // fused: load gamma/beta with x (latency-bound tensors; costs registers);
                           // cooperative: the chunk's per-channel weights during the wait
  bool one_reduction = false;  // fused LayerNorm: statistics from one team reduction (common.glsl id 7)
  bool plane_weights = false;  // fused, a group per workgroup: each plane's per-channel weights in shared memory
  bool hold_storage = false;   // fused, float16 vec4s: held as stored, unpacked where used (id 15)
  bool lane_groups = false;    // fused: an item per group of lane_group_view(layout) (norm_fused.comp id 16)
  uint32_t team = 1;       // fused: invocations per group
  uint32_t items = 1;      // fused, cooperative: elements per invocation (registers)
  uint32_t chunk_size = 0, n_chunks = 1;  // split, cooperative: chunks per group
  uint32_t reduce_team = 1, finalize_team = 1;
  uint32_t reduce_items = 1;  // split: chunk elements each reduce invocation holds (1: its second pass re-reads)
  uint64_t fused_workgroups(const GroupLayout& g) const;
  uint64_t reduce_workgroups(const GroupLayout& g) const;
  uint64_t finalize_workgroups(const GroupLayout& g) const;
  uint64_t apply_workgroups(const GroupLayout& g) const;
};

// What a device offers the planner. subgroup_reduce: subgroup arithmetic + shuffle usable in compute
// shaders on the device as it was created (vknorm's own context, ncnn's, or a caller's).
DeviceCaps device_caps(const DeviceInfo& info, bool subgroup_reduce, const Option& opt);
DeviceCaps device_caps(const Context& ctx, const Option& opt);
Plan plan_dispatch(const GroupLayout& g, const DeviceCaps& dev, const Option& opt, bool fp16 = false,
                   NormOp op = NormOp::LayerNorm);

// ---- The plan as data: one forward, independent of the engine that records it ----------------------
// Every pass binds the same eight storage buffers (binding = slot): the blob, gamma, beta, the split
// path's two scratch buffers, and for a fused residual add the second input, the output and the sum.
// A slot a pass does not use may hold any valid buffer.
enum Slot : uint32_t {
  kSlotBlob = 0, kSlotGamma, kSlotBeta, kSlotPartials, kSlotCoefs, kSlotResidual, kSlotOut, kSlotSum, kSlotCount
};

struct PushConstants {  // mirrors `parameter` in shaders/common.glsl (8 words)
  uint32_t group_size, gpc, cstep, n_groups, chunk_size, n_chunks, team;
  float eps;
};
static_assert(sizeof(PushConstants) == 32, "8 words of push constants");

struct Pass {
  std::string variant;                  // embedded SPIR-V: <shader>_fp<0|1>_p<1|4|v4>_sg<0|1>
  std::vector<uint32_t> specialization;  // constant ids 0..15: workgroup, op, affine, items, prefetch, team, size,
                                         // one reduction, planes, weights, channels per group, apply merges,
                                         // residual, activation, its parameter (float bits), hold storage;
                                         // each kernel's own from 16: the counter stride (cooperative kernel
                                         // and its clear; then its polls, its chunks of planes, its wait
                                         // rounds), the apply
                                         // pass's order, the fused kernel's items of one group in pack4 lanes
  PushConstants push{};
  uint32_t workgroup_size = 0;  // local_size_x (specialization[0])
  uint64_t workgroups = 0;      // 1-D; executors fold counts past maxComputeWorkGroupCount[0] into y
  bool after_previous = false;  // reads what the previous pass wrote: a barrier goes between them
  // Zeroes the cooperative kernel's counters (slot 4). An executor whose slot-4 buffer is already zero
  // (kept from an earlier forward: the cooperative kernel leaves its counters zero) skips it.
  bool clears_counters = false;
};

struct ForwardPlan {
  Plan kernel;          // the dispatcher's decision
  GroupLayout layout;   // the blob's groups
  bool fp16 = false;    // float16 storage
  uint64_t partials_bytes = 0, coefs_bytes = 0;  // split-path scratch (slots 3 and 4); 0: none
  bool counters = false;  // slot 4 holds the cooperative kernel's counters (coefs_bytes of them), zero between forwards
  // Where each count and claim lies: items, chunks per item, counter stride. Two layouts of equal bytes put one's
  // claims on the other's padding, which neither clears.
  std::array<uint32_t, 3> counters_layout{};
  std::vector<Pass> passes;
};

// What an executor knows of its slot-4 scratch from one recorded forward to the next: whether the last forward
// over it left the cooperative kernel's counters zero (the kernel does), and where, so that a forward with its
// counters at the same place may skip its clear pass. A buffer just made holds nothing known; a split forward's
// coefficients are not zero; and a forward of another layout may put its counters elsewhere: where one buffer
// holds the partials and then the counters (a Recorder's scratch), on what the last forward wrote as partials.
// Only the words of the last layout are known to be zero (its padding was never written), so a forward skips
// its clear only at the same layout and place.
struct CountersState {
  bool zero = false;
  uint64_t offset = 0;  // the counters the last forward left zero
  std::array<uint32_t, 3> layout{};
  bool skips(const Pass& pass, const ForwardPlan& fp, uint64_t at = 0) const {
    return pass.clears_counters && zero && fp.counters_layout == layout && at == offset;
  }
  // partials_before_counters: the forward's partials lie in the same buffer, from its start (a Recorder's scratch),
  // so a forward without counters (a split apply that merges) may write them over the bytes of earlier counters.
  void recorded(const ForwardPlan& fp, uint64_t at = 0, bool partials_before_counters = false) {
    if (fp.coefs_bytes) zero = fp.counters, layout = fp.counters_layout, offset = at;
    else if (partials_before_counters && fp.partials_bytes > offset) zero = false;
  }
};

// out_of_place: the variant that writes the output apart from a read-only input (Fusion::residual 1-3;
// norm_fused, norm_cooperative and norm_apply have one).
std::string variant_name(const std::string& shader, bool fp16, const std::string& layout, bool subgroup,
                         bool out_of_place = false);

// The fused kernel reads the blob as vec4s of one group ("v4" variants).
bool reads_vec4(const GroupLayout& g);
// pack4 elements whose lanes belong to different groups of an item (kept in group slots).
bool mixed_lanes(const GroupLayout& g, bool vec4);
// pack4 GroupNorm whose groups hold 2 mod 4 channels (320 or 960 channels in 32 groups) as an item per group:
// the (channels_per_group + 2) / 4 planes it touches, from lane 0 or 2 of the first (common.glsl LANE_GROUPS),
// where the blob's layout has items of two groups over channels_per_group / 2 planes. Nothing for others.
std::optional<GroupLayout> lane_group_view(const GroupLayout& g);

// A 1-D workgroup count as a grid: x up to maxComputeWorkGroupCount[0], the rest folded into y (the
// shaders rebuild the linear id, common.glsl). Every executor dispatches through this.
// ncnn packs a dims-1 blob by 4 when w divides: still one contiguous group, read unpacked (w and cstep in scalars,
// elempack 1). False where the unpacked width passes int: no such blob can be addressed.
inline bool unpack_dims1(int& w, size_t& cstep, int& elempack) {
  if (elempack <= 1) return true;
  if (w > INT_MAX / elempack) return false;
  w *= elempack, cstep *= size_t(elempack), elempack = 1;
  return true;
}

struct Grid {
  uint32_t x = 1, y = 1;
};
Grid fold_workgroups(uint64_t workgroups, uint32_t max_count_x);

// The group sizes a layer plans with the size as a specialization constant (its kernels' loops unrolled): an app
// feeding inputs of any size would otherwise compile and keep a pipeline per size (vknorm's own layers, ncnn's and
// a Recorder's). The first kMax sizes met are; later ones plan without it (DeviceCaps::specialize_shape off: fused
// plans hold a power of two of elements each) and share pipelines per kernel and team.
class SpecializedSizes {
 public:
  static constexpr size_t kMax = 16;
  // caps for a forward over groups of group_size: specialize_shape turned off past the first kMax sizes.
  DeviceCaps admit(DeviceCaps caps, uint32_t group_size) { return decide(caps, group_size, true); }
  // What admit would give, the size left unadmitted (an executor that may still refuse the forward).
  DeviceCaps peek(DeviceCaps caps, uint32_t group_size) { return decide(caps, group_size, false); }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    sizes_.clear();
  }

 private:
  DeviceCaps decide(DeviceCaps caps, uint32_t group_size, bool take) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!sizes_.count(group_size)) {
      if (sizes_.size() >= kMax) caps.specialize_shape = false;
      else if (take) sizes_.insert(group_size);
    }
    return caps;
  }
  std::mutex mutex_;
  std::set<uint32_t> sizes_;
};

// What a plan runs, as DispatchInfo reports it (gpu_us and pieces left to the executor).
DispatchInfo dispatch_info(const ForwardPlan& plan);

// The complete forward of one layer over one blob: what every executor records.
ForwardPlan plan_forward(NormOp op, bool affine, float eps, const GroupLayout& g, bool fp16, const DeviceCaps& dev,
                         const Option& opt, const Fusion& fusion = {});

// What an embedded SPIR-V variant asks of the device beyond Vulkan 1.0, read from its header and
// capabilities (cmake/shaders.cmake: float16-storage and subgroup variants are SPIR-V 1.3; pack1 float16
// ones declare StorageBuffer16BitAccess). Throws std::logic_error for a variant that was not built.
struct SpirvNeeds {
  bool vulkan_1_1 = false;
  bool storage_16bit = false;
};
SpirvNeeds spirv_needs(const std::string& variant);
// True when some pass of the plan reads the blob as single float16 values (storageBuffer16BitAccess).
bool needs_16bit_storage(const ForwardPlan& plan);

// The whole number the environment variable `name` holds; nothing when it is unset or empty.
// std::invalid_argument ("NAME=value: expected <expected>") for anything else.
std::optional<uint64_t> env_count(const char* name, const char* expected);
bool env_has_prefix(const char* prefix);  // any environment variable whose name starts so
// One of the planner's tuning knobs (VKNORM_TUNE_*, docs/benchmarks): a whole number, at most UINT32_MAX (more is
// read as that); unset or empty: nullopt; anything else throws std::invalid_argument naming the knob.
std::optional<uint32_t> env_knob(const char* name);
// The positive integer the environment variable `name` holds; 0 when it is unset or empty.
// std::invalid_argument ("NAME=value: expected a positive integer") for anything else.
uint64_t env_positive(const char* name);
// A switch: on for 1, true, on, yes; off for 0, false, off, no (any case), unset or empty;
// std::invalid_argument ("NAME=value: expected 1, true, on or yes (on), or 0, false, off, no or nothing (off)") for
// anything else.
bool env_flag(const char* name);
// VKNORM_VULKAN_API=1.0|1.1|1.2|1.3 as VK_API_VERSION_1_x (unset: 1.3); std::invalid_argument otherwise.
uint32_t env_api_cap();
// The capability profile: environment variables that make a device look smaller than it is, applied to every
// device vknorm plans for (its own context's, a Recorder's caller's, ncnn's), so each reports and plans the same:
//   VKNORM_VULKAN_API below 1.1   no subgroup operations, no 16-bit storage (as on a Vulkan 1.0 device)
//   VKNORM_NO_SUBGROUP=1          no subgroup operations: shared-memory reductions only
//   VKNORM_NO_FP16_STORAGE=1      no storageBuffer16BitAccess: float16 blobs read as pairs in 32-bit words
//   VKNORM_MAX_SHARED_MEMORY=N    at most N bytes of shared memory per workgroup (at least 256)
// std::invalid_argument naming the variable for a value it cannot read.
void apply_capability_profile(DeviceInfo& info);
// VKNORM_MAX_SHARED_MEMORY=N (at least 256): plan for at most N bytes of shared memory; 0 when unset.
uint64_t env_max_shared_memory();
// VKNORM_PATH: the kernel every plan of Path::Auto takes (unset or empty: Auto).
Path env_path();
// VKNORM_COOPERATIVE_WORKGROUPS: how many workgroups the device keeps resident (0: no cooperative kernel).
std::optional<uint64_t> env_cooperative_workgroups();
// A context's settings: VKNORM_BUFFER_CACHE_BYTES, VKNORM_PIPELINE_CACHE_COUNT, VKNORM_FENCE_SPIN_US,
// VKNORM_MAX_DEVICE_BYTES and VKNORM_SUBGROUP_SIZE (0: unset).
std::optional<uint64_t> env_buffer_cache_bytes();
std::optional<uint64_t> env_pipeline_cache_count();
std::optional<uint64_t> env_fence_spin_us();
uint64_t env_max_device_bytes();
uint64_t env_subgroup_size();
// The host conversions' knobs: VKNORM_TUNE_CONVERSION_BYTES_PER_THREAD (0: unset), VKNORM_TUNE_CONVERSION_THREADS.
uint64_t env_conversion_bytes_per_thread();
std::optional<uint64_t> env_conversion_threads();
// Every setting above, VKNORM_VULKAN_API and VKNORM_MAX_BUFFER_BYTES, each read on its own: {variable, message} for
// each value a context, plan or forward would refuse now (empty: none). vknorm info names them all at once, where
// the runtime meets them one at a time, and the planner's tuning knobs (env_knob). VKNORM_DEVICE is
// default_device_index's to judge (it needs the devices).
std::vector<std::pair<std::string, std::string>> setting_problems();
// The bytes one storage-buffer binding may hold: the device's maxStorageBufferRange (0: no limit), lowered by
// VKNORM_MAX_BUFFER_BYTES=N (plan as if the device bound at most N bytes: tests run the pieces path with small
// tensors; read on every forward); `why` names the one that applies. Throws as env_positive.
struct BindingLimit {
  uint64_t bytes;
  const char* why;  // "maxStorageBufferRange" or "VKNORM_MAX_BUFFER_BYTES"
};
BindingLimit binding_limit(uint64_t max_storage_buffer_range);

}  // namespace vknorm

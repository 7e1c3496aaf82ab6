#include "dispatch.h"

#include "vk.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>

#include <unistd.h>  // environ

#include "shaders.h"

namespace vknorm {
namespace {

// Shared memory a workgroup declares besides its per-invocation arrays (16 B per value, vec4 at most):
// norm_fused.comp's two plane-weight slots where it keeps no plane's weights; norm_cooperative.comp's claim
// words and chunk weights (44 B, rounded up).
constexpr uint32_t kFusedSharedFixed = 2 * 16;
constexpr uint32_t kCooperativeSharedFixed = 64;
// The widest subgroup assumed where a device reports none (Vulkan 1.0): AMD's and Adreno's common wave64, and every
// narrower width divides it.
constexpr uint32_t kUnreportedSubgroupWidth = 64;

// Split path: chunks of at least this many elements, and enough (group, chunk) items to fill a GPU.
constexpr uint32_t kMinChunk = 1024;
constexpr uint64_t kTargetItems = 1024;
constexpr uint64_t kMaxApplyWorkgroups = 1u << 16;

uint32_t pow2_ceil(uint64_t v) {
  uint32_t p = 1;
  while (p < v && p < (1u << 31)) p <<= 1;
  return p;
}
uint64_t div_up(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// A team of `team` invocations holding ceil(size / team) elements each.
uint32_t items_for(uint32_t size, uint32_t team) { return uint32_t(div_up(size, team)); }

}  // namespace

bool reads_vec4(const GroupLayout& g) {
  // pack4 elements that lie in one group (GroupNorm with channels per group divisible by 4) are read
  // as that group's vec4s; pack1 groups whose planes start 16-byte aligned, 4 consecutive elements at a time.
  if (g.elempack == 4) return g.channels_per_group % 4 == 0;
  return g.plane_size() % 4 == 0 && g.cstep % 4 == 0;
}

bool mixed_lanes(const GroupLayout& g, bool vec4) { return g.elempack == 4 && !vec4 && g.channels_per_group > 1; }

std::optional<GroupLayout> lane_group_view(const GroupLayout& g) {
  if (g.elempack != 4 || g.weights != GroupLayout::ByChannel || g.channels_per_group % 4 != 2) return std::nullopt;
  GroupLayout v = g;
  v.planes = (g.channels_per_group + 2) / 4;
  v.group_size = v.planes * g.plane_size();
  v.n_groups = 2 * g.n_groups;  // an item holds 4 / gcd(channels_per_group, 4) = 2 groups
  v.gpc = 1;
  return v;
}

Path parse_path(const std::string& name) {
  if (name == "auto" || name.empty()) return Path::Auto;
  if (name == "subgroup") return Path::Subgroup;
  if (name == "workgroup") return Path::Workgroup;
  if (name == "split") return Path::Split;
  if (name == "cooperative") return Path::Cooperative;
  throw std::invalid_argument("unknown path '" + name + "': expected auto, subgroup, workgroup, split or cooperative");
}

const char* path_name(Path p) {
  switch (p) {
    case Path::Subgroup: return "subgroup";
    case Path::Workgroup: return "workgroup";
    case Path::Split: return "split";
    case Path::Cooperative: return "cooperative";
    default: return "auto";
  }
}

uint32_t pow2_floor(uint32_t v) {
  uint32_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

// The planner's tuning knobs, each read by device_caps (docs/benchmarks); setting_problems checks them all.
constexpr const char* kPlanKnobs[] = {
    "VKNORM_TUNE_POLL_LOADS",
    "VKNORM_TUNE_WAIT_ROUNDS",
    "VKNORM_TUNE_COOPERATIVE_MIN_GROUP",
    "VKNORM_TUNE_COOPERATIVE_MAX_PER_UNIT",
    "VKNORM_TUNE_COOPERATIVE_MIN_WORKGROUP",
    "VKNORM_TUNE_FULL_TEAM_MAX_ITEMS",
    "VKNORM_TUNE_COOPERATIVE_MAX_PER_UNIT_FULL_TEAMS",
    "VKNORM_TUNE_FULL_TEAM_SPILL_ITEMS",
    "VKNORM_TUNE_MANY_PLANES",
    "VKNORM_TUNE_FULL_TEAM_SPILL_ITEMS_HELD",
    "VKNORM_TUNE_FEW_GROUP_ITEMS",
    "VKNORM_TUNE_FEW_GROUP_ANY_SIZE",
    "VKNORM_TUNE_FEW_GROUP_MIN_TEAM",
    "VKNORM_TUNE_FEW_WIDE_TEAM_GROUPS",
    "VKNORM_TUNE_FEW_WIDE_TEAM_ITEMS",
    "VKNORM_TUNE_ITEMS_TARGET_COOPERATIVE",
    "VKNORM_TUNE_ITEMS_TARGET_COOPERATIVE_CHANNELS",
    "VKNORM_TUNE_ITEMS_TARGET",
    "VKNORM_TUNE_ITEMS_TARGET_FP16",
    "VKNORM_TUNE_ITEMS_TARGET_CHANNELS",
    "VKNORM_TUNE_LATENCY_THREADS",
    "VKNORM_TUNE_LATENCY_ITEMS",
    "VKNORM_TUNE_LATENCY_TEAM",
    "VKNORM_TUNE_MAX_ITEMS",
    "VKNORM_TUNE_MAX_ITEMS_HELD",
    "VKNORM_TUNE_MAX_TEAM_HELD",
    "VKNORM_TUNE_MAX_TEAM_HELD_LAYERNORM",
    "VKNORM_TUNE_HOLD_REDUCE",
    "VKNORM_TUNE_APPLY_LAST_FIRST",
    "VKNORM_TUNE_ITEMS_TARGET_REDUCE",
    "VKNORM_TUNE_SMALL_GROUP",
    "VKNORM_TUNE_ITEMS_TARGET_SMALL",
    "VKNORM_TUNE_SPECIALIZE",
    "VKNORM_TUNE_ONE_REDUCTION",
    "VKNORM_TUNE_APPLY_MERGES",
    "VKNORM_TUNE_HOLD_STORAGE",
    "VKNORM_TUNE_PLANE_WEIGHTS",
    "VKNORM_TUNE_COUNTER_STRIDE",
    "VKNORM_TUNE_LANE_GROUPS",
    "VKNORM_TUNE_WORKGROUP",
};

std::optional<uint32_t> env_knob(const char* name) {
  // atoi read "abc" as 0 and "8x" as 8 without a word: a knob is a whole number (switches: 0 off) or refused
  const bool listed = std::any_of(std::begin(kPlanKnobs), std::end(kPlanKnobs),
                                  [name](const char* k) { return std::strcmp(k, name) == 0; });
  if (!listed) throw std::logic_error(std::string(name) + " is read as a tuning knob but not listed in kPlanKnobs");
  const std::optional<uint64_t> n = env_count(name, "a whole number (a tuning knob, docs/benchmarks)");
  if (!n) return std::nullopt;
  return uint32_t(std::min<uint64_t>(*n, UINT32_MAX));
}

DeviceCaps device_caps(const Context& ctx, const Option& opt) {
  return device_caps(ctx.info(), const_cast<Context&>(ctx).impl().subgroup_reduce, opt);
}

DeviceCaps device_caps(const DeviceInfo& info, bool subgroup_reduce, const Option& opt) {
  // Every plan starts here: an Option whose fields were set to what they cannot mean is refused, not read as Auto
  if (int(opt.path) < int(Path::Auto) || int(opt.path) > int(Path::Cooperative))
    throw std::invalid_argument("Option.path " + std::to_string(int(opt.path)) + " is not one of Path's values");
  if (opt.max_workgroup_size < 0)
    throw std::invalid_argument("Option.max_workgroup_size must be >= 0 (0: the device's limit), got " +
                                std::to_string(opt.max_workgroup_size));
  DeviceCaps caps;
  // Some 40 tuning knobs, read per plan: one pass over the environment tells whether any is set, where a getenv
  // each is a pass each (microseconds a forward; more in a large environment).
  const bool tuned = env_has_prefix("VKNORM_TUNE_");
  auto tune = [tuned](const char* name) -> std::optional<uint32_t> { return tuned ? env_knob(name) : std::nullopt; };
  caps.cpu = info.type == "cpu";
  // CPU drivers run a workgroup's invocations as loops on one core: small workgroups, and registers
  // are memory there anyway. GPUs: 256 by default, up to 1024 for one large group per workgroup,
  // and few enough registers per invocation to keep occupancy.
  uint32_t limit = std::min(info.max_workgroup_invocations, info.max_workgroup_size_x);
  caps.full_team = pow2_floor(std::min<uint32_t>(limit, caps.cpu ? 64 : 1024));
  if (opt.max_workgroup_size > 0) limit = std::min<uint32_t>(limit, uint32_t(opt.max_workgroup_size));
  caps.max_workgroup = pow2_floor(std::min<uint32_t>(limit, caps.cpu ? 64 : 1024));  // reductions halve
  caps.preferred_workgroup = std::min<uint32_t>(caps.max_workgroup, caps.cpu ? 64 : 256);
  caps.max_items = caps.cpu ? 128 : 16;
  // GPUs: float16 held as stored (hold_storage) takes half the registers per element, twice the elements.
  caps.max_items_held = caps.cpu ? caps.max_items : 2 * caps.max_items;
  // CPU drivers vectorize a subgroup across SIMD lanes: one subgroup per group, each lane walking
  // many elements, beats wide teams there (lavapipe 4096x768: ~1.3x faster than 8 per invocation).
  // GPUs, float32 rows: 16 per invocation, in teams half as wide (H200, 4096 / 8192 cols: LayerNorm 78 -> 91 %,
  // 72 -> 82 % of the copy roof, RMSNorm 82 -> 86 % at 8192; 1024-2048 the same within 1 point). float16
  // rows keep 8 (16 lost 4-10 points at 1024 cols); per-channel weights keep 8 (not measured at 16).
  caps.items_target = caps.cpu ? caps.max_items : 16;
  caps.items_target_fp16 = caps.cpu ? caps.max_items : 8;
  caps.items_target_channels = caps.items_target_fp16;
  caps.items_target_reduce = caps.items_target_fp16;
  caps.min_team = caps.cpu ? std::max<uint32_t>(info.subgroup_size, 1) : 1;
  // GPUs only: a tensor that cannot fill the device finishes sooner with more, shorter invocations.
  caps.latency_threads = caps.cpu ? 0 : 16384;
  // GPUs: the split apply pass merges partials itself, one dispatch fewer (H200, GroupNorm 320x64x64/32
  // 16.8 -> 14.5 us); lavapipe pays more for the barriers that merge takes (2.6 -> 4.4 ms there).
  caps.apply_merges = !caps.cpu;
  caps.apply_last_first = !caps.cpu;
  // The cooperative kernel waits for the other chunks of its item: every SM keeps at least one of its
  // workgroups resident, and half of them leaves room for another kernel running beside it, so that an
  // item's chunks run at once and no wait runs long enough for its workgroup to take the others over.
  caps.compute_units = info.compute_units;
  caps.cooperative_workgroups = caps.cpu ? 0 : info.compute_units / 2;
  // Declares how many workgroups the device keeps resident, where vknorm cannot tell (any device; tests
  // run lavapipe with as many threads: LP_NUM_THREADS, and with more, which the kernel survives slowly).
  if (const auto n = env_cooperative_workgroups())
    caps.cooperative_workgroups = uint32_t(std::min<uint64_t>(*n, UINT32_MAX));
  caps.poll_loads = !caps.cpu;
  // A CPU driver's threads share the cores with the rest of the machine: one preempted for tens of milliseconds
  // mid-chunk would outlast 2^22 polls. 2^26 there (seconds; llvmpipe ends loops after 65535 rounds).
  caps.wait_rounds = caps.cpu ? 16384 : 1024;
  if (const auto v = tune("VKNORM_TUNE_POLL_LOADS")) caps.poll_loads = *v != 0;
  // 0: every wait gives up at once (its item NaN): how tests reach the path that otherwise needs a stalled device.
  if (const auto v = tune("VKNORM_TUNE_WAIT_ROUNDS")) caps.wait_rounds = *v;
  if (const auto v = tune("VKNORM_TUNE_COOPERATIVE_MIN_GROUP")) caps.cooperative_min_group = *v;
  if (const auto v = tune("VKNORM_TUNE_COOPERATIVE_MAX_PER_UNIT")) caps.cooperative_max_per_unit = *v;
  if (caps.cpu) caps.cooperative_min_workgroup = caps.preferred_workgroup;
  if (const auto v = tune("VKNORM_TUNE_COOPERATIVE_MIN_WORKGROUP"))
    caps.cooperative_min_workgroup = pow2_floor(std::max<uint32_t>(1, *v));
  if (const auto v = tune("VKNORM_TUNE_FULL_TEAM_MAX_ITEMS")) caps.full_team_max_items = *v;
  if (const auto v = tune("VKNORM_TUNE_COOPERATIVE_MAX_PER_UNIT_FULL_TEAMS"))
    caps.cooperative_max_per_unit_full_teams = *v;
  if (const auto v = tune("VKNORM_TUNE_FULL_TEAM_SPILL_ITEMS")) caps.full_team_spill_items = *v;
  if (const auto v = tune("VKNORM_TUNE_MANY_PLANES")) caps.many_planes = *v;
  if (const auto v = tune("VKNORM_TUNE_FULL_TEAM_SPILL_ITEMS_HELD"))
    caps.full_team_spill_items_held = *v;
  if (caps.cpu) caps.few_group_items = 0;  // measured on the H200 only
  if (const auto v = tune("VKNORM_TUNE_FEW_GROUP_ITEMS")) caps.few_group_items = *v;
  if (const auto v = tune("VKNORM_TUNE_FEW_GROUP_ANY_SIZE")) caps.few_group_any_size = *v != 0;
  if (const auto v = tune("VKNORM_TUNE_FEW_GROUP_MIN_TEAM"))
    caps.few_group_min_team = pow2_floor(std::max<uint32_t>(1, *v));
  if (const auto v = tune("VKNORM_TUNE_FEW_WIDE_TEAM_GROUPS")) caps.few_wide_team_groups = *v;
  if (const auto v = tune("VKNORM_TUNE_FEW_WIDE_TEAM_ITEMS")) caps.few_wide_team_items = *v;
  if (const auto v = tune("VKNORM_TUNE_ITEMS_TARGET_COOPERATIVE"))
    caps.items_target_cooperative = std::max<uint32_t>(1, *v);
  // Groups spanning channels, in many chunks: up to 16 on GPUs (plan_dispatch says why); CPU drivers, no more.
  if (caps.cpu) caps.items_target_cooperative_channels = caps.items_target_cooperative;
  if (const auto v = tune("VKNORM_TUNE_ITEMS_TARGET_COOPERATIVE_CHANNELS"))
    caps.items_target_cooperative_channels = std::max<uint32_t>(1, *v);
  // Tuning knobs for measuring other choices on a device (vknorm bench); not needed in normal use.
  if (const auto v = tune("VKNORM_TUNE_ITEMS_TARGET")) caps.items_target = std::max<uint32_t>(1, *v);
  if (const auto v = tune("VKNORM_TUNE_ITEMS_TARGET_FP16")) caps.items_target_fp16 = std::max<uint32_t>(1, *v);
  if (const auto v = tune("VKNORM_TUNE_ITEMS_TARGET_CHANNELS"))
    caps.items_target_channels = std::max<uint32_t>(1, *v);
  if (const auto v = tune("VKNORM_TUNE_LATENCY_THREADS")) caps.latency_threads = *v;
  if (const auto v = tune("VKNORM_TUNE_LATENCY_ITEMS")) caps.latency_items = std::max<uint32_t>(1, *v);
  if (const auto v = tune("VKNORM_TUNE_LATENCY_TEAM")) caps.latency_team = std::max<uint32_t>(1, *v);
  if (const auto v = tune("VKNORM_TUNE_MAX_ITEMS")) caps.max_items = std::max<uint32_t>(1, *v);
  if (const auto v = tune("VKNORM_TUNE_MAX_ITEMS_HELD")) caps.max_items_held = std::max<uint32_t>(1, *v);
  // Team widths halve in the reductions: caps on them round down to a power of two, as the team knobs above.
  if (const auto v = tune("VKNORM_TUNE_MAX_TEAM_HELD")) caps.max_team_held = pow2_floor(std::max<uint32_t>(1, *v));
  if (const auto v = tune("VKNORM_TUNE_MAX_TEAM_HELD_LAYERNORM"))
    caps.max_team_held_layernorm = pow2_floor(std::max<uint32_t>(1, *v));
  if (const auto v = tune("VKNORM_TUNE_HOLD_REDUCE")) caps.hold_reduce = *v != 0;
  if (const auto v = tune("VKNORM_TUNE_APPLY_LAST_FIRST")) caps.apply_last_first = *v != 0;
  if (const auto v = tune("VKNORM_TUNE_ITEMS_TARGET_REDUCE"))
    caps.items_target_reduce = std::max<uint32_t>(1, *v);
  if (const auto v = tune("VKNORM_TUNE_SMALL_GROUP")) caps.small_group = *v;
  if (const auto v = tune("VKNORM_TUNE_ITEMS_TARGET_SMALL")) caps.items_target_small = std::max<uint32_t>(1, *v);
  if (const auto v = tune("VKNORM_TUNE_SPECIALIZE")) caps.specialize_shape = *v != 0;
  if (const auto v = tune("VKNORM_TUNE_ONE_REDUCTION")) caps.one_reduction = *v != 0;
  if (const auto v = tune("VKNORM_TUNE_APPLY_MERGES")) caps.apply_merges = *v != 0;
  if (const auto v = tune("VKNORM_TUNE_HOLD_STORAGE")) caps.hold_storage = *v != 0;
  if (const auto v = tune("VKNORM_TUNE_PLANE_WEIGHTS")) caps.plane_weights = *v != 0;
  // lavapipe loses with it: GroupNorm 320x32x32/32 fp32 1.5-1.6 -> 2.8-3.6 ms (an invocation's lanes are SIMD
  // lanes there, and it masks and stores per lane), 960x16x16/32 level within its noise.
  caps.lane_groups_min_channels = caps.cpu ? 0 : 6;
  // The cooperative kernel's counters 128 bytes apart, a cache line each (NVIDIA's L2 line; two of a CPU's). H200,
  // two interleaved A/Bs, packed -> a line apart, fp32: GroupNorm 1920x32x32/32 10.37 -> 9.82 and 10.33 -> 9.81 us,
  // 320x64x64/32 9.30 -> 9.21 and 9.53 -> 9.19; 960x64x64/32, InstanceNorm 64x128x128 and 32x224x224, 640x16x16/2
  // and float16 level (within 0.1 us).
  if (const auto v = tune("VKNORM_TUNE_COUNTER_STRIDE")) caps.counter_stride = std::max<uint32_t>(2, *v);
  if (const auto v = tune("VKNORM_TUNE_LANE_GROUPS")) caps.lane_groups_min_channels = *v;
  if (const auto v = tune("VKNORM_TUNE_WORKGROUP"))
    caps.preferred_workgroup = std::min(caps.max_workgroup, pow2_floor(std::max<uint32_t>(1, *v)));
  // Shared memory (maxComputeSharedMemorySize, VKNORM_MAX_SHARED_MEMORY caps it): per invocation the
  // fused kernel and norm_reduce hold one stat (vec4 at most: 16 B, common.glsl team_scratch), the fused kernel
  // also one weight slot of each kind (kFusedSharedFixed; with plane_weights a slot per plane, budgeted by that
  // rule); norm_finalize and norm_apply a stat and 3 afp (64 B: the whole budget), at the split path's
  // workgroup, preferred_workgroup; the cooperative kernel as those, plus a few values (kCooperativeSharedFixed).
  const uint32_t shared = std::max<uint32_t>(info.max_shared_memory, 64 + kFusedSharedFixed);
  caps.max_shared = shared;
  caps.max_workgroup = std::min(caps.max_workgroup, pow2_floor((shared - kFusedSharedFixed) / 16));
  caps.preferred_workgroup = std::min(caps.preferred_workgroup, pow2_floor(shared / 64));
  caps.subgroup_size = info.subgroup_size;
  // Subgroups of >= 2 invocations: team_sum2 keeps two values per subgroup in a workgroup-sized array.
  caps.subgroup_reduce = subgroup_reduce && opt.use_subgroup_ops && info.subgroup_size >= 2 &&
                         caps.preferred_workgroup % info.subgroup_size == 0;
  return caps;
}

// Planes whose weights norm_fused.comp keeps in shared memory (plane_weights), at most: the rule's measured
// range (its arrays are sized by the plan, its shared memory budgeted there).
constexpr uint32_t kMaxPlaneWeights = 64;

namespace {

// The rules for one layout; lane_groups: g is a lane_group_view, whose elements hold one group's lanes.
Plan plan_layout(const GroupLayout& g, const DeviceCaps& dev, Path want, bool fp16, NormOp op, bool lane_groups) {
  Plan plan;
  plan.wg = dev.preferred_workgroup;
  plan.subgroup = dev.subgroup_reduce;
  // An item per group inside pack4 lanes holds one group, as the vec4 reads of whole planes do: the fused kernel's
  // vec4 variant, one float per statistic (the pack4 one, statistics in vec4 slots, was slower: H200, fp32 / fp16,
  // us, GroupNorm 960x32x32/32 8.03 / 9.27 -> 7.87 / 8.45, 320x48x48/32 7.68 / 7.80 -> 7.58 / 7.16, 960x8x8/32
  // 3.86 / 3.76 -> 3.46 / 3.37; 320x32x32/32 5.04 / 4.80 -> 5.19 / 4.51).
  const bool vec4 = reads_vec4(g) || lane_groups;
  const bool mixed = mixed_lanes(g, vec4);
  const uint32_t size = vec4 && g.elempack == 1 ? g.group_size / 4 : g.group_size;
  const uint32_t subgroup = dev.subgroup_size ? std::min(dev.subgroup_size, plan.wg) : std::min(32u, plan.wg);
  // float16 elements the fused kernel holds as stored (common.glsl id 15): half the registers each, so
  // rows may hold more of them (GroupNorm/InstanceNorm's few large groups run faster split: H200,
  // GroupNorm 320x64x64/32 fp16 14.3 us split, 87.9 fused with 32 elements per invocation).
  const bool held = fp16 && dev.hold_storage && (vec4 || g.elempack == 4);
  const uint32_t max_items = held && g.weights == GroupLayout::ByPosition ? dev.max_items_held : dev.max_items;
  uint32_t items_cap = max_items;  // the fused kernel's limit; the few-group rule below may raise it

  // | rule                                      | kernel                                         |
  // |-------------------------------------------|------------------------------------------------|
  // | team of <= subgroup holds the group       | fused "subgroup": a team inside one subgroup   |
  // |   (<= max_items each)                     |   (tiny groups share a subgroup)               |
  // | team of <= max workgroup holds the group  | fused "workgroup": subgroups of one workgroup  |
  // | larger                                    | split: reduce chunks -> finalize -> normalize  |
  // Auto on GPUs that report their multiprocessors first takes the cooperative kernel (chunks of a group in
  // workgroups that wait on each other) for fewer groups than multiprocessors that are large
  // (cooperative_min_group), or that the fused row would hold in full teams of more than full_team_max_items
  // each; in either case only while its chunks fit a few waves (rules and measurements at each below).
  // Auto sizes the team for items_target elements per invocation (items_target_small for groups of at
  // most small_group packed elements or vec4s; latency_items (2, or 4 past teams of latency_team) when the whole tensor needs
  // fewer than latency_threads invocations: latency-bound, so wide teams and weights loaded early), then,
  // for fewer groups than multiprocessors with per-channel weights, narrows it while few_group_items suffice
  // (not for groups inside pack4 lanes, nor a full team the full-team rule sends to the cooperative kernel);
  // a forced path that cannot hold the group moves to the next row down.
  // LayerNorm in workgroup teams reduces its sum and sum of squares together, one team per workgroup
  // so the team may branch on its own into the rare second pass (H200: 1024-16384 cols +1 to +11 points
  // of the copy roof, latency shapes -8 %). Teams inside a subgroup keep two reductions: one chain of
  // shuffles each, and one reduction lost there (32-256 cols: 6-10 points).
  auto fused = [&](uint32_t team) {
    plan.vec4 = vec4;
    plan.team = team;
    plan.wg = std::max(dev.preferred_workgroup, team);
    plan.items = items_for(size, team);
    // Without the group size as a constant (a layer past the shapes it specializes), the elements each invocation
    // holds round up to a power of two where the cap allows, so that group sizes of one team share a pipeline: the
    // kernel masks the elements past the group (loads of its first element, sums of 0). Results agree within float32
    // rounding (bit for bit on lavapipe; a GPU compiler may contract the looped sums otherwise than unrolled ones).
    if (!dev.specialize_shape) {
      const uint32_t rounded = pow2_ceil(plan.items);
      if (rounded <= items_cap) plan.items = rounded;
    }
    plan.path = team <= subgroup ? Path::Subgroup : Path::Workgroup;
    plan.one_reduction = centres(op) && dev.one_reduction && plan.path == Path::Workgroup && !mixed;
    if (plan.one_reduction) plan.wg = team;
    plan.hold_storage = held;
    // A group per workgroup with per-channel weights: the weights of each of its planes go to shared memory
    // up front, and the store loop reads them there instead of from memory after the reduction. lavapipe,
    // where the store loop's gathers cost most: GroupNorm 640x32x32/32 fp32 1880 -> 1500 us, fp16 2130 ->
    // 1660, InstanceNorm 128x64x64 fp32 2430 -> 1420. H200: float32 only (GroupNorm 640x32x32/32 6.85 ->
    // 6.55 us, 256x64x64/32 8.15 -> 7.79; float16 mixed: 640x32x32/32 4.94 -> 4.79, 256x64x64/32 5.65 -> 5.95).
    plan.plane_weights = dev.plane_weights && (!fp16 || dev.cpu) && !plan.prefetch &&
                         g.weights != GroupLayout::ByPosition && plan.path == Path::Workgroup && plan.wg == team &&
                         g.planes <= kMaxPlaneWeights && g.planes <= plan.wg &&  // an invocation per plane loads them
                         uint64_t(plan.wg) * 16 + uint64_t(g.planes) * 2 * 16 <= dev.max_shared;
    return plan.items <= items_cap;
  };
  uint32_t target = g.weights != GroupLayout::ByPosition ? dev.items_target_channels
                    : fp16                                ? dev.items_target_fp16
                                                          : dev.items_target;
  // Small groups on a GPU: wider teams with fewer elements each, up to teams of 64 (H200, 2^25
  // elements: LayerNorm fp32 at 32-64 cols 76-81 % -> 91-92 % of the copy roof, 256-768 cols 77-81 % ->
  // 90-93 %, RMSNorm fp16 at 64 cols 64 % -> 82 %, 128 cols 67 -> 84 %; for larger groups the wider
  // team loses: LayerNorm fp32 at 1024-4096 cols 80-69 % -> 74-46 %).
  if (!dev.cpu && size <= dev.small_group) target = std::min(target, dev.items_target_small);
  const bool latency_bound = uint64_t(g.n_groups) * div_up(size, target) < dev.latency_threads;
  // Latency-bound teams wider than latency_team take twice the elements each (H200, LayerNorm 1x4096 fp32:
  // 512 x 2 vec4s 3.34 us, 256 x 4 3.06 us; 77x512 in a subgroup of 32 x 4 lost: 2.99 -> 3.23 us).
  if (latency_bound) target = div_up(size, dev.latency_items) > dev.latency_team ? 2 * dev.latency_items : dev.latency_items;
  plan.prefetch = latency_bound;
  const uint32_t team_for_target =
      std::max(pow2_ceil(div_up(size, target)), std::min(dev.min_team, pow2_ceil(size)));
  // Cooperative: the item in chunks of one plane each (the split path's chunks), a workgroup holding
  // each chunk in registers, at least items_target_cooperative elements per invocation, all of the
  // item's chunks resident at once (at most cooperative_workgroups; forced, at most 1 where that is 0).
  // Groups that span several channels, in more chunks than the device has multiprocessors, take up to
  // items_target_cooperative_channels each (GPUs: 16, not 8; H200, fp32 / fp16: GroupNorm 960x64x64/32, 480
  // chunks, 17.7 / 17.7 -> 13.5 / 11.0 us; 320x64x64/32, 160 chunks, 9.7 / 9.7 -> 9.3 / 8.3). Not in fewer
  // chunks (96x64x64/32, 48: fp32 7.3 -> 10.0), nor for groups of one channel (InstanceNorm 64x128x128, 128
  // chunks: 7.7 / 7.3 -> 8.6 / 8.4).
  const bool spans_channels = g.weights != GroupLayout::ByPosition && g.channels_per_group > 1;
  // Fills in the plan and returns true, or leaves the plan as it was.
  auto cooperative = [&](uint64_t max_workgroups) {
    const uint32_t plane = g.plane_size();
    // A plane that a smaller workgroup holds at its items target (a group spanning channels: up to
    // items_target_cooperative_channels) is one chunk either way: the smaller workgroup holds it with more
    // elements each (H200, fp32 / fp16, us: GroupNorm 1280x32x32/32, 1024-element planes, 256 x 4 13.2 / 12.9
    // -> 128 x 8 8.9 / 9.0; 1920x32x32/32 14.2 / 13.9 -> 10.3 / 10.0; fp32 1280x40x40/32, 1600, 256 x 7 15.0 ->
    // 128 x 13 9.9, 1920x40x40/32 16.0 -> 11.7). Not where that only makes more chunks (960x64x64/32, 4096:
    // 256 x 16 13.5 / 11.0, 128 x 16 14.2 / 11.5), nor 64-invocation ones (1280x32x32/32 11.0 / 8.4).
    const uint32_t share_items = spans_channels ? dev.items_target_cooperative_channels : dev.items_target_cooperative;
    // The kernel's workgroups are whole subgroups, with or without subgroup reductions: one narrower than the
    // subgroup (Option.max_workgroup_size below it) holding more than 32 elements each came out wrong on lavapipe
    // (LayerNorm 1x40, workgroups of 1: only each invocation's first element stored). A driver fault, by every
    // sign: the loops after the take-over's branch ran one iteration although no workgroup took that branch, and
    // without the call there (everything else the same) the results were right. Only where the workgroup is
    // narrower than llvmpipe's 8-wide vectors and loops of more than 32 are not unrolled. A device that reports no
    // subgroup size (Vulkan 1.0, or VKNORM_VULKAN_API=1.0 over lavapipe) still has one: workgroups are then whole
    // subgroups of any width up to kUnreportedSubgroupWidth.
    const uint32_t subgroup_width = dev.subgroup_size ? dev.subgroup_size : kUnreportedSubgroupWidth;
    auto whole_subgroups = [&](uint32_t wg) { return wg % subgroup_width == 0; };
    // Its shared memory: the split passes' 64 B per invocation and its own few values.
    auto shared_fits = [&](uint32_t wg) { return uint64_t(wg) * 64 + kCooperativeSharedFixed <= dev.max_shared; };
    auto workgroup_for = [&](uint64_t chunk) {
      uint32_t wg = dev.preferred_workgroup;
      while (wg / 2 >= 1 && whole_subgroups(wg / 2) &&
             (!shared_fits(wg) ||
              (wg / 2 >= dev.cooperative_min_workgroup && chunk <= uint64_t(wg / 2) * share_items)))
        wg /= 2;
      return wg;
    };
    auto take = [&](uint32_t wg, uint32_t chunk_size, uint32_t n_chunks, bool chunk_weights) {
      if (!whole_subgroups(wg) || !shared_fits(wg)) return false;
      plan.path = Path::Cooperative;
      plan.wg = plan.team = wg;
      plan.subgroup = dev.subgroup_reduce;
      plan.vec4 = plan.one_reduction = plan.hold_storage = plan.plane_weights = false;
      plan.prefetch = chunk_weights;
      plan.chunk_size = chunk_size;
      plan.n_chunks = n_chunks;
      plan.items = items_for(chunk_size, wg);
      return true;
    };
    const uint32_t wg = workgroup_for(plane);
    const uint32_t limit = std::max(dev.cooperative_workgroups, 1u);
    for (uint32_t items = std::min(dev.items_target_cooperative, dev.max_items); items <= dev.max_items; items *= 2) {
      const uint32_t per_plane = uint32_t(div_up(plane, uint64_t(wg) * items));
      if (uint64_t(per_plane) * g.planes > limit) continue;
      const uint64_t workgroups = uint64_t(per_plane) * g.planes * g.n_groups;
      if (spans_channels && dev.compute_units && workgroups > dev.compute_units && per_plane > 1 &&
          2 * items <= std::min(dev.items_target_cooperative_channels, dev.max_items))
        continue;
      if (workgroups > max_workgroups) return false;
      // The chunk's per-channel weights loaded during the wait (H200, GroupNorm 320x64x64/32: fp32 11.3 ->
      // 9.7 us, fp16 10.9 -> 9.5); not for groups of one channel (InstanceNorm 32x224x224 fp16 8.4 -> 8.9,
      // 64x128x128 7.3 -> 7.7; fp32 the same).
      return take(wg, uint32_t(div_up(plane, per_plane)), per_plane * g.planes, spans_channels);
    }
    // More planes than resident workgroups (GroupNorm(2, 640) on 16x16: 80 planes of 256 per group): chunks of
    // the fewest whole planes that fit, where a packed element holds one group (pack1, or pack4 groups of whole
    // planes), so its group slots are the same in every plane (norm_cooperative.comp, id 18). H200, fp32 / fp16:
    // GroupNorm 640x16x16/2 11.7 / 12.5 -> 7.2 / 7.0 us, 640x32x32/2 11.6 / 12.4 -> 8.6 / 8.9 (split before).
    if (g.planes > limit && (g.elempack == 1 || g.channels_per_group % 4 == 0)) {
      const uint32_t planes_per_chunk = uint32_t(div_up(g.planes, limit));
      const uint64_t chunk = uint64_t(planes_per_chunk) * plane;
      const uint32_t n_chunks = uint32_t(div_up(g.planes, planes_per_chunk));
      const uint32_t chunk_wg = workgroup_for(chunk);
      if (items_for(uint32_t(chunk), chunk_wg) > dev.max_items || uint64_t(n_chunks) * g.n_groups > max_workgroups) return false;
      return take(chunk_wg, uint32_t(chunk), n_chunks, false);
    }
    return false;
  };
  // Auto plans it (H200, interleaved A/B, docs/benchmarks) for fewer groups than the device has multiprocessors,
  // each of >= cooperative_min_group packed elements, which the fused kernel runs in too few workgroups
  // (InstanceNorm 64x128x128: 14.8 -> 7.7 us; GroupNorm 320x64x64/32 14.6 -> 11.4 us, split before; smaller
  // groups lose: GroupNorm 640x32x32/32 6.8 -> 9.5 us, rows that fill the GPU fused lose 25-50 %). Groups too
  // large for the fused kernel go split: LayerNorm 1024x32768 fp32 117 us there (its reduce holding its
  // chunks), 131 cooperative; RMSNorm 109 against 124.
  const bool cooperative_auto = !dev.cpu && dev.cooperative_workgroups >= 2;
  // ... and only while its workgroups are few enough to run in a few waves (cooperative_max_per_unit per
  // multiprocessor): in many waves every workgroup's wait adds up (H200, rows of 65536 cols, 128 groups in
  // 4096 workgroups: LayerNorm fp32 136 us cooperative, 109 split; RMSNorm fp16 108 against 67; one such
  // row, 32 workgroups: 7.1-7.6 us cooperative, 10.3-11.2 split).
  const bool few_groups = g.n_groups < dev.compute_units;
  const bool few_large_groups = few_groups && g.group_size >= dev.cooperative_min_group;
  // ... and for few pack4 groups spanning many small channel planes, which the fused kernel (a group per
  // workgroup) runs far below its speed on fewer, larger planes (H200, fp32 / fp16, us, fused -> cooperative:
  // GroupNorm 1280x16x16/8, 40 planes of 256, 512 x 20: 15.4 / 17.9 -> 7.7 / 7.6; 512x16x16/4, 32 planes:
  // 9.6 / 8.7 -> 6.7 / 6.7; 320x20x20/4, 20 planes of 400: 9.3 / 7.9 -> 7.0 / 7.2; 1280x24x24/16, 20 of 576:
  // 10.0 / 8.7 -> 7.9 / 8.3; 512x8x8/1, 128 planes of 64: 9.6 / 8.5 -> 6.7 / 6.8). Not fewer planes
  // (512x32x32/16, 8 planes of 1024: 6.9 / 5.8 -> 7.1 / 7.8), nor fewer elements (640x16x16/8, 20 planes of
  // 256: 5.4 / 4.6 -> 6.9 / 6.9), in float16 fewer than 7680 (384x16x16/4, 24 of 256: 5.8 -> 6.7; 768x12x12/4,
  // 48 of 144: 7.1 -> 7.3; but 960x16x16/8, 30 of 256: 7.7 -> 7.1).
  const uint32_t many_planes_min_group = fp16 ? dev.many_planes_min_group_fp16 : dev.many_planes_min_group;
  // Measured on groups of whole packed planes only (channels a multiple of 4), not inside pack4 lanes.
  const bool few_many_plane_groups = few_groups && spans_channels && g.elempack == 4 && g.channels_per_group % 4 == 0 &&
                                     dev.many_planes && g.planes >= dev.many_planes &&
                                     g.group_size >= many_planes_min_group;
  const uint64_t cooperative_auto_workgroups = uint64_t(dev.cooperative_max_per_unit) * dev.compute_units;
  // Few groups, each in a full team holding many elements per invocation: a few multiprocessors at their
  // register cap do all the work. The cooperative kernel spreads each group over chunks, where they fit
  // few to a multiprocessor (H200, fp32 / fp16, us: GroupNorm 960x32x32/32 1024 x 15 35.6 / 42.5 ->
  // 8.5 / 8.4, 96x64x64/32 17.0 / 18.4 -> 7.3 / 8.0; InstanceNorm 16x96x96 9.9 / 8.5 -> 6.9 / 6.8,
  // 32x112x112 12.5 / 9.6 -> 6.9 / 6.8; LayerNorm 64x12288 13.5 / 9.9 -> 8.3 / 8.0; RMSNorm 9.5 / 8.2 ->
  // 7.9 / 8.4). In more workgroups it loses (GroupNorm 1920x32x32/32 fp16, 480 of them: 9.6 -> 9.9 us),
  // and with 8 elements each it gains little (RMSNorm 16x8192 fp32 1024 x 8: 7.2 either way).
  // Float32 vec4s past full_team_spill_items each spill out of the team's registers, and for groups spanning
  // channels the cooperative kernel wins in more workgroups (fp32: GroupNorm 1920x32x32/32, 1024 x 15:
  // 15.3 -> 10.3 us in 480 of 128 x 8; 1280x40x40/32, 1024 x 16: 14.1 -> 9.9 in 320 of 128 x 13). Not with
  // 13 each (InstanceNorm 256x112x112 13.1 -> 14.7), nor for groups of one channel (InstanceNorm
  // 256x120x120, 1024 x 15: 14.7 -> 15.5). Float16 held as stored, past 15 each: GroupNorm 1280x40x40/32, 1024 x
  // 16: 10.4 -> 8.9 us in 320 of 128 x 13; at 15 level (1920x32x32/32 9.7 -> 9.5), 8-10 lose (1280x32x32/32 6.5
  // -> 9.0, 640x40x40/32 6.5 -> 7.9).
  auto full_team_cooperative = [&](uint32_t team, uint32_t items) {
    if (!cooperative_auto || !few_groups || team != dev.full_team || !dev.full_team_max_items ||
        items <= dev.full_team_max_items)
      return false;
    const uint32_t spill_items = held ? dev.full_team_spill_items_held : dev.full_team_spill_items;
    const bool spills = spans_channels && (vec4 || g.elempack == 4) && spill_items && items > spill_items;
    const uint32_t per_unit = spills ? dev.cooperative_max_per_unit : dev.cooperative_max_per_unit_full_teams;
    return cooperative(uint64_t(per_unit) * dev.compute_units);
  };
  switch (want) {
    case Path::Cooperative:
      if (cooperative(UINT64_MAX)) return plan;
      break;
    case Path::Auto: {
      if (cooperative_auto && (few_large_groups || few_many_plane_groups) && cooperative(cooperative_auto_workgroups))
        return plan;
      uint32_t team = std::min(dev.max_workgroup, team_for_target);
      // Fewer groups than multiprocessors, per-channel weights: a group per workgroup, each workgroup on a
      // multiprocessor of its own, where the size rules give wide teams (latency-bound: a few elements each;
      // larger: items_target each, up to 1024) that reduce across up to 32 subgroups. The narrowest team down to
      // few_group_min_team (128) that holds the group in at most few_group_items elements each (vec4s where it reads
      // them; float16 held as stored: at least max_items) keeps more loads in flight per invocation and reduces
      // across fewer subgroups; with one workgroup per multiprocessor nothing else needs its registers. H200,
      // fp32 / fp16, us (A/Bs, old and new rule interleaved in one process): GroupNorm
      // 640x32x32/32 1024 x 5 6.50 / 512 x 10 4.94 -> 256 x 20 5.69 / 4.74; 1280x16x16/32 1024 x 3 5.66 / 512 x 5
      // 4.45 -> 256 x 10 4.53 / 3.74; 1280x32x32/32 1024 x 10 9.46 / 7.91 -> 512 x 20 8.59 / 6.40; 960x16x16/8
      // fp32 1024 x 8 10.6 -> 512 x 15 9.2; InstanceNorm 256x96x96 1024 x 9 10.8 / 9.0 -> 512 x 18 8.3 / 6.7.
      // Float16 teams holding more than 20 each went both ways (GroupNorm 1920x32x32/32 1024 x 15 9.7 -> 512 x 30
      // 8.0, 256x64x64/32 512 x 16 5.7 -> 256 x 32 9.9; InstanceNorm 320x128x128 1024 x 16 11.8 -> 512 x 32 16.2).
      // Teams of 128 rather than 256, where they hold the group (A/B, fp32 / fp16, us): GroupNorm 1280x16x16/32
      // 256 x 10 4.57 / 3.84 -> 128 x 20 4.09 / 3.81, 1280x8x8/32 3.30 / 3.21 -> 3.20 / 3.14, 32x40x40/32 3.76 /
      // 3.53 -> 3.57 / 3.43; InstanceNorm 128x32x32 3.60 / 3.48 -> 3.41 / 3.29; none slower (64 lost: 2560x8x8/32
      // fp16 128 x 10 3.26, 64 x 20 3.72).
      // Not for groups inside pack4 lanes, where narrower teams lost (held float16 teams, below), nor where the
      // full-team rule spreads the group over the cooperative kernel (a handful of groups: InstanceNorm 16x96x96).
      bool full_team_tried = false;
      if ((latency_bound || dev.few_group_any_size) && few_groups && g.weights != GroupLayout::ByPosition &&
          !mixed && dev.few_group_items) {
        full_team_tried = items_for(size, team) <= items_cap;
        if (full_team_tried && full_team_cooperative(team, items_for(size, team))) return plan;
        const uint32_t most = held ? std::max(dev.max_items, dev.few_group_items) : dev.few_group_items;
        // Below preferred_workgroup only for whole planes: lanes of groups lost there (320x16x16/32 fp32 256 x 3
        // 3.60 -> 128 x 6 3.70 us).
        const uint32_t narrowest =
            lane_groups ? dev.preferred_workgroup : std::min(dev.preferred_workgroup, dev.few_group_min_team);
        while (team / 2 >= narrowest && items_for(size, team / 2) <= most) team /= 2;
        // A handful of float32 groups that still take a team wider than preferred_workgroup, many elements each: a
        // few multiprocessors each load a large group, where the cooperative kernel spreads it over many. H200, us,
        // fused -> cooperative, 512 x 16: GroupNorm 64x32x32/2 9.14 -> 6.88, 128x32x32/4 9.15 -> 6.93, 256x32x32/8
        // 9.43 -> 6.98, 320x28x28/8 9.35 -> 7.18; 512 x 13-14: 96x24x24/2 8.30 -> 6.77, 32x28x28/1 7.33 -> 6.56,
        // 64x56x56/8 7.50 -> 7.24. Not 12 each (48x32x32/2 6.64 -> 6.81, 960x14x14/8 6.93 -> 7.15), nor from 16
        // groups (512x32x32/16 6.91 against 7.11), nor teams of 256 (32x32x32/2 256 x 16 4.47 against 6.60;
        // InstanceNorm 32x64x64 4.81 against 6.86), nor float16 held as stored, level or faster fused (64x32x32/2,
        // 128x32x32/4, 256x32x32/8: 7.96-8.08 against 7.70-7.81; GroupNorm 512x7x7/1 512 x 13 6.42 against 6.84).
        // Teams capped at 512 (VKNORM_MAX_SHARED_MEMORY=16384) gain most: GroupNorm 12x56x56/1 512 x 19 11.44 ->
        // 7.02, 64x48x48/4 11.37 -> 6.93, InstanceNorm 16x96x96 512 x 18 7.29 -> 6.84. Measured on groups of whole
        // packed planes and InstanceNorm, not on groups inside pack4 lanes.
        if (cooperative_auto && !fp16 && !lane_groups && team > dev.preferred_workgroup &&
            items_for(size, team) > dev.few_wide_team_items && g.n_groups <= dev.few_wide_team_groups &&
            cooperative(cooperative_auto_workgroups))
          return plan;
        // Narrower than the team the group would take where nothing caps teams (16 KB of shared memory caps them at
        // 512, as Option.max_workgroup_size may): as narrowed, `most` each. H200 with teams capped at 512, fp32 /
        // fp16, us: GroupNorm 1280x32x32/32 cooperative 13.4 / 12.7 -> 512 x 20 8.6 / 6.3; lost: one group of 12
        // channels, 12x56x56/1, split 10.8 / 10.5 -> 512 x 19 11.4 / 12.3 (float32 since cooperative, above: 7.0).
        if (team < std::min(dev.full_team, team_for_target)) items_cap = std::max(items_cap, most);
      }
      // float16 held as stored (H200, 2^25 elements, % of the copy roof): teams of at most max_team_held
      // while max_items each suffice (8192 cols: LayerNorm 41 -> 58 %, RMSNorm 52 -> 62 %: 1024-invocation
      // teams run at their register cap; 16384 cols in 512 x 32 lose: 50 -> 40 %); RMSNorm's small groups in
      // one subgroup, not a workgroup of 64 (256 and 768 cols: 76 -> 85 %; LayerNorm's one reduction needs
      // the workgroup team, and loses there), unless latency-bound (197x768: 3.0 -> 3.9 us in a subgroup).
      // LayerNorm rows, held: teams of at most max_team_held_layernorm while max_items each suffice (4096 cols
      // pack4: 512 x 8 49.4 us, 256 x 16 43.8 us, 70 -> 79 % of the copy roof; 2048 cols stays 256 x 8:
      // 128 x 16 lost 90 -> 86 %). RMSNorm keeps 8 each (16 lost 4-10 points at 1024-4096 cols).
      const bool layernorm_rows = centres(op) && g.weights == GroupLayout::ByPosition && !latency_bound;
      // Not for groups inside lanes (pack4, channels per group not a multiple of 4), whose teams also map
      // lanes to groups per element: GroupNorm 320x32x32/32 fp16 512 x 10 10.3 us, 1024 x 5 7.1 (960x16x16/32:
      // 512 x 8 9.2, 1024 x 4 9.5).
      if (held && !mixed)
        for (uint32_t cap : {layernorm_rows ? dev.max_team_held_layernorm : dev.max_team_held, dev.max_team_held})
          if (team > cap && items_for(size, cap) <= dev.max_items && fused(cap)) return plan;
      if (held && !centres(op) && !dev.cpu && !latency_bound && size <= dev.small_group) team = std::min(team, subgroup);
      // Few groups that no team holds: cooperative rather than split where it runs them in a few waves (H200: one
      // row of 65536, 32 workgroups, 7.1-7.6 us cooperative, 10.3-11.2 split; GroupNorm 320x64x64/32 11.4 against
      // 14.6). Groups past cooperative_min_group went there above; this takes those below it that a device with
      // narrower teams cannot hold (teams capped at 512: 16 KB of shared memory, or Option.max_workgroup_size),
      // which the full-team rule sends there from 1024-wide teams. H200 with teams capped at 512
      // (VKNORM_MAX_SHARED_MEMORY=16384), fp32 / fp16, us: GroupNorm 1920x32x32/32 split 13.7 / 12.9 ->
      // cooperative in teams of 128 9.5 / 9.4, 1280x40x40/32 14.4 / 13.7 -> 10.0 / 8.9.
      if (!fused(team)) {
        if (cooperative_auto && few_groups && cooperative(cooperative_auto_workgroups)) return plan;
        break;
      }
      // (the items the group needs, not a power of two rounded up for a plan without the group size as a constant)
      if (!full_team_tried) full_team_cooperative(plan.team, items_for(size, plan.team));  // else stays fused
      return plan;
    }
    case Path::Subgroup:
      if (fused(std::min(subgroup, team_for_target))) return plan;
      [[fallthrough]];
    case Path::Workgroup:
      if (fused(std::max(std::min(dev.max_workgroup, team_for_target), std::min(2 * subgroup, dev.max_workgroup))))
        return plan;
      break;
    case Path::Split:
      break;
  }

  plan.path = Path::Split;
  plan.wg = dev.preferred_workgroup;
  plan.vec4 = false;
  plan.prefetch = plan.plane_weights = false;
  plan.one_reduction = false;
  plan.hold_storage = false;
  plan.team = 1;
  plan.items = 1;
  const uint32_t size_all = g.group_size;
  const uint64_t chunks_wanted = div_up(kTargetItems, g.n_groups);
  plan.chunk_size = uint32_t(std::max<uint64_t>(div_up(size_all, chunks_wanted), std::min(size_all, kMinChunk)));
  plan.n_chunks = uint32_t(div_up(size_all, plan.chunk_size));
  if (g.planes > 1) {  // chunks never straddle planes (common.glsl chunk_range): the same number in each
    const uint32_t plane = g.plane_size();
    const uint32_t per_plane = uint32_t(div_up(plane, std::min(plan.chunk_size, plane)));
    plan.chunk_size = uint32_t(div_up(plane, per_plane));
    plan.n_chunks = per_plane * g.planes;
  }
  // LayerNorm-type chunks the reduce pass holds in registers for its second pass (the squares about the
  // chunk mean) where they fit, instead of re-reading them (H200: GroupNorm 640x16x16/2 fp32 13.8 -> 11.7 us,
  // 320x64x64/32 14.7 -> 13.0 us); float32 rows in chunks of at most a workgroup's items_target_reduce each
  // so that they fit (LayerNorm 1024x32768: 140 -> 117 us, 47 -> 57 % of the copy roof). float16 rows keep
  // their larger chunks, re-read (512x65536: 87 us, 97 in held chunks).
  const bool hold_reduce = centres(op) && dev.hold_reduce;
  if (hold_reduce && !fp16 && g.planes == 1 && plan.chunk_size > plan.wg * dev.items_target_reduce) {
    plan.chunk_size = plan.wg * dev.items_target_reduce;
    plan.n_chunks = uint32_t(div_up(size_all, plan.chunk_size));
  }
  plan.reduce_team = std::min(plan.wg, pow2_ceil(div_up(plan.chunk_size, dev.items_target_reduce)));
  plan.reduce_items = items_for(plan.chunk_size, plan.reduce_team);
  if (!hold_reduce || plan.reduce_items > dev.max_items) plan.reduce_items = 1;
  plan.finalize_team = std::min(plan.wg, pow2_ceil(plan.n_chunks));
  return plan;
}

}  // namespace

// GroupNorm in pack4 with groups of 2 mod 4 channels, at least lane_groups_min_channels: an item per group where
// that runs fused and the items of two groups run fused too, or cooperative for want of registers (groups
// below cooperative_min_group that the full-team rule spreads). The items of two groups run in half the
// workgroups, each mapping lanes to groups per element; an item per group reads the plane it shares with the
// other group (a fifth more at 10 channels per group, from the cache once the other has read it; every element
// twice at 2) and reduces one group. H200, fp32 / fp16, us, items of two groups -> of one (interleaved A/Bs):
// GroupNorm 320x32x32/32 7.76 / 7.07 -> 4.93 / 4.83, 320x16x16/32 4.90 / 4.96 -> 3.69 / 3.77, 960x16x16/32
// 9.34 / 9.36 -> 4.42 / 4.24, 960x8x8/32 4.16 / 4.44 -> 3.92 / 3.63; from the cooperative kernel: 960x24x24/32
// 7.71 / 8.16 -> 5.45 / 7.59, 320x48x48/32 8.02 / 8.77 -> 7.46 / 8.53, 960x32x32/32 8.32 / 9.04 -> 8.29 / 9.32. At 6
// channels per group (in the vec4 variant): 192x32x32/32 6.31 / 6.00 -> 4.56 / 4.29, 192x48x48/32 17.57 / 19.18 ->
// 5.73 / 6.79, 96x32x32/16 6.21 / 5.83 -> 4.66 / 4.01, 192x16x16/32 3.49 / 3.50 -> 3.42 / 3.36; from the cooperative
// kernel: 192x64x64/32 8.04 / 8.56 -> 8.16 / 7.62.
// Not for few large groups, which stay cooperative items of two groups: an item per group in a 1024-invocation
// fused team lost (vec4 variant: 320x64x64/32 9.23 / 8.45 -> 12.95 / 9.98 us, 960x40x40/32 9.69 / 8.45 -> 12.57 /
// 10.50), and as cooperative chunks its whole-plane analogue was no faster (384x64x64/32 11.12 / 8.29 against
// 9.18 / 8.35). Nor at 2 channels per group, where each group reads every element of its planes (12x7x7/6 fp32
// 2.85 -> 2.97, 64x32x32/32 3.52 -> 4.00, 128x16x16/64 3.21 -> 3.29).
Plan plan_dispatch(const GroupLayout& g, const DeviceCaps& dev, const Option& opt, bool fp16, NormOp op) {
  Path want = opt.path;
  if (want == Path::Auto) want = env_path();
  const Plan items = plan_layout(g, dev, want, fp16, op, false);
  const auto fused = [](const Plan& p) { return p.path == Path::Subgroup || p.path == Path::Workgroup; };
  const bool spread = items.path == Path::Cooperative && want == Path::Auto && g.group_size < dev.cooperative_min_group;
  const std::optional<GroupLayout> view = lane_group_view(g);
  if (view && dev.lane_groups_min_channels && g.channels_per_group >= dev.lane_groups_min_channels &&
      (fused(items) || spread)) {
    Plan plan = plan_layout(*view, dev, want, fp16, op, true);
    if (fused(plan)) {
      plan.lane_groups = true;
      return plan;
    }
  }
  return items;
}

std::string variant_name(const std::string& shader, bool fp16, const std::string& layout, bool subgroup,
                         bool out_of_place) {
  return shader + (out_of_place ? "_oop" : "") + "_fp" + (fp16 ? "1" : "0") + "_p" + layout + "_sg" + (subgroup ? "1" : "0");
}

namespace {
// The partials of every chunk and group, indexed in 32 bits by the kernels.
void check_chunk_indexing(uint64_t chunks, const GroupLayout& g) {
  if ((2 * chunks + g.n_groups) * g.elempack > 0xffffffffull)
    throw std::invalid_argument("too many chunks for 32-bit indexing: " + std::to_string(chunks) + " chunks of " +
                                std::to_string(g.n_groups) + " groups (their partials past 2^32 - 1 floats)");
}
}  // namespace

ForwardPlan plan_forward(NormOp op, bool affine, float eps, const GroupLayout& blob, bool fp16, const DeviceCaps& dev,
                         const Option& opt, const Fusion& fusion) {
  // An empty blob has nothing to plan (the layers refuse it first; the planner divides by these).
  if (blob.n_groups == 0 || blob.group_size == 0) throw std::invalid_argument("nothing to normalize: the blob is empty");
  ForwardPlan f;
  f.kernel = plan_dispatch(blob, dev, opt, fp16, op);
  f.layout = blob;
  // The items the kernels run: the blob's, or an item per group (lane_groups).
  const GroupLayout g = f.kernel.lane_groups ? *lane_group_view(blob) : blob;
  f.fp16 = fp16;
  const Plan& plan = f.kernel;
  const uint32_t op_id = op == NormOp::RMSNorm ? 1 : 0;
  const uint32_t affine_id = affine ? 1 : 0;
  const std::string pack = g.elempack == 4 ? "4" : "1";
  PushConstants pc{g.group_size, g.gpc, g.cstep, g.n_groups, plan.chunk_size, plan.n_chunks, plan.team, eps};
  // The group model's constants (common.glsl ids 8-10): planes per item, where weights come from
  // (per channel: one per element in pack1, four lanes in pack4), channels per group for pack4 lanes.
  const uint32_t weights = g.weights == GroupLayout::ByChannel && g.elempack == 4 ? 2u : uint32_t(g.weights);
  const uint32_t cpg = g.elempack == 4 ? g.channels_per_group : 1u;
  const bool by_chunk = g.weights != GroupLayout::ByPosition;  // split apply: chunk by chunk (norm_apply.comp)
  const bool merges = by_chunk && dev.apply_merges;
  uint32_t alpha_bits;
  std::memcpy(&alpha_bits, &fusion.alpha, 4);
  auto model = [&](std::vector<uint32_t> spec) {
    spec.insert(spec.end(), {g.planes, weights, cpg, merges ? 1u : 0u, uint32_t(fusion.residual),
                             uint32_t(fusion.activation), alpha_bits, plan.hold_storage ? 1u : 0u});
    return spec;
  };
  // The kernels that write the output take their out-of-place variant (a read-only input) for residual 1-3.
  const bool out_of_place = fusion.residual != Fusion::None;
  auto pass = [&](const std::string& shader, const std::string& layout, bool subgroup, std::vector<uint32_t> spec,
                  uint64_t workgroups, bool after_previous) {
    const bool writes_output = shader == "norm_fused" || shader == "norm_cooperative" || shader == "norm_apply";
    f.passes.push_back(Pass{variant_name(shader, fp16, layout, subgroup, out_of_place && writes_output), std::move(spec),
                            pc, plan.wg, workgroups, after_previous});
  };
  if (plan.path == Path::Cooperative) {
    const uint64_t items = uint64_t(g.n_groups) * plan.n_chunks;
    check_chunk_indexing(items, g);
    // Partials as the split path's; slot 4: two counts per item, counter_stride uints apart, then a claim per
    // chunk (norm_cooperative.comp, norm_clear.comp).
    f.partials_bytes = (2 * items + g.n_groups) * g.elempack * sizeof(float);
    f.coefs_bytes = (uint64_t(g.n_groups) * dev.counter_stride + items) * sizeof(uint32_t);
    f.counters = true;
    f.counters_layout = {g.n_groups, plan.n_chunks, dev.counter_stride};
    pc.team = plan.wg;
    // Every constant a kernel declares gets a value (ncnn checks the count): ids 0-15, 16 the counter stride
    // (both kernels), and the cooperative kernel's 17-19.
    std::vector<uint32_t> spec =
        model({plan.wg, op_id, affine_id, plan.items, plan.prefetch ? 1u : 0u, plan.wg,
               dev.specialize_shape ? g.group_size : 0u, 0});
    spec.push_back(dev.counter_stride);
    f.passes.push_back(Pass{variant_name("norm_clear", false, "1", false), spec, pc, plan.wg,
                            div_up(g.n_groups + items, plan.wg), false, /*clears_counters=*/true});
    spec.push_back(dev.poll_loads ? 1u : 0u);
    spec.push_back(plan.chunk_size > g.plane_size() ? 1u : 0u);  // id 18: chunks of whole planes
    spec.push_back(dev.wait_rounds);                              // id 19
    pass("norm_cooperative", pack, plan.subgroup, spec, items, true);
    return f;
  }
  if (plan.path != Path::Split) {
    if (plan.vec4 && g.elempack == 1) pc.group_size /= 4, pc.cstep /= 4;  // the kernel counts vec4s
    const bool fixed = dev.specialize_shape;
    const uint32_t early_weights = plan.prefetch ? 1u : plan.plane_weights ? 2u : 0u;  // common.glsl id 4
    std::vector<uint32_t> spec = model({plan.wg, op_id, affine_id, plan.items, early_weights, fixed ? plan.team : 0u,
                                        fixed ? pc.group_size : 0u, plan.one_reduction ? 1u : 0u});
    spec.push_back(plan.lane_groups ? 1u : 0u);  // id 16: an item per group inside pack4 lanes
    pass("norm_fused", plan.vec4 ? "v4" : pack, plan.subgroup, spec, plan.fused_workgroups(g), false);
    return f;
  }
  const uint64_t items = uint64_t(g.n_groups) * plan.n_chunks;
  check_chunk_indexing(items, g);
  // Per-channel weights: apply works chunk by chunk, on GPUs each chunk's team merging its item's
  // partials itself (no finalize pass); by position: finalize, then every element, grid-stride.
  f.partials_bytes = (2 * items + g.n_groups) * g.elempack * sizeof(float);  // means, M2s, pivots
  f.coefs_bytes = merges ? 0 : 3ull * g.n_groups * g.elempack * sizeof(float);
  // The group size as a constant here too: element -> plane and item -> element divisions fold.
  const std::vector<uint32_t> spec =
      model({plan.wg, op_id, affine_id, 1, 0, 0, dev.specialize_shape ? g.group_size : 0u, 0});
  pc.team = plan.reduce_team;
  std::vector<uint32_t> reduce_spec = spec;
  reduce_spec[3] = plan.reduce_items;  // ITEMS: > 1 holds the chunk (norm_reduce.comp)
  pass("norm_reduce", pack, false, reduce_spec, plan.reduce_workgroups(g), false);
  if (!merges) {
    pc.team = plan.finalize_team;
    pass("norm_finalize", pack, false, spec, plan.finalize_workgroups(g), true);
  }
  pc.team = by_chunk ? plan.reduce_team : 1;
  std::vector<uint32_t> apply_spec = spec;
  apply_spec.push_back(!by_chunk && dev.apply_last_first ? 1u : 0u);  // id 16 (norm_apply.comp)
  pass("norm_apply", pack, false, apply_spec, by_chunk ? plan.reduce_workgroups(g) : plan.apply_workgroups(g), true);
  return f;
}

Grid fold_workgroups(uint64_t workgroups, uint32_t max_count_x) {
  const uint64_t x = std::min<uint64_t>(workgroups, std::max<uint32_t>(max_count_x, 1));
  return {uint32_t(x), uint32_t(x ? (workgroups + x - 1) / x : 1)};
}

DispatchInfo dispatch_info(const ForwardPlan& fp) {
  const Plan& plan = fp.kernel;
  DispatchInfo info;
  info.path = plan.path;
  info.workgroup_size = plan.wg;
  // A clear of the cooperative kernel's counters runs only where they are fresh: not counted.
  info.dispatches = int(std::count_if(fp.passes.begin(), fp.passes.end(), [](const Pass& p) { return !p.clears_counters; }));
  if (plan.path == Path::Cooperative) info.team = plan.wg, info.items = plan.items, info.chunks = plan.n_chunks,
                                       info.subgroup = plan.subgroup;
  else if (plan.path != Path::Split) info.team = plan.team, info.items = plan.items, info.subgroup = plan.subgroup, info.vec4 = plan.vec4,
                                 info.one_reduction = plan.one_reduction, info.hold_storage = plan.hold_storage;
  else info.team = plan.reduce_team, info.items = plan.reduce_items, info.chunks = plan.n_chunks;
  info.prefetch = plan.prefetch;
  info.plane_weights = plan.plane_weights;
  for (const Pass& p : fp.passes)  // norm_apply.comp's id 16, the last of its constants
    if (p.variant.rfind("norm_apply", 0) == 0) info.apply_last_first = p.specialization.back() != 0;
  info.lane_groups = plan.lane_groups;
  return info;
}

uint64_t Plan::fused_workgroups(const GroupLayout& g) const { return div_up(g.n_groups, wg / team); }  // vec4: same groups
uint64_t Plan::reduce_workgroups(const GroupLayout& g) const {
  return div_up(uint64_t(g.n_groups) * n_chunks, wg / reduce_team);
}
uint64_t Plan::finalize_workgroups(const GroupLayout& g) const { return div_up(g.n_groups, wg / finalize_team); }
uint64_t Plan::apply_workgroups(const GroupLayout& g) const {
  return std::min(div_up(uint64_t(g.n_groups) * g.group_size, wg), kMaxApplyWorkgroups);
}

SpirvNeeds spirv_needs(const std::string& variant) {
  const shaders::Spirv spv = shaders::find(variant.c_str());
  if (!spv.words || spv.count < 5) throw std::logic_error("vknorm: no shader variant " + variant);
  SpirvNeeds n;
  n.vulkan_1_1 = spv.words[1] > 0x00010000u;  // the version word: 1.0 is 0x00010000
  constexpr uint32_t kOpCapability = 17, kStorageBuffer16BitAccess = 4433, kUniformAndStorageBuffer16BitAccess = 4434;
  for (size_t i = 5; i < spv.count;) {
    const uint32_t words = spv.words[i] >> 16, opcode = spv.words[i] & 0xffffu;
    if (words == 0) break;
    if (opcode == kOpCapability && words >= 2 && i + 1 < spv.count) {
      const uint32_t cap = spv.words[i + 1];
      n.storage_16bit = n.storage_16bit || cap == kStorageBuffer16BitAccess || cap == kUniformAndStorageBuffer16BitAccess;
    }
    i += words;
  }
  return n;
}

bool needs_16bit_storage(const ForwardPlan& plan) {
  for (const Pass& pass : plan.passes)
    if (spirv_needs(pass.variant).storage_16bit) return true;
  return false;
}

BindingLimit binding_limit(uint64_t max_storage_buffer_range) {
  BindingLimit l{max_storage_buffer_range ? max_storage_buffer_range : ~0ull, "maxStorageBufferRange"};
  if (const uint64_t knob = env_positive("VKNORM_MAX_BUFFER_BYTES"); knob && knob < l.bytes) l = {knob, "VKNORM_MAX_BUFFER_BYTES"};
  return l;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return false;
  std::string word(v);
  for (char& ch : word) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (word == "1" || word == "true" || word == "on" || word == "yes") return true;
  if (word == "0" || word == "false" || word == "off" || word == "no") return false;
  // "false" had read as on: a switch set to a word it does not know is refused, not guessed at
  throw std::invalid_argument(std::string(name) + "=" + v +
                              ": expected 1, true, on or yes (on), or 0, false, off, no or nothing (off)");
}

uint32_t env_api_cap() {
  const char* v = std::getenv("VKNORM_VULKAN_API");
  if (!v || !*v) return VK_API_VERSION_1_3;
  const std::string s(v);
  if (s == "1.0") return VK_API_VERSION_1_0;
  if (s == "1.1") return VK_API_VERSION_1_1;
  if (s == "1.2") return VK_API_VERSION_1_2;
  if (s == "1.3") return VK_API_VERSION_1_3;
  throw std::invalid_argument("VKNORM_VULKAN_API=" + s + ": expected 1.0, 1.1, 1.2 or 1.3");
}

void apply_capability_profile(DeviceInfo& info) {
  const bool vulkan_1_0 = env_api_cap() < VK_API_VERSION_1_1;
  if (vulkan_1_0 || env_flag("VKNORM_NO_SUBGROUP")) info.subgroup_ops.clear(), info.subgroup_compute = false;
  if (vulkan_1_0 || env_flag("VKNORM_NO_FP16_STORAGE")) info.storage_16bit = false;
  if (const uint64_t cap = env_max_shared_memory())
    info.max_shared_memory = uint32_t(std::min<uint64_t>(info.max_shared_memory, cap));
}

uint64_t env_max_shared_memory() {
  const uint64_t cap = env_positive("VKNORM_MAX_SHARED_MEMORY");
  if (cap && cap < 256) throw std::invalid_argument("VKNORM_MAX_SHARED_MEMORY=" + std::to_string(cap) + ": at least 256 bytes");
  return cap;
}

Path env_path() {
  const char* env = std::getenv("VKNORM_PATH");
  if (!env) return Path::Auto;
  try {
    return parse_path(env);
  } catch (const std::invalid_argument& e) {  // set long ago, perhaps: name where the value comes from
    throw std::invalid_argument(std::string("VKNORM_PATH=") + env + ": " + e.what());
  }
}

std::optional<uint64_t> env_cooperative_workgroups() {
  return env_count("VKNORM_COOPERATIVE_WORKGROUPS", "a whole number of workgroups (0: no cooperative kernel)");
}

std::optional<uint64_t> env_buffer_cache_bytes() {
  return env_count("VKNORM_BUFFER_CACHE_BYTES", "a whole number of bytes (0: keep no freed buffers)");
}

std::optional<uint64_t> env_pipeline_cache_count() {
  return env_count("VKNORM_PIPELINE_CACHE_COUNT", "a whole number of pipelines (0: keep none)");
}

std::optional<uint64_t> env_fence_spin_us() {
  return env_count("VKNORM_FENCE_SPIN_US", "a whole number of microseconds (0: never poll)");
}

uint64_t env_max_device_bytes() { return env_positive("VKNORM_MAX_DEVICE_BYTES"); }

uint64_t env_subgroup_size() { return env_positive("VKNORM_SUBGROUP_SIZE"); }

uint64_t env_conversion_bytes_per_thread() { return env_positive("VKNORM_TUNE_CONVERSION_BYTES_PER_THREAD"); }

std::optional<uint64_t> env_conversion_threads() {
  return env_count("VKNORM_TUNE_CONVERSION_THREADS", "a whole number of threads (0 or 1: one)");
}

std::vector<std::pair<std::string, std::string>> setting_problems() {
  std::vector<std::pair<std::string, std::string>> problems;
  const auto check = [&problems](const char* name, const auto& read) {
    try {
      read();
    } catch (const std::invalid_argument& e) {
      problems.emplace_back(name, e.what());
    }
  };
  for (const char* name : {"VKNORM_VALIDATION", "VKNORM_VALIDATION_PRINT", "VKNORM_NO_FP16_STORAGE", "VKNORM_NO_SUBGROUP",
                           "VKNORM_PIPELINE_STATS", "VKNORM_TUNE_UNCACHED_MAPPING"})
    check(name, [name] { env_flag(name); });
  check("VKNORM_VULKAN_API", [] { env_api_cap(); });
  check("VKNORM_MAX_SHARED_MEMORY", [] { env_max_shared_memory(); });
  check("VKNORM_MAX_BUFFER_BYTES", [] { binding_limit(0); });
  check("VKNORM_MAX_DEVICE_BYTES", [] { env_max_device_bytes(); });
  check("VKNORM_SUBGROUP_SIZE", [] { env_subgroup_size(); });
  check("VKNORM_BUFFER_CACHE_BYTES", [] { env_buffer_cache_bytes(); });
  check("VKNORM_PIPELINE_CACHE_COUNT", [] { env_pipeline_cache_count(); });
  check("VKNORM_FENCE_SPIN_US", [] { env_fence_spin_us(); });
  check("VKNORM_COOPERATIVE_WORKGROUPS", [] { env_cooperative_workgroups(); });
  check("VKNORM_PATH", [] { env_path(); });
  check("VKNORM_TUNE_CONVERSION_BYTES_PER_THREAD", [] { env_conversion_bytes_per_thread(); });
  check("VKNORM_TUNE_CONVERSION_THREADS", [] { env_conversion_threads(); });
  for (const char* name : kPlanKnobs) check(name, [name] { env_knob(name); });
  return problems;
}

bool env_has_prefix(const char* prefix) {
  const size_t n = std::strlen(prefix);
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, prefix, n) == 0) return true;
  return false;
}

std::optional<uint64_t> env_count(const char* name, const char* expected) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*end != '\0' || !std::isdigit(static_cast<unsigned char>(v[0])) || errno == ERANGE)
    throw std::invalid_argument(std::string(name) + "=" + v + ": expected " + expected);
  return n;
}

uint64_t env_positive(const char* name) {
  const std::optional<uint64_t> n = env_count(name, "a positive integer");
  if (n && *n == 0) throw std::invalid_argument(std::string(name) + "=0: expected a positive integer");
  return n.value_or(0);
}

}  // namespace vknorm

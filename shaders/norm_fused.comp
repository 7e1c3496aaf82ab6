#version 450
#extension GL_GOOGLE_include_directive : require
// Single dispatch for groups that fit in registers: a team per group (several groups per subgroup
// when groups are tiny, a whole workgroup when large) reads x once into registers, reduces its
// statistics there and writes y once.
//
// LayerNorm statistics are taken about a pivot (the mean of the group's first 4 elements), so
// |mean| >> std stays exact: x - pivot is exact and small. With ONE_REDUCTION the team reduces the
// shifted sum and sum of squares together; var = E[d^2] - E[d]^2 then loses bits only when the shifted
// mean is large against the std (a pivot far from the mean), and exactly then the team takes ncnn's
// second pass, sum((d - mean)^2), from its registers.
// Items of one group inside pack4 lanes (common.glsl, LANE_GROUPS).
layout(constant_id = 16) const uint LANE_GROUPS = 0;
#define DECLARES_LANE_GROUPS 1
#include "common.glsl"

// Cancellation bound for the one-reduction variance: var = E[d^2] - m^2 keeps its relative error
// within ~(1 + 3 * 4) roundings when m^2 <= 4 var. Beyond it (rare: the pivot averages 4 elements,
// so m^2 / var ~ z^2 / 4) the second pass runs.
const float kMaxShiftRatio = 4.0;
// Squares about the pivot exceed squares about the mean by n * mean^2 (mean: the shifted mean). Where their sum
// nears FLT_MAX the second pass runs, squaring deviations from the mean: it gives the CPU reference's inf variance
// (a = 0) where that overflows too, and a finite one where only the squares about the pivot did (a pivot 2.2e17
// from the other 8188 of 8192 elements). This also catches a shifted mean past sqrt(FLT_MAX), whose square would
// make var = inf - inf (sum_sq >= n * mean^2). Compared as a finite bound, as drivers need not keep NaN
// semantics in comparisons.
const float kMaxSumOfSquares = 3.0e38;

// The pivot: the mean of the group's first 4 elements (the first one for smaller groups), in pairs
// scaled first so a constant group gives its own value exactly and none overflows. `precise`: a
// compiler may otherwise factor 0.25 * a + 0.25 * b into 0.25 * (a + b), which overflows near FLT_MAX.
// A pack4 item holding several groups takes each group's first element (one per slot).
afp group_pivot(uint base) {
#if VEC4
  if (LANE_GROUPS != 0u) return vec4(load_x(base)[item_first_lane]);  // the group's first lane
  vec4 f = load_x(base);
  precise float pv = (0.25 * f.x + 0.25 * f.y) + (0.25 * f.z + 0.25 * f.w);
  return vec4(pv);
#else
#if PACK == 4
  if (CPG != 1u) return first_elements(base);
#endif
  if (GROUP_SIZE < 4u) return load_x(base);
  precise afp pv = (0.25 * load_x(base) + 0.25 * load_x(base + elem_offset(1u))) +
                   (0.25 * load_x(base + elem_offset(2u)) + 0.25 * load_x(base + elem_offset(3u)));
  return pv;
#endif
}

// Element k (at i) of this invocation, minus the pivot: from registers, or from the bits held as stored
// (common.glsl id 15) where elements travel as float16 uvec2s.
#if HOLDS_BITS
const bool kHold = HOLD_STORAGE != 0u;
#define SHIFTED(k, i) (kHold ? unpack_held(h[k]) - from_slots(pivot, i) : v[k])
#else
#define SHIFTED(k, i) v[k]
#endif

// PREFETCH_WEIGHTS 2 (per-channel weights, a group per workgroup, an invocation per plane): the weights of
// each of the group's planes, loaded up front by one invocation per plane, read by the store loop after the
// reduction's barriers (instead of loads issued only then). Sized by the plan, so that a kernel without them
// holds one of each (shared memory is the device's to budget: src/dispatch.cpp device_caps).
const uint PLANE_WEIGHT_SLOTS = PREFETCH_WEIGHTS == 2u ? PLANES : 1u;
shared wfp sh_plane_gamma[PLANE_WEIGHT_SLOTS], sh_plane_beta[PLANE_WEIGHT_SLOTS];

void main() {
  uint g = team_item();
  bool in_range = g < p.n_groups;
  uint lane = team_lane();
  uint base = in_range ? group_base(g) : 0u;
  afp pivot = OP == OP_LAYERNORM ? group_pivot(base) : afp(0);  // unused past the last group
  const bool one_reduction = OP == OP_LAYERNORM && ONE_REDUCTION != 0u;

  // Sums are kept per group slot (to_slots: the identity unless a pack4 item holds several groups).
  // Each element stays in registers as x - pivot, or (held as stored) as its float16 bits, shifted
  // where used: the same float32 operations, so the same results.
  afp v[ITEMS];
#if HOLDS_BITS
  hfp h[ITEMS];
#endif
  wfp gk[ITEMS], bk[ITEMS];
  const bool one_element = OP == OP_LAYERNORM && GROUP_ELEMS == 1u;  // see nan_where_not_finite
  afp xk[ITEMS];
  afp s = afp(0), q = afp(0);
  // Loads are never behind a branch: an invocation past the group (or past the last group) loads the
  // group's first element (group 0's) and its weights, and never uses them (sums take 0 there, stores and
  // the second pass skip it). A load under a condition is issued only once the condition resolves, and
  // NVIDIA's compiler then keeps a team's ITEMS loads apart instead of in flight together (H200,
  // 1024-4096 cols: 75-81 % of the copy roof branched, 90-94 % unconditional).
  const uint g_loaded = in_range ? g : 0u;
  const bool plane_weights = PREFETCH_WEIGHTS == 2u && AFFINE != 0u;
  const uint plane_loaded = plane_weights && gl_LocalInvocationID.x < PLANES ? gl_LocalInvocationID.x : 0u;
  wfp plane_gamma = plane_weights ? gamma_for(g_loaded, plane_loaded * PLANE_SIZE) : wfp(1);
  wfp plane_beta = plane_weights && OP == OP_LAYERNORM ? beta_for(g_loaded, plane_loaded * PLANE_SIZE) : wfp(0);
  for (uint k = 0u; k < ITEMS; ++k) {
    uint i = lane + k * TEAM;
    bool inside = in_range && i < GROUP_SIZE;
    uint i_loaded = inside ? i : 0u;
    hfp hk = load_held(base + elem_offset(i_loaded));
    if (inside) store_sum(base + elem_offset(i), hk, owned_lanes(i));
    if (one_element) xk[k] = unpack_held(hk);
    afp vk = inside ? unpack_held(hk) - from_slots(pivot, i) : afp(0);
#if HOLDS_BITS
    if (kHold) h[k] = hk;
    else
#endif
      v[k] = vk;
    if (PREFETCH_WEIGHTS == 1u) {
      gk[k] = AFFINE != 0u ? gamma_for(g_loaded, i_loaded) : wfp(1);
      bk[k] = AFFINE != 0u && OP == OP_LAYERNORM ? beta_for(g_loaded, i_loaded) : wfp(0);
    }
    if (OP == OP_LAYERNORM) {
      s += to_slots(vk, i);
      if (one_reduction) q += to_slots(vk * vk, i);
    } else {
      s += to_slots(vk * vk, i);
    }
  }
  if (plane_weights && gl_LocalInvocationID.x < PLANES) {  // read after the reductions' barriers
    sh_plane_gamma[gl_LocalInvocationID.x] = plane_gamma;
    sh_plane_beta[gl_LocalInvocationID.x] = plane_beta;
  }
  float n = float(GROUP_ELEMS);
  stat mean = stat(0);
  stat var;
  if (OP == OP_LAYERNORM) {
    bool second_pass = true;
    if (one_reduction) {
      stat sum = to_stat(s), sum_sq = to_stat(q);
      team_sum2(sum, sum_sq);
      mean = sum / n;
      var = sum_sq / n - mean * mean;
      // Negative or NaN var: the comparison is true or false, and a NaN stays NaN either way.
      second_pass = !team_may_branch() || any_above(mean * mean, kMaxShiftRatio * var) ||
                    any_above(sum_sq, stat(kMaxSumOfSquares));
    } else {
      mean = team_sum(to_stat(s)) / n;
    }
    if (second_pass) {
      afp q2 = afp(0);
      for (uint k = 0u; k < ITEMS; ++k) {
        uint i = lane + k * TEAM;
        afp d = i < GROUP_SIZE ? SHIFTED(k, i) - from_slots(from_stat(mean), i) : afp(0);
        q2 += to_slots(d * d, i);
      }
      var = team_sum(to_stat(q2)) / n;
    }
  } else {
    var = team_sum(to_stat(s)) / n;
  }
  // inversesqrt, not 1 / sqrt: drivers may build sqrt(v) as v * inversesqrt(v), NaN for v = Inf, and
  // RMSNorm of a group holding Inf must give a = 0 as the CPU reference does (inv_sqrt: defined at 0 too).
  afp a = from_stat(inv_sqrt(var + p.eps));
  afp m = from_stat(mean);
  if (!in_range) return;
  for (uint k = 0u; k < ITEMS; ++k) {
    uint i = lane + k * TEAM;
    if (i < GROUP_SIZE) {
      wfp gw = PREFETCH_WEIGHTS == 1u ? gk[k]
               : plane_weights        ? sh_plane_gamma[plane_of(i)]
                                      : (AFFINE != 0u ? gamma_for(g, i) : wfp(1));
      wfp bw = PREFETCH_WEIGHTS == 1u ? bk[k]
               : plane_weights        ? sh_plane_beta[plane_of(i)]
                                      : (AFFINE != 0u && OP == OP_LAYERNORM ? beta_for(g, i) : wfp(0));
      afp y = normalize_one(SHIFTED(k, i) - from_slots(m, i), from_slots(a, i), gw, bw);
      if (one_element) store_activated(base + elem_offset(i), nan_where_not_finite(ACT != 0u ? activate(y) : y, xk[k]));
      else store_x(base + elem_offset(i), y, owned_lanes(i));
    }
  }
}

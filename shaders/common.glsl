// Shared by every vknorm shader: storage/arithmetic types, the group model, team reductions.
//
// The group model: a blob is packed channels, cstep apart; a team works on one item of group_size
// packed elements. An item is a group (LayerNorm/RMSNorm: part of one channel, gpc items per channel;
// InstanceNorm: one channel plane) or spans PLANES consecutive channel planes (GroupNorm). In pack4 a
// packed element holds 4 channels: lane j of the item's plane q belongs to the item's group
// (4q + j) / CPG, so an item holds 4 / gcd(CPG, 4) groups when CPG is not a multiple of 4 (statistics
// are then kept per group "slot" of a vec4) and one group otherwise.
//
// Build-time macros (one SPIR-V variant each, see cmake/shaders.cmake):
//   FP16     0: float32 storage, 1: float16 storage. Arithmetic is float32 either way.
//   PACK     1: one group per element, 4: ncnn pack4, each vec4 holds one element of 4 groups
//            (4 channels, or 4 rows of a 2-D blob) at the same position.
//   VEC4     with PACK 1: a pack1 blob read as vec4s, 4 consecutive elements of one group per load
//            (the host passes group_size and cstep in vec4s); or a pack4 blob whose elements each hold
//            channels of one group (GroupNorm of whole planes per group, or LANE_GROUPS items).
//   SUBGROUP 1: team reductions use subgroup operations, 0: shared memory only.
// Specialization constants (one pipeline per layer and choice), ids 0..6 in every kernel:
//   0 workgroup size, 1 op, 2 affine, 3 items per invocation and 4 weight prefetch (fused kernel),
//   5 team size and 6 group size when the plan fixes them (0: taken from the push constants),
//   7 LayerNorm statistics from one reduction (fused kernel, see norm_fused.comp),
//   8 planes per item, 9 where the affine weights come from, 10 channels per group (pack4 lanes),
//   11 the split apply pass merges partials itself (norm_apply.comp),
//   12 a residual add before the norm, 13 an activation after it, 14 its parameter (fusion, below),
//   15 float16 elements held in registers as stored (fused kernel, see norm_fused.comp),
//   16 (each kernel its own): the cooperative kernel's and its clear's counter stride (then 17 its polls, 18
//   its chunks spanning planes), the split apply pass's order, the fused kernel's items of one group inside
//   pack4 lanes (LANE_GROUPS, below).
#if FP16
#extension GL_EXT_shader_16bit_storage : require
#endif
#if SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif

#ifndef VEC4
#define VEC4 0
#endif
#if PACK == 4 || VEC4
#define afp vec4
#if FP16
#define sfp f16vec4
#else
#define sfp vec4
#endif
#else
#define afp float
#if FP16
#define sfp float16_t
#else
#define sfp float
#endif
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint OP = 0;  // 0 LayerNorm, 1 RMSNorm
layout(constant_id = 2) const uint AFFINE = 1;
layout(constant_id = 3) const uint ITEMS = 4;  // fused: elements each invocation holds; group_size <= team * ITEMS
// Weights loaded early, so their latency hides behind the reductions. Fused: 1 loads gamma/beta together
// with x (latency-bound tensors only: the extra registers cost occupancy on large ones, measured); 2 keeps
// each plane's per-channel weights in shared memory (norm_fused.comp). Cooperative: the chunk's
// per-channel weights, loaded during the wait (norm_cooperative.comp).
layout(constant_id = 4) const uint PREFETCH_WEIGHTS = 0;
// Team and group size as compile-time constants: loops over a team's items unroll and their bounds
// fold. 0 leaves them to the push constants (one pipeline for every shape).
layout(constant_id = 5) const uint TEAM_SPEC = 0;
layout(constant_id = 6) const uint GROUP_SIZE_SPEC = 0;
// 1: LayerNorm reduces the pivot-shifted sum and sum of squares together, and takes the second pass
// over its registers only when the two would cancel. 0: always two passes (two reductions).
layout(constant_id = 7) const uint ONE_REDUCTION = 0;
// Channel planes one item spans (cstep apart, GROUP_SIZE / PLANES elements each).
layout(constant_id = 8) const uint PLANES = 1;
// Affine weights: 0 by position in the group (LayerNorm/RMSNorm); 1 per channel, one channel per
// element (pack1); 2 per channel, the 4 lanes of a packed element are 4 channels (pack4); 3 one pair
// for the whole blob (InstanceNorm of a dims 1-2 blob).
layout(constant_id = 9) const uint WEIGHTS = 0;
// pack4: channels per group (1: each lane is a group of its own, as LayerNorm's pack4 groups).
layout(constant_id = 10) const uint CPG = 1;
// Split path, apply pass with per-channel weights: 1 merges the item's chunk partials itself (no
// finalize pass before it), 0 reads the coefficients norm_finalize wrote.
layout(constant_id = 11) const uint APPLY_MERGES = 0;
// Fusion with the layers beside a norm (ncnn graphs: BinaryOp add -> norm -> activation). 1: the norm
// reads x + residual (binding 5) as the add layer would store it and writes y to binding 6, leaving
// both inputs alone; 2: also writes that sum to binding 7 for the add's other consumers; 3: no add, y
// to binding 6, x left alone (an out-of-place layer: ncnn then needs no copy of a shared input).
layout(constant_id = 12) const uint RESIDUAL = 0;
// Applied to y as it is stored (ncnn's CPU formulas): 0 none, 1 ReLU, 2 leaky ReLU (slope ACT_ALPHA),
// 4 Sigmoid, 7 Swish, 8 GELU, 9 GELU's tanh form (ncnn's fast_gelu).
layout(constant_id = 13) const uint ACT = 0;
layout(constant_id = 14) const float ACT_ALPHA = 0.0;
// 1: the fused kernel holds a float16 vec4 in registers as it was loaded (2 registers, not 4) and
// unpacks it where used, so a team holds as many bytes of x per register as in float32 storage.
// Only where elements travel as uvec2 (FP16 with PACK 4 or VEC4); ignored elsewhere.
layout(constant_id = 15) const uint HOLD_STORAGE = 0;
#define ACT_RELU 1u
#define ACT_LEAKY_RELU 2u
#define ACT_SIGMOID 4u
#define ACT_SWISH 7u
#define ACT_GELU 8u
#define ACT_GELU_FAST 9u
#define OP_LAYERNORM 0u
#define OP_RMSNORM 1u
// pack4, channels per group 2 mod 4 (norm_fused.comp declares it as id 16; 0 in the other kernels): 1 gives each
// group an item of its own, the (CPG + 2) / 4 planes it touches from lane 0 or 2 of its first one (an item of
// two groups over CPG / 2 planes otherwise). The other group's lanes are loaded, then neither counted nor
// stored: half a vec4 (a uvec2 word in float16) is the least either group writes, so no word holds both.
#ifndef DECLARES_LANE_GROUPS
const uint LANE_GROUPS = 0u;
#endif
#define WG gl_WorkGroupSize.x
#define TEAM (TEAM_SPEC != 0u ? TEAM_SPEC : p.team)
#define GROUP_SIZE (GROUP_SIZE_SPEC != 0u ? GROUP_SIZE_SPEC : p.group_size)
#define PLANE_SIZE (GROUP_SIZE / PLANES)

// Every blob is channels -> groups per channel -> group elements. Positions are in packed elements.
// The block is named `parameter`: ncnn's Pipeline finds push constants by that name.
layout(push_constant) uniform parameter {
  uint group_size;   // elements of one group
  uint gpc;          // groups per (packed) channel
  uint cstep;        // packed elements between channels
  uint n_groups;     // packed groups: (channels / PACK) * gpc
  uint chunk_size;   // split path: elements per chunk of a group
  uint n_chunks;     // split path: chunks per group
  uint team;         // invocations that cooperate on one item (a power of two <= WG)
  float eps;
} p;

// The blob, through load_x / store_x only (the Load/Store pair every kernel shares). float16 vec4s
// travel as uvec2 with explicit pack/unpack: one 8-byte access per element (a 16-bit typed vector
// may be split into four 2-byte accesses), and no 16-bit storage feature is needed for them.
// An element as the kernels hold it before arithmetic (hfp): those storage bits where they travel as uvec2
// (HOLDS_BITS: the fused kernel may keep them so, see HOLD_STORAGE), else its float32 value.
#if FP16 && (PACK == 4 || VEC4)
#define bfp uvec2
afp unpack_b(uvec2 u) { return vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y)); }
uvec2 pack_b(afp v) { return uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw)); }
#define HOLDS_BITS 1
#define hfp uvec2
#define to_held(v) (v)
#define from_held(h) (h)
#else
#define bfp sfp
// Macros: a float16_t may not be a function parameter without 16-bit arithmetic.
#define unpack_b(v) afp(v)
#define pack_b(v) sfp(v)
#define HOLDS_BITS 0
#define hfp afp
#define to_held(v) unpack_b(v)
#define from_held(h) pack_b(h)
#endif
// Kernels that leave the blob at binding 0 as it is declare it read-only: the reduce pass, and the out-of-place
// variants (OUT_OF_PLACE: a fused add, or an output of its own, RESIDUAL 1-3; the in-place ones run RESIDUAL 0).
// Synchronization validation takes a writable binding for a write: a copy into the input's memory once it is
// freed (ncnn's light mode recycles it) would then be reported as a hazard with the norm.
#ifndef OUT_OF_PLACE
#define OUT_OF_PLACE 0
#endif
#ifndef READS_BLOB_ONLY
#define READS_BLOB_ONLY OUT_OF_PLACE
#endif
#if READS_BLOB_ONLY
layout(binding = 0) readonly buffer Blob { bfp x[]; };
#else
layout(binding = 0) buffer Blob { bfp x[]; };
#endif
layout(binding = 5) readonly buffer Residual { bfp residual[]; };
layout(binding = 6) writeonly buffer Out { bfp y_out[]; };
layout(binding = 7) buffer Sum { bfp sum_out[]; };

// The activation, per scalar. GELU: 0.5 x erfc(-x / sqrt 2) with erfc from a Chebyshev fit of
// fractional error < 1.2e-7 (GLSL has no erf), written so that +Inf gives +Inf as ncnn's does.
// Its tanh form as x / (1 + exp(-2u)): the same function, and no Inf / Inf where tanh saturates.
float erfc_nonneg(float z) {
  float t = 1.0 / (1.0 + 0.5 * z);
  float r = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 +
            t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
  return t * exp(r);
}
// ReLU's "v < 0" as bits: a compiler that may assume no NaN turns the float compare into max(v, 0), which
// gives 0 for NaN (NVIDIA's does); ncnn's generic CPU ReLU (relu.cpp) keeps NaN (its SSE/NEON ones take max and
// give 0). Negative: sign set, -0 and NaNs excluded.
bool below_zero(float v) {
  uint b = floatBitsToUint(v);
  return b > 0x80000000u && b <= 0xff800000u;
}
float activate1(float v) {
  if (ACT == ACT_RELU) return below_zero(v) ? 0.0 : v;
  if (ACT == ACT_LEAKY_RELU) return below_zero(v) ? v * ACT_ALPHA : v;
  if (ACT == ACT_SIGMOID) return 1.0 / (1.0 + exp(-v));
  if (ACT == ACT_SWISH) return v / (1.0 + exp(-v));
  if (ACT == ACT_GELU) {
    float e = erfc_nonneg(abs(v) * 0.70710678);
    return v >= 0.0 ? v * (1.0 - 0.5 * e) : 0.5 * v * e;
  }
  if (ACT == ACT_GELU_FAST) return v / (1.0 + exp(-1.59576904 * (v + 0.044715 * v * v * v)));
  return v;
}
float activate(float v) { return activate1(v); }
vec4 activate(vec4 v) { return vec4(activate1(v.x), activate1(v.y), activate1(v.z), activate1(v.w)); }

// The norm's input as stored: x, or x + residual rounded to the storage type, as the add layer stores it.
// The sum x + residual rounded to the storage type, held. float16: through bits XORed with a zero the
// compiler cannot prove (p.team is never 0), because NVIDIA's compiler folds a float32 -> float16 -> float32
// round trip into nothing, and the fused kernel then normalized the unrounded sum (H200: mean error 7.5e-3
// against the rounded sum, 1.4e-4 against the unrounded one, LayerNorm 8x5003).
uint opaque_zero() { return uint(p.team == 0u); }
#if HOLDS_BITS
hfp held_sum(afp s) { return pack_b(s) ^ uvec2(opaque_zero()); }
#elif FP16
hfp held_sum(afp s) { return unpackHalf2x16(packHalf2x16(vec2(s, 0.0)) ^ opaque_zero()).x; }
#else
hfp held_sum(afp s) { return s; }
#endif
hfp load_held(uint i) {
  if (RESIDUAL == 0u || RESIDUAL == 3u) return to_held(x[i]);
  return held_sum(unpack_b(x[i]) + unpack_b(residual[i]));
}
#define unpack_held(h) unpack_b(from_held(h))
// The norm's input for arithmetic.
afp load_x(uint i) { return unpack_held(load_held(i)); }
// Stores write the lanes that `lanes` names (LANE_GROUPS, owned_lanes): 0 all of the element, 1 its first two lanes,
// 2 its last two (a uvec2 word each in float16).
#if VEC4
#if FP16
#define LANES_01 x  // the uvec2 word of lanes 0-1
#define LANES_23 y
#else
#define LANES_01 xy
#define LANES_23 zw
#endif
#define WRITE_LANES(buf, at, v, lanes)                                         \
  if (lanes == 0u) buf[at] = v;                                                \
  else if (lanes == 1u) buf[at].LANES_01 = v.LANES_01;                         \
  else buf[at].LANES_23 = v.LANES_23;
#else
#define WRITE_LANES(buf, at, v, lanes) buf[at] = v;
#endif
// The add's output for its other consumers (RESIDUAL 2): the value load_held returned.
void store_sum(uint i, hfp v, uint lanes) {
  if (RESIDUAL == 2u) { WRITE_LANES(sum_out, i, from_held(v), lanes) }
}
void store_sum(uint i, hfp v) { store_sum(i, v, 0u); }
// The norm's output, already activated: in place, or to binding 6 when the inputs must stay as they are
// (RESIDUAL 1-3). store_x activates it first.
void store_activated(uint i, afp v, uint lanes) {
#if OUT_OF_PLACE
  WRITE_LANES(y_out, i, pack_b(v), lanes)
#elif !READS_BLOB_ONLY
  WRITE_LANES(x, i, pack_b(v), lanes)
#endif
}
void store_activated(uint i, afp v) { store_activated(i, v, 0u); }
void store_x(uint i, afp v, uint lanes) { store_activated(i, ACT != 0u ? activate(v) : v, lanes); }
void store_x(uint i, afp v) { store_x(i, v, 0u); }

// A group of one element: y, or NaN where that element x is Inf or NaN, as ncnn's CPU layer gives
// (x - mean is inf - inf, or NaN). Its deviation x - x is 0 to a compiler that may assume no NaN (SPIR-V
// keeps none by default), so the exponent bits decide; applied after the activation (max(NaN, 0) is 0).
float nan_where_not_finite(float y, float x) {
  return (floatBitsToUint(x) & 0x7f800000u) == 0x7f800000u ? uintBitsToFloat(0x7fc00000u) : y;
}
vec4 nan_where_not_finite(vec4 y, vec4 x) {
  return mix(y, vec4(uintBitsToFloat(0x7fc00000u)), equal(floatBitsToUint(x) & uvec4(0x7f800000u), uvec4(0x7f800000u)));
}
#if VEC4
// A vec4 of a pack1 group is 4 consecutive elements: its weights are 4 consecutive floats, one load
// each for gamma and beta (group_size is a multiple of 4 whenever the dispatcher picks vec4 reads).
layout(binding = 1) readonly buffer Gamma { vec4 gamma[]; };
layout(binding = 2) readonly buffer Beta { vec4 beta[]; };
#else
layout(binding = 1) readonly buffer Gamma { float gamma[]; };
layout(binding = 2) readonly buffer Beta { float beta[]; };
#endif
// Split-path scratch. Every kernel declares all eight bindings: engines that reflect the SPIR-V (ncnn)
// build their descriptor layouts from it and need bindings 0..7 without gaps.
// The cooperative kernel (COOPERATIVE) reads partials other workgroups wrote in the same dispatch
// (coherent), and holds its counters where the split path holds coefficients.
#ifndef COOPERATIVE
#define COOPERATIVE 0
#endif
#if COOPERATIVE
layout(binding = 3) coherent buffer Partials { afp partial[]; };
layout(binding = 4) volatile buffer Counters { uint counter[]; };  // volatile: coherent, and every read a load (norm_cooperative.comp)
// Uints from one item's counters to the next (at least 2: norm_cooperative.comp): a cache line each on GPUs, so
// that workgroups polling one item's count do not contend with another item's atomics (dispatch.cpp counter_stride).
layout(constant_id = 16) const uint COUNTER_STRIDE = 1;
#define COUNT(g) counter[(g) * COUNTER_STRIDE]
#else
layout(binding = 3) buffer Partials { afp partial[]; };  // [mean of n_items][M2 of n_items][pivot of n_groups]
layout(binding = 4) buffer Coefs { afp coef[]; };        // [pivot, shifted mean, a] per group
#endif

// A chunk's partial (mean and M2 about the group's pivot) where the merge reads it (split_coefs.glsl); a
// group's first chunk also keeps the pivot, for merges that run after the group's first elements may have
// been normalized in place.
void publish_partial(uint item, uint g, uint c, afp mean, afp m2, afp group_pivot) {
  uint n_items = p.n_groups * p.n_chunks;
  partial[item] = mean;
  partial[n_items + item] = m2;
  if (c == 0u) partial[2u * n_items + g] = group_pivot;
}

// Statistics are reduced per group: a float, or a vec4 for the 4 groups of a pack4 element. A VEC4
// lane first adds its vec4 across (one group), so a team reduction moves one float, not four.
#if PACK == 4
#define stat vec4
stat to_stat(afp v) { return v; }
afp from_stat(stat s) { return s; }
bool any_above(stat a, stat b) { return any(greaterThan(a, b)); }
#elif VEC4
#define stat float
stat to_stat(afp v) { return (v.x + v.y) + (v.z + v.w); }
afp from_stat(stat s) { return vec4(s); }
bool any_above(stat a, stat b) { return a > b; }
#else
#define stat float
stat to_stat(afp v) { return v; }
afp from_stat(stat s) { return s; }
bool any_above(stat a, stat b) { return a > b; }
#endif
// 1 / sqrt(v), +Inf at v = 0: inversesqrt(0) is undefined (a driver may return any value), and a constant group with
// eps 0 must come out NaN ((x - mean) * Inf), as ncnn's CPU layers give it (1 / sqrt(0)).
float inv_sqrt(float v) { return v == 0.0 ? uintBitsToFloat(0x7f800000u) : inversesqrt(v); }
vec4 inv_sqrt(vec4 v) { return mix(inversesqrt(v), vec4(uintBitsToFloat(0x7f800000u)), equal(v, vec4(0.0))); }

// Elements of one group: a VEC4 element is 4 of the group's; a pack4 item of PLANES planes holds
// CPG channel planes per group.
#if VEC4
#define GROUP_ELEMS (LANE_GROUPS != 0u ? CPG * PLANE_SIZE : GROUP_SIZE * 4u)
#elif PACK == 4
#define GROUP_ELEMS (CPG * PLANE_SIZE)
#else
#define GROUP_ELEMS GROUP_SIZE
#endif

// LANE_GROUPS: the item's group starts at this lane of its first plane (0 or 2), set with the item.
uint item_first_lane = 0u;
uint first_plane_of_group(uint g) { return (g * CPG) >> 2; }

uint group_base(uint g) {
  if (VEC4 != 0 && LANE_GROUPS != 0u) {
    item_first_lane = (g * CPG) & 3u;
    return first_plane_of_group(g) * p.cstep;
  }
  uint ch = g / p.gpc;
  return ch * PLANES * p.cstep + (g - ch * p.gpc) * GROUP_SIZE;
}

// Offset of the item's element i from its base: planes are cstep apart.
uint elem_offset(uint i) { return PLANES == 1u ? i : i + (i / PLANE_SIZE) * (p.cstep - PLANE_SIZE); }
// The item's plane that holds element i.
uint plane_of(uint i) { return PLANES == 1u ? 0u : i / PLANE_SIZE; }
// The packed channel that holds element i of item g.
uint channel_of(uint g, uint i) {
  return (LANE_GROUPS != 0u ? first_plane_of_group(g) : (g / p.gpc) * PLANES) + plane_of(i);
}

#if VEC4
// LANE_GROUPS: the lanes of the item's element i that its group owns, as stores take them (WRITE_LANES): 0 all
// four, 1 the first two (its last plane, when it starts at lane 0), 2 the last two (its first plane, when it
// starts at lane 2). With CPG 2 mod 4 these are the only cases: per plane, not per lane.
uint owned_lanes(uint i) {
  if (LANE_GROUPS == 0u) return 0u;
  uint q = plane_of(i);
  return item_first_lane != 0u ? (q == 0u ? 2u : 0u) : (q == PLANES - 1u ? 1u : 0u);
}
#else
uint owned_lanes(uint i) { return 0u; }
#endif

// Group slots (pack4): statistics of the groups an item holds, one per vec4 component. to_slots adds
// the lanes of element i into their groups' slots; from_slots hands each lane its group's value. With
// CPG 1 the lanes are the slots. Written per lane, so a NaN stays in its own group.
#if PACK == 4
uvec4 lane_slots(uint i) { return (uvec4(4u * plane_of(i)) + uvec4(0u, 1u, 2u, 3u)) / CPG; }
// Selects, not a vector indexed by each lane's slot (a dynamically indexed vector may be kept in memory):
// H200, GroupNorm with groups inside lanes, 96x64x64/32 fp32 36.3 -> 17.0 us, 960x16x16/32 13.5 -> 9.4,
// 320x16x16/32 6.4 -> 5.0, float16 alike; the per-lane sums add the same values in the same order.
float slot_sum(vec4 v, uvec4 s, uint k) {
  vec4 m = mix(vec4(0.0), v, equal(s, uvec4(k)));  // a select: a NaN in another slot stays there
  return ((m.x + m.y) + m.z) + m.w;
}
float slot_value(vec4 st, uint k) { return k == 0u ? st.x : k == 1u ? st.y : k == 2u ? st.z : st.w; }
vec4 to_slots(vec4 v, uint i) {
  if (CPG == 1u) return v;
  uvec4 s = lane_slots(i);
  return vec4(slot_sum(v, s, 0u), slot_sum(v, s, 1u), slot_sum(v, s, 2u), slot_sum(v, s, 3u));
}
vec4 from_slots(vec4 st, uint i) {
  if (CPG == 1u) return st;
  uvec4 s = lane_slots(i);
  return vec4(slot_value(st, s.x), slot_value(st, s.y), slot_value(st, s.z), slot_value(st, s.w));
}
// Elements of each slot's group in the item's plane q: lanes per slot.
vec4 lanes_per_slot(uint q) {
  if (CPG == 1u) return vec4(1.0);
  return to_slots(vec4(1.0), q * PLANE_SIZE);
}
// Each group's first element (the split path's pivot).
vec4 first_elements(uint base) {
  if (CPG == 1u) return load_x(base);
  vec4 r = vec4(0.0);
  for (uint k = 0u; k < 4u; ++k) {
    uint c = k * CPG;  // the slot's first channel, relative to the item
    if (c < 4u * PLANES) r[k] = load_x(base + (c >> 2) * p.cstep)[c & 3u];
  }
  return r;
}
#else
#if VEC4
// LANE_GROUPS in vec4 reads: the item is one group, whose statistic to_stat adds across the element; the other
// group's lanes are zeroed first, by a select (a NaN there stays there).
afp to_slots(afp v, uint i) {
  if (LANE_GROUPS == 0u) return v;
  uint o = owned_lanes(i);
  return mix(vec4(0.0), v, bvec4(o != 2u, o != 2u, o != 1u, o != 1u));
}
#else
afp to_slots(afp v, uint i) { return v; }
#endif
afp from_slots(afp st, uint i) { return st; }
float lanes_per_slot(uint q) { return 1.0; }
afp first_elements(uint base) { return load_x(base); }
#endif

// Workgroup counts above 65535 are folded into y by the host.
uint workgroup_linear() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

// Items (groups or chunks) are handed to teams of TEAM invocations; a workgroup holds WG / team teams.
uint team_lane() { return gl_LocalInvocationID.x & (TEAM - 1u); }
uint team_item() { return workgroup_linear() * (WG / TEAM) + gl_LocalInvocationID.x / TEAM; }

// A chunk lies in one plane (a group spanning planes has n_chunks / PLANES chunks in each), or, where the
// cooperative kernel takes chunks larger than a plane, is a run of whole planes (plane: its first).
void chunk_range(uint c, out uint begin, out uint end, out uint plane) {
  if (p.chunk_size > PLANE_SIZE) {
    begin = c * p.chunk_size;
    end = min(begin + p.chunk_size, GROUP_SIZE);
    plane = begin / PLANE_SIZE;
    return;
  }
  uint per_plane = p.n_chunks / PLANES;
  plane = c / per_plane;
  begin = plane * PLANE_SIZE + (c - plane * per_plane) * p.chunk_size;
  end = min(begin + p.chunk_size, (plane + 1u) * PLANE_SIZE);
}

// Counts as divisors: a slot with no element divides 0 by 1, not 0 by 0.
#if PACK == 4
vec4 at_least_one(vec4 n) { return mix(vec4(1.0), n, greaterThan(n, vec4(0.0))); }
#else
float at_least_one(float n) { return n > 0.0 ? n : 1.0; }
#endif

// Affine weights of element i of item g: by position in the group (one value serves the 4 groups of
// a pack4 element), or per channel (WEIGHTS). One body per layout, for gamma_for and beta_for alike.
#if VEC4
#define wfp vec4
#define WEIGHT_AT(w)                                                   \
  if (WEIGHTS == 0u) return w[i];                                      \
  if (WEIGHTS == 3u) return vec4(w[0].x);                              \
  uint c = channel_of(g, i);                                           \
  return WEIGHTS == 2u ? w[c] : vec4(w[c >> 2][c & 3u]);
#elif PACK == 4
#define wfp vec4
#define WEIGHT_AT(w)                                                   \
  if (WEIGHTS == 0u || WEIGHTS == 3u) return vec4(w[WEIGHTS == 0u ? i : 0u]); \
  uint c = 4u * channel_of(g, i);                                      \
  return vec4(w[c], w[c + 1u], w[c + 2u], w[c + 3u]);
#else
#define wfp float
#define WEIGHT_AT(w) return w[WEIGHTS == 0u ? i : WEIGHTS == 3u ? 0u : channel_of(g, i)];
#endif
wfp gamma_for(uint g, uint i) { WEIGHT_AT(gamma) }
wfp beta_for(uint g, uint i) { WEIGHT_AT(beta) }

// y = (x - mean) * a, then * gamma (+ beta for LayerNorm) when affine. `precise`: (x - mean) * a first, never
// reassociated into (x - mean) * (a * gamma), which a driver may hoist out of a loop (NVIDIA did, in the split
// apply pass) and which overflows where gamma is past float32's range only after normalizing (1e38 over a std
// of 1e-3: +-inf, not float64's values). The rest may still contract into an fma.
afp normalize_one(afp centred, afp a, wfp g, wfp b) {
  precise afp normalized = centred * a;
  if (AFFINE == 0u) return normalized;
  return OP == OP_LAYERNORM ? normalized * g + b : normalized * g;
}

shared stat team_scratch[gl_WorkGroupSize.x];

// Sum over the invocations of a team; every member gets the result. Called in uniform control flow
// (a team that spans subgroups: uniform across the workgroup, for its barriers).
stat team_sum(stat v) {
#if SUBGROUP
  if (TEAM <= gl_SubgroupSize) {
    for (uint m = 1u; m < TEAM; m <<= 1) v += subgroupShuffleXor(v, m);
    return v;
  }
  // A team spans whole subgroups: add inside each, then across the team's subgroups.
  v = subgroupAdd(v);
  if (subgroupElect()) team_scratch[gl_SubgroupID] = v;
  barrier();
  uint per_team = TEAM / gl_SubgroupSize;
  uint first = (gl_SubgroupID / per_team) * per_team;
  stat s = stat(0);
  for (uint k = 0u; k < per_team; ++k) s += team_scratch[first + k];
  barrier();
  return s;
#else
  uint lid = gl_LocalInvocationID.x;
  team_scratch[lid] = v;
  barrier();
  for (uint s = TEAM >> 1; s > 0u; s >>= 1) {
    if (team_lane() < s) team_scratch[lid] += team_scratch[lid + s];
    barrier();
  }
  v = team_scratch[lid - team_lane()];
  barrier();
  return v;
#endif
}

// Two sums at once: one chain of shuffles (or one pair of barriers) instead of two.
void team_sum2(inout stat a, inout stat b) {
#if SUBGROUP
  if (TEAM <= gl_SubgroupSize) {
    for (uint m = 1u; m < TEAM; m <<= 1) {
      a += subgroupShuffleXor(a, m);
      b += subgroupShuffleXor(b, m);
    }
    return;
  }
  // Subgroups hold >= 2 invocations (device_caps), so 2 entries per subgroup fit in WG.
  a = subgroupAdd(a);
  b = subgroupAdd(b);
  if (subgroupElect()) {
    team_scratch[2u * gl_SubgroupID] = a;
    team_scratch[2u * gl_SubgroupID + 1u] = b;
  }
  barrier();
  uint per_team = TEAM / gl_SubgroupSize;
  uint first = (gl_SubgroupID / per_team) * per_team;
  a = stat(0);
  b = stat(0);
  for (uint k = 0u; k < per_team; ++k) {
    a += team_scratch[2u * (first + k)];
    b += team_scratch[2u * (first + k) + 1u];
  }
  barrier();
#else
  a = team_sum(a);
  b = team_sum(b);
#endif
}

// Whether a team may take a branch of its own around team_sum: its reductions then involve no one
// outside the team (shuffles inside one subgroup, or barriers of a workgroup that is the team).
bool team_may_branch() {
#if SUBGROUP
  return TEAM <= gl_SubgroupSize || TEAM == WG;
#else
  return TEAM == WG;
#endif
}

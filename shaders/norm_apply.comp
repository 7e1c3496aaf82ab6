#version 450
#extension GL_GOOGLE_include_directive : require
// Pass 3 of the split path: y = ((x - pivot) - shifted mean) * a, then gamma/beta (by position in the
// group, or per channel); cstep padding is never touched.
// Weights by position (LayerNorm, RMSNorm): a grid-stride loop over every element of every group.
// Weights per channel (GroupNorm, InstanceNorm): a team per chunk, as in norm_reduce, that on GPUs first
// merges its item's chunk partials itself (APPLY_MERGES: no finalize pass; on lavapipe the barriers
// that costs make it slower than a finalize pass); a chunk lies in one plane, so its lanes'
// coefficients and weights are worked out once (H200, GroupNorm 320x64x64/32: 21.5 -> 16.8 us chunk by
// chunk), while LayerNorm's grid-stride loop stays ahead on its own layouts (32768 cols: 140 vs 149 us).
#include "common.glsl"
#include "split_coefs.glsl"

// The norm's input again: when norm_reduce wrote the residual sum, one stream instead of two.
afp load_input(uint i) { return RESIDUAL == 2u ? unpack_b(sum_out[i]) : load_x(i); }


// Elements last to first (spec id 16, 1 on GPUs): norm_reduce read x first to last, so the end of x is
// what the L2 cache still holds when this pass starts.
layout(constant_id = 16) const uint LAST_FIRST = 0;

void by_element() {
  uint total = p.n_groups * GROUP_SIZE;
  uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * WG;
  for (uint k = workgroup_linear() * WG + gl_LocalInvocationID.x; k < total; k += stride) {
    uint e = LAST_FIRST != 0u ? total - 1u - k : k;
    uint g = e / GROUP_SIZE;
    uint i = e - g * GROUP_SIZE;
    uint at = group_base(g) + elem_offset(i);
    afp v = (load_input(at) - from_slots(coef[3u * g], i)) - from_slots(coef[3u * g + 1u], i);
    store_x(at, normalize_one(v, from_slots(coef[3u * g + 2u], i), AFFINE != 0u ? gamma_for(g, i) : wfp(1),
                                AFFINE != 0u && OP == OP_LAYERNORM ? beta_for(g, i) : wfp(0)));
  }
}

void by_chunk() {
  uint n_items = p.n_groups * p.n_chunks;
  uint item = team_item();
  bool in_range = item < n_items;
  uint g = in_range ? item / p.n_chunks : 0u;
  uint begin, end, plane;
  chunk_range(item - g * p.n_chunks, begin, end, plane);
  afp pivot, mean, a;
  if (APPLY_MERGES != 0u) {
    item_coefs(g, in_range, true, TEAM, pivot, mean, a);  // the whole team, in uniform control flow
  } else if (in_range) {
    pivot = coef[3u * g], mean = coef[3u * g + 1u], a = coef[3u * g + 2u];
  }
  if (!in_range) return;
  uint at = group_base(g) + plane * (p.cstep - PLANE_SIZE);  // + i: element i of this chunk's plane
  pivot = from_slots(pivot, begin);
  mean = from_slots(mean, begin);
  a = from_slots(a, begin);
  wfp gw = AFFINE != 0u ? gamma_for(g, begin) : wfp(1);
  wfp bw = AFFINE != 0u && OP == OP_LAYERNORM ? beta_for(g, begin) : wfp(0);
  for (uint i = begin + team_lane(); i < end; i += TEAM)
    store_x(at + i, normalize_one((load_input(at + i) - pivot) - mean, a, gw, bw));
}

void main() {
  if (WEIGHTS == 0u) by_element();
  else by_chunk();
}

#version 450
#extension GL_GOOGLE_include_directive : require
// Pass 3 of the split path: y = ((x - pivot) - shifted mean) * a, then gamma/beta (by position in the
// group, or per channel). A team per chunk, as in norm_reduce: a chunk lies in one plane, so its lanes'
// coefficients (and per-channel weights) are fetched once; cstep padding is never touched.
#include "common.glsl"


void main() {
  uint n_items = p.n_groups * p.n_chunks;
  uint item = team_item();
  if (item >= n_items) return;
  uint g = item / p.n_chunks;
  uint begin, end, plane;
  chunk_range(item - g * p.n_chunks, begin, end, plane);
  uint at = group_base(g) + plane * (p.cstep - PLANE_SIZE);  // + i: element i of this chunk's plane
  afp pivot = from_slots(coef[3u * g], begin);
  afp mean = from_slots(coef[3u * g + 1u], begin);
  afp a = from_slots(coef[3u * g + 2u], begin);
  wfp gw = wfp(1), bw = wfp(0);
  if (AFFINE != 0u && WEIGHTS != 0u) {  // per channel: one pair for the whole chunk
    gw = gamma_for(g, begin);
    if (OP == OP_LAYERNORM) bw = beta_for(g, begin);
  }
  for (uint i = begin + team_lane(); i < end; i += TEAM) {
    if (AFFINE != 0u && WEIGHTS == 0u) {
      gw = gamma_for(g, i);
      if (OP == OP_LAYERNORM) bw = beta_for(g, i);
    }
    store_x(at + i, normalize_one((load_x(at + i) - pivot) - mean, a, gw, bw));
  }
}

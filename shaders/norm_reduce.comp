#version 450
#extension GL_GOOGLE_include_directive : require
// Pass 1 of the split path: each team reduces one chunk of one group to (mean, M2) about the group's
// pivot (its first element), so large offsets cancel before any sum is taken.
// RMSNorm: the pivot is 0 and the partial is the chunk's mean of squares.
#define READS_BLOB_ONLY 1
#include "common.glsl"


void main() {
  uint n_items = p.n_groups * p.n_chunks;
  uint item = team_item();
  bool in_range = item < n_items;
  uint g = in_range ? item / p.n_chunks : 0u;
  uint begin, end, plane;
  chunk_range(item - g * p.n_chunks, begin, end, plane);

  // LayerNorm: two passes over the chunk, as ncnn's two passes over a group: the chunk mean about the
  // group's pivot, then the squares about that mean. One-pass shifted sums would cancel when the pivot is
  // far from the chunk's mean (an outlier first element). ITEMS > 1: the chunk fits ITEMS per invocation
  // and the second pass reads the registers the first loaded; otherwise it re-reads x (from cache).
  // A chunk lies in one plane, so its lanes' groups are fixed: sums are kept per lane and added into
  // group slots (common.glsl) once; a slot with no lane in this plane counts 0.
  uint base = in_range ? group_base(g) : 0u;
  uint at = base + plane * (p.cstep - PLANE_SIZE);  // + i: element i of this chunk's plane
  afp n = afp(float(end - begin)) * lanes_per_slot(plane);
  afp group_pivot = in_range && OP == OP_LAYERNORM ? first_elements(base) : afp(0);
  afp pivot = from_slots(group_pivot, begin);
  const bool held = OP == OP_LAYERNORM && ITEMS > 1u;
  hfp h[ITEMS];
  afp s = afp(0);
  if (held) {
    // Loads never behind a branch (norm_fused.comp): past the chunk, the group's first element, unused.
    for (uint k = 0u; k < ITEMS; ++k) {
      uint i = begin + team_lane() + k * TEAM;
      bool inside = in_range && i < end;
      h[k] = load_held(inside ? at + i : base);
      if (inside) {
        store_sum(at + i, h[k]);
        s += unpack_held(h[k]) - pivot;
      }
    }
  } else if (in_range) {
    for (uint i = begin + team_lane(); i < end; i += TEAM) {
      hfp xi = load_held(at + i);
      store_sum(at + i, xi);  // the add's output, once (the second loop re-reads x)
      afp d = unpack_held(xi) - pivot;
      s += OP == OP_LAYERNORM ? d : d * d;
    }
  }
  afp mean = team_sum(to_slots(s, begin)) / at_least_one(n);  // LayerNorm: shifted mean; RMSNorm: mean of squares
  afp m2 = afp(0);
  if (OP == OP_LAYERNORM) {
    afp lane_mean = from_slots(mean, begin);
    afp q = afp(0);
    if (held) {
      for (uint k = 0u; k < ITEMS; ++k) {
        afp d = (unpack_held(h[k]) - pivot) - lane_mean;  // never pivot + mean: that rounds at |x|
        if (in_range && begin + team_lane() + k * TEAM < end) q += d * d;
      }
    } else if (in_range) {
      for (uint i = begin + team_lane(); i < end; i += TEAM) {
        afp d = (load_x(at + i) - pivot) - lane_mean;  // never pivot + mean: that rounds at |x|
        q += d * d;
      }
    }
    m2 = team_sum(to_slots(q, begin));
  }
  if (in_range && team_lane() == 0u) publish_partial(item, g, item - g * p.n_chunks, mean, m2, group_pivot);
}

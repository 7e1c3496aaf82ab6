#version 450
#extension GL_GOOGLE_include_directive : require
// Pass 1 of the split path: each team reduces one chunk of one group to (mean, M2) about the group's
// pivot (its first element), so large offsets cancel before any sum is taken.
// RMSNorm: the pivot is 0 and the partial is the chunk's mean of squares.
#include "common.glsl"

layout(binding = 3) writeonly buffer Partials { afp partial[]; };  // [mean of n_items][M2 of n_items]

void main() {
  uint n_items = p.n_groups * p.n_chunks;
  uint item = team_item();
  bool in_range = item < n_items;
  uint g = in_range ? item / p.n_chunks : 0u;
  uint begin = (item - g * p.n_chunks) * p.chunk_size;
  uint end = min(begin + p.chunk_size, p.group_size);

  afp s1 = afp(0), s2 = afp(0);
  if (in_range) {
    uint base = group_base(g);
    afp pivot = OP == OP_LAYERNORM ? afp(x[base]) : afp(0);
    for (uint i = begin + team_lane(); i < end; i += p.team) {
      afp d = afp(x[base + i]) - pivot;
      s1 += d;
      s2 += d * d;
    }
  }
  s1 = team_sum(s1);
  s2 = team_sum(s2);
  if (in_range && team_lane() == 0u) {
    float n = float(end - begin);
    bool rms = OP == OP_RMSNORM;
    partial[item] = rms ? s2 / n : s1 / n;
    partial[n_items + item] = rms ? afp(0) : s2 - s1 * (s1 / n);
  }
}

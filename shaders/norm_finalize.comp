#version 450
#extension GL_GOOGLE_include_directive : require
// Pass 2 of the split path: a team per group Chan-combines the chunks' (count, mean, M2) partials and
// writes the group's coefficients (pivot, shifted mean, a = 1/sqrt(var + eps)).
#include "common.glsl"
#include "split_coefs.glsl"

void main() {
  uint g = team_item();
  bool in_range = g < p.n_groups;
  afp pivot, mean, a;
  item_coefs(g, in_range, false, TEAM, pivot, mean, a);
  if (in_range && team_lane() == 0u) {
    coef[3u * g + 0u] = pivot;
    coef[3u * g + 1u] = mean;
    coef[3u * g + 2u] = a;
  }
}

#version 450
#extension GL_GOOGLE_include_directive : require
// Single dispatch for groups that fit in registers: a team per group (several groups per subgroup
// when groups are tiny, a whole workgroup when large) reads x once into registers, takes the mean
// about a pivot and then the variance about that mean (ncnn's two passes, from registers), and
// writes y once.
#include "common.glsl"

layout(constant_id = 3) const uint ITEMS = 4;  // elements each invocation holds; group_size <= team * ITEMS

void main() {
  uint g = team_item();
  bool in_range = g < p.n_groups;
  uint lane = team_lane();
  uint base = in_range ? group_base(g) : 0u;
  // The pivot keeps |mean| >> std exact: x - pivot is exact and small, so its mean is too.
  afp pivot = in_range && OP == OP_LAYERNORM ? pivot_of(afp(x[base])) : afp(0);

  // Weights are read only when writing: holding them in registers too costs occupancy (measured).
  afp v[ITEMS];
  afp s = afp(0);
  for (uint k = 0u; k < ITEMS; ++k) {
    uint i = lane + k * p.team;
    v[k] = in_range && i < p.group_size ? afp(x[base + i]) - pivot : afp(0);
    s += OP == OP_LAYERNORM ? v[k] : v[k] * v[k];
  }
  float n = float(p.group_size * GROUP_ELEMS_PER);
  afp mean = afp(0);
  afp var;
  if (OP == OP_LAYERNORM) {
    mean = group_total(team_sum(s)) / n;
    afp q = afp(0);
    for (uint k = 0u; k < ITEMS; ++k) {
      afp d = lane + k * p.team < p.group_size ? v[k] - mean : afp(0);
      q += d * d;
    }
    var = group_total(team_sum(q)) / n;
  } else {
    var = group_total(team_sum(s)) / n;
  }
  afp a = afp(1.0) / sqrt(var + p.eps);
  if (!in_range) return;
  for (uint k = 0u; k < ITEMS; ++k) {
    uint i = lane + k * p.team;
    if (i < p.group_size) {
      x[base + i] = sfp(normalize_one(v[k] - mean, a, AFFINE != 0u ? gamma_at(i) : wfp(1),
                                      AFFINE != 0u && OP == OP_LAYERNORM ? beta_at(i) : wfp(0)));
    }
  }
}

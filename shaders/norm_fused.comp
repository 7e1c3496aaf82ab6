#version 450
#extension GL_GOOGLE_include_directive : require
// Single dispatch for groups that fit in registers: a team per group (several groups per subgroup
// when groups are tiny, a whole workgroup when large) reads x once into registers, takes the mean
// about a pivot and then the variance about that mean (ncnn's two passes, from registers), and
// writes y once.
#include "common.glsl"


void main() {
  uint g = team_item();
  bool in_range = g < p.n_groups;
  uint lane = team_lane();
  uint base = in_range ? group_base(g) : 0u;
  // The pivot keeps |mean| >> std exact: x - pivot is exact and small, so its mean is too.
  afp pivot = in_range && OP == OP_LAYERNORM ? pivot_of(load_x(base)) : afp(0);

  afp v[ITEMS];
  wfp gk[ITEMS], bk[ITEMS];
  afp s = afp(0);
  for (uint k = 0u; k < ITEMS; ++k) {
    uint i = lane + k * TEAM;
    bool inside = in_range && i < GROUP_SIZE;
    v[k] = inside ? load_x(base + i) - pivot : afp(0);
    if (PREFETCH_WEIGHTS != 0u) {
      gk[k] = AFFINE != 0u && inside ? gamma_at(i) : wfp(1);
      bk[k] = AFFINE != 0u && OP == OP_LAYERNORM && inside ? beta_at(i) : wfp(0);
    }
    s += OP == OP_LAYERNORM ? v[k] : v[k] * v[k];
  }
  float n = float(GROUP_SIZE * GROUP_ELEMS_PER);
  afp mean = afp(0);
  afp var;
  if (OP == OP_LAYERNORM) {
    mean = group_total(team_sum(s)) / n;
    afp q = afp(0);
    for (uint k = 0u; k < ITEMS; ++k) {
      afp d = lane + k * TEAM < GROUP_SIZE ? v[k] - mean : afp(0);
      q += d * d;
    }
    var = group_total(team_sum(q)) / n;
  } else {
    var = group_total(team_sum(s)) / n;
  }
  // inversesqrt, not 1 / sqrt: drivers may build sqrt(v) as v * inversesqrt(v), NaN for v = Inf, and
  // RMSNorm of a group holding Inf must give a = 0 as the CPU reference does.
  afp a = inversesqrt(var + p.eps);
  if (!in_range) return;
  for (uint k = 0u; k < ITEMS; ++k) {
    uint i = lane + k * TEAM;
    if (i < GROUP_SIZE) {
      wfp gw = PREFETCH_WEIGHTS != 0u ? gk[k] : (AFFINE != 0u ? gamma_at(i) : wfp(1));
      wfp bw = PREFETCH_WEIGHTS != 0u ? bk[k] : (AFFINE != 0u && OP == OP_LAYERNORM ? beta_at(i) : wfp(0));
      store_x(base + i, normalize_one(v[k] - mean, a, gw, bw));
    }
  }
}

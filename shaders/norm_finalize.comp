#version 450
#extension GL_GOOGLE_include_directive : require
// Pass 2 of the split path: a team per group Chan-combines the chunks' (count, mean, M2) partials and
// writes the group's coefficients (pivot, shifted mean, a = 1/sqrt(var + eps)).
#include "common.glsl"


shared float sh_n[gl_WorkGroupSize.x];
shared afp sh_m[gl_WorkGroupSize.x];
shared afp sh_m2[gl_WorkGroupSize.x];

// Chan et al.: merge (nb, mb, m2b) into (na, ma, m2a). RMSNorm merges means of squares only, as a
// weighted sum, so an Inf stays Inf instead of becoming Inf - Inf.
void combine(inout float na, inout afp ma, inout afp m2a, float nb, afp mb, afp m2b) {
  float n = na + nb;
  if (nb == 0.0) return;
  if (OP == OP_RMSNORM) {
    ma = (ma * na + mb * nb) / n;
  } else {
    afp delta = mb - ma;
    ma += delta * (nb / n);
    m2a += m2b + delta * delta * (na * nb / n);
  }
  na = n;
}

void main() {
  uint n_items = p.n_groups * p.n_chunks;
  uint g = team_item();
  bool in_range = g < p.n_groups;
  uint lane = team_lane();

  float n = 0.0;
  afp m = afp(0), m2 = afp(0);
  if (in_range) {
    for (uint c = lane; c < p.n_chunks; c += TEAM) {
      uint item = g * p.n_chunks + c;
      float nc = float(min(p.chunk_size, GROUP_SIZE - c * p.chunk_size));
      combine(n, m, m2, nc, partial[item], partial[n_items + item]);
    }
  }
  uint lid = gl_LocalInvocationID.x;
  sh_n[lid] = n;
  sh_m[lid] = m;
  sh_m2[lid] = m2;
  barrier();
  for (uint s = TEAM >> 1; s > 0u; s >>= 1) {
    if (lane < s) {
      combine(sh_n[lid], sh_m[lid], sh_m2[lid], sh_n[lid + s], sh_m[lid + s], sh_m2[lid + s]);
    }
    barrier();
  }
  if (in_range && lane == 0u) {
    // M2 is a sum of squares and Chan's terms are >= 0, so no clamp: a clamp compiles to max() on some
    // drivers, and max() drops the NaN that a NaN in the group must leave.
    afp var = OP == OP_RMSNORM ? sh_m[lid] : sh_m2[lid] / sh_n[lid];
    uint base = group_base(g);
    coef[3u * g + 0u] = OP == OP_LAYERNORM ? load_x(base) : afp(0);
    coef[3u * g + 1u] = OP == OP_LAYERNORM ? sh_m[lid] : afp(0);
    coef[3u * g + 2u] = inversesqrt(var + p.eps);  // see norm_fused.comp
  }
}

// The split path's merge of one item's chunk partials into its coefficients, shared by norm_finalize
// (a pass of its own) and norm_apply (per-channel weights: each chunk's team merges its item's partials
// itself, one dispatch and one barrier fewer).
shared afp sh_n[gl_WorkGroupSize.x];
shared afp sh_m[gl_WorkGroupSize.x];
shared afp sh_m2[gl_WorkGroupSize.x];

// Chan et al.: merge (nb, mb, m2b) into (na, ma, m2a), per group slot; a slot that b has no elements
// of keeps a's values. RMSNorm merges means of squares only, as a weighted sum, so an Inf stays Inf
// instead of becoming Inf - Inf.
#if PACK == 4
#define has_elements(n) greaterThan(n, vec4(0.0))
#else
#define has_elements(n) (n > 0.0)
#endif
void combine(inout afp na, inout afp ma, inout afp m2a, afp nb, afp mb, afp m2b) {
  afp n = na + nb;
  afp w = nb / at_least_one(n);
  afp m, m2 = m2a;
  if (OP == OP_RMSNORM) {
    m = ma * (na / at_least_one(n)) + mb * w;
  } else {
    afp delta = mb - ma;
    m = ma + delta * w;
    // delta * (delta * (na * w)), in that order (precise: no reassociation): merging into an empty a (na = 0)
    // must add 0, not inf * 0 = NaN where delta * delta overflows (a chunk mean past 1e19 about the pivot).
    precise afp spread = delta * (delta * (na * w));
    m2 = m2a + m2b + spread;
  }
  ma = mix(ma, m, has_elements(nb));
  m2a = mix(m2a, m2, has_elements(nb));
  na = n;
}

// Chan-combines item g's chunk partials across the first `width` lanes of the team (a power of two, at
// most TEAM); every lane gets the item's coefficients (pivot, shifted mean, a = 1/sqrt(var + eps)).
// Called in uniform control flow (barriers). The pivot comes from x (finalize: nothing is written yet)
// or from what norm_reduce kept of it (apply, the cooperative kernel).
void item_coefs(uint g, bool in_range, bool pivot_kept, uint width, out afp pivot, out afp mean, out afp a) {
  uint n_items = p.n_groups * p.n_chunks;
  uint lane = team_lane();
  afp n = afp(0), m = afp(0), m2 = afp(0);
  if (in_range && lane < width) {
    for (uint c = lane; c < p.n_chunks; c += width) {
      uint item = g * p.n_chunks + c;
      uint begin, end, plane;
      chunk_range(c, begin, end, plane);
      combine(n, m, m2, afp(float(end - begin)) * lanes_per_slot(plane), partial[item], partial[n_items + item]);
    }
  }
  uint lid = gl_LocalInvocationID.x;
  sh_n[lid] = n;
  sh_m[lid] = m;
  sh_m2[lid] = m2;
  barrier();
  for (uint s = width >> 1; s > 0u; s >>= 1) {
    if (lane < s) {
      combine(sh_n[lid], sh_m[lid], sh_m2[lid], sh_n[lid + s], sh_m[lid + s], sh_m2[lid + s]);
    }
    barrier();
  }
  uint first = lid - lane;
  // M2 is a sum of squares and Chan's terms are >= 0, so no clamp: a clamp compiles to max() on some
  // drivers, and max() drops the NaN that a NaN in the group must leave.
  afp var = OP == OP_RMSNORM ? sh_m[first] : sh_m2[first] / at_least_one(sh_n[first]);
  mean = OP == OP_LAYERNORM ? sh_m[first] : afp(0);
  a = inv_sqrt(var + p.eps);  // see norm_fused.comp
  pivot = !in_range || OP != OP_LAYERNORM ? afp(0) : pivot_kept ? partial[2u * n_items + g] : first_elements(group_base(g));
  barrier();  // the team's shared slots are free again
}

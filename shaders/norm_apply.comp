#version 450
#extension GL_GOOGLE_include_directive : require
// Pass 3 of the split path: y = ((x - pivot) - shifted mean) * a, then gamma/beta (by position in the
// group, or per channel). Grid-stride over every element of every group; cstep padding is never touched.
#include "common.glsl"


void main() {
  uint total = p.n_groups * GROUP_SIZE;
  uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * WG;
  for (uint e = workgroup_linear() * WG + gl_LocalInvocationID.x; e < total; e += stride) {
    uint g = e / GROUP_SIZE;
    uint i = e - g * GROUP_SIZE;
    uint at = group_base(g) + elem_offset(i);
    afp v = (load_x(at) - from_slots(coef[3u * g], i)) - from_slots(coef[3u * g + 1u], i);
    store_x(at, normalize_one(v, from_slots(coef[3u * g + 2u], i), AFFINE != 0u ? gamma_for(g, i) : wfp(1),
                                AFFINE != 0u && OP == OP_LAYERNORM ? beta_for(g, i) : wfp(0)));
  }
}

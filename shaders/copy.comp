#version 450
// The roof for `vknorm bench`: read and write the same bytes as a norm, nothing else.
layout(local_size_x_id = 0) in;
layout(push_constant) uniform Shape { uint n_vec4; } p;
layout(binding = 0) readonly buffer Src { vec4 src[]; };
layout(binding = 1) writeonly buffer Dst { vec4 dst[]; };

void main() {
  uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
  uint first = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
  for (uint i = first; i < p.n_vec4; i += stride) dst[i] = src[i];
}

#version 450
// vknorm bench's copy roof (shaders/copy.comp): a grid-stride vec4 copy.
layout(local_size_x_id = 0) in;
layout(push_constant) uniform P { uint n4; uint wgs; } p;
layout(std430, binding = 0) readonly buffer X { vec4 x[]; };
layout(std430, binding = 1) writeonly buffer Y { vec4 y[]; };
void main() {
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.n4; i += stride) y[i] = x[i];
}

#version 450
#extension GL_GOOGLE_include_directive : require
// Zeroes the cooperative kernel's counters (binding 4) where they start out in memory of unknown
// content: ncnn's workspace allocator, or a buffer just made. The kernel leaves them zero, so an
// executor that keeps the buffer from one forward to the next runs this once.
#define COOPERATIVE 1
#include "common.glsl"

void main() {
  uint j = workgroup_linear() * WG + gl_LocalInvocationID.x;
  if (j < p.n_groups + 1u) counter[j * COUNTER_STRIDE] = 0u;  // the counters only, not the room between them
}

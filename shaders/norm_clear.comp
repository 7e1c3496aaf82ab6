#version 450
#extension GL_GOOGLE_include_directive : require
// Zeroes the cooperative kernel's counters (binding 4) where they start out in memory of unknown
// content: a buffer just made, or one an ncnn layer keeps, which records this every forward. The kernel
// leaves them zero, so an executor that keeps the buffer from one forward to the next may run this once.
#define COOPERATIVE 1
#include "common.glsl"

void main() {
  uint j = workgroup_linear() * WG + gl_LocalInvocationID.x;
  // Each item's two counts (not the room after them), then the chunks' claims (packed).
  if (j < p.n_groups) {
    counter[j * COUNTER_STRIDE] = 0u;
    counter[j * COUNTER_STRIDE + 1u] = 0u;
  } else if (j < p.n_groups * (p.n_chunks + 1u)) {
    counter[p.n_groups * COUNTER_STRIDE + (j - p.n_groups)] = 0u;
  }
}

#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// The least a single-dispatch reduction norm can cost: every invocation holds its K vec4s in registers, and
//   MODE 0: writes them back (a copy through registers: all loads before any store);
//   MODE 1: + a workgroup reduction whose result scales the stores (a group per workgroup);
//   MODE 2: + one exchange before the stores among each run of SET consecutive workgroups (a group spread
//           over SET workgroups; SET = all of them: one device-wide exchange): each workgroup publishes its
//           partial, arrives at its set's counter, waits until every workgroup of the set has, and reads
//           another one's partial. The least such a group needs: one round trip, no ticket, no merge.
// Every workgroup must be resident at once (the harness dispatches at most what the device keeps resident).
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint K = 1;
layout(constant_id = 2) const uint MODE = 0;
layout(constant_id = 3) const uint SET = 1;
layout(push_constant) uniform P { uint n4; uint wgs; } p;
layout(std430, binding = 0) readonly buffer X { vec4 x[]; };
layout(std430, binding = 1) writeonly buffer Y { vec4 y[]; };
// [0] waits that gave up, [1] partials read before they were published (a wait that ended early: the timing is
// then invalid); set s (128 bytes apart): [32 (s + 1)] arrivals, [32 (s + 1) + 1] generation (one per dispatch)
layout(std430, binding = 2) coherent volatile buffer C { uint counter[]; };
// per workgroup: its partial and the generation it was published in
layout(std430, binding = 3) coherent buffer Q { vec2 partial[]; };
shared float sh_sum[64];
shared float sh_scale;

void main() {
  uint stride = p.wgs * gl_WorkGroupSize.x;
  uint first = gl_WorkGroupID.x * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
  vec4 v[K];
  for (uint k = 0u; k < K; ++k) v[k] = x[min(first + k * stride, p.n4 - 1u)];  // no load behind a branch
  float scale = 1.0;
  if (MODE >= 1u) {
    float s = 0.0;
    for (uint k = 0u; k < K; ++k)
      if (first + k * stride < p.n4) s += v[k].x + v[k].y + v[k].z + v[k].w;
    s = subgroupAdd(s);
    if (subgroupElect()) sh_sum[gl_SubgroupID] = s;
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
      float t = 0.0;
      for (uint j = 0u; j < gl_NumSubgroups; ++j) t += sh_sum[j];
      if (MODE == 2u && SET > 1u) {  // a set of one is a group per workgroup: nothing to exchange
        uint set = gl_WorkGroupID.x / SET, first_of_set = set * SET, at = 32u * (set + 1u);
        uint generation = counter[at + 1u];  // moves on once every workgroup of the set, this one too, arrived
        partial[gl_WorkGroupID.x] = vec2(t, float(generation));
        memoryBarrierBuffer();
        if (atomicAdd(counter[at], 1u) == SET - 1u) {
          counter[at] = 0u;
          memoryBarrierBuffer();
          atomicAdd(counter[at + 1u], 1u);
        } else {
          uint polls = 0u;
          while (counter[at + 1u] == generation) {
            if (++polls == (1u << 20)) { atomicAdd(counter[0], 1u); break; }
          }
        }
        memoryBarrierBuffer();
        vec2 other = partial[first_of_set + (gl_WorkGroupID.x - first_of_set + 1u) % SET];
        if (other.y != float(generation)) atomicAdd(counter[1], 1u);
        t = other.x;
      }
      sh_scale = 1.0 / (1.0 + abs(t) * 1e-30);
    }
    barrier();
    scale = sh_scale;
  }
  for (uint k = 0u; k < K; ++k)
    if (first + k * stride < p.n4) y[first + k * stride] = v[k] * scale;
}

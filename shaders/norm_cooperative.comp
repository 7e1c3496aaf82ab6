#version 450
#extension GL_GOOGLE_include_directive : require
// One dispatch for groups larger than a workgroup holds, or too few to fill the GPU: a workgroup per
// chunk of a group (the split path's chunks, or runs of whole planes: CHUNK_PLANES) holds the chunk in
// registers, publishes its partial (mean, M2 about the group's pivot, as norm_reduce does), waits until
// every chunk of its item has, merges them (split_coefs.glsl) and normalizes its registers. x is read
// once and y written once, where the split path reads x twice in two or three dispatches.
//
// Waiting on other workgroups needs all chunks of an item resident at once. Vulkan promises no
// order or concurrency among workgroups, so: the dispatcher plans this kernel only for items of at
// most as many chunks as the device keeps workgroups resident (DeviceCaps::cooperative_workgroups),
// and a workgroup takes the next chunk when it starts (a ticket), not by its id. Chunks are then
// handed out in the order workgroups run: those a workgroup waits for are running or yet to start,
// and a slot frees as soon as the item ahead completes.
//
// Counters (binding 4, uint, COUNTER_STRIDE apart: common.glsl): the tickets taken, then each item's count:
// +1 when a chunk's partial is published (the item is complete at n_chunks), +1 when a workgroup has seen it
// complete.
// They are zero before the dispatch (the executor zeroes them once, or a clear pass does) and zero
// after it: the last ticket and each item's last count reset them, when no one reads them any more.
#define COOPERATIVE 1
#include "common.glsl"
#include "split_coefs.glsl"

// How a waiting workgroup polls its item's count (spec id 17). 1: plain loads of the volatile counter
// (GPUs: an atomic per poll from every waiting workgroup saturates the L2's atomic units; H200, LayerNorm
// 8192x4096: 182 us polling with atomics). 0: atomics (CPU drivers, whose compilers may keep a plain load
// out of the loop).
layout(constant_id = 17) const uint POLL_LOADS = 1;
// 1: chunks are runs of whole planes (planes smaller than a chunk, too many for one chunk each to be resident
// at once), each element addressed through its plane; only where a packed element holds one group (pack1, or
// whole pack4 planes per group), so the group slots are the same in every plane. 0: a chunk lies in one plane.
layout(constant_id = 18) const uint CHUNK_PLANES = 0;
// A wait that outlives 2^22 polls gives up and writes NaN for its item (the device did not keep the
// item's chunks resident together): a visible failure rather than a hung queue. 64 polls per iteration:
// llvmpipe ends a shader's loops after 65535 iterations.
#define POLL(seen, g) seen = POLL_LOADS != 0u ? COUNT(g) : atomicAdd(COUNT(g), 0u);
#define POLL_4(seen, g) POLL(seen, g) POLL(seen, g) POLL(seen, g) POLL(seen, g)
#define POLL_16(seen, g) POLL_4(seen, g) POLL_4(seen, g) POLL_4(seen, g) POLL_4(seen, g)

shared uint sh_ticket;
shared bool sh_complete;
shared wfp sh_chunk_gamma, sh_chunk_beta;

void main() {
  uint n_items = p.n_groups * p.n_chunks;
  // A grid folded past the x limit (common.glsl) has workgroups beyond the last chunk: they take no ticket,
  // which would hand a chunk out again once the last ticket reset the count.
  if (workgroup_linear() >= n_items) return;
  if (gl_LocalInvocationIndex == 0u) {
    sh_ticket = atomicAdd(counter[0], 1u);
    if (sh_ticket == n_items - 1u) counter[0] = 0u;  // every ticket is taken
  }
  barrier();
  uint chunk = sh_ticket;  // < n_items: one workgroup per chunk
  uint g = chunk / p.n_chunks;
  uint c = chunk - g * p.n_chunks;
  uint begin, end, plane;
  chunk_range(c, begin, end, plane);
  uint base = group_base(g);
  uint at = base + plane * (p.cstep - PLANE_SIZE);  // + i: element i of this chunk's plane
#define ELEM(i) (CHUNK_PLANES != 0u ? base + elem_offset(i) : at + (i))
  uint lane = gl_LocalInvocationID.x;
  afp n = afp(float(end - begin)) * lanes_per_slot(plane);
  // Read before this workgroup publishes, so before any of the item is written in place.
  afp group_pivot = OP == OP_LAYERNORM ? first_elements(base) : afp(0);
  afp pivot = from_slots(group_pivot, begin);

  // The chunk, held as stored; loads never behind a branch (see norm_fused.comp): an index past the
  // chunk loads its first element and never uses it.
  hfp h[ITEMS];
  afp s = afp(0);
  for (uint k = 0u; k < ITEMS; ++k) {
    uint i = begin + lane + k * WG;
    bool inside = i < end;
    h[k] = load_held(ELEM(inside ? i : begin));
    if (inside) {
      store_sum(ELEM(i), h[k]);
      afp d = unpack_held(h[k]) - pivot;
      s += OP == OP_LAYERNORM ? d : d * d;
    }
  }
  afp mean = team_sum(to_slots(s, begin)) / at_least_one(n);  // LayerNorm: shifted mean; RMSNorm: mean of squares
  afp m2 = afp(0);
  if (OP == OP_LAYERNORM) {
    afp lane_mean = from_slots(mean, begin);
    afp q = afp(0);
    for (uint k = 0u; k < ITEMS; ++k) {
      afp d = (unpack_held(h[k]) - pivot) - lane_mean;
      if (begin + lane + k * WG < end) q += d * d;
    }
    m2 = team_sum(to_slots(q, begin));
  }

  // Per-channel weights are one value per chunk (a chunk lies in one plane). With PREFETCH_WEIGHTS the last
  // invocation loads them into shared memory while the first one publishes and waits, so they arrive
  // during the wait (loaded by the publishing invocation, they would hold up its memory barrier).
  const bool chunk_weights = PREFETCH_WEIGHTS != 0u && AFFINE != 0u && WEIGHTS != 0u;
  if (chunk_weights && gl_LocalInvocationIndex == WG - 1u) {
    sh_chunk_gamma = gamma_for(g, begin);
    sh_chunk_beta = OP == OP_LAYERNORM ? beta_for(g, begin) : wfp(0);
  }

  // Publish, then wait for the item's other chunks (one invocation polls; the rest wait at the barrier).
  if (gl_LocalInvocationIndex == 0u) {
    publish_partial(chunk, g, c, mean, m2, group_pivot);
    memoryBarrierBuffer();
    uint seen = atomicAdd(COUNT(g), 1u) + 1u;
    for (uint k = 0u; k < 65536u && seen < p.n_chunks; ++k) {
      POLL_16(seen, g) POLL_16(seen, g) POLL_16(seen, g) POLL_16(seen, g)
    }
    sh_complete = seen >= p.n_chunks;
    memoryBarrierBuffer();
    // The item's last workgroup past its wait leaves the count zero for the next dispatch.
    if (atomicAdd(COUNT(g), 1u) == 2u * p.n_chunks - 1u) COUNT(g) = 0u;
  }
  barrier();
  afp group_pivot_kept, group_mean, a;
  uint width = 1u;  // lanes that merge the partials: the item's chunks, rounded up to a power of two
  while (width < min(p.n_chunks, WG)) width <<= 1;
  item_coefs(g, true, true, width, group_pivot_kept, group_mean, a);
  if (!sh_complete) a = afp(uintBitsToFloat(0x7fc00000u));

  wfp chunk_gamma = chunk_weights ? sh_chunk_gamma : wfp(1);  // written before the barrier above
  wfp chunk_beta = chunk_weights ? sh_chunk_beta : wfp(0);
  group_mean = from_slots(group_mean, begin);
  a = from_slots(a, begin);
  for (uint k = 0u; k < ITEMS; ++k) {
    uint i = begin + lane + k * WG;
    if (i < end) {
      wfp gw = chunk_weights ? chunk_gamma : AFFINE != 0u ? gamma_for(g, i) : wfp(1);
      wfp bw = chunk_weights ? chunk_beta : AFFINE != 0u && OP == OP_LAYERNORM ? beta_for(g, i) : wfp(0);
      store_x(ELEM(i), normalize_one((unpack_held(h[k]) - pivot) - group_mean, a, gw, bw));
    }
  }
}

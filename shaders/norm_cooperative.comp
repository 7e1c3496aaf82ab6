#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_memory_scope_semantics : require
// One dispatch for groups larger than a workgroup holds, or too few to fill the GPU: a workgroup per
// chunk of a group (the split path's chunks, or runs of whole planes: CHUNK_PLANES) holds the chunk in
// registers, publishes its partial (mean, M2 about the group's pivot, as norm_reduce does), waits until
// every chunk of its item has, merges them (split_coefs.glsl) and normalizes its registers. x is read
// once and y written once, where the split path reads x twice in two or three dispatches.
//
// Waiting on other workgroups is safe only if they run. Vulkan promises no order or concurrency among
// workgroups, so the wait never depends on it: a workgroup takes the chunk of its own id when it starts,
// claiming it (its loads go out first: the claim is needed only before the partial is published), and one
// whose wait runs long claims the item's chunks that no workgroup has started yet and reduces them itself,
// streaming them from x, then normalizes them once the item is complete. A workgroup that finds its chunk
// claimed leaves at once. Every chunk is then published by a running workgroup, whatever the device runs
// together (a ticket taken before any load, as before, left items of NaN or untouched inputs where chunks could
// not all run at once). The dispatcher still plans items of at most as many chunks as the device keeps
// workgroups resident (DeviceCaps::cooperative_workgroups), so that none waits long. The take-over runs apart
// from the main path (take_over), which keeps the registers of a kernel without it. H200: level with the ticket
// or faster (docs/benchmarks).
//
// Counters (binding 4, uint; common.glsl): per item, COUNTER_STRIDE apart, its count of published partials (the
// item is complete at n_chunks) and, next to it, its count of the workgroups done with it (a workgroup whose chunk
// was taken is done before the item is complete, so this is a count of its own); then, packed, each chunk's claim
// (0, or 1 + the id of the workgroup that took it). They are zero before the dispatch (the executor zeroes them
// once, or a clear pass does) and zero after it: each item's last workgroup resets them, when no one reads
// them any more.
#define COOPERATIVE 1
#include "common.glsl"
#include "split_coefs.glsl"

// How a waiting workgroup polls its item's count (spec id 17). 1: atomic loads (GPUs: a read-modify-write per
// poll from every waiting workgroup saturates the L2's atomic units; H200, LayerNorm 8192x4096: 182 us polling
// with them). 0: read-modify-writes (CPU drivers, as measured when polls were plain loads; lavapipe passes the
// cooperative tests either way).
layout(constant_id = 17) const uint POLL_LOADS = 1;
// 1: chunks are runs of whole planes (planes smaller than a chunk, too many for one chunk each to be resident
// at once), each element addressed through its plane; only where a packed element holds one group (pack1, or
// whole pack4 planes per group), so the group slots are the same in every plane. 0: a chunk lies in one plane.
layout(constant_id = 18) const uint CHUNK_PLANES = 0;
// A wait polls its item's count in rounds of 4096 (64 per iteration: llvmpipe ends a shader's loops after 65535
// iterations), trying after each round to claim a chunk no workgroup has started. One that outlives WAIT_ROUNDS
// rounds (one more where it took chunks over; a workgroup that claimed a chunk never published it) gives up and
// writes NaN over its own chunks (other chunks of the item may come out normalized): a visible failure rather than
// a hung queue. The limit counts polls, not time: a workgroup stalled past it (a CPU driver's thread preempted
// for tens of milliseconds) makes the item partly NaN. It still leaves the item, so the item's
// last workgroup zeroes the counters as always: the next forward, which takes them for zero, is not misled.
// 1024 (2^22 polls) on GPUs, 16384 on CPU devices, whose threads the OS preempts; the dispatcher sets 0 only to
// test giving up (VKNORM_TUNE_WAIT_ROUNDS).
layout(constant_id = 19) const uint WAIT_ROUNDS = 1024;
// A poll is an atomic operation, so that the fence after the wait acquires the partials it counted (a plain
// load, volatile or not, synchronizes with nothing); relaxed, the fence orders.
#define POLL(seen, g) \
  seen = POLL_LOADS != 0u ? atomicLoad(COUNT(g), gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed) \
                          : atomicAdd(COUNT(g), 0u);
#define POLL_4(seen, g) POLL(seen, g) POLL(seen, g) POLL(seen, g) POLL(seen, g)
#define POLL_16(seen, g) POLL_4(seen, g) POLL_4(seen, g) POLL_4(seen, g) POLL_4(seen, g)
const uint POLL_ITERATIONS = 1u << 6;  // 2^12 polls a round
#define CLAIM(chunk) counter[p.n_groups * COUNTER_STRIDE + (chunk)]
#define DONE(g) counter[(g) * COUNTER_STRIDE + 1u]
const uint COMPLETE = 0xffffffffu, NONE = 0xfffffffeu;  // a round's outcome, or the chunk it claimed

// Lane 0 acquires what other workgroups wrote (its fence after a wait) or releases what this one read (before
// leaving an item) for the whole workgroup: barrier() orders workgroup memory only, so the barriers at those hand-offs
// order buffer memory too, and every lane's later reads see what lane 0 acquired.
#define HANDOFF_BARRIER()                                                                                           \
  controlBarrier(gl_ScopeWorkgroup, gl_ScopeWorkgroup, gl_StorageSemanticsShared | gl_StorageSemanticsBuffer,      \
                 gl_SemanticsAcquireRelease)

shared uint sh_taken, sh_state;
shared bool sh_last;
shared wfp sh_chunk_gamma, sh_chunk_beta;

// Element i of the chunk: `base` is its item's, `at` its plane's (see main).
#define ELEM(i) (CHUNK_PLANES != 0u ? base + elem_offset(i) : at + (i))
uint plane_at(uint base, uint plane) { return base + plane * (p.cstep - PLANE_SIZE); }

// A chunk of item g that no workgroup has started, claimed for this one (lane 0), or NONE.
uint claim_unstarted(uint g, uint me) {
  for (uint c = 0u; c < p.n_chunks; ++c) {
    uint chunk = g * p.n_chunks + c;
    if (CLAIM(chunk) == 0u && atomicCompSwap(CLAIM(chunk), 0u, me + 1u) == 0u) return c;
  }
  return NONE;
}

// One round of item g's wait (lane 0): polls its count until the item is complete or a round of polls has gone,
// then, where the item is not complete and may_claim, claims a chunk no workgroup has started. Returns COMPLETE,
// the chunk claimed, or NONE; `seen` keeps the count last read.
uint wait_round(uint g, uint chunk, inout uint seen, bool may_claim) {
  for (uint k = 0u; k < POLL_ITERATIONS && seen < p.n_chunks; ++k) {
    POLL_16(seen, g) POLL_16(seen, g) POLL_16(seen, g) POLL_16(seen, g)
  }
  return seen >= p.n_chunks ? COMPLETE : may_claim ? claim_unstarted(g, chunk) : NONE;
}

// Publishes chunk c's partial and counts it (lane 0); returns the item's count with it.
uint publish_counted(uint g, uint c, afp mean, afp m2, afp group_pivot) {
  publish_partial(g * p.n_chunks + c, g, c, mean, m2, group_pivot);
  memoryBarrierBuffer();
  return atomicAdd(COUNT(g), 1u) + 1u;
}

// Reduces chunk c of item g from x (nothing of the item is written before it is complete) and publishes its
// partial as its own workgroup would have. Uniform control flow.
void reduce_claimed(uint g, uint c, uint base, afp group_pivot) {
  uint begin, end, plane;
  chunk_range(c, begin, end, plane);
  uint at = plane_at(base, plane);
  afp pivot = from_slots(group_pivot, begin);
  afp s = afp(0);
  for (uint i = begin + gl_LocalInvocationID.x; i < end; i += WG) {
    hfp h = load_held(ELEM(i));
    store_sum(ELEM(i), h);
    afp d = unpack_held(h) - pivot;
    s += OP == OP_LAYERNORM ? d : d * d;
  }
  afp mean = team_sum(to_slots(s, begin)) / at_least_one(afp(float(end - begin)) * lanes_per_slot(plane));
  afp m2 = afp(0);
  if (OP == OP_LAYERNORM) {
    afp lane_mean = from_slots(mean, begin);
    afp q = afp(0);
    for (uint i = begin + gl_LocalInvocationID.x; i < end; i += WG) {
      afp d = (load_x(ELEM(i)) - pivot) - lane_mean;
      q += d * d;
    }
    m2 = team_sum(to_slots(q, begin));
  }
  if (gl_LocalInvocationIndex == 0u) publish_counted(g, c, mean, m2, group_pivot);
}

// Normalizes chunk c of item g from x, with the item's coefficients as group slots.
void normalize_claimed(uint g, uint c, uint base, afp group_pivot, afp group_mean, afp a) {
  uint begin, end, plane;
  chunk_range(c, begin, end, plane);
  uint at = plane_at(base, plane);
  afp pivot = from_slots(group_pivot, begin);
  afp lane_mean = from_slots(group_mean, begin);
  afp lane_a = from_slots(a, begin);
  for (uint i = begin + gl_LocalInvocationID.x; i < end; i += WG) {
    wfp gw = AFFINE != 0u ? gamma_for(g, i) : wfp(1);
    wfp bw = AFFINE != 0u && OP == OP_LAYERNORM ? beta_for(g, i) : wfp(0);
    store_x(ELEM(i), normalize_one((load_x(ELEM(i)) - pivot) - lane_mean, lane_a, gw, bw));
  }
}

// The workgroup of a chunk id is done with its item (lane 0, after a memory barrier). The item's last one resets
// its counts, and returns true: its workgroup then resets the claims (reset_claims), every lane a few of them.
// Only the last one fences again, acquiring the other workgroups' leaves (their reads of the claims come first).
bool leave_item(uint g) {
  if (atomicAdd(DONE(g), 1u) != p.n_chunks - 1u) return false;
  memoryBarrierBuffer();
  COUNT(g) = 0u;
  DONE(g) = 0u;
  return true;
}
void reset_claims(uint g) {
  for (uint c = gl_LocalInvocationID.x; c < p.n_chunks; c += WG) CLAIM(g * p.n_chunks + c) = 0u;
}
// The same for the whole workgroup, apart from a wait (its chunk taken, chunks of others normalized, or a wait
// given up): the wait itself leaves inside its last round, sparing these barriers. The first barrier keeps every
// lane's reads of the claims (take_over's normalize loop) before the leave: once left, the item's last workgroup
// may zero them, and a lane still reading would skip its share of a chunk.
void leave_item_and_reset(uint g) {
  HANDOFF_BARRIER();
  if (gl_LocalInvocationIndex == 0u) {
    memoryBarrierBuffer();
    sh_last = leave_item(g);
  }
  HANDOFF_BARRIER();
  if (sh_last) reset_claims(g);
}

// Lanes that merge an item's partials: its chunks, rounded up to a power of two.
uint merge_width() {
  uint width = 1u;
  while (width < min(p.n_chunks, WG)) width <<= 1;
  return width;
}

// The wait of the workgroup of this id, once it has claimed chunk `claimed` of its item, which no workgroup had
// started. Its own chunk's registers are dropped: until the item is complete nothing of it is written, so that
// chunk is read again from x, like every chunk this workgroup claims. It reduces and publishes what it claimed,
// goes on polling (and claiming) from round `round`, then normalizes all of them. Kept apart from main so that
// the main path's held chunk is not held through this code (H200, GroupNorm 1280x40x40/32 fp32: 123 registers
// per invocation with it inside the wait loop, 96 apart; 10.9 -> 10.0 us).
void take_over(uint claimed, uint round) {
  uint chunk = workgroup_linear();
  uint g = chunk / p.n_chunks;
  uint base = group_base(g);
  barrier();  // every lane has read sh_state
  afp group_pivot = OP == OP_LAYERNORM ? first_elements(base) : afp(0);  // the item is not complete: x is intact
  uint state = claimed;
  uint seen = 0u;
  // Every chunk claimed is reduced: the first round here always runs, and the last claims none.
  for (; round <= WAIT_ROUNDS && state != COMPLETE; ++round) {
    if (state != NONE) reduce_claimed(g, state, base, group_pivot);
    if (gl_LocalInvocationIndex == 0u) {
      sh_state = wait_round(g, chunk, seen, round < WAIT_ROUNDS);
      memoryBarrierBuffer();
    }
    HANDOFF_BARRIER();
    state = sh_state;
    barrier();  // sh_state is free for the next round
  }
  afp group_pivot_kept, group_mean, a;
  item_coefs(g, true, true, merge_width(), group_pivot_kept, group_mean, a);
  if (state != COMPLETE) a = afp(uintBitsToFloat(0x7fc00000u));
  for (uint c = 0u; c < p.n_chunks; ++c)  // this workgroup's own chunk among them
    if (CLAIM(g * p.n_chunks + c) == chunk + 1u) normalize_claimed(g, c, base, group_pivot, group_mean, a);
  leave_item_and_reset(g);
}

void main() {
  uint n_items = p.n_groups * p.n_chunks;
  // A grid folded past the x limit (common.glsl) has workgroups beyond the last chunk: they have no chunk.
  uint chunk = workgroup_linear();
  if (chunk >= n_items) return;
  uint claimed_by = 0u;
  if (gl_LocalInvocationIndex == 0u) claimed_by = atomicCompSwap(CLAIM(chunk), 0u, chunk + 1u);
  uint g = chunk / p.n_chunks;
  uint c = chunk - g * p.n_chunks;
  uint begin, end, plane;
  chunk_range(c, begin, end, plane);
  uint base = group_base(g);
  uint at = plane_at(base, plane);
  uint lane = gl_LocalInvocationID.x;
  afp n = afp(float(end - begin)) * lanes_per_slot(plane);
  // Read before this workgroup publishes, so before any of the item is written in place.
  afp group_pivot = OP == OP_LAYERNORM ? first_elements(base) : afp(0);
  afp pivot = from_slots(group_pivot, begin);

  // The chunk, held as stored; loads never behind a branch (see norm_fused.comp): an index past the
  // chunk loads its first element and never uses it. A chunk another workgroup claimed first is reduced from
  // x there; the sums stored here are the same values.
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
  if (gl_LocalInvocationIndex == 0u) sh_taken = claimed_by;
  afp mean = team_sum(to_slots(s, begin)) / at_least_one(n);  // LayerNorm: shifted mean; RMSNorm: mean of squares
  barrier();
  if (sh_taken != 0u) {  // taken by a workgroup that waited on it
    leave_item_and_reset(g);
    return;
  }
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

  // Publish, then wait for the item's other chunks: one invocation polls, the rest wait at the barrier. A round
  // without the item complete tries to claim a chunk no one has started; one claimed, the workgroup goes on in
  // take_over, which no longer needs this chunk's registers.
  uint seen = 0u;
  if (gl_LocalInvocationIndex == 0u) seen = publish_counted(g, c, mean, m2, group_pivot);
  uint state = NONE, round = 0u;
  bool last = false;
  for (; round < WAIT_ROUNDS; ++round) {
    if (gl_LocalInvocationIndex == 0u) {
      sh_state = wait_round(g, chunk, seen, true);
      memoryBarrierBuffer();
      sh_last = sh_state == COMPLETE && leave_item(g);  // done with the item's counters
    }
    HANDOFF_BARRIER();
    state = sh_state;
    if (state != NONE) {
      last = sh_last;
      break;
    }
    barrier();  // sh_state is free for the next round
  }
  if (state != COMPLETE && state != NONE) {
    take_over(state, round + 1u);
    return;
  }
  if (last) reset_claims(g);
  if (state == NONE) leave_item_and_reset(g);  // gave up: its item comes out NaN, its counters zero as always
  afp group_pivot_kept, group_mean, a;
  item_coefs(g, true, true, merge_width(), group_pivot_kept, group_mean, a);
  if (state != COMPLETE) a = afp(uintBitsToFloat(0x7fc00000u));

  wfp chunk_gamma = chunk_weights ? sh_chunk_gamma : wfp(1);  // written before the barriers above
  wfp chunk_beta = chunk_weights ? sh_chunk_beta : wfp(0);
  afp lane_mean = from_slots(group_mean, begin);
  afp lane_a = from_slots(a, begin);
  for (uint k = 0u; k < ITEMS; ++k) {
    uint i = begin + lane + k * WG;
    if (i < end) {
      wfp gw = chunk_weights ? chunk_gamma : AFFINE != 0u ? gamma_for(g, i) : wfp(1);
      wfp bw = chunk_weights ? chunk_beta : AFFINE != 0u && OP == OP_LAYERNORM ? beta_for(g, i) : wfp(0);
      store_x(ELEM(i), normalize_one((unpack_held(h[k]) - pivot) - lane_mean, lane_a, gw, bw));
    }
  }
}

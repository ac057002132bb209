// Grouped expert kernels, bulk-copy variant: the same work items, tiles, mma fragments, epilogue
// and deterministic combine as experts_kernel.cuh (experts_common.cuh), with weights AND
// activations streamed by the copy engine (cp.async.bulk, Hopper's TMA in its 1-D form) into a
// ring of shared-memory stages, and the warps specialised so that nothing waits on a round trip
// it could have started earlier.
//
// Why: the register variant holds its in-flight bytes in registers (96-160 KB per SM), waits a
// round trip per run of blocks and drains at item ends: ncu measured its DeepSeek-V3 T=1 expert
// kernels at 3.67 (gate/up) and 3.07 TB/s (down) of the H200's ~4.6. A first bulk version that
// left the task / pair-list / activation loads and the epilogue to the consumer warps was 15%
// slower still (three dependent L2 round trips at every item start, a fence and an atomic
// blocking all warps at every down item's end). This one: 3.99 and 3.44 TB/s (ncu), the layer
// 0.80 of the read bandwidth at T=1 against 0.62 for the register kernels in the same run
// (src/cuda/layer/NOTES.md).
//   warps 8-9 (producers): each walks the CTA's items (a contiguous range of the tile-major item
//     list, sizes within one of each other: every item of a launch moves the same bytes, so the
//     split is even and there is no atomic round trip), fetching item i+2's task and item i+1's
//     pair ids while it issues item i's stages, and fills the ring slots it owns (slot % 2).
//     For each k chunk of kChunkBlocks 64-wide blocks it waits for its slot to be free, writes
//     the stage's item record (expert, tile, token count, pair ids), arms the stage's "full"
//     mbarrier with the byte count and issues the bulk copies: 16 weight rows (each row's chunk
//     is contiguous) and one activation row per token (x, or h in down mode), all completing on
//     that barrier. why two: a bulk copy takes uniform operands, so a warp issues its lanes'
//     copies one after another (~20 instructions each); one warp's issue rate limited the
//     stream (ncu, session 5). Measured (H200, session 6, same run): 2 producers + 4 KB rows
//     against 1 + 2 KB rows take DeepSeek-V3 1.4% less time at T=1, 13% less at T=128, and
//     Qwen3-30B-A3B 4% less at T=1, 12% at T=8, 15% at T=32 (4 KB rows alone: 3%, 4%, 5%).
//   warps 0-7 (consumers): wait for a stage, run the mma of their k blocks from shared memory
//     (block w and w + 8 of the chunk), release the stage ("empty" mbarrier), and at an item's
//     end hand their accumulators to the epilogue through one of kRedBuffers reduction buffers
//     ("red_full" mbarrier). They touch no global memory.
//   warp 10 (epilogue): sums the eight warps' accumulators in warp order (deterministic), writes
//     h = act(g, u) or the fp32 down partials and frees the buffer ("red_empty"). In down mode,
//     at the CTA's last item of a tile: a tile all of whose items were this CTA's (most of
//     them: ranges are contiguous and tile-major) is combined by this warp; a tile shared with
//     a neighbouring CTA (at most two per CTA) is counted in its tile counter after a fence, and
//     the CTA that completes the count combines it. The epilogue lags the consumers by up to
//     kRedBuffers items, so its stores do not stall the stream, and it combines a tile one pass
//     at a time while the consumers have not filled its next buffer (bulk_combine_pass; at once
//     in the instances that run at <= 8 tokens only, bulk_combine_tile).
// Barrier arrivals: every lane that wrote what a barrier publishes, or read what it releases,
// arrives on it (compute-sanitizer's racecheck does not take a __syncwarp before one lane's
// arrival as ordering; with a 2-stage ring it reports the consumers' reads against the next fill).
// Stage layout: 16 weight rows then kNT * 8 activation rows, each at a pitch of kChunkBlocks *
// 128 + 64 bytes, so the rows read by one quarter-warp's 16-byte loads fall in different banks
// (the one-token rings: one activation row, and no pad, BulkShape<1, 2> and <1, 3>; the ring of
// weights only, BulkShape<1, 4> and <2, 4>: no activation rows, the consumers load theirs from L2).
// PDL: gate/up's producers wait for the dispatch (first issuing the fused shared experts' items,
// which need nothing from it, up to ExpertsParams::early_shared; measured on the H200: DeepSeek-V3
// T=1 205.5 -> 199.1 us) and let the down kernel launch; the down kernel's CTAs
// take SMs as gate/up CTAs finish, and its producer issues the weight copies of its first
// kStages stages before griddepcontrol.wait (weights and the dispatch, two launches back, are
// ready) and their activation (h) copies after it: W2 streams through the gate/up tail. After
// its wait the down kernel lets the next kernel launch (the next layer's router GEMM, which loads
// its weights while we stream).
// Fused (experts_bulk_fused_kernel, the Persistent variant): the same warps run a CTA's gate/up
// items (dealt round-robin in task order) and then its down items in one grid of resident CTAs.
// Each gate/up item's epilogue counts itself in its task's counter (release); a down item's
// producer issues the item's weight copies at once and its h copies after acquiring the counter
// at the task's gate/up item count. Opt-in only: on the H200 it was 17-18% slower than the two
// launches with one producer and 2 KB rows (session 5); with two producers and 4 KB rows it is
// within 1% of them on DeepSeek-V3 (T=1..128) but 5-13% slower on Qwen3-30B-A3B (session 6,
// src/cuda/layer/NOTES.md).
// Down tail (the kTail instances, chosen by experts_down_tail): the last tiles' items are claimed
// one by one, as gate/up's tail; they are combined once every CTA has counted its partials
// written (wait_for_every_cta), by the consumer and epilogue warps of the whole grid
// (combine_tail_outputs). Measured on the H200 at 9-64 tokens: DeepSeek-V3 -0.2..-1.7%; at 2-8
// tokens (the split-row instance's twin) -0.9..-1.9% (experts_down_tail).
// Self-routing gate/up (the kSelfRoute instance, one token, no shared experts, E <= 128): no
// routing kernel runs; the gate/up kernel waits on the router GEMM and routes its token itself
// (experts_self_route_tokens: Qwen3-30B-A3B T=1 -4.0%).
// Preconditions (checked by the layer): as experts_kernel.cuh, and 16-byte aligned rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/experts/bulk_copy.cuh"
#include "cuda/experts/experts.h"
#include "cuda/experts/experts_common.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/trace.cuh"
#include "cuda/routing/routing_kernel.cuh"

namespace moekit::cuda::experts_detail {

constexpr int kBulkConsumerWarps = 8;
constexpr int kBulkProducerWarps = 2;  // filling alternate ring slots (header: why two)
constexpr int kBulkProducerWarp = kBulkConsumerWarps;  // the first producer warp
constexpr int kBulkEpilogueWarp = kBulkConsumerWarps + kBulkProducerWarps;
constexpr int kBulkThreads = (kBulkConsumerWarps + kBulkProducerWarps + 1) * 32;
constexpr int kBulkWeightRows = 16;    // weight rows per item (the mma's M)
constexpr int kDefaultRedBuffers = 4;  // items the epilogue warp may lag behind (BulkShape)
constexpr int kClaimSlots = 4;         // gate/up tail claims producer 0 may be ahead of producer 1

// The epilogue warp's one-shot combine of a down tile (combine_tile), in the down instances that
// run at <= 8 tokens only (the rings, the split rows: kCombineInPasses false): at 1-4 tokens
// (16-64 outputs) all slots (up to 16) of 1-2 outputs per lane in one batch of loads, one L2
// round trip per tile instead of 3 (9 slots, 4 at a time); at 5-8 tokens 4 outputs x 8 slots;
// above, 8 x 4. (More loads in flight spill: the kernel's 168 registers.)
__device__ __forceinline__ void bulk_combine_tile(const ExpertsParams& dn, int tile, int lane) {
  const int outputs = dn.tokens * 16;
  if (outputs <= 32) {
    combine_tile<1, 16>(dn, tile, lane, 32);
  } else if (outputs <= 64) {
    combine_tile<2, 16>(dn, tile, lane, 32);
  } else if (outputs <= 128) {
    combine_tile<4, 8>(dn, tile, lane, 32);
  } else {
    combine_tile<8, 4>(dn, tile, lane, 32);
  }
}

// Pass `pass` (0, 1, ...) of the epilogue warp's combine of a down tile; true while passes
// remain. At 1-4 tokens (16-64 outputs) one pass, bulk_combine_tile's (quads there were 1.7%
// slower on Qwen3-30B-A3B at one token, bench/results/h200/2026-12-01-s17-experiments, run 2).
// Above, quads (combine_tile_quads_pass, 4 rows per load): up to 8 tokens one unit per lane with
// all its slots (one round trip), up to 16 tokens 2 units x 8 slots, then passes of 4 units x 4
// slots (128 tokens, 9 slots: 4 passes of 3 round trips; 4 x 5 spilled in the L2-keeping
// dynamic-tail instance, the kernel's registers being capped at 168).
__device__ __forceinline__ bool bulk_combine_pass(const ExpertsParams& dn, int tile, int pass,
                                                  int lane) {
  const int outputs = dn.tokens * 16, units = dn.tokens * 4;
  if (outputs <= 32) {
    combine_tile<1, 16>(dn, tile, lane, 32);
    return false;
  }
  if (outputs <= 64) {
    combine_tile<2, 16>(dn, tile, lane, 32);
    return false;
  }
  if (units <= 32) return combine_tile_quads_pass<1, 16>(dn, tile, pass, lane, 32);
  if (units <= 64) return combine_tile_quads_pass<2, 8>(dn, tile, pass, lane, 32);
  return combine_tile_quads_pass<4, 4>(dn, tile, pass, lane, 32);
}

// What a stage (and, for the epilogue, a reduction buffer) holds besides its bytes.
struct BulkItem {
  int item;  // work item, or -1: no more work
  int expert;
  int tile;
  int count;  // tokens of the task
  int chunk;  // k chunk of this stage
  int down;   // fused kernel: 1 for a down item, 0 for gate/up
  int task;   // task id (the fused kernel's gate/up completion counter)
  int more;   // kKeep: ExpertTask::more of the item's task (also: 96 bytes, barriers stay aligned)
  int pairs[16];  // pair ids of the task's tokens (rows of h / partial)
};
constexpr int kBulkItemWords = static_cast<int>(sizeof(BulkItem) / 4);

template <int kNT, int kStages, int kChunkBlocks, int kActRowsPerStage = kNT * 8, int kRowPad = 64,
          int kRedBufs = kDefaultRedBuffers>
struct BulkLayout {
  static constexpr int kActRows = kActRowsPerStage;
  static constexpr int kRedBuffers = kRedBufs;
  // bytes per row in a stage (kRowPad 0: a tile's rows land as one contiguous copy)
  static constexpr int kPitch = kChunkBlocks * kBlockK * 2 + kRowPad;
  static constexpr int kStageBytes = (kBulkWeightRows + kActRows) * kPitch;
  static constexpr int kRedFloats = kBulkConsumerWarps * kNT * 4 * 32;  // one buffer
  static constexpr int kRedOffset = kStages * kStageBytes;
  static constexpr int kMetaOffset = kRedOffset + kRedBuffers * kRedFloats * 4;
  static constexpr int kBarOffset = kMetaOffset + (kStages + kRedBuffers) * sizeof(BulkItem);
  // then the claim ring's barriers (2 x kClaimSlots) and claimed items (kClaimSlots ints)
  static constexpr int kClaimOffset = kBarOffset + 2 * (kStages + kRedBuffers) * 8;
  // then the down tail's mbarrier (kTail: the epilogue warp has seen every CTA's partials),
  // 8-byte aligned after the claimed items
  static constexpr int kClaimEnd = kClaimOffset + 2 * kClaimSlots * 8 + kClaimSlots * 4;
  static constexpr int kTailBarOffset = (kClaimEnd + 7) / 8 * 8;
  static constexpr int kBytes = kTailBarOffset + 8;
  static_assert(kPitch % 16 == 0 && kStageBytes % 16 == 0, "bulk copies need 16-byte alignment");
  static_assert(kBarOffset % 8 == 0, "mbarriers need 8-byte alignment");
  // why: sm_90's largest dynamic shared memory per block (227 KB), one CTA per SM
  static_assert(kBytes <= 227 * 1024, "the ring does not fit in shared memory");
};

// Ring depth, chunk and activation rows per stage, per n-tiles and ring (kRing, kNT 1 only: 0
// the standard ring; 1 the deep ring, twice the stages of half the chunk; 2 and 3 the down and
// gate/up kernels' one-token rings; 4 the ring of weights only): ~200 KB of shared memory, 1 CTA
// per SM.
template <int kNT, int kRing = 0>
struct BulkShape;
template <>
struct BulkShape<1, 0> {
  // 2 x 98 KB (16 x 4 KB weights). why 4 KB rows, not 4 stages of 2 KB: the same weight bytes
  // in flight with half the bulk copies per byte (the copy issue limited the stream: header)
  static constexpr int kStages = 2, kChunkBlocks = 32, kActRows = 8, kRowPad = 64;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
};
template <>
struct BulkShape<1, 1> {
  // 4 x 50 KB (16 x 2 KB weights): for down rows of <= 2 KB, which fill at most half a stage of
  // BulkShape<1, 0>, twice the stages and so twice the weight bytes in flight
  // (ExpertsParams::ring: where it is used and why)
  static constexpr int kStages = 4, kChunkBlocks = 16, kActRows = 8, kRowPad = 64;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
};
template <>
struct BulkShape<1, 2> {
  // 8 x 25.5 KB (16 x 1.5 KB weights, ONE activation row, rows unpadded): for down rows of
  // <= 1.5 KB at one token, where the deep ring's stages carry 24 KB of weights in ~50 KB (8
  // activation rows of 2 KB reserved for one): 192 KB of weights in flight per SM instead of 96.
  // Unpadded, a tile's 16 rows of exactly 1.5 KB are one contiguous 24 KB copy instead of 16
  // (the copies' issue, not the bytes in flight, bounds these short rows; the consumers' loads
  // then meet bank conflicts, which one token's few mma hide). 12 blocks are not a multiple of
  // the 8 consumer warps: warps 4-7 take one block, 0-3 two (the guard below).
  static constexpr int kStages = 8, kChunkBlocks = 12, kActRows = 1, kRowPad = 0;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
};
template <>
struct BulkShape<1, 3> {
  // 3 x 68 KB (16 x 4 KB weights, ONE activation row, rows unpadded), at one token
  // (ExpertsParams::ring 3): the gate/up kernel's, 192 KB of weights in flight per SM instead of
  // 128 (where a row is one chunk, <= 4 KB, an item's 8 gate rows and 8 up rows are two
  // contiguous blocks, one copy each instead of 16; wider rows go one copy per row chunk); and
  // the down kernel's for rows of exactly 4 KB (DeepSeek-V3, Kimi-K2), a tile's 16 rows one 64 KB
  // copy instead of 32 of 2 KB, with 192 KB of weights in flight per SM instead of 128
  static constexpr int kStages = 3, kChunkBlocks = 32, kActRows = 1, kRowPad = 0;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
};
template <>
struct BulkShape<1, 4> {
  // 3 x 65 KB of weights only (16 x 4 KB, rows padded as the standard ring's), at 2-32 tokens
  // (ExpertsParams::ring 4, experts_l2_acts_ring): the consumer warps load their activation
  // fragments from global memory (L2) themselves, so the third stage fits: 192 KB of weights in
  // flight per SM instead of the standard ring's 128
  static constexpr int kStages = 3, kChunkBlocks = 32, kActRows = 0, kRowPad = 64;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
};
template <>
struct BulkShape<2, 0> {
  static constexpr int kStages = 5, kChunkBlocks = 8, kActRows = 16, kRowPad = 64;  // 5 x 34 KB
  static constexpr int kRedBuffers = kDefaultRedBuffers;
};
template <>
struct BulkShape<2, 4> {
  // ring 4 with tasks of up to 16 tokens (ExpertsParams::ring 4 at chunk 16,
  // experts_task16_ring): the same 3 x 65 KB stages of weights only, each consumer warp running
  // both n-tiles on every weight fragment, so an expert with 9-16 tokens streams its weights
  // once instead of twice. Its reduction buffers are twice as large (8 KB): 3 of them fit
  // beside the stages, not 4.
  static constexpr int kStages = 3, kChunkBlocks = 32, kActRows = 0, kRowPad = 64;
  static constexpr int kRedBuffers = 3;
};

template <int kNT, int kRing = 0>
struct BulkShapeLayout {
  using S = BulkShape<kNT, kRing>;
  using type =
      BulkLayout<kNT, S::kStages, S::kChunkBlocks, S::kActRows, S::kRowPad, S::kRedBuffers>;
};

template <int kNT, int kRing = 0>
constexpr int bulk_smem_bytes() {
  return BulkShapeLayout<kNT, kRing>::type::kBytes;
}

// The producer's view of one work item: its task in every lane, lane l < count holds pair l.
struct ProducerItem {
  ExpertTask task;
  int task_id;
  int item;  // in its GEMM's item list
  int tile;
  int pair;
  bool down;  // fused kernel: a down item
  int half = 0;  // kHalves: 0 the whole item, 1 / 2 its first / second half (h rows 0-3 / 4-7)
};

// Weight row i (0..15) of an item's m16 tile: gate rows r0.. then up rows I+r0.. (gate/up), or
// 16 consecutive W2 rows (down).
template <bool kGateUp>
__device__ __forceinline__ const __nv_bfloat16* tile_row(const ExpertsParams& p, int expert,
                                                         int r0, int i) {
  const __nv_bfloat16* wexp = p.w + static_cast<long long>(expert) * p.w_expert_stride;
  int row = r0 + i;
  if constexpr (kGateUp) row = i < 8 ? r0 + i : p.inter + r0 + (i - 8);
  return wexp + static_cast<size_t>(row) * p.k;
}

// What a launch of the bulk kernel does: one of the two GEMMs, or both in one persistent grid.
enum BulkMode : int {
  kBulkGateUp,  // gate/up + activation
  kBulkDown,    // down (+ combine)
  kBulkFused,   // gate/up, then down, in one grid (experts_bulk_fused_kernel below)
};

// How the fused kernel deals its gate/up items to CTAs.
enum FusedGateUpOrder : int {
  kGateUpRoundRobin,  // item i (task-major: task = i / tiles) to CTA i % grid: tasks finish
                      // one after another, so down items find their h early
  kGateUpRanges,      // contiguous tile-major ranges, as the gate/up kernel: every task
                      // finishes with the last CTA (the A/B of the order)
};

__device__ __forceinline__ int load_relaxed_gpu(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void fence_acq_rel_gpu() {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

__device__ __forceinline__ void red_release_gpu_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Orders this thread's generic-proxy accesses of global memory with its async-proxy ones (the
// bulk copies): h written by st.global in one CTA is read by cp.async.bulk in another.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// The down kernel's dynamic tail (kTail): its tiles' items went to whichever CTA claimed them,
// so a tail tile is combined only once every CTA has written its partials (counting each
// claimed item in its tile counter, a fence and an atomic per item, made the epilogue the
// bottleneck, session 6). The epilogue warp counts its CTA in ctas_done (zeroed by the
// dispatch) and waits for the grid; safe to spin: the grid is at most the resident CTAs
// (experts_grid), and all of them were resident before the next kernel could launch (each
// passed its griddepcontrol.launch_dependents).
__device__ __forceinline__ void wait_for_every_cta(int* ctas_done, int lane) {
  __threadfence();  // every lane: its partial stores before the count
  __syncwarp();
  if (lane == 0) {
    atomicAdd(ctas_done, 1);
    const unsigned long long t0 = global_timer_ns();
    while (load_relaxed_gpu(ctas_done) < static_cast<int>(gridDim.x)) {
      // why a deadline: a grid larger than the resident CTAs would spin forever; fail loudly
      if (global_timer_ns() - t0 > 4000000000ull) {
        printf("moekit: down kernel: CTA %d waited 4 s for the other CTAs' partials (grid %d "
               "larger than the resident CTAs?)\n",
               static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
        __trap();
      }
      __nanosleep(128);
    }
  }
  __syncwarp();
  fence_acq_rel_gpu();  // every lane, after lane 0 saw the count: the other CTAs' partials
}

// The tail tiles' [first, tiles) outputs combined by `nthreads` threads of the grid, thread
// `thread` taking units thread, thread + nthreads, ... of them all (combine_quads: 4 rows of one
// token per unit, token-major within a tile), two units and five slots per batch of loads. why
// spread so: one warp per tail tile (the first version) took 7 us at 32 tokens and 26 us at 128
// after the grid's wait, the rest idle (its CTA trace, session 12). Each row's sum is
// combine_tile's.
__device__ __forceinline__ void combine_tail_outputs(const ExpertsParams& p, int first,
                                                     int tiles, int thread, int nthreads) {
  const int per_tile = p.tokens * 4;
  combine_quads<2, 5>(p, (tiles - first) * per_tile, thread, nthreads,
                      [&](int i, int& tok, int& r) {
                        const int t = i / per_tile;
                        const int within = i - t * per_tile;
                        tok = within >> 2;
                        r = (first + t) * 16 + 4 * (within & 3);
                      });
}

// The warps that combine the down tail: the consumers and the epilogue warp. The consumers start
// once the epilogue warp has seen every CTA's partials, waiting on an mbarrier its lanes arrive
// on (BulkLayout::kTailBarOffset). why not a named barrier (bar.sync 1, 288, session 12): the two
// reach it at different instructions, and bar.sync is barrier.sync.aligned, which requires every
// thread to execute the same one (PTX ISA; compute-sanitizer's synccheck reported "divergent
// threads in block"); barrier.sync (not aligned) was correct but the kernel 0.35% slower at 16
// tokens (session 13), the compiler having merged the two paths.
constexpr int kTailCombineThreads = (kBulkConsumerWarps + 1) * 32;

// kSelfRoute: the routing of the launch's one token by this warp (route_token, the routing
// kernel's code: the same ids; E <= 128, so 4 experts per lane), after the wait for the router
// GEMM. write: also the ids and weights, and through align_small the dispatch and counters the
// down kernel reads (CTA 0's epilogue warp), else only lane j's pick j in `pick`.
__device__ __forceinline__ void self_route_token(const RoutingParams& p, int lane, bool write,
                                                 int* local_ids, int* pick) {
  constexpr int kPer = 4;
  float bias[kPer];
  routing_detail::load_correction_bias<kPer>(p, lane, bias);
  routing_detail::route_token<kPer>(p, 0, lane, write, bias, local_ids, pick);
}

// The bulk kernel's body. kMode kBulkGateUp / kBulkDown: the launch's params are gu / dn (the
// other is not read). kBulkFused: every CTA runs its gate/up items (dealt by `order`), then its
// down items (a contiguous tile-major range); a down item's activation copies wait until all
// gate/up items of its task have counted themselves in task_done[task] (release / acquire), its
// weight copies do not. Safe to spin: the grid is at most the resident CTAs (experts_fused_grid),
// and the next kernel launches only once every CTA has passed its trigger (all were resident).
// kNT: n-tiles of 8 tokens per task. kSplitRows: 4 KB row chunks copied in two halves
// (a template parameter, not a runtime test: any code for it slowed the one-copy kernels).
// kRing: the ring BulkShape<kNT, kRing> (1 deep, 2 / 3 one-token). kKeep: the weight rows of a task
// whose expert has a next task (ExpertTask::more) are copied with normal L2 priority instead of
// evict-first, so that the next task's item reads them from L2 (a template parameter for the same
// reason as kSplitRows: its code as a runtime choice cost Qwen3-30B-A3B 1-2% with the choice off,
// session 11). kTail (down, with a combine): the last dn.down_tail_percent % of the output tiles
// are a dynamic tail (ExpertsParams::down_tail_percent; wait_for_every_cta, combine_tail_outputs).
// kHalves (gate/up): the launch's last claimed items go as two half items each
// (ExpertsParams::half_items_per_cta): 4 of the tile's 8 h rows, i.e. 8 of its 16 weight rows,
// copied to their usual stage rows (the others hold stale bytes: their mma rows are computed
// and not stored), so the CTAs' last claims are half as long.
// kSelfRoute (gate/up at one token, ExpertsParams::self_route): no routing kernel ran; every
// CTA's producers route the token from the logits (self_route_token) and look their items up in
// the lists that implies, and CTA 0's epilogue warp writes the routing and the dispatch for the
// down kernel. Its dynamic tail claims from a counter of its own, which its last CTA to finish
// claiming zeroes (the dispatch, which zeroes the others, is written while it runs).
template <int kMode, int kNT, bool kSplitRows = false, int kRing = 0, bool kKeep = false,
          bool kTail = false, bool kHalves = false, bool kSelfRoute = false>
__device__ __forceinline__ void experts_bulk_body(const ExpertsParams& gu, const ExpertsParams& dn,
                                                  int* task_done, int order) {
  static_assert(kNT >= 1 && kNT <= 2, "kNT: 1 or 2 n-tiles of 8 tokens");
  static_assert(!kTail || kMode == kBulkDown, "kTail: the down kernel's");
  static_assert(!kHalves || (kMode == kBulkGateUp && !kKeep), "kHalves: the gate/up kernel's");
  static_assert(!kSelfRoute || (kMode == kBulkGateUp && kNT == 1 && !kKeep && !kHalves),
                "kSelfRoute: the plain chunk-8 gate/up kernel's");
  constexpr bool kHasGateUp = kMode != kBulkDown;
  constexpr bool kHasDown = kMode != kBulkGateUp;
  constexpr bool kFused = kMode == kBulkFused;
  // whether an item (its record's `down` flag) is a down item: fixed by the mode unless fused
  auto is_down = [](int down_flag) { return kHasDown && (!kHasGateUp || down_flag != 0); };
  constexpr int kStages = BulkShape<kNT, kRing>::kStages;
  constexpr int kChunkBlocks = BulkShape<kNT, kRing>::kChunkBlocks;
  static_assert(kRing != 2 || (kMode == kBulkDown && kNT == 1 && !kSplitRows),
                "the one-token ring: the chunk-8 down kernel's");
  static_assert(kRing != 3 || (kMode != kBulkFused && kNT == 1 && !kKeep && !kSplitRows && !kTail),
                "ring 3: the chunk-8 gate/up and down kernels' at one token");
  using L = typename BulkShapeLayout<kNT, kRing>::type;
  constexpr int kRedBuffers = L::kRedBuffers;  // items the epilogue warp may lag behind
  static_assert(
      kRing != 4 ||
          (kMode != kBulkFused && !kSplitRows && !kHalves && !kSelfRoute && (kNT == 1 || !kTail)),
      "ring 4: the gate/up and down kernels' (chunk 8 with the L2 keep and the tail; chunk 16 "
      "with the L2 keep)");
  // stages of weights only (ring 4): the consumers load the activations themselves
  constexpr bool kActsFromL2 = L::kActRows == 0;
  // The down epilogue's combine: one pass at a time between its items (bulk_combine_pass), or
  // at once (bulk_combine_tile) in the instances that run at <= 8 tokens only, whose code stays
  // as it was measured: with the passes they were 0.4-1.4% slower at one token (Qwen3-30B-A3B,
  // DeepSeek-V3, bench/results/h200/2026-12-01-s17-experiments, runs 2-3), though the code they
  // run there is the same (their layout, not their work, changed)
  constexpr bool kCombineInPasses = kHasDown && (kRing == 0 || kRing == 4) && !kSplitRows;
  constexpr int kGateUpTileRows = 8;  // output rows per gate/up item (of h)
  constexpr int kDownTileRows = 16;   // output rows per down item
  // (rounded up: a warp's blocks past the chunk are skipped, kRing 2)
  constexpr int kBlocksPerWarp = (kChunkBlocks + kBulkConsumerWarps - 1) / kBulkConsumerWarps;
  extern __shared__ __align__(128) unsigned char smem[];
  float* red = reinterpret_cast<float*>(smem + L::kRedOffset);
  BulkItem* stage_meta = reinterpret_cast<BulkItem*>(smem + L::kMetaOffset);
  BulkItem* item_meta = stage_meta + kStages;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarOffset);
  uint64_t* empty = full + kStages;
  uint64_t* red_full = empty + kStages;
  uint64_t* red_empty = red_full + kRedBuffers;
  uint64_t* claim_full = reinterpret_cast<uint64_t*>(smem + L::kClaimOffset);
  uint64_t* claim_empty = claim_full + kClaimSlots;
  int* claim_ring = reinterpret_cast<int*>(claim_empty + kClaimSlots);
  uint64_t* tail_ready = reinterpret_cast<uint64_t*>(smem + L::kTailBarOffset);
  // the dispatch (tasks, pair list, task count) and the trace are the same in both params
  const ExpertsParams& dp = kHasGateUp ? gu : dn;
  unsigned long long* const trace = dp.trace;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    trace_mark(trace, kHasGateUp ? kTraceGateUpStart : kTraceDownStart);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 32);  // every producer lane (the item record is written by several)
      mbar_init(&empty[s], kBulkConsumerWarps * 32);  // every consumer lane (each read it)
    }
    for (int b = 0; b < kRedBuffers; ++b) {
      mbar_init(&red_full[b], kBulkConsumerWarps * 32);  // every lane that wrote the buffer
      mbar_init(&red_empty[b], 32);
    }
    for (int c = 0; c < kClaimSlots; ++c) {
      mbar_init(&claim_full[c], 32);   // producer 0's lanes
      mbar_init(&claim_empty[c], 32);  // producer 1's lanes (each read the slot)
    }
    if (kTail) mbar_init(tail_ready, 32);  // the epilogue warp's lanes
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // The gate/up kernel's producers alone wait for the dispatch (below), after issuing the fused
  // shared experts' items when gu.early_shared, which need nothing from it; the consumers and the
  // epilogue read no dispatch data. The fused kernel waits here.
  if constexpr (kFused) {
    pdl_wait();  // the dispatch is the kernel just before
    pdl_launch_dependents();  // the next layer's router GEMM may load its weights (header)
    if (threadIdx.x == 0) trace_mark(trace, kTraceGateUpWaited);
  }
  const bool producer_warp = warp >= kBulkProducerWarp && warp < kBulkEpilogueWarp;
  // each ring slot has ONE producer (slot % 2 == id), so a slot's fills stay in order and the
  // parity of its "empty" barrier cannot alias (alternating owners could run two phases ahead)
  const int producer_id = warp - kBulkProducerWarp;
  auto owns = [&](int fill) {
    return (fill % kStages) % kBulkProducerWarps == producer_id;
  };
  const int gu_nkb = kHasGateUp ? gu.k / kBlockK : 0;
  const int dn_nkb = kHasDown ? dn.k / kBlockK : 0;
  const int gu_nchunks = (gu_nkb + kChunkBlocks - 1) / kChunkBlocks;
  const int dn_nchunks = (dn_nkb + kChunkBlocks - 1) / kChunkBlocks;
  auto range = [&](int total, int b) {
    return static_cast<int>(static_cast<long long>(total) * b / gridDim.x);
  };
  // The copies of stage s (record m): lane i < 16 copies weight row i, lane 16 + j the
  // activation row of token j (kNT * 8 <= 16 tokens), so the address arithmetic runs on all
  // lanes at once and only the copy instructions themselves take turns (the compiler issues a
  // bulk copy once per active lane). Weights and/or activations (down: activations only after
  // pdl_wait, fused: after the task's gate/up items).
  const uint64_t weight_policy = l2_evict_first_policy();
  const uint64_t keep_policy = kKeep ? l2_evict_normal_policy() : weight_policy;
  auto issue_copies = [&](int s, const BulkItem& m, bool weights, bool acts) {
    // the record's words, each read by the lane that wrote it (arm_stage: lane 0 the fields,
    // lane j < 16 pair j) and shuffled: racecheck does not take the __syncwarp between one
    // lane's write and another's read as ordering (it reported these reads, session 7)
    int rec[5] = {0, 0, 0, 0, 0};
    if (lane == 0) {
      rec[0] = m.expert;
      rec[1] = m.tile;
      rec[2] = m.count;
      rec[3] = m.chunk;
      rec[4] = kKeep ? m.down | (m.more << 1) : m.down;  // kKeep: `more` rides in bit 1
    }
#pragma unroll
    for (int i = 0; i < 5; ++i) rec[i] = __shfl_sync(0xffffffffu, rec[i], 0);
    // kKeep: the next item reads these weight rows again (the expert's next task): keep them
    const uint64_t policy = kKeep && (rec[4] & 2) != 0 ? keep_policy : weight_policy;
    if (kKeep) rec[4] &= 1;
    const int expert = rec[0], tile = rec[1], count = rec[2], chunk = rec[3];
    int own_pair = 0;
    if (lane < 16) own_pair = m.pairs[lane];
    const int pair = __shfl_sync(0xffffffffu, own_pair, lane & 15);  // lane 16 + j: pair j
    const bool down = is_down(rec[4]);
    const int nkb = down ? dn_nkb : gu_nkb;
    const int k = down ? dn.k : gu.k;
    const int blocks = min(kChunkBlocks, nkb - chunk * kChunkBlocks);
    const uint32_t row_bytes = static_cast<uint32_t>(blocks) * kBlockK * 2;
    const int k0 = chunk * kChunkBlocks * kBlockK;
    const __nv_bfloat16* src = nullptr;
    // kHalves: a half item's weight rows (gate and up rows 4(half-1)..+3: lanes & 7 of them)
    const int half = kHalves ? (rec[4] >> 2) & 3 : 0;
    // the one-token rings with rows of one chunk that fill their unpadded pitch: a tile's
    // contiguous rows in one copy (down: W2 rows r0..r0+15 of one expert; gate/up: gate rows
    // r0..r0+7, up rows I+r0..I+r0+7); rows of several chunks go one copy per row
    constexpr int kRowsPerCopy = kRing != 2 && kRing != 3 ? 1 : kMode == kBulkGateUp ? 8 : 16;
    const bool one_copy =
        kRowsPerCopy > 1 && row_bytes == static_cast<uint32_t>(L::kPitch) && nkb <= kChunkBlocks;
    if (lane < kBulkWeightRows) {
      if (weights && (!kHalves || half == 0 || ((lane & 7) >> 2) == half - 1) &&
          (!one_copy || (kRowsPerCopy == kBulkWeightRows ? lane == 0 : lane % kRowsPerCopy == 0))) {
        src = (down ? tile_row<false>(dn, expert, tile * kDownTileRows, lane)
                    : tile_row<true>(gu, expert, tile * kGateUpTileRows, lane)) +
              k0;
      }
    } else if (acts && lane - kBulkWeightRows < count &&
               (L::kActRows >= kNT * 8 || lane - kBulkWeightRows < L::kActRows)) {
      // (the one-token ring has room for one row: its launch checks that tasks hold one token)
      const __nv_bfloat16* x = down ? dn.x : gu.x;
      const int div = down ? dn.x_row_div : gu.x_row_div;
      src = x + static_cast<size_t>(pair / div) * k + k0;
    }
    void* dst = smem + s * L::kStageBytes + lane * L::kPitch;
    if (src != nullptr) {
      if (lane < kBulkWeightRows) {
        if (kSplitRows && row_bytes >= 4096) {
          // two 2 KB copies of a 4 KB row chunk (experts.h, ExpertsParams::weight_copy_pieces;
          // why not shorter chunks: 1.5 KB copies of 3 KB rows were slower, session 10)
          const uint32_t half = row_bytes / 2;
          bulk_copy_hinted(dst, src, half, &full[s], policy);
          bulk_copy_hinted(static_cast<char*>(dst) + half, src + half / 2, half, &full[s],
                           policy);
        } else {
          bulk_copy_hinted(dst, src, one_copy ? kRowsPerCopy * row_bytes : row_bytes, &full[s],
                           policy);
        }
      } else {
        bulk_copy(dst, src, row_bytes, &full[s]);
      }
    }
  };
  // Writes stage s's record for chunk c of item `it` and arms its "full" barrier with the bytes
  // to come (every producer lane arrives: several wrote the record), before any copy.
  auto arm_stage = [&](int s, const ProducerItem& it, int c, bool down, int nkb) -> BulkItem& {
    BulkItem& m = stage_meta[s];
    if (lane < 16) m.pairs[lane] = it.pair;
    if (lane == 0) {
      m.item = it.item;
      m.expert = it.task.expert;
      m.tile = it.tile;
      m.count = it.task.count;
      m.chunk = c;
      m.down = kHalves ? down | (it.half << 2) : down;  // kHalves: the half in bits 2-3
      m.task = it.task_id;
      if (kKeep) m.more = it.task.more;
      const int blocks = min(kChunkBlocks, nkb - c * kChunkBlocks);
      const uint32_t row_bytes = static_cast<uint32_t>(blocks) * kBlockK * 2;
      const int weight_rows = kHalves && it.half != 0 ? kBulkWeightRows / 2 : kBulkWeightRows;
      mbar_arrive_expect_tx(&full[s],
                            row_bytes * (weight_rows + (kActsFromL2 ? 0 : it.task.count)));
    } else {
      mbar_arrive(&full[s]);
    }
    __syncwarp();  // the record is complete and the byte count armed before any copy
    return m;
  };
  // Gate/up with fused shared experts (gu.early_shared = S): every CTA's producers first issue
  // its share of the shared experts' items (tile-major over S x ceil(T / chunk) token chunks),
  // whose weights and x are ready and whose pairs follow from the token (t * slots + top_k + s),
  // while the routing still runs; then wait for the dispatch and take the routed items (the
  // dispatch's tasks without its last pre_tasks: the shared experts have the largest ids).
  const int gu_tiles = kHasGateUp ? gu.rows / kGateUpTileRows : 1;
  const int chunk_tokens = kNT * 8;
  const int pre_chunks = kMode == kBulkGateUp ? (gu.tokens + chunk_tokens - 1) / chunk_tokens : 0;
  const int pre_tasks = kMode == kBulkGateUp ? gu.early_shared * pre_chunks : 0;
  int pre_fills = 0;  // stage fills of the shared items
  if constexpr (kMode == kBulkGateUp) {
    if (producer_warp) {
      const int pre_total = pre_tasks * gu_tiles;
      const int top_k = gu.slots - gu.early_shared;
#pragma unroll 1
      for (int item = range(pre_total, blockIdx.x); item < range(pre_total, blockIdx.x + 1);
           ++item) {
        ProducerItem it;
        it.tile = item / pre_tasks;
        const int pt = item - it.tile * pre_tasks;
        const int shared = pt / pre_chunks, first = (pt - shared * pre_chunks) * chunk_tokens;
        it.task = ExpertTask{gu.first_shared_expert + shared, 0,
                             min(chunk_tokens, gu.tokens - first),
                             kKeep && first + chunk_tokens < gu.tokens ? 1 : 0};
        it.task_id = 0;
        it.item = item;
        it.down = false;
        it.pair = lane < it.task.count ? (first + lane) * gu.slots + top_k + shared : 0;
        for (int c = 0; c < gu_nchunks; ++c, ++pre_fills) {
          if (!owns(pre_fills)) continue;
          const int s = pre_fills % kStages;
          mbar_wait(&empty[s], ((pre_fills / kStages) & 1) ^ 1);
          issue_copies(s, arm_stage(s, it, c, false, gu_nkb), true, true);
        }
      }
      pdl_wait();  // the dispatch is the kernel just before (kSelfRoute: the router GEMM)
      // the down kernel may take SMs as our CTAs finish (kSelfRoute: the epilogue warp lets it
      // launch, once CTA 0 has written the dispatch it reads)
      if constexpr (!kSelfRoute) pdl_launch_dependents();
      if (producer_id == 0 && lane == 0) trace_mark(trace, kTraceGateUpWaited);
    }
  }
  // The producer's copy of a small dispatch, loaded in the same round trip as the task count:
  // lane l holds task l and pair l, and with <= 32 of them (decode: DeepSeek-V3 up to 3 tokens)
  // the producer looks its items up by shuffles instead of two more dependent round trips (task,
  // then pair ids) before its first copy.
  // kSelfRoute: the same values from the producer's own routing of the token (no dispatch yet).
  ExpertTask lane_task{0, 0, 0, 0};
  int lane_pair = 0;
  int self_tasks = 0;
  if (producer_warp) {
    if constexpr (kSelfRoute) {
      int pick = 0;
      self_route_token(gu.route, lane, false, nullptr, &pick);
      self_tasks = align_detail::one_token_dispatch_lanes(pick, gu.route.cfg.top_k, lane,
                                                          lane_task, lane_pair);
      // (the trace's routing rows: picked, the producers' lists; end, CTA 0's dispatch)
      if (producer_id == 0 && lane == 0) trace_mark(trace, kTraceRoutingPicked);
    } else {
      if (lane < dp.task_capacity) lane_task = dp.tasks[lane];
      if (lane < dp.pair_capacity) lane_pair = dp.pair_list[lane];
    }
  }
  // (the gate/up kernel's consumers and epilogue read no dispatch data and did not wait)
  const int num_tasks =
      kSelfRoute ? self_tasks : (kMode == kBulkGateUp && !producer_warp ? 0 : *dp.num_tasks);
  // gate/up items: (task, tile of 8 rows of h) of the routed tasks (without the shared ones
  // issued above); down items: (task, tile of 16 output rows)
  const int gu_tasks = kHasGateUp ? max(num_tasks - pre_tasks, 0) : 0;  // tasks 0..gu_tasks-1
  const int gu_total = gu_tasks * gu_tiles;
  const int gu_div = max(gu_tasks, 1);  // (a divisor: without tasks there are no items)
  const int dn_total = kHasDown ? num_tasks * (dn.rows / kDownTileRows) : 0;
  // kTail: the last dn_tail_tiles tiles' items are claimed, the rest split into static ranges
  const int dn_tiles = kTail ? dn.rows / kDownTileRows : 0;
  const int dn_tail_tiles = kTail ? dn_tiles * dn.down_tail_percent / 100 : 0;
  const int dn_static = kTail ? dn_total - num_tasks * dn_tail_tiles : dn_total;
  // this CTA's items, gate/up then down: contiguous tile-major ranges (most of a down tile's
  // items are one CTA's, and it combines the tile without a counter round trip; sizes differ
  // by at most one), except the fused kernel's gate/up items dealt round-robin task-major.
  // The gate/up kernel splits only its first items so (its static items); the rest, its dynamic
  // tail, go one by one from the work counter to the CTAs that finish their ranges first. why:
  // CTAs stream at rates up to ~15% apart (the trace: DeepSeek-V3 T=1 gate/up CTAs ending 17 us
  // apart, 6 us with the tail). The down kernel only in its kTail instance, whose claimed items
  // are whole tiles' (combined after every CTA's partials: wait_for_every_cta): a claimed item
  // combined through its tile counter (a fence and an atomic each) made the epilogue the
  // bottleneck.
  const int gu_static =
      kMode != kBulkGateUp
          ? gu_total
          : gu_total - static_cast<int>(static_cast<long long>(gu_total) *
                                        dp.dynamic_tail_percent / 100);
  // kHalves: the tail's last gu_halved items are claimed as two halves each (claims
  // gu_claim_whole.. of the tail), after its gu_claim_whole whole items
  const int gu_halved =
      kHalves ? min(gu.half_items_per_cta * static_cast<int>(gridDim.x), gu_total - gu_static) : 0;
  const int gu_claim_whole = gu_total - gu_static - gu_halved;
  const bool gu_round_robin = kFused && order == kGateUpRoundRobin;
  const int gu_begin = range(gu_static, blockIdx.x);
  const int gu_count = gu_round_robin
                           ? (gu_total > static_cast<int>(blockIdx.x)
                                  ? (gu_total - 1 - static_cast<int>(blockIdx.x)) / gridDim.x + 1
                                  : 0)
                           : range(gu_static, blockIdx.x + 1) - gu_begin;
  const int dn_begin = range(dn_static, blockIdx.x);
  const int dn_end = range(dn_static, blockIdx.x + 1);
  const int seq_count = gu_count + (dn_end - dn_begin);  // the items of the static ranges

  if (producer_warp) {
    // ---- producers: each warp walks all the items (lanes fetch pair ids) and fills the stages
    // it owns; the copies are issued lane by lane ----
    // (warp-uniform calls: the lookups are shuffles)
    const bool small_tasks = num_tasks <= 32 && num_tasks <= dp.task_capacity;
    const bool small_pairs = dp.pair_capacity > 0 && dp.pair_capacity <= 32;
    // The gate/up tail: item gu_static + c for the c-th claim of the work counter, -1 once the
    // claims pass the launch's items (then no more claims). Both producers must walk the same
    // items, so producer 0 claims and hands each claim to producer 1 through a ring of
    // kClaimSlots slots (claim_full / claim_empty).
    // (kTail: the down kernel's claims, of its tail tiles' items)
    bool claims_left = kTail ? dn_static < dn_total : gu_static < gu_total;
    int claims = 0;  // claims so far (the same count in both producers)
    auto claim = [&]() {
      if (!claims_left) return -1;
      const int slot = claims % kClaimSlots;
      const uint32_t parity = (claims / kClaimSlots) & 1;
      ++claims;
      int c = 0;
      if (producer_id == 0) {
        mbar_wait(&claim_empty[slot], parity ^ 1);
        if (lane == 0) {
          c = atomicAdd(dp.work_counter, 1);
          claim_ring[slot] = c;
        }
        c = __shfl_sync(0xffffffffu, c, 0);
        mbar_arrive(&claim_full[slot]);
      } else {
        mbar_wait(&claim_full[slot], parity);
        c = claim_ring[slot];
        mbar_arrive(&claim_empty[slot]);  // every lane: each read the slot
      }
      if constexpr (kHalves) {
        if (c < gu_claim_whole + 2 * gu_halved) return c;  // (fetch maps it to item and half)
      } else {
        const int item = (kTail ? dn_static : gu_static) + c;
        if (item < (kTail ? dn_total : gu_total)) return item;
      }
      claims_left = false;
      return -1;
    };
    // the j-th item of this CTA's sequence (its static items, then claims), or item -1: none
    auto fetch = [&](int j) {
      ProducerItem it;
      int task;
      if (j >= seq_count) {
        it.down = kTail;  // (the gate/up kernel claims, and kTail's down kernel)
        it.item = claim();
        if constexpr (kTail) {
          it.tile = it.item < 0 ? 0 : it.item / num_tasks;  // (no tasks: no claims either)
          task = it.item < 0 ? 0 : it.item - it.tile * num_tasks;
        } else if constexpr (kHalves) {
          const int c = it.item;  // the claim: a whole tail item, or a half of a last one
          if (c >= gu_claim_whole) {
            it.item = gu_total - gu_halved + (c - gu_claim_whole) / 2;
            it.half = 1 + ((c - gu_claim_whole) & 1);
          } else if (c >= 0) {
            it.item = gu_static + c;
          }
          it.tile = it.item < 0 ? 0 : it.item / gu_div;
          task = it.item < 0 ? 0 : it.item - it.tile * gu_div;
        } else {
          it.tile = it.item < 0 ? 0 : it.item / gu_div;
          task = it.item < 0 ? 0 : it.item - it.tile * gu_div;
        }
      } else if (kHasGateUp && j < gu_count) {
        it.down = false;
        if (gu_round_robin) {
          it.item = blockIdx.x + j * gridDim.x;
          task = it.item / gu_tiles;
          it.tile = it.item - task * gu_tiles;
        } else {
          it.item = gu_begin + j;
          it.tile = it.item / gu_div;
          task = it.item - it.tile * gu_div;
        }
      } else {
        it.down = true;
        it.item = dn_begin + (j - gu_count);
        it.tile = it.item / num_tasks;
        task = it.item - it.tile * num_tasks;
      }
      it.task_id = task;
      if (it.item < 0) {
        it.task = ExpertTask{0, 0, 0, 0};
      } else if (small_tasks) {
        it.task.expert = __shfl_sync(0xffffffffu, lane_task.expert, task);
        it.task.begin = __shfl_sync(0xffffffffu, lane_task.begin, task);
        it.task.count = __shfl_sync(0xffffffffu, lane_task.count, task);
        it.task.more = kKeep ? __shfl_sync(0xffffffffu, lane_task.more, task) : 0;
      } else {
        it.task = dp.tasks[task];
      }
      it.pair = 0;
      return it;
    };
    auto fetch_pair = [&](ProducerItem& it) {
      if (it.item < 0) return;
      if (small_pairs) {
        const int pair = __shfl_sync(0xffffffffu, lane_pair, (it.task.begin + lane) & 31);
        if (lane < it.task.count) it.pair = pair;
      } else if (lane < it.task.count) {
        it.pair = dp.pair_list[it.task.begin + lane];
      }
    };
    // Fused: wait until every gate/up item of `task` has counted itself in (any CTA's). The
    // counters of tasks < 32 are polled by all lanes at once (lane l: tasks l, l + 32, ...) and
    // those found complete remembered (ready_low), as is "all complete", so most down items
    // need no round trip; a relaxed poll, then a fence: the acquire.
    uint32_t ready_low = 0;
    bool all_ready = false;
    bool down_waited = false;
    auto wait_task = [&](int task) {
      if (all_ready || (task < 32 && ((ready_low >> task) & 1u))) return;
      const unsigned long long t0 = global_timer_ns();
      for (;;) {
        bool lane_all = true, hit = false, low = false;
        for (int t = lane; t < num_tasks; t += 32) {
          const bool done = load_relaxed_gpu(task_done + t) >= gu_tiles;
          if (t < 32) low = done;
          if (t == task) hit = done;
          lane_all = lane_all && done;
        }
        ready_low |= __ballot_sync(0xffffffffu, low);
        all_ready = __all_sync(0xffffffffu, lane_all);
        if (__any_sync(0xffffffffu, hit)) break;
        // why a deadline: a grid larger than the resident CTAs would spin forever; fail loudly
        if (global_timer_ns() - t0 > 4000000000ull) {
          if (lane == 0) {
            printf("moekit: fused expert kernel: CTA %d waited 4 s for the gate/up items of "
                   "task %d (grid %d larger than the resident CTAs?)\n",
                   static_cast<int>(blockIdx.x), task, static_cast<int>(gridDim.x));
          }
          __trap();
        }
        __nanosleep(256);
      }
      fence_acq_rel_gpu();         // acquire: the h of the counted items is visible ...
      fence_proxy_async_global();  // ... to this thread's bulk copies too
      __syncwarp();
      if (!down_waited && lane == 0) trace_mark(trace, kTraceDownWaited);
      down_waited = true;
    };
    bool waited = kHasGateUp;
    bool down_started = false;
    // The down kernel's stages whose weight copies go out before its wait for h: the whole ring,
    // but one stage of the deep ring (Qwen3-30B-A3B's 1.5 KB rows at <= 8 tokens). why: its 4
    // stages' early copies (~12 MB over the grid) go out while the last gate/up CTAs stream, and
    // the wait for those ends later. Measured on the H200, same run (bench/results/h200/
    // 2026-11-30-s13-experiments, run 4): Qwen3-30B-A3B T=1 32.2 -> 31.75 us (-1.4%), T=2 -0.7%,
    // T=4 equal, T=8 +0.2%. With 4 KB rows (DeepSeek-V3: 2 stages) 1 stage was equal (run 1).
    // The one-token ring likewise (2026-12-01-s15-experiments, run 6: 2 / 4 / 7 of its 8 stages
    // early: equal, +0.3%, +9%). Ring 3 (4 KB rows) issues all 3, as the split instance its 2
    // (measured so: 2026-12-01-s16-experiments, run 1).
    constexpr int kEarlyStages = kRing == 1 || kRing == 2 ? 1 : kStages;
    int n = pre_fills;  // stage fills so far
    // Two items of look-ahead: item i+1's pair ids and item i+2's task are in flight while item
    // i's stages are issued (a down item can be a single ~24 KB stage, shorter than the two
    // dependent L2 round trips of task then pair ids). The first three tasks are fetched
    // together, then the first two items' pair ids together: two round trips before the first
    // copy, not five.
    // (a CTA claims its tail items three items ahead of issuing them)
    ProducerItem cur = fetch(0), nxt = fetch(1), nxt2 = fetch(2);
    fetch_pair(cur);
    fetch_pair(nxt);
    for (int j = 0; cur.item >= 0; ++j) {
      const bool down = is_down(cur.down);
      const int nchunks = down ? dn_nchunks : gu_nchunks;
      const int nkb = down ? dn_nkb : gu_nkb;
      if (kFused && down && !down_started) {
        down_started = true;
        if (lane == 0) trace_mark(trace, kTraceDownStart);
      }
      for (int c = 0; c < nchunks; ++c, ++n) {
        if (!owns(n)) continue;
        const int s = n % kStages;
        if (!waited && n >= kEarlyStages) {
          // the early stages hold weights: wait for h, then complete the stages issued so far
          pdl_wait();
          waited = true;
          pdl_launch_dependents();  // the next layer's router GEMM may load its weights (header)
          if (lane == 0) trace_mark(trace, kTraceDownWaited);
          for (int q = 0; q < kEarlyStages; ++q) {
            if (owns(q)) issue_copies(q, stage_meta[q], false, true);
          }
        }
        mbar_wait(&empty[s], ((n / kStages) & 1) ^ 1);
        BulkItem& m = arm_stage(s, cur, c, down, nkb);
        if (kFused && down && c == 0) {
          // the weights need nothing; h needs the task's gate/up items (every CTA's)
          issue_copies(s, m, true, false);
          if (!down_waited && lane == 0) trace_mark(trace, kTraceDownIssued);
          wait_task(cur.task_id);
          issue_copies(s, m, false, true);
        } else {
          issue_copies(s, m, true, waited);
        }
        if (kMode == kBulkDown && n == 0 && lane == 0) trace_mark(trace, kTraceDownIssued);
      }
      cur = nxt;
      nxt = nxt2;
      fetch_pair(nxt);  // its task was fetched an item ago
      nxt2 = fetch(j + 3);
    }
    if (!waited) {
      pdl_wait();
      pdl_launch_dependents();
      if (lane == 0) trace_mark(trace, kTraceDownWaited);
      for (int q = 0; q < n; ++q) {
        if (owns(q)) issue_copies(q, stage_meta[q], false, true);
      }
    }
    if constexpr (kSelfRoute) {
      // this CTA claims no more: the last CTA here zeroes the work counter for the next
      // self-routed forward, which no align step zeroes (DispatchCounters::self_route_work)
      if (producer_id == 0 && lane == 0) {
        __threadfence();  // this CTA's claims are ordered before its count
        if (atomicAdd(gu.self_route_ctas_done, 1) == static_cast<int>(gridDim.x) - 1) {
          __threadfence();
          *dp.work_counter = 0;
          *gu.self_route_ctas_done = 0;
        }
      }
    }
    // no more work: an item record of -1 in the next stage (by the warp that owns it)
    if (owns(n)) {
      const int s = n % kStages;
      mbar_wait(&empty[s], ((n / kStages) & 1) ^ 1);
      if (lane == 0) stage_meta[s].item = -1;
      mbar_arrive(&full[s]);
    }
    return;
  }

  const int g = lane >> 2, t = lane & 3;
  if (warp == kBulkEpilogueWarp) {
    // ---- epilogue: reduce in warp order, write the outputs, count and combine down tiles ----
    if constexpr (kMode == kBulkDown) pdl_wait();  // the combine reads outputs of earlier kernels
    if constexpr (kSelfRoute) {
      // no routing kernel ran: CTA 0 writes the token's ids, weights and dispatch (zeroing the
      // down kernel's counters) as the routing kernel would; then the down kernel may launch
      // (the producers do not trigger: one trigger per CTA counts, so CTA 0's must follow this)
      pdl_wait();  // the router GEMM's logits
      if (blockIdx.x == 0) {
        __shared__ int self_route_ids[32];
        self_route_token(gu.route, lane, true, self_route_ids, nullptr);
        __syncwarp();
        align_detail::align_small(gu.route, self_route_ids, lane, 32);
        __threadfence();  // the dispatch is visible before the down kernel may read it
        if (lane == 0) trace_mark(trace, kTraceRoutingEnd);
      }
      __syncwarp();
      pdl_launch_dependents();
    }
    bool gate_up_ended = !kHasGateUp;
    // The tile this warp combines (-1: none) and its next pass: a combine goes one pass at a
    // time while the consumers have not yet filled the next reduction buffer, so that they do
    // not wait behind it (a pass is 1-3 L2 round trips; a whole tile at 128 tokens took longer
    // than the kRedBuffers items the consumers may run ahead).
    // (one call site: the combine's code is large, and these kernels' time is sensitive to
    // their code size; the first version, with three, made the binary's SASS 43% larger)
    int combining = -1, combine_pass = 0, queued = -1;  // queued: a tile closed while combining
    bool ended = false;                                 // (then every pass runs at once)
    for (int seq = 0;; ++seq) {
      const int buf = seq % kRedBuffers;
      if constexpr (kCombineInPasses) {
        // (lane 0's test for the warp: every lane must take the same passes)
        while (combining >= 0 &&
               (ended || queued >= 0 ||
                !__shfl_sync(0xffffffffu, mbar_test(&red_full[buf], (seq / kRedBuffers) & 1), 0))) {
          if (!bulk_combine_pass(dn, combining, combine_pass++, lane)) {
            combining = queued;
            combine_pass = 0;
            queued = -1;
          }
        }
      }
      if (kCombineInPasses && ended) break;
      mbar_wait(&red_full[buf], (seq / kRedBuffers) & 1);
      const BulkItem& m = item_meta[buf];
      if (m.item < 0) {
        if (!kCombineInPasses) break;
        ended = true;  // (the loop's top runs the combine's last passes, then leaves)
        continue;
      }
      float acc[kNT][4];
      sum_warp_partials<kBulkConsumerWarps, kNT>(red + buf * L::kRedFloats, lane, acc);
      const int item = m.item, tile = m.tile, task = m.task;
      const bool down = is_down(m.down);
      if (kFused && down && !gate_up_ended) {
        gate_up_ended = true;
        if (lane == 0) trace_cta_end(trace, kTraceGateUpEnd, kTraceCtaGateUp);
      }
      if (!down) {
        if constexpr (kHalves) {
          // a half item's h rows only (lane row g: gate row g and up row g, fragment rows g, g+8)
          const int half = (m.down >> 2) & 3;
          if (half == 0 || (g >> 2) == half - 1) {
            store_item_outputs<true, kNT>(gu, m.expert, tile * kGateUpTileRows, m.count, m.pairs,
                                          acc, g, t);
          }
        } else {
          store_item_outputs<true, kNT>(gu, m.expert, tile * kGateUpTileRows, m.count, m.pairs,
                                        acc, g, t);
        }
        __syncwarp();
        mbar_arrive(&red_empty[buf]);  // the buffer and its record are read
        if constexpr (kFused) {
          // count the item in: its h (every lane's stores, ordered before lane 0's release by
          // __syncwarp; no fence.sc, which would also invalidate L1) before the count, for the
          // bulk copies of the CTAs whose down items wait on it
          fence_proxy_async_global();
          __syncwarp();
          if (lane == 0) red_release_gpu_add(task_done + task, 1);
        }
        continue;
      }
      store_item_outputs<false, kNT>(dn, m.expert, tile * kDownTileRows, m.count, m.pairs, acc,
                                     g, t);
      __syncwarp();
      mbar_arrive(&red_empty[buf]);  // the buffer and its record are read
      if (kTail && item >= dn_static) continue;  // a tail tile's: combined after the loop
      const bool closes_tile = item + 1 == dn_end || (item + 1) / num_tasks != tile;
      if (dn.tile_counters != nullptr && closes_tile) {
        // this CTA's last item of the tile: combine it here if all its items were ours (the
        // warp wrote every partial: __syncwarp orders them), else count ours in and let the
        // CTA that completes the count combine
        const int mine = item + 1 - max(dn_begin, tile * num_tasks);
        bool combine = mine == num_tasks;
        if (!combine) {
          __threadfence();  // our partials are visible before the counter counts them
          __syncwarp();
          int last = 0;
          if (lane == 0) last = atomicAdd(dn.tile_counters + tile, mine) + mine == num_tasks;
          combine = __shfl_sync(0xffffffffu, last, 0);
          if (combine) {
            __threadfence();
            if (lane == 0) dn.tile_counters[tile] = 0;
          }
        }
        if (combine && !kCombineInPasses) bulk_combine_tile(dn, tile, lane);
        if (combine && kCombineInPasses) {
          if (combining < 0) {
            combining = tile;
            combine_pass = 0;
          } else {
            queued = tile;
          }
        }
      }
    }
    if (kTail && dn_tail_tiles > 0 && dn.tile_counters != nullptr) {
      wait_for_every_cta(dn.tile_counters + dn_tiles, lane);
      mbar_arrive(tail_ready);  // every lane, after its acquire: the consumer warps join (below)
      combine_tail_outputs(dn, dn_tiles - dn_tail_tiles, dn_tiles,
                           static_cast<int>(blockIdx.x) * kTailCombineThreads +
                               kBulkConsumerWarps * 32 + lane,
                           static_cast<int>(gridDim.x) * kTailCombineThreads);
    }
    if (lane == 0) {
      if (!gate_up_ended) trace_cta_end(trace, kTraceGateUpEnd, kTraceCtaGateUp);
      if (kHasDown) trace_cta_end(trace, kTraceDownEnd, kTraceCtaDown);
    }
    return;
  }

  // ---- consumers ----
  // kActsFromL2: the consumers read h, the gate/up kernel's output, themselves, and the early
  // stages (weights only) may land before the producers' wait
  if constexpr (kActsFromL2 && kMode == kBulkDown) pdl_wait();
  // kActsFromL2: the activation rows of the item's tokens j * 8 + g (n-tile j), or null
  const __nv_bfloat16* act_row[kNT] = {};
  float acc[kNT][4];
  int count = 0;
  int nkb = 0, nchunks = 0;  // of the current item
  int c = 0;    // k chunk of the current item
  int seq = 0;  // items finished by this CTA
  for (int n = 0;; ++n) {
    const int s = n % kStages;
    mbar_wait(&full[s], (n / kStages) & 1);
    const BulkItem& m = stage_meta[s];
    const int buf = seq % kRedBuffers;
    const uint32_t empty_parity = ((seq / kRedBuffers) & 1) ^ 1;
    if (c == 0) {
      // the record's words that every lane needs, read by lane 0 (whose arrival on "empty"
      // releases the stage: racecheck does not count a __syncwarp as ordering the other lanes'
      // reads before it) and shuffled
      int item = 0, item_count = 0, item_down = 0;
      if (lane == 0) {
        item = m.item;
        item_count = m.count;
        item_down = m.down;
      }
      item = __shfl_sync(0xffffffffu, item, 0);
      if (item < 0) {
        if (kHasDown && warp == 0 && lane == 0) trace_mark(trace, kTraceDownConsumed);
        // tell the epilogue warp: a record of -1 in the next reduction buffer (every warp waits
        // for the buffer, so no arrival can count towards the buffer's previous use)
        mbar_wait(&red_empty[buf], empty_parity);
        if (warp == 0 && lane == 0) item_meta[buf].item = -1;
        __syncwarp();
        mbar_arrive(&red_full[buf]);
        if (kTail && dn_tail_tiles > 0 && dn.tile_counters != nullptr) {
          // the tail's combine, with the epilogue warp once it has seen every CTA's partials
          mbar_wait(tail_ready, 0);
          fence_acq_rel_gpu();  // (the epilogue warp's acquire, passed on by the mbarrier)
          combine_tail_outputs(dn, dn_tiles - dn_tail_tiles, dn_tiles,
                               static_cast<int>(blockIdx.x) * kTailCombineThreads +
                                   warp * 32 + lane,
                               static_cast<int>(gridDim.x) * kTailCombineThreads);
        }
        break;
      }
      count = __shfl_sync(0xffffffffu, item_count, 0);
      // (the flag is only read, and shuffled, when the mode does not fix it)
      const bool down = is_down(kFused ? __shfl_sync(0xffffffffu, item_down, 0) : 0);
      nkb = down ? dn_nkb : gu_nkb;
      nchunks = down ? dn_nchunks : gu_nchunks;
      if constexpr (kActsFromL2) {
        const ExpertsParams& ap = down ? dn : gu;
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          act_row[j] = nullptr;
          if (j * 8 + g < count) {
            act_row[j] = ap.x + static_cast<size_t>(m.pairs[j * 8 + g] / ap.x_row_div) * ap.k;
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
      if (warp == 0) {
        // the item's record for the epilogue (the stage is reused before the item ends)
        mbar_wait(&red_empty[buf], empty_parity);
        if (lane < kBulkItemWords) {
          reinterpret_cast<int*>(&item_meta[buf])[lane] = reinterpret_cast<const int*>(&m)[lane];
        }
      }
    }
    const unsigned char* stage = smem + s * L::kStageBytes;
    // kActsFromL2: this stage's activation fragments of the warp's blocks, all loads issued
    // before the first mma (one L2 round trip per stage; __ldcg: h is written by another kernel)
    uint4 gb[kBlocksPerWarp][kNT][2];
    if constexpr (kActsFromL2) {
#pragma unroll
      for (int u = 0; u < kBlocksPerWarp; ++u) {
        const int blk = warp + u * kBulkConsumerWarps;
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          gb[u][j][0] = gb[u][j][1] = make_uint4(0, 0, 0, 0);
          if (act_row[j] != nullptr && c * kChunkBlocks + blk < nkb) {
            const uint4* a = reinterpret_cast<const uint4*>(
                act_row[j] + (c * kChunkBlocks + blk) * kBlockK + 8 * t);
            gb[u][j][0] = __ldcg(a);
            gb[u][j][1] = __ldcg(a + 4);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kBlocksPerWarp; ++u) {
      const int blk = warp + u * kBulkConsumerWarps;
      if ((kChunkBlocks % kBulkConsumerWarps == 0 || blk < kChunkBlocks) &&
          c * kChunkBlocks + blk < nkb) {
        const unsigned char* lo = stage + g * L::kPitch + blk * kBlockK * 2 + 16 * t;
        const unsigned char* hi = lo + 8 * L::kPitch;
        const uint4 a[4] = {*reinterpret_cast<const uint4*>(lo),
                            *reinterpret_cast<const uint4*>(lo + 64),
                            *reinterpret_cast<const uint4*>(hi),
                            *reinterpret_cast<const uint4*>(hi + 64)};
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          if (j * 8 < count) {
            // token j*8+g's row; rows past the count were not copied: zeros
            const unsigned char* x = lo + (kBulkWeightRows + j * 8) * L::kPitch;
            uint4 b[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
            if (kActsFromL2) {
              b[0] = gb[u][j][0];
              b[1] = gb[u][j][1];
            } else if (j * 8 + g < count) {
              b[0] = *reinterpret_cast<const uint4*>(x);
              b[1] = *reinterpret_cast<const uint4*>(x + 64);
            }
            mma_block(acc[j], a, b);
          }
        }
      }
    }
    mbar_arrive(&empty[s]);  // release, every lane: its reads of the stage are done
    if (++c < nchunks) continue;

    // item end: hand the accumulators to the epilogue warp
    c = 0;
    if (warp != 0) mbar_wait(&red_empty[buf], empty_parity);  // warp 0 waited at item start
    float* rbuf = red + buf * L::kRedFloats;
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) rbuf[(warp * kNT * 4 + j * 4 + r) * 32 + lane] = acc[j][r];
    }
    mbar_arrive(&red_full[buf]);  // every lane: each wrote its part of the buffer
    ++seq;
  }
}

// One of the two GEMMs (kGateUp: gate/up + activation, else down + combine), as its own launch;
// kSplitRows, kRing, kKeep, kTail, kHalves and kSelfRoute as experts_bulk_body.
template <bool kGateUp, int kNT, bool kSplitRows = false, int kRing = 0, bool kKeep = false,
          bool kTail = false, bool kHalves = false, bool kSelfRoute = false>
__global__ void __launch_bounds__(kBulkThreads, 1) experts_bulk_kernel(const ExpertsParams p) {
  experts_bulk_body<kGateUp ? kBulkGateUp : kBulkDown, kNT, kSplitRows, kRing, kKeep, kTail,
                    kHalves, kSelfRoute>(p, p, nullptr, 0);
}

// Gate/up and down in one persistent grid (grid <= resident CTAs; task_done zeroed by the
// dispatch, one counter per task): no boundary between the two, no second prologue, one launch.
template <int kNT>
__global__ void __launch_bounds__(kBulkThreads, 1)
    experts_bulk_fused_kernel(const ExpertsParams gu, const ExpertsParams dn, int* task_done,
                              int order) {
  experts_bulk_body<kBulkFused, kNT>(gu, dn, task_done, order);
}

}  // namespace moekit::cuda::experts_detail

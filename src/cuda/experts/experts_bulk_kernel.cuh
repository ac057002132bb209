// Grouped expert kernels, bulk-copy variant: the same work items, tiles, mma fragments, epilogue
// and deterministic combine as experts_kernel.cuh (experts_common.cuh), with weights AND
// activations streamed by the copy engine (cp.async.bulk, Hopper's TMA in its 1-D form) into a
// ring of shared-memory stages, and the warps specialised so that nothing waits on a round trip
// it could have started earlier. why: the register variant holds its in-flight bytes in
// registers, waits a round trip per run of blocks and drains at item ends; this one streams
// nearer the H200's read bandwidth (docs/decisions/experts_bulk_design.md).
//   warps 8-9 (producers, experts_bulk_producer.inc): each walks the CTA's items (a contiguous
//     range of the tile-major item list, then a tail claimed one by one:
//     experts_bulk_dispatch.inc) and fills the ring slots it owns (slot % 2) with a stage record,
//     its "full" mbarrier armed with the byte count, and the bulk copies of 16 weight rows and
//     one activation row per token (x, or h in down mode; experts_bulk_copies.inc). why two: a
//     bulk copy takes uniform operands, so a warp issues its lanes' copies one after another, and
//     one warp's issue rate limits the stream.
//   warps 0-7 (consumers, experts_bulk_consumer.inc): wait for a stage, run the mma of their k
//     blocks from shared memory (block w and w + 8 of the chunk), release the stage ("empty"
//     mbarrier), and at an item's end hand their accumulators to the epilogue through one of
//     kRedBuffers reduction buffers ("red_full"). They touch no global memory but in the ring of
//     weights only, where they load the activations from L2.
//   warp 10 (epilogue, experts_bulk_epilogue.inc): sums the eight warps' accumulators in warp
//     order (deterministic), writes h = act(g, u) or the fp32 down partials and frees the buffer
//     ("red_empty"). In down mode, at the CTA's last item of a tile: a tile all of whose items
//     were this CTA's (most of them: ranges are contiguous and tile-major) is combined by this
//     warp; a tile shared with a neighbouring CTA (at most two per CTA) is counted in its tile
//     counter after a fence, and the CTA that completes the count combines it. The epilogue lags
//     the consumers by up to kRedBuffers items, so its stores do not stall the stream, and it
//     combines a tile one pass at a time while the consumers have not filled its next buffer
//     (experts_bulk_combine.cuh: the combine and the down tail).
// The ring's layout and shapes: experts_bulk_layout.cuh. The body is one function, its parts in
// the .inc files included where they run: its code is the measured code, and splitting it into
// functions changes the compiled code of every instance (scripts/compare_cubins.py).
// Barrier arrivals: every lane that wrote what a barrier publishes, or read what it releases,
// arrives on it (compute-sanitizer's racecheck does not take a __syncwarp before one lane's
// arrival as ordering; with a 2-stage ring it reports the consumers' reads against the next fill).
// PDL: gate/up's producers wait for the dispatch (first issuing the fused shared experts' items,
// which need nothing from it: docs/decisions/experts_shared_first.md) and let the down kernel
// launch; the down kernel's CTAs take SMs as gate/up CTAs finish, and its producer issues the
// weight copies of its first stages before griddepcontrol.wait (weights and the dispatch, two
// launches back, are ready) and their activation (h) copies after it: W2 streams through the
// gate/up tail. After its wait the down kernel lets the next kernel launch (the next layer's
// router GEMM, which loads its weights while we stream).
// Down tail (the kTail instances, docs/decisions/experts_down_tail.md): the last tiles' items are
// claimed one by one, as gate/up's tail; they are combined once every CTA has counted its
// partials written (wait_for_every_cta), by the consumer and epilogue warps of the whole grid
// (combine_tail_outputs).
// Self-routing gate/up (the kSelfRoute instances: one token, shared experts fused or none,
// E <= 128, or E <= 256 in fp8's one-token ring): no routing kernel runs; the gate/up kernel
// waits on the router GEMM and routes its token itself (docs/decisions/experts_self_route.md).
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

#include "cuda/experts/experts_bulk_combine.cuh"
#include "cuda/experts/experts_bulk_layout.cuh"
#include "cuda/experts/experts_fp8.cuh"
#include "cuda/experts/experts_mx.cuh"

namespace moekit::cuda::experts_detail {

// The bulk kernel's body. kMode kBulkGateUp / kBulkDown: which GEMM. gu and dn are the launch's
// params (experts_bulk_kernel passes p as both) and task_done is null: the deleted persistent
// variant's parameters (docs/decisions/persistent_variant.md), kept because one params reference
// or no task_done (with the lambda that reads it, experts_bulk_producer.inc) changes the machine
// code of bulk_down_l2_keep_tail (scripts/compare_cubins.py).
// kNT: n-tiles of 8 tokens per task. kSplitRows: 4 KB row chunks copied in two halves
// (a template parameter, not a runtime test: any code for it slows the one-copy kernels).
// kRing: the ring BulkShape<kNT, kRing> (plan::Ring: its stages and chunk). kKeep: the
// weight rows of a task whose expert has a next task (ExpertTask::more) are copied with normal
// L2 priority instead of evict-first, so that the next task's item reads them from L2 (a
// template parameter for the same reason as kSplitRows: docs/decisions/experts_l2_keep.md).
// kTail (down, with a combine): the last dn.down_tail_percent % of the output tiles are a
// dynamic tail (ExpertsParams::down_tail_percent; wait_for_every_cta, combine_tail_outputs).
// kHalves (gate/up): the launch's last claimed items go as two half items each
// (ExpertsParams::half_items_per_cta): 4 of the tile's 8 h rows, i.e. 8 of its 16 weight rows,
// copied to their usual stage rows (the others hold stale bytes: their mma rows are computed
// and not stored), so the CTAs' last claims are half as long.
// kSelfRoute (gate/up at one token, ExpertsParams::self_route): no routing kernel ran; every
// CTA's producers route the token from the logits (self_route_token: 8 experts a lane with kFp8,
// else 4; the bf16, fp8 one-token and MX gate/up kernels) and look their items up in
// the lists that implies (the fused shared slots' tasks after the routed ones), and CTA 0's
// epilogue warp writes the routing and the dispatch for the down kernel. Its dynamic tail claims
// from a counter of its own, which its last CTA to finish claiming zeroes (the dispatch, which
// zeroes the others, is written while it runs).
// kFp8 (the rings of weights only and the fp8 one-token rings): e4m3 weights with 128 x 128
// tile scales, W8A8 (experts_fp8.cuh): k blocks of 128 elements in the bytes of the bf16 blocks
// of 64, so the ring and its copies are the same; the consumers scale each block's products by
// its activation and weight scales. In the rings of weights only they load the activations'
// codes (quantize_rows_fp8.h) and all the scales themselves; in the one-token rings the
// producers copy the token's code row and the chunk's scales into the stage, so a consumer
// waits on the stage alone (the gate/up producers copy the fused shared experts' x8 rows before
// their PDL wait: x8 is complete when this kernel starts, since the routing kernel, the
// engine's dispatch or (kSelfRoute) the router GEMM runs between the quantiser and it and lets
// it launch only after its own wait).
// kMx (Mxfp8 / Mxfp4, the MX ring): packed MX weights, W8A16 / W4A16 (experts_mx.cuh): k blocks
// of 128 packed bytes (128 or 256 elements), the last one of a row possibly partial (rows of
// k / 2 or k bytes, k a multiple of 32); the producers copy the tile's 16 rows of the chunk and
// their e8m0 bytes into the stage (one copy each: experts_mx_layout.h; an item's first stage also
// the biases of its output rows, which the epilogue reads from its reduction buffer), the
// consumers load their bf16 activations themselves (x through L1, h from L2) and dequantise each
// weight before its mma, the path of the exponents' range chosen per warp (the mma is the warp's).
template <int kMode, int kNT, bool kSplitRows = false, plan::Ring kRing = plan::Ring::Standard,
          bool kKeep = false, bool kTail = false, bool kHalves = false, bool kSelfRoute = false,
          bool kFp8 = false, ExpertFormat kMx = ExpertFormat::Bf16, bool kGroups = false>
__device__ __forceinline__ void experts_bulk_body(const ExpertsParams& gu, const ExpertsParams& dn,
                                                  int* task_done) {
  static_assert(kNT >= 1 && kNT <= 2, "kNT: 1 or 2 n-tiles of 8 tokens");
  static_assert(!kTail || kMode == kBulkDown, "kTail: the down kernel's");
  static_assert(!kHalves || (kMode == kBulkGateUp && !kKeep), "kHalves: the gate/up kernel's");
  static_assert(!kSelfRoute || (kMode == kBulkGateUp && kNT == 1 && !kKeep && !kHalves),
                "kSelfRoute: the plain chunk-8 gate/up kernel's");
  constexpr bool kFp8OneToken =
      kRing == plan::Ring::Fp8OneToken || kRing == plan::Ring::Fp8OneTokenDeep;
  static_assert(
      !kFp8 ||
          ((kRing == plan::Ring::WeightsOnly ||
            ((kRing == plan::Ring::WeightsOnlyDeep || kRing == plan::Ring::Fp8OneTokenDeep) &&
             kMode == kBulkDown && kNT == 1 && !kTail) ||
            (kRing == plan::Ring::Fp8OneToken && kMode == kBulkGateUp && kNT == 1 && !kHalves)) &&
           !kKeep),
      "kFp8: the rings of weights only (the deep one: down, one n-tile, no tail) and "
      "the fp8 one-token rings, without the L2 keep");
  static_assert((kRing != plan::Ring::WeightsOnlyDeep && !kFp8OneToken) || kFp8,
                "the deep ring of weights only and the one-token rings with scales: fp8's");
  constexpr bool kMxOn = kMx != ExpertFormat::Bf16;
  static_assert((kRing == plan::Ring::MxWeightsOnly) == kMxOn &&
                    (!kMxOn || (kNT == 1 && !kFp8 && !kSplitRows && !kKeep && !kTail && !kHalves)),
                "kMx: the MX ring's, one n-tile, no other option but the self-routing gate/up");
  static_assert(!kMxOn || BulkShape<kNT, kRing>::kChunkBlocks * 128 == kMxChunkBytes,
                "kMx: the ring's chunk is the layout's (experts_mx_layout.h)");
  // kSelfRoute: the experts a lane of self_route_token (E <= 32 of them; plan.cpp's rule)
  constexpr int kRoutePerLane = kFp8 ? 8 : 4;
  constexpr bool kHasGateUp = kMode != kBulkDown;
  constexpr bool kHasDown = kMode != kBulkGateUp;
  // whether an item (its record's `down` flag) is a down item: fixed by the mode
  auto is_down = [](int down_flag) { return kHasDown && (!kHasGateUp || down_flag != 0); };
  constexpr int kStages = BulkShape<kNT, kRing>::kStages;
  constexpr int kChunkBlocks = BulkShape<kNT, kRing>::kChunkBlocks;
  static_assert(kRing != plan::Ring::OneTokenNarrow ||
                    (kMode == kBulkDown && kNT == 1 && !kSplitRows),
                "the narrow one-token ring: the chunk-8 down kernel's");
  static_assert(kRing != plan::Ring::OneToken || (kNT == 1 && !kKeep && !kSplitRows && !kTail),
                "the one-token ring: the chunk-8 gate/up and down kernels' at one token");
  using L = typename BulkShapeLayout<kNT, kRing>::type;
  constexpr int kRedBuffers = L::kRedBuffers;  // items the epilogue warp may lag behind
  static_assert(
      kRing != plan::Ring::WeightsOnly ||
          (!kSplitRows && !kHalves && !kSelfRoute && (kNT == 1 || !kTail)),
      "the ring of weights only: the gate/up and down kernels' (chunk 8 with the L2 keep and "
      "the tail; chunk 16 with the L2 keep)");
  // stages of weights only (Ring::WeightsOnly): the consumers load the activations themselves
  constexpr bool kActsFromL2 = L::kActRows == 0;
  // The down epilogue's combine: one pass at a time between its items (bulk_combine_pass), or
  // at once (bulk_combine_tile) in the instances that run at <= 8 tokens only, whose code stays
  // as it was measured: with the passes they are slower at one token, though the code they run
  // there is the same (docs/decisions/experts_bulk_design.md)
  constexpr bool kCombineInPasses =
      kHasDown &&
      (kRing == plan::Ring::Standard || kRing == plan::Ring::WeightsOnly ||
       kRing == plan::Ring::WeightsOnlyDeep || kRing == plan::Ring::MxWeightsOnly) &&
      !kSplitRows;
  constexpr int kGateUpTileRows = 8;  // output rows per gate/up item (of h)
  constexpr int kDownTileRows = 16;   // output rows per down item
  // (rounded up: a warp's blocks past the chunk are skipped, Ring::OneTokenNarrow)
  constexpr int kBlocksPerWarp = (kChunkBlocks + kBulkConsumerWarps - 1) / kBulkConsumerWarps;
  constexpr int kMaxGroups = kGroups ? 2 : 1;  // (consumer groups: below)
  static_assert(!kGroups || (kMx == ExpertFormat::Mxfp4 && !kTail && kHasGateUp != kHasDown),
                "consumer groups: MXFP4's, items of one fill count (one GEMM a launch), no tail");
  auto consumer_groups = [](int item_chunks) {
    return kMaxGroups > 1 && kStages % (kMaxGroups * item_chunks) == 0 ? kMaxGroups : 1;
  };
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
    // (consumer groups: the warps of one, from the item's fills as computed below)
    const int init_warps =
        kMaxGroups == 1 ? kBulkConsumerWarps
                        : kBulkConsumerWarps /
                              consumer_groups(((kHasGateUp ? gu.k : dn.k) / mx_elems_per_byte(kMx) +
                                               kChunkBlocks * 128 - 1) /
                                              (kChunkBlocks * 128));
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 32);  // every producer lane (the item record is written by several)
      mbar_init(&empty[s], init_warps * 32);  // every consumer lane of a group (each read it)
    }
    for (int b = 0; b < kRedBuffers; ++b) {
      mbar_init(&red_full[b], init_warps * 32);  // every lane that wrote the buffer
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
  // The gate/up kernel's producers alone wait for the dispatch (experts_bulk_dispatch.inc), after
  // issuing the fused shared experts' items when gu.early_shared, which need nothing from it; the
  // consumers and the epilogue read no dispatch data.
  const bool producer_warp = warp >= kBulkProducerWarp && warp < kBulkEpilogueWarp;
  // each ring slot has ONE producer (slot % 2 == id), so a slot's fills stay in order and the
  // parity of its "empty" barrier cannot alias (alternating owners could run two phases ahead)
  const int producer_id = warp - kBulkProducerWarp;
  auto owns = [&](int fill) {
    return (fill % kStages) % kBulkProducerWarps == producer_id;
  };
  // elements of a k block (MX: 128 packed bytes; a row's last block may be partial)
  constexpr int kBlockElems = kMxOn ? 128 * mx_elems_per_byte(kMx) : kFp8 ? kFp8BlockK : kBlockK;
  constexpr int kBlockRound = kMxOn ? kBlockElems - 1 : 0;  // (MX: a partial last block counts)
  const int gu_nkb = kHasGateUp ? (gu.k + kBlockRound) / kBlockElems : 0;
  const int dn_nkb = kHasDown ? (dn.k + kBlockRound) / kBlockElems : 0;
  const int gu_nchunks = (gu_nkb + kChunkBlocks - 1) / kChunkBlocks;
  const int dn_nchunks = (dn_nkb + kChunkBlocks - 1) / kChunkBlocks;
  // kGroups: the consumer warps run as `groups` groups of four that take alternate items, each
  // warp with twice the blocks of a stage, so that one group's item start and load round trips
  // overlap the other group's dequantisation and mma instead of all eight warps waiting at once.
  // A stage and a reduction buffer then have one group's warps; the producers end the work with
  // a record of -1 for each group. A group waits only for its own items' stages, so a slot's
  // previous fill must be its own group's (else a wait could pass on the slot's fill before
  // last): items of `item_chunks` fills, kStages a multiple of groups x item_chunks; other item
  // lengths run one group.
  const int item_chunks = kHasGateUp ? gu_nchunks : dn_nchunks;
  const int groups = consumer_groups(item_chunks);
  const int group_warps = kBulkConsumerWarps / groups;
  auto range = [&](int total, int b) {
    return static_cast<int>(static_cast<long long>(total) * b / gridDim.x);
  };
  const uint64_t weight_policy = l2_evict_first_policy();
  const uint64_t keep_policy = kKeep ? l2_evict_normal_policy() : weight_policy;
#include "cuda/experts/experts_bulk_copies.inc"
#include "cuda/experts/experts_bulk_dispatch.inc"

  if (producer_warp) {
#include "cuda/experts/experts_bulk_producer.inc"
  }

  const int g = lane >> 2, t = lane & 3;
  if (warp == kBulkEpilogueWarp) {
#include "cuda/experts/experts_bulk_epilogue.inc"
  }

#include "cuda/experts/experts_bulk_consumer.inc"
}

// One of the two GEMMs (kGateUp: gate/up + activation, else down + combine), as its own launch;
// kSplitRows, kRing, kKeep, kTail, kHalves, kSelfRoute, kFp8, kMx and kGroups as
// experts_bulk_body.
template <bool kGateUp, int kNT, bool kSplitRows = false, plan::Ring kRing = plan::Ring::Standard,
          bool kKeep = false, bool kTail = false, bool kHalves = false, bool kSelfRoute = false,
          bool kFp8 = false, ExpertFormat kMx = ExpertFormat::Bf16, bool kGroups = false>
__global__ void __launch_bounds__(kBulkThreads, 1) experts_bulk_kernel(const ExpertsParams p) {
  experts_bulk_body<kGateUp ? kBulkGateUp : kBulkDown, kNT, kSplitRows, kRing, kKeep, kTail,
                    kHalves, kSelfRoute, kFp8, kMx, kGroups>(p, p, nullptr);
}

}  // namespace moekit::cuda::experts_detail

// The bulk expert kernel's shapes (experts_bulk_kernel.cuh): its warp roles, the record a stage
// carries, the shared-memory layout of a ring (BulkLayout), the rings per n-tiles (BulkShape), the
// producers' view of a work item and the kernel's modes.
//
// Stage layout: 16 weight rows then kNT * 8 activation rows, each at a pitch of kChunkBlocks *
// 128 + 64 bytes, so the rows read by one quarter-warp's 16-byte loads fall in different banks
// (the one-token rings, Ring::OneTokenNarrow and Ring::OneToken: one activation row, and no pad;
// the ring of weights only, Ring::WeightsOnly: no activation rows, the consumers load theirs from
// L2). The fp8 one-token rings (Ring::Fp8OneToken, Ring::Fp8OneTokenDeep) end each stage with
// its chunk's scales: kChunkBlocks floats each of the activation's, the weight tile's first 8
// rows' and its last 8 rows' (gate/up: gate and up; down: the first only, one 128-row tile).
// The MX ring (Ring::MxWeightsOnly) holds a stage's 16 rows back to back at the chunk's own
// pitch, and ends each stage with the e8m0 bytes of the 16 rows' chunk (experts_mx_layout.h) and
// room for the item's 16 output-row biases (an item's first stage brings them).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/experts/experts.h"
#include "cuda/experts/experts_common.cuh"
#include "moekit/plan.h"

namespace moekit::cuda::experts_detail {

constexpr int kBulkConsumerWarps = 8;
constexpr int kBulkProducerWarps = 2;  // filling alternate ring slots (experts_bulk_kernel.cuh)
constexpr int kBulkProducerWarp = kBulkConsumerWarps;  // the first producer warp
constexpr int kBulkEpilogueWarp = kBulkConsumerWarps + kBulkProducerWarps;
constexpr int kBulkThreads = (kBulkConsumerWarps + kBulkProducerWarps + 1) * 32;
constexpr int kBulkWeightRows = 16;    // weight rows per item (the mma's M)
constexpr int kDefaultRedBuffers = 4;  // items the epilogue warp may lag behind (BulkShape)
constexpr int kClaimSlots = 4;         // gate/up tail claims producer 0 may be ahead of producer 1

// What a stage (and, for the epilogue, a reduction buffer) holds besides its bytes.
struct BulkItem {
  int item;  // work item, or -1: no more work
  int expert;
  int tile;
  int count;  // tokens of the task
  int chunk;  // k chunk of this stage
  int down;   // 1 for a down item, 0 for gate/up; kHalves: the half in bits 2-3
  int task;   // task id
  int more;   // kKeep: ExpertTask::more of the item's task (also: 96 bytes, barriers stay aligned)
  int pairs[16];  // pair ids of the task's tokens (rows of h / partial)
};
constexpr int kBulkItemWords = static_cast<int>(sizeof(BulkItem) / 4);

template <int kNT, int kStages, int kChunkBlocks, int kActRowsPerStage = kNT * 8, int kRowPad = 64,
          int kRedBufs = kDefaultRedBuffers, int kStageScaleBytes = 0, int kItemBiasFloats = 0>
struct BulkLayout {
  static constexpr int kActRows = kActRowsPerStage;
  static constexpr int kRedBuffers = kRedBufs;
  // bytes per row in a stage (kRowPad 0: a tile's rows land as one contiguous copy)
  static constexpr int kPitch = kChunkBlocks * kBlockK * 2 + kRowPad;
  // kStageScaleBytes: the chunk's scales after the rows (BulkShape::kStageScaleBytes)
  static constexpr int kScaleOffset = (kBulkWeightRows + kActRows) * kPitch;
  static constexpr int kScaleBytes = kStageScaleBytes;
  // kItemBiasFloats: the item's output-row biases after the scales, in an item's first stage
  // (BulkShape::kItemBiasFloats), and after the partials of each reduction buffer
  static constexpr int kBiasOffset = kScaleOffset + kScaleBytes;
  static constexpr int kBiasFloats = kItemBiasFloats;
  // (with biases, stages stay 128-byte aligned, as the copies' destinations are without them)
  static constexpr int kStageBytes =
      kBiasFloats > 0 ? (kBiasOffset + kBiasFloats * 4 + 127) / 128 * 128 : kBiasOffset;
  static constexpr int kRedPartials = kBulkConsumerWarps * kNT * 4 * 32;
  static constexpr int kRedFloats = kRedPartials + kBiasFloats;  // one buffer
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
  static_assert(kPitch % 16 == 0 && kStageBytes % 16 == 0 && kChunkBlocks % 4 == 0,
                "bulk copies need 16-byte alignment");
  static_assert(kBarOffset % 8 == 0, "mbarriers need 8-byte alignment");
  static_assert(kBiasOffset % 16 == 0 && kRedFloats % 4 == 0,
                "the biases' bulk copy and the reduction buffers need 16-byte alignment");
  // why: sm_90's largest dynamic shared memory per block (227 KB), one CTA per SM
  static_assert(kBytes <= 227 * 1024, "the ring does not fit in shared memory");
};

// Ring depth, chunk and activation rows per stage, per n-tiles and ring (moekit/plan.h's Ring;
// kNT 2: Standard and WeightsOnly only): ~200 KB of shared memory, 1 CTA per SM.
template <int kNT, plan::Ring kRing = plan::Ring::Standard>
struct BulkShape;
template <>
struct BulkShape<1, plan::Ring::Standard> {
  // 2 x 98 KB (16 x 4 KB weights). why 4 KB rows, not 4 stages of 2 KB: the same weight bytes
  // in flight with half the bulk copies per byte (the copy issue limits the stream:
  // docs/decisions/experts_bulk_design.md)
  static constexpr int kStages = 2, kChunkBlocks = 32, kActRows = 8, kRowPad = 64;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
};
template <>
struct BulkShape<1, plan::Ring::Deep> {
  // 4 x 50 KB (16 x 2 KB weights): for down rows of <= 2 KB, which fill at most half a stage of
  // the standard ring, twice the stages and so twice the weight bytes in flight
  // (docs/decisions/experts_down_deep_ring.md)
  static constexpr int kStages = 4, kChunkBlocks = 16, kActRows = 8, kRowPad = 64;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
};
template <>
struct BulkShape<1, plan::Ring::OneTokenNarrow> {
  // 8 x 25.5 KB (16 x 1.5 KB weights, ONE activation row, rows unpadded): for down rows of
  // <= 1.5 KB at one token, where the deep ring's stages carry 24 KB of weights in ~50 KB (8
  // activation rows of 2 KB reserved for one): 192 KB of weights in flight per SM instead of 96.
  // Unpadded, a tile's 16 rows of exactly 1.5 KB are one contiguous 24 KB copy instead of 16
  // (the copies' issue, not the bytes in flight, bounds these short rows; the consumers' loads
  // then meet bank conflicts, which one token's few mma hide). 12 blocks are not a multiple of
  // the 8 consumer warps: warps 4-7 take one block, 0-3 two (experts_bulk_consumer.inc's
  // guard; docs/decisions/experts_one_token_rings.md).
  static constexpr int kStages = 8, kChunkBlocks = 12, kActRows = 1, kRowPad = 0;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
};
template <>
struct BulkShape<1, plan::Ring::OneToken> {
  // 3 x 68 KB (16 x 4 KB weights, ONE activation row, rows unpadded), at one token
  // (docs/decisions/experts_one_token_rings.md): the gate/up kernel's, 192 KB of weights in
  // flight per SM instead of 128 (where a row is one chunk, <= 4 KB, an item's 8 gate rows and 8
  // up rows are two contiguous blocks, one copy each instead of 16; wider rows go one copy per
  // row chunk); and the down kernel's for rows of exactly 4 KB (DeepSeek-V3, Kimi-K2), a tile's
  // 16 rows one 64 KB copy instead of 32 of 2 KB, with 192 KB of weights in flight per SM
  // instead of 128
  static constexpr int kStages = 3, kChunkBlocks = 32, kActRows = 1, kRowPad = 0;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
};
template <>
struct BulkShape<1, plan::Ring::WeightsOnly> {
  // 3 x 65 KB of weights only (16 x 4 KB, rows padded as the standard ring's), at 2-32 tokens
  // (docs/decisions/experts_l2_acts_ring.md): the consumer warps load their activation
  // fragments from global memory (L2) themselves, so the third stage fits: 192 KB of weights in
  // flight per SM instead of the standard ring's 128
  static constexpr int kStages = 3, kChunkBlocks = 32, kActRows = 0, kRowPad = 64;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
};
template <>
struct BulkShape<1, plan::Ring::WeightsOnlyDeep> {
  // 6 x 33 KB of weights only (16 x 2 KB, padded): the fp8 down kernel's for rows of <= 2 KB
  // (DeepSeek-V3's 2048 e4m3 bytes), which fill half a stage of the ring of weights only; twice
  // the stages keep its 192 KB of weights in flight per SM (docs/decisions/fp8_experts.md)
  static constexpr int kStages = 6, kChunkBlocks = 16, kActRows = 0, kRowPad = 64;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
};
template <>
struct BulkShape<1, plan::Ring::Fp8OneToken> {
  // 3 x 68.4 KB (16 x 4 KB e4m3 weights, ONE activation row, the chunk's scales; rows
  // unpadded, as the bf16 one-token ring's): the fp8 gate/up kernel's at one token, whose
  // consumers then wait on nothing but the stage (docs/decisions/fp8_experts.md)
  static constexpr int kStages = 3, kChunkBlocks = 32, kActRows = 1, kRowPad = 0;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
  static constexpr int kStageScaleBytes = 3 * kChunkBlocks * 4;
};
template <>
struct BulkShape<1, plan::Ring::Fp8OneTokenDeep> {
  // 6 x 34.2 KB (16 x 2 KB, one activation row, the scales; unpadded: a tile's 16 rows of
  // exactly 2 KB are one copy): the fp8 down kernel's at one token for rows of <= 2 KB
  static constexpr int kStages = 6, kChunkBlocks = 16, kActRows = 1, kRowPad = 0;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
  static constexpr int kStageScaleBytes = 3 * kChunkBlocks * 4;
};
template <>
struct BulkShape<1, plan::Ring::MxWeightsOnly> {
  // 6 x 34 KB (16 x 2 KB packed MX weights + the chunk's e8m0 bytes of the 16 rows: 128 a row
  // for MXFP4's 4096 elements, 64 for MXFP8's 2048): the MX instances' ring, weights only, at
  // every batch. A stage's rows lie back to back at the pitch of the chunk's bytes (a runtime
  // pitch: a row's last chunk may be shorter), as the kernels' layout holds them, so its weights
  // are one copy and its scales another (experts_mx_layout.h; docs/decisions/mx_experts.md).
  // An item's first stage also brings the biases of its 16 output rows (gpt-oss), which the
  // epilogue warp then reads from the item's reduction buffer. why: the epilogue warp takes one
  // item at a time, and a load from global memory per item is in series with its reduction; an
  // MX item of one short stage is soon streamed (docs/decisions/mx_experts.md).
  static constexpr int kStages = 6, kChunkBlocks = 16, kActRows = 0, kRowPad = 0;
  static constexpr int kRedBuffers = kDefaultRedBuffers;
  static constexpr int kStageScaleBytes = kBulkWeightRows * 128;
  static constexpr int kItemBiasFloats = kBulkWeightRows;
};
template <>
struct BulkShape<2, plan::Ring::Standard> {
  static constexpr int kStages = 5, kChunkBlocks = 8, kActRows = 16, kRowPad = 64;  // 5 x 34 KB
  static constexpr int kRedBuffers = kDefaultRedBuffers;
};
template <>
struct BulkShape<2, plan::Ring::WeightsOnly> {
  // the ring of weights only with tasks of up to 16 tokens
  // (docs/decisions/experts_task16_ring.md): the same 3 x 65 KB stages of weights only, each
  // consumer warp running both n-tiles on every weight fragment, so an expert with 9-16 tokens
  // streams its weights once instead of twice. Its reduction buffers are twice as large (8 KB):
  // 3 of them fit beside the stages, not 4.
  static constexpr int kStages = 3, kChunkBlocks = 32, kActRows = 0, kRowPad = 64;
  static constexpr int kRedBuffers = 3;
};

// The bytes of the chunk's scales that end a ring's stages (BulkShape::kStageScaleBytes, where
// declared).
template <typename S>
constexpr int stage_scale_bytes() {
  if constexpr (requires { S::kStageScaleBytes; }) {
    return S::kStageScaleBytes;
  } else {
    return 0;
  }
}

// The floats of an item's biases that its first stage and its reduction buffer carry
// (BulkShape::kItemBiasFloats, where declared; else the epilogue loads them).
template <typename S>
constexpr int item_bias_floats() {
  if constexpr (requires { S::kItemBiasFloats; }) {
    return S::kItemBiasFloats;
  } else {
    return 0;
  }
}

template <int kNT, plan::Ring kRing = plan::Ring::Standard>
struct BulkShapeLayout {
  using S = BulkShape<kNT, kRing>;
  using type = BulkLayout<kNT, S::kStages, S::kChunkBlocks, S::kActRows, S::kRowPad, S::kRedBuffers,
                          stage_scale_bytes<S>(), item_bias_floats<S>()>;
};

template <int kNT, plan::Ring kRing = plan::Ring::Standard>
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
  bool down;  // a down item
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

// The same row of an fp8 instance's weights (kFp8: p.w8, bytes; experts_fp8.cuh).
template <bool kGateUp>
__device__ __forceinline__ const uint8_t* tile_row_fp8(const ExpertsParams& p, int expert, int r0,
                                                       int i) {
  const uint8_t* wexp = p.w8 + static_cast<long long>(expert) * p.w_expert_stride;
  int row = r0 + i;
  if constexpr (kGateUp) row = i < 8 ? r0 + i : p.inter + r0 + (i - 8);
  return wexp + static_cast<size_t>(row) * p.k;
}

// What a launch of the bulk kernel does: one of the two GEMMs.
enum BulkMode : int {
  kBulkGateUp,  // gate/up + activation
  kBulkDown,    // down (+ combine)
};

}  // namespace moekit::cuda::experts_detail

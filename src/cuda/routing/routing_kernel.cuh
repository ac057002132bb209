// Routing kernel: fp32 router logits -> per-token top-k expert ids and weights, every mode of
// DESIGN.md §1, with the fused shared slots appended (§2); the CTA that finishes last then runs
// the dispatch (align.cuh) in the same launch, so decode needs no separate align kernel.
//
// Grid: ceil(T / 16) CTAs of min(16, max(T, 4)) warps; one warp per token (a grid of one CTA
// for T <= 16 is sized to the batch: no idle warps to launch, >= 4 warps for the dispatch). Lane l
// holds experts l, l+32, ... as fp32 score and key: kPer = 4, 8 or 16 of them (E <= 128, 256,
// 512), a template parameter, so E=128 runs a quarter of the E=512 selection loop and its code
// is a third of the size. The kernel is latency-bound: one token is a chain of dependent warp
// operations on one warp (a warm second pass runs nearly as slow as the first: the chain, not
// the cold code, sets its time).
//
//   score   softmax over the row (warp max / sum) | sigmoid | sqrt(softplus) | the logit itself
//   key     score (+ correction bias)                                          selection only
//   groups  n_group > 1: group score = top-2 key sum (with a bias) or max; the topk_group best
//           groups are kept (ties -> lower group), the other keys become -inf (keys can be < 0)
//   top-k   k rounds of a warp pick (two redux.sync on order-preserving u32 keys, then the
//           lowest id: ties -> lower expert id, as the CPU reference); a taken mask, not a
//           sentinel key, removes picks, so -inf keys are still ordered by id
//   weights from the unbiased score (softmax-of-topk: softmax over the k picked logits), summed
//           in slot order, renormalised w / (sum + 1e-20), times routed_scaling_factor
//   shared  slots E..E+S-1 appended with weight 1 or sigmoid(logit[E]) (gated), shared_scale[t]
//
// Numerics: fp32 throughout; expf/log1pf/sqrtf are the accurate (not fast-math) versions, so
// keys match the CPU's float keys to an ulp: tie-free logits give identical ids. Weights agree
// with the CPU's double weights to ~1e-6 relative. Non-finite logits are not checked here (the
// host forward() rejects non-finite x); they would propagate as NaN weights.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/routing/align.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/trace.cuh"
#include "cuda/routing/routing.h"

namespace moekit::cuda::routing_detail {

constexpr int kRoutingWarps = 16;
constexpr int kRoutingThreads = kRoutingWarps * 32;
constexpr int kPerLane = kRoutingMaxExperts / 32;  // the largest kPer

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Order-preserving map of a float key to a u32 (larger key -> larger value; -0 and +0 equal, as
// in a float compare). Every non-NaN float maps above 0, so 0 marks "nothing to pick".
__device__ __forceinline__ uint32_t orderable(float f) {
  const uint32_t b = __float_as_uint(f + 0.0f);  // + 0: -0 becomes +0
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float from_orderable(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

// The warp's pick: the largest `value` (orderable, 0 = no candidate), ties -> the lowest `id`;
// every lane gets the winner's id. Two redux.sync instead of five shuffle rounds: the routing of
// one token is a chain of k of these (DeepSeek-V3: 8 picks and 4 group picks).
__device__ __forceinline__ int warp_pick(uint32_t value, int id) {
  const uint32_t best = __reduce_max_sync(0xffffffffu, value);
  const uint32_t mine =
      value == best && value != 0 ? 0xffffffffu - static_cast<uint32_t>(id) : 0u;
  return static_cast<int>(0xffffffffu - __reduce_max_sync(0xffffffffu, mine));
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Elementwise unbiased score (not Softmax, which needs the row).
__device__ __forceinline__ float score_of(Scoring scoring, float logit) {
  switch (scoring) {
    case Scoring::Sigmoid:
      return 1.0f / (1.0f + expf(-logit));
    case Scoring::SqrtSoftplus:
      return sqrtf(fmaxf(logit, 0.0f) + log1pf(expf(-fabsf(logit))));
    default:
      return logit;
  }
}

// One token on one warp: writes ids/weights of `token` (and its shared slots / scale).
// Every warp of the CTA runs this (warps past the batch on the last token, writing nothing), so
// the warp shuffles sit in uniform control flow: called under `if (token < T)` they compiled to
// divergent-collective fallbacks that doubled the code. The runtime-bound loops are not unrolled
// (small code); what shortens the token's chain is fewer warp reductions per pick.
// bias: this lane's correction bias values (expert lane + 32 i; zeros without a bias), loaded by
// the caller before its PDL wait. local_ids: null, or where the ids are also written at the same
// index (token * slots + slot) for the dispatch of a one-CTA grid. pick: null, or where lane j
// gets pick j's expert id (lanes >= top_k: unspecified), written or not.
template <int kPer>
__device__ __forceinline__ void route_token(const RoutingParams& p, int token, int lane,
                                            bool write, const float (&bias)[kPer],
                                            int* local_ids, int* pick = nullptr) {
  static_assert(kPer >= 1 && kPer <= kPerLane, "kPer: experts per lane, 1..16");
  const RoutingConfig& cfg = p.cfg;
  const int num_e = cfg.num_experts;
  const int slots = cfg.top_k + cfg.shared_slots;
  const float* row = p.logits + static_cast<size_t>(token) * cfg.logits_columns;

  // scores and keys
  float score[kPer];
  float key[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    score[i] = e < num_e ? row[e] : neg_inf();
  }
  if (cfg.scoring == Scoring::Softmax) {
    float mx = neg_inf();
#pragma unroll
    for (int i = 0; i < kPer; ++i) mx = fmaxf(mx, score[i]);
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      score[i] = e < num_e ? expf(score[i] - mx) : 0.0f;
      sum += score[i];
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < kPer; ++i) score[i] = score[i] / sum;
  } else if (cfg.scoring != Scoring::SoftmaxOfTopk) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) score[i] = score_of(cfg.scoring, score[i]);
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    key[i] = e < num_e ? score[i] + bias[i] : neg_inf();
  }
  if (threadIdx.x == 0) trace_mark(p.trace, kTraceRoutingKeyed);

  // grouped top-k: keep the topk_group best groups, -inf the rest
  if (cfg.n_group > 1) {
    const int per_group = num_e / cfg.n_group;
    int group[kPer];  // one division per element, not one per element and group
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      group[i] = e < num_e ? e / per_group : -1;
    }
    float my_group_score = neg_inf();  // lane g holds group g's score
    if (per_group == 32) {
      // group g is register g of every lane (DeepSeek-V3: 8 x 32): each group's top two by
      // warp reductions. why no `g < n_group` test around the body: registers past the groups
      // hold -inf keys (experts past E), so computing them is harmless, and without a branch
      // per group the compiler can interleave the groups' independent reduction chains (with
      // the kept groups chosen by rank below: a shorter group stage at DeepSeek-V3 T=1).
      const bool top2 = cfg.group_score_top2_sum;
#pragma unroll
      for (int g = 0; g < kPer; ++g) {
        const uint32_t o = orderable(key[g]);
        const uint32_t t1 = __reduce_max_sync(0xffffffffu, o);
        // the second largest: the maximum again if two lanes hold it
        const bool twice = __popc(__ballot_sync(0xffffffffu, o == t1)) > 1;
        const uint32_t t2 = twice ? t1 : __reduce_max_sync(0xffffffffu, o == t1 ? 0u : o);
        const float gs = top2 ? from_orderable(t1) + from_orderable(t2) : from_orderable(t1);
        if (lane == g && g < cfg.n_group) my_group_score = gs;
      }
    } else {
#pragma unroll 1
      for (int g = 0; g < cfg.n_group; ++g) {
        float t1 = neg_inf(), t2 = neg_inf();
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          if (group[i] == g) {
            const float v = key[i];
            if (v > t1) {
              t2 = t1;
              t1 = v;
            } else if (v > t2) {
              t2 = v;
            }
          }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          const float o1 = __shfl_xor_sync(0xffffffffu, t1, off);
          const float o2 = __shfl_xor_sync(0xffffffffu, t2, off);
          const float hi = fmaxf(t1, o1);
          const float lo = fmaxf(fminf(t1, o1), fmaxf(t2, o2));
          t1 = hi;
          t2 = lo;
        }
        const float gs = cfg.group_score_top2_sum ? t1 + t2 : t1;
        if (lane == g) my_group_score = gs;
      }
    }
    // The topk_group best groups (ties -> lower group), by rank rather than topk_group picks in
    // a row: group g is kept when fewer than topk_group groups beat it (a higher score, or the
    // same score and a lower index); the n_group (<= 32) scores are compared side by side.
    const uint32_t mine = orderable(my_group_score);
    int beaten_by = 0;
#pragma unroll 1
    for (int h = 0; h < cfg.n_group; ++h) {
      const uint32_t other = __shfl_sync(0xffffffffu, mine, h);
      beaten_by += other > mine || (other == mine && h < lane);
    }
    const uint32_t kept =
        __ballot_sync(0xffffffffu, lane < cfg.n_group && beaten_by < cfg.topk_group);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (group[i] >= 0 && !((kept >> group[i]) & 1u)) key[i] = neg_inf();
    }
    if (threadIdx.x == 0) trace_mark(p.trace, kTraceRoutingGrouped);
  }

  // top-k selection; lane j keeps pick j. Each round: this lane's best untaken key (ascending i:
  // equal keys keep the lower id), then the warp's pick; the winner's lane marks it taken.
  uint32_t ok[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) ok[i] = lane + 32 * i < num_e ? orderable(key[i]) : 0u;
  uint32_t taken = 0;
  int my_id = 0;
  float my_score = 0.0f;
#pragma unroll 1
  for (int j = 0; j < cfg.top_k; ++j) {
    uint32_t best = 0;
    int best_i = 0;
    float best_s = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (!((taken >> i) & 1u) && ok[i] > best) {
        best = ok[i];
        best_i = i;
        best_s = score[i];
      }
    }
    const int id = warp_pick(best, lane + 32 * best_i);
    const float s = __shfl_sync(0xffffffffu, best_s, id & 31);
    if ((id & 31) == lane) taken |= 1u << (id >> 5);
    if (lane == j) {
      my_id = id;
      my_score = s;
    }
  }

  if (threadIdx.x == 0) trace_mark(p.trace, kTraceRoutingPicked);

  // weights, in slot order
  const bool is_pick = lane < cfg.top_k;
  float w = is_pick ? my_score : 0.0f;
  if (cfg.scoring == Scoring::SoftmaxOfTopk) {
    const float top = __shfl_sync(0xffffffffu, my_score, 0);  // pick 0 has the largest logit
    w = is_pick ? expf(my_score - top) : 0.0f;
    float denom = 0.0f;
#pragma unroll 1
    for (int j = 0; j < cfg.top_k; ++j) denom += __shfl_sync(0xffffffffu, w, j);
    w = w / denom;
  }
  if (cfg.renormalize) {
    float sum = 0.0f;
#pragma unroll 1
    for (int j = 0; j < cfg.top_k; ++j) sum += __shfl_sync(0xffffffffu, w, j);
    w = w / (sum + 1e-20f);
  }
  w *= cfg.routed_scaling_factor;

  int32_t* ids = p.ids + static_cast<size_t>(token) * slots;
  float* weights = p.weights + static_cast<size_t>(token) * slots;
  if (pick != nullptr) *pick = my_id;
  if (!write) return;
  if (is_pick) {
    ids[lane] = my_id;
    weights[lane] = w;
    if (local_ids != nullptr) local_ids[token * slots + lane] = my_id;
  }
  if (cfg.shared_kind != SharedKind::None) {
    const float scale =
        cfg.shared_kind == SharedKind::Gated ? 1.0f / (1.0f + expf(-row[num_e])) : 1.0f;
    if (lane >= cfg.top_k && lane < slots) {
      ids[lane] = num_e + (lane - cfg.top_k);
      weights[lane] = scale;
      if (local_ids != nullptr) local_ids[token * slots + lane] = num_e + (lane - cfg.top_k);
    }
    if (lane == 0 && p.shared_scale != nullptr) p.shared_scale[token] = scale;
  }
}

// This lane's correction bias values (expert lane + 32 i; zeros without a bias), route_token's
// `bias`.
template <int kPer>
__device__ __forceinline__ void load_correction_bias(const RoutingParams& p, int lane,
                                                     float (&bias)[kPer]) {
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    bias[i] = p.cfg.has_correction_bias && e < p.cfg.num_experts ? p.correction_bias[e] : 0.0f;
  }
}

// blockDim.x: a multiple of 32, at most kRoutingThreads; a multi-CTA grid uses kRoutingThreads.
template <int kPer>
__global__ void __launch_bounds__(kRoutingThreads) routing_kernel(const RoutingParams p) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int token = blockIdx.x * kRoutingWarps + warp;
  // PDL: the logits come from the router GEMM just before; the gate/up kernel after us may
  // become resident now and wait for our completion
  if (threadIdx.x == 0) trace_mark(p.trace, kTraceRoutingStart);
  // The correction bias is a weight (no earlier kernel writes it): loaded before the wait, so
  // that its round trip (from HBM: the expert weights streamed since the layer's last use evict
  // it) overlaps the router GEMM instead of following the logits' in the token's chain.
  float bias[kPer];
  load_correction_bias<kPer>(p, lane, bias);
  pdl_wait();
  pdl_launch_dependents();
  if (threadIdx.x == 0) trace_mark(p.trace, kTraceRoutingWaited);
  // A one-CTA grid (T <= 16) keeps its ids in shared memory too, so that its dispatch reads
  // them there, not back from L2 (two L2 round trips on the path to the gate/up kernel's wait).
  __shared__ int local_ids[kRoutingWarps * 32];
  route_token<kPer>(p, token < p.tokens ? token : p.tokens - 1, lane, token < p.tokens, bias,
                    gridDim.x == 1 ? local_ids : nullptr);
  if (threadIdx.x == 0) trace_mark(p.trace, kTraceRoutingRouted);
  if (!p.dispatch) return;

  // The last CTA to finish sees every token's ids and builds the dispatch lists. A grid of one
  // CTA (T <= 16) is its own last CTA: no counter round trip.
  __shared__ bool is_last;
  __threadfence();
  __syncthreads();
  if (gridDim.x == 1) {
    if (p.tokens * (p.cfg.top_k + p.cfg.shared_slots) <= 32) {
      align_detail::align_small(p, local_ids);
    } else {
      align_detail::align_block(p, local_ids);
    }
    if (threadIdx.x == 0) trace_mark(p.trace, kTraceRoutingEnd);
    return;
  }
  if (threadIdx.x == 0) {
    const int done = atomicAdd(&p.counters->routing_done, 1);
    is_last = done == static_cast<int>(gridDim.x) - 1;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  align_detail::align_block(p, nullptr);
  if (threadIdx.x == 0) trace_mark(p.trace, kTraceRoutingEnd);
}

}  // namespace moekit::cuda::routing_detail

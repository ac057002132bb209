// router_gemm_dot: the dot-product router GEMM for the smallest M (decode).
//
// logits[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]); x bf16 [M, K] row-major, w bf16 or fp32
// [N, K] row-major, fp32 out [M, N].
// Grid: (ceil(N / kTileN) * split, ceil(M / kTileM)), clusters of `split` CTAs along x (split =
// the config's split_k, 1, 2, 4 or 8); cluster c computes columns c*kTileN.. for tokens
// by*kTileM.., all kTileM tokens in one pass over the weights, so at M <= kTileM each weight byte
// is read once. The K range (in 8-element vectors) is cut into `split` contiguous chunks, one per
// CTA of the cluster. why split: at decode M the plain grid has N / kTileN CTAs (~1 per SM) and
// each thread streams several vectors in turn; split-K puts 2-8 CTAs on each SM, each with all its
// loads issued before its first FMA, so more bytes are in flight per SM and the tail is shorter.
// Within a CTA, blockDim (64, 128 or 256) threads split the chunk: thread i takes vectors
// i, i + blockDim, ... (16-byte loads of bf16 weights and of x, two for fp32 weights), kUnroll
// vectors in flight per column before the first FMA. Reduction: warp shuffle (xor tree), then the
// warps' partials summed in warp order in shared memory, then (split > 1) CTA rank 0 sums the
// cluster's CTA partials in rank order through distributed shared memory, so the result is
// deterministic.
// Preconditions (checked by the op): K % 8 == 0, x and w 16-byte aligned, blockDim <= 256.
// Numerics: fp32 FMA accumulation of exact bf16 (or fp32) products; NaN/Inf propagate (the layer
// rejects non-finite inputs before this runs).
// PDL: the first weight vectors are loaded before griddepcontrol.wait (weights are never written
// by the previous kernel); x is read and out written only after it, and the next kernel is
// allowed to launch right after it (griddep_wait_then_trigger).
#pragma once

#include <cooperative_groups.h>

#include "router_gemm_common.cuh"

namespace moekit::cuda::router_gemm_detail {

// Eight consecutive weights along K, as loaded (raw registers), converted at use.
template <typename WT>
struct WeightVec8;

template <>
struct WeightVec8<__nv_bfloat16> {
  uint4 r;
  __device__ __forceinline__ void load(const __nv_bfloat16* p) { r = load_stream_16(p); }
  __device__ __forceinline__ void zero() { r = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ float at(int i) const { return bf16_at(r, i); }
};

template <>
struct WeightVec8<float> {
  uint4 r0, r1;
  __device__ __forceinline__ void load(const float* p) {
    r0 = load_stream_16(p);
    r1 = load_stream_16(p + 4);
  }
  __device__ __forceinline__ void zero() { r0 = r1 = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ float at(int i) const {
    return __uint_as_float(word(i < 4 ? r0 : r1, i & 3));
  }
};

// WT: weight type (__nv_bfloat16 or float). kTileN: columns per CTA. kTileM: tokens per pass.
template <typename WT, int kTileN, int kTileM>
__global__ void __launch_bounds__(256) router_gemm_dot_kernel(RouterGemmArgs a) {
  static_assert(kTileN >= 1 && kTileN <= 2, "kTileN: 1 or 2 columns per CTA");
  static_assert(kTileM >= 1 && kTileM <= 8, "kTileM: 1..8 tokens per pass");
  constexpr int kMaxWarps = 8;
  // why: 4 vectors per column in flight hide HBM latency; with 8 tokens the x registers
  // (kUnroll * kTileM * 4 words) would crowd out occupancy, so halve it.
  constexpr int kUnroll = kTileM >= 8 ? 2 : 4;

  const int split = a.split;  // == cluster size along x
  const int rank = static_cast<int>(blockIdx.x) % split;
  const int n0 = (static_cast<int>(blockIdx.x) / split) * kTileN;
  const int m0 = blockIdx.y * kTileM;
  const int nvec_all = a.k / 8;
  const int chunk = (nvec_all + split - 1) / split;
  const int v_begin = rank * chunk;
  // why min/max: with K / 8 < split * chunk the last CTAs get an empty range (they add zeros)
  const int nvec = max(v_begin, min(nvec_all, v_begin + chunk));
  const WT* w = static_cast<const WT*>(a.w);
  if (threadIdx.x == 0) trace_mark(a.trace, kTraceRouterStart);

  float acc[kTileN][kTileM];
#pragma unroll
  for (int c = 0; c < kTileN; ++c)
#pragma unroll
    for (int t = 0; t < kTileM; ++t) acc[c][t] = 0.0f;

  bool waited = false;
  for (int v0 = v_begin + static_cast<int>(threadIdx.x); v0 < nvec; v0 += kUnroll * blockDim.x) {
    // load weights (streamed once)
    WeightVec8<WT> wv[kUnroll][kTileN];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + u * blockDim.x;
#pragma unroll
      for (int c = 0; c < kTileN; ++c) {
        if (v < nvec && n0 + c < a.n) {
          wv[u][c].load(w + static_cast<size_t>(n0 + c) * a.k + static_cast<size_t>(v) * 8);
        } else {
          wv[u][c].zero();
        }
      }
    }
    if (!waited) {
      griddep_wait_then_trigger(a.trace);
      waited = true;
    }
    // load activations (shared by all CTAs: cached)
    uint4 xv[kUnroll][kTileM];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + u * blockDim.x;
#pragma unroll
      for (int t = 0; t < kTileM; ++t) {
        xv[u][t] = (v < nvec && m0 + t < a.m)
                       ? load_16(a.x + static_cast<size_t>(m0 + t) * a.k + static_cast<size_t>(v) * 8)
                       : make_uint4(0, 0, 0, 0);
      }
    }
    // multiply-accumulate
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int t = 0; t < kTileM; ++t)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float xf = bf16_at(xv[u][t], i);
#pragma unroll
          for (int c = 0; c < kTileN; ++c) acc[c][t] = fmaf(xf, wv[u][c].at(i), acc[c][t]);
        }
  }
  if (!waited) griddep_wait_then_trigger(a.trace);
  if (threadIdx.x == 0) trace_mark(a.trace, kTraceRouterSummed);

  // reduce within each warp
#pragma unroll
  for (int c = 0; c < kTileN; ++c)
#pragma unroll
    for (int t = 0; t < kTileM; ++t)
#pragma unroll
      for (int off = 16; off > 0; off /= 2)
        acc[c][t] += __shfl_xor_sync(0xffffffffu, acc[c][t], off);

  // reduce across warps, in warp order
  __shared__ float partial[kMaxWarps][kTileN * kTileM];
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int c = 0; c < kTileN; ++c)
#pragma unroll
      for (int t = 0; t < kTileM; ++t) partial[warp][c * kTileM + t] = acc[c][t];
  }
  __syncthreads();

  // store (split == 1) or publish this CTA's sums to the cluster
  __shared__ float cta_sum[kTileN * kTileM];
  const int c = threadIdx.x / kTileM;
  const int t = threadIdx.x % kTileM;
  const int col = n0 + c;
  const int tok = m0 + t;
  const bool owner = threadIdx.x < kTileN * kTileM;
  if (owner) {
    float s = 0.0f;
    for (int wi = 0; wi < static_cast<int>(blockDim.x / 32); ++wi) s += partial[wi][threadIdx.x];
    if (split == 1) {
      if (col < a.n && tok < a.m) {
        if (a.bias != nullptr) s += a.bias[col];
        a.out[static_cast<size_t>(tok) * a.n + col] = s;
      }
    } else {
      cta_sum[threadIdx.x] = s;
    }
  }
  if (threadIdx.x == 0) trace_mark(a.trace, kTraceRouterEnd);
  if (split == 1) return;  // uniform over the grid: every CTA of a cluster takes the same path

  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every CTA's sums are written
  if (rank == 0 && owner && col < a.n && tok < a.m) {
    float s = 0.0f;
    for (int q = 0; q < split; ++q) s += cluster.map_shared_rank(cta_sum, q)[threadIdx.x];
    if (a.bias != nullptr) s += a.bias[col];
    a.out[static_cast<size_t>(tok) * a.n + col] = s;
  }
  cluster.sync();  // why: keep this CTA's shared memory alive until rank 0 has read it
}

}  // namespace moekit::cuda::router_gemm_detail

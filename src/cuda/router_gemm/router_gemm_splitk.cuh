// router_gemm_splitk: bf16 tensor-core router GEMM, K split across warps and a CTA cluster.
//
// logits[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]); x bf16 [M, K], w bf16 [N, K], fp32 out.
// "Swap AB": experts are the mma's M side (16 rows), tokens its N side (8 columns), because
// decode has few tokens and many experts. mma.sync m16n8k16 row.col, A = w rows, B = x rows.
// Grid: (split_k, ceil(N / kTileN), ceil(M / kTileM)), clusters of split_k CTAs along x. All
// warps of a cluster work on the same kTileN x kTileM output tile; the K range, in 32-wide
// chunks, is cut into split_k * warps contiguous slices, one per warp.
// Fragments straight from global memory, 16-byte loads: lane (g = lane / 4, t = lane % 4) loads
// k = 32c + 8t .. 32c + 8t + 7 of expert rows g and g + 8 and of token row g. The mma's k slots
// are a permutation of those k (word 2h of the vector feeds slots 2t, 2t+1 of half h, word 2h+1
// slots 2t+8, 2t+9) and A and B use the same one, so the dot products are the true ones; no
// shared-memory staging or ldmatrix is needed because no element is used by two warps.
// Reduction, deterministic: warps' fragments -> shared memory -> summed in warp order; then, with
// split_k > 1, each CTA of the cluster sums a share of the tile over the cluster's CTAs in rank
// order through distributed shared memory (cluster barrier before and after), adds the bias and
// stores; with split_k == 1 the CTA stores directly.
// Preconditions (checked by the op): K % 8 == 0, x and w 16-byte aligned, blockDim 128 or 256,
// gridDim.x == cluster size. Rows past N, tokens past M and K past K load zeros.
// Numerics: exact bf16 products, fp32 accumulation in the tensor cores and in the reductions.
// PDL: weight fragments of the first chunks are loaded before griddepcontrol.wait; the next
// kernel may launch right after the wait (griddep_wait_then_trigger).
#pragma once

#include <cooperative_groups.h>

#include "router_gemm_common.cuh"

namespace moekit::cuda::router_gemm_detail {

__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a1,
                                                  uint32_t a2, uint32_t a3, uint32_t b0,
                                                  uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// kTileN: experts per warp and CTA (16 or 32: one or two mma rows).
// kTileM: tokens per warp and CTA (8, 16 or 32: one to four mma columns).
template <int kTileN, int kTileM>
__global__ void __launch_bounds__(256) router_gemm_splitk_kernel(RouterGemmArgs a) {
  static_assert(kTileN == 16 || kTileN == 32, "kTileN: 16 or 32 experts");
  static_assert(kTileM == 8 || kTileM == 16 || kTileM == 32, "kTileM: 8, 16 or 32 tokens");
  constexpr int kRowTiles = kTileN / 16;
  constexpr int kColTiles = kTileM / 8;
  constexpr int kMaxWarps = 8;
  // why: several 32-wide K chunks in flight per warp hide HBM latency; fewer when each chunk
  // already holds many loads (registers: kUnroll * (2 * kRowTiles + kColTiles) * 4 words).
  constexpr int kUnroll = (2 * kRowTiles + kColTiles) <= 4 ? 4 : 2;
  constexpr int kLd = kTileN + 1;  // why +1: fragment stores of lanes t=0..3 hit distinct banks

  namespace cg = cooperative_groups;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int split = gridDim.x;
  if (threadIdx.x == 0) trace_mark(a.trace, kTraceRouterStart);
  const int rank = blockIdx.x;  // == rank in the cluster: cluster dims are (gridDim.x, 1, 1)
  const int n0 = blockIdx.y * kTileN;
  const int m0 = blockIdx.z * kTileM;

  // this warp's K slice, in 32-wide chunks
  const int chunks = (a.k + 31) / 32;
  const int slices = split * warps;
  const int per_slice = (chunks + slices - 1) / slices;
  const int c_begin = (rank * warps + warp) * per_slice;
  const int c_end = min(chunks, c_begin + per_slice);

  const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(a.w);
  const __nv_bfloat16* w_row[kRowTiles][2];
  bool w_ok[kRowTiles][2];
#pragma unroll
  for (int i = 0; i < kRowTiles; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = n0 + i * 16 + h * 8 + g;
      w_ok[i][h] = e < a.n;
      w_row[i][h] = w + static_cast<size_t>(w_ok[i][h] ? e : 0) * a.k;
    }
  const __nv_bfloat16* x_row[kColTiles];
  bool x_ok[kColTiles];
#pragma unroll
  for (int j = 0; j < kColTiles; ++j) {
    const int tok = m0 + j * 8 + g;
    x_ok[j] = tok < a.m;
    x_row[j] = a.x + static_cast<size_t>(x_ok[j] ? tok : 0) * a.k;
  }

  float acc[kRowTiles][kColTiles][4];
#pragma unroll
  for (int i = 0; i < kRowTiles; ++i)
#pragma unroll
    for (int j = 0; j < kColTiles; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

  bool waited = false;
  for (int c0 = c_begin; c0 < c_end; c0 += kUnroll) {
    // load weight fragments (streamed once)
    uint4 wa[kUnroll][kRowTiles][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kk = (c0 + u) * 32 + 8 * t;
      const bool in = c0 + u < c_end && kk < a.k;
#pragma unroll
      for (int i = 0; i < kRowTiles; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          wa[u][i][h] = (in && w_ok[i][h]) ? load_stream_16(w_row[i][h] + kk) : make_uint4(0, 0, 0, 0);
    }
    if (!waited) {
      griddep_wait_then_trigger(a.trace);
      waited = true;
    }
    // load activation fragments
    uint4 xb[kUnroll][kColTiles];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kk = (c0 + u) * 32 + 8 * t;
      const bool in = c0 + u < c_end && kk < a.k;
#pragma unroll
      for (int j = 0; j < kColTiles; ++j)
        xb[u][j] = (in && x_ok[j]) ? load_16(x_row[j] + kk) : make_uint4(0, 0, 0, 0);
    }
    // two k16 mma steps per 32-wide chunk
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int hk = 0; hk < 2; ++hk)
#pragma unroll
        for (int i = 0; i < kRowTiles; ++i)
#pragma unroll
          for (int j = 0; j < kColTiles; ++j)
            mma_bf16_m16n8k16(acc[i][j], word(wa[u][i][0], 2 * hk), word(wa[u][i][1], 2 * hk),
                              word(wa[u][i][0], 2 * hk + 1), word(wa[u][i][1], 2 * hk + 1),
                              word(xb[u][j], 2 * hk), word(xb[u][j], 2 * hk + 1));
  }
  if (!waited) griddep_wait_then_trigger(a.trace);
  if (threadIdx.x == 0) trace_mark(a.trace, kTraceRouterSummed);

  // warps' fragments -> shared memory: D[g (+8)][2t, 2t+1] = (expert, token)
  __shared__ float partial[kMaxWarps][kTileM][kLd];
  __shared__ float tile[kTileM * kTileN];
#pragma unroll
  for (int i = 0; i < kRowTiles; ++i)
#pragma unroll
    for (int j = 0; j < kColTiles; ++j) {
      const int er = i * 16 + g;
      const int tc = j * 8 + 2 * t;
      partial[warp][tc][er] = acc[i][j][0];
      partial[warp][tc + 1][er] = acc[i][j][1];
      partial[warp][tc][er + 8] = acc[i][j][2];
      partial[warp][tc + 1][er + 8] = acc[i][j][3];
    }
  __syncthreads();

  // sum over warps in warp order; element e = (token tc, expert er), experts fastest for stores
  for (int e = threadIdx.x; e < kTileM * kTileN; e += blockDim.x) {
    const int tc = e / kTileN;
    const int er = e % kTileN;
    float s = 0.0f;
    for (int wi = 0; wi < warps; ++wi) s += partial[wi][tc][er];
    if (split == 1) {
      const int col = n0 + er;
      const int tok = m0 + tc;
      if (col < a.n && tok < a.m) {
        if (a.bias != nullptr) s += a.bias[col];
        a.out[static_cast<size_t>(tok) * a.n + col] = s;
      }
    } else {
      tile[e] = s;
    }
  }
  if (threadIdx.x == 0) trace_mark(a.trace, kTraceRouterEnd);
  if (split == 1) return;

  // sum over the cluster's CTAs in rank order through distributed shared memory
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every CTA's tile is written
  for (int e = rank * blockDim.x + threadIdx.x; e < kTileM * kTileN; e += split * blockDim.x) {
    const int tc = e / kTileN;
    const int er = e % kTileN;
    const int col = n0 + er;
    const int tok = m0 + tc;
    float s = 0.0f;
    for (int q = 0; q < split; ++q) s += cluster.map_shared_rank(tile, q)[e];
    if (col < a.n && tok < a.m) {
      if (a.bias != nullptr) s += a.bias[col];
      a.out[static_cast<size_t>(tok) * a.n + col] = s;
    }
  }
  cluster.sync();  // why: keep this CTA's shared memory alive until every peer has read it
}

}  // namespace moekit::cuda::router_gemm_detail

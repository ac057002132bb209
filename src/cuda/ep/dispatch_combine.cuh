// The expert-parallel dispatch and combine kernels (parameters: dispatch_combine.h).
//
// ep_dispatch_pack: grid = one CTA per destination rank, kPackThreads threads. The CTA scans the
// source's tokens in chunks of kPackThreads (a block-wide exclusive sum of "has a pair on d"),
// which gives each flagged token its packed row in token order; then the CTA copies the flagged
// rows (16-byte vectors), their k ids and weights, and fills the rows [count, fill_rows) with an
// id outside d's slice. Those rows' x is not written: the destination drops their pairs and never
// reads it, though the transport moves the whole fixed block. One CTA per destination keeps the
// order deterministic without atomics; decode batches are small, and the copies are
// bandwidth-bound anyway.
//
// ep_combine: one thread per 8 output columns (one 16-byte vector) of one token; the terms are
// summed in their given order in fp32 and the sum rounded to bf16 once.
#pragma once

#include <cuda_bf16.h>

#include <cub/block/block_scan.cuh>

#include "cuda/ep/dispatch_combine.h"

namespace moekit::cuda {

inline constexpr int kPackThreads = 256;
inline constexpr int kCombineThreads = 256;
inline constexpr int kBf16PerVector = 8;  // 16 bytes

__global__ void __launch_bounds__(kPackThreads) ep_dispatch_pack(const EpPackParams p) {
  const EpPackDest& d = p.dests[blockIdx.x];
  using Scan = cub::BlockScan<int, kPackThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int base;
  if (threadIdx.x == 0) base = 0;
  __syncthreads();

  // positions: the flagged tokens' packed rows, in token order
  for (int t0 = 0; t0 < p.tokens; t0 += kPackThreads) {
    const int t = t0 + static_cast<int>(threadIdx.x);
    int flag = 0;
    if (t < p.tokens) {
      for (int j = 0; j < p.top_k; ++j) {
        const int id = p.topk_ids[static_cast<size_t>(t) * p.top_k + j];
        flag |= (id >= d.slice_first && id < d.slice_first + d.slice_count) ? 1 : 0;
      }
    }
    int before = 0, total = 0;
    Scan(scan_storage).ExclusiveSum(flag, before, total);
    if (t < p.tokens) d.pos[t] = flag ? base + before : -1;
    __syncthreads();  // why: base is read above before thread 0 moves it; the storage is reused
    if (threadIdx.x == 0) base += total;
    __syncthreads();
  }
  const int count = base;
  if (threadIdx.x == 0) *d.count = count;

  // rows (pos, written by this CTA, is visible after the barrier above)
  const int vectors = p.hidden / kBf16PerVector;
  const uint4* x = reinterpret_cast<const uint4*>(p.x);
  uint4* out = reinterpret_cast<uint4*>(d.send_x);
  for (size_t i = threadIdx.x; i < static_cast<size_t>(p.tokens) * vectors; i += kPackThreads) {
    const size_t t = i / vectors, v = i % vectors;
    const int row = d.pos[t];
    if (row >= 0) out[static_cast<size_t>(row) * vectors + v] = x[i];
  }
  // the rows' ids and weights
  for (int i = threadIdx.x; i < p.tokens * p.top_k; i += kPackThreads) {
    const int t = i / p.top_k, j = i % p.top_k;
    const int row = d.pos[t];
    if (row >= 0) {
      d.send_ids[static_cast<size_t>(row) * p.top_k + j] = p.topk_ids[i];
      d.send_weights[static_cast<size_t>(row) * p.top_k + j] = p.topk_weights[i];
    }
  }
  // the fixed block's unused rows: pairs the destination's slice drops
  for (int i = count * p.top_k + threadIdx.x; i < p.fill_rows * p.top_k; i += kPackThreads) {
    d.send_ids[i] = d.sentinel;
    d.send_weights[i] = 0.0f;
  }
}

__global__ void __launch_bounds__(kCombineThreads) ep_combine(const EpCombineParams p) {
  const int vectors = p.hidden / kBf16PerVector;
  const size_t i = static_cast<size_t>(blockIdx.x) * kCombineThreads + threadIdx.x;
  if (i >= static_cast<size_t>(p.tokens) * vectors) return;
  const int t = static_cast<int>(i / vectors), v = static_cast<int>(i % vectors);
  float acc[kBf16PerVector] = {};
  for (int k = 0; k < p.num_terms; ++k) {
    const EpCombineTerm& term = p.terms[k];
    const int row = term.pos == nullptr ? t : term.pos[t];
    if (row < 0) continue;
    const uint4 raw =
        reinterpret_cast<const uint4*>(term.rows)[static_cast<size_t>(row) * vectors + v];
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
    for (int e = 0; e < kBf16PerVector; ++e) acc[e] += __bfloat162float(h[e]);
  }
  uint4 packed;
  __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(&packed);
#pragma unroll
  for (int e = 0; e < kBf16PerVector; ++e) o[e] = __float2bfloat16_rn(acc[e]);
  reinterpret_cast<uint4*>(p.y)[i] = packed;
}

}  // namespace moekit::cuda

// The expert-parallel dispatch and combine kernels (parameters: dispatch_combine.h).
//
// ep_dispatch_pack: grid = (token groups of kPackTokens, destination ranks), kPackThreads
// threads. A CTA counts the tokens before its group that have a pair on its destination (a block
// reduction over their ids), scans its own group's flags (which gives each flagged token its packed
// row in token order, as every CTA computes it alike: deterministic without atomics), then copies
// its flagged rows (16-byte vectors), their k ids and weights. The last group's CTA writes the
// count and fills the rows [count, fill_rows) with an id outside d's slice. Those rows' x is not
// written: the destination drops their pairs and never reads it, though the transport moves the
// whole fixed block. Many CTAs per destination keep the copy at bandwidth for prefill batches.
//
// ep_combine: one thread per 8 output columns (one 16-byte vector) of one token; the terms are
// summed in their given order in fp32 and the sum rounded to bf16 once.
#pragma once

#include <cuda_bf16.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "cuda/ep/dispatch_combine.h"

namespace moekit::cuda {

inline constexpr int kPackThreads = 256;
inline constexpr int kPackTokens = 8;  // tokens per CTA of the pack
inline constexpr int kCombineThreads = 256;
inline constexpr int kBf16PerVector = 8;  // 16 bytes

__device__ inline int ep_has_pair(const EpPackParams& p, const EpPackDest& d, int t) {
  int flag = 0;
  for (int j = 0; j < p.top_k; ++j) {
    const int id = p.topk_ids[static_cast<size_t>(t) * p.top_k + j];
    flag |= (id >= d.slice_first && id < d.slice_first + d.slice_count) ? 1 : 0;
  }
  return flag;
}

__global__ void __launch_bounds__(kPackThreads) ep_dispatch_pack(const EpPackParams p) {
  static_assert(kPackTokens <= kPackThreads, "a group's flags are scanned one token a thread");
  const EpPackDest& d = p.dests[blockIdx.y];
  const int t_begin = static_cast<int>(blockIdx.x) * kPackTokens;
  const int t_end = min(p.tokens, t_begin + kPackTokens);
  const bool last = blockIdx.x == gridDim.x - 1;
  using Reduce = cub::BlockReduce<int, kPackThreads>;
  using Scan = cub::BlockScan<int, kPackThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } storage;
  __shared__ int base;
  __shared__ int row_of[kPackTokens];

  // the flagged tokens before this group
  int mine = 0;
  for (int t = threadIdx.x; t < t_begin; t += kPackThreads) mine += ep_has_pair(p, d, t);
  const int before = Reduce(storage.reduce).Sum(mine);  // (thread 0's)
  if (threadIdx.x == 0) base = before;
  __syncthreads();  // why: base is read below; the storage is reused by the scan

  // this group's packed rows
  const int t = t_begin + static_cast<int>(threadIdx.x);
  const bool in_group = threadIdx.x < kPackTokens && t < t_end;
  const int flag = in_group ? ep_has_pair(p, d, t) : 0;
  int excl = 0, total = 0;
  Scan(storage.scan).ExclusiveSum(flag, excl, total);
  if (in_group) {
    const int row = flag ? base + excl : -1;
    d.pos[t] = row;
    row_of[threadIdx.x] = row;
  }
  __syncthreads();
  const int count = base + total;  // all flagged tokens up to this group's end
  if (last && threadIdx.x == 0) *d.count = count;

  // rows
  const int vectors = p.hidden / kBf16PerVector, n = t_end - t_begin;
  const uint4* x = reinterpret_cast<const uint4*>(p.x) + static_cast<size_t>(t_begin) * vectors;
  uint4* out = reinterpret_cast<uint4*>(d.send_x);
  for (int i = threadIdx.x; i < n * vectors; i += kPackThreads) {
    const int row = row_of[i / vectors];
    if (row >= 0) out[static_cast<size_t>(row) * vectors + i % vectors] = x[i];
  }
  // the rows' ids and weights
  for (int i = threadIdx.x; i < n * p.top_k; i += kPackThreads) {
    const int row = row_of[i / p.top_k], j = i % p.top_k;
    if (row >= 0) {
      const size_t src = static_cast<size_t>(t_begin) * p.top_k + i;
      d.send_ids[static_cast<size_t>(row) * p.top_k + j] = p.topk_ids[src];
      d.send_weights[static_cast<size_t>(row) * p.top_k + j] = p.topk_weights[src];
    }
  }
  // the fixed block's unused rows: pairs the destination's slice drops
  if (last) {
    for (int i = count * p.top_k + threadIdx.x; i < p.fill_rows * p.top_k; i += kPackThreads) {
      d.send_ids[i] = d.sentinel;
      d.send_weights[i] = 0.0f;
    }
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

// The prefill path's MX widening (prefill_mx.h). A block converts rounds of consecutive 16-byte
// pieces of the kernels' layout: each thread loads kPer pieces (coalesced, all in flight before
// any is used), widens them by the bulk MX kernels' bit moves and multiplies into shared memory,
// then the block stores the round's bf16 in 16-byte units in piece order, so consecutive threads
// write consecutive bytes of a row (each piece's 16 or 32 elements are one row's, contiguous).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/common/cuda_check.h"
#include "cuda/experts/experts_mx.cuh"
#include "cuda/experts/experts_mx_layout.h"
#include "cuda/prefill/prefill_mx.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

using experts_detail::mx_factors;
using experts_detail::mx_weight;
using experts_detail::MxBits;

constexpr int kThreads = 256;
constexpr int kMaxBlocksX = 4096;  // per expert; the blocks stride over its pieces

// Pieces a thread converts per round (32 KB of bf16 a block's round) and 16-byte output units
// of a piece.
template <ExpertFormat F>
struct Widen {
  static constexpr int kPer = F == ExpertFormat::Mxfp4 ? 2 : 4;
  static constexpr int kUnits = MxBits<F>::kPairs / 4;
  static constexpr int kRound = kThreads * kPer;
};

// One piece's bf16 pairs from its 16 bytes (v) and e8m0 byte (s).
template <ExpertFormat F>
__device__ __forceinline__ void widen_piece(const uint4& v, uint32_t s, uint4* out) {
  using B = MxBits<F>;
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t pairs[B::kPairs];
  uint32_t f, g;
  if (s > B::kOneStepMax) {
    mx_factors<F, true>(s, f, g);
#pragma unroll
    for (int p = 0; p < B::kPairs; ++p) pairs[p] = mx_weight<true>(mx_pair_bits(F, w, p), f, g);
  } else {
    mx_factors<F, false>(s, f, g);
#pragma unroll
    for (int p = 0; p < B::kPairs; ++p) pairs[p] = mx_weight<false>(mx_pair_bits(F, w, p), f, g);
  }
#pragma unroll
  for (int u = 0; u < B::kPairs / 4; ++u) {
    out[u] = make_uint4(pairs[4 * u], pairs[4 * u + 1], pairs[4 * u + 2], pairs[4 * u + 3]);
  }
}

template <ExpertFormat F>
__global__ void __launch_bounds__(kThreads)
    mx_widen_kernel(MxMatrices m, int first, const PrefillProblem* problems, __nv_bfloat16* dst) {
  using W = Widen<F>;
  constexpr int kElems = mx_elems_per_byte(F);
  constexpr int kScaleBytes = mx_chunk_scale_bytes(F);
  __shared__ uint4 staged[W::kRound * W::kUnits];
  __shared__ long long where[W::kRound];  // each staged piece's first element in the matrix
  const int e = first + static_cast<int>(blockIdx.y);
  if (problems != nullptr && problems[e].m == 0) return;
  const int row_bytes = m.k / kElems, chunks = mx_row_chunks(F, m.k);
  const long long tile_bytes = 16LL * row_bytes;
  const long long pieces = m.rows * static_cast<long long>(row_bytes) / 16;
  const uint8_t* packed = m.packed + e * (m.rows * static_cast<long long>(row_bytes));
  const uint8_t* scales = m.scales + e * (static_cast<long long>(chunks) * m.rows * kScaleBytes);
  __nv_bfloat16* out = dst + blockIdx.y * (static_cast<long long>(m.rows) * m.k);
  for (long long base = static_cast<long long>(blockIdx.x) * W::kRound; base < pieces;
       base += static_cast<long long>(gridDim.x) * W::kRound) {
    uint4 v[W::kPer];
    uint32_t s[W::kPer];
#pragma unroll
    for (int u = 0; u < W::kPer; ++u) {
      const int local = u * kThreads + static_cast<int>(threadIdx.x);
      const long long q = base + local;
      if (q >= pieces) break;
      // piece q: tile j, row chunk c (all but a row's last hold kMxChunkBytes), tile row i,
      // byte b of the row's chunk
      const long long o = q * 16;
      const int j = static_cast<int>(o / tile_bytes);
      const int in_tile = static_cast<int>(o - j * tile_bytes);
      const int c = in_tile / (16 * kMxChunkBytes);
      const int off = c * kMxChunkBytes;
      const int bytes = min(kMxChunkBytes, row_bytes - off);
      const int i = (in_tile - 16 * off) / bytes;
      const int b = in_tile - 16 * off - i * bytes;
      v[u] = *reinterpret_cast<const uint4*>(packed + o);
      s[u] = scales[(static_cast<long long>(j) * chunks + c) * 16 * kScaleBytes + i * kScaleBytes +
                    b * kElems / kMxGroup];
      where[local] =
          static_cast<long long>(mx_tile_row(m.gate_up, m.rows, j, i)) * m.k + (off + b) * kElems;
    }
#pragma unroll
    for (int u = 0; u < W::kPer; ++u) {
      const int local = u * kThreads + static_cast<int>(threadIdx.x);
      if (base + local >= pieces) break;
      widen_piece<F>(v[u], s[u], staged + local * W::kUnits);
    }
    __syncthreads();
    const int units =
        static_cast<int>(pieces - base < W::kRound ? pieces - base : W::kRound) * W::kUnits;
    for (int t = static_cast<int>(threadIdx.x); t < units; t += kThreads) {
      const int piece = t / W::kUnits, unit = t - piece * W::kUnits;
      *reinterpret_cast<uint4*>(out + where[piece] + unit * 8) = staged[t];
    }
    __syncthreads();
  }
}

}  // namespace

void launch_mx_widen(const MxMatrices& m, int first, int count, const PrefillProblem* problems,
                     __nv_bfloat16* dst, cudaStream_t stream) {
  MK_CHECK(m.format == ExpertFormat::Mxfp4 || m.format == ExpertFormat::Mxfp8,
           "launch_mx_widen: expected an MX format, got " << expert_format_name(m.format));
  MK_CHECK(m.rows >= 16 && m.rows % 16 == 0 && m.k >= kMxGroup && m.k % kMxGroup == 0,
           "launch_mx_widen: expected rows a multiple of 16 and k of " << kMxGroup << ", got "
                                                                       << m.rows << " x " << m.k);
  MK_CHECK(first >= 0 && count >= 1 && count <= 65535,
           "launch_mx_widen: expected first >= 0 and 1 <= count <= 65535, got " << first << ", "
                                                                                << count);
  MK_CHECK(m.packed != nullptr && m.scales != nullptr && dst != nullptr,
           "launch_mx_widen: packed, scales and dst must be set");
  const long long pieces = m.rows * static_cast<long long>(m.k / mx_elems_per_byte(m.format)) / 16;
  const int round = m.format == ExpertFormat::Mxfp4 ? Widen<ExpertFormat::Mxfp4>::kRound
                                                    : Widen<ExpertFormat::Mxfp8>::kRound;
  const dim3 grid(
      static_cast<unsigned>(std::min<long long>((pieces + round - 1) / round, kMaxBlocksX)),
      static_cast<unsigned>(count));
  if (m.format == ExpertFormat::Mxfp4) {
    mx_widen_kernel<ExpertFormat::Mxfp4><<<grid, kThreads, 0, stream>>>(m, first, problems, dst);
  } else {
    mx_widen_kernel<ExpertFormat::Mxfp8><<<grid, kThreads, 0, stream>>>(m, first, problems, dst);
  }
  MK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moekit::cuda

// The MX pieces of the bulk kernel's MX instances (plan::ExpertKernel::mx, Ring::MxWeightsOnly;
// experts_bulk_consumer_mx.inc): packed weights in the kernels' byte order
// (experts_mx_layout.h), dequantised in registers to their exact bf16 (w = bf16_rne(element x
// 2^(s - 127)), the CPU reference's rule), then the bf16 m16n8k16 mma on bf16 activations.
//
// A thread's piece is the 16 bytes of one row that the bf16 kernels' thread reads (bytes 16t..
// and 64+16t.. of a 128-byte block): 16 e4m3 or 32 e2m1 elements, all of one 32-element scale
// group. Its bf16 pairs come out in natural element order, pair i = elements (2i, 2i+1), and
// mma step j takes pairs 2j and 2j+1 of the row-g and row-g+8 pieces and of the token's
// activations at the same elements, so weights and activations meet element for element.
//
// The bit moves (mx_pair_bits, experts_mx_layout.h) make each element's value x 2^-120 (e4m3) or
// x 2^-126 (e2m1) as bf16 bits. One bf16 multiply by 2^(s - 127 + 120) (or + 126) then gives the
// weight, rounded once, whenever that factor is a bf16 normal (s <= 134 for MXFP8, s <= 128 for
// MXFP4); larger exponents take two multiplies, by 2^120 (2^126), which is exact, then by 2^(s -
// 127). The consumers choose one path for the whole warp (mma.sync is one instruction of all its
// lanes).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/experts/experts_common.cuh"
#include "cuda/experts/experts_mx_layout.h"

namespace moekit::cuda::experts_detail {

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// bf16x2 of 2^e in both halves, e in [-126, 127] (a normal).
__device__ __forceinline__ uint32_t bf16x2_pow2(int e) {
  const uint32_t b = static_cast<uint32_t>(e + 127) << 7;
  return b | (b << 16);
}

// bf16x2 of 2^(s - 127) for an e8m0 byte s < 255 (s = 0: the subnormal 2^-127).
__device__ __forceinline__ uint32_t bf16x2_e8m0(uint32_t s) {
  const uint32_t b = s == 0 ? 0x0040u : s << 7;
  return b | (b << 16);
}

// The element bias of the bit moves (values x 2^-kBias) and the largest e8m0 byte whose factor
// 2^(s - 127 + kBias) is a bf16 normal.
template <ExpertFormat F>
struct MxBits {
  static constexpr int kBias = F == ExpertFormat::Mxfp4 ? 126 : 120;
  static constexpr uint32_t kOneStepMax = 127 + 127 - kBias;
  static constexpr int kPairs = F == ExpertFormat::Mxfp4 ? 16 : 8;  // bf16 pairs of a piece
};

// The factors of an element's bits (mx_pair_bits) for e8m0 byte s: the weight is bits x f, or
// (bits x f) x g on the two-multiply path (kTwoSteps: s above kOneStepMax).
template <ExpertFormat F, bool kTwoSteps>
__device__ __forceinline__ void mx_factors(uint32_t s, uint32_t& f, uint32_t& g) {
  using B = MxBits<F>;
  if constexpr (kTwoSteps) {
    f = bf16x2_pow2(B::kBias);
    g = bf16x2_e8m0(s);
  } else {
    f = bf16x2_pow2(static_cast<int>(s) - 127 + B::kBias);
    g = 0;
  }
}

// A bf16 pair of weights from its bits and its factors (mx_factors).
template <bool kTwoSteps>
__device__ __forceinline__ uint32_t mx_weight(uint32_t bits, uint32_t f, uint32_t g) {
  const uint32_t w = mul_bf16x2(bits, f);
  return kTwoSteps ? mul_bf16x2(w, g) : w;
}

// One piece pair's mma steps: lo / hi the row-g and row-g+8 pieces with their e8m0 bytes, x the
// token's activations at the same elements (kPairs / 4 uint4). The even steps accumulate into
// ce, the odd ones into co (two independent mma chains). kTwoSteps: an exponent above
// kOneStepMax in either row (the two-multiply path).
template <ExpertFormat F, bool kTwoSteps>
__device__ __forceinline__ void mma_piece_mx_steps(float (&ce)[4], float (&co)[4], const uint4& lo,
                                                   const uint4& hi, uint32_t s_lo, uint32_t s_hi,
                                                   const uint4* x) {
  using B = MxBits<F>;
  uint32_t f_lo, f_hi, g_lo, g_hi;
  mx_factors<F, kTwoSteps>(s_lo, f_lo, g_lo);
  mx_factors<F, kTwoSteps>(s_hi, f_hi, g_hi);
  const uint32_t* xw = reinterpret_cast<const uint32_t*>(x);
  const uint32_t lw[4] = {lo.x, lo.y, lo.z, lo.w}, hw[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int j = 0; j < B::kPairs / 2; ++j) {
    mma_bf16(j % 2 == 0 ? ce : co, mx_weight<kTwoSteps>(mx_pair_bits(F, lw, 2 * j), f_lo, g_lo),
             mx_weight<kTwoSteps>(mx_pair_bits(F, hw, 2 * j), f_hi, g_hi),
             mx_weight<kTwoSteps>(mx_pair_bits(F, lw, 2 * j + 1), f_lo, g_lo),
             mx_weight<kTwoSteps>(mx_pair_bits(F, hw, 2 * j + 1), f_hi, g_hi), xw[2 * j],
             xw[2 * j + 1]);
  }
}

// A consumer warp's blocks of a stage: blocks u < live of kBlocks, each two pieces (q = 0, 1)
// of rows g and g+8 with their e8m0 bytes and the token's activations; piece q's even steps
// accumulate into c[q], its odd ones into c[2 + q] (four independent mma chains).
template <ExpertFormat F, bool kTwoSteps, int kBlocks, int kActs>
__device__ __forceinline__ void mma_blocks_mx(float (&c)[4][4], const uint4 (&lo)[kBlocks][2],
                                              const uint4 (&hi)[kBlocks][2],
                                              const uint32_t (&s_lo)[kBlocks][2],
                                              const uint32_t (&s_hi)[kBlocks][2],
                                              const uint4 (&x)[kBlocks][2][kActs], int live) {
#pragma unroll
  for (int u = 0; u < kBlocks; ++u) {
    if (u < live) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        mma_piece_mx_steps<F, kTwoSteps>(c[q], c[2 + q], lo[u][q], hi[u][q], s_lo[u][q], s_hi[u][q],
                                         x[u][q]);
      }
    }
  }
}

}  // namespace moekit::cuda::experts_detail

// The AVX-512 MX row loops, shared by mx_dot_avx512.cpp and mx_dot_avx512vbmi.cpp: one weight
// row against 1-2 tokens, summed exactly as kernels_avx512.cpp sums a bf16 row (dot_row_f32: 32
// columns a step, two accumulators, their sum; dot_row_bf16: 64 columns a step through
// vdpbf16ps, two accumulators, a 32-column tail into the first, their sum), with each step's
// weights made in registers by the caller's weight maker, of a block's codes and e8m0 byte:
//   Weights w{}                made once per call (it fetches its lookup tables); Weights::kFp4:
//                              the codes are nibbles; Weights::kBlockBytes: a block's code bytes
//   w.bf16(codes, e8m0)        the block's 32 weights as bf16 (the bf16 loop)
//   w.f32(codes, e8m0, lo, hi) the same as two vectors of 16 fp32 (the fp32 loop)
// The loops walk a row's codes and e8m0 bytes with pointers, a block a step: a column index's
// address arithmetic (halving, sign extension, the scale's shift) took as many instructions as
// making the weights.
//
// Everything here has internal linkage: the two files are compiled with different -m flags, so
// one linker-merged copy of an inline function could carry VBMI instructions into the path of a
// CPU without them.
#pragma once

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {
namespace {

// L2 prefetch this far ahead in the weight stream at 2 tokens (as kernels_avx512.cpp does).
constexpr int kPrefetchBytes = 4096;

// The loops prefetch the weight stream to L2 every 128 (MXFP4) or 64 (MXFP8) columns, written
// out in each loop. why not a helper: with the prefetch in a helper function, GCC 12 at -O2
// emitted no prefetch instruction at all (seen in the object code).

template <int J, class Weights>
void row_mx_f32(const Weights& w, const uint8_t* q, const uint8_t* s, int k, const float* const* x,
                float* out, size_t ldo) {
  __m512 a0[J], a1[J];
  for (int j = 0; j < J; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
  const uint8_t* qb = q;  // the block's codes and e8m0 byte, advanced a block a step
  const uint8_t* sb = s;
  for (int c = 0; c < k; c += 32, qb += Weights::kBlockBytes, ++sb) {
    if (Weights::kFp4 ? (c & 127) == 0 : (c & 63) == 0)
      _mm_prefetch(reinterpret_cast<const char*>(qb) + kPrefetchBytes, _MM_HINT_T1);
    __m512 w0, w1;
    w.f32(qb, *sb, w0, w1);
    for (int j = 0; j < J; ++j) {
      a0[j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[j] + c), a0[j]);
      a1[j] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[j] + c + 16), a1[j]);
    }
  }
  for (int j = 0; j < J; ++j) out[j * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(a0[j], a1[j]));
}

template <int J, class Weights>
void row_mx_bf16(const Weights& w, const uint8_t* q, const uint8_t* s, int k, const Bf16* const* x,
                 float* out, size_t ldo) {
  __m512 a0[J], a1[J];
  for (int j = 0; j < J; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
  const int k_main = k & ~63;
  const uint8_t* qb = q;  // the first block's codes and e8m0 byte, advanced two blocks a step
  const uint8_t* sb = s;
  for (int c = 0; c < k_main; c += 64, qb += 2 * Weights::kBlockBytes, sb += 2) {
    if (!Weights::kFp4 || (c & 127) == 0)
      _mm_prefetch(reinterpret_cast<const char*>(qb) + kPrefetchBytes, _MM_HINT_T1);
    const __m512bh w0 = w.bf16(qb, sb[0]);
    const __m512bh w1 = w.bf16(qb + Weights::kBlockBytes, sb[1]);
    for (int j = 0; j < J; ++j) {
      a0[j] = _mm512_dpbf16_ps(a0[j], w0, (__m512bh)_mm512_loadu_si512(x[j] + c));
      a1[j] = _mm512_dpbf16_ps(a1[j], w1, (__m512bh)_mm512_loadu_si512(x[j] + c + 32));
    }
  }
  if (k_main < k) {  // one whole block left, into a0 (dot_row_bf16's tail step)
    const __m512bh wv = w.bf16(qb, sb[0]);
    for (int j = 0; j < J; ++j)
      a0[j] = _mm512_dpbf16_ps(a0[j], wv, (__m512bh)_mm512_loadu_si512(x[j] + k_main));
  }
  for (int j = 0; j < J; ++j) out[j * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(a0[j], a1[j]));
}

// kernels.h's MxRowsF32 (X = float) and MxRowsBf16 (X = Bf16) with the weight maker Weights.
template <class Weights, typename X>
void mx_rows(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds, int rows, int k,
             const X* const* x, int n, float* out, size_t ldo) {
  const Weights w{};
  for (int r = 0; r < rows; ++r) {
    const uint8_t* qr = q + static_cast<size_t>(r) * ldq;
    const uint8_t* sr = scale + static_cast<size_t>(r) * lds;
    with_static_count<2>(n, [&](auto count) {
      if constexpr (std::is_same_v<X, Bf16>) {
        row_mx_bf16<decltype(count)::value>(w, qr, sr, k, x, out + r, ldo);
      } else {
        row_mx_f32<decltype(count)::value>(w, qr, sr, k, x, out + r, ldo);
      }
    });
  }
}

}  // namespace
}  // namespace moekit::cpu_fast::detail

#endif

// The AVX-512 MX bf16 row loop, shared by mx_dot_avx512.cpp and mx_dot_avx512vbmi.cpp: one
// weight row against 1-2 bf16 tokens, summed exactly as kernels_avx512.cpp's dot_row_bf16 sums
// a bf16 row (64 columns a step through vdpbf16ps, two accumulators, a 32-column tail into the
// first, their sum), with each step's weights made in registers by the caller's weight maker.
//
// Everything here has internal linkage: the two files are compiled with different -m flags, so
// one linker-merged copy of an inline function could carry VBMI instructions into the path of a
// CPU without them.
#pragma once

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {
namespace {

// L2 prefetch this far ahead in the weight stream at 2 tokens (as kernels_avx512.cpp does).
constexpr int kPrefetchBytes = 4096;

// Weights: w(c) returns the 32 bf16 weights of the block at column c; Weights::kFp4 says the
// codes are nibbles (the prefetch stride); w.q is the row's first code byte.
template <int J, class Weights>
void row_mx_bf16(const Weights& w, int k, const Bf16* const* x, float* out, size_t ldo) {
  __m512 a0[J], a1[J];
  for (int j = 0; j < J; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
  const int k_main = k & ~63;
  for (int c = 0; c < k_main; c += 64) {
    if (!Weights::kFp4 || (c & 127) == 0)
      _mm_prefetch(
          reinterpret_cast<const char*>(w.q + (Weights::kFp4 ? c / 2 : c)) + kPrefetchBytes,
          _MM_HINT_T1);
    const __m512bh w0 = w(c);
    const __m512bh w1 = w(c + 32);
    for (int j = 0; j < J; ++j) {
      a0[j] = _mm512_dpbf16_ps(a0[j], w0, (__m512bh)_mm512_loadu_si512(x[j] + c));
      a1[j] = _mm512_dpbf16_ps(a1[j], w1, (__m512bh)_mm512_loadu_si512(x[j] + c + 32));
    }
  }
  if (k_main < k) {  // one whole block left, into a0 (dot_row_bf16's tail step)
    const __m512bh wv = w(k_main);
    for (int j = 0; j < J; ++j)
      a0[j] = _mm512_dpbf16_ps(a0[j], wv, (__m512bh)_mm512_loadu_si512(x[j] + k_main));
  }
  for (int j = 0; j < J; ++j) out[j * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(a0[j], a1[j]));
}

// row(count, q, s, x, out, ldo) for every row, count the token count as a template constant.
template <typename X, typename Row>
void each_row(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds, int rows,
              const X* const* x, int n, float* out, size_t ldo, Row row) {
  for (int r = 0; r < rows; ++r) {
    with_static_count<2>(n, [&](auto count) {
      row(count, q + static_cast<size_t>(r) * ldq, scale + static_cast<size_t>(r) * lds, x, out + r,
          ldo);
    });
  }
}

// The bf16 rows of kernels.h's MxRowsBf16 with the weight maker Weights{row's codes, its scales}.
template <class Weights>
void mx_rows_bf16(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds, int rows, int k,
                  const Bf16* const* x, int n, float* out, size_t ldo) {
  each_row(q, ldq, scale, lds, rows, x, n, out, ldo,
           [k](auto count, auto qr, auto sr, auto xs, auto o, size_t l) {
             row_mx_bf16<decltype(count)::value>(Weights{qr, sr}, k, xs, o, l);
           });
}

}  // namespace
}  // namespace moekit::cpu_fast::detail

#endif

// AVX-512 MX rows (kernels.h dequant_mxfp4_row / dequant_mxfp8_row; compiled with the AVX-512
// flags, called only from the AVX-512 table). One 32-column block a step, its e8m0 scale one
// broadcast from mx_scale_table():
//   MXFP4  16 bytes -> 32 nibble codes in column order (low nibble first), vpermps through the
//          16 e2m1 values (the table is the LUT; its index is the code's low 4 bits);
//   MXFP8  e4m3 -> fp16 by the bit move of fp8_dequant_avx512.cpp (the value times 2^-8, exact),
//          widened, times 2^8 (exact) and then times the scale (two multiplies: one by
//          2^(s-119) would overflow for s >= 247).
// Each product is the exact fp32 of element x 2^(s-127) (reference_mx.h), rounded to bf16 with
// the integer round to nearest even of float_to_bf16, so the row equals the reference's.
#if defined(__x86_64__) || defined(__i386__)

// why: GCC 12's avx512fintrin.h seeds casts with _mm512_undefined_*(), which -Wall reports as
// uninitialised at every inlined use (a known false positive, GCC PR105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {
namespace {

// 16 fp32 -> 16 bf16 (round to nearest even), stored at out.
inline void store_bf16x16(__m512 f, Bf16* out) {
  __m512i u = _mm512_castps_si512(f);
  u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                           _mm512_and_si512(_mm512_srli_epi32(u, 16),
                                                            _mm512_set1_epi32(1))));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
}

}  // namespace

void dequant_mxfp4_row_avx512(const uint8_t* q, const uint8_t* scale, int k, Bf16* out) {
  const __m512 lut = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f,
                                    -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  const float* st = mx_scale_table();
  for (int c = 0; c < k; c += 32) {
    const __m512 s = _mm512_set1_ps(st[scale[c >> 5]]);
    // byte b -> 16-bit lane (low nibble) | (high nibble << 8): 32 bytes of codes in column order
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c / 2)));
    const __m256i codes =
        _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi16(0x0f)),
                        _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0xf0)), 4));
    const __m512i lo = _mm512_cvtepu8_epi32(_mm256_castsi256_si128(codes));
    const __m512i hi = _mm512_cvtepu8_epi32(_mm256_extracti128_si256(codes, 1));
    store_bf16x16(_mm512_mul_ps(_mm512_permutexvar_ps(lo, lut), s), out + c);
    store_bf16x16(_mm512_mul_ps(_mm512_permutexvar_ps(hi, lut), s), out + c + 16);
  }
}

void dequant_mxfp8_row_avx512(const uint8_t* q, const uint8_t* scale, int k, Bf16* out) {
  const __m256i sign = _mm256_set1_epi16(0x80), magnitude = _mm256_set1_epi16(0x7f);
  const __m512 two8 = _mm512_set1_ps(256.0f);
  const float* st = mx_scale_table();
  for (int c = 0; c < k; c += 16) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c)));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, sign), 8),
                                      _mm256_slli_epi16(_mm256_and_si256(b, magnitude), 7));
    const __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(h), two8);  // the e4m3 value, exact
    store_bf16x16(_mm512_mul_ps(v, _mm512_set1_ps(st[scale[c >> 5]])), out + c);
  }
}

}  // namespace moekit::cpu_fast::detail

#endif

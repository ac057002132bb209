// AVX-512 fp8 row dequantisation (kernels.h dequant_fp8_row; compiled with the AVX-512 flags,
// called only from the AVX-512 table and from fp8_dot_avx512.cpp for tiles its tables cannot hold).
//
// e4m3fn -> fp16 is a bit move: sign to bit 15, the 7 exponent/mantissa bits to bits 7..13. The
// fp16 it spells is the e4m3 value times 2^-8 (the exponent biases differ by 8), subnormals
// included, so vcvtph2ps widens it exactly and the 2^8 goes into the tile scale (scale * 256 is
// exact): the product is the same fp32 as fp8 x scale. bf16 rounding is the integer round to
// nearest even of float_to_bf16 (no NaN reaches it).
#if defined(__x86_64__) || defined(__i386__)

// why: GCC 12's avx512fintrin.h seeds casts with _mm512_undefined_*(), which -Wall reports as
// uninitialised at every inlined use (a known false positive, GCC PR105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {

void dequant_fp8_row_avx512(const uint8_t* q, const float* scale, int k, Bf16* out) {
  const __m256i sign = _mm256_set1_epi16(0x80), magnitude = _mm256_set1_epi16(0x7f);
  const __m512i round_bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  for (int c = 0; c < k; c += 16) {
    const int left = k - c < 16 ? k - c : 16;
    const __mmask16 m = static_cast<__mmask16>((1u << left) - 1);
    const __m256i b = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, q + c));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, sign), 8),
                                      _mm256_slli_epi16(_mm256_and_si256(b, magnitude), 7));
    // 16 columns never straddle a 128-wide tile
    const __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(scale[c >> 7] * 256.0f));
    __m512i u = _mm512_castps_si512(f);
    u = _mm512_add_epi32(
        u, _mm512_add_epi32(round_bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    _mm256_mask_storeu_epi16(out + c, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
  }
}

}  // namespace moekit::cpu_fast::detail

#endif

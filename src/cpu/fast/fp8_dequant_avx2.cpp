// AVX2 fp8 row dequantisation (kernels.h, dequant_fp8_row; compiled with -mavx2 -mfma -mf16c,
// called only from the AVX2 table). The e4m3 -> fp16 bit move and the scale * 2^8 of
// fp8_dequant_avx512.cpp, 8 columns a step; the last k % 8 columns in scalar (same values).
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {

void dequant_fp8_row_avx2(const uint8_t* q, const float* scale, int k, Bf16* out) {
  const __m128i sign = _mm_set1_epi16(0x80), magnitude = _mm_set1_epi16(0x7f);
  const __m256i round_bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  int c = 0;
  for (; c + 8 <= k; c += 8) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + c)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, sign), 8),
                                   _mm_slli_epi16(_mm_and_si128(b, magnitude), 7));
    const __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(scale[c >> 7] * 256.0f));
    __m256i u = _mm256_castps_si256(f);
    u = _mm256_add_epi32(u, _mm256_add_epi32(round_bias,
                                             _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
    u = _mm256_srli_epi32(u, 16);
    // pack 8 x 32 -> 8 x 16 (values < 2^16): per 128-bit lane, then the two low quads together
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(u, u), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), _mm256_castsi256_si128(packed));
  }
  for (; c < k; ++c) out[c] = float_to_bf16(fp8_e4m3_to_float(q[c]) * scale[c >> 7]);
}

}  // namespace moekit::cpu_fast::detail

#endif

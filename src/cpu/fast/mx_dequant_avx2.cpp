// AVX2 MX rows (kernels.h dequant_mxfp4_row / dequant_mxfp8_row; compiled with -mavx2 -mfma
// -mf16c, called only from the AVX2 table). As mx_dequant_avx512.cpp, 8 columns a step:
//   MXFP4  vpermps through the 8 e2m1 magnitudes (it reads the low 3 bits of each code), then
//          the code's bit 3 moved to the fp32 sign bit (code 8 is -0, as in the reference);
//   MXFP8  the e4m3 -> fp16 bit move, widened, times 2^8, times the scale.
// Products are exact in fp32 and rounded to bf16 to nearest even, equal to the reference's.
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {
namespace {

// 8 fp32 -> 8 bf16 (round to nearest even), stored at out.
inline void store_bf16x8(__m256 f, Bf16* out) {
  __m256i u = _mm256_castps_si256(f);
  u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                           _mm256_and_si256(_mm256_srli_epi32(u, 16),
                                                            _mm256_set1_epi32(1))));
  u = _mm256_srli_epi32(u, 16);
  // pack 8 x 32 -> 8 x 16 (values < 2^16): per 128-bit lane, then the two low quads together
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(u, u), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
}

// 8 e2m1 codes (one per 32-bit lane, 0..15) -> their values.
inline __m256 e2m1x8(__m256i codes, __m256 magnitudes) {
  const __m256 v = _mm256_permutevar8x32_ps(magnitudes, codes);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(8)), 28);
  return _mm256_or_ps(v, _mm256_castsi256_ps(sign));
}

}  // namespace

void dequant_mxfp4_row_avx2(const uint8_t* q, const uint8_t* scale, int k, Bf16* out) {
  const __m256 magnitudes = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const float* st = mx_scale_table();
  for (int c = 0; c < k; c += 32) {
    const __m256 s = _mm256_set1_ps(st[scale[c >> 5]]);
    // byte b -> 16-bit lane (low nibble) | (high nibble << 8): 32 bytes of codes in column order
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c / 2)));
    const __m256i codes =
        _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi16(0x0f)),
                        _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0xf0)), 4));
    const __m128i lo = _mm256_castsi256_si128(codes), hi = _mm256_extracti128_si256(codes, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int p = 0; p < 4; ++p) {
      const __m256 v = e2m1x8(_mm256_cvtepu8_epi32(parts[p]), magnitudes);
      store_bf16x8(_mm256_mul_ps(v, s), out + c + 8 * p);
    }
  }
}

void dequant_mxfp8_row_avx2(const uint8_t* q, const uint8_t* scale, int k, Bf16* out) {
  const __m128i sign = _mm_set1_epi16(0x80), magnitude = _mm_set1_epi16(0x7f);
  const __m256 two8 = _mm256_set1_ps(256.0f);
  const float* st = mx_scale_table();
  for (int c = 0; c < k; c += 8) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + c)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, sign), 8),
                                   _mm_slli_epi16(_mm_and_si128(b, magnitude), 7));
    const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), two8);  // the e4m3 value, exact
    store_bf16x8(_mm256_mul_ps(v, _mm256_set1_ps(st[scale[c >> 5]])), out + c);
  }
}

}  // namespace moekit::cpu_fast::detail

#endif

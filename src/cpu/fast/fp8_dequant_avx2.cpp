// AVX2 fp8 rows (kernels.h; compiled with -mavx2 -mfma -mf16c, called only from the AVX2 table):
// dequant_fp8_row, and dot_rows_fp8_f32 for decode (1-2 tokens), which makes each weight's
// bf16(fp8 x scale) in registers and sums exactly as kernels_avx2.cpp's dot_row_f32 does (16
// columns a step in two accumulators, their sum, then the k % 16 tail in scalar), so that it
// equals dequantising the row and running dot_rows_f32, without the round trip through memory.
// The e4m3 -> fp16 bit move and the scale * 2^8 are fp8_dequant_avx512.cpp's.
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
    u = _mm256_add_epi32(
        u, _mm256_add_epi32(round_bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
    u = _mm256_srli_epi32(u, 16);
    // pack 8 x 32 -> 8 x 16 (values < 2^16): per 128-bit lane, then the two low quads together
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(u, u), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), _mm256_castsi256_si128(packed));
  }
  for (; c < k; ++c) out[c] = float_to_bf16(fp8_e4m3_to_float(q[c]) * scale[c >> 7]);
}

namespace {

// 8 codes -> bf16(fp8 x scale) as fp32; scale256 = the tile scale * 256.
inline __m256 load_fp8x8(const uint8_t* q, __m256 scale256) {
  // code << 8 per 16-bit lane, shifted right arithmetically: the sign lands in bits 15 and 14,
  // the 7 other bits in 13..7; clearing bit 14 leaves the fp16 of the value times 2^-8
  const __m128i b8 =
      _mm_unpacklo_epi8(_mm_setzero_si128(), _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
  const __m128i h =
      _mm_and_si128(_mm_srai_epi16(b8, 1), _mm_set1_epi16(static_cast<short>(0xbfff)));
  __m256i u = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtph_ps(h), scale256));
  u = _mm256_add_epi32(
      u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                          _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
  return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

inline float hsum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int J>
void dot_row_fp8_f32(const uint8_t* q, const float* scale, int k, const float* const* x, float* out,
                     size_t ldo) {
  __m256 a0[J], a1[J];
  for (int j = 0; j < J; ++j) a0[j] = a1[j] = _mm256_setzero_ps();
  const int k_main = k & ~15;
  for (int c = 0; c < k_main; c += 16) {
    if constexpr (J >= 2) {
      if ((c & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(q + c) + 4096, _MM_HINT_T1);
    }
    const __m256 s = _mm256_set1_ps(scale[c >> 7] * 256.0f);  // 16 columns: one tile
    const __m256 w0 = load_fp8x8(q + c, s);
    const __m256 w1 = load_fp8x8(q + c + 8, s);
    for (int j = 0; j < J; ++j) {
      a0[j] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[j] + c), a0[j]);
      a1[j] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[j] + c + 8), a1[j]);
    }
  }
  for (int j = 0; j < J; ++j) {
    float s = hsum(_mm256_add_ps(a0[j], a1[j]));
    for (int c = k_main; c < k; ++c)
      s += round_to_bf16(fp8_e4m3_to_float(q[c]) * scale[c >> 7]) * x[j][c];
    out[j * ldo] = s;
  }
}

}  // namespace

void dot_rows_fp8_f32_avx2(const uint8_t* q, size_t ldq, const float* scale, size_t scale_ld,
                           int r0, int rows, int k, const float* const* x, int n, float* out,
                           size_t ldo) {
  for (int r = 0; r < rows; ++r) {
    const uint8_t* qr = q + static_cast<size_t>(r) * ldq;
    const float* sr = scale + static_cast<size_t>((r0 + r) / 128) * scale_ld;
    with_static_count<2>(n, [&](auto count) {
      dot_row_fp8_f32<decltype(count)::value>(qr, sr, k, x, out + r, ldo);
    });
  }
}

}  // namespace moekit::cpu_fast::detail

#endif

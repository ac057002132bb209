// AVX2 MX decode rows (kernels.h dot_rows_mxfp4_f32 / dot_rows_mxfp8_f32; compiled with -mavx2
// -mfma -mf16c, called only from the AVX2 table): one weight row against 1-2 tokens with each
// weight made in registers and summed exactly as kernels_avx2.cpp's dot_row_f32 sums the
// dequantised row (16 columns a step in two accumulators, their sum; K is a multiple of 32, so
// there is no tail), so they equal dequant_mx*_row + dot_rows_f32 bit for bit. Weights as in
// mx_dot_avx512.cpp: e2m1 through the 8 scaled magnitudes of mx_e2m1_f32_table() (vpermps reads
// the low 3 bits) with the code's bit 3 as the sign; e4m3 through the fp16 bit move times
// 2^(s-119), exact for 3 <= s <= 246, else the rounded two-multiply path.
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {
namespace {

inline float hsum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 4 bytes of e2m1 pairs -> their 8 codes, one per 32-bit lane in column order, in bits 0-3: u64
// lane i = byte i | byte i << 28 (the low nibble's lane also holds copies of it in bits 28-31
// and the high nibble in bits 4-7, which e2m1x8 does not read).
inline __m256i nibble_codes8(const uint8_t* q) {
  const __m256i b = _mm256_cvtepu8_epi64(_mm_loadu_si32(q));
  return _mm256_or_si256(b, _mm256_slli_epi64(b, 28));
}

// 8 e2m1 codes (one per 32-bit lane, in bits 0-3; bit 3 the sign) -> values, from the block's
// scaled magnitudes (vpermps reads an index's low 3 bits).
inline __m256 e2m1x8(__m256i codes, __m256 scaled) {
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(8)), 28);
  return _mm256_or_ps(_mm256_permutevar8x32_ps(scaled, codes), _mm256_castsi256_ps(sign));
}

// 8 e4m3 codes -> bf16(value x 2^(s-127)) as fp32.
inline __m256 e4m3x8(const uint8_t* q, uint8_t s, const float* st) {
  const __m128i b8 =
      _mm_unpacklo_epi8(_mm_setzero_si128(), _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
  const __m128i h =
      _mm_and_si128(_mm_srai_epi16(b8, 1), _mm_set1_epi16(static_cast<short>(0xbfff)));
  const __m256 v = _mm256_cvtph_ps(h);  // the e4m3 value times 2^-8
  if (s >= 3 && s <= 246) return _mm256_mul_ps(v, _mm256_set1_ps(st[s + 8]));  // exact
  __m256i u = _mm256_castps_si256(
      _mm256_mul_ps(_mm256_mul_ps(v, _mm256_set1_ps(256.0f)), _mm256_set1_ps(st[s])));
  u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                           _mm256_and_si256(_mm256_srli_epi32(u, 16),
                                                            _mm256_set1_epi32(1))));
  return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

template <bool kFp4, int J>
void row_mx_f32(const uint8_t* q, const uint8_t* s, int k, const float* const* x, float* out,
                size_t ldo) {
  const float* st = mx_scale_table();
  const E2m1Row* tables = mx_e2m1_f32_table();
  __m256 a0[J], a1[J];
  for (int j = 0; j < J; ++j) a0[j] = a1[j] = _mm256_setzero_ps();
  for (int c = 0; c < k; c += 16) {
    const uint8_t sb = s[c >> 5];  // 16 columns: half a block
    __m256 w0, w1;
    if constexpr (kFp4) {
      if ((c & 127) == 0) _mm_prefetch(reinterpret_cast<const char*>(q + c / 2) + 4096, _MM_HINT_T1);
      const __m256 scaled = _mm256_load_ps(tables[sb].f32);  // the 8 magnitudes x 2^(s-127)
      w0 = e2m1x8(nibble_codes8(q + c / 2), scaled);
      w1 = e2m1x8(nibble_codes8(q + c / 2 + 4), scaled);
    } else {
      if ((c & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(q + c) + 4096, _MM_HINT_T1);
      w0 = e4m3x8(q + c, sb, st);
      w1 = e4m3x8(q + c + 8, sb, st);
    }
    for (int j = 0; j < J; ++j) {
      a0[j] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[j] + c), a0[j]);
      a1[j] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[j] + c + 8), a1[j]);
    }
  }
  for (int j = 0; j < J; ++j) out[j * ldo] = hsum(_mm256_add_ps(a0[j], a1[j]));
}

template <bool kFp4>
void rows_mx_f32(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds, int rows, int k,
                 const float* const* x, int n, float* out, size_t ldo) {
  for (int r = 0; r < rows; ++r) {
    with_static_count<2>(n, [&](auto count) {
      row_mx_f32<kFp4, decltype(count)::value>(q + static_cast<size_t>(r) * ldq,
                                                scale + static_cast<size_t>(r) * lds, k, x,
                                                out + r, ldo);
    });
  }
}

}  // namespace

void dot_rows_mxfp4_f32_avx2(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                             int rows, int k, const float* const* x, int n, float* out,
                             size_t ldo) {
  rows_mx_f32<true>(q, ldq, scale, lds, rows, k, x, n, out, ldo);
}

void dot_rows_mxfp8_f32_avx2(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                             int rows, int k, const float* const* x, int n, float* out,
                             size_t ldo) {
  rows_mx_f32<false>(q, ldq, scale, lds, rows, k, x, n, out, ldo);
}

}  // namespace moekit::cpu_fast::detail

#endif

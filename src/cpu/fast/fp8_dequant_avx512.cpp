// AVX-512 fp8 rows (kernels.h; compiled with the AVX-512 flags, called only from the AVX-512
// table): dequant_fp8_row, and dot_rows_fp8_f32 for decode (1-2 tokens), which makes each weight's
// bf16(fp8 x scale) in registers and sums exactly as kernels_avx512.cpp's dot_row_f32 does (32
// columns a step in two accumulators, the masked 16-column tail steps into the first, then their
// sum), so that it equals dequantising the row and running dot_rows_f32.
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

namespace {

// 16 codes (masked lanes 0) -> bf16(fp8 x scale) as fp32; scale256 = the tile scale * 256. The
// fp16 is made as in fp8_dequant_avx2.cpp: code << 8, arithmetic shift right, bit 14 cleared.
inline __m512 load_fp8x16(const uint8_t* q, __mmask16 m, __m512 scale256) {
  const __m256i b8 = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, q)), 8);
  const __m256i h =
      _mm256_and_si256(_mm256_srai_epi16(b8, 1), _mm256_set1_epi16(static_cast<short>(0xbfff)));
  __m512i u = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtph_ps(h), scale256));
  u = _mm512_add_epi32(
      u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                          _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
  return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

template <int J>
void dot_row_fp8_f32(const uint8_t* q, const float* scale, int k, const float* const* x, float* out,
                     size_t ldo) {
  __m512 a0[J], a1[J];
  for (int j = 0; j < J; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
  const int k_main = k & ~31;
  for (int c = 0; c < k_main; c += 32) {
    if constexpr (J >= 2) {
      if ((c & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(q + c) + 4096, _MM_HINT_T1);
    }
    const __m512 s = _mm512_set1_ps(scale[c >> 7] * 256.0f);  // 32 columns: one tile
    const __m512 w0 = load_fp8x16(q + c, 0xffff, s);
    const __m512 w1 = load_fp8x16(q + c + 16, 0xffff, s);
    for (int j = 0; j < J; ++j) {
      a0[j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[j] + c), a0[j]);
      a1[j] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[j] + c + 16), a1[j]);
    }
  }
  for (int c = k_main; c < k; c += 16) {  // tail: at most two masked steps, into a0
    const int left = k - c < 16 ? k - c : 16;
    const __mmask16 m = static_cast<__mmask16>((1u << left) - 1);
    const __m512 wv = load_fp8x16(q + c, m, _mm512_set1_ps(scale[c >> 7] * 256.0f));
    for (int j = 0; j < J; ++j)
      a0[j] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x[j] + c), a0[j]);
  }
  for (int j = 0; j < J; ++j) out[j * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(a0[j], a1[j]));
}

}  // namespace

void dot_rows_fp8_f32_avx512(const uint8_t* q, size_t ldq, const float* scale, size_t scale_ld,
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

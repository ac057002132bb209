// AVX-512 MX decode rows (kernels.h dot_rows_mx*_f32 / dot_rows_mx*_bf16; compiled with the
// AVX-512 flags, called only from the AVX-512 table, the bf16 ones only on AVX512-BF16 CPUs): one
// weight row against 1-2 tokens with each weight made in registers, through the row loops of
// mx_row_loop_avx512.h, which sum as kernels_avx512.cpp's dot_row_f32 and dot_row_bf16 sum the
// dequantised row, so they equal dequant_mx*_row + dot_rows_* bit for bit without the bf16 row in
// memory. K is a multiple of 32, so every step is one or two whole MX blocks. This file holds the
// weight makers; mx_dot_avx512vbmi.cpp holds the MXFP4 ones for CPUs with VBMI.
//
// Weights: MXFP4 codes index the 16 e2m1 values already multiplied by the block's 2^(s-127)
// (mx_e2m1_f32_table / mx_e2m1_bf16_table; vpermps on fp32, vpermw on bf16); those products are
// exact in bf16 (mx_experts.md), so no rounding is needed. MXFP8 on fp32 uses the e4m3 -> fp16
// bit move (the value times 2^-8) times 2^(s-119), exact for 3 <= s <= 246 (the products are
// exact in bf16 there); on bf16, for 10 <= s <= 246, integer arithmetic on the bf16 exponent
// field (e4m3_bf16x32). Other blocks take the rounded two-multiply path of mx_dequant_avx512.cpp.
#if defined(__x86_64__) || defined(__i386__)

// why: GCC 12's avx512fintrin.h seeds casts with _mm512_undefined_*(), which -Wall reports as
// uninitialised at every inlined use (a known false positive, GCC PR105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "cpu/fast/kernels.h"
#include "cpu/fast/mx_row_loop_avx512.h"

namespace moekit::cpu_fast::detail {
namespace {

// 8 bytes of e2m1 pairs -> vpermps indices of their 16 codes in column order: u64 lane i = byte
// i | byte i << 28, so u32 lane 2i holds the low nibble and lane 2i + 1 the high one in bits 0-3
// (vpermps reads those only).
inline __m512i nibble_indices16(const uint8_t* q) {
  const __m512i b = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
  return _mm512_or_si512(b, _mm512_slli_epi64(b, 28));
}

// bf16 round to nearest even of 16 fp32, the result as fp32 (low 16 bits zero).
inline __m512 round_bf16(__m512 f) {
  __m512i u = _mm512_castps_si512(f);
  u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                           _mm512_and_si512(_mm512_srli_epi32(u, 16),
                                                            _mm512_set1_epi32(1))));
  return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// 16 e4m3 codes -> bf16(value x 2^(s-127)) as fp32.
inline __m512 e4m3x16(const uint8_t* q, uint8_t s, const float* st) {
  const __m256i b8 =
      _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))), 8);
  const __m256i h =
      _mm256_and_si256(_mm256_srai_epi16(b8, 1), _mm256_set1_epi16(static_cast<short>(0xbfff)));
  const __m512 v = _mm512_cvtph_ps(h);  // the e4m3 value times 2^-8
  if (s >= 3 && s <= 246) return _mm512_mul_ps(v, _mm512_set1_ps(st[s + 8]));  // exact
  return round_bf16(_mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(256.0f)), _mm512_set1_ps(st[s])));
}

// Two fp32 vectors holding bf16 values (low halves zero) -> 32 bf16 in order.
inline __m512bh pack_bf16(__m512 lo, __m512 hi) {
  const __m256i a = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(lo), 16));
  const __m256i b = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(hi), 16));
  return (__m512bh)_mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

// 32 MXFP4 weights of one block as bf16: the block's scaled table (exact in bf16) through vpermw.
inline __m512bh mxfp4_bf16x32(const uint8_t* q, const E2m1RowBf16& row) {
  const __m256i t16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(row.bits));
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  // u32 lane i = low nibble of byte i | byte i << 12 (one ternary-logic op): u16 lanes 2i, 2i+1
  // index the low and the high nibble in column order (vpermw reads an index's low 5 bits, so the
  // low nibble's copy in bits 12-15 is not read, and the high nibble needs no mask)
  const __m512i idx =
      _mm512_ternarylogic_epi32(b, _mm512_slli_epi32(b, 12), _mm512_set1_epi32(0x0f), 0xec);
  return (__m512bh)_mm512_permutexvar_epi16(idx, _mm512_zextsi256_si512(t16));
}

// bf16 bits of m x 2^-9 (the e4m3 subnormals, m = 1..7; lane 0 unused) and the bf16 exponent
// field's unit.
inline __m512i e4m3_subnormal_bits() {
  return _mm512_setr_epi32(0x3b00'0000, 0x3bc0'3b80, 0x3c20'3c00, 0x3c60'3c40, 0, 0, 0, 0, 0, 0,
                           0, 0, 0, 0, 0, 0);
}

// 32 e4m3 codes of a block with 10 <= s <= 246 -> bf16(value x 2^(s-127)) as bf16, in integer
// arithmetic: a normal code (exponent field E >= 1) is sign | (E + s - 7) << 7 | m << 4, a
// subnormal one m x 2^-9 with s - 127 added to its exponent field; every result is a normal
// bf16 in that range of s, so no rounding happens.
inline __m512bh e4m3_bf16x32(const uint8_t* q, uint8_t s, __m512i subnormals) {
  // sign-extended codes: b << 4 holds the magnitude in bits 4-10 and the sign in bit 15, and the
  // exponent offset added to the masked bits never carries into the sign
  const __m512i b = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
  const __m512i normal = _mm512_add_epi16(
      _mm512_and_si512(_mm512_slli_epi16(b, 4), _mm512_set1_epi16(static_cast<short>(0x87f0))),
      _mm512_set1_epi16(static_cast<short>((s - 7) << 7)));
  const __mmask32 is_sub = _mm512_testn_epi16_mask(b, _mm512_set1_epi16(0x78));
  if (is_sub == 0) return (__m512bh)normal;
  // subnormal codes (E = 0, rare in a block scaled to its largest element): the table (indexed
  // by the code's low 5 bits, m there) shifted by 2^(s-127), code 0 kept 0, and the sign
  const __m512i sub = _mm512_mask_mov_epi16(
      _mm512_add_epi16(subnormals, _mm512_set1_epi16(static_cast<short>((s - 127) << 7))), 1,
      _mm512_setzero_si512());
  const __m512i sign = _mm512_and_si512(b, _mm512_set1_epi16(static_cast<short>(0x8000)));
  return (__m512bh)_mm512_mask_mov_epi16(normal, is_sub,
                                         _mm512_or_si512(_mm512_permutexvar_epi16(b, sub), sign));
}

// The row loops' weight makers (mx_row_loop_avx512.h): a block of codes q with e8m0 byte s.
struct Mxfp4Weights {
  static constexpr bool kFp4 = true;
  static constexpr int kBlockBytes = 16;
  const E2m1RowBf16* tables = mx_e2m1_bf16_table();
  const E2m1Row* tables_f32 = mx_e2m1_f32_table();
  __m512bh bf16(const uint8_t* q, uint8_t s) const { return mxfp4_bf16x32(q, tables[s]); }
  void f32(const uint8_t* q, uint8_t s, __m512& lo, __m512& hi) const {
    const __m512 scaled = _mm512_load_ps(tables_f32[s].f32);
    lo = _mm512_permutexvar_ps(nibble_indices16(q), scaled);
    hi = _mm512_permutexvar_ps(nibble_indices16(q + 8), scaled);
  }
};

struct Mxfp8Weights {
  static constexpr bool kFp4 = false;
  static constexpr int kBlockBytes = 32;
  const float* st = mx_scale_table();
  __m512bh bf16(const uint8_t* q, uint8_t s) const {
    if (s >= 10 && s <= 246) return e4m3_bf16x32(q, s, e4m3_subnormal_bits());
    return pack_bf16(e4m3x16(q, s, st), e4m3x16(q + 16, s, st));
  }
  void f32(const uint8_t* q, uint8_t s, __m512& lo, __m512& hi) const {
    lo = e4m3x16(q, s, st);
    hi = e4m3x16(q + 16, s, st);
  }
};

}  // namespace

void dot_rows_mxfp4_f32_avx512(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                               int rows, int k, const float* const* x, int n, float* out,
                               size_t ldo) {
  mx_rows<Mxfp4Weights>(q, ldq, scale, lds, rows, k, x, n, out, ldo);
}

void dot_rows_mxfp8_f32_avx512(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                               int rows, int k, const float* const* x, int n, float* out,
                               size_t ldo) {
  mx_rows<Mxfp8Weights>(q, ldq, scale, lds, rows, k, x, n, out, ldo);
}

void dot_rows_mxfp4_bf16_avx512(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                                int rows, int k, const Bf16* const* x, int n, float* out,
                                size_t ldo) {
  mx_rows<Mxfp4Weights>(q, ldq, scale, lds, rows, k, x, n, out, ldo);
}

void dot_rows_mxfp8_bf16_avx512(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                                int rows, int k, const Bf16* const* x, int n, float* out,
                                size_t ldo) {
  mx_rows<Mxfp8Weights>(q, ldq, scale, lds, rows, k, x, n, out, ldo);
}

}  // namespace moekit::cpu_fast::detail

#endif

// The AVX-512 MXFP4 decode rows on CPUs with AVX512-VBMI (kernels.h dot_rows_mxfp4_*_avx512vbmi;
// compiled with the AVX-512 flags and -mavx512vbmi, put in the AVX-512 table only where the CPU
// has VBMI): mx_dot_avx512.cpp's rows with the table indices made by one vpermb and one variable
// shift (bf16: instead of a widening, a shift and a ternary op; fp32: instead of a widening, a
// shift and an or), so the same weights are summed in the same order (equal bit for bit).
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

// The 32 MXFP4 weights of one block (its 16 code bytes q, its e8m0 byte s).
// bf16: vpermb puts code byte i in bytes 4i..4i+3, so u16 lanes 2i and 2i + 1 both hold byte i
// twice; vpsrlvw shifts the odd lanes by 4, bringing the high nibble to bits 0-3. vpermw reads an
// index's low 5 bits: bit 4 is the other nibble's low bit, so the block's 16-entry table sits in
// both halves of the 32-entry one and that bit picks the same value.
// fp32: vpermb puts code byte i in the low byte of u32 lanes 2i and 2i + 1 (bytes 0-7 for the
// first 16 weights, 8-15 for the second); vpsrlvd shifts the odd lanes by 4; vpermps reads an
// index's low 4 bits.
struct Mxfp4WeightsVbmi {
  static constexpr bool kFp4 = true;
  static constexpr int kBlockBytes = 16;
  const E2m1RowBf16* tables = mx_e2m1_bf16_table();
  const E2m1Row* tables_f32 = mx_e2m1_f32_table();
  void f32(const uint8_t* q, uint8_t s, __m512& lo, __m512& hi) const {
    const __m512 scaled = _mm512_load_ps(tables_f32[s].f32);
    const __m512i codes =
        _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    // u32 lane l of the result takes code byte `first + l / 2` in its low byte
    const __m512i first_half = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i second_half =
        _mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    const __m512i odd_by_4 = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    lo = _mm512_permutexvar_ps(
        _mm512_srlv_epi32(_mm512_permutexvar_epi8(first_half, codes), odd_by_4), scaled);
    hi = _mm512_permutexvar_ps(
        _mm512_srlv_epi32(_mm512_permutexvar_epi8(second_half, codes), odd_by_4), scaled);
  }
  __m512bh bf16(const uint8_t* q, uint8_t s) const {
    const __m512i table =
        _mm512_broadcast_i64x4(_mm256_load_si256(reinterpret_cast<const __m256i*>(tables[s].bits)));
    const __m512i codes =
        _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    // byte 4i + j of the result is code byte i (vpermb reads its indices' low 6 bits)
    const __m512i each_four =
        _mm512_setr_epi32(0x00000000, 0x01010101, 0x02020202, 0x03030303, 0x04040404, 0x05050505,
                          0x06060606, 0x07070707, 0x08080808, 0x09090909, 0x0a0a0a0a, 0x0b0b0b0b,
                          0x0c0c0c0c, 0x0d0d0d0d, 0x0e0e0e0e, 0x0f0f0f0f);
    const __m512i idx =
        _mm512_srlv_epi16(_mm512_permutexvar_epi8(each_four, codes), _mm512_set1_epi32(4 << 16));
    return (__m512bh)_mm512_permutexvar_epi16(idx, table);
  }
};

}  // namespace

void dot_rows_mxfp4_f32_avx512vbmi(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                                   int rows, int k, const float* const* x, int n, float* out,
                                   size_t ldo) {
  mx_rows<Mxfp4WeightsVbmi>(q, ldq, scale, lds, rows, k, x, n, out, ldo);
}

void dot_rows_mxfp4_bf16_avx512vbmi(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                                    int rows, int k, const Bf16* const* x, int n, float* out,
                                    size_t ldo) {
  mx_rows<Mxfp4WeightsVbmi>(q, ldq, scale, lds, rows, k, x, n, out, ldo);
}

}  // namespace moekit::cpu_fast::detail

#endif

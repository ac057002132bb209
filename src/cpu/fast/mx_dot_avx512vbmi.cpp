// The AVX-512 MXFP4 bf16 decode rows on CPUs with AVX512-VBMI (kernels.h
// dot_rows_mxfp4_bf16_avx512vbmi; compiled with the AVX-512 flags and -mavx512vbmi, put in the
// AVX-512 table only where the CPU has VBMI and AVX512-BF16): mx_dot_avx512.cpp's bf16 rows with
// the vpermw indices made by one vpermb and one vpsrlvw instead of a widening, a shift and a
// ternary op, so the same weights are summed in the same order (equal bit for bit).
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

// 32 MXFP4 weights of one block as bf16. vpermb puts code byte i in bytes 4i..4i+3, so u16
// lanes 2i and 2i + 1 both hold byte i twice; vpsrlvw shifts the odd lanes by 4, bringing the
// high nibble to bits 0-3. vpermw reads an index's low 5 bits: bit 4 is the other nibble's low
// bit, so the block's 16-entry table sits in both halves of the 32-entry one and that bit picks
// the same value.
struct Mxfp4WeightsVbmi {
  static constexpr bool kFp4 = true;
  const uint8_t* q;
  const uint8_t* s;
  const E2m1RowBf16* tables = mx_e2m1_bf16_table();
  __m512bh operator()(int c) const {
    const __m512i table = _mm512_broadcast_i64x4(
        _mm256_load_si256(reinterpret_cast<const __m256i*>(tables[s[c >> 5]].bits)));
    const __m512i codes =
        _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c / 2)));
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

void dot_rows_mxfp4_bf16_avx512vbmi(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                                    int rows, int k, const Bf16* const* x, int n, float* out,
                                    size_t ldo) {
  mx_rows_bf16<Mxfp4WeightsVbmi>(q, ldq, scale, lds, rows, k, x, n, out, ldo);
}

}  // namespace moekit::cpu_fast::detail

#endif

// AVX-512 fp8 decode rows (kernels.h dot_rows_fp8_f32 / dot_rows_fp8_bf16; compiled with the
// AVX-512 flags, called only from the AVX-512 table, the bf16 one only on AVX512-BF16 CPUs): one
// weight row against 1-2 tokens, each weight's bf16(fp8 x scale) made in registers and summed
// exactly as kernels_avx512.cpp's dot_row_f32 (32 columns a step, two accumulators, masked
// 16-column tail steps into the first) and dot_row_bf16 (64 columns a step through vdpbf16ps, two
// accumulators, masked 32-column tail steps into the first) sum the dequantised row.
//
// Weights come from 32-entry bf16 tables through vpermw (which reads an index's low 5 bits, so a
// widened code is its own index). Per 128 x 128 tile with scale s, made before a row of the
// tile's row block is read:
//   normal[e << 3 | m] = bf16((1 + m/8) x 2^(e - 7) x s)   e < 4
//   subnormal[m]       = bf16(m x 2^-9 x s)                the codes with exponent field E = 0
// and one table for every tile, indexed by code >> 3 (sign, E): kHigh = sign << 15 | (E & 12) << 7.
// A code is normal[code] (subnormal[code] where E = 0) plus kHigh[code >> 3]: for E >= 1 the add
// scales bf16(v x s) by 2^(E & 12) in its exponent field, which equals bf16(v x 2^(E & 12) x s)
// while every value involved is a normal, finite bf16 (and the fp32 product a normal fp32); that
// holds for 2^-110 <= s <= 2^110, and rows with a tile scale outside it take dequant_fp8_row's
// arithmetic. E = 0 codes (zeros and subnormals, a small share of a tile) are looked up in the
// second table only in the 32-code groups that hold one.
#if defined(__x86_64__) || defined(__i386__)

// why: GCC 12's avx512fintrin.h seeds casts with _mm512_undefined_*(), which -Wall reports as
// uninitialised at every inlined use (a known false positive, GCC PR105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <vector>

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {
namespace {

constexpr int kTile = 128;
// L2 prefetch this far ahead in the weight stream (as the MX row kernels do, at one token too).
constexpr int kPrefetchBytes = 4096;

struct alignas(64) TileTables {
  uint16_t normal[32] = {};
  uint16_t subnormal[32] = {};
};

// sign << 15 | (E & 12) << 7 for index sign << 4 | E.
alignas(64) constexpr uint16_t kHigh[32] = {
    0,      0,      0,      0,      0x200,  0x200,  0x200,  0x200,  0x400,  0x400,  0x400,
    0x400,  0x600,  0x600,  0x600,  0x600,  0x8000, 0x8000, 0x8000, 0x8000, 0x8200, 0x8200,
    0x8200, 0x8200, 0x8400, 0x8400, 0x8400, 0x8400, 0x8600, 0x8600, 0x8600, 0x8600};

// bf16 round to nearest even of 16 finite fp32 (float_to_bf16's integer form), as 16-bit lanes.
inline __m256i bf16_bits(__m512 f) {
  __m512i u = _mm512_castps_si512(f);
  u = _mm512_add_epi32(
      u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                          _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
}

// Whether the tables hold a tile of scale s.
inline bool tables_exact(float s) { return s >= 0x1p-110f && s <= 0x1p110f; }

// The tables of each of the k / 128 column tiles of one tile row (scales at sr); false (and no
// tables) if one of the scales is outside tables_exact.
bool build_tables(const float* sr, int k, std::vector<TileTables>& out) {
  // (1 + m/8) x 2^(e - 7) for j = e << 3 | m, and m x 2^-9, exact in fp32
  alignas(64) static const float kNormal[32] = {
#define MK_ROW(e) \
  1.0f * e, 1.125f * e, 1.25f * e, 1.375f * e, 1.5f * e, 1.625f * e, 1.75f * e, 1.875f * e
      MK_ROW(0x1p-7f), MK_ROW(0x1p-6f), MK_ROW(0x1p-5f), MK_ROW(0x1p-4f)
#undef MK_ROW
  };
  alignas(64) static const float kSubnormal[16] = {
      0, 0x1p-9f, 2 * 0x1p-9f, 3 * 0x1p-9f, 4 * 0x1p-9f, 5 * 0x1p-9f, 6 * 0x1p-9f, 7 * 0x1p-9f};
  const int tiles = (k + kTile - 1) / kTile;
  for (int t = 0; t < tiles; ++t)
    if (!tables_exact(sr[t])) return false;
  out.resize(tiles);
  for (int t = 0; t < tiles; ++t) {
    const __m512 sv = _mm512_set1_ps(sr[t]);
    TileTables& tt = out[t];
    _mm256_store_si256(reinterpret_cast<__m256i*>(tt.normal),
                       bf16_bits(_mm512_mul_ps(_mm512_load_ps(kNormal), sv)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(tt.normal + 16),
                       bf16_bits(_mm512_mul_ps(_mm512_load_ps(kNormal + 16), sv)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(tt.subnormal),
                       bf16_bits(_mm512_mul_ps(_mm512_load_ps(kSubnormal), sv)));
  }
  return true;
}

// A tile's tables in registers, and kHigh.
struct Tables {
  __m512i normal, subnormal, high;
};

// 32 codes (zero where the mask m is clear) -> their bf16 weights.
inline __m512i weights_bf16x32(const uint8_t* q, __mmask32 m, const Tables& t) {
  const __m512i b = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, q));
  __m512i v = _mm512_permutexvar_epi16(b, t.normal);
  const __mmask32 low = _mm512_testn_epi16_mask(b, _mm512_set1_epi16(0x78));
  if (low != 0) v = _mm512_mask_permutexvar_epi16(v, low, b, t.subnormal);
  return _mm512_add_epi16(v, _mm512_permutexvar_epi16(_mm512_srli_epi16(b, 3), t.high));
}

// 32 weights of a row whose tile scales the tables cannot hold, as dequant_fp8_row makes them
// (s: the tile's scale; columns past `left` zero).
inline __m512i weights_dequantised(const uint8_t* q, int left, const float* s) {
  alignas(64) Bf16 w[32] = {};
  dequant_fp8_row_avx512(q, s, left >= 32 ? 32 : left, w);
  return _mm512_load_si512(w);
}

// The weights of columns [c, c + 32) of a row (kTables: from the tables tt, else dequantised).
template <bool kTables_>
struct RowWeights {
  static constexpr bool kTables = kTables_;
  const uint8_t* q;
  const TileTables* tt;
  const float* sr;
  int tile = -1;
  Tables t{_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_load_si512(kHigh)};

  __m512i at(int c, int left) {
    if constexpr (kTables_) {
      if (c / kTile != tile) {
        tile = c / kTile;
        t.normal = _mm512_load_si512(tt[tile].normal);
        t.subnormal = _mm512_load_si512(tt[tile].subnormal);
      }
      const __mmask32 m = left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << left) - 1);
      return weights_bf16x32(q + c, m, t);
    } else {
      return weights_dequantised(q + c, left, sr + c / kTile);
    }
  }
};

template <bool kTables, int J>
void row_fp8_bf16(RowWeights<kTables> rw, int k, const Bf16* const* x, float* out, size_t ldo) {
  __m512 a0[J], a1[J];
  for (int j = 0; j < J; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
  const int k_main = k & ~63;
  for (int c = 0; c < k_main; c += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(rw.q + c) + kPrefetchBytes, _MM_HINT_T1);
    const __m512bh w0 = (__m512bh)rw.at(c, 32);
    const __m512bh w1 = (__m512bh)rw.at(c + 32, 32);
    for (int j = 0; j < J; ++j) {
      a0[j] = _mm512_dpbf16_ps(a0[j], w0, (__m512bh)_mm512_loadu_si512(x[j] + c));
      a1[j] = _mm512_dpbf16_ps(a1[j], w1, (__m512bh)_mm512_loadu_si512(x[j] + c + 32));
    }
  }
  for (int c = k_main; c < k; c += 32) {  // tail: at most two masked steps, into a0
    const int left = k - c < 32 ? k - c : 32;
    const __mmask32 m = static_cast<__mmask32>((1ull << left) - 1);
    const __m512bh wv = (__m512bh)rw.at(c, left);
    for (int j = 0; j < J; ++j)
      a0[j] = _mm512_dpbf16_ps(a0[j], wv, (__m512bh)_mm512_maskz_loadu_epi16(m, x[j] + c));
  }
  for (int j = 0; j < J; ++j) out[j * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(a0[j], a1[j]));
}

// 16 bf16 lanes -> fp32.
inline __m512 widen(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <bool kTables, int J>
void row_fp8_f32(RowWeights<kTables> rw, int k, const float* const* x, float* out, size_t ldo) {
  __m512 a0[J], a1[J];
  for (int j = 0; j < J; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
  const int k_main = k & ~31;
  for (int c = 0; c < k_main; c += 32) {
    if ((c & 63) == 0)
      _mm_prefetch(reinterpret_cast<const char*>(rw.q + c) + kPrefetchBytes, _MM_HINT_T1);
    const __m512i wb = rw.at(c, 32);
    const __m512 w0 = widen(_mm512_castsi512_si256(wb));
    const __m512 w1 = widen(_mm512_extracti64x4_epi64(wb, 1));
    for (int j = 0; j < J; ++j) {
      a0[j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[j] + c), a0[j]);
      a1[j] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[j] + c + 16), a1[j]);
    }
  }
  if (k_main < k) {  // tail: at most two masked 16-column steps, into a0
    const int left = k - k_main;
    const __m512i wb = rw.at(k_main, left);
    const __mmask16 m0 = static_cast<__mmask16>(left >= 16 ? 0xffff : (1u << left) - 1);
    const __m512 w0 = widen(_mm512_castsi512_si256(wb));
    for (int j = 0; j < J; ++j)
      a0[j] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m0, x[j] + k_main), a0[j]);
    if (left > 16) {
      const __mmask16 m1 = static_cast<__mmask16>((1u << (left - 16)) - 1);
      const __m512 w1 = widen(_mm512_extracti64x4_epi64(wb, 1));
      for (int j = 0; j < J; ++j)
        a0[j] = _mm512_fmadd_ps(w1, _mm512_maskz_loadu_ps(m1, x[j] + k_main + 16), a0[j]);
    }
  }
  for (int j = 0; j < J; ++j) out[j * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(a0[j], a1[j]));
}

// Rows r0 .. r0 + rows - 1 one at a time (a single sequential stream), the tables rebuilt where
// a row enters a new tile row. row(count, weights, out) runs one row, weights a RowWeights<true>
// or <false>.
template <typename Row>
void each_row(const uint8_t* q, size_t ldq, const float* scale, size_t scale_ld, int r0, int rows,
              int k, int n, float* out, Row row) {
  thread_local std::vector<TileTables> tables;
  int built = -1;
  bool exact = false;
  for (int r = 0; r < rows; ++r) {
    const int tile_row = (r0 + r) / kTile;
    const float* sr = scale + static_cast<size_t>(tile_row) * scale_ld;
    if (tile_row != built) {
      exact = build_tables(sr, k, tables);
      built = tile_row;
    }
    const uint8_t* qr = q + static_cast<size_t>(r) * ldq;
    with_static_count<2>(n, [&](auto count) {
      if (exact)
        row(count, RowWeights<true>{qr, tables.data(), sr}, out + r);
      else
        row(count, RowWeights<false>{qr, nullptr, sr}, out + r);
    });
  }
}

}  // namespace

void dot_rows_fp8_f32_avx512(const uint8_t* q, size_t ldq, const float* scale, size_t scale_ld,
                             int r0, int rows, int k, const float* const* x, int n, float* out,
                             size_t ldo) {
  each_row(q, ldq, scale, scale_ld, r0, rows, k, n, out, [&](auto count, auto weights, float* o) {
    row_fp8_f32<decltype(weights)::kTables, decltype(count)::value>(weights, k, x, o, ldo);
  });
}

void dot_rows_fp8_bf16_avx512(const uint8_t* q, size_t ldq, const float* scale, size_t scale_ld,
                              int r0, int rows, int k, const Bf16* const* x, int n, float* out,
                              size_t ldo) {
  each_row(q, ldq, scale, scale_ld, r0, rows, k, n, out, [&](auto count, auto weights, float* o) {
    row_fp8_bf16<decltype(weights)::kTables, decltype(count)::value>(weights, k, x, o, ldo);
  });
}

}  // namespace moekit::cpu_fast::detail

#endif

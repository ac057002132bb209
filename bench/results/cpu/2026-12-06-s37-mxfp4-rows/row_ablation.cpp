// Ablation of the AVX-512 MXFP4 bf16 row kernel (mx_dot_avx512.cpp row_mx_bf16<true,1>): 48 rows
// of 2880 columns (in L1/L2), ns per 32 weights for variants that drop or double one part.
#include <immintrin.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
struct alignas(32) Tab { uint16_t bits[16]; };
static Tab tables[256];
static inline __m512bh wts(const uint8_t* q, const Tab& row) {
  const __m256i t16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(row.bits));
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  const __m512i idx = _mm512_ternarylogic_epi32(b, _mm512_slli_epi32(b, 12), _mm512_set1_epi32(0x0f), 0xec);
  return (__m512bh)_mm512_permutexvar_epi16(idx, _mm512_zextsi256_si512(t16));
}
// VBMI indices: each code byte four times (vpermb), the odd words shifted by 4 (vpsrlvw); the
// table broadcast to both halves so that index bit 4 (the other nibble's bit) does not matter
static inline __m512bh wts_vbmi(const uint8_t* q, const Tab& row) {
  const __m512i t = _mm512_broadcast_i64x4(_mm256_load_si256(reinterpret_cast<const __m256i*>(row.bits)));
  const __m512i b = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  const __m512i four = _mm512_set_epi8(15,15,15,15,14,14,14,14,13,13,13,13,12,12,12,12,11,11,11,11,10,10,10,10,9,9,9,9,8,8,8,8,7,7,7,7,6,6,6,6,5,5,5,5,4,4,4,4,3,3,3,3,2,2,2,2,1,1,1,1,0,0,0,0);
  const __m512i shifts = _mm512_set1_epi32(4 << 16);
  const __m512i idx = _mm512_srlv_epi16(_mm512_permutexvar_epi8(four, b), shifts);
  return (__m512bh)_mm512_permutexvar_epi16(idx, t);
}
template <int V>
__attribute__((noinline)) float row(const uint8_t* q, const uint8_t* s, int k, const uint16_t* x) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  if constexpr (V == 3) {  // 4 accumulators, 128 columns a step
    for (int c = 0; c < k; c += 128) {
      a0 = _mm512_dpbf16_ps(a0, wts(q + c / 2, tables[s[c >> 5]]), (__m512bh)_mm512_loadu_si512(x + c));
      a1 = _mm512_dpbf16_ps(a1, wts(q + c / 2 + 16, tables[s[(c >> 5) + 1]]), (__m512bh)_mm512_loadu_si512(x + c + 32));
      a2 = _mm512_dpbf16_ps(a2, wts(q + c / 2 + 32, tables[s[(c >> 5) + 2]]), (__m512bh)_mm512_loadu_si512(x + c + 64));
      a3 = _mm512_dpbf16_ps(a3, wts(q + c / 2 + 48, tables[s[(c >> 5) + 3]]), (__m512bh)_mm512_loadu_si512(x + c + 96));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  }
  for (int c = 0; c < k; c += 64) {
    __m512bh w0, w1;
    if constexpr (V == 2) {  // no permute: the indices as weights
      w0 = (__m512bh)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c / 2)));
      w1 = (__m512bh)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c / 2 + 16)));
    } else if constexpr (V == 4) {
      w0 = wts_vbmi(q + c / 2, tables[s[c >> 5]]);
      w1 = wts_vbmi(q + c / 2 + 16, tables[s[(c >> 5) + 1]]);
    } else {
      w0 = wts(q + c / 2, tables[s[c >> 5]]);
      w1 = wts(q + c / 2 + 16, tables[s[(c >> 5) + 1]]);
    }
    if constexpr (V == 1) {  // no dot: xor the weights in
      a0 = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a0), (__m512i)w0));
      a1 = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a1), (__m512i)w1));
    } else {
      a0 = _mm512_dpbf16_ps(a0, w0, (__m512bh)_mm512_loadu_si512(x + c));
      a1 = _mm512_dpbf16_ps(a1, w1, (__m512bh)_mm512_loadu_si512(x + c + 32));
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}
int main() {
  const int K = 2944, R = 48;  // K a multiple of 128 near gpt-oss's 2880
  for (int i = 0; i < 256; ++i) for (int j = 0; j < 16; ++j) tables[i].bits[j] = 0x3f80 + j;
  std::vector<uint8_t> q(R * K / 2), s(R * K / 32);
  std::vector<uint16_t> x(K, 0x3f80);
  for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t(i * 37);
  for (size_t i = 0; i < s.size(); ++i) s[i] = uint8_t(100 + i % 50);
  const char* names[] = {"as is", "no vdpbf16ps", "no vpermw", "4 accumulators", "vbmi indices"};
  volatile float sink = 0;
  for (int round = 0; round < 3; ++round) {
    for (int v = 0; v < 5; ++v) {
      double best = 1e30;
      for (int rep = 0; rep < 200; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < R; ++r) {
          const uint8_t* qr = q.data() + r * K / 2; const uint8_t* sr = s.data() + r * K / 32;
          float o = v == 0 ? row<0>(qr, sr, K, x.data()) : v == 1 ? row<1>(qr, sr, K, x.data())
                  : v == 2 ? row<2>(qr, sr, K, x.data()) : v == 3 ? row<3>(qr, sr, K, x.data()) : row<4>(qr, sr, K, x.data());
          sink = sink + o;
          if (rep == 0 && round == 0 && r == 0 && (v == 0 || v == 4)) printf("  check %s: %.6f\n", names[v], o);
        }
        best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
      }
      printf("%-16s %.3f ns per 32 weights\n", names[v], best / (R * K / 32.0));
    }
  }
}

// AVX2 + FMA inner loops of the fast CPU backend (compiled with -mavx2 -mfma -mf16c; called only
// when the CPU reports both).
//
// bf16 -> fp32 is a zero-extension and a 16-bit shift (bf16 is the top half of an fp32), done in
// registers right after the load, so weights cross the memory bus as bf16 (the byte count the
// bandwidth bound counts) and are multiplied in fp32. Rows are streamed one at a time, in address
// order; each loaded weight vector serves up to 4 tokens. Tails (k not a multiple of 16) are
// summed in scalar after the lane reduction, so every output element's summation order depends
// only on k.
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <cstring>

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {
namespace {

inline __m256 load_bf16x8(const Bf16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

inline float bf16_scalar(Bf16 v) {
  const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float hsum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline double hsum_pd(__m256d v) {
  const __m128d lo = _mm256_castpd256_pd128(v);
  const __m128d hi = _mm256_extractf128_pd(v, 1);
  const __m128d s = _mm_add_pd(lo, hi);
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

// One weight row against J tokens, two accumulators per token (even/odd 8-element steps).
template <int J>
void dot_row_f32(const Bf16* w, int k, const float* const* x, float* out, size_t ldo) {
  __m256 a0[J], a1[J];
  for (int j = 0; j < J; ++j) a0[j] = a1[j] = _mm256_setzero_ps();
  const int k_main = k & ~15;
  for (int c = 0; c < k_main; c += 16) {
    // L2 prefetch 4 KB ahead, once per 64-byte line, for multi-token tiles (see the AVX-512 file)
    if constexpr (J >= 2) {
      if ((c & 31) == 0) _mm_prefetch(reinterpret_cast<const char*>(w + c) + 4096, _MM_HINT_T1);
    }
    const __m256 w0 = load_bf16x8(w + c);
    const __m256 w1 = load_bf16x8(w + c + 8);
    for (int j = 0; j < J; ++j) {
      a0[j] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[j] + c), a0[j]);
      a1[j] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[j] + c + 8), a1[j]);
    }
  }
  for (int j = 0; j < J; ++j) {
    float s = hsum(_mm256_add_ps(a0[j], a1[j]));
    for (int c = k_main; c < k; ++c) s += bf16_scalar(w[c]) * x[j][c];
    out[j * ldo] = s;
  }
}

// 4 rows x J <= 2 tokens (8 accumulators + 4 weight vectors + 1 activation of the 16 ymm
// registers): each activation load serves 4 rows, for experts with 3+ tokens (compute-bound).
template <int J>
void dot_tile4_f32(const Bf16* w, size_t ldw, int k, const float* const* x, float* out,
                   size_t ldo) {
  constexpr int R = 4;
  __m256 acc[R][J];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) acc[r][j] = _mm256_setzero_ps();
  const int k_main = k & ~7;
  for (int c = 0; c < k_main; c += 8) {
    if ((c & 31) == 0) {
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w + r * ldw + c) + 4096, _MM_HINT_T1);
    }
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = load_bf16x8(w + r * ldw + c);
    for (int j = 0; j < J; ++j) {
      const __m256 xv = _mm256_loadu_ps(x[j] + c);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(wv[r], xv, acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < J; ++j) {
      float s = hsum(acc[r][j]);
      for (int c = k_main; c < k; ++c) s += bf16_scalar(w[r * ldw + c]) * x[j][c];
      out[j * ldo + r] = s;
    }
  }
}

// Up to 2 tokens: rows one at a time in address order (one sequential stream for the
// prefetchers), two accumulators per token. 3+ tokens: 4-row tiles. The choice depends only on
// the token count and the shapes, never on the thread count.
void dot_rows_f32(const Bf16* w, size_t ldw, int rows, int k, const float* const* x, int n,
                  float* out, size_t ldo) {
  int r0 = 0;
  if (n >= 3) {
    for (; r0 + 4 <= rows; r0 += 4) {
      const Bf16* wr = w + r0 * ldw;
      int j = 0;
      for (; j + 2 <= n; j += 2) dot_tile4_f32<2>(wr, ldw, k, x + j, out + j * ldo + r0, ldo);
      if (j < n) dot_tile4_f32<1>(wr, ldw, k, x + j, out + j * ldo + r0, ldo);
    }
  }
  for (int r = r0; r < rows; ++r) {
    const Bf16* wr = w + r * ldw;
    int j = 0;
    for (; j + 4 <= n; j += 4) dot_row_f32<4>(wr, k, x + j, out + j * ldo + r, ldo);
    with_static_count<3>(n - j, [&](auto count) {
      dot_row_f32<decltype(count)::value>(wr, k, x + j, out + j * ldo + r, ldo);
    });
  }
}

// L2 prefetch this far ahead in a router row (as the AVX-512 router does).
constexpr int kRouterPrefetchBytes = 4096;

// One router row against one double vector, 2 x 4 double lanes, the row prefetched one cache line
// at a time kRouterPrefetchBytes ahead.
template <bool kF32>
double router_row(const void* wp, int k, const double* x) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  const int k_main = k & ~7;
  constexpr int kLineElems = kF32 ? 16 : 32;
  for (int c = 0; c < k_main; c += 8) {
    if (c % kLineElems == 0) {
      _mm_prefetch(static_cast<const char*>(wp) + c * (kF32 ? 4 : 2) + kRouterPrefetchBytes,
                   _MM_HINT_T1);
    }
    __m256 wf;
    if constexpr (kF32) {
      wf = _mm256_loadu_ps(static_cast<const float*>(wp) + c);
    } else {
      wf = load_bf16x8(static_cast<const Bf16*>(wp) + c);
    }
    a0 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(wf)), _mm256_loadu_pd(x + c), a0);
    a1 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(wf, 1)), _mm256_loadu_pd(x + c + 4),
                         a1);
  }
  double s = hsum_pd(_mm256_add_pd(a0, a1));
  for (int c = k_main; c < k; ++c) {
    const double wv =
        kF32 ? static_cast<const float*>(wp)[c] : bf16_scalar(static_cast<const Bf16*>(wp)[c]);
    s += wv * x[c];
  }
  return s;
}

void router_dot(const void* w, bool w_f32, size_t ldw, int rows, int k, const double* const* x,
                int n, double* out, size_t ldo) {
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) {
      out[j * ldo + r] = w_f32 ? router_row<true>(static_cast<const float*>(w) + r * ldw, k, x[j])
                               : router_row<false>(static_cast<const Bf16*>(w) + r * ldw, k, x[j]);
    }
  }
}

float read_sum(const float* p, size_t count) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  const size_t main = count & ~size_t{31};
  for (size_t i = 0; i < main; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (size_t i = main; i < count; ++i) s += p[i];
  return s;
}

}  // namespace

const Kernels& avx2_kernels() {
  static const Kernels k{.name = "avx2",
                         .dot_rows_f32 = dot_rows_f32,
                         .dot_rows_bf16 = nullptr,
                         .router_dot = router_dot,
                         .dequant_fp8_row = dequant_fp8_row_avx2,
                         .dot_rows_fp8_f32 = dot_rows_fp8_f32_avx2,
                         .fp8_row_tokens = 2,
                         .dequant_mxfp4_row = dequant_mxfp4_row_avx2,
                         .dequant_mxfp8_row = dequant_mxfp8_row_avx2,
                         .dot_rows_mxfp4_f32 = dot_rows_mxfp4_f32_avx2,
                         .dot_rows_mxfp8_f32 = dot_rows_mxfp8_f32_avx2,
                         .mx_row_tokens = 2,
                         .read_sum = read_sum};
  return k;
}

}  // namespace moekit::cpu_fast::detail

#else  // not x86: no avx2 code; the table is never used (isa_supported() is false), but must link

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {
const Kernels& avx2_kernels() { return portable_kernels(); }
}  // namespace moekit::cpu_fast::detail

#endif

// AVX-512 inner loops of the fast CPU backend (compiled with -mavx512f/bw/vl/dq/bf16 -mfma; the
// table is used only when the CPU reports avx512f/bw/vl/dq, and dot_rows_bf16 only when it also
// reports avx512_bf16).
//
// dot_rows_f32: bf16 weights widened in registers (zero-extend + shift) and FMA'd with fp32
//   activations, 16 lanes. Used for the down projection, whose activations are fp32 (rounding
//   them to bf16 would cost ~3 significant digits).
// dot_rows_bf16: vdpbf16ps, 32 bf16 pairs per instruction: x is bf16 already, so every product is
//   exact in fp32 and only the accumulation order differs from the fp32 path; it halves the
//   instructions of the gate/up projection, which matters once several tokens share an expert.
//   (vdpbf16ps treats bf16 denormals as zero; weights and activations of any model are >> 1e-38.)
// Up to 2 tokens per expert (decode): one row at a time (sequential streaming), two accumulators
// per token. 3+ tokens: tiles of 4 rows x 4-6 tokens, so each loaded activation serves 4 rows.
// Tails use masked loads (zeros contribute nothing). The kernel chosen depends only on the
// token count and the shapes, never on the thread count.

#if defined(__x86_64__) || defined(__i386__)

// why: GCC 12's avx512fintrin.h seeds reductions and casts with _mm512_undefined_*(), which
// -Wall reports as uninitialised at every inlined use (a known false positive, GCC PR105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {
namespace {

inline __m512 load_bf16x16(const Bf16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline __m512 load_bf16x16_masked(const Bf16* p, __mmask16 m) {
  const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// Software prefetch into L2, kPrefetchBytes ahead in the weight stream. why: with several tokens
// per row the core issues more instructions per weight byte, fewer weight loads fit in the
// out-of-order window, and the hardware prefetchers (which stop at 4 KB pages) leave the stream
// latency-bound (it pays at a few tokens and not at one, so single-token tiles do not
// prefetch). Reading <= 4 KB past a slice's end is harmless.
constexpr int kPrefetchBytes = 4096;
inline void prefetch_ahead(const Bf16* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T1);
}

// Few tokens (<= 2, decode): rows one at a time, in address order: a single sequential stream is
// what the hardware prefetchers follow best (4 interleaved rows, 4 KB apart, stream slower at one
// token). More tokens: 4-row tiles, which are bound by
// compute rather than by the stream. Which kernel runs depends on n and the row count, never on
// the thread count, so results do not depend on it. tile(count, w, x, out) runs a 4-row tile for
// `count` tokens (a compile-time count), row(count, w, x, out) one row; X: the activations' type.
template <typename X, typename Tile, typename Row>
void schedule_rows(const Bf16* w, size_t ldw, int rows, const X* const* x, int n, float* out,
                   size_t ldo, Tile tile, Row row) {
  int r0 = 0;
  if (n >= 3) {
    for (; r0 + 4 <= rows; r0 += 4) {
      const Bf16* wr = w + r0 * ldw;
      int j = 0;
      // blocks of 4 tokens, the last block 1-6 (a 5- or 6-token tile beats 4 + 1 or 4 + 2)
      for (; n - j > 6; j += 4) {
        tile(std::integral_constant<int, 4>{}, wr, x + j, out + j * ldo + r0);
      }
      with_static_count<6>(n - j, [&](auto count) { tile(count, wr, x + j, out + j * ldo + r0); });
    }
  }
  for (int r = r0; r < rows; ++r) {
    const Bf16* wr = w + r * ldw;
    int j = 0;
    for (; j + 8 <= n; j += 8) row(std::integral_constant<int, 8>{}, wr, x + j, out + j * ldo + r);
    with_static_count<7>(n - j, [&](auto count) { row(count, wr, x + j, out + j * ldo + r); });
  }
}

// ---- fp32 activations ----

// One weight row against J tokens: out[j * ldo] = w . x[j]. Two accumulators per token (even and
// odd 16-element steps) keep two FMA chains in flight even for J = 1.
template <int J>
void dot_row_f32(const Bf16* w, int k, const float* const* x, float* out, size_t ldo) {
  __m512 a0[J], a1[J];
  for (int j = 0; j < J; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
  const int k_main = k & ~31;
  for (int c = 0; c < k_main; c += 32) {
    if constexpr (J >= 2) prefetch_ahead(w + c);
    const __m512 w0 = load_bf16x16(w + c);
    const __m512 w1 = load_bf16x16(w + c + 16);
    for (int j = 0; j < J; ++j) {
      a0[j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[j] + c), a0[j]);
      a1[j] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[j] + c + 16), a1[j]);
    }
  }
  for (int c = k_main; c < k; c += 16) {  // tail: at most two masked steps, into a0
    const int left = k - c < 16 ? k - c : 16;
    const __mmask16 m = static_cast<__mmask16>((1u << left) - 1);
    const __m512 wv = load_bf16x16_masked(w + c, m);
    for (int j = 0; j < J; ++j)
      a0[j] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x[j] + c), a0[j]);
  }
  for (int j = 0; j < J; ++j) out[j * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(a0[j], a1[j]));
}

// 4 rows x J <= 6 tokens, one accumulator each (<= 24 of the 32 zmm registers): each activation
// vector loaded serves 4 rows. For 3+ tokens per expert the kernel is bound by the activation
// loads, not by memory, and this tile measured 2.3x the one-row kernel at 6 tokens (Zen 4 dev
// machine).
template <int J>
void dot_tile4_f32(const Bf16* w, size_t ldw, int k, const float* const* x, float* out,
                   size_t ldo) {
  constexpr int R = 4;
  __m512 acc[R][J];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) acc[r][j] = _mm512_setzero_ps();
  // Steps of 16 elements, an L2 prefetch per 64-byte line of each row. The masked tail repeats
  // the body rather than sharing a helper: with a shared lambda GCC 12 kept the accumulators on
  // the stack.
  const int k_main = k & ~15;
  for (int c = 0; c < k_main; c += 16) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) {
      if ((c & 31) == 0) prefetch_ahead(w + r * ldw + c);
      wv[r] = load_bf16x16(w + r * ldw + c);
    }
    for (int j = 0; j < J; ++j) {
      const __m512 xv = _mm512_loadu_ps(x[j] + c);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(wv[r], xv, acc[r][j]);
    }
  }
  if (k_main < k) {
    const __mmask16 m = static_cast<__mmask16>((1u << (k - k_main)) - 1);
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = load_bf16x16_masked(w + r * ldw + k_main, m);
    for (int j = 0; j < J; ++j) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x[j] + k_main);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(wv[r], xv, acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) out[j * ldo + r] = _mm512_reduce_add_ps(acc[r][j]);
}

void dot_rows_f32(const Bf16* w, size_t ldw, int rows, int k, const float* const* x, int n,
                  float* out, size_t ldo) {
  schedule_rows(
      w, ldw, rows, x, n, out, ldo,
      [=](auto count, const Bf16* wr, const float* const* xj, float* o) {
        dot_tile4_f32<decltype(count)::value>(wr, ldw, k, xj, o, ldo);
      },
      [=](auto count, const Bf16* wr, const float* const* xj, float* o) {
        dot_row_f32<decltype(count)::value>(wr, k, xj, o, ldo);
      });
}

// ---- bf16 activations (vdpbf16ps) ----

template <int J>
void dot_row_bf16(const Bf16* w, int k, const Bf16* const* x, float* out, size_t ldo) {
  __m512 a0[J], a1[J];
  for (int j = 0; j < J; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
  const int k_main = k & ~63;
  for (int c = 0; c < k_main; c += 64) {
    if constexpr (J >= 2) {
      prefetch_ahead(w + c);
      prefetch_ahead(w + c + 32);
    }
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + c);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + c + 32);
    for (int j = 0; j < J; ++j) {
      a0[j] = _mm512_dpbf16_ps(a0[j], w0, (__m512bh)_mm512_loadu_si512(x[j] + c));
      a1[j] = _mm512_dpbf16_ps(a1[j], w1, (__m512bh)_mm512_loadu_si512(x[j] + c + 32));
    }
  }
  for (int c = k_main; c < k; c += 32) {  // tail: at most two masked steps, into a0
    const int left = k - c < 32 ? k - c : 32;
    const __mmask32 m = static_cast<__mmask32>((1ull << left) - 1);
    const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w + c);
    for (int j = 0; j < J; ++j)
      a0[j] = _mm512_dpbf16_ps(a0[j], wv, (__m512bh)_mm512_maskz_loadu_epi16(m, x[j] + c));
  }
  for (int j = 0; j < J; ++j) out[j * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(a0[j], a1[j]));
}

template <int J>
void dot_tile4_bf16(const Bf16* w, size_t ldw, int k, const Bf16* const* x, float* out,
                    size_t ldo) {
  constexpr int R = 4;
  __m512 acc[R][J];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) acc[r][j] = _mm512_setzero_ps();
  // Steps of 32 elements (one 64-byte line per row). The tail repeats the body with masked
  // loads rather than sharing a helper: GCC 12 then kept the accumulators on the stack.
  const int k_main = k & ~31;
  for (int c = 0; c < k_main; c += 32) {
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) {
      prefetch_ahead(w + r * ldw + c);
      wv[r] = (__m512bh)_mm512_loadu_si512(w + r * ldw + c);
    }
    for (int j = 0; j < J; ++j) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x[j] + c);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv[r], xv);
    }
  }
  if (k_main < k) {
    const __mmask32 m = static_cast<__mmask32>((1ull << (k - k_main)) - 1);
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(m, w + r * ldw + k_main);
    for (int j = 0; j < J; ++j) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, x[j] + k_main);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv[r], xv);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) out[j * ldo + r] = _mm512_reduce_add_ps(acc[r][j]);
}

void dot_rows_bf16(const Bf16* w, size_t ldw, int rows, int k, const Bf16* const* x, int n,
                   float* out, size_t ldo) {
  schedule_rows(
      w, ldw, rows, x, n, out, ldo,
      [=](auto count, const Bf16* wr, const Bf16* const* xj, float* o) {
        dot_tile4_bf16<decltype(count)::value>(wr, ldw, k, xj, o, ldo);
      },
      [=](auto count, const Bf16* wr, const Bf16* const* xj, float* o) {
        dot_row_bf16<decltype(count)::value>(wr, k, xj, o, ldo);
      });
}

// ---- router, double accumulation ----

inline __m512 load_router16(const void* w, bool f32, int c, __mmask16 m) {
  return f32 ? _mm512_maskz_loadu_ps(m, static_cast<const float*>(w) + c)
             : load_bf16x16_masked(static_cast<const Bf16*>(w) + c, m);
}

// One router row against J tokens: the 16 weights of a step are widened to double once and used
// for every token (the router is read once per call however many tokens there are). The rows
// are prefetched kPrefetchBytes ahead, one cache line a step or two. why: a step's widening and
// its two double chains leave few loads in flight, so without it the stream waits on each load's
// latency (docs/decisions/fp8_experts.md).
template <int J>
void router_row(const void* w, bool f32, int k, const double* const* x, double* out, size_t ldo) {
  __m512d a0[J], a1[J];
  for (int j = 0; j < J; ++j) a0[j] = a1[j] = _mm512_setzero_pd();
  const int k_main = k & ~15;
  const char* bytes = static_cast<const char*>(w);
  const int elem = f32 ? 4 : 2;
  for (int c = 0; c < k_main; c += 16) {
    if (f32 || (c & 31) == 0) _mm_prefetch(bytes + c * elem + kPrefetchBytes, _MM_HINT_T1);
    const __m512 wf = load_router16(w, f32, c, 0xffff);
    const __m512d w0 = _mm512_cvtps_pd(_mm512_castps512_ps256(wf));
    const __m512d w1 =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(wf), 1)));
    for (int j = 0; j < J; ++j) {
      a0[j] = _mm512_fmadd_pd(w0, _mm512_loadu_pd(x[j] + c), a0[j]);
      a1[j] = _mm512_fmadd_pd(w1, _mm512_loadu_pd(x[j] + c + 8), a1[j]);
    }
  }
  if (k_main < k) {
    const __mmask16 m = static_cast<__mmask16>((1u << (k - k_main)) - 1);
    const __m512 wf = load_router16(w, f32, k_main, m);
    const __m512d w0 = _mm512_cvtps_pd(_mm512_castps512_ps256(wf));
    const __m512d w1 =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(wf), 1)));
    const __mmask8 m0 = static_cast<__mmask8>(m & 0xff), m1 = static_cast<__mmask8>(m >> 8);
    for (int j = 0; j < J; ++j) {
      a0[j] = _mm512_fmadd_pd(w0, _mm512_maskz_loadu_pd(m0, x[j] + k_main), a0[j]);
      a1[j] = _mm512_fmadd_pd(w1, _mm512_maskz_loadu_pd(m1, x[j] + k_main + 8), a1[j]);
    }
  }
  for (int j = 0; j < J; ++j) out[j * ldo] = _mm512_reduce_add_pd(_mm512_add_pd(a0[j], a1[j]));
}

void router_dot(const void* w, bool w_f32, size_t ldw, int rows, int k, const double* const* x,
                int n, double* out, size_t ldo) {
  const size_t elem = w_f32 ? 4 : 2;
  for (int r = 0; r < rows; ++r) {
    const void* wr = static_cast<const uint8_t*>(w) + r * ldw * elem;
    int j = 0;
    for (; j + 4 <= n; j += 4) router_row<4>(wr, w_f32, k, x + j, out + j * ldo + r, ldo);
    with_static_count<3>(n - j, [&](auto count) {
      router_row<decltype(count)::value>(wr, w_f32, k, x + j, out + j * ldo + r, ldo);
    });
  }
}

float read_sum(const float* p, size_t count) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  const size_t main = count & ~size_t{63};
  for (size_t i = 0; i < main; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  for (size_t i = main; i < count; ++i) s += p[i];
  return s;
}

}  // namespace

const Kernels& avx512_kernels() {
  static const Kernels k{.name = "avx512",
                         .dot_rows_f32 = dot_rows_f32,
                         .dot_rows_bf16 = dot_rows_bf16,
                         .router_dot = router_dot,
                         .dequant_fp8_row = dequant_fp8_row_avx512,
                         .dot_rows_fp8_f32 = dot_rows_fp8_f32_avx512,
                         .dot_rows_fp8_bf16 = dot_rows_fp8_bf16_avx512,
                         .fp8_row_tokens = 2,
                         .dequant_mxfp4_row = dequant_mxfp4_row_avx512,
                         .dequant_mxfp8_row = dequant_mxfp8_row_avx512,
                         .dot_rows_mxfp4_f32 = cpu_has_avx512_vbmi() ? dot_rows_mxfp4_f32_avx512vbmi
                                                                     : dot_rows_mxfp4_f32_avx512,
                         .dot_rows_mxfp8_f32 = dot_rows_mxfp8_f32_avx512,
                         .dot_rows_mxfp4_bf16 = cpu_has_avx512_vbmi()
                                                    ? dot_rows_mxfp4_bf16_avx512vbmi
                                                    : dot_rows_mxfp4_bf16_avx512,
                         .dot_rows_mxfp8_bf16 = dot_rows_mxfp8_bf16_avx512,
                         .mx_row_tokens = 2,
                         .read_sum = read_sum};
  return k;
}

}  // namespace moekit::cpu_fast::detail

#else  // not x86: no avx512 code; the table is never used (isa_supported() is false), but must link

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {
const Kernels& avx512_kernels() { return portable_kernels(); }
}  // namespace moekit::cpu_fast::detail

#endif

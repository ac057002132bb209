// The per-ISA inner loops of the fast CPU backend, as a table of function pointers filled by
// kernels_avx512.cpp, kernels_avx2.cpp (compiled with those -m flags) and kernels_portable.cpp.
// The layer (fast_layer.cpp, expert_jobs.cpp) only calls through this table after checking the
// CPU's features (isa_select.cpp), so no AVX instruction runs on a CPU without it.
//
// All GEMMs here are "many rows of weights against a few activation vectors": the weights are the
// large, streamed operand (each row read once per call), the activations stay in cache. Every
// kernel sums each output element in an order that depends only on k (lanes, then a fixed
// reduction), never on how rows or tokens are blocked, so results do not depend on threading.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "moekit/dtype.h"

namespace moekit::cpu_fast::detail {

// Calls f(std::integral_constant<int, n>{}) for a run-time n in [1, kMax] (nothing for other n).
// The SIMD kernels take their token count as a template argument, so their accumulators live in
// registers; this is the one switch from a run-time remainder to that argument.
template <int kMax, class F>
inline void with_static_count(int n, F&& f) {
  if constexpr (kMax >= 1) {
    if (n == kMax) {
      f(std::integral_constant<int, kMax>{});
      return;
    }
    with_static_count<kMax - 1>(n, std::forward<F>(f));
  }
}

struct Kernels {
  const char* name = "";

  // out[j * ldo + r] = sum_{c < k} w[r * ldw + c] * x[j][c]   for r < rows, j < n.
  // bf16 weights, fp32 activations, fp32 accumulation. Used for both expert GEMMs.
  void (*dot_rows_f32)(const Bf16* w, size_t ldw, int rows, int k, const float* const* x, int n,
                       float* out, size_t ldo) = nullptr;

  // Same with bf16 activations: products are exact, accumulation fp32 (AVX512-BF16 vdpbf16ps).
  // Null where the ISA has no bf16 dot product.
  void (*dot_rows_bf16)(const Bf16* w, size_t ldw, int rows, int k, const Bf16* const* x, int n,
                        float* out, size_t ldo) = nullptr;

  // Router GEMM, double accumulation like the reference: out[j * ldo + r] = sum_c w[r][c] * x[j][c]
  // with w bf16 (w_f32 false) or fp32 rows of stride ldw elements, x as doubles.
  void (*router_dot)(const void* w, bool w_f32, size_t ldw, int rows, int k, const double* const* x,
                     int n, double* out, size_t ldo) = nullptr;

  // out[c] = bf16(fp8(q[c]) * scale[c / 128]) for c < k: one row of an fp8 block-scale matrix
  // (e4m3fn codes, no NaN codes: the loader rejects them) dequantised exactly as a bf16 load of
  // the checkpoint holds it (round to nearest even), for the fp8 weight-only path.
  void (*dequant_fp8_row)(const uint8_t* q, const float* scale, int k, Bf16* out) = nullptr;

  // dot_rows_f32 on fp8 rows, for n <= fp8_row_tokens tokens (decode): row r is q + r * ldq with
  // its tile scales at scale + ((r0 + r) / 128) * scale_ld; each weight is bf16(fp8 x scale),
  // made in registers, and summed exactly as dot_rows_f32 sums the dequantised row (so the
  // result equals dequant_fp8_row + dot_rows_f32 bit for bit, without the bf16 row in memory).
  // Null where an ISA has none; more tokens go through dequant_fp8_row.
  void (*dot_rows_fp8_f32)(const uint8_t* q, size_t ldq, const float* scale, size_t scale_ld,
                           int r0, int rows, int k, const float* const* x, int n, float* out,
                           size_t ldo) = nullptr;
  // The same on bf16 activations, summed as dot_rows_bf16 sums (vdpbf16ps): the gate/up
  // projection where it runs on bf16 activations. Null where dot_rows_bf16 is.
  void (*dot_rows_fp8_bf16)(const uint8_t* q, size_t ldq, const float* scale, size_t scale_ld,
                            int r0, int rows, int k, const Bf16* const* x, int n, float* out,
                            size_t ldo) = nullptr;
  int fp8_row_tokens = 0;

  // out[c] = bf16(element(c) x 2^(scale[c / 32] - 127)) for c < k (k a multiple of 32): one row
  // of an OCP MX matrix (MXFP4: e2m1 pairs, the even column in the low nibble; MXFP8: e4m3fn
  // bytes) dequantised as the CPU reference does (cpu/reference_mx.h), through a table of the
  // element values, an fp32 multiply by the e8m0 scale and bf16's round to nearest even.
  void (*dequant_mxfp4_row)(const uint8_t* q, const uint8_t* scale, int k, Bf16* out) = nullptr;
  void (*dequant_mxfp8_row)(const uint8_t* q, const uint8_t* scale, int k, Bf16* out) = nullptr;

  // dot_rows_f32 / dot_rows_bf16 on MX rows, for n <= mx_row_tokens tokens (decode): row r is
  // q + r * ldq bytes with its e8m0 bytes at scale + r * lds, k a multiple of 32; each weight is
  // made in registers and summed exactly as dot_rows_f32 / dot_rows_bf16 sum the dequantised row
  // (so the result equals dequant_mx*_row + that kernel bit for bit). Null where an ISA has none
  // (the bf16 ones exist only where dot_rows_bf16 does); more tokens go through dequant_mx*_row.
  using MxRowsF32 = void (*)(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                             int rows, int k, const float* const* x, int n, float* out,
                             size_t ldo);
  using MxRowsBf16 = void (*)(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                              int rows, int k, const Bf16* const* x, int n, float* out,
                              size_t ldo);
  MxRowsF32 dot_rows_mxfp4_f32 = nullptr;
  MxRowsF32 dot_rows_mxfp8_f32 = nullptr;
  MxRowsBf16 dot_rows_mxfp4_bf16 = nullptr;
  MxRowsBf16 dot_rows_mxfp8_bf16 = nullptr;
  int mx_row_tokens = 0;

  // Sum of count floats (the read-bandwidth probe; the result only defeats dead-code removal).
  float (*read_sum)(const float* p, size_t count) = nullptr;
};

// The fp8 row dequantisers (fp8_dequant_*.cpp), one per table.
void dequant_fp8_row_portable(const uint8_t* q, const float* scale, int k, Bf16* out);
void dequant_fp8_row_avx2(const uint8_t* q, const float* scale, int k, Bf16* out);
void dequant_fp8_row_avx512(const uint8_t* q, const float* scale, int k, Bf16* out);
void dot_rows_fp8_f32_avx2(const uint8_t* q, size_t ldq, const float* scale, size_t scale_ld,
                           int r0, int rows, int k, const float* const* x, int n, float* out,
                           size_t ldo);
void dot_rows_fp8_f32_avx512(const uint8_t* q, size_t ldq, const float* scale, size_t scale_ld,
                             int r0, int rows, int k, const float* const* x, int n, float* out,
                             size_t ldo);
void dot_rows_fp8_bf16_avx512(const uint8_t* q, size_t ldq, const float* scale, size_t scale_ld,
                              int r0, int rows, int k, const Bf16* const* x, int n, float* out,
                              size_t ldo);

// The MX row dequantisers (mx_dequant_*.cpp), one pair per table.
void dequant_mxfp4_row_portable(const uint8_t* q, const uint8_t* scale, int k, Bf16* out);
void dequant_mxfp8_row_portable(const uint8_t* q, const uint8_t* scale, int k, Bf16* out);
void dequant_mxfp4_row_avx2(const uint8_t* q, const uint8_t* scale, int k, Bf16* out);
void dequant_mxfp8_row_avx2(const uint8_t* q, const uint8_t* scale, int k, Bf16* out);
void dequant_mxfp4_row_avx512(const uint8_t* q, const uint8_t* scale, int k, Bf16* out);
void dequant_mxfp8_row_avx512(const uint8_t* q, const uint8_t* scale, int k, Bf16* out);
void dot_rows_mxfp4_f32_avx2(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                             int rows, int k, const float* const* x, int n, float* out, size_t ldo);
void dot_rows_mxfp8_f32_avx2(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                             int rows, int k, const float* const* x, int n, float* out, size_t ldo);
void dot_rows_mxfp4_f32_avx512(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                               int rows, int k, const float* const* x, int n, float* out,
                               size_t ldo);
void dot_rows_mxfp8_f32_avx512(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                               int rows, int k, const float* const* x, int n, float* out,
                               size_t ldo);
void dot_rows_mxfp4_bf16_avx512(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                                int rows, int k, const Bf16* const* x, int n, float* out,
                                size_t ldo);
void dot_rows_mxfp8_bf16_avx512(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                                int rows, int k, const Bf16* const* x, int n, float* out,
                                size_t ldo);
// dot_rows_mxfp4_f32_avx512 / _bf16_avx512 with VBMI-made indices (mx_dot_avx512vbmi.cpp): the
// AVX-512 table's MXFP4 rows where cpu_has_avx512_vbmi().
void dot_rows_mxfp4_f32_avx512vbmi(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                                   int rows, int k, const float* const* x, int n, float* out,
                                   size_t ldo);
void dot_rows_mxfp4_bf16_avx512vbmi(const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                                    int rows, int k, const Bf16* const* x, int n, float* out,
                                    size_t ldo);
// Whether this CPU has AVX512-VBMI (vpermb) beside the AVX-512 table's features.
bool cpu_has_avx512_vbmi();
// 2^(s - 127) for every e8m0 byte s (255, NaN, never reaches a kernel: the loader rejects it).
const float* mx_scale_table();
// The 16 e2m1 values times 2^(s - 127) for every e8m0 byte s < 255, as fp32 and as bf16 (the
// products are exact in both), 64-byte aligned rows: the MXFP4 decode kernels' lookup tables.
struct alignas(64) E2m1Row {
  float f32[16];
};
struct alignas(32) E2m1RowBf16 {
  uint16_t bits[16];
};
const E2m1Row* mx_e2m1_f32_table();       // [255]
const E2m1RowBf16* mx_e2m1_bf16_table();  // [255]

const Kernels& portable_kernels();
// These two may only be called on a CPU that has the instructions (they are plain tables, but
// using them elsewhere faults).
const Kernels& avx2_kernels();
const Kernels& avx512_kernels();

}  // namespace moekit::cpu_fast::detail

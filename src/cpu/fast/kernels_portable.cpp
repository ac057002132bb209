// Portable inner loops of the fast CPU backend (no intrinsics; runs on any CPU).
//
// Each dot product keeps kLanes partial sums (lane l sums the elements c = l mod kLanes), which
// the compiler can map onto whatever vector registers the baseline ISA has, then adds the lanes
// in a fixed tree. Rows are streamed one at a time in address order; for each row every token
// is done before the next row (the row, the streamed operand, stays in L1 across tokens).
#include <cstring>

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {
namespace {

constexpr int kLanes = 8;

inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float reduce_lanes(const float* a) {
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

// One weight row against one fp32 vector.
float dot_row(const Bf16* w, int k, const float* x) {
  float acc[kLanes] = {};
  const int k_main = k - k % kLanes;
  for (int c = 0; c < k_main; c += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += bf16_bits_to_float(w[c + l].bits) * x[c + l];
  }
  float s = reduce_lanes(acc);
  for (int c = k_main; c < k; ++c) s += bf16_bits_to_float(w[c].bits) * x[c];
  return s;
}

void dot_rows_f32(const Bf16* w, size_t ldw, int rows, int k, const float* const* x, int n,
                  float* out, size_t ldo) {
  // One row at a time, in address order: one sequential stream for the hardware prefetchers.
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) out[j * ldo + r] = dot_row(w + r * ldw, k, x[j]);
  }
}

template <typename W>
double router_row(const W* w, int k, const double* x) {
  double acc[kLanes] = {};
  const int k_main = k - k % kLanes;
  for (int c = 0; c < k_main; c += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      double wv;
      if constexpr (sizeof(W) == 2) {
        wv = bf16_bits_to_float(w[c + l].bits);
      } else {
        wv = w[c + l];
      }
      acc[l] += wv * x[c + l];
    }
  }
  double s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (int c = k_main; c < k; ++c) {
    if constexpr (sizeof(W) == 2) {
      s += bf16_bits_to_float(w[c].bits) * x[c];
    } else {
      s += static_cast<double>(w[c]) * x[c];
    }
  }
  return s;
}

void router_dot(const void* w, bool w_f32, size_t ldw, int rows, int k, const double* const* x,
                int n, double* out, size_t ldo) {
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) {
      out[j * ldo + r] = w_f32 ? router_row(static_cast<const float*>(w) + r * ldw, k, x[j])
                               : router_row(static_cast<const Bf16*>(w) + r * ldw, k, x[j]);
    }
  }
}

float read_sum(const float* p, size_t count) {
  float acc[kLanes] = {};
  const size_t main = count - count % kLanes;
  for (size_t i = 0; i < main; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += p[i + l];
  }
  float s = reduce_lanes(acc);
  for (size_t i = main; i < count; ++i) s += p[i];
  return s;
}

}  // namespace

const Kernels& portable_kernels() {
  static const Kernels k{.name = "portable",
                         .dot_rows_f32 = dot_rows_f32,
                         .dot_rows_bf16 = nullptr,
                         .router_dot = router_dot,
                         .dequant_fp8_row = dequant_fp8_row_portable,
                         .dequant_mxfp4_row = dequant_mxfp4_row_portable,
                         .dequant_mxfp8_row = dequant_mxfp8_row_portable,
                         .read_sum = read_sum};
  return k;
}

}  // namespace moekit::cpu_fast::detail

// fp8 block-scale weights kept as stored (fp8_experts.h).
#include "io/fp8_experts.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/tensor_convert.h"
#include "moekit/error.h"
#include "moekit/weights.h"

namespace moekit::io {

void require_fp8(const MatrixSrc& m, const std::string& what) {
  const std::string dtype =
      m.fp4 ? "packed FP4 (" + m.w.info->dtype_name + ")" : dtype_name(m.dtype);
  MK_CHECK(!m.fp4 && m.dtype == DType::F8_E4M3 && m.scale,
           "checkpoint tensor " << m.w.where() << " (" << what << "): expected dtype F8_E4M3 with "
                                << "a 128x128 block scale to keep the experts in fp8, got " << dtype
                                << " (load with expert dtype BF16 to dequantise)");
}

const uint8_t* fp8_bytes(const MatrixSrc& m) {
  return static_cast<const uint8_t*>(m.w.file->data(m.w.name())) + m.offset;
}

void read_fp8_scales(const MatrixSrc& m, bool ue8m0, float* out) {
  const size_t rb = ceil_div(m.rows, kFp8Block), kb = ceil_div(m.cols, kFp8Block);
  const void* data = m.scale.file->raw_data(m.scale.name());
  const std::string& dtype = m.scale.info->dtype_name;
  const std::string where = m.scale.where();
  for (size_t i = 0; i < rb * kb; ++i) {
    // scale_value throws for NaN, infinite and negative values.
    const float v = scale_value(dtype, data, m.scale_offset + i, where);
    MK_CHECK(v > 0.0f, "scale tensor " << where << ": tile (" << i / kb << ", " << i % kb
                                       << ") is 0, expected a finite scale > 0");
    int exponent = 0;
    MK_CHECK(!ue8m0 || std::frexp(v, &exponent) == 0.5f,
             "scale tensor " << where << ": tile (" << i / kb << ", " << i % kb << ") is " << v
                             << ", but quantization_config.scale_fmt is ue8m0 (expected a "
                             << "power of two)");
    out[i] = v;
  }
}

void check_fp8_codes(const uint8_t* q, size_t rows, size_t cols, const std::string& what) {
  const size_t n = rows * cols;
  // Branch-free per block of 4 KB, so the scan vectorises; the exact spot only on a hit.
  constexpr size_t kBlock = 4096;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t end = std::min(n, b + kBlock);
    unsigned nan = 0;
    for (size_t i = b; i < end; ++i) nan |= (q[i] & 0x7fu) == 0x7fu;
    if (!nan) continue;
    for (size_t i = b; i < end; ++i) {
      MK_CHECK((q[i] & 0x7fu) != 0x7fu, what << " holds an e4m3 NaN code (0x" << std::hex
                                             << unsigned(q[i]) << std::dec << ") at row "
                                             << i / cols << ", column " << i % cols
                                             << ": expected finite weights");
    }
  }
}

void build_fp8_mlp(const MatrixSrc& gate, const MatrixSrc* up, const MatrixSrc& down, size_t width,
                   size_t hidden, bool ue8m0, const std::string& w13_what,
                   const std::string& w2_what, ExpertStorage& out) {
  const size_t tiles = ceil_div(width, kFp8Block) * ceil_div(hidden, kFp8Block);
  out.w13_scale.resize(2 * tiles);
  if (up == nullptr) {
    // a stacked [2*width, hidden] slice: its 2*width/128 tile rows are the gate's, then the up's
    out.view.w13_fp8 = fp8_bytes(gate);
    read_fp8_scales(gate, ue8m0, out.w13_scale.data());
  } else {
    out.w13_fp8.resize(2 * width * hidden);
    std::memcpy(out.w13_fp8.data(), fp8_bytes(gate), width * hidden);
    std::memcpy(out.w13_fp8.data() + width * hidden, fp8_bytes(*up), width * hidden);
    read_fp8_scales(gate, ue8m0, out.w13_scale.data());
    read_fp8_scales(*up, ue8m0, out.w13_scale.data() + tiles);
  }
  out.view.w2_fp8 = fp8_bytes(down);
  out.w2_scale.resize(tiles);
  read_fp8_scales(down, ue8m0, out.w2_scale.data());
  out.view_owned();
  check_fp8_codes(out.view.w13_fp8, 2 * width, hidden, w13_what);
  check_fp8_codes(out.view.w2_fp8, hidden, width, w2_what);
}

void repack_shared_slot_fp8(const MoeSpec& spec, const LayerWeights& w, int slot,
                            ExpertStorage& out) {
  const size_t H = spec.hidden, I = spec.expert_intermediate, Is = spec.shared_intermediate;
  const int S = spec.shared_slots();
  MK_CHECK(S > 0, "spec " << spec.name << " cannot fuse its shared expert: shared width " << Is
                          << " is not a positive multiple of I = " << I);
  MK_CHECK(slot >= 0 && slot < S,
           "shared slot out of range: expected 0 <= slot < " << S << ", got " << slot);
  MK_CHECK(w.shared_w13_fp8() && w.shared_w2_fp8(),
           "spec " << spec.name << " has no fp8 shared MLP weights to fuse");
  const size_t j0 = static_cast<size_t>(slot) * I;
  MK_CHECK(S == 1 || I % kFp8Block == 0,
           "fp8 shared-expert fusion of " << spec.name << ": slot " << slot << " starts at column "
                                          << j0 << " of the shared MLP, and with I = " << I
                                          << " (not a multiple of " << kFp8Block
                                          << ") the slots do not fall on the 128x128 scale tiles; "
                                          << "run the shared expert unfused");
  const size_t kbH = ceil_div(H, kFp8Block), rbI = ceil_div(I, kFp8Block);
  const size_t rbIs = ceil_div(Is, kFp8Block), kbIs = ceil_div(Is, kFp8Block);
  const size_t t0 = j0 / kFp8Block;  // the slot's first tile row (w13) / column (w2)

  out.w13_fp8.resize(2 * I * H);
  std::memcpy(out.w13_fp8.data(), w.shared_w13_fp8() + j0 * H, I * H);
  std::memcpy(out.w13_fp8.data() + I * H, w.shared_w13_fp8() + (Is + j0) * H, I * H);
  out.w13_scale.resize(2 * rbI * kbH);
  const float* ss = w.shared_w13_scale();
  std::memcpy(out.w13_scale.data(), ss + t0 * kbH, rbI * kbH * sizeof(float));
  std::memcpy(out.w13_scale.data() + rbI * kbH, ss + (rbIs + t0) * kbH, rbI * kbH * sizeof(float));

  out.w2_fp8.resize(H * I);
  for (size_t h = 0; h < H; ++h)
    std::memcpy(out.w2_fp8.data() + h * I, w.shared_w2_fp8() + h * Is + j0, I);
  out.w2_scale.resize(ceil_div(H, kFp8Block) * rbI);
  for (size_t r = 0; r < ceil_div(H, kFp8Block); ++r)
    std::memcpy(out.w2_scale.data() + r * rbI, w.shared_w2_scale() + r * kbIs + t0,
                rbI * sizeof(float));
  if (spec.has_expert_bias) {
    out.b13.assign(2 * I, 0.0f);
    out.b2.assign(H, 0.0f);
  }
  out.view_owned();
}

}  // namespace moekit::io

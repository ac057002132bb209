// OCP MX weights kept as stored (mx_experts.h).
#include "io/mx_experts.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "io/tensor_convert.h"
#include "moekit/error.h"

namespace moekit::io {

namespace {

// e2m1 magnitudes by code (OCP MX v1.0, table of FP4 E2M1): 0, 0.5, 1, 1.5, 2, 3, 4, 6.
constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

const char* format_word(ExpertFormat f) { return f == ExpertFormat::Mxfp4 ? "mxfp4" : "mxfp8"; }

}  // namespace

float mx_scale_value(uint8_t s) { return std::ldexp(1.0f, static_cast<int>(s) - 127); }

float mx_element_value(ExpertFormat f, uint8_t code) {
  if (f == ExpertFormat::Mxfp4) {
    const float v = kE2m1[code & 7];
    return (code & 8) ? -v : v;
  }
  static const std::array<float, 256> e4m3 = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_float(static_cast<uint8_t>(i));
    return t;
  }();
  return e4m3[code];
}

void check_mx_rows(ExpertFormat f, const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                   size_t rows, size_t cols, const std::string& what) {
  const bool fp4 = f == ExpertFormat::Mxfp4;
  const size_t groups = cols / kMxGroup, group_bytes = fp4 ? kMxGroup / 2 : kMxGroup;
  for (size_t r = 0; r < rows; ++r) {
    const uint8_t* qr = q + r * ldq;
    const uint8_t* sr = scale + r * lds;
    for (size_t g = 0; g < groups; ++g) {
      MK_CHECK(sr[g] != 255, what << ": the e8m0 scale of row " << r << ", columns ["
                                  << g * kMxGroup << ", " << (g + 1) * kMxGroup
                                  << ") is 255 (NaN), expected a byte 0..254 (2^(s-127))");
      // Element codes are sign-magnitude with the magnitude increasing with the low bits, so the
      // largest magnitude code is the block's largest |element|.
      unsigned largest = 0;
      const uint8_t* b = qr + g * group_bytes;
      for (size_t i = 0; i < group_bytes; ++i) {
        if (fp4) {
          largest = std::max({largest, b[i] & 7u, (b[i] >> 4) & 7u});
        } else {
          largest = std::max(largest, b[i] & 0x7fu);
        }
      }
      if (!fp4 && largest == 0x7f) {
        for (size_t i = 0; i < group_bytes; ++i)
          MK_CHECK((b[i] & 0x7f) != 0x7f,
                   what << " holds an e4m3 NaN code (0x" << std::hex << unsigned(b[i]) << std::dec
                        << ") at row " << r << ", column " << g * kMxGroup + i
                        << ": expected finite weights");
      }
      const float top = mx_element_value(f, static_cast<uint8_t>(largest)) * mx_scale_value(sr[g]);
      MK_CHECK(std::isfinite(top),
               what << ": row " << r << ", columns [" << g * kMxGroup << ", "
                    << (g + 1) * kMxGroup << ") overflow: the largest " << format_word(f)
                    << " element " << mx_element_value(f, static_cast<uint8_t>(largest))
                    << " times 2^(" << int(sr[g]) << " - 127) is not a finite float");
    }
  }
}

void mx_decode_row(ExpertFormat f, const uint8_t* q, const uint8_t* scale, size_t cols,
                   Bf16* out) {
  for (size_t g = 0; g < cols / kMxGroup; ++g) {
    const float s = mx_scale_value(scale[g]);
    for (size_t c = g * kMxGroup; c < (g + 1) * kMxGroup; ++c) {
      const uint8_t code = f == ExpertFormat::Mxfp4 ? (q[c / 2] >> (4 * (c % 2))) & 15 : q[c];
      out[c] = float_to_bf16(mx_element_value(f, code) * s);
    }
  }
}

namespace {

// Nearest e2m1 code to x, ties to the even code (the even mantissa): round to nearest even. The
// midpoints of the values {0, 0.5, 1, 1.5, 2, 3, 4, 6} decide, each tie going to the neighbour of
// even code; a NaN gives code 0, beyond 6 saturates to 7.
uint8_t e2m1_encode(float x) {
  const float a = std::fabs(x);
  uint8_t best = 7;
  if (std::isnan(x) || a <= 0.25f) {
    best = 0;
  } else if (a < 0.75f) {
    best = 1;
  } else if (a <= 1.25f) {
    best = 2;
  } else if (a < 1.75f) {
    best = 3;
  } else if (a <= 2.5f) {
    best = 4;
  } else if (a < 3.5f) {
    best = 5;
  } else if (a <= 5.0f) {
    best = 6;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) && best != 0 ? 8 : 0));
}

}  // namespace

void mx_quantize_row(ExpertFormat f, const Bf16* row, size_t cols, uint8_t* q, uint8_t* scale) {
  const bool fp4 = f == ExpertFormat::Mxfp4;
  const int emax = fp4 ? 2 : 8;
  if (fp4) std::memset(q, 0, cols / 2);
  for (size_t g = 0; g < cols / kMxGroup; ++g) {
    float amax = 0.0f;
    for (size_t c = g * kMxGroup; c < (g + 1) * kMxGroup; ++c)
      amax = std::max(amax, std::fabs(bf16_to_float(row[c])));
    int e = 0;
    if (amax > 0.0f) {
      std::frexp(amax, &e);  // amax = m 2^e, m in [0.5, 1): floor(log2 amax) = e - 1
      e = std::clamp(e - 1 - emax, -127, 127);
    }
    scale[g] = static_cast<uint8_t>(e + 127);
    // (2^-e is a float for e in [-127, 127], so the product rounds as ldexp would)
    const float inv = std::ldexp(1.0f, -e);
    for (size_t c = g * kMxGroup; c < (g + 1) * kMxGroup; ++c) {
      const float v = bf16_to_float(row[c]) * inv;
      if (fp4) {
        q[c / 2] |= static_cast<uint8_t>(e2m1_encode(v) << (4 * (c % 2)));
      } else {
        q[c] = fp8_e4m3_encode(v);
      }
    }
  }
}

void require_mxfp8(const MatrixSrc& m, const std::string& what) {
  const std::string dtype =
      m.fp4 ? "packed FP4 (" + m.w.info->dtype_name + ")"
            : std::string(dtype_name(m.dtype)) + (m.dtype == DType::F8_E4M3 && !m.mx8
                                                       ? " with a 128x128 block scale"
                                                       : "");
  MK_CHECK(!m.fp4 && m.dtype == DType::F8_E4M3 && m.mx8 && m.scale,
           "checkpoint tensor " << m.w.where() << " (" << what << "): expected dtype F8_E4M3 with "
                                << "a 1x32 e8m0 scale to keep the experts in mxfp8, got " << dtype
                                << " (load with expert format bf16 to dequantise)");
}

const uint8_t* mx_bytes(const MatrixSrc& m) {
  return static_cast<const uint8_t*>(m.w.file->raw_data(m.w.name())) + m.offset;
}

const uint8_t* mx_scale_bytes(const MatrixSrc& m) {
  return static_cast<const uint8_t*>(m.scale.file->raw_data(m.scale.name())) + m.scale_offset;
}

void build_mxfp8_mlp(const MatrixSrc& gate, const MatrixSrc* up, const MatrixSrc& down,
                     size_t width, size_t hidden, const std::string& w13_what,
                     const std::string& w2_what, ExpertStorage& out) {
  const size_t gh = hidden / kMxGroup;
  if (up == nullptr) {
    out.view.w13_mx = mx_bytes(gate);
    out.view.w13_mx_scale = mx_scale_bytes(gate);
  } else {
    out.w13_mx.resize(2 * width * hidden);
    std::memcpy(out.w13_mx.data(), mx_bytes(gate), width * hidden);
    std::memcpy(out.w13_mx.data() + width * hidden, mx_bytes(*up), width * hidden);
    out.w13_mx_scale.resize(2 * width * gh);
    std::memcpy(out.w13_mx_scale.data(), mx_scale_bytes(gate), width * gh);
    std::memcpy(out.w13_mx_scale.data() + width * gh, mx_scale_bytes(*up), width * gh);
  }
  out.view.w2_mx = mx_bytes(down);
  out.view.w2_mx_scale = mx_scale_bytes(down);
  out.view.mx_format = ExpertFormat::Mxfp8;
  out.view_owned();
  check_mx_rows(ExpertFormat::Mxfp8, out.view.w13_mx, hidden, out.view.w13_mx_scale, gh,
                2 * width, hidden, w13_what);
  check_mx_rows(ExpertFormat::Mxfp8, out.view.w2_mx, width, out.view.w2_mx_scale,
                width / kMxGroup, hidden, width, w2_what);
}

void build_gpt_oss_mxfp4(const uint8_t* gate_up_blocks, const uint8_t* gate_up_scales,
                         const uint8_t* down_blocks, const uint8_t* down_scales, size_t inter,
                         size_t hidden, const std::string& w13_what, const std::string& w2_what,
                         ExpertStorage& out) {
  const size_t row = hidden / 2, gh = hidden / kMxGroup;
  out.w13_mx.resize(2 * inter * row);
  out.w13_mx_scale.resize(2 * inter * gh);
  for (size_t r = 0; r < 2 * inter; ++r) {
    // checkpoint row 2i is gate row i, row 2i+1 up row i (moekit's row I + i)
    const size_t dst = (r % 2 ? inter : 0) + r / 2;
    std::memcpy(out.w13_mx.data() + dst * row, gate_up_blocks + r * row, row);
    std::memcpy(out.w13_mx_scale.data() + dst * gh, gate_up_scales + r * gh, gh);
  }
  out.view.w2_mx = down_blocks;
  out.view.w2_mx_scale = down_scales;
  out.view.mx_format = ExpertFormat::Mxfp4;
  out.view_owned();
  check_mx_rows(ExpertFormat::Mxfp4, out.view.w13_mx, row, out.view.w13_mx_scale, gh, 2 * inter,
                hidden, w13_what);
  check_mx_rows(ExpertFormat::Mxfp4, out.view.w2_mx, inter / 2, out.view.w2_mx_scale,
                inter / kMxGroup, hidden, inter, w2_what);
}

void repack_shared_slot_mx(const MoeSpec& spec, const LayerWeights& w, int slot,
                           ExpertStorage& out) {
  const ExpertFormat f = w.expert_format();
  const size_t H = spec.hidden, I = spec.expert_intermediate, Is = spec.shared_intermediate;
  const int S = spec.shared_slots();
  MK_CHECK(S > 0, "spec " << spec.name << " cannot fuse its shared expert: shared width " << Is
                          << " is not a positive multiple of I = " << I);
  MK_CHECK(slot >= 0 && slot < S,
           "shared slot out of range: expected 0 <= slot < " << S << ", got " << slot);
  MK_CHECK(w.shared_w13_mx() && w.shared_w2_mx(),
           "spec " << spec.name << " has no " << format_word(f) << " shared MLP weights to fuse");
  MK_CHECK(I % kMxGroup == 0, "MX shared-expert fusion of " << spec.name << ": I = " << I
                                                            << " is not a multiple of 32");
  const size_t j0 = static_cast<size_t>(slot) * I;
  const size_t row = mx_row_bytes(f, H), gh = H / kMxGroup;
  out.w13_mx.resize(2 * I * row);
  std::memcpy(out.w13_mx.data(), w.shared_w13_mx() + j0 * row, I * row);
  std::memcpy(out.w13_mx.data() + I * row, w.shared_w13_mx() + (Is + j0) * row, I * row);
  out.w13_mx_scale.resize(2 * I * gh);
  std::memcpy(out.w13_mx_scale.data(), w.shared_w13_mx_scale() + j0 * gh, I * gh);
  std::memcpy(out.w13_mx_scale.data() + I * gh, w.shared_w13_mx_scale() + (Is + j0) * gh, I * gh);

  // down [H, Is] -> columns [j0, j0 + I) of each row: bytes and scale bytes
  const size_t src_row = mx_row_bytes(f, Is), dst_row = mx_row_bytes(f, I);
  const size_t byte0 = mx_row_bytes(f, j0);
  out.w2_mx.resize(H * dst_row);
  out.w2_mx_scale.resize(H * (I / kMxGroup));
  for (size_t h = 0; h < H; ++h) {
    std::memcpy(out.w2_mx.data() + h * dst_row, w.shared_w2_mx() + h * src_row + byte0, dst_row);
    std::memcpy(out.w2_mx_scale.data() + h * (I / kMxGroup),
                w.shared_w2_mx_scale() + h * (Is / kMxGroup) + j0 / kMxGroup, I / kMxGroup);
  }
  if (spec.has_expert_bias) {
    out.b13.assign(2 * I, 0.0f);
    out.b2.assign(H, 0.0f);
  }
  out.view.mx_format = f;
  out.view_owned();
}

}  // namespace moekit::io

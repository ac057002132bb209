// What the engine API tests share (tests/test_engine_api.cpp, tests/cuda/test_engine_api_gpu.cpp):
// an engine's own copy of a layer's weights in vLLM's fused_experts layout (stacks [n, 2I, H] and
// [n, H, I], the fused shared slots after the routed experts; bf16, or fp8 block-scale bytes and
// tile scales for an Fp8Block LayerWeights), built from a LayerWeights, and the MoeWeightsView
// that borrows it; and the bf16 bit-for-bit comparison of outputs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "moekit/dtype.h"
#include "moekit/moe.h"
#include "moekit/routing.h"
#include "moekit/weights.h"

namespace moekit::test {

struct StackOptions {
  bool fused_slots = true;     // the stacks hold the fused shared slots (where the spec has them)
  bool unfused_shared = true;  // the view carries the unfused shared MLP
  int expert_offset = 0;       // the slice held
  int expert_count = -1;       // -1: E - expert_offset
  int64_t pad = 0;             // elements of padding after each expert's matrices (strides)
};

// The engine's buffers (host memory) and a view of them.
struct EngineStacks {
  std::vector<uint8_t> router;
  std::vector<float> router_bias, correction_bias;
  std::vector<Bf16> w13, w2, shared_w13, shared_w2;
  std::vector<float> b13, b2;
  // fp8 block-scale weights (a LayerWeights of expert_format Fp8Block) instead of w13 / w2
  std::vector<uint8_t> w13_fp8, w2_fp8;
  std::vector<float> w13_scale, w2_scale;
  // OCP MX weights (a LayerWeights of expert_format Mxfp4 / Mxfp8) instead of w13 / w2
  std::vector<uint8_t> w13_mx, w13_mx_scale, w2_mx, w2_mx_scale;
  MoeWeightsView view;
};

// The fp8 stacks of an Fp8Block LayerWeights: every row's e4m3 bytes and tile scales, with `pad`
// NaN elements after each expert's matrices and grids.
inline void copy_fp8_stacks(const LayerWeights& lw, const StackOptions& o, int count, int rows,
                            EngineStacks& s) {
  const MoeSpec& spec = lw.spec();
  const size_t H = spec.hidden, I = spec.expert_intermediate;
  const size_t s13 = 2 * I * H + o.pad, s2 = H * I + o.pad;
  const size_t g13 = fp8_w13_scale_floats(spec), g2 = fp8_w2_scale_floats(spec);
  const size_t t13 = g13 + o.pad, t2 = g2 + o.pad;
  s.w13_fp8.assign(rows * s13, 0x7f);  // e4m3 NaN
  s.w2_fp8.assign(rows * s2, 0x7f);
  s.w13_scale.assign(rows * t13, std::nanf(""));
  s.w2_scale.assign(rows * t2, std::nanf(""));
  for (int r = 0; r < rows; ++r) {
    const int e = r < count ? o.expert_offset + r : spec.num_experts + (r - count);
    const ExpertView ex = lw.expert(e);
    std::memcpy(s.w13_fp8.data() + r * s13, ex.w13_fp8, 2 * I * H);
    std::memcpy(s.w2_fp8.data() + r * s2, ex.w2_fp8, H * I);
    std::memcpy(s.w13_scale.data() + r * t13, ex.w13_scale, g13 * sizeof(float));
    std::memcpy(s.w2_scale.data() + r * t2, ex.w2_scale, g2 * sizeof(float));
  }
  MoeWeightsView& v = s.view;
  v.expert_dtype = DType::F8_E4M3;
  v.w13_fp8 = s.w13_fp8.data();
  v.w2_fp8 = s.w2_fp8.data();
  v.w13_scale = s.w13_scale.data();
  v.w2_scale = s.w2_scale.data();
  v.w13_expert_stride = static_cast<int64_t>(s13);
  v.w2_expert_stride = static_cast<int64_t>(s2);
  v.w13_scale_expert_stride = static_cast<int64_t>(t13);
  v.w2_scale_expert_stride = static_cast<int64_t>(t2);
}

// The MX stacks of an Mxfp4 / Mxfp8 LayerWeights: every row's packed bytes and e8m0 bytes, with
// `pad` bytes of 0xff (MXFP8's NaN code, MXFP4's -6 pair, e8m0's NaN) after each expert's.
inline void copy_mx_stacks(const LayerWeights& lw, const StackOptions& o, int count, int rows,
                           EngineStacks& s) {
  const MoeSpec& spec = lw.spec();
  const ExpertFormat f = lw.expert_format();
  const size_t H = spec.hidden, I = spec.expert_intermediate;
  const size_t q13 = 2 * I * mx_row_bytes(f, H), q2 = H * mx_row_bytes(f, I);
  const size_t g13 = 2 * I * (H / kMxGroup), g2 = H * (I / kMxGroup);
  const size_t p = static_cast<size_t>(o.pad);
  s.w13_mx.assign(rows * (q13 + p), 0xff);
  s.w2_mx.assign(rows * (q2 + p), 0xff);
  s.w13_mx_scale.assign(rows * (g13 + p), 0xff);
  s.w2_mx_scale.assign(rows * (g2 + p), 0xff);
  for (int r = 0; r < rows; ++r) {
    const int e = r < count ? o.expert_offset + r : spec.num_experts + (r - count);
    const ExpertView ex = lw.expert(e);
    std::memcpy(s.w13_mx.data() + r * (q13 + p), ex.w13_mx, q13);
    std::memcpy(s.w2_mx.data() + r * (q2 + p), ex.w2_mx, q2);
    std::memcpy(s.w13_mx_scale.data() + r * (g13 + p), ex.w13_mx_scale, g13);
    std::memcpy(s.w2_mx_scale.data() + r * (g2 + p), ex.w2_mx_scale, g2);
  }
  MoeWeightsView& v = s.view;
  v.mx_format = f;
  v.w13_mx = s.w13_mx.data();
  v.w2_mx = s.w2_mx.data();
  v.w13_mx_scale = s.w13_mx_scale.data();
  v.w2_mx_scale = s.w2_mx_scale.data();
  v.w13_expert_stride = static_cast<int64_t>(q13 + p);
  v.w2_expert_stride = static_cast<int64_t>(q2 + p);
  v.w13_scale_expert_stride = static_cast<int64_t>(g13 + p);
  v.w2_scale_expert_stride = static_cast<int64_t>(g2 + p);
}

inline EngineStacks make_stacks(const LayerWeights& lw, const StackOptions& o = {}) {
  const MoeSpec& spec = lw.spec();
  const int E = spec.num_experts;
  const size_t H = spec.hidden, I = spec.expert_intermediate;
  EngineStacks s;
  const size_t router_bytes =
      static_cast<size_t>(spec.router_columns()) * H * dtype_size(spec.router_dtype);
  s.router.resize(router_bytes);
  std::memcpy(s.router.data(), lw.router_weight(), router_bytes);
  if (lw.router_bias() != nullptr) s.router_bias.assign(lw.router_bias(), lw.router_bias() + E);
  if (lw.correction_bias() != nullptr)
    s.correction_bias.assign(lw.correction_bias(), lw.correction_bias() + E);
  const int count = o.expert_count < 0 ? E - o.expert_offset : o.expert_count;
  const int slots = o.fused_slots && spec.can_fuse_shared() ? spec.shared_slots() : 0;
  const int rows = count + slots;
  const bool fp8 = lw.expert_format() == ExpertFormat::Fp8Block;
  const bool mx =
      lw.expert_format() == ExpertFormat::Mxfp4 || lw.expert_format() == ExpertFormat::Mxfp8;
  const size_t s13 = 2 * I * H + o.pad, s2 = H * I + o.pad;
  const size_t sb13 = 2 * I + o.pad, sb2 = H + o.pad;
  if (!fp8 && !mx) {
    s.w13.assign(rows * s13, Bf16{0x7fc0});  // padding holds NaN: reading it would show
    s.w2.assign(rows * s2, Bf16{0x7fc0});
  }
  if (spec.has_expert_bias) {
    s.b13.assign(rows * sb13, 0.0f);
    s.b2.assign(rows * sb2, 0.0f);
  }
  for (int r = 0; r < rows; ++r) {
    const int e = r < count ? o.expert_offset + r : E + (r - count);
    const ExpertView ex = lw.expert(e);
    if (!fp8 && !mx) {
      std::memcpy(s.w13.data() + r * s13, ex.w13, 2 * I * H * sizeof(Bf16));
      std::memcpy(s.w2.data() + r * s2, ex.w2, H * I * sizeof(Bf16));
    }
    if (spec.has_expert_bias && ex.b13 != nullptr) {
      std::memcpy(s.b13.data() + r * sb13, ex.b13, 2 * I * sizeof(float));
      std::memcpy(s.b2.data() + r * sb2, ex.b2, H * sizeof(float));
    }
  }
  if (o.unfused_shared && lw.shared_w13() != nullptr) {
    const size_t Is = spec.shared_intermediate;
    s.shared_w13.assign(lw.shared_w13(), lw.shared_w13() + 2 * Is * H);
    s.shared_w2.assign(lw.shared_w2(), lw.shared_w2() + H * Is);
  }
  MoeWeightsView& v = s.view;
  v.location = Location::Host;
  v.router_weight = s.router.data();
  v.router_bias = s.router_bias.empty() ? nullptr : s.router_bias.data();
  v.correction_bias = s.correction_bias.empty() ? nullptr : s.correction_bias.data();
  v.w13 = s.w13.empty() ? nullptr : s.w13.data();
  v.w2 = s.w2.empty() ? nullptr : s.w2.data();
  v.w13_expert_stride = static_cast<int64_t>(s13);
  v.w2_expert_stride = static_cast<int64_t>(s2);
  if (spec.has_expert_bias) {
    v.b13 = s.b13.data();
    v.b2 = s.b2.data();
    v.b13_expert_stride = static_cast<int64_t>(sb13);
    v.b2_expert_stride = static_cast<int64_t>(sb2);
  }
  v.fused_slots = slots;
  v.shared_w13 = s.shared_w13.empty() ? nullptr : s.shared_w13.data();
  v.shared_w2 = s.shared_w2.empty() ? nullptr : s.shared_w2.data();
  v.expert_offset = o.expert_offset;
  v.expert_count = o.expert_count;
  if (fp8) copy_fp8_stacks(lw, o, count, rows, s);
  if (mx) copy_mx_stacks(lw, o, count, rows, s);
  return s;
}

// The k routed columns of a routing ([tokens, slots]: the fused slots after them dropped), as
// the caller's topk ids and weights of experts().
struct RoutedColumns {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};
inline RoutedColumns routed_columns(const Routing& r, int k) {
  RoutedColumns c;
  for (int t = 0; t < r.tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      c.ids.push_back(r.ids[static_cast<size_t>(t) * r.slots + j]);
      c.weights.push_back(r.weights[static_cast<size_t>(t) * r.slots + j]);
    }
  }
  return c;
}

// y (fp32) rounded to bf16, as the engine API writes it.
inline std::vector<Bf16> to_bf16(const std::vector<float>& y) {
  std::vector<Bf16> out(y.size());
  for (size_t i = 0; i < y.size(); ++i) out[i] = float_to_bf16(y[i]);
  return out;
}

// got == want bit for bit, or a failure naming how many elements differ and the first.
inline void expect_same_bits(const std::vector<Bf16>& got, const std::vector<Bf16>& want,
                             const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].bits != want[i].bits && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements differ, first at " << first << " ("
                     << bf16_to_float(got[first]) << " vs " << bf16_to_float(want[first]) << ")";
}

}  // namespace moekit::test

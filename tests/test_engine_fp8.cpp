// The engine API on fp8 block-scale host views (MoeWeightsView::expert_dtype F8_E4M3): an
// engine's e4m3 stacks and tile scales, borrowed, give the CPU backends' forward on the same
// fp8 LayerWeights bit for bit (the reference in W8A8 and weight-only, the fast backend
// weight-only), experts() on the reference's routing too, padded strides read only the experts,
// and bad fp8 views are errors that name the problem.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_test_util.h"
#include "expect_error.h"
#include "fp8_test_util.h"
#include "io_test_util.h"
#include "moekit/cpu_fast.h"
#include "moekit/layer.h"
#include "moekit/moe.h"
#include "shrunk_spec.h"

namespace moekit::test {
namespace {

// The fp8 load of a freshly written fp8 checkpoint of `spec`'s first MoE layer.
std::unique_ptr<LayerWeights> fp8_weights(const MoeSpec& spec, uint64_t seed,
                                          const std::string& tag) {
  const std::string dir = scratch_dir("engine_fp8_" + tag);
  write_fp8_checkpoint(spec, spec.moe_layers.front(), seed, false, dir);
  LoadOptions lo;
  lo.expert_format = ExpertFormat::Fp8Block;
  auto w = load_checkpoint_weights(spec, spec.moe_layers.front(), dir, lo);
  EXPECT_EQ(w->expert_format(), ExpertFormat::Fp8Block);
  return w;
}

struct Fp8ViewCase {
  const char* model;
  int hidden, inter, experts;
};

// DeepSeek-V3 (one fused shared slot, whole tiles), MiniMax-M2 (no shared expert, partial tiles
// both ways: H = 192, I = 96, w13's grid the gate's partial tile row then the up's),
// DeepSeek-V4-Flash (ue8m0 scales).
const Fp8ViewCase kCases[] = {{"deepseek-v3", 256, 128, 16},
                              {"minimax-m2", 192, 96, 16},
                              {"deepseek-v4-flash", 256, 128, 16}};

TEST(EngineFp8, ForwardAndExpertsMatchTheBackendsBitForBit) {
  for (const Fp8ViewCase& c : kCases) {
    const MoeSpec spec = shrunk_spec(c.model, c.hidden, c.inter, c.experts);
    const auto lw = fp8_weights(spec, 5, c.model);
    const EngineStacks st = make_stacks(*lw);
    ASSERT_TRUE(st.view.fp8());
    for (int tokens : {1, 6}) {
      const std::vector<Bf16> x = random_input(tokens, spec.hidden, 3 + tokens, 1.0f);
      for (Fp8Compute mode : {Fp8Compute::W8A8, Fp8Compute::WeightOnly}) {
        const std::string what = std::string(c.model) + " T=" + std::to_string(tokens) + " " +
                                 fp8_compute_name(mode);
        MoeOptions opt;
        opt.cpu_backend = CpuBackend::Reference;
        opt.fp8 = mode;
        MoeOp op(spec, opt);
        std::vector<Bf16> y(x.size());
        op.forward(st.view, x.data(), y.data(), tokens, nullptr, 0, nullptr);
        const ForwardResult ref =
            cpu_reference::forward(*lw, x.data(), tokens, FuseShared::Auto, mode);
        expect_same_bits(y, to_bf16(ref.y), what + " reference forward");
        // experts() on the reference's routing (its k routed columns; the fused slot appended)
        const RoutedColumns rc = routed_columns(ref.routing, spec.top_k);
        std::vector<Bf16> ye(x.size());
        op.experts(st.view, x.data(), rc.ids.data(), rc.weights.data(), ye.data(), tokens, {},
                   nullptr, 0, nullptr);
        expect_same_bits(ye, y, what + " experts on the reference's routing");
      }
      MoeOptions fast;
      fast.fp8 = Fp8Compute::WeightOnly;
      MoeOp fop(spec, fast);
      std::vector<Bf16> y(x.size());
      fop.forward(st.view, x.data(), y.data(), tokens, nullptr, 0, nullptr);
      expect_same_bits(y, to_bf16(cpu_fast::forward(*lw, x.data(), tokens, FuseShared::Auto).y),
                       std::string(c.model) + " fast weight-only");
      MoeOp w8a8_fast(spec, MoeOptions{});  // the fast backend, W8A8 asked for
      expect_error(
          [&] { w8a8_fast.forward(st.view, x.data(), y.data(), tokens, nullptr, 0, nullptr); },
          {"fast CPU backend computes fp8 experts weight-only", "Fp8Compute::WeightOnly"});
    }
  }
}

TEST(EngineFp8, PaddedStridesReadOnlyTheExperts) {
  const MoeSpec spec = shrunk_spec("deepseek-v3", 256, 128, 16);
  const auto lw = fp8_weights(spec, 2, "padded");
  StackOptions so;
  so.pad = 24;  // e4m3 NaN bytes and NaN scales between the experts
  const EngineStacks padded = make_stacks(*lw, so);
  const EngineStacks dense = make_stacks(*lw);
  EXPECT_EQ(padded.view.w13_scale_expert_stride, fp8_w13_scale_floats(spec) + 24);
  const int tokens = 5;
  const std::vector<Bf16> x = random_input(tokens, spec.hidden, 4, 1.0f);
  MoeOptions opt;
  opt.cpu_backend = CpuBackend::Reference;
  MoeOp op(spec, opt);
  std::vector<Bf16> a(x.size()), b(x.size());
  op.forward(padded.view, x.data(), a.data(), tokens, nullptr, 0, nullptr);
  op.forward(dense.view, x.data(), b.data(), tokens, nullptr, 0, nullptr);
  expect_same_bits(a, b, "padded vs dense fp8 stacks");
}

TEST(EngineFp8, BadFp8ViewsNameTheProblem) {
  const MoeSpec spec = shrunk_spec("deepseek-v3", 256, 128, 16);
  const auto lw = fp8_weights(spec, 1, "bad");
  const EngineStacks st = make_stacks(*lw);
  EXPECT_EQ(fp8_w13_scale_floats(spec), 2 * 1 * 2);
  EXPECT_EQ(fp8_w2_scale_floats(spec), 2 * 1);
  static const Bf16 some_bf16[1] = {};
  static const float some_floats[2] = {};
  auto bad = [&](auto edit, std::vector<std::string> frags) {
    MoeWeightsView v = st.view;
    edit(v);
    expect_error([&] { validate_view(spec, v, ViewUse::Experts); }, frags);
  };
  bad([](MoeWeightsView& v) { v.w2_scale = nullptr; }, {"w2_scale of the fp8 view", "is null"});
  bad([](MoeWeightsView& v) { v.w13_fp8 = nullptr; }, {"w13_fp8 of the fp8 view", "is null"});
  bad([](MoeWeightsView& v) { v.w13 = some_bf16; }, {"bf16 w13 / w2 must be null"});
  bad([](MoeWeightsView& v) { v.shared_w13 = some_bf16, v.shared_w2 = some_bf16; },
      {"fused slots", "shared_w13 / shared_w2 must be null"});
  bad([](MoeWeightsView& v) { v.w13_scale_expert_stride = 3; },
      {"w13_scale_expert_stride = 3", "scale grid (4 elements)"});
  bad([](MoeWeightsView& v) { v.w2_scale_expert_stride = 1; },
      {"w2_scale_expert_stride = 1", "(2 elements)"});
  bad(
      [](MoeWeightsView& v) {
        v.w13_scale = reinterpret_cast<const float*>(reinterpret_cast<const char*>(some_floats) + 1);
      },
      {"4-byte aligned", "w13_scale"});
  bad([](MoeWeightsView& v) { v.w13_expert_stride = 100; },
      {"w13_expert_stride = 100", "[2I, H]"});
  bad([](MoeWeightsView& v) { v.expert_dtype = DType::F16; },
      {"expected expert_dtype BF16 or F8_E4M3", "F16"});
  bad([](MoeWeightsView& v) { v.expert_dtype = DType::BF16; },
      {"expert_dtype is BF16", "set expert_dtype = F8_E4M3"});
  // route() reads no stacks: an fp8 view routes as any other
  MoeWeightsView v = st.view;
  v.w2_scale = nullptr;
  validate_view(spec, v, ViewUse::Router);
  MoeOptions o;
  o.expert_dtype = DType::F32;
  expect_error([&] { MoeOp op(spec, o); }, {"MoeOptions::expert_dtype", "F32"});
}

}  // namespace
}  // namespace moekit::test

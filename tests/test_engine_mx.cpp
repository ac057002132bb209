// The engine API on OCP MX host views (MoeWeightsView::mx_format Mxfp4 / Mxfp8): an engine's
// packed stacks and e8m0 bytes, borrowed, give the CPU backends' forward on the same MX
// LayerWeights bit for bit (the reference and the fast backend; gpt-oss in MXFP4 with its
// biases, MiniMax-M3 in MXFP8 with its fused shared slot), experts() on the reference's routing
// too, padded strides read only the experts, and bad MX views (device ones included) are errors
// that name the problem.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_test_util.h"
#include "expect_error.h"
#include "io_test_util.h"
#include "moekit/cpu_fast.h"
#include "moekit/layer.h"
#include "moekit/moe.h"
#include "mx_test_util.h"
#include "shrunk_spec.h"

namespace moekit::test {
namespace {

struct MxViewCase {
  const char* model;
  ExpertFormat format;
  int hidden, inter, experts, shared_slots;
};

const MxViewCase kCases[] = {{"gpt-oss-120b", ExpertFormat::Mxfp4, 320, 192, 16, 0},
                             {"minimax-m3", ExpertFormat::Mxfp8, 384, 192, 16, 1}};

MoeSpec case_spec(const MxViewCase& c) {
  return mx_spec(c.model, c.hidden, c.inter, c.experts, c.shared_slots,
                 c.format == ExpertFormat::Mxfp8 ? mxfp8_quant() : nlohmann::json());
}

// The packed load of a freshly written MX checkpoint of `spec`'s first MoE layer.
std::unique_ptr<LayerWeights> mx_weights(const MoeSpec& spec, ExpertFormat f, uint64_t seed,
                                         const std::string& tag) {
  const std::string dir = scratch_dir("engine_mx_" + tag);
  const int layer = spec.moe_layers.front();
  write_mx_checkpoint(spec, layer, seed, f, false, dir);
  LoadOptions lo;
  lo.expert_format = f;
  auto w = load_checkpoint_weights(spec, layer, dir, lo);
  EXPECT_EQ(w->expert_format(), f);
  return w;
}

TEST(EngineMx, ForwardAndExpertsMatchTheBackendsBitForBit) {
  for (const MxViewCase& c : kCases) {
    const MoeSpec spec = case_spec(c);
    const auto lw = mx_weights(spec, c.format, 5, c.model);
    const EngineStacks st = make_stacks(*lw);
    ASSERT_TRUE(st.view.mx());
    EXPECT_EQ(st.view.fused_slots, c.shared_slots);
    for (int tokens : {1, 6}) {
      const std::vector<Bf16> x = random_input(tokens, spec.hidden, 3 + tokens, 1.0f);
      const std::string what = std::string(c.model) + " " + expert_format_name(c.format) +
                               " T=" + std::to_string(tokens);
      MoeOptions opt;
      opt.cpu_backend = CpuBackend::Reference;
      MoeOp op(spec, opt);
      std::vector<Bf16> y(x.size());
      op.forward(st.view, x.data(), y.data(), tokens, nullptr, 0, nullptr);
      const ForwardResult ref = cpu_reference::forward(*lw, x.data(), tokens, FuseShared::Auto);
      expect_same_bits(y, to_bf16(ref.y), what + " reference forward");
      // experts() on the reference's routing (its k routed columns; the fused slot appended)
      const RoutedColumns rc = routed_columns(ref.routing, spec.top_k);
      std::vector<Bf16> ye(x.size());
      op.experts(st.view, x.data(), rc.ids.data(), rc.weights.data(), ye.data(), tokens, {},
                 nullptr, 0, nullptr);
      expect_same_bits(ye, y, what + " experts on the reference's routing");
      MoeOp fop(spec, MoeOptions{});
      std::vector<Bf16> yf(x.size());
      fop.forward(st.view, x.data(), yf.data(), tokens, nullptr, 0, nullptr);
      expect_same_bits(yf, to_bf16(cpu_fast::forward(*lw, x.data(), tokens, FuseShared::Auto).y),
                       what + " fast forward");
    }
  }
}

TEST(EngineMx, PaddedStridesReadOnlyTheExperts) {
  for (const MxViewCase& c : kCases) {
    const MoeSpec spec = case_spec(c);
    const auto lw = mx_weights(spec, c.format, 2, std::string("padded_") + c.model);
    StackOptions so;
    so.pad = 48;  // 0xff bytes (e8m0 NaN, e4m3 NaN) between the experts
    const EngineStacks padded = make_stacks(*lw, so);
    const EngineStacks dense = make_stacks(*lw);
    EXPECT_EQ(padded.view.w13_scale_expert_stride, 2 * c.inter * (c.hidden / 32) + 48);
    const int tokens = 5;
    const std::vector<Bf16> x = random_input(tokens, spec.hidden, 4, 1.0f);
    for (CpuBackend b : {CpuBackend::Reference, CpuBackend::Fast}) {
      MoeOptions opt;
      opt.cpu_backend = b;
      MoeOp op(spec, opt);
      std::vector<Bf16> p(x.size()), d(x.size());
      op.forward(padded.view, x.data(), p.data(), tokens, nullptr, 0, nullptr);
      op.forward(dense.view, x.data(), d.data(), tokens, nullptr, 0, nullptr);
      expect_same_bits(p, d, std::string(c.model) + " padded vs dense MX stacks");
    }
  }
}

TEST(EngineMx, BadMxViewsNameTheProblem) {
  const MxViewCase& c = kCases[0];
  const MoeSpec spec = case_spec(c);
  const auto lw = mx_weights(spec, c.format, 1, "bad");
  const EngineStacks st = make_stacks(*lw);
  static const Bf16 some_bf16[1] = {};
  static const uint8_t some_bytes[1] = {};
  auto bad = [&](auto edit, std::vector<std::string> frags) {
    MoeWeightsView v = st.view;
    edit(v);
    expect_error([&] { validate_view(spec, v, ViewUse::Experts); }, frags);
  };
  bad([](MoeWeightsView& v) { v.w2_mx_scale = nullptr; },
      {"w2_mx_scale of the mxfp4 view", "is null (16 experts)"});
  bad([](MoeWeightsView& v) { v.w13_mx = nullptr; }, {"w13_mx of the mxfp4 view", "is null"});
  bad([](MoeWeightsView& v) { v.w13 = some_bf16; },
      {"reads w13_mx / w2_mx", "w13, w2, w13_fp8 and w2_fp8 must be null"});
  bad([](MoeWeightsView& v) { v.expert_dtype = DType::F8_E4M3; },
      {"keeps expert_dtype BF16, got F8_E4M3"});
  bad([](MoeWeightsView& v) { v.mx_format = ExpertFormat::Fp8Block; },
      {"expected mx_format Bf16, Mxfp4 or Mxfp8, got fp8"});
  bad([](MoeWeightsView& v) { v.mx_format = ExpertFormat::Bf16; },
      {"mx_format is Bf16, but its MX stacks", "set mx_format = Mxfp4 or Mxfp8"});
  // MXFP4 rows of H = 320: 160 bytes, so w13's 384 rows take 61440 bytes
  bad([](MoeWeightsView& v) { v.w13_expert_stride = 61439; },
      {"w13_expert_stride = 61439", "[2I, H] packed rows (61440 bytes)"});
  bad([](MoeWeightsView& v) { v.w2_scale_expert_stride = 7; },
      {"w2_scale_expert_stride = 7", "[H, I/32] e8m0 scales (1920 bytes)"});
  bad(
      [](MoeWeightsView& v) {
        v.w13_mx_scale = nullptr, v.w13_mx = nullptr, v.mx_format = ExpertFormat::Bf16,
        v.w2_mx = some_bytes;
      },
      {"mx_format is Bf16, but its MX stacks"});
  // a device MX view: the GPU holds MX experts in its own layout
  MoeWeightsView dev = st.view;
  dev.location = Location::Device;
  MoeOp op(spec, MoeOptions{});
  const std::vector<Bf16> x = random_input(1, spec.hidden, 1, 1.0f);
  std::vector<Bf16> y(x.size());
  expect_error(
      [&] { op.forward(dev, x.data(), y.data(), 1, nullptr, 0, nullptr); },
      {"MX views (mx_format mxfp4) run on the CPU backends", "a device view is bf16 or fp8"});
  // route() reads no stacks: an MX view routes as any other
  MoeWeightsView v = st.view;
  v.w2_mx = nullptr;
  validate_view(spec, v, ViewUse::Router);
}

}  // namespace
}  // namespace moekit::test

// Random weights held in the quantised formats (make_random_weights' format): each expert and the
// shared MLP are the bf16 random weights quantised as save_checkpoint quantises them, the fused
// slots repack the quantised shared MLP, the layer runs on them, and `moekit bench --device cpu
// --dtype` counts the bytes of the format it benchmarks.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/mx_experts.h"
#include "io/tensor_convert.h"
#include "io_test_util.h"
#include "moekit/cpu_fast.h"
#include "moekit/layer.h"
#include "moekit/weights.h"
#include "shrunk_spec.h"

namespace moekit {
namespace {

std::vector<uint8_t> bytes_of(const uint8_t* p, size_t n) { return {p, p + n}; }
std::vector<float> floats_of(const float* p, size_t n) { return {p, p + n}; }

// fp8 of a bf16 MLP w13 [2W, H], w2 [H, W]: gate and up tiled separately, then down.
struct Fp8Mlp {
  std::vector<uint8_t> w13, w2;
  std::vector<float> s13, s2;
};
Fp8Mlp fp8_of(const Bf16* w13, const Bf16* w2, size_t W, size_t H, bool pow2) {
  const size_t half = io::ceil_div(W, 128) * io::ceil_div(H, 128);
  Fp8Mlp m;
  m.w13.resize(2 * W * H);
  m.s13.resize(2 * half);
  io::quantize_fp8_block(w13, W, H, m.w13.data(), m.s13.data(), pow2);
  io::quantize_fp8_block(w13 + W * H, W, H, m.w13.data() + W * H, m.s13.data() + half, pow2);
  m.w2.resize(H * W);
  m.s2.resize(io::ceil_div(H, 128) * io::ceil_div(W, 128));
  io::quantize_fp8_block(w2, H, W, m.w2.data(), m.s2.data(), pow2);
  return m;
}

// DeepSeek-V3 scaled down, one shared slot: I = 96 and H = 200 leave partial 128-tiles at the
// edges (fp8); H 256, I 128 for the MX forms, whose rows are whole groups of 32.
MoeSpec fp8_spec() { return test::shrunk_spec("deepseek-v3", 200, 96, 16); }
MoeSpec mx_spec() { return test::shrunk_spec("deepseek-v3", 256, 128, 16); }

TEST(RandomFormats, Fp8ExpertsAndSharedAreTheBf16WeightsQuantised) {
  const MoeSpec spec = fp8_spec();
  const int layer = spec.moe_layers.front();
  const auto bf = make_random_weights(spec, layer, 7);
  const auto q = make_random_weights(spec, layer, 7, ExpertFormat::Fp8Block);
  ASSERT_EQ(q->expert_format(), ExpertFormat::Fp8Block);
  EXPECT_EQ(bf->random_seed(), std::optional<uint64_t>(7));
  EXPECT_EQ(q->random_seed(), std::nullopt);  // the GPU regenerates bf16 only
  const size_t H = spec.hidden, I = spec.expert_intermediate, Is = spec.shared_intermediate;
  for (int e : {0, 5, spec.num_experts - 1}) {
    const ExpertView b = bf->expert(e), v = q->expert(e);
    EXPECT_EQ(v.w13, nullptr);
    EXPECT_EQ(v.w2, nullptr);
    const Fp8Mlp want = fp8_of(b.w13, b.w2, I, H, spec.quant.scale_ue8m0);
    EXPECT_EQ(bytes_of(v.w13_fp8, 2 * I * H), want.w13) << "expert " << e;
    EXPECT_EQ(floats_of(v.w13_scale, want.s13.size()), want.s13) << "expert " << e;
    EXPECT_EQ(bytes_of(v.w2_fp8, H * I), want.w2) << "expert " << e;
    EXPECT_EQ(floats_of(v.w2_scale, want.s2.size()), want.s2) << "expert " << e;
  }
  ASSERT_GT(Is, 0u);
  EXPECT_EQ(q->shared_w13(), nullptr);
  const Fp8Mlp shared = fp8_of(bf->shared_w13(), bf->shared_w2(), Is, H, spec.quant.scale_ue8m0);
  EXPECT_EQ(bytes_of(q->shared_w13_fp8(), 2 * Is * H), shared.w13);
  EXPECT_EQ(floats_of(q->shared_w2_scale(), shared.s2.size()), shared.s2);
  // the fused slot (Is = I: one slot) is the quantised shared MLP itself
  ASSERT_EQ(spec.shared_slots(), 1);
  const ExpertView slot = q->expert(spec.num_experts);
  EXPECT_EQ(bytes_of(slot.w13_fp8, 2 * I * H), shared.w13);
  EXPECT_EQ(bytes_of(slot.w2_fp8, H * I), shared.w2);
}

TEST(RandomFormats, MxExpertsAndSharedAreTheBf16RowsQuantised) {
  const MoeSpec spec = mx_spec();
  const int layer = spec.moe_layers.front();
  const auto bf = make_random_weights(spec, layer, 3);
  const size_t H = spec.hidden, I = spec.expert_intermediate;
  for (ExpertFormat f : {ExpertFormat::Mxfp4, ExpertFormat::Mxfp8}) {
    SCOPED_TRACE(expert_format_name(f));
    const auto q = make_random_weights(spec, layer, 3, f);
    ASSERT_EQ(q->expert_format(), f);
    // routed experts, and the fused slot: the shared MLP's rows (Is = I)
    for (int e : {0, 7, spec.num_experts}) {
      const ExpertView b = bf->expert(e), v = q->expert(e);
      EXPECT_EQ(v.w13, nullptr);
      EXPECT_EQ(v.mx_format, f);
      const size_t rb = mx_row_bytes(f, H);
      std::vector<uint8_t> row(rb), scale(H / 32);
      for (size_t r : {size_t{0}, I - 1, I, 2 * I - 1}) {  // gate and up, first and last rows
        io::mx_quantize_row(f, b.w13 + r * H, H, row.data(), scale.data());
        EXPECT_EQ(bytes_of(v.w13_mx + r * rb, rb), row) << "expert " << e << " row " << r;
        EXPECT_EQ(bytes_of(v.w13_mx_scale + r * (H / 32), H / 32), scale);
      }
      const size_t db = mx_row_bytes(f, I);
      std::vector<uint8_t> drow(db), dscale(I / 32);
      io::mx_quantize_row(f, b.w2 + (H - 1) * I, I, drow.data(), dscale.data());
      EXPECT_EQ(bytes_of(v.w2_mx + (H - 1) * db, db), drow) << "expert " << e;
      EXPECT_EQ(bytes_of(v.w2_mx_scale + (H - 1) * (I / 32), I / 32), dscale);
    }
  }
}

// max |fast - reference| within 1e-2 of max |reference| (fp32 sums against double), same routing
void expect_fast_near_reference(const LayerWeights& w, const std::vector<Bf16>& x, int tokens) {
  const ForwardResult ref =
      cpu_reference::forward(w, x.data(), tokens, FuseShared::On, Fp8Compute::WeightOnly);
  const ForwardResult fast = cpu_fast::forward(w, x.data(), tokens, FuseShared::On);
  ASSERT_EQ(ref.y.size(), fast.y.size());
  EXPECT_EQ(ref.routing.ids, fast.routing.ids);
  double err = 0, top = 0;
  for (size_t i = 0; i < ref.y.size(); ++i) {
    err = std::max(err, static_cast<double>(std::abs(ref.y[i] - fast.y[i])));
    top = std::max(top, static_cast<double>(std::abs(ref.y[i])));
  }
  EXPECT_GT(top, 0.0);
  EXPECT_LT(err, 1e-2 * top);
}

TEST(RandomFormats, TheFastBackendRunsThemAsTheReferenceDoes) {
  const int tokens = 5;
  const MoeSpec spec = fp8_spec();
  expect_fast_near_reference(
      *make_random_weights(spec, spec.moe_layers.front(), 1, ExpertFormat::Fp8Block),
      test::random_input(tokens, spec.hidden, 11, 1.0f), tokens);
  const MoeSpec mx = mx_spec();
  for (ExpertFormat f : {ExpertFormat::Mxfp4, ExpertFormat::Mxfp8}) {
    SCOPED_TRACE(expert_format_name(f));
    expect_fast_near_reference(*make_random_weights(mx, mx.moe_layers.front(), 1, f),
                               test::random_input(tokens, mx.hidden, 12, 1.0f), tokens);
  }
}

TEST(RandomFormats, MxNeedsWidthsOfWholeGroups) {
  const MoeSpec spec = fp8_spec();  // H 200
  try {
    make_random_weights(spec, spec.moe_layers.front(), 1, ExpertFormat::Mxfp4);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 32, got 200, 96, 96"), std::string::npos)
        << e.what();
  }
}

// `moekit bench --device cpu --dtype D`: with every expert touched (T = 32, top-8 of 16) each
// forward reads all 16 experts and the fused slot, in D's bytes, and the router.
TEST(RandomFormats, CpuBenchCountsTheBytesOfItsDtype) {
  if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built";
  const std::string dir = test::scratch_dir();
  const MoeSpec spec = mx_spec();
  nlohmann::json c = nlohmann::json::parse(
      test::read_file(std::string(MOEKIT_TEST_DATA_DIR) + "/../configs/deepseek-v3.json"));
  c["hidden_size"] = 256;
  c["moe_intermediate_size"] = 128;
  c["n_routed_experts"] = 16;
  test::write_file(dir + "/config.json", c.dump());
  struct Case {
    const char* dtype;
    double expert_bytes;
  };
  MoeSpec mx8 = spec;
  mx8.quant.kind = QuantKind::Mxfp8;
  for (const Case& k : {Case{"bf16", static_cast<double>(spec.expert_bytes())},
                        Case{"fp8", static_cast<double>(spec.fp8_expert_bytes())},
                        Case{"config", static_cast<double>(spec.fp8_expert_bytes())},
                        Case{"mxfp8", static_cast<double>(mx8.mx_expert_bytes())}}) {
    SCOPED_TRACE(k.dtype);
    const std::string out = dir + "/bench.json";
    const std::string cmd = std::string(MOEKIT_CLI_PATH) + " bench --device cpu --model " + dir +
                            "/config.json --batch 32 --fuse-shared on --threads 1 --iterations 5 " +
                            "--json --dtype " + k.dtype + " >" + out + " 2>" + dir + "/err.txt";
    const int rc = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << test::read_file(dir + "/err.txt");
    const nlohmann::json recs = nlohmann::json::parse(test::read_file(out));
    ASSERT_EQ(recs.size(), 1u);
    const nlohmann::json& r = recs[0];
    EXPECT_EQ(r["dtype"], std::string(k.dtype) == "config" ? "fp8" : k.dtype);
    EXPECT_NE(r["command"].get<std::string>().find("--dtype " + std::string(k.dtype)),
              std::string::npos);
    ASSERT_DOUBLE_EQ(r["experts_touched"].get<double>(), 17.0);
    const double bytes = r["gb_per_s"].get<double>() * 1e9 * r["us_per_layer"].get<double>() * 1e-6;
    const double want = 17 * k.expert_bytes + static_cast<double>(spec.router_bytes());
    EXPECT_NEAR(bytes / want, 1.0, 1e-9);
  }
  const std::string bad = std::string(MOEKIT_CLI_PATH) + " bench --device cpu --model " + dir +
                          "/config.json --batch 1 --dtype fp4 >/dev/null 2>" + dir + "/err.txt";
  const int rc = std::system(bad.c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) != 0);
  EXPECT_NE(test::read_file(dir + "/err.txt")
                .find("bench: --dtype 'fp4' is not one of bf16, fp8, mxfp4, mxfp8, config"),
            std::string::npos)
      << test::read_file(dir + "/err.txt");
}

}  // namespace
}  // namespace moekit

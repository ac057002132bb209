// The GPU layer on OCP MX experts (GpuLayerOptions::mx_format Mxfp4 / Mxfp8: W4A16 / W8A16 on
// the bulk kernels' MX instances, or the prefill path on experts widened to bf16 or on the packed
// bytes): tiny MX checkpoints in the real tensor names (written by the project's writer,
// tests/mx_test_util.h), loaded packed, run on the GPU and compared with the CPU reference on the
// same bytes (which dequantises exactly, then runs the bf16 math): rows of one partial k block, of
// several chunks with a partial last block, MiniMax-M3's fused shared expert against the
// reference's unfused one, exponents past the one-multiply range; CUDA-graph replay; the random MX
// layers of the bench; and the errors of what the MX layer cannot run. GpuMxSmall.* runs under
// scripts/gpu_check.sh's sanitizers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../expect_error.h"
#include "../io_test_util.h"
#include "../mx_test_util.h"
#include "layer_test_util.h"
#include "moekit/cuda_layer.h"
#include "moekit/layer.h"
#include "moekit/plan.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

using namespace moekit::test;

struct MxCase {
  const char* model;
  ExpertFormat format;
  int hidden, inter, experts, shared_slots;
};

MoeSpec case_spec(const MxCase& c) {
  return mx_spec(c.model, c.hidden, c.inter, c.experts, c.shared_slots,
                 c.format == ExpertFormat::Mxfp8 ? mxfp8_quant() : nlohmann::json());
}

// The packed load of a freshly written MX checkpoint of `spec`'s first MoE layer.
std::unique_ptr<LayerWeights> mx_layer(const MoeSpec& spec, ExpertFormat f, uint64_t seed,
                                       const std::string& tag) {
  const std::string dir = scratch_dir(tag);
  const int layer = spec.moe_layers.front();
  write_mx_checkpoint(spec, layer, seed, f, false, dir);
  LoadOptions lo;
  lo.expert_format = f;
  return load_checkpoint_weights(spec, layer, dir, lo);
}

// gpt-oss (MXFP4: rows of 160 and 96 bytes, one partial block; then rows of 2080 bytes, a
// chunk and a partial block of 32), MiniMax-M3 (MXFP8, one fused shared slot: rows of 384
// and 192 bytes; then 2112, a chunk and a block of 64), and gpt-oss's own gate/up rows of 1440
// bytes (11.25 blocks: the 8 consumer warps take 2 or 1, the last partial).
const MxCase kCases[] = {{"gpt-oss-120b", ExpertFormat::Mxfp4, 320, 192, 16, 0},
                         {"gpt-oss-120b", ExpertFormat::Mxfp4, 4160, 320, 8, 0},
                         {"minimax-m3", ExpertFormat::Mxfp8, 384, 192, 16, 1},
                         {"minimax-m3", ExpertFormat::Mxfp8, 2112, 256, 8, 1},
                         {"gpt-oss-120b", ExpertFormat::Mxfp4, 2880, 320, 8, 0}};

// The MX layer's ways: the bulk MX kernels, the prefill path's GEMMs on widened matrices in runs
// of 3 experts (not dividing the 16 or 17 weight rows), the packed GEMM with token tiles of 64
// or 128.
enum class MxPath { Bulk, Widened, Packed64, Packed128 };
const char* path_name(MxPath p) {
  return p == MxPath::Bulk       ? "bulk"
         : p == MxPath::Widened  ? "widened"
         : p == MxPath::Packed64 ? "packed 64"
                                 : "packed 128";
}

// The options of a layer on `path` at every batch.
cuda::GpuLayerOptions path_options(int max_tokens, MxPath path) {
  cuda::GpuLayerOptions opt = base_options(max_tokens);
  opt.overrides.stream = path == MxPath::Bulk ? plan::Stream::Bulk : plan::Stream::Grouped;
  if (path == MxPath::Widened) {
    opt.overrides.grouped_mx_tile = 0;
    opt.overrides.grouped_mx_chunk = 3;
  }
  if (path == MxPath::Packed64) opt.overrides.grouped_mx_tile = 64;
  if (path == MxPath::Packed128) opt.overrides.grouped_mx_tile = 128;
  return opt;
}

// Every way: one token, tasks of 8, many tasks per expert (100 tokens over 8-16 experts) on the
// bulk kernels; the prefill path's ways at the same batches; the GPU's fused shared expert
// against the reference's unfused shared MLP.
TEST(GpuMx, ForwardMatchesTheCpuReference) {
  SKIP_WITHOUT_GPU();
  for (const MxCase& c : kCases) {
    const MoeSpec spec = case_spec(c);
    const auto w = mx_layer(spec, c.format, 7, "mx-forward");
    ASSERT_EQ(w->expert_format(), c.format);
    for (const MxPath path : {MxPath::Bulk, MxPath::Widened, MxPath::Packed64, MxPath::Packed128}) {
      const bool prefill = path != MxPath::Bulk;
      const auto gpu = cuda::GpuMoeLayer::create(*w, path_options(100, path));
      for (int tokens : {1, 5, 8, 40, 100}) {
        std::ostringstream what;
        what << spec.name << " " << expert_format_name(c.format) << " H=" << c.hidden
             << " I=" << c.inter << " T=" << tokens << " " << path_name(path);
        const plan::LayerPlan p = gpu->plan(tokens, FuseShared::Auto);
        EXPECT_EQ(p.mx, c.format) << what.str();
        EXPECT_EQ(p.stream, prefill ? plan::Stream::Grouped : plan::Stream::Bulk) << what.str();
        EXPECT_EQ(p.grouped_mx_chunk, path == MxPath::Widened ? 3 : 0) << what.str();
        EXPECT_EQ(p.grouped_mx_tile, path == MxPath::Packed64    ? 64
                                     : path == MxPath::Packed128 ? 128
                                                                 : 0)
            << what.str();
        for (const std::string& name : plan_kernel_names(p)) {
          EXPECT_NE(name.find(expert_format_name(c.format)), std::string::npos) << what.str();
        }
        const std::vector<Bf16> x = random_x(tokens, spec.hidden, 11 + tokens);
        const ForwardResult g = gpu->forward(x.data(), tokens, FuseShared::Auto);
        expect_routing_matches_cpu(spec, *w, gpu->last_logits(tokens), g, what.str());
        expect_layer_matches(spec, tokens, g,
                             cpu_reference::forward(*w, x.data(), tokens, FuseShared::Auto),
                             what.str());
        if (c.shared_slots > 0) {
          // (the routings differ in their slots: y alone, by norm)
          const ForwardResult off = cpu_reference::forward(*w, x.data(), tokens, FuseShared::Off);
          const Diff d = compare_rows(g.y, off.y, spec.hidden, std::vector<bool>(tokens, true));
          EXPECT_LE(d.rel_norm, 5e-3) << what.str() << " against the reference unfused";
        }
      }
    }
  }
}

// Exponents past the one-multiply range (e8m0 bytes above 128 for MXFP4, 134 for MXFP8: every
// scale byte of the checkpoint raised by `delta`) take the kernels' two-multiply path: still the
// reference's weights (experts_mx.cuh).
TEST(GpuMx, LargeExponentsTakeTheTwoMultiplyPath) {
  SKIP_WITHOUT_GPU();
  for (const auto& [c, delta] : {std::pair{kCases[0], 16}, std::pair{kCases[2], 24}}) {
    const MoeSpec spec = case_spec(c);
    const std::string dir = scratch_dir("mx-large");
    const int layer = spec.moe_layers.front();
    write_mx_checkpoint(spec, layer, 13, c.format, false, dir);
    const nlohmann::json index =
        nlohmann::json::parse(std::ifstream(dir + "/model.safetensors.index.json"));
    int raised = 0;
    for (const auto& [name, file] : index["weight_map"].items()) {
      const bool scale = name.ends_with("_scales") || name.ends_with("_scale");
      if (!scale || raw_tensor(dir, name).dtype != "U8") continue;
      edit_raw(dir, name, [&](RawTensor& t) {
        for (uint8_t& b : t.bytes) b = static_cast<uint8_t>(b + delta);
      });
      ++raised;
    }
    ASSERT_GT(raised, 0) << spec.name;
    LoadOptions lo;
    lo.expert_format = c.format;
    const auto w = load_checkpoint_weights(spec, layer, dir, lo);
    const ExpertView e0 = w->expert(0);
    const uint8_t* s0 = e0.w2_mx_scale;
    const uint8_t largest = *std::max_element(
        s0, s0 + static_cast<size_t>(spec.hidden) * spec.expert_intermediate / 32);
    EXPECT_GT(largest, c.format == ExpertFormat::Mxfp4 ? 128 : 134)
        << spec.name << ": the edit did not leave the one-multiply range";
    const auto gpu = cuda::GpuMoeLayer::create(*w, base_options(8));
    for (int tokens : {1, 8}) {
      const std::vector<Bf16> x = random_x(tokens, spec.hidden, 3 + tokens);
      expect_layer_matches(spec, tokens, gpu->forward(x.data(), tokens, FuseShared::Auto),
                           cpu_reference::forward(*w, x.data(), tokens, FuseShared::Auto),
                           spec.name + " large exponents T=" + std::to_string(tokens));
    }
  }
}

// The MX forward on each way, captured in a graph and replayed, gives the eager forward bit
// for bit.
TEST(GpuMx, GraphReplayEqualsTheEagerForward) {
  SKIP_WITHOUT_GPU();
  for (const MxCase& c : {kCases[0], kCases[2]}) {
    const MoeSpec spec = case_spec(c);
    const auto w = mx_layer(spec, c.format, 3, "mx-graph");
    for (const MxPath path : {MxPath::Bulk, MxPath::Widened, MxPath::Packed64}) {
      const auto gpu = cuda::GpuMoeLayer::create(*w, path_options(32, path));
      for (int tokens : {1, 32})
        expect_graph_replay_equals_forward(*gpu, spec, tokens, FuseShared::Auto, 5);
    }
  }
}

// No routing kernel at one token on the MX gate/up kernels (self_route_tokens=1, no shared
// expert, E <= 128: gpt-oss in MXFP4, Qwen3-30B-A3B's family in MXFP8, the formats their
// checkpoints are written in): the gate/up kernel routes its token and its CTA 0 writes the
// dispatch. Against the routing kernel's path bit for bit and the CPU reference, two forwards at
// one token, one at 9 tokens, one token again.
TEST(GpuMx, SelfRoutedGateUpAtOneToken) {
  const MxCase cases[] = {{"gpt-oss-120b", ExpertFormat::Mxfp4, 320, 192, 16, 0},
                          {"qwen3-30b-a3b", ExpertFormat::Mxfp8, 256, 128, 16, 0}};
  cuda::GpuLayerOptions on = path_options(9, MxPath::Bulk), off = on;
  on.overrides.self_route_tokens = 1;
  off.overrides.self_route_tokens = 0;
  std::vector<std::unique_ptr<LayerWeights>> weights;
  for (const MxCase& c : cases) {
    const MoeSpec spec = case_spec(c);
    const ExpertFormat f = c.format;
    const std::string name = expert_format_name(f);
    auto plan_with = [&](const cuda::GpuLayerOptions& o) {
      return plan::plan_layer(spec, 1, FuseShared::Auto, o.overrides, plan::device_profile("sm90"),
                              DType::BF16, f);
    };
    EXPECT_FALSE(plan_with(on).routing_kernel) << name;
    EXPECT_TRUE(plan_with(off).routing_kernel) << name;
    EXPECT_EQ(plan_kernel_names(plan_with(on)).front(), "bulk_gate_up_" + name + "_self_route");
    weights.push_back(mx_layer(spec, f, 17, "mx-self-route-" + name));
    ASSERT_EQ(weights.back()->expert_format(), f);
  }
  SKIP_WITHOUT_GPU();
  for (size_t i = 0; i < std::size(cases); ++i) {
    const MxCase& c = cases[i];
    const MoeSpec spec = case_spec(c);
    const ExpertFormat f = c.format;
    const auto& w = weights[i];
    const auto routed_here = cuda::GpuMoeLayer::create(*w, on);
    const auto routed_before = cuda::GpuMoeLayer::create(*w, off);
    for (int tokens : {1, 1, 9, 1}) {
      const std::string what =
          std::string(c.model) + " " + expert_format_name(f) + " T=" + std::to_string(tokens);
      const std::vector<Bf16> x = random_x(tokens, spec.hidden, 60 + tokens);
      const ForwardResult g = routed_here->forward(x.data(), tokens, FuseShared::Auto);
      expect_routing_matches_cpu(spec, *w, routed_here->last_logits(tokens), g, what);
      expect_layer_matches(spec, tokens, g,
                           cpu_reference::forward(*w, x.data(), tokens, FuseShared::Auto), what);
      EXPECT_EQ(routed_before->forward(x.data(), tokens, FuseShared::Auto).y, g.y) << what;
    }
  }
}

// Small shapes for the sanitizers: both formats from checkpoints on every way, and the bench's
// random MX layers (made on the GPU: codes and one exponent per matrix), whose y is finite and
// not zero.
TEST(GpuMxSmall, SanitizerShapes) {
  SKIP_WITHOUT_GPU();
  for (const MxCase& c : {kCases[0], kCases[2]}) {
    const MoeSpec spec = case_spec(c);
    const auto w = mx_layer(spec, c.format, 9, "mx-small");
    for (const MxPath path : {MxPath::Bulk, MxPath::Widened, MxPath::Packed64, MxPath::Packed128}) {
      const auto gpu = cuda::GpuMoeLayer::create(*w, path_options(24, path));
      for (int tokens : {1, 24}) {
        const std::vector<Bf16> x = random_x(tokens, spec.hidden, tokens);
        expect_layer_matches(spec, tokens, gpu->forward(x.data(), tokens, FuseShared::Auto),
                             cpu_reference::forward(*w, x.data(), tokens, FuseShared::Auto),
                             spec.name + " T=" + std::to_string(tokens) + " " + path_name(path));
      }
    }
    cuda::GpuLayerOptions opt = base_options(24);
    opt.mx_format = c.format;
    const auto random = cuda::GpuMoeLayer::create_random(spec, spec.moe_layers.front(), 5, opt);
    const std::vector<Bf16> x = random_x(24, spec.hidden, 2);
    const ForwardResult r = random->forward(x.data(), 24, FuseShared::Auto);
    double sum = 0;
    for (const float v : r.y) {
      ASSERT_TRUE(std::isfinite(v)) << spec.name << " random " << expert_format_name(c.format);
      sum += std::fabs(v);
    }
    EXPECT_GT(sum, 0.0) << spec.name << " random " << expert_format_name(c.format);
  }
}

// What the MX layer cannot run is an error naming it.
TEST(GpuMx, WhatItCannotRunIsAClearError) {
  SKIP_WITHOUT_GPU();
  const MoeSpec m3 = case_spec(kCases[2]);
  const auto w = mx_layer(m3, ExpertFormat::Mxfp8, 3, "mx-errors");
  cuda::GpuLayerOptions wrong = base_options(4);
  wrong.mx_format = ExpertFormat::Mxfp4;
  expect_error([&] { cuda::GpuMoeLayer::create(*w, wrong); },
               {"GpuLayerOptions::mx_format mxfp4 disagrees with the weights' mxfp8"});
  const auto gpu = cuda::GpuMoeLayer::create(*w, base_options(4));
  const std::vector<Bf16> x = random_x(4, m3.hidden, 1);
  expect_error([&] { gpu->forward(x.data(), 4, FuseShared::Off); },
               {"mxfp8 experts of", "run the shared expert fused"});
  cuda::GpuLayerOptions both = base_options(4);
  both.mx_format = ExpertFormat::Mxfp8;
  both.expert_dtype = DType::F8_E4M3;
  expect_error([&] { cuda::GpuMoeLayer::create_random(m3, m3.moe_layers.front(), 1, both); },
               {"mx_format is Bf16, Mxfp4 or Mxfp8 (with expert_dtype BF16)"});
}

}  // namespace
}  // namespace moekit

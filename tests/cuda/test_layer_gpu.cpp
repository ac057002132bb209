// The GPU layer as a whole: the weights generated on the device equal the uploaded ones, a
// forward is deterministic in every kernel family, the trace records the kernel timeline in
// order, a CUDA graph replays the eager forward bit for bit and holds the plan's launches, and
// bad inputs throw naming the problem.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../expect_error.h"
#include "cuda/common/trace.cuh"
#include "knob_test_util.h"
#include "layer_test_util.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"
#include "moekit/plan.h"

namespace moekit {
namespace {

using namespace moekit::test;

TEST(GpuLayer, DeviceRandomFillMatchesHostWeightsBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const std::string model : {"deepseek-v3", "gpt-oss-120b", "qwen2-57b-a14b", "minimax-m2"}) {
    SCOPED_TRACE(model);
    const MoeSpec spec = small_spec(model);
    const int layer = spec.moe_layers.back();
    const auto w = make_random_weights(spec, layer, 3);
    const cuda::GpuLayerOptions opt = base_options(64);
    const auto uploaded = cuda::GpuMoeLayer::create(*w, opt);
    const auto generated = cuda::GpuMoeLayer::create_random(spec, layer, 3, opt);
    EXPECT_EQ(uploaded->weight_bytes(), generated->weight_bytes());
    const std::vector<Bf16> x = random_x(64, spec.hidden, 9);
    for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
      const ForwardResult a = uploaded->forward(x.data(), 64, fuse);
      const std::vector<float> la = uploaded->last_logits(64);
      const ForwardResult b = generated->forward(x.data(), 64, fuse);
      const std::vector<float> lb = generated->last_logits(64);
      EXPECT_EQ(la, lb) << "router logits differ: router weights differ";
      EXPECT_EQ(a.routing.ids, b.routing.ids);
      EXPECT_EQ(a.y, b.y) << "outputs differ: expert weights differ";
    }
  }
}

TEST(GpuLayer, ForwardIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 1);
  const cuda::GpuLayerOptions opt = base_options(256);
  for (plan::Stream s : {plan::Stream::Registers, plan::Stream::RegistersEarlyActs,
                         plan::Stream::Bulk}) {
    plan::PlanOverrides o = opt.overrides;
    o.stream = s;
    const auto gpu = create_with(*w, opt, o);
    for (int tokens : {1, 8, 9, 256}) {
      const std::vector<Bf16> x = random_x(tokens, spec.hidden, 2);
      for (FuseShared fuse : {FuseShared::On, FuseShared::Off}) {
        const ForwardResult a = gpu->forward(x.data(), tokens, fuse);
        const ForwardResult b = gpu->forward(x.data(), tokens, fuse);
        EXPECT_EQ(a.y, b.y) << "T=" << tokens << " fuse=" << fuse_shared_name(fuse)
                            << " stream=" << plan::stream_name(s);
      }
    }
  }
}

// `moekit bench --trace`'s timeline: every event recorded, in the order PDL imposes (a kernel's
// griddepcontrol.wait returns after the kernel before it has finished), and nothing recorded
// once the trace is unset. The bulk kernels record (gate/up, then down); the plan at 4 tokens
// runs them with the routing kernel before (no self-routing: DeepSeek-V3 has a shared expert).
TEST(GpuLayer, TraceRecordsTheKernelTimelineInOrder) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 6);
  const cuda::GpuLayerOptions opt = base_options(8);
  {
    const auto gpu = create_with(*w, opt, bulk(opt.overrides));
    unsigned long long* words = nullptr;
    ASSERT_EQ(cudaMalloc(&words, cuda::kTraceWords * 8), cudaSuccess);
    std::vector<unsigned long long> init(cuda::kTraceWords, 0);
    std::fill(init.begin(), init.begin() + cuda::kTraceEvents, ~0ull);  // earliest: none yet
    ASSERT_EQ(cudaMemcpy(words, init.data(), cuda::kTraceWords * 8, cudaMemcpyHostToDevice),
              cudaSuccess);
    const std::vector<Bf16> x = random_x(4, spec.hidden, 6);
    gpu->set_trace(words);
    gpu->forward(x.data(), 4, FuseShared::On);
    gpu->set_trace(nullptr);
    std::vector<unsigned long long> t(cuda::kTraceWords);
    ASSERT_EQ(cudaMemcpy(t.data(), words, cuda::kTraceWords * 8, cudaMemcpyDeviceToHost),
              cudaSuccess);
    auto first = [&](int ev) { return t[ev]; };
    auto last = [&](int ev) { return t[cuda::kTraceEvents + ev]; };
    for (int ev = 0; ev < cuda::kTraceEvents; ++ev) {
      EXPECT_NE(first(ev), ~0ull) << "event " << ev << " not recorded";
      EXPECT_LE(first(ev), last(ev)) << "event " << ev;
    }
    EXPECT_LE(first(cuda::kTraceRouterWaited), first(cuda::kTraceRouterSummed));
    EXPECT_LE(first(cuda::kTraceRouterSummed), first(cuda::kTraceRouterEnd));
    EXPECT_LE(last(cuda::kTraceRouterEnd), first(cuda::kTraceRoutingWaited));
    EXPECT_LE(last(cuda::kTraceRoutingStart), first(cuda::kTraceRoutingWaited));
    EXPECT_LE(first(cuda::kTraceRoutingWaited), first(cuda::kTraceRoutingKeyed));
    EXPECT_LE(first(cuda::kTraceRoutingKeyed), first(cuda::kTraceRoutingGrouped));
    EXPECT_LE(first(cuda::kTraceRoutingGrouped), first(cuda::kTraceRoutingPicked));
    EXPECT_LE(first(cuda::kTraceRoutingPicked), last(cuda::kTraceRoutingRouted));
    EXPECT_LE(last(cuda::kTraceRoutingWaited), first(cuda::kTraceRoutingRouted));
    EXPECT_LE(last(cuda::kTraceRoutingRouted), first(cuda::kTraceRoutingEnd));
    EXPECT_LE(last(cuda::kTraceRoutingEnd), first(cuda::kTraceGateUpWaited));
    EXPECT_LE(first(cuda::kTraceGateUpWaited), first(cuda::kTraceGateUpEnd));
    EXPECT_LE(first(cuda::kTraceDownStart), first(cuda::kTraceDownIssued));
    EXPECT_LE(last(cuda::kTraceGateUpEnd), first(cuda::kTraceDownWaited));
    // every CTA's consumers see its producer's end-of-work record after the producer's wait
    EXPECT_LE(first(cuda::kTraceDownWaited), first(cuda::kTraceDownConsumed));
    EXPECT_LE(last(cuda::kTraceDownWaited), last(cuda::kTraceDownEnd));
    EXPECT_LE(last(cuda::kTraceDownConsumed), last(cuda::kTraceDownEnd));
    // each CTA's end lies within its kernel's first and last, on an SM of this GPU
    int sms = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    for (const int kernel : {cuda::kTraceCtaGateUp, cuda::kTraceCtaDown}) {
      const int end_ev = kernel == cuda::kTraceCtaGateUp ? cuda::kTraceGateUpEnd
                                                         : cuda::kTraceDownEnd;
      int recorded = 0;
      for (int c = 0; c < cuda::kTraceMaxCtas; ++c) {
        const unsigned long long at = t[cuda::kTraceCtaOffset + kernel * cuda::kTraceMaxCtas + c];
        if (at == 0) continue;
        ++recorded;
        EXPECT_GE(at, first(end_ev)) << "kernel " << kernel << " CTA " << c;
        EXPECT_LE(at, last(end_ev)) << "kernel " << kernel << " CTA " << c;
        EXPECT_LT(t[cuda::kTraceCtaOffset + (2 + kernel) * cuda::kTraceMaxCtas + c],
                  static_cast<unsigned long long>(sms));
      }
      EXPECT_GT(recorded, 0) << "kernel " << kernel;
    }
    gpu->forward(x.data(), 4, FuseShared::On);  // unset: the words stay as they were
    std::vector<unsigned long long> after(cuda::kTraceWords);
    ASSERT_EQ(cudaMemcpy(after.data(), words, cuda::kTraceWords * 8, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(after, t);
    ASSERT_EQ(cudaFree(words), cudaSuccess);
  }
}

// Qwen2-57B (shared experts, fused and not) at 3 and 32 tokens; Qwen3-30B-A3B at one token, where
// the gate/up kernel routes the token itself and zeroes its own work counter for the next replay.
TEST(GpuLayer, GraphReplayMatchesForward) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* model;
    std::vector<int> tokens;
  };
  for (const Case& c : {Case{"qwen2-57b-a14b", {3, 32}}, Case{"qwen3-30b-a3b", {1}}}) {
    SCOPED_TRACE(c.model);
    const MoeSpec spec = small_spec(c.model);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 4);
    const cuda::GpuLayerOptions opt = base_options(32);
    const auto gpu = cuda::GpuMoeLayer::create(*w, opt);
    for (FuseShared fuse : {FuseShared::On, FuseShared::Off}) {
      if (fuse == FuseShared::On && spec.shared_intermediate == 0) continue;  // (the same path)
      for (int tokens : c.tokens) {
        expect_graph_replay_equals_forward(*gpu, spec, tokens, fuse, 8);
      }
    }
  }
}

// A CUDA graph of a forward holds the plan's own launches (router, routing unless self-routed,
// the expert kernels), plus cuBLAS' GEMMs and the activation where the plan runs the shared MLP
// dense; at most 4 launches fused up to 8 tokens.
TEST(GpuLayer, GraphHoldsThePlansLaunches) {
  const MoeSpec spec = small_spec("deepseek-v3");
  const plan::PlanOverrides none;
  for (int tokens : {1, 8}) {
    EXPECT_LE(plan::own_launches(sm90_plan(spec, tokens, FuseShared::On, none)), 4) << tokens;
  }
  EXPECT_TRUE(sm90_plan(spec, 32, FuseShared::Off, none).dense_shared);
  SKIP_WITHOUT_GPU();
  const cuda::GpuLayerOptions opt = base_options(256);
  const auto gpu = cuda::GpuMoeLayer::create_random(spec, spec.moe_layers.front(), 0, opt);
  for (int tokens : {1, 8, 32, 128}) {
    for (const bool fused : {true, false}) {
      const plan::LayerPlan p = gpu->plan(tokens, fused ? FuseShared::On : FuseShared::Off);
      const cuda::LaunchCount n = gpu->count_launches(tokens, fused);
      std::printf("T=%d %s: %d kernels, %d other graph nodes\n", tokens,
                  fused ? "fused" : "unfused", n.kernels, n.other_nodes);
      // a cuBLAS router GEMM may take more than one kernel; moekit's own take one each
      const bool cublas_router = p.router.config.backend == tuning::RouterGemmBackend::Cublas;
      // (the dense shared MLP: cuBLAS' GEMMs, >= 1 kernel each, and the activation)
      const int dense = p.dense_shared ? 3 : 0;
      if (cublas_router || p.dense_shared) {
        EXPECT_GE(n.kernels, plan::own_launches(p) + dense) << plan::describe(p);
      } else {
        EXPECT_EQ(n.kernels, plan::own_launches(p)) << plan::describe(p);
      }
    }
  }
}

TEST(GpuLayer, RejectsTooManyTokensAndNonFiniteInput) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("qwen3-30b-a3b");
  const cuda::GpuLayerOptions opt = base_options(4);
  const auto gpu = cuda::GpuMoeLayer::create_random(spec, spec.moe_layers.front(), 0, opt);
  std::vector<Bf16> x = random_x(5, spec.hidden, 1);
  test::expect_error([&] { gpu->forward(x.data(), 5, FuseShared::Auto); },
                     {"max_tokens (4), got 5"});
  x[3 * spec.hidden + 7] = float_to_bf16(std::nanf(""));
  test::expect_error([&] { gpu->forward(x.data(), 4, FuseShared::Auto); }, {"token 3, column 7"});
  // device pointers the expert kernels cannot copy or store in 16-byte units
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 1 << 20), cudaSuccess);  // (never read: the check comes first)
  char* base = static_cast<char*>(buf);
  test::expect_error([&] { gpu->forward_device(base + 8, base + 4096, 1, nullptr); },
                     {"x and y must be 16-byte aligned"});
  test::expect_error([&] { gpu->forward_device(base, base + 4096 + 2, 1, nullptr); },
                     {"x and y must be 16-byte aligned"});
  ASSERT_EQ(cudaFree(buf), cudaSuccess);
  // fusing a spec without a shared expert is fine (nothing to fuse); forcing On on a spec that
  // cannot fuse throws naming the widths
  MoeSpec odd = small_spec("qwen2-57b-a14b");
  odd.shared_intermediate = 3 * 64;  // not a multiple of I = 128
  const auto wodd = make_random_weights(odd, odd.moe_layers.front(), 0);
  const auto godd = cuda::GpuMoeLayer::create(*wodd, opt);
  std::vector<Bf16> x4 = random_x(4, odd.hidden, 1);
  EXPECT_THROW(godd->forward(x4.data(), 4, FuseShared::On), Error);
  const ForwardResult r = godd->forward(x4.data(), 4, FuseShared::Auto);
  EXPECT_FALSE(r.fused);
  expect_layer_matches_cpu(odd, *wodd, x4.data(), 4, r, FuseShared::Auto, "unfusable qwen2");
}

}  // namespace
}  // namespace moekit

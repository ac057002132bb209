// The engine API on fp8 block-scale device views (MoeOptions::expert_dtype F8_E4M3): an engine's
// own device copy of an fp8 layer (e4m3 stacks [E+S, 2I, H] / [E+S, H, I] and their 128x128
// tile-scale grids, the fused shared slot after the routed experts) gives the owning fp8
// GpuMoeLayer's y bit for bit (the same plan and kernels), in a CUDA graph too; experts() on the
// layer's own routing gives the same y; expert slices sum to the whole layer; and what the fp8
// device path cannot run is an error naming it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../engine_test_util.h"
#include "../expect_error.h"
#include "../fp8_test_util.h"
#include "../io_test_util.h"
#include "../shrunk_spec.h"
#include "engine_gpu_test_util.h"
#include "layer_test_util.h"
#include "moekit/cuda_layer.h"
#include "moekit/layer.h"
#include "moekit/moe.h"

namespace moekit::test {
namespace {

std::unique_ptr<LayerWeights> fp8_weights(const MoeSpec& spec, uint64_t seed,
                                          const std::string& tag) {
  const std::string dir = scratch_dir("engine_fp8_gpu_" + tag);
  write_fp8_checkpoint(spec, spec.moe_layers.front(), seed, false, dir);
  LoadOptions lo;
  lo.expert_format = ExpertFormat::Fp8Block;
  return load_checkpoint_weights(spec, spec.moe_layers.front(), dir, lo);
}

MoeOptions fp8_options(int max_tokens) {
  MoeOptions o = engine_options(max_tokens, FuseShared::Auto);
  o.expert_dtype = DType::F8_E4M3;
  return o;
}

size_t differing(const Dev& a, const Dev& b, size_t n) {
  const auto x = a.to_host<uint16_t>(n);
  const auto y = b.to_host<uint16_t>(n);
  size_t d = 0;
  for (size_t i = 0; i < n; ++i) d += x[i] != y[i];
  return d;
}

// DeepSeek-V3 (groups, one fused shared slot), MiniMax-M2 (no shared expert), DeepSeek-V4-Flash
// (ue8m0 scales); H and I multiples of 128 as the fp8 kernels need.
const char* const kModels[] = {"deepseek-v3", "minimax-m2", "deepseek-v4-flash"};

// forward() on the borrowed fp8 stacks = GpuMoeLayer::forward_device on its own fp8 copy, bit for
// bit, at decode sizes and where the plan takes the prefill path; experts() on the routing the
// layer picked (route() of the same op) gives the same bits too.
TEST(EngineFp8Gpu, ForwardEqualsTheOwningFp8LayerBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const char* model : kModels) {
    // (H and I multiples of 512: one token takes the fp8 one-token rings)
    const MoeSpec spec = shrunk_spec(model, 512, 512, 16);
    const auto lw = fp8_weights(spec, 5, model);
    ASSERT_EQ(lw->expert_dtype(), DType::F8_E4M3);
    DeviceStacks ds(make_stacks(*lw));
    ASSERT_TRUE(ds.view.fp8());
    const int max_tokens = 256, k = spec.top_k;
    auto layer = cuda::GpuMoeLayer::create(*lw, base_options(max_tokens));
    Engine eng(spec, fp8_options(max_tokens));
    for (int tokens : {1, 5, 33, 200}) {
      const std::string what = std::string(model) + " fp8 T=" + std::to_string(tokens);
      const std::vector<Bf16> x = random_x(tokens, spec.hidden, 100 + tokens);
      const size_t n = x.size() * sizeof(Bf16);
      Dev dx(n, x.data()), dy_engine(n), dy_layer(n), dy_experts(n);
      cudaMemset(dy_engine.p, 0xff, n);
      cudaMemset(dy_layer.p, 0xff, n);
      cudaMemset(dy_experts.p, 0xff, n);
      eng.op.forward(ds.view, dx.p, dy_engine.p, tokens, eng.ws->p, eng.ws->bytes, nullptr);
      layer->forward_device(dx.p, dy_layer.p, tokens, FuseShared::Auto, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      EXPECT_EQ(differing(dy_engine, dy_layer, x.size()), 0u) << what << ": forward elements";
      // route + experts: the forward's routing on the caller's side of the contract
      Dev ids(tokens * k * 4), w(tokens * k * 4);
      eng.op.route(ds.view, dx.p, tokens, ids.as<int32_t>(), w.as<float>(), nullptr, eng.ws->p,
                   eng.ws->bytes, nullptr);
      eng.op.experts(ds.view, dx.p, ids.as<int32_t>(), w.as<float>(), dy_experts.p, tokens, {},
                     eng.ws->p, eng.ws->bytes, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      const std::vector<Bf16> ye = [&] {
        const auto b = dy_experts.to_host<uint16_t>(x.size());
        std::vector<Bf16> v(b.size());
        for (size_t i = 0; i < b.size(); ++i) v[i] = Bf16{b[i]};
        return v;
      }();
      const ForwardResult ref =
          cpu_reference::forward(*lw, x.data(), tokens, FuseShared::Auto, Fp8Compute::W8A8);
      ForwardResult g = ref;  // the GPU's routed ids (a near-tie may pick differently)
      const auto gi = ids.to_host<int32_t>(tokens * k);
      for (int t = 0; t < tokens; ++t) {
        for (int j = 0; j < k; ++j) g.routing.ids[t * ref.routing.slots + j] = gi[t * k + j];
      }
      for (size_t i = 0; i < ye.size(); ++i) g.y[i] = bf16_to_float(ye[i]);
      // the prefill path rounds gate/up to bf16 and re-quantises h from it (fp8_experts.md rule
      // 6): against the reference it is bounded as in test_prefill_fp8_path.cpp (kTolReference)
      const bool prefill = plan::plan_layer(spec, tokens, FuseShared::Auto, {},
                                            cuda::live_device_info(), DType::F8_E4M3)
                               .stream == plan::Stream::Grouped;
      expect_layer_matches(spec, tokens, g, ref, what + " route + experts vs the reference",
                           prefill ? 3e-2 : 5e-3);
      EXPECT_TRUE(eng.op.read_status(eng.ws->p, nullptr).ok()) << what;
    }
  }
}

// The fp8 forward captured in a graph and replayed gives the eager forward bit for bit.
TEST(EngineFp8Gpu, GraphReplayEqualsTheEagerForward) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = shrunk_spec("deepseek-v3", 256, 128, 16);
  const auto lw = fp8_weights(spec, 3, "graph");
  DeviceStacks ds(make_stacks(*lw));
  Engine eng(spec, fp8_options(32));
  for (int tokens : {1, 32}) {
    const std::vector<Bf16> x = random_x(tokens, spec.hidden, tokens);
    const size_t n = x.size() * sizeof(Bf16);
    Dev dx(n, x.data()), eager(n), replay(n);
    cudaStream_t st;
    ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    eng.op.forward(ds.view, dx.p, eager.p, tokens, eng.ws->p, eng.ws->bytes, st);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    eng.op.forward(ds.view, dx.p, replay.p, tokens, eng.ws->p, eng.ws->bytes, st);
    ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int r = 0; r < 3; ++r) ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_EQ(differing(eager, replay, x.size()), 0u) << "T=" << tokens;
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  }
}

// Expert slices of an fp8 layer without a shared expert (MiniMax-M2) sum to the whole layer.
TEST(EngineFp8Gpu, ExpertSlicesSumToTheWholeLayer) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = shrunk_spec("minimax-m2", 256, 128, 16);
  const auto lw = fp8_weights(spec, 8, "slices");
  const int tokens = 12;
  const std::vector<Bf16> x = random_x(tokens, spec.hidden, 4);
  const size_t n = x.size() * sizeof(Bf16);
  Dev dx(n, x.data());
  Engine eng(spec, fp8_options(32));
  DeviceStacks whole(make_stacks(*lw));
  Dev dy(n);
  eng.op.forward(whole.view, dx.p, dy.p, tokens, eng.ws->p, eng.ws->bytes, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto want = dy.to_host<uint16_t>(x.size());
  std::vector<double> sum(x.size(), 0.0);
  const int bounds[] = {0, 5, 16};
  for (int rank = 0; rank < 2; ++rank) {
    StackOptions so;
    so.expert_offset = bounds[rank];
    so.expert_count = bounds[rank + 1] - bounds[rank];
    DeviceStacks part(make_stacks(*lw, so));
    eng.op.forward(part.view, dx.p, dy.p, tokens, eng.ws->p, eng.ws->bytes, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto y = dy.to_host<uint16_t>(x.size());
    for (size_t i = 0; i < y.size(); ++i) sum[i] += bf16_to_float(Bf16{y[i]});
  }
  double err = 0, norm = 0;
  for (size_t i = 0; i < sum.size(); ++i) {
    const double w = bf16_to_float(Bf16{want[i]});
    err += (sum[i] - w) * (sum[i] - w);
    norm += w * w;
  }
  EXPECT_GT(norm, 0.0);
  EXPECT_LT(std::sqrt(err / norm), 1e-2) << "two bf16 partial sums against one";
}

// What the fp8 device path cannot run is an error naming it: a bf16 view on an fp8 op (and the
// reverse), a call of a spec with a shared expert that leaves it out.
TEST(EngineFp8Gpu, WhatItCannotRunIsAClearError) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = shrunk_spec("deepseek-v3", 256, 128, 16);
  const auto f8 = fp8_weights(spec, 2, "errors");
  const auto bf = make_random_weights(spec, spec.moe_layers.front(), 2);
  DeviceStacks d8(make_stacks(*f8)), d16(make_stacks(*bf));
  const int tokens = 3, k = spec.top_k;
  const std::vector<Bf16> x = random_x(tokens, spec.hidden, 1);
  Dev dx(x.size() * 2, x.data()), dy(x.size() * 2), ids(tokens * k * 4), w(tokens * k * 4);
  Engine e8(spec, fp8_options(8));
  Engine e16(spec, engine_options(8, FuseShared::Auto));
  expect_error(
      [&] { e8.op.forward(d16.view, dx.p, dy.p, tokens, e8.ws->p, e8.ws->bytes, nullptr); },
      {"runs F8_E4M3 experts on the device", "holds BF16 stacks"});
  expect_error(
      [&] { e16.op.forward(d8.view, dx.p, dy.p, tokens, e16.ws->p, e16.ws->bytes, nullptr); },
      {"runs BF16 experts on the device", "holds F8_E4M3 stacks"});
  // route() reads no stacks: a bf16-typed route-only view routes on the fp8 op
  MoeWeightsView router_only;
  router_only.location = Location::Device;
  router_only.router_weight = d8.view.router_weight;
  router_only.correction_bias = d8.view.correction_bias;
  e8.op.route(router_only, dx.p, tokens, ids.as<int32_t>(), w.as<float>(), nullptr, e8.ws->p,
              e8.ws->bytes, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpertsOptions eo;
  eo.add_shared = false;
  expect_error(
      [&] {
        e8.op.experts(d8.view, dx.p, ids.as<int32_t>(), w.as<float>(), dy.p, tokens, eo,
                      e8.ws->p, e8.ws->bytes, nullptr);
      },
      {"experts on fp8 device views", "fused slots", "add_shared false"});
  const MoeSpec odd = shrunk_spec("minimax-m2", 192, 128, 8);
  expect_error([&] { (void)workspace_bytes(odd, 8, fp8_options(8)); }, {"multiples of 128"});
}

}  // namespace
}  // namespace moekit::test

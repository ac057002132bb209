// The engine API (include/moekit/moe.h) on device views: an engine's own device copy of a layer
// (vLLM's fused_experts layout, the fused slots after the routed experts) and its own workspace
// give the owning GpuMoeLayer's y bit for bit (decode kernels and the prefill path, fused and
// unfused, in a CUDA graph too); route() gives the layer's ids; experts() on the CPU reference's
// routing gives the reference's y; the caller's current device is left as it was; an expert id
// out of range is reported through the status word.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../engine_test_util.h"
#include "../expect_error.h"
#include "engine_gpu_test_util.h"
#include "layer_test_util.h"
#include "moekit/cuda_layer.h"
#include "moekit/layer.h"
#include "moekit/moe.h"

namespace moekit::test {
namespace {

const std::vector<std::string> kEngineGpuModels = {"deepseek-v3", "qwen2-57b-a14b", "gpt-oss-120b",
                                                   "minimax-m3",  "qwen3-30b-a3b",  "mixtral-8x7b"};

class EngineGpu : public ::testing::TestWithParam<std::string> {};

// forward() on borrowed device weights = GpuMoeLayer::forward_device on its own copy, bit for bit
// (1 and 5 tokens on the decode kernels, 200 on the prefill path where the plan takes it).
TEST_P(EngineGpu, ForwardEqualsTheOwningLayerBitForBit) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec(GetParam());
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 5);
  const EngineStacks hs = make_stacks(*lw);
  DeviceStacks ds(hs);
  const int max_tokens = 256;
  auto layer = cuda::GpuMoeLayer::create(*lw, base_options(max_tokens));
  for (FuseShared fuse : {FuseShared::Auto, FuseShared::On, FuseShared::Off}) {
    if (fuse == FuseShared::On && !spec.can_fuse_shared()) continue;
    Engine eng(spec, engine_options(max_tokens, fuse));
    for (int tokens : {1, 5, 33, 200}) {
      const std::vector<Bf16> x = random_x(tokens, spec.hidden, 100 + tokens);
      const size_t n = x.size() * sizeof(Bf16);
      Dev dx(n, x.data()), dy_engine(n), dy_layer(n);
      cudaMemset(dy_engine.p, 0xff, n);
      cudaMemset(dy_layer.p, 0xff, n);
      eng.op.forward(ds.view, dx.p, dy_engine.p, tokens, eng.ws->p, eng.ws->bytes, nullptr);
      layer->forward_device(dx.p, dy_layer.p, tokens, fuse, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto a = dy_engine.to_host<uint16_t>(x.size());
      const auto b = dy_layer.to_host<uint16_t>(x.size());
      size_t differ = 0;
      for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
      EXPECT_EQ(differ, 0u) << GetParam() << " T=" << tokens << " fuse " << fuse_shared_name(fuse)
                            << ": elements that differ";
      EXPECT_TRUE(eng.op.read_status(eng.ws->p, nullptr).ok());
      EXPECT_TRUE(layer->read_status().ok());
    }
  }
}

// route(x) gives the owning layer's routed ids and weights exactly (same kernels); route_logits
// on the CPU's logits gives the CPU reference's ids exactly, weights to 1e-5.
TEST_P(EngineGpu, RouteMatchesTheLayerAndTheReference) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec(GetParam());
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 6);
  DeviceStacks ds(make_stacks(*lw));
  const int tokens = 37, k = spec.top_k;
  Engine eng(spec, engine_options(64, FuseShared::Off));
  auto layer = cuda::GpuMoeLayer::create(*lw, base_options(64));
  const std::vector<Bf16> x = random_x(tokens, spec.hidden, 9);
  const ForwardResult lf = layer->forward(x.data(), tokens, FuseShared::Off);
  Dev dx(x.size() * 2, x.data()), ids(tokens * k * 4), w(tokens * k * 4), scale(tokens * 4);
  eng.op.route(ds.view, dx.p, tokens, ids.as<int32_t>(), w.as<float>(), scale.as<float>(),
               eng.ws->p, eng.ws->bytes, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto gi = ids.to_host<int32_t>(tokens * k);
  const auto gw = w.to_host<float>(tokens * k);
  for (int t = 0; t < tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(gi[t * k + j], lf.routing.ids[t * lf.routing.slots + j]) << "token " << t;
      EXPECT_EQ(gw[t * k + j], lf.routing.weights[t * lf.routing.slots + j]) << "token " << t;
    }
  }
  const std::vector<float> logits = cpu_reference::router_logits(*lw, x.data(), tokens);
  Dev dl(logits.size() * 4, logits.data());
  eng.op.route_logits(ds.view, dl.as<float>(), tokens, ids.as<int32_t>(), w.as<float>(), nullptr,
                      eng.ws->p, eng.ws->bytes, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Routing cr = cpu_reference::route(RoutingConfig::from_spec(spec, false), logits.data(),
                                          tokens, lw->correction_bias());
  const auto li = ids.to_host<int32_t>(tokens * k);
  const auto lwt = w.to_host<float>(tokens * k);
  for (size_t i = 0; i < li.size(); ++i) {
    EXPECT_EQ(li[i], cr.ids[i]) << "pair " << i;
    EXPECT_NEAR(lwt[i], cr.weights[i], 1e-5 * std::fabs(cr.weights[i]) + 1e-7) << "pair " << i;
  }
}

// experts() on the CPU reference's own ids and weights gives the reference's y (fused slots and
// unfused shared MLP; the decode kernels and the prefill path).
TEST_P(EngineGpu, ExpertsOnTheReferenceRoutingMatchTheReference) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec(GetParam());
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 7);
  DeviceStacks ds(make_stacks(*lw));
  const int k = spec.top_k;
  for (FuseShared fuse : {FuseShared::On, FuseShared::Off}) {
    if (fuse == FuseShared::On && !spec.can_fuse_shared()) continue;
    Engine eng(spec, engine_options(256, fuse));
    for (int tokens : {1, 6, 200}) {
      const std::vector<Bf16> x = random_x(tokens, spec.hidden, 40 + tokens);
      const ForwardResult ref = cpu_reference::forward(*lw, x.data(), tokens, fuse);
      std::vector<int32_t> ids(tokens * k);
      std::vector<float> w(tokens * k);
      for (int t = 0; t < tokens; ++t) {
        for (int j = 0; j < k; ++j) {
          ids[t * k + j] = ref.routing.ids[t * ref.routing.slots + j];
          w[t * k + j] = ref.routing.weights[t * ref.routing.slots + j];
        }
      }
      std::vector<float> scale(tokens, 1.0f);
      if (!ref.routing.shared_scale.empty()) scale = ref.routing.shared_scale;
      const size_t n = x.size() * 2;
      Dev dx(n, x.data()), dy(n), di(ids.size() * 4, ids.data()), dw(w.size() * 4, w.data()),
          dsc(scale.size() * 4, scale.data());
      cudaMemset(dy.p, 0xff, n);
      ExpertsOptions eo;
      eo.shared_scale = dsc.as<float>();
      eng.op.experts(ds.view, dx.p, di.as<int32_t>(), dw.as<float>(), dy.p, tokens, eo, eng.ws->p,
                     eng.ws->bytes, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_TRUE(eng.op.read_status(eng.ws->p, nullptr).ok());
      ForwardResult g;
      g.tokens = tokens;
      g.hidden = spec.hidden;
      g.fused = ref.fused;
      g.routing = ref.routing;
      const auto y16 = dy.to_host<uint16_t>(x.size());
      g.y.resize(y16.size());
      for (size_t i = 0; i < y16.size(); ++i) g.y[i] = bf16_to_float(Bf16{y16[i]});
      expect_layer_matches(
          spec, tokens, g, ref,
          GetParam() + " experts T=" + std::to_string(tokens) + " fuse " + fuse_shared_name(fuse));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EngineGpu, ::testing::ValuesIn(kEngineGpuModels),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-' || c == '.') c = '_';
                           return n;
                         });

// An expert id out of range in the caller's topk ids sets the status word (decode kernels and
// the prefill path); read_status clears it; a good call after reads ok.
TEST(EngineGpuStatus, OutOfRangeIdIsReported) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("qwen3-30b-a3b");
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 3);
  DeviceStacks ds(make_stacks(*lw));
  Engine eng(spec, engine_options(256, FuseShared::Auto));
  const int k = spec.top_k, E = spec.num_experts;
  for (int tokens : {2, 200}) {
    for (int bad : {E, -1}) {
      const std::vector<Bf16> x = random_x(tokens, spec.hidden, 1);
      std::vector<int32_t> ids(tokens * k);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7) % E);
      std::vector<float> w(ids.size(), 0.125f);
      Dev dx(x.size() * 2, x.data()), dy(x.size() * 2), dw(w.size() * 4, w.data());
      Dev di(ids.size() * 4, ids.data());
      eng.op.experts(ds.view, dx.p, di.as<int32_t>(), dw.as<float>(), dy.p, tokens, {}, eng.ws->p,
                     eng.ws->bytes, nullptr);
      EXPECT_TRUE(eng.op.read_status(eng.ws->p, nullptr).ok()) << "T=" << tokens;
      ids[k + 1] = bad;
      ASSERT_EQ(cudaMemcpy(di.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      eng.op.experts(ds.view, dx.p, di.as<int32_t>(), dw.as<float>(), dy.p, tokens, {}, eng.ws->p,
                     eng.ws->bytes, nullptr);
      const MoeStatus s = eng.op.read_status(eng.ws->p, nullptr);
      EXPECT_TRUE(s.expert_id_out_of_range) << "T=" << tokens << " id " << bad;
      EXPECT_NE(s.message().find("outside [0, E)"), std::string::npos);
      EXPECT_TRUE(eng.op.read_status(eng.ws->p, nullptr).ok()) << "cleared by the read";
      // experts() reads no router: a view without one runs, and the host op reports the same word
      MoeWeightsView stacks_only = ds.view;
      stacks_only.router_weight = nullptr;
      eng.op.experts(stacks_only, dx.p, di.as<int32_t>(), dw.as<float>(), dy.p, tokens, {},
                     eng.ws->p, eng.ws->bytes, nullptr);
      const uint32_t device_word = eng.op.read_status(eng.ws->p, nullptr).word();
      const EngineStacks hs = make_stacks(*lw);
      MoeOp host(spec, MoeOptions{});
      std::vector<Bf16> hy(x.size());
      EXPECT_ANY_THROW(host.experts(hs.view, x.data(), ids.data(), w.data(), hy.data(), tokens, {},
                                    nullptr, 0, nullptr));
      EXPECT_EQ(device_word, host.read_host_status().word()) << "T=" << tokens << " id " << bad;
      EXPECT_EQ(device_word, kStatusExpertIdOutOfRange);
    }
  }
}

// Every entry leaves the caller's current device as it found it (with two GPUs: the caller on
// device 1, moekit on device 0); available() checks the device asked for.
TEST(EngineGpuDevice, CallersDeviceIsRestored) {
  SKIP_WITHOUT_GPU();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  std::string why;
  EXPECT_FALSE(cuda::available(&why, count));
  EXPECT_NE(why.find("does not exist"), std::string::npos) << why;
  if (count < 2) GTEST_SKIP() << "one GPU: the caller's device cannot differ from moekit's";
  const MoeSpec spec = small_spec("deepseek-v3");
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 2);
  // the weights, the workspace and the inputs on device 0, the caller's current device 1
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  DeviceStacks ds(make_stacks(*lw));
  const std::vector<Bf16> x = random_x(4, spec.hidden, 3);
  Dev dx(x.size() * 2, x.data()), dy(x.size() * 2);
  MoeOptions o = engine_options(16, FuseShared::Auto);
  o.device = 0;
  MoeOp op(spec, o);
  Dev ws(op.workspace_bytes());
  auto expect_on_1 = [](const char* after) {
    int now = -1;
    EXPECT_EQ(cudaGetDevice(&now), cudaSuccess);
    EXPECT_EQ(now, 1) << "after " << after;
  };
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  (void)workspace_bytes(spec, 16, o);
  expect_on_1("workspace_bytes");
  op.prepare_workspace(ws.p, ws.bytes, nullptr);
  expect_on_1("prepare_workspace");
  op.forward(ds.view, dx.p, dy.p, 4, ws.p, ws.bytes, nullptr);
  expect_on_1("forward");
  EXPECT_TRUE(op.read_status(ws.p, nullptr).ok());
  expect_on_1("read_status");
  cuda::GpuLayerOptions lo = base_options(16);
  lo.device = 0;
  {
    auto layer = cuda::GpuMoeLayer::create(*lw, lo);
    expect_on_1("GpuMoeLayer::create");
    (void)layer->forward(x.data(), 4, FuseShared::Auto);
    expect_on_1("GpuMoeLayer::forward");
  }
  expect_on_1("~GpuMoeLayer");
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

// A CUDA graph of the engine's forward replays to the eager forward's bits.
TEST(EngineGpuGraph, ForwardCapturesAndReplays) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3");
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 8);
  DeviceStacks ds(make_stacks(*lw));
  Engine eng(spec, engine_options(64, FuseShared::Auto));
  const int tokens = 3;
  const std::vector<Bf16> x = random_x(tokens, spec.hidden, 4);
  const size_t n = x.size() * 2;
  Dev dx(n, x.data()), dy(n);
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  eng.op.forward(ds.view, dx.p, dy.p, tokens, eng.ws->p, eng.ws->bytes, st);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  const auto eager = dy.to_host<uint16_t>(x.size());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  eng.op.forward(ds.view, dx.p, dy.p, tokens, eng.ws->p, eng.ws->bytes, st);
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep) {
    ASSERT_EQ(cudaMemset(dy.p, 0xff, n), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_EQ(dy.to_host<uint16_t>(x.size()), eager) << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

// Two ranks' expert slices (the shared expert on the second only) sum to the whole layer, on the
// decode kernels and on the prefill path; experts() on a slice with the whole routing too.
TEST(EngineGpuSlices, SlicesSumToTheWholeLayer) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3");  // 32 experts, one fused slot
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 12);
  const int E = spec.num_experts, k = spec.top_k;
  auto layer = cuda::GpuMoeLayer::create(*lw, base_options(256));
  StackOptions r0, r1;
  r0.expert_offset = 0;
  r0.expert_count = 12;
  r0.fused_slots = false;
  r0.unfused_shared = false;
  r1.expert_offset = 12;
  r1.expert_count = E - 12;
  r1.unfused_shared = false;  // the fused slot only
  DeviceStacks d0(make_stacks(*lw, r0)), d1(make_stacks(*lw, r1));
  Engine eng(spec, engine_options(256, FuseShared::Auto));
  for (int tokens : {3, 40, 200}) {
    const std::vector<Bf16> x = random_x(tokens, spec.hidden, 70 + tokens);
    const size_t n = x.size() * 2;
    Dev dx(n, x.data()), dy0(n), dy1(n), dyl(n);
    const ForwardResult whole = layer->forward(x.data(), tokens, FuseShared::On);
    for (int pass = 0; pass < 2; ++pass) {
      // pass 0: forward on each slice; pass 1: experts() on each slice with the layer's ids
      if (pass == 0) {
        eng.op.forward(d0.view, dx.p, dy0.p, tokens, eng.ws->p, eng.ws->bytes, nullptr);
        eng.op.forward(d1.view, dx.p, dy1.p, tokens, eng.ws->p, eng.ws->bytes, nullptr);
      } else {
        std::vector<int32_t> ids(tokens * k);
        std::vector<float> w(tokens * k);
        for (int t = 0; t < tokens; ++t) {
          for (int j = 0; j < k; ++j) {
            ids[t * k + j] = whole.routing.ids[t * whole.routing.slots + j];
            w[t * k + j] = whole.routing.weights[t * whole.routing.slots + j];
          }
        }
        Dev di(ids.size() * 4, ids.data()), dw(w.size() * 4, w.data());
        eng.op.experts(d0.view, dx.p, di.as<int32_t>(), dw.as<float>(), dy0.p, tokens, {},
                       eng.ws->p, eng.ws->bytes, nullptr);
        eng.op.experts(d1.view, dx.p, di.as<int32_t>(), dw.as<float>(), dy1.p, tokens, {},
                       eng.ws->p, eng.ws->bytes, nullptr);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_TRUE(eng.op.read_status(eng.ws->p, nullptr).ok()) << "skipped pairs are no error";
      const auto a = dy0.to_host<uint16_t>(x.size());
      const auto b = dy1.to_host<uint16_t>(x.size());
      double err = 0, norm = 0;
      size_t non_finite = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        const double sum =
            static_cast<double>(bf16_to_float(Bf16{a[i]})) + bf16_to_float(Bf16{b[i]});
        non_finite += std::isfinite(sum) ? 0 : 1;
        err += (sum - whole.y[i]) * (sum - whole.y[i]);
        norm += static_cast<double>(whole.y[i]) * whole.y[i];
      }
      EXPECT_EQ(non_finite, 0u) << "T=" << tokens << " pass " << pass;
      // two bf16 roundings of partial sums against one
      EXPECT_LT(std::sqrt(err / norm), 1e-2) << "T=" << tokens << " pass " << pass;
    }
  }
}

// What the GPU backend does not take, and host memory in a device view, are named errors.
TEST(EngineGpuErrors, PaddedStacksAndHostPointersAreRefused) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("mixtral-8x7b");
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 2);
  const EngineStacks hs = make_stacks(*lw);
  DeviceStacks ds(hs);
  Engine eng(spec, engine_options(16, FuseShared::Auto));
  const std::vector<Bf16> x = random_x(2, spec.hidden, 3);
  Dev dx(x.size() * 2, x.data()), dy(x.size() * 2);
  MoeWeightsView v = ds.view;
  v.w2_expert_stride = static_cast<int64_t>(spec.hidden) * spec.expert_intermediate + 64;
  expect_error([&] { eng.op.forward(v, dx.p, dy.p, 2, eng.ws->p, eng.ws->bytes, nullptr); },
               {"dense expert stacks", "w2_expert_stride"});
  v = ds.view;
  v.w13 = hs.view.w13;  // host memory
  expect_error([&] { eng.op.forward(v, dx.p, dy.p, 2, eng.ws->p, eng.ws->bytes, nullptr); },
               {"w13", "expected device memory"});
  expect_error([&] { eng.op.forward(ds.view, dx.p, dy.p, 2, eng.ws->p, 64, nullptr); },
               {"workspace holds 64 bytes", "workspace_bytes()"});
}

}  // namespace
}  // namespace moekit::test

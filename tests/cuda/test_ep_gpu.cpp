// Expert parallelism on the GPU (moekit/ep_layer.h) against the single-GPU layer (MoeOp::forward
// on the whole view over all the tokens): each rank's routing ids (ulp ties aside), its y to the
// bf16 rounding of the ranks' partial sums (relative error by norm <= 1e-2, the tolerance of the
// engine API's slice test), the rows sent against the CPU dispatch plan (moekit/ep.h).
//   local transport (every rank on one GPU): world size 2 and 4, both modes, five families, empty
//     ranks, prefill-sized batches
//   NCCL on one GPU: a one-rank communicator under ep::MoeLayer (NCCL's init, groups and the
//     layer's wiring; LowLatency captured in a CUDA graph), NCCL's send / receive to itself, errors
//   NCCL over >= 2 GPUs: the local cases on one GPU per rank (skipped with a message on fewer)
//   DeepSeek-V3 at its real shape through the bench (bench_ep checks y against one GPU)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "../engine_test_util.h"
#include "../expect_error.h"
#include "cuda/ep/exchange.h"
#include "engine_gpu_test_util.h"
#include "ep/nccl_calls.h"
#include "layer_test_util.h"
#include "moekit/ep.h"
#include "moekit/ep_bench.h"
#include "moekit/ep_layer.h"
#include "moekit/ep_nccl.h"
#include "moekit/layer.h"

namespace moekit::test {
namespace {

const std::vector<std::string> kEpModels = {"deepseek-v3", "qwen2-57b-a14b", "gpt-oss-120b",
                                            "qwen3-30b-a3b", "mixtral-8x7b"};

struct EpCase {
  int world = 2;
  std::vector<int> split;  // tokens per rank
};

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Local: every rank on device 0; Nccl: rank r on device r (the single-GPU reference on device 0).
void run_case(const std::string& model, const EpCase& c, ep::Mode mode,
              ep::Transport transport = ep::Transport::Local) {
  const MoeSpec spec = small_spec(model);  // H 256, 32 experts, I 128
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 21);
  const int H = spec.hidden, k = spec.top_k, W = c.world;
  int total = 0, most = 1;
  for (int n : c.split) total += n, most = std::max(most, n);
  const bool nccl = transport == ep::Transport::Nccl;
  const std::string what = model + (nccl ? " nccl" : " local") + " W=" + std::to_string(W) + " " +
                           ep::mode_name(mode) + " T=" + std::to_string(total);
  SCOPED_TRACE(what);

  // the single-GPU layer on all the tokens
  const std::vector<Bf16> x = random_x(std::max(total, 1), H, 300 + total);
  const size_t bytes = static_cast<size_t>(total) * H * sizeof(Bf16);
  Dev dx(bytes, x.data()), dy(bytes), di(static_cast<size_t>(total) * k * 4),
      dw(static_cast<size_t>(total) * k * 4);
  const DeviceStacks whole(make_stacks(*lw));
  Engine eng(spec, engine_options(std::max(total, 1), FuseShared::Auto));
  if (total > 0) {
    eng.op.forward(whole.view, dx.p, dy.p, total, eng.ws->p, eng.ws->bytes, nullptr);
    eng.op.route(whole.view, dx.p, total, di.as<int32_t>(), dw.as<float>(), nullptr, eng.ws->p,
                 eng.ws->bytes, nullptr);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> y_ref = dy.to_host<uint16_t>(static_cast<size_t>(total) * H);
  const std::vector<int32_t> ids_ref = di.to_host<int32_t>(static_cast<size_t>(total) * k);

  // the ranks: contiguous slices, each with the shared expert (fused slots and unfused MLP),
  // their tokens and outputs (poisoned) on their devices
  const ep::Placement p = ep::Placement::contiguous(spec.num_experts, W);
  std::vector<std::unique_ptr<DeviceStacks>> stacks;
  std::vector<std::unique_ptr<Dev>> xs, ys;
  std::vector<ep::RankIo> ranks;
  std::vector<int> devices;
  int first = 0;
  for (int r = 0; r < W; ++r) {
    const int device = nccl ? r : 0;
    ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
    if (nccl) devices.push_back(device);
    StackOptions so;
    so.expert_offset = p.contiguous_first(r);
    so.expert_count = p.local_experts(r);
    stacks.push_back(std::make_unique<DeviceStacks>(make_stacks(*lw, so)));
    const size_t n = static_cast<size_t>(c.split[r]) * H * sizeof(Bf16);
    xs.push_back(std::make_unique<Dev>(n, x.data() + static_cast<size_t>(first) * H));
    ys.push_back(std::make_unique<Dev>(n));
    cudaMemset(ys.back()->p, 0xff, n > 0 ? n : 16);
    ranks.push_back({stacks.back()->view, xs.back()->p, ys.back()->p, c.split[r]});
    first += c.split[r];
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ep::LayerOptions lo;
  lo.mode = mode;
  lo.max_tokens_per_rank = most;
  lo.engine = engine_options(most, FuseShared::Auto);
  lo.timings = true;
  ep::GroupLayer layer(spec, p, transport, devices, lo);
  layer.forward(ranks);
  layer.synchronize();
  for (int r = 0; r < W; ++r) {
    EXPECT_TRUE(layer.read_status(r).ok()) << "rank " << r;
    const ep::RankStats st = layer.stats(r);
    EXPECT_GE(st.total_us, st.route_us + st.home_us) << "rank " << r;
    EXPECT_EQ(st.dispatch_bytes == 0, W == 1) << "rank " << r;
  }

  // ids: each rank routes its own batch, whose router GEMM may sum in another order than the
  // whole batch's, so a token tied to an ulp may pick another expert (at most 1 in 100 tokens,
  // layer_test_util.h's rule); y is compared on the tokens whose ids agree
  first = 0;
  double err = 0, norm = 0;
  size_t non_finite = 0;
  int differing = 0;
  for (int r = 0; r < W; ++r) {
    const int T = c.split[r];
    const std::vector<int32_t> ids = layer.topk_ids(r);
    ASSERT_EQ(ids.size(), static_cast<size_t>(T) * k);
    std::vector<bool> same(T, true);
    for (int t = 0; t < T; ++t) {
      for (int j = 0; j < k; ++j) {
        same[t] = same[t] && ids[t * k + j] == ids_ref[static_cast<size_t>(first + t) * k + j];
      }
      differing += same[t] ? 0 : 1;
    }
    // the rows sent are the CPU plan's for the same routing (each token once per destination)
    Routing rt;
    rt.tokens = T;
    rt.slots = k;
    rt.ids = ids;
    rt.weights.assign(ids.size(), 1.0f);
    const ep::DispatchPlan plan = ep::plan_dispatch(p, r, rt, 0);
    const std::vector<int32_t> sent = layer.rows_sent(r);
    for (int d = 0; d < W; ++d) {
      EXPECT_EQ(sent[d], d == r ? 0 : plan.rows_to(d)) << "rank " << r << " to " << d;
    }
    ASSERT_EQ(cudaSetDevice(nccl ? r : 0), cudaSuccess);
    const std::vector<uint16_t> y = ys[r]->to_host<uint16_t>(static_cast<size_t>(T) * H);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    for (size_t i = 0; i < y.size(); ++i) {
      const double a = bf16_to_float(Bf16{y[i]});
      non_finite += std::isfinite(a) ? 0 : 1;
      if (!same[i / H]) continue;
      const double b = bf16_to_float(Bf16{y_ref[static_cast<size_t>(first) * H + i]});
      err += (a - b) * (a - b);
      norm += b * b;
    }
    first += T;
  }
  EXPECT_LE(differing, total / 100) << "tokens routed differently";
  EXPECT_EQ(non_finite, 0u);
  if (total > 0) {
    EXPECT_LE(std::sqrt(err / std::max(norm, 1e-30)), 1e-2) << "relative error by norm";
  }
}

const std::vector<EpCase> kCases = {
    {2, {1, 1}}, {2, {3, 5}}, {2, {0, 4}}, {2, {40, 33}}, {2, {200, 150}}, {4, {2, 0, 7, 1}},
};

class EpGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(EpGpu, LocalTransportMatchesTheSingleGpuLayer) {
  SKIP_WITHOUT_GPU();
  for (const EpCase& c : kCases) {
    for (ep::Mode mode : {ep::Mode::Throughput, ep::Mode::LowLatency}) {
      run_case(GetParam(), c, mode);
      if (HasFailure()) return;
    }
  }
}

TEST_P(EpGpu, NcclOverGpusMatchesTheSingleGpuLayer) {
  SKIP_WITHOUT_GPU();
  if (!ep::nccl_support().on()) GTEST_SKIP() << ep::nccl_support().describe();
  const int gpus = gpu_count();
  if (gpus < 2) GTEST_SKIP() << "the NCCL path over GPUs needs 2, this machine has " << gpus;
  for (const EpCase& c : kCases) {
    if (c.world > gpus) continue;
    for (ep::Mode mode : {ep::Mode::Throughput, ep::Mode::LowLatency}) {
      run_case(GetParam(), c, mode, ep::Transport::Nccl);
      if (HasFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EpGpu, ::testing::ValuesIn(kEpModels), [](const auto& info) {
  std::string n = info.param;
  for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return n;
});

#define SKIP_WITHOUT_NCCL()                                                      \
  do {                                                                           \
    SKIP_WITHOUT_GPU();                                                          \
    if (!ep::nccl_support().on()) GTEST_SKIP() << ep::nccl_support().describe(); \
  } while (0)

// NCCL's send and receive to the rank itself (the one exchange one GPU can make): the bytes
// arrive, both exchange directions of a group, inside NcclExchange's begin / end.
TEST(EpNcclOneGpu, SendAndReceiveToItself) {
  SKIP_WITHOUT_NCCL();
  ep::Communicator comm(ep::nccl_unique_id(), 1, 0, 0);
  EXPECT_EQ(comm.world_size(), 1);
  EXPECT_EQ(ep::nccl::world_size(comm.get()), 1);
  EXPECT_EQ(ep::nccl::rank(comm.get()), 0);
  EXPECT_EQ(ep::nccl::device(comm.get()), 0);
  const size_t n = (1 << 20) + 12;  // not a multiple of a vector
  std::vector<uint8_t> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<uint8_t>(i * 131 + 7);
  Dev src(n, host.data()), dst(n);
  cudaMemset(dst.p, 0, n);
  ep::NcclExchange ex({comm.get()});
  ex.begin();
  ex.send(0, 0, src.p, n, nullptr);
  ex.recv(0, 0, dst.p, n, nullptr);
  ex.end();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dst.to_host<uint8_t>(n), host);
  EXPECT_NO_THROW(ep::nccl::check_async(comm.get()));
}

// ep::MoeLayer on a one-rank communicator the test makes from a unique id: every expert local,
// nothing sent, y the single-GPU layer's; LowLatency captured in a CUDA graph and replayed gives
// the same bytes; the stats.
TEST(EpNcclOneGpu, OneRankLayerMatchesTheSingleGpuLayer) {
  SKIP_WITHOUT_NCCL();
  for (const std::string model : {"deepseek-v3", "qwen2-57b-a14b"}) {
    SCOPED_TRACE(model);
    const MoeSpec spec = small_spec(model);
    const auto lw = make_random_weights(spec, spec.moe_layers.front(), 5);
    const int H = spec.hidden, T = 37;
    const std::vector<Bf16> x = random_x(T, H, 17);
    const size_t bytes = static_cast<size_t>(T) * H * sizeof(Bf16);
    Dev dx(bytes, x.data()), dy_ref(bytes), dy(bytes), dy_graph(bytes);
    const DeviceStacks whole(make_stacks(*lw));
    Engine eng(spec, engine_options(T, FuseShared::Auto));
    eng.op.forward(whole.view, dx.p, dy_ref.p, T, eng.ws->p, eng.ws->bytes, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> y_ref = dy_ref.to_host<uint16_t>(static_cast<size_t>(T) * H);

    ep::Communicator comm(ep::nccl_unique_id(), 1, 0, 0);
    const ep::Placement p = ep::Placement::contiguous(spec.num_experts, 1);
    for (ep::Mode mode : {ep::Mode::Throughput, ep::Mode::LowLatency}) {
      SCOPED_TRACE(ep::mode_name(mode));
      ep::LayerOptions lo;
      lo.mode = mode;
      lo.max_tokens_per_rank = 64;
      lo.engine = engine_options(64, FuseShared::Auto);
      lo.timings = mode == ep::Mode::Throughput;
      ep::MoeLayer layer(spec, p, comm.get(), lo);
      EXPECT_EQ(layer.rank(), 0);
      EXPECT_EQ(layer.world_size(), 1);
      cudaStream_t s = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      cudaMemset(dy.p, 0xff, bytes);
      layer.forward({whole.view, dx.p, dy.p, T}, s);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      EXPECT_TRUE(layer.read_status(s).ok());
      const std::vector<uint16_t> y = dy.to_host<uint16_t>(static_cast<size_t>(T) * H);
      double err = 0, norm = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        const double a = bf16_to_float(Bf16{y[i]}), b = bf16_to_float(Bf16{y_ref[i]});
        ASSERT_TRUE(std::isfinite(a)) << "y[" << i << "]";
        err += (a - b) * (a - b);
        norm += b * b;
      }
      EXPECT_LE(std::sqrt(err / norm), 1e-2) << "relative error by norm";
      if (mode == ep::Mode::Throughput) {
        const ep::RankStats st = layer.stats();
        EXPECT_EQ(st.dispatch_bytes + st.return_bytes, 0u);
        EXPECT_GT(st.route_us, 0.0f);
        EXPECT_GE(st.total_us, st.route_us + st.home_us);
      } else {
        expect_error([&] { layer.stats(); }, {"no timings"});
        cudaGraph_t g = nullptr;
        cudaGraphExec_t ge = nullptr;
        ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        layer.forward({whole.view, dx.p, dy_graph.p, T}, s);
        ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
        ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
        cudaMemset(dy_graph.p, 0xff, bytes);
        ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        EXPECT_EQ(dy_graph.to_host<uint16_t>(static_cast<size_t>(T) * H), y) << "graph replay";
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
      }
      cudaStreamDestroy(s);
    }
  }
}

TEST(EpNcclOneGpu, ErrorsNameTheProblem) {
  SKIP_WITHOUT_NCCL();
  const MoeSpec spec = small_spec("qwen3-30b-a3b");
  ep::Communicator comm(ep::nccl_unique_id(), 1, 0, 0);
  ep::LayerOptions lo;
  lo.max_tokens_per_rank = 4;
  expect_error([&] { ep::MoeLayer(spec, ep::Placement::contiguous(32, 2), comm.get(), lo); },
               {"the communicator has 1 ranks, the placement 2"});
  lo.engine.device = 1;
  expect_error([&] { ep::MoeLayer(spec, ep::Placement::contiguous(32, 1), comm.get(), lo); },
               {"communicator is on device 0, options.engine.device is 1"});
  lo.engine.device = 0;
  expect_error([&] { ep::MoeLayer(spec, ep::Placement::contiguous(32, 1), nullptr, lo); },
               {"communicator is null"});
  const int gpus = gpu_count();
  std::vector<int> too_many;
  for (int d = 0; d <= gpus && d < ep::kMaxGpuRanks; ++d) too_many.push_back(d);
  if (gpus < ep::kMaxGpuRanks) {
    expect_error(
        [&] {
          ep::GroupLayer(spec, ep::Placement::contiguous(32, static_cast<int>(too_many.size())),
                         ep::Transport::Nccl, too_many, lo);
        },
        {"this machine has " + std::to_string(gpus) + " GPU"});
  }
  expect_error(
      [&] {
        ep::GroupLayer(spec, ep::Placement::contiguous(32, 2), ep::Transport::Nccl, {0, 0}, lo);
      },
      {"each device once"});
}

TEST(EpLocalErrors, MismatchedViewsAndTooManyTokens) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("qwen3-30b-a3b");
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 3);
  const ep::Placement p = ep::Placement::contiguous(spec.num_experts, 2);
  ep::LayerOptions lo;
  lo.max_tokens_per_rank = 4;
  ep::GroupLayer layer(spec, p, ep::Transport::Local, {}, lo);
  StackOptions so;
  so.expert_offset = 0;
  so.expert_count = 16;
  const DeviceStacks r0(make_stacks(*lw, so));
  Dev dx(8 * spec.hidden * sizeof(Bf16)), dy(8 * spec.hidden * sizeof(Bf16));
  expect_error(
      [&] {
        layer.forward({{r0.view, dx.p, dy.p, 1}, {r0.view, dx.p, dy.p, 1}});
      },
      {"rank 1's view holds experts [0, 16)"});
  so.expert_offset = 16;
  const DeviceStacks r1(make_stacks(*lw, so));
  expect_error(
      [&] {
        layer.forward({{r0.view, dx.p, dy.p, 5}, {r1.view, dx.p, dy.p, 1}});
      },
      {"rank 0 routes 5 tokens", "max_tokens_per_rank 4"});
  expect_error(
      [&] {
        layer.forward({{r0.view, dx.p, dy.p, 1}});
      },
      {"one RankIo for each of the 2 ranks, got 1"});
  std::vector<int> swapped(32);
  for (int e = 0; e < 32; ++e) swapped[e] = e ^ 1;  // every expert on one rank, rows out of order
  expect_error(
      [&] {
        ep::GroupLayer(spec, ep::Placement::from_map(32, {swapped}), ep::Transport::Local, {}, lo);
      },
      {"contiguous placements"});
  expect_error(
      [&] {
        ep::GroupLayer(spec, p, ep::Transport::Local, {0, 0}, lo);
      },
      {"the local transport runs every rank on options.engine.device"});
}

// The local exchange refuses posts NCCL would hang on: a receive no send matches, sizes that
// differ.
TEST(EpLocalErrors, UnmatchedPostsAreRefused) {
  SKIP_WITHOUT_GPU();
  Dev a(64), b(64);
  ep::LocalExchange ex(0);
  ex.begin();
  ex.recv(1, 0, b.p, 64, nullptr);
  expect_error([&] { ex.end(); }, {"rank 1 receives 64 bytes from rank 0, which sends it nothing"});
  ex.begin();
  ex.send(0, 1, a.p, 32, nullptr);
  ex.recv(1, 0, b.p, 64, nullptr);
  expect_error([&] { ex.end(); }, {"rank 0 sends 32 bytes to rank 1, which receives 64"});
  ex.begin();
  ex.send(0, 1, a.p, 32, nullptr);
  expect_error([&] { ex.end(); }, {"rank 0 sends 32 bytes to rank 1, which receives nothing"});
}

// DeepSeek-V3 at its real shape (H 7168, 256 experts of I 2048, the shared expert fused): the
// bench's forward over two ranks checked against the whole layer on one GPU (bench_ep throws
// above 1e-2), on one GPU (local) and, where two are present, over NCCL.
TEST(EpBenchGpu, DeepSeekV3RealShapeMatchesOneGpu) {
  SKIP_WITHOUT_GPU();
  std::vector<ep::Transport> transports = {ep::Transport::Local};
  if (ep::nccl_support().on() && gpu_count() >= 2) transports.push_back(ep::Transport::Nccl);
  for (ep::Transport t : transports) {
    ep::EpBenchOptions o;
    o.model = "deepseek-v3";
    o.world = 2;
    o.transport = t;
    o.batches = {1, 96};
    o.iterations = 2;
    const std::vector<ep::EpBenchRecord> recs = ep::bench_ep(o);
    ASSERT_EQ(recs.size(), 4u);
    for (const ep::EpBenchRecord& r : recs) {
      SCOPED_TRACE(r.transport + " " + r.mode + " T=" + std::to_string(r.tokens_per_rank));
      EXPECT_GE(r.rel_error, 0.0) << "the single-GPU check did not run";
      EXPECT_LE(r.rel_error, 1e-2);
      EXPECT_GT(r.link_bytes, 0.0);
      EXPECT_GT(r.us_per_forward, 0.0);
    }
  }
}

}  // namespace
}  // namespace moekit::test

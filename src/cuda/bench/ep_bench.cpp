// bench_ep (moekit/ep_bench.h): the expert-parallel layer on random weights, its phases, the link
// and an NCCL all-to-all of the same bytes, in one run.
//
// Each rank's view holds its contiguous slice of the routed experts and the fused shared slots,
// filled on its device with make_random_weights' values (the same expert ids as the whole layer,
// so the single-GPU baseline computes the same layer); the router is replicated.
#include "moekit/ep_bench.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>

#include "common/random_values.h"
#include "cuda/bench/graph_timing.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "cuda/common/device_guard.h"
#include "cuda/layer/random_fill.h"
#include "ep/nccl_calls.h"
#include "io/random_weight_values.h"
#include "moekit/ep_nccl.h"
#include "moekit/error.h"
#include "moekit/spec.h"

namespace moekit::ep {
namespace {

namespace rv = random_values;
using cuda::DeviceBuffer;

// One rank's device weights: its slice of experts [first, first + n) then the S fused slots.
struct RankWeights {
  DeviceBuffer router, corr_bias, router_bias, w13, w2, b13, b2;
  MoeWeightsView view;

  RankWeights(const MoeSpec& spec, int first, int n, uint64_t seed, int device) {
    cuda::DeviceGuard guard(device);
    const int H = spec.hidden, I = spec.expert_intermediate, S = spec.shared_slots();
    const int E = spec.num_experts, layer = spec.moe_layers.front(), rows = n + S;
    const size_t r13 = static_cast<size_t>(2) * I * H, r2 = static_cast<size_t>(H) * I;
    const size_t router_elems = static_cast<size_t>(spec.router_columns()) * H;
    cudaStream_t s = nullptr;
    const bool f32_router = spec.router_dtype == DType::F32;
    router = DeviceBuffer(router_elems * (f32_router ? 4 : 2));
    if (f32_router) {
      cuda::fill_random_f32(router.as<float>(), router_elems, 1, seed, layer,
                            rv::Tensor::RouterWeight, -1, rv::weight_scale(H), s);
    } else {
      cuda::fill_random_bf16(router.as<__nv_bfloat16>(), router_elems, 1, seed, layer,
                             rv::Tensor::RouterWeight, -1, rv::weight_scale(H), s);
    }
    w13 = DeviceBuffer(rows * r13 * 2);
    w2 = DeviceBuffer(rows * r2 * 2);
    if (n > 0) {
      cuda::fill_random_bf16(w13.as<__nv_bfloat16>(), r13, n, seed, layer, rv::Tensor::ExpertW13,
                             first, rv::weight_scale(H), s);
      cuda::fill_random_bf16(w2.as<__nv_bfloat16>(), r2, n, seed, layer, rv::Tensor::ExpertW2,
                             first, rv::weight_scale(I), s);
    }
    if (S > 0) {  // the fused slots: ids E .. E + S - 1 of the same generator
      cuda::fill_random_bf16(w13.as<__nv_bfloat16>() + n * r13, r13, S, seed, layer,
                             rv::Tensor::ExpertW13, E, rv::weight_scale(H), s);
      cuda::fill_random_bf16(w2.as<__nv_bfloat16>() + n * r2, r2, S, seed, layer,
                             rv::Tensor::ExpertW2, E, rv::weight_scale(I), s);
    }
    view.location = Location::Device;
    view.router_weight = router.ptr;
    if (spec.has_correction_bias) {
      corr_bias = DeviceBuffer(E * sizeof(float));
      cuda::fill_random_f32(corr_bias.as<float>(), E, 1, seed, layer, rv::Tensor::CorrectionBias,
                            -1, rv::kCorrectionBiasScale, s);
      view.correction_bias = corr_bias.as<float>();
    }
    if (spec.has_router_bias) {
      router_bias = DeviceBuffer(E * sizeof(float));
      cuda::fill_random_f32(router_bias.as<float>(), E, 1, seed, layer, rv::Tensor::RouterBias, -1,
                            rv::kBiasScale, s);
      view.router_bias = router_bias.as<float>();
    }
    if (spec.has_expert_bias) {
      b13 = DeviceBuffer(static_cast<size_t>(rows) * 2 * I * sizeof(float));
      b2 = DeviceBuffer(static_cast<size_t>(rows) * H * sizeof(float));
      // the routed experts' rows by their ids, the fused slots' by E + j
      for (const auto& [row0, count, id] : {std::array<int, 3>{0, n, first}, {n, S, E}}) {
        if (count == 0) continue;
        cuda::fill_random_f32(b13.as<float>() + static_cast<size_t>(row0) * 2 * I,
                              static_cast<size_t>(2) * I, count, seed, layer, rv::Tensor::ExpertB13,
                              id, rv::kBiasScale, s);
        cuda::fill_random_f32(b2.as<float>() + static_cast<size_t>(row0) * H, H, count, seed, layer,
                              rv::Tensor::ExpertB2, id, rv::kBiasScale, s);
      }
      view.b13 = b13.as<float>();
      view.b2 = b2.as<float>();
    }
    view.w13 = w13.as<Bf16>();
    view.w2 = w2.as<Bf16>();
    view.fused_slots = S;
    view.expert_offset = first;
    view.expert_count = n;
    MK_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

size_t rank_weight_bytes(const MoeSpec& spec, int n) {
  const size_t rows = static_cast<size_t>(n) + spec.shared_slots();
  return rows * 3 * spec.expert_intermediate * spec.hidden * sizeof(Bf16);
}

std::string device_name(int device) {
  cudaDeviceProp p{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return p.name;
}

// GB/s of a copy of `bytes` from device a to device b (a == b: within one device), median of 5.
double link_gbs(int a, int b, size_t bytes) {
  cuda::DeviceGuard guard(a);
  DeviceBuffer src(bytes);
  DeviceBuffer dst = [&] {
    cuda::DeviceGuard g(b);
    return DeviceBuffer(bytes);
  }();
  if (a != b) {
    int can = 0;
    MK_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
    if (can) {
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled)
        (void)cudaGetLastError();
      else
        MK_CUDA_CHECK(e);
    }
  }
  cuda::bench_timing::Events ev;
  std::vector<float> ms;
  for (int i = 0; i < 6; ++i) {
    MK_CUDA_CHECK(cudaEventRecord(ev.a, nullptr));
    MK_CUDA_CHECK(cudaMemcpyPeerAsync(dst.ptr, b, src.ptr, a, bytes, nullptr));
    MK_CUDA_CHECK(cudaEventRecord(ev.b, nullptr));
    MK_CUDA_CHECK(cudaEventSynchronize(ev.b));
    float m = 0;
    MK_CUDA_CHECK(cudaEventElapsedTime(&m, ev.a, ev.b));
    if (i > 0) ms.push_back(m);
  }
  std::sort(ms.begin(), ms.end());
  return static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

// The NCCL baseline: every pair exchanges `pair_bytes` one way then `pair_bytes` back, each an
// all-to-all of grouped sends and receives (PyTorch's all_to_all_single); mean microseconds.
double alltoall_us(const std::vector<int>& devices, size_t pair_bytes, int iterations) {
  const int W = static_cast<int>(devices.size());
  std::vector<Communicator> comms = Communicator::all(devices);
  std::vector<DeviceBuffer> send, recv;
  std::vector<cudaStream_t> streams(W);
  const size_t bytes = std::max<size_t>(pair_bytes, 1) * W;
  for (int r = 0; r < W; ++r) {
    cuda::DeviceGuard guard(devices[r]);
    send.emplace_back(bytes);
    recv.emplace_back(bytes);
    MK_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
  }
  auto once = [&] {
    for (int way = 0; way < 2; ++way) {
      nccl::group_start();
      for (int r = 0; r < W; ++r) {
        for (int p = 0; p < W; ++p) {
          if (p == r || pair_bytes == 0) continue;
          nccl::send(static_cast<char*>(send[r].ptr) + p * pair_bytes, pair_bytes, p,
                     comms[r].get(), streams[r]);
          nccl::recv(static_cast<char*>(recv[r].ptr) + p * pair_bytes, pair_bytes, p,
                     comms[r].get(), streams[r]);
        }
      }
      nccl::group_end();
    }
  };
  auto sync = [&] {
    for (int r = 0; r < W; ++r) {
      cuda::DeviceGuard guard(devices[r]);
      MK_CUDA_CHECK(cudaStreamSynchronize(streams[r]));
    }
  };
  for (int i = 0; i < 5; ++i) once();
  sync();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) once();
  sync();
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < W; ++r) {
    cuda::DeviceGuard guard(devices[r]);
    MK_CUDA_WARN(cudaStreamDestroy(streams[r]));
  }
  return us / iterations;
}

// |y_ranks - y_whole| / |y_whole| by norm: rank r's T rows against rows [r T, (r + 1) T) of the
// single-GPU layer's y on device 0.
double relative_error(const DeviceBuffer& whole_y, const std::vector<DeviceBuffer>& ys,
                      const std::vector<int>& devices, int T, int H) {
  const size_t n = static_cast<size_t>(T) * H;
  std::vector<Bf16> a(n), b(n);
  double err = 0, norm = 0;
  for (size_t r = 0; r < ys.size(); ++r) {
    {
      cuda::DeviceGuard guard(devices[r]);
      MK_CUDA_CHECK(cudaMemcpy(a.data(), ys[r].ptr, n * sizeof(Bf16), cudaMemcpyDeviceToHost));
    }
    MK_CUDA_CHECK(cudaMemcpy(b.data(), static_cast<const Bf16*>(whole_y.ptr) + r * n,
                             n * sizeof(Bf16), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) {
      const double x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
      if (!std::isfinite(x)) return std::numeric_limits<double>::infinity();
      err += (x - y) * (x - y);
      norm += y * y;
    }
  }
  return std::sqrt(err / std::max(norm, 1e-30));
}

// Each phase's slowest rank and the busiest rank's bytes into rec.slowest; every rank's bytes
// into rec.link_bytes.
void read_stats(const GroupLayer& layer, EpBenchRecord& rec) {
  RankStats& m = rec.slowest;
  for (int r = 0; r < layer.world_size(); ++r) {
    const RankStats s = layer.stats(r);
    rec.link_bytes += static_cast<double>(s.dispatch_bytes + s.return_bytes);
    m.route_us = std::max(m.route_us, s.route_us);
    m.home_us = std::max(m.home_us, s.home_us);
    m.pack_us = std::max(m.pack_us, s.pack_us);
    m.counts_us = std::max(m.counts_us, s.counts_us);
    m.dispatch_us = std::max(m.dispatch_us, s.dispatch_us);
    m.remote_us = std::max(m.remote_us, s.remote_us);
    m.return_us = std::max(m.return_us, s.return_us);
    m.combine_us = std::max(m.combine_us, s.combine_us);
    m.total_us = std::max(m.total_us, s.total_us);
    if (s.dispatch_bytes + s.return_bytes > m.dispatch_bytes + m.return_bytes) {
      m.dispatch_bytes = s.dispatch_bytes;
      m.return_bytes = s.return_bytes;
    }
  }
}

}  // namespace

std::vector<EpBenchRecord> bench_ep(const EpBenchOptions& opt, bool verbose) {
  const MoeSpec spec = load_spec(opt.model);
  const int W = opt.world;
  const bool nccl_transport = opt.transport == Transport::Nccl;
  MK_CHECK(W >= 1 && W <= kMaxGpuRanks,
           "bench --ep: expected 1 to " << kMaxGpuRanks << " ranks, got " << W);
  MK_CHECK(!opt.batches.empty() && !opt.modes.empty(), "bench --ep: no batch or no mode to run");
  if (nccl_transport)
    MK_CHECK(nccl_support().on(), "bench --ep " << W << ": " << nccl_support().describe());
  int count = 0;
  MK_CUDA_CHECK(cudaGetDeviceCount(&count));
  MK_CHECK(!nccl_transport || count >= W,
           "bench --ep " << W << " over NCCL needs " << W << " GPUs, this machine has " << count
                         << " (--ep-transport local runs every rank on one GPU)");
  std::vector<int> devices;
  for (int r = 0; r < W; ++r) devices.push_back(nccl_transport ? r : 0);
  const Placement placement = Placement::contiguous(spec.num_experts, W);
  const int max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());

  std::vector<std::unique_ptr<RankWeights>> weights;
  for (int r = 0; r < W; ++r) {
    weights.push_back(std::make_unique<RankWeights>(
        spec, placement.contiguous_first(r), placement.local_experts(r), opt.seed, devices[r]));
  }
  // the whole layer on device 0, where it fits beside rank 0's share
  std::unique_ptr<RankWeights> whole;
  {
    cuda::DeviceGuard guard(0);
    size_t free_b = 0, total_b = 0;
    MK_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (rank_weight_bytes(spec, spec.num_experts) * 5 / 4 < free_b) {
      whole = std::make_unique<RankWeights>(spec, 0, spec.num_experts, opt.seed, 0);
    }
  }
  std::vector<DeviceBuffer> xs, ys;
  const size_t row = static_cast<size_t>(spec.hidden) * sizeof(Bf16);
  for (int r = 0; r < W; ++r) {
    cuda::DeviceGuard guard(devices[r]);
    xs.emplace_back(max_batch * row);
    ys.emplace_back(max_batch * row);
    cuda::fill_random_bf16(xs.back().as<__nv_bfloat16>(),
                           static_cast<size_t>(max_batch) * spec.hidden, 1, opt.seed, -1,
                           rv::Tensor::Input, r, 1.0f, nullptr);
  }
  const double gbs = link_gbs(devices[0], devices[W > 1 ? 1 : 0], size_t{256} << 20);

  std::vector<EpBenchRecord> out;
  for (Mode mode : opt.modes) {
    for (int T : opt.batches) {
      // a layer sized for this batch: LowLatency's fixed blocks are max_tokens_per_rank rows
      LayerOptions lo;
      lo.mode = mode;
      lo.max_tokens_per_rank = std::max(T, 1);
      lo.timings = true;
      GroupLayer layer(spec, placement, opt.transport,
                       nccl_transport ? devices : std::vector<int>{}, lo);
      std::vector<RankIo> io;
      for (int r = 0; r < W; ++r) io.push_back({weights[r]->view, xs[r].ptr, ys[r].ptr, T});
      const int iters = opt.iterations > 0 ? opt.iterations : (T >= 1024 ? 10 : 50);
      for (int i = 0; i < 3; ++i) layer.forward(io);
      layer.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) layer.forward(io);
      layer.synchronize();
      const double wall =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      layer.forward(io);
      layer.synchronize();
      for (int r = 0; r < W; ++r) {
        const MoeStatus st = layer.read_status(r);
        MK_CHECK(st.ok(), "bench --ep: rank " << r << ": " << st.message());
      }
      EpBenchRecord rec;
      rec.model = spec.name;
      rec.device = device_name(devices[0]);
      rec.transport = nccl_transport ? "nccl" : "local";
      rec.mode = mode_name(mode);
      rec.world = W;
      rec.tokens_per_rank = T;
      rec.us_per_forward = wall / iters;
      read_stats(layer, rec);
      rec.link_gbs = gbs;
      rec.exchange_us = rec.slowest.dispatch_us + rec.slowest.return_us;
      rec.exchange_floor_us =
          static_cast<double>(rec.slowest.dispatch_bytes + rec.slowest.return_bytes) / (gbs * 1e3);
      rec.link_fraction = rec.exchange_us > 0 ? rec.exchange_floor_us / rec.exchange_us : 0;
      if (nccl_transport && W > 1) {
        const size_t pair = rec.slowest.dispatch_bytes / (W - 1);
        rec.alltoall_us = alltoall_us(devices, pair, iters);
      }
      if (whole && W * T <= 8192) {
        cuda::DeviceGuard guard(0);
        MoeOptions eo;
        eo.max_tokens = W * T;
        MoeOp op(spec, eo);
        DeviceBuffer ws(op.workspace_bytes()), x(W * T * row), y(W * T * row);
        op.prepare_workspace(ws.ptr, ws.bytes, nullptr);
        for (int r = 0; r < W; ++r) {  // the ranks' tokens, in rank order
          MK_CUDA_CHECK(cudaMemcpyPeer(static_cast<char*>(x.ptr) + r * T * row, 0, xs[r].ptr,
                                       devices[r], T * row));
        }
        for (int i = 0; i < 3; ++i)
          op.forward(whole->view, x.ptr, y.ptr, W * T, ws.ptr, ws.bytes, nullptr);
        MK_CUDA_CHECK(cudaDeviceSynchronize());
        const auto s0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) {
          op.forward(whole->view, x.ptr, y.ptr, W * T, ws.ptr, ws.bytes, nullptr);
        }
        MK_CUDA_CHECK(cudaDeviceSynchronize());
        rec.single_gpu_us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s0)
                .count() /
            iters;
        rec.rel_error = relative_error(y, ys, devices, T, spec.hidden);
        MK_CHECK(rec.rel_error <= 1e-2, "bench --ep " << W << " " << rec.mode << " T=" << T
                                                      << ": y differs from the single-GPU layer's "
                                                         "by "
                                                      << rec.rel_error << " (relative, by norm)");
      }
      if (verbose) {
        std::fprintf(stderr, "bench --ep %d %s %s T=%d: %.1f us per forward\n", W,
                     rec.transport.c_str(), rec.mode.c_str(), T, rec.us_per_forward);
      }
      out.push_back(rec);
    }
  }
  return out;
}

}  // namespace moekit::ep

// The GPU layer benchmark (cuda_layer.h bench_layer): what a serving engineer reads.
//
// In one run, on one GPU:
//   1. read bandwidth   a 16-byte-load read kernel over >= 2 GB, CUDA-graph replay, median
//   2. weight sets      as many distinct random layers (create_random, on the device) as fit,
//                       up to the model's MoE layer count: rotating among them means no forward
//                       finds its experts in L2 (each set is far larger than the 60 MB L2)
//   3. per batch, per fusion mode (fused and unfused side by side):
//        us_per_layer   one graph of N forwards (set 0..N-1), replayed; median / N
//        step_us        one graph of every MoE layer of the model (layer l on set l % N): a
//                       decode step's MoE time; tokens/s = batch / step
//        floor_us       (distinct touched experts + shared MLP + router + x + y bytes) / bandwidth,
//                       the touched experts counted from each set's actual routing of the input
//        launches       kernel nodes of a captured forward
//        --trace        the kernel timeline of one forward in that graph (print_trace)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "common/random_values.h"
#include "cuda/bench/gemm_ceiling.h"
#include "cuda/bench/graph_timing.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "cuda/common/trace.cuh"
#include "cuda/layer/random_fill.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

using bench_timing::capture;
using bench_timing::Graph;
using bench_timing::Stream;
using bench_timing::time_graph;

constexpr int kReadThreads = 512;
constexpr int kReadUnroll = 4;

// Reads n16 16-byte words; the XOR of what it read is stored only if it equals a value no data
// produces, so the loads cannot be removed.
__global__ void __launch_bounds__(kReadThreads) read_kernel(const uint4* __restrict__ data,
                                                            size_t n16, uint32_t* sink) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  for (; i + (kReadUnroll - 1) * stride < n16; i += kReadUnroll * stride) {
    uint4 v[kReadUnroll];
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) v[u] = __ldcs(data + i + u * stride);
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = __ldcs(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// --trace: the kernel timeline (cuda/common/trace.cuh) of the last forward of the us_per_layer
// graph (one forward per weight set), in us after the down kernel of the forward before it ended
// (its last CTA); the second replay is recorded, so code and TLBs are as warm as when timed.
void print_trace(std::vector<std::unique_ptr<GpuMoeLayer>>& sets, const __nv_bfloat16* x,
                 __nv_bfloat16* y, int batch, FuseShared mode, cudaStream_t stream,
                 const std::string& what) {
  const int n = static_cast<int>(sets.size());
  const size_t bytes = 2 * kTraceWords * sizeof(unsigned long long);
  unsigned long long* words = nullptr;
  MK_CUDA_CHECK(cudaMalloc(&words, bytes));
  struct Cleanup {  // stop recording and free the words, also when something throws
    std::vector<std::unique_ptr<GpuMoeLayer>>& sets;
    unsigned long long* words;
    ~Cleanup() {
      for (auto& s : sets) s->set_trace(nullptr);
      MK_CUDA_WARN(cudaFree(words));
    }
  } cleanup{sets, words};
  Graph g;
  capture(g, stream, [&] {
    for (int i = 0; i < n; ++i) {
      // the forward before the last records into words[0..), the last into words[kTraceWords..)
      sets[i]->set_trace(i >= n - 2 ? words + (i - (n - 2)) * kTraceWords : nullptr);
      sets[i]->forward_device(x, y, batch, mode, stream);
    }
  });
  auto reset = [&] {
    for (int b = 0; b < 2; ++b) {
      MK_CUDA_CHECK(cudaMemsetAsync(words + b * kTraceWords, 0xff, kTraceEvents * 8, stream));
      // the latest times and the per-CTA records: 0 (none)
      MK_CUDA_CHECK(cudaMemsetAsync(words + b * kTraceWords + kTraceEvents, 0,
                                    (kTraceWords - kTraceEvents) * 8, stream));
    }
  };
  reset();
  MK_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
  reset();
  MK_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
  std::vector<unsigned long long> h(2 * kTraceWords);
  MK_CUDA_CHECK(cudaMemcpyAsync(h.data(), words, bytes, cudaMemcpyDeviceToHost, stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  const unsigned long long* prev = h.data();
  const unsigned long long* cur = h.data() + kTraceWords;
  // the register expert kernels (large batches) record nothing: then from the routing's start
  const unsigned long long prev_end = prev[kTraceEvents + kTraceDownEnd];
  const unsigned long long base = n >= 2 && prev_end != 0 ? prev_end : cur[kTraceRoutingStart];
  auto at = [&](int ev, bool last) {
    const unsigned long long t = cur[ev + (last ? kTraceEvents : 0)];
    char buf[32];
    if (t == ~0ull || t == 0) return std::string("     -");
    std::snprintf(buf, sizeof buf, "%6.1f",
                  (static_cast<double>(t) - static_cast<double>(base)) / 1e3);
    return std::string(buf);
  };
  std::fprintf(stderr,
               "trace %s: us after the previous forward's bulk down kernel ended, else after "
               "the routing started (first / last CTA)\n",
               what.c_str());
  auto row = [&](const char* name, int start, int waited, int end) {
    std::fprintf(stderr, "  %-8s start %s / %s   waited %s / %s   end %s / %s\n", name,
                 at(start, false).c_str(), at(start, true).c_str(), at(waited, false).c_str(),
                 at(waited, true).c_str(), at(end, false).c_str(), at(end, true).c_str());
  };
  row("router", kTraceRouterStart, kTraceRouterWaited, kTraceRouterEnd);
  std::fprintf(stderr, "           summed %s / %s (a CTA's products, x read after the wait)\n",
               at(kTraceRouterSummed, false).c_str(), at(kTraceRouterSummed, true).c_str());
  row("routing", kTraceRoutingStart, kTraceRoutingWaited, kTraceRoutingEnd);
  std::fprintf(stderr,
               "           keyed %s, grouped %s, picked %s (token 0: keys, groups kept, top-k)\n",
               at(kTraceRoutingKeyed, false).c_str(), at(kTraceRoutingGrouped, false).c_str(),
               at(kTraceRoutingPicked, false).c_str());
  std::fprintf(stderr, "           routed %s / %s (ids written; the dispatch follows)\n",
               at(kTraceRoutingRouted, false).c_str(), at(kTraceRoutingRouted, true).c_str());
  row("gate/up", kTraceGateUpStart, kTraceGateUpWaited, kTraceGateUpEnd);
  row("down", kTraceDownStart, kTraceDownWaited, kTraceDownEnd);
  std::fprintf(stderr, "           issued %s / %s (first stage's weight copies, before the wait)\n",
               at(kTraceDownIssued, false).c_str(), at(kTraceDownIssued, true).c_str());
  std::fprintf(stderr, "           consumed %s / %s (the consumers' last item; then the epilogue's tail)\n",
               at(kTraceDownConsumed, false).c_str(), at(kTraceDownConsumed, true).c_str());
  // The bulk kernels' CTA ends: their spread, and whether the last CTAs share SMs (a few slow
  // SMs) or not (a slope).
  for (const int kernel : {kTraceCtaGateUp, kTraceCtaDown}) {
    struct End {
      double us;
      int cta;
      unsigned long long sm;
    };
    std::vector<End> ends;
    const unsigned long long* t = cur + kTraceCtaOffset + kernel * kTraceMaxCtas;
    const unsigned long long* sm = cur + kTraceCtaOffset + (2 + kernel) * kTraceMaxCtas;
    for (int c = 0; c < kTraceMaxCtas; ++c) {
      if (t[c] != 0) {
        ends.push_back({(static_cast<double>(t[c]) - static_cast<double>(base)) / 1e3, c, sm[c]});
      }
    }
    if (ends.empty()) continue;
    std::sort(ends.begin(), ends.end(), [](const End& a, const End& b) { return a.us < b.us; });
    auto pct = [&](double p) { return ends[static_cast<size_t>(p * (ends.size() - 1))].us; };
    std::fprintf(stderr,
                 "  %-8s %zu CTAs end at p0 %.1f, p10 %.1f, p50 %.1f, p90 %.1f, max %.1f; last:",
                 kernel == kTraceCtaGateUp ? "gate/up" : "down", ends.size(), pct(0), pct(0.1),
                 pct(0.5), pct(0.9), ends.back().us);
    for (size_t i = ends.size() > 6 ? ends.size() - 6 : 0; i < ends.size(); ++i) {
      std::fprintf(stderr, " %.1f (CTA %d, SM %llu)", ends[i].us, ends[i].cta, ends[i].sm);
    }
    std::fprintf(stderr, "\n");
  }
}

}  // namespace

double measure_read_bandwidth(size_t bytes, int device) {
  MK_CUDA_CHECK(cudaSetDevice(device));
  bytes = bytes / 16 * 16;
  MK_CHECK(bytes >= 16, "read bandwidth buffer too small: " << bytes << " bytes");
  DeviceBuffer buf(bytes), sink(sizeof(uint32_t));
  // why not zeros: never time on zeros (METHOD.md); any non-zero pattern will do
  MK_CUDA_CHECK(cudaMemset(buf.ptr, 0x5a, bytes));
  int sms = 0;
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  Stream stream;
  Graph g;
  capture(g, stream.s, [&] {
    read_kernel<<<sms * 4, kReadThreads, 0, stream.s>>>(buf.as<const uint4>(), bytes / 16,
                                                        sink.as<uint32_t>());
    MK_CUDA_CHECK_LAUNCH();
  });
  const double us = time_graph(g, stream.s, 21, 3);
  return static_cast<double>(bytes) / (us * 1e3);
}

// Above this batch the decode step (every MoE layer in one graph) is not timed: its layers add up.
constexpr int kStepMaxBatch = 512;

std::vector<GpuBenchRecord> bench_layer(const GpuBenchOptions& opt, bool verbose) {
  const MoeSpec spec = load_spec(opt.model);
  MK_CHECK(!opt.batches.empty(), "bench_layer: no batch sizes given");
  const int max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  MK_CHECK(opt.batches.front() >= 1, "bench_layer: batches must be >= 1");
  std::string why;
  MK_CHECK(available(&why), "bench_layer: no usable GPU: " << why);
  MK_CUDA_CHECK(cudaSetDevice(opt.device));
  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, opt.device));

  // 1. read bandwidth over >= 2 GB (4 GB when memory allows)
  size_t free_b = 0, total_b = 0;
  MK_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t read_bytes = std::min<size_t>(size_t{4} << 30, free_b / 4);
  MK_CHECK(read_bytes >= (size_t{2} << 30),
           "bench_layer: needs 8 GB free for the bandwidth probe, " << free_b << " bytes free");
  const double bw_gbs = measure_read_bandwidth(read_bytes, opt.device);
  if (verbose) std::fprintf(stderr, "read bandwidth: %.1f GB/s over %zu MB\n", bw_gbs, read_bytes >> 20);
  // the tensor-core ceiling of the experts' dtype (a dense 8192^3 GEMM), for peak_fraction
  const bool fp8 = opt.expert_dtype == DType::F8_E4M3;
  const bool mx = opt.mx_format != ExpertFormat::Bf16;
  // (MX computes in bf16 after its in-register dequantisation: the bf16 ceiling)
  const double peak_tflops = fp8 ? bench_fp8_gemm_tflops() : bench_bf16_gemm_tflops();
  if (verbose) {
    std::fprintf(stderr, "%s GEMM ceiling: %.1f TFLOP/s\n", fp8 ? "fp8" : "bf16", peak_tflops);
  }

  // 2. distinct weight sets
  GpuLayerOptions lo;
  lo.max_tokens = max_batch;
  lo.device = opt.device;
  lo.fuse = FuseShared::Auto;
  lo.overrides = opt.overrides;
  lo.expert_dtype = opt.expert_dtype;
  lo.mx_format = opt.mx_format;
  const int moe_layers = static_cast<int>(spec.moe_layers.size());
  std::vector<std::unique_ptr<GpuMoeLayer>> sets;
  sets.push_back(GpuMoeLayer::create_random(spec, spec.moe_layers[0], opt.seed, lo));
  const size_t per_set = sets[0]->weight_bytes() + sets[0]->workspace_bytes();
  MK_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t reserve = size_t{4} << 30;  // left for graphs and the router GEMM's workspaces
  int want = moe_layers;
  if (opt.max_layer_sets > 0) want = std::min(want, opt.max_layer_sets);
  while (static_cast<int>(sets.size()) < want && free_b > per_set + reserve) {
    const int l = spec.moe_layers[sets.size()];
    sets.push_back(GpuMoeLayer::create_random(spec, l, opt.seed, lo));
    MK_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  }
  const int nsets = static_cast<int>(sets.size());
  if (verbose) {
    std::fprintf(stderr, "%s: %d weight sets of %.2f GB, %d MoE layers\n", spec.name.c_str(),
                 nsets, per_set / 1e9, moe_layers);
  }

  // inputs: the CLI's random activations (random_values::Tensor::Input), made on the device
  Stream stream;
  const size_t nx = static_cast<size_t>(max_batch) * spec.hidden;
  __nv_bfloat16 *x = nullptr, *y = nullptr;
  MK_CUDA_CHECK(cudaMalloc(&x, nx * 2));
  MK_CUDA_CHECK(cudaMalloc(&y, nx * 2));
  std::vector<GpuBenchRecord> out;
  try {
    fill_random_bf16(x, nx, 1, opt.seed, -1, random_values::Tensor::Input, -1, 1.0f, stream.s);
    std::vector<Bf16> x_host(nx);
    MK_CUDA_CHECK(cudaMemcpyAsync(x_host.data(), x, nx * 2, cudaMemcpyDeviceToHost, stream.s));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream.s));

    std::vector<bool> modes;
    const bool can_fuse = spec.can_fuse_shared();
    const bool has_shared = spec.shared_kind != SharedKind::None;
    const bool quantised = fp8 || mx;
    MK_CHECK(!(quantised && has_shared && opt.fuse == FuseShared::Off),
             "bench_layer: " << (fp8 ? "fp8" : expert_format_name(opt.mx_format))
                             << " experts run the shared expert fused (--fuse-shared off)");
    if (opt.fuse != FuseShared::Off && can_fuse) modes.push_back(true);
    // (fp8, MX: the shared expert runs fused only)
    if ((opt.fuse != FuseShared::On || !can_fuse) && !(quantised && has_shared)) {
      modes.push_back(false);
    }
    // the bytes of an expert and of the shared MLP in the layer's format
    const double expert_bytes =
        static_cast<double>(mx ? mx_mlp_bytes(opt.mx_format, spec.expert_intermediate, spec.hidden)
                            : fp8 ? spec.fp8_expert_bytes()
                                  : spec.expert_bytes());
    const double shared_bytes =
        static_cast<double>(mx ? mx_mlp_bytes(opt.mx_format, spec.shared_intermediate, spec.hidden)
                            : fp8 ? spec.fp8_shared_bytes()
                                  : spec.shared_bytes());

    for (const int batch : opt.batches) {
      std::vector<GpuBenchRecord> recs;
      for (const bool fused : modes) {
        const FuseShared mode = fused ? FuseShared::On : FuseShared::Off;
        GpuBenchRecord r;
        r.model = spec.name;
        r.device = prop.name;
        r.batch = batch;
        r.dtype = mx ? expert_format_name(opt.mx_format) : fp8 ? "fp8" : "bf16";
        r.fuse_shared = fused ? "on" : "off";
        r.auto_choice = sets[0]->resolve_fused(FuseShared::Auto, batch) == fused;
        r.read_bw_gbs = bw_gbs;
        r.layer_sets = nsets;
        r.max_tokens = max_batch;
        r.workspace_bytes = static_cast<double>(sets[0]->workspace_bytes());
        r.moe_layers = moe_layers;
        r.launches = sets[0]->count_launches(batch, fused).kernels;
        r.plan = plan::summary(sets[0]->plan(batch, mode));

        // touched bytes from each set's routing of this input
        double bytes = 0;
        for (auto& s : sets) {
          const ForwardResult fr = s->forward(x_host.data(), batch, mode);
          std::set<int> routed;
          for (const int id : fr.routing.ids) {
            if (id < spec.num_experts) routed.insert(id);
          }
          bytes += static_cast<double>(routed.size()) * expert_bytes;
        }
        bytes /= nsets;
        if (has_shared) bytes += shared_bytes;
        bytes += static_cast<double>(spec.router_bytes());
        bytes += 2.0 * batch * spec.hidden * 2;
        r.touched_bytes = bytes;
        r.floor_us = bytes / (bw_gbs * 1e3);

        // one layer: a graph of one forward per set
        Graph layer_graph;
        capture(layer_graph, stream.s, [&] {
          for (auto& s : sets) s->forward_device(x, y, batch, mode, stream.s);
        });
        const int layer_reps = opt.iterations > 0 ? opt.iterations : 30;
        r.us_per_layer = time_graph(layer_graph, stream.s, layer_reps, 3) / nsets;
        r.bw_fraction = r.floor_us / r.us_per_layer;
        const int slots = spec.top_k + (fused ? spec.shared_slots() : 0);
        const double expert_flops =
            6.0 * batch * slots * static_cast<double>(spec.hidden) * spec.expert_intermediate;
        r.expert_tflops = expert_flops / (r.us_per_layer * 1e6);
        r.peak_tflops = peak_tflops;
        r.peak_fraction = r.expert_tflops / peak_tflops;
        if (batch > kStepMaxBatch) {  // (a step of prefill-sized batches: the layers add up)
          r.step_us = 0;
          r.tokens_per_s = batch / (r.us_per_layer * moe_layers * 1e-6);
          recs.push_back(r);
          if (opt.trace) {
            std::fprintf(stderr,
                         "trace %s T=%d: none above %d tokens (the timeline is of a decode step's "
                         "kernels; time the prefill path's with nsys or ncu)\n",
                         spec.name.c_str(), batch, kStepMaxBatch);
          }
          if (verbose) {
            std::fprintf(stderr, "  batch %d fused=%s: %.1f us/layer (floor %.1f, %.3f of bw), "
                         "%.1f expert TFLOP/s (%.3f of the bf16 ceiling)\n", batch,
                         r.fuse_shared.c_str(), r.us_per_layer, r.floor_us, r.bw_fraction,
                         r.expert_tflops, r.peak_fraction);
          }
          continue;
        }

        // a decode step: every MoE layer, layer l on set l % nsets
        Graph step_graph;
        capture(step_graph, stream.s, [&] {
          for (int l = 0; l < moe_layers; ++l) {
            sets[l % nsets]->forward_device(x, y, batch, mode, stream.s);
          }
        });
        const double est_step = r.us_per_layer * moe_layers;
        int step_reps = opt.iterations > 0 ? opt.iterations
                                           : static_cast<int>(std::clamp(2e6 / est_step, 3.0, 20.0));
        r.step_us = time_graph(step_graph, stream.s, step_reps, 1);
        r.tokens_per_s = batch / (r.step_us * 1e-6);
        if (opt.trace) {
          print_trace(sets, x, y, batch, mode, stream.s,
                      spec.name + " T=" + std::to_string(batch) + (fused ? " fused" : " unfused"));
        }
        if (verbose) {
          std::fprintf(stderr, "  batch %d fused=%s: %.1f us/layer (floor %.1f, %.3f of bw), step %.0f us\n",
                       batch, r.fuse_shared.c_str(), r.us_per_layer, r.floor_us, r.bw_fraction,
                       r.step_us);
        }
        recs.push_back(r);
      }
      if (recs.size() == 2) {
        const double ratio = recs[0].us_per_layer / recs[1].us_per_layer;  // on / off
        recs[0].fused_over_unfused = recs[1].fused_over_unfused = ratio;
      }
      out.insert(out.end(), recs.begin(), recs.end());
    }
  } catch (...) {
    (void)cudaFree(x);
    (void)cudaFree(y);
    throw;
  }
  MK_CUDA_CHECK(cudaFree(x));
  MK_CUDA_CHECK(cudaFree(y));
  return out;
}

}  // namespace moekit::cuda

// The prefill path's grouped GEMMs alone (cuda_layer.h bench_grouped_gemms, `moekit bench
// grouped-gemm`): every instance of the dtype on a model's two GEMMs, with the group sizes a
// random routing gives, against the dtype's GEMM ceiling and the read bandwidth measured in the
// same run. The layer benchmark times the path whole; this one says which instance runs each
// GEMM fastest, and how far each is from its floors.
//
// Operands are random (never zeros: METHOD.md): A [rows, K] and the weights [groups, N, K] as
// the path stacks them, bf16 or e4m3 with fp32 scales (one per row per 128 K for A, one per
// 128 x 128 tile for B). The weights of every group are distinct memory, far larger than L2
// for the models this is for, so a replay reads them from DRAM as the layer does.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/bench/gemm_ceiling.h"
#include "cuda/bench/graph_timing.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "cuda/layer/random_fill.h"
#include "cuda/prefill/prefill_gemm.h"
#include "cuda/prefill/prefill_gemm_fp8.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"
#include "moekit/plan.h"

namespace moekit::cuda {
namespace {

namespace bt = bench_timing;

// max |d - d0| and max |d0| over n bf16 values, as float bits (non-negative: ordered as ints)
__global__ void max_diff_kernel(const __nv_bfloat16* d, const __nv_bfloat16* d0, size_t n,
                                unsigned* out) {
  float diff = 0.0f, mag = 0.0f;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float a = __bfloat162float(d[i]), b = __bfloat162float(d0[i]);
    // a NaN on either side (a poisoned, unwritten output among them) is an infinite difference
    const float e = fabsf(a - b);
    diff = e == e ? fmaxf(diff, e) : __int_as_float(0x7f800000);
    mag = fmaxf(mag, fabsf(b));
  }
  atomicMax(&out[0], __float_as_uint(diff));
  atomicMax(&out[1], __float_as_uint(mag));
}

double max_rel_diff(const __nv_bfloat16* d, const __nv_bfloat16* d0, size_t n, cudaStream_t s) {
  DeviceBuffer out(2 * sizeof(unsigned));
  MK_CUDA_CHECK(cudaMemsetAsync(out.ptr, 0, 2 * sizeof(unsigned), s));
  max_diff_kernel<<<1024, 256, 0, s>>>(d, d0, n, out.as<unsigned>());
  MK_CUDA_CHECK_LAUNCH();
  unsigned host[2];
  MK_CUDA_CHECK(cudaMemcpyAsync(host, out.ptr, sizeof host, cudaMemcpyDeviceToHost, s));
  MK_CUDA_CHECK(cudaStreamSynchronize(s));
  float diff, mag;
  std::memcpy(&diff, &host[0], 4);
  std::memcpy(&mag, &host[1], 4);
  return mag > 0 ? diff / mag : diff;
}

// Rows per weight row (group) of a routing of `tokens` tokens: top_k distinct routed experts per
// token, uniformly at random, and every token in each of `shared` fused shared slots.
std::vector<int> group_rows(int tokens, int experts, int top_k, int shared, uint64_t seed) {
  std::vector<int> rows(experts + shared, 0);
  std::mt19937_64 rng(seed);
  std::vector<int> ids(experts);
  for (int t = 0; t < tokens; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    for (int j = 0; j < top_k; ++j) {  // (a partial Fisher-Yates draw)
      std::uniform_int_distribution<int> pick(j, experts - 1);
      std::swap(ids[j], ids[pick(rng)]);
      ++rows[ids[j]];
    }
  }
  for (int s = 0; s < shared; ++s) rows[experts + s] = tokens;
  return rows;
}

// One GEMM's operands and device arrays: A [m, k] (rows of group g from row0[g]), B [groups, n,
// k], D [m, n]; fp8: A's scales [m, k/128], B's [groups, n/128, k/128].
struct GemmOperands {
  int m = 0, n = 0, k = 0, groups = 0;
  bool fp8 = false;
  DeviceBuffer a, b, d, d0, sa, sb;
  DeviceBuffer problems, pa, pb, psa, psb, pd, lda, ldb, ldd;
  PrefillGroupArrays bf16;
  PrefillFp8GroupArrays f8;
  double bytes = 0;  // what one launch must move at least

  GemmOperands(const std::vector<int>& rows, int n_, int k_, bool fp8_, uint64_t seed,
               cudaStream_t s)
      : n(n_), k(k_), groups(static_cast<int>(rows.size())), fp8(fp8_) {
    m = std::accumulate(rows.begin(), rows.end(), 0);
    const size_t el = fp8 ? 1 : 2;
    const size_t a_count = static_cast<size_t>(m) * k,
                 b_count = static_cast<size_t>(groups) * n * k;
    const size_t d_count = static_cast<size_t>(m) * n;
    a = DeviceBuffer(a_count * el);
    b = DeviceBuffer(b_count * el);
    d = DeviceBuffer(d_count * 2);
    d0 = DeviceBuffer(d_count * 2);
    using random_values::Tensor;
    if (fp8) {
      fill_random_e4m3(a.as<uint8_t>(), a_count, 1, seed, -1, Tensor::Input, -1, s);
      fill_random_e4m3(b.as<uint8_t>(), b_count, 1, seed, 0, Tensor::ExpertW13, -1, s);
      // (values do not change the speed; 1/448 maps the codes' range onto about [-1, 1])
      sa = DeviceBuffer(static_cast<size_t>(m) * (k / 128) * sizeof(float));
      sb = DeviceBuffer(static_cast<size_t>(groups) * (n / 128) * (k / 128) * sizeof(float));
      fill_f32(sa.as<float>(), sa.bytes / 4, 1.0f / 448, s);
      fill_f32(sb.as<float>(), sb.bytes / 4, 1.0f / 448, s);
    } else {
      fill_random_bf16(a.as<__nv_bfloat16>(), a_count, 1, seed, -1, Tensor::Input, -1, 1.0f, s);
      fill_random_bf16(b.as<__nv_bfloat16>(), b_count, 1, seed, 0, Tensor::ExpertW13, -1, 1.0f / 64,
                       s);
    }
    // the per-group arrays, as the path's plan kernel writes them
    std::vector<PrefillProblem> prob(groups);
    std::vector<const void*> ha(groups), hb(groups), hsa(groups), hsb(groups);
    std::vector<void*> hd(groups);
    std::vector<int64_t> la(groups, k), lb(groups, k), ld(groups, n);
    size_t row0 = 0;
    for (int g = 0; g < groups; ++g) {
      prob[g] = {rows[g], n, k};
      ha[g] = static_cast<const char*>(a.ptr) + row0 * k * el;
      hb[g] = static_cast<const char*>(b.ptr) + static_cast<size_t>(g) * n * k * el;
      hd[g] = static_cast<char*>(d.ptr) + row0 * n * 2;
      if (fp8) {
        hsa[g] = sa.as<float>() + row0 * (k / 128);
        hsb[g] = sb.as<float>() + static_cast<size_t>(g) * (n / 128) * (k / 128);
      }
      if (rows[g] > 0) bytes += static_cast<double>(n) * k * el + (fp8 ? 4.0 * n * k / 16384 : 0);
      row0 += rows[g];
    }
    bytes += static_cast<double>(a_count) * el + static_cast<double>(d_count) * 2 +
             (fp8 ? 4.0 * m * (k / 128) : 0);
    auto upload = [&](DeviceBuffer& dst, const void* src, size_t size) {
      dst = DeviceBuffer(size);
      MK_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src, size, cudaMemcpyHostToDevice, s));
    };
    const size_t pbytes = groups * sizeof(void*), lbytes = groups * sizeof(int64_t);
    upload(problems, prob.data(), groups * sizeof(PrefillProblem));
    upload(pa, ha.data(), pbytes);
    upload(pb, hb.data(), pbytes);
    upload(pd, hd.data(), pbytes);
    upload(lda, la.data(), lbytes);
    upload(ldb, lb.data(), lbytes);
    upload(ldd, ld.data(), lbytes);
    if (fp8) {
      upload(psa, hsa.data(), pbytes);
      upload(psb, hsb.data(), pbytes);
    }
    MK_CUDA_CHECK(cudaStreamSynchronize(s));  // (the host vectors go out of scope)
    bf16 = {problems.as<PrefillProblem>(),
            pa.as<const __nv_bfloat16*>(),
            pb.as<const __nv_bfloat16*>(),
            pd.as<__nv_bfloat16*>(),
            lda.as<int64_t>(),
            ldb.as<int64_t>(),
            ldd.as<int64_t>()};
    f8.problems = problems.as<PrefillProblem>();
    f8.a = pa.as<const uint8_t*>();
    f8.b = pb.as<const uint8_t*>();
    f8.scale_a = psa.as<const float*>();
    f8.scale_b = psb.as<const float*>();
    f8.d = pd.as<__nv_bfloat16*>();
    f8.stride_a = lda.as<int64_t>();
    f8.stride_b = ldb.as<int64_t>();
    f8.stride_d = ldd.as<int64_t>();
  }

  void launch(int kernel, void* workspace, cudaStream_t s) const {
    run_grouped_gemm(kernel, fp8, fp8 ? static_cast<const void*>(&f8) : &bf16, groups, workspace,
                     s);
  }
};

}  // namespace

GroupedGemmBenchRun bench_grouped_gemms(const GroupedGemmBenchOptions& o) {
  MK_CUDA_CHECK(cudaSetDevice(o.device));
  const char* why = nullptr;
  MK_CHECK(prefill_gemm_supported(&why), "bench grouped-gemm: " << why);
  const MoeSpec& spec = o.spec;
  const int H = spec.hidden, I = spec.expert_intermediate, E = spec.num_experts;
  MK_CHECK(!o.fp8 || (H % 128 == 0 && I % 128 == 0),
           "bench grouped-gemm: fp8 needs hidden and the expert width multiples of 128, got "
               << H << " and " << I);
  MK_CHECK(o.reps >= 1, "bench grouped-gemm: expected reps >= 1, got " << o.reps);
  const auto table = plan::grouped_gemm_kernels();
  std::vector<int> kernels = o.kernels;
  if (kernels.empty()) {
    for (size_t i = 0; i < table.size(); ++i) {
      if (table[i].fp8 == o.fp8) kernels.push_back(static_cast<int>(i));
    }
  }
  for (const int kernel : kernels) {
    MK_CHECK(kernel >= 0 && kernel < static_cast<int>(table.size()) && table[kernel].fp8 == o.fp8,
             "bench grouped-gemm: instance " << kernel << " is not a " << (o.fp8 ? "fp8" : "bf16")
                                             << " row of the table");
  }
  const int shared = o.fuse_shared ? spec.shared_slots() : 0;

  GroupedGemmBenchRun run;
  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, o.device));
  run.device = prop.name;
  run.read_gbs = measure_read_bandwidth(size_t{4} << 30, o.device);
  run.peak_tflops = o.fp8 ? bench_fp8_gemm_tflops() : bench_bf16_gemm_tflops();
  bt::Stream stream;
  for (const int tokens : o.batches) {
    MK_CHECK(tokens >= 1, "bench grouped-gemm: expected batches >= 1, got " << tokens);
    const std::vector<int> rows = group_rows(tokens, E, spec.top_k, shared, o.seed + tokens);
    struct Gemm {
      const char* name;
      int n, k;
    };
    for (const Gemm g : {Gemm{"gate_up", 2 * I, H}, Gemm{"down", H, I}}) {
      GemmOperands ops(rows, g.n, g.k, o.fp8, o.seed, stream.s);
      DeviceBuffer workspace(prefill_gemm_workspace_bytes(ops.groups));
      for (size_t i = 0; i < kernels.size(); ++i) {
        const plan::GroupedGemmKernel& row = table[kernels[i]];
        MK_CUDA_CHECK(cudaMemsetAsync(ops.d.ptr, 0xFF, ops.d.bytes, stream.s));  // (poison)
        bt::Graph graph;
        bt::capture(graph, stream.s, [&] { ops.launch(kernels[i], workspace.ptr, stream.s); });
        GroupedGemmBenchRecord r;
        r.us = bt::time_graph(graph, stream.s, o.reps, 2);
        if (i == 0) {
          MK_CUDA_CHECK(cudaMemcpyAsync(ops.d0.ptr, ops.d.ptr, ops.d.bytes,
                                        cudaMemcpyDeviceToDevice, stream.s));
        }
        r.max_rel_diff = max_rel_diff(ops.d.as<__nv_bfloat16>(), ops.d0.as<__nv_bfloat16>(),
                                      ops.d.bytes / 2, stream.s);
        r.kernel = row.name;
        r.gemm = g.name;
        r.batch = tokens;
        r.groups = ops.groups;
        r.m = ops.m;
        r.n = g.n;
        r.k = g.k;
        for (const int m : rows) {
          r.padded_rows += static_cast<double>((m + row.tile_m - 1) / row.tile_m) * row.tile_m;
        }
        r.tflops = 2.0 * r.m * r.n * static_cast<double>(r.k) / (r.us * 1e6);
        r.peak_fraction = r.tflops / run.peak_tflops;
        r.bytes = ops.bytes;
        r.floor_us = ops.bytes / (run.read_gbs * 1e3);
        r.bw_fraction = r.floor_us / r.us;
        run.records.push_back(r);
      }
    }
  }
  return run;
}

}  // namespace moekit::cuda

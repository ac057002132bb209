// Timing of the prefill path and the bf16 GEMM ceiling (prefill_bench.h).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "cuda/bench/graph_timing.h"
#include "cuda/common/cublas_check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/prefill/prefill.h"
#include "cuda/prefill/prefill_bench.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

namespace bt = bench_timing;

struct Buffer {
  void* p = nullptr;
  explicit Buffer(size_t bytes) {
    if (bytes > 0) MK_CUDA_CHECK(cudaMalloc(&p, bytes));
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (p != nullptr) MK_CUDA_WARN(cudaFree(p));
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

__device__ __forceinline__ unsigned hash32(unsigned long long i) {
  unsigned long long z = i + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<unsigned>((z ^ (z >> 31)) >> 32);
}

// dst[i] = scale * U(-1, 1) from a hash of (seed, i): benchmark data, not the layer's weights
__global__ void fill_bf16_kernel(__nv_bfloat16* dst, size_t n, unsigned long long seed,
                                 float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(hash32(seed * 0x100000001B3ull + i)) * 2.3283064e-10f;
    dst[i] = __float2bfloat16_rn(scale * (2.0f * u - 1.0f));
  }
}

void fill_bf16(__nv_bfloat16* dst, size_t n, unsigned long long seed, float scale) {
  fill_bf16_kernel<<<1024, 256>>>(dst, n, seed, scale);
  MK_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void upload(Buffer& b, const std::vector<T>& host) {
  MK_CUDA_CHECK(cudaMemcpy(b.p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
}

}  // namespace

PrefillBenchRecord bench_prefill(const MoeSpec& spec, int tokens, bool fused, int reps) {
  MK_CHECK(tokens >= 1 && reps >= 1, "expected tokens >= 1 and reps >= 1, got " << tokens << ", "
                                                                                  << reps);
  MK_CHECK(!fused || spec.can_fuse_shared(), spec.name << " cannot fuse its shared expert");
  const int E = spec.num_experts, K = spec.top_k, S = fused ? spec.shared_slots() : 0;
  const int H = spec.hidden, I = spec.expert_intermediate;
  const int rows = E + S, slots = K + S;
  const size_t pairs = static_cast<size_t>(tokens) * slots;

  // ids: top_k distinct experts per token, spread evenly; then the shared slots
  std::vector<int32_t> ids(pairs);
  std::vector<float> weights(pairs);
  const int step = std::max(1, E / K);
  for (int t = 0; t < tokens; ++t) {
    const unsigned start = (static_cast<unsigned>(t) * 2654435761u) % static_cast<unsigned>(E);
    for (int s = 0; s < slots; ++s) {
      const size_t q = static_cast<size_t>(t) * slots + s;
      ids[q] = s < K ? static_cast<int32_t>((start + s * step) % E) : E + (s - K);
      weights[q] = s < K ? 1.0f / K : 1.0f;
    }
  }
  Buffer x(static_cast<size_t>(tokens) * H * 2), d_ids(pairs * 4), d_w(pairs * 4);
  Buffer w13(static_cast<size_t>(rows) * 2 * I * H * 2), w2(static_cast<size_t>(rows) * H * I * 2);
  Buffer y(static_cast<size_t>(tokens) * H * 2);
  const bool shared_unfused = !fused && spec.shared_kind != SharedKind::None;
  Buffer shared_partial(shared_unfused ? static_cast<size_t>(tokens) * H * 4 : 0);
  Buffer shared_scale(shared_unfused ? static_cast<size_t>(tokens) * 4 : 0);
  Buffer b13(spec.has_expert_bias ? static_cast<size_t>(rows) * 2 * I * 4 : 0);
  Buffer b2(spec.has_expert_bias ? static_cast<size_t>(rows) * H * 4 : 0);
  upload(d_ids, ids);
  upload(d_w, weights);
  fill_bf16(x.as<__nv_bfloat16>(), static_cast<size_t>(tokens) * H, 1, 1.0f);
  fill_bf16(w13.as<__nv_bfloat16>(), static_cast<size_t>(rows) * 2 * I * H, 2, 0.05f);
  fill_bf16(w2.as<__nv_bfloat16>(), static_cast<size_t>(rows) * H * I, 3, 0.05f);
  if (shared_unfused) {
    MK_CUDA_CHECK(cudaMemset(shared_partial.p, 0, static_cast<size_t>(tokens) * H * 4));
    upload(shared_scale, std::vector<float>(tokens, 1.0f));
  }
  if (spec.has_expert_bias) {
    MK_CUDA_CHECK(cudaMemset(b13.p, 0, static_cast<size_t>(rows) * 2 * I * 4));
    MK_CUDA_CHECK(cudaMemset(b2.p, 0, static_cast<size_t>(rows) * H * 4));
  }
  const size_t ws_bytes = prefill_workspace_bytes(tokens, slots, rows, H, I);
  Buffer ws(ws_bytes);

  PrefillParams p;
  p.tokens = tokens;
  p.hidden = H;
  p.inter = I;
  p.rows = rows;
  p.slots = slots;
  p.max_tokens = tokens;
  p.x = x.as<__nv_bfloat16>();
  p.ids = d_ids.as<int32_t>();
  p.weights = d_w.as<float>();
  p.w13 = w13.as<__nv_bfloat16>();
  p.w2 = w2.as<__nv_bfloat16>();
  p.b13 = spec.has_expert_bias ? b13.as<float>() : nullptr;
  p.b2 = spec.has_expert_bias ? b2.as<float>() : nullptr;
  p.activation = spec.activation;
  p.limit = spec.swiglu_limit;
  p.alpha = spec.swiglu_alpha;
  p.beta = spec.swiglu_beta;
  p.shared_partial = shared_unfused ? shared_partial.as<float>() : nullptr;
  p.shared_scale = shared_unfused ? shared_scale.as<float>() : nullptr;
  p.y = y.as<__nv_bfloat16>();
  p.workspace = ws.p;
  p.workspace_bytes = ws_bytes;
  MK_CUDA_CHECK(cudaDeviceSynchronize());

  bt::Stream stream;
  bt::Graph graph;
  bt::capture(graph, stream.s, [&] { launch_prefill_experts(p, stream.s); });
  PrefillBenchRecord r;
  r.model = spec.name;
  r.tokens = tokens;
  r.slots = slots;
  r.rows = rows;
  r.hidden = H;
  r.inter = I;
  r.fused = fused;
  r.us = bt::time_graph(graph, stream.s, reps, 3);
  r.expert_flops = prefill_expert_flops(tokens, slots, H, I);
  r.expert_tflops = r.expert_flops / (r.us * 1e-6) / 1e12;
  r.workspace_bytes = ws_bytes;
  return r;
}

double bench_bf16_gemm_tflops(int n, int reps) {
  MK_CHECK(n >= 256 && reps >= 1, "expected n >= 256 and reps >= 1, got " << n << ", " << reps);
  const size_t elems = static_cast<size_t>(n) * n;
  Buffer a(elems * 2), b(elems * 2), c(elems * 2);
  fill_bf16(a.as<__nv_bfloat16>(), elems, 4, 1.0f);
  fill_bf16(b.as<__nv_bfloat16>(), elems, 5, 1.0f);
  MK_CUDA_CHECK(cudaDeviceSynchronize());  // (the fills ran in the legacy default stream)
  bt::Stream stream;
  cublasHandle_t handle = nullptr;
  MK_CUBLAS_CHECK(cublasCreate(&handle));
  std::unique_ptr<cublasContext, void (*)(cublasHandle_t)> guard(
      handle, [](cublasHandle_t h) { (void)cublasDestroy(h); });
  MK_CUBLAS_CHECK(cublasSetStream(handle, stream.s));
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    MK_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a.p,
                                 CUDA_R_16BF, n, b.p, CUDA_R_16BF, n, &beta, c.p, CUDA_R_16BF, n,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  for (int i = 0; i < 3; ++i) gemm();
  bt::Events ev;
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    MK_CUDA_CHECK(cudaEventRecord(ev.a, stream.s));
    gemm();
    MK_CUDA_CHECK(cudaEventRecord(ev.b, stream.s));
    MK_CUDA_CHECK(cudaEventSynchronize(ev.b));
    MK_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev.a, ev.b));
  }
  std::sort(ms.begin(), ms.end());
  const double seconds = 1e-3 * ms[reps / 2];
  return 2.0 * n * static_cast<double>(n) * n / seconds / 1e12;
}

}  // namespace moekit::cuda

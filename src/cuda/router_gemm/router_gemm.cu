// The router GEMM op: validate -> choose config -> launch (STYLE.md "one op, three layers").
//
// Validation throws "expected X, got Y" naming the field; an empty problem (m == 0) returns before
// anything touches the device. The config comes from the tuning tables (include/moekit/tuning.h)
// for this device's architecture; a table config that needs 16-byte aligned pointers falls back to
// the naive kernel when the caller's pointers are not aligned (a table cannot know pointers).
#include "cuda/router_gemm/router_gemm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <mutex>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/router_gemm/router_gemm_launch.h"
#include "moekit/error.h"
#include "moekit/router_gemm.h"
#include "moekit/spec.h"
#include "moekit/tuning.h"

namespace moekit::cuda {

using tuning::RouterGemmBackend;
using tuning::RouterGemmConfig;

namespace router_gemm_detail {

namespace {
std::atomic<int>& pdl_flag() {
  // On until set_router_gemm_pdl (the CLI maps MOEKIT_PDL=0 to it; the benchmark times both).
  static std::atomic<int> flag{1};
  return flag;
}
}  // namespace

bool pdl_enabled() { return pdl_flag().load(std::memory_order_relaxed) != 0; }

}  // namespace router_gemm_detail

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void validate(const RouterGemmProblem& p) {
  MK_CHECK(p.m >= 0, "router_gemm: expected m >= 0, got m=" << p.m);
  MK_CHECK(p.n > 0, "router_gemm: expected n > 0, got n=" << p.n);
  MK_CHECK(p.k > 0, "router_gemm: expected k > 0, got k=" << p.k);
  MK_CHECK(p.weight_dtype == DType::BF16 || p.weight_dtype == DType::F32,
           "router_gemm: expected weight dtype BF16 or F32, got " << dtype_name(p.weight_dtype));
  MK_CHECK(p.m <= tuning::kMaxTokensPerCall, "router_gemm: expected m <= "
                                                 << tuning::kMaxTokensPerCall << ", got m=" << p.m);
  MK_CHECK(static_cast<long long>(p.m) * p.n < (1ll << 31) &&
               static_cast<long long>(p.n) * p.k < (1ll << 31),
           "router_gemm: expected m*n and n*k < 2^31, got m=" << p.m << " n=" << p.n
                                                             << " k=" << p.k);
  if (p.m == 0) return;
  MK_CHECK(p.x != nullptr, "router_gemm: expected x (bf16 [m, k]) to be set, got nullptr");
  MK_CHECK(p.weight != nullptr, "router_gemm: expected weight ([n, k]) to be set, got nullptr");
  MK_CHECK(p.out != nullptr, "router_gemm: expected out (fp32 [m, n]) to be set, got nullptr");
}

// Whether a config's kernel can read these pointers (16-byte vector loads).
bool pointers_fit(const RouterGemmConfig& c, const RouterGemmProblem& p) {
  if (c.backend != RouterGemmBackend::Dot && c.backend != RouterGemmBackend::SplitK) return true;
  return aligned16(p.x) && aligned16(p.weight);
}

void launch(const RouterGemmProblem& p, const RouterGemmConfig& c, cudaStream_t stream) {
  using namespace router_gemm_detail;
  switch (c.backend) {
    case RouterGemmBackend::Naive:
      launch_router_gemm_naive(p, stream);
      return;
    case RouterGemmBackend::Dot:
      if (p.weight_dtype == DType::F32) {
        launch_router_gemm_dot_f32(p, c, stream);
      } else {
        launch_router_gemm_dot_bf16(p, c, stream);
      }
      return;
    case RouterGemmBackend::SplitK:
      launch_router_gemm_splitk_bf16(p, c, stream);
      return;
    case RouterGemmBackend::Cublas:
      launch_router_gemm_cublas(p, stream);
      return;
  }
  MK_FAIL("router_gemm: unknown backend " << static_cast<int>(c.backend));
}

struct ArchCache {
  std::mutex mutex;
  std::vector<int> arch;  // per device, -1 = not read yet
};

}  // namespace

void set_router_gemm_pdl(bool enabled) {
  router_gemm_detail::pdl_flag().store(enabled ? 1 : 0, std::memory_order_relaxed);
}
bool router_gemm_pdl() { return router_gemm_detail::pdl_enabled(); }

tuning::Arch current_arch() {
  static ArchCache cache;
  int device = 0;
  MK_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(cache.mutex);
  if (cache.arch.size() <= static_cast<size_t>(device)) cache.arch.resize(device + 1, -1);
  if (cache.arch[device] < 0) {
    int major = 0, minor = 0;
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    cache.arch[device] = static_cast<int>(tuning::arch_from_compute_capability(major, minor));
  }
  return static_cast<tuning::Arch>(cache.arch[device]);
}

tuning::RouterGemmChoice router_gemm_choice(const RouterGemmProblem& p) {
  validate(p);
  tuning::RouterGemmChoice choice =
      tuning::choose_router_gemm(current_arch(), p.weight_dtype, p.k, p.n, std::max(p.m, 1));
  if (!pointers_fit(choice.config, p)) {
    choice = tuning::RouterGemmChoice{tuning::router_gemm_fallback(),
                                      tuning::ConfigSource::Fallback, -1};
  }
  return choice;
}

void router_gemm(const RouterGemmProblem& p, cudaStream_t stream) {
  validate(p);
  if (p.m == 0) return;
  launch(p, router_gemm_choice(p).config, stream);
}

void router_gemm(const RouterGemmProblem& p, const RouterGemmConfig& config, cudaStream_t stream) {
  validate(p);
  if (p.m == 0) return;
  const char* problem = tuning::router_gemm_config_problem(config, p.weight_dtype, p.k, p.n, p.m);
  MK_CHECK(problem == nullptr, "router_gemm: config '"
                                   << tuning::describe(config) << "' cannot run "
                                   << dtype_name(p.weight_dtype) << " M=" << p.m << " K=" << p.k
                                   << " N=" << p.n << ": " << problem);
  MK_CHECK(pointers_fit(config, p), "router_gemm: config '"
                                        << tuning::describe(config)
                                        << "' expected 16-byte aligned x and weight, got x="
                                        << p.x << " weight=" << p.weight);
  launch(p, config, stream);
}

void warm_up_router_gemm(const MoeSpec& spec, int max_m, cudaStream_t stream) {
  MK_CHECK(max_m >= 1, "warm_up_router_gemm: expected max_m >= 1, got " << max_m);
  const tuning::Arch arch = current_arch();
  for (const tuning::RouterGemmShape& shape : tuning::router_gemm_shapes(spec)) {
    // Distinct configs over M = 1..max_m, each run once at the largest M that chose it.
    std::vector<std::pair<RouterGemmConfig, int>> runs;
    for (int m = 1; m <= max_m; ++m) {
      const RouterGemmConfig c =
          tuning::choose_router_gemm(arch, shape.weight_dtype, shape.k, shape.n, m).config;
      bool seen = false;
      for (auto& r : runs) {
        if (r.first == c) {
          r.second = m;
          seen = true;
        }
      }
      if (!seen) runs.emplace_back(c, m);
    }
    bool needs_cublas = false;
    for (const auto& r : runs) needs_cublas |= r.first.backend == RouterGemmBackend::Cublas;
    if (needs_cublas) {
      router_gemm_detail::prepare_router_gemm_cublas(
          shape.weight_dtype == DType::F32 ? static_cast<size_t>(max_m) * shape.k : 0);
    }
    // Scratch buffers: zeros are enough to load the modules and touch every code path.
    const size_t x_bytes = static_cast<size_t>(max_m) * shape.k * 2;
    const size_t w_bytes = static_cast<size_t>(shape.n) * shape.k * dtype_size(shape.weight_dtype);
    const size_t out_bytes = static_cast<size_t>(max_m) * shape.n * 4;
    const size_t bias_bytes = shape.has_bias ? static_cast<size_t>(shape.n) * 4 : 0;
    void* buf = nullptr;
    auto round16 = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t total = round16(x_bytes) + round16(w_bytes) + round16(out_bytes) + bias_bytes;
    MK_CUDA_CHECK(cudaMalloc(&buf, total));
    char* base = static_cast<char*>(buf);
    try {
      MK_CUDA_CHECK(cudaMemsetAsync(buf, 0, total, stream));
      RouterGemmProblem p;
      p.n = shape.n;
      p.k = shape.k;
      p.weight_dtype = shape.weight_dtype;
      p.x = base;
      p.weight = base + round16(x_bytes);
      p.out = reinterpret_cast<float*>(base + round16(x_bytes) + round16(w_bytes));
      p.bias = shape.has_bias ? reinterpret_cast<const float*>(base + round16(x_bytes) +
                                                               round16(w_bytes) +
                                                               round16(out_bytes))
                              : nullptr;
      for (const auto& r : runs) {
        p.m = r.second;
        router_gemm(p, r.first, stream);
      }
      MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    } catch (...) {
      MK_CUDA_WARN(cudaFree(buf));
      throw;
    }
    MK_CUDA_CHECK(cudaFree(buf));
  }
}

}  // namespace moekit::cuda

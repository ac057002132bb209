// Host-facing router GEMM entries (include/moekit/router_gemm.h): router_logits on host arrays,
// device info, and RouterGemmTimer (CUDA-graph replay over weight copies rotated out of L2),
// which `moekit tune` and `moekit bench router-gemm` use.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/random_values.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "cuda/router_gemm/router_gemm.h"
#include "moekit/error.h"
#include "moekit/router_gemm.h"
#include "moekit/weights.h"

namespace moekit::cuda {

namespace {

struct StreamGuard {
  cudaStream_t s = nullptr;
  StreamGuard() { MK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~StreamGuard() { MK_CUDA_WARN(cudaStreamDestroy(s)); }
};

// Uniform [-scale, scale), rounded to bf16 (also for fp32 weights: exact either way).
__global__ void fill_random_kernel(void* out, size_t count, bool f32, uint64_t stream, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const __nv_bfloat16 v = __float2bfloat16(random_values::uniform(stream, i) * scale);
    if (f32) {
      static_cast<float*>(out)[i] = __bfloat162float(v);
    } else {
      static_cast<__nv_bfloat16*>(out)[i] = v;
    }
  }
}

__global__ void fill_nan_kernel(float* out, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = __int_as_float(0x7fc00000);
}

__global__ void empty_kernel() {}

// An empty kernel that, launched with PDL, waits for the kernel before it (the boundary every
// dependent kernel pays in a decode step).
__global__ void empty_dependent_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Stand-in for the kernel before the router GEMM in a decode step (the previous layer's down
// kernel): it lets its dependents launch at once (so a PDL router GEMM takes spare SM slots and
// loads its weights under it), streams `stream_vecs` 16-byte vectors from HBM, and writes the
// router's input last (x_dst = x_src), so that x is produced by the kernel before, as in the layer.
__global__ void step_predecessor_kernel(const uint4* stream, size_t stream_vecs, const uint4* x_src,
                                        uint4* x_dst, size_t x_vecs, unsigned* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  unsigned acc = 0;
  for (size_t i = first; i < stream_vecs; i += stride) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(stream + i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) atomicAdd(sink, 1u);  // why: the loads must not be dead code
  for (size_t i = first; i < x_vecs; i += stride) x_dst[i] = x_src[i];
}

// Bytes the stand-in streams per launch: ~3.7 us at the H200's read bandwidth, longer than a
// router GEMM's weight fetch, shorter than a real down kernel (60-70 us for DeepSeek-V3).
constexpr size_t kStepStreamBytes = size_t{16} << 20;

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

std::vector<float> router_logits(const LayerWeights& w, const Bf16* x, int tokens,
                                 const tuning::RouterGemmConfig* config) {
  const MoeSpec& spec = w.spec();
  MK_CHECK(tokens >= 0, "router_logits: expected tokens >= 0, got " << tokens);
  const int n = spec.router_columns();
  const int k = spec.hidden;
  std::vector<float> out(static_cast<size_t>(tokens) * n);
  if (tokens == 0) return out;
  const size_t w_bytes = static_cast<size_t>(n) * k * dtype_size(spec.router_dtype);
  const size_t x_bytes = static_cast<size_t>(tokens) * k * sizeof(Bf16);
  DeviceBuffer dw(w_bytes), dx(x_bytes), dout(out.size() * sizeof(float)), dbias(n * 4);
  StreamGuard stream;
  MK_CUDA_CHECK(cudaMemcpyAsync(dw.ptr, w.router_weight(), w_bytes, cudaMemcpyHostToDevice, stream.s));
  MK_CUDA_CHECK(cudaMemcpyAsync(dx.ptr, x, x_bytes, cudaMemcpyHostToDevice, stream.s));
  if (w.router_bias() != nullptr) {
    MK_CUDA_CHECK(cudaMemcpyAsync(dbias.ptr, w.router_bias(), n * sizeof(float),
                                  cudaMemcpyHostToDevice, stream.s));
  }
  RouterGemmProblem p;
  p.m = tokens;
  p.n = n;
  p.k = k;
  p.weight_dtype = spec.router_dtype;
  p.x = dx.ptr;
  p.weight = dw.ptr;
  p.bias = w.router_bias() != nullptr ? static_cast<const float*>(dbias.ptr) : nullptr;
  p.out = static_cast<float*>(dout.ptr);
  if (config != nullptr) {
    router_gemm(p, *config, stream.s);
  } else {
    router_gemm(p, stream.s);
  }
  MK_CUDA_CHECK(cudaMemcpyAsync(out.data(), dout.ptr, out.size() * sizeof(float),
                                cudaMemcpyDeviceToHost, stream.s));
  MK_CUDA_CHECK(cudaStreamSynchronize(stream.s));
  return out;
}

RouterGemmDeviceInfo router_gemm_device_info() {
  int count = 0;
  MK_CUDA_CHECK(cudaGetDeviceCount(&count));
  MK_CHECK(count > 0, "no CUDA device found");
  int device = 0;
  MK_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  RouterGemmDeviceInfo info;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.sms = prop.multiProcessorCount;
  info.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  info.arch = tuning::arch_from_compute_capability(prop.major, prop.minor);
  return info;
}

// ---- RouterGemmTimer ----

struct RouterGemmTimer::Impl {
  tuning::RouterGemmShape shape;
  int max_m = 0;
  int copies = 0;
  size_t w_bytes = 0, x_bytes = 0, out_bytes = 0, bias_bytes = 0, copy_stride = 0;
  std::unique_ptr<DeviceBuffer> pool;
  StreamGuard stream;
  cudaEvent_t start = nullptr, stop = nullptr;
  // time_in_step_us's stand-in predecessor: stream windows of kStepStreamBytes rotated out of L2,
  // the x it writes (x_src: the copies' x values) and a sink for its checksum
  int windows = 0;
  int sms = 0;
  std::unique_ptr<DeviceBuffer> step_stream, x_src, sink;

  // Microseconds `launch(copy)` adds after the stand-in predecessor: graph of (predecessor,
  // launch) pairs minus the graph of predecessors alone, per launch.
  template <typename Launch>
  double time_after_predecessor(int m, Launch launch) {
    const double alone = time_graph([&](int c) { launch_predecessor(c, m); });
    const double with = time_graph([&](int c) {
      launch_predecessor(c, m);
      launch(c);
    });
    return with - alone;
  }

  // Runs `config` once on copy 0 at M = m with its output poisoned (NaN) first and returns the
  // output; `in_step`: after the stand-in, with x poisoned (bf16 NaN, 0xffff) until the stand-in
  // rewrites it, so a launch that reads x before its PDL wait returns NaN.
  std::vector<float> run_once(const tuning::RouterGemmConfig& config, int m, bool in_step) {
    const RouterGemmProblem p = problem(0, m);
    const size_t count = static_cast<size_t>(m) * shape.n;
    fill_nan_kernel<<<64, 256, 0, stream.s>>>(p.out, count);
    MK_CUDA_CHECK_LAUNCH();
    if (in_step) {
      MK_CUDA_CHECK(cudaMemsetAsync(const_cast<void*>(p.x), 0xff,
                                    static_cast<size_t>(m) * shape.k * 2, stream.s));
      launch_predecessor(0, m);
    }
    router_gemm(p, config, stream.s);
    std::vector<float> out(count);
    MK_CUDA_CHECK(cudaMemcpyAsync(out.data(), p.out, count * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream.s));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream.s));
    return out;
  }

  // The stand-in predecessor of launch `copy`: streams window copy % windows, then writes the
  // copy's x (m rows).
  void launch_predecessor(int copy, int m) {
    const RouterGemmProblem p = problem(copy, m);
    const size_t window_vecs = kStepStreamBytes / 16;
    const uint4* window = static_cast<const uint4*>(step_stream->ptr) +
                          static_cast<size_t>(copy % windows) * window_vecs;
    step_predecessor_kernel<<<sms, 256, 0, stream.s>>>(
        window, window_vecs, static_cast<const uint4*>(x_src->ptr),
        static_cast<uint4*>(const_cast<void*>(p.x)), static_cast<size_t>(m) * shape.k * 2 / 16,
        static_cast<unsigned*>(sink->ptr));
    MK_CUDA_CHECK_LAUNCH();
  }

  RouterGemmProblem problem(int copy, int m) const {
    char* base = static_cast<char*>(pool->ptr) + static_cast<size_t>(copy) * copy_stride;
    RouterGemmProblem p;
    p.m = m;
    p.n = shape.n;
    p.k = shape.k;
    p.weight_dtype = shape.weight_dtype;
    p.weight = base;
    p.x = base + align256(w_bytes);
    p.out = reinterpret_cast<float*>(base + align256(w_bytes) + align256(x_bytes));
    p.bias = shape.has_bias ? reinterpret_cast<const float*>(base + align256(w_bytes) +
                                                             align256(x_bytes) +
                                                             align256(out_bytes))
                            : nullptr;
    return p;
  }

  // Captures `launch(copy)` for every copy into one graph, replays it (1 warm-up + kReps timed)
  // and returns the median replay time per launch in microseconds.
  template <typename Launch>
  double time_graph(Launch launch) {
    constexpr int kReps = 7;
    cudaGraph_t graph = nullptr;
    MK_CUDA_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
    try {
      for (int c = 0; c < copies; ++c) launch(c);
    } catch (...) {
      cudaGraph_t g = nullptr;
      MK_CUDA_WARN(cudaStreamEndCapture(stream.s, &g));
      if (g != nullptr) MK_CUDA_WARN(cudaGraphDestroy(g));
      throw;
    }
    MK_CUDA_CHECK(cudaStreamEndCapture(stream.s, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    MK_CUDA_WARN(cudaGraphDestroy(graph));
    MK_CUDA_CHECK(inst);
    std::vector<float> ms(kReps);
    try {
      MK_CUDA_CHECK(cudaGraphUpload(exec, stream.s));
      MK_CUDA_CHECK(cudaGraphLaunch(exec, stream.s));  // warm-up
      for (int r = 0; r < kReps; ++r) {
        MK_CUDA_CHECK(cudaEventRecord(start, stream.s));
        MK_CUDA_CHECK(cudaGraphLaunch(exec, stream.s));
        MK_CUDA_CHECK(cudaEventRecord(stop, stream.s));
        MK_CUDA_CHECK(cudaEventSynchronize(stop));
        MK_CUDA_CHECK(cudaEventElapsedTime(&ms[r], start, stop));
      }
    } catch (...) {
      MK_CUDA_WARN(cudaGraphExecDestroy(exec));
      throw;
    }
    MK_CUDA_CHECK(cudaGraphExecDestroy(exec));
    std::sort(ms.begin(), ms.end());
    return 1000.0 * ms[kReps / 2] / copies;
  }
};

RouterGemmTimer::RouterGemmTimer(const tuning::RouterGemmShape& shape, int max_m, uint64_t seed)
    : impl_(std::make_unique<Impl>()) {
  MK_CHECK(max_m >= 1, "RouterGemmTimer: expected max_m >= 1, got " << max_m);
  MK_CHECK(shape.k > 0 && shape.n > 0,
           "RouterGemmTimer: expected K, N > 0, got K=" << shape.k << " N=" << shape.n);
  Impl& s = *impl_;
  s.shape = shape;
  s.max_m = max_m;
  s.w_bytes = static_cast<size_t>(shape.n) * shape.k * dtype_size(shape.weight_dtype);
  s.x_bytes = static_cast<size_t>(max_m) * shape.k * 2;
  s.out_bytes = static_cast<size_t>(max_m) * shape.n * 4;
  s.bias_bytes = shape.has_bias ? static_cast<size_t>(shape.n) * 4 : 0;
  s.copy_stride = align256(s.w_bytes) + align256(s.x_bytes) + align256(s.out_bytes) +
                  align256(s.bias_bytes);
  const RouterGemmDeviceInfo info = router_gemm_device_info();
  // why 2.5 x L2 of weights: every launch then finds its weights evicted, as in a decode step
  // where the experts stream gigabytes between two router GEMMs. why at most 256 copies: graph
  // instantiation grows with nodes; for gates under 2.5 x L2 / 256 (~0.6 MB on an H200, only
  // Mixtral's) part of the rotation stays in L2, which favours cuBLAS and us alike.
  constexpr int kMaxCopies = 256;
  const double want = 2.5 * static_cast<double>(info.l2_bytes) / static_cast<double>(s.w_bytes);
  s.copies = static_cast<int>(std::clamp(std::ceil(want), 2.0, static_cast<double>(kMaxCopies)));
  s.pool = std::make_unique<DeviceBuffer>(s.copy_stride * s.copies);
  for (int c = 0; c < s.copies; ++c) {
    const RouterGemmProblem p = s.problem(c, max_m);
    using random_values::Tensor;
    const uint64_t key = random_values::stream_key(seed, c, Tensor::RouterWeight, -1);
    // why 1/sqrt(K): keeps logits O(1), as a trained gate's are
    const float scale = 1.0f / std::sqrt(static_cast<float>(shape.k));
    fill_random_kernel<<<1024, 256, 0, s.stream.s>>>(const_cast<void*>(p.weight),
                                                     s.w_bytes / dtype_size(shape.weight_dtype),
                                                     shape.weight_dtype == DType::F32, key, scale);
    MK_CUDA_CHECK_LAUNCH();
    // why the same x values in every copy (at its own address): the in-step stand-in rewrites
    // each copy's x from one source, so x never changes under a run and a reference computed
    // before in-step timings still holds after them
    fill_random_kernel<<<1024, 256, 0, s.stream.s>>>(
        const_cast<void*>(p.x), s.x_bytes / 2, false,
        random_values::stream_key(seed, 0, Tensor::Input, -1), 1.0f);
    MK_CUDA_CHECK_LAUNCH();
    if (shape.has_bias) {
      fill_random_kernel<<<16, 256, 0, s.stream.s>>>(
          const_cast<float*>(p.bias), shape.n, true,
          random_values::stream_key(seed, c, Tensor::RouterBias, -1), 1.0f);
      MK_CUDA_CHECK_LAUNCH();
    }
  }
  // The in-step stand-in's buffers: windows covering 2.5 x L2 (as the weight copies), zeroed
  // (its reads are timed, never used), and its x source: the copies' x values.
  s.sms = info.sms;
  s.windows = static_cast<int>(std::max(
      2.0, std::ceil(2.5 * static_cast<double>(info.l2_bytes) / kStepStreamBytes)));
  s.step_stream = std::make_unique<DeviceBuffer>(kStepStreamBytes * s.windows);
  MK_CUDA_CHECK(cudaMemsetAsync(s.step_stream->ptr, 0, kStepStreamBytes * s.windows, s.stream.s));
  s.sink = std::make_unique<DeviceBuffer>(sizeof(unsigned));
  MK_CUDA_CHECK(cudaMemsetAsync(s.sink->ptr, 0, sizeof(unsigned), s.stream.s));
  s.x_src = std::make_unique<DeviceBuffer>(s.x_bytes);
  fill_random_kernel<<<1024, 256, 0, s.stream.s>>>(
      s.x_src->ptr, s.x_bytes / 2, false,
      random_values::stream_key(seed, 0, random_values::Tensor::Input, -1), 1.0f);
  MK_CUDA_CHECK_LAUNCH();
  MK_CUDA_CHECK(cudaEventCreate(&s.start));
  MK_CUDA_CHECK(cudaEventCreate(&s.stop));
  MK_CUDA_CHECK(cudaStreamSynchronize(s.stream.s));
}

RouterGemmTimer::~RouterGemmTimer() {
  if (impl_) {
    if (impl_->start != nullptr) MK_CUDA_WARN(cudaEventDestroy(impl_->start));
    if (impl_->stop != nullptr) MK_CUDA_WARN(cudaEventDestroy(impl_->stop));
  }
}

int RouterGemmTimer::copies() const { return impl_->copies; }

double RouterGemmTimer::bytes(int m) const {
  const Impl& s = *impl_;
  return static_cast<double>(s.w_bytes) + static_cast<double>(m) * s.shape.k * 2 +
         static_cast<double>(m) * s.shape.n * 4 + static_cast<double>(s.bias_bytes);
}

double RouterGemmTimer::time_config_us(const tuning::RouterGemmConfig& config, int m) {
  Impl& s = *impl_;
  MK_CHECK(m >= 1 && m <= s.max_m, "RouterGemmTimer: expected 1 <= m <= " << s.max_m << ", got " << m);
  // Validate (and create cuBLAS state, fp32 staging) outside the capture.
  router_gemm(s.problem(0, m), config, s.stream.s);
  MK_CUDA_CHECK(cudaStreamSynchronize(s.stream.s));
  return s.time_graph([&](int c) { router_gemm(s.problem(c, m), config, s.stream.s); });
}

double RouterGemmTimer::time_dispatch_us(int m) {
  Impl& s = *impl_;
  MK_CHECK(m >= 1 && m <= s.max_m, "RouterGemmTimer: expected 1 <= m <= " << s.max_m << ", got " << m);
  router_gemm(s.problem(0, m), s.stream.s);
  MK_CUDA_CHECK(cudaStreamSynchronize(s.stream.s));
  return s.time_graph([&](int c) { router_gemm(s.problem(c, m), s.stream.s); });
}

double RouterGemmTimer::time_empty_us() {
  Impl& s = *impl_;
  return s.time_graph([&](int) {
    empty_kernel<<<1, 32, 0, s.stream.s>>>();
    MK_CUDA_CHECK_LAUNCH();
  });
}

double RouterGemmTimer::time_in_step_us(const tuning::RouterGemmConfig* config, int m) {
  Impl& s = *impl_;
  MK_CHECK(m >= 1 && m <= s.max_m, "RouterGemmTimer: expected 1 <= m <= " << s.max_m << ", got " << m);
  auto launch = [&](int c) {
    if (config != nullptr) {
      router_gemm(s.problem(c, m), *config, s.stream.s);
    } else {
      router_gemm(s.problem(c, m), s.stream.s);
    }
  };
  launch(0);  // validate, create cuBLAS state, load the module: outside the capture
  MK_CUDA_CHECK(cudaStreamSynchronize(s.stream.s));
  return s.time_after_predecessor(m, launch);
}

double RouterGemmTimer::time_in_step_empty_us() {
  Impl& s = *impl_;
  return s.time_after_predecessor(1, [&](int) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(32);
    cfg.stream = s.stream.s;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    MK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, empty_dependent_kernel));
  });
}

std::vector<float> RouterGemmTimer::run_in_step(const tuning::RouterGemmConfig& config, int m) {
  Impl& s = *impl_;
  MK_CHECK(m >= 1 && m <= s.max_m, "RouterGemmTimer: expected 1 <= m <= " << s.max_m << ", got " << m);
  return s.run_once(config, m, true);
}

std::vector<float> RouterGemmTimer::run(const tuning::RouterGemmConfig& config, int m) {
  Impl& s = *impl_;
  MK_CHECK(m >= 1 && m <= s.max_m, "RouterGemmTimer: expected 1 <= m <= " << s.max_m << ", got " << m);
  return s.run_once(config, m, false);
}

}  // namespace moekit::cuda

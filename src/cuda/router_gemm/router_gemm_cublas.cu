// The cuBLAS tier of the router GEMM (large M) and the baseline the benchmark compares with.
//
// out[M,N] row-major is out^T[N,M] column-major, = W[N,K] x^T: cublasGemmEx(op T on W as a
// column-major [K,N] matrix, op N on x as column-major [K,M]), fp32 output and fp32 compute
// (CUBLAS_COMPUTE_32F, default math: no tf32). cuBLAS needs A and B of one type: fp32 weights
// first convert x to fp32 in a staging buffer. The bias, if any, is added by a tiny kernel after.
// One handle per device with a fixed workspace (so graph capture never allocates), created by
// prepare_router_gemm_cublas (warm-up) or on first use outside a capture.
#include <cublas_v2.h>

#include <memory>
#include <mutex>
#include <vector>

#include "cuda/common/cublas_check.h"
#include "cuda/router_gemm/router_gemm_launch.h"

namespace moekit::cuda::router_gemm_detail {

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLAS' recommendation for Hopper

struct CublasState {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  float* x_f32 = nullptr;  // staging for fp32 weights
  size_t x_f32_elems = 0;
};

std::mutex g_mutex;
std::vector<std::unique_ptr<CublasState>> g_states;  // per device; live for the process

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MK_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// The current device's state, created (handle, workspace) and staging grown to min_x_f32 elems.
CublasState& state(size_t min_x_f32, cudaStream_t stream) {
  int device = 0;
  MK_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_states.size() <= static_cast<size_t>(device)) g_states.resize(device + 1);
  if (!g_states[device]) {
    MK_CHECK(stream == nullptr || !capturing(stream),
             "router_gemm cublas: first use inside a CUDA graph capture; call "
             "warm_up_router_gemm before capturing");
    auto s = std::make_unique<CublasState>();
    MK_CUBLAS_CHECK(cublasCreate(&s->handle));
    MK_CUDA_CHECK(cudaMalloc(&s->workspace, kWorkspaceBytes));
    MK_CUBLAS_CHECK(cublasSetWorkspace(s->handle, s->workspace, kWorkspaceBytes));
    g_states[device] = std::move(s);
  }
  CublasState& s = *g_states[device];
  if (s.x_f32_elems < min_x_f32) {
    MK_CHECK(stream == nullptr || !capturing(stream),
             "router_gemm cublas: fp32 staging for " << min_x_f32 << " elements (have "
                 << s.x_f32_elems << ") needed inside a CUDA graph capture; call "
                 "warm_up_router_gemm with a large enough max_m before capturing");
    if (s.x_f32 != nullptr) MK_CUDA_CHECK(cudaFree(s.x_f32));
    s.x_f32 = nullptr;
    s.x_f32_elems = 0;
    MK_CUDA_CHECK(cudaMalloc(&s.x_f32, min_x_f32 * sizeof(float)));
    s.x_f32_elems = min_x_f32;
  }
  return s;
}

__global__ void bf16_to_f32_kernel(const __nv_bfloat16* in, float* out, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

__global__ void add_bias_kernel(float* out, const float* bias, int m, int n) {
  const long long total = static_cast<long long>(m) * n;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    out[i] += bias[i % n];
}

unsigned grid_for(long long count, int block) {
  return static_cast<unsigned>(std::min<long long>((count + block - 1) / block, 4096));
}

}  // namespace

void prepare_router_gemm_cublas(size_t max_m_k_f32) { state(max_m_k_f32, nullptr); }

void launch_router_gemm_cublas(const RouterGemmProblem& p, cudaStream_t stream) {
  const bool f32 = p.weight_dtype == DType::F32;
  const size_t mk = static_cast<size_t>(p.m) * p.k;
  CublasState& s = state(f32 ? mk : 0, stream);
  MK_CUBLAS_CHECK(cublasSetStream(s.handle, stream));
  // (cublasSetStream resets the handle to cuBLAS' default workspace pool, which may allocate:
  // not inside a graph capture)
  MK_CUBLAS_CHECK(cublasSetWorkspace(s.handle, s.workspace, kWorkspaceBytes));
  const void* b = p.x;
  cudaDataType_t type = CUDA_R_16BF;
  if (f32) {
    constexpr int kBlock = 256;
    bf16_to_f32_kernel<<<grid_for(static_cast<long long>(mk), kBlock), kBlock, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(p.x), s.x_f32, mk);
    MK_CUDA_CHECK_LAUNCH();
    b = s.x_f32;
    type = CUDA_R_32F;
  }
  const float alpha = 1.0f;
  const float beta = 0.0f;
  MK_CUBLAS_CHECK(cublasGemmEx(s.handle, CUBLAS_OP_T, CUBLAS_OP_N, p.n, p.m, p.k, &alpha,
                               p.weight, type, p.k, b, type, p.k, &beta, p.out, CUDA_R_32F, p.n,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (p.bias != nullptr) {
    constexpr int kBlock = 256;
    add_bias_kernel<<<grid_for(static_cast<long long>(p.m) * p.n, kBlock), kBlock, 0, stream>>>(
        p.out, p.bias, p.m, p.n);
    MK_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace moekit::cuda::router_gemm_detail

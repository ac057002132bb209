// Launch code of the grouped expert kernels (experts_kernel.cuh): the variant table, the
// persistent grid size, the launch. Six instantiations in all (CI compiles on two cores).
//
// Variants (kNT n-tiles of 8 tokens per task, kUnroll k blocks in flight per warp); both are
// spill-free at 2 CTAs of 256 threads per SM (128 registers):
//   chunk 8:  kNT = 1, kUnroll = 3  -> 192 B of weights in flight per thread, 96 KB per SM
//   chunk 16: kNT = 2, kUnroll = 2  (the second n-tile's activation fragments take registers)
// Default: chunk 8 up to 256 tokens. At decode an expert rarely holds more than 8 tokens (DeepSeek-V3
// at T=128 averages 4), and the shared expert's extra chunks are adjacent work items that run
// side by side, so its weights come from L2 after the first chunk. MOEKIT_EXPERTS_CHUNK=8|16
// overrides (read once, for measurements). MOEKIT_EXPERTS_KERNEL=ring selects the cp.async ring
// variant (experts_ring_kernel.cuh, chunk 8; chunk 16 stays on registers) at layer creation.
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/experts/experts.h"
#include "cuda/experts/experts_kernel.cuh"
#include "cuda/experts/experts_ring_kernel.cuh"
#include "cuda/layer/pdl.cuh"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

using experts_detail::experts_kernel;
using experts_detail::experts_ring_kernel;
using experts_detail::kThreads;

constexpr int kRingStages = 4;  // 4 k blocks (8 KB of weights per warp) in flight, 2 CTAs per SM
constexpr int kRingSmem = experts_detail::ring_smem_bytes<kRingStages>();

using KernelFn = void (*)(ExpertsParams);

int smem_bytes(ExpertsStream stream_kind) {
  return stream_kind == ExpertsStream::Ring ? kRingSmem : 0;
}

KernelFn kernel_for(ExpertsKind kind, int chunk, ExpertsStream stream_kind) {
  const bool gate_up = kind == ExpertsKind::GateUp;
  if (stream_kind == ExpertsStream::Ring) {
    MK_CHECK(chunk == 8, "the cp.async ring expert kernel takes chunk 8, got " << chunk);
    return gate_up ? experts_ring_kernel<true, kRingStages> : experts_ring_kernel<false, kRingStages>;
  }
  if (chunk == 8) return gate_up ? experts_kernel<true, 1, 3> : experts_kernel<false, 1, 3>;
  if (chunk == 16) return gate_up ? experts_kernel<true, 2, 2> : experts_kernel<false, 2, 2>;
  MK_FAIL("no expert kernel for chunk " << chunk << " (expected 8 or 16)");
}

}  // namespace

int experts_chunk(int tokens) {
  static const int forced = [] {
    const char* v = std::getenv("MOEKIT_EXPERTS_CHUNK");
    if (v == nullptr || v[0] == '\0') return 0;
    const std::string s(v);
    MK_CHECK(s == "8" || s == "16", "MOEKIT_EXPERTS_CHUNK='" << s << "' (expected 8 or 16)");
    return std::stoi(s);
  }();
  if (forced != 0) return forced;
  return tokens <= 256 ? 8 : 16;
}

ExpertsStream experts_stream_from_env() {
  const char* v = std::getenv("MOEKIT_EXPERTS_KERNEL");
  if (v == nullptr || v[0] == '\0') return ExpertsStream::Registers;
  const std::string s(v);
  if (s == "regs") return ExpertsStream::Registers;
  if (s == "ring") return ExpertsStream::Ring;
  MK_FAIL("MOEKIT_EXPERTS_KERNEL='" << s << "' (expected regs or ring)");
}

int experts_grid(ExpertsKind kind, int chunk, ExpertsStream stream_kind) {
  int device = 0, sms = 0, per_sm = 0;
  MK_CUDA_CHECK(cudaGetDevice(&device));
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const KernelFn fn = kernel_for(kind, chunk, stream_kind);
  const int smem = smem_bytes(stream_kind);
  if (smem > 48 * 1024) {
    MK_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  MK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kThreads, smem));
  MK_CHECK(per_sm > 0, "expert kernel (chunk " << chunk << ") cannot be resident on this device");
  return sms * per_sm;
}

void launch_experts(ExpertsKind kind, int chunk, ExpertsStream stream_kind,
                    const ExpertsParams& p, int grid, cudaStream_t stream) {
  launch_pdl(kernel_for(kind, chunk, stream_kind), dim3(grid), dim3(kThreads),
             smem_bytes(stream_kind), stream, p);
}

}  // namespace moekit::cuda

// Launch code of the grouped expert kernels (experts_kernel.cuh): the variant table, the
// persistent grid size, the launch. Eleven instantiations in all (CI compiles on two cores).
//
// Variants (kNT n-tiles of 8 tokens per task, kUnroll k blocks in flight per warp, where the
// activation fragments are loaded); all are spill-free at 2 CTAs of 256 threads per SM (128
// registers, ptxas -v, CUDA 13):
//   default (regs): activation fragments loaded right before their mma (kLateActs), so the
//     registers hold weights only:
//     chunk 8:  gate/up kUnroll 5 (320 B of weights in flight per thread, 160 KB per SM),
//               down kUnroll 4 (256 B, 128 KB per SM); down with K <= 1024: 4-warp CTAs,
//               4 per SM (one round of 4 warps covers K)
//     chunk 16: kNT = 2, kUnroll 3 (192 B, 96 KB per SM)
//   regs-early (the previous default, kept to A/B on the GPU): activations loaded with the
//     weights: chunk 8 kNT 1 kUnroll 3 (96 KB per SM), chunk 16 kNT 2 kUnroll 2.
//   ring: experts_ring_kernel.cuh, chunk 8 only (measured slower everywhere; opt-in).
// Default: chunk 8 up to 256 tokens. At decode an expert rarely holds more than 8 tokens
// (DeepSeek-V3 at T=128 averages 4), and the shared expert's extra chunks are adjacent work items that run
// side by side, so its weights come from L2 after the first chunk. MOEKIT_EXPERTS_CHUNK=8|16
// overrides (read once, for measurements). MOEKIT_EXPERTS_KERNEL=regs|regs-early|ring selects
// the variant at layer creation.
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

// A kernel and its block size.
struct Variant {
  KernelFn fn;
  int threads;
};

int smem_bytes(ExpertsStream stream_kind) {
  return stream_kind == ExpertsStream::Ring ? kRingSmem : 0;
}

// Largest reduction length (in 64-wide k blocks) the 4-warp down variant covers in one round.
constexpr int kDown4MaxBlocks = 4 * 4;

// k: the reduction length of the launch (H for gate/up, the expert width for down).
Variant kernel_for(ExpertsKind kind, int chunk, ExpertsStream stream_kind, int k) {
  const bool gate_up = kind == ExpertsKind::GateUp;
  MK_CHECK(chunk == 8 || chunk == 16, "no expert kernel for chunk " << chunk
                                          << " (expected 8 or 16)");
  switch (stream_kind) {
    case ExpertsStream::Ring:
      MK_CHECK(chunk == 8, "the cp.async ring expert kernel takes chunk 8, got " << chunk);
      return {gate_up ? experts_ring_kernel<true, kRingStages>
                      : experts_ring_kernel<false, kRingStages>,
              kThreads};
    case ExpertsStream::RegistersEarlyActs:
      if (chunk == 8) {
        return {gate_up ? experts_kernel<true, 1, 3, false> : experts_kernel<false, 1, 3, false>,
                kThreads};
      }
      return {gate_up ? experts_kernel<true, 2, 2, false> : experts_kernel<false, 2, 2, false>,
              kThreads};
    default:
      // gate/up kUnroll 5: DeepSeek-V3 K=7168 is 112 blocks = 3 rounds of 40 (kUnroll 3: 5
      // rounds); down kUnroll 4: K=2048 is 32 blocks = one round on all 8 warps (3: two rounds,
      // the second on 3 warps); a down K of <= 16 blocks (Qwen3-30B: 12) is one round of 4
      // warps, so 4-warp CTAs, 4 per SM: twice the items in flight, no idle warps
      if (chunk == 8) {
        if (gate_up) return {experts_kernel<true, 1, 5, true>, kThreads};
        if (k / experts_detail::kBlockK <= kDown4MaxBlocks) {
          return {experts_kernel<false, 1, 4, true, 4>, 4 * 32};
        }
        return {experts_kernel<false, 1, 4, true>, kThreads};
      }
      return {gate_up ? experts_kernel<true, 2, 3, true> : experts_kernel<false, 2, 3, true>,
              kThreads};
  }
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

ExpertsStream experts_stream_for(int hidden) {
  const char* v = std::getenv("MOEKIT_EXPERTS_KERNEL");
  if (v == nullptr || v[0] == '\0') {
    // Measured on the H200 (bench/results/h200/2026-11-30-run4-layer): with DeepSeek-V3's experts
    // (H = 7168) loading activations with the weights is 5-8% faster at every batch (fewer waits
    // per k block); with Qwen3-30B-A3B's (H = 2048, I = 768) the rolling loads are 4-10% faster
    // (more items in flight). Shapes between were not measured; 4096 splits the two.
    return hidden >= 4096 ? ExpertsStream::RegistersEarlyActs : ExpertsStream::Registers;
  }
  const std::string s(v);
  if (s == "regs") return ExpertsStream::Registers;
  if (s == "regs-early") return ExpertsStream::RegistersEarlyActs;
  if (s == "ring") return ExpertsStream::Ring;
  MK_FAIL("MOEKIT_EXPERTS_KERNEL='" << s << "' (expected regs, regs-early or ring)");
}

int experts_grid(ExpertsKind kind, int chunk, ExpertsStream stream_kind, int k) {
  int device = 0, sms = 0, per_sm = 0;
  MK_CUDA_CHECK(cudaGetDevice(&device));
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const Variant v = kernel_for(kind, chunk, stream_kind, k);
  const int smem = smem_bytes(stream_kind);
  if (smem > 48 * 1024) {
    MK_CUDA_CHECK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  MK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v.fn, v.threads, smem));
  MK_CHECK(per_sm > 0, "expert kernel (chunk " << chunk << ") cannot be resident on this device");
  return sms * per_sm;
}

void launch_experts(ExpertsKind kind, int chunk, ExpertsStream stream_kind,
                    const ExpertsParams& p, int grid, cudaStream_t stream) {
  const Variant v = kernel_for(kind, chunk, stream_kind, p.k);
  launch_pdl(v.fn, dim3(grid), dim3(v.threads), smem_bytes(stream_kind), stream, p);
}

}  // namespace moekit::cuda

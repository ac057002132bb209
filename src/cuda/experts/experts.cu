// Launch code of the grouped expert kernels: instance -> kernel address, block size and shared
// memory (experts_instances.cuh: the three groups of the plan's table), the residency check and
// the launch. Which instance runs is the plan's choice (src/plan/plan.cpp), never made here.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/common/pdl.cuh"
#include "cuda/experts/experts.h"
#include "cuda/experts/experts_instances.cuh"
#include "moekit/error.h"
#include "plan/expert_kernels.h"

namespace moekit::cuda {
namespace {

using experts_detail::ExpertKernelFn;

struct Instance {
  ExpertKernelFn fn = nullptr;
  int threads = 0;
  int smem = 0;
};

Instance instance(int index) {
  MK_CHECK(
      index >= 0 && index < plan::kNumExpertKernels,
      "expert kernel index " << index << " (expected 0.." << plan::kNumExpertKernels - 1 << ")");
  const plan::ExpertKernel& k = plan::kExpertKernels[index];
  Instance in;
  in.threads = k.warps * 32;
  if (k.stream == plan::Stream::Bulk) {
    in.fn = k.gemm == plan::Gemm::GateUp ? experts_detail::bulk_gate_up_kernel(index)
                                         : experts_detail::bulk_down_kernel(index);
    in.smem = experts_detail::bulk_smem_bytes_of(index);
  } else {
    in.fn = experts_detail::regs_kernel(index);
  }
  MK_CHECK(in.fn != nullptr, "expert kernel " << k.name << " is not instantiated");
  return in;
}

}  // namespace

RowDivisor::RowDivisor(int d) {
  MK_CHECK(d >= 1, "RowDivisor: the divisor is " << d << ", not a positive integer");
  int p = 0;
  while ((1ll << p) < d) ++p;
  shift = 31 + p;
  mul = static_cast<uint32_t>(((1ull << shift) + static_cast<unsigned long long>(d) - 1) /
                              static_cast<unsigned long long>(d));
}

void prepare_expert_kernels() {
  int device = 0;
  MK_CUDA_CHECK(cudaGetDevice(&device));
  for (int i = 0; i < plan::kNumExpertKernels; ++i) {
    const Instance in = instance(i);
    if (in.smem > 48 * 1024) {
      MK_CUDA_CHECK(
          cudaFuncSetAttribute(in.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, in.smem));
    }
    int per_sm = 0;
    MK_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, in.fn, in.threads, in.smem));
    const plan::ExpertKernel& k = plan::kExpertKernels[i];
    MK_CHECK(per_sm == k.ctas_per_sm, "expert kernel "
                                          << k.name << ": " << per_sm << " CTAs per SM on device "
                                          << device << ", the plan's table says " << k.ctas_per_sm);
  }
}

void launch_expert_kernel(int kernel, const ExpertsParams& p, int grid, bool pdl,
                          cudaStream_t stream) {
  const Instance in = instance(kernel);
  const plan::ExpertKernel& k = plan::kExpertKernels[kernel];
  if (k.stream == plan::Stream::Bulk) {
    MK_CHECK(p.ring == experts_detail::bulk_ring(k.ring) &&
                 p.weight_copy_pieces == (k.split_rows ? 2 : 1) &&
                 p.l2_keep == (k.l2_keep ? 1 : 0) && p.self_route == (k.self_route ? 1 : 0),
             "launch_expert_kernel: params (ring "
                 << p.ring << ", copy pieces " << p.weight_copy_pieces << ", l2_keep " << p.l2_keep
                 << ", self_route " << p.self_route << ") disagree with " << plan::describe(k));
    MK_CHECK(!k.down_tail || p.tile_counters != nullptr,
             "launch_expert_kernel: " << k.name << " needs the combine's counters");
    const bool mx = k.mx != ExpertFormat::Bf16;
    MK_CHECK(!mx || (p.w8 != nullptr && p.mx_scale != nullptr && p.w == nullptr && p.x != nullptr &&
                     p.k % kMxGroup == 0 && reinterpret_cast<uintptr_t>(p.w8) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(p.mx_scale) % 16 == 0 &&
                     p.w_expert_stride % 16 == 0 && p.mx_scale_expert_stride % 16 == 0),
             "launch_expert_kernel: " << k.name
                                      << " reads packed MX weights and their e8m0 bytes (w8, "
                                         "mx_scale, 16-byte aligned; k a multiple of 32) and bf16 "
                                         "activations (x), got w8 "
                                      << static_cast<const void*>(p.w8) << ", mx_scale "
                                      << static_cast<const void*>(p.mx_scale) << ", k " << p.k);
    // (the MX ring bulk-copies an item's biases: runs of 8 or 16 floats)
    MK_CHECK(!mx || p.bias == nullptr ||
                 (reinterpret_cast<uintptr_t>(p.bias) % 16 == 0 && p.bias_expert_stride % 4 == 0 &&
                  p.inter % 4 == 0),
             "launch_expert_kernel: " << k.name
                                      << " bulk-copies the biases (16-byte aligned, their expert "
                                         "stride and inter multiples of 4 floats), got bias "
                                      << static_cast<const void*>(p.bias) << ", stride "
                                      << p.bias_expert_stride << ", inter " << p.inter);
    MK_CHECK(mx || (k.fp8 ? p.w8 != nullptr && p.w_scale != nullptr && p.w == nullptr &&
                                p.x8 != nullptr && p.x_scale != nullptr && p.k % 128 == 0 &&
                                p.inter % 128 == 0
                          : p.w8 == nullptr && p.w != nullptr),
             "launch_expert_kernel: " << k.name
                                      << (k.fp8 ? " reads fp8 weights, activations and "
                                                  "scales (w8, w_scale, x8, x_scale; k "
                                                  "and inter multiples of 128)"
                                                : " reads bf16 weights (w)")
                                      << ", got w " << p.w << ", w8 "
                                      << static_cast<const void*>(p.w8) << ", k " << p.k
                                      << ", inter " << p.inter);
    MK_CHECK(
        (k.ring != plan::Ring::Fp8OneToken && k.ring != plan::Ring::Fp8OneTokenDeep) ||
            (p.k % 512 == 0 && reinterpret_cast<uintptr_t>(p.w_scale) % 16 == 0 &&
             reinterpret_cast<uintptr_t>(p.x_scale) % 16 == 0 && p.scale_expert_stride % 4 == 0),
        "launch_expert_kernel: " << k.name
                                 << " bulk-copies runs of scales (k a multiple of 512, the "
                                    "scale grids 16-byte aligned), got k "
                                 << p.k << ", w_scale " << p.w_scale << ", x_scale " << p.x_scale);
  }
  MK_CHECK(grid >= 1, "launch_expert_kernel: expected grid >= 1, got " << grid);
  launch_pdl(pdl, in.fn, dim3(grid), dim3(in.threads), in.smem, stream, p);
}

}  // namespace moekit::cuda

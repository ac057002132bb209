// The fp8 pieces of the bulk kernel's W8A8 instances (plan::ExpertKernel::fp8; the ring of
// weights only, experts_bulk_kernel.cuh): e4m3 weights with one fp32 multiplier per 128 x 128
// tile, activations quantised per token per 128 channels before the kernel (quantize_rows_fp8.h),
// mma.m16n8k32 in e4m3 with fp32 accumulation, and each 128-wide k block's product scaled by its
// activation scale and weight scale before it joins the accumulator (cpu_reference's dot_w8a8).
//
// A k block of the fp8 instances is 128 elements, the 128 bytes where a bf16 block of 64 lies, so
// the ring's rows, copies and shared-memory addresses are the bf16 kernel's: thread t of a row
// quad holds bytes 16t..16t+15 and 64+16t..64+16t+15 of the block (elements, now), and in mma
// step s its logical k {4t..4t+3} / {16+4t..16+4t+3} are its physical elements {8s'..8s'+3} /
// {8s'+4..8s'+7} of the 16-byte piece that step reads, identically for weights and activations.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/experts/experts.h"

namespace moekit::cuda::experts_detail {

constexpr int kFp8BlockK = 128;  // elements (= bytes) of an fp8 k block: one tile-scale column

// The tile-scale row (nkb floats, one per k block) of weight row r of `expert` in p.w_scale:
// one row per 128 weight rows.
__device__ __forceinline__ const float* tile_scale_row_fp8(const ExpertsParams& p, int expert,
                                                           int r, int nkb) {
  return p.w_scale + static_cast<long long>(expert) * p.scale_expert_stride +
         static_cast<size_t>(r / kFp8BlockK) * nkb;
}

__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 128-wide fp8 k block: a = {lo row bytes 16t.., lo row bytes 64+16t.., hi row 16t..,
// hi row 64+16t..}, b = the token's two 16-byte pieces at the same positions; four mma steps.
__device__ __forceinline__ void mma_block_fp8(float (&c)[4], const uint4 (&a)[4],
                                              const uint4 (&b)[2]) {
  mma_e4m3(c, a[0].x, a[2].x, a[0].y, a[2].y, b[0].x, b[0].y);
  mma_e4m3(c, a[0].z, a[2].z, a[0].w, a[2].w, b[0].z, b[0].w);
  mma_e4m3(c, a[1].x, a[3].x, a[1].y, a[3].y, b[1].x, b[1].y);
  mma_e4m3(c, a[1].z, a[3].z, a[1].w, a[3].w, b[1].z, b[1].w);
}

}  // namespace moekit::cuda::experts_detail

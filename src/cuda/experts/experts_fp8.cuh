// The fp8 pieces of the bulk kernel's W8A8 instances (plan::ExpertKernel::fp8; the ring of
// weights only, experts_bulk_kernel.cuh): e4m3 weights with one fp32 multiplier per 128 x 128
// tile, activations quantised by the consumer warps per token per 128 channels, mma.m16n8k32 in
// e4m3 with fp32 accumulation, and each 128-wide k block's product scaled by its activation scale
// and weight scale before it joins the accumulator (cpu_reference's dot_w8a8).
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

#include "common/fp8_quotient.h"

namespace moekit::cuda::experts_detail {

constexpr int kFp8BlockK = 128;  // elements (= bytes) of an fp8 k block: one tile-scale column

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

// cpu_reference::quantize_activation_fp8's scale of a group with maximum magnitude amax:
// max(amax, 1e-4) / 448 (IEEE division), and under ue8m0 the power of two at or above it.
__device__ __forceinline__ float fp8_activation_scale(float amax, bool ue8m0) {
  float s = fmaxf(amax, 1e-4f) / 448.0f;
  if (ue8m0) {
    uint32_t bits = __float_as_uint(s);  // (s is normal and positive)
    if ((bits & 0x007fffffu) != 0) bits = (bits & 0x7f800000u) + 0x00800000u;
    s = __uint_as_float(bits);
  }
  return s;
}

// Two floats to e4m3, round to nearest even, saturating at +-448: lo in the low byte.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// A thread's 32 bf16 activations of a k block (v[0..1]: its elements 16t..16t+15, v[2..3]:
// 64+16t..64+16t+15) quantised with the block's scale, the amax over the row quad's four lanes
// (the token's 128 elements): q[0] / q[1] the e4m3 codes at the same positions. Returns the scale.
// Every lane of the warp calls it (the quad's shuffles). q = e4m3(v / s), the codes of the
// reference's IEEE division (fp8_quotient).
__device__ __forceinline__ float quantize_fragment_fp8(const uint4 (&v)[4], bool ue8m0,
                                                       uint4 (&q)[2]) {
  float f[32];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      f[i * 8 + 2 * j] = __uint_as_float(w[j] << 16);
      f[i * 8 + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(f[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  const float s = fp8_activation_scale(amax, ue8m0);
  const float r = __frcp_rn(s);
  uint32_t b[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t p0 = e4m3x2(fp8_quotient(f[4 * i], s, r), fp8_quotient(f[4 * i + 1], s, r));
    const uint32_t p1 =
        e4m3x2(fp8_quotient(f[4 * i + 2], s, r), fp8_quotient(f[4 * i + 3], s, r));
    b[i] = p0 | (p1 << 16);
  }
  q[0] = make_uint4(b[0], b[1], b[2], b[3]);
  q[1] = make_uint4(b[4], b[5], b[6], b[7]);
  return s;
}

}  // namespace moekit::cuda::experts_detail

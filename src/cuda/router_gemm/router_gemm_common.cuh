// Device helpers shared by the router GEMM kernels: the argument block, programmatic dependent
// launch (PDL) controls, 16-byte loads and bf16 unpacking.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/trace.cuh"

namespace moekit::cuda::router_gemm_detail {

// One router GEMM call, as the kernels see it. Shapes and layouts: router_gemm.h.
struct RouterGemmArgs {
  const __nv_bfloat16* x;  // [m, k] bf16
  const void* w;           // [n, k] bf16 or fp32 (the kernel's template type)
  const float* bias;       // [n] or nullptr
  float* out;              // [m, n] fp32
  int m;
  int n;
  int k;
  int split = 1;  // dot kernel: CTAs (one cluster along x) sharing one output tile's K range
  unsigned long long* trace = nullptr;  // kernel timeline (cuda/common/trace.cuh) or null
};

// PDL: wait until the previous kernel in the stream has finished and its writes are visible.
// Everything before this call may only read data no earlier kernel writes (the weights).
// Without a programmatic launch it returns at once.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// PDL: let the next kernel start its prologue; it still waits for our completion in its own
// griddep_wait, so calling this early is safe.
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Wait for the previous kernel, then let the next one launch. why not trigger before waiting:
// the next kernel may read, before its own wait, data written two kernels back (the layer's PDL
// contract, src/cuda/common/pdl.cuh), which holds only if we trigger after our wait. Triggering
// here, before our main work, still lets the next kernel's prologue (e.g. the next router GEMM's
// weight prefetch) run under ours.
__device__ __forceinline__ void griddep_wait_then_trigger() {
  griddep_wait();
  griddep_launch_dependents();
}

// griddep_wait_then_trigger, with the moment the wait returned in the kernel timeline (CTA thread
// 0; trace.cuh).
__device__ __forceinline__ void griddep_wait_then_trigger(unsigned long long* trace) {
  griddep_wait_then_trigger();
  if (threadIdx.x == 0) trace_mark(trace, kTraceRouterWaited);
}

// 16-byte load of data read once (weights): read-only path, not kept in L1; L2::256B asks L2
// to fetch the whole 256-byte block from HBM at once (a warp's 32 loads cover 512 contiguous
// bytes, so nothing fetched goes unused, and the DRAM bursts are longer).
__device__ __forceinline__ uint4 load_stream_16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// 16-byte load of data many CTAs read (activations): cached in L1 and L2. why not __ldg / .nc:
// x is written by the kernel before ours, and the compiler treats .nc loads as invariant and
// hoisted them above griddepcontrol.wait (seen in the SASS: LDG.CONSTANT of x before ACQBULK),
// which under PDL could read x before the previous kernel wrote it. A volatile asm plain load
// stays after the wait (volatile asm statements keep their order).
__device__ __forceinline__ uint4 load_16(const void* p) {
  uint4 r;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// bf16 pair in one 32-bit word -> floats (element 0 is the low half), exact.
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Element i (0..7) of eight bf16 in a uint4.
__device__ __forceinline__ float bf16_at(const uint4& v, int i) {
  const uint32_t w = word(v, i / 2);
  return (i & 1) ? bf16_hi(w) : bf16_lo(w);
}

}  // namespace moekit::cuda::router_gemm_detail

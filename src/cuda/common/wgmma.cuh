// Hopper's warpgroup mma (sm_90a) as the packed MX GEMM uses it: A (64 rows x 16 of K, bf16) from
// registers, B (K x N, bf16) from shared memory in the K-major 128-byte-swizzle layout, fp32
// accumulators. Every helper compiles to nothing (and the caller traps) where the target is not
// sm_90a, so the translation unit still builds for the other architectures.
#pragma once

#include <cstdint>

namespace moekit::cuda::wgmma {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
inline constexpr bool kAvailable = true;
#else
inline constexpr bool kAvailable = false;
#endif

// The shared-memory descriptor of a B operand whose N rows of 128 bytes (64 bf16 of K) are the
// 128-byte swizzle atom's rows, 8 rows 1024 bytes apart, starting at `addr` (a shared address; the
// atom 1024-byte aligned, addr itself moved by 32 bytes for each 16 elements of K inside it).
__device__ __forceinline__ uint64_t b_desc_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// Orders this thread's register writes (A fragments, accumulators) before the next mma_async.
__device__ __forceinline__ void fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
// Waits until at most kPending committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
#endif
}
// Makes this thread's generic-proxy shared-memory writes (cp.async's) visible to the async proxy
// that wgmma reads B through.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// Keeps the compiler from moving accesses of an accumulator across a wait.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

#define MOEKIT_WGMMA_D8(i)                                                                    \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])

// d (64 x N, fp32) = (accumulate ? d : 0) + A (64 x 16, the warpgroup's registers a) . B (16 x N at
// desc), N = 64 or 128: a warp's a is the m16n8k16 mma's A fragment of its 16 rows, d the mma's C
// fragments of its rows, N / 8 of them.
template <int N>
__device__ __forceinline__ void mma_rs_bf16(float (&d)[N / 2], const uint32_t (&a)[4],
                                            uint64_t desc, bool accumulate) {
  static_assert(N == 64 || N == 128, "mma_rs_bf16: N is 64 or 128");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : MOEKIT_WGMMA_D8(0), MOEKIT_WGMMA_D8(8), MOEKIT_WGMMA_D8(16), MOEKIT_WGMMA_D8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(static_cast<int>(accumulate)));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : MOEKIT_WGMMA_D8(0), MOEKIT_WGMMA_D8(8), MOEKIT_WGMMA_D8(16), MOEKIT_WGMMA_D8(24),
          MOEKIT_WGMMA_D8(32), MOEKIT_WGMMA_D8(40), MOEKIT_WGMMA_D8(48), MOEKIT_WGMMA_D8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(static_cast<int>(accumulate)));
  }
#else
  (void)d;
  (void)a;
  (void)desc;
  (void)accumulate;
#endif
}

#undef MOEKIT_WGMMA_D8

}  // namespace moekit::cuda::wgmma

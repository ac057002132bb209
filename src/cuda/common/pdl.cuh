// Programmatic dependent launch (PDL) for the layer's kernels: each is launched with
// programmatic stream serialization, so its CTAs may become resident while the previous kernel
// drains (its tail) and wait in pdl_wait() for that kernel's completion and memory. A kernel
// may do before pdl_wait() only what needs no output of the kernel just before it: read weights,
// and read what a kernel two or more launches back wrote (that one has completed: every CTA of
// the kernel in between passed its own pdl_wait before it could exit). Without the attribute
// (the plan's pdl off: MOEKIT_PDL=0) pdl_wait is a no-op: the fallback if a driver mishandles it.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.h"

namespace moekit::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel's CTAs launch now (they still wait for our completion in pdl_wait).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute when `pdl`.
template <typename... Params, typename... Args>
void launch_pdl(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  MK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace moekit::cuda

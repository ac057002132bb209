// The fp8 bulk instances' activations, quantised once per forward (plan::LayerPlan::fp8 on the
// bulk kernels): the layer's x before the router GEMM, and h between gate/up and down, each row
// per 128 channels into e4m3 codes and fp32 scales by cpu_reference::quantize_activation_fp8's
// rule (cuda/common/fp8_quantize.cuh). The expert kernels' consumers then load codes and scales.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moekit::cuda {

// src [rows, k] bf16 (k a multiple of 128) -> q [rows, k] e4m3, scales [rows, k/128]. With `pdl`
// the kernel lets the next one launch at once and waits for the previous one (src's writer)
// before it reads src.
void quantize_rows_fp8(const __nv_bfloat16* src, int rows, int k, bool ue8m0, uint8_t* q,
                       float* scales, bool pdl, cudaStream_t stream);

}  // namespace moekit::cuda

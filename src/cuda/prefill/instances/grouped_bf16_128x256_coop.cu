// Row grouped_bf16_128x256_coop of the grouped GEMM instances (src/plan/grouped_gemm_kernels.h).
#include "cuda/prefill/prefill_gemm_instance.cuh"

MOEKIT_PREFILL_GEMM_INSTANCE("grouped_bf16_128x256_coop")

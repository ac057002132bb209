// Row grouped_fp8_128x128_coop of the grouped GEMM instances (src/plan/grouped_gemm_kernels.h).
#include "cuda/prefill/prefill_gemm_instance.cuh"

MOEKIT_PREFILL_GEMM_INSTANCE("grouped_fp8_128x128_coop")

// The 64-row instance of the prefill grouped GEMM (prefill_gemm_instance.cuh).
#include "cuda/prefill/prefill_gemm_instance.cuh"

namespace moekit::cuda {

using M64 = prefill_gemm_detail::GroupedGemm<prefill_gemm_detail::PingpongM64>;
static_assert(cute::size<0>(M64::TileShape{}) == 64 &&
              cute::size<1>(M64::TileShape{}) == kPrefillTileN);

size_t prefill_gemm_m64_workspace_bytes(int groups) { return M64::workspace_bytes(groups); }

void run_prefill_gemm_m64(const PrefillGroupArrays& arrays, int groups, void* workspace,
                          cudaStream_t stream) {
  M64::run(arrays, groups, workspace, stream);
}

}  // namespace moekit::cuda

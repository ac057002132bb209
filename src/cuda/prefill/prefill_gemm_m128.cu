// The 128-row instance of the prefill grouped GEMM (prefill_gemm_instance.cuh).
#include "cuda/prefill/prefill_gemm_instance.cuh"

namespace moekit::cuda {

using M128 = prefill_gemm_detail::GroupedGemm<prefill_gemm_detail::CooperativeM128>;
static_assert(cute::size<0>(M128::TileShape{}) == 128 &&
              cute::size<1>(M128::TileShape{}) == kPrefillTileN);

size_t prefill_gemm_m128_workspace_bytes(int groups) { return M128::workspace_bytes(groups); }

void run_prefill_gemm_m128(const PrefillGroupArrays& arrays, int groups, void* workspace,
                           cudaStream_t stream) {
  M128::run(arrays, groups, workspace, stream);
}

}  // namespace moekit::cuda

// The register-kernel rows of the expert-kernel table (experts_instances.cuh).
#include "cuda/experts/experts_instances.cuh"
#include "cuda/experts/experts_kernel.cuh"

namespace moekit::cuda::experts_detail {

template <int I>
struct Instance<InstanceGroup::Registers, I> {
  static constexpr ExpertKernelFn fn() {
    constexpr plan::ExpertKernel k = plan::kExpertKernels[I];
    if constexpr (in_group(k, InstanceGroup::Registers)) {
      constexpr bool kLateActs = k.stream == plan::Stream::Registers;
      return experts_kernel<k.gemm == plan::Gemm::GateUp, k.n_tiles, k.unroll, kLateActs, k.warps>;
    } else {
      return nullptr;
    }
  }
};

ExpertKernelFn regs_kernel(int index) {
  static constexpr auto kFns = group_table<InstanceGroup::Registers>();
  return index >= 0 && index < plan::kNumExpertKernels ? kFns[index] : nullptr;
}

}  // namespace moekit::cuda::experts_detail

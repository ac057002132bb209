// The bulk down (+ combine) rows of the expert-kernel table (experts_instances.cuh).
#include "cuda/experts/experts_bulk_kernel.cuh"
#include "cuda/experts/experts_instances.cuh"

namespace moekit::cuda::experts_detail {

template <int I>
struct Instance<InstanceGroup::BulkDown, I> {
  static constexpr ExpertKernelFn fn() {
    constexpr plan::ExpertKernel k = plan::kExpertKernels[I];
    if constexpr (in_group(k, InstanceGroup::BulkDown)) {
      return experts_bulk_kernel<false, k.n_tiles, k.split_rows, k.ring, k.l2_keep, k.down_tail,
                                 k.half_items, k.self_route, k.fp8, k.mx, k.consumer_groups>;
    } else {
      return nullptr;
    }
  }
};

ExpertKernelFn bulk_down_kernel(int index) {
  static constexpr auto kFns = group_table<InstanceGroup::BulkDown>();
  return index >= 0 && index < plan::kNumExpertKernels ? kFns[index] : nullptr;
}

}  // namespace moekit::cuda::experts_detail

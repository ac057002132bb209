// The bulk gate/up rows of the expert-kernel table (experts_instances.cuh), and the shared-memory
// size of every bulk row.
#include "cuda/experts/experts_bulk_kernel.cuh"
#include "cuda/experts/experts_instances.cuh"

namespace moekit::cuda::experts_detail {

template <int I>
struct Instance<InstanceGroup::BulkGateUp, I> {
  static constexpr ExpertKernelFn fn() {
    constexpr plan::ExpertKernel k = plan::kExpertKernels[I];
    if constexpr (in_group(k, InstanceGroup::BulkGateUp)) {
      return experts_bulk_kernel<true, k.n_tiles, k.split_rows, k.ring, k.l2_keep, k.down_tail,
                                 k.half_items, k.self_route, k.fp8, k.mx, k.consumer_groups>;
    } else {
      return nullptr;
    }
  }
};

ExpertKernelFn bulk_gate_up_kernel(int index) {
  static constexpr auto kFns = group_table<InstanceGroup::BulkGateUp>();
  return index >= 0 && index < plan::kNumExpertKernels ? kFns[index] : nullptr;
}

namespace {
template <size_t... I>
constexpr std::array<int, sizeof...(I)> smem_table(std::index_sequence<I...>) {
  return {(plan::kExpertKernels[I].stream == plan::Stream::Bulk
               ? bulk_smem_bytes<plan::kExpertKernels[I].n_tiles,
                                 plan::kExpertKernels[I].ring>()
               : 0)...};
}
}  // namespace

int bulk_smem_bytes_of(int index) {
  static constexpr auto kSmem = smem_table(std::make_index_sequence<plan::kNumExpertKernels>{});
  return index >= 0 && index < plan::kNumExpertKernels ? kSmem[index] : 0;
}

}  // namespace moekit::cuda::experts_detail

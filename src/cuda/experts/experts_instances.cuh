// The expert-kernel instances of one group of rows of the plan's table (src/plan/
// expert_kernels.h), as an array of kernel addresses indexed like the table (null for rows of
// other groups). Each group's .cu file (experts_bulk_gate_up.cu, experts_bulk_down.cu,
// experts_regs.cu) instantiates its rows, so the groups compile in parallel.
#pragma once

#include <array>
#include <utility>

#include "cuda/experts/experts.h"
#include "plan/expert_kernels.h"

namespace moekit::cuda::experts_detail {

using ExpertKernelFn = void (*)(ExpertsParams);

// The ring's number in ExpertsParams::ring, which launch_expert_kernel checks against the
// instance (the kernel templates take the plan::Ring itself).
constexpr int bulk_ring(plan::Ring r) {
  switch (r) {
    case plan::Ring::Standard:
      return 0;
    case plan::Ring::Deep:
      return 1;
    case plan::Ring::OneTokenNarrow:
      return 2;
    case plan::Ring::OneToken:
      return 3;
    case plan::Ring::WeightsOnly:
      return 4;
    case plan::Ring::WeightsOnlyDeep:
      return 5;
    case plan::Ring::Fp8OneToken:
      return 6;
    case plan::Ring::Fp8OneTokenDeep:
      return 7;
    case plan::Ring::MxWeightsOnly:
      return 8;
  }
  return -1;
}

enum class InstanceGroup { BulkGateUp, BulkDown, Registers };

constexpr bool in_group(const plan::ExpertKernel& k, InstanceGroup g) {
  switch (g) {
    case InstanceGroup::BulkGateUp:
      return k.stream == plan::Stream::Bulk && k.gemm == plan::Gemm::GateUp;
    case InstanceGroup::BulkDown:
      return k.stream == plan::Stream::Bulk && k.gemm == plan::Gemm::Down;
    case InstanceGroup::Registers:
      return k.stream != plan::Stream::Bulk;
  }
  return false;
}

// Row I's kernel when the row belongs to group G, else null: Instance<G, I>::fn(), specialised
// per group in the group's .cu file (where the kernel templates are included).
template <InstanceGroup G, int I>
struct Instance;

template <InstanceGroup G, size_t... I>
constexpr std::array<ExpertKernelFn, sizeof...(I)> group_fns(std::index_sequence<I...>) {
  return {Instance<G, static_cast<int>(I)>::fn()...};
}

template <InstanceGroup G>
constexpr std::array<ExpertKernelFn, plan::kNumExpertKernels> group_table() {
  return group_fns<G>(std::make_index_sequence<plan::kNumExpertKernels>{});
}

// The three groups' tables (one .cu file each).
ExpertKernelFn bulk_gate_up_kernel(int index);
ExpertKernelFn bulk_down_kernel(int index);
ExpertKernelFn regs_kernel(int index);
// Dynamic shared memory of a bulk row (its ring's layout; 0 for register rows).
int bulk_smem_bytes_of(int index);

}  // namespace moekit::cuda::experts_detail

// One instance of the prefill path's grouped GEMM (prefill_gemm.h, prefill_gemm_fp8.h): a CUTLASS
// 3.x ptr-array grouped GEMM for sm_90a built from one row of the instance table
// (src/plan/grouped_gemm_kernels.h): TMA loads into a multi-stage shared-memory pipeline (with a
// cluster, each A tile multicast along N and each B tile along M), a producer warp and consumer
// warpgroups issuing wgmma with fp32 accumulators, a persistent tile scheduler over (group,
// m-tile, n-tile) that reads the per-group sizes on the device; bf16 D, no source C.
//
// bf16 rows: bf16 A and B. fp8 rows: the mainloop of CUTLASS's example 68
// (sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp): e4m3 A and B, cp.async
// loads of their scales, fp8 wgmma into fp32 accumulators multiplied by SA x SB and added into
// the main accumulators once per 128-wide K block ("promotion"); scale granularity 1 row x 128 K
// for A, 128 n x 128 K for B, both K-major, i.e. SA [M_g, K/128] and SB [N_g/128, K/128]
// row-major: the checkpoint's weight scale grid of one expert is used as is.
//
// Each instances/<name>.cu instantiates its row with MOEKIT_PREFILL_GEMM_INSTANCE (each its
// own translation unit, so they compile in parallel); prefill_gemm.cu dispatches by row.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/common/cuda_check.h"
#include "cuda/prefill/prefill_gemm.h"
#include "cuda/prefill/prefill_gemm_fp8.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "moekit/error.h"
#include "plan/grouped_gemm_kernels.h"

namespace moekit::cuda::prefill_gemm_detail {

using namespace cute;

// The CUTLASS types of table row kRow.
template <int kRow>
struct Instance {
  static constexpr plan::GroupedGemmKernel kRowFields = plan::kGroupedGemmKernels[kRow];
  static constexpr bool kFp8 = kRowFields.fp8;
  static constexpr bool kPingpong = kRowFields.schedule == plan::GroupedSchedule::Pingpong;

  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using ElementA = std::conditional_t<kFp8, cutlass::float_e4m3_t, cutlass::bfloat16_t>;
  using ElementB = ElementA;
  using ElementD = cutlass::bfloat16_t;
  using ElementAccumulator = float;  // also the fp8 scales' type (the collective requires it)
  using LayoutA = cutlass::layout::RowMajor;     // [M, K], K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // K x N with K contiguous: the [N, K] weight rows
  using LayoutD = cutlass::layout::RowMajor;     // [M, N]
  static constexpr int kAlignAB = 128 / cutlass::sizeof_bits<ElementA>::value;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using TileShape =
      Shape<Int<kRowFields.tile_m>, Int<kRowFields.tile_n>, Int<kRowFields.tile_k>>;
  using ClusterShape = Shape<Int<kRowFields.cluster_m>, Int<kRowFields.cluster_n>, _1>;

  using KernelSchedule = std::conditional_t<
      kFp8,
      std::conditional_t<kPingpong,
                         cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
                         cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>,
      std::conditional_t<kPingpong, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                         cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>>;
  using EpilogueSchedule =
      std::conditional_t<kPingpong, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                         cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;

  using ScaleConfig =
      cutlass::detail::Sm90BlockwiseScaleConfig<1, kPrefillFp8Block, kPrefillFp8Block,
                                                cute::GMMA::Major::K, cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  // fp8: the operand layouts carry the scales' layouts
  using MainloopLayoutA = std::conditional_t<kFp8, cute::tuple<LayoutA*, LayoutSFA*>, LayoutA*>;
  using MainloopLayoutB = std::conditional_t<kFp8, cute::tuple<LayoutB*, LayoutSFB*>, LayoutB*>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator, void,
      LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator, void,
                                                   ElementAccumulator>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, MainloopLayoutA, kAlignAB,
      ElementB, MainloopLayoutB, kAlignAB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Underlying = typename ProblemShape::UnderlyingProblemShape;
  using Arrays = std::conditional_t<kFp8, PrefillFp8GroupArrays, PrefillGroupArrays>;

  // The device arrays of prefill_gemm.h / prefill_gemm_fp8.h are written by our plan kernel as
  // plain ints, int64s and pointers.
  static_assert(sizeof(Underlying) == sizeof(PrefillProblem), "problem shape is not 3 ints");
  static_assert(sizeof(StrideA) == sizeof(int64_t) && sizeof(StrideB) == sizeof(int64_t) &&
                    sizeof(StrideD) == sizeof(int64_t),
                "a ptr-array stride is not one int64 (its unit modes are static)");
  static_assert(sizeof(ElementD) == sizeof(__nv_bfloat16), "D is not 2-byte bf16");

  static typename Gemm::Arguments arguments(const Arrays& g, int groups) {
    cutlass::KernelHardwareInfo hw;
    MK_CUDA_CHECK(cudaGetDevice(&hw.device_id));
    hw.sm_count = prefill_sm_count();
    typename Gemm::Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    // no host copy of the problem sizes: the kernel reads them on the device
    args.problem_shape = {groups, reinterpret_cast<Underlying*>(g.problems), nullptr};
    if constexpr (kFp8) {
      // why no scale layouts: the mainloop derives each group's scale layout from its {M, N, K}
      // and the majorness of these static strides (load_init: tile_atom_to_shape_SFA/SFB);
      // K-major is our layout, and the per-group layout arrays are then not read.
      static_assert(!CollectiveMainloop::MMajorSFA && !CollectiveMainloop::NMajorSFB,
                    "the scales must be K-major: SA [M, K/128], SB [N/128, K/128] row-major");
      static_assert(CollectiveMainloop::ScaleGranularityM == 1 &&
                    CollectiveMainloop::ScaleGranularityN == kPrefillFp8Block &&
                    CollectiveMainloop::ScaleGranularityK == kPrefillFp8Block);
      args.mainloop = {reinterpret_cast<const ElementA**>(g.a),
                       reinterpret_cast<StrideA*>(g.stride_a),
                       reinterpret_cast<const ElementB**>(g.b),
                       reinterpret_cast<StrideB*>(g.stride_b),
                       g.scale_a,
                       nullptr,
                       g.scale_b,
                       nullptr};
    } else {
      args.mainloop = {
          reinterpret_cast<const ElementA**>(g.a), reinterpret_cast<StrideA*>(g.stride_a),
          reinterpret_cast<const ElementB**>(g.b), reinterpret_cast<StrideB*>(g.stride_b)};
    }
    auto& fusion = args.epilogue.thread;
    fusion.alpha = 1.0f;
    fusion.beta = 0.0f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
    args.epilogue.ptr_D = reinterpret_cast<ElementD**>(g.d);
    args.epilogue.dD = reinterpret_cast<StrideD*>(g.stride_d);
    args.hw_info = hw;
    return args;
  }

  static size_t workspace_bytes(int groups) {
    return Gemm::get_workspace_size(arguments(Arrays{}, groups));
  }

  static void run(const Arrays& g, int groups, void* workspace, cudaStream_t stream) {
    const typename Gemm::Arguments args = arguments(g, groups);
    const char* name = kRowFields.name;
    Gemm gemm;
    cutlass::Status st = gemm.can_implement(args);
    MK_CHECK(st == cutlass::Status::kSuccess, name << ": CUTLASS cannot implement it: "
                                                   << cutlass::cutlassGetStatusString(st));
    // (initialize fills the kernel's parameters on the host and sets its shared-memory limit; it
    // issues no stream work for this kernel, so a graph capture records the launch alone)
    st = gemm.initialize(args, workspace, stream);
    MK_CHECK(st == cutlass::Status::kSuccess,
             name << ": initialize failed: " << cutlass::cutlassGetStatusString(st));
    st = gemm.run(stream);
    MK_CHECK(st == cutlass::Status::kSuccess, name << ": launch failed: "
                                                   << cutlass::cutlassGetStatusString(st) << " ("
                                                   << cudaGetErrorString(cudaGetLastError())
                                                   << ")");
  }
};

}  // namespace moekit::cuda::prefill_gemm_detail

namespace moekit::cuda {

template <int kRow>
size_t grouped_gemm_workspace_bytes_row(int groups) {
  return prefill_gemm_detail::Instance<kRow>::workspace_bytes(groups);
}

template <int kRow>
void run_grouped_gemm_row(const void* arrays, int groups, void* workspace, cudaStream_t stream) {
  using Row = prefill_gemm_detail::Instance<kRow>;
  Row::run(*static_cast<const typename Row::Arrays*>(arrays), groups, workspace, stream);
}

}  // namespace moekit::cuda

// Instantiates the entries of prefill_gemm.h for the row named `row_name` (a string literal);
// one use per translation unit.
#define MOEKIT_PREFILL_GEMM_INSTANCE(row_name)                                                \
  static_assert(moekit::plan::grouped_gemm_row(row_name) >= 0,                                \
                "no row " row_name " in src/plan/grouped_gemm_kernels.h");                    \
  template size_t                                                                             \
  moekit::cuda::grouped_gemm_workspace_bytes_row<moekit::plan::grouped_gemm_row(row_name)>(   \
      int);                                                                                   \
  template void moekit::cuda::run_grouped_gemm_row<moekit::plan::grouped_gemm_row(row_name)>( \
      const void*, int, void*, cudaStream_t);

// The fp8 grouped GEMM of the prefill path (prefill_gemm_fp8.h): CUTLASS 4.2's Hopper ptr-array
// grouped GEMM with blockwise scaling (the mainloop of example 68,
// sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp): TMA loads of the e4m3
// A and B tiles, cp.async loads of their scales, fp8 wgmma into fp32 accumulators that are
// multiplied by SA x SB and added into the main accumulators once per 128-wide K block
// ("promotion"), a persistent scheduler over (group, m-tile, n-tile) reading the per-group sizes
// on the device; bf16 D, no source C.
//
// Tile 128 x 128 x 128 (one scale block of K per k-tile), cluster 1 x 1 x 1, cooperative (two
// consumer warpgroups of 64 rows each). Scales: Sm90BlockwiseScaleConfig<1, 128, 128, K, K>:
// granularity 1 row x 128 K for A, 128 n x 128 K for B, both K-major, i.e. SA [M_g, K/128] and
// SB [N_g/128, K/128] row-major: the checkpoint's weight scale grid of one expert is used as is.
#include <cuda_runtime.h>

#include "cuda/common/cuda_check.h"
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

namespace moekit::cuda {
namespace {

using namespace cute;

struct Fp8GroupedGemm {
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using ElementAccumulator = float;           // also the scales' type (the collective requires it)
  using LayoutA = cutlass::layout::RowMajor;  // [M, K], K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // K x N with K contiguous: the [N, K] weight rows
  using LayoutD = cutlass::layout::RowMajor;     // [M, N]
  static constexpr int kAlignAB = 128 / cutlass::sizeof_bits<ElementA>::value;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using TileShape = Shape<Int<kPrefillFp8TileM>, Int<kPrefillFp8TileN>, Int<kPrefillFp8Block>>;
  using ClusterShape = Shape<_1, _1, _1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;

  using ScaleConfig =
      cutlass::detail::Sm90BlockwiseScaleConfig<1, kPrefillFp8Block, kPrefillFp8Block,
                                                cute::GMMA::Major::K, cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator, void,
      LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator, void,
                                                   ElementAccumulator>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA,
      cute::tuple<LayoutA*, LayoutSFA*>, kAlignAB, ElementB, cute::tuple<LayoutB*, LayoutSFB*>,
      kAlignAB, ElementAccumulator, TileShape, ClusterShape,
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

  // The device arrays of prefill_gemm_fp8.h are written by our plan kernel as plain ints, int64s
  // and pointers.
  static_assert(sizeof(Underlying) == sizeof(PrefillProblem), "problem shape is not 3 ints");
  static_assert(sizeof(StrideA) == sizeof(int64_t) && sizeof(StrideB) == sizeof(int64_t) &&
                    sizeof(StrideD) == sizeof(int64_t),
                "a ptr-array stride is not one int64 (its unit modes are static)");
  static_assert(sizeof(ElementA) == 1 && sizeof(ElementD) == sizeof(__nv_bfloat16));
  // why: the mainloop derives each group's scale layout from its {M, N, K} and the majorness of
  // these static strides (load_init: ScaleConfig::tile_atom_to_shape_SFA/SFB); K-major is our
  // layout, and the per-group layout arrays of its Arguments are then not read.
  static_assert(!CollectiveMainloop::MMajorSFA && !CollectiveMainloop::NMajorSFB,
                "the scales must be K-major: SA [M, K/128], SB [N/128, K/128] row-major");
  static_assert(CollectiveMainloop::ScaleGranularityM == 1 &&
                CollectiveMainloop::ScaleGranularityN == kPrefillFp8Block &&
                CollectiveMainloop::ScaleGranularityK == kPrefillFp8Block);

  static typename Gemm::Arguments arguments(const PrefillFp8GroupArrays& g, int groups) {
    cutlass::KernelHardwareInfo hw;
    MK_CUDA_CHECK(cudaGetDevice(&hw.device_id));
    hw.sm_count = prefill_sm_count();
    typename Gemm::Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    // no host copy of the problem sizes: the kernel reads them on the device
    args.problem_shape = {groups, reinterpret_cast<Underlying*>(g.problems), nullptr};
    args.mainloop = {reinterpret_cast<const ElementA**>(g.a),
                     reinterpret_cast<StrideA*>(g.stride_a),
                     reinterpret_cast<const ElementB**>(g.b),
                     reinterpret_cast<StrideB*>(g.stride_b),
                     g.scale_a,
                     nullptr,  // layout_SFA: derived per group on the device (see above)
                     g.scale_b,
                     nullptr};  // layout_SFB: likewise
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
};

}  // namespace

size_t prefill_gemm_fp8_workspace_bytes(int groups) {
  return Fp8GroupedGemm::Gemm::get_workspace_size(
      Fp8GroupedGemm::arguments(PrefillFp8GroupArrays{}, groups));
}

void run_prefill_gemm_fp8(const PrefillFp8GroupArrays& arrays, int groups, void* workspace,
                          cudaStream_t stream) {
  const char* why = nullptr;
  MK_CHECK(prefill_gemm_supported(&why), "prefill fp8 grouped GEMM cannot run: " << why);
  MK_CHECK(groups >= 1, "prefill fp8 grouped GEMM: expected >= 1 groups, got " << groups);
  using Gemm = Fp8GroupedGemm::Gemm;
  const typename Gemm::Arguments args = Fp8GroupedGemm::arguments(arrays, groups);
  Gemm gemm;
  cutlass::Status st = gemm.can_implement(args);
  MK_CHECK(st == cutlass::Status::kSuccess,
           "prefill fp8 grouped GEMM: CUTLASS cannot implement it: "
               << cutlass::cutlassGetStatusString(st));
  // (initialize fills the kernel's parameters on the host and sets its shared-memory limit; no
  // stream work, so a graph capture records the launch alone)
  st = gemm.initialize(args, workspace, stream);
  MK_CHECK(st == cutlass::Status::kSuccess,
           "prefill fp8 grouped GEMM: initialize failed: " << cutlass::cutlassGetStatusString(st));
  st = gemm.run(stream);
  MK_CHECK(st == cutlass::Status::kSuccess, "prefill fp8 grouped GEMM: launch failed: "
                                                << cutlass::cutlassGetStatusString(st) << " ("
                                                << cudaGetErrorString(cudaGetLastError()) << ")");
}

}  // namespace moekit::cuda

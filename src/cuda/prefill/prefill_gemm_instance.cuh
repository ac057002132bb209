// One instance of the prefill path's grouped GEMM (prefill_gemm.h), a CUTLASS 3.x ptr-array
// grouped GEMM for sm_90a: TMA loads into a multi-stage shared-memory pipeline, a producer warp
// and consumer warpgroups issuing wgmma with fp32 accumulators, a persistent tile scheduler over
// (group, m-tile, n-tile) that reads the per-group sizes on the device; bf16 A and B, bf16 D, no
// source C. `Config` names the tile and the kernel schedule; each prefill_gemm_m*.cu instantiates
// one (each its own translation unit, so they compile in parallel).
#pragma once

#include <cuda_runtime.h>

#include <mutex>

#include "cuda/common/cuda_check.h"
#include "cuda/prefill/prefill_gemm.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "moekit/error.h"

namespace moekit::cuda::prefill_gemm_detail {

using namespace cute;

// 128 x 256 x 64, two consumer warpgroups sharing each tile (64 rows each).
struct CooperativeM128 {
  using TileShape = Shape<_128, _256, _64>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};

// 64 x 256 x 64, two consumer warpgroups on alternate tiles (one's epilogue under the other's
// mainloop): half the padding of a short group's last m-tile.
struct PingpongM64 {
  using TileShape = Shape<_64, _256, _64>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

template <class Config>
struct GroupedGemm {
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using ElementA = cutlass::bfloat16_t;
  using ElementB = cutlass::bfloat16_t;
  using ElementD = cutlass::bfloat16_t;
  using ElementAccumulator = float;
  using LayoutA = cutlass::layout::RowMajor;     // [M, K], K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // K x N with K contiguous: the [N, K] weight rows
  using LayoutD = cutlass::layout::RowMajor;     // [M, N]
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<ElementA>::value;  // A, B and D
  using TileShape = typename Config::TileShape;
  using ClusterShape = Shape<_1, _1, _1>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator, void,
      LayoutD*, kAlign, ElementD, LayoutD*, kAlign, typename Config::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator, void,
                                                   ElementAccumulator>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, kAlign, ElementB,
      LayoutB*, kAlign, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Config::KernelSchedule>::CollectiveOp;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Underlying = typename ProblemShape::UnderlyingProblemShape;

  // The device arrays of prefill_gemm.h are written by our own kernels as plain ints and int64s.
  static_assert(sizeof(Underlying) == sizeof(PrefillProblem), "problem shape is not 3 ints");
  static_assert(sizeof(StrideA) == sizeof(int64_t) && sizeof(StrideB) == sizeof(int64_t) &&
                    sizeof(StrideD) == sizeof(int64_t),
                "a ptr-array stride is not one int64 (its unit modes are static)");
  static_assert(sizeof(ElementD) == sizeof(__nv_bfloat16), "D is not 2-byte bf16");

  static typename Gemm::Arguments arguments(const PrefillGroupArrays& g, int groups) {
    cutlass::KernelHardwareInfo hw;
    MK_CUDA_CHECK(cudaGetDevice(&hw.device_id));
    hw.sm_count = prefill_sm_count();
    typename Gemm::Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    // no host copy of the problem sizes: the kernel reads them on the device
    args.problem_shape = {groups, reinterpret_cast<Underlying*>(g.problems), nullptr};
    args.mainloop = {
        reinterpret_cast<const ElementA**>(g.a), reinterpret_cast<StrideA*>(g.stride_a),
        reinterpret_cast<const ElementB**>(g.b), reinterpret_cast<StrideB*>(g.stride_b)};
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
    return Gemm::get_workspace_size(arguments(PrefillGroupArrays{}, groups));
  }

  static void run(const PrefillGroupArrays& g, int groups, void* workspace, cudaStream_t stream) {
    const typename Gemm::Arguments args = arguments(g, groups);
    Gemm gemm;
    cutlass::Status st = gemm.can_implement(args);
    MK_CHECK(st == cutlass::Status::kSuccess, "prefill grouped GEMM: CUTLASS cannot implement it: "
                                                  << cutlass::cutlassGetStatusString(st));
    // (initialize fills the kernel's parameters on the host and sets its shared-memory limit; it
    // issues no stream work for this kernel, so a graph capture records the launch alone)
    st = gemm.initialize(args, workspace, stream);
    MK_CHECK(st == cutlass::Status::kSuccess,
             "prefill grouped GEMM: initialize failed: " << cutlass::cutlassGetStatusString(st));
    st = gemm.run(stream);
    MK_CHECK(st == cutlass::Status::kSuccess, "prefill grouped GEMM: launch failed: "
                                                  << cutlass::cutlassGetStatusString(st) << " ("
                                                  << cudaGetErrorString(cudaGetLastError()) << ")");
  }
};

}  // namespace moekit::cuda::prefill_gemm_detail

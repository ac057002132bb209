// The prefill grouped GEMM (prefill_gemm.h): ONE CUTLASS 3.x instance, the ptr-array grouped GEMM
// of sm_90a (KernelPtrArrayTmaWarpSpecializedCooperative: TMA loads into a multi-stage shared-
// memory pipeline, warp-specialised producer and two consumer warpgroups issuing wgmma with fp32
// accumulators, a persistent tile scheduler over (group, m-tile, n-tile)), bf16 A and B, fp32 D,
// no source C. Both of the path's GEMMs (gate/up and down) run it.
#include <cuda_runtime.h>

#include <mutex>
#include <sstream>

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

namespace moekit::cuda {
namespace {

using namespace cute;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using ElementA = cutlass::bfloat16_t;
using ElementB = cutlass::bfloat16_t;
using ElementD = float;
using ElementAccumulator = float;
using LayoutA = cutlass::layout::RowMajor;     // [M, K], K contiguous
using LayoutB = cutlass::layout::ColumnMajor;  // K x N with K contiguous: the [N, K] weight rows
using LayoutD = cutlass::layout::RowMajor;     // [M, N]
constexpr int kAlignA = 128 / cutlass::sizeof_bits<ElementA>::value;
constexpr int kAlignB = 128 / cutlass::sizeof_bits<ElementB>::value;
constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;

using TileShape = Shape<Int<kPrefillTileM>, Int<kPrefillTileN>, _64>;
using ClusterShape = Shape<_1, _1, _1>;
using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
    void, LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD, EpilogueSchedule,
    cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator, void,
                                                 ElementAccumulator>>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, kAlignA, ElementB,
    LayoutB*, kAlignB, ElementAccumulator, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    KernelSchedule>::CollectiveOp;

using GemmKernel =
    cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

using StrideA = typename GemmKernel::InternalStrideA;
using StrideB = typename GemmKernel::InternalStrideB;
using StrideD = typename GemmKernel::InternalStrideD;
using Underlying = typename ProblemShape::UnderlyingProblemShape;

// The device arrays of prefill_gemm.h are written by our own kernels as plain ints and int64s.
static_assert(sizeof(Underlying) == sizeof(PrefillProblem), "problem shape is not 3 ints");
static_assert(sizeof(StrideA) == sizeof(int64_t) && sizeof(StrideB) == sizeof(int64_t) &&
                  sizeof(StrideD) == sizeof(int64_t),
              "a ptr-array stride is not one int64 (its unit modes are static)");

// The device's SM count, asked once per process (the layer runs on one device).
int sm_count() {
  static int count = 0;
  static std::once_flag once;
  std::call_once(once, [] {
    int device = 0;
    MK_CUDA_CHECK(cudaGetDevice(&device));
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  });
  return count;
}

typename Gemm::Arguments make_arguments(const PrefillGroupArrays& g, int groups) {
  cutlass::KernelHardwareInfo hw;
  MK_CUDA_CHECK(cudaGetDevice(&hw.device_id));
  hw.sm_count = sm_count();
  typename Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  // no host copy of the problem sizes: the kernel reads them on the device
  args.problem_shape = {groups, reinterpret_cast<Underlying*>(g.problems), nullptr};
  args.mainloop = {reinterpret_cast<const ElementA**>(g.a),
                   reinterpret_cast<StrideA*>(g.stride_a),
                   reinterpret_cast<const ElementB**>(g.b),
                   reinterpret_cast<StrideB*>(g.stride_b)};
  auto& fusion = args.epilogue.thread;
  fusion.alpha = 1.0f;
  fusion.beta = 0.0f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = nullptr;
  args.epilogue.ptr_D = g.d;
  args.epilogue.dD = reinterpret_cast<StrideD*>(g.stride_d);
  args.hw_info = hw;
  return args;
}

const char* status_name(cutlass::Status s) { return cutlass::cutlassGetStatusString(s); }

}  // namespace

bool prefill_gemm_supported(const char** why) {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    if (why != nullptr) *why = "no usable CUDA device";
    return false;
  }
  if (major != 9 || minor != 0) {
    if (why != nullptr) *why = "the prefill GEMM is built for sm_90a (compute capability 9.0)";
    return false;
  }
  return true;
}

size_t prefill_gemm_workspace_bytes(int groups) {
  PrefillGroupArrays none;
  return Gemm::get_workspace_size(make_arguments(none, groups));
}

void run_prefill_gemm(const PrefillGroupArrays& arrays, int groups, void* workspace,
                      cudaStream_t stream) {
  const char* why = nullptr;
  MK_CHECK(prefill_gemm_supported(&why), "prefill grouped GEMM cannot run: " << why);
  MK_CHECK(groups >= 1, "expected >= 1 GEMM groups, got " << groups);
  const typename Gemm::Arguments args = make_arguments(arrays, groups);
  Gemm gemm;
  cutlass::Status st = gemm.can_implement(args);
  MK_CHECK(st == cutlass::Status::kSuccess,
           "prefill grouped GEMM: CUTLASS cannot implement it: " << status_name(st));
  // (initialize fills the kernel's parameters on the host and sets its shared-memory limit; it
  // issues no stream work for this kernel, so a graph capture records the launch alone)
  st = gemm.initialize(args, workspace, stream);
  MK_CHECK(st == cutlass::Status::kSuccess,
           "prefill grouped GEMM: initialize failed: " << status_name(st));
  st = gemm.run(stream);
  MK_CHECK(st == cutlass::Status::kSuccess, "prefill grouped GEMM: launch failed: "
                                                << status_name(st) << " ("
                                                << cudaGetErrorString(cudaGetLastError()) << ")");
}

}  // namespace moekit::cuda

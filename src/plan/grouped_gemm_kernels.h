// The one list of the prefill path's compiled grouped GEMM instances (moekit/plan.h:
// GroupedGemmKernel). It drives the CUDA instantiation (src/cuda/prefill/prefill_gemm_instance.cuh
// builds each row's types from its fields; src/cuda/prefill/instances/<name>.cu instantiates one
// row), the launch's dispatch by row (prefill_gemm.cu), the plan's choice, `moekit list-kernels`
// and `moekit bench grouped-gemm`. Host-only and constexpr, so the CUDA sources read the same
// rows. Every row costs CI a CUTLASS translation unit (about a minute of one core): the table
// holds what the plan picks, and a row that lost its A/B is deleted
// (docs/decisions/experts_grouped_gemms.md).
#pragma once

#include <string_view>

#include "moekit/plan.h"

namespace moekit::plan {

constexpr GroupedGemmKernel grouped(const char* name, bool fp8, int tile_m, int tile_n, int tile_k,
                                    GroupedSchedule schedule, int cluster_m = 1,
                                    int cluster_n = 1) {
  GroupedGemmKernel k;
  k.name = name;
  k.fp8 = fp8;
  k.tile_m = tile_m;
  k.tile_n = tile_n;
  k.tile_k = tile_k;
  k.schedule = schedule;
  k.cluster_m = cluster_m;
  k.cluster_n = cluster_n;
  return k;
}

constexpr GroupedSchedule kCoop = GroupedSchedule::Cooperative;
constexpr GroupedSchedule kPingpong = GroupedSchedule::Pingpong;

inline constexpr GroupedGemmKernel kGroupedGemmKernels[] = {
    // bf16
    grouped("grouped_bf16_128x256_coop", false, 128, 256, 64, kCoop),
    grouped("grouped_bf16_64x256_pingpong", false, 64, 256, 64, kPingpong),
    // fp8 block-scale (W8A8): K tiles of one scale block
    grouped("grouped_fp8_128x128_coop", true, 128, 128, 128, kCoop),
    grouped("grouped_fp8_64x128_pingpong", true, 64, 128, 128, kPingpong),
};
inline constexpr int kNumGroupedGemmKernels =
    static_cast<int>(sizeof(kGroupedGemmKernels) / sizeof(kGroupedGemmKernels[0]));

// The row named `name` (a translation unit names its row), or -1.
constexpr int grouped_gemm_row(std::string_view name) {
  for (int i = 0; i < kNumGroupedGemmKernels; ++i) {
    if (name == kGroupedGemmKernels[i].name) return i;
  }
  return -1;
}

// What CUTLASS's sm90 grouped GEMMs build here: a wgmma M of 64 per consumer warpgroup (so
// tile_m 64 ping-pong, 128 or 256 cooperative), tile_n a multiple of 64 up to 256, clusters of
// at most 2 CTAs; fp8: K tiles of one 128-wide scale block, B's 128 x 128 scale tiles whole in
// a tile (tile_n 128), and accumulators in registers twice (tile_m x tile_n / 128 threads <= 64).
constexpr bool legal(const GroupedGemmKernel& k) {
  const bool rows = k.schedule == GroupedSchedule::Pingpong ? k.tile_m == 64
                                                            : (k.tile_m == 128 || k.tile_m == 256);
  const bool cluster = k.cluster_m >= 1 && k.cluster_n >= 1 && k.cluster_m * k.cluster_n <= 2;
  const bool n = k.tile_n >= 64 && k.tile_n <= 256 && k.tile_n % 64 == 0;
  if (!rows || !cluster || !n) return false;
  if (!k.fp8) return k.tile_k == 64;
  const int warpgroups = k.schedule == GroupedSchedule::Pingpong ? 1 : 2;
  return k.tile_k == 128 && k.tile_n == 128 && k.tile_m * k.tile_n / (128 * warpgroups) <= 64;
}

constexpr bool same_shape(const GroupedGemmKernel& a, const GroupedGemmKernel& b) {
  return a.fp8 == b.fp8 && a.tile_m == b.tile_m && a.tile_n == b.tile_n && a.tile_k == b.tile_k &&
         a.schedule == b.schedule && a.cluster_m == b.cluster_m && a.cluster_n == b.cluster_n;
}

constexpr bool grouped_table_ok() {
  for (int i = 0; i < kNumGroupedGemmKernels; ++i) {
    if (!legal(kGroupedGemmKernels[i])) return false;
    for (int j = 0; j < i; ++j) {
      if (same_shape(kGroupedGemmKernels[i], kGroupedGemmKernels[j]) ||
          std::string_view(kGroupedGemmKernels[i].name) == kGroupedGemmKernels[j].name) {
        return false;
      }
    }
  }
  return true;
}
static_assert(grouped_table_ok(), "kGroupedGemmKernels: an illegal or repeated row");

}  // namespace moekit::plan

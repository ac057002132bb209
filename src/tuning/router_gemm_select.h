// Router GEMM tuner's choice rule, host only (tested on the CPU in tests/test_tuning.cpp):
// from measured times per M to table rows.
//
// The requested M values (e.g. 1-16,20,24,...,128) split 1..max into segments (prev+1 .. m); a
// row covers whole segments, so every M of a segment takes the segment's choice. Each segment is
// measured at both ends (prev+1 and m): cuBLAS picks different algorithms at different M (at
// M = 104 and 112 it was 15% slower than at 97..103 on the H200), so one end alone can hide a
// loss over the rest of the segment.
// Choice: one of our kernels only where it beats cuBLAS by kRouterGemmWinMargin at EVERY
// measured point of the segment; otherwise cuBLAS. Among the winners the least total time; the
// running row's config is kept while it still wins and is within kRouterGemmKeepTolerance of the
// best (fewer rows, no flapping between configs that noise cannot separate).
#pragma once

#include <utility>
#include <vector>

#include "moekit/dtype.h"
#include "moekit/tuning.h"

namespace moekit::tuning {

// why 3%: graph-replay medians of the same config differ by ~1% run to run; a 3% margin keeps
// noise from putting a kernel that ties cuBLAS into the table ("never slower than cuBLAS").
constexpr double kRouterGemmWinMargin = 0.97;
constexpr double kRouterGemmKeepTolerance = 1.02;

struct RouterGemmTiming {
  RouterGemmConfig config;
  double us;
};

// One segment: M in [m_min, m_max], and per measured point (1 or 2) every candidate's time.
struct RouterGemmSegment {
  int m_min = 1;
  int m_max = 1;
  std::vector<std::vector<RouterGemmTiming>> points;
};

struct RouterGemmSelectedRow {
  RouterGemmRow row;
  double us_mean = 0;         // the chosen config, mean over the measured points of its segments
  double cublas_us_mean = 0;  // cuBLAS at the same points
};

// Segments (m_min, m_max) of the sorted, deduplicated M list `ms` (every value >= 1).
std::vector<std::pair<int, int>> router_gemm_segments(std::vector<int> ms);

// The M values to measure for those segments: both ends of each, ascending, no duplicates.
std::vector<int> router_gemm_measure_points(const std::vector<std::pair<int, int>>& segments);

// Rows for one gate shape from its segments, in M order, covering exactly the segments.
std::vector<RouterGemmSelectedRow> select_router_gemm_rows(
    DType weight_dtype, int k, int n, const std::vector<RouterGemmSegment>& segments);

}  // namespace moekit::tuning

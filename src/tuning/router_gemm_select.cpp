// Router GEMM tuner's choice rule (see router_gemm_select.h): segments of M, their measured
// points, and the rows chosen from the timings. Host only, so it is tested without a GPU.
#include "tuning/router_gemm_select.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "moekit/error.h"

namespace moekit::tuning {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool is_cublas(const RouterGemmConfig& c) { return c.backend == RouterGemmBackend::Cublas; }

double time_of(const std::vector<RouterGemmTiming>& v, const RouterGemmConfig& c) {
  for (const RouterGemmTiming& t : v)
    if (t.config == c) return t.us;
  return kInf;
}

double cublas_time(const std::vector<RouterGemmTiming>& v) {
  for (const RouterGemmTiming& t : v)
    if (is_cublas(t.config)) return t.us;
  return kInf;
}

// Total time of `c` over the segment's points if it beats cuBLAS by the margin at every one of
// them, else infinity. A missing cuBLAS time (it failed) counts as infinitely slow.
double winning_total(const RouterGemmSegment& s, const RouterGemmConfig& c) {
  double total = 0;
  for (const auto& point : s.points) {
    const double us = time_of(point, c);
    if (!std::isfinite(us)) return kInf;
    const double cublas = cublas_time(point);
    if (!(us <= kRouterGemmWinMargin * cublas)) return kInf;
    total += us;
  }
  return total;
}

}  // namespace

std::vector<std::pair<int, int>> router_gemm_segments(std::vector<int> ms) {
  std::sort(ms.begin(), ms.end());
  ms.erase(std::unique(ms.begin(), ms.end()), ms.end());
  std::vector<std::pair<int, int>> out;
  int prev = 0;
  for (int m : ms) {
    MK_CHECK(m >= 1, "router_gemm_segments: expected M >= 1, got " << m);
    out.emplace_back(prev + 1, m);
    prev = m;
  }
  return out;
}

std::vector<int> router_gemm_measure_points(const std::vector<std::pair<int, int>>& segments) {
  std::vector<int> out;
  for (const auto& [lo, hi] : segments) {
    out.push_back(lo);
    out.push_back(hi);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<RouterGemmSelectedRow> select_router_gemm_rows(
    DType weight_dtype, int k, int n, const std::vector<RouterGemmSegment>& segments) {
  const RouterGemmConfig cublas{RouterGemmBackend::Cublas, 0, 0, 0, 1};
  std::vector<RouterGemmSelectedRow> rows;
  bool open = false;
  RouterGemmConfig current;
  double us_sum = 0, cublas_sum = 0;
  int n_points = 0;
  auto close = [&] {
    RouterGemmSelectedRow r;
    r.row.weight_dtype = weight_dtype;
    r.row.k = k;
    r.row.n = n;
    r.row.config = current;
    r.us_mean = us_sum / std::max(n_points, 1);
    r.cublas_us_mean = cublas_sum / std::max(n_points, 1);
    r.row.m_max = 0;  // set by the caller of close
    rows.push_back(r);
  };
  int row_min = 1;
  int prev_max = 0;
  for (const RouterGemmSegment& s : segments) {
    MK_CHECK(s.m_min == prev_max + 1 && s.m_max >= s.m_min && !s.points.empty(),
             "select_router_gemm_rows: expected contiguous segments starting at M=1 with "
             "timings, got M=" << s.m_min << ".." << s.m_max << " after " << prev_max
                               << " with " << s.points.size() << " point(s)");
    // The winner of this segment: least total among configs that beat cuBLAS everywhere in it.
    RouterGemmConfig best = cublas;
    double best_total = kInf;
    for (const RouterGemmTiming& t : s.points.front()) {
      if (is_cublas(t.config)) continue;
      const double total = winning_total(s, t.config);
      if (total < best_total) {
        best_total = total;
        best = t.config;
      }
    }
    bool keep = false;
    if (open) {
      if (is_cublas(best)) {
        keep = is_cublas(current);
      } else if (!is_cublas(current)) {
        keep = winning_total(s, current) <= kRouterGemmKeepTolerance * best_total;
      }
    }
    if (open && !keep) {
      close();
      rows.back().row.m_min = row_min;
      rows.back().row.m_max = prev_max;
      open = false;
    }
    if (!open) {
      open = true;
      current = best;
      row_min = s.m_min;
      us_sum = cublas_sum = 0;
      n_points = 0;
    }
    for (const auto& point : s.points) {
      us_sum += time_of(point, current);
      cublas_sum += cublas_time(point);
      ++n_points;
    }
    prev_max = s.m_max;
  }
  if (open) {
    close();
    rows.back().row.m_min = row_min;
    rows.back().row.m_max = prev_max;
  }
  for (const RouterGemmSelectedRow& r : rows) validate_row(r.row, "tune");
  return rows;
}

}  // namespace moekit::tuning

// The built-in router GEMM tables (tuning/*.inc), compiled in and checked at build time.
//
// Each MK_ROUTER_GEMM_ROW(...) line becomes checked_row(RouterGemmRow{...}), a consteval call: a
// row whose config is illegal for its (dtype, K, N, M range) calls a non-constexpr function, so
// the build fails at that row, and the compiler's note names the rule (detail::row_problem, the
// same rules the op enforces at run time). A static_assert then checks that rows of one table with
// the same (dtype, K, N) do not overlap in M, since only the first would ever be used.
#include "moekit/tuning.h"
#include "tuning/router_gemm_variants.h"

namespace moekit::tuning {

namespace {

// Never defined as constexpr: reaching it in a constant expression is the build error.
void table_row_is_invalid(const char* /*why*/) {}

consteval RouterGemmRow checked_row(RouterGemmRow r) {
  if (const char* why = detail::row_problem(r)) table_row_is_invalid(why);
  return r;
}

// The last element of each array is a sentinel so that empty tables compile; it is not a row.
#define MK_ROUTER_GEMM_ROW(DT, K, N, M_MIN, M_MAX, BACKEND, BLOCK, TILE_N, TILE_M, SPLIT_K) \
  checked_row(RouterGemmRow{DType::DT, K, N, M_MIN, M_MAX,                                  \
                            RouterGemmConfig{RouterGemmBackend::BACKEND, BLOCK, TILE_N,     \
                                             TILE_M, SPLIT_K}}),

constexpr RouterGemmRow kGenericRows[] = {
#include "../../tuning/generic.inc"
    RouterGemmRow{}};
constexpr RouterGemmRow kSm90Rows[] = {
#include "../../tuning/sm90.inc"
    RouterGemmRow{}};
constexpr RouterGemmRow kSm100Rows[] = {
#include "../../tuning/sm100.inc"
    RouterGemmRow{}};

#undef MK_ROUTER_GEMM_ROW

template <size_t N>
constexpr bool no_overlaps(const RouterGemmRow (&rows)[N]) {
  for (size_t i = 0; i + 1 < N; ++i) {
    for (size_t j = i + 1; j + 1 < N; ++j) {
      const RouterGemmRow& a = rows[i];
      const RouterGemmRow& b = rows[j];
      if (a.weight_dtype == b.weight_dtype && a.k == b.k && a.n == b.n &&
          a.m_min <= b.m_max && b.m_min <= a.m_max)
        return false;
    }
  }
  return true;
}

static_assert(no_overlaps(kGenericRows), "tuning/generic.inc: two rows overlap in M");
static_assert(no_overlaps(kSm90Rows), "tuning/sm90.inc: two rows overlap in M");
static_assert(no_overlaps(kSm100Rows), "tuning/sm100.inc: two rows overlap in M");

template <size_t N>
std::span<const RouterGemmRow> rows_of(const RouterGemmRow (&rows)[N]) {
  return std::span<const RouterGemmRow>(rows, N - 1);  // without the sentinel
}

}  // namespace

std::span<const RouterGemmRow> builtin_table(Arch a) {
  switch (a) {
    case Arch::Sm90:
      return rows_of(kSm90Rows);
    case Arch::Sm100:
      return rows_of(kSm100Rows);
    case Arch::Generic:
      return rows_of(kGenericRows);
  }
  return {};
}

}  // namespace moekit::tuning

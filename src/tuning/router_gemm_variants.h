// The compiled router GEMM kernel variants and the legality rules, constexpr so the built-in
// tables are checked at build time (static_assert in router_gemm_tables.cpp) with the very rules
// the op checks at run time.
//
// One list drives everything: MK_ROUTER_GEMM_*_VARIANTS instantiate the kernels
// (src/cuda/router_gemm/router_gemm_{dot_bf16,dot_f32,splitk_bf16}.cu), build the dispatch switch
// (router_gemm_launch.h) and answer "is there a kernel for this config" here. Keep them few: each
// entry is one more kernel to compile on the 2-core CI.
#pragma once

#include "moekit/dtype.h"
#include "moekit/tuning.h"

// Dot-product kernel: X(tile_n, tile_m) = (expert columns per CTA, tokens per pass).
#define MK_ROUTER_GEMM_DOT_VARIANTS(X) \
  X(1, 1) X(1, 2) X(1, 4) X(1, 8) X(2, 1) X(2, 2) X(2, 4) X(2, 8)

// Split-K mma kernel: X(tile_n, tile_m) = (experts per warp: 16 x mma rows, tokens per warp: 8 x
// mma columns). Experts sit on the mma's M side ("swap AB") because tokens are few at decode.
#define MK_ROUTER_GEMM_SPLITK_VARIANTS(X) \
  X(16, 8) X(16, 16) X(16, 32) X(32, 8) X(32, 16) X(32, 32)

namespace moekit::tuning::detail {

constexpr bool dot_variant_exists(int tile_n, int tile_m) {
#define MK_ROUTER_GEMM_MATCH_(TN, TM) \
  if (tile_n == (TN) && tile_m == (TM)) return true;
  MK_ROUTER_GEMM_DOT_VARIANTS(MK_ROUTER_GEMM_MATCH_)
  return false;
}

constexpr bool splitk_variant_exists(int tile_n, int tile_m) {
  MK_ROUTER_GEMM_SPLITK_VARIANTS(MK_ROUTER_GEMM_MATCH_)
  return false;
#undef MK_ROUTER_GEMM_MATCH_
}

constexpr long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// why the limits: grid.y and grid.z are at most 65535; the kernels index with int.
constexpr long long kMaxGridYZ = 65535;

constexpr const char* config_problem(const RouterGemmConfig& c, DType dt, int k, int n, int m) {
  if (dt != DType::BF16 && dt != DType::F32) return "the weight dtype must be BF16 or F32";
  if (k < 0 || n < 0 || m < 0) return "dimensions must not be negative";
  if (m > kMaxTokensPerCall) return "M exceeds kMaxTokensPerCall (1048576)";
  if (static_cast<long long>(m) * n >= (1ll << 31) || static_cast<long long>(n) * k >= (1ll << 31))
    return "M*N and N*K must fit in int";
  switch (c.backend) {
    case RouterGemmBackend::Naive:
    case RouterGemmBackend::Cublas:
      if (c.block != 0 || c.tile_n != 0 || c.tile_m != 0 || c.split_k != 1)
        return "naive and cublas take no parameters (block, tile_n, tile_m 0, split_k 1)";
      return nullptr;
    case RouterGemmBackend::Dot:
      if (c.block != 64 && c.block != 128 && c.block != 256) return "dot: block must be 64, 128 or 256";
      if (!dot_variant_exists(c.tile_n, c.tile_m))
        return "dot: no compiled kernel for this (tile_n, tile_m) (see MK_ROUTER_GEMM_DOT_VARIANTS)";
      // why <= 8: split_k CTAs form one cluster (8 is the portable cluster size limit)
      if (c.split_k != 1 && c.split_k != 2 && c.split_k != 4 && c.split_k != 8)
        return "dot: split_k must be 1, 2, 4 or 8";
      // why: each thread reads 8 consecutive K elements with 16-byte loads, rows must stay aligned
      if (k % 8 != 0) return "dot: K must be a multiple of 8 (16-byte loads along K)";
      if (m > 0 && ceil_div(m, c.tile_m) > kMaxGridYZ) return "dot: M / tile_m exceeds grid.y 65535";
      return nullptr;
    case RouterGemmBackend::SplitK:
      // why: fp32 weights on the tensor cores would mean tf32, ~1e-3 relative error, not fp32
      if (dt != DType::BF16) return "splitk: weights must be BF16 (fp32 would need tf32)";
      if (c.block != 128 && c.block != 256) return "splitk: block must be 128 or 256";
      if (!splitk_variant_exists(c.tile_n, c.tile_m))
        return "splitk: no compiled kernel for this (tile_n, tile_m) (see "
               "MK_ROUTER_GEMM_SPLITK_VARIANTS)";
      if (c.split_k < 1 || c.split_k > kMaxSplitK) return "splitk: split_k must be in 1..8";
      if (k % 8 != 0) return "splitk: K must be a multiple of 8 (16-byte loads along K)";
      if (n > 0 && ceil_div(n, c.tile_n) > kMaxGridYZ) return "splitk: N / tile_n exceeds 65535";
      if (m > 0 && ceil_div(m, c.tile_m) > kMaxGridYZ) return "splitk: M / tile_m exceeds 65535";
      return nullptr;
  }
  return "unknown backend";
}

// A table row: well formed and its config legal for every M of its range.
constexpr const char* row_problem(const RouterGemmRow& r) {
  if (r.k < 0 || r.n < 0) return "K and N must be >= 0 (0 = any)";
  if (r.m_min < 1 || r.m_max < r.m_min) return "M range must satisfy 1 <= m_min <= m_max";
  if (r.m_max > kMaxTokensPerCall) return "m_max exceeds kMaxTokensPerCall";
  if (const char* p = config_problem(r.config, r.weight_dtype, r.k, r.n, r.m_max)) return p;
  return nullptr;
}

}  // namespace moekit::tuning::detail

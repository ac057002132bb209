// The fast CPU MoE layer: same result as cpu_reference::forward, bound by memory bandwidth.
//
//   1. router     logits[T, C] = x . Wg^T (+ router bias), double accumulation (kernels.h
//                 router_dot), columns split over the threads when large enough; then
//                 cpu_reference::route (cheap).
//   2. group      the T*(k+S) (token, slot) pairs become one job per touched expert.
//   3. gate/up    units of one job's gate and up rows, activation applied while in cache.
//   4. down       units of one job's W2 rows, in the same run of the threads as gate/up's.
//   5. combine    y[t] += w * (down + b2), jobs in a fixed order.
//
// This file holds the router and forward(); phases 2-5 are experts() (fast_experts.cpp), each
// expert format's weights and rows are expert_jobs.h's, and the SIMD path and thread count come
// from isa_select.cpp.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "cpu/fast/fast_common.h"
#include "cpu/fast/kernels.h"
#include "moekit/cpu_fast.h"
#include "moekit/error.h"

namespace moekit::cpu_fast {

namespace {

using detail::Kernels;
using detail::kernels_for;
using detail::parallel;
using detail::scratch;

// [n*p/P, n*(p+1)/P): the slice of n items participant p of P owns.
inline int slice_begin(int n, int p, int parts) {
  return static_cast<int>(static_cast<int64_t>(n) * p / parts);
}

// The router's MACs that one core does in about the time the pool takes to wake its workers
// from sleep (tens of microseconds on a virtual machine; one core reads a router at a few G
// weights a second: docs/decisions/cpu_thread_pool.md). The columns are split over the threads
// when the split saves more than that: MACs x (1 - 1/threads) above it.
constexpr double kRouterMacsPerWake = 2e5;

}  // namespace

std::vector<float> router_logits(const LayerWeights& w, const Bf16* x, int tokens,
                                 const FastOptions& opt) {
  const MoeSpec& spec = w.spec();
  const int H = spec.hidden;
  const Kernels& kern = kernels_for(resolve_isa(opt.isa));
  const int threads = resolve_threads(opt.threads);
  MK_CHECK(tokens >= 0, "expected tokens >= 0, got " << tokens);

  // ---- router GEMM (double accumulation, like the reference, so both pick the same experts)
  const DType rdt = w.router_dtype();
  MK_CHECK(rdt == DType::BF16 || rdt == DType::F32,
           "expected router dtype BF16 or F32, got " << dtype_name(rdt));
  MK_CHECK(w.router_weight() != nullptr, "router weight of " << spec.name << " is missing");
  MK_CHECK(!spec.has_router_bias || w.router_bias() != nullptr,
           spec.name << " has a router bias but the weights hold none");
  const int C = spec.router_columns();
  const size_t TH = static_cast<size_t>(tokens) * H;
  thread_local std::vector<double> xd_buffer;
  double* xd = scratch(xd_buffer, TH);
  for (size_t i = 0; i < TH; ++i) xd[i] = bf16_to_float(x[i]);
  std::vector<const double*> xd_rows(tokens);
  for (int t = 0; t < tokens; ++t) xd_rows[t] = xd + static_cast<size_t>(t) * H;
  std::vector<double> logits_d(static_cast<size_t>(tokens) * C);
  if (tokens > 0) {
    const bool w_f32 = rdt == DType::F32;
    const size_t row_bytes = static_cast<size_t>(H) * (w_f32 ? 4 : 2);
    // why: a parallel phase may have to wake the workers, which only the smallest routers, or a
    // split over too few threads, do not repay
    const double macs = static_cast<double>(tokens) * C * H;
    const bool small = threads <= 1 || macs * (1.0 - 1.0 / threads) <= kRouterMacsPerWake;
    parallel(small ? 1 : std::min(threads, C), [&](int p, int parts) {
      const int c0 = slice_begin(C, p, parts), c1 = slice_begin(C, p + 1, parts);
      if (c0 == c1) return;
      const void* wrows = static_cast<const uint8_t*>(w.router_weight()) + c0 * row_bytes;
      kern.router_dot(wrows, w_f32, H, c1 - c0, H, xd_rows.data(), tokens, logits_d.data() + c0, C);
    });
  }
  std::vector<float> logits(logits_d.size());
  for (int t = 0; t < tokens; ++t) {
    for (int c = 0; c < C; ++c) {
      double v = logits_d[static_cast<size_t>(t) * C + c];
      // gpt-oss router bias on the routed columns (never on a gated shared expert's gate column)
      if (spec.has_router_bias && c < spec.num_experts) v += w.router_bias()[c];
      logits[static_cast<size_t>(t) * C + c] = static_cast<float>(v);
    }
  }
  return logits;
}

ForwardResult forward(const LayerWeights& w, const Bf16* x, int tokens, FuseShared fuse,
                      const FastOptions& opt) {
  const MoeSpec& spec = w.spec();
  check_finite_input(x, tokens, spec.hidden);
  const bool fused = fuse == FuseShared::On || (fuse == FuseShared::Auto && spec.can_fuse_shared());
  const RoutingConfig cfg = RoutingConfig::from_spec(spec, fused);  // throws if On is impossible
  check_forward_memory(w, tokens, fused);  // refuse before allocating, naming both sizes

  ForwardResult result;
  result.tokens = tokens;
  result.hidden = spec.hidden;
  result.fused = fused;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<float> logits = router_logits(w, x, tokens, opt);
  result.routing = cpu_reference::route(cfg, logits.data(), tokens, w.correction_bias());
  if (opt.phases != nullptr) opt.phases->router = detail::microseconds_since(start);
  const bool add_shared = !fused && spec.shared_kind != SharedKind::None;
  result.y = experts(w, x, tokens, result.routing, add_shared, opt);
  return result;
}

}  // namespace moekit::cpu_fast

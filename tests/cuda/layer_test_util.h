// What the GPU layer tests share (tests/cuda/test_layer_*.cpp): the skip without a GPU, inputs,
// the comparison of a GPU forward with the CPU reference (routing exactly, y by norm), the base
// options (the plan's knobs from the environment, so that scripts/gpu_check.sh's settings for
// the sanitizer runs apply), and CUDA-graph replay.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../small_spec.h"
#include "common/random_values.h"
#include "moekit/cuda_layer.h"
#include "moekit/layer.h"
#include "moekit/plan.h"
#include "moekit/routing.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit::test {

#define SKIP_WITHOUT_GPU()                                                  \
  do {                                                                      \
    std::string why_;                                                       \
    if (!cuda::available(&why_)) GTEST_SKIP() << "no usable GPU: " << why_; \
  } while (0)

// Options of a test layer: max_tokens, and the plan's knobs as the environment sets them
// (scripts/gpu_check.sh runs the sanitizers with MOEKIT_SHARED_DENSE=0; unset: the rules).
inline cuda::GpuLayerOptions base_options(int max_tokens) {
  cuda::GpuLayerOptions opt;
  opt.max_tokens = max_tokens;
  opt.overrides = plan::plan_overrides_from_env();
  return opt;
}

// x[tokens, hidden] uniform in (-1, 1), bf16, a function of the seed.
inline std::vector<Bf16> random_x(int tokens, int hidden, uint64_t seed) {
  namespace rv = random_values;
  const uint64_t stream = rv::stream_key(seed, -1, rv::Tensor::Input, -1);
  std::vector<Bf16> x(static_cast<size_t>(tokens) * hidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(rv::uniform(stream, i));
  return x;
}

struct Diff {
  double rel_norm = 0;  // ||a - b|| / ||b||
  double max_abs = 0;
  size_t worst = 0;
  size_t non_finite = 0;
};

inline Diff compare_rows(const std::vector<float>& a, const std::vector<float>& b, int hidden,
                         const std::vector<bool>& use_token) {
  Diff d;
  double num = 0, den = 0;
  for (size_t t = 0; t < use_token.size(); ++t) {
    if (!use_token[t]) continue;
    for (int h = 0; h < hidden; ++h) {
      const size_t i = t * hidden + h;
      if (!std::isfinite(a[i])) ++d.non_finite;
      const double e = std::fabs(static_cast<double>(a[i]) - b[i]);
      num += e * e;
      den += static_cast<double>(b[i]) * b[i];
      if (e > d.max_abs) {
        d.max_abs = e;
        d.worst = i;
      }
    }
  }
  d.rel_norm = std::sqrt(num / std::max(den, 1e-300));
  return d;
}

inline double max_abs_value(const std::vector<float>& v) {
  double m = 0;
  for (float f : v) m = std::max(m, static_cast<double>(std::fabs(f)));
  return m;
}

// The routing of a GPU forward: the GPU logits routed by the CPU reference give exactly the same
// ids, weights to 1e-5 relative.
inline void expect_routing_matches_cpu(const MoeSpec& spec, const LayerWeights& w,
                                       const std::vector<float>& gpu_logits,
                                       const ForwardResult& g, const std::string& what) {
  const RoutingConfig cfg = RoutingConfig::from_spec(spec, g.fused);
  const Routing cr = cpu_reference::route(cfg, gpu_logits.data(), g.tokens, w.correction_bias());
  ASSERT_EQ(g.routing.slots, cr.slots) << what;
  ASSERT_EQ(g.routing.ids.size(), cr.ids.size()) << what;
  int mismatch = 0;
  for (size_t i = 0; i < cr.ids.size(); ++i) {
    if (g.routing.ids[i] != cr.ids[i] && ++mismatch <= 5) {
      ADD_FAILURE() << what << ": pair " << i << " (token " << i / cr.slots << ", slot "
                    << i % cr.slots << "): GPU id " << g.routing.ids[i] << ", CPU id "
                    << cr.ids[i];
    }
    const double tol = 1e-5 * std::fabs(cr.weights[i]) + 1e-7;
    if (std::fabs(g.routing.weights[i] - cr.weights[i]) > tol && ++mismatch <= 5) {
      ADD_FAILURE() << what << ": pair " << i << " weight GPU " << g.routing.weights[i]
                    << ", CPU " << cr.weights[i];
    }
  }
  EXPECT_EQ(mismatch, 0) << what << ": routing mismatches";
  if (!cr.shared_scale.empty()) {
    ASSERT_EQ(g.routing.shared_scale.size(), cr.shared_scale.size()) << what;
    for (size_t t = 0; t < cr.shared_scale.size(); ++t) {
      EXPECT_NEAR(g.routing.shared_scale[t], cr.shared_scale[t],
                  1e-6 + 1e-6 * std::fabs(cr.shared_scale[t]))
          << what << ": shared_scale of token " << t;
    }
  }
}

// y of the GPU against cpu_reference::forward, on the tokens whose ids agree (the CPU computes
// its own logits in double, so a token tied to ~1e-6 may route differently: at most T/100).
inline void expect_layer_matches(const MoeSpec& spec, int tokens, const ForwardResult& g,
                                 const ForwardResult& c, const std::string& what,
                                 double tol = 5e-3) {
  ASSERT_EQ(c.fused, g.fused) << what;
  ASSERT_EQ(c.y.size(), g.y.size()) << what;
  const int slots = c.routing.slots;
  std::vector<bool> same(tokens, true);
  int differing = 0;
  for (int t = 0; t < tokens; ++t) {
    for (int s = 0; s < slots; ++s) {
      if (c.routing.ids[t * slots + s] != g.routing.ids[t * slots + s]) same[t] = false;
    }
    differing += same[t] ? 0 : 1;
  }
  EXPECT_LE(differing, tokens / 100)
      << what << ": " << differing << " tokens route differently from the CPU's double logits";
  const Diff d = compare_rows(g.y, c.y, spec.hidden, same);
  const double scale = max_abs_value(c.y);
  const size_t non_finite =
      std::count_if(g.y.begin(), g.y.end(), [](float v) { return !std::isfinite(v); });
  EXPECT_EQ(non_finite, 0u) << what << ": non-finite outputs (unwritten: poisoned with NaN)";
  EXPECT_LE(d.rel_norm, tol) << what << ": relative error by norm";
  EXPECT_LE(d.max_abs, 4 * tol * scale + 1e-6)
      << what << ": worst element " << d.worst << " (token " << d.worst / spec.hidden
      << ", column " << d.worst % spec.hidden << "): GPU " << g.y[d.worst] << ", CPU "
      << c.y[d.worst] << ", max |y| " << scale;
}

inline void expect_layer_matches_cpu(const MoeSpec& spec, const LayerWeights& w, const Bf16* x,
                                     int tokens, const ForwardResult& g, FuseShared fuse,
                                     const std::string& what, double tol = 5e-3) {
  expect_layer_matches(spec, tokens, g, cpu_reference::forward(w, x, tokens, fuse), what, tol);
}

// The forward captured in a CUDA graph and replayed three times (y poisoned before each) gives
// the eager forward's y bit for bit.
inline void expect_graph_replay_equals_forward(cuda::GpuMoeLayer& gpu, const MoeSpec& spec,
                                               int tokens, FuseShared fuse, int seed) {
  const std::vector<Bf16> x = random_x(tokens, spec.hidden, seed);
  const ForwardResult ref = gpu.forward(x.data(), tokens, fuse);
  const size_t n = static_cast<size_t>(tokens) * spec.hidden;
  void *dx = nullptr, *dy = nullptr;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, n * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, n * 2), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  gpu.forward_device(dx, dy, tokens, fuse, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 3; ++rep) {
    ASSERT_EQ(cudaMemset(dy, 0xff, n * 2), cudaSuccess);  // NaN poison
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<Bf16> y(n);
    ASSERT_EQ(cudaMemcpy(y.data(), dy, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(bf16_to_float(y[i]), ref.y[i])
          << "replay " << rep << " element " << i << " fuse=" << fuse_shared_name(fuse);
    }
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaFree(dx), cudaSuccess);
  EXPECT_EQ(cudaFree(dy), cudaSuccess);
}

// The expert-kernel instances a plan launches, by name, in launch order.
inline std::vector<std::string> plan_kernel_names(const plan::LayerPlan& p) {
  std::vector<std::string> names;
  for (const plan::ExpertLaunch& l : p.experts) names.push_back(plan::expert_kernels()[l.kernel].name);
  return names;
}

}  // namespace moekit::test

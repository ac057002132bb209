// GPU MoE layer (include/moekit/cuda_layer.h) against the CPU reference.
//
// Every family of configs/ runs scaled down (hidden 256, 32 experts, I = 128: the real parser on
// a shrunk copy of the real config) for T in {1, 2, 7, 32, 128, 1000}, fused and unfused:
//   - routing: the GPU's own logits routed by cpu_reference::route give exactly the GPU's ids
//     (selection is fp32 on both sides) and its weights to 1e-5
//   - layer:   y against cpu_reference::forward on every token whose ids agree (the CPU computes
//     its own logits in double, so a token tied to ~1e-6 may route differently; at most T/100
//     such tokens, none below T = 100), relative error by norm <= 5e-3 (bf16 h and y)
//   - fused against unfused, device fill against host weights (bit-identical), determinism,
//     CUDA-graph replay, launch count, dispatch invariants, error messages
// DeepSeek-V3 runs once at its real shape (T = 1, 7, 9) with its 22.6 GB layer made on the GPU.
// Outputs are poisoned (NaN / -1) before every run by GpuMoeLayer::forward. Without a GPU every
// test skips saying why, except the host-side choice of the expert-kernel variant.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../expect_error.h"
#include "common/random_values.h"
#include "cuda/experts/experts.h"
#include "cuda/common/trace.cuh"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/routing.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

#define SKIP_WITHOUT_GPU()                                                  \
  do {                                                                      \
    std::string why_;                                                       \
    if (!cuda::available(&why_)) GTEST_SKIP() << "no usable GPU: " << why_; \
  } while (0)

const std::vector<std::string> kModels = {
    "deepseek-v2-lite", "deepseek-v3",  "deepseek-v4-flash", "glm-4.5",         "glm-5",
    "gpt-oss-120b",     "kimi-k2",      "minimax-m2",        "minimax-m3",      "mixtral-8x7b",
    "qwen2-57b-a14b",   "qwen3-235b-a22b", "qwen3-30b-a3b"};

// configs/<model>.json with the sizes shrunk to kernel-legal multiples of 64, parsed by the real
// parser; family, scoring, groups, shared kind, activation stay the model's own.
MoeSpec small_spec(const std::string& model, int hidden = 256, int experts = 32, int inter = 128) {
  const std::string path = config_dir() + "/" + model + ".json";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  nlohmann::json top = nlohmann::json::parse(in);
  nlohmann::json& c = top.contains("text_config") ? top["text_config"] : top;
  c["hidden_size"] = hidden;
  for (const char* k : {"n_routed_experts", "num_experts", "num_local_experts"}) {
    if (c.contains(k)) c[k] = experts;
  }
  if (c.contains("moe_intermediate_size")) {
    c["moe_intermediate_size"] = inter;
  } else {
    c["intermediate_size"] = inter;
  }
  if (c.contains("shared_expert_intermediate_size")) c["shared_expert_intermediate_size"] = 2 * inter;
  if (c.contains("shared_intermediate_size")) c["shared_intermediate_size"] = inter;
  if (c.contains("n_group") && c["n_group"].is_number_integer() &&
      c["n_group"].get<int>() > experts / 2) {
    c["n_group"] = 1;
    c["topk_group"] = 1;
  }
  return parse_spec_json(top.dump(), model + "-small");
}

std::vector<Bf16> random_x(int tokens, int hidden, uint64_t seed) {
  namespace rv = random_values;
  const uint64_t stream = rv::stream_key(seed, -1, rv::Tensor::Input, -1);
  std::vector<Bf16> x(static_cast<size_t>(tokens) * hidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(rv::uniform(stream, i));
  return x;
}

struct Diff {
  double rel_norm = 0;     // ||a - b|| / ||b||
  double max_abs = 0;
  size_t worst = 0;
  size_t non_finite = 0;
};

Diff compare_rows(const std::vector<float>& a, const std::vector<float>& b, int hidden,
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

double max_abs_value(const std::vector<float>& v) {
  double m = 0;
  for (float f : v) m = std::max(m, static_cast<double>(std::fabs(f)));
  return m;
}

// Checks the routing of a GPU forward: ids in range, and the GPU logits routed by the CPU
// reference give exactly the same ids, weights to 1e-5 relative.
void expect_routing_matches_cpu(const MoeSpec& spec, const LayerWeights& w,
                                const std::vector<float>& gpu_logits, const ForwardResult& g,
                                const std::string& what) {
  const RoutingConfig cfg = RoutingConfig::from_spec(spec, g.fused);
  const Routing cr = cpu_reference::route(cfg, gpu_logits.data(), g.tokens, w.correction_bias());
  ASSERT_EQ(g.routing.slots, cr.slots) << what;
  ASSERT_EQ(g.routing.ids.size(), cr.ids.size()) << what;
  int id_mismatch = 0;
  for (size_t i = 0; i < cr.ids.size(); ++i) {
    if (g.routing.ids[i] != cr.ids[i] && ++id_mismatch <= 5) {
      ADD_FAILURE() << what << ": pair " << i << " (token " << i / cr.slots << ", slot "
                    << i % cr.slots << "): GPU id " << g.routing.ids[i] << ", CPU id "
                    << cr.ids[i];
    }
    const double tol = 1e-5 * std::fabs(cr.weights[i]) + 1e-7;
    if (std::fabs(g.routing.weights[i] - cr.weights[i]) > tol && ++id_mismatch <= 5) {
      ADD_FAILURE() << what << ": pair " << i << " weight GPU " << g.routing.weights[i]
                    << ", CPU " << cr.weights[i];
    }
  }
  EXPECT_EQ(id_mismatch, 0) << what << ": routing mismatches";
  if (!cr.shared_scale.empty()) {
    ASSERT_EQ(g.routing.shared_scale.size(), cr.shared_scale.size()) << what;
    for (size_t t = 0; t < cr.shared_scale.size(); ++t) {
      EXPECT_NEAR(g.routing.shared_scale[t], cr.shared_scale[t],
                  1e-6 + 1e-6 * std::fabs(cr.shared_scale[t]))
          << what << ": shared_scale of token " << t;
    }
  }
}

// y of the GPU against cpu_reference::forward, on the tokens whose ids agree.
void expect_layer_matches(const MoeSpec& spec, int tokens, const ForwardResult& g,
                          const ForwardResult& c, const std::string& what, double tol = 5e-3) {
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

void expect_layer_matches_cpu(const MoeSpec& spec, const LayerWeights& w, const Bf16* x,
                              int tokens, const ForwardResult& g, FuseShared fuse,
                              const std::string& what, double tol = 5e-3) {
  expect_layer_matches(spec, tokens, g, cpu_reference::forward(w, x, tokens, fuse), what, tol);
}

// ---- every family, every T ----

struct Case {
  std::string model;
  int tokens;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string n = info.param.model + "_T" + std::to_string(info.param.tokens);
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

// Every expert-kernel variant (experts.h), by its MOEKIT_EXPERTS_KERNEL name.
constexpr const char* kExpertKernels[] = {"regs", "regs-early", "bulk", "persistent"};

// Environment variable `name` set to `value` for this object's lifetime, then restored (or unset)
// as it was, also when an assertion leaves the test early.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* before = std::getenv(name);
    if (before != nullptr) before_ = before;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (before_) {
      setenv(name_.c_str(), before_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> before_;
};

// The layer with its expert kernels forced to `variant` (read once, at layer creation).
std::unique_ptr<cuda::GpuMoeLayer> create_with_kernel(const LayerWeights& w,
                                                      const cuda::GpuLayerOptions& opt,
                                                      const char* variant) {
  setenv("MOEKIT_EXPERTS_KERNEL", variant, 1);
  auto gpu = cuda::GpuMoeLayer::create(w, opt);
  unsetenv("MOEKIT_EXPERTS_KERNEL");
  return gpu;
}

// The layer with the bulk expert kernels and environment knob `name` set to `value` (layers read
// their knobs once, at creation).
std::unique_ptr<cuda::GpuMoeLayer> create_bulk_with_knob(const LayerWeights& w,
                                                         const cuda::GpuLayerOptions& opt,
                                                         const char* name, const char* value) {
  setenv(name, value, 1);
  auto gpu = create_with_kernel(w, opt, "bulk");
  unsetenv(name);
  return gpu;
}

// Two bulk layers, made with knob `name` at `off` and at `on`, forward the same `tokens`
// (inputs seeded seed + T): on's output matches the CPU reference and off's equals it bit for
// bit (the knob moves work between CTAs or in time, never changes a sum).
void expect_knob_keeps_the_output(const MoeSpec& spec, const LayerWeights& w,
                                  const cuda::GpuLayerOptions& opt, const char* name,
                                  const char* off, const char* on,
                                  std::initializer_list<int> tokens, FuseShared fuse, int seed) {
  const auto without = create_bulk_with_knob(w, opt, name, off);
  const auto with = create_bulk_with_knob(w, opt, name, on);
  for (int t : tokens) {
    const std::vector<Bf16> x = random_x(t, spec.hidden, seed + t);
    std::ostringstream what;
    what << spec.name << " T=" << t << " " << name << "=" << on << " vs " << off;
    const ForwardResult g = with->forward(x.data(), t, fuse);
    expect_layer_matches_cpu(spec, w, x.data(), t, g, fuse, what.str());
    EXPECT_EQ(without->forward(x.data(), t, fuse).y, g.y) << what.str();
  }
}

// expect_knob_keeps_the_output for each of `on_values`, fused and unfused.
void expect_knob_values_keep_the_output(const MoeSpec& spec, const LayerWeights& w,
                                        const cuda::GpuLayerOptions& opt, const char* name,
                                        const char* off,
                                        std::initializer_list<const char*> on_values,
                                        std::initializer_list<int> tokens, int seed) {
  for (FuseShared fuse : {FuseShared::On, FuseShared::Off}) {
    for (const char* on : on_values) {
      expect_knob_keeps_the_output(spec, w, opt, name, off, on, tokens, fuse, seed);
    }
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const auto& m : kModels) {
    for (int t : {1, 2, 7, 32, 128, 1000}) out.push_back({m, t});
  }
  return out;
}

class GpuLayerFamily : public testing::TestWithParam<Case> {};

TEST_P(GpuLayerFamily, MatchesCpuReferenceFusedAndUnfused) {
  SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const MoeSpec spec = small_spec(c.model);
  const int layer = spec.moe_layers.front();
  const auto w = make_random_weights(spec, layer, 11);
  const std::vector<Bf16> x = random_x(c.tokens, spec.hidden, 5 + c.tokens);
  std::vector<FuseShared> modes{FuseShared::Off};
  if (spec.can_fuse_shared()) modes.push_back(FuseShared::On);
  std::vector<ForwardResult> cpu;
  for (FuseShared fuse : modes) cpu.push_back(cpu_reference::forward(*w, x.data(), c.tokens, fuse));

  cuda::GpuLayerOptions opt;
  opt.max_tokens = c.tokens;
  for (const char* variant : kExpertKernels) {
    const auto gpu = create_with_kernel(*w, opt, variant);
    std::vector<ForwardResult> results;
    for (size_t m = 0; m < modes.size(); ++m) {
      std::ostringstream what;
      what << spec.name << " T=" << c.tokens << " fuse=" << fuse_shared_name(modes[m])
           << " kernel=" << variant;
      SCOPED_TRACE(what.str());
      const ForwardResult g = gpu->forward(x.data(), c.tokens, modes[m]);
      EXPECT_EQ(g.fused, modes[m] == FuseShared::On);
      const std::vector<float> logits = gpu->last_logits(c.tokens);
      expect_routing_matches_cpu(spec, *w, logits, g, what.str());
      expect_layer_matches(spec, c.tokens, g, cpu[m], what.str());
      results.push_back(g);
    }
    if (results.size() == 2) {
      // fused vs unfused: the same routed ids, outputs equal to bf16 precision
      const int k = spec.top_k;
      for (int t = 0; t < c.tokens; ++t) {
        for (int s = 0; s < k; ++s) {
          ASSERT_EQ(results[0].routing.ids[t * k + s],
                    results[1].routing.ids[t * results[1].routing.slots + s])
              << "token " << t << " slot " << s;
        }
      }
      const Diff d = compare_rows(results[1].y, results[0].y, spec.hidden,
                                  std::vector<bool>(c.tokens, true));
      EXPECT_LE(d.rel_norm, 5e-3) << spec.name << ": fused vs unfused, kernel=" << variant;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, GpuLayerFamily, testing::ValuesIn(all_cases()), case_name);

// ---- device fill, determinism, graphs, launches ----

TEST(GpuLayer, DeviceRandomFillMatchesHostWeightsBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const std::string model : {"deepseek-v3", "gpt-oss-120b", "qwen2-57b-a14b", "minimax-m2"}) {
    SCOPED_TRACE(model);
    const MoeSpec spec = small_spec(model);
    const int layer = spec.moe_layers.back();
    const auto w = make_random_weights(spec, layer, 3);
    cuda::GpuLayerOptions opt;
    opt.max_tokens = 64;
    const auto uploaded = cuda::GpuMoeLayer::create(*w, opt);
    const auto generated = cuda::GpuMoeLayer::create_random(spec, layer, 3, opt);
    EXPECT_EQ(uploaded->weight_bytes(), generated->weight_bytes());
    const std::vector<Bf16> x = random_x(64, spec.hidden, 9);
    for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
      const ForwardResult a = uploaded->forward(x.data(), 64, fuse);
      const std::vector<float> la = uploaded->last_logits(64);
      const ForwardResult b = generated->forward(x.data(), 64, fuse);
      const std::vector<float> lb = generated->last_logits(64);
      EXPECT_EQ(la, lb) << "router logits differ: router weights differ";
      EXPECT_EQ(a.routing.ids, b.routing.ids);
      EXPECT_EQ(a.y, b.y) << "outputs differ: expert weights differ";
    }
  }
}

TEST(GpuLayer, ForwardIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 1);
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 256;
  for (const char* variant : kExpertKernels) {
    const auto gpu = create_with_kernel(*w, opt, variant);
    for (int tokens : {1, 8, 9, 256}) {
      const std::vector<Bf16> x = random_x(tokens, spec.hidden, 2);
      for (FuseShared fuse : {FuseShared::On, FuseShared::Off}) {
        const ForwardResult a = gpu->forward(x.data(), tokens, fuse);
        const ForwardResult b = gpu->forward(x.data(), tokens, fuse);
        EXPECT_EQ(a.y, b.y) << "T=" << tokens << " fuse=" << fuse_shared_name(fuse)
                            << " kernel=" << variant;
      }
    }
  }
}

// `moekit bench --trace`'s timeline: every event recorded, in the order PDL imposes (a kernel's
// griddepcontrol.wait returns after the kernel before it has finished), and nothing recorded
// once the trace is unset. Both variants that record: bulk (gate/up, then down) and persistent
// (both in one grid: down items start while other CTAs still run gate/up).
TEST(GpuLayer, TraceRecordsTheKernelTimelineInOrder) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 6);
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 8;
  for (const char* variant : {"bulk", "persistent"}) {
    SCOPED_TRACE(variant);
    const bool persistent = std::string(variant) == "persistent";
    const auto gpu = create_with_kernel(*w, opt, variant);
    unsigned long long* words = nullptr;
    ASSERT_EQ(cudaMalloc(&words, cuda::kTraceWords * 8), cudaSuccess);
    std::vector<unsigned long long> init(cuda::kTraceWords, 0);
    std::fill(init.begin(), init.begin() + cuda::kTraceEvents, ~0ull);  // earliest: none yet
    ASSERT_EQ(cudaMemcpy(words, init.data(), cuda::kTraceWords * 8, cudaMemcpyHostToDevice),
              cudaSuccess);
    const std::vector<Bf16> x = random_x(4, spec.hidden, 6);
    gpu->set_trace(words);
    gpu->forward(x.data(), 4, FuseShared::On);
    gpu->set_trace(nullptr);
    std::vector<unsigned long long> t(cuda::kTraceWords);
    ASSERT_EQ(cudaMemcpy(t.data(), words, cuda::kTraceWords * 8, cudaMemcpyDeviceToHost),
              cudaSuccess);
    auto first = [&](int ev) { return t[ev]; };
    auto last = [&](int ev) { return t[cuda::kTraceEvents + ev]; };
    for (int ev = 0; ev < cuda::kTraceEvents; ++ev) {
      EXPECT_NE(first(ev), ~0ull) << "event " << ev << " not recorded";
      EXPECT_LE(first(ev), last(ev)) << "event " << ev;
    }
    EXPECT_LE(first(cuda::kTraceRouterWaited), first(cuda::kTraceRouterSummed));
    EXPECT_LE(first(cuda::kTraceRouterSummed), first(cuda::kTraceRouterEnd));
    EXPECT_LE(last(cuda::kTraceRouterEnd), first(cuda::kTraceRoutingWaited));
    EXPECT_LE(last(cuda::kTraceRoutingStart), first(cuda::kTraceRoutingWaited));
    EXPECT_LE(first(cuda::kTraceRoutingWaited), first(cuda::kTraceRoutingKeyed));
    EXPECT_LE(first(cuda::kTraceRoutingKeyed), first(cuda::kTraceRoutingGrouped));
    EXPECT_LE(first(cuda::kTraceRoutingGrouped), first(cuda::kTraceRoutingPicked));
    EXPECT_LE(first(cuda::kTraceRoutingPicked), last(cuda::kTraceRoutingRouted));
    EXPECT_LE(last(cuda::kTraceRoutingWaited), first(cuda::kTraceRoutingRouted));
    EXPECT_LE(last(cuda::kTraceRoutingRouted), first(cuda::kTraceRoutingEnd));
    EXPECT_LE(last(cuda::kTraceRoutingEnd), first(cuda::kTraceGateUpWaited));
    EXPECT_LE(first(cuda::kTraceGateUpWaited), first(cuda::kTraceGateUpEnd));
    EXPECT_LE(first(cuda::kTraceDownStart), first(cuda::kTraceDownIssued));
    if (persistent) {
      // a down item's h waits for its task's gate/up items, which follow the grid's wait
      EXPECT_LE(first(cuda::kTraceGateUpWaited), first(cuda::kTraceDownStart));
      EXPECT_LE(first(cuda::kTraceDownIssued), first(cuda::kTraceDownWaited));
      EXPECT_LE(last(cuda::kTraceGateUpEnd), last(cuda::kTraceDownEnd));
    } else {
      EXPECT_LE(last(cuda::kTraceGateUpEnd), first(cuda::kTraceDownWaited));
      // every CTA's consumers see its producer's end-of-work record after the producer's wait
      EXPECT_LE(first(cuda::kTraceDownWaited), first(cuda::kTraceDownConsumed));
    }
    EXPECT_LE(last(cuda::kTraceDownWaited), last(cuda::kTraceDownEnd));
    EXPECT_LE(last(cuda::kTraceDownConsumed), last(cuda::kTraceDownEnd));
    // each CTA's end lies within its kernel's first and last, on an SM of this GPU
    int sms = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    for (const int kernel : {cuda::kTraceCtaGateUp, cuda::kTraceCtaDown}) {
      const int end_ev = kernel == cuda::kTraceCtaGateUp ? cuda::kTraceGateUpEnd
                                                         : cuda::kTraceDownEnd;
      int recorded = 0;
      for (int c = 0; c < cuda::kTraceMaxCtas; ++c) {
        const unsigned long long at = t[cuda::kTraceCtaOffset + kernel * cuda::kTraceMaxCtas + c];
        if (at == 0) continue;
        ++recorded;
        EXPECT_GE(at, first(end_ev)) << "kernel " << kernel << " CTA " << c;
        EXPECT_LE(at, last(end_ev)) << "kernel " << kernel << " CTA " << c;
        EXPECT_LT(t[cuda::kTraceCtaOffset + (2 + kernel) * cuda::kTraceMaxCtas + c],
                  static_cast<unsigned long long>(sms));
      }
      EXPECT_GT(recorded, 0) << "kernel " << kernel;
    }
    gpu->forward(x.data(), 4, FuseShared::On);  // unset: the words stay as they were
    std::vector<unsigned long long> after(cuda::kTraceWords);
    ASSERT_EQ(cudaMemcpy(after.data(), words, cuda::kTraceWords * 8, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(after, t);
    ASSERT_EQ(cudaFree(words), cudaSuccess);
  }
}

// The forward captured in a CUDA graph and replayed three times (y poisoned before each) gives
// the eager forward's y bit for bit.
void expect_graph_replay_equals_forward(cuda::GpuMoeLayer& gpu, const MoeSpec& spec, int tokens,
                                        FuseShared fuse, int seed) {
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

// Qwen2-57B (shared experts, fused and not) at 3 and 32 tokens; Qwen3-30B-A3B at one token, where
// the gate/up kernel routes the token itself and zeroes its own work counter for the next replay.
TEST(GpuLayer, GraphReplayMatchesForward) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* model;
    std::vector<int> tokens;
  };
  for (const Case& c : {Case{"qwen2-57b-a14b", {3, 32}}, Case{"qwen3-30b-a3b", {1}}}) {
    SCOPED_TRACE(c.model);
    const MoeSpec spec = small_spec(c.model);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 4);
    cuda::GpuLayerOptions opt;
    opt.max_tokens = 32;
    const auto gpu = cuda::GpuMoeLayer::create(*w, opt);
    for (FuseShared fuse : {FuseShared::On, FuseShared::Off}) {
      if (fuse == FuseShared::On && spec.shared_intermediate == 0) continue;  // (the same path)
      for (int tokens : c.tokens) {
        expect_graph_replay_equals_forward(*gpu, spec, tokens, fuse, 8);
      }
    }
  }
}

TEST(GpuLayer, AtMostFourLaunchesWhenFused) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3");
  const auto gpu = cuda::GpuMoeLayer::create_random(spec, spec.moe_layers.front(), 0, {});
  for (int tokens : {1, 8, 32, 128}) {
    const cuda::LaunchCount fused = gpu->count_launches(tokens, true);
    const cuda::LaunchCount unfused = gpu->count_launches(tokens, false);
    std::printf("T=%d: fused %d kernels, unfused %d kernels\n", tokens, fused.kernels,
                unfused.kernels);
    if (tokens <= 8) EXPECT_LE(fused.kernels, 4) << "T=" << tokens;
    if (tokens < cuda::experts_shared_dense_tokens()) {
      EXPECT_EQ(unfused.kernels, fused.kernels + 2) << "T=" << tokens;  // its gate/up and down
    } else {
      // (the dense shared MLP: cuBLAS' GEMMs, >= 1 kernel each, and the activation)
      EXPECT_GE(unfused.kernels, fused.kernels + 3) << "T=" << tokens;
    }
    std::printf("T=%d: %d non-kernel graph nodes (fused)\n", tokens, fused.other_nodes);
  }
}

// The persistent expert variant: gate/up and down are one launch (3 per fused layer; unfused,
// with the expert kernels for the shared MLP below MOEKIT_SHARED_DENSE's tokens, 5).
TEST(GpuLayer, PersistentExpertsTakeOneLaunch) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 3);
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 128;
  const auto gpu = create_with_kernel(*w, opt, "persistent");
  for (int tokens : {1, 7}) {
    EXPECT_EQ(gpu->count_launches(tokens, true).kernels, 3) << "T=" << tokens;
    EXPECT_EQ(gpu->count_launches(tokens, false).kernels, 5) << "T=" << tokens;
  }
  EXPECT_EQ(gpu->count_launches(128, true).kernels, 3);
  EXPECT_GE(gpu->count_launches(128, false).kernels, 3 + 3);  // (the dense shared MLP)
}

TEST(GpuLayer, RejectsTooManyTokensAndNonFiniteInput) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("qwen3-30b-a3b");
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 4;
  const auto gpu = cuda::GpuMoeLayer::create_random(spec, spec.moe_layers.front(), 0, opt);
  std::vector<Bf16> x = random_x(5, spec.hidden, 1);
  test::expect_error([&] { gpu->forward(x.data(), 5, FuseShared::Auto); },
                     {"max_tokens (4), got 5"});
  x[3 * spec.hidden + 7] = float_to_bf16(std::nanf(""));
  test::expect_error([&] { gpu->forward(x.data(), 4, FuseShared::Auto); }, {"token 3, column 7"});
  // device pointers the expert kernels cannot copy or store in 16-byte units
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 1 << 20), cudaSuccess);  // (never read: the check comes first)
  char* base = static_cast<char*>(buf);
  test::expect_error([&] { gpu->forward_device(base + 8, base + 4096, 1, nullptr); },
                     {"x and y must be 16-byte aligned"});
  test::expect_error([&] { gpu->forward_device(base, base + 4096 + 2, 1, nullptr); },
                     {"x and y must be 16-byte aligned"});
  ASSERT_EQ(cudaFree(buf), cudaSuccess);
  // fusing a spec without a shared expert is fine (nothing to fuse); forcing On on a spec that
  // cannot fuse throws naming the widths
  MoeSpec odd = small_spec("qwen2-57b-a14b");
  odd.shared_intermediate = 3 * 64;  // not a multiple of I = 128
  const auto wodd = make_random_weights(odd, odd.moe_layers.front(), 0);
  const auto godd = cuda::GpuMoeLayer::create(*wodd, opt);
  std::vector<Bf16> x4 = random_x(4, odd.hidden, 1);
  EXPECT_THROW(godd->forward(x4.data(), 4, FuseShared::On), Error);
  const ForwardResult r = godd->forward(x4.data(), 4, FuseShared::Auto);
  EXPECT_FALSE(r.fused);
  expect_layer_matches_cpu(odd, *wodd, x4.data(), 4, r, FuseShared::Auto, "unfusable qwen2");
}

// Small shapes for compute-sanitizer (scripts/gpu_check.sh runs the tests named *Small* under
// memcheck, racecheck, initcheck and synccheck): both expert kernel variants, both fusion modes,
// the dispatch on its own.
TEST(GpuLayerSmall, SanitizerShapesBothKernels) {
  SKIP_WITHOUT_GPU();
  for (const std::string model : {"deepseek-v3", "qwen2-57b-a14b", "gpt-oss-120b"}) {
    const MoeSpec spec = small_spec(model, 128, 16, 64);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 2);
    cuda::GpuLayerOptions opt;
    opt.max_tokens = 20;
    for (const char* variant : kExpertKernels) {
      const auto gpu = create_with_kernel(*w, opt, variant);
      for (int tokens : {2, 7, 20}) {
        const std::vector<Bf16> x = random_x(tokens, spec.hidden, tokens);
        for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
          std::ostringstream what;
          what << spec.name << " T=" << tokens << " fuse=" << fuse_shared_name(fuse)
               << " kernel=" << variant;
          const ForwardResult g = gpu->forward(x.data(), tokens, fuse);
          expect_layer_matches_cpu(spec, *w, x.data(), tokens, g, fuse, what.str());
        }
      }
    }
    const RoutingConfig cfg = RoutingConfig::from_spec(spec, spec.can_fuse_shared());
    std::vector<float> logits(static_cast<size_t>(9) * cfg.logits_columns);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 37) % 23) * 0.1f;
    std::vector<float> bias(spec.num_experts, 0.25f);
    cuda::GpuDispatch d;
    const Routing g = cuda::route_on_device(cfg, logits.data(), 9, bias.data(), 8, &d);
    EXPECT_EQ(g.ids, cpu_reference::route(cfg, logits.data(), 9, bias.data()).ids) << model;
    EXPECT_FALSE(d.id_out_of_range) << model;
  }
}

// The bulk gate/up kernel's dynamic tail at its extremes and between: no claims (static ranges
// only), some, and every item claimed (no static range). Each against the CPU reference, and a
// forward repeated bit for bit (the claims land differently each time, the results do not).
TEST(GpuLayerSmall, BulkDynamicTailAtEveryShare) {
  SKIP_WITHOUT_GPU();
  for (const std::string model : {"deepseek-v3", "qwen3-30b-a3b"}) {
    const MoeSpec spec = small_spec(model, 128, 16, 64);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 12);
    cuda::GpuLayerOptions opt;
    opt.max_tokens = 20;
    for (const char* tail : {"0", "30", "100"}) {
      const auto gpu = create_bulk_with_knob(*w, opt, "MOEKIT_EXPERTS_TAIL", tail);
      for (int tokens : {1, 7, 20}) {
        const std::vector<Bf16> x = random_x(tokens, spec.hidden, 40 + tokens);
        for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
          std::ostringstream what;
          what << spec.name << " T=" << tokens << " fuse=" << fuse_shared_name(fuse)
               << " tail=" << tail << "%";
          const ForwardResult g = gpu->forward(x.data(), tokens, fuse);
          expect_layer_matches_cpu(spec, *w, x.data(), tokens, g, fuse, what.str());
          EXPECT_EQ(gpu->forward(x.data(), tokens, fuse).y, g.y) << what.str();
        }
      }
    }
  }
}

// The bulk down kernel's items of one partial k chunk, one full chunk (32 blocks of 64), and a
// full chunk and one block (two stages per item). Small shapes, so that the sanitizer runs
// (small shapes only) cover the multi-stage down items that the real shapes take.
TEST(GpuLayerSmall, BulkDownItemsOfOneAndTwoStages) {
  SKIP_WITHOUT_GPU();
  for (int inter : {64, 2048, 2112}) {
    const MoeSpec spec = small_spec("deepseek-v3", 128, 16, inter);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 15);
    cuda::GpuLayerOptions opt;
    opt.max_tokens = 20;
    const auto gpu = create_with_kernel(*w, opt, "bulk");
    for (int tokens : {1, 7, 20}) {
      const std::vector<Bf16> x = random_x(tokens, spec.hidden, 70 + tokens);
      for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
        std::ostringstream what;
        what << spec.name << " I=" << inter << " T=" << tokens << " fuse=" << fuse_shared_name(fuse);
        const ForwardResult g = gpu->forward(x.data(), tokens, fuse);
        expect_layer_matches_cpu(spec, *w, x.data(), tokens, g, fuse, what.str());
      }
    }
  }
}

// The fused shared experts' gate/up items issued before the kernel waits for the dispatch, and
// not: one and two shared experts (DeepSeek-V2-Lite, Qwen2-57B's gated shared MLP as two slots),
// 8- and 16-token chunks (T=300). Each against the CPU reference, and bit for bit equal (the
// items are the same, only their order and CTAs change).
TEST(GpuLayerSmall, BulkSharedExpertsFirstOrAfterTheWait) {
  SKIP_WITHOUT_GPU();
  for (const std::string model : {"deepseek-v3", "deepseek-v2-lite", "qwen2-57b-a14b"}) {
    const MoeSpec spec = small_spec(model, 128, 16, 64);
    ASSERT_GT(spec.shared_slots(), 0) << model;
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 13);
    cuda::GpuLayerOptions opt;
    opt.max_tokens = 300;
    expect_knob_keeps_the_output(spec, *w, opt, "MOEKIT_EXPERTS_SHARED_FIRST", "0", "300",
                                 {1, 7, 20, 300}, FuseShared::On, 50);
  }
}

// The bulk down kernel's 4 KB weight rows copied in two pieces (experts_down_split_tokens; the
// scaled-down shapes' rows are shorter, so this one's inter is DeepSeek-V3's 2048: one 4 KB
// chunk per row): against the CPU reference, and bit for bit equal to one copy per row (the
// same bytes land in the same shared memory).
TEST(GpuLayerSmall, BulkDownWeightRowsInTwoCopies) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3", 128, 16, 2048);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 17);
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 8;
  expect_knob_keeps_the_output(spec, *w, opt, "MOEKIT_EXPERTS_DOWN_SPLIT", "0", "8", {1, 2, 7},
                               FuseShared::Auto, 60);
}

// The split-row down instance with a dynamic tail (MOEKIT_EXPERTS_DOWN_TAIL forced at <= 8
// tokens, where the split-row instance takes 4 KB rows): bit for bit equal to static ranges,
// fused and unfused, at 1, 2 and 7 tokens.
TEST(GpuLayerSmall, BulkDownWeightRowsInTwoCopiesWithDynamicTail) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3", 128, 16, 2048);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 19);
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 8;
  expect_knob_values_keep_the_output(spec, *w, opt, "MOEKIT_EXPERTS_DOWN_TAIL", "0", {"50", "100"},
                                     {1, 2, 7}, 65);
}

// The bulk down kernel's deep ring (4 stages of 2 KB chunks, experts_down_deep_tokens; rows of
// <= 2 KB: inter 768, as Qwen3-30B-A3B): against the CPU reference and bit for bit equal to the
// 2-stage ring (a warp takes the same k blocks in the same order). Forced at 40 tokens too (not
// a default): two tasks of one expert.
TEST(GpuLayerSmall, BulkDownDeepRing) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("qwen3-30b-a3b", 256, 16, 768);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 23);
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 40;
  expect_knob_keeps_the_output(spec, *w, opt, "MOEKIT_EXPERTS_DOWN_DEEP", "0", "64", {1, 7, 40},
                               FuseShared::Auto, 70);
}

// The bulk kernels' one-token rings (experts_down_one_token_ring, experts_gate_up_one_token_ring,
// experts_down_wide_one_token_ring): against the CPU reference and bit for bit equal to the rings
// they replace (a warp takes the same k blocks in the same order; the down kernel's 12 blocks:
// warps 0-3 two, 4-7 one). The down kernel's 1.5 KB rows go one copy per tile; the self-routing
// gate/up kernel's rows one copy per 8 rows at hidden 2048 (4 KB rows), a copy per row at the
// unpadded pitch at 256 (512 bytes) and at 2240 (a 4 KB chunk and a 384-byte one). The down
// kernel's 4 KB rows (inter 2048, as DeepSeek-V3) one 64 KB copy per tile, in place of the split
// copies. The gate/up kernel with the routing kernel before it (shared experts) at hidden 2240
// (at 256, one chunk, it keeps the standard ring), with whole and (forced) half items; fused and
// unfused (the routed launches; the shared MLP's own launches keep their rings). At 2 tokens the
// rings are off in both layers; one token again after it (the buffers reused).
TEST(GpuLayerSmall, OneTokenRings) {
  SKIP_WITHOUT_GPU();
  for (int hidden : {2048, 256, 2240}) {
    const MoeSpec spec = small_spec("qwen3-30b-a3b", hidden, 16, 768);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 37);
    cuda::GpuLayerOptions opt;
    opt.max_tokens = 8;
    expect_knob_keeps_the_output(spec, *w, opt, "MOEKIT_EXPERTS_ONE_TOKEN_RING", "0", "1",
                                 {1, 2, 1}, FuseShared::Auto, 95);
  }
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 8;
  for (int hidden : {256, 2240}) {
    const MoeSpec spec = small_spec("deepseek-v3", hidden, 16, 2048);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 41);
    expect_knob_values_keep_the_output(spec, *w, opt, "MOEKIT_EXPERTS_ONE_TOKEN_RING", "0", {"1"},
                                       {1, 2, 1}, 105);
  }
  const MoeSpec spec = small_spec("deepseek-v3", 2240, 16, 256);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 43);
  setenv("MOEKIT_EXPERTS_HALF_ITEMS", "1", 1);
  expect_knob_values_keep_the_output(spec, *w, opt, "MOEKIT_EXPERTS_ONE_TOKEN_RING", "0", {"1"},
                                     {1, 2, 1}, 110);
  unsetenv("MOEKIT_EXPERTS_HALF_ITEMS");
}

// Both bulk kernels' ring of weights only (experts_l2_acts_ring: from 2 tokens while tasks are
// short, down rows of 3-4 KB, and from 8 tokens for rows of <= 2 KB): the consumers load their
// activation fragments themselves, the k blocks and their order per warp are the standard
// ring's (and the deep ring's, the split copies', the half items'), so bit for bit the same
// output. Gate/up rows of one chunk (hidden 256) and of several with a narrower last one
// (2240); down rows of 3 and 4 KB, and Qwen3-30B-A3B's 1.5 KB (the deep ring when off); fused and
// unfused; then with its dynamic-tail and L2-keeping twins forced.
TEST(GpuLayerSmall, BulkWeightsOnlyRing) {
  SKIP_WITHOUT_GPU();
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 32;
  for (int hidden : {256, 2240}) {
    for (int inter : {1536, 2048}) {
      const MoeSpec spec = small_spec("deepseek-v3", hidden, 16, inter);
      const auto w = make_random_weights(spec, spec.moe_layers.front(), 47);
      expect_knob_values_keep_the_output(spec, *w, opt, "MOEKIT_EXPERTS_L2_ACTS", "0", {"32"},
                                         {2, 7, 32}, 120);
    }
  }
  const MoeSpec qwen = small_spec("qwen3-30b-a3b", 2048, 16, 768);
  const auto wq = make_random_weights(qwen, qwen.moe_layers.front(), 53);
  expect_knob_keeps_the_output(qwen, *wq, opt, "MOEKIT_EXPERTS_L2_ACTS", "0", "32", {8, 32},
                               FuseShared::Auto, 125);
  const MoeSpec spec = small_spec("deepseek-v3", 2240, 16, 2048);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 59);
  setenv("MOEKIT_EXPERTS_DOWN_TAIL", "50", 1);
  expect_knob_values_keep_the_output(spec, *w, opt, "MOEKIT_EXPERTS_L2_ACTS", "0", {"32"},
                                     {2, 9, 32}, 130);
  setenv("MOEKIT_EXPERTS_L2_KEEP_FROM", "1", 1);
  expect_knob_keeps_the_output(spec, *w, opt, "MOEKIT_EXPERTS_L2_ACTS", "0", "32", {9, 32},
                               FuseShared::On, 135);
  unsetenv("MOEKIT_EXPERTS_L2_KEEP_FROM");
  unsetenv("MOEKIT_EXPERTS_DOWN_TAIL");
}

// The ring of weights only and its dynamic-tail and L2-keeping twins at shapes small enough for
// racecheck (the test above takes minutes under it): 512 gate/up and 256 down items of 16 rows
// over the 132 CTAs at 9 and 40 tokens, so each CTA's 3 stages wrap around; then down rows of two
// chunks. Against the CPU reference and bit for bit equal to the standard ring.
TEST(GpuLayerSmall, BulkWeightsOnlyRingSanitizerShapes) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3", 256, 16, 256);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 61);
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 40;
  expect_knob_values_keep_the_output(spec, *w, opt, "MOEKIT_EXPERTS_L2_ACTS", "0", {"40"}, {9, 40},
                                     140);
  setenv("MOEKIT_EXPERTS_DOWN_TAIL", "50", 1);
  setenv("MOEKIT_EXPERTS_L2_KEEP_FROM", "1", 1);
  expect_knob_keeps_the_output(spec, *w, opt, "MOEKIT_EXPERTS_L2_ACTS", "0", "40", {9, 40},
                               FuseShared::On, 145);
  unsetenv("MOEKIT_EXPERTS_L2_KEEP_FROM");
  unsetenv("MOEKIT_EXPERTS_DOWN_TAIL");
  // down rows of two chunks (5 KB), 4 experts: the gate/up ring wraps, each down item is 2 stages
  const MoeSpec wide = small_spec("gpt-oss-120b", 256, 4, 2560);
  const auto ww = make_random_weights(wide, wide.moe_layers.front(), 63);
  expect_knob_keeps_the_output(wide, *ww, opt, "MOEKIT_EXPERTS_L2_ACTS", "0", "40", {2, 9},
                               FuseShared::Off, 147);
}

// The ring of weights only for down rows of more than 4 KB, two and seven 4 KB chunks a row
// (gpt-oss-120b's 5.6 KB with its clamped activation and biases, Qwen2-57B-A14B's 5 KB with its
// gated shared expert, Mixtral's 28 KB), the last chunk narrower; then with the down tail forced
// and gate/up rows of several chunks too. Bit for bit the standard ring's output (its k blocks
// and their order per warp), and against the CPU reference.
TEST(GpuLayerSmall, BulkWeightsOnlyRingWideRows) {
  SKIP_WITHOUT_GPU();
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 16;
  const std::pair<const char*, int> shapes[] = {
      {"gpt-oss-120b", 2880}, {"qwen2-57b-a14b", 2560}, {"mixtral-8x7b", 14336}};
  for (const auto& [model, inter] : shapes) {
    SCOPED_TRACE(model);
    const MoeSpec spec = small_spec(model, 256, 16, inter);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 67);
    for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
      if (fuse == FuseShared::Auto && spec.shared_intermediate == 0) continue;  // (the same path)
      expect_knob_keeps_the_output(spec, *w, opt, "MOEKIT_EXPERTS_L2_ACTS", "0", "16", {2, 7, 16},
                                   fuse, 150);
    }
  }
  const MoeSpec spec = small_spec("qwen2-57b-a14b", 2240, 16, 2560);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 71);
  setenv("MOEKIT_EXPERTS_DOWN_TAIL", "50", 1);
  expect_knob_values_keep_the_output(spec, *w, opt, "MOEKIT_EXPERTS_L2_ACTS", "0", {"16"},
                                     {2, 9, 16}, 155);
  unsetenv("MOEKIT_EXPERTS_DOWN_TAIL");
}

// Both bulk kernels' tasks of up to 16 tokens (experts_task16_ring: chunk 16 through the ring of
// weights only, each consumer warp running both n-tiles on every weight fragment): bit for bit
// the output of tasks of 8 (per token the same k blocks in the same order per warp, and an mma's
// column does not depend on the other columns), and against the CPU reference. 16 experts: at 9
// tokens tasks of 1-8 tokens (the second n-tile idle), at 40 of 16 and a rest (two tasks per
// expert), the fused shared expert's of 16, 16 and 8; gate/up and down rows of one 512-byte
// chunk; fused and unfused. Small enough for racecheck; wider rows below.
TEST(GpuLayerSmall, BulkTasksOf16Tokens) {
  SKIP_WITHOUT_GPU();
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 40;
  const MoeSpec spec = small_spec("deepseek-v3", 256, 16, 256);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 79);
  expect_knob_values_keep_the_output(spec, *w, opt, "MOEKIT_EXPERTS_TASK16", "0", {"1"},
                                     {9, 16, 40}, 170);
}

// The same for wider rows: gate/up rows of several 4 KB chunks with a narrower last (hidden 2240)
// beside down rows of one (DeepSeek-V3's 4 KB); down rows of several (gpt-oss-120b's 5.6 KB with
// its clamped activation and biases, Qwen2-57B-A14B's 5 KB with its gated shared expert as two
// slots, Mixtral's 28 KB over 8 experts: 10 tokens per expert at 40); fused where the model has a
// shared expert, and unfused.
TEST(GpuLayerSmall, BulkTasksOf16TokensWideRows) {
  SKIP_WITHOUT_GPU();
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 40;
  const std::tuple<const char*, int, int, int> shapes[] = {{"deepseek-v3", 2240, 16, 2048},
                                                           {"gpt-oss-120b", 256, 16, 2880},
                                                           {"qwen2-57b-a14b", 256, 16, 2560},
                                                           {"mixtral-8x7b", 256, 8, 14336}};
  for (const auto& [model, hidden, experts, inter] : shapes) {
    SCOPED_TRACE(model);
    const MoeSpec spec = small_spec(model, hidden, experts, inter);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 83);
    for (FuseShared fuse : {FuseShared::Off, FuseShared::On}) {
      if (fuse == FuseShared::On && spec.shared_intermediate == 0) continue;  // (the same path)
      expect_knob_keeps_the_output(spec, *w, opt, "MOEKIT_EXPERTS_TASK16", "0", "1", {9, 40}, fuse,
                                   175);
    }
  }
}

// The unfused shared MLP as dense cuBLAS GEMMs (MOEKIT_SHARED_DENSE, src/cuda/layer/shared_dense.h)
// for each kind of shared expert: DeepSeek-V3's (SiLU), DeepSeek-V4-Flash's (clamped SiLU),
// Qwen2-57B-A14B's (sigmoid-gated, twice the routed width) and MiniMax-M3's (swigluoai). Against
// the CPU reference (the sums' order differs from the expert kernels', so not bit for bit), below
// and from its token limit, and captured in a CUDA graph (cuBLAS with its fixed workspace) equal
// to the eager forward.
TEST(GpuLayerSmall, SharedDenseMlp) {
  SKIP_WITHOUT_GPU();
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 40;
  for (const char* model : {"deepseek-v3", "deepseek-v4-flash", "qwen2-57b-a14b", "minimax-m3"}) {
    SCOPED_TRACE(model);
    const MoeSpec spec = small_spec(model, 256, 16, 128);
    ASSERT_GT(spec.shared_intermediate, 0);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 73);
    const auto gpu = [&] {
      const ScopedEnv dense("MOEKIT_SHARED_DENSE", "9");
      return cuda::GpuMoeLayer::create(*w, opt);
    }();
    for (int t : {1, 9, 40}) {
      const std::vector<Bf16> x = random_x(t, spec.hidden, 160 + t);
      const ForwardResult g = gpu->forward(x.data(), t, FuseShared::Off);
      expect_layer_matches_cpu(spec, *w, x.data(), t, g, FuseShared::Off,
                               spec.name + " T=" + std::to_string(t) + " MOEKIT_SHARED_DENSE=9");
    }
    expect_graph_replay_equals_forward(*gpu, spec, 40, FuseShared::Off, 165);
    // the dense path taken: cuBLAS' GEMMs (>= 1 kernel each) and the activation kernel in place
    // of the two expert kernels
    const auto plain = [&] {
      const ScopedEnv never("MOEKIT_SHARED_DENSE", "0");
      return cuda::GpuMoeLayer::create(*w, opt);
    }();
    EXPECT_GE(gpu->count_launches(40, false).kernels, plain->count_launches(40, false).kernels + 1);
  }
}

// The bulk kernels' instances that keep weight rows read again by the expert's next task in L2
// (experts_l2_keep, forced here from 1 token at this small hidden size): a cache hint only, so
// bit for bit the same output; at 40 tokens over 16 experts most experts have two tasks, and the
// fused shared expert five; fused and unfused (the shared MLP's own tasks also re-read it).
TEST(GpuLayerSmall, BulkL2KeepForExpertsWithSeveralTasks) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3", 256, 16, 256);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 29);
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 40;
  for (FuseShared fuse : {FuseShared::On, FuseShared::Off}) {
    expect_knob_keeps_the_output(spec, *w, opt, "MOEKIT_EXPERTS_L2_KEEP_FROM", "0", "1",
                                 {1, 9, 40}, fuse, 80);
  }
}

// The bulk down kernel's dynamic tail (kTail instance: the last tiles' items claimed one by one,
// combined after every CTA has written its partials): against the CPU reference and bit for bit
// equal to static ranges (each output is the same slot-ordered sum, whichever CTA wrote the
// partials). 256 rows are 16 tiles: 50% makes 8 tail tiles; 100% leaves no static items at all;
// with the L2-keeping instance (forced at these sizes) too; fused and unfused.
TEST(GpuLayerSmall, BulkDownDynamicTailTiles) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3", 256, 16, 256);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 31);
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 40;
  expect_knob_values_keep_the_output(spec, *w, opt, "MOEKIT_EXPERTS_DOWN_TAIL", "0", {"50", "100"},
                                     {1, 9, 40}, 90);
  setenv("MOEKIT_EXPERTS_L2_KEEP_FROM", "1", 1);
  expect_knob_keeps_the_output(spec, *w, opt, "MOEKIT_EXPERTS_DOWN_TAIL", "0", "50", {9, 40},
                               FuseShared::On, 95);
  unsetenv("MOEKIT_EXPERTS_L2_KEEP_FROM");
}

// The bulk gate/up kernel's half items (kHalves instance: the dynamic tail's last items claimed
// as two halves of 4 h rows each): against the CPU reference and bit for bit equal to whole
// items (each h row is the same sum, only its weight rows are copied in another item). 2 per CTA
// (at 40 tokens whole tail items, then halves; at 1 and 9 the whole tail halved) and 16 per CTA
// (every tail item halved); fused and unfused (the shared MLP's gate/up launch halves its tail
// too).
TEST(GpuLayerSmall, BulkGateUpHalfTailItems) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3", 256, 16, 256);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 37);
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 40;
  expect_knob_values_keep_the_output(spec, *w, opt, "MOEKIT_EXPERTS_HALF_ITEMS", "0", {"2", "16"},
                                     {1, 9, 40}, 100);
}

// No routing kernel at one token (MOEKIT_EXPERTS_SELF_ROUTE=1): the gate/up kernel routes its
// token from the logits and its CTA 0 writes the routing and dispatch for the down kernel. Against
// the CPU reference and bit for bit equal to the routing kernel's path, with two forwards at one
// token (the second claims its dynamic tail from the work counter the first left zeroed) before
// and one after a forward at 9 tokens (the routing kernel's) in the same layer; models
// without shared experts: softmax + renormalise (Qwen3), router bias + softmax of the top-k +
// clamped SwiGLU (gpt-oss), 8 experts (Mixtral). 3 launches at one token, 4 at two.
TEST(GpuLayerSmall, SelfRoutedGateUpAtOneToken) {
  SKIP_WITHOUT_GPU();
  for (const char* model : {"qwen3-30b-a3b", "gpt-oss-120b", "mixtral-8x7b"}) {
    const MoeSpec spec = small_spec(model, 256, model == std::string("mixtral-8x7b") ? 8 : 16, 128);
    ASSERT_EQ(spec.shared_slots(), 0) << model;
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 43);
    cuda::GpuLayerOptions opt;
    opt.max_tokens = 9;
    expect_knob_keeps_the_output(spec, *w, opt, "MOEKIT_EXPERTS_SELF_ROUTE", "0", "1",
                                 {1, 1, 9, 1}, FuseShared::Auto, 120);
    const auto gpu = create_bulk_with_knob(*w, opt, "MOEKIT_EXPERTS_SELF_ROUTE", "1");
    EXPECT_EQ(gpu->count_launches(1, false).kernels, 3) << model;
    EXPECT_EQ(gpu->count_launches(2, false).kernels, 4) << model;
  }
}

// ---- routing + dispatch alone, on constructed logits ----

// Tie-free logits: a per-token permutation of evenly spaced values (0.05 apart).
std::vector<float> tie_free_logits(int tokens, int cols, uint64_t seed) {
  std::vector<float> out(static_cast<size_t>(tokens) * cols);
  const uint64_t s = random_values::stream_key(seed, 0, random_values::Tensor::Input, 0);
  for (int t = 0; t < tokens; ++t) {
    std::vector<int> perm(cols);
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = cols - 1; i > 0; --i) {
      const uint64_t r = random_values::mix64(s ^ (static_cast<uint64_t>(t) * 1000003 + i));
      std::swap(perm[i], perm[r % (i + 1)]);
    }
    for (int e = 0; e < cols; ++e) out[static_cast<size_t>(t) * cols + e] = (perm[e] - cols / 2) * 0.05f;
  }
  return out;
}

void check_dispatch(const Routing& r, const cuda::GpuDispatch& d, int rows, int chunk,
                    const std::string& what) {
  const int pairs = r.tokens * r.slots;
  EXPECT_FALSE(d.id_out_of_range) << what;
  std::vector<int> sorted = d.pair_list;
  std::sort(sorted.begin(), sorted.end());
  for (int q = 0; q < pairs; ++q) ASSERT_EQ(sorted[q], q) << what << ": pair list is not a permutation";
  std::vector<int> count(rows, 0);
  for (int id : r.ids) count[id]++;
  int expect_tasks = 0;
  for (int n : count) expect_tasks += (n + chunk - 1) / chunk;
  EXPECT_EQ(d.num_tasks, expect_tasks) << what;
  int covered = 0;
  for (int i = 0; i < d.num_tasks; ++i) {
    EXPECT_GE(d.task_count[i], 1) << what;
    EXPECT_LE(d.task_count[i], chunk) << what;
    for (int j = 0; j < d.task_count[i]; ++j) {
      const int q = d.pair_list[d.task_begin[i] + j];
      ASSERT_EQ(r.ids[q], d.task_expert[i]) << what << ": task " << i << " holds pair " << q;
    }
    covered += d.task_count[i];
    const bool next_same = i + 1 < d.num_tasks && d.task_expert[i + 1] == d.task_expert[i];
    EXPECT_EQ(d.task_more[i], next_same ? 1 : 0) << what << ": task " << i;
  }
  EXPECT_EQ(covered, pairs) << what;
  EXPECT_EQ(d.num_shared_tasks, (r.tokens + chunk - 1) / chunk) << what;
}

TEST(GpuRouting, ExactIdsOnTieFreeAndTiedLogitsEveryFamily) {
  SKIP_WITHOUT_GPU();
  for (const auto& model : kModels) {
    for (const bool fused : {false, true}) {
      for (int experts : {32, 256}) {
        const MoeSpec spec = small_spec(model, 256, experts, 128);
        if (fused && !spec.can_fuse_shared()) continue;
        const RoutingConfig cfg = RoutingConfig::from_spec(spec, fused);
        for (int tokens : {1, 7, 300}) {
          std::ostringstream what;
          what << model << " E=" << experts << " fused=" << fused << " T=" << tokens;
          SCOPED_TRACE(what.str());
          std::vector<float> bias(spec.num_experts);
          for (int e = 0; e < spec.num_experts; ++e) bias[e] = ((e * 7) % 5) * 0.0625f;
          // tie-free
          std::vector<float> logits = tie_free_logits(tokens, cfg.logits_columns, tokens);
          for (const int chunk : {8, 16, 32}) {
            cuda::GpuDispatch d;
            const Routing g = cuda::route_on_device(cfg, logits.data(), tokens, bias.data(),
                                                    chunk, &d);
            const Routing c = cpu_reference::route(cfg, logits.data(), tokens, bias.data());
            ASSERT_EQ(g.ids, c.ids);
            for (size_t i = 0; i < c.weights.size(); ++i) {
              ASSERT_NEAR(g.weights[i], c.weights[i], 1e-5 * std::fabs(c.weights[i]) + 1e-7)
                  << "pair " << i;
            }
            EXPECT_EQ(g.shared_scale.size(), c.shared_scale.size());
            for (size_t t = 0; t < c.shared_scale.size(); ++t) {
              ASSERT_NEAR(g.shared_scale[t], c.shared_scale[t], 1e-6) << "token " << t;
            }
            check_dispatch(g, d, spec.num_experts + cfg.shared_slots, chunk, what.str());
          }
          // exact ties everywhere: three logit levels, lower id must win on both sides
          for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 3) * 0.5f;
          const Routing g = cuda::route_on_device(cfg, logits.data(), tokens, bias.data());
          const Routing c = cpu_reference::route(cfg, logits.data(), tokens, bias.data());
          ASSERT_EQ(g.ids, c.ids) << "tied logits";
        }
      }
    }
  }
}

TEST(GpuRouting, ExtremeBiasesKeepUnbiasedWeights) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3", 256, 256, 128);
  const RoutingConfig cfg = RoutingConfig::from_spec(spec, true);
  const int tokens = 16;
  std::vector<float> logits = tie_free_logits(tokens, cfg.logits_columns, 3);
  for (float& v : logits) v = v * 4.0f - 18.0f;  // scores ~1e-8..1e-6
  std::vector<float> bias(spec.num_experts);
  for (int e = 0; e < spec.num_experts; ++e) bias[e] = (e % 2 ? 12.0f : -12.0f) + e * 1e-3f;
  const Routing g = cuda::route_on_device(cfg, logits.data(), tokens, bias.data());
  const Routing c = cpu_reference::route(cfg, logits.data(), tokens, bias.data());
  ASSERT_EQ(g.ids, c.ids);
  for (size_t i = 0; i < c.weights.size(); ++i) {
    EXPECT_GT(g.weights[i], 0.0f) << "pair " << i << ": weight from key - bias would be 0";
    EXPECT_NEAR(g.weights[i], c.weights[i], 1e-5 * std::fabs(c.weights[i])) << "pair " << i;
  }
}

// ---- DeepSeek-V3 at its real shape, weights generated on the GPU ----

TEST(GpuLayerRealShape, DeepSeekV3MatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = load_spec("deepseek-v3");
  const int layer = spec.moe_layers.front();
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 9;
  const auto gpu = cuda::GpuMoeLayer::create_random(spec, layer, 21, opt);
  const auto w = make_random_weights(spec, layer, 21);  // lazy: only touched experts are made
  // auto: fused up to 16 tokens; from 17 its slots would read the 88 MB of shared weights three
  // times (the dense shared MLP exists from 8 tokens, so at 9 too)
  EXPECT_TRUE(gpu->resolve_fused(FuseShared::Auto, 9));
  EXPECT_TRUE(gpu->resolve_fused(FuseShared::Auto, 16));
  EXPECT_FALSE(gpu->resolve_fused(FuseShared::Auto, 17));
  // (9: the down kernel's dynamic tail, experts_down_tail, which needs >= 7168 rows; unfused,
  // the dense shared MLP)
  for (int tokens : {1, 7, 9}) {
    const std::vector<Bf16> x = random_x(tokens, spec.hidden, 30 + tokens);
    for (FuseShared fuse : {FuseShared::On, FuseShared::Off}) {
      std::ostringstream what;
      what << "deepseek-v3 T=" << tokens << " fuse=" << fuse_shared_name(fuse);
      SCOPED_TRACE(what.str());
      const ForwardResult g = gpu->forward(x.data(), tokens, fuse);
      expect_routing_matches_cpu(spec, *w, gpu->last_logits(tokens), g, what.str());
      expect_layer_matches_cpu(spec, *w, x.data(), tokens, g, fuse, what.str());
    }
  }
}

// Qwen3-30B-A3B at its real shape: its 128 output tiles of the down GEMM fit the H200's 132 SMs,
// so at <= 4 tokens the bulk down kernel runs one CTA per whole tile (experts_down_grid), a path
// the scaled-down shapes never take; against the CPU reference and bit for bit equal to the
// resident grid (MOEKIT_EXPERTS_WHOLE_TILES=0), whose tiles straddle CTAs.
TEST(GpuLayerRealShape, Qwen3WholeTileDownMatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = load_spec("qwen3-30b-a3b");
  const int layer = spec.moe_layers.front();
  const auto w = make_random_weights(spec, layer, 23);
  cuda::GpuLayerOptions opt;
  opt.max_tokens = 8;
  expect_knob_keeps_the_output(spec, *w, opt, "MOEKIT_EXPERTS_WHOLE_TILES", "0", "8", {1, 2, 4, 7},
                               FuseShared::Off, 40);
}

// ---- the expert-kernel variant choice (host code: runs without a GPU) ----

TEST(ExpertsVariant, OverrideParsesItsValuesAndNamesABadOne) {
  unsetenv("MOEKIT_EXPERTS_KERNEL");
  EXPECT_FALSE(cuda::experts_stream_override().has_value());
  const std::pair<const char*, cuda::ExpertsStream> values[] = {
      {"regs", cuda::ExpertsStream::Registers},
      {"regs-early", cuda::ExpertsStream::RegistersEarlyActs},
      {"bulk", cuda::ExpertsStream::Bulk},
      {"persistent", cuda::ExpertsStream::Persistent}};
  for (const auto& [name, stream] : values) {
    setenv("MOEKIT_EXPERTS_KERNEL", name, 1);
    EXPECT_EQ(cuda::experts_stream_override(), stream) << name;
  }
  setenv("MOEKIT_EXPERTS_KERNEL", "ring", 1);  // the removed cp.async variant
  test::expect_error(
      [] { cuda::experts_stream_override(); },
      {"MOEKIT_EXPERTS_KERNEL='ring' (expected regs, regs-early, bulk or persistent)"});
  unsetenv("MOEKIT_EXPERTS_KERNEL");
}

// Sets environment variable `name` to each of `good` and expects `parse` to return it, then to
// each of `bad` and expects an error naming the variable, the value and `expected`; unsets it.
void expect_env_int_knob(const char* name, int (*parse)(), std::initializer_list<int> good,
                         std::initializer_list<const char*> bad, const std::string& expected) {
  for (int v : good) {
    setenv(name, std::to_string(v).c_str(), 1);
    EXPECT_EQ(parse(), v) << name;
  }
  for (const char* v : bad) {
    setenv(name, v, 1);
    test::expect_error([&] { parse(); },
                       {std::string(name) + "='" + v + "' (expected " + expected + ")"});
  }
  unsetenv(name);
}

TEST(ExpertsVariant, DynamicTailParsesAPercentageAndNamesABadOne) {
  unsetenv("MOEKIT_EXPERTS_TAIL");
  const int fallback = cuda::experts_dynamic_tail_percent();
  EXPECT_GE(fallback, 0);
  EXPECT_LE(fallback, 100);
  expect_env_int_knob("MOEKIT_EXPERTS_TAIL", cuda::experts_dynamic_tail_percent, {0, 15, 100},
                      {"101", "-1", "15%", "x"}, "a percentage, 0 to 100");
}

TEST(ExpertsVariant, DownSplitParsesATokenCountAndNamesABadOne) {
  unsetenv("MOEKIT_EXPERTS_DOWN_SPLIT");
  EXPECT_GE(cuda::experts_down_split_tokens(), 1);  // on at one token by default
  expect_env_int_knob("MOEKIT_EXPERTS_DOWN_SPLIT", cuda::experts_down_split_tokens, {0, 8, 256},
                      {"-1", "on", "8 tokens"}, "a token count, 0 (never) to 1048576");
}

TEST(ExpertsVariant, DownRowsInTwoCopiesOnlyUpToTheLimitAndFor4KBRows) {
  EXPECT_EQ(cuda::experts_down_copy_pieces(1, 2048, 8), 2);  // DeepSeek-V3, Kimi-K2
  EXPECT_EQ(cuda::experts_down_copy_pieces(8, 2048, 8), 2);
  EXPECT_EQ(cuda::experts_down_copy_pieces(9, 2048, 8), 1);  // more tokens than the limit
  EXPECT_EQ(cuda::experts_down_copy_pieces(1, 2048, 0), 1);  // turned off
  EXPECT_EQ(cuda::experts_down_copy_pieces(1, 768, 8), 1);   // Qwen3-30B-A3B: 1.5 KB rows
  EXPECT_EQ(cuda::experts_down_copy_pieces(1, 1024, 8), 1);  // 2 KB rows: the deep ring
  EXPECT_EQ(cuda::experts_down_copy_pieces(1, 1536, 8), 1);  // MiniMax-M2, GLM-4.5: 3 KB rows
  EXPECT_EQ(cuda::experts_down_copy_pieces(1, 2880, 8), 1);  // gpt-oss: 5.6 KB rows lost 6-7%
  EXPECT_EQ(cuda::experts_down_copy_pieces(1, 2560, 8), 1);  // Qwen2-57B: 5 KB rows lost 8-9%
}

TEST(ExpertsVariant, DownDeepParsesATokenCountAndNamesABadOne) {
  unsetenv("MOEKIT_EXPERTS_DOWN_DEEP");
  EXPECT_GE(cuda::experts_down_deep_tokens(), 1);  // on at one token by default
  expect_env_int_knob("MOEKIT_EXPERTS_DOWN_DEEP", cuda::experts_down_deep_tokens, {0, 8, 256},
                      {"-1", "on", "8 tokens"}, "a token count, 0 (never) to 1048576");
}

TEST(ExpertsVariant, DownDeepRingOnlyUpToTheLimitAndFor2KBRows) {
  EXPECT_TRUE(cuda::experts_down_deep_ring(1, 768, 8));    // Qwen3-30B-A3B: 1.5 KB rows
  EXPECT_TRUE(cuda::experts_down_deep_ring(8, 1024, 8));   // 2 KB rows
  EXPECT_FALSE(cuda::experts_down_deep_ring(9, 768, 8));   // more tokens than the limit
  EXPECT_FALSE(cuda::experts_down_deep_ring(1, 768, 0));   // turned off
  EXPECT_FALSE(cuda::experts_down_deep_ring(1, 1536, 8));  // 3 KB rows: the wide ring
  EXPECT_FALSE(cuda::experts_down_deep_ring(1, 2048, 8));  // DeepSeek-V3: split copies instead
}

TEST(ExpertsVariant, OneTokenRingParsesZeroOrOneAndNamesABadOne) {
  unsetenv("MOEKIT_EXPERTS_ONE_TOKEN_RING");
  EXPECT_EQ(cuda::experts_one_token_ring_setting(), 1);  // on by default
  expect_env_int_knob("MOEKIT_EXPERTS_ONE_TOKEN_RING", cuda::experts_one_token_ring_setting, {0, 1},
                      {"2", "-1", "on"}, "0 or 1");
}

TEST(ExpertsVariant, OneTokenRingsOnlyAtOneTokenAndForTheRowsMeasured) {
  EXPECT_TRUE(cuda::experts_down_one_token_ring(1, 768, 1));    // Qwen3-30B-A3B
  EXPECT_FALSE(cuda::experts_down_one_token_ring(2, 768, 1));   // two tokens: the deep ring
  EXPECT_FALSE(cuda::experts_down_one_token_ring(1, 1024, 1));  // 2 KB rows: the deep ring
  EXPECT_FALSE(cuda::experts_down_one_token_ring(1, 768, 0));   // turned off
  EXPECT_TRUE(cuda::experts_gate_up_one_token_ring(1, 7168, false, 1));   // DeepSeek-V3
  EXPECT_TRUE(cuda::experts_gate_up_one_token_ring(1, 2880, true, 1));    // gpt-oss, self-routed
  EXPECT_TRUE(cuda::experts_gate_up_one_token_ring(1, 2048, true, 1));    // Qwen3-30B-A3B
  EXPECT_FALSE(cuda::experts_gate_up_one_token_ring(1, 2048, false, 1));  // DeepSeek-V2-Lite
  EXPECT_FALSE(cuda::experts_gate_up_one_token_ring(2, 7168, false, 1));  // two tokens
  EXPECT_FALSE(cuda::experts_gate_up_one_token_ring(1, 7168, false, 0));  // turned off
  EXPECT_TRUE(cuda::experts_down_wide_one_token_ring(1, 2048, 1));   // DeepSeek-V3: 4 KB rows
  EXPECT_FALSE(cuda::experts_down_wide_one_token_ring(2, 2048, 1));  // two tokens: split copies
  EXPECT_FALSE(cuda::experts_down_wide_one_token_ring(1, 1536, 1));  // 3 KB rows: unmeasured
  EXPECT_FALSE(cuda::experts_down_wide_one_token_ring(1, 2880, 1));  // gpt-oss: two chunks a row
  EXPECT_FALSE(cuda::experts_down_wide_one_token_ring(1, 2048, 0));  // turned off
}

TEST(ExpertsVariant, L2ActsParsesATokenCountAndNamesABadOne) {
  unsetenv("MOEKIT_EXPERTS_L2_ACTS");
  EXPECT_EQ(cuda::experts_l2_acts_tokens(), -1);  // the measured rule
  expect_env_int_knob("MOEKIT_EXPERTS_L2_ACTS", cuda::experts_l2_acts_tokens, {0, 2, 128},
                      {"-1", "on", "32 tokens"}, "a token count, 0 (never) to 1048576");
}

TEST(ExpertsVariant, WeightsOnlyRingFromTwoTokensWhileTasksAreShort) {
  // the default (-1): tokens x top_k <= 2 x experts, or <= 3 x experts up to 48 tokens
  EXPECT_TRUE(cuda::experts_l2_acts_ring(2, 8, 2048, 8, 256, -1));  // DeepSeek-V3: 4 KB down rows
  EXPECT_TRUE(cuda::experts_l2_acts_ring(48, 8, 2048, 8, 256, -1));
  EXPECT_TRUE(cuda::experts_l2_acts_ring(64, 8, 2048, 8, 256, -1));    // 2 tokens per expert
  EXPECT_FALSE(cuda::experts_l2_acts_ring(65, 8, 2048, 8, 256, -1));   // more, above 48 tokens
  EXPECT_FALSE(cuda::experts_l2_acts_ring(128, 8, 2048, 8, 256, -1));  // +1.0%
  EXPECT_TRUE(cuda::experts_l2_acts_ring(96, 8, 2048, 8, 384, -1));    // Kimi-K2: 2 per expert
  EXPECT_FALSE(cuda::experts_l2_acts_ring(128, 8, 2048, 8, 384, -1));
  EXPECT_TRUE(cuda::experts_l2_acts_ring(2, 8, 1536, 8, 160, -1));    // GLM-4.5: 3 KB
  EXPECT_TRUE(cuda::experts_l2_acts_ring(48, 8, 1536, 8, 160, -1));   // 2.4 per expert
  EXPECT_FALSE(cuda::experts_l2_acts_ring(49, 8, 1536, 8, 160, -1));  // ... above 48 tokens
  EXPECT_TRUE(cuda::experts_l2_acts_ring(48, 8, 768, 8, 128, -1));    // Qwen3-30B-A3B: 3
  EXPECT_FALSE(cuda::experts_l2_acts_ring(49, 8, 768, 8, 128, -1));
  EXPECT_TRUE(cuda::experts_l2_acts_ring(8, 8, 768, 8, 128, -1));     // 1.5 KB rows from 8 tokens
  EXPECT_FALSE(cuda::experts_l2_acts_ring(4, 8, 768, 8, 128, -1));    // ... below: its deep ring
  EXPECT_FALSE(cuda::experts_l2_acts_ring(2, 8, 1024, 8, 128, -1));   // (2 KB rows likewise)
  EXPECT_TRUE(cuda::experts_l2_acts_ring(2, 8, 14336, 2, 8, -1));     // Mixtral: 28 KB rows
  EXPECT_TRUE(cuda::experts_l2_acts_ring(8, 8, 14336, 2, 8, -1));     // 2 per expert
  EXPECT_FALSE(cuda::experts_l2_acts_ring(13, 8, 14336, 2, 8, -1));   // more than 3: +4.9% at 32
  EXPECT_TRUE(cuda::experts_l2_acts_ring(64, 8, 2880, 4, 128, -1));   // gpt-oss: 5.6 KB rows
  EXPECT_FALSE(cuda::experts_l2_acts_ring(1, 8, 2048, 8, 256, -1));   // one token: its own rings
  EXPECT_FALSE(cuda::experts_l2_acts_ring(8, 16, 2048, 8, 256, -1));  // chunk 16: no instance
  // MOEKIT_EXPERTS_L2_ACTS=N: up to N tokens whatever the experts (the rows' exception stays)
  EXPECT_TRUE(cuda::experts_l2_acts_ring(128, 8, 2048, 8, 256, 128));
  EXPECT_FALSE(cuda::experts_l2_acts_ring(33, 8, 2048, 8, 256, 32));
  EXPECT_FALSE(cuda::experts_l2_acts_ring(8, 8, 2048, 8, 256, 0));  // turned off
  EXPECT_FALSE(cuda::experts_l2_acts_ring(4, 8, 768, 8, 128, 128));
}

TEST(ExpertsVariant, Task16ParsesTokensPerExpertAndNamesABadOne) {
  unsetenv("MOEKIT_EXPERTS_TASK16");
  EXPECT_EQ(cuda::experts_task16_setting(), -1);  // the measured rule
  expect_env_int_knob("MOEKIT_EXPERTS_TASK16", cuda::experts_task16_setting, {0, 1, 16},
                      {"-1", "on", "6 tokens"}, "routed tokens per expert, 0 (never) to 1048576");
}

TEST(ExpertsVariant, TasksOf16TokensFrom8RoutedTokensPerExpertUnlessForced) {
  // the default (-1): from 8 routed tokens per expert on average
  EXPECT_TRUE(cuda::experts_task16_ring(64, 8, 64, -1));  // Qwen2-57B-A14B: -11.5%
  EXPECT_FALSE(cuda::experts_task16_ring(63, 8, 64, -1));
  EXPECT_TRUE(cuda::experts_task16_ring(32, 2, 8, -1));      // Mixtral-8x7B: -13.8%
  EXPECT_TRUE(cuda::experts_task16_ring(128, 8, 128, -1));   // Qwen3-30B-A3B: -6.6%
  EXPECT_FALSE(cuda::experts_task16_ring(96, 8, 128, -1));   // 6 per expert: +2.5%
  EXPECT_TRUE(cuda::experts_task16_ring(256, 8, 256, -1));   // DeepSeek-V3: -4.5%
  EXPECT_FALSE(cuda::experts_task16_ring(192, 8, 256, -1));  // 6 per expert: -0.4%, noise
  EXPECT_FALSE(cuda::experts_task16_ring(256, 8, 384, -1));  // Kimi-K2: 5.3 per expert
  // MOEKIT_EXPERTS_TASK16=N: from N routed tokens per expert on average
  EXPECT_TRUE(cuda::experts_task16_ring(16, 8, 64, 2));   // Qwen2-57B-A14B: 2 per expert
  EXPECT_FALSE(cuda::experts_task16_ring(15, 8, 64, 2));  // 1.9
  EXPECT_TRUE(cuda::experts_task16_ring(32, 8, 256, 1));  // DeepSeek-V3: 1 per expert
  EXPECT_FALSE(cuda::experts_task16_ring(31, 8, 256, 1));
  EXPECT_FALSE(cuda::experts_task16_ring(8, 2, 8, 1));    // 8 tokens fill one task of 8
  EXPECT_TRUE(cuda::experts_task16_ring(1024, 2, 8, 1));  // (where the bulk kernels run)
  EXPECT_FALSE(cuda::experts_task16_ring(128, 2, 8, 0));  // turned off
}

TEST(ExpertsVariant, L2KeepFromParsesATokenCountAndNamesABadOne) {
  unsetenv("MOEKIT_EXPERTS_L2_KEEP_FROM");
  EXPECT_EQ(cuda::experts_l2_keep_from_tokens(), -1);
  expect_env_int_knob("MOEKIT_EXPERTS_L2_KEEP_FROM", cuda::experts_l2_keep_from_tokens,
                      {0, 1, 64}, {"-1", "on"}, "a token count, 0 (never) to 1048576");
}

TEST(ExpertsVariant, L2KeepFrom32TokensForWideHiddenOnlyUnlessForced) {
  EXPECT_TRUE(cuda::experts_l2_keep(128, 7168, 8, -1));    // DeepSeek-V3, Kimi-K2
  EXPECT_TRUE(cuda::experts_l2_keep(32, 5120, 8, -1));     // GLM-4.5
  EXPECT_FALSE(cuda::experts_l2_keep(31, 7168, 8, -1));    // too few tokens
  EXPECT_FALSE(cuda::experts_l2_keep(128, 4096, 8, -1));   // Qwen3-235B-A22B: +7.8% at 256
  EXPECT_FALSE(cuda::experts_l2_keep(256, 2048, 8, -1));   // Qwen3-30B-A3B: lost 4-5% at 256
  EXPECT_FALSE(cuda::experts_l2_keep(512, 7168, 16, -1));  // chunk 16: not measured
  EXPECT_TRUE(cuda::experts_l2_keep(1, 256, 8, 1));        // forced from 1 token, any hidden
  EXPECT_FALSE(cuda::experts_l2_keep(128, 7168, 8, 0));    // forced off
  EXPECT_FALSE(cuda::experts_l2_keep(512, 7168, 16, 1));   // chunk 16 even when forced
}

TEST(ExpertsVariant, DownTailParsesAPercentageAndNamesABadOne) {
  unsetenv("MOEKIT_EXPERTS_DOWN_TAIL");
  EXPECT_EQ(cuda::experts_down_tail_percent_setting(), -1);  // unset: the rule
  expect_env_int_knob("MOEKIT_EXPERTS_DOWN_TAIL", cuda::experts_down_tail_percent_setting,
                      {0, 20, 100}, {"101", "-1", "20%", "x"}, "a percentage, 0 to 100");
}

TEST(ExpertsVariant, DownTailFrom2To128TokensForHidden7168UnlessForced) {
  EXPECT_EQ(cuda::experts_down_tail(2, 7168, 8, -1), 20);    // DeepSeek-V3, Kimi-K2
  EXPECT_EQ(cuda::experts_down_tail(64, 7168, 8, -1), 20);
  EXPECT_EQ(cuda::experts_down_tail(128, 7168, 8, -1), 20);
  EXPECT_EQ(cuda::experts_down_tail(1, 7168, 8, -1), 0);     // +1.1..+1.3% at one token
  EXPECT_EQ(cuda::experts_down_tail(129, 7168, 8, -1), 0);   // equal at 192, worse at 256
  EXPECT_EQ(cuda::experts_down_tail(32, 5120, 8, -1), 0);    // GLM-4.5: +0.7% at 32
  EXPECT_EQ(cuda::experts_down_tail(32, 2048, 8, -1), 0);    // Qwen3-30B-A3B: +2.9% at 32
  EXPECT_EQ(cuda::experts_down_tail(32, 2048, 8, 35), 35);   // forced, any hidden
  EXPECT_EQ(cuda::experts_down_tail(300, 7168, 8, 20), 20);
  EXPECT_EQ(cuda::experts_down_tail(1, 7168, 8, 20), 20);    // forced: at one token too
  EXPECT_EQ(cuda::experts_down_tail(32, 7168, 8, 0), 0);     // forced off
  EXPECT_EQ(cuda::experts_down_tail(512, 7168, 16, 20), 0);  // chunk 16: no instance
}

TEST(ExpertsVariant, HalfItemsParsesACountAndNamesABadOne) {
  unsetenv("MOEKIT_EXPERTS_HALF_ITEMS");
  EXPECT_EQ(cuda::experts_gate_up_half_items_setting(), -1);  // unset: the rule
  expect_env_int_knob("MOEKIT_EXPERTS_HALF_ITEMS", cuda::experts_gate_up_half_items_setting,
                      {0, 2, 16}, {"17", "-1", "2 items", "x"}, "items per CTA, 0 to 16");
}

TEST(ExpertsVariant, HalfItemsUpTo8TokensForHidden7168UnlessForced) {
  EXPECT_EQ(cuda::experts_gate_up_half_items(2, 7168, 8, -1, 1), 1);  // DeepSeek-V3, Kimi-K2
  EXPECT_EQ(cuda::experts_gate_up_half_items(1, 7168, 8, -1, 1), 0);  // the one-token ring's
  EXPECT_EQ(cuda::experts_gate_up_half_items(1, 7168, 8, -1, 0), 1);  // ... turned off
  EXPECT_EQ(cuda::experts_gate_up_half_items(8, 7168, 8, -1, 1), 1);
  EXPECT_EQ(cuda::experts_gate_up_half_items(16, 7168, 8, -1, 1), 0);  // equal at 16
  EXPECT_EQ(cuda::experts_gate_up_half_items(1, 2048, 8, -1, 1), 0);   // Qwen3-30B-A3B: +1.5%
  EXPECT_EQ(cuda::experts_gate_up_half_items(1, 6144, 8, -1, 1), 0);   // not measured
  EXPECT_EQ(cuda::experts_gate_up_half_items(1, 2048, 8, 2, 1), 2);    // forced, any hidden
  EXPECT_EQ(cuda::experts_gate_up_half_items(1, 7168, 8, 0, 1), 0);    // forced off
  EXPECT_EQ(cuda::experts_gate_up_half_items(1, 7168, 16, 1, 1), 0);   // chunk 16: no instance
}

TEST(ExpertsVariant, SelfRouteParsesATokenCountAndNamesABadOne) {
  unsetenv("MOEKIT_EXPERTS_SELF_ROUTE");
  EXPECT_EQ(cuda::experts_self_route_tokens(), 1);  // on at one token by default
  expect_env_int_knob("MOEKIT_EXPERTS_SELF_ROUTE", cuda::experts_self_route_tokens, {0, 1},
                      {"2", "-1", "on", "x"}, "a token count, 0 or 1");
}

TEST(ExpertsVariant, SharedFirstParsesATokenCountAndNamesABadOne) {
  unsetenv("MOEKIT_EXPERTS_SHARED_FIRST");
  EXPECT_GE(cuda::experts_shared_first_tokens(), 1);  // on at one token by default
  expect_env_int_knob("MOEKIT_EXPERTS_SHARED_FIRST", cuda::experts_shared_first_tokens,
                      {0, 8, 4096}, {"-1", "yes", "8 tokens", "99999999999"},
                      "a token count, 0 (never) to 1048576");
}

TEST(ExpertsVariant, SharedDenseParsesATokenCountAndNamesABadOne) {
  unsetenv("MOEKIT_SHARED_DENSE");
  EXPECT_EQ(cuda::experts_shared_dense_tokens(), 8);  // the measured default
  expect_env_int_knob("MOEKIT_SHARED_DENSE", cuda::experts_shared_dense_tokens, {0, 1, 32, 4096},
                      {"-1", "yes", "8 tokens", "99999999999"},
                      "a token count, 0 (never) to 1048576");
}

// auto's rule, at the shapes it was measured on: the dense shared MLP once the fused slots' tasks
// of 8 tokens (16 above 256) read its weights again 100 MB or more.
TEST(ExpertsVariant, SharedDenseOverFusedByTheBytesReadAgain) {
  constexpr long long kDeepSeekV3 = 3LL * 2048 * 7168 * 2;       // 88 MB
  constexpr long long kGlm45 = 3LL * 1536 * 5120 * 2;            // 47 MB
  constexpr long long kDeepSeekV4Flash = 3LL * 2048 * 4096 * 2;  // 50 MB
  constexpr long long kDeepSeekV2Lite = 3LL * 2816 * 2048 * 2;   // 35 MB (two slots)
  constexpr long long kQwen2 = 3LL * 20480 * 3584 * 2;           // 440 MB (eight slots)
  for (int t : {1, 8}) EXPECT_FALSE(cuda::experts_shared_dense_over_fused(t, 8, kQwen2)) << t;
  EXPECT_TRUE(cuda::experts_shared_dense_over_fused(9, 8, kQwen2));
  for (int t : {9, 16}) EXPECT_FALSE(cuda::experts_shared_dense_over_fused(t, 8, kDeepSeekV3)) << t;
  for (int t : {17, 24, 32, 128, 256}) {
    EXPECT_TRUE(cuda::experts_shared_dense_over_fused(t, 8, kDeepSeekV3)) << t;
  }
  EXPECT_FALSE(cuda::experts_shared_dense_over_fused(24, 8, kGlm45));
  EXPECT_TRUE(cuda::experts_shared_dense_over_fused(32, 8, kGlm45));
  EXPECT_FALSE(cuda::experts_shared_dense_over_fused(16, 8, kDeepSeekV4Flash));
  EXPECT_TRUE(cuda::experts_shared_dense_over_fused(24, 8, kDeepSeekV4Flash));
  EXPECT_FALSE(cuda::experts_shared_dense_over_fused(24, 8, kDeepSeekV2Lite));
  EXPECT_TRUE(cuda::experts_shared_dense_over_fused(32, 8, kDeepSeekV2Lite));
  // tasks of 16 tokens: 17-32 tokens stream the weights twice, 33-48 three times
  EXPECT_FALSE(cuda::experts_shared_dense_over_fused(16, 16, kDeepSeekV4Flash));
  EXPECT_FALSE(cuda::experts_shared_dense_over_fused(32, 16, kDeepSeekV4Flash));
  EXPECT_TRUE(cuda::experts_shared_dense_over_fused(33, 16, kDeepSeekV4Flash));
}

TEST(ExpertsVariant, WholeTilesParsesATokenCountAndNamesABadOne) {
  unsetenv("MOEKIT_EXPERTS_WHOLE_TILES");
  EXPECT_GE(cuda::experts_whole_tile_tokens(), 1);  // on at one token by default
  expect_env_int_knob("MOEKIT_EXPERTS_WHOLE_TILES", cuda::experts_whole_tile_tokens,
                      {0, 4, 64}, {"-1", "all", "4 tokens"}, "a token count, 0 (never) to 1048576");
}

TEST(ExpertsVariant, DownGridTakesWholeTilesOnlyWithFewIdleSMs) {
  // Qwen3-30B-A3B's 2048 rows = 128 tiles on the H200's 132 resident CTAs: whole tiles
  EXPECT_EQ(cuda::experts_down_grid(132, 2048, 1, 4), 128);
  EXPECT_EQ(cuda::experts_down_grid(132, 2048, 4, 4), 128);
  EXPECT_EQ(cuda::experts_down_grid(132, 2048, 5, 4), 132);  // more tokens than the limit
  EXPECT_EQ(cuda::experts_down_grid(132, 2048, 1, 0), 132);  // turned off
  EXPECT_EQ(cuda::experts_down_grid(114, 2048, 1, 4), 114);  // more tiles than CTAs
  EXPECT_EQ(cuda::experts_down_grid(132, 7168, 1, 4), 132);  // DeepSeek-V3: 448 tiles
  EXPECT_EQ(cuda::experts_down_grid(132, 1024, 1, 4), 132);  // half the SMs would idle
  // at most 1/16 of the resident CTAs idle: 124 tiles (8 idle) yes, 123 (9 idle) no
  EXPECT_EQ(cuda::experts_down_grid(132, 124 * 16, 1, 4), 124);
  EXPECT_EQ(cuda::experts_down_grid(132, 123 * 16, 1, 4), 132);
}

TEST(ExpertsVariant, DefaultIsTheBulkKernelAtDecodeBatches) {
  // the limits measured on the H200 (experts.cu): the bulk kernel up to 256 tokens; above, the
  // register kernels with the activations early for large experts (H >= 4096), and below that
  // the bulk kernel again where its tasks of 16 tokens apply (else the register kernels)
  using cuda::ExpertsStream;
  for (int hidden : {2048, 2880, 7168}) {
    for (bool tasks_of_16 : {false, true}) {
      EXPECT_EQ(cuda::experts_stream_default(hidden, 1, tasks_of_16), ExpertsStream::Bulk);
      EXPECT_EQ(cuda::experts_stream_default(hidden, 128, tasks_of_16), ExpertsStream::Bulk);
      EXPECT_EQ(cuda::experts_stream_default(hidden, 256, tasks_of_16), ExpertsStream::Bulk);
    }
  }
  EXPECT_EQ(cuda::experts_stream_default(7168, 257, true), ExpertsStream::RegistersEarlyActs);
  EXPECT_EQ(cuda::experts_stream_default(4096, 1024, true), ExpertsStream::RegistersEarlyActs);
  EXPECT_EQ(cuda::experts_stream_default(2048, 257, true), ExpertsStream::Bulk);
  EXPECT_EQ(cuda::experts_stream_default(3584, 1024, true), ExpertsStream::Bulk);
  EXPECT_EQ(cuda::experts_stream_default(2048, 257, false), ExpertsStream::Registers);
}

}  // namespace
}  // namespace moekit

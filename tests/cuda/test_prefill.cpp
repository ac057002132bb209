// The GPU prefill path (src/cuda/prefill/prefill.h: permute, CUTLASS grouped GEMMs, activation,
// combine) against the CPU reference's experts.
//
// Families scaled down (hidden 256, 32 experts, I 128; shared slots kept): Qwen3-30B-A3B (SiLU),
// gpt-oss-120b (clamped swiglu, expert biases), MiniMax-M3 (swigluoai with its limit, one shared
// slot), DeepSeek-V3 (one shared slot) and Qwen2-57B-A14B (gated shared MLP, eight slots), fused
// and unfused, at T in {257, 1000, 4096} (no multiple of any tile). Ids and weights come from
// cpu_reference::route on the CPU's logits, or are crafted: half the experts with no token, one
// expert that every token takes. The expected y is the sum over slots, in slot order, of the
// weight times cpu_reference::expert_forward (+ the scaled cpu_reference::shared_forward when
// unfused), in double; relative error by norm <= 5e-3 (bf16 h and y, as the layer's tests).
// y and the whole workspace are poisoned (0xFF bytes: NaN, -1) before every run; runs repeat bit
// for bit, also replayed from a CUDA graph. The naive GEMM twin runs the same cases apart from
// CUTLASS. Without a GPU (or not sm_90a) every test skips.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "prefill_test_util.h"
#include "../expect_error.h"
#include "common/random_values.h"
#include "cuda/prefill/prefill.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/routing.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

using test::Dev;

// configs/<model>.json scaled to H = hidden, E = experts, I = inter, keeping the number of
// I-wide shared slots; parsed by the real parser.
MoeSpec prefill_spec(const std::string& model, int hidden = 256, int experts = 32, int inter = 128) {
  const std::string path = config_dir() + "/" + model + ".json";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  nlohmann::json top = nlohmann::json::parse(in);
  nlohmann::json& c = top.contains("text_config") ? top["text_config"] : top;
  c["hidden_size"] = hidden;
  const char* inter_key =
      c.contains("moe_intermediate_size") ? "moe_intermediate_size" : "intermediate_size";
  const int orig_inter = c[inter_key].get<int>();
  c[inter_key] = inter;
  for (const char* k : {"n_routed_experts", "num_experts", "num_local_experts"}) {
    if (c.contains(k)) c[k] = experts;
  }
  for (const char* k : {"shared_expert_intermediate_size", "shared_intermediate_size"}) {
    if (c.contains(k) && c[k].is_number_integer() && c[k].get<int>() > 0) {
      c[k] = c[k].get<int>() / orig_inter * inter;
    }
  }
  if (c.contains("n_group") && c["n_group"].is_number_integer() &&
      c["n_group"].get<int>() > experts / 2) {
    c["n_group"] = 1;
    c["topk_group"] = 1;
  }
  return parse_spec_json(top.dump(), model + "-prefill");
}

std::vector<Bf16> random_x(int tokens, int hidden, uint64_t seed) {
  namespace rv = random_values;
  const uint64_t stream = rv::stream_key(seed, -1, rv::Tensor::Input, -1);
  std::vector<Bf16> x(static_cast<size_t>(tokens) * hidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(rv::uniform(stream, i));
  return x;
}

// How the ids and weights of a case are made.
enum class Ids { Routed, HalfExpertsIdle, OneExpertTakesAll };

struct Inputs {
  int tokens = 0, slots = 0, rows = 0;
  std::vector<Bf16> x;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<float> shared_scale;    // unfused with a shared MLP, else empty
  std::vector<float> shared_partial;  // [T, H] unfused with a shared MLP, else empty
};

Inputs make_inputs(const MoeSpec& spec, const LayerWeights& w, int tokens, bool fused, Ids how) {
  Inputs in;
  in.tokens = tokens;
  in.x = random_x(tokens, spec.hidden, 11);
  const RoutingConfig cfg = RoutingConfig::from_spec(spec, fused);
  const std::vector<float> logits = cpu_reference::router_logits(w, in.x.data(), tokens);
  const Routing r = cpu_reference::route(cfg, logits.data(), tokens, w.correction_bias());
  in.slots = r.slots;
  in.rows = spec.weight_rows(fused);
  in.ids = r.ids;
  in.weights = r.weights;
  const int E = spec.num_experts, K = spec.top_k;
  if (how != Ids::Routed) {
    // the routed slots crafted (the fused shared slots stay E..E+S-1): distinct experts per
    // token, from the even half only, or expert 5 in slot 0 of every token
    for (int t = 0; t < tokens; ++t) {
      for (int s = 0; s < K; ++s) {
        int e = 0;
        if (how == Ids::HalfExpertsIdle) {
          e = 2 * ((t + s) % (E / 2));
        } else {
          e = s == 0 ? 5 : 6 + (t + s) % (E - 6);
        }
        in.ids[static_cast<size_t>(t) * in.slots + s] = e;
      }
    }
  }
  const bool shared_unfused = !fused && spec.shared_kind != SharedKind::None;
  if (shared_unfused) {
    in.shared_scale = r.shared_scale;
    in.shared_partial.resize(static_cast<size_t>(tokens) * spec.hidden);
    for (int t = 0; t < tokens; ++t) {
      cpu_reference::shared_forward(w, in.x.data() + static_cast<size_t>(t) * spec.hidden,
                                    in.shared_partial.data() + static_cast<size_t>(t) * spec.hidden);
    }
  }
  return in;
}

// y in double: sum over slots in order of weight * expert_forward (+ scale * shared partial).
std::vector<double> expected_y(const MoeSpec& spec, const LayerWeights& w, const Inputs& in) {
  const int H = spec.hidden;
  std::vector<double> y(static_cast<size_t>(in.tokens) * H, 0.0);
  std::vector<float> out(H);
  for (int t = 0; t < in.tokens; ++t) {
    const Bf16* xt = in.x.data() + static_cast<size_t>(t) * H;
    double* yt = y.data() + static_cast<size_t>(t) * H;
    for (int s = 0; s < in.slots; ++s) {
      const size_t q = static_cast<size_t>(t) * in.slots + s;
      cpu_reference::expert_forward(spec, w.expert(in.ids[q]), xt, out.data());
      for (int c = 0; c < H; ++c) yt[c] += static_cast<double>(in.weights[q]) * out[c];
    }
    if (!in.shared_partial.empty()) {
      for (int c = 0; c < H; ++c) {
        yt[c] += static_cast<double>(in.shared_scale[t]) * in.shared_partial[t * H + c];
      }
    }
  }
  return y;
}

// The weights on the device, stacked as the layer holds them.
struct DeviceWeights {
  std::unique_ptr<Dev> w13, w2, b13, b2;
  DeviceWeights(const MoeSpec& spec, const LayerWeights& w, int rows) {
    const size_t H = spec.hidden, I = spec.expert_intermediate;
    std::vector<Bf16> h13(rows * 2 * I * H), h2(rows * H * I);
    std::vector<float> hb13, hb2;
    if (spec.has_expert_bias) {
      hb13.assign(rows * 2 * I, 0.0f);
      hb2.assign(rows * H, 0.0f);
    }
    for (int e = 0; e < rows; ++e) {
      const ExpertView v = w.expert(e);
      std::memcpy(h13.data() + e * 2 * I * H, v.w13, 2 * I * H * sizeof(Bf16));
      std::memcpy(h2.data() + e * H * I, v.w2, H * I * sizeof(Bf16));
      if (spec.has_expert_bias && v.b13 != nullptr) {
        std::memcpy(hb13.data() + e * 2 * I, v.b13, 2 * I * sizeof(float));
      }
      if (spec.has_expert_bias && v.b2 != nullptr) {
        std::memcpy(hb2.data() + e * H, v.b2, H * sizeof(float));
      }
    }
    w13 = std::make_unique<Dev>(h13);
    w2 = std::make_unique<Dev>(h2);
    if (spec.has_expert_bias) {
      b13 = std::make_unique<Dev>(hb13);
      b2 = std::make_unique<Dev>(hb2);
    }
  }
};

// The device side of one case: inputs uploaded, workspace for max_tokens, y poisoned per run.
struct PrefillRun {
  const MoeSpec& spec;
  const Inputs& in;
  DeviceWeights dw;
  Dev x, ids, weights, shared_scale, shared_partial, y, workspace;
  cuda::PrefillParams p;

  PrefillRun(const MoeSpec& s, const LayerWeights& w, const Inputs& i, int max_tokens)
      : spec(s),
        in(i),
        dw(s, w, i.rows),
        x(i.x),
        ids(i.ids),
        weights(i.weights),
        shared_scale(i.shared_scale),
        shared_partial(i.shared_partial),
        y(static_cast<size_t>(i.tokens) * s.hidden * sizeof(Bf16)),
        workspace(cuda::prefill_workspace_bytes(max_tokens, i.slots, i.rows, s.hidden,
                                                s.expert_intermediate)) {
    p.tokens = i.tokens;
    p.hidden = s.hidden;
    p.inter = s.expert_intermediate;
    p.rows = i.rows;
    p.slots = i.slots;
    p.max_tokens = max_tokens;
    p.x = x.as<__nv_bfloat16>();
    p.ids = ids.as<int32_t>();
    p.weights = weights.as<float>();
    p.w13 = dw.w13->as<__nv_bfloat16>();
    p.w2 = dw.w2->as<__nv_bfloat16>();
    p.b13 = dw.b13 ? dw.b13->as<float>() : nullptr;
    p.b2 = dw.b2 ? dw.b2->as<float>() : nullptr;
    p.activation = s.activation;
    p.limit = s.swiglu_limit;
    p.alpha = s.swiglu_alpha;
    p.beta = s.swiglu_beta;
    p.shared_partial = i.shared_partial.empty() ? nullptr : shared_partial.as<float>();
    p.shared_scale = i.shared_scale.empty() ? nullptr : shared_scale.as<float>();
    p.y = y.as<__nv_bfloat16>();
    p.workspace = workspace.p;
    p.workspace_bytes = workspace.bytes;
    p.gate_up_gemm = p.down_gemm = test::grouped_gemm_rows(false).front();
  }

  void poison() {
    ASSERT_EQ(cudaMemset(y.p, 0xFF, y.bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(workspace.p, 0xFF, workspace.bytes), cudaSuccess);
  }

  std::vector<uint16_t> y_bits() {
    std::vector<uint16_t> bits(y.bytes / 2);
    EXPECT_EQ(cudaMemcpy(bits.data(), y.p, y.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return bits;
  }

  std::vector<uint16_t> run_eager() {
    poison();
    cuda::launch_prefill_experts(p, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return y_bits();
  }
};

double rel_error(const std::vector<uint16_t>& y_bits, const std::vector<double>& want,
                 size_t* non_finite) {
  double num = 0, den = 0;
  *non_finite = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float g = bf16_to_float(Bf16{y_bits[i]});
    if (!std::isfinite(g)) ++*non_finite;
    num += (g - want[i]) * (g - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

struct Case {
  std::string model;
  int tokens;
  bool fused;
  Ids ids;
};

std::string case_name(const Case& c) {
  const char* how = c.ids == Ids::Routed ? "routed" : c.ids == Ids::HalfExpertsIdle ? "half-idle"
                                                                                   : "one-takes-all";
  return c.model + " T=" + std::to_string(c.tokens) + (c.fused ? " fused " : " unfused ") + how;
}

// Runs the case with each bf16 CUTLASS instance (both GEMMs on it), or the naive twin once.
void check_case(const Case& c, cuda::PrefillGemm gemm = cuda::PrefillGemm::Cutlass) {
  const MoeSpec spec = prefill_spec(c.model);
  ASSERT_TRUE(!c.fused || spec.can_fuse_shared()) << case_name(c);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 7);
  const Inputs in = make_inputs(spec, *w, c.tokens, c.fused, c.ids);
  const std::vector<double> want = expected_y(spec, *w, in);
  PrefillRun run(spec, *w, in, c.tokens + 5);  // (workspace for more tokens than run)
  run.p.gemm = gemm;
  const std::vector<int> kernels = gemm == cuda::PrefillGemm::Naive
                                       ? std::vector<int>{test::grouped_gemm_rows(false).front()}
                                       : test::grouped_gemm_rows(false);
  for (const int kernel : kernels) {
    run.p.gate_up_gemm = run.p.down_gemm = kernel;
    const std::string what =
        case_name(c) + " " +
        (gemm == cuda::PrefillGemm::Naive ? "naive" : plan::grouped_gemm_kernels()[kernel].name);
    const std::vector<uint16_t> first = run.run_eager();
    size_t non_finite = 0;
    const double err = rel_error(first, want, &non_finite);
    EXPECT_EQ(non_finite, 0u) << what;
    EXPECT_LE(err, 5e-3) << what;
    std::printf("  %s: relative error %.2e\n", what.c_str(), err);
    const std::vector<uint16_t> second = run.run_eager();
    EXPECT_TRUE(first == second) << what << ": y differs between two runs";
  }
}

// The path through the naive GEMM twin: the plan, permute, activation and combine checked apart
// from CUTLASS; then both GEMMs' y against each other (they differ in the fp32 summation order).
TEST(GpuPrefill, NaiveGemmTwin) {
  SKIP_WITHOUT_PREFILL_GPU();
  check_case({"qwen3-30b-a3b", 257, false, Ids::Routed}, cuda::PrefillGemm::Naive);
  check_case({"gpt-oss-120b", 1000, false, Ids::OneExpertTakesAll}, cuda::PrefillGemm::Naive);
  check_case({"deepseek-v3", 257, true, Ids::HalfExpertsIdle}, cuda::PrefillGemm::Naive);
  const MoeSpec spec = prefill_spec("minimax-m3");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 7);
  const Inputs in = make_inputs(spec, *w, 1000, true, Ids::Routed);
  PrefillRun run(spec, *w, in, 1000);
  const std::vector<uint16_t> cutlass_y = run.run_eager();
  run.p.gemm = cuda::PrefillGemm::Naive;
  const std::vector<uint16_t> naive_y = run.run_eager();
  std::vector<double> naive(naive_y.size());
  for (size_t i = 0; i < naive.size(); ++i) naive[i] = bf16_to_float(Bf16{naive_y[i]});
  size_t non_finite = 0;
  EXPECT_LE(rel_error(cutlass_y, naive, &non_finite), 2e-3);
  EXPECT_EQ(non_finite, 0u);
}

// One small case with both instances, for compute-sanitizer's slower tools (racecheck).
TEST(GpuPrefill, SmallCaseForSanitizers) {
  SKIP_WITHOUT_PREFILL_GPU();
  check_case({"deepseek-v3", 257, true, Ids::Routed});
}

TEST(GpuPrefill, SiluModel) {
  SKIP_WITHOUT_PREFILL_GPU();
  for (int t : {257, 1000, 4096}) check_case({"qwen3-30b-a3b", t, false, Ids::Routed});
}

TEST(GpuPrefill, GptOssClampAndBiases) {
  SKIP_WITHOUT_PREFILL_GPU();
  for (int t : {257, 1000, 4096}) check_case({"gpt-oss-120b", t, false, Ids::Routed});
}

TEST(GpuPrefill, MiniMaxM3SwigluOaiFusedAndUnfused) {
  SKIP_WITHOUT_PREFILL_GPU();
  for (int t : {257, 1000, 4096}) {
    check_case({"minimax-m3", t, true, Ids::Routed});
    check_case({"minimax-m3", t, false, Ids::Routed});
  }
}

TEST(GpuPrefill, SharedExpertModelsFusedAndUnfused) {
  SKIP_WITHOUT_PREFILL_GPU();
  for (int t : {257, 1000, 4096}) {
    check_case({"deepseek-v3", t, true, Ids::Routed});
    check_case({"deepseek-v3", t, false, Ids::Routed});
  }
  check_case({"qwen2-57b-a14b", 1000, true, Ids::Routed});
  check_case({"qwen2-57b-a14b", 1000, false, Ids::Routed});
}

TEST(GpuPrefill, ExpertsWithNoTokens) {
  SKIP_WITHOUT_PREFILL_GPU();
  for (int t : {257, 4096}) {
    check_case({"qwen3-30b-a3b", t, false, Ids::HalfExpertsIdle});
    check_case({"deepseek-v3", t, true, Ids::HalfExpertsIdle});
  }
}

TEST(GpuPrefill, OneExpertTakesAllTokens) {
  SKIP_WITHOUT_PREFILL_GPU();
  for (int t : {257, 1000, 4096}) {
    check_case({"gpt-oss-120b", t, false, Ids::OneExpertTakesAll});
    check_case({"minimax-m3", t, true, Ids::OneExpertTakesAll});
  }
}

// A CUDA graph of the launch replays to the eager result bit for bit, also after the ids change
// (the per-expert sizes are read on the device).
TEST(GpuPrefill, GraphReplayMatchesEager) {
  SKIP_WITHOUT_PREFILL_GPU();
  const MoeSpec spec = prefill_spec("deepseek-v3");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 7);
  Inputs in = make_inputs(spec, *w, 1000, true, Ids::Routed);
  PrefillRun run(spec, *w, in, 1000);
  // (the first bf16 instance runs every other case; the graph takes the last: its cluster and
  // schedule differ most)
  run.p.gate_up_gemm = run.p.down_gemm = test::grouped_gemm_rows(false).back();
  const std::vector<uint16_t> eager = run.run_eager();

  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cuda::launch_prefill_experts(run.p, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  run.poison();
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(run.y_bits() == eager) << "graph replay differs from the eager run";

  // other routing, same graph: the crafted ids through the replay against a fresh eager run
  const Inputs other = make_inputs(spec, *w, 1000, true, Ids::OneExpertTakesAll);
  CUDA_OK(cudaMemcpy(run.ids.p, other.ids.data(), run.ids.bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(run.weights.p, other.weights.data(), run.weights.bytes,
                     cudaMemcpyHostToDevice));
  run.poison();
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  const std::vector<uint16_t> replayed = run.y_bits();
  EXPECT_TRUE(replayed == run.run_eager()) << "graph replay with new ids differs from eager";
  size_t non_finite = 0;
  EXPECT_LE(rel_error(replayed, expected_y(spec, *w, other), &non_finite), 5e-3);
  EXPECT_EQ(non_finite, 0u);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

// An id outside [0, rows) sets the error flag and its slot is dropped.
TEST(GpuPrefill, OutOfRangeIdFlaggedAndDropped) {
  SKIP_WITHOUT_PREFILL_GPU();
  const MoeSpec spec = prefill_spec("qwen3-30b-a3b");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 7);
  Inputs in = make_inputs(spec, *w, 257, false, Ids::Routed);
  const size_t bad = 3 * static_cast<size_t>(in.slots) + 1;  // token 3, slot 1
  in.ids[bad] = in.rows;
  Inputs dropped = in;
  dropped.weights[bad] = 0.0f;
  dropped.ids[bad] = 0;
  const std::vector<double> want = expected_y(spec, *w, dropped);
  PrefillRun run(spec, *w, in, 257);
  Dev flag(sizeof(int));
  CUDA_OK(cudaMemset(flag.p, 0, sizeof(int)));
  run.p.error_flag = flag.as<int>();
  const std::vector<uint16_t> y = run.run_eager();
  int flag_value = 0;
  CUDA_OK(cudaMemcpy(&flag_value, flag.p, sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(flag_value, 1);
  size_t non_finite = 0;
  EXPECT_LE(rel_error(y, want, &non_finite), 5e-3);
  EXPECT_EQ(non_finite, 0u);
}

TEST(GpuPrefill, ErrorsNameTheField) {
  SKIP_WITHOUT_PREFILL_GPU();
  const MoeSpec spec = prefill_spec("qwen3-30b-a3b");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 7);
  const Inputs in = make_inputs(spec, *w, 257, false, Ids::Routed);
  PrefillRun run(spec, *w, in, 257);
  cuda::PrefillParams p = run.p;
  p.workspace_bytes = 1024;
  test::expect_error([&] { cuda::launch_prefill_experts(p, nullptr); }, {"prefill_workspace_bytes"});
  p = run.p;
  p.tokens = 258;
  test::expect_error([&] { cuda::launch_prefill_experts(p, nullptr); }, {"tokens <= max_tokens"});
  p = run.p;
  p.inter = 96;
  test::expect_error([&] { cuda::launch_prefill_experts(p, nullptr); }, {"inter a positive multiple"});
  p = run.p;
  p.gate_up_gemm = static_cast<int>(plan::grouped_gemm_kernels().size());
  test::expect_error([&] { cuda::launch_prefill_experts(p, nullptr); },
                     {"gate_up_gemm a grouped GEMM instance"});
  p = run.p;
  p.down_gemm = test::grouped_gemm_rows(true).front();
  test::expect_error([&] { cuda::launch_prefill_experts(p, nullptr); },
                     {"down_gemm", "takes fp8 operands"});
}

}  // namespace
}  // namespace moekit

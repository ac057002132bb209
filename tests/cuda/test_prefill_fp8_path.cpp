// The whole GPU prefill path on fp8 block-scale experts (launch_prefill_experts with w13_fp8 set)
// against the CPU reference forward in W8A8 (cpu_reference::forward, Fp8Compute::W8A8, fused
// shared slot), on a DeepSeek-V3 config shrunk to H 512, I 256, 8 experts, top-k 4 and its one
// shared expert as a fused slot (the ninth weight row), written as an fp8 checkpoint by the
// project's writer and loaded with LoadOptions::expert_format = Fp8Block; 200 and 1000 tokens,
// fresh random weights and inputs each run. The GPU takes the reference's routing (ids, weights),
// so the experts and the combine are what is compared. y and the workspace are poisoned first.
//
// Tolerances (relative error by norm of y):
//   against the reference, 3e-2. The reference keeps gate/up in double and rounds h to bf16
//   before quantising it to e4m3; the path rounds gate/up to bf16 (2^-9 relative) and computes h
//   from them, and that moves some h values across a bf16 and then an e4m3 rounding boundary (a step of 2^-4..2^-3 relative):
//   a small fraction of h's elements, each off by one e4m3 step, which the down projection
//   carries into y. HostEmulationAgainstReference (no GPU needed) measures exactly this part: the
//   path's rounding points emulated on the host against the reference.
//   against that host emulation, 5e-3, and CUTLASS against the naive GEMM likewise: they share
//   every rounding point and differ only in the order of the fp32 sums, whose effect the same
//   test measures on the host (fp32 sums against double sums).
// Runs repeat bit for bit, also replayed from a CUDA graph.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "prefill_test_util.h"
#include "../fp8_test_util.h"
#include "cpu/reference_fp8.h"
#include "cuda/prefill/prefill.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

using test::Dev;

// configs/deepseek-v3.json at H 512, I 256, 8 experts, top-k 4 (one group), its shared expert.
MoeSpec deepseek_fp8_spec() {
  const std::string path = config_dir() + "/deepseek-v3.json";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  nlohmann::json c = nlohmann::json::parse(in);
  c["hidden_size"] = 512;
  c["moe_intermediate_size"] = 256;
  c["n_routed_experts"] = 8;
  c["num_experts_per_tok"] = 4;
  c["n_group"] = 1;
  c["topk_group"] = 1;
  return parse_spec_json(c.dump(), "deepseek-v3-prefill-fp8");
}

std::string scratch_dir(const std::string& tag) {
  const auto dir = std::filesystem::temp_directory_path() / ("moekit_gpu_prefill_fp8_" + tag);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// The fp8 experts of rows [0, rows) stacked as PrefillParams takes them, on the device.
struct DeviceFp8Weights {
  std::unique_ptr<Dev> w13, s13, w2, s2;
  DeviceFp8Weights(const LayerWeights& w, int rows, size_t H, size_t I) {
    const size_t n13 = 2 * I * H, ns13 = (2 * I / 128) * (H / 128), n2 = H * I,
                 ns2 = (H / 128) * (I / 128);
    std::vector<uint8_t> h13(rows * n13), h2(rows * n2);
    std::vector<float> hs13(rows * ns13), hs2(rows * ns2);
    for (int e = 0; e < rows; ++e) {
      const ExpertView v = w.expert(e);
      EXPECT_TRUE(v.w13_fp8 != nullptr && v.w13_scale != nullptr && v.w2_fp8 != nullptr &&
                  v.w2_scale != nullptr)
          << "weight row " << e << " has no fp8 form";
      if (v.w13_fp8 == nullptr) return;
      std::memcpy(h13.data() + e * n13, v.w13_fp8, n13);
      std::memcpy(hs13.data() + e * ns13, v.w13_scale, ns13 * sizeof(float));
      std::memcpy(h2.data() + e * n2, v.w2_fp8, n2);
      std::memcpy(hs2.data() + e * ns2, v.w2_scale, ns2 * sizeof(float));
    }
    w13 = std::make_unique<Dev>(h13);
    s13 = std::make_unique<Dev>(hs13);
    w2 = std::make_unique<Dev>(h2);
    s2 = std::make_unique<Dev>(hs2);
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

// Relative errors by norm of y (see the head of this file): against the reference, and against
// the host emulation (or one GEMM against the other), which share every rounding point with the
// device but the fp32 order of sums.
constexpr double kTolReference = 3e-2;
constexpr double kTolEmulation = 5e-3;
// The CUTLASS GEMMs against the emulation and the naive GEMM: Hopper's fp8 tensor cores sum a
// 128-wide k block's products with fewer bits than fp32 (why blockwise kernels promote to fp32
// every block), which moves y by about 5e-3 at these shapes, twice the naive GEMM's fp32 sums.
constexpr double kTolCutlass = 1e-2;

// One case: the fp8 checkpoint written and loaded, fresh x, the reference's forward (fused).
struct Fp8Case {
  MoeSpec spec;
  std::string dir;
  uint64_t seed = 0;
  std::unique_ptr<LayerWeights> w;
  int tokens = 0, rows = 0, slots = 0;
  std::vector<Bf16> x;
  ForwardResult ref;
  std::vector<double> want;  // ref.y

  explicit Fp8Case(int t) : spec(deepseek_fp8_spec()), tokens(t) {
    EXPECT_TRUE(spec.can_fuse_shared());
    EXPECT_EQ(spec.shared_slots(), 1);
    const int layer = spec.moe_layers.front();
    dir = scratch_dir(std::to_string(tokens));
    seed = std::random_device{}();
    test::write_fp8_checkpoint(spec, layer, seed, false, dir);
    LoadOptions opts;
    opts.expert_format = ExpertFormat::Fp8Block;
    w = load_checkpoint_weights(spec, layer, dir, opts);
    EXPECT_EQ(w->expert_dtype(), DType::F8_E4M3);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    x.resize(static_cast<size_t>(tokens) * spec.hidden);
    for (auto& v : x) v = float_to_bf16(u(rng));
    ref = cpu_reference::forward(*w, x.data(), tokens, FuseShared::On, Fp8Compute::W8A8);
    EXPECT_TRUE(ref.fused);
    want.assign(ref.y.begin(), ref.y.end());
    rows = spec.weight_rows(true);
    slots = ref.routing.slots;
    EXPECT_EQ(slots, spec.top_k + 1);
  }
  ~Fp8Case() { std::filesystem::remove_all(dir); }
};

float silu_mul(float g, float u) { return g / (1.0f + std::exp(-g)) * u; }

// The path's arithmetic on the host, rounding where the device rounds: gate/up to bf16 (from the
// W8A8 dot in double, where the GEMM sums in fp32), h = SiLU(g) * u in fp32 from them and rounded
// to bf16, quantised
// by the reference's rule, the down projection to bf16, the combine in fp32 in slot order, y in
// bf16. It differs from the device only where a sum's fp32 rounding moves a bf16 or an e4m3
// rounding, so it bounds the device tightly; against the reference it shows what the rounding
// points alone cost.
// A projection row's W8A8 dot with fp32 sums as the naive GEMM does them (block sums in K order,
// then the scaled blocks in order).
float dot_w8a8_f32(const cpu_reference::Fp8Rows& w, size_t r, const uint8_t* qa, const float* sa,
                   int n) {
  const uint8_t* q = w.row(r);
  const float* ws = w.row_scales(r);
  float acc = 0.0f;
  for (int b = 0; b * 128 < n; ++b) {
    float block = 0.0f;
    for (int k = b * 128; k < (b + 1) * 128; ++k)
      block += cpu_reference::fp8_value(qa[k]) * cpu_reference::fp8_value(q[k]);
    acc += block * (sa[b] * ws[b]);
  }
  return acc;
}

enum class Sums { Double, Fp32 };

std::vector<double> emulated_y(const Fp8Case& c, Sums sums, bool ue8m0 = false) {
  using cpu_reference::Fp8Rows;
  const int H = c.spec.hidden, I = c.spec.expert_intermediate;
  EXPECT_EQ(c.spec.activation, Activation::Silu);
  std::vector<double> y(static_cast<size_t>(c.tokens) * H);
  std::vector<float> v(H), xs(H / 128), hs(I / 128), acc(H);
  std::vector<uint8_t> xq(H), hq(I);
  std::vector<float> gu(2 * I), h(I);
  auto dot = [sums](const Fp8Rows& w, size_t r, const uint8_t* qa, const float* sa, int n) {
    return sums == Sums::Fp32 ? dot_w8a8_f32(w, r, qa, sa, n)
                              : static_cast<float>(cpu_reference::dot_w8a8(w, r, qa, sa, n));
  };
  for (int t = 0; t < c.tokens; ++t) {
    for (int k = 0; k < H; ++k) v[k] = bf16_to_float(c.x[static_cast<size_t>(t) * H + k]);
    cpu_reference::quantize_activation_fp8(v.data(), H, ue8m0, xq.data(), xs.data());
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int s = 0; s < c.slots; ++s) {
      const size_t q = static_cast<size_t>(t) * c.slots + s;
      const ExpertView e = c.w->expert(c.ref.routing.ids[q]);
      const Fp8Rows w13{e.w13_fp8, e.w13_scale, static_cast<size_t>(H),
                        static_cast<size_t>(H / 128)};
      const Fp8Rows w2{e.w2_fp8, e.w2_scale, static_cast<size_t>(I), static_cast<size_t>(I / 128)};
      for (int j = 0; j < 2 * I; ++j) {
        gu[j] = bf16_to_float(float_to_bf16(dot(w13, j, xq.data(), xs.data(), H)));
      }
      for (int i = 0; i < I; ++i) h[i] = bf16_to_float(float_to_bf16(silu_mul(gu[i], gu[I + i])));
      cpu_reference::quantize_activation_fp8(h.data(), I, ue8m0, hq.data(), hs.data());
      const float weight = c.ref.routing.weights[q];
      for (int r = 0; r < H; ++r) {
        const float partial = bf16_to_float(float_to_bf16(dot(w2, r, hq.data(), hs.data(), I)));
        acc[r] += weight * partial;
      }
    }
    for (int r = 0; r < H; ++r) {
      y[static_cast<size_t>(t) * H + r] = bf16_to_float(float_to_bf16(acc[r]));
    }
  }
  return y;
}

double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// No GPU needed: the host emulation against the reference, the error the path's rounding points
// give by themselves (the basis of the whole-path tolerance against the reference), and the
// emulation with fp32 sums against the one with double sums, what the order of sums alone moves.
TEST(GpuPrefillFp8, HostEmulationAgainstReference) {
  for (const int tokens : {200, 1000}) {
    const Fp8Case c(tokens);
    ASSERT_FALSE(c.spec.quant.scale_ue8m0);
    const std::vector<double> emulated = emulated_y(c, Sums::Double);
    const double err = rel_error(emulated, c.want);
    const double err_sums = rel_error(emulated_y(c, Sums::Fp32), emulated);
    std::printf(
        "  host emulation T=%d: relative error %.2e against the W8A8 reference; fp32 "
        "sums against double sums %.2e\n",
        tokens, err, err_sums);
    EXPECT_LE(err, kTolReference) << "T=" << tokens << " (seed " << c.seed << ")";
    EXPECT_LE(err_sums, kTolEmulation) << "T=" << tokens << " (seed " << c.seed << ")";
    // the ue8m0 rule moves y by far more than kTolEmulation: the GPU's ue8m0 check can fail
    const double err_ue8m0 = rel_error(emulated_y(c, Sums::Double, true), emulated);
    std::printf("  host emulation T=%d: ue8m0 against plain scales %.2e\n", tokens, err_ue8m0);
    EXPECT_GT(err_ue8m0, 2 * kTolEmulation) << "T=" << tokens;
  }
}

void check_whole_path(int tokens) {
  const Fp8Case c(tokens);
  const MoeSpec& spec = c.spec;
  const int H = spec.hidden, I = spec.expert_intermediate, rows = c.rows, slots = c.slots;
  const std::vector<double> emulated = emulated_y(c, Sums::Double);

  DeviceFp8Weights dw(*c.w, rows, H, I);
  ASSERT_TRUE(dw.w13 != nullptr);
  const int max_tokens = tokens + 3;  // (a workspace for more tokens than run)
  Dev dx(c.x), ids(c.ref.routing.ids), weights(c.ref.routing.weights),
      y(static_cast<size_t>(tokens) * H * sizeof(Bf16)),
      workspace(cuda::prefill_workspace_bytes(max_tokens, slots, rows, H, I, true));
  cuda::PrefillParams p;
  p.tokens = tokens;
  p.hidden = H;
  p.inter = I;
  p.rows = rows;
  p.slots = slots;
  p.max_tokens = max_tokens;
  p.x = dx.as<__nv_bfloat16>();
  p.ids = ids.as<int32_t>();
  p.weights = weights.as<float>();
  p.w13_fp8 = dw.w13->as<uint8_t>();
  p.w13_scale = dw.s13->as<float>();
  p.w2_fp8 = dw.w2->as<uint8_t>();
  p.w2_scale = dw.s2->as<float>();
  p.ue8m0 = spec.quant.scale_ue8m0;
  p.activation = spec.activation;
  p.limit = spec.swiglu_limit;
  p.alpha = spec.swiglu_alpha;
  p.beta = spec.swiglu_beta;
  p.y = y.as<__nv_bfloat16>();
  p.workspace = workspace.p;
  p.workspace_bytes = workspace.bytes;

  p.gate_up_gemm = p.down_gemm = test::grouped_gemm_rows(true).front();
  auto run = [&](cuda::PrefillGemm gemm) {
    EXPECT_EQ(cudaMemset(y.p, 0xFF, y.bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(workspace.p, 0xFF, workspace.bytes), cudaSuccess);
    p.gemm = gemm;
    cuda::launch_prefill_experts(p, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> bits(y.bytes / 2);
    EXPECT_EQ(cudaMemcpy(bits.data(), y.p, y.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return bits;
  };
  const std::vector<uint16_t> cutlass_y = run(cuda::PrefillGemm::Cutlass);
  const std::vector<uint16_t> naive_y = run(cuda::PrefillGemm::Naive);
  for (const auto* got : {&cutlass_y, &naive_y}) {
    const std::string what = std::string(got == &cutlass_y ? "CUTLASS" : "naive") +
                             " T=" + std::to_string(tokens) + " (seed " + std::to_string(c.seed) +
                             ")";
    size_t non_finite = 0;
    const double err_ref = rel_error(*got, c.want, &non_finite);
    EXPECT_EQ(non_finite, 0u) << what;
    const double err_emu = rel_error(*got, emulated, &non_finite);
    EXPECT_LE(err_ref, kTolReference) << what << " against the reference";
    EXPECT_LE(err_emu, got == &cutlass_y ? kTolCutlass : kTolEmulation)
        << what << " against the host emulation";
    std::printf(
        "  fp8 prefill %s: relative error %.2e against the W8A8 reference, %.2e against "
        "the host emulation\n",
        what.c_str(), err_ref, err_emu);
  }
  std::vector<double> naive(naive_y.size());
  for (size_t i = 0; i < naive.size(); ++i) naive[i] = bf16_to_float(Bf16{naive_y[i]});
  size_t non_finite = 0;
  EXPECT_LE(rel_error(cutlass_y, naive, &non_finite), kTolCutlass) << "CUTLASS against naive";
  EXPECT_TRUE(run(cuda::PrefillGemm::Cutlass) == cutlass_y) << "y differs between two runs";
  // every other fp8 instance on both GEMMs: the same bound against the host emulation
  for (const int kernel : test::grouped_gemm_rows(true)) {
    if (kernel == p.gate_up_gemm) continue;
    const char* name = plan::grouped_gemm_kernels()[kernel].name;
    p.gate_up_gemm = p.down_gemm = kernel;
    const std::vector<uint16_t> other = run(cuda::PrefillGemm::Cutlass);
    size_t other_non_finite = 0;
    EXPECT_LE(rel_error(other, emulated, &other_non_finite), kTolCutlass) << name;
    EXPECT_EQ(other_non_finite, 0u) << name;
    EXPECT_TRUE(run(cuda::PrefillGemm::Cutlass) == other) << name << ": y differs between runs";
  }
  p.gate_up_gemm = p.down_gemm = test::grouped_gemm_rows(true).front();

  // ue8m0 activation scales (DeepSeek-V3.1+ / V4's scale_fmt) through the whole path, against
  // the host emulation with the same rule (the checkpoint's weight scales stay as written)
  p.ue8m0 = true;
  const std::vector<uint16_t> ue8m0_y = run(cuda::PrefillGemm::Cutlass);
  size_t ue8m0_non_finite = 0;
  const double ue8m0_err = rel_error(ue8m0_y, emulated_y(c, Sums::Double, true), &ue8m0_non_finite);
  EXPECT_EQ(ue8m0_non_finite, 0u) << "ue8m0";
  EXPECT_LE(ue8m0_err, kTolCutlass) << "ue8m0 T=" << tokens << " against the host emulation";
  std::printf("  fp8 prefill CUTLASS T=%d ue8m0: relative error %.2e against the host emulation\n",
              tokens, ue8m0_err);
  p.ue8m0 = spec.quant.scale_ue8m0;

  // a CUDA graph of the fp8 launch replays to the eager result bit for bit
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  p.gemm = cuda::PrefillGemm::Cutlass;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cuda::launch_prefill_experts(p, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaMemset(y.p, 0xFF, y.bytes));
  CUDA_OK(cudaMemset(workspace.p, 0xFF, workspace.bytes));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<uint16_t> replayed(y.bytes / 2);
  CUDA_OK(cudaMemcpy(replayed.data(), y.p, y.bytes, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(replayed == cutlass_y) << "graph replay differs from the eager run";
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST(GpuPrefillFp8, WholePathAgainstReferenceW8A8T200) {
  SKIP_WITHOUT_PREFILL_GPU();
  check_whole_path(200);
}

TEST(GpuPrefillFp8, WholePathAgainstReferenceW8A8T1000) {
  SKIP_WITHOUT_PREFILL_GPU();
  check_whole_path(1000);
}

// The fp8 checks name the bad value before any launch.
TEST(GpuPrefillFp8, ErrorsNameTheValue) {
  SKIP_WITHOUT_PREFILL_GPU();
  const int H = 512, I = 256, rows = 9, slots = 5, T = 16;
  Dev x(static_cast<size_t>(T) * H * 2), ids(T * slots * 4), weights(T * slots * 4),
      y(static_cast<size_t>(T) * H * 2), w13(static_cast<size_t>(rows) * 2 * I * H),
      w2(static_cast<size_t>(rows) * H * I), s(static_cast<size_t>(rows) * 2 * I * H / 4096),
      workspace(cuda::prefill_workspace_bytes(T, slots, rows, H, I, true));
  cuda::PrefillParams p;
  p.tokens = T;
  p.hidden = H;
  p.inter = I;
  p.rows = rows;
  p.slots = slots;
  p.max_tokens = T;
  p.x = x.as<__nv_bfloat16>();
  p.ids = ids.as<int32_t>();
  p.weights = weights.as<float>();
  p.w13_fp8 = w13.as<uint8_t>();
  p.w13_scale = s.as<float>();
  p.w2_fp8 = w2.as<uint8_t>();
  p.w2_scale = s.as<float>();
  p.y = y.as<__nv_bfloat16>();
  p.workspace = workspace.p;
  p.workspace_bytes = workspace.bytes;
  p.gate_up_gemm = p.down_gemm = test::grouped_gemm_rows(true).front();
  auto expect_error = [&](const cuda::PrefillParams& bad, const std::string& text) {
    try {
      cuda::launch_prefill_experts(bad, nullptr);
      ADD_FAILURE() << "expected an error naming '" << text << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  cuda::PrefillParams bad = p;
  bad.hidden = 576;
  expect_error(bad, "hidden a multiple of 128, got 576");
  bad = p;
  bad.inter = 320;
  expect_error(bad, "inter a multiple of 128, got 320");
  bad = p;
  bad.w2_scale = nullptr;
  expect_error(bad, "w2_scale");
  bad = p;
  bad.w13 = reinterpret_cast<const __nv_bfloat16*>(w13.p);
  expect_error(bad, "w13 and w2 must be null");
  bad = p;
  bad.workspace_bytes = cuda::prefill_workspace_bytes(T, slots, rows, H, I, false) / 2;
  expect_error(bad, "fp8 true");
  bad = p;
  bad.gate_up_gemm = test::grouped_gemm_rows(false).front();
  expect_error(bad, "takes bf16 operands; the weights are fp8");
}

}  // namespace
}  // namespace moekit

// The whole GPU prefill path on fp8 block-scale experts (launch_prefill_experts with w13_fp8 set)
// against the CPU reference forward in W8A8 (cpu_reference::forward, Fp8Compute::W8A8, fused
// shared slot), on a DeepSeek-V3 config shrunk to H 512, I 256, 8 experts, top-k 4 and its one
// shared expert as a fused slot (the ninth weight row), written as an fp8 checkpoint by the
// project's writer and loaded with LoadOptions::expert_dtype = F8_E4M3; 200 and 1000 tokens,
// fresh random inputs each run. The GPU takes the reference's routing (ids, weights) so the
// experts and the combine are what is compared.
//
// Tolerance (relative error by norm, y against the reference's y): 5e-2. The reference keeps the
// gate/up projections and h in double before quantising h to e4m3; the path rounds gate/up to
// bf16 (2^-9 relative) and computes h in fp32 from them, and that perturbation moves some h
// values across an e4m3 rounding boundary (a step of 2^-4..2^-3 relative): a few percent of h's
// elements each off by one e4m3 step, an error of about 1-2% of h's norm that the down projection
// carries into y. The CUTLASS and the naive GEMM share every rounding point but the fp32
// summation order: y of one against the other <= 1e-2. Runs repeat bit for bit.
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

#include "../fp8_test_util.h"
#include "cuda/prefill/prefill.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

#define SKIP_WITHOUT_PREFILL_GPU()                                              \
  do {                                                                          \
    std::string why_;                                                           \
    if (!cuda::available(&why_)) GTEST_SKIP() << "no usable GPU: " << why_;     \
    const char* why_prefill_ = nullptr;                                         \
    if (!cuda::prefill_supported(&why_prefill_)) GTEST_SKIP() << why_prefill_;  \
  } while (0)

#define CUDA_OK(stmt) ASSERT_EQ((stmt), cudaSuccess) << #stmt

struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) {
    if (n > 0 && cudaMalloc(&p, n) != cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc(" << n << ") failed";
      p = nullptr;
    }
  }
  template <typename T>
  explicit Dev(const std::vector<T>& host) : Dev(host.size() * sizeof(T)) {
    if (p != nullptr) {
      EXPECT_EQ(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() {
    if (p != nullptr) (void)cudaFree(p);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

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

void check_whole_path(int tokens) {
  const MoeSpec spec = deepseek_fp8_spec();
  ASSERT_TRUE(spec.can_fuse_shared());
  ASSERT_EQ(spec.shared_slots(), 1);
  const int layer = spec.moe_layers.front();
  const std::string dir = scratch_dir(std::to_string(tokens));
  std::random_device seed_source;
  const uint64_t seed = seed_source();
  test::write_fp8_checkpoint(spec, layer, seed, false, dir);
  LoadOptions opts;
  opts.expert_dtype = DType::F8_E4M3;
  const auto w = load_checkpoint_weights(spec, layer, dir, opts);
  ASSERT_EQ(w->expert_dtype(), DType::F8_E4M3);
  const int H = spec.hidden, I = spec.expert_intermediate;

  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<Bf16> x(static_cast<size_t>(tokens) * H);
  for (auto& v : x) v = float_to_bf16(u(rng));
  const ForwardResult ref =
      cpu_reference::forward(*w, x.data(), tokens, FuseShared::On, Fp8Compute::W8A8);
  ASSERT_TRUE(ref.fused);
  const std::vector<double> want(ref.y.begin(), ref.y.end());
  const int rows = spec.weight_rows(true), slots = ref.routing.slots;
  ASSERT_EQ(slots, spec.top_k + 1);

  DeviceFp8Weights dw(*w, rows, H, I);
  ASSERT_TRUE(dw.w13 != nullptr);
  const int max_tokens = tokens + 3;  // (a workspace for more tokens than run)
  Dev dx(x), ids(ref.routing.ids), weights(ref.routing.weights),
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
    const char* what = got == &cutlass_y ? "CUTLASS" : "naive";
    size_t non_finite = 0;
    const double err = rel_error(*got, want, &non_finite);
    EXPECT_EQ(non_finite, 0u) << what << " T=" << tokens;
    EXPECT_LE(err, 5e-2) << what << " T=" << tokens << " (seed " << seed << ")";
    std::printf("  fp8 prefill %s T=%d: relative error %.2e against the W8A8 reference\n", what,
                tokens, err);
  }
  std::vector<double> naive(naive_y.size());
  for (size_t i = 0; i < naive.size(); ++i) naive[i] = bf16_to_float(Bf16{naive_y[i]});
  size_t non_finite = 0;
  EXPECT_LE(rel_error(cutlass_y, naive, &non_finite), 1e-2) << "CUTLASS against naive";
  EXPECT_TRUE(run(cuda::PrefillGemm::Cutlass) == cutlass_y) << "y differs between two runs";
  std::filesystem::remove_all(dir);
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
}

}  // namespace
}  // namespace moekit

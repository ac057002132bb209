// Router GEMM on the GPU against the CPU reference: every built-in table row, every candidate
// the tuner can pick and the fallback, at M on the tile boundaries (1..17, 31, 33, 127, 128), with
// K not a multiple of the K tile, N not a multiple of 16, bf16 and fp32 weights, with and without
// bias; the dispatch, CUDA-graph capture after warm-up, determinism, and rejected inputs.
// Outputs are poisoned with NaN before every run and guarded past their end.
// Skipped, with a message, where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../expect_error.h"
#include "common/random_values.h"
#include "cuda/common/cuda_check.h"
#include "cuda/router_gemm/router_gemm.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/weights.h"
#include "moekit/router_gemm.h"
#include "moekit/spec.h"
#include "moekit/tuning.h"

namespace moekit::cuda {
namespace {

using tuning::RouterGemmBackend;
using tuning::RouterGemmConfig;

bool have_gpu(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err);
    return false;
  }
  if (count == 0) {
    *why = "no CUDA device";
    return false;
  }
  return true;
}

#define MK_REQUIRE_GPU()                                          \
  do {                                                            \
    std::string why_;                                             \
    if (!have_gpu(&why_)) GTEST_SKIP() << "no GPU: " << why_;     \
  } while (0)

struct Shape {
  DType dtype;
  int k;
  int n;
  bool bias;
};

std::string name(const Shape& s) {
  return std::string(dtype_name(s.dtype)) + " K=" + std::to_string(s.k) + " N=" +
         std::to_string(s.n) + (s.bias ? " +bias" : "");
}

constexpr int kMaxM = 128;
constexpr int kGuard = 64;  // floats past the end of out that must stay untouched
const std::vector<int> kBoundaryMs = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
                                      31, 33, 127, 128};

// One shape's inputs on host and device, and the fp64 reference for every M <= kMaxM.
class Fixture {
 public:
  explicit Fixture(const Shape& s, uint64_t seed = 1) : s_(s) {
    using random_values::Tensor;
    const uint64_t kw = random_values::stream_key(seed, 0, Tensor::RouterWeight, -1);
    const uint64_t kx = random_values::stream_key(seed, 0, Tensor::Input, -1);
    const uint64_t kb = random_values::stream_key(seed, 0, Tensor::RouterBias, -1);
    x_.resize(static_cast<size_t>(kMaxM) * s.k);
    for (size_t i = 0; i < x_.size(); ++i) x_[i] = float_to_bf16(random_values::uniform(kx, i));
    // Weights bf16-exact even when stored fp32, so the reference sees the device's exact inputs.
    wf_.resize(static_cast<size_t>(s.n) * s.k);
    for (size_t i = 0; i < wf_.size(); ++i) wf_[i] = round_to_bf16(random_values::uniform(kw, i));
    if (s.bias) {
      bias_.resize(s.n);
      for (int i = 0; i < s.n; ++i) bias_[i] = random_values::uniform(kb, i) * 4;
    }
    // reference: fp64 sums, and sum of |x w| (the scale of fp32 rounding error)
    ref_.resize(static_cast<size_t>(kMaxM) * s.n);
    mag_.resize(ref_.size());
    for (int m = 0; m < kMaxM; ++m)
      for (int n = 0; n < s.n; ++n) {
        double acc = 0, mag = 0;
        for (int k = 0; k < s.k; ++k) {
          const double p = static_cast<double>(bf16_to_float(x_[static_cast<size_t>(m) * s.k + k])) *
                           wf_[static_cast<size_t>(n) * s.k + k];
          acc += p;
          mag += std::fabs(p);
        }
        if (s.bias) {
          acc += bias_[n];
          mag += std::fabs(bias_[n]);
        }
        ref_[static_cast<size_t>(m) * s.n + n] = acc;
        mag_[static_cast<size_t>(m) * s.n + n] = mag;
      }
    // device copies; x and w get 16 extra bytes so misaligned views stay in bounds
    MK_CUDA_CHECK(cudaMalloc(&dx_, x_.size() * 2 + 16));
    MK_CUDA_CHECK(cudaMemcpy(dx_, x_.data(), x_.size() * 2, cudaMemcpyHostToDevice));
    const size_t wb = wf_.size() * dtype_size(s.dtype);
    MK_CUDA_CHECK(cudaMalloc(&dw_, wb + 16));
    if (s.dtype == DType::F32) {
      MK_CUDA_CHECK(cudaMemcpy(dw_, wf_.data(), wb, cudaMemcpyHostToDevice));
    } else {
      std::vector<Bf16> wb16(wf_.size());
      for (size_t i = 0; i < wf_.size(); ++i) wb16[i] = float_to_bf16(wf_[i]);
      MK_CUDA_CHECK(cudaMemcpy(dw_, wb16.data(), wb, cudaMemcpyHostToDevice));
    }
    MK_CUDA_CHECK(cudaMalloc(&dbias_, std::max(s.n, 1) * sizeof(float)));
    if (s.bias) {
      MK_CUDA_CHECK(cudaMemcpy(dbias_, bias_.data(), s.n * sizeof(float), cudaMemcpyHostToDevice));
    }
    MK_CUDA_CHECK(cudaMalloc(&dout_, (ref_.size() + kGuard) * sizeof(float)));
    MK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~Fixture() {
    MK_CUDA_WARN(cudaFree(dx_));
    MK_CUDA_WARN(cudaFree(dw_));
    MK_CUDA_WARN(cudaFree(dbias_));
    MK_CUDA_WARN(cudaFree(dout_));
    MK_CUDA_WARN(cudaStreamDestroy(stream_));
  }

  RouterGemmProblem problem(int m) const {
    RouterGemmProblem p;
    p.m = m;
    p.n = s_.n;
    p.k = s_.k;
    p.weight_dtype = s_.dtype;
    p.x = dx_;
    p.weight = dw_;
    p.bias = s_.bias ? dbias_ : nullptr;
    p.out = dout_;
    return p;
  }
  cudaStream_t stream() const { return stream_; }

  // Fills out and its guard with NaN (0xff bytes).
  void poison() const {
    MK_CUDA_CHECK(cudaMemsetAsync(dout_, 0xff, (ref_.size() + kGuard) * sizeof(float), stream_));
  }

  // Output [m, n] plus the guard, after the stream finishes.
  std::vector<float> fetch(int m) const {
    std::vector<float> out(static_cast<size_t>(m) * s_.n + kGuard);
    MK_CUDA_CHECK(cudaMemcpyAsync(out.data(), dout_, out.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return out;
  }

  // Compares out [m, n] to the reference; error bound 1e-5 of sum |x w| (the scale of fp32
  // accumulation error, which a plain |ref| would not be when the sum cancels). The guard must
  // still hold the poison. Returns "" or the first mismatches and the max error.
  std::string check(const std::vector<float>& out, int m) const {
    std::string msg;
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < m * s_.n; ++i) {
      const double err = std::fabs(out[i] - ref_[i]) / std::max(mag_[i], 1e-30);
      if (!(err <= 1e-5)) {  // NaN fails too: an element never written
        if (++bad <= 3) {
          msg += " [m=" + std::to_string(i / s_.n) + " n=" + std::to_string(i % s_.n) +
                 ": got " + std::to_string(out[i]) + " want " + std::to_string(ref_[i]) + "]";
        }
      }
      if (!std::isnan(err)) worst = std::max(worst, err);
    }
    for (int i = 0; i < kGuard; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &out[static_cast<size_t>(m) * s_.n + i], 4);
      if (bits != 0xffffffffu) {
        msg += " [wrote past the end of out at +" + std::to_string(i) + "]";
        break;
      }
    }
    if (bad > 0 || !msg.empty()) {
      msg = std::to_string(bad) + " mismatches, max err/sum|xw| " + std::to_string(worst) + msg;
    }
    return msg;
  }

  // Poison, run `config` (or the dispatch when null), check.
  std::string run_and_check(int m, const RouterGemmConfig* config) const {
    poison();
    if (config != nullptr) {
      router_gemm(problem(m), *config, stream_);
    } else {
      router_gemm(problem(m), stream_);
    }
    MK_CUDA_CHECK(cudaGetLastError());
    return check(fetch(m), m);
  }

 private:
  Shape s_;
  std::vector<Bf16> x_;
  std::vector<float> wf_, bias_;
  std::vector<double> ref_, mag_;
  void* dx_ = nullptr;
  void* dw_ = nullptr;
  float* dbias_ = nullptr;
  float* dout_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// Gate shapes of the models, and shapes that hit the edges: K not a multiple of 32 (or 16),
// N not a multiple of 16 (or of 8), N below one mma tile.
const std::vector<Shape> kShapes = {
    {DType::BF16, 7168, 256, false}, {DType::BF16, 2880, 128, true},
    {DType::BF16, 4096, 8, false},   {DType::BF16, 1000, 67, true},
    {DType::BF16, 136, 5, false},    {DType::F32, 3072, 256, false},
    {DType::F32, 1000, 67, true},
};

TEST(RouterGemmCuda, EveryCandidateAtTileBoundaries) {
  MK_REQUIRE_GPU();
  for (const Shape& s : kShapes) {
    Fixture f(s);
    for (int m : kBoundaryMs) {
      std::vector<RouterGemmConfig> configs = tuning::router_gemm_candidates(s.dtype, s.k, s.n, m);
      configs.push_back(tuning::router_gemm_fallback());
      for (const RouterGemmConfig& c : configs) {
        const std::string err = f.run_and_check(m, &c);
        EXPECT_EQ(err, "") << name(s) << " M=" << m << " " << tuning::describe(c);
      }
    }
  }
}

TEST(RouterGemmCuda, EveryTableRow) {
  MK_REQUIRE_GPU();
  for (tuning::Arch a : {tuning::Arch::Generic, tuning::Arch::Sm90, tuning::Arch::Sm100}) {
    const auto rows = tuning::builtin_table(a);
    for (size_t i = 0; i < rows.size(); ++i) {
      const tuning::RouterGemmRow& r = rows[i];
      // Wildcard rows run on every test shape of their dtype; concrete rows on their own shape.
      std::vector<Shape> shapes;
      if (r.k != 0 && r.n != 0) {
        shapes.push_back({r.weight_dtype, r.k, r.n, false});
      } else {
        for (const Shape& s : kShapes)
          if (s.dtype == r.weight_dtype && (r.k == 0 || r.k == s.k) && (r.n == 0 || r.n == s.n))
            shapes.push_back(s);
      }
      for (const Shape& s : shapes) {
        if (tuning::router_gemm_config_problem(r.config, s.dtype, s.k, s.n, 1) != nullptr) continue;
        Fixture f(s);
        const int mid = std::min((r.m_min + r.m_max) / 2, kMaxM);
        for (int m : {r.m_min, mid, std::min(r.m_max, kMaxM)}) {
          if (m > kMaxM) continue;
          const std::string err = f.run_and_check(m, &r.config);
          EXPECT_EQ(err, "") << tuning::arch_name(a) << " row " << i << " " << name(s)
                             << " M=" << m << " " << tuning::describe(r.config);
        }
      }
    }
  }
}

TEST(RouterGemmCuda, DispatchAndMisalignedPointers) {
  MK_REQUIRE_GPU();
  for (const Shape& s : kShapes) {
    Fixture f(s);
    for (int m : kBoundaryMs) EXPECT_EQ(f.run_and_check(m, nullptr), "") << name(s) << " M=" << m;
  }
  // K % 8 != 0: only the fallback and cuBLAS can run it; the dispatch picks the fallback.
  Fixture odd({DType::BF16, 100, 24, true});
  for (int m : {1, 7, 33}) EXPECT_EQ(odd.run_and_check(m, nullptr), "") << "K=100 M=" << m;
  RouterGemmProblem p = odd.problem(3);
  EXPECT_EQ(router_gemm_choice(p).source, tuning::ConfigSource::Fallback);
  // A dot config cannot take a weight pointer that is not 16-byte aligned; the dispatch falls
  // back to the naive kernel instead (checked on a view one element in: only the error text and
  // the choice are checked, the values differ from the reference by construction).
  Fixture f({DType::BF16, 512, 32, false});
  p = f.problem(1);
  p.weight = static_cast<const char*>(p.weight) + 2;
  const RouterGemmConfig dot{RouterGemmBackend::Dot, 256, 1, 1, 1};
  test::expect_error([&] { router_gemm(p, dot, f.stream()); }, {"16-byte aligned"});
  EXPECT_EQ(router_gemm_choice(p).config, tuning::router_gemm_fallback());
}

using test::expect_error;

TEST(RouterGemmCuda, RejectsIllegalShapesAndConfigs) {
  MK_REQUIRE_GPU();
  Fixture f({DType::BF16, 100, 24, false});
  const cudaStream_t st = f.stream();
  RouterGemmProblem p = f.problem(4);
  expect_error([&] { router_gemm(p, RouterGemmConfig{RouterGemmBackend::Dot, 256, 1, 4, 1}, st); },
               {"K must be a multiple of 8"});
  expect_error([&] { router_gemm(p, RouterGemmConfig{RouterGemmBackend::Dot, 256, 1, 4, 1}, st); },
               {"K=100"});
  Fixture f32({DType::F32, 512, 32, false});
  expect_error([&] {
    router_gemm(f32.problem(8), RouterGemmConfig{RouterGemmBackend::SplitK, 256, 16, 8, 2}, st);
  }, {"splitk: weights must be BF16"});
  Fixture bf16({DType::BF16, 512, 32, false});
  expect_error([&] {
    router_gemm(bf16.problem(8), RouterGemmConfig{RouterGemmBackend::SplitK, 256, 16, 8, 16}, st);
  }, {"split_k must be in 1..8"});
  expect_error([&] {
    router_gemm(bf16.problem(8), RouterGemmConfig{RouterGemmBackend::Dot, 256, 3, 8, 1}, st);
  }, {"no compiled kernel"});
  RouterGemmProblem q = p;
  q.m = -1;
  expect_error([&] { router_gemm(q, st); }, {"expected m >= 0, got m=-1"});
  q = p;
  q.k = 0;
  expect_error([&] { router_gemm(q, st); }, {"expected k > 0, got k=0"});
  q = p;
  q.weight_dtype = DType::F16;
  expect_error([&] { router_gemm(q, st); }, {"expected weight dtype BF16 or F32, got F16"});
  q = p;
  q.x = nullptr;
  expect_error([&] { router_gemm(q, st); }, {"expected x (bf16 [m, k]) to be set"});
  // m == 0: nothing runs, out keeps its poison, null pointers are fine.
  f.poison();
  q = p;
  q.m = 0;
  q.x = nullptr;
  router_gemm(q, st);
  const std::vector<float> out = f.fetch(1);
  for (float v : out) EXPECT_TRUE(std::isnan(v));
}

// The dot kernel with K split over a cluster of 2..8 CTAs, on every test shape, including shapes
// where the split leaves CTAs an empty K range (K=136: 17 vectors over 8 CTAs of 3) or threads
// idle, with and without bias, at M across the token tiles.
TEST(RouterGemmCuda, DotSplitOverClusterEveryShape) {
  MK_REQUIRE_GPU();
  for (const Shape& s : kShapes) {
    Fixture f(s);
    for (int split : {2, 4, 8}) {
      for (const RouterGemmConfig& c :
           {RouterGemmConfig{RouterGemmBackend::Dot, 64, 1, 1, split},
            RouterGemmConfig{RouterGemmBackend::Dot, 128, 2, 2, split},
            RouterGemmConfig{RouterGemmBackend::Dot, 256, 1, 8, split},
            RouterGemmConfig{RouterGemmBackend::Dot, 256, 2, 4, split}}) {
        if (tuning::router_gemm_config_problem(c, s.dtype, s.k, s.n, 17) != nullptr) continue;
        for (int m : {1, 3, 4, 9, 17}) {
          const std::string err = f.run_and_check(m, &c);
          EXPECT_EQ(err, "") << name(s) << " M=" << m << " " << tuning::describe(c);
        }
      }
    }
  }
}

TEST(RouterGemmCuda, DeterministicAcrossRuns) {
  MK_REQUIRE_GPU();
  Fixture f({DType::BF16, 7168, 256, false});
  for (const RouterGemmConfig& c :
       {RouterGemmConfig{RouterGemmBackend::SplitK, 256, 16, 8, 8},
        RouterGemmConfig{RouterGemmBackend::SplitK, 128, 32, 32, 4},
        RouterGemmConfig{RouterGemmBackend::Dot, 256, 2, 4, 1},
        RouterGemmConfig{RouterGemmBackend::Dot, 128, 2, 8, 8}}) {
    f.poison();
    router_gemm(f.problem(33), c, f.stream());
    const std::vector<float> a = f.fetch(33);
    f.poison();
    router_gemm(f.problem(33), c, f.stream());
    const std::vector<float> b = f.fetch(33);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), 33 * 256 * sizeof(float)), 0) << tuning::describe(c);
  }
}

TEST(RouterGemmCuda, GraphCaptureAfterWarmUpFromTheSpec) {
  MK_REQUIRE_GPU();
  for (const char* model : {"deepseek-v3", "gpt-oss-120b", "minimax-m2"}) {
    const MoeSpec spec = load_spec(model);
    const tuning::RouterGemmShape shape = tuning::router_gemm_shapes(spec).at(0);
    Fixture f({shape.weight_dtype, shape.k, shape.n, shape.has_bias});
    warm_up_router_gemm(spec, kMaxM, f.stream());
    for (int m : {1, 4, 16, 128}) {
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      f.poison();
      MK_CUDA_CHECK(cudaStreamSynchronize(f.stream()));
      MK_CUDA_CHECK(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeThreadLocal));
      router_gemm(f.problem(m), f.stream());
      MK_CUDA_CHECK(cudaStreamEndCapture(f.stream(), &graph));
      MK_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      MK_CUDA_CHECK(cudaGraphLaunch(exec, f.stream()));
      EXPECT_EQ(f.check(f.fetch(m), m), "") << model << " M=" << m << " (graph)";
      MK_CUDA_CHECK(cudaGraphExecDestroy(exec));
      MK_CUDA_CHECK(cudaGraphDestroy(graph));
    }
    // cuBLAS inside a capture, once its state exists.
    const RouterGemmConfig cublas{RouterGemmBackend::Cublas, 0, 0, 0, 1};
    EXPECT_EQ(f.run_and_check(kMaxM, &cublas), "");
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    f.poison();
    MK_CUDA_CHECK(cudaStreamSynchronize(f.stream()));
    MK_CUDA_CHECK(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeThreadLocal));
    router_gemm(f.problem(kMaxM), cublas, f.stream());
    MK_CUDA_CHECK(cudaStreamEndCapture(f.stream(), &graph));
    MK_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    MK_CUDA_CHECK(cudaGraphLaunch(exec, f.stream()));
    EXPECT_EQ(f.check(f.fetch(kMaxM), kMaxM), "") << model << " cuBLAS (graph)";
    MK_CUDA_CHECK(cudaGraphExecDestroy(exec));
    MK_CUDA_CHECK(cudaGraphDestroy(graph));
  }
}

// The host entry (same arguments as cpu_reference::router_logits) on real specs' random weights:
// router bias (gpt-oss), fp32 router (MiniMax-M2), gated shared expert's extra column (Qwen2).
TEST(RouterGemmCuda, HostEntryMatchesCpuReferenceOnModels) {
  MK_REQUIRE_GPU();
  for (const char* model : {"gpt-oss-120b", "minimax-m2", "qwen2-57b-a14b", "deepseek-v3"}) {
    const MoeSpec spec = load_spec(model);
    const auto w = make_random_weights(spec, spec.moe_layers.at(0), 7);
    for (int tokens : {1, 7, 33}) {
      std::vector<Bf16> x(static_cast<size_t>(tokens) * spec.hidden);
      const uint64_t key = random_values::stream_key(3, 0, random_values::Tensor::Input, -1);
      for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(random_values::uniform(key, i));
      const std::vector<float> want = cpu_reference::router_logits(*w, x.data(), tokens);
      const std::vector<float> got = router_logits(*w, x.data(), tokens);
      ASSERT_EQ(got.size(), want.size());
      double scale = 1e-30, diff = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
        const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
        diff = std::isnan(d) ? INFINITY : std::max(diff, d);
      }
      // why 1e-4 of the largest logit (not 1e-5 of sum |x w| as above): this API does not expose
      // the per-element magnitudes; fp32 error is ~1e-6 of sum |x w| ~ sqrt(K) x the logits.
      EXPECT_LE(diff, 1e-4 * scale) << model << " tokens=" << tokens;
    }
  }
}

// The timer behind `moekit tune` and `moekit bench router-gemm`: outputs agree across backends
// (it checks candidates with run()), times are positive and finite, PDL can be switched.
TEST(RouterGemmCuda, TimerRunsAndTimesEveryBackend) {
  MK_REQUIRE_GPU();
  const tuning::RouterGemmShape shape{DType::BF16, 1024, 64, true};
  RouterGemmTimer timer(shape, 16);
  EXPECT_GE(timer.copies(), 2);
  const RouterGemmConfig cublas{RouterGemmBackend::Cublas, 0, 0, 0, 1};
  const std::vector<float> ref = timer.run(tuning::router_gemm_fallback(), 16);
  ASSERT_EQ(ref.size(), 16u * 64u);
  for (const RouterGemmConfig& c :
       {cublas, RouterGemmConfig{RouterGemmBackend::Dot, 128, 2, 8, 1},
        RouterGemmConfig{RouterGemmBackend::SplitK, 128, 16, 16, 2}}) {
    const std::vector<float> got = timer.run(c, 16);
    double scale = 0, diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
    }
    EXPECT_LE(diff, 1e-5 * scale) << tuning::describe(c);
    const double us = timer.time_config_us(c, 16);
    EXPECT_TRUE(us > 0 && std::isfinite(us)) << tuning::describe(c) << " " << us;
  }
  const bool pdl = router_gemm_pdl();
  set_router_gemm_pdl(!pdl);
  EXPECT_EQ(router_gemm_pdl(), !pdl);
  EXPECT_GT(timer.time_dispatch_us(3), 0.0);
  set_router_gemm_pdl(pdl);
  EXPECT_GT(timer.time_dispatch_us(3), 0.0);
  EXPECT_GT(timer.time_empty_us(), 0.0);
  EXPECT_GT(timer.bytes(1), 1024.0 * 64 * 2);
}

// In a decode step the router GEMM follows a kernel that writes its x and lets it launch early
// (PDL): every backend, launched after the timer's stand-in with x poisoned until the stand-in
// writes it, returns what it returns on the written x (a kernel that read x, or wrote out, before
// its griddepcontrol.wait returns NaN or is overwritten); the in-step time is finite.
TEST(RouterGemmCuda, InStepLaunchReadsXOnlyAfterThePreviousKernelWroteIt) {
  MK_REQUIRE_GPU();
  const bool pdl = router_gemm_pdl();
  set_router_gemm_pdl(true);
  for (const tuning::RouterGemmShape& shape :
       {tuning::RouterGemmShape{DType::BF16, 7168, 256, false},
        tuning::RouterGemmShape{DType::F32, 3072, 256, false},
        tuning::RouterGemmShape{DType::BF16, 2880, 128, true}}) {
    RouterGemmTimer timer(shape, 16);
    std::vector<RouterGemmConfig> configs = {
        tuning::router_gemm_fallback(), RouterGemmConfig{RouterGemmBackend::Cublas, 0, 0, 0, 1},
        RouterGemmConfig{RouterGemmBackend::Dot, 256, 1, 1, 1},
        RouterGemmConfig{RouterGemmBackend::Dot, 128, 2, 4, 2}};
    if (shape.weight_dtype == DType::BF16) {
      configs.push_back(RouterGemmConfig{RouterGemmBackend::SplitK, 256, 16, 8, 4});
      configs.push_back(RouterGemmConfig{RouterGemmBackend::SplitK, 128, 32, 16, 1});
    }
    for (const RouterGemmConfig& c : configs) {
      for (int m : {1, 3, 16}) {
        if (tuning::router_gemm_config_problem(c, shape.weight_dtype, shape.k, shape.n, m) !=
            nullptr)
          continue;
        const std::vector<float> in_step = timer.run_in_step(c, m);
        const std::vector<float> ref = timer.run(tuning::router_gemm_fallback(), m);
        ASSERT_EQ(in_step.size(), ref.size());
        double scale = 0, diff = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          ASSERT_TRUE(std::isfinite(in_step[i]))
              << tuning::describe(c) << " " << tuning::describe(shape) << " M=" << m << " i=" << i;
          scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
          diff = std::max(diff, std::fabs(static_cast<double>(in_step[i]) - ref[i]));
        }
        EXPECT_LE(diff, 1e-5 * scale)
            << tuning::describe(c) << " " << tuning::describe(shape) << " M=" << m;
      }
    }
    const double us = timer.time_in_step_us(nullptr, 1);
    EXPECT_TRUE(std::isfinite(us) && us > -1.0) << us;  // a difference of two graph times
    const double empty = timer.time_in_step_empty_us();
    EXPECT_TRUE(std::isfinite(empty) && empty > -1.0) << empty;
  }
  set_router_gemm_pdl(pdl);
}

}  // namespace
}  // namespace moekit::cuda

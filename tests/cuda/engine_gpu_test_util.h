// What the engine API's GPU tests share (test_engine_api_gpu.cpp, test_engine_fp8_gpu.cpp,
// test_ep_gpu.cpp): a device buffer, the engine's device copy of make_stacks' buffers (bf16 or
// fp8) with the device view of it, and a MoeOp with its prepared workspace.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "../engine_test_util.h"
#include "moekit/moe.h"
#include "moekit/plan.h"

namespace moekit::test {

// One cudaMalloc'ed buffer (freed at scope exit), optionally filled from the host.
struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n, const void* host = nullptr) : bytes(n) {
    EXPECT_EQ(cudaMalloc(&p, n > 0 ? n : 16), cudaSuccess);
    if (host != nullptr && n > 0)
      EXPECT_EQ(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> to_host(size_t count) const {
    std::vector<T> v(count);
    EXPECT_EQ(cudaMemcpy(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

// The engine's device copy of make_stacks' buffers and the device view of it.
struct DeviceStacks {
  std::unique_ptr<Dev> router, router_bias, corr_bias, w13, w2, b13, b2, shared_w13, shared_w2;
  std::unique_ptr<Dev> w13_fp8, w13_scale, w2_fp8, w2_scale;
  MoeWeightsView view;

  explicit DeviceStacks(const EngineStacks& h) {
    auto up = [](const auto& v) {
      return v.empty() ? nullptr : std::make_unique<Dev>(v.size() * sizeof(v[0]), v.data());
    };
    router = up(h.router);
    router_bias = up(h.router_bias);
    corr_bias = up(h.correction_bias);
    w13 = up(h.w13);
    w2 = up(h.w2);
    b13 = up(h.b13);
    b2 = up(h.b2);
    shared_w13 = up(h.shared_w13);
    shared_w2 = up(h.shared_w2);
    w13_fp8 = up(h.w13_fp8);
    w13_scale = up(h.w13_scale);
    w2_fp8 = up(h.w2_fp8);
    w2_scale = up(h.w2_scale);
    view = h.view;
    view.location = Location::Device;
    auto ptr = [](const std::unique_ptr<Dev>& d) { return d ? d->p : nullptr; };
    view.router_weight = ptr(router);
    view.router_bias = static_cast<const float*>(ptr(router_bias));
    view.correction_bias = static_cast<const float*>(ptr(corr_bias));
    view.w13 = static_cast<const Bf16*>(ptr(w13));
    view.w2 = static_cast<const Bf16*>(ptr(w2));
    view.b13 = static_cast<const float*>(ptr(b13));
    view.b2 = static_cast<const float*>(ptr(b2));
    view.shared_w13 = static_cast<const Bf16*>(ptr(shared_w13));
    view.shared_w2 = static_cast<const Bf16*>(ptr(shared_w2));
    view.w13_fp8 = static_cast<const uint8_t*>(ptr(w13_fp8));
    view.w13_scale = static_cast<const float*>(ptr(w13_scale));
    view.w2_fp8 = static_cast<const uint8_t*>(ptr(w2_fp8));
    view.w2_scale = static_cast<const float*>(ptr(w2_scale));
  }
};

inline MoeOptions engine_options(int max_tokens, FuseShared fuse) {
  MoeOptions o;
  o.max_tokens = max_tokens;
  o.fuse = fuse;
  o.overrides = plan::plan_overrides_from_env();
  return o;
}

// A MoeOp with its prepared workspace.
struct Engine {
  MoeOp op;
  std::unique_ptr<Dev> ws;
  Engine(const MoeSpec& spec, const MoeOptions& o) : op(spec, o) {
    ws = std::make_unique<Dev>(op.workspace_bytes());
    op.prepare_workspace(ws->p, ws->bytes, nullptr);
  }
};

}  // namespace moekit::test

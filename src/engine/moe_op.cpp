// MoeOp (include/moekit/moe.h): validation, the fusion a call runs with, and the host views'
// calls on the CPU backends (ViewLayerWeights: the borrowed weights, nothing copied). Device
// views go to the CUDA side (gpu_hooks.h) after the same validation.
#include <vector>

#include "engine/gpu_hooks.h"
#include "moekit/cpu_fast.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/moe.h"
#include "moekit/routing.h"

namespace moekit {

std::string MoeStatus::message() const {
  if (ok()) return "";
  return "the device saw an expert id outside [0, E) in the routing (its pair was dropped; the "
         "outputs of that call are undefined)";
}

size_t workspace_bytes(const MoeSpec& spec, int max_tokens, const MoeOptions& options) {
  MK_CHECK(max_tokens >= 1, "expected max_tokens >= 1, got " << max_tokens);
  return engine_gpu::workspace_bytes(spec, max_tokens, options);
}

bool engine_gpu::fused_for(const MoeWeightsView& w, FuseShared fuse, const bool* plan_auto) {
  const bool can_fuse = w.fused_slots > 0, can_unfuse = w.shared_w13 != nullptr;
  if (!can_fuse && !can_unfuse) return false;  // no shared expert here (or not on this rank)
  switch (fuse) {
    case FuseShared::On:
      MK_CHECK(can_fuse,
               "fuse on needs the fused shared slots in the view (fused_slots), but it "
               "holds only the unfused shared MLP");
      return true;
    case FuseShared::Off:
      MK_CHECK(can_unfuse,
               "fuse off needs the unfused shared MLP in the view (shared_w13, "
               "shared_w2), but it holds only the fused slots");
      return false;
    case FuseShared::Auto:
      if (can_fuse && can_unfuse && plan_auto != nullptr) return *plan_auto;
      return can_fuse;
  }
  return false;
}

namespace {

void store_bf16(const std::vector<float>& y, void* out) {
  Bf16* o = static_cast<Bf16*>(out);
  for (size_t i = 0; i < y.size(); ++i) o[i] = float_to_bf16(y[i]);
}

}  // namespace

MoeOp::MoeOp(const MoeSpec& spec, const MoeOptions& options) : spec_(spec), options_(options) {
  validate_spec(spec_);
  MK_CHECK(options_.max_tokens >= 1, "expected max_tokens >= 1, got " << options_.max_tokens);
  MK_CHECK(options_.device >= 0, "expected device >= 0, got " << options_.device);
  MK_CHECK(options_.expert_dtype == DType::BF16 || options_.expert_dtype == DType::F8_E4M3,
           "expected MoeOptions::expert_dtype BF16 or F8_E4M3, got "
               << dtype_name(options_.expert_dtype));
}

MoeOp::~MoeOp() {
  if (gpu_ != nullptr) engine_gpu::destroy(gpu_);
}

size_t MoeOp::workspace_bytes() const {
  return moekit::workspace_bytes(spec_, options_.max_tokens, options_);
}

void MoeOp::prepare_workspace(void* workspace, size_t bytes, CUstream_st* stream) {
  if (gpu_ == nullptr) gpu_ = engine_gpu::create(spec_, options_);
  engine_gpu::prepare_workspace(*gpu_, workspace, bytes, stream);
}

MoeOp::Gpu& MoeOp::gpu(const char* what) const {
  engine_gpu::require_cuda(what);
  MK_CHECK(gpu_ != nullptr, what << " on a device view: call prepare_workspace(workspace, bytes, "
                                    "stream) once first");
  return *gpu_;
}

namespace {

void check_call(const MoeSpec& spec, const MoeOptions& opt, const MoeWeightsView& w, int tokens,
                ViewUse use) {
  validate_view(spec, w, use);
  MK_CHECK(w.location == Location::Host || !w.mx() || use == ViewUse::Router ||
               use == ViewUse::RoutingBias,
           "MX views (mx_format " << expert_format_name(w.mx_format)
                                  << ") run on the CPU backends: the GPU holds MX experts in its "
                                     "own layout (cuda::GpuMoeLayer::create on their "
                                     "LayerWeights), so a device view is bf16 or fp8");
  MK_CHECK(tokens >= 0 && tokens <= opt.max_tokens,
           "expected 0 <= tokens <= max_tokens (" << opt.max_tokens << "), got " << tokens);
}

// The experts on the host backend of `opt`, over the pairs the view holds.
std::vector<float> host_experts(const MoeOptions& opt, const ViewLayerWeights& lw, const Bf16* x,
                                int tokens, const Routing& r, bool add_shared) {
  const MoeWeightsView& v = lw.view();
  const int lo = v.expert_offset, hi = v.expert_offset + v.local_experts(lw.spec());
  if (opt.cpu_backend == CpuBackend::Reference) {
    return cpu_reference::experts(lw, x, tokens, r, add_shared, lo, hi, opt.fp8);
  }
  MK_CHECK(!v.fp8() || opt.fp8 == Fp8Compute::WeightOnly,
           "the fast CPU backend computes fp8 experts weight-only, but MoeOptions::fp8 asks for "
           "W8A8: set fp8 = Fp8Compute::WeightOnly, or cpu_backend = CpuBackend::Reference");
  return cpu_fast::experts(lw, x, tokens, r, add_shared, opt.cpu, lo, hi);
}

std::vector<float> host_logits(const MoeOptions& opt, const ViewLayerWeights& lw, const Bf16* x,
                               int tokens) {
  if (opt.cpu_backend == CpuBackend::Reference) {
    return cpu_reference::router_logits(lw, x, tokens);
  }
  return cpu_fast::router_logits(lw, x, tokens, opt.cpu);
}

// The routing's k routed columns (and the shared scale) into the caller's arrays.
void store_routing(const MoeSpec& spec, const Routing& r, int32_t* ids, float* weights,
                   float* shared_scale) {
  const int k = spec.top_k;
  for (int t = 0; t < r.tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      ids[static_cast<size_t>(t) * k + j] = r.ids[static_cast<size_t>(t) * r.slots + j];
      weights[static_cast<size_t>(t) * k + j] = r.weights[static_cast<size_t>(t) * r.slots + j];
    }
    if (shared_scale != nullptr && !r.shared_scale.empty()) shared_scale[t] = r.shared_scale[t];
  }
}

}  // namespace

void MoeOp::forward(const MoeWeightsView& w, const void* x, void* y, int tokens, void* workspace,
                    size_t bytes, CUstream_st* stream) {
  check_call(spec_, options_, w, tokens, ViewUse::Layer);
  if (tokens == 0) return;
  MK_CHECK(x != nullptr && y != nullptr, "forward: x or y is null");
  if (w.location == Location::Device) {
    engine_gpu::forward(gpu("forward"), w, x, y, tokens, workspace, bytes, stream);
    return;
  }
  const Bf16* xb = static_cast<const Bf16*>(x);
  check_finite_input(xb, tokens, spec_.hidden);
  const ViewLayerWeights lw(spec_, w);
  const bool fused = engine_gpu::fused_for(w, options_.fuse, nullptr);
  const bool add_shared = !fused && w.shared_w13 != nullptr;
  const std::vector<float> logits = host_logits(options_, lw, xb, tokens);
  const Routing r = cpu_reference::route(RoutingConfig::from_spec(spec_, fused), logits.data(),
                                         tokens, lw.correction_bias());
  store_bf16(host_experts(options_, lw, xb, tokens, r, add_shared), y);
}

void MoeOp::route(const MoeWeightsView& w, const void* x, int tokens, int32_t* topk_ids,
                  float* topk_weights, float* shared_scale, void* workspace, size_t bytes,
                  CUstream_st* stream) {
  check_call(spec_, options_, w, tokens, ViewUse::Router);
  if (tokens == 0) return;
  MK_CHECK(x != nullptr && topk_ids != nullptr && topk_weights != nullptr,
           "route: x, topk_ids or topk_weights is null");
  if (w.location == Location::Device) {
    engine_gpu::route(gpu("route"), w, x, nullptr, tokens, topk_ids, topk_weights, shared_scale,
                      workspace, bytes, stream);
    return;
  }
  const Bf16* xb = static_cast<const Bf16*>(x);
  check_finite_input(xb, tokens, spec_.hidden);
  const ViewLayerWeights lw(spec_, w, 0, ViewUse::Router);
  const std::vector<float> logits = host_logits(options_, lw, xb, tokens);
  const Routing r = cpu_reference::route(RoutingConfig::from_spec(spec_, false), logits.data(),
                                         tokens, lw.correction_bias());
  store_routing(spec_, r, topk_ids, topk_weights, shared_scale);
}

void MoeOp::route_logits(const MoeWeightsView& w, const float* logits, int tokens,
                         int32_t* topk_ids, float* topk_weights, float* shared_scale,
                         void* workspace, size_t bytes, CUstream_st* stream) {
  check_call(spec_, options_, w, tokens, ViewUse::RoutingBias);
  if (tokens == 0) return;
  MK_CHECK(logits != nullptr && topk_ids != nullptr && topk_weights != nullptr,
           "route_logits: logits, topk_ids or topk_weights is null");
  if (w.location == Location::Device) {
    engine_gpu::route(gpu("route_logits"), w, nullptr, logits, tokens, topk_ids, topk_weights,
                      shared_scale, workspace, bytes, stream);
    return;
  }
  const ViewLayerWeights lw(spec_, w, 0, ViewUse::RoutingBias);
  const Routing r = cpu_reference::route(RoutingConfig::from_spec(spec_, false), logits, tokens,
                                         lw.correction_bias());
  store_routing(spec_, r, topk_ids, topk_weights, shared_scale);
}

void MoeOp::experts(const MoeWeightsView& w, const void* x, const int32_t* topk_ids,
                    const float* topk_weights, void* y, int tokens, const ExpertsOptions& eo,
                    void* workspace, size_t bytes, CUstream_st* stream) {
  check_call(spec_, options_, w, tokens, ViewUse::Experts);
  if (tokens == 0) return;
  MK_CHECK(x != nullptr && topk_ids != nullptr && topk_weights != nullptr && y != nullptr,
           "experts: x, topk_ids, topk_weights or y is null");
  if (w.location == Location::Device) {
    engine_gpu::experts(gpu("experts"), w, x, topk_ids, topk_weights, y, tokens, eo, workspace,
                        bytes, stream);
    return;
  }
  const Bf16* xb = static_cast<const Bf16*>(x);
  check_finite_input(xb, tokens, spec_.hidden);
  const ViewLayerWeights lw(spec_, w, 0, ViewUse::Experts);
  const int E = spec_.num_experts, k = spec_.top_k;
  const bool fused = eo.add_shared && engine_gpu::fused_for(w, options_.fuse, nullptr);
  const bool add_shared = eo.add_shared && !fused && w.shared_w13 != nullptr;
  // the routing as the routing op builds it: k routed slots, then the fused slots E..E+S-1 whose
  // weight is the token's shared scale (1, or sigmoid of a gated shared expert's gate logit)
  Routing r;
  r.tokens = tokens;
  r.slots = k + (fused ? w.fused_slots : 0);
  r.ids.resize(static_cast<size_t>(tokens) * r.slots);
  r.weights.resize(r.ids.size());
  if (add_shared) r.shared_scale.resize(tokens);
  for (int t = 0; t < tokens; ++t) {
    const float scale = eo.shared_scale != nullptr ? eo.shared_scale[t] : 1.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t id = topk_ids[static_cast<size_t>(t) * k + j];
      if (id < 0 || id >= E) {
        host_status_.fetch_or(kStatusExpertIdOutOfRange);
        MK_FAIL("topk_ids[" << t << ", " << j << "] = " << id << " is outside [0, " << E << ")");
      }
      r.ids[static_cast<size_t>(t) * r.slots + j] = id;
      r.weights[static_cast<size_t>(t) * r.slots + j] =
          topk_weights[static_cast<size_t>(t) * k + j];
    }
    for (int j = k; j < r.slots; ++j) {
      r.ids[static_cast<size_t>(t) * r.slots + j] = E + (j - k);
      r.weights[static_cast<size_t>(t) * r.slots + j] = scale;
    }
    if (add_shared) r.shared_scale[t] = scale;
  }
  store_bf16(host_experts(options_, lw, xb, tokens, r, add_shared), y);
}

MoeStatus MoeOp::read_host_status(bool clear) {
  return MoeStatus::from_word(clear ? host_status_.exchange(0) : host_status_.load());
}

MoeStatus MoeOp::read_status(void* workspace, CUstream_st* stream, bool clear) const {
  engine_gpu::require_cuda("read_status");
  return engine_gpu::read_status(options_.device, workspace, workspace_bytes(), stream, clear);
}

}  // namespace moekit

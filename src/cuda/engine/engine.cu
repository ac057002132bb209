// The engine API's CUDA side (src/engine/gpu_hooks.h, include/moekit/moe.h): MoeOp::Gpu is a
// GpuMoeLayer::Impl (src/cuda/layer/layer_impl.h) without weights or workspace of its own. Each
// call points the Impl at the caller's weights (the layout the owning layer uploads: stacked
// w13 [E+S, 2I, H], w2 [E+S, H, I], the fused slots after the routed experts) and at the pieces
// of the caller's workspace, then runs the owning layer's own launches: the same plan, the same
// kernels, so the same bits. Every entry makes options.device current and restores the caller's.
// fp8 views (MoeOptions::expert_dtype F8_E4M3) point the Impl's fp8 stacks at the caller's e4m3
// bytes and tile scales and run its fp8 kernels (W8A8), the shared expert as fused slots only.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/engine/engine_dispatch.h"
#include "cuda/experts/quantize_rows_fp8.h"
#include "cuda/layer/layer_impl.h"
#include "cuda/router_gemm/router_gemm.h"
#include "engine/gpu_hooks.h"
#include "moekit/error.h"

namespace moekit {

struct MoeOp::Gpu {
  std::unique_ptr<cuda::GpuMoeLayer::Impl> impl;
};

namespace engine_gpu {

using cuda::DeviceGuard;
using Impl = cuda::GpuMoeLayer::Impl;

namespace {

// The Impl's shapes, validation and device facts for (spec, options); no stream, no kernels.
void require_gpu(int device) {
  std::string why;
  MK_CHECK(cuda::available(&why, device), "no usable GPU: " << why);
}

// (after require_gpu, under a DeviceGuard of options.device)
std::unique_ptr<Impl> make_core(const MoeSpec& spec, const MoeOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->spec = spec;
  impl->layer = -1;
  impl->opt.max_tokens = options.max_tokens;
  impl->opt.fuse = options.fuse;
  impl->opt.device = options.device;
  impl->opt.overrides = options.overrides;
  impl->opt.expert_dtype = options.expert_dtype;
  impl->init_shapes();
  impl->validate();
  impl->device = cuda::live_device_info(options.device);
  return impl;
}

// Whether `stream` is being captured into a CUDA graph: the pointer checks below then do not
// run (they ran on the eager calls before a capture; a capture admits only stream work).
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MK_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// Device memory on `device` (or managed memory), else an error naming the tensor. Skipped where
// `check` is false (a capture).
void check_device_pointer(const void* p, int device, const char* name, bool check = true) {
  if (p == nullptr || !check) return;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    MK_FAIL(name << " (" << p << ") is not memory CUDA knows");
  }
  MK_CHECK(a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged,
           name << " (" << p << ") is " << (a.type == cudaMemoryTypeHost ? "pinned host" : "host")
                << " memory, expected device memory (a device view)");
  MK_CHECK(a.type != cudaMemoryTypeDevice || a.device == device,
           name << " is on device " << a.device << ", expected device " << device);
}

void check_aligned(const void* p, const char* name) {
  MK_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, name << " must be 16-byte aligned, got " << p);
}

// Points the Impl at the view's weights and the workspace's pieces, after the checks only the
// GPU backend needs (the view itself is validated by moe_op.cpp).
// Returns whether the pointer checks ran (not while `stream` is captured). reads_experts: the
// call runs the stacks (not route()), whose dtype must then be the op's.
bool bind(Impl& m, const MoeWeightsView& w, void* workspace, size_t bytes, cudaStream_t stream,
          bool reads_experts = true) {
  const MoeSpec& spec = m.spec;
  const int64_t H = spec.hidden, I = spec.expert_intermediate;
  MK_CHECK((w.w13_expert_stride == 0 || w.w13_expert_stride == 2 * I * H) &&
               (w.w2_expert_stride == 0 || w.w2_expert_stride == H * I),
           "the GPU backend takes dense expert stacks (w13_expert_stride 0 or "
               << 2 * I * H << ", w2_expert_stride 0 or " << H * I << "), got "
               << w.w13_expert_stride << ", " << w.w2_expert_stride);
  MK_CHECK(!spec.has_expert_bias || ((w.b13_expert_stride == 0 || w.b13_expert_stride == 2 * I) &&
                                     (w.b2_expert_stride == 0 || w.b2_expert_stride == H)),
           "the GPU backend takes dense bias stacks (b13_expert_stride 0 or "
               << 2 * I << ", b2_expert_stride 0 or " << H << ")");
  MK_CHECK(workspace != nullptr, "the workspace is null (workspace_bytes() gives its size)");
  const size_t need = m.carve_workspace(nullptr, nullptr);
  MK_CHECK(bytes >= need, "the workspace holds " << bytes << " bytes, expected at least " << need
                                                 << " (workspace_bytes())");
  MK_CHECK(reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
           "the workspace must be 256-byte aligned, got " << workspace);
  MK_CHECK(!reads_experts || w.expert_dtype == m.opt.expert_dtype,
           "the op runs " << dtype_name(m.opt.expert_dtype)
                          << " experts on the device (MoeOptions::expert_dtype), but the view "
                             "holds "
                          << dtype_name(w.expert_dtype) << " stacks");
  MK_CHECK(!w.fp8() || ((w.w13_scale_expert_stride == 0 ||
                         w.w13_scale_expert_stride == fp8_w13_scale_floats(spec)) &&
                        (w.w2_scale_expert_stride == 0 ||
                         w.w2_scale_expert_stride == fp8_w2_scale_floats(spec))),
           "the GPU backend takes dense fp8 scale grids (w13_scale_expert_stride 0 or "
               << fp8_w13_scale_floats(spec) << ", w2_scale_expert_stride 0 or "
               << fp8_w2_scale_floats(spec) << ")");
  const int dev = m.opt.device;
  const bool check = !capturing(stream);
  check_device_pointer(w.router_weight, dev, "router_weight", check);
  check_device_pointer(w.w13, dev, "w13", check);
  check_device_pointer(w.w2, dev, "w2", check);
  check_device_pointer(w.w13_fp8, dev, "w13_fp8", check);
  check_device_pointer(w.w13_scale, dev, "w13_scale", check);
  check_device_pointer(w.w2_fp8, dev, "w2_fp8", check);
  check_device_pointer(w.w2_scale, dev, "w2_scale", check);
  check_device_pointer(w.shared_w13, dev, "shared_w13", check);
  check_device_pointer(workspace, dev, "workspace", check);
  check_aligned(w.router_weight, "router_weight");
  check_aligned(w.w13, "w13");
  check_aligned(w.w2, "w2");
  check_aligned(w.w13_fp8, "w13_fp8");
  check_aligned(w.w13_scale, "w13_scale");
  check_aligned(w.w2_fp8, "w2_fp8");
  check_aligned(w.w2_scale, "w2_scale");
  check_aligned(w.shared_w13, "shared_w13");
  check_aligned(w.shared_w2, "shared_w2");
  m.wp.router_w = w.router_weight;
  m.wp.router_bias = spec.has_router_bias ? w.router_bias : nullptr;
  m.wp.corr_bias = spec.has_correction_bias ? w.correction_bias : nullptr;
  m.wp.w13 = reinterpret_cast<const __nv_bfloat16*>(w.w13);
  m.wp.w2 = reinterpret_cast<const __nv_bfloat16*>(w.w2);
  m.wp.b13 = spec.has_expert_bias ? w.b13 : nullptr;
  m.wp.b2 = spec.has_expert_bias ? w.b2 : nullptr;
  m.wp.shared_w13 = reinterpret_cast<const __nv_bfloat16*>(w.shared_w13);
  m.wp.shared_w2 = reinterpret_cast<const __nv_bfloat16*>(w.shared_w2);
  m.wp.w13_fp8 = w.w13_fp8;
  m.wp.w13_scale = w.w13_scale;
  m.wp.w2_fp8 = w.w2_fp8;
  m.wp.w2_scale = w.w2_scale;
  m.carve_workspace(workspace, &m.ws);
  m.add_shared = true;
  m.slice_count = w.local_experts(spec);
  m.drops_pairs = false;
  return check;
}

// fp8 runs the shared expert as fused slots only (the plan has no fp8 dense shared MLP): a call
// of a spec with a shared expert that leaves it out, or holds it unfused, is refused by name.
void require_fp8_shared(const Impl& m, bool add_shared, const char* what) {
  MK_CHECK(!m.fp8 || !m.has_shared || add_shared,
           what << " on fp8 device views of " << m.spec.name
                << " runs the shared expert as fused slots: a call without it (an expert slice "
                   "not holding it, or ExpertsOptions::add_shared false) is not supported there");
}

// The fusion asked of the plan: Auto stays Auto where the view holds both forms (the plan's
// rule, as the owning layer runs it), else the form the view holds.
FuseShared plan_fuse(Impl& m, const MoeWeightsView& w, FuseShared fuse, int tokens,
                     bool self_route) {
  const bool auto_fused = m.plan_for(tokens, FuseShared::Auto, self_route).fused;
  const bool fused = fused_for(w, fuse, m.can_fuse ? &auto_fused : nullptr);
  if (fuse == FuseShared::Auto && w.fused_slots > 0 && w.shared_w13 != nullptr) {
    return FuseShared::Auto;
  }
  return fused ? FuseShared::On : FuseShared::Off;
}

}  // namespace

void require_cuda(const char*) {}

size_t workspace_bytes(const MoeSpec& spec, int max_tokens, const MoeOptions& options) {
  MoeOptions o = options;
  o.max_tokens = max_tokens;
  require_gpu(o.device);
  DeviceGuard guard(o.device);
  std::unique_ptr<Impl> core = make_core(spec, o);
  core->prefill_bytes = core->prefill_bytes_needed();
  return core->carve_workspace(nullptr, nullptr);
}

MoeOp::Gpu* create(const MoeSpec& spec, const MoeOptions& options) {
  require_gpu(options.device);
  DeviceGuard guard(options.device);
  auto gpu = std::make_unique<MoeOp::Gpu>();
  gpu->impl = make_core(spec, options);
  Impl& m = *gpu->impl;
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  m.prepare_kernels();
  MK_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return gpu.release();
}

void destroy(MoeOp::Gpu* gpu) {
  if (gpu == nullptr) return;
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  const int device = gpu->impl->opt.device;
  if (previous != device) MK_CUDA_WARN(cudaSetDevice(device));
  delete gpu;
  if (previous >= 0 && previous != device) MK_CUDA_WARN(cudaSetDevice(previous));
}

void prepare_workspace(MoeOp::Gpu& gpu, void* workspace, size_t bytes, CUstream_st* stream) {
  Impl& m = *gpu.impl;
  DeviceGuard guard(m.opt.device);
  MK_CHECK(workspace != nullptr, "prepare_workspace: the workspace is null");
  const size_t need = m.carve_workspace(nullptr, nullptr);
  MK_CHECK(bytes >= need, "the workspace holds " << bytes << " bytes, expected at least " << need
                                                 << " (workspace_bytes())");
  MK_CHECK(reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
           "the workspace must be 256-byte aligned, got " << workspace);
  check_device_pointer(workspace, m.opt.device, "workspace");
  cuda::LayerWorkspace w;
  m.carve_workspace(workspace, &w);
  m.init_workspace(w, stream);
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
}

namespace {

// A routing [T, k] of global ids (the caller's, or the routing kernel's in the workspace) ->
// the view's dispatch (engine_dispatch.h) -> the plan's expert launches into y.
void dispatch_and_experts(Impl& m, const MoeWeightsView& w, const plan::LayerPlan& pl,
                          const void* x, const int32_t* topk_ids, const float* topk_weights,
                          const float* shared_scale, void* y, cudaStream_t stream) {
  // the fp8 bulk kernels read x in e4m3 (forward_device quantises it before the router GEMM)
  if (pl.fp8 && pl.stream == plan::Stream::Bulk) {
    cuda::quantize_rows_fp8(static_cast<const __nv_bfloat16*>(x), pl.tokens, m.H,
                            m.spec.quant.scale_ue8m0, m.ws.x8, m.ws.x8_scale, false, stream);
  }
  m.drops_pairs = true;  // dropping another rank's pairs is no error
  cuda::EngineDispatchParams dp;
  dp.rp = m.routing_params(pl);
  dp.topk_ids = topk_ids;
  dp.topk_weights = topk_weights;
  dp.shared_scale_in = shared_scale;
  dp.expert_offset = w.expert_offset;
  dp.expert_count = m.slice_count;
  dp.status = m.ws.status;
  cuda::launch_engine_dispatch(dp, stream);
  if (m.slice_count < m.E && pl.stream != plan::Stream::Grouped) {
    cuda::zero_dropped_partials(m.ws.ids, pl.tokens * pl.slots, m.ws.partial, m.H, stream);
  }
  m.launch_experts(pl, dp.rp, x, y, stream);
  m.drops_pairs = false;
}

}  // namespace

void forward(MoeOp::Gpu& gpu, const MoeWeightsView& w, const void* x, void* y, int tokens,
             void* workspace, size_t bytes, CUstream_st* stream) {
  Impl& m = *gpu.impl;
  DeviceGuard guard(m.opt.device);
  bind(m, w, workspace, bytes, stream);
  const bool add_shared = m.has_shared && w.holds_shared();
  if (m.slice_count == m.E && add_shared == m.has_shared) {
    // the whole layer: the owning layer's forward, launch for launch
    m.forward_device(x, y, tokens, plan_fuse(m, w, m.opt.fuse, tokens, true), stream);
    return;
  }
  // an expert slice (or a view without the shared expert): the routing over all E experts
  // into the workspace, then this view's pairs only
  check_aligned(x, "x");
  check_aligned(y, "y");
  require_fp8_shared(m, add_shared, "forward");
  const FuseShared f = add_shared ? plan_fuse(m, w, m.opt.fuse, tokens, false) : FuseShared::Off;
  const plan::LayerPlan& pl = m.plan_for(tokens, f, false);
  m.add_shared = add_shared;
  m.launch_dense_shared(pl, x, stream);
  m.launch_router_gemm(pl, x, stream);
  cuda::RoutingParams rr = m.routing_params(pl);
  rr.cfg = m.cfg_unfused;
  rr.ids = m.ws.topk_ids;
  rr.weights = m.ws.topk_weights;
  rr.weight_rows = m.E;  // (its lists are rebuilt for the view by the dispatch)
  rr.shared_tasks = nullptr;
  cuda::launch_routing(rr, stream, pl.pdl);
  dispatch_and_experts(m, w, pl, x, m.ws.topk_ids, m.ws.topk_weights,
                       m.has_shared ? m.ws.shared_scale : nullptr, y, stream);
  m.add_shared = true;
}

void route(MoeOp::Gpu& gpu, const MoeWeightsView& w, const void* x, const float* logits, int tokens,
           int32_t* topk_ids, float* topk_weights, float* shared_scale, void* workspace,
           size_t bytes, CUstream_st* stream) {
  Impl& m = *gpu.impl;
  DeviceGuard guard(m.opt.device);
  const bool check = bind(m, w, workspace, bytes, stream, false);
  if (x != nullptr) check_aligned(x, "x");
  check_device_pointer(topk_ids, m.opt.device, "topk_ids", check);
  check_device_pointer(topk_weights, m.opt.device, "topk_weights", check);
  // the unfused routing: k slots per token, written straight into the caller's arrays (fp8:
  // the plan of the fused forward, whose router GEMM is the same; its routing config unfused)
  const bool fp8_shared = m.fp8 && m.has_shared;
  const plan::LayerPlan& pl =
      m.plan_for(tokens, fp8_shared ? FuseShared::On : FuseShared::Off, false);
  if (x != nullptr) m.launch_router_gemm(pl, x, stream);
  cuda::RoutingParams rp = m.routing_params(pl);
  rp.cfg = m.cfg_unfused;
  rp.weight_rows = m.E;  // every expert's ids are in range, whatever slice the view holds
  rp.logits = x != nullptr ? m.ws.logits : logits;
  rp.ids = topk_ids;
  rp.weights = topk_weights;
  rp.shared_scale =
      m.has_shared ? (shared_scale != nullptr ? shared_scale : m.ws.shared_scale) : nullptr;
  rp.shared_tasks = nullptr;
  cuda::launch_routing(rp, stream, pl.pdl);
}

void experts(MoeOp::Gpu& gpu, const MoeWeightsView& w, const void* x, const int32_t* topk_ids,
             const float* topk_weights, void* y, int tokens, const ExpertsOptions& eo,
             void* workspace, size_t bytes, CUstream_st* stream) {
  Impl& m = *gpu.impl;
  DeviceGuard guard(m.opt.device);
  const bool check = bind(m, w, workspace, bytes, stream);
  check_aligned(x, "x");
  check_aligned(y, "y");
  check_device_pointer(topk_ids, m.opt.device, "topk_ids", check);
  check_device_pointer(topk_weights, m.opt.device, "topk_weights", check);
  const bool add_shared = eo.add_shared && m.has_shared && w.holds_shared();
  require_fp8_shared(m, add_shared, "experts");
  const FuseShared f = add_shared ? plan_fuse(m, w, m.opt.fuse, tokens, false) : FuseShared::Off;
  const plan::LayerPlan& pl = m.plan_for(tokens, f, false);
  m.add_shared = add_shared;
  m.launch_dense_shared(pl, x, stream);
  dispatch_and_experts(m, w, pl, x, topk_ids, topk_weights, eo.shared_scale, y, stream);
  m.add_shared = true;
}

MoeStatus read_status(int device, void* workspace, size_t, CUstream_st* stream, bool clear) {
  DeviceGuard guard(device);
  MK_CHECK(workspace != nullptr, "read_status: the workspace is null");
  int word = 0;
  // the status word is the workspace's first piece (Impl::carve_workspace)
  MK_CUDA_CHECK(cudaMemcpyAsync(&word, workspace, sizeof(int), cudaMemcpyDeviceToHost, stream));
  if (clear) MK_CUDA_CHECK(cudaMemsetAsync(workspace, 0, sizeof(int), stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  return MoeStatus::from_word(static_cast<uint32_t>(word));
}

}  // namespace engine_gpu
}  // namespace moekit

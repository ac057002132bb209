// A forward of GpuMoeLayer (layer_impl.h): the plan for its token count (plan_layer, cached),
// then each planned launch's parameters, then the launches, in the plan's order:
//   0. the dense shared MLP (cuBLAS), when the plan runs it
//   1. router GEMM        logits[T, E(+1)] fp32            src/cuda/router_gemm/
//   2. routing + dispatch ids/weights [T, k+S], per-expert pair lists, tasks (one launch)
//   2a/2b. the unfused shared MLP through the expert kernels, one dense "expert" of width Is
//   3. gate/up            h[pair, I] = act(x W1^T, x W3^T) bf16, every touched expert once
//   4. down + combine     y[T, H] = sum_slots w * (h W2^T + b2), deterministic, bf16
// fp8 experts on the bulk kernels (W8A8): x is quantised to e4m3 before launch 1, h before 4.
// Fused: the shared MLP is S more experts E..E+S-1 whose slots every token routes to, so it rides
// in launches 3-4. Unfused: the combine of launch 4 adds shared_scale[t] * its output.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <iostream>

#include "cuda/experts/experts.h"
#include "cuda/experts/experts_instances.cuh"
#include "cuda/experts/quantize_rows_fp8.h"
#include "cuda/layer/layer_impl.h"
#include "cuda/prefill/prefill.h"
#include "cuda/router_gemm/router_gemm.h"
#include "moekit/error.h"
#include "plan/expert_kernels.h"

namespace moekit::cuda {
namespace {

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ExpertsParams' record of the instance's choices (launch_expert_kernel checks them).
void record_instance(int kernel, ExpertsParams& p) {
  const plan::ExpertKernel& k = plan::expert_kernels()[kernel];
  p.ring = k.stream == plan::Stream::Bulk ? experts_detail::bulk_ring(k.ring) : 0;
  p.weight_copy_pieces = k.split_rows ? 2 : 1;
  p.l2_keep = k.l2_keep ? 1 : 0;
  p.self_route = k.self_route ? 1 : 0;
}

}  // namespace

const plan::LayerPlan& GpuMoeLayer::Impl::plan_for(int tokens, FuseShared fuse,
                                                    bool self_route) const {
  const long long key =
      (static_cast<long long>(tokens) * 3 + static_cast<int>(fuse)) * 2 + (self_route ? 1 : 0);
  auto it = plans.find(key);
  if (it == plans.end()) {
    plan::PlanOverrides o = opt.overrides;
    // (a caller's own routing, the engine API's experts(): no gate/up kernel routes its token)
    if (!self_route) o.self_route_tokens = 0;
    it = plans
             .emplace(key, plan::plan_layer(spec, tokens, fuse, o, device, opt.expert_dtype,
                                            opt.mx_format))
             .first;
    if (opt.overrides.print) std::cerr << plan::describe(it->second);
  }
  return it->second;
}

void GpuMoeLayer::Impl::forward_device(const void* x, void* y, int tokens, FuseShared fuse,
                                       cudaStream_t st) {
  MK_CHECK(tokens >= 0 && tokens <= opt.max_tokens,
           "expected 0 <= tokens <= max_tokens (" << opt.max_tokens << "), got " << tokens);
  if (tokens == 0) return;
  MK_CHECK(x != nullptr && y != nullptr, "forward_device: x or y is null");
  // (the expert kernels copy x rows in 16-byte units and store y rows 4 at a time)
  MK_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0,
           "forward_device: x and y must be 16-byte aligned (x " << x << ", y " << y << ")");
  const plan::LayerPlan& pl = plan_for(tokens, fuse);
  launch_dense_shared(pl, x, st);
  // the fp8 bulk kernels' x in e4m3, first (the router GEMM's wait covers it; layer_impl.h)
  if (pl.fp8 && pl.stream == plan::Stream::Bulk) {
    quantize_rows_fp8(static_cast<const __nv_bfloat16*>(x), tokens, H, spec.quant.scale_ue8m0,
                      ws.x8, ws.x8_scale, pl.pdl, st);
  }
  launch_router_gemm(pl, x, st);
  const RoutingParams rp = routing_params(pl);
  if (pl.routing_kernel) launch_routing(rp, st, pl.pdl);
  launch_experts(pl, rp, x, y, st);
}

// 0. the dense shared MLP: it needs x only, so it goes first and leaves the chain of
// programmatic launches from the router GEMM to the down kernel as it is
void GpuMoeLayer::Impl::launch_dense_shared(const plan::LayerPlan& pl, const void* x,
                                            cudaStream_t st) {
  if (!pl.dense_shared || !add_shared) return;
  MK_CHECK(shared_dense != nullptr, "the plan runs the dense shared MLP, which is not prepared");
  MK_CHECK(wp.shared_w13 != nullptr && wp.shared_w2 != nullptr,
           "the plan runs the unfused shared MLP, but its weights are missing");
  SharedActivation act{spec.activation, spec.swiglu_limit, spec.swiglu_alpha, spec.swiglu_beta};
  shared_dense->forward(static_cast<const __nv_bfloat16*>(x), wp.shared_w13, wp.shared_w2,
                        pl.tokens, act, ws.shared_h, ws.shared_partial, st);
}

// 1. router GEMM
void GpuMoeLayer::Impl::launch_router_gemm(const plan::LayerPlan& pl, const void* x,
                                           cudaStream_t st) {
  RouterGemmProblem rg;
  rg.m = pl.tokens;
  rg.n = cols;
  rg.k = H;
  rg.weight_dtype = spec.router_dtype;
  rg.x = x;
  rg.weight = wp.router_w;
  rg.bias = spec.has_router_bias ? wp.router_bias : nullptr;
  rg.out = ws.logits;
  rg.trace = trace;
  router_gemm(rg, pl.router.config, st);
}

// 2. routing + dispatch, from the workspace's logits into its ids, weights and lists
RoutingParams GpuMoeLayer::Impl::routing_params(const plan::LayerPlan& pl) const {
  const bool shared_unfused = has_shared && !pl.fused && add_shared;
  // (the routed down launch, the last; the prefill path has none)
  const bool down_tail = !pl.experts.empty() && pl.experts.back().down_tail_percent > 0;
  RoutingParams rp;
  rp.cfg = pl.fused ? cfg_fused : cfg_unfused;
  rp.tokens = pl.tokens;
  rp.logits = ws.logits;
  rp.correction_bias = spec.has_correction_bias ? wp.corr_bias : nullptr;
  rp.ids = ws.ids;
  rp.weights = ws.weights;
  rp.shared_scale = has_shared ? ws.shared_scale : nullptr;
  rp.dispatch = pl.routing_dispatch;
  rp.weight_rows = slice_count + (pl.fused ? S : 0);
  rp.chunk = pl.chunk;
  rp.pair_list = ws.pair_list;
  rp.tasks = ws.tasks;
  rp.shared_tasks = shared_unfused && !pl.dense_shared ? ws.shared_tasks : nullptr;
  rp.counters = ws.counters;
  rp.tile_counters = ws.tile_counters;
  rp.num_tile_counters = H / 16 + (down_tail ? 1 : 0);  // (+ its CTAs done)
  rp.error_flag = drops_pairs ? nullptr : ws.status;
  rp.trace = trace;
  return rp;
}

// 3-4: the expert launches on the dispatch's lists (rp: what the routing wrote, and the
// self-routing gate/up kernel's routing where the plan has no routing kernel)
void GpuMoeLayer::Impl::launch_experts(const plan::LayerPlan& pl, const RoutingParams& rp,
                                       const void* x, void* y, cudaStream_t st) {
  if (pl.stream == plan::Stream::Grouped) {
    forward_grouped(pl, x, y, st);
    return;
  }
  const int tokens = pl.tokens;
  const int slots = pl.slots;
  const bool shared_unfused = has_shared && !pl.fused && add_shared;
  auto* ctr = ws.counters;

  // the parameters every expert launch shares
  auto common = [&](const plan::ExpertLaunch& l) {
    ExpertsParams p;
    p.dynamic_tail_percent = l.dynamic_tail_percent;
    p.half_items_per_cta = l.half_items_per_cta;
    p.down_tail_percent = l.down_tail_percent;
    p.activation = spec.activation;
    p.limit = spec.swiglu_limit;
    p.alpha = spec.swiglu_alpha;
    p.beta = spec.swiglu_beta;
    record_instance(l.kernel, p);
    return p;
  };
  for (const plan::ExpertLaunch& l : pl.experts) {
    if (l.shared && !add_shared) continue;
    const bool gate_up = plan::expert_kernels()[l.kernel].gemm == plan::Gemm::GateUp;
    ExpertsParams p = common(l);
    if (l.shared) {
      // 2a/2b. the unfused shared MLP: one dense "expert" of width Is, every token one pair
      p.w = gate_up ? wp.shared_w13 : wp.shared_w2;
      p.inter = Is;
      p.rows = gate_up ? Is : H;
      p.k = gate_up ? H : Is;
      p.x = gate_up ? static_cast<const __nv_bfloat16*>(x) : ws.shared_h;
      p.x_row = RowDivisor(1);
      p.pair_list = ws.pair_identity;
      p.tasks = ws.shared_tasks;
      p.num_tasks = &ctr->num_shared_tasks;
      p.task_capacity = ceil_div(opt.max_tokens, 8);
      p.pair_capacity = tokens;
      p.work_counter = &ctr->work[gate_up ? 2 : 3];
      if (gate_up) {
        p.h = ws.shared_h;
      } else {
        p.partial = ws.shared_partial;
      }
    } else if (gate_up) {
      // 3. routed (+ fused shared) gate/up
      p.w = wp.w13;
      p.w_expert_stride = static_cast<long long>(2) * I * H;
      if (pl.fp8) {
        p.w = nullptr;
        p.w8 = wp.w13_fp8;
        p.w_scale = wp.w13_scale;
        p.scale_expert_stride = static_cast<long long>(scales13());
        p.x8 = ws.x8;
        p.x_scale = ws.x8_scale;
      } else if (pl.mx != ExpertFormat::Bf16) {
        p.w = nullptr;
        p.w8 = wp.w13_mx;
        p.w_expert_stride = static_cast<long long>(mx13_bytes());
        p.mx_scale = wp.w13_mx_scale;
        p.mx_scale_expert_stride = static_cast<long long>(mx13_scale_bytes());
      }
      p.bias = spec.has_expert_bias ? wp.b13 : nullptr;
      p.bias_expert_stride = static_cast<long long>(2) * I;
      p.inter = I;
      p.rows = I;
      p.k = H;
      p.x = static_cast<const __nv_bfloat16*>(x);
      p.x_row = RowDivisor(slots);
      p.pair_list = ws.pair_list;
      p.tasks = ws.tasks;
      p.num_tasks = &ctr->num_tasks;
      p.task_capacity = max_tasks;
      p.pair_capacity = tokens * slots;
      p.work_counter = &ctr->work[0];
      p.h = ws.h;
      p.trace = trace;
      if (!pl.routing_kernel) {
        p.route = rp;
        // (no align step before it zeroes work[0]: its own counters, which it leaves zeroed)
        p.work_counter = &ctr->self_route_work;
        p.self_route_ctas_done = &ctr->self_route_ctas_done;
      }
      if (l.early_shared > 0) {
        p.early_shared = l.early_shared;
        p.first_shared_expert = slice_count;
        p.tokens = tokens;
        p.slots = slots;
      }
    } else {
      // 4. down + weighted combine
      p.w = wp.w2;
      p.w_expert_stride = static_cast<long long>(H) * I;
      if (pl.fp8) {
        p.w = nullptr;
        p.w8 = wp.w2_fp8;
        p.w_scale = wp.w2_scale;
        p.scale_expert_stride = static_cast<long long>(scales2());
        p.x8 = ws.h8;
        p.x_scale = ws.h8_scale;
      } else if (pl.mx != ExpertFormat::Bf16) {
        p.w = nullptr;
        p.w8 = wp.w2_mx;
        p.w_expert_stride = static_cast<long long>(mx2_bytes());
        p.mx_scale = wp.w2_mx_scale;
        p.mx_scale_expert_stride = static_cast<long long>(mx2_scale_bytes());
      }
      p.bias = spec.has_expert_bias ? wp.b2 : nullptr;
      p.bias_expert_stride = H;
      p.inter = I;
      p.rows = H;
      p.k = I;
      p.x = ws.h;
      p.x_row = RowDivisor(1);
      p.pair_list = ws.pair_list;
      p.tasks = ws.tasks;
      p.num_tasks = &ctr->num_tasks;
      p.task_capacity = max_tasks;
      p.pair_capacity = tokens * slots;
      p.work_counter = &ctr->work[1];
      p.partial = ws.partial;
      p.tile_counters = ws.tile_counters;
      p.tokens = tokens;
      p.slots = slots;
      p.slot_weights = ws.weights;
      p.shared_partial = shared_unfused ? ws.shared_partial : nullptr;
      p.shared_scale = shared_unfused ? ws.shared_scale : nullptr;
      p.y = static_cast<__nv_bfloat16*>(y);
      p.trace = trace;
    }
    if (pl.fp8 && !gate_up) {
      // the fp8 down kernel's h in e4m3, once, between the two GEMMs
      quantize_rows_fp8(ws.h, tokens * slots, I, spec.quant.scale_ue8m0, ws.h8, ws.h8_scale,
                        pl.pdl, st);
    }
    launch_expert_kernel(l.kernel, p, l.grid, pl.pdl, st);
  }
}

// 3-4 on the prefill path: the routing's ids and weights -> permute, grouped GEMMs, combine.
void GpuMoeLayer::Impl::forward_grouped(const plan::LayerPlan& pl, const void* x, void* y,
                                        cudaStream_t st) {
  MK_CHECK(ws.prefill != nullptr, "the plan takes the prefill path at "
                                                 << pl.tokens << " tokens, but max_tokens ("
                                                 << opt.max_tokens << ") does not");
  const bool shared_unfused = has_shared && !pl.fused && add_shared;
  PrefillParams p;
  p.tokens = pl.tokens;
  p.hidden = H;
  p.inter = I;
  p.rows = slice_count + (pl.fused ? S : 0);
  p.slots = pl.slots;
  p.max_tokens = opt.max_tokens;
  p.x = static_cast<const __nv_bfloat16*>(x);
  p.ids = ws.ids;
  p.weights = ws.weights;
  p.w13 = wp.w13;
  p.w2 = wp.w2;
  if (pl.fp8) {
    p.w13 = nullptr;
    p.w2 = nullptr;
    p.w13_fp8 = wp.w13_fp8;
    p.w13_scale = wp.w13_scale;
    p.w2_fp8 = wp.w2_fp8;
    p.w2_scale = wp.w2_scale;
    p.ue8m0 = spec.quant.scale_ue8m0;
  } else if (pl.mx != ExpertFormat::Bf16) {
    p.w13 = nullptr;
    p.w2 = nullptr;
    p.mx = pl.mx;
    p.w13_mx = wp.w13_mx;
    p.w13_mx_scale = wp.w13_mx_scale;
    p.w2_mx = wp.w2_mx;
    p.w2_mx_scale = wp.w2_mx_scale;
    p.mx_chunk = pl.grouped_mx_chunk;
    p.mx_tile_m = pl.grouped_mx_tile;
  }
  p.b13 = spec.has_expert_bias ? wp.b13 : nullptr;
  p.b2 = spec.has_expert_bias ? wp.b2 : nullptr;
  p.activation = spec.activation;
  p.limit = spec.swiglu_limit;
  p.alpha = spec.swiglu_alpha;
  p.beta = spec.swiglu_beta;
  p.shared_partial = shared_unfused ? ws.shared_partial : nullptr;
  p.shared_scale = shared_unfused ? ws.shared_scale : nullptr;
  p.y = static_cast<__nv_bfloat16*>(y);
  p.error_flag = drops_pairs ? nullptr : ws.status;
  p.gate_up_gemm = pl.grouped_gate_up;
  p.down_gemm = pl.grouped_down;
  p.workspace = ws.prefill;
  p.workspace_bytes = ws.prefill_bytes;
  launch_prefill_experts(p, st);
}

}  // namespace moekit::cuda

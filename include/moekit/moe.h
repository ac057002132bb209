// The engine API: a serving engine hands moekit its own weights (borrowed, never copied) and runs
// the MoE layer, or its pieces, on them.
//
//   MoeWeightsView   pointers + strides of one layer's weights, on the host or on a GPU
//   MoeOptions       fusion, max_tokens, the plan's knobs, the device, the CPU backend
//   MoeOp            one per (spec, options): forward, route, experts on any view of that spec,
//                    so one op and one workspace serve every MoE layer of a model in turn
//   workspace_bytes  the device workspace a MoeOp needs (the caller allocates it; calls that
//                    share one run one after the other on one stream)
//
// The weights' layout is vLLM's `fused_experts` contract (and what transformers 5 stores):
//
//   router_weight     [router_columns, H]  bf16 or fp32 (spec.router_dtype), rows dense; for a
//                                          gated shared expert (Qwen2-MoE) row E is its gate row
//   router_bias       [E] fp32             gpt-oss only
//   correction_bias   [E] fp32             e_score_correction_bias (selection only)
//   w13               [n, 2I, H] bf16      gate rows [0, I) first, then up rows [I, 2I)
//   w2                [n, H, I]  bf16
//   b13 / b2          [n, 2I] / [n, H] fp32  gpt-oss only
//   shared_w13        [2 Is, H] bf16       the unfused shared MLP, gate rows first
//   shared_w2         [H, Is] bf16
//
// fp8 block-scale experts (expert_dtype F8_E4M3, DeepSeek's checkpoints; w13 / w2 then null):
//   w13_fp8           [n, 2I, H] e4m3fn    gate rows first, as w13
//   w13_scale         [n, 2 ceil(I/128), ceil(H/128)] fp32  the multiplier of each 128x128 tile,
//                                          the gate's tile rows then the up's (= ceil(2I/128)
//                                          rows when I % 128 == 0, which the GPU needs)
//   w2_fp8            [n, H, I] e4m3fn
//   w2_scale          [n, ceil(H/128), ceil(I/128)] fp32
// The shared expert of an fp8 view is its fused slots (there is no fp8 unfused shared MLP, as in
// the GPU layer). Host views compute per MoeOptions::fp8 (W8A8 or weight-only; the fast backend
// weight-only), device views W8A8 on the GPU layer's fp8 kernels (MoeOptions::expert_dtype).
//
// OCP MX experts (mx_format Mxfp4 / Mxfp8, host views; w13 / w2 then null), W4A16 / W8A16 on the
// CPU backends as the CPU reference computes them (each weight dequantised exactly):
//   w13_mx            [n, 2I, mx_row_bytes(H)] u8  MXFP4: two e2m1 a byte, the even column in the
//                                          low nibble; MXFP8: e4m3fn; gate rows first, as w13
//                                          (gpt-oss's interleaved checkpoint rows de-interleaved)
//   w13_mx_scale      [n, 2I, H/32] u8     e8m0 exponent bytes: 2^(s-127), 255 is NaN
//   w2_mx             [n, H, mx_row_bytes(I)] u8, w2_mx_scale [n, H, I/32] u8
// Their expert strides count bytes (the scales' in w13/w2_scale_expert_stride); the shared
// expert of an MX view is its fused slots. The bytes are not scanned (the checkpoint loader
// refuses an e8m0 byte 255 and an e4m3 NaN code; a view holding one computes NaN). The GPU
// holds MX experts in its own layout (cuda::GpuMoeLayer::create on their LayerWeights): device
// views are bf16 or fp8.
//
// with n = expert_count + fused_slots rows of the stacks: the view's routed experts (global ids
// [expert_offset, expert_offset + expert_count), local row id - expert_offset), then, when
// fused_slots = spec.shared_slots(), the shared MLP repacked as S slots of the expert layout
// (slot j: gate rows [jI, (j+1)I) and up rows Is + [jI, (j+1)I) of shared_w13, down columns
// [jI, (j+1)I) of shared_w2; DESIGN.md §2). Expert e of a stack starts `expert_stride` elements
// after expert e-1 (0 = dense: 2IH, HI, 2I, H), so per-expert buffers placed at a regular
// spacing in one allocation are described without a copy; inside an expert, rows are dense.
//
// Expert parallelism: a rank holding the slice [expert_offset, expert_offset + expert_count)
// runs every token's routing over all E experts and computes only the (token, slot) pairs routed
// to its experts; pairs routed elsewhere are skipped. Its y is a partial sum: the caller sums y
// across the ranks. The shared expert is added by every view that holds it (fused_slots or
// shared_w13/shared_w2): give it to exactly one rank. On the GPU a slice's forward runs the
// routing, then a dispatch of its own pairs (one more launch, and one that zeroes the skipped
// pairs' partial rows on the decode kernels). The GPU takes dense stacks (expert strides 0 or
// the dense size); padded strides run on the CPU backends.
//
// Which backend runs is the view's `location`: Host -> the CPU backend of MoeOptions (the
// reference or the fast one), Device -> the CUDA layer's kernels on MoeOptions::device. The
// workspace arguments are ignored on the host (the CPU backends keep their own scratch).
//
// Errors: invalid arguments throw moekit::Error naming the field ("expected X, got Y"). On the
// GPU, what only the device sees (an expert id out of range in the caller's topk ids, or in a
// routing from non-finite logits) sets a status word in the workspace, which read_status()
// returns once the stream has synchronised; the outputs of that call are then undefined.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "moekit/cpu_fast.h"
#include "moekit/dtype.h"
#include "moekit/layer.h"
#include "moekit/plan.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

struct CUstream_st;  // cudaStream_t == CUstream_st*

namespace moekit {

enum class Location { Host, Device };
const char* location_name(Location l);  // "host" | "device"

struct MoeWeightsView {
  Location location = Location::Host;
  const void* router_weight = nullptr;     // [router_columns, H], spec.router_dtype
  const float* router_bias = nullptr;      // [E] when spec.has_router_bias, else ignored
  const float* correction_bias = nullptr;  // [E] when spec.has_correction_bias, else ignored
  const Bf16* w13 = nullptr;               // [n, 2I, H]
  const Bf16* w2 = nullptr;                // [n, H, I]
  const float* b13 = nullptr;              // [n, 2I] when spec.has_expert_bias, else ignored
  const float* b2 = nullptr;               // [n, H]
  int64_t w13_expert_stride = 0;           // elements between experts; 0 = 2 I H
  int64_t w2_expert_stride = 0;            // 0 = H I
  int64_t b13_expert_stride = 0;           // 0 = 2 I
  int64_t b2_expert_stride = 0;            // 0 = H
  // 0, or spec.shared_slots(): the stacks hold the fused shared slots after the routed experts
  int fused_slots = 0;
  const Bf16* shared_w13 = nullptr;  // [2 Is, H] or null (then only the fused slots add it)
  const Bf16* shared_w2 = nullptr;   // [H, Is]
  int expert_offset = 0;             // the first global expert id the stacks hold
  int expert_count = -1;             // how many; -1 = E - expert_offset
  // fp8 block-scale stacks instead of w13 / w2 (expert_dtype F8_E4M3); the expert strides above
  // count their elements (bytes) too
  DType expert_dtype = DType::BF16;   // BF16 (w13, w2) or F8_E4M3 (the four below)
  const uint8_t* w13_fp8 = nullptr;   // [n, 2I, H] e4m3fn
  const float* w13_scale = nullptr;   // [n, 2 ceil(I/128), ceil(H/128)]
  const uint8_t* w2_fp8 = nullptr;    // [n, H, I] e4m3fn
  const float* w2_scale = nullptr;    // [n, ceil(H/128), ceil(I/128)]
  int64_t w13_scale_expert_stride = 0;  // floats (MX: e8m0 bytes) between experts'; 0 = dense
  int64_t w2_scale_expert_stride = 0;
  // OCP MX stacks instead of w13 / w2 (host views, expert_dtype BF16); the expert strides above
  // count bytes
  ExpertFormat mx_format = ExpertFormat::Bf16;  // Mxfp4 / Mxfp8 (the four below), Bf16: none
  const uint8_t* w13_mx = nullptr;              // [n, 2I, mx_row_bytes(H)]
  const uint8_t* w13_mx_scale = nullptr;        // [n, 2I, H/32] e8m0
  const uint8_t* w2_mx = nullptr;               // [n, H, mx_row_bytes(I)]
  const uint8_t* w2_mx_scale = nullptr;         // [n, H, I/32] e8m0

  int local_experts(const MoeSpec& spec) const {
    return expert_count < 0 ? spec.num_experts - expert_offset : expert_count;
  }
  // Whether the view holds the shared expert at all (fused slots or the unfused MLP).
  bool holds_shared() const { return fused_slots > 0 || shared_w13 != nullptr; }
  bool fp8() const { return expert_dtype == DType::F8_E4M3; }
  bool mx() const { return mx_format != ExpertFormat::Bf16; }
};

// Floats of one expert's tile-scale grids in an fp8 view: w13 [2 ceil(I/128), ceil(H/128)],
// w2 [ceil(H/128), ceil(I/128)].
int64_t fp8_w13_scale_floats(const MoeSpec& spec);
int64_t fp8_w2_scale_floats(const MoeSpec& spec);

// The parts of a view one call reads; validate_view checks those only, so an engine that calls
// experts() on its own routing need not hand over a router, and route() needs no stacks.
enum class ViewUse {
  Layer,        // forward: everything below
  Router,       // route(x): router_weight, router_bias, correction_bias
  RoutingBias,  // route_logits: correction_bias
  Experts,      // experts(): the stacks, their biases, the slice, the shared expert
};
const char* view_use_name(ViewUse u);  // the call's name: "forward", "route", ...

// Throws naming the first problem in what `use` reads: a tensor the spec needs that is null, a
// stride smaller than one expert's matrix, an expert slice outside [0, E), fused_slots neither
// 0 nor S, half of the unfused shared MLP.
void validate_view(const MoeSpec& spec, const MoeWeightsView& view, ViewUse use = ViewUse::Layer);

// Row `local_row` of the view's stacks as an ExpertView (host or device pointers alike).
ExpertView view_expert(const MoeSpec& spec, const MoeWeightsView& view, int local_row);

// A LayerWeights over a host view: every CPU backend (cpu_reference::forward, cpu_fast::forward)
// runs on the borrowed weights, nothing copied. expert(e) takes global ids: routed
// [expert_offset, expert_offset + expert_count) and the fused slots E..E+S-1 when held; any other
// id throws naming the range held. The view's memory must outlive the object. `use` is what the
// caller will read (validate_view); the parts it leaves out may be null.
class ViewLayerWeights final : public LayerWeights {
 public:
  ViewLayerWeights(const MoeSpec& spec, const MoeWeightsView& view, int layer = 0,
                   ViewUse use = ViewUse::Layer);
  const void* router_weight() const override { return view_.router_weight; }
  const float* router_bias() const override;
  const float* correction_bias() const override;
  const Bf16* shared_w13() const override { return view_.shared_w13; }
  const Bf16* shared_w2() const override { return view_.shared_w2; }
  ExpertView expert(int e) const override;
  int materialised_experts() const override;
  std::string origin() const override { return "borrowed host weights"; }
  const MoeWeightsView& view() const { return view_; }

 private:
  MoeWeightsView view_;
};

enum class CpuBackend { Reference, Fast };

struct MoeOptions {
  // fused shared slots or the unfused shared MLP; Auto: the plan's rule on the GPU, fused on the
  // CPU, each where the view holds what that needs (a view holding only one form runs it)
  FuseShared fuse = FuseShared::Auto;
  int max_tokens = 8192;          // the most tokens one call takes (sizes the workspace)
  plan::PlanOverrides overrides;  // the GPU plan's knobs (plan::plan_overrides_from_env)
  int device = 0;                 // the CUDA device of device views
  CpuBackend cpu_backend = CpuBackend::Fast;
  cpu_fast::FastOptions cpu;  // the fast CPU backend's threads and ISA
  // fp8 host views: how the reference computes (the fast backend runs weight-only only, and
  // refuses W8A8 rather than change the numbers asked for)
  Fp8Compute fp8 = Fp8Compute::W8A8;
  // The experts' dtype of the device views this op runs (its kernels and workspace follow it):
  // BF16, or F8_E4M3 (W8A8; hidden and expert_intermediate multiples of 128, the shared expert
  // fused). Host views run whichever dtype they hold.
  DType expert_dtype = DType::BF16;
};

// Bytes of the device workspace MoeOp(spec, options with this max_tokens) needs on
// options.device, 256-byte aligned pieces of one buffer. 0 in a build without CUDA (host views
// need none).
size_t workspace_bytes(const MoeSpec& spec, int max_tokens, const MoeOptions& options);

// The status word's bits: what the device saw, read after the stream synchronised
// (MoeOp::read_status). The host calls report the same bits (MoeOp::read_host_status), and throw.
inline constexpr uint32_t kStatusExpertIdOutOfRange = 1u;  // a pair's expert outside [0, E)

struct MoeStatus {
  bool expert_id_out_of_range = false;  // a pair's expert outside [0, E) (its pair was dropped)
  bool ok() const { return !expert_id_out_of_range; }
  std::string message() const;  // "" when ok
  uint32_t word() const { return expert_id_out_of_range ? kStatusExpertIdOutOfRange : 0u; }
  static MoeStatus from_word(uint32_t word) {
    MoeStatus s;
    s.expert_id_out_of_range = (word & kStatusExpertIdOutOfRange) != 0;
    return s;
  }
};

// Where the shared expert goes in experts().
struct ExpertsOptions {
  bool add_shared = true;  // add the shared expert where the view holds it (MoeOptions::fuse)
  // [tokens] fp32 per-token scale of a gated shared expert (Qwen2-MoE: sigmoid of the gate
  // logit, route()'s shared_scale), in the location of the view; null = 1
  const float* shared_scale = nullptr;
};

class MoeOp {
 public:
  // Checks the spec and the options. Holds no weights and no workspace; host views need nothing
  // more. The GPU side is prepared by the first prepare_workspace().
  MoeOp(const MoeSpec& spec, const MoeOptions& options);
  ~MoeOp();
  MoeOp(const MoeOp&) = delete;
  MoeOp& operator=(const MoeOp&) = delete;

  const MoeSpec& spec() const { return spec_; }
  const MoeOptions& options() const { return options_; }
  // workspace_bytes(spec, options.max_tokens, options)
  size_t workspace_bytes() const;
  // Initialises a device workspace of workspace_bytes() on options.device (zeroed counters, a
  // clear status), once before its first use, outside any graph capture; synchronises `stream`.
  // The first call also prepares the op's GPU side: the plans' device facts, the kernels'
  // attributes, the router GEMM's warm-up, and the dense shared MLP's cuBLAS handle and scratch
  // (so one MoeOp runs one device call at a time). Every call restores the caller's device.
  void prepare_workspace(void* workspace, size_t bytes, CUstream_st* stream);

  // y[tokens, H] bf16 = the MoE layer on x[tokens, H] bf16. Host views: x and y host memory (y
  // is bf16 too: fp32 results rounded), workspace ignored, stream ignored. Device views: no
  // host synchronisation and no allocation (capturable in a CUDA graph); x, y 16-byte aligned.
  void forward(const MoeWeightsView& w, const void* x, void* y, int tokens, void* workspace,
               size_t workspace_bytes, CUstream_st* stream);

  // The router GEMM and the routing: topk_ids int32 [tokens, k] (global expert ids, by
  // descending key), topk_weights fp32 [tokens, k] (renormalised, routed scaling included);
  // shared_scale fp32 [tokens] when not null and the spec has a shared expert (sigmoid of the
  // gate logit for a gated one, else 1). From x (bf16 [tokens, H]) with the view's router, or
  // from logits (fp32 [tokens, router_columns], router bias already added) with the view's
  // correction bias.
  void route(const MoeWeightsView& w, const void* x, int tokens, int32_t* topk_ids,
             float* topk_weights, float* shared_scale, void* workspace, size_t workspace_bytes,
             CUstream_st* stream);
  void route_logits(const MoeWeightsView& w, const float* logits, int tokens, int32_t* topk_ids,
                    float* topk_weights, float* shared_scale, void* workspace,
                    size_t workspace_bytes, CUstream_st* stream);

  // The experts and the combine on the caller's routing: y[t] = sum_j topk_weights[t, j] *
  // E_{topk_ids[t, j]}(x[t]) over the pairs the view holds (+ the shared expert, ExpertsOptions).
  // top_k columns: spec.top_k. ids are global; an id outside [0, E) is an error (thrown on the
  // host, MoeStatus on the device).
  void experts(const MoeWeightsView& w, const void* x, const int32_t* topk_ids,
               const float* topk_weights, void* y, int tokens, const ExpertsOptions& eo,
               void* workspace, size_t workspace_bytes, CUstream_st* stream);

  // The device workspace's status since it was prepared or last cleared; synchronises `stream`.
  // clear: reset it after reading.
  MoeStatus read_status(void* workspace, CUstream_st* stream, bool clear = true) const;
  // The same bits from this op's host calls since it was made or last cleared: a host call that
  // meets what the device reports in its status word (an expert id outside [0, E) in experts())
  // sets it, then throws naming the problem. Lets one status check serve both locations.
  MoeStatus read_host_status(bool clear = true);

  struct Gpu;  // the CUDA side (src/cuda/engine/), absent until prepare_workspace

 private:
  Gpu& gpu(const char* what) const;
  MoeSpec spec_;
  MoeOptions options_;
  Gpu* gpu_ = nullptr;  // owned (destroyed by ~MoeOp)
  std::atomic<uint32_t> host_status_{0};
};

}  // namespace moekit

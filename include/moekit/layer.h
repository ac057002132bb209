// One MoE layer forward: router GEMM -> routing -> dispatch -> experts -> combine.
//
// Backends share these argument and result types, so one test body runs every backend
// ("cpu::op(args) and cuda::op(args) take the same args", STYLE.md). The CPU reference
// (src/cpu/reference_*.cpp) is the oracle; it is written for clarity, not speed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/dtype.h"
#include "moekit/routing.h"
#include "moekit/weights.h"

namespace moekit {

enum class FuseShared { Auto, On, Off };
const char* fuse_shared_name(FuseShared f);
FuseShared parse_fuse_shared(const std::string& s);  // "auto" | "on" | "off"
// MOEKIT_FUSE_SHARED_EXPERTS (auto|on|off|1|0), when set, overrides the requested mode.
FuseShared fuse_shared_from_env(FuseShared requested);

// How fp8 experts (LayerWeights::expert_dtype() == F8_E4M3) compute; bf16 weights ignore it.
//   W8A8        (the default: what an fp8 model with activation_scheme "dynamic" is, in DeepSeek's
//               inference code and transformers' finegrained_fp8) the input of each projection is
//               quantised per token per 128 channels to e4m3; per 128-wide K block the fp8
//               products are summed and scaled by activation scale x weight tile scale; h, the
//               down projection's input, is quantised from its bf16 value (the models' h is bf16).
//   WeightOnly  w = bf16(fp8 x scale) per tile, then the bf16 math of a bf16 checkpoint.
enum class Fp8Compute { W8A8, WeightOnly };
const char* fp8_compute_name(Fp8Compute m);             // "w8a8" | "weight-only"
Fp8Compute parse_fp8_compute(const std::string& s);      // throws naming s and the choices

// Non-finite values in x are an error (the layer throws naming the token and column): a NaN in
// an activation means something upstream broke, and propagating it silently hides where.
struct ForwardResult {
  int tokens = 0;
  int hidden = 0;
  std::vector<float> y;  // [tokens, hidden], fp32 (GPU backends return bf16 rounded to float)
  Routing routing;       // what was picked
  bool fused = false;    // whether the shared expert ran as fused slots
};

namespace cpu_reference {

// logits[T, router_columns] = x[T,H] . Wg^T (+ router bias), fp32 out, double accumulation.
std::vector<float> router_logits(const LayerWeights& w, const Bf16* x, int tokens);

// Routing of DESIGN.md §1 on fp32 logits [tokens, cfg.logits_columns].
// correction_bias / router_bias may be null when cfg says there is none.
Routing route(const RoutingConfig& cfg, const float* logits, int tokens,
              const float* correction_bias);

// One expert (routed or fused slot) on one token: out[H] = W2 . act(W13 . x) (+ biases).
// An fp8 view (ex.w13_fp8 set) computes per `fp8`.
void expert_forward(const MoeSpec& spec, const ExpertView& ex, const Bf16* x, float* out,
                    Fp8Compute fp8 = Fp8Compute::W8A8);

// The unfused shared MLP on one token (before its gate scale).
void shared_forward(const LayerWeights& w, const Bf16* x, float* out,
                    Fp8Compute fp8 = Fp8Compute::W8A8);

// The same two in double, unrounded: the values experts() sums (in slot order, then the shared
// MLP), so a caller that sums them in that order (the expert-parallel combine) gets its y bitwise.
void expert_forward_f64(const MoeSpec& spec, const ExpertView& ex, const Bf16* x, double* out,
                        Fp8Compute fp8 = Fp8Compute::W8A8);
void shared_forward_f64(const LayerWeights& w, const Bf16* x, double* out,
                        Fp8Compute fp8 = Fp8Compute::W8A8);

// The experts and the combine on a routing `r` (r.slots per token: the k routed ids, then the
// fused slots E..E+S-1 when it holds them): y[t] = sum_s w[t,s] * E_id(x_t), plus
// r.shared_scale[t] * shared(x_t) when add_shared (unfused). Routed experts outside
// [held_begin, held_end) (-1: E) are skipped, their pairs left to the rank that holds them.
// Throws naming an id outside [0, E + fused slots).
std::vector<float> experts(const LayerWeights& w, const Bf16* x, int tokens, const Routing& r,
                           bool add_shared, int held_begin = 0, int held_end = -1,
                           Fp8Compute fp8 = Fp8Compute::W8A8);

// The whole layer. fuse: Off runs the shared expert as its own MLP; On runs it as S slots of the
// routed experts (throws if the spec cannot fuse); Auto = On when fusable. fp8: how fp8 weights
// compute (ignored for bf16 weights).
ForwardResult forward(const LayerWeights& w, const Bf16* x, int tokens, FuseShared fuse,
                      Fp8Compute fp8 = Fp8Compute::W8A8);

// W8A8's activation quantisation of one token's n values: per group of 128 (the last partial),
// s = max(amax, 1e-4) / 448 (DeepSeek's act_quant; the floor makes an all-zero group s = 1e-4/448
// and its codes zero), with ue8m0 rounded up to a power of two; q = e4m3(v / s), round to nearest
// even, saturating at +-448. scales has ceil(n/128) entries.
void quantize_activation_fp8(const float* v, int n, bool ue8m0, uint8_t* q, float* scales);

}  // namespace cpu_reference

// Throws naming the first non-finite element of x[tokens, hidden].
void check_finite_input(const Bf16* x, int tokens, int hidden);

}  // namespace moekit

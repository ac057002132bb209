// CPU reference MoE layer: router GEMM -> routing -> experts -> combine, the oracle every other
// backend is compared with. Written for exactness and clarity, not speed:
//
//   logits[T, C]  = x[T,H] . Wg[C,H]^T (+ router bias, gpt-oss)   double accumulate, fp32 out
//                   C = E, or E+1 with a gated shared expert (row E = the shared gate row)
//   routing       = cpu_reference::route (routing_reference.cpp)
//   E_e(x)[H]     = W2_e[H,I] . act(W1_e x + b1, W3_e x + b3) + b2      all in double
//   y[t]          = sum_slots w * E_id(x_t)  (+ shared_scale[t] * shared(x_t) when unfused)
//
// Every expert, routed or fused shared slot, goes through one function (mlp_forward) that is
// given the gate rows, the up rows and the down columns, so the unfused shared MLP and its fused
// slots run the same arithmetic; fused and unfused differ only in summation order (1e-12 rel).
//
// Inputs are the bf16 values the GPU sees; weights are read exactly (bf16 or fp32) and nothing in
// between is rounded to bf16. Accumulation is in double, the combine is in double, and y is
// rounded to fp32 once at the end. The router bias is added here, in the router "epilogue", so
// route() always receives the logits the selection works on.
//
// fp8 weights (LayerWeights::expert_dtype() F8_E4M3) run the same MLP with the projections in one
// of two modes (layer.h, Fp8Compute; reference_fp8.h): weight-only reads each weight row as
// bf16(fp8 x tile scale), so it equals the bf16 reference on the dequantised checkpoint exactly;
// W8A8 quantises x per 128 channels, takes per-tile block dot products, and quantises the
// intermediate h per 128 channels again before the down projection. The router is not quantised.
// MX weights (expert_format() Mxfp4 / Mxfp8) run weight-only (W4A16 / W8A16, reference_mx.h):
// each row read as bf16(element x 2^(s-127)), then the bf16 math, so they equal the bf16
// reference on the same checkpoint loaded as bf16 exactly.
//
// Tokens are independent, so forward() splits them across threads; each token's arithmetic is
// the same sequence whatever the thread count, so results do not depend on it.
#include <algorithm>
#include <cmath>
#include <exception>
#include <thread>
#include <vector>

#include "cpu/experts_routing_check.h"
#include "cpu/reference_fp8.h"
#include "cpu/reference_mx.h"
#include "moekit/error.h"
#include "moekit/layer.h"

namespace moekit {

void check_finite_input(const Bf16* x, int tokens, int hidden) {
  MK_CHECK(tokens >= 0 && hidden > 0,
           "expected tokens >= 0 and hidden > 0, got tokens " << tokens << ", hidden " << hidden);
  MK_CHECK(tokens == 0 || x != nullptr, "input x is null for " << tokens << " tokens");
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < hidden; ++h) {
      const float v = bf16_to_float(x[static_cast<size_t>(t) * hidden + h]);
      MK_CHECK(std::isfinite(v), "non-finite input at token " << t << ", column " << h << ": " << v
                                                              << " (expected finite x)");
    }
  }
}

namespace cpu_reference {
namespace {

// Runs fn(i) for i in [0, n) on up to hardware_concurrency threads; rethrows the first error.
template <typename Fn>
void parallel_for(int n, Fn fn) {
  const int threads =
      std::max(1, std::min<int>(n, static_cast<int>(std::thread::hardware_concurrency())));
  if (threads <= 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::exception_ptr> errors(threads);
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w) {
    pool.emplace_back([&, w] {
      try {
        for (int i = w; i < n; i += threads) fn(i);
      } catch (...) {
        errors[w] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

double dot_bf16(const Bf16* w, const double* x, int n) {
  double acc = 0.0;
  for (int i = 0; i < n; ++i) acc += static_cast<double>(bf16_to_float(w[i])) * x[i];
  return acc;
}

// The gated nonlinearity on one intermediate element, per spec.activation (DESIGN.md §1).
double activate(const MoeSpec& spec, double g, double u) {
  const double limit = spec.swiglu_limit;
  if (limit > 0.0) {
    // The gate is clamped from above only, the up projection on both sides (gpt-oss, MiniMax-M3
    // swigluoai, DeepSeek-V4 silu with swiglu_limit).
    g = std::min(g, limit);
    u = std::clamp(u, -limit, limit);
  }
  switch (spec.activation) {
    case Activation::Silu:
      return g / (1.0 + std::exp(-g)) * u;
    case Activation::SwigluOai:
    case Activation::SwigluOaiInterleaved: {
      // Same math for both: the loader de-interleaves gpt-oss's gate/up columns into moekit's
      // split layout.
      const double alpha = spec.swiglu_alpha;
      const double glu = g / (1.0 + std::exp(-alpha * g));
      return (u + static_cast<double>(spec.swiglu_beta)) * glu;
    }
  }
  MK_FAIL("unknown activation " << static_cast<int>(spec.activation));
}

// One gated MLP of `width` intermediate elements on one token; writes
// out[H] = W2[:, 0:width] . act(gate . x + b_gate, up . x + b_up) + b2.
//   gate, up: [width, H] rows (row stride H); down: [H, *] with row stride down_stride.
//   fp8: gate8/up8/down8 instead (reference_fp8.h), computed per `mode`.
struct MlpView {
  const Bf16* gate = nullptr;
  const Bf16* up = nullptr;
  const Bf16* down = nullptr;
  int down_stride = 0;
  bool fp8 = false;
  Fp8Rows gate8, up8, down8;
  Fp8Compute mode = Fp8Compute::W8A8;
  bool ue8m0 = false;  // W8A8 activation scales rounded up to powers of two
  bool mx = false;     // MX rows instead (reference_mx.h), computed weight-only
  MxRows gate_mx, up_mx, down_mx;
  int width = 0;
  const float* b_gate = nullptr;  // [width] or null
  const float* b_up = nullptr;    // [width] or null
  const float* b_down = nullptr;  // [H] or null
};

// The fp8 MLP: projections per m.mode, the rest as mlp_forward.
void mlp_forward_fp8(const MoeSpec& spec, const MlpView& m, const double* x, double* out) {
  const int hidden = spec.hidden;
  const bool w8a8 = m.mode == Fp8Compute::W8A8;
  std::vector<double> act(m.width);
  // Weight-only: each row dequantised, then the bf16 dot; W8A8: x and h quantised once.
  std::vector<Bf16> row(std::max(hidden, m.width));
  std::vector<float> v(std::max(hidden, m.width));
  std::vector<uint8_t> q(v.size());
  std::vector<float> qs((v.size() + kFp8Tile - 1) / kFp8Tile);
  if (w8a8) {
    for (int k = 0; k < hidden; ++k) v[k] = static_cast<float>(x[k]);  // bf16 values: exact
    quantize_activation_fp8(v.data(), hidden, m.ue8m0, q.data(), qs.data());
  }
  auto project = [&](const Fp8Rows& w, size_t r, const double* in, int n) {
    if (w8a8) return dot_w8a8(w, r, q.data(), qs.data(), n);
    dequant_row(w, r, n, row.data());
    return dot_bf16(row.data(), in, n);
  };
  for (int i = 0; i < m.width; ++i) {
    double g = project(m.gate8, i, x, hidden);
    double u = project(m.up8, i, x, hidden);
    if (m.b_gate) g += m.b_gate[i];
    if (m.b_up) u += m.b_up[i];
    act[i] = activate(spec, g, u);
  }
  if (w8a8) {
    // h is re-quantised per 128 channels before the down projection, from its bf16 value: in
    // DeepSeek's inference code (and transformers' finegrained_fp8) the projections and the
    // activation produce bf16, and act_quant reads that.
    for (int i = 0; i < m.width; ++i) {
      v[i] = bf16_to_float(float_to_bf16(static_cast<float>(act[i])));
    }
    quantize_activation_fp8(v.data(), m.width, m.ue8m0, q.data(), qs.data());
  }
  for (int h = 0; h < hidden; ++h) {
    double acc = project(m.down8, h, act.data(), m.width);
    if (m.b_down) acc += m.b_down[h];
    out[h] = acc;
  }
}

// The MX MLP: each weight row dequantised to bf16, then mlp_forward's bf16 arithmetic.
void mlp_forward_mx(const MoeSpec& spec, const MlpView& m, const double* x, double* out) {
  const int hidden = spec.hidden;
  std::vector<double> act(m.width);
  std::vector<Bf16> row(std::max(hidden, m.width));
  for (int i = 0; i < m.width; ++i) {
    dequant_row_mx(m.gate_mx, i, hidden, row.data());
    double g = dot_bf16(row.data(), x, hidden);
    dequant_row_mx(m.up_mx, i, hidden, row.data());
    double u = dot_bf16(row.data(), x, hidden);
    if (m.b_gate) g += m.b_gate[i];
    if (m.b_up) u += m.b_up[i];
    act[i] = activate(spec, g, u);
  }
  for (int h = 0; h < hidden; ++h) {
    dequant_row_mx(m.down_mx, h, m.width, row.data());
    double acc = dot_bf16(row.data(), act.data(), m.width);
    if (m.b_down) acc += m.b_down[h];
    out[h] = acc;
  }
}

void mlp_forward(const MoeSpec& spec, const MlpView& m, const double* x, double* out) {
  if (m.mx) {
    mlp_forward_mx(spec, m, x, out);
    return;
  }
  if (m.fp8) {
    mlp_forward_fp8(spec, m, x, out);
    return;
  }
  const int hidden = spec.hidden;
  std::vector<double> act(m.width);
  for (int i = 0; i < m.width; ++i) {
    double g = dot_bf16(m.gate + static_cast<size_t>(i) * hidden, x, hidden);
    double u = dot_bf16(m.up + static_cast<size_t>(i) * hidden, x, hidden);
    if (m.b_gate) g += m.b_gate[i];
    if (m.b_up) u += m.b_up[i];
    act[i] = activate(spec, g, u);
  }
  for (int h = 0; h < hidden; ++h) {
    double acc = dot_bf16(m.down + static_cast<size_t>(h) * m.down_stride, act.data(), m.width);
    if (m.b_down) acc += m.b_down[h];
    out[h] = acc;
  }
}

size_t tiles(size_t n) { return (n + kFp8Tile - 1) / kFp8Tile; }

// gate [width, H] and up [width, H] in rows [0, width) and [width, 2 width) of w13, their tiles
// in tile rows [0, tiles(width)) and [tiles(width), 2 tiles(width)) of the scales; down [H, *]
// with ld columns.
void set_fp8(const MoeSpec& spec, const uint8_t* w13, const float* s13, const uint8_t* w2,
             const float* s2, size_t width, size_t ld, Fp8Compute mode, MlpView& m) {
  const size_t H = spec.hidden;
  m.fp8 = true;
  m.mode = mode;
  m.ue8m0 = spec.quant.scale_ue8m0;
  m.gate8 = {w13, s13, H, tiles(H)};
  m.up8 = {w13 + width * H, s13 + tiles(width) * tiles(H), H, tiles(H)};
  m.down8 = {w2, s2, ld, tiles(ld)};
}

// gate [width, H] and up [width, H] in rows [0, width) and [width, 2 width) of w13, down
// [H, width]: MX rows of format f with their e8m0 bytes.
void set_mx(const MoeSpec& spec, ExpertFormat f, const uint8_t* w13, const uint8_t* s13,
            const uint8_t* w2, const uint8_t* s2, size_t width, MlpView& m) {
  const size_t H = spec.hidden, row = mx_row_bytes(f, H), gh = H / kMxGroup;
  m.mx = true;
  m.gate_mx = {f, w13, s13, row, gh};
  m.up_mx = {f, w13 + width * row, s13 + width * gh, row, gh};
  m.down_mx = {f, w2, s2, mx_row_bytes(f, width), width / kMxGroup};
}

MlpView expert_view(const MoeSpec& spec, const ExpertView& ex, Fp8Compute mode) {
  const int inter = spec.expert_intermediate;
  MlpView m;
  if (ex.w13_mx != nullptr) {
    const ExpertFormat format = ex.mx_format;
    MK_CHECK(format == ExpertFormat::Mxfp4 || format == ExpertFormat::Mxfp8,
             "expert holds MX weights, but its mx_format is " << expert_format_name(format));
    MK_CHECK(ex.w13_mx_scale != nullptr && ex.w2_mx != nullptr && ex.w2_mx_scale != nullptr,
             "MX expert weights are incomplete (w13 " << static_cast<const void*>(ex.w13_mx)
                                                      << ", w2 "
                                                      << static_cast<const void*>(ex.w2_mx)
                                                      << ")");
    set_mx(spec, format, ex.w13_mx, ex.w13_mx_scale, ex.w2_mx, ex.w2_mx_scale, inter, m);
  } else if (ex.w13_fp8 != nullptr) {
    MK_CHECK(ex.w13_scale != nullptr && ex.w2_fp8 != nullptr && ex.w2_scale != nullptr,
             "fp8 expert weights are incomplete (w13 " << static_cast<const void*>(ex.w13_fp8)
                                                       << ", w2 "
                                                       << static_cast<const void*>(ex.w2_fp8)
                                                       << ", scales " << ex.w13_scale << ", "
                                                       << ex.w2_scale << ")");
    set_fp8(spec, ex.w13_fp8, ex.w13_scale, ex.w2_fp8, ex.w2_scale, inter, inter, mode, m);
  } else {
    MK_CHECK(ex.w13 != nullptr && ex.w2 != nullptr,
             "expert weights are null (w13 " << ex.w13 << ", w2 " << ex.w2 << ")");
    m.gate = ex.w13;
    m.up = ex.w13 + static_cast<size_t>(inter) * spec.hidden;
    m.down = ex.w2;
  }
  m.down_stride = inter;
  m.width = inter;
  if (ex.b13) {
    m.b_gate = ex.b13;
    m.b_up = ex.b13 + inter;
  }
  m.b_down = ex.b2;
  return m;
}

MlpView shared_view(const LayerWeights& w, Fp8Compute mode) {
  const MoeSpec& spec = w.spec();
  const int width = spec.shared_intermediate;
  MK_CHECK(spec.shared_kind != SharedKind::None && width > 0,
           spec.name << " has no shared expert (shared_intermediate " << width << ")");
  MlpView m;
  const ExpertFormat f = w.expert_format();
  if (f == ExpertFormat::Mxfp4 || f == ExpertFormat::Mxfp8) {
    MK_CHECK(w.shared_w13_mx() && w.shared_w13_mx_scale() && w.shared_w2_mx() &&
                 w.shared_w2_mx_scale(),
             expert_format_name(f) << " shared expert weights of " << spec.name << " are missing");
    set_mx(spec, f, w.shared_w13_mx(), w.shared_w13_mx_scale(), w.shared_w2_mx(),
           w.shared_w2_mx_scale(), width, m);
  } else if (f == ExpertFormat::Fp8Block) {
    MK_CHECK(w.shared_w13_fp8() && w.shared_w13_scale() && w.shared_w2_fp8() &&
                 w.shared_w2_scale(),
             "fp8 shared expert weights of " << spec.name << " are missing");
    set_fp8(spec, w.shared_w13_fp8(), w.shared_w13_scale(), w.shared_w2_fp8(),
            w.shared_w2_scale(), width, width, mode, m);
  } else {
    MK_CHECK(w.shared_w13() != nullptr && w.shared_w2() != nullptr,
             "shared expert weights of " << spec.name << " are missing");
    m.gate = w.shared_w13();
    m.up = w.shared_w13() + static_cast<size_t>(width) * spec.hidden;
    m.down = w.shared_w2();
  }
  m.down_stride = width;
  m.width = width;
  return m;
}

std::vector<double> to_double(const Bf16* x, int n) {
  std::vector<double> v(n);
  for (int i = 0; i < n; ++i) v[i] = bf16_to_float(x[i]);
  return v;
}

}  // namespace

std::vector<float> router_logits(const LayerWeights& w, const Bf16* x, int tokens) {
  const MoeSpec& spec = w.spec();
  const int hidden = spec.hidden;
  const int cols = spec.router_columns();
  const DType dt = w.router_dtype();
  MK_CHECK(dt == DType::BF16 || dt == DType::F32,
           "expected router dtype BF16 or F32, got " << dtype_name(dt));
  MK_CHECK(w.router_weight() != nullptr, "router weight of " << spec.name << " is missing");
  MK_CHECK(!spec.has_router_bias || w.router_bias() != nullptr,
           spec.name << " has a router bias but the weights hold none");
  MK_CHECK(tokens >= 0, "expected tokens >= 0, got " << tokens);

  std::vector<float> logits(static_cast<size_t>(tokens) * cols);
  parallel_for(tokens, [&](int t) {
    const std::vector<double> xt = to_double(x + static_cast<size_t>(t) * hidden, hidden);
    for (int c = 0; c < cols; ++c) {
      const size_t row = static_cast<size_t>(c) * hidden;
      double acc = 0.0;
      if (dt == DType::F32) {
        const float* wg = static_cast<const float*>(w.router_weight()) + row;
        for (int h = 0; h < hidden; ++h) acc += static_cast<double>(wg[h]) * xt[h];
      } else {
        acc = dot_bf16(static_cast<const Bf16*>(w.router_weight()) + row, xt.data(), hidden);
      }
      // gpt-oss router bias on the routed columns (never on a gated shared expert's gate column)
      if (spec.has_router_bias && c < spec.num_experts) acc += w.router_bias()[c];
      logits[static_cast<size_t>(t) * cols + c] = static_cast<float>(acc);
    }
  });
  return logits;
}

void expert_forward_f64(const MoeSpec& spec, const ExpertView& ex, const Bf16* x, double* out,
                        Fp8Compute fp8) {
  const std::vector<double> xd = to_double(x, spec.hidden);
  mlp_forward(spec, expert_view(spec, ex, fp8), xd.data(), out);
}

void shared_forward_f64(const LayerWeights& w, const Bf16* x, double* out, Fp8Compute fp8) {
  const std::vector<double> xd = to_double(x, w.spec().hidden);
  mlp_forward(w.spec(), shared_view(w, fp8), xd.data(), out);
}

void expert_forward(const MoeSpec& spec, const ExpertView& ex, const Bf16* x, float* out,
                    Fp8Compute fp8) {
  std::vector<double> yd(spec.hidden);
  expert_forward_f64(spec, ex, x, yd.data(), fp8);
  for (int h = 0; h < spec.hidden; ++h) out[h] = static_cast<float>(yd[h]);
}

void shared_forward(const LayerWeights& w, const Bf16* x, float* out, Fp8Compute fp8) {
  std::vector<double> yd(w.spec().hidden);
  shared_forward_f64(w, x, yd.data(), fp8);
  for (int h = 0; h < w.spec().hidden; ++h) out[h] = static_cast<float>(yd[h]);
}

std::vector<float> experts(const LayerWeights& w, const Bf16* x, int tokens, const Routing& r,
                           bool add_shared, int held_begin, int held_end, Fp8Compute fp8) {
  const MoeSpec& spec = w.spec();
  const int hidden = spec.hidden;
  const int E = spec.num_experts;
  const int fused_slots =
      cpu_detail::check_experts_routing(spec, tokens, r, add_shared, held_begin, held_end);

  // Look every used expert up once, here on the calling thread: materialisation (and any error it
  // raises) happens before the parallel part, which then only reads. Routed experts outside the
  // held range are skipped (another rank computes them).
  const int rows = E + fused_slots;
  auto held = [&](int32_t id) { return id >= E || (id >= held_begin && id < held_end); };
  std::vector<bool> used(rows, false);
  for (int32_t id : r.ids) {
    MK_CHECK(id >= 0 && id < rows,
             "routing picked expert " << id << ", expected [0, " << rows << ")");
    used[id] = held(id);
  }
  std::vector<MlpView> views(rows);
  for (int e = 0; e < rows; ++e) {
    if (!used[e]) continue;
    const ExpertView ex = w.expert(e);
    if (spec.has_expert_bias && e < spec.num_experts) {
      MK_CHECK(ex.b13 != nullptr && ex.b2 != nullptr,
               spec.name << " has expert biases but expert " << e << " holds none");
    }
    views[e] = expert_view(spec, ex, fp8);
  }
  const MlpView shared = add_shared ? shared_view(w, fp8) : MlpView{};
  MK_CHECK(!add_shared || r.shared_scale.size() == static_cast<size_t>(tokens),
           "expected " << tokens << " shared scales, got " << r.shared_scale.size());

  std::vector<float> y(static_cast<size_t>(tokens) * hidden, 0.0f);
  parallel_for(tokens, [&](int t) {
    const std::vector<double> xt = to_double(x + static_cast<size_t>(t) * hidden, hidden);
    std::vector<double> acc(hidden, 0.0), out(hidden);
    for (int s = 0; s < r.slots; ++s) {
      const size_t slot = static_cast<size_t>(t) * r.slots + s;
      if (!used[r.ids[slot]]) continue;
      mlp_forward(spec, views[r.ids[slot]], xt.data(), out.data());
      // The weight multiplies the whole expert output, down bias included (gpt-oss).
      const double weight = r.weights[slot];
      for (int h = 0; h < hidden; ++h) acc[h] += weight * out[h];
    }
    if (add_shared) {
      mlp_forward(spec, shared, xt.data(), out.data());
      const double scale = r.shared_scale[t];
      for (int h = 0; h < hidden; ++h) acc[h] += scale * out[h];
    }
    float* yt = y.data() + static_cast<size_t>(t) * hidden;
    for (int h = 0; h < hidden; ++h) yt[h] = static_cast<float>(acc[h]);
  });
  return y;
}

ForwardResult forward(const LayerWeights& w, const Bf16* x, int tokens, FuseShared fuse,
                      Fp8Compute fp8) {
  const MoeSpec& spec = w.spec();
  const int hidden = spec.hidden;
  check_finite_input(x, tokens, hidden);

  // fuse: On must be possible (from_spec throws naming the widths), Auto fuses when it can.
  const bool fused = fuse == FuseShared::On || (fuse == FuseShared::Auto && spec.can_fuse_shared());
  check_forward_memory(w, tokens, fused);  // refuse before allocating, naming both sizes

  ForwardResult result;
  result.tokens = tokens;
  result.hidden = hidden;
  result.fused = fused;
  const RoutingConfig cfg = RoutingConfig::from_spec(spec, fused);
  const std::vector<float> logits = router_logits(w, x, tokens);
  result.routing = route(cfg, logits.data(), tokens, w.correction_bias());
  const bool add_shared = !fused && spec.shared_kind != SharedKind::None;
  result.y = experts(w, x, tokens, result.routing, add_shared, 0, -1, fp8);
  return result;
}

}  // namespace cpu_reference
}  // namespace moekit

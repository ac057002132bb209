// The engine API with borrowed host weights: an "engine" holds a layer's weights in its own
// buffers, in vLLM's fused_experts layout (w13 [E(+S), 2I, H] gate rows first, w2 [E(+S), H, I]),
// describes them with a MoeWeightsView and lets moekit run the layer on them, nothing copied:
// the whole forward, then route() and experts() as two calls, then two ranks that each hold half
// of the experts (rank 1 also the shared expert) and sum their partial outputs.
//
//   engine_api [config.json or model name, default: a small DeepSeek-V3-shaped spec]
//
// Prints the three results' agreement and exits non-zero when they disagree.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "moekit/error.h"
#include "moekit/moe.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace {

// A DeepSeek-V3-shaped layer small enough for a test: 16 experts in 8 groups, top 4 of them,
// sigmoid scores with a correction bias, one shared expert (one fused slot).
const char* kSmallConfig = R"({
  "model_type": "deepseek_v3", "hidden_size": 128, "moe_intermediate_size": 64,
  "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 8, "topk_group": 4,
  "n_shared_experts": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
  "num_hidden_layers": 2, "first_k_dense_replace": 1, "intermediate_size": 256
})";

// The engine's own buffers: here filled from moekit's deterministic random weights.
struct EngineLayer {
  std::vector<uint8_t> router;
  std::vector<float> correction_bias;
  std::vector<moekit::Bf16> w13, w2, shared_w13, shared_w2;
};

EngineLayer engine_weights(const moekit::MoeSpec& spec) {
  const auto lw = moekit::make_random_weights(spec, spec.moe_layers.front(), 1);
  const size_t H = spec.hidden, I = spec.expert_intermediate;
  const int rows = spec.weight_rows(spec.can_fuse_shared());  // E routed + S fused slots
  EngineLayer e;
  const size_t router_bytes = spec.router_columns() * H * moekit::dtype_size(spec.router_dtype);
  e.router.assign(static_cast<const uint8_t*>(lw->router_weight()),
                  static_cast<const uint8_t*>(lw->router_weight()) + router_bytes);
  if (lw->correction_bias() != nullptr)
    e.correction_bias.assign(lw->correction_bias(), lw->correction_bias() + spec.num_experts);
  e.w13.resize(rows * 2 * I * H);
  e.w2.resize(rows * H * I);
  for (int r = 0; r < rows; ++r) {
    const moekit::ExpertView ex = lw->expert(r);
    std::memcpy(e.w13.data() + r * 2 * I * H, ex.w13, 2 * I * H * sizeof(moekit::Bf16));
    std::memcpy(e.w2.data() + r * H * I, ex.w2, H * I * sizeof(moekit::Bf16));
  }
  if (lw->shared_w13() != nullptr) {
    const size_t Is = spec.shared_intermediate;
    e.shared_w13.assign(lw->shared_w13(), lw->shared_w13() + 2 * Is * H);
    e.shared_w2.assign(lw->shared_w2(), lw->shared_w2() + H * Is);
  }
  return e;
}

double max_diff(const std::vector<moekit::Bf16>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::fmax(m, std::fabs(moekit::bf16_to_float(a[i]) - b[i]));
  return m;
}

}  // namespace

int main(int argc, char** argv) try {
  using namespace moekit;
  const MoeSpec spec = argc > 1 ? load_spec(argv[1]) : parse_spec_json(kSmallConfig, "small");
  const EngineLayer e = engine_weights(spec);
  const int T = 8, H = spec.hidden, k = spec.top_k;

  // the view: borrowed pointers, the fused slot after the 16 routed experts
  MoeWeightsView w;
  w.location = Location::Host;
  w.router_weight = e.router.data();
  w.correction_bias = e.correction_bias.empty() ? nullptr : e.correction_bias.data();
  w.w13 = e.w13.data();
  w.w2 = e.w2.data();
  w.fused_slots = spec.can_fuse_shared() ? spec.shared_slots() : 0;
  w.shared_w13 = e.shared_w13.empty() ? nullptr : e.shared_w13.data();
  w.shared_w2 = e.shared_w2.empty() ? nullptr : e.shared_w2.data();

  MoeOptions opt;
  opt.max_tokens = T;
  opt.cpu_backend = CpuBackend::Reference;
  MoeOp op(spec, opt);

  std::vector<Bf16> x(static_cast<size_t>(T) * H), y(x.size()), y2(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(std::sin(0.37 * i));

  // 1. the whole layer
  op.forward(w, x.data(), y.data(), T, nullptr, 0, nullptr);

  // 2. the engine's own two steps: route, then the experts on that routing
  std::vector<int32_t> ids(T * k);
  std::vector<float> weights(T * k);
  op.route(w, x.data(), T, ids.data(), weights.data(), nullptr, nullptr, 0, nullptr);
  op.experts(w, x.data(), ids.data(), weights.data(), y2.data(), T, {}, nullptr, 0, nullptr);
  size_t split_differs = 0;
  for (size_t i = 0; i < y.size(); ++i) split_differs += y[i].bits != y2[i].bits;

  // 3. two ranks with half of the experts each; the shared expert on rank 1 only
  std::vector<float> sum(y.size(), 0.0f);
  const int E = spec.num_experts;
  for (int rank = 0; rank < 2; ++rank) {
    MoeWeightsView part = w;
    part.expert_offset = rank * (E / 2);
    part.expert_count = rank == 0 ? E / 2 : E - E / 2;
    const size_t first = static_cast<size_t>(part.expert_offset);
    part.w13 = e.w13.data() + first * 2 * spec.expert_intermediate * H;
    part.w2 = e.w2.data() + first * H * spec.expert_intermediate;
    // the fused slot lies right after rank 1's experts in the stacks: rank 1 holds it
    part.fused_slots = rank == 1 ? w.fused_slots : 0;
    part.shared_w13 = nullptr;
    part.shared_w2 = nullptr;
    std::vector<Bf16> yr(y.size());
    op.forward(part, x.data(), yr.data(), T, nullptr, 0, nullptr);
    for (size_t i = 0; i < yr.size(); ++i) sum[i] += bf16_to_float(yr[i]);
  }
  const double slice_diff = max_diff(y, sum);
  double y_max = 0;
  for (Bf16 v : y) y_max = std::fmax(y_max, std::fabs(bf16_to_float(v)));

  std::printf("%s: %d tokens, y[0][0..3] = %.5f %.5f %.5f %.5f\n", spec.name.c_str(), T,
              bf16_to_float(y[0]), bf16_to_float(y[1]), bf16_to_float(y[2]), bf16_to_float(y[3]));
  std::printf("route + experts vs forward: %zu elements differ\n", split_differs);
  std::printf("two expert slices summed vs forward: max |diff| %.3g (max |y| %.3g)\n", slice_diff,
              y_max);
  const bool ok = split_differs == 0 && slice_diff <= 2e-2 * y_max;
  std::printf("%s\n", ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
} catch (const moekit::Error& err) {
  std::fprintf(stderr, "engine_api: %s\n", err.what());
  return 2;
}

// CPU reference routing: fp32 router logits -> per-token expert ids and weights (DESIGN.md §1),
// with the fused shared-expert slots appended (DESIGN.md §2). This is the oracle the GPU routing
// kernel is compared with, so it is written for clarity and for bit-for-bit agreement on the
// *selection*:
//
//   1. score s   per expert, in fp32:  softmax | sigmoid | sqrt(softplus) | the logit itself
//   2. key   c   = s (+ e_score_correction_bias in fp32)                      selection only
//   3. groups    (n_group > 1): group score = top-2 key sum (with a bias) or group max; the
//                topk_group best groups are kept (ties -> lower group), the others' keys -> -inf
//   4. top-k     over the keys, descending, ties -> lower expert id; this is also the slot order
//   5. weights   from the UNBIASED score, recomputed from the logit in double (never key - bias:
//                with biases ~12 and scores ~1e-8, fp32 key - bias is exactly 0); softmax-of-topk
//                takes the softmax over the k picked logits; renormalise w / (sum + 1e-20) when
//                cfg.renormalize, then multiply by routed_scaling_factor (even without renorm,
//                as DeepSeek-V2 does)
//   6. fused     shared slots E..E+S-1 appended with weight 1 (plain) or sigmoid(gate logit)
//                (gated, column E of the logits row); the routed scaling is folded into the
//                routed weights, so the shared slots need no 1/rsf.
//
// Why fp32 keys: the GPU computes keys in fp32, and the two must pick the same experts. Keys use
// plain IEEE float arithmetic and the float overloads of std::exp/log1p/sqrt; a GPU using fast
// intrinsics can differ by an ulp, which only matters for logits tied to within an ulp (tests
// build tie-free logits, or exact ties, which both sides break the same way).
//
// Router bias (gpt-oss): added to the logits by cpu_reference::router_logits (the router GEMM
// epilogue), so the logits route() receives already include it; cfg.has_router_bias only tells
// route that the logits are "biased logits" for softmax-of-topk.
//
// NaN policy: a NaN or infinite logit throws naming the token and the expert column; it means
// the input or the router weight is broken, and silently picking some expert would hide that.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/routing.h"

namespace moekit {

RoutingConfig RoutingConfig::from_spec(const MoeSpec& spec, bool fuse_shared) {
  if (fuse_shared) {
    MK_CHECK(spec.can_fuse_shared(), "cannot fuse the shared expert of "
                                         << spec.name << ": expected shared_intermediate ("
                                         << spec.shared_intermediate
                                         << ") to be a positive whole multiple of "
                                            "expert_intermediate ("
                                         << spec.expert_intermediate << ")");
  }
  RoutingConfig cfg;
  cfg.num_experts = spec.num_experts;
  cfg.top_k = spec.top_k;
  cfg.n_group = spec.n_group;
  cfg.topk_group = spec.topk_group;
  cfg.group_score_top2_sum = spec.group_score_top2_sum;
  cfg.scoring = spec.scoring;
  cfg.renormalize = spec.renormalize;
  cfg.routed_scaling_factor = spec.routed_scaling_factor;
  cfg.has_correction_bias = spec.has_correction_bias;
  cfg.has_router_bias = spec.has_router_bias;
  cfg.shared_slots = fuse_shared ? spec.shared_slots() : 0;
  cfg.shared_kind = spec.shared_kind;
  cfg.logits_columns = spec.router_columns();
  return cfg;
}

namespace cpu_reference {
namespace {

void validate_config(const RoutingConfig& cfg) {
  const int e = cfg.num_experts;
  MK_CHECK(e > 0, "expected num_experts > 0, got " << e);
  MK_CHECK(cfg.top_k > 0 && cfg.top_k <= e,
           "expected 0 < top_k <= num_experts (" << e << "), got " << cfg.top_k);
  MK_CHECK(cfg.n_group >= 1 && e % cfg.n_group == 0,
           "expected n_group >= 1 dividing num_experts (" << e << "), got " << cfg.n_group);
  MK_CHECK(cfg.topk_group >= 1 && cfg.topk_group <= cfg.n_group,
           "expected 1 <= topk_group <= n_group (" << cfg.n_group << "), got " << cfg.topk_group);
  if (cfg.n_group > 1) {
    const int kept = cfg.topk_group * (e / cfg.n_group);
    MK_CHECK(cfg.top_k <= kept, "expected top_k <= topk_group * experts per group ("
                                    << kept << "), got " << cfg.top_k);
    MK_CHECK(!cfg.group_score_top2_sum || e / cfg.n_group >= 2,
             "group_score_top2_sum needs >= 2 experts per group, got " << e / cfg.n_group);
  }
  const int want_cols = e + (cfg.shared_kind == SharedKind::Gated ? 1 : 0);
  MK_CHECK(cfg.logits_columns == want_cols,
           "expected logits_columns = " << want_cols << " (num_experts"
                                        << (cfg.shared_kind == SharedKind::Gated ? " + gate" : "")
                                        << "), got " << cfg.logits_columns);
  MK_CHECK(cfg.shared_slots >= 0, "expected shared_slots >= 0, got " << cfg.shared_slots);
  MK_CHECK(cfg.shared_slots == 0 || cfg.shared_kind != SharedKind::None,
           "shared_slots = " << cfg.shared_slots << " but shared_kind is None");
  MK_CHECK(std::isfinite(cfg.routed_scaling_factor),
           "expected a finite routed_scaling_factor, got " << cfg.routed_scaling_factor);
}

// Unbiased score in fp32: what selection sees (before the correction bias).
float score_fp32(Scoring scoring, float logit) {
  switch (scoring) {
    case Scoring::Sigmoid:
      return 1.0f / (1.0f + std::exp(-logit));
    case Scoring::SqrtSoftplus: {
      // softplus(x) = max(x, 0) + log1p(exp(-|x|)): no overflow for large |x|.
      const float sp = std::max(logit, 0.0f) + std::log1p(std::exp(-std::fabs(logit)));
      return std::sqrt(sp);
    }
    case Scoring::SoftmaxOfTopk:
      return logit;
    case Scoring::Softmax:
      break;  // needs the whole row, handled by the caller
  }
  MK_FAIL("score_fp32: scoring " << scoring_name(scoring) << " is not elementwise");
}

// The same scores in double, for the weights.
double score_double(Scoring scoring, double logit) {
  switch (scoring) {
    case Scoring::Sigmoid:
      return 1.0 / (1.0 + std::exp(-logit));
    case Scoring::SqrtSoftplus:
      return std::sqrt(std::max(logit, 0.0) + std::log1p(std::exp(-std::fabs(logit))));
    case Scoring::SoftmaxOfTopk:
      return logit;
    case Scoring::Softmax:
      break;
  }
  MK_FAIL("score_double: scoring " << scoring_name(scoring) << " is not elementwise");
}

// a goes before b: larger key first, on equal keys the lower index.
bool key_before(float key_a, int a, float key_b, int b) {
  return key_a > key_b || (key_a == key_b && a < b);
}

// Indices of the k largest keys, in selection order.
std::vector<int> top_k_indices(const std::vector<float>& keys, int k) {
  std::vector<int> idx(keys.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return key_before(keys[a], a, keys[b], b); });
  idx.resize(k);
  return idx;
}

// Grouped top-k, step 3 of the header: keys of the groups not kept become -inf in place.
void mask_groups(const RoutingConfig& cfg, std::vector<float>& keys) {
  const int per_group = cfg.num_experts / cfg.n_group;
  std::vector<float> group_score(cfg.n_group);
  for (int g = 0; g < cfg.n_group; ++g) {
    const auto first = keys.begin() + static_cast<ptrdiff_t>(g) * per_group;
    std::vector<float> members(first, first + per_group);
    std::sort(members.begin(), members.end(), std::greater<float>());
    // fp32 sum of the two largest, like the GPU; the group max otherwise.
    group_score[g] = cfg.group_score_top2_sum ? members[0] + members[1] : members[0];
  }
  const std::vector<int> kept = top_k_indices(group_score, cfg.topk_group);
  std::vector<bool> keep(cfg.n_group, false);
  for (int g : kept) keep[g] = true;
  for (int e = 0; e < cfg.num_experts; ++e) {
    if (!keep[e / per_group]) keys[e] = -std::numeric_limits<float>::infinity();
  }
}

double sigmoid_double(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

Routing route(const RoutingConfig& cfg, const float* logits, int tokens,
              const float* correction_bias) {
  validate_config(cfg);
  MK_CHECK(tokens >= 0, "expected tokens >= 0, got " << tokens);
  MK_CHECK(tokens == 0 || logits != nullptr, "logits is null for " << tokens << " tokens");
  MK_CHECK(!cfg.has_correction_bias || correction_bias != nullptr,
           "the routing config has a correction bias but correction_bias is null");
  const int num_e = cfg.num_experts;
  const int k = cfg.top_k;
  const int cols = cfg.logits_columns;

  Routing r;
  r.tokens = tokens;
  r.slots = cfg.slots_per_token();
  r.ids.resize(static_cast<size_t>(tokens) * r.slots);
  r.weights.resize(static_cast<size_t>(tokens) * r.slots);
  if (cfg.shared_kind != SharedKind::None) r.shared_scale.resize(tokens);

  std::vector<float> keys(num_e);
  for (int t = 0; t < tokens; ++t) {
    const float* row = logits + static_cast<size_t>(t) * cols;
    for (int c = 0; c < cols; ++c) {
      MK_CHECK(std::isfinite(row[c]), "router logit of token " << t << ", expert " << c << " is "
                                                               << row[c] << " (expected finite)");
    }

    // scores and keys, fp32
    if (cfg.scoring == Scoring::Softmax) {
      const float mx = *std::max_element(row, row + num_e);
      float sum = 0.0f;
      for (int e = 0; e < num_e; ++e) {
        keys[e] = std::exp(row[e] - mx);
        sum += keys[e];
      }
      for (int e = 0; e < num_e; ++e) keys[e] /= sum;
    } else {
      for (int e = 0; e < num_e; ++e) keys[e] = score_fp32(cfg.scoring, row[e]);
    }
    if (cfg.has_correction_bias) {
      for (int e = 0; e < num_e; ++e) keys[e] += correction_bias[e];
    }
    if (cfg.n_group > 1) mask_groups(cfg, keys);

    const std::vector<int> picked = top_k_indices(keys, k);

    // weights from the unbiased score, in double
    std::vector<double> w(k);
    if (cfg.scoring == Scoring::Softmax) {
      double mx = row[0];
      for (int e = 1; e < num_e; ++e) mx = std::max(mx, static_cast<double>(row[e]));
      double denom = 0.0;
      for (int e = 0; e < num_e; ++e) denom += std::exp(static_cast<double>(row[e]) - mx);
      for (int j = 0; j < k; ++j) w[j] = std::exp(static_cast<double>(row[picked[j]]) - mx) / denom;
    } else if (cfg.scoring == Scoring::SoftmaxOfTopk) {
      // picked[0] holds the largest logit: subtract it for a stable softmax over the k picked.
      const double mx = row[picked[0]];
      double denom = 0.0;
      for (int j = 0; j < k; ++j) {
        w[j] = std::exp(static_cast<double>(row[picked[j]]) - mx);
        denom += w[j];
      }
      for (int j = 0; j < k; ++j) w[j] /= denom;
    } else {
      for (int j = 0; j < k; ++j) w[j] = score_double(cfg.scoring, row[picked[j]]);
    }
    if (cfg.renormalize) {
      const double sum = std::accumulate(w.begin(), w.end(), 0.0);
      for (double& v : w) v /= (sum + 1e-20);
    }

    int32_t* ids = r.ids.data() + static_cast<size_t>(t) * r.slots;
    float* weights = r.weights.data() + static_cast<size_t>(t) * r.slots;
    for (int j = 0; j < k; ++j) {
      ids[j] = picked[j];
      weights[j] = static_cast<float>(w[j] * static_cast<double>(cfg.routed_scaling_factor));
    }

    // shared expert: its per-token scale, and the fused slots carrying it
    if (cfg.shared_kind != SharedKind::None) {
      const float scale = cfg.shared_kind == SharedKind::Gated
                              ? static_cast<float>(sigmoid_double(row[num_e]))
                              : 1.0f;
      r.shared_scale[t] = scale;
      for (int s = 0; s < cfg.shared_slots; ++s) {
        ids[k + s] = num_e + s;
        weights[k + s] = scale;
      }
    }
  }
  return r;
}

}  // namespace cpu_reference
}  // namespace moekit

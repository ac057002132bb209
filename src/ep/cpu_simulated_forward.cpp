// simulated_forward (moekit/ep_cpu.h): the expert-parallel layer with every rank in one process,
// the plans of moekit/ep.h executed with memcpy as the transport and the CPU reference's math.
//
// Buffers per rank, as a GPU transport would hold them:
//   recv_x      [buffer_rows, H] bf16      token rows from every source, at row_offset[source]
//   recv_pairs  [buffer_pairs] Pair        their pairs, at pair_offset[source]
//   recv_out    [buffer_pairs, H] double   the weighted output of each received pair
//   back        [plan.pairs, H] double     the outputs of this rank's own pairs, laid out like
//                                          its plan (destination blocks in rank order)
// In low-latency mode the receive buffers are W x capacity and only each block's head is used.
#include <algorithm>
#include <cstring>
#include <memory>

#include "moekit/ep_cpu.h"
#include "moekit/error.h"

namespace moekit::ep {
namespace {

constexpr int64_t kPairRecordBytes = 3 * sizeof(int32_t) + sizeof(float);

struct RankState {
  MoeWeightsView view;                   // normalised: expert_offset 0, expert_count n
  std::unique_ptr<ViewLayerWeights> lw;  // router, biases and the unfused shared MLP
  std::vector<Bf16> recv_x;
  std::vector<Pair> recv_pairs;
  std::vector<double> recv_out;
  std::vector<double> back;
};

void check_rank_view(const MoeSpec& spec, const Placement& p, int r, const MoeWeightsView& v,
                     bool fused) {
  MK_CHECK(v.location == Location::Host,
           "rank " << r << ": the CPU simulation needs host weights, got a "
                   << location_name(v.location) << " view");
  MK_CHECK(v.local_experts(spec) == p.local_experts(r),
           "rank " << r << "'s view holds " << v.local_experts(spec)
                   << " routed experts, the placement gives it " << p.local_experts(r) << " ("
                   << p.describe() << ")");
  const bool has_shared = spec.shared_kind != SharedKind::None;
  if (fused) {
    MK_CHECK(v.fused_slots == spec.shared_slots(),
             "rank " << r << ": the shared expert runs fused, so its view must hold the "
                     << spec.shared_slots() << " fused slots after its routed experts, got "
                     << v.fused_slots);
  } else if (has_shared) {
    MK_CHECK(v.shared_w13 != nullptr,
             "rank " << r << ": the shared expert runs unfused on each token's own rank, so "
                     << "every rank's view needs shared_w13 / shared_w2");
  }
}

}  // namespace

std::vector<RankResult> simulated_forward(const MoeSpec& spec, const Placement& placement,
                                          const std::vector<MoeWeightsView>& weights,
                                          const std::vector<RankTokens>& tokens,
                                          const SimOptions& options) {
  const int W = placement.world_size();
  const int H = spec.hidden;
  MK_CHECK(placement.num_experts() == spec.num_experts,
           "the placement is of " << placement.num_experts() << " experts, " << spec.name << " has "
                                  << spec.num_experts);
  MK_CHECK(static_cast<int>(weights.size()) == W && static_cast<int>(tokens.size()) == W,
           "expected a view and a token block for each of the "
               << W << " ranks, got " << weights.size() << " views and " << tokens.size()
               << " blocks");
  const FuseShared fuse = options.fuse;
  const bool fused = fuse == FuseShared::On || (fuse == FuseShared::Auto && spec.can_fuse_shared());
  const RoutingConfig cfg = RoutingConfig::from_spec(spec, fused);  // throws if On cannot fuse
  const bool add_shared = !fused && spec.shared_kind != SharedKind::None;
  const ExchangeConfig xcfg{options.mode, options.max_tokens_per_rank, cfg.slots_per_token()};

  std::vector<RankState> ranks(W);
  std::vector<RankResult> results(W);

  // route and plan, each rank on its own tokens
  std::vector<DispatchPlan> plans;
  for (int r = 0; r < W; ++r) {
    check_rank_view(spec, placement, r, weights[r], fused);
    RankState& st = ranks[r];
    st.view = weights[r];
    st.view.expert_offset = 0;
    st.view.expert_count = placement.local_experts(r);
    st.lw = std::make_unique<ViewLayerWeights>(spec, st.view);
    const RankTokens& in = tokens[r];
    MK_CHECK(in.tokens >= 0, "rank " << r << ": expected tokens >= 0, got " << in.tokens);
    check_finite_input(in.x, in.tokens, H);
    ForwardResult& fr = results[r].forward;
    fr.tokens = in.tokens;
    fr.hidden = H;
    fr.fused = fused;
    const std::vector<float> logits = cpu_reference::router_logits(*st.lw, in.x, in.tokens);
    fr.routing = cpu_reference::route(cfg, logits.data(), in.tokens, st.lw->correction_bias());
    plans.push_back(plan_dispatch(placement, r, fr.routing, cfg.shared_slots));
    check_capacity(plans.back(), xcfg);
  }

  // the count exchange (throughput) or the buffer headers (low latency): receive layouts
  const std::vector<ReceiveLayout> layouts = plan_receives(plans, xcfg);

  // dispatch: every source's rows and pairs into every destination's receive buffers
  for (int d = 0; d < W; ++d) {
    const ReceiveLayout& lay = layouts[d];
    RankState& dst = ranks[d];
    dst.recv_x.assign(static_cast<size_t>(lay.buffer_rows) * H, Bf16{0});
    dst.recv_pairs.assign(lay.buffer_pairs, Pair{-1, -1, -1, 0.0f});
    for (int s = 0; s < W; ++s) {
      const DispatchPlan& plan = plans[s];
      for (int j = 0; j < plan.rows_to(d); ++j) {
        const int t = plan.rows[plan.row_begin[d] + j];
        std::memcpy(dst.recv_x.data() + static_cast<size_t>(lay.row_offset[s] + j) * H,
                    tokens[s].x + static_cast<size_t>(t) * H, sizeof(Bf16) * H);
      }
      if (plan.pairs_to(d) > 0) {  // (an empty block's buffers may be null)
        std::memcpy(dst.recv_pairs.data() + lay.pair_offset[s],
                    plan.pairs.data() + plan.pair_begin[d], sizeof(Pair) * plan.pairs_to(d));
      }
      if (s != d) {
        results[s].remote_bytes_dispatch +=
            static_cast<int64_t>(plan.rows_to(d)) * H * sizeof(Bf16) +
            plan.pairs_to(d) * kPairRecordBytes;
      }
    }
  }

  // local experts on every received pair, weight applied, in the order received
  for (int d = 0; d < W; ++d) {
    const ReceiveLayout& lay = layouts[d];
    RankState& dst = ranks[d];
    const int rows_held = placement.local_experts(d) + (fused ? spec.shared_slots() : 0);
    dst.recv_out.assign(static_cast<size_t>(lay.buffer_pairs) * H, 0.0);
    std::vector<double> out(H);
    for (int s = 0; s < W; ++s) {
      for (int j = 0; j < lay.pairs_from[s]; ++j) {
        const int slot = lay.pair_offset[s] + j;
        const Pair& pr = dst.recv_pairs[slot];
        MK_CHECK(pr.local_expert >= 0 && pr.local_expert < rows_held && pr.row >= 0 &&
                     pr.row < lay.rows_from[s],
                 "rank " << d << " received a pair from rank " << s << " for local expert "
                         << pr.local_expert << " (it holds " << rows_held << ") on row " << pr.row
                         << " (of " << lay.rows_from[s] << ")");
        const ExpertView ex = view_expert(spec, dst.view, pr.local_expert);
        if (spec.has_expert_bias && pr.local_expert < placement.local_experts(d)) {
          MK_CHECK(ex.b13 != nullptr && ex.b2 != nullptr,
                   spec.name << " has expert biases but rank " << d << "'s view holds none");
        }
        const Bf16* x = dst.recv_x.data() + static_cast<size_t>(lay.row_offset[s] + pr.row) * H;
        cpu_reference::expert_forward_f64(spec, ex, x, out.data());
        // the weight multiplies the whole expert output, down bias included (gpt-oss)
        const double weight = pr.weight;
        double* o = dst.recv_out.data() + static_cast<size_t>(slot) * H;
        for (int h = 0; h < H; ++h) o[h] = weight * out[h];
      }
    }
  }

  // combine's exchange: each destination's outputs back to their source, laid out like its plan
  for (int s = 0; s < W; ++s) {
    const DispatchPlan& plan = plans[s];
    RankState& src = ranks[s];
    src.back.assign(plan.pairs.size() * static_cast<size_t>(H), 0.0);
    for (int d = 0; d < W; ++d) {
      if (plan.pairs_to(d) == 0) continue;
      std::memcpy(src.back.data() + static_cast<size_t>(plan.pair_begin[d]) * H,
                  ranks[d].recv_out.data() + static_cast<size_t>(layouts[d].pair_offset[s]) * H,
                  sizeof(double) * H * plan.pairs_to(d));
      if (d != s) {
        results[d].remote_bytes_combine +=
            static_cast<int64_t>(plan.pairs_to(d)) * H * sizeof(Bf16);
      }
    }
  }

  // combine: by slot, the single-rank layer's order, then the unfused shared MLP at home
  for (int s = 0; s < W; ++s) {
    const DispatchPlan& plan = plans[s];
    const RankState& src = ranks[s];
    ForwardResult& fr = results[s].forward;
    fr.y.assign(static_cast<size_t>(plan.tokens) * H, 0.0f);
    std::vector<double> acc(H), out(H);
    for (int t = 0; t < plan.tokens; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int slot = 0; slot < plan.slots; ++slot) {
        const int p = plan.combine_pair[static_cast<size_t>(t) * plan.slots + slot];
        const double* o = src.back.data() + static_cast<size_t>(p) * H;
        for (int h = 0; h < H; ++h) acc[h] += o[h];
      }
      if (add_shared) {
        cpu_reference::shared_forward_f64(*src.lw, tokens[s].x + static_cast<size_t>(t) * H,
                                          out.data());
        const double scale = fr.routing.shared_scale[t];
        for (int h = 0; h < H; ++h) acc[h] += scale * out[h];
      }
      float* y = fr.y.data() + static_cast<size_t>(t) * H;
      for (int h = 0; h < H; ++h) y[h] = static_cast<float>(acc[h]);
    }
    results[s].dispatch = plans[s];
    results[s].receive = layouts[s];
  }
  return results;
}

}  // namespace moekit::ep

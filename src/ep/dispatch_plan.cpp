// The dispatch and receive plans (moekit/ep.h): per source rank, what goes to whom in which
// order; per destination rank, where it lands. Pure bookkeeping on the host: the transports copy
// what these plans say.
//
// Ordering rules, which make every transport deterministic:
//   - a destination's rows are the source's token ids ascending, each token at most once;
//   - a destination's pairs are ordered by (token, slot), and it returns one output per pair in
//     the order received;
//   - the source combines token t's outputs by slot 0 .. slots-1 (combine_pair), the order of the
//     single-rank layer, whichever rank computed them.
#include <algorithm>

#include "moekit/ep.h"
#include "moekit/error.h"

namespace moekit::ep {

int DispatchPlan::destination_of(int p) const {
  MK_CHECK(p >= 0 && p < static_cast<int>(pairs.size()),
           "expected a pair index in [0, " << pairs.size() << "), got " << p);
  // pair_begin is ascending: the destination is the last d with pair_begin[d] <= p
  const auto it = std::upper_bound(pair_begin.begin(), pair_begin.end(), p);
  return static_cast<int>(it - pair_begin.begin()) - 1;
}

int64_t DispatchPlan::remote_rows() const {
  return static_cast<int64_t>(rows.size()) - rows_to(source_rank);
}

int64_t DispatchPlan::remote_pairs() const {
  return static_cast<int64_t>(pairs.size()) - pairs_to(source_rank);
}

DispatchPlan plan_dispatch(const Placement& placement, int source_rank, const Routing& r,
                           int fused_slots) {
  const int W = placement.world_size();
  MK_CHECK(source_rank >= 0 && source_rank < W,
           "expected a source rank in [0, " << W << "), got " << source_rank);
  MK_CHECK(r.tokens >= 0 && r.slots > fused_slots && fused_slots >= 0,
           "expected a routing with more slots than the " << fused_slots << " fused ones, got "
                                                          << r.tokens << " tokens of " << r.slots
                                                          << " slots");
  const size_t n = static_cast<size_t>(r.tokens) * r.slots;
  MK_CHECK(r.ids.size() == n && r.weights.size() == n,
           "expected " << n << " ids and weights (" << r.tokens << " tokens x " << r.slots
                       << " slots), got " << r.ids.size() << " ids, " << r.weights.size()
                       << " weights");

  // Where each pair runs, then counts per destination.
  std::vector<Replica> where(n);
  std::vector<int32_t> pair_count(W, 0), row_count(W, 0);
  std::vector<int32_t> last_token(W, -1);
  for (int t = 0; t < r.tokens; ++t) {
    for (int s = 0; s < r.slots; ++s) {
      const size_t i = static_cast<size_t>(t) * r.slots + s;
      where[i] = placement.place(r.ids[i], source_rank, t, fused_slots);
      const int d = where[i].rank;
      ++pair_count[d];
      if (last_token[d] != t) {
        last_token[d] = t;
        ++row_count[d];
      }
    }
  }

  DispatchPlan plan;
  plan.source_rank = source_rank;
  plan.world_size = W;
  plan.tokens = r.tokens;
  plan.slots = r.slots;
  plan.fused_slots = fused_slots;
  plan.row_begin.assign(W + 1, 0);
  plan.pair_begin.assign(W + 1, 0);
  for (int d = 0; d < W; ++d) {
    plan.row_begin[d + 1] = plan.row_begin[d] + row_count[d];
    plan.pair_begin[d + 1] = plan.pair_begin[d] + pair_count[d];
  }
  plan.rows.resize(plan.row_begin[W]);
  plan.pairs.resize(plan.pair_begin[W]);
  plan.combine_pair.resize(n);

  // Fill in (token, slot) order: each destination's rows and pairs come out in that order.
  std::vector<int32_t> next_row(plan.row_begin.begin(), plan.row_begin.end() - 1);
  std::vector<int32_t> next_pair(plan.pair_begin.begin(), plan.pair_begin.end() - 1);
  last_token.assign(W, -1);
  for (int t = 0; t < r.tokens; ++t) {
    for (int s = 0; s < r.slots; ++s) {
      const size_t i = static_cast<size_t>(t) * r.slots + s;
      const int d = where[i].rank;
      if (last_token[d] != t) {
        last_token[d] = t;
        plan.rows[next_row[d]++] = t;
      }
      const int p = next_pair[d]++;
      plan.pairs[p] = {next_row[d] - 1 - plan.row_begin[d], s, where[i].local, r.weights[i]};
      plan.combine_pair[i] = p;
    }
  }
  return plan;
}

Capacity low_latency_capacity(const ExchangeConfig& cfg) {
  MK_CHECK(cfg.max_tokens_per_rank > 0,
           "low-latency mode needs max_tokens_per_rank > 0 (it sizes the fixed buffers), got "
               << cfg.max_tokens_per_rank);
  MK_CHECK(cfg.slots > 0, "expected slots per token > 0, got " << cfg.slots);
  return {cfg.max_tokens_per_rank, cfg.max_tokens_per_rank * cfg.slots};
}

void check_capacity(const DispatchPlan& plan, const ExchangeConfig& cfg) {
  if (cfg.mode != Mode::LowLatency) return;
  const Capacity cap = low_latency_capacity(cfg);
  MK_CHECK(plan.tokens <= cfg.max_tokens_per_rank,
           "low-latency dispatch: rank " << plan.source_rank << " routes " << plan.tokens
                                         << " tokens, more than max_tokens_per_rank "
                                         << cfg.max_tokens_per_rank
                                         << " that sizes the fixed buffers (use the throughput "
                                            "mode or a larger max_tokens_per_rank)");
  for (int d = 0; d < plan.world_size; ++d) {
    MK_CHECK(plan.rows_to(d) <= cap.rows && plan.pairs_to(d) <= cap.pairs,
             "low-latency dispatch: rank " << plan.source_rank << " sends " << plan.rows_to(d)
                                           << " token rows and " << plan.pairs_to(d)
                                           << " pairs to rank " << d << ", capacity " << cap.rows
                                           << " rows and " << cap.pairs << " pairs per source");
  }
}

int ReceiveLayout::total_rows() const {
  int n = 0;
  for (int c : rows_from) n += c;
  return n;
}

int ReceiveLayout::total_pairs() const {
  int n = 0;
  for (int c : pairs_from) n += c;
  return n;
}

ReceiveLayout plan_receive(int rank, const std::vector<int32_t>& rows_from,
                           const std::vector<int32_t>& pairs_from, const ExchangeConfig& cfg) {
  const int W = static_cast<int>(rows_from.size());
  MK_CHECK(W > 0 && pairs_from.size() == rows_from.size(),
           "expected row and pair counts from every source, got " << rows_from.size() << " and "
                                                                  << pairs_from.size());
  MK_CHECK(rank >= 0 && rank < W, "expected a rank in [0, " << W << "), got " << rank);
  ReceiveLayout lay;
  lay.rank = rank;
  lay.mode = cfg.mode;
  lay.rows_from = rows_from;
  lay.pairs_from = pairs_from;
  lay.row_offset.resize(W);
  lay.pair_offset.resize(W);
  for (int s = 0; s < W; ++s) {
    MK_CHECK(rows_from[s] >= 0 && pairs_from[s] >= rows_from[s],
             "rank " << rank << " receives " << rows_from[s] << " rows and " << pairs_from[s]
                     << " pairs from rank " << s << " (expected at least one pair per row)");
  }
  if (cfg.mode == Mode::Throughput) {
    for (int s = 0; s < W; ++s) {
      lay.row_offset[s] = lay.buffer_rows;
      lay.pair_offset[s] = lay.buffer_pairs;
      lay.buffer_rows += rows_from[s];
      lay.buffer_pairs += pairs_from[s];
    }
    return lay;
  }
  const Capacity cap = low_latency_capacity(cfg);
  for (int s = 0; s < W; ++s) {
    MK_CHECK(rows_from[s] <= cap.rows && pairs_from[s] <= cap.pairs,
             "low-latency receive: rank " << rank << " gets " << rows_from[s] << " rows and "
                                          << pairs_from[s] << " pairs from rank " << s
                                          << ", capacity " << cap.rows << " rows and " << cap.pairs
                                          << " pairs per source");
    lay.row_offset[s] = s * cap.rows;
    lay.pair_offset[s] = s * cap.pairs;
  }
  lay.buffer_rows = W * cap.rows;
  lay.buffer_pairs = W * cap.pairs;
  return lay;
}

std::vector<ReceiveLayout> plan_receives(const std::vector<DispatchPlan>& plans,
                                         const ExchangeConfig& cfg) {
  const int W = static_cast<int>(plans.size());
  std::vector<ReceiveLayout> out;
  out.reserve(W);
  for (int d = 0; d < W; ++d) {
    std::vector<int32_t> rows(W), pairs(W);
    for (int s = 0; s < W; ++s) {
      MK_CHECK(plans[s].world_size == W && plans[s].source_rank == s,
               "expected plan " << s << " to be rank " << s << "'s of world size " << W
                                << ", got rank " << plans[s].source_rank << " of "
                                << plans[s].world_size);
      rows[s] = plans[s].rows_to(d);
      pairs[s] = plans[s].pairs_to(d);
    }
    out.push_back(plan_receive(d, rows, pairs, cfg));
  }
  return out;
}

}  // namespace moekit::ep

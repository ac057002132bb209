// Expert parallelism: one MoE layer's routed experts spread over world_size ranks (GPUs), the
// token rows sent to the ranks that hold their experts and the expert outputs sent back
// (docs/decisions/expert_parallel.md). This header is the host-side planning layer, which builds
// without CUDA or NCCL: the CPU simulation (ep_cpu.h) executes its plans, and the GPU path
// (ep_layer.h) computes the same placement and token order on the device:
//
//   Placement       which rank holds which experts: contiguous ranges by default, or any
//                   logical -> physical map with replicas; the shared expert on every rank, its
//                   fused slots always run on the token's own rank (they never cross a link)
//   plan_dispatch   one source rank's routing -> per destination rank the token rows to send
//                   (each row once per destination) and their (slot, local expert, weight) pairs,
//                   plus where each (token, slot) output comes back, for the combine
//   plan_receive    the counts a destination receives from each source -> where they land in its
//                   receive buffers: exact (Throughput) or fixed capacity per source (LowLatency)
//
// Combine order: the source sums a token's outputs by slot, 0 .. slots-1, whichever rank computed
// them and whenever they arrived; that is the single-rank layer's order, so the result does not
// depend on the world size (the CPU simulation equals the CPU reference layer bitwise).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/routing.h"

namespace moekit::ep {

// Throughput (prefill): the counts are exchanged first, then exactly the needed bytes.
// LowLatency (decode): fixed-capacity receive buffers sized by max_tokens_per_rank, one exchange
// without a count round trip (the counts travel with the data), so a forward is graph-capturable.
enum class Mode { Throughput, LowLatency };
const char* mode_name(Mode m);          // "throughput" | "low-latency"
Mode parse_mode(const std::string& s);  // throws naming s and the choices

// One physical copy of a logical routed expert: the rank and the row of its expert stacks.
struct Replica {
  int rank = 0;
  int local = 0;
  bool operator==(const Replica&) const = default;
};

class Placement {
 public:
  // Rank r holds the contiguous range [first(r), first(r) + count(r)): E / W experts each, the
  // first E % W ranks one more (world_size > E leaves the last ranks without routed experts).
  static Placement contiguous(int num_experts, int world_size);
  // Rank r holds rank_experts[r] (logical ids, in the order of its stacks' rows). Every expert
  // must be held by at least one rank and by no rank twice; a rank may hold none. Throws naming
  // the expert or rank that breaks this.
  static Placement from_map(int num_experts, std::vector<std::vector<int>> rank_experts);

  int world_size() const { return static_cast<int>(rank_experts_.size()); }
  int num_experts() const { return num_experts_; }
  // Routed experts rank r holds; its stacks hold them in rows [0, n), the fused shared slots
  // (when fused) in rows [n, n + S).
  int local_experts(int rank) const;
  const std::vector<int>& experts_of(int rank) const;
  // Every copy of logical expert e, by ascending rank.
  const std::vector<Replica>& replicas(int expert) const;
  // When rank r's experts are one contiguous range: its first expert, else -1 (count is
  // local_experts(r); an empty rank answers 0).
  int contiguous_first(int rank) const;

  // Where the pair (token `token` of `source_rank`, expert id `id`) runs. A fused shared slot
  // (id = E + j) runs on the source rank at row local_experts(source_rank) + j. A routed expert
  // runs on the source rank when it holds a copy (no traffic), else on replicas(id)[token % n]:
  // deterministic, and spread across the copies. Throws on an id outside [0, E + fused_slots).
  Replica place(int id, int source_rank, int token, int fused_slots) const;

  std::string describe() const;  // one line: "E=32 W=3 ranks [0,11) [11,22) [22,32)" or a map

 private:
  int num_experts_ = 0;
  std::vector<std::vector<int>> rank_experts_;
  std::vector<std::vector<Replica>> replicas_;
};

// One (token, slot) pair sent to a destination rank.
struct Pair {
  int32_t row = 0;           // the token's row among those this source sends to this destination
  int32_t slot = 0;          // the slot in the token's routing (the combine's order)
  int32_t local_expert = 0;  // the row of the destination's expert stacks
  float weight = 0.0f;       // the routing weight (routed scaling folded in; 1 or the gate for
                             // a fused shared slot)
  bool operator==(const Pair&) const = default;
};

// What one source rank sends, derived from its routing alone.
struct DispatchPlan {
  int source_rank = 0;
  int world_size = 0;
  int tokens = 0;
  int slots = 0;        // per token: k routed + the fused shared slots
  int fused_slots = 0;  // S when the routing holds the fused shared slots, else 0
  // Destination d receives token rows rows[row_begin[d] .. row_begin[d+1]) (source-local token
  // ids, ascending: a token routed to several experts of d is sent once) and the pairs
  // pairs[pair_begin[d] .. pair_begin[d+1]), ordered by (token, slot); Pair::row indexes the
  // rows sent to d (0 = rows[row_begin[d]]).
  std::vector<int32_t> row_begin;  // [world_size + 1]
  std::vector<int32_t> rows;
  std::vector<int32_t> pair_begin;  // [world_size + 1]
  std::vector<Pair> pairs;
  // The destination returns one output row per pair, in the order it received them; they land
  // in a buffer laid out like `pairs`. Output (token t, slot s) is row combine_pair[t*slots + s]
  // of it.
  std::vector<int32_t> combine_pair;  // [tokens * slots]

  int rows_to(int d) const { return row_begin[d + 1] - row_begin[d]; }
  int pairs_to(int d) const { return pair_begin[d + 1] - pair_begin[d]; }
  // The destination of pair p (an index into `pairs`).
  int destination_of(int p) const;
  // Token rows and pairs that cross a link (destination != source).
  int64_t remote_rows() const;
  int64_t remote_pairs() const;
};

// Plans one source rank's dispatch from its routing (r.slots = k + fused_slots per token; ids
// global, the fused slots E..E+S-1 last). Throws naming a token whose id is out of range.
DispatchPlan plan_dispatch(const Placement& placement, int source_rank, const Routing& r,
                           int fused_slots);

struct ExchangeConfig {
  Mode mode = Mode::Throughput;
  // LowLatency: the most tokens any rank routes in one forward (sizes the fixed buffers).
  int max_tokens_per_rank = 0;
  int slots = 0;  // per token, k + fused slots (LowLatency's pair capacity)
};

// The fixed per-source capacity of LowLatency's buffers: max_tokens_per_rank token rows (a token
// is sent to a rank at most once) and max_tokens_per_rank * slots pairs and returned rows.
struct Capacity {
  int rows = 0;
  int pairs = 0;
};
Capacity low_latency_capacity(const ExchangeConfig& cfg);

// LowLatency: throws when the plan does not fit the fixed buffers, naming the source rank, the
// destination, the count and the capacity (and max_tokens_per_rank). Throughput: no-op.
void check_capacity(const DispatchPlan& plan, const ExchangeConfig& cfg);

// Where one destination rank's receive buffers hold what each source sent.
struct ReceiveLayout {
  int rank = 0;
  Mode mode = Mode::Throughput;
  std::vector<int32_t> rows_from, pairs_from;  // [world_size]: counts from each source
  std::vector<int32_t> row_offset,
      pair_offset;       // [world_size]: where source s's rows / pairs start
  int buffer_rows = 0;   // rows of the receive buffer (Throughput: the sum; LowLatency: W * cap)
  int buffer_pairs = 0;  // pairs (and returned rows) likewise
  int total_rows() const;
  int total_pairs() const;
};

// Throughput: the sources' blocks packed in rank order, buffers exactly their sum. LowLatency:
// source s's block at s * capacity, buffers W * capacity; a count over capacity throws.
ReceiveLayout plan_receive(int rank, const std::vector<int32_t>& rows_from,
                           const std::vector<int32_t>& pairs_from, const ExchangeConfig& cfg);

// The receive layout of every rank from every source's plan (the count exchange of Throughput,
// or what LowLatency's buffer headers carry), in rank order.
std::vector<ReceiveLayout> plan_receives(const std::vector<DispatchPlan>& plans,
                                         const ExchangeConfig& cfg);

}  // namespace moekit::ep

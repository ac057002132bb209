// Placement (moekit/ep.h): which rank holds which routed experts, and where one (token, expert)
// pair runs. The shared expert is not placed: every rank holds it, and its fused slots run on
// the token's own rank.
#include <algorithm>
#include <sstream>

#include "moekit/ep.h"
#include "moekit/error.h"

namespace moekit::ep {

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Throughput:
      return "throughput";
    case Mode::LowLatency:
      return "low-latency";
  }
  return "?";
}

Mode parse_mode(const std::string& s) {
  if (s == "throughput") return Mode::Throughput;
  if (s == "low-latency") return Mode::LowLatency;
  MK_FAIL("unknown expert-parallel mode '" << s << "' (expected throughput or low-latency)");
}

Placement Placement::contiguous(int num_experts, int world_size) {
  MK_CHECK(num_experts > 0, "expected num_experts > 0, got " << num_experts);
  MK_CHECK(world_size > 0, "expected world_size > 0, got " << world_size);
  std::vector<std::vector<int>> map(world_size);
  const int base = num_experts / world_size, extra = num_experts % world_size;
  int first = 0;
  for (int r = 0; r < world_size; ++r) {
    const int count = base + (r < extra ? 1 : 0);
    for (int e = first; e < first + count; ++e) map[r].push_back(e);
    first += count;
  }
  return from_map(num_experts, std::move(map));
}

Placement Placement::from_map(int num_experts, std::vector<std::vector<int>> rank_experts) {
  MK_CHECK(num_experts > 0, "expected num_experts > 0, got " << num_experts);
  MK_CHECK(!rank_experts.empty(), "expected at least one rank in the expert map, got none");
  Placement p;
  p.num_experts_ = num_experts;
  p.replicas_.assign(num_experts, {});
  for (int r = 0; r < static_cast<int>(rank_experts.size()); ++r) {
    const std::vector<int>& held = rank_experts[r];
    for (int local = 0; local < static_cast<int>(held.size()); ++local) {
      const int e = held[local];
      MK_CHECK(e >= 0 && e < num_experts, "rank " << r << " row " << local << " holds expert " << e
                                                  << ", expected [0, " << num_experts << ")");
      MK_CHECK(p.replicas_[e].empty() || p.replicas_[e].back().rank != r,
               "rank " << r << " holds expert " << e << " twice (rows "
                       << p.replicas_[e].back().local << " and " << local << ")");
      p.replicas_[e].push_back({r, local});
    }
  }
  for (int e = 0; e < num_experts; ++e) {
    MK_CHECK(!p.replicas_[e].empty(),
             "expert " << e << " is held by none of the " << rank_experts.size() << " ranks");
  }
  p.rank_experts_ = std::move(rank_experts);
  return p;
}

int Placement::local_experts(int rank) const { return static_cast<int>(experts_of(rank).size()); }

const std::vector<int>& Placement::experts_of(int rank) const {
  MK_CHECK(rank >= 0 && rank < world_size(),
           "expected a rank in [0, " << world_size() << "), got " << rank);
  return rank_experts_[rank];
}

const std::vector<Replica>& Placement::replicas(int expert) const {
  MK_CHECK(expert >= 0 && expert < num_experts_,
           "expected an expert in [0, " << num_experts_ << "), got " << expert);
  return replicas_[expert];
}

int Placement::contiguous_first(int rank) const {
  const std::vector<int>& held = experts_of(rank);
  if (held.empty()) return 0;
  for (size_t i = 1; i < held.size(); ++i) {
    if (held[i] != held[0] + static_cast<int>(i)) return -1;
  }
  return held[0];
}

Replica Placement::place(int id, int source_rank, int token, int fused_slots) const {
  MK_CHECK(id >= 0 && id < num_experts_ + fused_slots,
           "token " << token << " of rank " << source_rank << " is routed to expert " << id
                    << ", expected [0, " << num_experts_ + fused_slots << ")");
  if (id >= num_experts_) return {source_rank, local_experts(source_rank) + (id - num_experts_)};
  const std::vector<Replica>& reps = replicas_[id];
  for (const Replica& rep : reps) {
    if (rep.rank == source_rank) return rep;
  }
  return reps[static_cast<size_t>(token) % reps.size()];
}

std::string Placement::describe() const {
  std::ostringstream os;
  os << "E=" << num_experts_ << " W=" << world_size() << " ranks";
  for (int r = 0; r < world_size(); ++r) {
    const int first = contiguous_first(r);
    if (first >= 0) {
      os << " [" << first << "," << first + local_experts(r) << ")";
    } else {
      os << " {";
      for (size_t i = 0; i < rank_experts_[r].size(); ++i)
        os << (i ? "," : "") << rank_experts_[r][i];
      os << "}";
    }
  }
  return os.str();
}

}  // namespace moekit::ep

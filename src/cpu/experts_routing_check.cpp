// check_experts_routing (experts_routing_check.h).
#include "cpu/experts_routing_check.h"

#include <cstddef>

#include "moekit/error.h"

namespace moekit::cpu_detail {

int check_experts_routing(const MoeSpec& spec, int tokens, const Routing& r, bool add_shared,
                          int held_begin, int& held_end) {
  const int E = spec.num_experts;
  if (held_end < 0) held_end = E;
  MK_CHECK(0 <= held_begin && held_begin <= held_end && held_end <= E,
           "expected a held expert range inside [0, " << E << "], got [" << held_begin << ", "
                                                       << held_end << ")");
  MK_CHECK(r.tokens == tokens && r.ids.size() == static_cast<size_t>(tokens) * r.slots &&
               r.weights.size() == r.ids.size(),
           "expected a routing of " << tokens << " tokens, got " << r.tokens << " tokens, "
                                    << r.ids.size() << " ids, " << r.weights.size()
                                    << " weights of " << r.slots << " slots");
  const int fused_slots = r.slots - spec.top_k;
  MK_CHECK(fused_slots == 0 || fused_slots == spec.shared_slots(),
           "expected " << spec.top_k << " or " << spec.top_k + spec.shared_slots()
                       << " slots per token, got " << r.slots);
  MK_CHECK(!add_shared || fused_slots == 0,
           "the shared expert runs fused (the routing holds its slots) or unfused, not both");
  return fused_slots;
}

}  // namespace moekit::cpu_detail

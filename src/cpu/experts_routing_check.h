// The argument checks both CPU backends' experts() run on the routing they are given.
#pragma once

#include "moekit/routing.h"
#include "moekit/spec.h"

namespace moekit::cpu_detail {

// Throws naming what is off: the held expert range [held_begin, held_end) outside [0, E]
// (held_end -1 means E and is resolved in place), a routing of other than `tokens` tokens or ids
// and weights of different counts, slots per token other than top_k or top_k + the shared
// slots, or the shared expert both fused (slots in the routing) and unfused (add_shared).
// Returns the fused shared slots per token (0 or spec.shared_slots()).
int check_experts_routing(const MoeSpec& spec, int tokens, const Routing& r, bool add_shared,
                          int held_begin, int& held_end);

}  // namespace moekit::cpu_detail

// libFuzzer target: config.json text -> parse_spec_json -> routing on the parsed spec.
//
// Contract checked: any input either parses to a spec that validate_spec accepts, or throws
// moekit::Error. Anything else (another exception type, a crash, ASan/UBSan report, a hang, an
// allocation beyond -rss_limit_mb) is a finding. For a spec that parses, the routing of two tokens
// with logits and correction biases drawn from the input must keep the invariants every backend
// relies on (DESIGN.md §1-2): per token k distinct routed ids in [0, E), then the S fused shared
// ids E..E+S-1 (never beyond the weight rows E+S), finite non-negative weights.
// Seeds: configs/*.json and fuzz/corpus/spec/.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/routing.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace {

// Routing is run only for specs whose rows stay cheap; bigger ones are still parsed and validated.
constexpr int kMaxRoutedExperts = 4096;

[[noreturn]] void fail(const char* what, int token, int slot, long long value) {
  std::fprintf(stderr, "fuzz_spec: invariant broken: %s (token %d, slot %d, value %lld)\n", what,
               token, slot, value);
  __builtin_trap();
}

// Deterministic floats in [-span, span] from the input bytes (splitmix64 of position and byte).
float draw(const uint8_t* data, size_t size, size_t i, float span) {
  uint64_t z = i * 0x9e3779b97f4a7c15ull + (size ? data[i % size] : 0);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return span * (static_cast<float>(z >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f);
}

void check_routing(const moekit::MoeSpec& spec, bool fused, const uint8_t* data, size_t size) {
  const moekit::RoutingConfig cfg = moekit::RoutingConfig::from_spec(spec, fused);
  const int tokens = 2;
  std::vector<float> logits(static_cast<size_t>(tokens) * cfg.logits_columns);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = draw(data, size, i, 8.0f);
  std::vector<float> bias(spec.num_experts);
  // Biases up to +-12 with tiny scores: the case where key - bias loses every digit.
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = draw(data, size, i + 7919, 12.0f);
  const moekit::Routing r = moekit::cpu_reference::route(
      cfg, logits.data(), tokens, spec.has_correction_bias ? bias.data() : nullptr);
  const int E = spec.num_experts, S = cfg.shared_slots, rows = spec.weight_rows(fused);
  if (r.slots != spec.top_k + S) fail("slots per token != top_k + shared slots", 0, 0, r.slots);
  if (r.ids.size() != static_cast<size_t>(tokens) * r.slots) fail("ids size", 0, 0, r.ids.size());
  for (int t = 0; t < tokens; ++t) {
    std::set<int> seen;
    for (int s = 0; s < r.slots; ++s) {
      const int id = r.ids[static_cast<size_t>(t) * r.slots + s];
      const float w = r.weights[static_cast<size_t>(t) * r.slots + s];
      if (id < 0 || id >= rows) fail("expert id outside the weight rows", t, s, id);
      if (s < spec.top_k && id >= E) fail("routed slot holds a shared id", t, s, id);
      if (s >= spec.top_k && id != E + (s - spec.top_k)) fail("shared slot id", t, s, id);
      if (!seen.insert(id).second) fail("duplicate expert id in one token", t, s, id);
      if (!std::isfinite(w) || w < 0.0f) fail("weight not finite and >= 0", t, s, id);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  moekit::MoeSpec spec;
  try {
    spec = moekit::parse_spec_json(text, "fuzz");
  } catch (const moekit::Error&) {
    return 0;  // refused with moekit's error: the expected outcome for most inputs
  }
  // A parsed spec is a validated one.
  moekit::validate_spec(spec);
  (void)spec.expert_bytes();
  (void)spec.shared_bytes();
  (void)spec.router_bytes();
  for (bool fused : {false, true}) {
    if (fused && !spec.can_fuse_shared()) {
      try {
        moekit::RoutingConfig::from_spec(spec, true);
        fail("from_spec fused on a spec that cannot fuse", 0, 0, spec.shared_intermediate);
      } catch (const moekit::Error&) {
      }
      continue;
    }
    (void)moekit::host_bytes_needed(spec, 1, fused);
    if (spec.num_experts <= kMaxRoutedExperts) check_routing(spec, fused, data, size);
  }
  return 0;
}

// LazyExperts: the per-expert storage behind LayerWeights::expert(e) for every weight source.
//
// Each slot (routed expert or fused shared slot) is materialised exactly once, on first use, by a
// source-specific callback, under its own std::once_flag: two threads asking for different experts
// build them in parallel, two asking for the same one build it once. Slots are heap objects that
// never move, so the pointers handed out stay valid for the owner's life.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "moekit/dtype.h"
#include "moekit/error.h"
#include "moekit/weights.h"

namespace moekit::io {

struct ExpertStorage {
  // Owned buffers; a source may instead point the view straight at mapped file pages.
  std::vector<Bf16> w13, w2;
  std::vector<float> b13, b2;
  std::vector<uint8_t> w13_fp8, w2_fp8;  // the fp8 form (LoadOptions::expert_format Fp8Block)
  std::vector<float> w13_scale, w2_scale;
  // the MX form (LoadOptions::expert_format Mxfp4 / Mxfp8): packed bytes and e8m0 scale bytes
  std::vector<uint8_t> w13_mx, w2_mx, w13_mx_scale, w2_mx_scale;
  ExpertView view;
  // Point the view at the owned buffers that are non-empty (call after filling them).
  void view_owned() {
    if (!w13.empty()) view.w13 = w13.data();
    if (!w2.empty()) view.w2 = w2.data();
    if (!b13.empty()) view.b13 = b13.data();
    if (!b2.empty()) view.b2 = b2.data();
    if (!w13_fp8.empty()) view.w13_fp8 = w13_fp8.data();
    if (!w2_fp8.empty()) view.w2_fp8 = w2_fp8.data();
    if (!w13_scale.empty()) view.w13_scale = w13_scale.data();
    if (!w2_scale.empty()) view.w2_scale = w2_scale.data();
    if (!w13_mx.empty()) view.w13_mx = w13_mx.data();
    if (!w2_mx.empty()) view.w2_mx = w2_mx.data();
    if (!w13_mx_scale.empty()) view.w13_mx_scale = w13_mx_scale.data();
    if (!w2_mx_scale.empty()) view.w2_mx_scale = w2_mx_scale.data();
  }
};

class LazyExperts {
 public:
  using Builder = std::function<void(int expert, ExpertStorage& out)>;

  LazyExperts(int slots, Builder builder) : builder_(std::move(builder)) {
    slots_.reserve(slots);
    for (int i = 0; i < slots; ++i) slots_.push_back(std::make_unique<Slot>());
  }

  int size() const { return static_cast<int>(slots_.size()); }

  ExpertView get(int e) const {
    MK_CHECK(e >= 0 && e < size(),
             "expert index out of range: expected 0 <= e < " << size() << ", got " << e);
    Slot& s = *slots_[e];
    // An exception inside call_once leaves the flag unset, so a failed load is retried (and
    // fails again with the same message) rather than handing out a half-built expert.
    std::call_once(s.once, [&] {
      builder_(e, s.storage);
      materialised_.fetch_add(1, std::memory_order_relaxed);
    });
    return s.storage.view;
  }

  int materialised() const { return materialised_.load(std::memory_order_relaxed); }

 private:
  struct Slot {
    std::once_flag once;
    ExpertStorage storage;
  };
  Builder builder_;
  std::vector<std::unique_ptr<Slot>> slots_;
  mutable std::atomic<int> materialised_{0};
};

// Fused shared slot j (DESIGN.md §2): gate rows [jI,(j+1)I) and up rows Is+[jI,(j+1)I) of the
// shared w13 [2*Is, H], down columns [jI,(j+1)I) of the shared w2 [H, Is], repacked into the
// expert layout w13 [2I, H], w2 [H, I]. Biases (only if the spec has expert biases) are zero:
// the shared MLP has none, and zero b2 in each slot keeps the slot sum exact.
void repack_shared_slot(const MoeSpec& spec, const Bf16* shared_w13, const Bf16* shared_w2,
                        int slot, ExpertStorage& out);

}  // namespace moekit::io

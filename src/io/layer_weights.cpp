// What every LayerWeights source shares: prefetching experts in parallel and repacking the shared
// MLP into fused slots (the memory estimates are in memory_estimate.cpp).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "io/lazy_experts.h"
#include "moekit/error.h"
#include "moekit/weights.h"

namespace moekit {

const char* expert_format_name(ExpertFormat f) {
  switch (f) {
    case ExpertFormat::Bf16:
      return "bf16";
    case ExpertFormat::Fp8Block:
      return "fp8";
    case ExpertFormat::Mxfp4:
      return "mxfp4";
    case ExpertFormat::Mxfp8:
      return "mxfp8";
  }
  return "?";
}

ExpertFormat parse_expert_format(const std::string& s) {
  for (ExpertFormat f :
       {ExpertFormat::Bf16, ExpertFormat::Fp8Block, ExpertFormat::Mxfp4, ExpertFormat::Mxfp8}) {
    if (s == expert_format_name(f)) return f;
  }
  MK_FAIL("unknown expert format '" << s << "' (expected bf16, fp8, mxfp4 or mxfp8)");
}

void LayerWeights::prefetch(const std::vector<int>& experts) const {
  if (experts.empty()) return;
  // Materialising an expert is a fill or a page-in plus conversion of ~10-90 MB: spread the
  // experts over the cores. Each expert is still built once (LazyExperts' once_flag).
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t workers = std::min<size_t>(experts.size(), hw);
  if (workers == 1) {
    for (int e : experts) expert(e);
    return;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < experts.size();) {
      try {
        expert(experts[i]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 0; t + 1 < workers; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

namespace io {

void repack_shared_slot(const MoeSpec& spec, const Bf16* shared_w13, const Bf16* shared_w2,
                        int slot, ExpertStorage& out) {
  const size_t H = spec.hidden, I = spec.expert_intermediate, Is = spec.shared_intermediate;
  const int S = spec.shared_slots();
  MK_CHECK(S > 0, "spec " << spec.name << " cannot fuse its shared expert: shared width " << Is
                          << " is not a positive multiple of I = " << I);
  MK_CHECK(slot >= 0 && slot < S,
           "shared slot out of range: expected 0 <= slot < " << S << ", got " << slot);
  MK_CHECK(shared_w13 && shared_w2, "spec " << spec.name << " has no shared MLP weights to fuse");
  const size_t j0 = static_cast<size_t>(slot) * I;
  out.w13.resize(2 * I * H);
  // gate rows [j0, j0+I) then up rows Is + [j0, j0+I): each block is contiguous in the source.
  std::memcpy(out.w13.data(), shared_w13 + j0 * H, I * H * sizeof(Bf16));
  std::memcpy(out.w13.data() + I * H, shared_w13 + (Is + j0) * H, I * H * sizeof(Bf16));
  out.w2.resize(H * I);
  for (size_t h = 0; h < H; ++h) {
    std::memcpy(out.w2.data() + h * I, shared_w2 + h * Is + j0, I * sizeof(Bf16));
  }
  if (spec.has_expert_bias) {
    out.b13.assign(2 * I, 0.0f);
    out.b2.assign(H, 0.0f);
  }
  out.view_owned();
}

}  // namespace io
}  // namespace moekit

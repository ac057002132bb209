// The plan's rules (expert_rules.h). Thresholds and their reasons: docs/decisions/<rule>.md.
#include "plan/expert_rules.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "moekit/error.h"
#include "plan/expert_kernels.h"
#include "plan/grouped_gemm_kernels.h"

namespace moekit::plan {

int experts_chunk(int tokens) { return tokens <= 256 ? 8 : 16; }

Stream experts_stream_default(int hidden, int tokens, bool tasks_of_16) {
  if (tokens <= 256) return Stream::Bulk;
  // why hidden: regs-early beats tasks of 16 on wide experts, tasks of 16 beat regs below
  if (hidden >= 4096) return Stream::RegistersEarlyActs;
  return tasks_of_16 ? Stream::Bulk : Stream::Registers;
}

bool experts_grouped_path(int tokens, int top_k, int experts, bool fp8, int setting) {
  if (setting >= 0) return setting > 0 && tokens >= setting;
  // why 4 per expert (bf16): below it an expert's rows fill a fraction of the 64-row tile and the
  // decode kernels, streaming each expert once, win; fp8 from 2: there its 64 x 128 instance
  // ties the fp8 decode kernels at 1 routed token per expert and leads from 2; from 64 tokens:
  // none measured below
  const int from_per_expert = fp8 ? 2 : 4;
  constexpr int kFromTokens = 64;
  return tokens >= kFromTokens && static_cast<long long>(tokens) * top_k >=
                                      static_cast<long long>(from_per_expert) * experts;
}

double experts_grouped_padded_rows(int tokens, int top_k, int experts, int shared_slots,
                                   int tile_m) {
  const double lambda = static_cast<double>(tokens) * top_k / experts;
  // E[ceil(n / tile_m)] for n ~ Poisson(lambda), summed over n up to where the tail is < 1e-12
  const int n_max = static_cast<int>(lambda + 12.0 * std::sqrt(lambda) + 4.0 * tile_m + 16.0);
  double tiles = 0.0;
  for (int n = 1; n <= n_max; ++n) {
    const double log_pmf = n * std::log(lambda) - lambda - std::lgamma(n + 1.0);
    tiles += std::exp(log_pmf) * ((n + tile_m - 1) / tile_m);
  }
  const double shared_tiles = static_cast<double>(shared_slots) * ((tokens + tile_m - 1) / tile_m);
  return (experts * tiles + shared_tiles) * tile_m;
}

int experts_grouped_tile_m(int tokens, int top_k, int experts, int shared_slots, bool fp8,
                           int tile128_from_rows) {
  if (!fp8 && tile128_from_rows > 0 &&
      static_cast<long long>(tokens) * top_k >=
          static_cast<long long>(tile128_from_rows) * experts) {
    return 128;
  }
  if (!fp8 && tokens <= kGroupedTile64UpToTokens) return 64;
  const double rows128 = experts_grouped_padded_rows(tokens, top_k, experts, shared_slots, 128);
  const double rows64 = experts_grouped_padded_rows(tokens, top_k, experts, shared_slots, 64);
  return rows64 * (fp8 ? kGroupedFp8Tile64RowCost : kGroupedTile64RowCost) < rows128 ? 64 : 128;
}

GroupedGemms experts_grouped_gemms(int tokens, int top_k, int experts, int shared_slots, bool fp8,
                                   int tile128_from_rows, int gate_up_setting, int down_setting) {
  // the instances the rule picks, by dtype and tile rows (the table must hold them)
  constexpr int kBf16Rows128 = grouped_gemm_row("grouped_bf16_128x256_coop");
  constexpr int kBf16Rows64 = grouped_gemm_row("grouped_bf16_64x256_pingpong");
  constexpr int kFp8Rows128 = grouped_gemm_row("grouped_fp8_128x128_coop");
  constexpr int kFp8Rows64 = grouped_gemm_row("grouped_fp8_64x128_pingpong");
  static_assert(kBf16Rows128 >= 0 && kBf16Rows64 >= 0 && kFp8Rows128 >= 0 && kFp8Rows64 >= 0,
                "a grouped GEMM instance of the rule is missing from the table");
  const bool rows64 =
      experts_grouped_tile_m(tokens, top_k, experts, shared_slots, fp8, tile128_from_rows) == 64;
  const int pick = fp8 ? (rows64 ? kFp8Rows64 : kFp8Rows128) : (rows64 ? kBf16Rows64 : kBf16Rows128);
  GroupedGemms g{pick, pick};
  for (const auto& [setting, out, what] :
       {std::tuple{gate_up_setting, &g.gate_up, "gate/up"}, {down_setting, &g.down, "down"}}) {
    if (setting < 0) continue;
    MK_CHECK(setting < kNumGroupedGemmKernels,
             "experts_grouped_gemms: " << what << " instance " << setting << " is not a row of "
                                       << kNumGroupedGemmKernels);
    MK_CHECK(kGroupedGemmKernels[setting].fp8 == fp8,
             "the " << what << " grouped GEMM " << kGroupedGemmKernels[setting].name << " takes "
                    << (fp8 ? "bf16" : "fp8") << " operands; the layer holds "
                    << (fp8 ? "fp8" : "bf16") << " experts");
    *out = setting;
  }
  return g;
}

bool experts_grouped_path_mx(int tokens, int top_k, int experts, int setting) {
  if (setting >= 0) return setting > 0 && tokens >= setting;
  // why 24 per expert: the MX instances' time grows with the tokens, the widening's does not;
  // measured, they cross between 16 and 32 routed tokens per expert for both formats
  constexpr int kFromTokensPerExpert = 24;
  return static_cast<long long>(tokens) * top_k >=
         static_cast<long long>(kFromTokensPerExpert) * experts;
}

int experts_grouped_mx_chunk(int rows, int hidden, int inter, int setting) {
  MK_CHECK(rows >= 1, "experts_grouped_mx_chunk: expected rows >= 1, got " << rows);
  if (setting >= 1) return std::min(setting, rows);
  const long long matrix = 2LL * inter * hidden * 2;  // bf16 [2I, H]
  return static_cast<int>(std::clamp<long long>(kMxWidenBytes / matrix, 1, rows));
}

int experts_grouped_mx_tile(int tokens, int top_k, int experts, int setting) {
  MK_CHECK(setting <= 0 || setting == 64 || setting == 128,
           "experts_grouped_mx_tile: expected 0, 64 or 128, got " << setting);
  if (setting >= 0) return setting;
  // why: the packed GEMM reads each packed byte once where the widening writes and reads the
  // bf16 matrices again, a cost that more tokens share out; up to 128 routed tokens per expert
  // the packed GEMM is the faster, above it is not measured. Tiles of 64 pad less below 64.
  const long long routed = static_cast<long long>(tokens) * top_k;
  if (routed > 128LL * experts) return 0;
  return routed >= 64LL * experts ? 128 : 64;
}

bool experts_task16_ring(int tokens, int top_k, int experts, int setting) {
  // why 8 per expert: below it the ring's two n-tiles cost more than the re-streams they save
  constexpr int kFromTokensPerExpert = 8;
  const int from = setting >= 0 ? setting : kFromTokensPerExpert;
  if (from == 0 || tokens <= 8) return false;  // (8 tokens fill one chunk-8 task)
  return static_cast<long long>(tokens) * top_k >= static_cast<long long>(from) * experts;
}

bool experts_l2_acts_ring(int tokens, int chunk, int inter, int top_k, int experts, int setting) {
  const long long slots = static_cast<long long>(tokens) * top_k;  // routed token-slots
  const bool within = setting >= 0
                          ? tokens <= setting
                          : slots <= 2LL * experts || (tokens <= 48 && slots <= 3LL * experts);
  // why not one token: it has its own rings; why not short down rows below 8 tokens: the deep
  // ring runs there
  return chunk == 8 && tokens >= 2 && within && (tokens >= 8 || inter > 1024);
}

bool experts_l2_keep(int tokens, int hidden, int chunk, int setting) {
  if (chunk != 8) return false;
  if (setting >= 0) return setting > 0 && tokens >= setting;
  // why the hidden size: ~132 CTAs stream one item each between a row's two reads, ~21-30 MB at
  // hidden 5120-7168, which evicts evict-first lines; at 2048 they survive anyway
  return tokens >= 32 && hidden >= 5120;
}

int experts_down_tail(int tokens, int hidden, int chunk, int setting) {
  if (chunk != 8) return 0;
  if (setting >= 0) return setting;
  return hidden >= 7168 && tokens >= 2 && tokens <= 128 ? 20 : 0;
}

int experts_gate_up_half_items(int tokens, int hidden, int chunk, int setting,
                               int one_token_rings) {
  if (chunk != 8) return 0;
  if (setting >= 0) return setting;
  if (tokens == 1 && one_token_rings != 0) return 0;
  return hidden >= 7168 && tokens <= 8 ? 1 : 0;
}

int experts_down_copy_pieces(int tokens, int k, int split_tokens) {
  return tokens <= split_tokens && k == 2048 ? 2 : 1;
}

bool experts_down_deep_ring(int tokens, int k, int deep_tokens) {
  return tokens <= deep_tokens && k <= 1024;
}

bool experts_down_deep_fp8_ring(int k, int deep_tokens) {
  return deep_tokens != 0 && k <= 2 * 1024;
}

bool experts_fp8_one_token_ring(Gemm gemm, int tokens, int k, int enabled) {
  return enabled != 0 && tokens == 1 && k % 512 == 0 && (gemm == Gemm::GateUp || k <= 2 * 1024);
}

bool experts_down_one_token_ring(int tokens, int k, int enabled) {
  return enabled != 0 && tokens == 1 && k <= 12 * kBlockK;
}

bool experts_down_wide_one_token_ring(int tokens, int k, int enabled) {
  return enabled != 0 && tokens == 1 && k == 32 * kBlockK;
}

bool experts_gate_up_one_token_ring(int tokens, int hidden, bool self_route, int enabled) {
  // why one-chunk rows only when self-routed: with the routing kernel before it they lost
  return enabled != 0 && tokens == 1 && (self_route || hidden > 32 * kBlockK);
}

int experts_down_grid(int resident, int rows, int tokens, int whole_tile_tokens) {
  // why: a CTA's contiguous range then holds whole tiles, so no tile waits on the counter's
  // fence and atomic at the CTA's end
  const int tiles = rows / 16;
  const bool whole =
      tokens <= whole_tile_tokens && tiles <= resident && (resident - tiles) * 16 <= resident;
  return whole ? tiles : resident;
}

bool experts_shared_dense_over_fused(int tokens, int chunk, long long shared_weight_bytes) {
  // The fused slots stream the shared weights once per task of `chunk` tokens, all but the first
  // from L2; the dense GEMMs stream them once, for three launches and cuBLAS' smaller GEMMs.
  constexpr long long kDenseFromReStreamedBytes = 100'000'000;
  const long long re_streams = (tokens + chunk - 1) / chunk - 1;
  return re_streams * shared_weight_bytes >= kDenseFromReStreamedBytes;
}

bool experts_mx_consumer_groups(ExpertFormat f, int tokens, int from_tokens) {
  return f == ExpertFormat::Mxfp4 && from_tokens > 0 && tokens >= from_tokens;
}

int select_expert_kernel(const KernelChoice& c) {
  MK_CHECK(c.chunk == 8 || c.chunk == 16,
           "no expert kernel for chunk " << c.chunk << " (expected 8 or 16)");
  const bool gate_up = c.gemm == Gemm::GateUp;
  ExpertKernel k;
  k.gemm = c.gemm;
  k.stream = c.stream;
  k.n_tiles = c.chunk / 8;
  if (c.stream != Stream::Bulk) {
    // registers: kUnroll per GEMM and chunk; a down reduction of <= 16 k blocks is one round of
    // 4 warps, so 4-warp CTAs (twice the items in flight, no idle warps)
    const bool late = c.stream == Stream::Registers;
    const bool chunk8 = c.chunk == 8;
    k.unroll = late ? (chunk8 ? (gate_up ? 5 : 4) : 3) : (chunk8 ? 3 : 2);
    k.warps = late && chunk8 && !gate_up && c.k / kBlockK <= 16 ? 4 : 8;
    k.ctas_per_sm = 16 / k.warps;
  } else if (c.mx != ExpertFormat::Bf16) {
    k.ring = Ring::MxWeightsOnly;
    k.mx = c.mx;
    k.self_route = gate_up && c.self_route;
    k.consumer_groups = c.consumer_groups && !k.self_route;
  } else if (c.fp8) {
    const bool own_ring =
        c.chunk == 8 && (gate_up ? c.ring == Ring::Fp8OneToken
                                 : !c.down_tail && (c.ring == Ring::WeightsOnlyDeep ||
                                                    c.ring == Ring::Fp8OneTokenDeep));
    k.ring = own_ring ? c.ring : Ring::WeightsOnly;
    k.fp8 = true;
    k.self_route = gate_up && k.ring == Ring::Fp8OneToken && c.self_route;
    k.down_tail = !gate_up && c.down_tail && c.chunk == 8;
  } else if (c.chunk == 16) {
    k.ring = c.ring == Ring::WeightsOnly ? Ring::WeightsOnly : Ring::Standard;
  } else if (c.ring == Ring::WeightsOnly) {
    k.ring = Ring::WeightsOnly;
    k.l2_keep = c.l2_keep;
    k.down_tail = !gate_up && c.down_tail;
  } else if (!gate_up && c.ring != Ring::Standard) {
    k.ring = c.ring;  // the down rings: no split copies, keep or tail instances
  } else if (!gate_up) {
    k.split_rows = c.split_rows;
    k.down_tail = c.down_tail;
    k.l2_keep = c.l2_keep && !c.split_rows;
  } else if (c.l2_keep) {
    k.l2_keep = true;  // (no one-token, half-item or self-routing instance keeps)
  } else {
    k.ring = c.ring == Ring::OneToken ? Ring::OneToken : Ring::Standard;
    k.self_route = c.self_route && !c.half_items;
    k.half_items = c.half_items;
  }
  const int index = find_expert_kernel(k);
  MK_CHECK(index >= 0, "no expert kernel instance for " << describe(k));
  return index;
}

}  // namespace moekit::plan

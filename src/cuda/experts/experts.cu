// Launch code of the grouped expert kernels (experts_bulk_kernel.cuh, experts_kernel.cuh): the
// variant table, the persistent grid size, the launch. Thirty-one kernel instances in all (CI
// compiles them on two cores): 20 bulk, 2 persistent, 9 register kernels.
//
// Variants, chosen per forward by experts_stream_default (measured) unless
// MOEKIT_EXPERTS_KERNEL=regs|regs-early|bulk|persistent forces one at layer creation:
//   bulk (decode batches): experts_bulk_kernel.cuh, weights and activations by bulk copies into a
//     ring of shared-memory stages, consumer / 2 producer / epilogue warps (one CTA of 11 warps
//     and ~210 KB of shared memory per SM); chunk 8: 2 stages of 16 x 4 KB of weights, chunk 16:
//     5 stages of 16 x 1 KB, or (ring 4, experts_task16_ring) 3 stages of 16 x 4 KB of weights
//     only, which also runs above 256 tokens on experts of hidden < 4096.
//   persistent (opt-in): the bulk kernel's warps running gate/up and then down in ONE grid of
//     resident CTAs (experts_bulk_fused_kernel): a CTA's down items wait per task on the gate/up
//     completion counters instead of a kernel boundary; 3 launches per fused layer. Measured on
//     the H200 within 1% of bulk on DeepSeek-V3, 5-13% slower on Qwen3-30B-A3B
//     (bench/results/h200/2026-11-30-s6-producer-issue): not a default.
//   regs / regs-early (larger batches): experts_kernel.cuh, weights in registers (kNT n-tiles of
//     8 tokens per task, kUnroll k blocks in flight per warp), spill-free at 2 CTAs of 256
//     threads per SM (128 registers, ptxas -v, CUDA 13).
//     regs: activation fragments loaded right before their mma (kLateActs), so the registers
//       hold weights only: chunk 8 gate/up kUnroll 5 (160 KB of weights in flight per SM), down
//       kUnroll 4 (128 KB; K <= 1024: 4-warp CTAs, 4 per SM), chunk 16 kNT 2 kUnroll 3.
//     regs-early: activations loaded with the weights: chunk 8 kUnroll 3, chunk 16 kNT 2 kUnroll 2
//       (fewer waits per k block: faster with large experts).
// Chunk 8 up to 256 tokens. At decode an expert rarely holds more than 8 tokens (DeepSeek-V3 at
// T=128 averages 4), and an expert's further chunks (the shared expert's at every T > 8) are
// adjacent work items that re-read its rows: from L2 where the rows outlive the items streamed
// in between, which on wide experts takes the L2 keep (experts_l2_keep). But where experts
// average 8 routed tokens or more, the bulk kernels take chunk 16 (experts_task16_ring: those
// re-reads then cost more than the ring of weights only's two n-tiles). MOEKIT_EXPERTS_CHUNK=8|16
// overrides (read once, for measurements).
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/experts/experts.h"
#include "cuda/experts/experts_bulk_kernel.cuh"
#include "cuda/experts/experts_kernel.cuh"
#include "cuda/layer/pdl.cuh"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

using experts_detail::bulk_smem_bytes;
using experts_detail::experts_bulk_kernel;
using experts_detail::experts_kernel;
using experts_detail::kBulkThreads;
using experts_detail::kThreads;

using KernelFn = void (*)(ExpertsParams);

// A kernel and its block size.
struct Variant {
  KernelFn fn;
  int threads;
};

// ring: ExpertsParams::ring (0 the standard ring; down: 1 the deep one, 2 and 3 the one-token
// ones; gate/up: 3 the one-token one; both: 4 the ring of weights only)
int smem_bytes(ExpertsStream stream_kind, int chunk, int ring = 0) {
  if (stream_kind != ExpertsStream::Bulk && stream_kind != ExpertsStream::Persistent) return 0;
  if (chunk != 8) return ring == 4 ? bulk_smem_bytes<2, 4>() : bulk_smem_bytes<2>();
  switch (ring) {
    case 1:
      return bulk_smem_bytes<1, 1>();
    case 2:
      return bulk_smem_bytes<1, 2>();
    case 3:
      return bulk_smem_bytes<1, 3>();
    case 4:
      return bulk_smem_bytes<1, 4>();
    default:
      return bulk_smem_bytes<1>();
  }
}

// Largest reduction length (in 64-wide k blocks) the 4-warp down variant covers in one round.
constexpr int kDown4MaxBlocks = 4 * 4;

// k: the reduction length of the launch (H for gate/up, the expert width for down).
// split_rows: the bulk down kernel's instance that copies weight rows in two halves; ring: its
// deep-ring (1) or one-token-ring (2: rows <= 1.5 KB, 3: 4 KB rows) instance, or the gate/up
// kernel's one-token-ring (3) instances (self-routing, whole items or half items; chunk 8); keep:
// the bulk kernels' L2-keeping instance (chunk 8, kKeep); tail: the bulk down kernel's dynamic-tail
// instances (chunk 8, kTail; with keep or without). Ring 4 (both kernels, weights-only stages)
// has its keep and tail twins.
Variant kernel_for(ExpertsKind kind, int chunk, ExpertsStream stream_kind, int k,
                   bool split_rows = false, int ring = 0, bool keep = false, bool tail = false,
                   bool halves = false, bool self_route = false) {
  const bool gate_up = kind == ExpertsKind::GateUp;
  MK_CHECK(chunk == 8 || chunk == 16, "no expert kernel for chunk " << chunk
                                          << " (expected 8 or 16)");
  switch (stream_kind) {
    case ExpertsStream::Persistent:  // its separate GEMMs (the unfused shared MLP) run as Bulk
    case ExpertsStream::Bulk:
      if (chunk == 8) {
        if (ring == 4) {  // weights-only stages, with the L2-keeping and dynamic-tail twins
          if (gate_up) {
            return {keep ? experts_bulk_kernel<true, 1, false, 4, true>
                         : experts_bulk_kernel<true, 1, false, 4>,
                    kBulkThreads};
          }
          if (tail) {
            return {keep ? experts_bulk_kernel<false, 1, false, 4, true, true>
                         : experts_bulk_kernel<false, 1, false, 4, false, true>,
                    kBulkThreads};
          }
          return {keep ? experts_bulk_kernel<false, 1, false, 4, true>
                       : experts_bulk_kernel<false, 1, false, 4>,
                  kBulkThreads};
        }
        if (!gate_up && ring == 2) return {experts_bulk_kernel<false, 1, false, 2>, kBulkThreads};
        if (!gate_up && ring == 3) return {experts_bulk_kernel<false, 1, false, 3>, kBulkThreads};
        if (!gate_up && ring == 1) return {experts_bulk_kernel<false, 1, false, 1>, kBulkThreads};
        if (!gate_up && split_rows) {
          return {tail ? experts_bulk_kernel<false, 1, true, false, false, true>
                       : experts_bulk_kernel<false, 1, true>,
                  kBulkThreads};
        }
        if (!gate_up && tail) {
          return {keep ? experts_bulk_kernel<false, 1, false, false, true, true>
                       : experts_bulk_kernel<false, 1, false, false, false, true>,
                  kBulkThreads};
        }
        if (gate_up && self_route && ring == 3 && !keep && !halves) {
          return {experts_bulk_kernel<true, 1, false, 3, false, false, false, true>, kBulkThreads};
        }
        if (gate_up && ring == 3 && !keep) {
          return {halves ? experts_bulk_kernel<true, 1, false, 3, false, false, true>
                         : experts_bulk_kernel<true, 1, false, 3>,
                  kBulkThreads};
        }
        if (gate_up && self_route && !keep && !halves) {
          return {experts_bulk_kernel<true, 1, false, false, false, false, false, true>,
                  kBulkThreads};
        }
        if (gate_up && halves && !keep) {
          return {experts_bulk_kernel<true, 1, false, false, false, false, true>, kBulkThreads};
        }
        if (keep) {
          return {gate_up ? experts_bulk_kernel<true, 1, false, false, true>
                          : experts_bulk_kernel<false, 1, false, false, true>,
                  kBulkThreads};
        }
        return {gate_up ? experts_bulk_kernel<true, 1> : experts_bulk_kernel<false, 1>,
                kBulkThreads};
      }
      if (ring == 4) {  // tasks of up to 16 tokens through weights-only stages (no twins)
        return {gate_up ? experts_bulk_kernel<true, 2, false, 4>
                        : experts_bulk_kernel<false, 2, false, 4>,
                kBulkThreads};
      }
      return {gate_up ? experts_bulk_kernel<true, 2> : experts_bulk_kernel<false, 2>,
              kBulkThreads};
    case ExpertsStream::RegistersEarlyActs:
      if (chunk == 8) {
        return {gate_up ? experts_kernel<true, 1, 3, false> : experts_kernel<false, 1, 3, false>,
                kThreads};
      }
      return {gate_up ? experts_kernel<true, 2, 2, false> : experts_kernel<false, 2, 2, false>,
              kThreads};
    default:
      // gate/up kUnroll 5: DeepSeek-V3 K=7168 is 112 blocks = 3 rounds of 40 (kUnroll 3: 5
      // rounds); down kUnroll 4: K=2048 is 32 blocks = one round on all 8 warps (3: two rounds,
      // the second on 3 warps); a down K of <= 16 blocks (Qwen3-30B: 12) is one round of 4
      // warps, so 4-warp CTAs, 4 per SM: twice the items in flight, no idle warps
      if (chunk == 8) {
        if (gate_up) return {experts_kernel<true, 1, 5, true>, kThreads};
        if (k / experts_detail::kBlockK <= kDown4MaxBlocks) {
          return {experts_kernel<false, 1, 4, true, 4>, 4 * 32};
        }
        return {experts_kernel<false, 1, 4, true>, kThreads};
      }
      return {gate_up ? experts_kernel<true, 2, 3, true> : experts_kernel<false, 2, 3, true>,
              kThreads};
  }
}

}  // namespace

int experts_chunk(int tokens) {
  static const int forced = [] {
    const char* v = std::getenv("MOEKIT_EXPERTS_CHUNK");
    if (v == nullptr || v[0] == '\0') return 0;
    const std::string s(v);
    MK_CHECK(s == "8" || s == "16", "MOEKIT_EXPERTS_CHUNK='" << s << "' (expected 8 or 16)");
    return std::stoi(s);
  }();
  if (forced != 0) return forced;
  return tokens <= 256 ? 8 : 16;
}

std::optional<ExpertsStream> experts_stream_override() {
  const char* v = std::getenv("MOEKIT_EXPERTS_KERNEL");
  if (v == nullptr || v[0] == '\0') return std::nullopt;
  const std::string s(v);
  if (s == "regs") return ExpertsStream::Registers;
  if (s == "regs-early") return ExpertsStream::RegistersEarlyActs;
  if (s == "bulk") return ExpertsStream::Bulk;
  if (s == "persistent") return ExpertsStream::Persistent;
  MK_FAIL("MOEKIT_EXPERTS_KERNEL='" << s << "' (expected regs, regs-early, bulk or persistent)");
}

namespace {
// The integer in environment variable `name`, checked to lie in [lo, hi] (`what` names the
// expected value in the error), or `fallback` when it is unset or empty.
int env_int_in_range(const char* name, int fallback, long lo, long hi, const char* what) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  const std::string s(v);
  char* end = nullptr;
  const long n = std::strtol(s.c_str(), &end, 10);
  MK_CHECK(*end == '\0' && n >= lo && n <= hi, name << "='" << s << "' (expected " << what << ")");
  return static_cast<int>(n);
}
}  // namespace

int experts_dynamic_tail_percent() {
  // Measured on the H200 (bench/results/h200/2026-11-30-s6-producer-issue, run 3: the gate/up
  // kernel's last CTA ended 5 us sooner at T=1, 70 us at T=128 with 35% than with none; 20% and
  // 35% alike at T=1). The down kernel keeps static ranges: its claimed items, combined through
  // the tile counters (a fence and an atomic each), made its epilogue the bottleneck (and four
  // at a time, one fence per four, still slower: 2026-11-30-s7-experiments).
  return env_int_in_range("MOEKIT_EXPERTS_TAIL", 35, 0, 100, "a percentage, 0 to 100");
}

int experts_shared_dense_tokens() {
  // Measured on the H200 (bench/results/h200/2026-12-01-s19-experiments, run 2: the unfused
  // shared MLP as dense GEMMs against it through these kernels, same run): from 8 tokens
  // 0.989-0.998 on all eight shared-expert models, 0.95-0.99 at 16-64 (DeepSeek-V2-Lite 0.86 and
  // Qwen2-57B-A14B 0.67 at 64); at one token 1.002-1.056 (three launches for one token's GEMVs).
  return env_int_in_range("MOEKIT_SHARED_DENSE", 8, 0, 1 << 20,
                          "a token count, 0 (never) to 1048576");
}

bool experts_shared_dense_over_fused(int tokens, int chunk, long long shared_weight_bytes) {
  // The fused slots stream the shared weights once per task of `chunk` tokens, all but the first
  // from L2; dense GEMMs stream them once, for three launches and cuBLAS' smaller GEMMs.
  // Measured on the H200 (bench/results/h200/2026-12-01-s19-experiments, runs 1-3, dense against
  // fused in one run; the 4.54 TB/s kind, then the 4.63 one): dense wins once those re-streams
  // pass ~100 MB. DeepSeek-V3 / Kimi-K2 (88 MB each): 16 tokens 0.997 / 0.999, then 1.008-1.009
  // / 1.006-1.010 (fused stays); 24 0.991 / 0.992, then 1.001-1.002 / 1.003; 32 0.996-1.001 /
  // 0.998-1.006, then 0.996-0.999 / 0.999-1.000; 64 0.983-0.989 / 0.988-0.991, then 0.995 / 0.994;
  // 128 0.982-0.984 / 0.984-0.989, then 0.986 / 0.988; 256 0.945 / 0.965-0.969, then 0.932 / 0.977.
  // GLM-4.5 (47 MB) 16 0.999, 24 0.988, 128 0.96; DeepSeek-V4-Flash (50 MB) 16 1.003, 24 0.994;
  // DeepSeek-V2-Lite (two 17 MB slots) 16 1.032, 24 1.007, 32 0.983; MiniMax-M3 (113 MB) 16 0.993;
  // Qwen2-57B-A14B (440 MB, eight slots) 8 1.010, 16 0.923 / 0.927, 64 0.62.
  constexpr long long kDenseFromReStreamedBytes = 100'000'000;
  const long long re_streams = (tokens + chunk - 1) / chunk - 1;
  return re_streams * shared_weight_bytes >= kDenseFromReStreamedBytes;
}

int experts_down_split_tokens() {
  // Measured on the H200 (bench/results/h200/2026-11-30-s9-experiments): the down kernel's
  // 4 KB weight rows in two 2 KB copies, off / on twice in one run (run 5): DeepSeek-V3 T=1
  // 198.1 -> 195.0 us, T=2 -0.6%, T=4 -0.7%, T=8 -0.5%; Kimi-K2 T=1 -0.6%, T=4 -0.7%, T=8
  // -0.5%. At 32-128 tokens it lost 0.4-1.4% (run 4, the same H200 kind), and split gate/up
  // rows lost everywhere there; on the other H200 kind (run 3) splitting every row gained at
  // 1-32 tokens and lost at 128. As this template instance, default on (session 10, run 1, the
  // 4.63 TB/s kind, twice; bench/results/h200/2026-11-30-s10-experiments): DeepSeek-V3 T=1
  // 203.1 -> 199.4 us, T=2 -1.9%, T=8 -1.5%, T=32 and 128 (no split) equal, Qwen3-30B-A3B (no
  // split: 1.5 KB rows) equal. Why it helps is not known (the bytes and the ring are the same).
  // Rows of 3 KB (1536-wide experts) in 1.5 KB copies were slower (run 11, 0 / 8 twice):
  // MiniMax-M2 T=1 68.3 -> 71.1 us, T=2 +3.9%, T=8 +2.3%; GLM-4.5 +3.3%, +2.4%, +1.2%. And rows
  // of more than 4 KB, their first 4 KB chunk split (session 11, run 7, 0 / 8 twice): gpt-oss-120b
  // (2880) T=1 62.8 -> 66.7 us, T=8 +7%; Qwen2-57B-A14B (2560) +9%, +8%; MiniMax-M3 (3072) +7%,
  // +4%. Hence only rows of exactly one 4 KB chunk (experts_down_copy_pieces).
  return env_int_in_range("MOEKIT_EXPERTS_DOWN_SPLIT", 8, 0, 1 << 20,
                          "a token count, 0 (never) to 1048576");
}

int experts_down_copy_pieces(int tokens, int k, int split_tokens) {
  return tokens <= split_tokens && k == 2048 ? 2 : 1;
}

int experts_down_deep_tokens() {
  // Measured on the H200 (bench/results/h200/2026-11-30-s10-experiments, runs 8-10, off / on
  // twice in one run): Qwen3-30B-A3B (768-wide experts: 1.5 KB rows) T=1 33.4 -> 32.1 us, T=2
  // 52.2 -> 49.6, T=8 142.1 -> 141.4; at 16-128 tokens it lost 0.4-3% (at 256 it gained 1.6%).
  // Its 2-stage ring carries 24 KB of weights per stage, the deep one twice the stages; the
  // bulk-copy stream probe (moekit bench stream) streams that shape at 0.75 of the read kernel
  // with 2 stages and 0.95-0.98 with 4. With 4 KB rows (DeepSeek-V3) the deep ring lost 0.3-1%
  // at 1-8 tokens (and a deep gate/up ring: 0.5-1.5%, Qwen3 within 1%), hence rows <= 2 KB.
  return env_int_in_range("MOEKIT_EXPERTS_DOWN_DEEP", 8, 0, 1 << 20,
                          "a token count, 0 (never) to 1048576");
}

bool experts_down_deep_ring(int tokens, int k, int deep_tokens) {
  return tokens <= deep_tokens && k <= 1024;
}

int experts_one_token_ring_setting() {
  // Measured on the H200 (bench/results/h200/2026-12-01-s15-experiments, runs 5-7, off / on
  // in one run): Qwen3-30B-A3B (768-wide experts) T=1 30.4-30.6 -> 29.9-30.0 us (-1.6%; run 7,
  // three times each), T=2 equal. Its trace: the down phase, wait to end, 7.6 -> 6.9 us. The
  // same ring with padded rows, 16 copies per tile (run 5): +2.6%, though it held 1.75x the bytes
  // in flight: at 1.5 KB rows the copies' issue, not the bytes in flight, bounds the down stream.
  return env_int_in_range("MOEKIT_EXPERTS_ONE_TOKEN_RING", 1, 0, 1, "0 or 1");
}

bool experts_down_one_token_ring(int tokens, int k, int enabled) {
  return enabled != 0 && tokens == 1 && k <= 12 * experts_detail::kBlockK;
}

bool experts_down_wide_one_token_ring(int tokens, int k, int enabled) {
  // Measured on the H200 (bench/results/h200/2026-12-01-s16-experiments, run 1, the 4.43 TB/s
  // kind, twice each): DeepSeek-V3 T=1 199.0-199.5 -> 196.2-196.4 us (-1.4%), Kimi-K2 200.0-201.1
  // -> 197.2-197.5 (-1.4%), against the split instance's 2 KB copies in 2 stages. 1, 2, 4, 8 or
  // 16 rows per copy were alike (within 0.3%): one copy per tile, the fewest instructions. Run 4
  // (4.53 kind): GLM-5 -1.0%, DeepSeek-V4-Flash -1.5%. Only rows of exactly 4 KB: with 3 KB rows
  // (run 4) MiniMax-M2 +1.3%, GLM-4.5 -0.3%, Qwen3-235B-A22B equal.
  return enabled != 0 && tokens == 1 && k == 32 * experts_detail::kBlockK;
}

bool experts_gate_up_one_token_ring(int tokens, int hidden, bool self_route, int enabled) {
  // Measured on the H200 (bench/results/h200/2026-12-01-s15-experiments, off / on three times in
  // one run): Qwen3-30B-A3B (hidden 2048: 4 KB rows) T=1 30.0-30.1 -> 29.7 us (-1.0%; run 8,
  // the down kernel's one-token ring in both); both rings against neither 30.5-30.6 -> 29.5 us
  // (-3.3%; run 9). Two copies per 64 KB item instead of 16. The gate/up tail's 35% stays with
  // it (20% equal, 50% +1%; run 9). For rows of several 4 KB chunks, copied row by row: the
  // third stage alone (2026-12-01-s16-experiments, run 5, off / on twice in one run on the 4.53
  // TB/s kind): DeepSeek-V3 194.2-194.4 -> 186.9-187.5 us (-3.8%; 0.904 -> 0.939 of the read
  // bandwidth), Kimi-K2 -2.2%, GLM-5 -6.5%, DeepSeek-V4-Flash -2.5%, GLM-4.5 -3.2%, MiniMax-M2
  // -1.9%; self-routed (run 6, all one-token rings off / on): Qwen3-235B-A22B -4.3%, gpt-oss-120b
  // -2.7%, Mixtral-8x7B -5.5%, and Qwen2-57B-A14B -3.7%. But DeepSeek-V2-Lite (hidden 2048, the
  // routing kernel before it) +0.9% (42.4 -> 42.8 us, twice): hence one-chunk rows only when
  // self-routed.
  return enabled != 0 && tokens == 1 && (self_route || hidden > 32 * experts_detail::kBlockK);
}

int experts_l2_acts_tokens() {
  return env_int_in_range("MOEKIT_EXPERTS_L2_ACTS", -1, 0, 1 << 20,
                          "a token count, 0 (never) to 1048576");
}

bool experts_l2_acts_ring(int tokens, int chunk, int inter, int top_k, int experts,
                          int l2_acts_tokens) {
  const long long slots = static_cast<long long>(tokens) * top_k;  // routed token-slots
  const bool within = l2_acts_tokens >= 0
                          ? tokens <= l2_acts_tokens
                          : slots <= 2LL * experts || (tokens <= 48 && slots <= 3LL * experts);
  return chunk == 8 && tokens >= 2 && within && (tokens >= 8 || inter > 1024);
}

int experts_task16_setting() {
  return env_int_in_range("MOEKIT_EXPERTS_TASK16", -1, 0, 1 << 20,
                          "routed tokens per expert, 0 (never) to 1048576");
}

bool experts_task16_ring(int tokens, int top_k, int experts, int setting) {
  // Measured on the H200 (bench/results/h200/2026-12-01-s20-experiments, runs 1-2: forced from 1
  // routed token per expert against never, same run, `auto`): at 8 per expert every model gains,
  // Mixtral-8x7B -13.8% (32 tokens), Qwen2-57B-A14B -11.5% (64), Qwen3-30B-A3B -6.6% (128),
  // DeepSeek-V3 -4.5% (256), gpt-oss-120b -20.8% (256), and more above (Qwen2-57B-A14B -31 / -37%
  // at 16 / 32 per expert, Mixtral -23 / -28%, Qwen3-30B-A3B -20% at 16); at 6-6.4 it is mixed
  // (GLM-4.5 -1.8% at 6.4, 0.2% at 6; DeepSeek-V3 -0.4% at 6; Qwen3-30B-A3B +2.5% at 6), and
  // at 1-5 per expert it loses (DeepSeek-V3 +0.6..+2.4%, GLM-4.5 +1.1..+5.5%, Qwen3-30B-A3B
  // +5.9..+8.8%, gpt-oss-120b +2.2..+4.7%, Qwen2-57B-A14B +2.9 / +3.8% at 2 / 4): the ring of
  // weights only loses with more tokens per task (experts.h, experts_l2_acts_ring) until the
  // re-streams it saves outweigh that.
  constexpr int kFromTokensPerExpert = 8;
  const int from = setting >= 0 ? setting : kFromTokensPerExpert;
  if (from == 0 || tokens <= 8) return false;
  return static_cast<long long>(tokens) * top_k >= static_cast<long long>(from) * experts;
}

int experts_l2_keep_from_tokens() {
  return env_int_in_range("MOEKIT_EXPERTS_L2_KEEP_FROM", -1, 0, 1 << 20,
                          "a token count, 0 (never) to 1048576");
}

bool experts_l2_keep(int tokens, int hidden, int chunk, int forced_from) {
  if (chunk != 8) return false;  // why: measured at chunk 8 (<= 256 tokens) only
  if (forced_from >= 0) return forced_from > 0 && tokens >= forced_from;
  // Measured on the H200 (bench/results/h200/2026-11-30-s11-experiments, runs 1-6, same run
  // against the kernels without it): DeepSeek-V3 T=128 -1.9..-2.5%, T=256 -6.3..-7.8%, T=32-64
  // -0.3..-0.6%; Kimi-K2 T=128 -1.1..-1.3%, T=256 -4.2..-5.0%; GLM-4.5 T=32 -1.4%, T=128 -4.6%,
  // T=256 -5.2%; GLM-5 T=32 -0.4%, T=128 -2.3%, T=256 -7.0%; MiniMax-M3 T=32 -1.0%, T=128 -3.3%,
  // T=256 -4.3%. But Qwen3-30B-A3B (2048) T=256 +4.4..+5%, Qwen3-235B-A22B (4096) T=256 +7.8%,
  // Mixtral-8x7B (4096) +16..22%; MiniMax-M2 (3072) and gpt-oss-120b (2880) gain <= 1.4%. Why
  // the hidden size: a task's gate/up item is 16 weight rows of `hidden` bf16, and ~132 CTAs
  // stream one item each between a row's two reads: ~30 MB at 7168, ~21 MB at 5120 (the
  // evict-first lines are gone by the second read), ~8 MB at 2048 (they survive anyway, and
  // rows held at normal priority then only crowd out h and the partials).
  return tokens >= 32 && hidden >= 5120;
}

int experts_down_tail_percent_setting() {
  return env_int_in_range("MOEKIT_EXPERTS_DOWN_TAIL", -1, 0, 100, "a percentage, 0 to 100");
}

int experts_down_tail(int tokens, int hidden, int chunk, int forced) {
  if (chunk != 8) return 0;  // why: experts.h
  if (forced >= 0) return forced;
  return hidden >= 7168 && tokens >= 2 && tokens <= 128 ? 20 : 0;
}

int experts_gate_up_half_items_setting() {
  return env_int_in_range("MOEKIT_EXPERTS_HALF_ITEMS", -1, 0, 16, "items per CTA, 0 to 16");
}

int experts_gate_up_half_items(int tokens, int hidden, int chunk, int forced, int one_token_ring) {
  if (chunk != 8) return 0;  // why: experts.h
  if (forced >= 0) return forced;
  if (tokens == 1 && one_token_ring != 0) return 0;  // why: experts.h
  return hidden >= 7168 && tokens <= 8 ? 1 : 0;
}

int experts_self_route_tokens() {
  return env_int_in_range("MOEKIT_EXPERTS_SELF_ROUTE", 1, 0, 1, "a token count, 0 or 1");
}

int experts_shared_first_tokens() {
  // Measured on the H200, DeepSeek-V3 fused, same run (bench/results/h200/2026-11-30-s7-
  // experiments): shared items first, T=1 205.5 -> 199.1 us, T=8 1197.5 -> 1182.7, T=32 3306.7
  // -> 3315.0 (noise), T=128 5470.3 -> 5519.9 (+0.9%: the routed items then start ~200 us late
  // and the tail balances them worse). On up to 32 tokens, where it gains or is even.
  return env_int_in_range("MOEKIT_EXPERTS_SHARED_FIRST", 32, 0, 1 << 20,
                          "a token count, 0 (never) to 1048576");
}

int experts_whole_tile_tokens() {
  // Measured on the H200 (bench/results/h200/2026-11-30-s8-experiments, run 4): Qwen3-30B-A3B
  // (128 tiles on 132 SMs) T=1 35.3 -> 33.3 us, T=2 54.0 -> 52.3, T=4 88.1 -> 87.6, T=8 equal,
  // T=32 +0.8%, T=128 +1% (4 idle SMs then cost more than the counters). DeepSeek-V3's 448 tiles
  // on 112 CTAs were 3-4% slower at every batch: hence also the bound on idle SMs.
  return env_int_in_range("MOEKIT_EXPERTS_WHOLE_TILES", 4, 0, 1 << 20,
                          "a token count, 0 (never) to 1048576");
}

int experts_down_grid(int resident, int rows, int tokens, int whole_tile_tokens) {
  const int tiles = rows / 16;
  const bool whole = tokens <= whole_tile_tokens && tiles <= resident &&
                     (resident - tiles) * 16 <= resident;
  return whole ? tiles : resident;
}

ExpertsStream experts_stream_default(int hidden, int tokens, bool tasks_of_16) {
  // Measured on the H200, each variant forced at every batch in one run
  // (bench/results/h200/2026-11-30-s6-producer-issue/run6, ab.txt): the bulk-copy kernel is the
  // fastest up to 256 tokens for DeepSeek-V3 (T=256: 7484 us against 8054 regs-early, 8962
  // regs) and Qwen3-30B-A3B (T=128: 438 against 588 regs; T=256: 736 against 957), and up to 128
  // for gpt-oss-120b (1570 against 1691 regs-early, 2403 regs; at 256 regs-early is 6% faster,
  // regs 34% slower). Above 256 tokens (chunk 16) the register kernels, as measured before
  // (2026-11-30-run5-bulk): regs-early for large experts (H >= 4096), regs below; but below
  // H = 4096 the bulk kernels with tasks of 16 tokens (experts_task16_ring) beat regs
  // (2026-12-01-s20-experiments, run 2, same run, `auto`): Qwen3-30B-A3B -35 / -35 / -36% at
  // 384 / 512 / 1024 tokens, gpt-oss-120b -13.5 / -10.5 / -2.6%, Qwen2-57B-A14B -5.6 / -2.8 /
  // -3.2%; not regs-early (Mixtral-8x7B +24 / +24 / +17%, DeepSeek-V3 +1.1 / +5.8 / +10%).
  if (tokens <= 256) return ExpertsStream::Bulk;
  if (hidden >= 4096) return ExpertsStream::RegistersEarlyActs;
  return tasks_of_16 ? ExpertsStream::Bulk : ExpertsStream::Registers;
}

namespace {

// SMs x resident CTAs of kernel `fn` on the current device; also raises its dynamic
// shared-memory limit. `what` names the kernel in the error.
template <typename... Params>
int resident_grid(void (*fn)(Params...), int threads, int smem, const char* what, int chunk) {
  int device = 0, sms = 0, per_sm = 0;
  MK_CUDA_CHECK(cudaGetDevice(&device));
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (smem > 48 * 1024) {
    MK_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  MK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, smem));
  MK_CHECK(per_sm > 0, what << " (chunk " << chunk << ") cannot be resident on this device");
  return sms * per_sm;
}

}  // namespace

int experts_grid(ExpertsKind kind, int chunk, ExpertsStream stream_kind, int k) {
  const Variant v = kernel_for(kind, chunk, stream_kind, k);
  const int grid =
      resident_grid(v.fn, v.threads, smem_bytes(stream_kind, chunk), "expert kernel", chunk);
  // The instances launch_experts may pick instead (ExpertsParams::weight_copy_pieces,
  // ring, l2_keep, down_tail_percent) need their own shared-memory limits raised, and run
  // on the same grid.
  struct Twin {
    bool split_rows;
    int ring;
    bool keep, tail, halves, self_route;
    const char* name;
  };
  for (const Twin& t :
       {Twin{true, 0, false, false, false, false, "split-row"},
        Twin{false, 1, false, false, false, false, "deep-ring"},
        Twin{false, 2, false, false, false, false, "one-token-ring"},
        Twin{false, 3, false, false, false, false, "4 KB one-token-ring"},
        Twin{false, 0, true, false, false, false, "L2-keeping"},
        Twin{false, 0, false, true, false, false, "dynamic-tail"},
        Twin{false, 0, true, true, false, false, "L2-keeping dynamic-tail"},
        Twin{true, 0, false, true, false, false, "split-row dynamic-tail"},
        Twin{false, 0, false, false, true, false, "half-item"},
        Twin{false, 0, false, false, false, true, "self-routing"},
        Twin{false, 3, false, false, false, true, "one-token self-routing"},
        Twin{false, 3, false, false, false, false, "one-token gate/up"},
        Twin{false, 3, false, false, true, false, "one-token half-item"},
        Twin{false, 4, false, false, false, false, "weights-only-ring"},
        Twin{false, 4, true, false, false, false, "L2-keeping weights-only-ring"},
        Twin{false, 4, false, true, false, false, "dynamic-tail weights-only-ring"},
        Twin{false, 4, true, true, false, false, "L2-keeping dynamic-tail weights-only-ring"}}) {
    const Variant twin = kernel_for(kind, chunk, stream_kind, k, t.split_rows, t.ring, t.keep,
                                    t.tail, t.halves, t.self_route);
    if (twin.fn == v.fn) continue;
    MK_CHECK(resident_grid(twin.fn, twin.threads, smem_bytes(stream_kind, chunk, t.ring),
                           "expert kernel", chunk) == grid,
             "the " << t.name << " expert kernel's resident grid differs from its twin's");
  }
  return grid;
}

void launch_experts(ExpertsKind kind, int chunk, ExpertsStream stream_kind,
                    const ExpertsParams& p, int grid, cudaStream_t stream) {
  const int ring = chunk == 8 || p.ring == 4 ? p.ring : 0;  // (chunk 16: ring 4 or the standard)
  MK_CHECK(ring == 0 || ring == 4 ||
               (kind == ExpertsKind::Down ? ring <= 3 : ring == 3 && p.l2_keep == 0),
           "launch_experts: ring " << ring
                                   << " (expected 0 to 4 for down, 0, 3 or 4 for gate/up; 3 "
                                      "without the L2 keep)");
  MK_CHECK(
      ring != 4 || (p.half_items_per_cta == 0 && p.weight_copy_pieces == 1 && p.self_route == 0),
      "launch_experts: ring 4 has no half items, split copies or self-routing (half items "
          << p.half_items_per_cta << ", copy pieces " << p.weight_copy_pieces << ", self_route "
          << p.self_route << ")");
  // the down rings' instances have no tail; the one-token rings' stages hold one activation
  // row, and one row chunk of <= 1.5 KB (ring 2) or <= 4 KB (ring 3), with no split copies
  const bool tail = kind == ExpertsKind::Down && p.down_tail_percent > 0 && chunk == 8;
  MK_CHECK(kind != ExpertsKind::Down || ring == 0 || ring == 4 || !tail,
           "launch_experts: the down kernel's ring " << ring << " has no tail (tail "
                                                     << p.down_tail_percent << "%)");
  MK_CHECK(kind != ExpertsKind::Down || ring < 2 || ring == 4 ||
               (p.tokens == 1 && p.k <= (ring == 2 ? 12 : 32) * experts_detail::kBlockK &&
                p.weight_copy_pieces == 1),
           "launch_experts: the down kernel's one-token ring "
               << ring << " needs one token, rows of <= " << (ring == 2 ? 768 : 2048)
               << " and one copy per row (tokens " << p.tokens << ", k " << p.k << ", copy pieces "
               << p.weight_copy_pieces << ")");
  MK_CHECK(!tail || p.tile_counters != nullptr,
           "launch_experts: a down tail (down_tail_percent " << p.down_tail_percent
                                                             << ") needs the combine's counters");
  const bool halves = kind == ExpertsKind::GateUp && p.half_items_per_cta > 0 && chunk == 8;
  const bool self_route = kind == ExpertsKind::GateUp && p.self_route != 0;
  MK_CHECK(!self_route || (chunk == 8 && stream_kind == ExpertsStream::Bulk && !halves &&
                           p.l2_keep == 0 && p.route.tokens == 1 &&
                           p.route.cfg.num_experts <= 128 && p.route.cfg.shared_slots == 0),
           "launch_experts: a self-routing gate/up launch needs chunk 8, the bulk kernel, one "
           "token, E <= 128 and no shared slots");
  const Variant v = kernel_for(kind, chunk, stream_kind, p.k, p.weight_copy_pieces == 2, ring,
                               p.l2_keep != 0, tail, halves, self_route);
  launch_pdl(v.fn, dim3(grid), dim3(v.threads), smem_bytes(stream_kind, chunk, ring), stream, p);
}

namespace {

using FusedFn = void (*)(ExpertsParams, ExpertsParams, int*, int);

FusedFn fused_kernel_for(int chunk) {
  MK_CHECK(chunk == 8 || chunk == 16, "no fused expert kernel for chunk " << chunk
                                          << " (expected 8 or 16)");
  return chunk == 8 ? experts_detail::experts_bulk_fused_kernel<1>
                    : experts_detail::experts_bulk_fused_kernel<2>;
}

int fused_gate_up_order() {
  static const int order = [] {
    const char* v = std::getenv("MOEKIT_FUSED_GATE_UP_ORDER");
    if (v == nullptr || v[0] == '\0') return int{experts_detail::kGateUpRoundRobin};
    const std::string s(v);
    if (s == "round-robin") return int{experts_detail::kGateUpRoundRobin};
    if (s == "ranges") return int{experts_detail::kGateUpRanges};
    MK_FAIL("MOEKIT_FUSED_GATE_UP_ORDER='" << s << "' (expected round-robin or ranges)");
  }();
  return order;
}

}  // namespace

int experts_fused_grid(int chunk) {
  return resident_grid(fused_kernel_for(chunk), kBulkThreads,
                       smem_bytes(ExpertsStream::Persistent, chunk), "fused expert kernel", chunk);
}

void launch_experts_fused(int chunk, const ExpertsParams& gu, const ExpertsParams& dn,
                          int* task_done, int grid, cudaStream_t stream) {
  MK_CHECK(task_done != nullptr, "launch_experts_fused: task_done is null");
  launch_pdl(fused_kernel_for(chunk), dim3(grid), dim3(kBulkThreads),
             smem_bytes(ExpertsStream::Persistent, chunk), stream, gu, dn, task_done,
             fused_gate_up_order());
}

}  // namespace moekit::cuda

// The rules of the layer plan (plan_layer, src/plan/plan.cpp composes them): pure functions of
// the shapes, the batch and one setting each (-1: the rule's default; PlanOverrides). Host-only.
// Each rule's comment names its page in docs/decisions/, which holds the A/B that set it.
#pragma once

#include "moekit/plan.h"

namespace moekit::plan {

// The defaults of the settings that are plain numbers (PlanOverrides: -1 takes these).
constexpr int kGateUpTailPercent = 35;  // docs/decisions/experts_gate_up_tail.md
constexpr int kSharedFirstTokens = 32;  // docs/decisions/experts_shared_first.md
constexpr int kWholeTileTokens = 4;     // docs/decisions/experts_down_whole_tiles.md
constexpr int kDownSplitTokens = 8;     // docs/decisions/experts_down_split_rows.md
constexpr int kDownDeepTokens = 8;      // docs/decisions/experts_down_deep_ring.md
constexpr int kOneTokenRings = 1;       // docs/decisions/experts_one_token_rings.md
constexpr int kSelfRouteTokens = 1;     // docs/decisions/experts_self_route.md
constexpr int kSharedDenseTokens = 8;   // docs/decisions/shared_dense.md
constexpr int kMxGroupsTokens = 2;      // docs/decisions/mx_experts.md
constexpr int kBlockK = 64;             // the expert kernels' k block (elements)
constexpr double kGroupedTile64RowCost = 1.07;  // docs/decisions/experts_grouped_tile.md
constexpr int kGroupedTile64UpToTokens = 4096;  // docs/decisions/experts_grouped_gemms.md
constexpr double kGroupedFp8Tile64RowCost = 1.25;  // docs/decisions/experts_grouped_gemms.md
constexpr long long kMxWidenBytes = 512LL << 20;  // docs/decisions/mx_experts.md

// Tokens per task below tasks of 16 through the ring of weights only: 8 up to 256 tokens, else 16.
int experts_chunk(int tokens);

// The kernel family: bulk up to 256 tokens; above, regs-early for hidden >= 4096, else bulk
// with tasks of 16 where experts_task16_ring holds, else regs (docs/decisions/
// experts_stream_default.md).
Stream experts_stream_default(int hidden, int tokens, bool tasks_of_16);

// Whether the prefill path (grouped GEMMs on the tensor cores) runs the experts: from `setting`
// tokens when >= 0 (0: never), else from 64 tokens while experts average at least 4 routed
// tokens (tokens x top_k >= 4 x experts), 2 for fp8 block-scale experts
// (docs/decisions/experts_grouped_path.md).
bool experts_grouped_path(int tokens, int top_k, int experts, bool fp8, int setting);

// The same for MX experts, whose prefill path first widens every expert with rows to bf16: from
// `setting` tokens when >= 0 (0: never), else while experts average at least 24 routed tokens
// (tokens x top_k >= 24 x experts), where it overtakes the MX instances (docs/decisions/
// mx_experts.md).
bool experts_grouped_path_mx(int tokens, int top_k, int experts, int setting);

// The prefill path's tile rows, 128 or 64 (docs/decisions/experts_grouped_gemms.md), by the
// expected padded work: the routed experts' rows taken as Poisson of mean tokens x top_k /
// experts (each expert's last m-tile pads to the tile), the fused shared slots holding every
// token; a 64-row tile's row costs kGroupedTile64RowCost of a 128-row tile's in bf16
// (docs/decisions/experts_grouped_tile.md), kGroupedFp8Tile64RowCost in fp8. bf16 takes the
// 64-row tile at any rows up to kGroupedTile64UpToTokens tokens too (measured faster at every
// such batch of every model on the H200, also where neither tile pads), and the 128-row tile
// from tile128_from_rows routed rows an expert where the device sets it (> 0; the H100:
// DeviceInfo::grouped_tile128_from_rows).
int experts_grouped_tile_m(int tokens, int top_k, int experts, int shared_slots, bool fp8,
                           int tile128_from_rows);

// The prefill path's grouped GEMM instances (rows of grouped_gemm_kernels()) for the gate/up
// and the down GEMM: each setting when >= 0 (a row of the experts' dtype), else the instance of
// the dtype with experts_grouped_tile_m's rows for both (the 64-row ping-pong or the 128-row
// cooperative one; docs/decisions/experts_grouped_gemms.md).
struct GroupedGemms {
  int gate_up = -1, down = -1;
};
GroupedGemms experts_grouped_gemms(int tokens, int top_k, int experts, int shared_slots, bool fp8,
                                   int tile128_from_rows, int gate_up_setting, int down_setting);
// The expected rows a grouped GEMM computes with tiles of `tile_m` rows (the model above).
double experts_grouped_padded_rows(int tokens, int top_k, int experts, int shared_slots,
                                   int tile_m);

// The MX experts the prefill path widens to bf16 at a time: `setting` when >= 1, else as many as
// kMxWidenBytes of bf16 gate/up matrices ([2I, H]) hold, at least 1, at most `rows` (the weight
// rows) (docs/decisions/mx_experts.md).
int experts_grouped_mx_chunk(int rows, int hidden, int inter, int setting);

// The MX prefill GEMM: 0, experts widened to bf16 then the bf16 GEMMs (experts_grouped_mx_chunk),
// or 64 / 128, the GEMM that reads the packed bytes itself with that token tile. `setting` when
// >= 0; else the packed GEMM up to 128 routed tokens per expert, its tile of 128 from 64 of them
// (docs/decisions/mx_experts.md).
int experts_grouped_mx_tile(int tokens, int top_k, int experts, int setting);

// Whether the bulk kernels run tasks of up to 16 tokens through the ring of weights only, so that
// an expert of 9-16 tokens streams its weights once: from 9 tokens and `from` (setting, else 8)
// routed tokens per expert on average (docs/decisions/experts_task16_ring.md).
bool experts_task16_ring(int tokens, int top_k, int experts, int setting);

// Whether both bulk kernels take the ring of weights only at chunk 8: from 2 tokens, not below 8
// tokens with down rows of <= 2 KB, up to `setting` tokens, else while an expert's tasks are
// short: tokens x top_k <= 2 x experts, or <= 3 x experts up to 48 tokens
// (docs/decisions/experts_l2_acts_ring.md).
bool experts_l2_acts_ring(int tokens, int chunk, int inter, int top_k, int experts, int setting);

// Whether the bulk kernels keep re-read weight rows in L2 (chunk 8): from `setting` tokens for
// every hidden size, else from 32 tokens for hidden >= 5120 (docs/decisions/experts_l2_keep.md).
bool experts_l2_keep(int tokens, int hidden, int chunk, int setting);

// The % of the bulk down kernel's tiles taken dynamically (chunk 8): `setting`, else 20 from 2 to
// 128 tokens at hidden >= 7168 (docs/decisions/experts_down_tail.md).
int experts_down_tail(int tokens, int hidden, int chunk, int setting);

// Half items per CTA of the bulk gate/up kernel's tail (chunk 8): `setting`, else 1 up to 8
// tokens at hidden >= 7168, but none at one token with the one-token rings on
// (docs/decisions/experts_gate_up_half_items.md).
int experts_gate_up_half_items(int tokens, int hidden, int chunk, int setting, int one_token_rings);

// The bulk down kernel's weight rows in two copies: 2 when tokens <= split_tokens and a row is
// exactly 4 KB (k 2048), else 1 (docs/decisions/experts_down_split_rows.md).
int experts_down_copy_pieces(int tokens, int k, int split_tokens);

// The bulk down kernel's deep ring: tokens <= deep_tokens and rows of <= 2 KB (k <= 1024)
// (docs/decisions/experts_down_deep_ring.md).
bool experts_down_deep_ring(int tokens, int k, int deep_tokens);

// The fp8 down kernel's deep ring of weights only: rows of <= 2 KB (k <= 2048 e4m3 bytes) at
// every batch of the bulk kernels, unless deep_tokens is 0 (MOEKIT_EXPERTS_DOWN_DEEP=0)
// (docs/decisions/fp8_experts.md).
bool experts_down_deep_fp8_ring(int k, int deep_tokens);

// The fp8 one-token rings, where `enabled` (MOEKIT_EXPERTS_ONE_TOKEN_RING): at one token the
// stage carries the e4m3 activation row and the chunk's activation and weight scales, so the
// consumers read no global memory (Ring::Fp8OneToken for gate/up, Ring::Fp8OneTokenDeep for
// down rows of <= 2 KB). k a multiple of 512: each scale row's chunks are whole 16-byte copies
// (docs/decisions/fp8_experts.md).
bool experts_fp8_one_token_ring(Gemm gemm, int tokens, int k, int enabled);

// The one-token rings (docs/decisions/experts_one_token_rings.md), each where `enabled`: the
// down kernel's for rows of <= 1.5 KB (k <= 768) and for rows of exactly 4 KB (k 2048); the
// gate/up kernel's when it routes the token itself or rows are of several 4 KB chunks.
bool experts_down_one_token_ring(int tokens, int k, int enabled);
bool experts_down_wide_one_token_ring(int tokens, int k, int enabled);
bool experts_gate_up_one_token_ring(int tokens, int hidden, bool self_route, int enabled);

// The bulk down kernel's grid: one CTA per 16-row output tile when tokens <= whole_tile_tokens
// and that leaves at most 1/16 of the resident CTAs idle, else the resident grid
// (docs/decisions/experts_down_whole_tiles.md).
int experts_down_grid(int resident, int rows, int tokens, int whole_tile_tokens);

// Whether the unfused shared MLP as dense GEMMs beats its fused slots: once the fused slots'
// tasks of `chunk` tokens would stream the shared weights again 100 MB or more
// (docs/decisions/fuse_shared_auto.md).
bool experts_shared_dense_over_fused(int tokens, int chunk, long long shared_weight_bytes);

// Without the dense path: fuse, except several shared slots from 32 tokens
// (docs/decisions/fuse_shared_auto.md).
constexpr int kUnfusedFromTokensWithManySlots = 32;

// The index into expert_kernels() that runs a launch with these choices (the precedence of the
// bulk instances: a ring shape other than the standard one and the weights-only ring takes the
// place of the split copies, the L2 keep and the tail). Throws when no instance exists.
struct KernelChoice {
  Gemm gemm = Gemm::GateUp;
  int chunk = 8;
  Stream stream = Stream::Bulk;
  int k = 0;  // reduction length: hidden (gate/up) or the expert width (down)
  Ring ring = Ring::Standard;
  bool split_rows = false, l2_keep = false, down_tail = false, half_items = false;
  bool self_route = false;
  bool fp8 = false;  // fp8 block-scale weights: the fp8 instances (ring of weights only, no keep)
  ExpertFormat mx = ExpertFormat::Bf16;  // MX weights: the MX instances (their ring, chunk 8)
  bool consumer_groups = false;          // (MX) the consumer-groups instance, where there is one
};
int select_expert_kernel(const KernelChoice& c);

// Whether the bulk MX kernels run their consumer warps as two groups taking alternate items:
// MXFP4's from `from_tokens` tokens (0: never). At one token a CTA holds too few items for the
// groups' overlap to make up for each item's doubled time (docs/decisions/mx_experts.md).
bool experts_mx_consumer_groups(ExpertFormat f, int tokens, int from_tokens);

}  // namespace moekit::plan

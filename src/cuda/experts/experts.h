// The grouped expert op on the GPU (experts_kernel.cuh): for every task {expert, token chunk}
// produced by the dispatch, gate/up with the activation fused (h = act(x W1^T, x W3^T)), and down
// with the weighted combine fused (y = sum_slots w * h W2^T). Launch code apart from the kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <optional>

#include "cuda/routing/routing.h"
#include "moekit/spec.h"

namespace moekit::cuda {

struct ExpertsParams {
  // weights: expert e's matrix starts at w + e * w_expert_stride (elements), row-major
  //   gate/up: [2*inter, k] (gate rows [0,inter), up rows [inter,2*inter));  down: [rows, k]
  const __nv_bfloat16* w = nullptr;
  long long w_expert_stride = 0;
  const float* bias = nullptr;  // gate/up: [2*inter] per expert; down: [rows]; or null
  long long bias_expert_stride = 0;
  int inter = 0;  // gate/up: intermediate width I of one expert (or of the unfused shared MLP)
  int rows = 0;   // output rows per expert: inter (gate/up) or H (down)
  int k = 0;      // reduction length: H (gate/up) or inter (down); multiple of 64
  // activations: row of pair q is x + (q / x_row_div) * k
  const __nv_bfloat16* x = nullptr;
  int x_row_div = 1;
  // dispatch
  const int* pair_list = nullptr;
  const ExpertTask* tasks = nullptr;
  const int* num_tasks = nullptr;  // device
  // entries of tasks / pair_list the bulk kernel may read ahead of *num_tasks (initialised
  // memory); <= 32 of them are loaded with the task count and looked up by shuffles; 0: fetch
  int task_capacity = 0;
  int pair_capacity = 0;
  int* work_counter = nullptr;     // device, zeroed by the dispatch
  // bulk gate/up kernel: the last dynamic_tail_percent % of the items are not in the CTAs'
  // static ranges but taken from work_counter by the CTAs that finish their ranges first
  int dynamic_tail_percent = 0;
  // bulk down kernel: each 4 KB weight row copied in this many pieces, 1 or 2 (2: its kernel
  // instance with two copies per row; why, and why 4 KB rows only: experts_down_split_tokens)
  int weight_copy_pieces = 1;
  // bulk kernels at chunk 8, the ring's shape (each its own kernel instance), else 0 (the
  // standard ring). Down: 1 the deep ring, 4 stages of 2 KB chunks instead of 2 of 4 KB (why:
  // experts_down_deep_tokens); 2 the one-token ring, 8 stages of 1.5 KB chunks with one
  // activation row each, a tile's rows one copy (experts_down_one_token_ring); 3 the one-token
  // ring of 4 KB rows, 3 stages of one 64 KB copy and one activation row
  // (experts_down_wide_one_token_ring). Gate/up: 3 its one-token ring, 3 stages of 4 KB chunks
  // with one activation row, a tile's gate rows and up rows one copy each where a row is one
  // chunk (experts_gate_up_one_token_ring). Both: 4 the ring of weights only, 3 stages of 4 KB
  // chunks with no activation rows, the consumer warps loading their activation fragments from
  // global memory (L2) themselves (experts_l2_acts_ring; its own instances, with the L2-keeping and
  // dynamic-tail twins). At chunk 16 only 4 exists (tasks of up to 16 tokens through the same
  // stages, experts_task16_ring), else the ring is ignored there.
  int ring = 0;
  // bulk kernels at chunk 8: 1 for their instance that copies the weight rows of a task whose
  // expert has a next task (ExpertTask::more: that task's item reads the same rows next) with
  // normal L2 priority instead of evict-first (why: experts_l2_keep), else 0. The split-row and
  // deep-ring instances take precedence (they exist at <= 8 tokens, where no task has a next);
  // the persistent variant's one launch (experts_bulk_fused_kernel) has no such instance.
  int l2_keep = 0;
  // bulk down kernel with a combine (tile_counters set) at chunk 8: the % of its 16-row output
  // tiles whose items are not in the CTAs' static ranges but taken one by one from work_counter
  // by the CTAs that finish their ranges first, and combined once every CTA has written its
  // partials (its own kernel instance; why: experts_down_tail). tile_counters then has one more
  // word, the CTAs done. 0: none (every item static)
  int down_tail_percent = 0;
  // bulk gate/up kernel at chunk 8 without the L2 keep: the last half_items_per_cta x grid items
  // of its dynamic tail are claimed as two halves each (4 of the tile's 8 h rows; its own kernel
  // instance; why: experts_gate_up_half_items). 0: whole items only
  int half_items_per_cta = 0;
  // bulk gate/up with the shared experts fused: their number S (ids first_shared_expert..+S-1,
  // slots top_k..top_k+S-1 of every token; tokens and slots below), whose items are issued
  // before the kernel waits for the dispatch (they need nothing from it); 0: none early
  int early_shared = 0;
  int first_shared_expert = 0;
  // bulk gate/up at one token without shared experts, E <= 128: 1 when no routing kernel runs
  // before it, and the kernel routes its token itself from the logits (`route`: the routing
  // kernel's params, whose routing and dispatch its CTA 0 writes for the down kernel; its own
  // instance; why: experts_self_route_tokens), else 0
  int self_route = 0;
  RoutingParams route;
  // (self_route: its CTAs done claiming from work_counter, which its last CTA zeroes with this)
  int* self_route_ctas_done = nullptr;
  // gate/up output h [pairs, inter] bf16 and activation
  __nv_bfloat16* h = nullptr;
  Activation activation = Activation::Silu;
  float limit = 0.0f, alpha = 1.702f, beta = 1.0f;
  // down output: fp32 partial [pairs, rows] (unweighted expert output, bias included)
  float* partial = nullptr;
  // combine (down only; null tile_counters = no combine): y[t] = sum_s w[t,s] * partial[t*slots+s]
  // (+ shared_scale[t] * shared_partial[t]) in slot order, bf16 out. rows / 16 tile counters
  // (+ 1 with down_tail_percent), zeroed by the dispatch
  int* tile_counters = nullptr;
  int tokens = 0;
  int slots = 0;
  const float* slot_weights = nullptr;
  const float* shared_partial = nullptr;
  const float* shared_scale = nullptr;
  __nv_bfloat16* y = nullptr;
  unsigned long long* trace = nullptr;  // timeline (cuda/layer/trace.cuh; bulk kernel) or null
};

// Kernel variants: gate/up or down; tokens per task (chunk 8 or 16); how weights are streamed.
enum class ExpertsKind { GateUp, Down };
enum class ExpertsStream {
  Registers,           // experts_kernel.cuh: kUnroll k blocks of weights per warp in registers,
                       // activations loaded right before their mma, dynamic work items
  RegistersEarlyActs,  // the same kernel, activations loaded with the weights (fewer weights
                       // in flight; faster than Registers with large experts)
  Bulk,                // experts_bulk_kernel.cuh: producer warps stream weights and
                       // activations by bulk copies (TMA) into a shared-memory ring, 8 warps
                       // compute, an epilogue warp writes the outputs and combines
  Persistent,          // the same warps, gate/up and down in ONE persistent grid
                       // (launch_experts_fused): a CTA moves from its gate/up items to its down
                       // items, each waiting for its task's h; no boundary, one launch less
};

// Tokens per task (8 or 16) for `tokens` tokens per forward: the dispatch's chunk and the variant.
// MOEKIT_EXPERTS_CHUNK=8|16 overrides. (The bulk kernels may take chunk 16 below 256 tokens too:
// experts_task16_ring.)
int experts_chunk(int tokens);
// The fewest routed tokens per expert, on average (tokens x top_k / experts), at which the bulk
// kernels run tasks of up to 16 tokens through the ring of weights only (experts_task16_ring):
// MOEKIT_EXPERTS_TASK16=N when set (0: never; read at each call; layers call once, at creation),
// else -1: the measured rule.
int experts_task16_setting();
// Whether a forward of `tokens` tokens through the bulk kernels runs chunk 16 with
// ExpertsParams::ring 4 (BulkShape<2, 4>): tasks of up to 16 tokens, so that an expert with 9-16
// tokens streams its weights once, not twice (the second time mostly from L2, but through the
// same ring: a task's time is its weight bytes). For `experts` routed experts of which each
// token takes `top_k`; from 9 tokens (8 fill one chunk-8 task), and at least `setting` (when
// >= 0) or the rule's routed tokens per expert on average. (The layer asks only where the bulk
// kernels run: experts_stream_default, or MOEKIT_EXPERTS_KERNEL=bulk.)
bool experts_task16_ring(int tokens, int top_k, int experts, int setting);
// The bulk gate/up kernel's dynamic tail (ExpertsParams::dynamic_tail_percent):
// MOEKIT_EXPERTS_TAIL=0..100 when set (read at each call; layers call once, at creation), else
// the measured default.
int experts_dynamic_tail_percent();
// The most tokens at which the bulk down kernel copies its weight rows in two pieces
// (ExpertsParams::weight_copy_pieces): MOEKIT_EXPERTS_DOWN_SPLIT=0.. when set (0: never; read at
// each call; layers call once, at creation), else the measured default.
int experts_down_split_tokens();
// The bulk down kernel's ExpertsParams::weight_copy_pieces at `tokens` tokens for a reduction
// length of `k` (the expert width): 2 when tokens <= split_tokens and a row is one 4 KB chunk
// (k == 2048; it then goes as two 2 KB copies), else 1.
int experts_down_copy_pieces(int tokens, int k, int split_tokens);
// The most tokens at which the bulk down kernel streams rows of <= 2 KB through the deep ring
// (ExpertsParams::ring 1): MOEKIT_EXPERTS_DOWN_DEEP=0.. when set (0: never; read at each
// call; layers call once, at creation), else the measured default.
int experts_down_deep_tokens();
// Whether the bulk down kernel takes the deep ring at `tokens` tokens for a reduction length of
// `k` (the expert width): tokens <= deep_tokens and a row fits one 2 KB chunk (k <= 1024).
bool experts_down_deep_ring(int tokens, int k, int deep_tokens);
// MOEKIT_EXPERTS_ONE_TOKEN_RING=0|1 when set (0: never), else 1 (the measured default): the
// one-token rings of both bulk kernels. Read at each call; layers call once, at creation.
int experts_one_token_ring_setting();
// Whether the bulk down kernel's deep ring is its one-token shape (ExpertsParams::ring 2):
// enabled, one token, and a row fits one 1.5 KB chunk (k <= 768).
bool experts_down_one_token_ring(int tokens, int k, int enabled);
// Whether the bulk down kernel takes its one-token ring of 4 KB rows (ExpertsParams::ring 3, in
// place of the split instance): enabled, one token, and rows of exactly 4 KB (k 2048).
bool experts_down_wide_one_token_ring(int tokens, int k, int enabled);
// Whether the bulk gate/up kernel takes its one-token ring (ExpertsParams::ring 3; chunk 8, not
// with the L2 keep): enabled, one token, and the kernel routes the token itself (self_route) or
// rows are of several 4 KB chunks (hidden > 2048).
bool experts_gate_up_one_token_ring(int tokens, int hidden, bool self_route, int enabled);
// The most tokens at which both bulk kernels take their ring of weights only (ExpertsParams::ring
// 4): MOEKIT_EXPERTS_L2_ACTS=0.. when set (0: never; read at each call; layers call once, at
// creation), else -1: the measured rule of experts_l2_acts_ring.
int experts_l2_acts_tokens();
// Whether both bulk kernels take their ring of weights only at `tokens` tokens per forward, chunk
// `chunk`, for `experts` routed experts of width `inter` (the down kernel's k) of which each token
// takes `top_k`: chunk 8, from 2 tokens (one token has its own rings), not below 8 tokens with
// down rows of <= 2 KB (where the down kernel's deep ring runs: Qwen3-30B-A3B lost there), and up
// to l2_acts_tokens tokens when that is >= 0, else (the default) while an expert's tasks are
// short: at most 2 routed tokens per expert on average (tokens x top_k <= 2 x experts), or 3 up
// to 48 tokens. In place of the standard ring, the down kernel's deep ring and split copies and
// the gate/up half items.
// Why: a stage of the standard ring holds 8 activation rows beside its 16 weight rows (a third
// of its bytes), so 2 stages fit; without them 3 stages of weights do, 192 KB in flight per SM
// instead of 128 (what the one-token rings gained from, session 16), and the consumers'
// activation loads from L2 are few (16 bytes x 2 per k block and lane). With more tokens per task
// it loses; why is open (not the consumers' wait for their loads' L2 round trip at every stage:
// those loads issued a stage ahead, ring 5, did not help; s18 run 1). Measured on the H200 against
// the standard rings, same runs (bench/results/h200/2026-12-01-s17-experiments runs 6-7 at 2-32
// tokens, 2026-12-01-s18-experiments runs 1-3 above and for wide rows):
// - DeepSeek-V3 -2.1 / -1.7 / -1.5 / -1.5 / -1.9% at 2 / 4 / 8 / 16 / 32 tokens, -2.5 / -2.1 /
//   -1.2 / -0.2% at 40 / 48 / 64 / 96, +1.0% at 128 (4 tokens per expert);
// - Kimi-K2 -1.6 / -0.8% at 16 / 32, -2.6 / -2.4 / -1.7 / -1.0% at 40 / 48 / 64 / 96;
// - GLM-5 -2.4 / -1.2 / -0.4% at 48 / 64 / 96; DeepSeek-V4-Flash -1.1 / -0.3 / +0.8%, MiniMax-M2
//   -0.2 / -0.2 / +0.1% there;
// - GLM-4.5 (3 KB down rows) -0.2..-1.2% at 2-32, -0.7 / -0.5 / +0.2 / +2.1% at 40 / 48 / 64 / 96;
// - Qwen3-30B-A3B (1.5 KB down rows) -2.2 / -1.4 / -1.2% at 8 / 16 / 32, -1.4 / -1.3 / -0.9 /
//   +0.7% at 40 / 48 / 64 / 96, but +6.9 / +5.0% at 2 / 4 (hence the rows' exception);
//   Qwen3-235B-A22B -0.1 / +0.5 / +2.3% at 48 / 64 / 96;
// - down rows of more than 4 KB, two to seven 4 KB chunks a row (run 3, fused where the model has
//   shared experts): gpt-oss-120b -1.6 / -2.2 / -1.2 / -1.1% at 2 / 8 / 32 / 64, MiniMax-M3 -4.3
//   / -2.3 / -1.4 / -0.9%, Qwen2-57B-A14B -3.4 / -1.3% at 2 / 8, Mixtral-8x7B -6.1 / -1.9% at 2 /
//   8 but +4.9% at 32 (8 tokens per expert); this rule against the one before (run 4, `auto`):
//   Mixtral -8.3 / -7.5 / -5.2 / -1.8% at 2 / 4 / 8 / 12, Qwen2-57B-A14B -5.3 / -3.0 / -4.7 /
//   -7.7% at 2 / 8 / 16 / 24, gpt-oss-120b -0.9 / -1.4 / -1.7 / -1.7% and MiniMax-M3 -2.9 / -1.6
//   / -2.6 / -1.1% at 2 / 8 / 32 / 64.
// Every measured cell the rule takes gained; of those it leaves out, Qwen3-30B-A3B at 64 tokens
// gained more than 0.5% (-0.9%), and Qwen2-57B-A14B fused at 32 (-6.9%; `auto` runs it unfused).
bool experts_l2_acts_ring(int tokens, int chunk, int inter, int top_k, int experts,
                          int l2_acts_tokens);
// The fewest tokens at which the bulk kernels keep re-read weight rows in L2, forced for every
// hidden size: MOEKIT_EXPERTS_L2_KEEP_FROM=N when set (0: never), else -1 (the measured rule of
// experts_l2_keep). Read at each call; layers call once, at creation.
int experts_l2_keep_from_tokens();
// ExpertsParams::l2_keep for a forward of `tokens` tokens at `chunk` tokens per task through
// experts whose gate/up reduction length is `hidden`: with forced_from >= 0 (the variable set),
// tokens >= forced_from > 0; else tokens >= 32 and hidden >= 5120. Chunk 8 only.
bool experts_l2_keep(int tokens, int hidden, int chunk, int forced_from);
// The % of the bulk down kernel's output tiles taken dynamically (ExpertsParams::
// down_tail_percent), forced for every hidden size and batch:
// MOEKIT_EXPERTS_DOWN_TAIL=0..100 when set (0: never), else -1 (the measured rule of
// experts_down_tail). Read at each call; layers call once, at creation. (The deep-ring instance
// has no dynamic-tail twin: where it runs, the down kernel keeps static ranges.)
int experts_down_tail_percent_setting();
// ExpertsParams::down_tail_percent of the routed down launch (the one with the combine) at
// `tokens` tokens, `chunk` tokens per task, for experts whose down output has `hidden` rows:
// with forced >= 0 (the variable set), forced; else 20 from 2 to 128 tokens at hidden >= 7168;
// chunk 8 only. Why a dynamic tail: the down CTAs' static ranges end up to
// ~100 us apart at 32-128 tokens (their stream rates differ, and not by SM: session 12's CTA
// trace). Measured on the H200, 20% against none, same run (bench/results/h200/2026-11-30-s12-
// experiments): DeepSeek-V3 and Kimi-K2 -1.4..-1.7% at 16-32 tokens, -0.4..-0.5% at 64, equal
// at 128, +0.9..+1.5% at 256 (run 3, the 4.63 TB/s kind); -0.2..-0.8% at 9-64 (run 4, the 4.53
// kind); GLM-5, MiniMax-M3 (6144) within 0.2% at 16-64 (run 4); GLM-4.5 (5120) equal at 16,
// +0.4..+2.6% from 32, Qwen3-30B-A3B (2048) +2.5..+8% everywhere (run 3: small items, so the
// claims and the tail's wait for every CTA weigh more). Session 13 (bench/results/h200/
// 2026-11-30-s13-experiments, 20% against none): at 65-128 tokens DeepSeek-V3 and Kimi-K2
// -0.3..-0.7% (80, 96, 112; 128 0..-0.3%), 192-256 equal or worse; at 2-8 tokens, where the
// split-row instance runs (its kTail twin), DeepSeek-V3 -0.9..-1.9%, Kimi-K2 -0.4..-1.0%, but at
// 1 token +1.1..+1.3% for both (the wait for every CTA against a ~200 us layer).
int experts_down_tail(int tokens, int hidden, int chunk, int forced);
// MOEKIT_EXPERTS_HALF_ITEMS=0..16 when set, else -1 (the measured rule of
// experts_gate_up_half_items). Read at each call; layers call once, at creation.
int experts_gate_up_half_items_setting();
// ExpertsParams::half_items_per_cta of the gate/up launches at `tokens` tokens, `chunk` tokens per
// task, for experts of hidden size `hidden` (the caller leaves it 0 with the L2 keep, which has
// no half-item instance): with forced >= 0, forced; else 1 at <= 8 tokens for hidden >= 7168,
// but not at one token with the one-token rings on (one_token_ring: their setting); chunk 8 only.
// Why: the gate/up CTAs end 7.7-12 us apart at one token (DeepSeek-V3, session 12), their last
// claimed items being 16 rows x 14 KB, ~6.7 us of one CTA's stream, claimed three items ahead.
// Measured on the H200, 1 against 0, same run (bench/results/h200/2026-11-30-s13- experiments, two
// H200s): DeepSeek-V3 T=1 -0.1..-0.6%, T=2 -0.6..-1.6%, T=4 -1.8..-2.2%, T=8 -0.5..-2.0%, T=16
// equal; Kimi-K2 T=1-8 -0.6..-1.8%; Qwen3-30B-A3B (2048) +0.4..+1.5% at 1-16 (2 per CTA: +2..+3%).
// With the gate/up one-token ring (bench/results/h200/2026-12-01-s16- experiments, run 8, 1 against
// 0 twice): DeepSeek-V3 T=1 +0.5%, Kimi-K2 +0.4%.
int experts_gate_up_half_items(int tokens, int hidden, int chunk, int forced, int one_token_ring);
// The most tokens at which the bulk gate/up kernel issues the fused shared experts' items before
// its wait for the dispatch: MOEKIT_EXPERTS_SHARED_FIRST=0.. when set (0: never; read at each
// call; layers call once, at creation), else the measured default.
int experts_shared_first_tokens();
// The fewest tokens from which the layer's unfused shared MLP runs as two dense cuBLAS GEMMs
// (src/cuda/layer/shared_dense.h: its weights stream once) in place of the expert kernels (which
// stream them once per task of <= 8 tokens): MOEKIT_SHARED_DENSE=0.. when set (0: never; read at
// each call; layers call once, at creation), else the measured default, 8.
int experts_shared_dense_tokens();
// Whether the shared MLP as dense GEMMs beats its fused slots at `tokens` (tasks of `chunk`
// tokens; the shared MLP's weights shared_weight_bytes): by the bytes the fused slots stream
// again from L2 (fuse_shared = auto's rule where the dense path is available).
bool experts_shared_dense_over_fused(int tokens, int chunk, long long shared_weight_bytes);
// The most tokens (0 or 1) at which the layer runs no routing kernel for models without shared
// experts (E <= 128): the bulk gate/up kernel routes its one token from the logits itself
// (route_token, the routing kernel's code: the same ids), each CTA for its producers, CTA 0 also
// writing the ids, weights and dispatch for the down kernel; 3 launches per layer.
// MOEKIT_EXPERTS_SELF_ROUTE=0|1 when set (read at each call; layers call once, at creation),
// else 1. Why: Qwen3-30B-A3B T=1 spent ~6 us before its gate/up kernel streamed (router 1.8 us,
// the routing kernel's dispatch written at 5.6, the gate/up wait at 6.1-6.7: session 13's
// trace); self-routed, its gate/up wait returns at 2.6-2.8. Measured on the H200, same run
// (bench/results/h200/2026-11-30-s14-experiments, run 3): Qwen3-30B-A3B T=1 31.55 -> 30.3 us
// (-4.0%), Qwen3-235B-A22B 85.3 -> 84.2 (-1.3%), gpt-oss-120b 63.0 -> 62.25 (-1.2%), Mixtral
// 183.65 -> 183.8 (equal). With static ranges only (no dynamic tail) Mixtral lost 1.7% and
// gpt-oss 0.3% (run 1): hence the kernel's own work counter (DispatchCounters::self_route_work).
int experts_self_route_tokens();
// The most tokens at which the bulk down kernel may run one CTA per 16-row output tile
// (experts_down_grid): MOEKIT_EXPERTS_WHOLE_TILES=0.. when set (0: never; read at each call;
// layers call once, at creation), else the measured default.
int experts_whole_tile_tokens();
// The bulk down kernel's grid for `rows` output rows at `tokens` tokens: the `resident` grid, or
// one CTA per 16-row tile (rows / 16 CTAs) when tokens <= whole_tile_tokens and that leaves at
// most 1/16 of the resident CTAs idle. why: a CTA's contiguous range then holds whole tiles, so
// it combines them itself and no tile waits on the counter's fence and atomic (two dependent L2
// round trips at the CTA's end, when the batch is too small to hide them).
int experts_down_grid(int resident, int rows, int tokens, int whole_tile_tokens);
// MOEKIT_EXPERTS_KERNEL=regs|regs-early|bulk|persistent when set (read at each call; layers call
// once, at creation), else nullopt: the measured default applies.
std::optional<ExpertsStream> experts_stream_override();
// The measured default variant for experts of hidden size `hidden` at `tokens` tokens per forward,
// where tasks_of_16 says whether experts_task16_ring holds: the bulk kernels up to 256 tokens;
// above, the register kernels with the activations loaded early for hidden >= 4096, else the bulk
// kernels with tasks of 16 tokens (or the register kernels, if tasks of 16 do not apply).
ExpertsStream experts_stream_default(int hidden, int tokens, bool tasks_of_16);
constexpr int kExpertsStreams = 4;  // ExpertsStream values, for per-variant tables
// Persistent grid size (SMs x resident CTAs) of a variant on the current device; also raises the
// variant's dynamic shared-memory limit. k: the reduction length the launches will have (the
// variant, and its CTAs per SM, depend on it); launch_experts picks the variant from p.k, and
// any grid size is correct (work items are taken dynamically), a mismatched one only slower.
int experts_grid(ExpertsKind kind, int chunk, ExpertsStream stream_kind, int k);
// Persistent is launched by launch_experts_fused; launch_experts runs it as Bulk (the unfused
// shared MLP's separate GEMMs).
void launch_experts(ExpertsKind kind, int chunk, ExpertsStream stream_kind,
                    const ExpertsParams& p, int grid, cudaStream_t stream);

// The Persistent variant's grid: every CTA resident at once (it spins on other CTAs' progress),
// so the SMs x resident CTAs of the fused kernel; also raises its shared-memory limit.
int experts_fused_grid(int chunk);
// Gate/up (gu) and down (dn, with its combine) of the same dispatch in one launch. task_done:
// one int per task, zeroed by the dispatch (RoutingParams::task_done). The gate/up items are
// dealt round-robin in task order (tasks finish one after another, so down items find their
// h early), or with MOEKIT_FUSED_GATE_UP_ORDER=ranges in the gate/up kernel's contiguous
// ranges (read once per process, for measurements).
void launch_experts_fused(int chunk, const ExpertsParams& gu, const ExpertsParams& dn,
                          int* task_done, int grid, cudaStream_t stream);

}  // namespace moekit::cuda

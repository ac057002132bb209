// The layer plan: every choice a GPU forward of the MoE layer makes, computed by host code that
// builds without CUDA (src/plan/), into a plain struct that prints in one line per kernel and
// serialises to JSON. The forward executes a plan; it does not decide (src/cuda/layer/).
//
//   plan_layer(spec, tokens, fuse, overrides, device, experts' dtype)
//     -> fused or unfused (and why), the router GEMM config, the routing launch (or the gate/up
//        kernel routing its one token itself), the dense shared MLP, and per expert launch: the
//        kernel instance (expert_kernels(): one table of named fields), its grid and parameters.
//
// Each rule lives in src/plan/expert_rules.cpp with a comment naming its page in docs/decisions/
// (the A/B that set it). Overrides force one rule each: a benchmark's or a test's knob; the
// environment fills them in one place (plan_overrides_from_env, called by the CLI).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "moekit/layer.h"
#include "moekit/spec.h"
#include "moekit/tuning.h"

namespace moekit::plan {

// ---- the expert-kernel instances ----

enum class Gemm : uint8_t { GateUp, Down };
const char* gemm_name(Gemm g);  // "gate_up", "down"

// How a kernel streams the weights (src/cuda/experts/).
enum class Stream : uint8_t {
  Bulk,                // producer warps bulk-copy weights (and activations) into a shared-memory
                       // ring, 8 consumer warps run the mma, an epilogue warp stores and combines
  Registers,           // weights in registers, activations loaded right before their mma
  RegistersEarlyActs,  // weights in registers, activations loaded with the weights
  Grouped,             // the prefill path (src/cuda/prefill/): the pairs permuted by expert,
                       // CUTLASS grouped GEMMs on the tensor cores (TMA, wgmma), a combine
};
const char* stream_name(Stream s);  // "bulk", "regs", "regs-early", "grouped"
std::optional<Stream> parse_stream(const std::string& s);  // nullopt when not a name

// The bulk kernels' shared-memory ring (each shape its own layout, src/cuda/experts/).
enum class Ring : uint8_t {
  Standard,         // chunk 8: 2 stages of 16 weight rows x 4 KB + 8 activation rows;
                    // chunk 16: 5 stages of 16 x 1 KB + 16 activation rows
  Deep,             // down, rows <= 2 KB: 4 stages of 16 x 2 KB + 8 activation rows
  OneTokenNarrow,   // down, one token, rows <= 1.5 KB: 8 stages of 16 x 1.5 KB + one activation
                    // row, unpadded: a tile's rows one copy
  OneToken,         // one token: 3 stages of 16 x 4 KB + one activation row, unpadded (gate/up;
                    // down rows of exactly 4 KB: a tile's 16 rows one 64 KB copy)
  WeightsOnly,      // 3 stages of 16 x 4 KB weights only; the consumer warps load their
                    // activation fragments from L2 (chunk 16: both n-tiles on every fragment)
  WeightsOnlyDeep,  // fp8 down, rows <= 2 KB: 6 stages of 16 x 2 KB weights only
  Fp8OneToken,      // fp8 gate/up, one token: 3 stages of 16 x 4 KB + the e4m3 activation row
                    // + the chunk's activation and weight scales, unpadded
  Fp8OneTokenDeep,  // fp8 down, one token, rows <= 2 KB: 6 stages of 16 x 2 KB + the same
  MxWeightsOnly,    // MXFP8 / MXFP4 (gate/up and down): 6 stages of 16 x 2 KB packed weights
                    // + the chunk's e8m0 scale bytes; activations from L2
};
const char* ring_name(
    Ring r);  // "standard", "deep", "one-token-narrow", "one-token", "weights-only",
              // "weights-only-deep", "fp8-one-token", "fp8-one-token-deep", "mx-weights-only"

// One compiled kernel instance. The fields a family does not use keep their defaults.
struct ExpertKernel {
  const char* name = "";
  Gemm gemm = Gemm::GateUp;
  Stream stream = Stream::Bulk;
  int n_tiles = 1;  // 8-token n-tiles per task: 1 (tasks of <= 8 tokens) or 2 (<= 16)
  // bulk
  Ring ring = Ring::Standard;
  bool split_rows = false;  // down: 4 KB weight rows copied as two 2 KB pieces
  bool l2_keep = false;     // rows the expert's next task re-reads copied at normal L2 priority
  bool down_tail = false;   // down: the last tiles' items claimed dynamically, combined last
  bool half_items = false;  // gate/up: the last tail items claimed as two halves
  bool self_route = false;  // gate/up: routes its one token itself (no routing kernel)
  // bulk, ring of weights only: fp8 block-scale weights (e4m3, an fp32 multiplier per 128 x 128
  // tile) computed W8A8: the consumers quantise their activations per token per 128 channels
  // and run e4m3 mma, each 128-wide k block scaled by its weight and activation scales
  bool fp8 = false;
  // bulk, Ring::MxWeightsOnly: OCP MX weights (Mxfp8: e4m3, Mxfp4: e2m1 pairs; an e8m0 exponent
  // per 32 input elements of a row) computed W8A16 / W4A16: the consumers dequantise each weight
  // to its exact bf16 in registers and run the bf16 mma on bf16 activations. Bf16: not MX.
  ExpertFormat mx = ExpertFormat::Bf16;
  // bulk MXFP4: the consumer warps as two groups of four that take alternate items (each warp
  // with twice a stage's blocks), where a ring slot's fills stay one group's; else one group
  bool consumer_groups = false;
  // registers
  int unroll = 0;       // k blocks of 64 in flight per warp
  int warps = 11;       // threads / 32 (bulk: 8 consumers, 2 producers, 1 epilogue)
  int ctas_per_sm = 1;  // resident CTAs per SM (checked on the device at layer creation)
};

// Every instance, in one table (src/plan/expert_kernels.cpp); the CUDA sources instantiate
// exactly these (src/cuda/experts/experts_instances.cuh).
std::span<const ExpertKernel> expert_kernels();
// The index of the instance with these fields (name ignored), or -1.
int find_expert_kernel(const ExpertKernel& fields);
// One line: "bulk_down_weights_only_tail: down bulk n_tiles=1 ring=weights-only down_tail".
std::string describe(const ExpertKernel& k);

// ---- the prefill path's grouped GEMM instances (src/cuda/prefill/) ----

// How the consumer warpgroups of a CUTLASS sm90 grouped GEMM share the work.
enum class GroupedSchedule : uint8_t {
  Cooperative,  // both warpgroups on one tile (tile_m / 2 rows each)
  Pingpong,     // each warpgroup its own tile, one's epilogue under the other's mainloop
};
const char* grouped_schedule_name(GroupedSchedule s);  // "coop", "pingpong"

// One compiled grouped GEMM instance: D_g = A_g . B_g^T for every group (an expert's rows),
// TMA loads, wgmma, a persistent scheduler over (group, m-tile, n-tile).
struct GroupedGemmKernel {
  const char* name = "";
  bool fp8 = false;  // e4m3 A and B with one fp32 scale per 128 K (A: per row; B: per 128 x 128
                     // tile), W8A8; else bf16
  int tile_m = 128;  // rows of an expert per tile (its last m-tile pads to it)
  int tile_n = 256;
  int tile_k = 64;
  GroupedSchedule schedule = GroupedSchedule::Cooperative;
  int cluster_m = 1;  // CTAs of one cluster along M: each B tile multicast to them
  int cluster_n = 1;  // along N: each A tile multicast to them
};

// Every grouped GEMM instance, in one table (src/plan/grouped_gemm_kernels.h); the CUDA sources
// instantiate exactly these (src/cuda/prefill/prefill_gemm_instance.cuh, a .cu per row).
std::span<const GroupedGemmKernel> grouped_gemm_kernels();
// The index of the instance named `name`, or -1.
int find_grouped_gemm(const std::string& name);
// One line: "grouped_bf16_128x256_coop: bf16 tile 128x256x64 coop cluster 1x1".
std::string describe(const GroupedGemmKernel& k);

// ---- inputs ----

// Device facts the plan needs: a named profile or the live GPU (cuda::live_device_info()).
struct DeviceInfo {
  std::string name = "sm90";
  int sms = 132;
  tuning::Arch arch = tuning::Arch::Sm90;
  // bf16 prefill: the 128-row grouped GEMM tile from this many routed rows an expert, 0 = the
  // tile rule alone; measured on the GPU of the name (with_measured_facts)
  int grouped_tile128_from_rows = 0;
};
// "sm90" (H100/H200 SXM: 132 SMs), "h100" (sm90 with the facts measured on the H100 80GB HBM3)
// and "sm100" (B200: 148 SMs); throws naming the known ones.
DeviceInfo device_profile(const std::string& name);
// `d` with the facts measured on the GPU its name names (cudaDeviceProp::name, e.g. "NVIDIA H100
// 80GB HBM3"); a GPU measured for none keeps d's (docs/decisions/experts_grouped_gemms.md).
DeviceInfo with_measured_facts(DeviceInfo d);

// Each field forces one rule (-1: the rule decides). Filled by the caller; the library reads no
// environment. The README's options table lists the matching MOEKIT_* variables.
struct PlanOverrides {
  std::optional<Stream> stream;   // MOEKIT_EXPERTS_KERNEL: one kernel family at every batch
  int grouped_from_tokens = -1;   // MOEKIT_EXPERTS_GROUPED_FROM: the prefill path from N (0: never)
  int grouped_gate_up = -1;       // MOEKIT_EXPERTS_GROUPED_GEMM: its gate/up GEMM's instance (a
  int grouped_down = -1;          // row of grouped_gemm_kernels()), and its down GEMM's
  int grouped_mx_chunk = -1;      // MOEKIT_EXPERTS_MX_CHUNK: MX experts it widens at a time (>= 1)
  int grouped_mx_tile = -1;  // MOEKIT_EXPERTS_MX_GEMM: 0 widen, 64 / 128 the packed GEMM's tile
  int gate_up_tail_percent = -1;  // MOEKIT_EXPERTS_TAIL: the gate/up kernel's dynamic tail
  int shared_first_tokens = -1;   // MOEKIT_EXPERTS_SHARED_FIRST (0: never)
  int whole_tile_tokens = -1;     // MOEKIT_EXPERTS_WHOLE_TILES (0: never)
  int down_split_tokens = -1;     // MOEKIT_EXPERTS_DOWN_SPLIT (0: never)
  int down_deep_tokens = -1;      // MOEKIT_EXPERTS_DOWN_DEEP (0: never)
  int one_token_rings = -1;       // MOEKIT_EXPERTS_ONE_TOKEN_RING: 0 or 1
  int weights_only_tokens = -1;   // MOEKIT_EXPERTS_L2_ACTS: the ring of weights only up to N
  int l2_keep_from_tokens = -1;   // MOEKIT_EXPERTS_L2_KEEP_FROM: every hidden size from N
  int down_tail_percent = -1;     // MOEKIT_EXPERTS_DOWN_TAIL: every hidden size and batch
  int half_items_per_cta = -1;    // MOEKIT_EXPERTS_HALF_ITEMS: every hidden size
  int self_route_tokens = -1;     // MOEKIT_EXPERTS_SELF_ROUTE: 0 or 1
  int task16_from = -1;           // MOEKIT_EXPERTS_TASK16: routed tokens per expert (0: never)
  int shared_dense_tokens = -1;   // MOEKIT_SHARED_DENSE: dense shared MLP from N (0: never)
  int mx_groups_tokens = -1;  // MOEKIT_EXPERTS_MX_GROUPS: MXFP4 consumer groups from N (0: never)
  bool pdl = true;                // MOEKIT_PDL=0: launch without programmatic dependent launch
  bool print = false;             // MOEKIT_PRINT_CONFIG=1: print each plan once (stderr)
  friend bool operator==(const PlanOverrides&, const PlanOverrides&) = default;
};
// The MOEKIT_* variables above, each checked ("MOEKIT_EXPERTS_TAIL='x' (expected a percentage,
// 0 to 100)"); unset or empty leaves the field as it is in `base`.
PlanOverrides plan_overrides_from_env(PlanOverrides base = {});

// ---- the plan ----

struct ExpertLaunch {
  const char* role = "";         // "shared gate/up", "shared down", "gate/up", "down"
  bool shared = false;           // the unfused shared MLP's own GEMMs (one dense "expert")
  int kernel = -1;               // index into expert_kernels()
  int grid = 0;                  // CTAs
  int dynamic_tail_percent = 0;  // gate/up (bulk): items taken dynamically at the end
  int half_items_per_cta = 0;    // gate/up (bulk, half_items instance)
  int down_tail_percent = 0;     // down (bulk, down_tail instance): tiles taken dynamically
  int early_shared = 0;          // gate/up: fused shared slots issued before the dispatch wait
  bool combine = false;          // down: the weighted combine into y
};

struct LayerPlan {
  std::string model;
  int tokens = 0;
  DeviceInfo device;
  bool fused = false;  // the shared expert as extra slots of the routed experts
  const char* fuse_reason = "";
  int slots = 0;  // top_k (+ fused shared slots)
  int chunk = 8;  // tokens per task of the dispatch
  Stream stream = Stream::Bulk;
  tuning::RouterGemmChoice router;
  bool routing_kernel = true;  // false: the gate/up kernel routes its one token itself
  bool routing_dispatch = true;  // the routing kernel builds the expert kernels' task lists
                                 // (not on the prefill path: its plan kernel permutes the pairs)
  bool dense_shared = false;   // the unfused shared MLP as dense cuBLAS GEMMs (before the router)
  std::vector<ExpertLaunch> experts;  // in launch order (empty on the prefill path)
  int grouped_gate_up = -1;  // the prefill path's gate/up GEMM: a row of grouped_gemm_kernels()
  int grouped_down = -1;     // and its down GEMM's; -1 off that path
  int grouped_mx_chunk = 0;  // MX on the prefill path: experts widened to bf16 at a time
  int grouped_mx_runs = 0;   // and the runs of each GEMM (ceil(weight rows / chunk)); else 0
  int grouped_mx_tile = 0;   // or the packed MX GEMM's token tile (64 or 128), chunk and runs 0
  bool fp8 = false;        // fp8 block-scale experts, computed W8A8 (the fp8 instances)
  ExpertFormat mx = ExpertFormat::Bf16;  // Mxfp8 / Mxfp4: MX experts (the MX instances)
  bool pdl = true;
};

// The plan of a forward of `tokens` (>= 1) tokens with fusion `fuse` (On throws when the spec
// cannot fuse). Validates nothing about the spec beyond what a choice needs (the layer does).
// `experts`: the dtype the layer holds its experts in, BF16 or F8_E4M3 (fp8 block-scale: the
// fp8 instances, the shared expert fused; throws where that cannot be). `mx`: Mxfp8 / Mxfp4
// when the layer holds MX experts (with experts BF16): the MX instances (tasks of 8 tokens) or
// the prefill path (its runs of widened experts), the shared expert fused; Bf16 otherwise.
LayerPlan plan_layer(const MoeSpec& spec, int tokens, FuseShared fuse,
                     const PlanOverrides& overrides, const DeviceInfo& device,
                     DType experts = DType::BF16, ExpertFormat mx = ExpertFormat::Bf16);

// Kernel launches of the plan that moekit makes itself (router, routing, experts, fp8's two
// activation quantisers on the bulk kernels); the dense
// shared MLP's cuBLAS GEMMs come on top (one or two kernels each, cuBLAS' choice).
int own_launches(const LayerPlan& p);

// One line per kernel, e.g.
//   deepseek-v3 T=32 sm90: fused (auto: ...) slots 9 chunk 8 bulk
//     router   dot block=256 tile_n=1 tile_m=4 (arch table)
//     routing  routing+dispatch
//     gate/up  bulk_gate_up_weights_only grid 132 tail 35% shared-first 1
//     down     bulk_down_weights_only_tail grid 132 tail 20% combine
std::string describe(const LayerPlan& p);
// The same lines in one, joined by " | " (bench records carry it).
std::string summary(const LayerPlan& p);
// The same facts as JSON text (an object: model, tokens, device, fused, fuse_reason, slots,
// chunk, stream, router, routing_kernel, dense_shared, experts[], launches).
std::string to_json(const LayerPlan& p);

}  // namespace moekit::plan

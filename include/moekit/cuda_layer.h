// The MoE layer on an NVIDIA GPU (src/cuda/layer/): router GEMM -> routing + dispatch -> grouped
// gate/up (+activation) -> grouped down (+weighted combine), bf16 activations and weights, fp32
// accumulation, the same semantics as cpu_reference::forward.
//
// This header carries no CUDA headers: streams are passed as CUstream_st* (what cudaStream_t is a
// pointer to), so host code that never includes cuda_runtime.h can still hold and drive a layer.
// Without CUDA (src/cuda_stub/) available() says why and every other call throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moekit/layer.h"
#include "moekit/moe.h"
#include "moekit/plan.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

struct CUstream_st;  // cudaStream_t == CUstream_st*

namespace moekit::cuda {

// Whether GPU `device` is usable (it exists and has compute capability 9.x, which moekit's
// sm_90a binary runs on). When not, *why says which check failed.
bool available(std::string* why = nullptr, int device = 0);

// The plan's facts of GPU `device` (its SM count and architecture); throws without a GPU.
plan::DeviceInfo live_device_info(int device = 0);

struct GpuLayerOptions {
  // Largest token count forward()/forward_device() accept; the workspace is sized for it once.
  int max_tokens = 8192;  // (covers chunked prefill; workspace_bytes() reports what it takes)
  // Default fusion of forward_device(x, y, T, stream); auto: the plan's rule (plan_layer).
  FuseShared fuse = FuseShared::Auto;
  int device = 0;  // every call makes it current and restores the caller's device after
  // Knobs of the plan (moekit/plan.h), read at creation; the library reads no environment
  // (the CLI fills them with plan::plan_overrides_from_env).
  plan::PlanOverrides overrides;
  // The dtype the layer holds its experts in: BF16, or F8_E4M3 (fp8 block-scale, computed W8A8
  // by the fp8 instances; hidden and expert_intermediate multiples of 128, the shared expert
  // fused). create() takes it from the LayerWeights (this must be BF16 or agree);
  // create_random() generates e4m3 codes and tile scales on the GPU.
  DType expert_dtype = DType::BF16;
  // Mxfp4 / Mxfp8: the layer holds OCP MX experts (packed, an e8m0 byte per 32 inputs), computed
  // W4A16 / W8A16 by the MX instances, or on the prefill path by the bf16 GEMMs on runs of
  // experts widened to bf16 (the shared expert fused; expert_dtype BF16). create() takes it from
  // the LayerWeights (this must be Bf16 or agree); create_random() generates packed codes and
  // exponents on the GPU. Bf16: not MX.
  ExpertFormat mx_format = ExpertFormat::Bf16;
};

// Launch counts of one forward, as a CUDA graph of it holds them (kernels + memsets).
struct LaunchCount {
  int kernels = 0;
  int other_nodes = 0;
};

class GpuMoeLayer {
 public:
  // Uploads the layer (router, biases, all E routed experts, the fused shared slots when the spec
  // can fuse, and the unfused shared MLP). Materialises every expert of w on the host.
  static std::unique_ptr<GpuMoeLayer> create(const LayerWeights& w, const GpuLayerOptions& opt);
  // Builds make_random_weights(spec, layer, seed) directly on the GPU, bit-identical to the host
  // generator, without host memory for the experts (a DeepSeek-V3 layer is 22.6 GB).
  static std::unique_ptr<GpuMoeLayer> create_random(const MoeSpec& spec, int layer, uint64_t seed,
                                                    const GpuLayerOptions& opt);
  ~GpuMoeLayer();
  GpuMoeLayer(const GpuMoeLayer&) = delete;
  GpuMoeLayer& operator=(const GpuMoeLayer&) = delete;

  const MoeSpec& spec() const;
  int layer() const;
  int max_tokens() const;
  // Device bytes held by weights and by the workspace.
  size_t weight_bytes() const;
  size_t workspace_bytes() const;
  // What `fuse` means for this spec and token count (Auto resolved; On throws if not fusable).
  bool resolve_fused(FuseShared fuse, int tokens) const;
  // The plan a forward of `tokens` tokens with fusion `fuse` runs (planned once per token count).
  plan::LayerPlan plan(int tokens, FuseShared fuse) const;

  // Host in, host out (tests, `moekit run`): checks x is finite, copies it in, poisons the device
  // output with NaN, runs forward_device and copies y [T,H] (bf16 -> float) and the routing back.
  ForwardResult forward(const Bf16* x, int tokens, FuseShared fuse);

  // Device in, device out: x, y bf16 [tokens, H] on this layer's device. No host synchronisation
  // and no allocation: capturable in a CUDA graph. tokens <= max_tokens (throws otherwise).
  void forward_device(const void* x, void* y, int tokens, FuseShared fuse, CUstream_st* stream);
  void forward_device(const void* x, void* y, int tokens, CUstream_st* stream);

  // What the device saw since creation or the last clear: an expert id outside [0, E + S) that
  // a forward's dispatch dropped (forward_device's outputs of that call are then undefined).
  // Synchronises `stream`.
  MoeStatus read_status(CUstream_st* stream = nullptr, bool clear = true);

  // Captures one forward in a CUDA graph and counts its nodes (the benchmark's "launches").
  LaunchCount count_launches(int tokens, bool fused);

  // Profiling: forwards launched or captured while set record their kernel timeline (the first
  // and last CTA's %globaltimer at start, after griddepcontrol.wait and at the end of the routing
  // and bulk expert kernels; layout in src/cuda/common/trace.cuh) into these device words;
  // nullptr (the default) records nothing.
  void set_trace(unsigned long long* device_words);

  // The router logits [tokens, router_columns] of the last forward (tests: route them on the CPU
  // and compare the ids exactly).
  std::vector<float> last_logits(int tokens) const;

  struct Impl;

 private:
  explicit GpuMoeLayer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The GPU routing + dispatch kernel alone on host logits (tests): the same launch a forward uses,
// with `chunk` tokens per task. `dispatch`, when given, receives the lists it built.
struct GpuDispatch {
  std::vector<int> pair_list;   // [tokens * slots], grouped by expert
  std::vector<int> task_expert, task_begin, task_count;
  std::vector<int> task_more;   // 1: the next task holds more tokens of the same expert
  int num_tasks = 0;
  int num_shared_tasks = 0;
  bool id_out_of_range = false;
};
Routing route_on_device(const RoutingConfig& cfg, const float* logits, int tokens,
                        const float* correction_bias, int chunk = 8,
                        GpuDispatch* dispatch = nullptr);

// One forward of `w` on the GPU (`moekit run --device cuda`): uploads the layer with max_tokens =
// tokens, runs GpuMoeLayer::forward once. Uploading materialises every expert of w on the host.
ForwardResult forward_once(const LayerWeights& w, const Bf16* x, int tokens, FuseShared fuse,
                           const plan::PlanOverrides& overrides = {});

// ---- benchmark (src/cuda/bench/) ----

struct GpuBenchOptions {
  std::string model;                 // short name or path (load_spec)
  std::vector<int> batches{1, 32, 128};
  FuseShared fuse = FuseShared::Auto;  // Auto: time fused and unfused side by side
  uint64_t seed = 0;
  int iterations = 0;                // graph replays per measurement; 0 = automatic
  int max_layer_sets = 0;            // distinct weight sets to rotate among; 0 = as many as fit
  int device = 0;
  bool trace = false;                // print each batch's kernel timeline (stderr)
  plan::PlanOverrides overrides;     // the layers' plan knobs
  DType expert_dtype = DType::BF16;  // BF16 or F8_E4M3 (fp8 block-scale: the shared expert fused)
  ExpertFormat mx_format = ExpertFormat::Bf16;  // Mxfp4 / Mxfp8: MX experts (expert_dtype BF16)
};

struct GpuBenchRecord {
  std::string model;
  std::string device;              // GPU name
  int batch = 0;
  std::string dtype;               // the experts': "bf16" | "fp8" | "mxfp8" | "mxfp4" (bytes and
                                   // ceiling follow it)
  std::string fuse_shared;         // "on" | "off" (what was timed)
  bool auto_choice = false;        // whether fuse=auto picks this mode at this batch
  double us_per_layer = 0;         // median, CUDA-graph replay, weights not L2-resident
  double step_us = 0;              // decode step: every MoE layer (0 above 512 tokens: not timed) of the model
  double tokens_per_s = 0;         // batch / step time
  double floor_us = 0;             // touched bytes / measured read bandwidth
  double bw_fraction = 0;          // floor_us / us_per_layer
  double touched_bytes = 0;        // distinct experts touched + shared + router + activations
  double read_bw_gbs = 0;          // measured in the same run
  int launches = 0;                // kernel nodes per layer forward
  double fused_over_unfused = 0;   // us_per_layer(on) / us_per_layer(off); 0 when not fusable
  int layer_sets = 0;              // distinct weight sets rotated among
  int max_tokens = 0;              // the layers' max_tokens (the largest batch of the run)
  double workspace_bytes = 0;      // one layer's device workspace at max_tokens
  int moe_layers = 0;
  std::string plan;                // what ran: plan::summary of the layer's plan
  double expert_tflops = 0;        // the expert GEMMs' FLOPs (6 T slots H I) over us_per_layer
  double peak_tflops = 0;          // the ceiling of the dtype, measured in the same run (8192^3
                                   // cuBLAS bf16 GEMM; fp8: cuBLASLt e4m3 GEMM, bf16 out)
  double peak_fraction = 0;        // expert_tflops / peak_tflops
};

// Measures read bandwidth (16-byte loads over >= 2 GB), then for each batch times one layer and a
// decode step, fused and unfused, in the same run. Prints progress to stderr when verbose.
std::vector<GpuBenchRecord> bench_layer(const GpuBenchOptions& opt, bool verbose = false);

// The read kernel alone: GB/s (1e9 B/s) of a 16-byte-load read over `bytes`, median of replays.
double measure_read_bandwidth(size_t bytes, int device = 0);

// ---- the prefill path's grouped GEMMs alone (src/cuda/bench/grouped_gemm_bench.cu,
// `moekit bench grouped-gemm`) ----

struct GroupedGemmBenchOptions {
  MoeSpec spec;
  std::vector<int> batches{1024, 4096};
  bool fp8 = false;          // the fp8 instances (W8A8 operands) instead of the bf16 ones
  bool fuse_shared = true;   // the shared expert as more groups (where the spec has one)
  uint64_t seed = 0;         // the routing's and the operands'
  int reps = 10;             // timed graph replays per instance (median)
  std::vector<int> kernels;  // rows of plan::grouped_gemm_kernels(); empty: every row of the dtype
  int device = 0;
};

struct GroupedGemmBenchRecord {
  std::string kernel;        // the instance's name
  std::string gemm;          // "gate_up" | "down"
  int batch = 0;             // tokens
  int groups = 0;            // weight rows E (+ fused shared slots)
  int m = 0, n = 0, k = 0;   // rows of every group together (tokens x slots), N, K
  double padded_rows = 0;    // sum over groups of M_g rounded up to the tile's rows
  double us = 0;             // median of CUDA-graph replays of the one launch
  double tflops = 0;         // 2 m n k / us
  double peak_fraction = 0;  // tflops / the dtype's ceiling measured in the same run
  double bytes = 0;          // the weights of every group with rows + A + D (+ scales), once
  double floor_us = 0;       // bytes / the read bandwidth measured in the same run
  double bw_fraction = 0;    // floor_us / us
  double max_rel_diff = 0;   // D against the first instance's D: max |d - d0| / max |d0|
};

struct GroupedGemmBenchRun {
  std::string device;
  double read_gbs = 0;       // the read kernel (measure_read_bandwidth)
  double peak_tflops = 0;    // the dtype's GEMM ceiling (bench_bf16/fp8_gemm_tflops)
  std::vector<GroupedGemmBenchRecord> records;
};

// For each batch: a routing of uniformly random top-k experts per token (fixed by the seed),
// each group's rows and both GEMMs' shapes as the prefill path runs them, random operands; each
// instance times its one launch per GEMM, its D compared with the first instance's.
GroupedGemmBenchRun bench_grouped_gemms(const GroupedGemmBenchOptions& opt);

// ---- the bulk-copy stream's ceiling (src/cuda/bench/stream_probe.cu, `moekit bench stream`) ----

// One pattern of the bulk expert kernels' weight stream without their math: every CTA (one per
// SM) moves its units of a buffer through a ring of `stages` shared-memory stages with 1-D bulk
// copies. A unit fills one stage: `rows` copies, row r of row block b and chunk c from byte
// (b * rows + r) * row_bytes + c * copy_bytes, copy_bytes long (a row's last chunk may be
// shorter). row_bytes == copy_bytes: each stage is one contiguous range (the down kernel's 16
// weight rows); row_bytes > copy_bytes: a k chunk of `rows` rows (gate/up's 14 KB rows).
// The order of the units among the CTAs: contiguous ranges (as the expert kernels' static
// ranges), round-robin (CTA b takes units b, b + grid, ...: all CTAs near one address at a time,
// as the read kernel), or ranges each walked from a CTA-dependent start (a hash of the CTA),
// wrapping around: the same ranges, the CTAs at unrelated offsets.
enum class StreamOrder { Ranges, RoundRobin, RotatedRanges };
inline const char* stream_order_name(StreamOrder o) {
  switch (o) {
    case StreamOrder::Ranges: return "ranges";
    case StreamOrder::RoundRobin: return "round-robin";
    case StreamOrder::RotatedRanges: return "rotated";
  }
  return "?";
}

struct StreamProbeConfig {
  std::string name;
  int rows = 16;             // copies per stage, 1..64
  int row_bytes = 4096;      // stride of the rows in global memory (a multiple of 16)
  int copy_bytes = 4096;     // bytes per copy (a multiple of 16, <= row_bytes)
  int stages = 2;            // ring depth, 2..8
  StreamOrder order = StreamOrder::Ranges;
  bool read = true;          // the consumers read every byte of a stage (as the mma warps do)
};

struct StreamProbeRecord {
  StreamProbeConfig config;
  int buffer = 0;       // which of the run's buffers (each allocated once, all held together)
  size_t bytes = 0;     // bytes streamed (whole row blocks of the buffer)
  double us = 0;        // median of CUDA-graph replays
  double gbs = 0;       // bytes / us
  double of_read = 0;   // gbs / the read kernel's (mean of before and after)
};

struct StreamProbeRun {
  std::string device;
  size_t buffer_bytes = 0;
  int buffers = 1;
  double read_gbs_before = 0, read_gbs_after = 0;  // the read kernel around the probes
  std::vector<StreamProbeRecord> records;
};

// The configs `moekit bench stream` measures: the bulk expert kernels' stage shapes and the
// copy sizes, stage sizes, ring depths and orders around them.
std::vector<StreamProbeConfig> stream_probe_configs();
// Checks a config (a clear error naming what is wrong): the shape limits above and that the
// ring fits in shared memory.
void check_stream_probe_config(const StreamProbeConfig& c);
// Times each config over each of `buffers` buffers of `bytes` (1..8, allocated together, so at
// different physical places; for a config, one buffer after the other) in one run, with the
// read kernel before and after. why several: one shape's rate moved by up to ~25% between runs
// on the H200, each with a fresh buffer; several buffers in one run tell placement from drift.
StreamProbeRun bench_stream(const std::vector<StreamProbeConfig>& configs, size_t bytes,
                            int device = 0, int buffers = 1);
// One probe launch over device memory `data` (`bytes`) with read on: the XOR of every 32-bit
// word the consumers read (the test compares it with the host's over *covered bytes).
uint32_t stream_probe_checksum(const StreamProbeConfig& c, const void* data, size_t bytes,
                               size_t* covered);

}  // namespace moekit::cuda

// GpuMoeLayer (include/moekit/cuda_layer.h): one MoE layer on the GPU, the op layer of the CUDA
// backend. It validates the spec against the kernels' limits once, holds the weights and a
// workspace sized for max_tokens, and runs a forward as a fixed sequence of launches with no
// host synchronisation (so a CUDA graph can capture it):
//
//   1. router GEMM        logits[T, E(+1)] fp32            src/cuda/router_gemm/ (another op)
//   2. routing + dispatch ids/weights [T, k+S], per-expert pair lists, tasks (one launch)
//   3. gate/up            h[pair, I] = act(x W1^T, x W3^T) bf16, every touched expert once
//   4. down + combine     y[T, H] = sum_slots w * (h W2^T + b2), deterministic, bf16
//   (3+4 are one persistent launch with the Persistent expert variant: experts.h)
//
// Fused: the shared MLP is S more experts E..E+S-1 whose slots every token routes to, so it
// rides in launches 3-4. Unfused (the baseline): the shared MLP [T, Is] runs on its own, and the
// combine of launch 4 adds shared_scale[t] * its output after the routed slots: from 8 tokens as
// dense cuBLAS GEMMs before launch 1 (shared_dense.h: three launches, its weights read once),
// below that as launches 2a/2b, one dense "expert" of width Is through the expert kernels.
//
// fuse_shared = auto picks fused while the spec can fuse and its slots' tasks of 8 tokens do not
// read the shared weights again too often (each task streams them whole: from L2 after the
// first), else unfused (experts_shared_dense_over_fused; by the measured re-streamed bytes). The
// benchmark (`moekit bench --device cuda`) measures both side by side per batch.
//
// Weights on the device: stacked w13 [E+S, 2I, H], w2 [E+S, H, I] (slots repacked from the
// shared MLP as in src/io/lazy_experts.h), biases [E+S, 2I] / [E+S, H] (zero for the slots), and
// the unfused shared MLP [2Is, H] / [H, Is]. create_random generates them on the GPU with the
// host generator's formula (random_fill.cu), so a 22.6 GB DeepSeek-V3 layer needs no host copy.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/random_values.h"
#include "cuda/cuda_check.h"
#include "cuda/experts/experts.h"
#include "cuda/layer/random_fill.h"
#include "cuda/layer/shared_dense.h"
#include "cuda/router_gemm/router_gemm.h"
#include "cuda/routing/routing.h"
#include "io/random_weight_values.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

// Owns one cudaMalloc'ed buffer.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr != nullptr) MK_CUDA_WARN(cudaFree(ptr));
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

template <typename T>
T* allocate(DeviceBuffer& buf, size_t count, size_t& total) {
  MK_CHECK(buf.ptr == nullptr, "device buffer allocated twice");
  if (count == 0) return nullptr;
  buf.bytes = count * sizeof(T);
  const cudaError_t err = cudaMalloc(&buf.ptr, buf.bytes);
  if (err != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    (void)cudaGetLastError();
    (void)cudaMemGetInfo(&free_b, &total_b);
    MK_FAIL("cudaMalloc of " << buf.bytes << " bytes failed (" << cudaGetErrorName(err) << "): "
                             << free_b << " of " << total_b << " bytes free on the device");
  }
  total += buf.bytes;
  return static_cast<T*>(buf.ptr);
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace

struct GpuMoeLayer::Impl {
  MoeSpec spec;
  int layer = 0;
  GpuLayerOptions opt;
  int E = 0, S = 0, H = 0, I = 0, Is = 0, K = 0, cols = 0;
  bool has_shared = false;
  bool can_fuse = false;
  RoutingConfig cfg_fused, cfg_unfused;
  cudaStream_t stream = nullptr;
  // [variant][gate/up, down, the unfused shared MLP's down][chunk 8, 16] (the kernel, and so
  // its resident grid, depends on the reduction length: I for down, Is for the shared down)
  int grid[kExpertsStreams][3][2] = {};
  int fused_grid[2] = {};                 // the Persistent variant's one launch [chunk 8, 16]
  std::optional<ExpertsStream> forced_stream;  // MOEKIT_EXPERTS_KERNEL at creation
  int dynamic_tail_percent = 0;                // the bulk gate/up kernel's (MOEKIT_EXPERTS_TAIL)
  int shared_first_tokens = 0;                 // its MOEKIT_EXPERTS_SHARED_FIRST
  int whole_tile_tokens = 0;                   // the bulk down's MOEKIT_EXPERTS_WHOLE_TILES
  int down_split_tokens = 0;                   // ... its MOEKIT_EXPERTS_DOWN_SPLIT
  int down_deep_tokens = 0;                    // ... its MOEKIT_EXPERTS_DOWN_DEEP
  int one_token_ring = 0;                      // both's MOEKIT_EXPERTS_ONE_TOKEN_RING
  int l2_keep_from = -1;                       // the bulk kernels' MOEKIT_EXPERTS_L2_KEEP_FROM
  int down_tail_setting = -1;                  // the bulk down kernel's MOEKIT_EXPERTS_DOWN_TAIL
  int half_items_setting = -1;                 // the gate/up kernel's MOEKIT_EXPERTS_HALF_ITEMS
  int self_route_tokens = 0;                   // its MOEKIT_EXPERTS_SELF_ROUTE
  int l2_acts_tokens = -1;                     // both's MOEKIT_EXPERTS_L2_ACTS (-1: the rule)
  int task16_setting = -1;                     // both's MOEKIT_EXPERTS_TASK16 (-1: the rule)
  int shared_dense_tokens = 0;                 // MOEKIT_SHARED_DENSE (0: never)
  std::unique_ptr<SharedDenseMlp> shared_dense;  // the unfused shared MLP's cuBLAS GEMMs
  unsigned long long* trace = nullptr;         // set_trace: kernel timeline words, or null

  // weights
  size_t weight_bytes = 0;
  DeviceBuffer router_w, router_bias, corr_bias, w13, w2, b13, b2, shared_w13, shared_w2;
  // workspace
  size_t workspace_bytes = 0;
  DeviceBuffer logits, ids, weights, shared_scale, pair_list, tasks, shared_tasks, pair_identity;
  DeviceBuffer h, shared_h, partial, shared_partial, counters, tile_counters, task_done;
  DeviceBuffer error_flag;
  DeviceBuffer x_in, y_out;
  int max_tasks = 0;

  ~Impl() {
    if (stream != nullptr) MK_CUDA_WARN(cudaStreamDestroy(stream));
  }

  int rows_fused() const { return E + (can_fuse ? S : 0); }

  void validate() {
    validate_spec(spec);
    MK_CHECK(opt.max_tokens >= 1, "expected max_tokens >= 1, got " << opt.max_tokens);
    MK_CHECK(E >= 1 && E <= kRoutingMaxExperts, "GPU routing takes 1.." << kRoutingMaxExperts
                                                   << " experts, got " << E);
    MK_CHECK(H % 64 == 0, "GPU experts need hidden % 64 == 0, got hidden " << H);
    MK_CHECK(I % 64 == 0, "GPU experts need expert_intermediate % 64 == 0, got " << I);
    MK_CHECK(!has_shared || Is % 64 == 0,
             "GPU shared MLP needs shared_intermediate % 64 == 0, got " << Is);
    MK_CHECK(spec.top_k + S <= 32, "GPU routing holds top_k + shared slots <= 32, got "
                                       << spec.top_k << " + " << S);
    MK_CHECK(spec.n_group <= 32, "GPU routing takes n_group <= 32, got " << spec.n_group);
    MK_CHECK(E + S <= kAlignMaxRows, "GPU dispatch counts <= " << kAlignMaxRows
                                         << " weight rows, got " << E + S);
    MK_CHECK(spec.router_dtype == DType::BF16 || spec.router_dtype == DType::F32,
             "expected router dtype BF16 or F32, got " << dtype_name(spec.router_dtype));
  }

  void init_shapes() {
    E = spec.num_experts;
    H = spec.hidden;
    I = spec.expert_intermediate;
    K = spec.top_k;
    cols = spec.router_columns();
    has_shared = spec.shared_kind != SharedKind::None && spec.shared_intermediate > 0;
    Is = has_shared ? spec.shared_intermediate : 0;
    can_fuse = spec.can_fuse_shared();
    S = can_fuse ? spec.shared_slots() : 0;
    cfg_unfused = RoutingConfig::from_spec(spec, false);
    if (can_fuse) cfg_fused = RoutingConfig::from_spec(spec, true);
  }

  void allocate_weights() {
    const size_t rows = rows_fused();
    const size_t router_elems = static_cast<size_t>(cols) * H;
    if (spec.router_dtype == DType::F32) {
      allocate<float>(router_w, router_elems, weight_bytes);
    } else {
      allocate<__nv_bfloat16>(router_w, router_elems, weight_bytes);
    }
    if (spec.has_router_bias) allocate<float>(router_bias, E, weight_bytes);
    if (spec.has_correction_bias) allocate<float>(corr_bias, E, weight_bytes);
    allocate<__nv_bfloat16>(w13, rows * 2 * I * H, weight_bytes);
    allocate<__nv_bfloat16>(w2, rows * H * I, weight_bytes);
    if (spec.has_expert_bias) {
      allocate<float>(b13, rows * 2 * I, weight_bytes);
      allocate<float>(b2, rows * H, weight_bytes);
      MK_CUDA_CHECK(cudaMemsetAsync(b13.ptr, 0, b13.bytes, stream));
      MK_CUDA_CHECK(cudaMemsetAsync(b2.ptr, 0, b2.bytes, stream));
    }
    if (has_shared) {
      allocate<__nv_bfloat16>(shared_w13, static_cast<size_t>(2) * Is * H, weight_bytes);
      allocate<__nv_bfloat16>(shared_w2, static_cast<size_t>(H) * Is, weight_bytes);
    }
  }

  // Fused slot j = gate rows [jI,(j+1)I) and up rows Is+[jI,(j+1)I) of the shared w13, down
  // columns [jI,(j+1)I) of the shared w2 (the repack of src/io/lazy_experts.h, on the device).
  void repack_slots_on_device() {
    const size_t expert13 = static_cast<size_t>(2) * I * H, expert2 = static_cast<size_t>(H) * I;
    for (int j = 0; j < S; ++j) {
      __nv_bfloat16* dst13 = w13.as<__nv_bfloat16>() + (E + j) * expert13;
      const __nv_bfloat16* src = shared_w13.as<__nv_bfloat16>();
      MK_CUDA_CHECK(cudaMemcpyAsync(dst13, src + static_cast<size_t>(j) * I * H,
                                    static_cast<size_t>(I) * H * 2, cudaMemcpyDeviceToDevice,
                                    stream));
      MK_CUDA_CHECK(cudaMemcpyAsync(dst13 + static_cast<size_t>(I) * H,
                                    src + (static_cast<size_t>(Is) + j * I) * H,
                                    static_cast<size_t>(I) * H * 2, cudaMemcpyDeviceToDevice,
                                    stream));
      MK_CUDA_CHECK(cudaMemcpy2DAsync(
          w2.as<__nv_bfloat16>() + (E + j) * expert2, static_cast<size_t>(I) * 2,
          shared_w2.as<__nv_bfloat16>() + static_cast<size_t>(j) * I,
          static_cast<size_t>(Is) * 2, static_cast<size_t>(I) * 2, H, cudaMemcpyDeviceToDevice,
          stream));
    }
  }

  // Every copy in the layer's stream, in order with the memsets before it and the kernels after.
  // why not cudaMemcpy: it runs in the legacy default stream, which a non-blocking stream does not
  // wait for, and from pageable memory it may return before its DMA lands.
  void upload(const LayerWeights& w) {
    auto to_device = [&](void* dst, const void* src, size_t bytes) {
      MK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    };
    const size_t router_elems = static_cast<size_t>(cols) * H;
    MK_CHECK(w.router_weight() != nullptr, "router weight of " << spec.name << " is missing");
    to_device(router_w.ptr, w.router_weight(), router_elems * dtype_size(spec.router_dtype));
    if (spec.has_router_bias) {
      MK_CHECK(w.router_bias() != nullptr, spec.name << " has a router bias but none was given");
      to_device(router_bias.ptr, w.router_bias(), E * sizeof(float));
    }
    if (spec.has_correction_bias) {
      MK_CHECK(w.correction_bias() != nullptr,
               spec.name << " has a correction bias but none was given");
      to_device(corr_bias.ptr, w.correction_bias(), E * sizeof(float));
    }
    const size_t expert13 = static_cast<size_t>(2) * I * H, expert2 = static_cast<size_t>(H) * I;
    for (int e = 0; e < rows_fused(); ++e) {
      const ExpertView v = w.expert(e);
      MK_CHECK(v.w13 != nullptr && v.w2 != nullptr, "expert " << e << " of " << spec.name
                                                               << " has no weights");
      to_device(w13.as<__nv_bfloat16>() + e * expert13, v.w13, expert13 * 2);
      to_device(w2.as<__nv_bfloat16>() + e * expert2, v.w2, expert2 * 2);
      if (spec.has_expert_bias && v.b13 != nullptr) {
        to_device(b13.as<float>() + e * static_cast<size_t>(2) * I, v.b13,
                  static_cast<size_t>(2) * I * sizeof(float));
      }
      if (spec.has_expert_bias && v.b2 != nullptr) {
        to_device(b2.as<float>() + e * static_cast<size_t>(H), v.b2,
                  static_cast<size_t>(H) * sizeof(float));
      }
    }
    if (has_shared) {
      MK_CHECK(w.shared_w13() != nullptr && w.shared_w2() != nullptr,
               "shared expert weights of " << spec.name << " are missing");
      to_device(shared_w13.ptr, w.shared_w13(), shared_w13.bytes);
      to_device(shared_w2.ptr, w.shared_w2(), shared_w2.bytes);
    }
  }

  void fill_random(uint64_t seed) {
    namespace rv = random_values;
    using rv::Tensor;
    const size_t router_elems = static_cast<size_t>(cols) * H;
    if (spec.router_dtype == DType::F32) {
      fill_random_f32(router_w.as<float>(), router_elems, 1, seed, layer, Tensor::RouterWeight,
                      -1, rv::weight_scale(H), stream);
    } else {
      fill_random_bf16(router_w.as<__nv_bfloat16>(), router_elems, 1, seed, layer,
                       Tensor::RouterWeight, -1, rv::weight_scale(H), stream);
    }
    if (spec.has_correction_bias) {
      fill_random_f32(corr_bias.as<float>(), E, 1, seed, layer, Tensor::CorrectionBias, -1,
                      rv::kCorrectionBiasScale, stream);
    }
    if (spec.has_router_bias) {
      fill_random_f32(router_bias.as<float>(), E, 1, seed, layer, Tensor::RouterBias, -1,
                      rv::kBiasScale, stream);
    }
    fill_random_bf16(w13.as<__nv_bfloat16>(), static_cast<size_t>(2) * I * H, E, seed, layer,
                     Tensor::ExpertW13, 0, rv::weight_scale(H), stream);
    fill_random_bf16(w2.as<__nv_bfloat16>(), static_cast<size_t>(H) * I, E, seed, layer,
                     Tensor::ExpertW2, 0, rv::weight_scale(I), stream);
    if (spec.has_expert_bias) {
      fill_random_f32(b13.as<float>(), static_cast<size_t>(2) * I, E, seed, layer,
                      Tensor::ExpertB13, 0, rv::kBiasScale, stream);
      fill_random_f32(b2.as<float>(), H, E, seed, layer, Tensor::ExpertB2, 0, rv::kBiasScale,
                      stream);
    }
    if (has_shared) {
      fill_random_bf16(shared_w13.as<__nv_bfloat16>(), static_cast<size_t>(2) * Is * H, 1, seed,
                       layer, Tensor::SharedW13, -1, rv::weight_scale(H), stream);
      fill_random_bf16(shared_w2.as<__nv_bfloat16>(), static_cast<size_t>(H) * Is, 1, seed, layer,
                       Tensor::SharedW2, -1, rv::weight_scale(Is), stream);
    }
  }

  void allocate_workspace() {
    const int tm = opt.max_tokens;
    const int max_slots = K + S;
    const size_t pairs = static_cast<size_t>(tm) * max_slots;
    max_tasks = max_routed_tasks(static_cast<int>(pairs), rows_fused(), 8);
    size_t& ws = workspace_bytes;
    allocate<float>(logits, static_cast<size_t>(tm) * cols, ws);
    allocate<int32_t>(ids, pairs, ws);
    allocate<float>(weights, pairs, ws);
    allocate<float>(shared_scale, tm, ws);
    allocate<int>(pair_list, pairs, ws);
    allocate<ExpertTask>(tasks, max_tasks, ws);
    allocate<ExpertTask>(shared_tasks, ceil_div(tm, 8), ws);
    allocate<int>(pair_identity, tm, ws);
    allocate<__nv_bfloat16>(h, pairs * I, ws);
    allocate<float>(partial, pairs * H, ws);
    if (has_shared) {
      allocate<__nv_bfloat16>(shared_h, static_cast<size_t>(tm) * Is, ws);
      allocate<float>(shared_partial, static_cast<size_t>(tm) * H, ws);
    }
    allocate<DispatchCounters>(counters, 1, ws);
    allocate<int>(tile_counters, H / 16 + 1, ws);  // + the down tail's CTAs done
    allocate<int>(task_done, max_tasks, ws);
    allocate<int>(error_flag, 1, ws);
    allocate<__nv_bfloat16>(x_in, static_cast<size_t>(tm) * H, ws);
    allocate<__nv_bfloat16>(y_out, static_cast<size_t>(tm) * H, ws);
    // (tasks are read ahead of the task count: task_capacity)
    MK_CUDA_CHECK(cudaMemsetAsync(tasks.ptr, 0, tasks.bytes, stream));
    MK_CUDA_CHECK(cudaMemsetAsync(shared_tasks.ptr, 0, shared_tasks.bytes, stream));
    MK_CUDA_CHECK(cudaMemsetAsync(counters.ptr, 0, counters.bytes, stream));
    MK_CUDA_CHECK(cudaMemsetAsync(tile_counters.ptr, 0, tile_counters.bytes, stream));
    MK_CUDA_CHECK(cudaMemsetAsync(error_flag.ptr, 0, error_flag.bytes, stream));
    std::vector<int> identity(tm);
    for (int i = 0; i < tm; ++i) identity[i] = i;
    MK_CUDA_CHECK(cudaMemcpyAsync(pair_identity.ptr, identity.data(), tm * sizeof(int),
                                  cudaMemcpyHostToDevice, stream));
  }

  void init_launch_config() {
    forced_stream = experts_stream_override();
    dynamic_tail_percent = experts_dynamic_tail_percent();
    shared_first_tokens = experts_shared_first_tokens();
    whole_tile_tokens = experts_whole_tile_tokens();
    down_split_tokens = experts_down_split_tokens();
    down_deep_tokens = experts_down_deep_tokens();
    one_token_ring = experts_one_token_ring_setting();
    l2_keep_from = experts_l2_keep_from_tokens();
    down_tail_setting = experts_down_tail_percent_setting();
    half_items_setting = experts_gate_up_half_items_setting();
    self_route_tokens = experts_self_route_tokens();
    l2_acts_tokens = experts_l2_acts_tokens();
    task16_setting = experts_task16_setting();
    shared_dense_tokens = has_shared ? experts_shared_dense_tokens() : 0;
    if (shared_dense_tokens > 0 && shared_dense_tokens <= opt.max_tokens) {
      shared_dense = std::make_unique<SharedDenseMlp>(opt.max_tokens, H, Is);
    }
    const int chunks[2] = {8, 16};
    for (int v = 0; v < kExpertsStreams; ++v) {
      const auto sk = static_cast<ExpertsStream>(v);
      for (int c = 0; c < 2; ++c) {
        grid[v][0][c] = experts_grid(ExpertsKind::GateUp, chunks[c], sk, H);
        grid[v][1][c] = experts_grid(ExpertsKind::Down, chunks[c], sk, I);
        if (has_shared) grid[v][2][c] = experts_grid(ExpertsKind::Down, chunks[c], sk, Is);
      }
    }
    for (int c = 0; c < 2; ++c) fused_grid[c] = experts_fused_grid(chunks[c]);
    warm_up_router_gemm(spec, opt.max_tokens, stream);
  }

  // The expert-kernel variant for a forward of `tokens` tokens (every variant exists for both
  // chunks, 8 and 16 tokens per task).
  ExpertsStream kind_for(int tokens) const {
    return forced_stream ? *forced_stream : experts_stream_default(H, tokens, task16_rule(tokens));
  }

  // Whether experts_task16_ring holds for a forward of `tokens` (where the bulk kernels run)
  bool task16_rule(int tokens) const { return experts_task16_ring(tokens, K, E, task16_setting); }

  // Whether a forward of `tokens` runs the bulk kernels with tasks of up to 16 tokens through
  // the ring of weights only (experts_task16_ring)
  bool task16_at(int tokens) const {
    return kind_for(tokens) == ExpertsStream::Bulk && task16_rule(tokens);
  }

  // Tokens per task (the dispatch's chunk) of a forward of `tokens`
  int chunk_for(int tokens) const { return task16_at(tokens) ? 16 : experts_chunk(tokens); }

  static constexpr int kUnfusedFromTokensWithManySlots = 32;

  // Whether an unfused forward of `tokens` runs the shared MLP as dense GEMMs (shared_dense.h)
  bool dense_shared_at(int tokens) const {
    return shared_dense != nullptr && tokens >= shared_dense_tokens;
  }

  long long shared_weight_bytes() const { return 3LL * Is * H * 2; }  // bf16 gate, up, down

  bool resolve_fused(FuseShared fuse, int tokens) const {
    if (!has_shared) return false;
    switch (fuse) {
      case FuseShared::On:
        MK_CHECK(can_fuse, "cannot fuse the shared expert of "
                               << spec.name << ": shared_intermediate (" << spec.shared_intermediate
                               << ") is not a whole multiple of expert_intermediate (" << I << ")");
        return true;
      case FuseShared::Off:
        return false;
      case FuseShared::Auto:
        if (!can_fuse) return false;
        // fused, until its slots' tasks stream the shared weights again often enough that the
        // dense GEMMs win (experts_shared_dense_over_fused: measured on eight models)
        if (dense_shared_at(tokens)) {
          return !experts_shared_dense_over_fused(tokens, chunk_for(tokens), shared_weight_bytes());
        }
        // Without the dense path (MOEKIT_SHARED_DENSE=0): measured on the H200
        // (bench/results/h200/2026-11-30-run6-final): one fused slot (DeepSeek-V3, Kimi-K2) is
        // never slower than the unfused expert kernels, at any batch up to 256; Qwen2-57B's 8
        // slots are 2-8% slower from 32 tokens (each slot is split into T/8 tasks that re-read
        // it). So: fuse, except several slots at >= 32 tokens.
        return !(S > 1 && tokens >= kUnfusedFromTokensWithManySlots);
    }
    return false;
  }

  // l2_keep, half_items: ExpertsParams::l2_keep and half_items_per_cta of this forward
  // (experts_l2_keep, experts_gate_up_half_items)
  ExpertsParams experts_common(int l2_keep, int half_items) const {
    ExpertsParams p;
    p.dynamic_tail_percent = dynamic_tail_percent;
    p.half_items_per_cta = half_items;  // (read by the gate/up launches only)
    p.l2_keep = l2_keep;
    p.activation = spec.activation;
    p.limit = spec.swiglu_limit;
    p.alpha = spec.swiglu_alpha;
    p.beta = spec.swiglu_beta;
    return p;
  }

  void forward_device(const void* x, void* y, int tokens, bool fused, cudaStream_t st) {
    MK_CHECK(tokens >= 0 && tokens <= opt.max_tokens,
             "expected 0 <= tokens <= max_tokens (" << opt.max_tokens << "), got " << tokens);
    if (tokens == 0) return;
    MK_CHECK(x != nullptr && y != nullptr, "forward_device: x or y is null");
    // (the expert kernels copy x rows in 16-byte units and store y rows 4 at a time)
    MK_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0,
             "forward_device: x and y must be 16-byte aligned (x " << x << ", y " << y << ")");
    const int s_run = fused ? S : 0;
    const int slots = K + s_run;
    const bool task16 = task16_at(tokens);
    const int chunk = task16 ? 16 : experts_chunk(tokens);  // (chunk_for, the rule asked once)
    const int l2_keep = experts_l2_keep(tokens, H, chunk, l2_keep_from) ? 1 : 0;
    const int ci = chunk == 8 ? 0 : 1;  // chunk_for gives 8 or 16
    const ExpertsStream sk = kind_for(tokens);
    const int down_tail =
        sk == ExpertsStream::Bulk ? experts_down_tail(tokens, H, chunk, down_tail_setting) : 0;
    // both bulk kernels' ring of weights only, the consumers loading the activations
    // (experts_l2_acts_ring): in place of the half items, the split copies and the deep rings
    // (tasks of 16 tokens: the same ring, experts_task16_ring)
    const bool l2_acts = task16 || (sk == ExpertsStream::Bulk &&
                                    experts_l2_acts_ring(tokens, chunk, I, K, E, l2_acts_tokens));
    const int half_items =
        sk == ExpertsStream::Bulk && !l2_keep && !l2_acts
            ? experts_gate_up_half_items(tokens, H, chunk, half_items_setting, one_token_ring)
            : 0;
    // no routing kernel: the gate/up kernel routes its one token (experts_self_route_tokens)
    const bool self_route = sk == ExpertsStream::Bulk && chunk == 8 &&
                            tokens <= self_route_tokens && !has_shared && E <= 128 && !l2_keep &&
                            half_items == 0;
    const int vi = static_cast<int>(sk);
    const bool one_expert_launch = sk == ExpertsStream::Persistent;
    const bool shared_unfused = has_shared && !fused;
    // the unfused shared MLP as dense GEMMs (its weights stream once), else its own expert tasks
    const bool dense_shared = shared_unfused && dense_shared_at(tokens);
    auto* ctr = counters.as<DispatchCounters>();

    // 0. the dense shared MLP: it needs x only, so it goes first and leaves the chain of
    // programmatic launches from the router GEMM to the down kernel as it is
    if (dense_shared) {
      SharedActivation act;
      act.activation = spec.activation;
      act.limit = spec.swiglu_limit;
      act.alpha = spec.swiglu_alpha;
      act.beta = spec.swiglu_beta;
      shared_dense->forward(static_cast<const __nv_bfloat16*>(x), shared_w13.as<__nv_bfloat16>(),
                            shared_w2.as<__nv_bfloat16>(), tokens, act,
                            shared_h.as<__nv_bfloat16>(), shared_partial.as<float>(), st);
    }

    // 1. router GEMM
    RouterGemmProblem rg;
    rg.m = tokens;
    rg.n = cols;
    rg.k = H;
    rg.weight_dtype = spec.router_dtype;
    rg.x = x;
    rg.weight = router_w.ptr;
    rg.bias = spec.has_router_bias ? router_bias.as<float>() : nullptr;
    rg.out = logits.as<float>();
    rg.trace = trace;
    router_gemm(rg, st);

    // 2. routing + dispatch
    RoutingParams rp;
    rp.cfg = fused ? cfg_fused : cfg_unfused;
    rp.tokens = tokens;
    rp.logits = logits.as<float>();
    rp.correction_bias = spec.has_correction_bias ? corr_bias.as<float>() : nullptr;
    rp.ids = ids.as<int32_t>();
    rp.weights = weights.as<float>();
    rp.shared_scale = has_shared ? shared_scale.as<float>() : nullptr;
    rp.weight_rows = E + s_run;
    rp.chunk = chunk;
    rp.pair_list = pair_list.as<int>();
    rp.tasks = tasks.as<ExpertTask>();
    rp.shared_tasks = shared_unfused && !dense_shared ? shared_tasks.as<ExpertTask>() : nullptr;
    rp.counters = ctr;
    rp.tile_counters = tile_counters.as<int>();
    rp.num_tile_counters = H / 16 + (down_tail > 0 ? 1 : 0);  // (+ its CTAs done)
    rp.task_done = one_expert_launch ? task_done.as<int>() : nullptr;
    rp.error_flag = error_flag.as<int>();
    rp.trace = trace;
    if (!self_route) launch_routing(rp, st);

    // 2a/2b. unfused shared MLP as its own GEMMs: one dense "expert" of width Is
    if (shared_unfused && !dense_shared) {
      ExpertsParams g = experts_common(l2_keep, half_items);
      g.w = shared_w13.as<__nv_bfloat16>();
      g.inter = Is;
      g.rows = Is;
      g.k = H;
      g.x = static_cast<const __nv_bfloat16*>(x);
      g.x_row_div = 1;
      g.pair_list = pair_identity.as<int>();
      g.tasks = shared_tasks.as<ExpertTask>();
      g.num_tasks = &ctr->num_shared_tasks;
      g.task_capacity = ceil_div(opt.max_tokens, 8);
      g.pair_capacity = tokens;
      g.work_counter = &ctr->work[2];
      g.h = shared_h.as<__nv_bfloat16>();
      launch_experts(ExpertsKind::GateUp, chunk, sk, g, grid[vi][0][ci], st);

      ExpertsParams d = experts_common(l2_keep, half_items);
      d.w = shared_w2.as<__nv_bfloat16>();
      d.inter = Is;
      d.rows = H;
      d.k = Is;
      d.x = shared_h.as<__nv_bfloat16>();
      d.x_row_div = 1;
      d.pair_list = pair_identity.as<int>();
      d.tasks = shared_tasks.as<ExpertTask>();
      d.num_tasks = &ctr->num_shared_tasks;
      d.task_capacity = ceil_div(opt.max_tokens, 8);
      d.pair_capacity = tokens;
      d.work_counter = &ctr->work[3];
      d.partial = shared_partial.as<float>();
      launch_experts(ExpertsKind::Down, chunk, sk, d, grid[vi][2][ci], st);
    }

    // 3. routed (+ fused shared) gate/up
    ExpertsParams g = experts_common(l2_keep, half_items);
    g.w = w13.as<__nv_bfloat16>();
    g.w_expert_stride = static_cast<long long>(2) * I * H;
    g.bias = spec.has_expert_bias ? b13.as<float>() : nullptr;
    g.bias_expert_stride = static_cast<long long>(2) * I;
    g.inter = I;
    g.rows = I;
    g.k = H;
    g.x = static_cast<const __nv_bfloat16*>(x);
    g.x_row_div = slots;
    g.pair_list = pair_list.as<int>();
    g.tasks = tasks.as<ExpertTask>();
    g.num_tasks = &ctr->num_tasks;
    g.task_capacity = max_tasks;
    g.pair_capacity = tokens * slots;
    g.work_counter = &ctr->work[0];
    g.h = h.as<__nv_bfloat16>();
    g.trace = trace;
    if (self_route) {
      g.self_route = 1;
      g.route = rp;
      // (no align step before it zeroes work[0]: its own counters, which it leaves zeroed)
      g.work_counter = &ctr->self_route_work;
      g.self_route_ctas_done = &ctr->self_route_ctas_done;
    }
    if (l2_acts) {
      g.ring = 4;
    } else if (l2_keep == 0 &&
               experts_gate_up_one_token_ring(tokens, H, self_route, one_token_ring)) {
      g.ring = 3;
    }
    if (s_run > 0 && sk == ExpertsStream::Bulk && tokens <= shared_first_tokens) {
      g.early_shared = s_run;
      g.first_shared_expert = E;
      g.tokens = tokens;
      g.slots = slots;
    }

    // 4. down + weighted combine (Persistent: one launch with gate/up)
    ExpertsParams d = experts_common(l2_keep, half_items);
    d.w = w2.as<__nv_bfloat16>();
    d.w_expert_stride = static_cast<long long>(H) * I;
    d.bias = spec.has_expert_bias ? b2.as<float>() : nullptr;
    d.bias_expert_stride = H;
    d.inter = I;
    d.rows = H;
    d.k = I;
    d.x = h.as<__nv_bfloat16>();
    d.x_row_div = 1;
    d.pair_list = pair_list.as<int>();
    d.tasks = tasks.as<ExpertTask>();
    d.num_tasks = &ctr->num_tasks;
    d.task_capacity = max_tasks;
    d.pair_capacity = tokens * slots;
    d.work_counter = &ctr->work[1];
    d.partial = partial.as<float>();
    d.tile_counters = tile_counters.as<int>();
    d.tokens = tokens;
    d.slots = slots;
    d.slot_weights = weights.as<float>();
    d.shared_partial = shared_unfused ? shared_partial.as<float>() : nullptr;
    d.shared_scale = shared_unfused ? shared_scale.as<float>() : nullptr;
    d.y = static_cast<__nv_bfloat16*>(y);
    d.trace = trace;
    // (rings 1-3 have no tail instances: a tail, only ever forced where one would be, wins;
    // ring 3 takes the place of the split copies at 4 KB rows; ring 4 (which has tail instances)
    // the place of all the others and of the split copies)
    d.ring = l2_acts                                                       ? 4
             : down_tail > 0                                               ? 0
             : experts_down_wide_one_token_ring(tokens, I, one_token_ring) ? 3
             : !experts_down_deep_ring(tokens, I, down_deep_tokens)        ? 0
             : experts_down_one_token_ring(tokens, I, one_token_ring)      ? 2
                                                                           : 1;
    d.weight_copy_pieces = d.ring >= 3 ? 1 : experts_down_copy_pieces(tokens, I, down_split_tokens);
    d.down_tail_percent = down_tail;
    if (one_expert_launch) {
      launch_experts_fused(chunk, g, d, task_done.as<int>(), fused_grid[ci], st);
    } else {
      launch_experts(ExpertsKind::GateUp, chunk, sk, g, grid[vi][0][ci], st);
      const int down_grid = sk == ExpertsStream::Bulk
                                ? experts_down_grid(grid[vi][1][ci], H, tokens, whole_tile_tokens)
                                : grid[vi][1][ci];
      launch_experts(ExpertsKind::Down, chunk, sk, d, down_grid, st);
    }
  }
};

// ---- GpuMoeLayer ----

namespace {

std::unique_ptr<GpuMoeLayer::Impl> make_impl(const MoeSpec& spec, int layer,
                                             const GpuLayerOptions& opt) {
  auto impl = std::make_unique<GpuMoeLayer::Impl>();
  impl->spec = spec;
  impl->layer = layer;
  impl->opt = opt;
  impl->opt.fuse = fuse_shared_from_env(opt.fuse);
  impl->init_shapes();
  impl->validate();
  std::string why;
  MK_CHECK(available(&why), "no usable GPU: " << why);
  MK_CUDA_CHECK(cudaSetDevice(opt.device));
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  impl->allocate_weights();
  impl->allocate_workspace();
  return impl;
}

}  // namespace

GpuMoeLayer::GpuMoeLayer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuMoeLayer::~GpuMoeLayer() = default;

std::unique_ptr<GpuMoeLayer> GpuMoeLayer::create(const LayerWeights& w,
                                                 const GpuLayerOptions& opt) {
  auto impl = make_impl(w.spec(), w.layer(), opt);
  impl->upload(w);
  impl->init_launch_config();
  MK_CUDA_CHECK(cudaStreamSynchronize(impl->stream));
  return std::unique_ptr<GpuMoeLayer>(new GpuMoeLayer(std::move(impl)));
}

std::unique_ptr<GpuMoeLayer> GpuMoeLayer::create_random(const MoeSpec& spec, int layer,
                                                        uint64_t seed,
                                                        const GpuLayerOptions& opt) {
  MK_CHECK(spec.is_moe_layer(layer), "layer " << layer << " of " << spec.name
                                              << " is not an MoE layer");
  auto impl = make_impl(spec, layer, opt);
  impl->fill_random(seed);
  if (impl->can_fuse) impl->repack_slots_on_device();
  impl->init_launch_config();
  MK_CUDA_CHECK(cudaStreamSynchronize(impl->stream));
  return std::unique_ptr<GpuMoeLayer>(new GpuMoeLayer(std::move(impl)));
}

const MoeSpec& GpuMoeLayer::spec() const { return impl_->spec; }
int GpuMoeLayer::layer() const { return impl_->layer; }
int GpuMoeLayer::max_tokens() const { return impl_->opt.max_tokens; }
size_t GpuMoeLayer::weight_bytes() const { return impl_->weight_bytes; }
size_t GpuMoeLayer::workspace_bytes() const { return impl_->workspace_bytes; }

bool GpuMoeLayer::resolve_fused(FuseShared fuse, int tokens) const {
  return impl_->resolve_fused(fuse, tokens);
}

void GpuMoeLayer::forward_device(const void* x, void* y, int tokens, FuseShared fuse,
                                 CUstream_st* stream) {
  impl_->forward_device(x, y, tokens, impl_->resolve_fused(fuse, tokens), stream);
}

void GpuMoeLayer::forward_device(const void* x, void* y, int tokens, CUstream_st* stream) {
  forward_device(x, y, tokens, impl_->opt.fuse, stream);
}

ForwardResult GpuMoeLayer::forward(const Bf16* x, int tokens, FuseShared fuse) {
  Impl& m = *impl_;
  MK_CHECK(tokens >= 0 && tokens <= m.opt.max_tokens,
           "expected 0 <= tokens <= max_tokens (" << m.opt.max_tokens << "), got " << tokens);
  check_finite_input(x, tokens, m.H);
  MK_CUDA_CHECK(cudaSetDevice(m.opt.device));
  const bool fused = m.resolve_fused(fuse, tokens);
  const int slots = m.K + (fused ? m.S : 0);
  const size_t n_x = static_cast<size_t>(tokens) * m.H;
  const size_t n_pairs = static_cast<size_t>(tokens) * slots;

  ForwardResult r;
  r.tokens = tokens;
  r.hidden = m.H;
  r.fused = fused;
  r.routing.tokens = tokens;
  r.routing.slots = slots;
  if (tokens == 0) return r;

  // poison every output, so an unwritten element shows as NaN / -1
  MK_CUDA_CHECK(cudaMemcpyAsync(m.x_in.ptr, x, n_x * 2, cudaMemcpyHostToDevice, m.stream));
  MK_CUDA_CHECK(cudaMemsetAsync(m.y_out.ptr, 0xff, n_x * 2, m.stream));
  MK_CUDA_CHECK(cudaMemsetAsync(m.ids.ptr, 0xff, n_pairs * 4, m.stream));
  MK_CUDA_CHECK(cudaMemsetAsync(m.weights.ptr, 0xff, n_pairs * 4, m.stream));
  MK_CUDA_CHECK(cudaMemsetAsync(m.shared_scale.ptr, 0xff, static_cast<size_t>(tokens) * 4,
                                m.stream));
  MK_CUDA_CHECK(cudaMemsetAsync(m.error_flag.ptr, 0, 4, m.stream));
  m.forward_device(m.x_in.ptr, m.y_out.ptr, tokens, fused, m.stream);

  std::vector<uint16_t> y16(n_x);
  r.routing.ids.resize(n_pairs);
  r.routing.weights.resize(n_pairs);
  int error = 0;
  MK_CUDA_CHECK(cudaMemcpyAsync(y16.data(), m.y_out.ptr, n_x * 2, cudaMemcpyDeviceToHost,
                                m.stream));
  MK_CUDA_CHECK(cudaMemcpyAsync(r.routing.ids.data(), m.ids.ptr, n_pairs * 4,
                                cudaMemcpyDeviceToHost, m.stream));
  MK_CUDA_CHECK(cudaMemcpyAsync(r.routing.weights.data(), m.weights.ptr, n_pairs * 4,
                                cudaMemcpyDeviceToHost, m.stream));
  MK_CUDA_CHECK(cudaMemcpyAsync(&error, m.error_flag.ptr, 4, cudaMemcpyDeviceToHost, m.stream));
  if (m.has_shared) {
    r.routing.shared_scale.resize(tokens);
    MK_CUDA_CHECK(cudaMemcpyAsync(r.routing.shared_scale.data(), m.shared_scale.ptr,
                                  static_cast<size_t>(tokens) * 4, cudaMemcpyDeviceToHost,
                                  m.stream));
  }
  MK_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  MK_CHECK(error == 0, "GPU routing produced an expert id outside [0, "
                           << m.E + (fused ? m.S : 0) << ") (dispatch dropped it)");
  r.y.resize(n_x);
  for (size_t i = 0; i < n_x; ++i) r.y[i] = bf16_to_float(Bf16{y16[i]});
  return r;
}

LaunchCount GpuMoeLayer::count_launches(int tokens, bool fused) {
  Impl& m = *impl_;
  MK_CUDA_CHECK(cudaSetDevice(m.opt.device));
  cudaGraph_t graph = nullptr;
  MK_CUDA_CHECK(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal));
  try {
    m.forward_device(m.x_in.ptr, m.y_out.ptr, tokens, m.resolve_fused(fused ? FuseShared::On
                                                                            : FuseShared::Off,
                                                                      tokens),
                     m.stream);
  } catch (...) {
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(m.stream, &broken);
    if (broken != nullptr) (void)cudaGraphDestroy(broken);
    throw;
  }
  MK_CUDA_CHECK(cudaStreamEndCapture(m.stream, &graph));
  size_t n = 0;
  MK_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  MK_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  LaunchCount c;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    MK_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeKernel) {
      ++c.kernels;
    } else {
      ++c.other_nodes;
    }
  }
  MK_CUDA_CHECK(cudaGraphDestroy(graph));
  return c;
}

void GpuMoeLayer::set_trace(unsigned long long* words) { impl_->trace = words; }

std::vector<float> GpuMoeLayer::last_logits(int tokens) const {
  const Impl& m = *impl_;
  MK_CHECK(tokens >= 0 && tokens <= m.opt.max_tokens,
           "expected 0 <= tokens <= max_tokens (" << m.opt.max_tokens << "), got " << tokens);
  std::vector<float> out(static_cast<size_t>(tokens) * m.cols);
  MK_CUDA_CHECK(cudaSetDevice(m.opt.device));
  MK_CUDA_CHECK(cudaMemcpyAsync(out.data(), m.logits.ptr, out.size() * sizeof(float),
                                cudaMemcpyDeviceToHost, m.stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return out;
}

ForwardResult forward_once(const LayerWeights& w, const Bf16* x, int tokens, FuseShared fuse) {
  GpuLayerOptions opt;
  opt.max_tokens = std::max(tokens, 1);
  // Random weights (origin "random seed N", weights.h) are regenerated on the device: uploading
  // would materialise every expert on the host (22.6 GB for DeepSeek-V3).
  const std::string origin = w.origin();
  const std::string prefix = "random seed ";
  if (origin.rfind(prefix, 0) == 0) {
    size_t used = 0;
    const unsigned long long seed = std::stoull(origin.substr(prefix.size()), &used);
    if (used == origin.size() - prefix.size()) {
      return GpuMoeLayer::create_random(w.spec(), w.layer(), seed, opt)->forward(x, tokens, fuse);
    }
  }
  return GpuMoeLayer::create(w, opt)->forward(x, tokens, fuse);
}

bool available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" +
                    cudaGetErrorString(err) + ")";
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device found";
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = "cudaGetDeviceProperties(0) failed";
    return false;
  }
  if (prop.major != 9) {
    if (why) {
      *why = std::string("device 0 (") + prop.name + ") is sm_" + std::to_string(prop.major) +
             std::to_string(prop.minor) + "; moekit's kernels are built for sm_90a";
    }
    return false;
  }
  if (why) why->clear();
  return true;
}

}  // namespace moekit::cuda

// route_on_device (cuda_layer.h): the routing + dispatch kernel on host logits, for tests. It
// allocates its own buffers (not for hot paths), poisons the outputs and copies everything back.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/routing/routing.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

struct Scratch {
  std::vector<void*> ptrs;
  ~Scratch() {
    for (void* p : ptrs) MK_CUDA_WARN(cudaFree(p));
  }
  template <typename T>
  T* alloc(size_t count) {
    void* p = nullptr;
    MK_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
    ptrs.push_back(p);
    return static_cast<T*>(p);
  }
};

}  // namespace

Routing route_on_device(const RoutingConfig& cfg, const float* logits, int tokens,
                        const float* correction_bias, int chunk, GpuDispatch* dispatch) {
  MK_CHECK(tokens >= 1, "expected tokens >= 1, got " << tokens);
  MK_CHECK(cfg.num_experts >= 1 && cfg.num_experts <= kRoutingMaxExperts,
           "GPU routing takes 1.." << kRoutingMaxExperts << " experts, got " << cfg.num_experts);
  MK_CHECK(cfg.top_k + cfg.shared_slots <= 32,
           "GPU routing holds top_k + shared slots <= 32, got " << cfg.top_k + cfg.shared_slots);
  MK_CHECK(cfg.n_group >= 1 && cfg.n_group <= 32, "GPU routing takes n_group in 1..32, got "
                                                      << cfg.n_group);
  MK_CHECK(chunk >= 1, "expected chunk >= 1, got " << chunk);
  MK_CHECK(!cfg.has_correction_bias || correction_bias != nullptr,
           "the routing config has a correction bias but correction_bias is null");
  const int slots = cfg.top_k + cfg.shared_slots;
  const int rows = cfg.num_experts + cfg.shared_slots;
  const size_t pairs = static_cast<size_t>(tokens) * slots;
  const int max_tasks = max_routed_tasks(static_cast<int>(pairs), rows, chunk);
  const int shared_chunks = (tokens + chunk - 1) / chunk;

  Scratch s;
  RoutingParams p;
  p.cfg = cfg;
  p.tokens = tokens;
  float* d_logits = s.alloc<float>(static_cast<size_t>(tokens) * cfg.logits_columns);
  MK_CUDA_CHECK(cudaMemcpy(d_logits, logits,
                           static_cast<size_t>(tokens) * cfg.logits_columns * sizeof(float),
                           cudaMemcpyHostToDevice));
  p.logits = d_logits;
  if (cfg.has_correction_bias) {
    float* d_bias = s.alloc<float>(cfg.num_experts);
    MK_CUDA_CHECK(cudaMemcpy(d_bias, correction_bias, cfg.num_experts * sizeof(float),
                             cudaMemcpyHostToDevice));
    p.correction_bias = d_bias;
  }
  p.ids = s.alloc<int32_t>(pairs);
  p.weights = s.alloc<float>(pairs);
  p.shared_scale = cfg.shared_kind != SharedKind::None ? s.alloc<float>(tokens) : nullptr;
  p.weight_rows = rows;
  p.chunk = chunk;
  p.pair_list = s.alloc<int>(pairs);
  p.tasks = s.alloc<ExpertTask>(max_tasks);
  p.shared_tasks = s.alloc<ExpertTask>(shared_chunks);
  p.counters = s.alloc<DispatchCounters>(1);
  p.tile_counters = s.alloc<int>(4);
  p.num_tile_counters = 4;
  p.error_flag = s.alloc<int>(1);
  MK_CUDA_CHECK(cudaMemset(p.ids, 0xff, pairs * 4));
  MK_CUDA_CHECK(cudaMemset(p.weights, 0xff, pairs * 4));
  MK_CUDA_CHECK(cudaMemset(p.pair_list, 0xff, pairs * 4));
  if (p.shared_scale) MK_CUDA_CHECK(cudaMemset(p.shared_scale, 0xff, tokens * 4));
  MK_CUDA_CHECK(cudaMemset(p.counters, 0, sizeof(DispatchCounters)));
  MK_CUDA_CHECK(cudaMemset(p.counters, 0xff, sizeof(int) * 2));  // num_tasks poisoned
  MK_CUDA_CHECK(cudaMemset(p.tile_counters, 0xff, 4 * sizeof(int)));
  MK_CUDA_CHECK(cudaMemset(p.error_flag, 0, sizeof(int)));
  cudaStream_t stream = nullptr;
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  try {
    launch_routing(p, stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    MK_CUDA_WARN(cudaStreamDestroy(stream));
    throw;
  }
  MK_CUDA_CHECK(cudaStreamDestroy(stream));

  Routing r;
  r.tokens = tokens;
  r.slots = slots;
  r.ids.resize(pairs);
  r.weights.resize(pairs);
  MK_CUDA_CHECK(cudaMemcpy(r.ids.data(), p.ids, pairs * 4, cudaMemcpyDeviceToHost));
  MK_CUDA_CHECK(cudaMemcpy(r.weights.data(), p.weights, pairs * 4, cudaMemcpyDeviceToHost));
  if (p.shared_scale) {
    r.shared_scale.resize(tokens);
    MK_CUDA_CHECK(cudaMemcpy(r.shared_scale.data(), p.shared_scale, tokens * 4,
                             cudaMemcpyDeviceToHost));
  }
  if (dispatch != nullptr) {
    DispatchCounters c{};
    int err = 0;
    std::vector<int> tiles(4);
    MK_CUDA_CHECK(cudaMemcpy(&c, p.counters, sizeof c, cudaMemcpyDeviceToHost));
    MK_CUDA_CHECK(cudaMemcpy(&err, p.error_flag, 4, cudaMemcpyDeviceToHost));
    MK_CUDA_CHECK(cudaMemcpy(tiles.data(), p.tile_counters, 16, cudaMemcpyDeviceToHost));
    for (int v : tiles) MK_CHECK(v == 0, "dispatch left a combine tile counter at " << v);
    MK_CHECK(c.routing_done == 0 && c.work[0] == 0 && c.work[1] == 0,
             "dispatch did not reset its counters (routing_done " << c.routing_done << ")");
    MK_CHECK(c.num_tasks >= 0 && c.num_tasks <= max_tasks,
             "dispatch wrote num_tasks " << c.num_tasks << ", expected 0.." << max_tasks);
    dispatch->num_tasks = c.num_tasks;
    dispatch->num_shared_tasks = c.num_shared_tasks;
    dispatch->id_out_of_range = err != 0;
    dispatch->pair_list.resize(pairs);
    MK_CUDA_CHECK(cudaMemcpy(dispatch->pair_list.data(), p.pair_list, pairs * 4,
                             cudaMemcpyDeviceToHost));
    std::vector<ExpertTask> tasks(c.num_tasks);
    MK_CUDA_CHECK(cudaMemcpy(tasks.data(), p.tasks, c.num_tasks * sizeof(ExpertTask),
                             cudaMemcpyDeviceToHost));
    dispatch->task_expert.clear();
    dispatch->task_begin.clear();
    dispatch->task_count.clear();
    dispatch->task_more.clear();
    for (const ExpertTask& t : tasks) {
      dispatch->task_expert.push_back(t.expert);
      dispatch->task_begin.push_back(t.begin);
      dispatch->task_count.push_back(t.count);
      dispatch->task_more.push_back(t.more);
    }
  }
  return r;
}

}  // namespace moekit::cuda

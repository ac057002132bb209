// The routing + dispatch op on the GPU: fp32 router logits -> per-token expert ids and weights
// (every mode of DESIGN.md §1, fused shared slots appended, §2) -> per-expert token-slot lists
// and the task list the expert kernels consume. One launch (routing_kernel.cuh, align.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "moekit/routing.h"

namespace moekit::cuda {

// One unit of expert work: `count` (<= chunk) consecutive entries of the pair list, all routed to
// `expert`, starting at `begin`. The expert kernels take (task, row tile) work items.
struct ExpertTask {
  int expert;
  int begin;
  int count;
  int more;  // 1: the next task holds more tokens of the same expert (the expert kernels may keep
             // its weight rows in L2 for it, ExpertsParams::l2_keep), else 0
};

// Counters the expert kernels use; zeroed by the align step of every forward so that a graph
// replay (or an earlier aborted run) never sees stale values.
struct DispatchCounters {
  int num_tasks;          // routed tasks of this forward
  int num_shared_tasks;   // unfused shared MLP tasks (token chunks)
  int routing_done;       // CTAs of the routing kernel that finished (last one aligns)
  int pad0;
  int work[4];            // dynamic work-item counters: routed gate/up, routed down, shared x2
  // The self-routing gate/up kernel's work counter and its CTAs done (ExpertsParams::self_route):
  // no align step runs before that kernel, so it leaves them zeroed itself (its last CTA).
  int self_route_work;
  int self_route_ctas_done;
};

struct RoutingParams {
  RoutingConfig cfg;          // plain struct, copied to the kernel
  int tokens = 0;
  const float* logits = nullptr;           // [tokens, cfg.logits_columns]
  const float* correction_bias = nullptr;  // [E] or null
  int32_t* ids = nullptr;                  // [tokens, slots]
  float* weights = nullptr;                // [tokens, slots]
  float* shared_scale = nullptr;           // [tokens] or null (no shared expert)

  // dispatch (align); dispatch false: the kernel routes only (the prefill path permutes the
  // pairs itself), and every field below but error_flag and trace goes unread
  bool dispatch = true;
  int weight_rows = 0;             // E + S: the experts the lists count, never the routed E alone
  int chunk = 8;                   // tokens per task (the expert kernels' n-tile capacity)
  int* pair_list = nullptr;        // [tokens*slots]: pair indices grouped by expert
  ExpertTask* tasks = nullptr;     // [max tasks]
  ExpertTask* shared_tasks = nullptr;  // [ceil(tokens/chunk)] for the unfused shared MLP
  DispatchCounters* counters = nullptr;
  int* tile_counters = nullptr;    // combine counters to zero
  int num_tile_counters = 0;
  // per-task counters zeroed for every task of the forward (its length is the task
  // capacity), or null (the layer passes null)
  int* task_done = nullptr;
  int* error_flag = nullptr;       // set to 1 when an id falls outside [0, weight_rows); or null
  unsigned long long* trace = nullptr;  // kernel timeline (cuda/common/trace.cuh) or null
};

// Upper bound of the routed task count for `pairs` pairs over `rows` experts in chunks of `chunk`:
// sum_e ceil(n_e / chunk) <= active + pairs / chunk.
inline int max_routed_tasks(int pairs, int rows, int chunk) {
  const int active = pairs < rows ? pairs : rows;
  return active + pairs / chunk + 1;
}

// Launches the routing kernel (grid of ceil(T/16) CTAs; the last CTA to finish aligns), with
// programmatic dependent launch when `pdl`.
void launch_routing(const RoutingParams& p, cudaStream_t stream, bool pdl = true);

// Largest E the kernel takes (a warp holds one token's row, 16 experts per lane).
constexpr int kRoutingMaxExperts = 512;
// Largest E + S the align step counts (one shared-memory counter per weight row).
constexpr int kAlignMaxRows = 2048;

}  // namespace moekit::cuda

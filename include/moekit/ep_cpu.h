// The expert-parallel forward simulated on the CPU: world_size "ranks" in one process, each with
// its own tokens and its own borrowed weights (MoeWeightsView), exchanging buffers by memcpy
// where a GPU build uses NCCL. It executes the plans of moekit/ep.h with the CPU reference's
// routing and expert math, so it is the oracle of the plans and of every transport:
//
//   per rank   route its tokens (cpu_reference::router_logits + route, the replicated router)
//              -> plan_dispatch (+ check_capacity in low-latency mode)
//   exchange   the counts (plan_receives), then each source's rows and pairs into every
//              destination's receive buffers at the layout's offsets
//   per rank   run its local experts on every received pair (weight applied there), in the
//              order received
//   exchange   the weighted outputs back into each source's return buffer, laid out like its plan
//   per rank   combine token t's outputs by slot 0 .. slots-1, then the unfused shared MLP
//
// Outputs travel in double here (a GPU transport carries bf16), so y is bitwise the single-rank
// cpu_reference::forward's on the same tokens, whatever the world size and placement.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/ep.h"
#include "moekit/layer.h"
#include "moekit/moe.h"

namespace moekit::ep {

struct RankTokens {
  const Bf16* x = nullptr;  // [tokens, H] host memory
  int tokens = 0;           // 0: the rank has no tokens this step (it still serves its experts)
};

struct SimOptions {
  Mode mode = Mode::Throughput;
  int max_tokens_per_rank = 0;  // LowLatency: sizes the fixed buffers (required)
  // Auto and On fuse the shared expert where the spec can (On throws where it cannot): every
  // rank's view then holds the S fused slots after its routed experts; Off runs the unfused
  // shared MLP on each token's own rank (every view holds shared_w13 / shared_w2).
  FuseShared fuse = FuseShared::Auto;
};

struct RankResult {
  ForwardResult forward;  // y [tokens, H] and the rank's routing, as cpu_reference::forward's
  DispatchPlan dispatch;  // what the rank sent
  ReceiveLayout receive;  // what it received
  int64_t remote_bytes_dispatch = 0;  // bf16 token rows + pair records sent to other ranks
  int64_t remote_bytes_combine = 0;   // output rows returned to other ranks (at bf16)
};

// Runs one layer forward over all ranks. weights[r] is rank r's view (host): router and biases
// replicated, stacks holding placement.experts_of(r) in that order (its expert_offset is not
// read: the placement says which experts the rows are), then the fused slots or the unfused
// shared MLP as `options.fuse` needs. Throws naming the rank whose view or tokens do not fit.
std::vector<RankResult> simulated_forward(const MoeSpec& spec, const Placement& placement,
                                          const std::vector<MoeWeightsView>& weights,
                                          const std::vector<RankTokens>& tokens,
                                          const SimOptions& options = {});

}  // namespace moekit::ep

// Expert parallelism with every rank on one GPU: the dispatch and combine kernels
// (src/cuda/ep/) run between the ranks' own buffers, with cudaMemcpyAsync standing in for NCCL
// (the "local transport"). It tests the kernels against the single-GPU layer on one device, and is
// the shape the NCCL transports take: only the copies between ranks change.
//
// Per forward, on one stream, for each rank r (its tokens x_r, its device view):
//   route      MoeOp::route on x_r: topk ids / weights [T_r, k], the gated shared scale
//   home       MoeOp::experts on x_r with r's view: its own experts' pairs + the shared expert
//              (the fused slots never leave the rank)
//   pack       per destination d != r: the tokens with a pair on d, their rows and their whole
//              k-wide (id, weight) rows, packed (ep_dispatch_pack)
//   transport  the packed blocks into d's receive buffer (Throughput: the counts read first, then
//              exactly those rows; LowLatency: fixed blocks of max_tokens_per_rank rows, unused
//              rows holding an id outside d's slice, so no count reaches the host)
//   remote     MoeOp::experts on d's receive buffer with d's view, no shared expert: the view's
//              slice drops the pairs of other ranks, so each row's result is its pairs on d
//   return     the result rows back to r, then the combine: y_r[t] = sum over ranks in rank order
//              of r's home row and each destination's row for t (fp32, rounded to bf16 once)
//
// Unlike the CPU simulation (ep_cpu.h, one returned row per pair, bitwise the reference), the
// destination reduces a token's pairs before returning (the existing expert kernels' combine), so
// each rank's partial is rounded to bf16: y matches the single-GPU layer to bf16 rounding of the
// partials (tests/cuda/test_ep_local.cpp), deterministically. Contiguous placements only (the
// engine API's slices); a build without CUDA throws naming that.
#pragma once

#include <memory>
#include <vector>

#include "moekit/ep.h"
#include "moekit/moe.h"

struct CUstream_st;

namespace moekit::ep {

// The most ranks the local transport and its kernels take.
inline constexpr int kMaxLocalRanks = 8;

struct LocalRank {
  MoeWeightsView
      weights;  // device view: the placement's slice (expert_offset, expert_count) and
                // the shared expert (fused slots and/or the unfused MLP) where it has one
  const void* x = nullptr;  // [tokens, H] bf16, device
  void* y = nullptr;        // [tokens, H] bf16, device
  int tokens = 0;
};

struct LocalOptions {
  Mode mode = Mode::Throughput;
  int max_tokens_per_rank = 0;  // sizes every buffer (both modes), > 0
  MoeOptions engine;            // the ranks' MoeOp (max_tokens raised to what the buffers need)
};

class LocalTransportLayer {
 public:
  // Allocates every rank's buffers on options.engine.device. Throws on a non-contiguous
  // placement, more than kMaxLocalRanks ranks, or a hidden size that is not a multiple of 8.
  LocalTransportLayer(const MoeSpec& spec, const Placement& placement, const LocalOptions& options);
  ~LocalTransportLayer();
  LocalTransportLayer(const LocalTransportLayer&) = delete;
  LocalTransportLayer& operator=(const LocalTransportLayer&) = delete;

  // One layer forward over all ranks (ranks[r] is rank r). Throughput synchronises `stream` once
  // (the count exchange); LowLatency does not. Throws naming the rank whose view or token count
  // does not fit.
  void forward(const std::vector<LocalRank>& ranks, CUstream_st* stream);

  // After forward (synchronises `stream`): rank r's routing ids [tokens, k] and what its last
  // forward sent to each rank (rows; 0 to itself).
  std::vector<int32_t> topk_ids(int rank, CUstream_st* stream) const;
  std::vector<int32_t> rows_sent(int rank, CUstream_st* stream) const;
  // The ranks' MoeOp status (an id out of range anywhere); synchronises `stream`, clears it.
  MoeStatus read_status(CUstream_st* stream);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace moekit::ep

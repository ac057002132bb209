// Expert parallelism on the GPU: one MoE layer's routed experts spread over ranks (one GPU each
// on NCCL; every rank on one GPU for the local transport), each rank running the engine API's
// MoeOp on its slice of the experts (moekit/moe.h), the dispatch and combine kernels between them.
//
// Per forward, on rank r (its tokens x_r, its device view):
//   route      MoeOp::route on x_r: topk ids / weights [T_r, k], the gated shared scale
//   home       MoeOp::experts on x_r with r's view: its own experts' pairs + the shared expert
//              (the fused slots never leave the rank)
//   pack       per destination d != r: the tokens with a pair on d (each once, in token order),
//              their rows and their whole k-wide (id, weight) rows
//   counts     Throughput: the rows each rank sends each other rank, exchanged and read to the
//              host (the one host synchronisation); LowLatency has none
//   dispatch   the packed rows, ids and weights to their destinations (Throughput: exactly the
//              counted rows, each source's block after the lower ranks'; LowLatency: fixed blocks
//              of max_tokens_per_rank rows whose unused rows hold an id outside the destination's
//              slice, so the shapes are static and a forward is capturable in one CUDA graph)
//   remote     MoeOp::experts on what r received, its view, no shared expert: the view's slice
//              drops the pairs of other ranks, so each row's result is its pairs on r
//   return     each received row's result back to its source
//   combine    y_r[t] = the sum in rank order of r's home row and each destination's row for t
//              (fp32, rounded to bf16 once)
//
// Each destination reduces a token's pairs before returning (the expert kernels' combine), so a
// rank's partial is rounded to bf16: y matches the single-GPU layer to that rounding, and the order
// is fixed, so it is deterministic (the CPU simulation, moekit/ep_cpu.h, returns one row per pair
// and matches the reference bitwise). Contiguous placements only (the engine API's slices), at
// most kMaxGpuRanks ranks. A build without CUDA throws naming that; without NCCL, the NCCL paths
// throw with nccl_support().describe().
#pragma once

#include <memory>
#include <vector>

#include "moekit/ep.h"
#include "moekit/moe.h"

struct CUstream_st;
struct ncclComm;

namespace moekit::ep {

// The most ranks the GPU path takes (one host's NVLink domain).
inline constexpr int kMaxGpuRanks = 8;

// One rank's call: its weights and its tokens.
struct RankIo {
  MoeWeightsView weights;   // device view: the placement's slice (expert_offset, expert_count)
                            // and the shared expert (fused slots and/or the unfused MLP)
  const void* x = nullptr;  // [tokens, H] bf16, on the rank's device
  void* y = nullptr;        // [tokens, H] bf16, on the rank's device
  int tokens = 0;
};

struct LayerOptions {
  Mode mode = Mode::Throughput;
  int max_tokens_per_rank = 0;  // the most tokens a rank routes per forward; sizes every buffer
  MoeOptions engine;            // each rank's MoeOp (max_tokens raised to what the buffers need)
  bool timings = false;         // record the phases' times (CUDA events; not under graph capture)
};

// One rank's last forward, read after it finished (timings on).
struct RankStats {
  float route_us = 0, home_us = 0, pack_us = 0, counts_us = 0, dispatch_us = 0, remote_us = 0,
        return_us = 0, combine_us = 0, total_us = 0;
  size_t dispatch_bytes = 0;  // rows, ids and weights this rank sent (counts included)
  size_t return_bytes = 0;    // result rows this rank sent back
};

// One rank of an expert-parallel layer on an NCCL communicator the engine owns (one rank per
// process or per thread; every rank calls forward for every step, with any token count up to
// max_tokens_per_rank, zero included). The rank and world size are the communicator's; its
// device must be options.engine.device.
class MoeLayer {
 public:
  MoeLayer(const MoeSpec& spec, const Placement& placement, ncclComm* comm,
           const LayerOptions& options);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // y = the layer on x over all ranks, on `stream`. Throughput synchronises `stream` once (the
  // counts); LowLatency does not (capturable, timings off). Throws naming what does not fit
  // before anything is sent: a view of other experts than the placement's, more tokens than
  // max_tokens_per_rank (every rank must then stop too: the others wait in NCCL).
  void forward(const RankIo& io, CUstream_st* stream);

  int rank() const;
  int world_size() const;
  RankStats stats() const;  // the last forward's; synchronises its stream
  MoeStatus read_status(CUstream_st* stream);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// How the ranks of a GroupLayer reach each other.
enum class Transport {
  Local,  // every rank on options.engine.device, cudaMemcpyAsync between their buffers
  Nccl,   // rank r on devices[r], an NCCL communicator each (ncclCommInitAll)
};

// Every rank of an expert-parallel layer driven by this one process: the tests and the bench.
// Each rank runs on a stream of its own, on its device; the NCCL calls of a phase are posted for
// every rank inside one group (a thread driving several communicators must).
class GroupLayer {
 public:
  // devices: Nccl: rank r's device, one per rank, each once; Local: empty.
  GroupLayer(const MoeSpec& spec, const Placement& placement, Transport transport,
             const std::vector<int>& devices, const LayerOptions& options);
  ~GroupLayer();
  GroupLayer(const GroupLayer&) = delete;
  GroupLayer& operator=(const GroupLayer&) = delete;

  // One forward over every rank (ranks[r] is rank r), enqueued on the ranks' streams
  // (Throughput waits for the counts once); synchronize() waits for it.
  void forward(const std::vector<RankIo>& ranks);
  void synchronize();

  int world_size() const;
  int device(int rank) const;
  CUstream_st* stream(int rank) const;  // where rank's work runs (its inputs' producers sync first)
  // After a forward (synchronising): rank r's routing ids [tokens, k], the rows it sent each
  // rank (0 to itself), its phases' times (timings on), its MoeOp's status (cleared).
  std::vector<int32_t> topk_ids(int rank) const;
  std::vector<int32_t> rows_sent(int rank) const;
  RankStats stats(int rank) const;
  MoeStatus read_status(int rank);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace moekit::ep

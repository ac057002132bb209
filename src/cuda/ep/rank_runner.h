// One expert-parallel rank on the GPU (moekit/ep_layer.h): its MoeOp, workspace and buffers, and
// the forward's phases as calls the drivers order. A driver runs each phase for every rank it
// drives (run_forward); the phases that move data only post to an Exchange, so all ranks of a
// thread post a phase inside one group.
//
// Buffers, cap = max_tokens_per_rank rows:
//   ids / weights [cap, k], shared scale [cap], home partial [cap, H]
//   pos [W, cap] (token t's packed row in the block for d, -1 = none), counts [W] (rows to each d)
//   per d != r: send x [cap, H], ids / weights [cap, k]; back partial [cap, H]
//   receive x / ids / weights / partial of (W - 1) blocks (Throughput: packed in source order at
//   the counts' prefix; LowLatency: source s at block s < r ? s : s - 1), recv counts [W]
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "cuda/common/device_buffer.h"
#include "cuda/ep/exchange.h"
#include "moekit/ep_layer.h"

namespace moekit::ep {

class RankRunner {
 public:
  RankRunner(const MoeSpec& spec, const Placement& placement, int rank,
             const LayerOptions& options);
  ~RankRunner();
  RankRunner(const RankRunner&) = delete;
  RankRunner& operator=(const RankRunner&) = delete;

  int rank() const { return rank_; }
  int device() const { return options_.engine.device; }
  bool low_latency() const { return low_latency_; }

  void check(const RankIo& io) const;            // throws naming what does not fit, sends nothing
  void start(const RankIo& io, cudaStream_t s);  // route, home, pack (io already checked)
  void post_counts(Exchange& ex);                // Throughput: the row counts, each way
  void read_counts();                            // Throughput: counts to the host (async)
  void wait_counts();                            // Throughput: the host counts are there
  void post_dispatch(Exchange& ex);
  void remote_experts();
  void post_return(Exchange& ex);
  void finish();  // the combine into io.y

  // after a forward: rank's routing ids, rows sent to each rank, stats (timings), MoeOp status
  std::vector<int32_t> topk_ids() const;
  std::vector<int32_t> rows_sent() const;
  RankStats stats() const;
  MoeStatus read_status(cudaStream_t stream);  // synchronises it, clears the status

 private:
  int rows_to(int d) const;    // rows this rank sends d
  int rows_from(int s) const;  // rows this rank receives from s
  int offset_from(int s) const;
  int received_rows() const;
  bool has_shared() const { return spec_.shared_kind != SharedKind::None; }
  void mark(int phase);  // timings: an event at a phase boundary

  MoeSpec spec_;
  Placement placement_;
  LayerOptions options_;
  int rank_ = 0, W_ = 0, H_ = 0, k_ = 0, cap_ = 0;
  bool low_latency_ = false;
  std::unique_ptr<MoeOp> op_;
  cuda::DeviceBuffer ws_;
  cuda::DeviceBuffer ids_, weights_, scale_, home_, pos_, counts_, recv_counts_;
  cuda::DeviceBuffer recv_x_, recv_ids_, recv_weights_, recv_y_;
  std::vector<cuda::DeviceBuffer> send_x_, send_ids_, send_weights_, back_;  // [W], none at rank
  int32_t* host_counts_ = nullptr;  // pinned [2W]: sent to each rank, then received from each
  cudaEvent_t counts_ready_ = nullptr;
  std::vector<cudaEvent_t> marks_;  // timings: one per phase boundary
  RankIo io_;
  cudaStream_t stream_ = nullptr;
};

// One forward of the ranks this thread drives (ranks[i] runs io[i] on streams[i]): every phase
// for every rank, the exchanges of a phase inside one begin / end. Checks every rank before
// anything runs.
void run_forward(const std::vector<RankRunner*>& ranks, const std::vector<RankIo>& io,
                 const std::vector<cudaStream_t>& streams, Exchange& ex);

}  // namespace moekit::ep

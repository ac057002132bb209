// The expert-parallel bench (`moekit bench --ep N`): one process drives every rank of a
// GroupLayer (moekit/ep_layer.h) on random weights of a model, and reports per phase the slowest
// rank's time, the bytes crossing the links, the fraction of the link's bandwidth measured in the
// same run, and an NCCL all-to-all of the same bytes (grouped send / receive, as PyTorch's
// all_to_all_single) timed beside it.
#pragma once

#include <string>
#include <vector>

#include "moekit/ep_layer.h"

namespace moekit::ep {

struct EpBenchOptions {
  std::string model;                      // short name or path (load_spec)
  int world = 2;                          // ranks
  Transport transport = Transport::Nccl;  // Local: every rank on device 0 (no link)
  std::vector<int> batches{1, 32, 128};   // tokens per rank
  std::vector<Mode> modes{Mode::LowLatency, Mode::Throughput};
  uint64_t seed = 0;
  int iterations = 0;  // forwards per measurement; 0 = automatic
};

struct EpBenchRecord {
  std::string model, device, transport, mode;
  int world = 0, tokens_per_rank = 0;
  double us_per_forward = 0;     // host wall time of a forward over every rank (mean)
  RankStats slowest;             // each phase's time on its slowest rank (bytes: the busiest rank)
  double link_bytes = 0;         // bytes crossing the links per forward, all ranks, both ways
  double link_gbs = 0;           // measured: one device's copy to another (Local: on one device)
  double exchange_us = 0;        // the slowest rank's dispatch + return
  double exchange_floor_us = 0;  // the busiest rank's dispatch + return bytes / link_gbs
  double link_fraction = 0;      // exchange_floor_us / exchange_us
  double alltoall_us = 0;        // NCCL grouped send / receive of each pair's dispatch and
                                 // return bytes, two all-to-alls (0 for Local)
  double single_gpu_us = 0;      // the whole layer on one GPU over all world * T tokens (0 where
                                 // the model's experts do not fit one GPU)
  double rel_error = -1;  // |y - y_single| / |y_single| over every rank's tokens (-1: not run);
                          // above 1e-2 bench_ep throws
};

// Runs every mode and batch; prints progress to stderr when verbose. Throws naming what is missing
// (GPUs, NCCL) before allocating.
std::vector<EpBenchRecord> bench_ep(const EpBenchOptions& opt, bool verbose = false);

}  // namespace moekit::ep

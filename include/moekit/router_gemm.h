// The router GEMM on the GPU, public side: logits[M,N] = x[M,K] . Wg[N,K]^T (+ bias), fp32 out.
//
// The layer calls the device-pointer op in src/cuda/router_gemm/router_gemm.h. This header is
// CUDA-free: a host-array entry (tests, the CLI) and the timer behind `moekit tune` and
// `moekit bench router-gemm`. Without CUDA (MOEKIT_CUDA=OFF) everything here throws a clear error.
// Tables and the lookup: moekit/tuning.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moekit/dtype.h"
#include "moekit/tuning.h"

namespace moekit {
class LayerWeights;
}

namespace moekit::cuda {

// Router logits of one layer on the current GPU, host in and out (copies the router weights to
// the device on every call: for tests and tools, not for serving). Same arguments and result as
// cpu_reference::router_logits. `config` null = the tuned dispatch.
std::vector<float> router_logits(const LayerWeights& w, const Bf16* x, int tokens,
                                 const tuning::RouterGemmConfig* config = nullptr);

// Programmatic dependent launch for the router GEMM kernels: on unless switched off here (the
// CLI does for MOEKIT_PDL=0; the benchmark switches it to time both). Process-wide; affects
// launches made after the call.
void set_router_gemm_pdl(bool enabled);
bool router_gemm_pdl();

struct RouterGemmDeviceInfo {
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int sms = 0;
  size_t l2_bytes = 0;
  tuning::Arch arch = tuning::Arch::Generic;
};
RouterGemmDeviceInfo router_gemm_device_info();  // the current device; throws without a GPU

// Times router GEMM launches of one shape the way they run in a decode step: a CUDA graph of
// copies() launches, each on its own copy of the weights (and x, out) so that together they exceed
// twice the L2 and every launch reads its weights from HBM; the graph is replayed and the median
// replay time divided by the launches. Weights and x are random (fixed seed), bf16-exact.
class RouterGemmTimer {
 public:
  RouterGemmTimer(const tuning::RouterGemmShape& shape, int max_m, uint64_t seed = 0);
  ~RouterGemmTimer();
  RouterGemmTimer(const RouterGemmTimer&) = delete;
  RouterGemmTimer& operator=(const RouterGemmTimer&) = delete;

  int copies() const;
  // Median microseconds per launch of `config` at M = m (1 <= m <= max_m).
  double time_config_us(const tuning::RouterGemmConfig& config, int m);
  // The same through the dispatch (router_gemm(problem, stream), as the layer calls it).
  double time_dispatch_us(int m);
  // An empty kernel in the same graph method: the launch share of the floor.
  double time_empty_us();
  // Microseconds one launch adds to a decode step: each launch follows a stand-in for the
  // previous layer's expert kernel (streams 16 MB from HBM, lets its dependents launch at once,
  // writes x last), and the time of the graph of stand-ins alone is subtracted. A PDL launch
  // (the dispatch, set_router_gemm_pdl) loads its weights under the stand-in; one without PDL,
  // or cuBLAS, starts after it. `config` null = the dispatch.
  double time_in_step_us(const tuning::RouterGemmConfig* config, int m);
  // The same for an empty kernel launched with PDL that only waits: the kernel boundary's share
  // of a dependent kernel's time in the step.
  double time_in_step_empty_us();
  // Runs `config` once on copy 0 at M = m and returns its output [m, N] (poisoned with NaN
  // before the run), for checking a candidate before trusting its time.
  std::vector<float> run(const tuning::RouterGemmConfig& config, int m);
  // The same after the stand-in, with copy 0's x poisoned (NaN) until the stand-in writes it
  // (every copy's x holds the same values, which the stand-in rewrites): the output of a launch
  // that read x before its PDL wait is NaN.
  std::vector<float> run_in_step(const tuning::RouterGemmConfig& config, int m);
  // Bytes one launch must move at M = m: weights + x + out (+ bias).
  double bytes(int m) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moekit::cuda

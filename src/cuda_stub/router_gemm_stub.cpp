// The public router GEMM API (moekit/router_gemm.h) in a build without CUDA: every entry throws
// an error that says why, so callers and the CLI report it instead of failing to link.
#include "moekit/error.h"
#include "moekit/router_gemm.h"

namespace moekit::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  MK_FAIL(what << " needs the CUDA backend, but moekit was built without it (MOEKIT_CUDA=OFF or "
                  "no nvcc found); rebuild with -DMOEKIT_CUDA=ON");
}
}  // namespace

std::vector<float> router_logits(const LayerWeights&, const Bf16*, int,
                                 const tuning::RouterGemmConfig*) {
  no_cuda("cuda::router_logits");
}

void set_router_gemm_pdl(bool) { no_cuda("cuda::set_router_gemm_pdl"); }
bool router_gemm_pdl() { return false; }

RouterGemmDeviceInfo router_gemm_device_info() { no_cuda("cuda::router_gemm_device_info"); }

struct RouterGemmTimer::Impl {};

RouterGemmTimer::RouterGemmTimer(const tuning::RouterGemmShape&, int, uint64_t) {
  no_cuda("the router GEMM timer");
}
RouterGemmTimer::~RouterGemmTimer() = default;
int RouterGemmTimer::copies() const { no_cuda("the router GEMM timer"); }
double RouterGemmTimer::time_config_us(const tuning::RouterGemmConfig&, int) {
  no_cuda("the router GEMM timer");
}
double RouterGemmTimer::time_dispatch_us(int) { no_cuda("the router GEMM timer"); }
double RouterGemmTimer::time_empty_us() { no_cuda("the router GEMM timer"); }
std::vector<float> RouterGemmTimer::run(const tuning::RouterGemmConfig&, int) {
  no_cuda("the router GEMM timer");
}
double RouterGemmTimer::time_in_step_us(const tuning::RouterGemmConfig*, int) {
  no_cuda("the router GEMM timer");
}
double RouterGemmTimer::time_in_step_empty_us() { no_cuda("the router GEMM timer"); }
std::vector<float> RouterGemmTimer::run_in_step(const tuning::RouterGemmConfig&, int) {
  no_cuda("the router GEMM timer");
}
double RouterGemmTimer::bytes(int) const { no_cuda("the router GEMM timer"); }

}  // namespace moekit::cuda

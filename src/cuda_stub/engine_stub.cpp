// The engine API's CUDA side (src/engine/gpu_hooks.h) in a build without CUDA: host views run on
// the CPU backends, every call on a device view throws "moekit was built without CUDA", and the
// device workspace a host-only op needs is 0 bytes.
#include "engine/gpu_hooks.h"
#include "moekit/error.h"

namespace moekit {

struct MoeOp::Gpu {};

namespace engine_gpu {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  MK_FAIL(what << " on a device view: moekit was built without CUDA (configure with "
                  "-DMOEKIT_CUDA=ON)");
}
}  // namespace

void require_cuda(const char* what) { no_cuda(what); }
size_t workspace_bytes(const MoeSpec&, int, const MoeOptions&) { return 0; }
MoeOp::Gpu* create(const MoeSpec&, const MoeOptions&) { no_cuda("prepare_workspace"); }
void destroy(MoeOp::Gpu* gpu) { delete gpu; }
void prepare_workspace(MoeOp::Gpu&, void*, size_t, CUstream_st*) { no_cuda("prepare_workspace"); }
void forward(MoeOp::Gpu&, const MoeWeightsView&, const void*, void*, int, void*, size_t,
             CUstream_st*) {
  no_cuda("forward");
}
void route(MoeOp::Gpu&, const MoeWeightsView&, const void*, const float*, int, int32_t*, float*,
           float*, void*, size_t, CUstream_st*) {
  no_cuda("route");
}
void experts(MoeOp::Gpu&, const MoeWeightsView&, const void*, const int32_t*, const float*, void*,
             int, const ExpertsOptions&, void*, size_t, CUstream_st*) {
  no_cuda("experts");
}
MoeStatus read_status(int, void*, size_t, CUstream_st*, bool) { no_cuda("read_status"); }

}  // namespace engine_gpu
}  // namespace moekit

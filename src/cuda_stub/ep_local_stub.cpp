// The local-transport expert-parallel layer (moekit/ep_local.h) in a build without CUDA: every
// call throws naming that.
#include "moekit/ep_local.h"
#include "moekit/error.h"

namespace moekit::ep {

struct LocalTransportLayer::Impl {};

namespace {
[[noreturn]] void no_cuda(const char* what) {
  MK_FAIL("LocalTransportLayer::" << what
                                  << ": moekit was built without CUDA (configure with "
                                     "-DMOEKIT_CUDA=ON)");
}
}  // namespace

LocalTransportLayer::LocalTransportLayer(const MoeSpec&, const Placement&, const LocalOptions&) {
  no_cuda("LocalTransportLayer");
}
LocalTransportLayer::~LocalTransportLayer() = default;
void LocalTransportLayer::forward(const std::vector<LocalRank>&, CUstream_st*) {
  no_cuda("forward");
}
std::vector<int32_t> LocalTransportLayer::topk_ids(int, CUstream_st*) const { no_cuda("topk_ids"); }
std::vector<int32_t> LocalTransportLayer::rows_sent(int, CUstream_st*) const {
  no_cuda("rows_sent");
}
MoeStatus LocalTransportLayer::read_status(CUstream_st*) { no_cuda("read_status"); }

}  // namespace moekit::ep

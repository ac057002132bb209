// The GPU expert-parallel layers (moekit/ep_layer.h) and the NCCL communicator (moekit/ep_nccl.h)
// in a build without CUDA: every call throws naming that.
#include "moekit/ep_bench.h"
#include "moekit/ep_layer.h"
#include "moekit/ep_nccl.h"
#include "moekit/error.h"

namespace moekit::ep {

struct MoeLayer::Impl {};
struct GroupLayer::Impl {};

namespace {
[[noreturn]] void no_cuda(const char* what) {
  MK_FAIL(what << ": moekit was built without CUDA (configure with -DMOEKIT_CUDA=ON); "
               << nccl_support().describe());
}
}  // namespace

MoeLayer::MoeLayer(const MoeSpec&, const Placement&, ncclComm*, const LayerOptions&) {
  no_cuda("ep::MoeLayer");
}
MoeLayer::~MoeLayer() = default;
void MoeLayer::forward(const RankIo&, CUstream_st*) { no_cuda("ep::MoeLayer::forward"); }
int MoeLayer::rank() const { no_cuda("ep::MoeLayer::rank"); }
int MoeLayer::world_size() const { no_cuda("ep::MoeLayer::world_size"); }
RankStats MoeLayer::stats() const { no_cuda("ep::MoeLayer::stats"); }
MoeStatus MoeLayer::read_status(CUstream_st*) { no_cuda("ep::MoeLayer::read_status"); }

GroupLayer::GroupLayer(const MoeSpec&, const Placement&, Transport, const std::vector<int>&,
                       const LayerOptions&) {
  no_cuda("ep::GroupLayer");
}
GroupLayer::~GroupLayer() = default;
void GroupLayer::forward(const std::vector<RankIo>&) { no_cuda("ep::GroupLayer::forward"); }
void GroupLayer::synchronize() { no_cuda("ep::GroupLayer::synchronize"); }
int GroupLayer::world_size() const { no_cuda("ep::GroupLayer::world_size"); }
int GroupLayer::device(int) const { no_cuda("ep::GroupLayer::device"); }
CUstream_st* GroupLayer::stream(int) const { no_cuda("ep::GroupLayer::stream"); }
std::vector<int32_t> GroupLayer::topk_ids(int) const { no_cuda("ep::GroupLayer::topk_ids"); }
std::vector<int32_t> GroupLayer::rows_sent(int) const { no_cuda("ep::GroupLayer::rows_sent"); }
RankStats GroupLayer::stats(int) const { no_cuda("ep::GroupLayer::stats"); }
MoeStatus GroupLayer::read_status(int) { no_cuda("ep::GroupLayer::read_status"); }

Communicator::Communicator(const NcclUniqueId&, int, int, int) { no_cuda("ep::Communicator"); }
std::vector<Communicator> Communicator::all(const std::vector<int>&) {
  no_cuda("ep::Communicator::all");
}
Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

std::vector<EpBenchRecord> bench_ep(const EpBenchOptions&, bool) { no_cuda("bench --ep"); }

}  // namespace moekit::ep

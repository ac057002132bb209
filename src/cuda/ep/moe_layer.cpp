// ep::MoeLayer (moekit/ep_layer.h), one rank on an engine's NCCL communicator, and
// ep::Communicator (moekit/ep_nccl.h), the communicator moekit makes for an engine without one.
#include <utility>

#include "cuda/common/device_guard.h"
#include "cuda/ep/exchange.h"
#include "cuda/ep/rank_runner.h"
#include "ep/nccl_calls.h"
#include "moekit/ep_layer.h"
#include "moekit/ep_nccl.h"
#include "moekit/error.h"

namespace moekit::ep {

struct MoeLayer::Impl {
  int rank = 0, world = 0;
  std::unique_ptr<RankRunner> runner;
  std::unique_ptr<NcclExchange> ex;
};

MoeLayer::MoeLayer(const MoeSpec& spec, const Placement& placement, ncclComm* comm,
                   const LayerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  MK_CHECK(comm != nullptr, "ep::MoeLayer: the NCCL communicator is null");
  Impl& m = *impl_;
  m.world = nccl::world_size(comm);
  m.rank = nccl::rank(comm);
  const int device = nccl::device(comm);
  MK_CHECK(m.world == placement.world_size(), "ep::MoeLayer: the communicator has "
                                                  << m.world << " ranks, the placement "
                                                  << placement.world_size());
  MK_CHECK(device == options.engine.device,
           "ep::MoeLayer: rank " << m.rank << "'s communicator is on device " << device
                                 << ", options.engine.device is " << options.engine.device);
  m.runner = std::make_unique<RankRunner>(spec, placement, m.rank, options);
  std::vector<ncclComm*> comms(m.world, nullptr);
  comms[m.rank] = comm;
  m.ex = std::make_unique<NcclExchange>(std::move(comms));
}

MoeLayer::~MoeLayer() = default;

void MoeLayer::forward(const RankIo& io, CUstream_st* stream) {
  run_forward({impl_->runner.get()}, {io}, {stream}, *impl_->ex);
}

int MoeLayer::rank() const { return impl_->rank; }
int MoeLayer::world_size() const { return impl_->world; }
RankStats MoeLayer::stats() const { return impl_->runner->stats(); }
MoeStatus MoeLayer::read_status(CUstream_st* stream) { return impl_->runner->read_status(stream); }

Communicator::Communicator(const NcclUniqueId& id, int world_size, int rank, int device)
    : rank_(rank), world_size_(world_size), device_(device) {
  cuda::DeviceGuard guard(device);
  comm_ = nccl::init_rank(world_size, id, rank);
}

std::vector<Communicator> Communicator::all(const std::vector<int>& devices) {
  const std::vector<ncclComm*> comms = nccl::init_all(devices);
  std::vector<Communicator> out;
  for (size_t r = 0; r < comms.size(); ++r) {
    out.push_back(
        Communicator(comms[r], static_cast<int>(r), static_cast<int>(comms.size()), devices[r]));
  }
  return out;
}

Communicator::~Communicator() { nccl::destroy(comm_); }

Communicator::Communicator(Communicator&& o) noexcept
    : comm_(std::exchange(o.comm_, nullptr)),
      rank_(o.rank_),
      world_size_(o.world_size_),
      device_(o.device_) {}

Communicator& Communicator::operator=(Communicator&& o) noexcept {
  std::swap(comm_, o.comm_);
  std::swap(rank_, o.rank_);
  std::swap(world_size_, o.world_size_);
  std::swap(device_, o.device_);
  return *this;
}

}  // namespace moekit::ep

// ep::GroupLayer (moekit/ep_layer.h): every rank of an expert-parallel layer in this process, on
// one device (the local transport) or one device each (NCCL, communicators from
// ncclCommInitAll), each rank on a stream of its own.
#include <algorithm>
#include <set>

#include "cuda/common/cuda_check.h"
#include "cuda/common/device_guard.h"
#include "cuda/ep/exchange.h"
#include "cuda/ep/rank_runner.h"
#include "moekit/ep_layer.h"
#include "moekit/ep_nccl.h"
#include "moekit/error.h"

namespace moekit::ep {

struct GroupLayer::Impl {
  std::vector<int> devices;  // [W]
  std::vector<Communicator> comms;
  std::vector<std::unique_ptr<RankRunner>> ranks;
  std::vector<cudaStream_t> streams;
  std::unique_ptr<Exchange> ex;

  ~Impl() {
    ranks.clear();
    for (size_t r = 0; r < streams.size(); ++r) {
      if (streams[r] == nullptr) continue;
      cuda::DeviceGuard guard(devices[r]);
      MK_CUDA_WARN(cudaStreamDestroy(streams[r]));
    }
  }
  const RankRunner& at(int rank) const {
    MK_CHECK(rank >= 0 && rank < static_cast<int>(ranks.size()),
             "expected a rank in [0, " << ranks.size() << "), got " << rank);
    return *ranks[rank];
  }
};

GroupLayer::GroupLayer(const MoeSpec& spec, const Placement& placement, Transport transport,
                       const std::vector<int>& devices, const LayerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const int W = placement.world_size();
  MK_CHECK(W >= 1 && W <= kMaxGpuRanks,
           "expert parallelism on the GPU takes 1 to " << kMaxGpuRanks << " ranks, got " << W);
  if (transport == Transport::Local) {
    MK_CHECK(devices.empty(), "the local transport runs every rank on options.engine.device; got "
                                  << devices.size() << " devices");
    m.devices.assign(W, options.engine.device);
  } else {
    MK_CHECK(static_cast<int>(devices.size()) == W,
             "the NCCL transport takes one device per rank: " << W << " ranks, " << devices.size()
                                                              << " devices");
    MK_CHECK(std::set<int>(devices.begin(), devices.end()).size() == devices.size(),
             "the NCCL transport takes each device once (NCCL refuses two ranks on one GPU)");
    int count = 0;
    MK_CUDA_CHECK(cudaGetDeviceCount(&count));
    const int most = *std::max_element(devices.begin(), devices.end());
    MK_CHECK(*std::min_element(devices.begin(), devices.end()) >= 0 && most < count,
             "expert parallelism over NCCL on " << W << " ranks needs devices up to " << most
                                                << ", this machine has " << count << " GPU"
                                                << (count == 1 ? "" : "s"));
    MK_CHECK(nccl_support().on(), "the NCCL transport: " << nccl_support().describe());
    m.devices = devices;
    m.comms = Communicator::all(devices);
  }
  for (int r = 0; r < W; ++r) {
    LayerOptions ro = options;
    ro.engine.device = m.devices[r];
    m.ranks.push_back(std::make_unique<RankRunner>(spec, placement, r, ro));
    cuda::DeviceGuard guard(m.devices[r]);
    cudaStream_t s = nullptr;
    MK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    m.streams.push_back(s);
  }
  if (transport == Transport::Local) {
    m.ex = std::make_unique<LocalExchange>(options.engine.device);
  } else {
    std::vector<ncclComm*> comms;
    for (const Communicator& c : m.comms) comms.push_back(c.get());
    m.ex = std::make_unique<NcclExchange>(std::move(comms));
  }
}

GroupLayer::~GroupLayer() = default;

void GroupLayer::forward(const std::vector<RankIo>& ranks) {
  Impl& m = *impl_;
  MK_CHECK(ranks.size() == m.ranks.size(), "expected one RankIo for each of the "
                                               << m.ranks.size() << " ranks, got " << ranks.size());
  std::vector<RankRunner*> runners;
  for (auto& r : m.ranks) runners.push_back(r.get());
  run_forward(runners, ranks, m.streams, *m.ex);
}

void GroupLayer::synchronize() {
  for (size_t r = 0; r < impl_->streams.size(); ++r) {
    cuda::DeviceGuard guard(impl_->devices[r]);
    MK_CUDA_CHECK(cudaStreamSynchronize(impl_->streams[r]));
  }
}

int GroupLayer::world_size() const { return static_cast<int>(impl_->ranks.size()); }
int GroupLayer::device(int rank) const { return impl_->at(rank).device(); }
CUstream_st* GroupLayer::stream(int rank) const {
  impl_->at(rank);
  return impl_->streams[rank];
}
std::vector<int32_t> GroupLayer::topk_ids(int rank) const { return impl_->at(rank).topk_ids(); }
std::vector<int32_t> GroupLayer::rows_sent(int rank) const { return impl_->at(rank).rows_sent(); }
RankStats GroupLayer::stats(int rank) const { return impl_->at(rank).stats(); }
MoeStatus GroupLayer::read_status(int rank) {
  impl_->at(rank);
  return impl_->ranks[rank]->read_status(impl_->streams[rank]);
}

}  // namespace moekit::ep

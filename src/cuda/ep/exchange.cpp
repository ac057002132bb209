// The expert-parallel transports (exchange.h): NCCL's grouped send / receive, and the one-GPU
// stand-in that pairs the posts itself.
#include "cuda/ep/exchange.h"

#include <utility>

#include "cuda/common/cuda_check.h"
#include "cuda/common/device_guard.h"
#include "ep/nccl_calls.h"
#include "moekit/error.h"

namespace moekit::ep {

ncclComm* NcclExchange::comm(int rank) const {
  MK_CHECK(rank >= 0 && rank < static_cast<int>(comms_.size()) && comms_[rank] != nullptr,
           "NCCL exchange: rank " << rank << " has no communicator in this process");
  return comms_[rank];
}

void NcclExchange::begin() {
  nccl::group_start();
  open_ = true;
}

void NcclExchange::send(int from, int to, const void* buf, size_t bytes, cudaStream_t stream) {
  nccl::send(buf, bytes, to, comm(from), stream);
}

void NcclExchange::recv(int at, int from, void* buf, size_t bytes, cudaStream_t stream) {
  nccl::recv(buf, bytes, from, comm(at), stream);
}

void NcclExchange::end() {
  open_ = false;
  nccl::group_end();
}

void NcclExchange::abandon() noexcept {
  if (!open_) return;
  open_ = false;
  try {
    nccl::group_end();
  } catch (...) {  // an error is already on its way
  }
}

LocalExchange::LocalExchange(int device) : device_(device) {
  cuda::DeviceGuard guard(device);
  MK_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  MK_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

LocalExchange::~LocalExchange() {
  if (ready_ != nullptr) MK_CUDA_WARN(cudaEventDestroy(ready_));
  if (done_ != nullptr) MK_CUDA_WARN(cudaEventDestroy(done_));
}

void LocalExchange::begin() {
  sends_.clear();
  recvs_.clear();
}

void LocalExchange::send(int from, int to, const void* buf, size_t bytes, cudaStream_t stream) {
  sends_.push_back({from, to, const_cast<void*>(buf), bytes, stream});
}

void LocalExchange::recv(int at, int from, void* buf, size_t bytes, cudaStream_t stream) {
  recvs_.push_back({at, from, buf, bytes, stream});
}

void LocalExchange::end() {
  cuda::DeviceGuard guard(device_);
  std::vector<bool> used(sends_.size(), false);
  for (const Post& r : recvs_) {
    size_t i = 0;
    while (i < sends_.size() && (used[i] || sends_[i].self != r.peer || sends_[i].peer != r.self)) {
      ++i;
    }
    MK_CHECK(i < sends_.size(), "local exchange: rank " << r.self << " receives " << r.bytes
                                                        << " bytes from rank " << r.peer
                                                        << ", which sends it nothing more");
    const Post& s = sends_[i];
    used[i] = true;
    MK_CHECK(s.bytes == r.bytes, "local exchange: rank " << s.self << " sends " << s.bytes
                                                         << " bytes to rank " << r.self
                                                         << ", which receives " << r.bytes);
    if (s.stream != r.stream) {
      MK_CUDA_CHECK(cudaEventRecord(ready_, s.stream));
      MK_CUDA_CHECK(cudaStreamWaitEvent(r.stream, ready_, 0));
    }
    MK_CUDA_CHECK(cudaMemcpyAsync(r.buf, s.buf, r.bytes, cudaMemcpyDeviceToDevice, r.stream));
    if (s.stream != r.stream) {
      MK_CUDA_CHECK(cudaEventRecord(done_, r.stream));
      MK_CUDA_CHECK(cudaStreamWaitEvent(s.stream, done_, 0));
    }
  }
  for (size_t i = 0; i < sends_.size(); ++i) {
    MK_CHECK(used[i], "local exchange: rank " << sends_[i].self << " sends " << sends_[i].bytes
                                              << " bytes to rank " << sends_[i].peer
                                              << ", which receives nothing from it");
  }
  sends_.clear();
  recvs_.clear();
}

void LocalExchange::abandon() noexcept {
  sends_.clear();
  recvs_.clear();
}

}  // namespace moekit::ep

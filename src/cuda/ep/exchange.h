// The transport between expert-parallel ranks: point-to-point sends and receives posted between
// begin() and end(), each on the posting rank's stream. NCCL's contract holds for every
// transport: both sides post the same bytes, and a rank's sends to a peer pair with that peer's
// receives from it in posting order.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

struct ncclComm;

namespace moekit::ep {

class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void begin() = 0;
  virtual void send(int from, int to, const void* buf, size_t bytes, cudaStream_t stream) = 0;
  virtual void recv(int at, int from, void* buf, size_t bytes, cudaStream_t stream) = 0;
  // Launches what was posted; on return the transfers are ordered on the streams.
  virtual void end() = 0;
  // Closes a group that an error left open (nothing thrown).
  virtual void abandon() noexcept = 0;
};

// NCCL: comms[r] is rank r's communicator (null for ranks this thread does not drive);
// begin / end are ncclGroupStart / ncclGroupEnd, so every rank a thread drives posts its part of
// a phase before any of it waits.
class NcclExchange final : public Exchange {
 public:
  explicit NcclExchange(std::vector<ncclComm*> comms) : comms_(std::move(comms)) {}
  void begin() override;
  void send(int from, int to, const void* buf, size_t bytes, cudaStream_t stream) override;
  void recv(int at, int from, void* buf, size_t bytes, cudaStream_t stream) override;
  void end() override;
  void abandon() noexcept override;

 private:
  ncclComm* comm(int rank) const;
  std::vector<ncclComm*> comms_;
  bool open_ = false;
};

// Every rank on one device: end() pairs each receive with its send (throwing when the posts do not
// match, as NCCL would hang) and copies it on the receiver's stream once the sender's stream has
// reached the send; the sender's stream then waits for the copy (its buffer is free again, as
// after an NCCL send).
class LocalExchange final : public Exchange {
 public:
  explicit LocalExchange(int device);
  ~LocalExchange() override;
  LocalExchange(const LocalExchange&) = delete;
  LocalExchange& operator=(const LocalExchange&) = delete;
  void begin() override;
  void send(int from, int to, const void* buf, size_t bytes, cudaStream_t stream) override;
  void recv(int at, int from, void* buf, size_t bytes, cudaStream_t stream) override;
  void end() override;
  void abandon() noexcept override;

 private:
  struct Post {
    int self, peer;
    void* buf;
    size_t bytes;
    cudaStream_t stream;
  };
  int device_;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  std::vector<Post> sends_, recvs_;
};

}  // namespace moekit::ep

// Whether this build of moekit runs expert parallelism over NCCL, and on which NCCL.
//
// NCCL comes from PyPI's nvidia-nccl-cu13 wheel (pinned by scripts/install_deps.sh) or the CUDA
// toolkit, found by CMake (MOEKIT_NCCL, cmake/nccl.cmake). The build reads nccl.h only; the
// library is loaded at run time, so a binary built with NCCL still starts where libnccl.so.2 is
// absent, and says so.
#pragma once

#include <array>
#include <string>
#include <vector>

struct ncclComm;  // nccl.h's ncclComm_t is ncclComm*

namespace moekit::ep {

struct NcclSupport {
  bool built = false;           // compiled against nccl.h (MOEKIT_NCCL found it)
  std::string header_version;   // "2.30.7": the nccl.h of the build
  std::string library;          // the libnccl.so.2 loaded (else the one the build found)
  bool loaded = false;          // that library (or the loader's libnccl.so.2) loads now
  std::string runtime_version;  // what its ncclGetVersion answers
  std::string reason;           // why expert parallelism over NCCL is off ("" when it is on)
  bool on() const { return built && loaded; }
  // "expert parallelism: NCCL 2.30.7 (/.../libnccl.so.2)" or "expert parallelism: off (...)"
  std::string describe() const;
};

// Looks once (the library is loaded at the first call and kept).
const NcclSupport& nccl_support();

// nccl.h's ncclUniqueId, as bytes: one rank makes it, the engine hands it to every rank.
struct NcclUniqueId {
  std::array<char, 128> bytes{};
};
NcclUniqueId nccl_unique_id();  // ncclGetUniqueId; throws naming why when NCCL is off

// An NCCL communicator moekit creates and destroys, for engines that do not own one (an engine
// that does passes its own ncclComm_t to ep::MoeLayer). Move-only.
class Communicator {
 public:
  // ncclCommInitRank of `rank` among `world_size` on `device` (blocks until every rank joined).
  Communicator(const NcclUniqueId& id, int world_size, int rank, int device);
  // ncclCommInitAll: one process driving devices[r] as rank r.
  static std::vector<Communicator> all(const std::vector<int>& devices);
  ~Communicator();
  Communicator(Communicator&& o) noexcept;
  Communicator& operator=(Communicator&& o) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  ncclComm* get() const { return comm_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }

 private:
  Communicator(ncclComm* comm, int rank, int world_size, int device)
      : comm_(comm), rank_(rank), world_size_(world_size), device_(device) {}
  ncclComm* comm_ = nullptr;
  int rank_ = 0, world_size_ = 0, device_ = 0;
};

}  // namespace moekit::ep

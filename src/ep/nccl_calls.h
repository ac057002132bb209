// The NCCL calls moekit makes, resolved from the libnccl.so.2 that nccl_support() loads
// (src/ep/nccl_library.cpp, the one translation unit that reads nccl.h). Each throws
// moekit::Error naming the call, NCCL's error string and the communicator's last-error text; in a
// build or on a machine without NCCL, each throws nccl_support().describe().
#pragma once

#include <cstddef>
#include <vector>

#include "moekit/ep_nccl.h"

struct CUstream_st;

namespace moekit::ep::nccl {

NcclUniqueId get_unique_id();
// ncclCommInitRank on the current device.
ncclComm* init_rank(int world_size, const NcclUniqueId& id, int rank);
// ncclCommInitAll: comms[r] on devices[r], one process driving them all.
std::vector<ncclComm*> init_all(const std::vector<int>& devices);
void destroy(ncclComm* comm) noexcept;  // ncclCommDestroy; a failure is printed, not thrown

int world_size(ncclComm* comm);  // ncclCommCount
int rank(ncclComm* comm);        // ncclCommUserRank
int device(ncclComm* comm);      // ncclCommCuDevice

// Between group_start and group_end, sends and receives of every rank a thread drives are
// posted; group_end launches them (on each call's stream) and returns.
void group_start();
void group_end();
// `bytes` as ncclChar; both sides post the same size (NCCL's contract).
void send(const void* buf, size_t bytes, int peer, ncclComm* comm, CUstream_st* stream);
void recv(void* buf, size_t bytes, int peer, ncclComm* comm, CUstream_st* stream);

// Throws when the communicator holds an asynchronous error (ncclCommGetAsyncError).
void check_async(ncclComm* comm);

}  // namespace moekit::ep::nccl

// Whether this build of moekit runs expert parallelism over NCCL, and on which NCCL.
//
// NCCL comes from PyPI's nvidia-nccl-cu13 wheel (pinned by scripts/install_deps.sh) or the CUDA
// toolkit, found by CMake (MOEKIT_NCCL, cmake/nccl.cmake). The build reads nccl.h only; the
// library is loaded at run time, so a binary built with NCCL still starts where libnccl.so.2 is
// absent, and says so.
#pragma once

#include <string>

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

}  // namespace moekit::ep

// The NCCL library (moekit/ep_nccl.h, src/ep/nccl_calls.h): the NCCL this build was configured
// with (nccl.h's version and the library path, from cmake/nccl.cmake), whether that library loads
// here (dlopen, then ncclGetVersion), and the calls moekit makes, resolved from the loaded library.
// The one translation unit that sees nccl.h; nothing links libnccl at build time.
#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <cstring>
#include <sstream>

#include "ep/nccl_calls.h"
#include "moekit/ep_nccl.h"
#include "moekit/error.h"

#if defined(MOEKIT_WITH_NCCL)
#include <nccl.h>
static_assert(sizeof(ncclUniqueId) == sizeof(moekit::ep::NcclUniqueId::bytes),
              "NcclUniqueId must hold nccl.h's ncclUniqueId");
#elif !defined(MOEKIT_NCCL_OFF_REASON)
#define MOEKIT_NCCL_OFF_REASON "MOEKIT_NCCL was not configured"
#endif

namespace moekit::ep {
namespace {

#if defined(MOEKIT_WITH_NCCL)
// NCCL's version code: X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z after (nccl.h).
std::string version_text(int code) {
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? (code % 10000) / 100 : (code % 1000) / 100;
  std::ostringstream os;
  os << major << "." << minor << "." << code % 100;
  return os.str();
}

// The entry points, typed by nccl.h's own declarations.
struct Entries {
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGetLastError) get_last_error = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommCount) comm_count = nullptr;
  decltype(&ncclCommUserRank) comm_user_rank = nullptr;
  decltype(&ncclCommCuDevice) comm_cu_device = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
};
#endif

struct Library {
  NcclSupport support;
#if defined(MOEKIT_WITH_NCCL)
  Entries fn;
#endif
};

#if defined(MOEKIT_WITH_NCCL)
template <typename F>
void resolve(void* handle, const char* name, F& out, std::string& missing) {
  out = reinterpret_cast<F>(dlsym(handle, name));
  if (out == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
}
#endif

Library load() {
  Library lib;
  NcclSupport& s = lib.support;
#if defined(MOEKIT_WITH_NCCL)
  s.built = true;
  s.header_version = version_text(NCCL_VERSION_CODE);
  s.library = MOEKIT_NCCL_LIBRARY;
  // the build's library first, then whatever the loader finds under the soname; the handle is
  // kept for the process's life
  void* handle = dlopen(s.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    s.reason = std::string("libnccl.so.2 does not load: ") + (err ? err : "unknown error");
    return lib;
  }
  using GetVersion = int (*)(int*);
  const auto get_version = reinterpret_cast<GetVersion>(dlsym(handle, "ncclGetVersion"));
  int code = 0;
  if (get_version == nullptr || get_version(&code) != 0) {
    s.reason = "the loaded libnccl.so.2 has no working ncclGetVersion";
    return lib;
  }
  s.runtime_version = version_text(code);
  // the file that was loaded (the soname fallback may find another copy than the build's)
  link_map* lm = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm != nullptr && lm->l_name != nullptr &&
      lm->l_name[0] != '\0') {
    s.library = lm->l_name;
  }
  Entries& f = lib.fn;
  std::string missing;
  resolve(handle, "ncclGetErrorString", f.get_error_string, missing);
  resolve(handle, "ncclGetLastError", f.get_last_error, missing);
  resolve(handle, "ncclGetUniqueId", f.get_unique_id, missing);
  resolve(handle, "ncclCommInitRank", f.comm_init_rank, missing);
  resolve(handle, "ncclCommInitAll", f.comm_init_all, missing);
  resolve(handle, "ncclCommDestroy", f.comm_destroy, missing);
  resolve(handle, "ncclCommCount", f.comm_count, missing);
  resolve(handle, "ncclCommUserRank", f.comm_user_rank, missing);
  resolve(handle, "ncclCommCuDevice", f.comm_cu_device, missing);
  resolve(handle, "ncclCommGetAsyncError", f.comm_get_async_error, missing);
  resolve(handle, "ncclGroupStart", f.group_start, missing);
  resolve(handle, "ncclGroupEnd", f.group_end, missing);
  resolve(handle, "ncclSend", f.send, missing);
  resolve(handle, "ncclRecv", f.recv, missing);
  if (!missing.empty()) {
    s.reason = "the loaded " + s.library + " (NCCL " + s.runtime_version + ") lacks " + missing;
    return lib;
  }
  s.loaded = true;
#else
  s.reason = std::string("built without NCCL (") + MOEKIT_NCCL_OFF_REASON +
             "; configure with -DMOEKIT_NCCL=ON and the CUDA backend)";
#endif
  return lib;
}

const Library& library() {
  static const Library lib = load();
  return lib;
}

#if defined(MOEKIT_WITH_NCCL)
// The entry points, or an error saying why expert parallelism over NCCL is off.
const Entries& calls(const char* what) {
  const Library& lib = library();
  MK_CHECK(lib.support.on(), what << ": " << lib.support.describe());
  return lib.fn;
}

void check(ncclResult_t r, const char* call, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  const Entries& f = library().fn;
  const char* last = f.get_last_error != nullptr ? f.get_last_error(comm) : nullptr;
  MK_FAIL(call << " failed: " << f.get_error_string(r)
               << (last != nullptr && last[0] != '\0' ? std::string(" (") + last + ")" : ""));
}
#else
[[noreturn]] void off(const char* what) { MK_FAIL(what << ": " << library().support.describe()); }
#endif

}  // namespace

std::string NcclSupport::describe() const {
  std::ostringstream os;
  os << "expert parallelism: ";
  if (on()) {
    os << "NCCL " << runtime_version << " (" << library << ", built with nccl.h " << header_version
       << ")";
  } else {
    os << "off (" << reason << ")";
  }
  return os.str();
}

const NcclSupport& nccl_support() { return library().support; }

namespace nccl {

#if defined(MOEKIT_WITH_NCCL)
NcclUniqueId get_unique_id() {
  ncclUniqueId id;
  check(calls("ncclGetUniqueId").get_unique_id(&id), "ncclGetUniqueId");
  NcclUniqueId out;
  std::memcpy(out.bytes.data(), id.internal, sizeof(id.internal));
  return out;
}

ncclComm* init_rank(int world_size, const NcclUniqueId& id, int rank) {
  MK_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
           "ncclCommInitRank: expected 0 <= rank < world_size, got rank " << rank << " of "
                                                                          << world_size);
  ncclUniqueId nid;
  std::memcpy(nid.internal, id.bytes.data(), sizeof(nid.internal));
  ncclComm_t comm = nullptr;
  check(calls("ncclCommInitRank").comm_init_rank(&comm, world_size, nid, rank), "ncclCommInitRank");
  return comm;
}

std::vector<ncclComm*> init_all(const std::vector<int>& devices) {
  MK_CHECK(!devices.empty(), "ncclCommInitAll: expected at least one device");
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  check(calls("ncclCommInitAll")
            .comm_init_all(comms.data(), static_cast<int>(devices.size()), devices.data()),
        "ncclCommInitAll");
  return {comms.begin(), comms.end()};
}

void destroy(ncclComm* comm) noexcept {
  if (comm == nullptr || !library().support.on()) return;
  const ncclResult_t r = library().fn.comm_destroy(comm);
  if (r != ncclSuccess) {
    std::fprintf(stderr, "moekit: ncclCommDestroy failed: %s\n", library().fn.get_error_string(r));
  }
}

int world_size(ncclComm* comm) {
  int n = 0;
  check(calls("ncclCommCount").comm_count(comm, &n), "ncclCommCount", comm);
  return n;
}

int rank(ncclComm* comm) {
  int r = 0;
  check(calls("ncclCommUserRank").comm_user_rank(comm, &r), "ncclCommUserRank", comm);
  return r;
}

int device(ncclComm* comm) {
  int d = 0;
  check(calls("ncclCommCuDevice").comm_cu_device(comm, &d), "ncclCommCuDevice", comm);
  return d;
}

void group_start() { check(calls("ncclGroupStart").group_start(), "ncclGroupStart"); }
void group_end() { check(calls("ncclGroupEnd").group_end(), "ncclGroupEnd"); }

void send(const void* buf, size_t bytes, int peer, ncclComm* comm, CUstream_st* stream) {
  check(calls("ncclSend").send(buf, bytes, ncclChar, peer, comm, stream), "ncclSend", comm);
}

void recv(void* buf, size_t bytes, int peer, ncclComm* comm, CUstream_st* stream) {
  check(calls("ncclRecv").recv(buf, bytes, ncclChar, peer, comm, stream), "ncclRecv", comm);
}

void check_async(ncclComm* comm) {
  ncclResult_t async = ncclSuccess;
  check(calls("ncclCommGetAsyncError").comm_get_async_error(comm, &async), "ncclCommGetAsyncError",
        comm);
  check(async, "an earlier NCCL operation (asynchronous error)", comm);
}
#else
NcclUniqueId get_unique_id() { off("ncclGetUniqueId"); }
ncclComm* init_rank(int, const NcclUniqueId&, int) { off("ncclCommInitRank"); }
std::vector<ncclComm*> init_all(const std::vector<int>&) { off("ncclCommInitAll"); }
void destroy(ncclComm*) noexcept {}
int world_size(ncclComm*) { off("ncclCommCount"); }
int rank(ncclComm*) { off("ncclCommUserRank"); }
int device(ncclComm*) { off("ncclCommCuDevice"); }
void group_start() { off("ncclGroupStart"); }
void group_end() { off("ncclGroupEnd"); }
void send(const void*, size_t, int, ncclComm*, CUstream_st*) { off("ncclSend"); }
void recv(void*, size_t, int, ncclComm*, CUstream_st*) { off("ncclRecv"); }
void check_async(ncclComm*) { off("ncclCommGetAsyncError"); }
#endif

}  // namespace nccl

// The engine-facing wrappers (moekit/ep_nccl.h).
NcclUniqueId nccl_unique_id() { return nccl::get_unique_id(); }

}  // namespace moekit::ep

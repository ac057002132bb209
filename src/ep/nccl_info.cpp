// nccl_support (moekit/ep_nccl.h): the NCCL this build was configured with (nccl.h's version and
// the library path, from cmake/nccl.cmake) and whether that library loads here (dlopen, then
// ncclGetVersion). The one translation unit that sees nccl.h.
#include <dlfcn.h>
#include <link.h>

#include <sstream>

#include "moekit/ep_nccl.h"

#if defined(MOEKIT_WITH_NCCL)
#include <nccl.h>
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
#endif

NcclSupport look() {
  NcclSupport s;
#if defined(MOEKIT_WITH_NCCL)
  s.built = true;
  s.header_version = version_text(NCCL_VERSION_CODE);
  s.library = MOEKIT_NCCL_LIBRARY;
  // the build's library first, then whatever the loader finds under the soname; the handle is
  // kept for the process's life (the NCCL transport resolves its symbols from it)
  void* handle = dlopen(s.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    s.reason = std::string("libnccl.so.2 does not load: ") + (err ? err : "unknown error");
    return s;
  }
  using GetVersion = int (*)(int*);
  const auto get_version = reinterpret_cast<GetVersion>(dlsym(handle, "ncclGetVersion"));
  int code = 0;
  if (get_version == nullptr || get_version(&code) != 0) {
    s.reason = "the loaded libnccl.so.2 has no working ncclGetVersion";
    return s;
  }
  s.loaded = true;
  s.runtime_version = version_text(code);
  // the file that was loaded (the soname fallback may find another copy than the build's)
  link_map* lm = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm != nullptr && lm->l_name != nullptr &&
      lm->l_name[0] != '\0') {
    s.library = lm->l_name;
  }
#else
  s.reason = std::string("built without NCCL (") + MOEKIT_NCCL_OFF_REASON +
             "; configure with -DMOEKIT_NCCL=ON and the CUDA backend)";
#endif
  return s;
}

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

const NcclSupport& nccl_support() {
  static const NcclSupport s = look();
  return s;
}

}  // namespace moekit::ep

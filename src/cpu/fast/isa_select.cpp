// The fast CPU backend's choice of SIMD path and thread count (moekit/cpu_fast.h): ISA names,
// what this CPU supports (by run-time feature detection), and what a forward runs with.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "cpu/fast/kernels.h"
#include "moekit/cpu_fast.h"
#include "moekit/error.h"

namespace moekit::cpu_fast {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Auto:
      return "auto";
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx2:
      return "avx2";
    case Isa::Portable:
      return "portable";
  }
  return "?";
}

Isa parse_isa(const std::string& s) {
  if (s == "auto") return Isa::Auto;
  if (s == "avx512") return Isa::Avx512;
  if (s == "avx2") return Isa::Avx2;
  if (s == "portable") return Isa::Portable;
  MK_FAIL("unknown CPU ISA '" << s << "' (expected auto, avx512, avx2 or portable)");
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Auto:
    case Isa::Portable:
      return true;
#if defined(__x86_64__) || defined(__i386__)
    case Isa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma");
#else
    case Isa::Avx2:
    case Isa::Avx512:
      return false;
#endif
  }
  return false;
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  return isa_supported(Isa::Avx512) && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

namespace detail {
bool cpu_has_avx512_vbmi() {
#if defined(__x86_64__) || defined(__i386__)
  return isa_supported(Isa::Avx512) && __builtin_cpu_supports("avx512vbmi");
#else
  return false;
#endif
}
}  // namespace detail

Isa resolve_isa(Isa requested) {
  Isa isa = requested;
  const char* source = "requested";
  if (isa == Isa::Auto) {
    const char* env = std::getenv("MOEKIT_CPU_ISA");
    if (env != nullptr && env[0] != '\0') {
      isa = parse_isa(env);
      source = "MOEKIT_CPU_ISA";
    }
  }
  if (isa == Isa::Auto) {
    if (isa_supported(Isa::Avx512)) return Isa::Avx512;
    if (isa_supported(Isa::Avx2)) return Isa::Avx2;
    return Isa::Portable;
  }
  MK_CHECK(isa_supported(isa), "CPU ISA '" << isa_name(isa) << "' (" << source
                                           << ") is not supported by this CPU (expected one of: "
                                           << (isa_supported(Isa::Avx512) ? "avx512, " : "")
                                           << (isa_supported(Isa::Avx2) ? "avx2, " : "")
                                           << "portable)");
  return isa;
}

int resolve_threads(int requested) {
  MK_CHECK(requested >= 0, "expected threads >= 0 (0 = all cores), got " << requested);
  if (requested > 0) return requested;
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace moekit::cpu_fast

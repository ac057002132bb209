// The shared-expert fusion switch (DESIGN.md §2): layer option fuse_shared = auto|on|off, and the
// environment variable MOEKIT_FUSE_SHARED_EXPERTS that overrides it (auto|on|off, or 1|0).
//
// Parsing is strict and case-sensitive: a typo ("of", "ON ") is an error naming the value and the
// allowed spellings, never a silent fallback to a mode the user did not ask for.
#include <cstdlib>
#include <string>

#include "moekit/error.h"
#include "moekit/layer.h"

namespace moekit {

const char* fuse_shared_name(FuseShared f) {
  switch (f) {
    case FuseShared::Auto:
      return "auto";
    case FuseShared::On:
      return "on";
    case FuseShared::Off:
      return "off";
  }
  return "?";
}

FuseShared parse_fuse_shared(const std::string& s) {
  if (s == "auto") return FuseShared::Auto;
  if (s == "on") return FuseShared::On;
  if (s == "off") return FuseShared::Off;
  MK_FAIL("unknown fuse_shared mode '" << s << "' (expected auto, on or off)");
}

FuseShared fuse_shared_from_env(FuseShared requested) {
  const char* value = std::getenv("MOEKIT_FUSE_SHARED_EXPERTS");
  // Unset or empty: the caller's choice stands (an empty export is how shells "unset" in CI).
  if (value == nullptr || value[0] == '\0') return requested;
  const std::string v(value);
  if (v == "1") return FuseShared::On;
  if (v == "0") return FuseShared::Off;
  if (v == "auto" || v == "on" || v == "off") return parse_fuse_shared(v);
  MK_FAIL("MOEKIT_FUSE_SHARED_EXPERTS='" << v
                                         << "' is not a fusion mode (expected auto, on, off, "
                                            "1 or 0)");
}

}  // namespace moekit

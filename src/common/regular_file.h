// Opening files moekit reads (configs, safetensors files, checkpoint indexes, tuning files) so
// that careless or hostile paths fail fast with a message instead of hanging or reading forever:
// the open never blocks (O_NONBLOCK: a FIFO without a writer would block a plain open), and
// anything but a regular file (FIFO, /dev/zero and other devices, a directory, a socket) is
// refused before a byte is read.
#pragma once

#include <cstddef>
#include <string>

namespace moekit {

// JSON files are read whole into memory; these bound how much.
inline constexpr size_t kMaxConfigBytes = size_t{16} << 20;  // config.json, tuning files
inline constexpr size_t kMaxIndexBytes = size_t{128} << 20;  // model.safetensors.index.json

// An open read-only descriptor of a regular file and its size at open. The caller closes fd.
struct RegularFile {
  int fd = -1;
  size_t size = 0;
};

// Throws moekit::Error "<what> <path>: ..." (path escaped) when the path cannot be opened or is
// not a regular file (the message names what it is).
RegularFile open_regular_file(const std::string& path, const std::string& what);

// The whole file, refused when larger than max_bytes (naming both sizes).
std::string read_regular_file(const std::string& path, const std::string& what, size_t max_bytes);

}  // namespace moekit

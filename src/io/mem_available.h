// The host memory the kernel says is available (MemAvailable in /proc/meminfo): the weights'
// memory check before allocating experts and the CPU benchmark's choice of what fits.
#pragma once

#include <cstddef>

namespace moekit {

// MemAvailable in bytes, or 0 when it cannot be read (not Linux).
size_t mem_available_bytes();

}  // namespace moekit

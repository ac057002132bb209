#include "io/mem_available.h"

#include <cstdio>
#include <fstream>
#include <string>

namespace moekit {

size_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kb) == 1) return kb * 1024;
  }
  return 0;
}

}  // namespace moekit

// What the fast CPU backend's files share (fast_layer.cpp, fast_experts.cpp, expert_jobs.cpp,
// read_probe.cpp): the SIMD kernels of an ISA, the thread pool's two ways of running work and the
// per-thread scratch buffers.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <vector>

#include "cpu/fast/kernels.h"
#include "cpu/fast/thread_pool.h"
#include "moekit/cpu_fast.h"

namespace moekit::cpu_fast::detail {

inline const Kernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return avx512_kernels();
    case Isa::Avx2:
      return avx2_kernels();
    default:
      return portable_kernels();
  }
}

// Runs fn(index, participants) on `threads` threads of the global pool.
inline void parallel(int threads, const std::function<void(int, int)>& fn) {
  global_pool().run(threads, fn);
}

// Runs fn(unit) for every unit in [0, count) on `threads` threads, units handed out in order.
inline void run_units(int threads, size_t count, const std::function<void(size_t)>& fn) {
  if (count == 0) return;
  std::atomic<size_t> next{0};
  parallel(static_cast<int>(std::min<size_t>(threads, count)), [&](int, int) {
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < count;) fn(i);
  });
}

// A thread's scratch buffer, grown but never shrunk. why: a decode step allocates the same few MB
// every call; fresh allocations of that size are mmap'd and page-faulted each time, reused ones
// are not.
template <typename T>
T* scratch(std::vector<T>& buffer, size_t n) {
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// Microseconds since `start` (FastOptions::phases).
inline double microseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace moekit::cpu_fast::detail

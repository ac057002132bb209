// A small persistent thread pool for the fast CPU backend.
//
// A forward is a few parallel phases (router, expert lookup, gate/up, down) separated by joins.
// Spawning threads per phase costs ~50 us each, a visible fraction of a decode layer, so the
// workers persist and sleep on a condition variable between phases (no busy-waiting: with one
// core per thread, a spinning worker would steal the core the caller needs). run() hands each
// participant its index; the caller is participant 0 and works too, so threads = 1 never touches
// the pool.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moekit::cpu_fast::detail {

class ThreadPool {
 public:
  ThreadPool() = default;
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs fn(index, participants) for index in [0, participants) concurrently, the caller taking
  // index 0; returns when all are done and rethrows the first exception any of them threw.
  // Concurrent callers are serialised.
  void run(int participants, const std::function<void(int, int)>& fn);

 private:
  void ensure_workers(int count);  // with mutex_ held
  void worker_loop(int index);

  std::mutex run_mutex_;  // one run() at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* task_ = nullptr;
  int participants_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// The process-wide pool the backend uses.
ThreadPool& global_pool();

}  // namespace moekit::cpu_fast::detail

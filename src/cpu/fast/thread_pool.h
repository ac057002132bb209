// A small persistent thread pool for the fast CPU backend.
//
// A forward is a few parallel phases (router, gate/up, down, combine) separated by joins and
// short serial steps. Spawning threads per phase costs ~50 us each, and waking a sleeping
// thread costs tens of microseconds on a virtual machine (the vCPU is halted), a visible
// fraction of a decode layer. So the workers persist, and after a phase each spins on the
// phase counter for a short while (kSpin, pausing between polls) before it sleeps on it: the
// next phase of the same forward, microseconds later, finds it awake. The caller is
// participant 0 and works too, so threads = 1 never touches the pool; it waits for the others
// the same way, spinning first, on one word per worker that the worker alone writes: a
// counter that every participant decrements would pass its cache line from core to core once
// per worker at the end of every phase. Workers spin only while the pool's threads fit the
// machine's cores, so that a spinning worker never takes a core a working one needs.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace moekit::cpu_fast::detail {

class ThreadPool {
 public:
  ThreadPool();
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs fn(index, participants) for index in [0, participants) concurrently, the caller taking
  // index 0; returns when all are done and rethrows the first exception any of them threw.
  // Concurrent callers are serialised.
  void run(int participants, const std::function<void(int, int)>& fn);

 private:
  // The counter (phase_'s high 32 bits) of the last run a worker took part in, written by that
  // worker when its share is done; a cache line of its own. why 32 bits: an atomic of this
  // size is a futex word, whose notify without sleepers only reads; a 64-bit atomic's notify
  // adds to a word the library shares between addresses, one more line every worker writes.
  struct alignas(64) Done {
    std::atomic<uint32_t> run{0};
  };

  void ensure_workers(int count);  // with run_mutex_ held
  // seen: the phase_ it was created in
  void worker_loop(int index, uint64_t seen, Done* done);

  const int cores_;       // std::thread::hardware_concurrency(), at least 1
  std::mutex run_mutex_;  // one run() at a time
  std::vector<std::thread> workers_;
  std::vector<std::unique_ptr<Done>> done_;  // worker i's is done_[i - 1]
  // The current run's function: written before phase_ changes (release), read only by the
  // run's participants, after they see the change (acquire) and before they count themselves
  // done, so never while the next run() writes it.
  const std::function<void(int, int)>* task_ = nullptr;
  // One word per run, so that a worker that sits a run out reads nothing else of it: a counter
  // bumped by every run() that uses workers (and at stop) in the high 32 bits, bit 31 set when
  // the run's threads fit the cores (its workers spin), its participant count in the low bits.
  std::atomic<uint64_t> phase_{0};
  std::atomic<bool> stop_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

// The process-wide pool the backend uses.
ThreadPool& global_pool();

// One pause of a spin-wait loop (x86 pause, arm yield).
void cpu_relax();

}  // namespace moekit::cpu_fast::detail

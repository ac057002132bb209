// Persistent worker threads for the fast CPU backend (see thread_pool.h for why).
#include "cpu/fast/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace moekit::cpu_fast::detail {

namespace {

// How long a thread polls before it sleeps: longer than the serial steps between the phases of
// one forward (routing, job grouping: microseconds), short enough that an idle pool burns
// little.
constexpr std::chrono::microseconds kSpin{200};

// Waits until `a` holds a value other than `old` and returns it: polling for up to kSpin when
// `spin`, then sleeping on the atomic (a futex on Linux).
template <typename T>
T wait_for_change(const std::atomic<T>& a, T old, bool spin) {
  T v = a.load(std::memory_order_acquire);
  if (v != old || !spin) {
    while (v == old) {
      a.wait(old, std::memory_order_acquire);
      v = a.load(std::memory_order_acquire);
    }
    return v;
  }
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    cpu_relax();
    v = a.load(std::memory_order_acquire);
    if (v != old) return v;
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
  }
  return wait_for_change(a, old, false);
}

}  // namespace

ThreadPool::ThreadPool() : cores_(std::max(1u, std::thread::hardware_concurrency())) {}

// phase_'s fields (thread_pool.h).
constexpr uint64_t kPhaseStep = uint64_t{1} << 32;
constexpr uint64_t kPhaseSpin = uint64_t{1} << 31;
constexpr uint64_t kPhaseParticipants = kPhaseSpin - 1;

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  phase_.fetch_add(kPhaseStep, std::memory_order_release);
  phase_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::ensure_workers(int count) {
  while (static_cast<int>(workers_.size()) < count) {
    const int index = static_cast<int>(workers_.size()) + 1;  // participant index; 0 = caller
    // (the phase before the run that creates it: a thread that starts late still sees that run)
    const uint64_t seen = phase_.load(std::memory_order_relaxed);
    done_.push_back(std::make_unique<Done>());
    Done* done = done_.back().get();
    workers_.emplace_back([this, index, seen, done] { worker_loop(index, seen, done); });
  }
}

void ThreadPool::worker_loop(int index, uint64_t seen, Done* done) {
  for (;;) {
    // (spinning when the run last seen fit the cores)
    seen = wait_for_change(phase_, seen, (seen & kPhaseSpin) != 0);
    if (stop_.load(std::memory_order_relaxed)) return;
    const int participants = static_cast<int>(seen & kPhaseParticipants);
    // Workers beyond this run's participant count sit it out.
    if (index >= participants) continue;
    try {
      (*task_)(index, participants);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    done->run.store(static_cast<uint32_t>(seen >> 32),
                    std::memory_order_release);  // (after error_)
    done->run.notify_one();
  }
}

void ThreadPool::run(int participants, const std::function<void(int, int)>& fn) {
  if (participants <= 1) {
    fn(0, 1);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  ensure_workers(participants - 1);
  task_ = &fn;
  error_ = nullptr;
  // why: workers that outnumber the cores would spin on cores that working threads need
  const bool spin = static_cast<int>(workers_.size()) + 1 <= cores_;
  const uint64_t phase = (phase_.load(std::memory_order_relaxed) & ~(kPhaseStep - 1)) + kPhaseStep +
                         (spin ? kPhaseSpin : 0) + static_cast<uint64_t>(participants);
  phase_.store(phase, std::memory_order_release);  // publishes task_
  phase_.notify_all();
  std::exception_ptr caller_error;
  try {
    fn(0, participants);
  } catch (...) {
    caller_error = std::current_exception();
  }
  const uint32_t run = static_cast<uint32_t>(phase >> 32);
  for (int i = 0; i < participants - 1; ++i) {
    const std::atomic<uint32_t>& done = done_[i]->run;
    for (uint32_t d = done.load(std::memory_order_acquire); d != run;) {
      d = wait_for_change(done, d, spin);
    }
  }
  task_ = nullptr;
  std::exception_ptr error = caller_error;
  if (!error) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

ThreadPool& global_pool() {
  static ThreadPool pool;
  return pool;
}

}  // namespace moekit::cpu_fast::detail

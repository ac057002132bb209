// Persistent worker threads for the fast CPU backend (see thread_pool.h for why).
#include "cpu/fast/thread_pool.h"

namespace moekit::cpu_fast::detail {

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::ensure_workers(int count) {
  while (static_cast<int>(workers_.size()) < count) {
    const int index = static_cast<int>(workers_.size()) + 1;  // participant index; 0 = caller
    workers_.emplace_back([this, index] { worker_loop(index); });
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int, int)>* task;
    int participants;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Workers beyond this run's participant count sleep through it.
      wake_.wait(lock, [&] { return stop_ || (generation_ != seen && index < participants_); });
      if (stop_) return;
      seen = generation_;
      task = task_;
      participants = participants_;
    }
    std::exception_ptr error;
    try {
      (*task)(index, participants);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error && !error_) error_ = error;
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::run(int participants, const std::function<void(int, int)>& fn) {
  if (participants <= 1) {
    fn(0, 1);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ensure_workers(participants - 1);
    task_ = &fn;
    participants_ = participants;
    pending_ = participants - 1;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  std::exception_ptr caller_error;
  try {
    fn(0, participants);
  } catch (...) {
    caller_error = std::current_exception();
  }
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    error = caller_error ? caller_error : error_;
    task_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

ThreadPool& global_pool() {
  static ThreadPool pool;
  return pool;
}

}  // namespace moekit::cpu_fast::detail

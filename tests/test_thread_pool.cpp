// Tests of the fast CPU backend's thread pool (src/cpu/fast/thread_pool.h): every participant
// runs once per run with the run's count, back-to-back runs of changing sizes (workers that sit
// runs out, workers created late), runs after the workers fell asleep, more participants than
// cores (no spinning), exceptions from workers and from the caller, concurrent callers, and a
// pool destroyed with its workers awake or asleep.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpu/fast/thread_pool.h"

namespace {

using moekit::cpu_fast::detail::ThreadPool;

// Runs one phase of `participants` on `pool` and checks that each index ran exactly once and saw
// the run's count.
void run_and_check(ThreadPool& pool, int participants) {
  std::vector<std::atomic<int>> ran(participants);
  std::atomic<int> wrong_count{0};
  pool.run(participants, [&](int index, int count) {
    if (count != participants || index < 0 || index >= participants) {
      wrong_count.fetch_add(1);
      return;
    }
    ran[index].fetch_add(1);
  });
  ASSERT_EQ(wrong_count.load(), 0) << "participants " << participants;
  for (int i = 0; i < participants; ++i) {
    ASSERT_EQ(ran[i].load(), 1) << "index " << i << " of " << participants;
  }
}

TEST(ThreadPool, EveryParticipantRunsOnceBackToBack) {
  ThreadPool pool;
  const int sizes[] = {2, 4, 3, 1, 7, 2, 5, 8, 2};
  for (int round = 0; round < 2000; ++round) {
    run_and_check(pool, sizes[round % std::size(sizes)]);
  }
}

TEST(ThreadPool, RunsAfterTheWorkersSlept) {
  ThreadPool pool;
  for (int round = 0; round < 5; ++round) {
    run_and_check(pool, 3);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // longer than any spin
  }
}

TEST(ThreadPool, MoreParticipantsThanCores) {
  ThreadPool pool;
  const int many = static_cast<int>(std::thread::hardware_concurrency()) * 2 + 3;
  for (int round = 0; round < 200; ++round) run_and_check(pool, round % 2 ? many : 2);
}

TEST(ThreadPool, WorkersShareTheWork) {
  // A phase whose participants wait for each other finishes only if they run concurrently.
  ThreadPool pool;
  std::atomic<int> arrived{0};
  pool.run(4, [&](int, int count) {
    arrived.fetch_add(1);
    while (arrived.load() < count) std::this_thread::yield();
  });
  EXPECT_EQ(arrived.load(), 4);
}

TEST(ThreadPool, RethrowsAndStaysUsable) {
  ThreadPool pool;
  for (int thrower : {0, 1, 2}) {
    EXPECT_THROW(pool.run(3,
                          [&](int index, int) {
                            if (index == thrower) throw std::runtime_error("participant failed");
                          }),
                 std::runtime_error)
        << "thrower " << thrower;
    run_and_check(pool, 3);
  }
}

TEST(ThreadPool, ConcurrentCallersAreSerialised) {
  ThreadPool pool;
  std::atomic<int> inside{0}, overlapped{0};
  auto caller = [&] {
    for (int round = 0; round < 300; ++round) {
      pool.run(2, [&](int index, int) {
        if (index == 0 && inside.fetch_add(1) != 0) overlapped.fetch_add(1);
        if (index == 0) inside.fetch_sub(1);
      });
    }
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(overlapped.load(), 0);
}

TEST(ThreadPool, DestroyedAwakeOrAsleep) {
  {
    ThreadPool pool;
    run_and_check(pool, 4);
  }
  {
    ThreadPool pool;
    run_and_check(pool, 4);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  { ThreadPool pool; }
}

}  // namespace

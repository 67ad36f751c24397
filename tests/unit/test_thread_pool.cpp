// The kernels' thread pool: every index runs exactly once, whatever the pool size; nested and concurrent
// calls complete (inline); the first exception reaches the caller and the pool stays usable.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "k3/core/thread_pool.h"

TEST(ThreadPool, EveryIndexOnceForAnySize) {
  for (int threads : {1, 2, 3, 8}) {
    k3::ThreadPool pool(threads);
    for (int64_t n : {1, 2, 7, 1000, 100003}) {
      for (int64_t grain : {0, 1, 13}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int> bad_thread{0};
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int t) {
          if (t < 0 || t >= pool.size()) bad_thread++;
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << threads << " " << n << " " << i;
        EXPECT_EQ(bad_thread.load(), 0);
      }
    }
  }
}

TEST(ThreadPool, NestedAndConcurrentCallsComplete) {
  k3::ThreadPool pool(4);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(8, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(100, 0, [&](int64_t b2, int64_t e2, int) { sum += e2 - b2; });  // runs inline
  });
  EXPECT_EQ(sum.load(), 800);
  // Two external threads at once: one gets the pool, the other runs inline; both finish.
  std::atomic<int64_t> a{0}, c{0};
  std::thread t1([&] {
    for (int r = 0; r < 200; ++r) pool.parallel_for(1000, 0, [&](int64_t b, int64_t e, int) { a += e - b; });
  });
  std::thread t2([&] {
    for (int r = 0; r < 200; ++r) pool.parallel_for(1000, 0, [&](int64_t b, int64_t e, int) { c += e - b; });
  });
  t1.join();
  t2.join();
  EXPECT_EQ(a.load(), 200000);
  EXPECT_EQ(c.load(), 200000);
}

TEST(ThreadPool, ExceptionReachesTheCallerAndThePoolStaysUsable) {
  k3::ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(1000, 1,
                                 [&](int64_t b, int64_t, int) {
                                   if (b == 500) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  std::atomic<int64_t> n{0};
  pool.parallel_for(1000, 0, [&](int64_t b, int64_t e, int) { n += e - b; });
  EXPECT_EQ(n.load(), 1000);
}

// Thousands of back-to-back tiny jobs (the decode step's pattern: hundreds of kernels of microseconds),
// with the workers racing the caller, sleeping between bursts and waking late: every index of every job
// runs exactly once, and never after its parallel_for returned (a late worker must not run a finished
// job's chunks, nor a new job's chunks under the old job's bounds).
TEST(ThreadPool, ShortJobsBackToBackRunEachIndexOnceAndNeverLate) {
  k3::ThreadPool pool(3);
  constexpr int kJobs = 4000;
  std::vector<std::atomic<int>> live(kJobs);
  std::atomic<int> stale{0}, wrong_count{0};
  for (int j = 0; j < kJobs; ++j) {
    const int64_t n = 1 + j % 7;
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    live[static_cast<size_t>(j)] = 1;
    pool.parallel_for(n, 1, [&, j](int64_t b, int64_t e, int t) {
      if (live[static_cast<size_t>(j)].load() != 1) stale++;
      if (t != 0 && j % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));  // a slow worker
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      if (live[static_cast<size_t>(j)].load() != 1) stale++;
    });
    live[static_cast<size_t>(j)] = 0;
    for (auto& h : hits)
      if (h.load() != 1) wrong_count++;
    if (j % 1000 == 999) std::this_thread::sleep_for(std::chrono::milliseconds(3));  // let the workers fall asleep
  }
  EXPECT_EQ(stale.load(), 0);
  EXPECT_EQ(wrong_count.load(), 0);
}

// An exception thrown on a worker thread (not the caller) reaches the caller, and the job still waits
// for the workers inside it.
TEST(ThreadPool, ExceptionFromAWorkerReachesTheCaller) {
  k3::ThreadPool pool(2);
  int worker_threw = 0;
  for (int attempt = 0; attempt < 50 && worker_threw < 3; ++attempt) {
    std::atomic<bool> threw{false};
    std::atomic<int> running{0}, after_return{0};
    std::atomic<bool> returned{false};
    try {
      pool.parallel_for(64, 1, [&](int64_t, int64_t, int t) {
        running++;
        if (returned.load()) after_return++;
        // the worker's chunk outlasts all of the caller's: the caller must wait for it, then rethrow
        std::this_thread::sleep_for(std::chrono::microseconds(t == 1 ? 3000 : 20));
        running--;
        if (t == 1) {
          threw = true;
          throw std::runtime_error("worker");
        }
      });
      EXPECT_FALSE(threw.load());
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(threw.load());
      EXPECT_STREQ(e.what(), "worker");
      ++worker_threw;
    }
    returned = true;
    EXPECT_EQ(running.load(), 0);  // nobody is still inside a chunk once parallel_for returned
    EXPECT_EQ(after_return.load(), 0);
  }
  EXPECT_GT(worker_threw, 0) << "the worker never took a chunk";
}

// The spin time is clamped to 0..1 s, and with no spinning at all (every worker sleeps between jobs, the
// path the hybrid runner's longer spin avoids) jobs still run each index exactly once.
TEST(ThreadPool, SpinTimeIsClampedAndZeroSpinStaysCorrect) {
  const auto saved = k3::ThreadPool::spin_time();
  k3::ThreadPool::set_spin_time(std::chrono::microseconds(-5));
  EXPECT_EQ(k3::ThreadPool::spin_time().count(), 0);
  k3::ThreadPool::set_spin_time(std::chrono::seconds(7));
  EXPECT_EQ(k3::ThreadPool::spin_time().count(), 1000000);
  k3::ThreadPool::set_spin_time(std::chrono::microseconds(0));
  k3::ThreadPool pool(3);
  int wrong = 0;
  for (int j = 0; j < 300; ++j) {
    std::vector<std::atomic<int>> hits(37);
    pool.parallel_for(37, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (auto& h : hits) wrong += h.load() != 1;
    if (j % 50 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  k3::ThreadPool::set_spin_time(saved);
  EXPECT_EQ(wrong, 0);
}

namespace {
// Both sleeping paths at once, thousands of times (spin time 0): workers asleep when a job opens (the publish
// must wake them) and the caller asleep while a slow worker finishes (the finish must wake it). A lost wake-up
// hangs here; every index still runs once.
TEST(ThreadPool, SleepingWorkersAndSleepingCallerAreAlwaysWoken) {
  const auto saved = k3::ThreadPool::spin_time();
  k3::ThreadPool::set_spin_time(std::chrono::microseconds(0));
  k3::ThreadPool pool(4);
  int wrong = 0;
  for (int j = 0; j < 2000; ++j) {
    std::vector<std::atomic<int>> hits(9);
    pool.parallel_for(9, 1, [&](int64_t b, int64_t e, int t) {
      if (t != 0 && j % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(20 + j % 50));
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (auto& h : hits) wrong += h.load() != 1;
    if (j % 97 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  k3::ThreadPool::set_spin_time(saved);
  EXPECT_EQ(wrong, 0);
}
}  // namespace

namespace {
// The chunks are the documented ones whatever the claim order or thread count: chunk c = [c x grain,
// min(n, (c + 1) x grain)), each exactly once; with InOrder a chunk may wait on every lower one having started
// (matmul_two_stage's pattern) and the job still completes.
TEST(ThreadPool, ChunksAreFixedRangesUnderBothClaimOrders) {
  for (auto claim : {k3::ThreadPool::Claim::Spread, k3::ThreadPool::Claim::InOrder})
    for (int threads : {2, 3, 5}) {
      k3::ThreadPool pool(threads);
      for (int64_t n : {7, 64, 1001})
        for (int64_t grain : {1, 3, 16}) {
          const int64_t chunks = (n + grain - 1) / grain;
          std::vector<std::atomic<int>> seen(static_cast<size_t>(chunks));
          std::atomic<int> bad{0};
          pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int t) {
            if (b % grain != 0 || e != std::min(n, b + grain) || t < 0 || t >= threads) bad++;
            else seen[static_cast<size_t>(b / grain)]++;
          }, claim);
          EXPECT_EQ(bad.load(), 0);
          for (auto& s : seen) EXPECT_EQ(s.load(), 1) << "n " << n << " grain " << grain << " threads " << threads;
        }
    }
  k3::ThreadPool pool(4);
  // Two stages spread: every chunk of [0, 100) is claimed before any later one, so a second-stage chunk may wait
  // for the whole first stage to finish; each chunk still once.
  for (int rep = 0; rep < 50; ++rep) {
    std::atomic<int> first_done{0};
    std::vector<std::atomic<int>> hits(300);
    pool.parallel_for(300, 1, [&](int64_t b, int64_t, int) {
      if (b >= 100)
        while (first_done.load() < 100) std::this_thread::yield();
      hits[static_cast<size_t>(b)]++;
      if (b < 100) first_done++;
    }, k3::ThreadPool::Claim::Spread, 100);
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
  for (int rep = 0; rep < 50; ++rep) {
    std::vector<std::atomic<int>> started(200);
    pool.parallel_for(200, 1, [&](int64_t b, int64_t, int) {
      while (b > 0 && started[static_cast<size_t>(b - 1)].load() == 0) std::this_thread::yield();
      started[static_cast<size_t>(b)] = 1;
    }, k3::ThreadPool::Claim::InOrder);
    for (auto& s : started) EXPECT_EQ(s.load(), 1);
  }
}
}  // namespace

// The kernels' thread pool: every index runs exactly once, whatever the pool size; nested and concurrent
// calls complete (inline); the first exception reaches the caller and the pool stays usable.
#include <gtest/gtest.h>

#include <atomic>
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

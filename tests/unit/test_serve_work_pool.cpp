// k3::serve::WorkPool: the bounded queue of the parse workers of `k3 serve`.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>

#include "k3/serve/work_pool.h"

using k3::serve::WorkPool;

TEST(ServeWorkPool, RunsTasksAndRefusesBeyondTheQueueBound) {
  WorkPool pool(1, 2);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> ran{0};
  std::promise<void> started;
  std::function<void()> blocker = [&] {
    started.set_value();
    gate.wait();
    ++ran;
  };
  ASSERT_TRUE(pool.try_submit(blocker));
  started.get_future().wait();  // the one worker is busy: what follows waits in the queue
  std::function<void()> t1 = [&] { ++ran; }, t2 = [&] { ++ran; }, t3 = [&] { ++ran; };
  EXPECT_TRUE(pool.try_submit(t1));
  EXPECT_TRUE(pool.try_submit(t2));
  EXPECT_FALSE(pool.try_submit(t3));  // queue bound 2
  EXPECT_TRUE(static_cast<bool>(t3)) << "a refused task is left to the caller";
  release.set_value();
  for (int i = 0; i < 500 && ran.load() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(ran.load(), 3);
  pool.stop();
  std::function<void()> t4 = [&] { ++ran; };
  EXPECT_FALSE(pool.try_submit(t4));  // stopped
}

TEST(ServeWorkPool, StopDropsQueuedTasks) {
  std::atomic<int> ran{0};
  auto token = std::make_shared<int>(0);
  {
    WorkPool pool(1, 8);
    std::promise<void> started, release;
    std::function<void()> blocker = [&] {
      started.set_value();
      release.get_future().wait();
    };
    ASSERT_TRUE(pool.try_submit(blocker));
    started.get_future().wait();
    std::function<void()> queued = [&ran, token] { ++ran; };
    ASSERT_TRUE(pool.try_submit(queued));
    std::thread releaser([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      release.set_value();
    });
    pool.stop();
    releaser.join();
  }
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(token.use_count(), 1) << "a dropped task's captures are released";
}

// A small fixed pool of worker threads with a bounded queue: `k3 serve` parses request bodies and
// tokenises prompts here, off the HTTP I/O threads, so that a huge prompt cannot stall /health.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace k3::serve {

class WorkPool {
 public:
  WorkPool(int threads, size_t max_queued);
  ~WorkPool();  // stop()
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Queues `task`; false (and `task` untouched) when max_queued tasks are already waiting or the pool stopped.
  bool try_submit(std::function<void()>& task);
  // Drops the tasks not started yet, waits for the running ones, joins the threads. Idempotent.
  void stop();

 private:
  void run();
  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace k3::serve

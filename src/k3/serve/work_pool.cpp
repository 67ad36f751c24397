#include "k3/serve/work_pool.h"

namespace k3::serve {

WorkPool::WorkPool(int threads, size_t max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { run(); });
}

WorkPool::~WorkPool() { stop(); }

bool WorkPool::try_submit(std::function<void()>& task) {
  {
    std::lock_guard lk(mu_);
    if (stopping_ || queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void WorkPool::stop() {
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard lk(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  dropped.clear();  // outside the lock: a task's captures may run arbitrary destructors
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void WorkPool::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace k3::serve

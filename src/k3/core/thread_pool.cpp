#include "k3/core/thread_pool.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "k3/core/error.h"

namespace k3 {

namespace {
thread_local bool t_in_task = false;
constexpr int kSpin = 20000;  // pause iterations (~100 us) before a worker or the caller sleeps
constexpr int kMaxThreads = 1024;

// Binds the calling thread to `cpus` (empty: left as it is). A failure (a CPU outside the cgroup's set)
// leaves the thread unpinned: placement is a performance hint, never a reason to fail a run.
void pin_current_thread(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

struct GlobalConfig {
  std::mutex mu;
  bool created = false;
  int threads = 0;  // 0: default_threads()
  std::vector<std::vector<int>> pin;
};
GlobalConfig& global_config() {
  static GlobalConfig c;
  return c;
}
}  // namespace

struct ThreadPool::Impl {
  int size = 1;
  std::vector<std::thread> workers;
  std::mutex job_mu;  // one job at a time (others run inline)

  // The current job.
  const std::function<void(int64_t, int64_t, int)>* fn = nullptr;
  int64_t n = 0, grain = 1;
  std::atomic<int64_t> next{0};
  std::atomic<int> pending{0};  // workers still in the job
  std::exception_ptr error;
  std::mutex error_mu;

  std::atomic<uint64_t> generation{0};
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  bool stop = false;

  void run_chunks(int thread) {
    t_in_task = true;
    for (;;) {
      const int64_t b = next.fetch_add(grain, std::memory_order_relaxed);
      if (b >= n) break;
      const int64_t e = std::min(n, b + grain);
      try {
        (*fn)(b, e, thread);
      } catch (...) {
        std::lock_guard lk(error_mu);
        if (!error) error = std::current_exception();
        next.store(n, std::memory_order_relaxed);  // stop handing out chunks
      }
    }
    t_in_task = false;
  }

  void worker(int thread) {
    uint64_t seen = 0;
    for (;;) {
      // Spin for a new job, then sleep.
      int spins = 0;
      while (generation.load(std::memory_order_acquire) == seen && spins < kSpin) {
        _mm_pause();
        ++spins;
      }
      if (generation.load(std::memory_order_acquire) == seen) {
        std::unique_lock lk(mu);
        cv_work.wait(lk, [&] { return stop || generation.load(std::memory_order_acquire) != seen; });
        if (stop) return;
      }
      seen = generation.load(std::memory_order_acquire);
      run_chunks(thread);
      if (pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard lk(mu);
        cv_done.notify_all();
      }
    }
  }
};

ThreadPool::ThreadPool(int threads, std::vector<std::vector<int>> pin) : impl_(std::make_unique<Impl>()) {
  impl_->size = std::max(1, threads);
  for (int t = 1; t < impl_->size; ++t) {
    std::vector<int> cpus = t < static_cast<int>(pin.size()) ? pin[t] : std::vector<int>{};
    impl_->workers.emplace_back([this, t, cpus = std::move(cpus)] {
      pin_current_thread(cpus);
      impl_->worker(t);
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv_work.notify_all();
  for (auto& w : impl_->workers) w.join();
}

int ThreadPool::default_threads(std::string* source) {
  for (const char* var : {"K3_NUM_THREADS", "OMP_NUM_THREADS"})
    if (const char* v = std::getenv(var)) {
      const int n = std::atoi(v);
      if (n > 0) {
        if (source) *source = var;
        return std::min(n, kMaxThreads);
      }
    }
  if (source) *source = "the CPUs this process may use";
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return std::min(CPU_COUNT(&set), kMaxThreads);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void ThreadPool::configure_global(int threads, std::vector<std::vector<int>> pin) {
  if (threads < 1 || threads > kMaxThreads)
    throw Error("compute threads: expected 1.." + std::to_string(kMaxThreads) + ", got " + std::to_string(threads));
  GlobalConfig& c = global_config();
  std::lock_guard lk(c.mu);
  if (c.created) throw Error("the compute thread pool is already running; its size must be set before the first kernel");
  c.threads = threads;
  c.pin = std::move(pin);
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool = [] {
    GlobalConfig& c = global_config();
    std::lock_guard lk(c.mu);
    c.created = true;
    return ThreadPool(c.threads > 0 ? c.threads : default_threads(), c.pin);
  }();
  return pool;
}

int ThreadPool::size() const { return impl_->size; }

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (n == 1) {
    fn(0, 1, 0);
    return;
  }
  Impl& m = *impl_;
  std::unique_lock job(m.job_mu, std::defer_lock);
  if (m.size == 1 || t_in_task || !job.try_lock()) {  // nested, busy or single-threaded: inline
    fn(0, n, 0);
    return;
  }
  m.fn = &fn;
  m.n = n;
  m.grain = grain > 0 ? grain : std::max<int64_t>(1, n / (4 * static_cast<int64_t>(m.size)));
  m.next.store(0, std::memory_order_relaxed);
  m.error = nullptr;
  m.pending.store(m.size - 1, std::memory_order_relaxed);
  {
    std::lock_guard lk(m.mu);
    m.generation.fetch_add(1, std::memory_order_release);
  }
  m.cv_work.notify_all();
  m.run_chunks(0);
  int spins = 0;
  while (m.pending.load(std::memory_order_acquire) != 0 && spins < kSpin) {
    _mm_pause();
    ++spins;
  }
  if (m.pending.load(std::memory_order_acquire) != 0) {
    std::unique_lock lk(m.mu);
    m.cv_done.wait(lk, [&] { return m.pending.load(std::memory_order_acquire) == 0; });
  }
  m.fn = nullptr;
  if (m.error) std::rethrow_exception(m.error);
}

}  // namespace k3

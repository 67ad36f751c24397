// The CPU kernels' thread pool (replaces OpenMP): one fork-join `parallel_for` at a time, the caller
// taking part. Workers spin ~100 us after a job (back-to-back kernels of a forward pass reuse them at
// once) and then sleep on a condition variable, so idle threads cost nothing on a busy machine (OpenMP's
// default spinning made decode 4-10x slower on a loaded 2-core box). Work is split into chunks of
// indices; which thread runs a chunk never changes a result (every index's work is independent), so
// outputs do not depend on the thread count. Nested calls (from inside a task) and calls while another
// thread's job runs execute inline on the calling thread.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace k3 {

class ThreadPool {
 public:
  // `threads` in total, the caller included (1: everything runs inline). `pin[t]`: the CPUs worker t
  // (1 <= t < threads) is bound to when it starts (missing or empty: not pinned; pin[0], the caller's, is
  // not applied here: the caller is not the pool's thread).
  explicit ThreadPool(int threads, std::vector<std::vector<int>> pin = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The process-wide pool, created on first use: the size and pinning from configure_global() if it was
  // called, else default_threads() workers, not pinned.
  static ThreadPool& global();

  // Sets the global pool's size (1..1024) and placement (see the constructor) before its first use
  // (`-t/--threads`, `--numa`). Throws k3::Error for a size out of range or once the pool exists.
  static void configure_global(int threads, std::vector<std::vector<int>> pin = {});

  // K3_NUM_THREADS, else OMP_NUM_THREADS, else the CPUs this process may run on (sched_getaffinity, so
  // taskset / cgroup limits count); `source` (optional) says which.
  static int default_threads(std::string* source = nullptr);

  int size() const;

  // How long idle workers (and a caller waiting for them) spin before they sleep, for every pool
  // (default 100 us, clamped to 0..1 s). A sleeping worker wakes tens of microseconds late and then finds
  // its job done by the others, so jobs further apart than the spin time run on fewer threads: the hybrid
  // CUDA runner, whose CPU expert jobs are one GPU layer (~100-300 us) apart, raises it.
  static void set_spin_time(std::chrono::microseconds t);
  static std::chrono::microseconds spin_time();

  // How chunks are handed out. Spread: each thread starts on its own contiguous run of them and then takes
  // what is left of the others' (no shared counter while it has its own). InOrder: from one counter, in
  // increasing index order -- for a job whose later chunks wait on earlier ones (matmul_two_stage: a chunk
  // only waits on chunks some running thread has already claimed, so it cannot deadlock). Spread is a preference:
  // pools of more than 4 threads hand it out in order too (measured slower at 16 threads, faster at 2; thread_pool.cpp;
  // K3_POOL_CLAIM=inorder | spread overrides).
  enum class Claim { Spread, InOrder };

  // fn(begin, end, thread) over [0, n) in chunks of `grain` indices (0: about n / (4 x size)), chunk c being
  // [c x grain, min(n, (c + 1) x grain)) whatever the thread count or claim order, thread in [0, size()) (for
  // per-thread scratch). Returns when every chunk is done; rethrows the first exception (chunks not yet
  // started are then skipped). `first_stage` > 0 (Spread): the chunks holding indices [0, first_stage) are all
  // claimed before any later one -- two dependent stages in one job, each spread (matmul_two_stage: a second-stage
  // chunk waits only on first-stage chunks running threads hold, as in order).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& fn,
                    Claim claim = Claim::Spread, int64_t first_stage = 0);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// fn(i) for i in [0, n) on the global pool when `parallel`, else inline.
template <typename F>
void parallel_for(int64_t n, bool parallel, F&& fn) {
  if (!parallel || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  ThreadPool::global().parallel_for(n, 0, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) fn(i);
  });
}

}  // namespace k3

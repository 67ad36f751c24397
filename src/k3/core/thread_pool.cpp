#include "k3/core/thread_pool.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
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
// How long a worker (or the caller) spins before it sleeps: longer than the gaps between the kernels of a
// forward pass (a few us of serial work: norms, routing), short enough that an idle pool stops taking
// CPU from the rest of a busy machine at once. Timed, not counted: a pause is ~50 ns on this EPYC (20000
// of them, the old count, were ~1 ms, not the ~100 us intended).
// ThreadPool::set_spin_time changes it (the hybrid CUDA runner: its CPU jobs are a GPU layer apart).
std::atomic<int64_t> g_spin_us{100};

// Spins until done() or the spin time has passed; returns done().
template <typename Done>
bool spin_until(Done&& done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(g_spin_us.load(std::memory_order_relaxed));
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (done()) return true;
      _mm_pause();
    }
    if (std::chrono::steady_clock::now() >= end) return done();
  }
}
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

// A job's life: the caller publishes it (a new generation in `state`, open, no one joined), workers that
// see it in time JOIN it (an atomic add to the joined count, which counts only while it is open), all
// take chunks, and when the caller runs out of chunks it CLOSES the job and waits only for the workers
// that joined. A worker that wakes late (asleep on the condition variable, or descheduled on a busy
// machine) finds the job closed and goes back to waiting: the caller never waits for a thread that does
// no work (it used to wait for every worker to pass by each job, i.e. a futex wake-up per kernel).
struct ThreadPool::Impl {
  static constexpr uint64_t kClosed = uint64_t{1} << 31, kJoinedMask = kClosed - 1;
  static uint32_t gen_of(uint64_t s) { return static_cast<uint32_t>(s >> 32); }

  int size = 1;
  std::vector<std::thread> workers;
  std::mutex job_mu;  // one job at a time (others run inline)

  // The current job: written by the caller before it publishes the generation, read by the workers that
  // joined it (the job stays alive until they have left).
  const std::function<void(int64_t, int64_t, int)>* fn = nullptr;
  int64_t n = 0, grain = 1;
  bool in_order = false;  // Claim::InOrder: every chunk from slots[0], in increasing order
  int stages = 1;         // 2: the chunks below the split are all claimed before any above it
  // The job's chunks (of `grain` indices), split into one contiguous run per thread: thread t claims from
  // slots[t] (an atomic add on a line no one else touches while it has chunks), then takes what is left of
  // the others' runs. With one shared counter every claim was a contended atomic and consecutive chunks went to
  // different threads (no thread streamed two blocks in a row): a job cost ~9-11 us at 16 threads (k3 bench memory
  // --job-kib, s54-2; how much of that the counter was is not measured apart) and the runs made kl-1b's decode
  // 4-20% faster at 2 threads (docs/perf/cpu.md, session 54).
  struct alignas(64) Slot {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  std::unique_ptr<Slot[]> slots;
  std::atomic<bool> failed{false};  // a chunk threw: stop handing out chunks
  // Whether a Spread job is handed out in order after all: measured, the per-thread runs win at 2 threads (dev box,
  // kl-1b decode +4-20%, session 54) and lose at 16 (the H100 host's Xeon, call s55-1: kl48 decode 49.8 / 51.3 / 52.0
  // vs 50.2 / 53.5 / 58.7 tok/s in order; 1.2-3.2 us more a 64-256 KiB job); the boundary between is not measured: spread up
  // to 4 threads. K3_POOL_CLAIM=inorder | spread forces either (the A/B knob).
  static constexpr int kSpreadMaxThreads = 4;
  bool force_in_order = false;  // set once the size is (the constructor)
  static bool spread_loses(int threads) {
    const char* e = std::getenv("K3_POOL_CLAIM");
    if (e != nullptr && std::string(e) == "inorder") return true;
    if (e != nullptr && std::string(e) == "spread") return false;
    return threads > kSpreadMaxThreads;
  }
  std::exception_ptr error;
  std::mutex error_mu;

  // Each on its own cache line: all workers add themselves to `state` as a job opens and count themselves out
  // on `left` at once.
  alignas(64) std::atomic<uint64_t> state{0};  // generation << 32 | closed bit | workers joined
  alignas(64) std::atomic<int> left{0};        // joined workers that have finished their chunks
  alignas(64) std::atomic<bool> caller_asleep{false};  // the caller waits on cv_done (spun past the spin time)
  std::atomic<int> asleep{0};                          // workers waiting on cv_work
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  bool stop = false;

  // Opens a job of generation gen: sleeping workers (if any) are woken under mu; spinning ones see it at once.
  void publish(uint32_t gen) {
    state.store(static_cast<uint64_t>(gen) << 32, std::memory_order_seq_cst);
    // A worker counts itself asleep under mu before its predicate's seq_cst load of `state`: either it sees
    // the new generation or this load sees it asleep; mu then orders the wake-up after its wait began.
    if (asleep.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard lk(mu); }
      cv_work.notify_all();
    }
  }

  // Splits the job's chunks into the threads' runs (the caller, before it publishes the job): one run a thread
  // per stage -- chunks [0, split) and [split, chunks) with a split, else one stage -- or, in order, one run.
  void plan(int64_t chunks, int64_t split) {
    stages = in_order || split <= 0 || split >= chunks ? 1 : 2;
    const int runs = in_order ? 1 : size;
    const int64_t bounds[3] = {0, stages == 2 ? split : chunks, chunks};  // stage st: [bounds[st], bounds[st + 1])
    for (int st = 0; st < 2; ++st)
      for (int t = 0; t < size; ++t) {
        const int64_t lo = bounds[st], len = bounds[st + 1] - lo;
        Slot& sl = slots[static_cast<size_t>(st * size + t)];
        sl.next.store(t < runs ? lo + len * t / runs : lo + len, std::memory_order_relaxed);
        sl.end = t < runs ? lo + len * (t + 1) / runs : lo + len;
      }
  }

  void run_chunk(int64_t c, int thread) {
    const int64_t b = c * grain, e = std::min(n, b + grain);
    try {
      (*fn)(b, e, thread);
    } catch (...) {
      std::lock_guard lk(error_mu);
      if (!error) error = std::current_exception();
      failed.store(true, std::memory_order_relaxed);
    }
  }

  // Stage by stage: own run first, then the others' in turn (the thread's neighbours first); a thread reaches the
  // second stage only once every first-stage chunk is claimed. Returns once every chunk is claimed.
  void run_chunks(int thread) {
    t_in_task = true;
    const int runs = in_order ? 1 : size;
    for (int k = 0; k < stages * runs; ++k) {
      Slot& sl = slots[static_cast<size_t>(k / runs * size + (thread + k) % runs)];
      while (!failed.load(std::memory_order_relaxed)) {
        const int64_t c = sl.next.fetch_add(1, std::memory_order_relaxed);
        if (c >= sl.end) break;
        run_chunk(c, thread);
      }
    }
    t_in_task = false;
  }

  // Joins the current job if it is still open (one atomic add: a CAS loop retried by 15 workers at once costs
  // microseconds a job); returns its generation in *gen either way. An add on a closed job is harmless: the
  // caller read the joined count when it closed it, and the next job's publish overwrites the word.
  bool join(uint32_t* gen) {
    const uint64_t s = state.fetch_add(1, std::memory_order_acq_rel);
    *gen = gen_of(s);
    return !(s & kClosed);
  }

  void worker(int thread) {
    uint32_t seen = 0;
    auto fresh = [&] { return gen_of(state.load(std::memory_order_acquire)) != seen; };
    for (;;) {
      // Spin for a new job (back-to-back kernels), then sleep.
      if (!spin_until(fresh)) {
        std::unique_lock lk(mu);
        asleep.fetch_add(1, std::memory_order_seq_cst);  // before the predicate's load: see publish()
        cv_work.wait(lk, [&] { return stop || gen_of(state.load(std::memory_order_seq_cst)) != seen; });
        asleep.fetch_sub(1, std::memory_order_relaxed);
        if (stop) return;
      }
      if (!join(&seen)) continue;  // closed: wait for the next one
      run_chunks(thread);
      left.fetch_add(1, std::memory_order_seq_cst);
      // Only a sleeping caller needs the mutex and a wake-up: it sets caller_asleep under mu before its
      // predicate's seq_cst load of `left`, so either it sees this count or this load sees the flag. Taking
      // mu every job made the workers of a 16-thread pool queue on it between back-to-back kernels.
      if (caller_asleep.load(std::memory_order_seq_cst)) {
        { std::lock_guard lk(mu); }  // a caller between its check and its wait holds mu: no lost wake-up
        cv_done.notify_one();
      }
    }
  }
};

ThreadPool::ThreadPool(int threads, std::vector<std::vector<int>> pin) : impl_(std::make_unique<Impl>()) {
  impl_->size = std::max(1, threads);
  impl_->force_in_order = Impl::spread_loses(impl_->size);
  impl_->slots = std::make_unique<Impl::Slot[]>(2 * static_cast<size_t>(impl_->size));
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

void ThreadPool::set_spin_time(std::chrono::microseconds t) {
  g_spin_us.store(std::clamp<int64_t>(t.count(), 0, 1000000), std::memory_order_relaxed);
}

std::chrono::microseconds ThreadPool::spin_time() { return std::chrono::microseconds(g_spin_us.load(std::memory_order_relaxed)); }

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& fn, Claim claim,
                              int64_t first_stage) {
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
  m.in_order = claim == Claim::InOrder || m.force_in_order;
  m.plan((n + m.grain - 1) / m.grain, first_stage > 0 ? (first_stage + m.grain - 1) / m.grain : 0);
  m.failed.store(false, std::memory_order_relaxed);
  m.error = nullptr;
  m.left.store(0, std::memory_order_relaxed);
  m.publish(Impl::gen_of(m.state.load(std::memory_order_relaxed)) + 1);
  m.run_chunks(0);
  // Every chunk is taken: close the job to latecomers, then wait for the workers inside it.
  const uint64_t closed = m.state.fetch_or(Impl::kClosed, std::memory_order_acq_rel);
  const int joined = static_cast<int>(closed & Impl::kJoinedMask);
  auto all_left = [&] { return m.left.load(std::memory_order_seq_cst) == joined; };
  if (!spin_until(all_left)) {
    std::unique_lock lk(m.mu);
    m.caller_asleep.store(true, std::memory_order_seq_cst);  // before the predicate's load (see worker())
    m.cv_done.wait(lk, all_left);
    m.caller_asleep.store(false, std::memory_order_relaxed);
  }
  m.fn = nullptr;
  if (m.error) std::rethrow_exception(m.error);
}

}  // namespace k3

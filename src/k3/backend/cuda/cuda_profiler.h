// K3_CUDA_PROFILE=1: GPU time per op category of the eager path, printed when the model is destroyed
// (K3_CUDA_PROFILE_SKIP=N: the first N steps are not counted -- a bench's warm-up pass, whose first-use costs
// of cuBLAS and the allocator otherwise dominate a one-repetition profile).
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace k3::cuda {

// Per-category GPU time of the eager path (K3_CUDA_PROFILE=1): cudaEvent pairs around each region,
// summed after the step's synchronisation and printed when the model is destroyed.
class Profiler {
 public:
  explicit Profiler(bool on) : on_(on) {
    if (const char* n = std::getenv("K3_CUDA_PROFILE_SKIP"))  // digits only, clamped: no atoi overflow
      skip_ = std::clamp<long long>(std::strtoll(n, nullptr, 10), 0, 1LL << 30);
  }
  ~Profiler() {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }
  bool on() const { return on_; }
  void begin(const char* cat, cudaStream_t s) {
    if (!on_) return;
    open_.push_back({cat, event(), nullptr});
    cudaEventRecord(open_.back().a, s);
  }
  void end(cudaStream_t s) {
    if (!on_) return;
    open_.back().b = event();
    cudaEventRecord(open_.back().b, s);
    done_.push_back(open_.back());
    open_.pop_back();
  }
  // After the stream is synchronised (once per step).
  void collect() {
    const bool counted = skip_ == 0;
    if (!counted) --skip_;
    for (auto& r : done_) {
      float ms = 0;
      cudaEventElapsedTime(&ms, r.a, r.b);
      if (counted) {
        auto& t = totals_[r.cat];
        t.first += ms;
        t.second += 1;
      }
      free_.push_back(r.a);
      free_.push_back(r.b);
    }
    done_.clear();
  }
  // Host-side wall time of a region the CPU runs (the host expert jobs: waiting for their inputs, computing).
  void add_host(const char* cat, double ms) {
    if (!on_ || skip_ > 0) return;  // a skipped step's (collect() ends it)
    auto& t = host_totals_[cat];
    t.first += ms;
    t.second += 1;
  }
  void print() const {
    if (!on_ || totals_.empty()) return;
    // A category with a '/' is a part of an enclosing region ("kda/conv" inside "kda core"): left out of the total,
    // its share given of the whole as the others' are.
    double all = 0;
    for (auto& [k, v] : totals_)
      if (k.find('/') == std::string::npos) all += v.first;
    std::fprintf(stderr, "k3 cuda profile (eager path; GPU time per region):\n");
    for (auto& [k, v] : totals_)
      std::fprintf(stderr, "  %-14s %10.3f ms  %5.1f%%  %8lld calls\n", k.c_str(), v.first, 100.0 * v.first / all,
                   static_cast<long long>(v.second));
    if (!host_totals_.empty()) std::fprintf(stderr, "k3 cuda profile (host wall time per region):\n");
    for (auto& [k, v] : host_totals_)
      std::fprintf(stderr, "  host: %-18s %10.3f ms  %8lld calls  %8.1f us/call\n", k.c_str(), v.first,
                   static_cast<long long>(v.second), 1e3 * v.first / static_cast<double>(std::max<int64_t>(v.second, 1)));
  }

 private:
  struct Region {
    const char* cat;
    cudaEvent_t a, b;
  };
  cudaEvent_t event() {
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    cudaEvent_t e;
    cudaEventCreate(&e);
    pool_.push_back(e);
    return e;
  }
  bool on_;
  long long skip_ = 0;  // steps still to leave out of the totals
  std::vector<Region> open_, done_;
  std::vector<cudaEvent_t> pool_, free_;
  std::map<std::string, std::pair<double, int64_t>> totals_, host_totals_;
};

// A region for the length of a scope (functions with several returns).
class ProfRegion {
 public:
  ProfRegion(Profiler& p, const char* cat, cudaStream_t s) : p_(p), s_(s) { p_.begin(cat, s_); }
  ~ProfRegion() { p_.end(s_); }
  ProfRegion(const ProfRegion&) = delete;
  ProfRegion& operator=(const ProfRegion&) = delete;

 private:
  Profiler& p_;
  cudaStream_t s_;
};

}  // namespace k3::cuda

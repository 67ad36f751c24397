// A default-on switch of the CUDA backend's kernels: off when its environment variable starts with '0' (read once, on
// first use; any other value means on), and forced either way by tests (nullopt: back to the environment's). The A/B
// switches of the timing calls (K3_MOE_HPERM, K3_MOE_DEC_FOLD, ...) are these, so that one binary runs both arms.
#pragma once
#include <atomic>
#include <cstdlib>
#include <optional>

namespace k3::cuda {

class EnvFlag {
 public:
  explicit constexpr EnvFlag(const char* var) : var_(var) {}
  EnvFlag(const EnvFlag&) = delete;
  EnvFlag& operator=(const EnvFlag&) = delete;

  bool on() const {
    const int f = forced_.load(std::memory_order_relaxed);
    if (f >= 0) return f == 1;
    int e = env_.load(std::memory_order_relaxed);
    if (e < 0) {  // a race here only reads the same variable twice
      const char* v = std::getenv(var_);
      e = v && v[0] == '0' ? 0 : 1;
      env_.store(e, std::memory_order_relaxed);
    }
    return e == 1;
  }
  void force(std::optional<bool> v) { forced_.store(v ? (*v ? 1 : 0) : -1, std::memory_order_relaxed); }

 private:
  const char* var_;
  mutable std::atomic<int> env_{-1};
  std::atomic<int> forced_{-1};
};

}  // namespace k3::cuda

// K3_CPU_PROFILE=1 (K3_CPU_PROFILE_SKIP=N: from step N + 1 on): wall time per op of the CPU backend (every op runs to completion before it returns, so
// wall time is the op's time), with the bytes of weights each matrix product streams, printed when the
// backend is destroyed. Says where a decode step's time goes beside the DRAM bound (docs/perf/cpu.md).
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace k3::cpu {

class CpuOpProfile {
 public:
  CpuOpProfile();  // on when K3_CPU_PROFILE is set and not "0"
  ~CpuOpProfile();
  CpuOpProfile(const CpuOpProfile&) = delete;
  CpuOpProfile& operator=(const CpuOpProfile&) = delete;

  bool on() const { return on_; }
  // A step began: the time since the previous one is one step's wall time (ops + what runs between them).
  void step_boundary();
  void add(const std::string& name, double seconds, int64_t bytes);

  // Times one op: `Scope s(prof, "rmsnorm");` (costs one branch when profiling is off).
  class Scope {
   public:
    Scope(CpuOpProfile& p, const char* name, int64_t bytes = 0) : p_(p.on_ ? &p : nullptr), name_(name), bytes_(bytes) {
      if (p_) t0_ = std::chrono::steady_clock::now();
    }
    // A name built only when profiling is on (a matrix product's shape and format).
    template <typename F>
    Scope(CpuOpProfile& p, F&& make_name, int64_t bytes) : p_(p.on_ ? &p : nullptr), name_(nullptr), bytes_(bytes) {
      if (p_) {
        owned_ = make_name();
        t0_ = std::chrono::steady_clock::now();
      }
    }
    ~Scope() {
      if (p_)
        p_->add(name_ ? std::string(name_) : owned_,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(), bytes_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    // Bytes known only after the op began (the experts a MoE step routed to).
    void set_bytes(int64_t b) { bytes_ = b; }

   private:
    CpuOpProfile* p_;
    const char* name_;
    std::string owned_;
    int64_t bytes_;
    std::chrono::steady_clock::time_point t0_{};
  };

 private:
  struct Total {
    double seconds = 0;
    int64_t calls = 0, bytes = 0;
  };
  void print() const;

  bool on_ = false;
  int skip_ = 0;  // K3_CPU_PROFILE_SKIP=N: the first N steps are not counted (a bench's warm-up)
  std::map<std::string, Total> totals_;
  int64_t steps_ = 0;
  double step_seconds_ = 0;
  bool started_ = false;
  std::chrono::steady_clock::time_point last_step_{};
};

}  // namespace k3::cpu

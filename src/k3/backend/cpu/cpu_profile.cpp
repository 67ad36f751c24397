// K3_CPU_PROFILE: the per-op wall-time table of the CPU backend (cpu_profile.h).
#include "k3/backend/cpu/cpu_profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace k3::cpu {

CpuOpProfile::CpuOpProfile() {
  const char* e = std::getenv("K3_CPU_PROFILE");
  on_ = e != nullptr && std::string(e) != "0" && std::string(e) != "";
  if (const char* s = std::getenv("K3_CPU_PROFILE_SKIP"))  // digits only, clamped: no atoi overflow
    skip_ = static_cast<int>(std::clamp<long long>(std::strtoll(s, nullptr, 10), 0, 1 << 30));
}

CpuOpProfile::~CpuOpProfile() { print(); }

void CpuOpProfile::step_boundary() {
  if (!on_) return;
  if (skip_ > 0) {  // a skipped step (warm-up, prefill): neither its ops nor its interval are counted
    --skip_;
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (started_) {
    step_seconds_ += std::chrono::duration<double>(now - last_step_).count();
    ++steps_;
  }
  started_ = true;
  last_step_ = now;
}

void CpuOpProfile::add(const std::string& name, double seconds, int64_t bytes) {
  if (skip_ > 0) return;
  Total& t = totals_[name];
  t.seconds += seconds;
  t.calls += 1;
  t.bytes += bytes;
}

// Sorted by time; matrix products with the GB/s their weights streamed at (a decode step reads each weight
// once, so that rate beside the machine's read bandwidth says how far each shape is from its bound).
void CpuOpProfile::print() const {
  if (!on_ || totals_.empty()) return;
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double all = 0;
  int64_t all_bytes = 0;
  for (const auto& [k, t] : rows) {
    all += t.seconds;
    all_bytes += t.bytes;
  }
  std::fprintf(stderr, "k3 cpu profile (wall time per op; %lld step intervals, %.3f ms of steps, %.3f ms in ops):\n",
               static_cast<long long>(steps_), 1e3 * step_seconds_, 1e3 * all);
  std::fprintf(stderr, "  %-44s %10s %6s %9s %9s %8s\n", "op", "ms", "%", "calls", "us/call", "GB/s");
  for (const auto& [k, t] : rows) {
    char gbs[32] = "";
    if (t.bytes > 0 && t.seconds > 0) std::snprintf(gbs, sizeof gbs, "%8.1f", 1e-9 * static_cast<double>(t.bytes) / t.seconds);
    std::fprintf(stderr, "  %-44s %10.3f %5.1f%% %9lld %9.1f %8s\n", k.c_str(), 1e3 * t.seconds, 100.0 * t.seconds / all,
                 static_cast<long long>(t.calls), 1e6 * t.seconds / static_cast<double>(t.calls), gbs);
  }
  if (all_bytes > 0)
    std::fprintf(stderr, "  weights streamed by the timed products: %.3f GB in %.3f ms of ops\n", 1e-9 * static_cast<double>(all_bytes),
                 1e3 * all);
}

}  // namespace k3::cpu

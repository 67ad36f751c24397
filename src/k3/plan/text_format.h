// printf-style formatting and human-readable sizes for the planners' tables (plan.cpp, offload_plan.cpp).
#pragma once
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <string>

namespace k3::plan {

inline std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
inline std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// 1.23 GB (decimal units, as the hardware tables quote memory).
inline std::string bytes_h(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (std::fabs(b) >= 1000 && u < 4) b /= 1000, ++u;
  return u ? fmt("%.2f %s", b, units[u]) : fmt("%.0f B", b);
}

inline std::string count_h(double n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int u = 0;
  while (n >= 1000 && u < 4) n /= 1000, ++u;
  return u ? fmt("%.2f%s", n, units[u]) : fmt("%.0f", n);
}

}  // namespace k3::plan

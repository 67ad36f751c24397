#include "cli/common.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "k3/core/error.h"

namespace k3cli {

namespace fs = std::filesystem;

static const char* kDefaultModel = "models/k3-tiny";

std::string resolve_model_dir(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* env = std::getenv("K3_MODEL"); env && *env) return env;
  std::vector<fs::path> candidates = {fs::current_path() / kDefaultModel};
  char exe[4096];
  ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len > 0) {
    exe[len] = '\0';
    fs::path dir = fs::path(exe).parent_path();
    for (int up = 0; up < 4 && !dir.empty(); ++up, dir = dir.parent_path()) candidates.push_back(dir / kDefaultModel);
  }
  for (auto& c : candidates)
    if (fs::exists(c / "config.json")) return c.string();
  throw k3::Error("no model given: pass -m DIR (an HF checkpoint directory) or set K3_MODEL; the default model '" +
                  std::string(kDefaultModel) + "' was not found");
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (b >= 1000 && u < 5) b /= 1000, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

std::string human_count(double n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int u = 0;
  while (n >= 1000 && u < 4) n /= 1000, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, u ? "%.2f%s" : "%.0f%s", n, units[u]);
  return buf;
}

}  // namespace k3cli

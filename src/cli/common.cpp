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
    // An installed binary (`cmake --install`: PREFIX/bin/k3) finds PREFIX/share/k3/models/k3-tiny.
    candidates.push_back(dir.parent_path() / "share" / "k3" / kDefaultModel);
    for (int up = 0; up < 4 && !dir.empty(); ++up, dir = dir.parent_path()) candidates.push_back(dir / kDefaultModel);
  }
  for (auto& c : candidates)
    if (std::error_code ec; fs::exists(c / "config.json", ec)) return c.string();  // no throw on loops
  throw k3::Error("no model given: pass -m DIR (an HF checkpoint directory) or set K3_MODEL; the default model '" +
                  std::string(kDefaultModel) + "' was not found");
}

void check_tokenizer_fits(int64_t tokenizer_n_vocab, int64_t model_vocab_size) {
  if (tokenizer_n_vocab > model_vocab_size)
    throw k3::Error("the tokenizer has " + std::to_string(tokenizer_n_vocab) + " ids but the model's vocab_size is " +
                    std::to_string(model_vocab_size) + " (tokenizer files from another model?)");
}

int64_t parse_memory(const std::string& s, int64_t fraction_of) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    throw k3::Error("cannot read memory size '" + s + "' (examples: 2GiB, 512MB, 0.25)");
  }
  std::string unit = s.substr(used);
  double mul = 1;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "K" || unit == "KB") mul = 1e3;
  else if (unit == "M" || unit == "MB") mul = 1e6;
  else if (unit == "G" || unit == "GB") mul = 1e9;
  else if (unit == "KiB") mul = 1024.0;
  else if (unit == "MiB") mul = 1024.0 * 1024;
  else if (unit == "GiB") mul = 1024.0 * 1024 * 1024;
  else throw k3::Error("unknown memory unit '" + unit + "' in '" + s + "' (use B, KB, MB, GB, KiB, MiB, GiB)");
  if (!(v > 0)) throw k3::Error("memory size must be positive: '" + s + "'");
  if (unit.empty() && v < 1) {
    const double whole = fraction_of > 0 ? static_cast<double>(fraction_of)
                                         : static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
    return static_cast<int64_t>(v * whole);
  }
  return static_cast<int64_t>(v * mul);
}

bool memory_is_fraction(const std::string& s) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == s.size() && v > 0 && v < 1;
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

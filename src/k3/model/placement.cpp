#include "k3/model/placement.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>

#include "k3/core/error.h"
#include "k3/core/weight.h"

namespace k3 {

struct Placement::Rule {
  std::string pattern, device_name;
  int device = kHostDevice;
  int below_layer = -1;  // --n-cpu-moe: the pattern's group 1 is a layer index that must be < this
  pcre2_code* code = nullptr;
  pcre2_match_data* md = nullptr;  // reused: binding asks once per tensor (~250k for K3), one thread
  ~Rule() {
    pcre2_match_data_free(md);
    pcre2_code_free(code);
  }
};

namespace {

// A user's pattern in an error message: at most 80 characters.
std::string shown(const std::string& s) { return s.size() <= 80 ? s : s.substr(0, 77) + "..."; }

// CPU | CUDA<n> | cuda | cuda:<n> (llama.cpp names buffer types CPU, CUDA0, ...).
int parse_device(const std::string& flag, const std::string& d) {
  std::string l;
  for (char c : d) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l == "cpu") return kHostDevice;
  std::string num;
  if (l == "cuda") return 0;
  if (l.rfind("cuda:", 0) == 0) num = l.substr(5);
  else if (l.rfind("cuda", 0) == 0) num = l.substr(4);
  if (!num.empty() && num.size() <= 3 && num.find_first_not_of("0123456789") == std::string::npos) return std::stoi(num);
  throw Error(flag + ": unknown device '" + d + "' (expected CPU, CUDA0, cuda or cuda:N)");
}

}  // namespace

Placement::Placement() = default;
Placement::~Placement() = default;
Placement::Placement(Placement&&) noexcept = default;
Placement& Placement::operator=(Placement&&) noexcept = default;

Placement Placement::parse(const std::vector<std::string>& override_tensor, bool cpu_moe, int n_cpu_moe) {
  std::vector<std::pair<std::string, std::string>> specs;  // (pattern, device)
  for (const std::string& ot : override_tensor) {
    const size_t eq = ot.rfind('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == ot.size())
      throw Error("--override-tensor '" + shown(ot) + "': expected PATTERN=DEVICE (e.g. 'experts=CPU')");
    specs.emplace_back(ot.substr(0, eq), ot.substr(eq + 1));
  }
  if (n_cpu_moe < 0) throw Error("--n-cpu-moe must be >= 0");
  if (n_cpu_moe > 0) specs.emplace_back("\\blayers\\.(\\d+)\\..*\\.experts\\.", "CPU");  // layer < N: below_layer
  if (cpu_moe) specs.emplace_back("\\.experts\\.", "CPU");  // routed experts ("shared_experts." does not match)
  Placement p;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [pattern, device] = specs[i];
    auto r = std::make_unique<Rule>();
    r->pattern = pattern;
    r->device_name = device;
    if (n_cpu_moe > 0 && i == override_tensor.size()) r->below_layer = n_cpu_moe;
    r->device = parse_device("--override-tensor '" + shown(pattern + "=" + device) + "'", device);
    int err = 0;
    PCRE2_SIZE off = 0;
    r->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), 0, &err, &off, nullptr);
    if (!r->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error("--override-tensor '" + shown(pattern) + "': the pattern does not compile at offset " + std::to_string(off) +
                  ": " + reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE);
    r->md = pcre2_match_data_create_from_pattern(r->code, nullptr);
    p.rules_.push_back(std::move(r));
  }
  return p;
}

int Placement::device_of(const std::string& name, int model_device) const {
  for (const auto& r : rules_) {
    pcre2_match_data* md = r->md;
    const int rc = pcre2_match(r->code, reinterpret_cast<PCRE2_SPTR>(name.data()), name.size(), 0, 0, md, nullptr);
    bool hit = rc >= 0;
    if (hit && r->below_layer >= 0) {  // the layer index (group 1), compared as a number (at most 9 digits)
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const std::string digits = name.substr(ov[2], ov[3] - ov[2]);
      hit = digits.size() <= 9 && std::stol(digits) < r->below_layer;
    }
    if (hit) return r->device;
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
      throw Error("--override-tensor '" + shown(r->pattern) + "': matching failed on " + name);
  }
  return model_device;
}

bool Placement::empty() const { return rules_.empty(); }

bool Placement::only_host() const {
  for (const auto& r : rules_)
    if (r->device != kHostDevice) return false;
  return true;
}

std::vector<std::string> Placement::describe() const {
  std::vector<std::string> v;
  for (const auto& r : rules_)
    v.push_back(r->below_layer >= 0 ? "experts of layers < " + std::to_string(r->below_layer) + "=" + r->device_name
                                    : r->pattern + "=" + r->device_name);
  return v;
}

}  // namespace k3

#include "k3/backend/cpu/cpu_isa.h"

#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "k3/backend/cpu/weight_kernels.h"
#include "k3/core/error.h"

namespace k3::cpu {

namespace {

using Flag = std::pair<const char*, bool CpuFeatures::*>;
// /proc/cpuinfo's spelling of each flag k3 reads.
const Flag kFlags[] = {
    {"avx", &CpuFeatures::avx},           {"avx2", &CpuFeatures::avx2},
    {"fma", &CpuFeatures::fma},           {"f16c", &CpuFeatures::f16c},
    {"avx512f", &CpuFeatures::avx512f},   {"avx512bw", &CpuFeatures::avx512bw},
    {"avx512vl", &CpuFeatures::avx512vl}, {"avx512dq", &CpuFeatures::avx512dq},
    {"avx512_bf16", &CpuFeatures::avx512_bf16}, {"avx512_vnni", &CpuFeatures::avx512_vnni},
    {"avx_vnni", &CpuFeatures::avx_vnni}, {"amx_tile", &CpuFeatures::amx_tile},
    {"amx_bf16", &CpuFeatures::amx_bf16}, {"amx_int8", &CpuFeatures::amx_int8},
    {"avx512vbmi", &CpuFeatures::avx512_vbmi},
};

// What each tier needs beyond the one below it.
std::vector<Flag> tier_needs(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2: return {kFlags[1], kFlags[2], kFlags[3]};
    case CpuIsa::Avx2Int8: return {};  // avx2's instructions, other arithmetic
    case CpuIsa::Avx512: return {kFlags[4], kFlags[5], kFlags[6], kFlags[7]};
    case CpuIsa::Avx512Bf16: return {kFlags[8], kFlags[9], kFlags[14]};  // VBMI: the MXFP4 nibble decode (vpermb)
    case CpuIsa::Amx: return {kFlags[11], kFlags[12], kFlags[13]};
  }
  return {};
}

std::string tiers_with_kernels(bool (*has_kernels)(CpuIsa)) {
  std::string s;
  for (CpuIsa t : kAllCpuIsas)
    if (has_kernels(t)) s += (s.empty() ? "" : ", ") + std::string(isa_name(t));
  return s;
}

}  // namespace

bool isa_is_exact(CpuIsa isa) { return isa == CpuIsa::Avx2 || isa == CpuIsa::Avx512; }

const char* isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx2Int8: return "avx2int8";
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Avx512Bf16: return "avx512bf16";
    case CpuIsa::Amx: return "amx";
  }
  return "?";
}

std::optional<CpuIsa> parse_isa(std::string_view name) {
  for (CpuIsa t : kAllCpuIsas)
    if (name == isa_name(t)) return t;
  return std::nullopt;
}

std::string isa_missing_features(const CpuFeatures& f, CpuIsa isa, bool amx_granted) {
  std::string missing;
  auto add = [&](const char* name) {
    if (!missing.empty()) missing += ' ';
    missing += name;
  };
  for (CpuIsa t : kAllCpuIsas) {  // a tier needs every tier below it
    for (const Flag& flag : tier_needs(t))
      if (!(f.*flag.second)) add(flag.first);
    if (t == CpuIsa::Amx && f.amx_tile && !amx_granted) add("amx-permission");
    if (t == isa) break;
  }
  return missing;
}

IsaChoice choose_isa(const CpuFeatures& f, const char* forced, bool amx_granted, bool (*has_kernels)(CpuIsa)) {
  const std::string with_kernels = tiers_with_kernels(has_kernels);
  // The best tier the CPU can run, the best one with kernels, and the best exact one with kernels.
  std::optional<CpuIsa> best_cpu, best, best_exact;
  for (CpuIsa t : kAllCpuIsas)
    if (isa_missing_features(f, t, amx_granted).empty()) {
      best_cpu = t;
      if (!has_kernels(t)) continue;
      best = t;
      if (isa_is_exact(t)) best_exact = t;
    }
  if (forced && *forced) {
    const std::string what = "K3_CPU_ISA=" + std::string(forced);
    if (std::string_view(forced) == "exact") {
      if (!best_exact) throw Error(what + ": no exact tier fits this CPU (tiers with kernels: " + with_kernels + ")");
      return {*best_exact, "forced by K3_CPU_ISA=exact (fp32 products of weights and activations)"};
    }
    const auto isa = parse_isa(forced);
    if (!isa) throw Error(what + ": unknown kernel tier (expected exact, avx2, avx2int8, avx512, avx512bf16 or amx)");
    if (const std::string m = isa_missing_features(f, *isa, amx_granted); !m.empty())
      throw Error(what + ": this CPU cannot run it (missing: " + m + ")");
    if (!has_kernels(*isa))
      throw Error(what + ": this build has no " + isa_name(*isa) + " kernels yet (tiers with kernels: " + with_kernels + ")");
    return {*isa, "forced by K3_CPU_ISA"};
  }
  if (!best) throw Error("no CPU kernel tier fits this CPU (tiers with kernels: " + with_kernels + ")");
  // The default is the fastest tier, as llama.cpp and vLLM's CPU backend do: an inexact tier rounds the
  // activations (bf16 for BF16 weights, int8 blocks for MXFP4), which costs a KLD of ~1e-3 against exact
  // fp32 products (docs/quality.md); K3_CPU_ISA=exact keeps the exact reference arithmetic. amx, where the kernel
  // grants tile data, is the fastest at prefill (session 24: 1.5-2.2x avx512bf16's at 2-16 threads); its decode is
  // even or up to 9% faster at 2-8 threads and 5-16% slower on kl-1b at 16 (docs/perf/cpu.md).
  std::string reason = *best_cpu == *best ? "the best tier this CPU offers"
                                          : std::string("the CPU offers ") + isa_name(*best_cpu) +
                                                ", but this build has kernels for " + with_kernels + " only";
  if (!isa_is_exact(*best)) {
    reason += "; activations rounded (";
    reason += *best == CpuIsa::Avx2Int8 ? "int8 quads)" : "bf16 / int8 blocks)";
    if (best_exact) {
      reason += ", exact fp32 products (";
      reason += isa_name(*best_exact);
      reason += ") with K3_CPU_ISA=exact";
    }
  }
  return {*best, reason};
}

const CpuState& cpu_state() {
  static const CpuState state = [] {
    CpuState s;
    s.features = detect_cpu_features();
    bool granted = false;
    if (!s.features.amx_tile) {
      s.amx_status = "absent";
    } else if (const int err = request_amx_permission(); err == 0) {
      granted = true;
      s.amx_status = "granted";
    } else {
      s.amx_status = std::string("refused by the kernel (arch_prctl: ") + (err > 0 ? std::strerror(err) : "not Linux") + ")";
    }
    s.choice = choose_isa(s.features, std::getenv("K3_CPU_ISA"), granted, isa_has_kernels);
    return s;
  }();
  return state;
}

std::string feature_names(const CpuFeatures& f) {
  std::string s;
  for (const Flag& flag : kFlags) {
    if (!(f.*flag.second)) continue;
    if (!s.empty()) s += ' ';
    s += flag.first;
  }
  return s;
}

}  // namespace k3::cpu

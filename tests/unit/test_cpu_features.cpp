// CPU feature detection (cpuid + xgetbv) against what the kernel reports in /proc/cpuinfo, the flags'
// implications, the baseline message, and the kernel-tier choice on synthetic CPUs (every tier, forced
// or chosen, whatever this machine has).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "k3/backend/cpu/cpu_features.h"
#include "k3/backend/cpu/cpu_isa.h"
#include "k3/backend/cpu/weight_kernels.h"
#include "k3/core/error.h"

using k3::cpu::CpuFeatures;
using k3::cpu::CpuIsa;

namespace {

std::set<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::set<std::string> out;
  for (std::string w; in >> w;) out.insert(w);
  return out;
}

std::set<std::string> proc_cpuinfo_flags() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("flags", 0) == 0) return words(line.substr(line.find(':') + 1));
  return {};
}

CpuFeatures all_features() {
  CpuFeatures f;
  f.os_avx = f.os_avx512 = f.os_amx = true;
  f.avx = f.avx2 = f.fma = f.f16c = true;
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512_bf16 = f.avx512_vnni = f.avx512_vbmi = f.avx_vnni = true;
  f.amx_tile = f.amx_bf16 = f.amx_int8 = true;
  return f;
}

bool avx2_only(CpuIsa isa) { return isa == CpuIsa::Avx2; }
bool every_tier(CpuIsa) { return true; }
bool below_amx(CpuIsa isa) { return isa != CpuIsa::Amx; }

std::string error_of(const CpuFeatures& f, const char* forced, bool amx_granted, bool (*has)(CpuIsa)) {
  try {
    k3::cpu::choose_isa(f, forced, amx_granted, has);
  } catch (const k3::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(CpuFeatures, ThisMachineHasTheBaseline) {
  const CpuFeatures f = k3::cpu::detect_cpu_features();
  EXPECT_TRUE(f.avx2);
  EXPECT_TRUE(f.fma);
  EXPECT_TRUE(f.f16c);
  EXPECT_TRUE(f.os_avx);
  EXPECT_EQ(k3::cpu::missing_baseline(f), nullptr);
}

// Linux lists a flag only when the CPU has it and the OS enabled its register state: detection must agree
// flag for flag (a wrong cpuid bit or xgetbv mask shows up here on any machine that has the feature).
TEST(CpuFeatures, MatchesProcCpuinfo) {
  const auto proc = proc_cpuinfo_flags();
  if (proc.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  const auto ours = words(k3::cpu::feature_names(k3::cpu::detect_cpu_features()));
  for (const char* name : {"avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
                           "avx512_vnni", "avx512vbmi", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"})
    EXPECT_EQ(ours.count(name), proc.count(name)) << name;
  EXPECT_FALSE(std::string(k3::cpu::detect_cpu_features().model_name).empty());
}

TEST(CpuFeatures, FlagsAreConsistent) {
  const CpuFeatures f = k3::cpu::detect_cpu_features();
  EXPECT_TRUE(!f.avx2 || f.avx);
  EXPECT_TRUE(!f.fma || f.avx);
  EXPECT_TRUE(!f.f16c || f.avx);
  EXPECT_TRUE(!f.avx || f.os_avx);
  for (bool sub : {f.avx512bw, f.avx512vl, f.avx512dq, f.avx512_bf16, f.avx512_vnni, f.avx512_vbmi}) EXPECT_TRUE(!sub || f.avx512f);
  EXPECT_TRUE(!f.avx512f || f.os_avx512);
  EXPECT_TRUE(!f.os_avx512 || f.os_avx);
  EXPECT_TRUE(!f.amx_bf16 || f.amx_tile);
  EXPECT_TRUE(!f.amx_int8 || f.amx_tile);
  EXPECT_TRUE(!f.amx_tile || f.os_amx);
}

TEST(CpuFeatures, MissingBaselineIsNamed) {
  CpuFeatures f = all_features();
  EXPECT_EQ(k3::cpu::missing_baseline(f), nullptr);
  for (bool CpuFeatures::*flag : {&CpuFeatures::avx2, &CpuFeatures::fma, &CpuFeatures::f16c}) {
    CpuFeatures g = f;
    g.*flag = false;
    ASSERT_NE(k3::cpu::missing_baseline(g), nullptr);
    EXPECT_NE(std::string(k3::cpu::missing_baseline(g)).find("lacks AVX2/FMA/F16C"), std::string::npos);
  }
}

TEST(CpuIsa, ChoosesTheBestTierWithKernels) {
  const CpuFeatures f = all_features();
  auto c = k3::cpu::choose_isa(f, nullptr, true, avx2_only);
  EXPECT_EQ(c.isa, CpuIsa::Avx2);
  EXPECT_NE(c.reason.find("the CPU offers amx"), std::string::npos) << c.reason;
  EXPECT_EQ(k3::cpu::choose_isa(f, "amx", true, every_tier).isa, CpuIsa::Amx);
  // The automatic choice is the fastest tier with kernels, exact or not (as llama.cpp: activations
  // rounded); its reason names the exact one, which K3_CPU_ISA=exact picks.
  c = k3::cpu::choose_isa(f, "", true, every_tier);
  EXPECT_EQ(c.isa, CpuIsa::Amx);
  EXPECT_EQ(c.reason,
            "the best tier this CPU offers; activations rounded (bf16 / int8 blocks), exact fp32 products (avx512) with "
            "K3_CPU_ISA=exact");
  // A build without amx kernels: avx512bf16, and the reason says what the CPU offers.
  c = k3::cpu::choose_isa(f, "", true, below_amx);
  EXPECT_EQ(c.isa, CpuIsa::Avx512Bf16);
  EXPECT_NE(c.reason.find("the CPU offers amx, but this build has kernels for avx2, avx2int8, avx512, avx512bf16 only"),
            std::string::npos) << c.reason;
  // AMX refused by the kernel: avx512bf16 is the best the CPU runs.
  c = k3::cpu::choose_isa(f, nullptr, false, every_tier);
  EXPECT_EQ(c.isa, CpuIsa::Avx512Bf16);
  c = k3::cpu::choose_isa(f, "exact", true, every_tier);
  EXPECT_EQ(c.isa, CpuIsa::Avx512);
  EXPECT_NE(c.reason.find("forced by K3_CPU_ISA=exact"), std::string::npos) << c.reason;
  EXPECT_EQ(k3::cpu::choose_isa(f, "exact", true, avx2_only).isa, CpuIsa::Avx2);
  EXPECT_EQ(k3::cpu::choose_isa(f, "avx512bf16", false, every_tier).isa, CpuIsa::Avx512Bf16);
  EXPECT_TRUE(k3::cpu::isa_is_exact(CpuIsa::Avx2) && k3::cpu::isa_is_exact(CpuIsa::Avx512));
  EXPECT_FALSE(k3::cpu::isa_is_exact(CpuIsa::Avx2Int8) || k3::cpu::isa_is_exact(CpuIsa::Avx512Bf16) ||
               k3::cpu::isa_is_exact(CpuIsa::Amx));
  CpuFeatures no_bf16 = f;
  no_bf16.avx512_bf16 = false;  // AMX needs the tiers below it too
  EXPECT_EQ(k3::cpu::choose_isa(no_bf16, nullptr, true, every_tier).isa, CpuIsa::Avx512);
  EXPECT_EQ(k3::cpu::choose_isa(no_bf16, nullptr, true, every_tier).reason, "the best tier this CPU offers");
  CpuFeatures no_vbmi = f;  // BF16 without VBMI (Cooper Lake): the avx512bf16 tier's MXFP4 decode needs vpermb
  no_vbmi.avx512_vbmi = false;
  EXPECT_EQ(k3::cpu::choose_isa(no_vbmi, nullptr, true, every_tier).isa, CpuIsa::Avx512);
  EXPECT_NE(error_of(no_vbmi, "avx512bf16", true, every_tier).find("missing: avx512vbmi"), std::string::npos);
  // An AVX2-only CPU: the avx2int8 rounding tier (int8 activations for MXFP4 and Q8_0 / Q4-6_K), avx2
  // with K3_CPU_ISA=exact or =avx2.
  CpuFeatures plain = f;
  plain.avx512f = false;
  c = k3::cpu::choose_isa(plain, nullptr, true, every_tier);
  EXPECT_EQ(c.isa, CpuIsa::Avx2Int8);
  EXPECT_EQ(c.reason, "the best tier this CPU offers; activations rounded (int8 quads), exact fp32 products (avx2) with "
                      "K3_CPU_ISA=exact");
  EXPECT_EQ(k3::cpu::choose_isa(plain, "exact", true, every_tier).isa, CpuIsa::Avx2);
  EXPECT_EQ(k3::cpu::choose_isa(plain, "avx2int8", true, every_tier).isa, CpuIsa::Avx2Int8);
  EXPECT_EQ(k3::cpu::choose_isa(f, nullptr, true, avx2_only).reason.find("forced"), std::string::npos);
}

TEST(CpuIsa, ForcedTierIsCheckedAgainstCpuAndBuild) {
  const CpuFeatures f = all_features();
  auto c = k3::cpu::choose_isa(f, "avx2", true, avx2_only);
  EXPECT_EQ(c.isa, CpuIsa::Avx2);
  EXPECT_EQ(c.reason, "forced by K3_CPU_ISA");
  EXPECT_EQ(k3::cpu::choose_isa(f, "avx512", true, every_tier).isa, CpuIsa::Avx512);
  EXPECT_NE(error_of(f, "avx512", true, avx2_only).find("K3_CPU_ISA=avx512: this build has no avx512 kernels yet"),
            std::string::npos);
  CpuFeatures avx2_cpu = f;
  avx2_cpu.avx512f = avx2_cpu.amx_tile = false;
  EXPECT_NE(error_of(avx2_cpu, "avx512", true, every_tier).find("cannot run it (missing: avx512f)"), std::string::npos);
  EXPECT_NE(error_of(f, "amx", false, every_tier).find("missing: amx-permission"), std::string::npos);
  for (const char* bad : {"AVX2", "sse", "avx2 ", "avx-512"})
    EXPECT_NE(error_of(f, bad, true, every_tier).find("unknown kernel tier"), std::string::npos) << bad;
  for (CpuIsa t : k3::cpu::kAllCpuIsas) EXPECT_EQ(k3::cpu::parse_isa(k3::cpu::isa_name(t)), t);
}

// Today's build: every tier has kernels (amx since session 23), and the best tier the CPU runs is what runs
// (K3_CPU_ISA is unset in the tests).
TEST(CpuIsa, ActiveTierHasKernels) {
  EXPECT_TRUE(k3::cpu::isa_has_kernels(CpuIsa::Avx2));
  EXPECT_TRUE(k3::cpu::isa_has_kernels(CpuIsa::Avx2Int8));
  EXPECT_TRUE(k3::cpu::isa_has_kernels(CpuIsa::Avx512));
  EXPECT_TRUE(k3::cpu::isa_has_kernels(CpuIsa::Avx512Bf16));
  EXPECT_TRUE(k3::cpu::isa_has_kernels(CpuIsa::Amx));
  const auto& f = k3::cpu::cpu_state().features;
  const bool avx512 = k3::cpu::isa_missing_features(f, CpuIsa::Avx512, false).empty();
  const bool bf16 = k3::cpu::isa_missing_features(f, CpuIsa::Avx512Bf16, false).empty();
  const std::string forced = std::getenv("K3_CPU_ISA") ? std::getenv("K3_CPU_ISA") : "";
  // Unset: the fastest tier with kernels (avx512bf16 and avx2int8 round activations); "exact": the best
  // exact one (the test main sets it when the caller did not).
  const CpuIsa exact = avx512 ? CpuIsa::Avx512 : CpuIsa::Avx2;
  const CpuIsa expected = forced == "exact" ? exact
                          : !forced.empty() ? *k3::cpu::parse_isa(forced)
                          : bf16            ? CpuIsa::Avx512Bf16
                          : avx512          ? CpuIsa::Avx512
                                            : CpuIsa::Avx2Int8;
  EXPECT_EQ(k3::cpu::active_cpu_isa(), expected);
  const auto& s = k3::cpu::cpu_state();
  EXPECT_EQ(s.amx_status == "absent", !s.features.amx_tile) << s.amx_status;
}

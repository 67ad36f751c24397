// The CPU kernel tier: chosen once at start-up as the best tier that both the CPU offers (cpu_features.h)
// and this build has kernels for (weight_kernels.cpp: isa_has_kernels), or forced by $K3_CPU_ISA.
// `k3 info` prints the choice and why; row_kernels() dispatches on it.
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "k3/backend/cpu/cpu_features.h"

namespace k3::cpu {

// Tiers from the baseline up. Avx2, Avx2Int8, Avx512 and Avx512Bf16 have kernels (weight_kernels.cpp,
// weight_kernels_avx2int8.cpp, weight_kernels_avx512.cpp, weight_kernels_avx512bf16.cpp). Avx2Int8 needs
// what Avx2 needs (AVX2 + FMA + F16C) and rounds MXFP4's activations to int8 quads; Amx is reserved for the AMX kernels of issue
// 14, so that adding one is a kernel table, not new plumbing.
enum class CpuIsa { Avx2, Avx2Int8, Avx512, Avx512Bf16, Amx };
inline constexpr CpuIsa kAllCpuIsas[] = {CpuIsa::Avx2, CpuIsa::Avx2Int8, CpuIsa::Avx512, CpuIsa::Avx512Bf16, CpuIsa::Amx};

// Whether a tier's matmuls use the exact fp32 products of the weights and activations (avx2, avx512).
// avx2int8, avx512bf16 (and amx) round the activations (bf16, int8 blocks: docs/perf/cpu.md) as llama.cpp does; the
// automatic choice takes them when the CPU has them, and K3_CPU_ISA=exact keeps the exact tiers.
bool isa_is_exact(CpuIsa isa);

const char* isa_name(CpuIsa isa);  // "avx2", "avx2int8", "avx512", "avx512bf16", "amx" ($K3_CPU_ISA's values, with "exact")
std::optional<CpuIsa> parse_isa(std::string_view name);

// The features a tier needs that `f` lacks, space-separated ("" when the CPU can run it). `amx_granted`:
// whether the kernel allowed the process to use AMX tile data (request_amx_permission).
std::string isa_missing_features(const CpuFeatures& f, CpuIsa isa, bool amx_granted);

struct IsaChoice {
  CpuIsa isa = CpuIsa::Avx2;
  std::string reason;  // for `k3 info`: forced by K3_CPU_ISA, or which better tier is missing what
};

// The tier to run. `forced`: $K3_CPU_ISA (null or empty: the best tier the CPU can run and the build has
// kernels for, exact or not; "exact": the best exact one; else a tier's name). Throws k3::Error for an
// unknown name, a tier the CPU cannot run, or one this build has no kernels for. The tests run with
// K3_CPU_ISA=exact unless they pick a tier (tests/common/test_main.cpp): goldens are exact.
IsaChoice choose_isa(const CpuFeatures& f, const char* forced, bool amx_granted, bool (*has_kernels)(CpuIsa));

// The process's CPU: detected, AMX permission requested (once, when the CPU has AMX) and the tier chosen on
// first use. Throws k3::Error (bad $K3_CPU_ISA) on every call until the environment is fixed.
struct CpuState {
  CpuFeatures features;
  std::string amx_status;  // "absent", "granted" or why the kernel refused
  IsaChoice choice;
};
const CpuState& cpu_state();
inline CpuIsa active_cpu_isa() { return cpu_state().choice.isa; }

// "avx2 fma f16c avx512f ...": the instruction sets `f` has, in /proc/cpuinfo's names.
std::string feature_names(const CpuFeatures& f);

}  // namespace k3::cpu

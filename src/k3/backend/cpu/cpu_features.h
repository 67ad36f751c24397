// What the CPU and the OS offer (cpuid + xgetbv), read without any AVX instruction: cpu_features.cpp is
// built without the AVX2 baseline flags (CMakeLists.txt: k3_cpu_baseline) so that a CPU lacking AVX2/FMA/F16C
// gets a clear error from require_cpu_baseline() instead of SIGILL. Everything here is plain data and C calls
// (no std::string, no inline library code that another TU may have compiled with AVX2 and the linker kept).
// The kernel tier chosen from these flags lives in cpu_isa.h.
#pragma once

namespace k3::cpu {

struct CpuFeatures {
  char model_name[49] = {};  // cpuid brand string, trimmed ("" if the CPU has none)
  // OS support (XCR0): the registers are saved on context switches, so the instructions may be used.
  bool os_avx = false;     // XMM + YMM state
  bool os_avx512 = false;  // + opmask, ZMM_Hi256, Hi16_ZMM
  bool os_amx = false;     // XTILECFG + XTILEDATA
  // Instruction sets: the CPU has them AND the OS enabled their register state (as /proc/cpuinfo lists them).
  bool avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_vnni = false, avx512_vbmi = false, avx_vnni = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
};

// Reads cpuid / xgetbv (no caching; cheap).
CpuFeatures detect_cpu_features();

// nullptr when `f` has the build's baseline (AVX2, FMA, F16C with OS AVX support), else the message to print.
const char* missing_baseline(const CpuFeatures& f);

// Called before any AVX2 code runs (a constructor in the `k3` binary, cli/cpu_baseline_check.cpp): prints
// "k3: error: this CPU lacks AVX2/FMA/F16C ..." and exits 1 when the baseline is missing.
void require_cpu_baseline();

// Linux: asks the kernel for the AMX tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA),
// which a process must do before its first tile instruction. Returns 0 when granted, else the errno
// (or -1 when the OS is not Linux/x86-64).
int request_amx_permission();

}  // namespace k3::cpu

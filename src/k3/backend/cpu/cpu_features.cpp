// Built WITHOUT -mavx2 -mfma -mf16c (CMakeLists.txt, object library k3_cpu_baseline): this file runs before
// the CPU is known to have them. Keep it to cpuid, plain data and C calls (see cpu_features.h); the test
// CpuBaseline.ObjectHasNoAvxInstructions disassembles it to make sure.
#include "k3/backend/cpu/cpu_features.h"

#include <cpuid.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

namespace k3::cpu {

namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) r = Regs{};
  return r;
}

bool bit(unsigned v, int i) { return (v >> i) & 1u; }

unsigned long long xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

void read_brand(char (&out)[49]) {
  if (cpuid(0x80000000u, 0).a < 0x80000004u) return;
  unsigned words[12];
  for (unsigned i = 0; i < 3; ++i) {
    const Regs r = cpuid(0x80000002u + i, 0);
    words[4 * i] = r.a, words[4 * i + 1] = r.b, words[4 * i + 2] = r.c, words[4 * i + 3] = r.d;
  }
  char raw[49] = {};
  std::memcpy(raw, words, 48);
  const char* s = raw;
  while (*s == ' ') ++s;  // Intel pads the brand string on the left
  std::size_t n = std::strlen(s);
  while (n > 0 && s[n - 1] == ' ') --n;
  std::memcpy(out, s, n);
  out[n] = '\0';
}

}  // namespace

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  read_brand(f.model_name);
  const unsigned max_leaf = cpuid(0, 0).a;
  const Regs l1 = max_leaf >= 1 ? cpuid(1, 0) : Regs{};
  const Regs l7 = max_leaf >= 7 ? cpuid(7, 0) : Regs{};
  const Regs l7s1 = max_leaf >= 7 && l7.a >= 1 ? cpuid(7, 1) : Regs{};
  // XCR0 says which register state the OS saves; without OSXSAVE there is no xgetbv and no AVX at all.
  const unsigned long long x = bit(l1.c, 27) ? xcr0() : 0;
  f.os_avx = (x & 0x6) == 0x6;                       // SSE + AVX state
  f.os_avx512 = f.os_avx && (x & 0xE0) == 0xE0;      // opmask, ZMM_Hi256, Hi16_ZMM
  f.os_amx = (x & 0x60000) == 0x60000;               // XTILECFG + XTILEDATA
  f.avx = f.os_avx && bit(l1.c, 28);
  f.fma = f.avx && bit(l1.c, 12);
  f.f16c = f.avx && bit(l1.c, 29);
  f.avx2 = f.avx && bit(l7.b, 5);
  f.avx_vnni = f.avx2 && bit(l7s1.a, 4);
  f.avx512f = f.os_avx512 && bit(l7.b, 16);
  f.avx512dq = f.avx512f && bit(l7.b, 17);
  f.avx512bw = f.avx512f && bit(l7.b, 30);
  f.avx512vl = f.avx512f && bit(l7.b, 31);
  f.avx512_vnni = f.avx512f && bit(l7.c, 11);
  f.avx512_vbmi = f.avx512f && bit(l7.c, 1);
  f.avx512_bf16 = f.avx512f && bit(l7s1.a, 5);
  f.amx_tile = f.os_amx && bit(l7.d, 24);
  f.amx_bf16 = f.amx_tile && bit(l7.d, 22);
  f.amx_int8 = f.amx_tile && bit(l7.d, 25);
  return f;
}

const char* missing_baseline(const CpuFeatures& f) {
  if (f.avx2 && f.fma && f.f16c) return nullptr;
  if (!f.os_avx)
    return "this CPU lacks AVX2/FMA/F16C (the OS has not enabled AVX state), which this build of k3 requires";
  return "this CPU lacks AVX2/FMA/F16C, which this build of k3 requires (it was built with -mavx2 -mfma -mf16c)";
}

void require_cpu_baseline() {
  const CpuFeatures f = detect_cpu_features();
  const char* msg = missing_baseline(f);
  if (!msg) return;
  const char* parts[] = {"k3: error: ", msg, "\n"};
  for (const char* p : parts)
    if (::write(2, p, std::strlen(p)) < 0) break;
  ::_exit(1);
}

int request_amx_permission() {
#if defined(__linux__) && defined(__x86_64__)
  constexpr int kArchReqXcompPerm = 0x1023;  // <asm/prctl.h>
  constexpr int kXfeatureXtiledata = 18;
  if (::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return 0;
  return errno;
#else
  return -1;
#endif
}

}  // namespace k3::cpu

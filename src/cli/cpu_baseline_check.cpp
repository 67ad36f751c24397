// The first thing the `k3` binary does: check that the CPU has the build's baseline (AVX2, FMA, F16C)
// before any code compiled for it runs. A constructor with a priority runs before the default-priority
// static initialisers of libk3 (which may hold AVX2 instructions), so a CPU without AVX2 gets
// "k3: error: this CPU lacks AVX2/FMA/F16C ..." and status 1 instead of SIGILL. The k3bin sources are built
// without the AVX2 flags (CMakeLists.txt), and require_cpu_baseline's TU too (cpu_features.cpp).
#include "k3/backend/cpu/cpu_features.h"

__attribute__((constructor(101))) static void k3_require_cpu_baseline() { k3::cpu::require_cpu_baseline(); }

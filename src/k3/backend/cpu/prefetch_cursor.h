// A software-prefetch cursor over one stream of weights, for the one-token rows of the int8 tiers
// (weight_kernels_quant_vnni.cpp's K-quant rows, weight_kernels_avx512bf16.cpp's MXFP4 rows): every 64-byte line
// of [next, end) is requested exactly once, into the cache level kHint (0: L1, 1: L2, 2: L3). From DRAM one core's
// hardware prefetcher kept too few lines in flight for these streams (docs/perf/cpu.md sessions 25, 29, 30).
// Addresses are integers: a cursor may run past the matrix, where a prefetch only costs the request. prefetch_lines:
// one range at once, for the several-token tiles (the next row block, session 34).
// Included inside the tiers' target regions; internal linkage, so each tier's copy is its own.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>  // a no-op here: the including files have it before their target regions

namespace k3::cpu {
namespace {

template <int kHint>
struct PrefetchCursor {
  uintptr_t next;  // the first line not yet requested
  __attribute__((always_inline)) void upto(uintptr_t end) {
    for (; next < end; next += 64)
      _mm_prefetch(reinterpret_cast<const char*>(next), kHint == 1 ? _MM_HINT_T1 : kHint == 2 ? _MM_HINT_T2 : _MM_HINT_T0);
  }
};

// Every line of [p, p + bytes) requested (kHint: 0 = L1, 1 = L2, 2 = L3); prefetches never fault.
template <int kHint>
__attribute__((always_inline)) inline void prefetch_lines(const uint8_t* p, int64_t bytes) {
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes);
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; a < end; a += 64)
    _mm_prefetch(reinterpret_cast<const char*>(a), kHint == 1 ? _MM_HINT_T1 : kHint == 2 ? _MM_HINT_T2 : _MM_HINT_T0);
}

// K3_TILE_PREFETCH=0: the several-token tiles do not request the next row block (the A/B of session 34).
inline const bool g_tile_prefetch = [] {
  const char* e = std::getenv("K3_TILE_PREFETCH");
  return e == nullptr || e[0] != '0';
}();

}  // namespace
}  // namespace k3::cpu

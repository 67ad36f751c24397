// A software-prefetch cursor over one stream of weights, for the one-token rows of the int8 tiers
// (weight_kernels_quant_vnni.cpp's K-quant rows, weight_kernels_avx512bf16.cpp's MXFP4 rows): every 64-byte line
// of [next, end) is requested exactly once, into the cache level kHint (0: L1, 1: L2, 2: L3). From DRAM one core's
// hardware prefetcher kept too few lines in flight for these streams (docs/perf/cpu.md sessions 25, 29, 30).
// Addresses are integers: a cursor may run past the matrix, where a prefetch only costs the request.
// Included inside the tiers' target regions; internal linkage, so each tier's copy is its own.
#pragma once
#include <immintrin.h>

#include <cstdint>

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

}  // namespace
}  // namespace k3::cpu

// Shared-memory mbarriers (PTX ISA "mbarrier") for the warp-specialised Hopper kernels in this folder: a producer
// signals a stage full, its consumers signal it empty, each side waiting on the other's phase parity. Used by the
// MLA decode kernel (mla_decode_wgmma.cu); session 63's warp-specialised ring body used them too (measured slower in
// s63-1 and removed: docs/perf/cuda.md "Session 63").
#pragma once
#include <cstdint>

namespace k3::cuda::mbar {

// `count` arrivals complete a phase; the barrier starts in phase 0 (parity 0 not yet complete).
__device__ __forceinline__ void init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival (release: this thread's earlier shared-memory accesses are ordered before the phase completes).
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Spins until the phase of this parity has completed (acquire).
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

}  // namespace k3::cuda::mbar

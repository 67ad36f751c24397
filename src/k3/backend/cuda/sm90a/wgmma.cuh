// wgmma (sm_90a) building blocks for the Hopper kernels in this folder: bf16 operands, fp32 accumulators; the MMA
// instructions are CuTe's atoms (CUTLASS is a dependency already), which replaced our generated copies of their long
// operand lists (session 62; the PTX is the same but for spacing). A warpgroup (4
// consecutive warps, the first one's index a multiple of 4) issues each instruction together; the
// accumulator layout per warp is mma.sync m16n8k16's for rows 16 w .. 16 w + 15 (PTX ISA, "wgmma
// register fragments"). Shared-memory operands are described by make_desc (128-byte swizzle).
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/arch/mma_sm90_gmma_ext.hpp>

namespace k3::cuda::wgmma {

// Matrix descriptor (PTX ISA "matrix descriptor format"): start address, leading / stride byte offsets
// (16-byte units), swizzle mode 1 = 128B. Swizzled atoms must start 1024-byte aligned.
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr & 0x3ffffu) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3fffu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3fffu) << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int pending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across the asynchronous region.
template <int n>
__device__ __forceinline__ void fence_regs(float (&d)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Generic-proxy shared-memory writes (st.shared, cp.async) made visible to the async proxy (wgmma).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The MMAs: CuTe's wgmma atoms (bf16 x bf16 -> fp32, A K-major), their operands spread from our register arrays.
// Widths by N: shared-memory A (ss) 16, 32, 48, 64, 256; register A (rs) 16 .. 128 in steps of 16, 256.
namespace gmma = cute::SM90::GMMA;
template <int N, gmma::Major MB> struct Atoms;
#define K3_WGMMA_ATOMS(N)                                                               \
  template <gmma::Major MB> struct Atoms<N, MB> {                                       \
    using ss = gmma::MMA_64x##N##x16_F32BF16BF16_SS<gmma::Major::K, MB>;                \
    using rs = gmma::MMA_64x##N##x16_F32BF16BF16_RS<gmma::Major::K, MB>;                \
  };
K3_WGMMA_ATOMS(16)
K3_WGMMA_ATOMS(32)
K3_WGMMA_ATOMS(48)
K3_WGMMA_ATOMS(64)
K3_WGMMA_ATOMS(80)
K3_WGMMA_ATOMS(96)
K3_WGMMA_ATOMS(112)
K3_WGMMA_ATOMS(128)
K3_WGMMA_ATOMS(256)
#undef K3_WGMMA_ATOMS

template <int N, gmma::Major MB, size_t... I>
__device__ __forceinline__ void ss_spread(float (&d)[N / 2], uint64_t da, uint64_t db, int accumulate, std::index_sequence<I...>) {
  Atoms<N, MB>::ss::fma(da, db, d[I]..., accumulate ? gmma::ScaleOut::One : gmma::ScaleOut::Zero);
}
template <int N, gmma::Major MB, size_t... I>
__device__ __forceinline__ void rs_spread(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, std::index_sequence<I...>) {
  Atoms<N, MB>::rs::fma(a[0], a[1], a[2], a[3], db, d[I]...);
}

// D[64 x N] (+)= A[64 x 16] B[16 x N], A and B from shared memory (descriptors); B K-major, or N-major with
// MB = gmma::Major::MN. accumulate == 0 overwrites D.
template <int N, gmma::Major MB = gmma::Major::K>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  ss_spread<N, MB>(d, desc_a, desc_b, accumulate, std::make_index_sequence<N / 2>{});
}
// D[64 x N] += A[64 x 16] B[16 x N], A from registers (the m16n8k16 A layout per warp), B in shared memory.
template <int N, gmma::Major MB = gmma::Major::K>
__device__ __forceinline__ void mma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  rs_spread<N, MB>(d, a, desc_b, std::make_index_sequence<N / 2>{});
}

}  // namespace k3::cuda::wgmma

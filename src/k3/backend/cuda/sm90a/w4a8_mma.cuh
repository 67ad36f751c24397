// MXFP4 weights x MXFP8 activations on wgmma (sm_90a): the building blocks of the W4A8 decode kernels
// (moe_decode_w4a8.cu) and of their stand-alone prototype (scripts/perf/w4a8_bench.cu).
//
// One wgmma m64n8k32 e4m3 per 32-input group: A = 64 weight rows from registers, B = a tile's 8 tokens from shared
// memory, into the group's own accumulator (scale-d = 0); the weight and activation group scales are then applied in
// fp32 (4 FFMA a thread), so the scales leave the weights and the tensor core's reduced-precision sum spans only 32
// exact products (an E2M1 value times an E4M3 one has at most 4 significant bits).
//
// Lane (g, t) of warp w holds A rows 16 w + g and 16 w + g + 8 (PTX ISA's 8-bit A fragment, per warp of the
// warpgroup): register 0 / 2 = row g at k 4t..4t+3 / 16+4t..16+4t+3, 1 / 3 = the same for row g + 8. The lane reads
// word t of each group of its rows (8 nibbles: inputs 8t..8t+7 of the group, as stored); the even inputs go to k 4t+i,
// the odd ones to k 16+4t+i, and the activations are staged in that order: per group two 8 x 16-byte core matrices (no
// swizzle), token n's row of the first holding its even inputs, of the second its odd ones.
#pragma once
#include <cstdint>

namespace k3::cuda::w4a8 {

// K-major, no swizzle: start address, leading / stride byte offsets (16-byte units).
__device__ __forceinline__ uint64_t desc_noswizzle(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr & 0x3ffffu) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3fffu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3fffu) << 32);
}
// The B descriptor of a group staged at `smem_addr`: its two core matrices 128 bytes apart (given as both offsets,
// whichever the hardware takes for the K direction; N = 8 has one core matrix across).
__device__ __forceinline__ uint64_t group_desc(uint32_t smem_addr) { return desc_noswizzle(smem_addr, 128, 128); }

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// D[64 x 8] = A[64 x 32] B[32 x 8], scale-d = 0: the group's product alone. A e4m3 from registers, B e4m3 K-major.
__device__ __forceinline__ void mma_group(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0));
}

// One stored word (E2M1 nibbles 0..7, low nibble first) -> e4m3 bytes of nibbles 0,2,4,6 (lo) and 1,3,5,7 (hi), each
// value times 2^-6 (exact: sign to bit 7, e1 e0 m to bits 4..2; E2M1's subnormal 0.5 lands on E4M3's 2^-7).
__device__ __forceinline__ void e2m1x8_to_e4m3(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);
  hi = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
}

__device__ __forceinline__ uint32_t word_of(const uint4& q, int k) {
  return k == 0 ? q.x : k == 1 ? q.y : k == 2 ? q.z : q.w;
}

// A chunk (4 groups) of a lane's two rows as A fragments: fr[q] for group q (words q of `r0` and `r1`).
__device__ __forceinline__ void dequant_chunk(const uint4& r0, const uint4& r1, uint32_t (&fr)[4][4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t l0, h0, l1, h1;
    e2m1x8_to_e4m3(word_of(r0, q), l0, h0);
    e2m1x8_to_e4m3(word_of(r1, q), l1, h1);
    fr[q][0] = l0;
    fr[q][1] = l1;
    fr[q][2] = h0;
    fr[q][3] = h1;
  }
}

// Loads ordered against the asm barriers (volatile): a ring's next chunk goes out after this chunk's registers are
// consumed, into the same registers (a hoisted load needs fresh ones and a copy back at the loop's end: 25 moves a
// chunk in the prototype's first form).
__device__ __forceinline__ uint32_t ld_nc_u32(const uint32_t* p) {
  uint32_t r;
  asm volatile("ld.global.nc.u32 %0, [%1];\n" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ uint4 ld_nc_v4(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
// A lane's 4 words (word q: part t of group q) of chunk c of a row as stored: 4 loads of 4 bytes, the row's 4 lanes side
// by side in each (no load-time repack: every other MXFP4 kernel keeps reading the same bytes).
__device__ __forceinline__ uint4 load_chunk_words(const uint8_t* row, int c, int t) {
  const uint32_t* p = reinterpret_cast<const uint32_t*>(row) + c * 16 + t;
  uint4 r;
  r.x = ld_nc_u32(p);
  r.y = ld_nc_u32(p + 4);
  r.z = ld_nc_u32(p + 8);
  r.w = ld_nc_u32(p + 12);
  return r;
}

// Every A register final before the fence: else ptxas interleaves the dequantisation with the wgmmas and injects a
// warpgroup.arrive before each one.
__device__ __forceinline__ void settle(const uint32_t (&fr)[4][4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q)
    asm volatile("" ::"r"(fr[q][0]), "r"(fr[q][1]), "r"(fr[q][2]), "r"(fr[q][3]) : "memory");
}

// The activation's exponent term staged per (group, token): with the weight's E8M0 byte ws, ws << 23 + this is the
// float bits of 2^(ws-127) 2^(xs-127) 2^6 (the 2^6 undoes the e4m3 placement) -- one IMAD a product instead of two
// decodes and a multiply. Valid while ws + xs - 121 stays in [1, 254]: blocks with xs < 32 (amax < 2^-87) are staged as
// zeros with xs = 127 (kFlushBelow), and real weight scales are far above 2^-37.
constexpr uint32_t kFlushBelow = 32;
__device__ __forceinline__ uint32_t act_exp_term(uint32_t xs) { return (xs - 121u) << 23; }

// One chunk's 4 groups: the wgmmas (fr must be settled), then each group's product scaled into acc. SA / SB: the two
// rows' 4 scale bytes; sx: the chunk's first group's exponent terms [group][8 tokens].
// The 4 groups' products of a chunk (fr settled), each in its own accumulator d[q], complete on return.
__device__ __forceinline__ void group_products(const uint32_t (&fr)[4][4], uint64_t desc, float (&d)[4][4]) {
  fence();
#pragma unroll
  for (int q = 0; q < 4; ++q) mma_group(d[q], fr[q], desc + static_cast<uint64_t>(q * 16));  // +256 bytes a group
  commit();
  wait_all();
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[q][i])::"memory");
}

__device__ __forceinline__ void chunk_products(const uint32_t (&fr)[4][4], uint32_t SA, uint32_t SB, uint64_t desc,
                                               const uint32_t* sx, int t, float (&acc)[4]) {
  float d[4][4];
  group_products(fr, desc, d);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t s0 = __byte_perm(SA, 0, 0x4440 | q), s1 = __byte_perm(SB, 0, 0x4440 | q);
    const uint2 xv = *reinterpret_cast<const uint2*>(sx + q * 8 + 2 * t);
    acc[0] = fmaf(d[q][0], __uint_as_float(s0 * (1u << 23) + xv.x), acc[0]);
    acc[1] = fmaf(d[q][1], __uint_as_float(s0 * (1u << 23) + xv.y), acc[1]);
    acc[2] = fmaf(d[q][2], __uint_as_float(s1 * (1u << 23) + xv.x), acc[2]);
    acc[3] = fmaf(d[q][3], __uint_as_float(s1 * (1u << 23) + xv.y), acc[3]);
  }
}

}  // namespace k3::cuda::w4a8

// The staged form of the dense tensor-core block GEMV (quant_gemv_mma.cu; decoders and numerics in quant_mma.cuh):
// KSplit's work split with the weights copied into shared memory by coalesced cp.async first. Included by
// quant_gemv_mma.cu only.
//
// Why (call s31-1, ncu of the one-token KSplit kernel): each lane loads its own 4-8 bytes of 8 different rows, so a
// warp's load touches 8 cache lines for 128 useful bytes. On the 163840 x 2304 Q6_K head that was 9.9 M requests for
// 73 M sectors (7.4 per request), the L1 at 64% of its throughput and DRAM at 31%: 207 us for 310 MB. Small matrices
// had the opposite problem: 2304 x 4096 Q4_K ran 144 blocks with two units in flight per warp (13.5% occupancy, 82% of
// cycles with no eligible warp) and read 0.4 TB/s. Here the block's 16 rows stream through a ring of kStages
// shared-memory stages (kSb super-blocks of all 16 rows each, every 16-byte granule one cp.async, consecutive
// threads on consecutive granules), kStages - 1 stages in flight while one is multiplied.
// Measured (call s31-4, docs/perf/cuda.md session 31): it did not pay -- the head 208 -> 222 us, Q4_K / Q5_K slower,
// only 4096 x 7168 Q6_K faster, ~1% end to end -- so the sectors per request were not the bound; the rule
// (quant_gemv_mma.cu default_form) does not take it, K3_QUANT_MMA_FORM=staged does.
//
// The same bits as KSplit with one m16 tile: warp w multiplies units w, w + 8, w + 16, ... in that order (a stage's
// units are consecutive), the decoders are the same code over the staged bytes, and the warps meet in the same
// fixed tree.
#pragma once
#include "k3/backend/cuda/quant_mma.cuh"

namespace k3::cuda::qmma {
namespace {

// The shared-memory layout of one stage of format P: 16 rows of kSb blocks each, a row's bytes starting at the
// 16-byte granule that holds its first byte (Q6_K's 210-byte blocks are 2-aligned: one more granule), rows kRow apart
// with kRow chosen so that the 8 rows a warp's loads touch fall in different banks (Q4_K / Q5_K: 64-bit loads of 8 rows
// x 32 bytes, rows 8 words apart modulo 32; Q6_K: 32-bit loads of 8 rows x 16 bytes, 4 words apart).
template <class P>
struct WStage {
  static constexpr int kSb = 4;
  static constexpr int kData = (kSb * P::kBlockBytes + (P::kBlockBytes % 16 ? 14 : 0) + 15) / 16 * 16;  // whole granules
  static constexpr int kMod = P::kBlockBytes % 16 ? 16 : 32;
  static constexpr int kRow = kData + ((kMod - kData % 128) % 128 + 128) % 128;
  static constexpr int kBytes = 16 * kRow;
  static constexpr int kGranules = kData / 16;  // per row
  static_assert(kRow % 128 == kMod && kRow >= kData, "row stride");
};
constexpr int kStages = 4;

// The block copies super-blocks [sb0, sb1) of its 16 rows (rows past the end repeat the last) into the stage at sbase.
// A granule is never wholly outside the matrix [lo, hi) (segments lie inside it); one that the matrix starts or ends
// inside (Q6_K at 2 mod 16) is copied by 2-byte loads, zeros outside the matrix (bytes never decoded) -- not by
// cp.async with a source size, which compute-sanitizer counts as a 16-byte read (call s31-4).
template <class P>
__device__ void fill_stage(uint32_t sbase, const Job& j, int64_t r0, int64_t sb0, int64_t sb1) {
  using S = WStage<P>;
  const uint8_t* lo = j.w0;
  const uint8_t* hi = j.w0 + j.rows * j.row_bytes;
  const int64_t nbytes = (sb1 - sb0) * P::kBlockBytes;
  for (int i = threadIdx.x; i < 16 * S::kGranules; i += kWarps * 32) {
    const int r = i / S::kGranules, k = i % S::kGranules;
    const uint8_t* seg = j.w0 + min(r0 + r, j.rows - 1) * j.row_bytes + sb0 * P::kBlockBytes;
    const uint8_t* g = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(seg) & ~uintptr_t{15}) + 16 * k;
    if (g >= seg + nbytes) continue;  // past the segment (a short last stage)
    const uint32_t dst = sbase + r * S::kRow + 16 * k;
    if (g >= lo && g + 16 <= hi) {
      cp16(dst, g);
    } else {
      for (int b = 0; b < 16; b += 2) {
        const uint8_t* p = g + b;
        const unsigned short v = p >= lo && p < hi ? __ldg(reinterpret_cast<const unsigned short*>(p)) : 0;
        asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(dst + b), "h"(v) : "memory");
      }
    }
  }
}

template <class P, int NT, bool SPLIT>
__global__ void __launch_bounds__(kWarps * 32) quant_mma_staged_kernel(const Job j) {
  using S = WStage<P>;
  constexpr int R = NT * 4;
  constexpr int kUnitsPerSb = 256 / P::kUnitCols;
  extern __shared__ __align__(16) uint8_t wstage_mem[];
  __shared__ float red[kWarps / 2][R][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 16;
  const uint32_t sbase = smem_addr(wstage_mem);
  // The lane's two rows: their stage offsets and the low bits of their global addresses (a staged row's bytes begin
  // at its first byte's place in a 16-byte granule: Q6_K's kSb blocks are 840 bytes, so that place moves per stage).
  uint32_t row_off[2], row_lo[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_off[h] = (8 * h + g) * S::kRow;
    row_lo[h] = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(j.w0 + min(r0 + 8 * h + g, j.rows - 1) * j.row_bytes) & 15);
  }
  Xv<NT, SPLIT, false> xv;
  xv.init(j.a, j.ldx, nullptr, 1, 0, j.a.n, g, tq);
  float acc[1][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[0][nt][0] = acc[0][nt][1] = acc[0][nt][2] = acc[0][nt][3] = 0.f;
  const int64_t nsb = j.a.cols / 256, nst = (nsb + S::kSb - 1) / S::kSb;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nst) fill_stage<P>(sbase + s * S::kBytes, j, r0, s * S::kSb, min(nsb, (s + 1) * int64_t{S::kSb}));
    cp_commit();
  }
  for (int64_t st = 0; st < nst; ++st) {
    cp_wait<kStages - 2>();
    __syncthreads();  // stage st is in; every warp is done with stage st - 1, whose slot is refilled next
    const int64_t nx = st + kStages - 1;
    if (nx < nst) fill_stage<P>(sbase + (nx % kStages) * S::kBytes, j, r0, nx * S::kSb, min(nsb, (nx + 1) * int64_t{S::kSb}));
    cp_commit();
    const uint32_t slot = sbase + static_cast<uint32_t>(st % kStages) * S::kBytes;
    const int units = static_cast<int>(min(nsb - st * S::kSb, int64_t{S::kSb})) * kUnitsPerSb;
    for (int ul = warp; ul < units; ul += kWarps) {
      typename P::Raw r[1][2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        r[0][h] = P::load_s(slot + row_off[h] + ((row_lo[h] + static_cast<uint32_t>(st * S::kSb * P::kBlockBytes)) & 15), ul, tq);
      P::template apply<NT, 1, SPLIT>(r, st * S::kSb * kUnitsPerSb + ul, xv, tq, acc);
    }
  }
  reduce_warps<R>(&acc[0][0][0], red, warp, lane);  // the KSplit kernel's fixed tree
  if (warp != 0) return;
  store_tile<NT>(acc[0], j.y, j.rows, j.a.n, r0, g, tq);
}

template <class P, int NT, bool SPLIT>
cudaError_t launch_staged(const Job& j, cudaStream_t s) {
  constexpr int kSmem = kStages * WStage<P>::kBytes;
  static_assert(kSmem <= 200 * 1024, "the stages fit in shared memory");
  if constexpr (kSmem > 48 * 1024)
    if (const cudaError_t e = opt_in_smem<quant_mma_staged_kernel<P, NT, SPLIT>>(kSmem); e != cudaSuccess) return e;
  const int64_t blocks = (j.rows + 15) / 16;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  quant_mma_staged_kernel<P, NT, SPLIT><<<static_cast<unsigned>(blocks), kWarps * 32, kSmem, s>>>(j);
  return cudaGetLastError();
}

}  // namespace
}  // namespace k3::cuda::qmma

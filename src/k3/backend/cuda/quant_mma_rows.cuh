// The row-split form of the dense tensor-core block GEMV (quant_gemv_mma.cu; the decoders and numerics are
// quant_mma.cuh's). Included by quant_gemv_mma.cu only.
//
// Why a second form: quant_mma_kernel puts a block's 8 warps on the SAME 16 rows and splits k between them, so
// every warp loads its own activations: per unit of weights (16 rows x 64 columns of Q4_K, 768 bytes) a warp reads
// NT x 512 bytes of x hi + lo from L1 / L2 -- at 64 tokens ~21x the weight bytes, and the 163840 x 2304 head took
// 1.68 ms for 310 MB (184 GB/s; CudaQuantMma.TimingAtK3Width, call s30-1). Here the 8 warps own 8 DIFFERENT m16
// tiles (128 rows) and walk the same units in step: each unit's activations (hi, lo and the 32-column sums of all
// the block's tokens) are staged once in shared memory by cp.async, double-buffered, and read by all 8 warps --
// 1/8 of the activation traffic. Each warp's weights stream from global into registers one unit ahead, as before.
//
// k is split over gridDim.y slices when there are too few 128-row blocks to fill the GPU: slice s sums units
// [s per, (s + 1) per) of its rows into partials[s][token][row], and rows_reduce_kernel adds the slices in order
// (fixed order: the result does not depend on timing). One slice writes y directly.
#pragma once
#include "k3/backend/cuda/quant_mma.cuh"

namespace k3::cuda::qmma {
namespace {

constexpr int kRowsPerBlock = 16 * kWarps;

// One staged unit: the activations of its U columns for the block's 8 NT token rows (hi, then lo), each row padded
// by 8 bf16 (16 bytes) so that the 8 rows a warp's B load touches fall in different banks, then the unit's U / 32
// sums for the 8 NT tokens.
template <int U, int NT, bool SPLIT>
struct Stage {
  static constexpr int kRow = U + 8;                   // bf16 per staged token row
  static constexpr int kTok = 8 * NT;
  static constexpr int kHalf = kTok * kRow;            // bf16 per half
  static constexpr int kSumsOff = (SPLIT ? 2 : 1) * kHalf * 2;  // bytes
  static constexpr int kBytes = kSumsOff + (U / 32) * kTok * 4;
  // The whole block copies unit u (columns u U ..) into the stage at s.
  __device__ static void fill(uint8_t* s, const QuantMmaActs& a, int64_t ldx, int64_t u) {
    constexpr int kChunks = U / 8;  // 16-byte chunks per token row and half
    constexpr int kCopies = (SPLIT ? 2 : 1) * kTok * kChunks;
    for (int i = threadIdx.x; i < kCopies; i += kWarps * 32) {
      const int half = i / (kTok * kChunks), r = (i / kChunks) % kTok, c = i % kChunks;
      const uint16_t* src = (half ? a.lo : a.hi) + static_cast<int64_t>(min(r, a.n - 1)) * a.cols + u * U + 8 * c;
      cp16(s + 2 * (half * kHalf + r * kRow + 8 * c), src);
    }
    constexpr int kSumCopies = (U / 32) * kTok / 4;
    for (int i = threadIdx.x; i < kSumCopies; i += kWarps * 32) {
      const int sb = i / (kTok / 4), c = i % (kTok / 4);  // ldx >= 8 NT, a multiple of 8: rows 32-byte aligned
      cp16(s + kSumsOff + 4 * (sb * kTok + 4 * c), a.xsum + (u * (U / 32) + sb) * ldx + 4 * c);
    }
  }
};

// The decoders' view of x (the Xv interface of quant_mma.cuh) over a staged unit.
template <int U, int NT, bool SPLIT>
struct XvStaged {
  using S = Stage<U, NT, SPLIT>;
  const uint8_t* s = nullptr;
  int64_t col0 = 0;  // the unit's first column
  int g = 0, tq = 0;
  template <class T>
  __device__ T hi_at(int nt, int64_t col) const {
    return *reinterpret_cast<const T*>(s + 2 * ((8 * nt + g) * S::kRow + (col - col0)));
  }
  template <class T>
  __device__ T lo_at(int nt, int64_t col) const {
    return *reinterpret_cast<const T*>(s + 2 * (S::kHalf + (8 * nt + g) * S::kRow + (col - col0)));
  }
  __device__ float2 sums(int64_t sb, int nt) const {
    return *reinterpret_cast<const float2*>(s + S::kSumsOff + 4 * ((sb - col0 / 32) * S::kTok + 8 * nt + 2 * tq));
  }
};

// Grid: (row blocks of 128, k slices). Dynamic shared memory: two stages.
template <class P, int NT, bool SPLIT>
__global__ void __launch_bounds__(kWarps * 32) quant_mma_rows_kernel(const Job j, int64_t per, float* partials) {
  constexpr int U = P::kUnitCols;
  using S = Stage<U, NT, SPLIT>;
  extern __shared__ __align__(16) uint8_t stage_mem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + 16 * warp;
  const uint8_t* rp[1][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) rp[0][h] = j.w0 + min(r0 + 8 * h + g, j.rows - 1) * j.row_bytes;
  const int64_t units = j.a.cols / U, u0 = blockIdx.y * per, u1 = min(units, u0 + per);
  float acc[1][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[0][nt][0] = acc[0][nt][1] = acc[0][nt][2] = acc[0][nt][3] = 0.f;
  XvStaged<U, NT, SPLIT> xv;
  xv.g = g, xv.tq = tq;
  typename P::Raw ra[1][2], rb[1][2];
  if (u0 < u1)  // the first unit's weights before the wait (pdl.cuh), its activations after
#pragma unroll
    for (int h = 0; h < 2; ++h) ra[0][h] = P::load(rp[0][h], u0, tq);
  pdl::begin();
  if (u0 < u1) {
    S::fill(stage_mem, j.a, j.ldx, u0);
    cp_commit();
  }
  // Units in pairs: stage 0 / ra hold unit u, stage 1 / rb unit u + 1. Each unit's stage and weights are requested
  // before the previous unit is multiplied; the barrier after a multiply frees its stage for the unit after next.
  for (int64_t u = u0; u < u1; u += 2) {
    const bool more = u + 1 < u1;
    if (more) {
      S::fill(stage_mem + S::kBytes, j.a, j.ldx, u + 1);
#pragma unroll
      for (int h = 0; h < 2; ++h) rb[0][h] = P::load(rp[0][h], u + 1, tq);
    }
    cp_commit();
    cp_wait<1>();
    __syncthreads();
    xv.s = stage_mem, xv.col0 = u * U;
    P::template apply<NT, 1, SPLIT>(ra, u, xv, tq, acc);
    __syncthreads();
    if (!more) break;
    const bool more2 = u + 2 < u1;
    if (more2) {
      S::fill(stage_mem, j.a, j.ldx, u + 2);
#pragma unroll
      for (int h = 0; h < 2; ++h) ra[0][h] = P::load(rp[0][h], u + 2, tq);
    }
    cp_commit();
    cp_wait<1>();
    __syncthreads();
    xv.s = stage_mem + S::kBytes, xv.col0 = (u + 1) * U;
    P::template apply<NT, 1, SPLIT>(rb, u + 1, xv, tq, acc);
    __syncthreads();
  }
  float* out = gridDim.y > 1 ? partials + static_cast<int64_t>(blockIdx.y) * j.a.n * j.rows : j.y;
  store_tile<NT>(acc[0], out, j.rows, j.a.n, r0, g, tq);
}

// y[i] = partials[0][i] + partials[1][i] + ... in slice order.
__global__ void rows_reduce_kernel(const float* __restrict__ partials, int slices, int64_t count, float* __restrict__ y) {
  pdl::begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  float s = partials[i];
  for (int k = 1; k < slices; ++k) s += partials[k * count + i];
  y[i] = s;
}

template <class P, int NT, bool SPLIT>
cudaError_t launch_rows(const Job& j, int slices, float* partials, cudaStream_t s) {
  using S = Stage<P::kUnitCols, NT, SPLIT>;
  constexpr int kSmem = 2 * S::kBytes;
  static_assert(kSmem <= 227 * 1024, "two stages fit in shared memory");
  if constexpr (kSmem > 48 * 1024)
    if (const cudaError_t e = opt_in_smem<quant_mma_rows_kernel<P, NT, SPLIT>>(kSmem); e != cudaSuccess) return e;
  const int64_t blocks = (j.rows + kRowsPerBlock - 1) / kRowsPerBlock, units = j.a.cols / P::kUnitCols;
  if (blocks > 0x7fffffff || slices < 1 || slices > 65535 || units < 1) return cudaErrorInvalidValue;
  const int64_t per = (units + slices - 1) / slices;
  slices = static_cast<int>((units + per - 1) / per);  // every slice holds a unit
  const cudaError_t e = pdl::launch(quant_mma_rows_kernel<P, NT, SPLIT>, dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(slices)),
                                    kWarps * 32, kSmem, s, j, per, partials);
  if (slices == 1 || e != cudaSuccess) return e;
  const int64_t count = static_cast<int64_t>(j.a.n) * j.rows;
  return pdl::launch(rows_reduce_kernel, static_cast<unsigned>((count + 255) / 256), 256, 0, s, partials, slices, count, j.y);
}

}  // namespace
}  // namespace k3::cuda::qmma

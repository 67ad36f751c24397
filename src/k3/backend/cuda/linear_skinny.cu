// Tensor-core skinny GEMM for decode batches (linear_skinny.h).
//
// mma.sync m16n8k16 bf16 -> fp32 with the weights as A (16 output rows) and the batch's tokens as B (8 per
// n8 tile, up to 4 tiles), x split into bf16 hi + lo (two MMAs into one accumulator: ~fp32 accuracy).
// No weight repack: lane (g, tq) loads 16 bytes (8 consecutive columns) of rows g and g + 8 of a 32-column
// chunk straight into A fragments, using the freedom to permute k (applied to A and B alike): k-slots
// {2tq, 2tq+1} / {2tq+8, 2tq+9} of step s are stored columns 8tq + 4s + {0,1} / {2,3}. So the B fragment
// of step s is the 8 bytes x[token][8tq + 4s .. +3]: one 16-byte load of the natural-order activation row
// serves both steps (the same mapping as moe_decode.cu's bf16 experts).
//
// Block: 8 warps on the same 16 * MT rows, each over every 8th chunk of K (the weight rows are read as
// 512 contiguous bytes per row by the 8 warps together); U chunks' weights are loaded before any is used,
// so each lane has U * MT * 2 16-byte loads in flight. The 8 warps' partial sums meet in shared memory and
// are added in warp order: the result does not depend on timing (graph replay == eager, bit for bit).
// x (<= 32 x cols bf16 pairs, L2-resident) is read through L1 by every warp; weights bypass L1.
//
// x comes either pre-split (linear_skinny: hi / lo from to_bf16_split) or as the fp32 activations
// (linear_skinny_f32), split here into the same hi / lo bits as to_bf16_split makes: one launch per
// projection instead of two, and the same 4 bytes per value read (fp32 instead of two bf16). At decode
// batches of 2..32 a step runs ~46 projections, so the split launches were ~46 small kernels per step.
#include "k3/backend/cuda/linear_skinny.h"

#include <cuda_bf16.h>

#include "k3/backend/cuda/mma_bf16.cuh"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;  // chunks per warp whose weights are in flight together

// The matrices one launch multiplies by the same x (a group, or one matrix): blocks [first_block[m],
// first_block[m + 1]) compute matrix m's rows. Passed by value (kernel parameters: a CUDA graph keeps them).
struct SkinnyGroup {
  const uint16_t* W[kLinearGroupMax];
  float* y[kLinearGroupMax];
  int rows[kLinearGroupMax];
  int first_block[kLinearGroupMax];
  int count;
};

using mma_bf16::load_stream;
using mma_bf16::mma_chunk;

// B-fragment sources: the 8 x values at columns 32c + 8tq .. +7 of one token, as bf16 hi and lo halves.
struct SplitX {  // x pre-split by to_bf16_split: [n][cols] hi, [n][cols] lo
  const uint4* p[2];
  __device__ void init(const void* xa, const void* xb, int64_t tok, int cols, int tq) {
    p[0] = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(xa) + tok * cols) + tq;
    p[1] = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(xb) + tok * cols) + tq;
  }
  __device__ void load(int c, uint4& bh, uint4& bl) const {
    bh = __ldg(p[0] + 4 * c);
    bl = __ldg(p[1] + 4 * c);
  }
};

__device__ __forceinline__ uint32_t bf16_bits(__nv_bfloat16 v) { return *reinterpret_cast<const unsigned short*>(&v); }

// Two values into (hi, lo) bf16 pairs, the element at the lower column in the low half (memory order);
// hi = rn(v), lo = rn(v - hi): to_bf16_split_kernel's arithmetic, so the MMAs see the same bits.
__device__ __forceinline__ void split2(float v0, float v1, uint32_t& h, uint32_t& l) {
  const __nv_bfloat16 h0 = __float2bfloat16_rn(v0), h1 = __float2bfloat16_rn(v1);
  const __nv_bfloat16 l0 = __float2bfloat16_rn(v0 - __bfloat162float(h0));
  const __nv_bfloat16 l1 = __float2bfloat16_rn(v1 - __bfloat162float(h1));
  h = bf16_bits(h0) | (bf16_bits(h1) << 16);
  l = bf16_bits(l0) | (bf16_bits(l1) << 16);
}

struct F32X {  // fp32 x [n][cols] (16-byte aligned), split here
  const float4* p;
  __device__ void init(const void* xa, const void*, int64_t tok, int cols, int tq) {
    p = reinterpret_cast<const float4*>(static_cast<const float*>(xa) + tok * cols) + 2 * tq;
  }
  __device__ void load(int c, uint4& bh, uint4& bl) const {
    const float4 a = __ldg(p + 8 * c), b = __ldg(p + 8 * c + 1);
    split2(a.x, a.y, bh.x, bl.x);
    split2(a.z, a.w, bh.y, bl.y);
    split2(b.x, b.y, bh.z, bl.z);
    split2(b.z, b.w, bh.w, bl.w);
  }
};

template <int MT, int NT, class XSrc>
__global__ void __launch_bounds__(kWarps * 32) skinny_kernel(const SkinnyGroup grp, int cols,
                                                             const void* __restrict__ xa,
                                                             const void* __restrict__ xb, int n) {
  pdl::launch_dependents();
  __shared__ float red[kWarps][MT * NT * 4][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  // This block's matrix of the group (block-uniform) and its first row there.
  int m = 0;
  while (m + 1 < grp.count && static_cast<int>(blockIdx.x) >= grp.first_block[m + 1]) ++m;
  const uint16_t* __restrict__ W = grp.W[m];
  float* __restrict__ y = grp.y[m];
  const int rows = grp.rows[m];
  const int row0 = (static_cast<int>(blockIdx.x) - grp.first_block[m]) * 16 * MT;
  const int chunks = cols / 32;
  // Rows past the end and tokens past n are clamped to valid ones: their loads are harmless and their
  // results (separate accumulator rows / columns) are never stored.
  const uint4* wp[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = min(row0 + 16 * i + g + 8 * h, rows - 1);
      wp[i][h] = reinterpret_cast<const uint4*>(W + static_cast<int64_t>(r) * cols) + tq;
    }
  XSrc xs[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) xs[t].init(xa, xb, min(8 * t + g, n - 1), cols, tq);
  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][t][j] = 0.f;

  for (int c0 = warp; c0 < chunks; c0 += kWarps * kUnroll) {
    uint4 wv[kUnroll][MT][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * kWarps;
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) wv[u][i][h] = c < chunks ? load_stream(wp[i][h] + 4 * c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * kWarps;
      if (c >= chunks) break;  // warp-uniform
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        uint4 bh, bl;
        xs[t].load(c, bh, bl);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          mma_chunk(acc[i][t], wv[u][i][0], wv[u][i][1], bh);
          mma_chunk(acc[i][t], wv[u][i][0], wv[u][i][1], bl);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int j = 0; j < 4; ++j) red[warp][(i * NT + t) * 4 + j][lane] = acc[i][t][j];
  __syncthreads();
  // Sum the warps' partials in warp order; accumulator j of lane (g, tq) in tile (i, t) is row
  // 16 i + g + 8 (j >> 1), token 8 t + 2 tq + (j & 1).
  for (int idx = threadIdx.x; idx < MT * NT * 4 * 32; idx += kWarps * 32) {
    const int l = idx & 31, f = idx >> 5, j = f & 3, t = (f >> 2) % NT, i = (f >> 2) / NT;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[w][f][l];
    const int row = row0 + 16 * i + (l >> 2) + 8 * (j >> 1), tok = 8 * t + 2 * (l & 3) + (j & 1);
    if (row < rows && tok < n) y[static_cast<int64_t>(tok) * rows + row] = s;
  }
}

template <int MT, class XSrc>
cudaError_t launch(SkinnyGroup grp, int cols, const void* xa, const void* xb, int n, cudaStream_t s) {
  unsigned grid = 0;
  for (int m = 0; m < grp.count; ++m) {
    grp.first_block[m] = static_cast<int>(grid);
    grid += static_cast<unsigned>((grp.rows[m] + 16 * MT - 1) / (16 * MT));
  }
  switch ((n + 7) / 8) {
    case 1: skinny_kernel<MT, 1, XSrc><<<grid, kWarps * 32, 0, s>>>(grp, cols, xa, xb, n); break;
    case 2: skinny_kernel<MT, 2, XSrc><<<grid, kWarps * 32, 0, s>>>(grp, cols, xa, xb, n); break;
    case 3: skinny_kernel<MT, 3, XSrc><<<grid, kWarps * 32, 0, s>>>(grp, cols, xa, xb, n); break;
    case 4: skinny_kernel<MT, 4, XSrc><<<grid, kWarps * 32, 0, s>>>(grp, cols, xa, xb, n); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <class XSrc>
cudaError_t dispatch(const SkinnyGroup& grp, int cols, const void* xa, const void* xb, int n, cudaStream_t s) {
  int64_t rows = 0;
  for (int m = 0; m < grp.count; ++m) rows += grp.rows[m];
  // Two m16 tiles per block once that still gives >= 2 blocks per SM on a 132-SM part (lm_head, MLP
  // up-projections, a group's rows together): half the activation reads per weight byte; smaller
  // products keep one for more blocks.
  if (rows >= 2 * 132 * 32) return launch<2, XSrc>(grp, cols, xa, xb, n, s);
  return launch<1, XSrc>(grp, cols, xa, xb, n, s);
}

SkinnyGroup single(const WeightMatrix& W, float* y) {
  SkinnyGroup g{};
  g.W[0] = static_cast<const uint16_t*>(W.data);
  g.y[0] = y;
  g.rows[0] = static_cast<int>(W.rows);
  g.count = 1;
  return g;
}

// A group's matrices must each be linear_skinny_supported and share the input width.
bool group_ok(const WeightMatrix* const* W, float* const* y, int count, int n) {
  if (count < 1 || count > kLinearGroupMax) return false;
  for (int m = 0; m < count; ++m)
    if (W[m] == nullptr || y[m] == nullptr || !linear_skinny_supported(*W[m], n) || W[m]->cols != W[0]->cols) return false;
  return true;
}

SkinnyGroup group_of(const WeightMatrix* const* W, float* const* y, int count) {
  SkinnyGroup g{};
  for (int m = 0; m < count; ++m) {
    g.W[m] = static_cast<const uint16_t*>(W[m]->data);
    g.y[m] = y[m];
    g.rows[m] = static_cast<int>(W[m]->rows);
  }
  g.count = count;
  return g;
}

}  // namespace

bool linear_skinny_supported(const WeightMatrix& W, int64_t n) {
  return W.format == WeightFormat::BF16 && n >= kSkinnyMinTokens && n <= kSkinnyMaxTokens && W.rows >= 1 &&
         W.rows <= (int64_t{1} << 30) && W.cols >= 32 && W.cols % 32 == 0 && W.cols <= (int64_t{1} << 30) &&
         reinterpret_cast<uintptr_t>(W.data) % 16 == 0;
}

cudaError_t linear_skinny(const WeightMatrix& W, const uint16_t* x_hi, const uint16_t* x_lo, int n, float* y,
                          cudaStream_t s) {
  if (!linear_skinny_supported(W, n)) return cudaErrorInvalidValue;
  return dispatch<SplitX>(single(W, y), static_cast<int>(W.cols), x_hi, x_lo, n, s);
}

cudaError_t linear_skinny_f32(const WeightMatrix& W, const float* x, int n, float* y, cudaStream_t s) {
  if (!linear_skinny_supported(W, n) || reinterpret_cast<uintptr_t>(x) % 16 != 0) return cudaErrorInvalidValue;
  return dispatch<F32X>(single(W, y), static_cast<int>(W.cols), x, nullptr, n, s);
}

cudaError_t linear_skinny_group(const WeightMatrix* const* W, float* const* y, int count, const uint16_t* x_hi,
                                const uint16_t* x_lo, int n, cudaStream_t s) {
  if (!group_ok(W, y, count, n)) return cudaErrorInvalidValue;
  return dispatch<SplitX>(group_of(W, y, count), static_cast<int>(W[0]->cols), x_hi, x_lo, n, s);
}

cudaError_t linear_skinny_group_f32(const WeightMatrix* const* W, float* const* y, int count, const float* x, int n,
                                    cudaStream_t s) {
  if (!group_ok(W, y, count, n) || reinterpret_cast<uintptr_t>(x) % 16 != 0) return cudaErrorInvalidValue;
  return dispatch<F32X>(group_of(W, y, count), static_cast<int>(W[0]->cols), x, nullptr, n, s);
}

}  // namespace k3::cuda

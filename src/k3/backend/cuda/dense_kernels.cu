// Elementwise / row kernels (dense_kernels.h). Row kernels use one block per row with a block-wide
// reduction; sums are accumulated in fp32 (the CPU reference uses double for attn_res and the L2 norms,
// float elsewhere: differences stay at fp32 rounding).
#include "k3/backend/cuda/dense_kernels.h"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)

#include <cuda_bf16.h>

#include <cstdint>
#include <initializer_list>

namespace k3::cuda {
namespace {

__device__ __forceinline__ float bf16_to_f32(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

// Sum over the block (blockDim.x a multiple of 32, <= 1024). All threads get the result.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float x = lane < static_cast<int>(blockDim.x >> 5) ? part[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    if (lane == 0) total = x;
  }
  __syncthreads();
  return total;
}

int row_threads(int dim) { return dim >= 1024 ? 512 : dim >= 256 ? 256 : 128; }

// float4s a thread of the register-held norms (1, 2 or 4), or 0: the looped kernels (a width or stride off 4
// floats, a pointer off 16 bytes, rows wider than 16384). Null pointers (an absent weight) are aligned.
int vec_norm_per_thread(int dim, int stride, std::initializer_list<const void*> ptrs) {
  if (dim % 4 != 0 || stride % 4 != 0) return 0;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 0;
  const int q = dim / 4;
  return q <= 1024 ? 1 : q <= 2048 ? 2 : q <= 4096 ? 4 : 0;
}
// Threads of a register-held norm block: the row's float4s over v, rounded up to whole warps.
int vec_norm_threads(int dim, int v) { return ((dim / 4 + v - 1) / v + 31) / 32 * 32; }
unsigned grid1d(int64_t count, int threads) { return static_cast<unsigned>((count + threads - 1) / threads); }

__global__ void embed_kernel(const uint16_t* __restrict__ table, int64_t H, const int32_t* __restrict__ tokens,
                             float* __restrict__ out) {
  pdl::begin();
  const int64_t t = blockIdx.x;
  const uint16_t* row = table + static_cast<int64_t>(tokens[t]) * H;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) out[t * H + i] = bf16_to_f32(row[i]);
}

// A vocabulary shard's embedding: rows [first, first + count) of the vocabulary; other tokens get zeros.
__global__ void embed_shard_kernel(const uint16_t* __restrict__ table, int64_t H, const int32_t* __restrict__ tokens,
                                   int64_t first, int64_t count, int64_t stride, float* __restrict__ out) {
  pdl::begin();
  const int64_t t = blockIdx.x, row = static_cast<int64_t>(tokens[t]) - first;
  const bool mine = row >= 0 && row < count;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) out[t * stride + i] = mine ? bf16_to_f32(table[row * H + i]) : 0.f;
}

__global__ void map_ids_kernel(int32_t* ids, int64_t n, const int32_t* __restrict__ table, int64_t table_n) {
  pdl::begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = ids[i];
    ids[i] = (e >= 0 && e < table_n) ? table[e] : -1;
  }
}

__global__ void rmsnorm_kernel(const float* x, const float* __restrict__ w, int dim, int stride, float eps, float* out) {
  pdl::begin();
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * stride;
  float* orow = out + static_cast<int64_t>(blockIdx.x) * stride;
  float ss = 0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  const float inv = rsqrtf(block_sum(ss) / static_cast<float>(dim) + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) orow[i] = xr[i] * inv * (w ? w[i] : 1.0f);
}

// y += x, then out = rmsnorm(y) * w, per row: add_kernel and rmsnorm_kernel in one launch with their exact
// arithmetic (the same per-element add; the same threads, strided loop and block_sum for the norm), so the
// bits equal the two-kernel sequence. Each thread re-reads only the y elements it wrote itself.
__global__ void add_rmsnorm_kernel(float* y, const float* __restrict__ x, const float* __restrict__ w, int dim, int stride,
                                   float eps, float* out) {
  pdl::begin();
  float* yr = y + static_cast<int64_t>(blockIdx.x) * stride;
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * stride;
  float* orow = out + static_cast<int64_t>(blockIdx.x) * stride;
  float ss = 0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = yr[i] + xr[i];
    yr[i] = v;
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / static_cast<float>(dim) + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) orow[i] = yr[i] * inv * (w ? w[i] : 1.0f);
}

// The same two norms with each row held in registers (V float4 a thread, one load round trip instead of a strided
// loop per 512 values): at batch 1 the looped kernels took ~6 us a row of 2304 (ncu, call s42-1), 53 launches a
// Kimi-Linear-48B step. For dim % 4 == 0, 16-byte aligned rows, dim <= 4 * 1024 * V. The sum of squares runs per
// float4 (x, y, z, w) and then over the block: other bits than the looped kernels', the same in both of these
// (AddRmsnormEqualsAddThenRmsnorm).
// The register-held row v (V float4 a thread) times inv and the weight w (none: 1) into orow.
template <int V>
__device__ __forceinline__ void store_normed(float4* orow, const float4 (&v)[V], float inv, const float* __restrict__ w, int q) {
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int j = threadIdx.x + i * blockDim.x;
    if (j >= q) continue;
    const float4 g = w ? reinterpret_cast<const float4*>(w)[j] : make_float4(1.f, 1.f, 1.f, 1.f);
    orow[j] = make_float4(v[i].x * inv * g.x, v[i].y * inv * g.y, v[i].z * inv * g.z, v[i].w * inv * g.w);
  }
}

// Row blockIdx.x held in v (V float4 a thread): x's row, or y + x (then stored back to y) when y is given; returns
// the thread's sum of squares (per float4: x, y, z, w).
template <int V>
__device__ __forceinline__ float load_row(float4 (&v)[V], float* y, const float* x, int stride, int q) {
  const int64_t off = static_cast<int64_t>(blockIdx.x) * stride;
  const float4* xr = reinterpret_cast<const float4*>(x + off);
  float4* yr = y ? reinterpret_cast<float4*>(y + off) : nullptr;
  float ss = 0;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int j = threadIdx.x + i * blockDim.x;
    v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (j < q) {
      const float4 b = xr[j];
      if (yr) {
        const float4 a = yr[j];
        v[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        yr[j] = v[i];
      } else {
        v[i] = b;
      }
    }
    ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
  }
  return ss;
}

template <int V>
__global__ void rmsnorm_vec_kernel(const float* x, const float* __restrict__ w, int dim, int stride, float eps, float* out) {
  pdl::begin();
  const int q = dim / 4;
  float4 v[V];
  const float ss = load_row<V>(v, nullptr, x, stride, q);
  float4* orow = reinterpret_cast<float4*>(out + static_cast<int64_t>(blockIdx.x) * stride);
  store_normed<V>(orow, v, rsqrtf(block_sum(ss) / static_cast<float>(dim) + eps), w, q);
}

template <int V>
__global__ void add_rmsnorm_vec_kernel(float* y, const float* __restrict__ x, const float* __restrict__ w, int dim,
                                       int stride, float eps, float* out) {
  pdl::begin();
  const int q = dim / 4;
  float4 v[V];
  const float ss = load_row<V>(v, y, x, stride, q);
  float4* orow = reinterpret_cast<float4*>(out + static_cast<int64_t>(blockIdx.x) * stride);
  store_normed<V>(orow, v, rsqrtf(block_sum(ss) / static_cast<float>(dim) + eps), w, q);
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  pdl::begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}
__global__ void sigmoid_mul_kernel(float* y, const float* g, int64_t n) {
  pdl::begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] *= sigmoid(g[i]);
}
__global__ void glu_kernel(float* gate, const float* up, int64_t n, bool situ, float beta, float lbeta) {
  pdl::begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i], u = up[i];
  if (situ)
    gate[i] = beta * tanhf(g / beta) * sigmoid(g) * (lbeta * tanhf(u / lbeta));
  else
    gate[i] = g * sigmoid(g) * u;
}
__global__ void to_bf16_kernel(const float* x, int64_t n, uint16_t* out) {
  pdl::begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const __nv_bfloat16 b = __float2bfloat16_rn(x[i]);
    out[i] = *reinterpret_cast<const uint16_t*>(&b);
  }
}

__global__ void to_bf16_split_kernel(const float* x, int64_t n, uint16_t* hi, uint16_t* lo) {
  pdl::begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x[i]);
    const __nv_bfloat16 l = __float2bfloat16_rn(x[i] - __bfloat162float(h));
    hi[i] = *reinterpret_cast<const uint16_t*>(&h);
    lo[i] = *reinterpret_cast<const uint16_t*>(&l);
  }
}

// The m = nb + 1 sources of the mix: the completed blocks, block_stride floats apart, then the partial sum.
struct ResSources {
  const float* blocks;
  int64_t block_stride;
  const float* partial;
  int nb;
  __device__ const float* operator[](int i) const { return i < nb ? blocks + i * block_stride : partial; }
};

// The softmax weights p[0..m) of row t over the sources (shared p, visible to the whole block on return).
__device__ void attn_res_weights(const ResSources src, int m, const float* __restrict__ w, int H,
                                 float eps, int64_t t, float* p) {
  for (int i = 0; i < m; ++i) {
    const float* v = src[i] + t * H;
    float ss = 0, dot = 0;
    for (int d = threadIdx.x; d < H; d += blockDim.x) {
      ss += v[d] * v[d];
      dot += v[d] * w[d];
    }
    ss = block_sum(ss);
    dot = block_sum(dot);
    if (threadIdx.x == 0) p[i] = dot * rsqrtf(ss / static_cast<float>(H) + eps);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float mx = -INFINITY, sum = 0;
    for (int i = 0; i < m; ++i) mx = fmaxf(mx, p[i]);
    for (int i = 0; i < m; ++i) sum += (p[i] = __expf(p[i] - mx));
    for (int i = 0; i < m; ++i) p[i] /= sum;
  }
  __syncthreads();
}

// One block per row; m <= 32 sources (K3: 93 layers / block 12 -> at most 9 blocks + the partial sum).
__global__ void attn_res_kernel(const ResSources src, int m, const float* __restrict__ w, int H,
                                float eps, float* __restrict__ out) {
  pdl::begin();
  __shared__ float p[32];
  const int64_t t = blockIdx.x;
  attn_res_weights(src, m, w, H, eps, t, p);
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    float o = 0;
    for (int i = 0; i < m; ++i) o += p[i] * src[i][t * H + d];
    out[t * H + d] = o;
  }
}

// attn_res_kernel followed by RMSNorm of the mixed row (kept in shared memory).
__global__ void attn_res_norm_kernel(const ResSources src, int m, const float* __restrict__ w, int H,
                                     float eps, const float* __restrict__ norm_w, float* __restrict__ out) {
  pdl::begin();
  extern __shared__ float row[];  // [H]
  __shared__ float p[32];
  const int64_t t = blockIdx.x;
  attn_res_weights(src, m, w, H, eps, t, p);
  float ss = 0;
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    float o = 0;
    for (int i = 0; i < m; ++i) o += p[i] * src[i][t * H + d];
    row[d] = o;
    ss += o * o;
  }
  const float inv = rsqrtf(block_sum(ss) / static_cast<float>(H) + eps);
  for (int d = threadIdx.x; d < H; d += blockDim.x) out[t * H + d] = row[d] * inv * norm_w[d];
}

__global__ void gather_kernel(const float* x, const int32_t* rows, int H, float* out) {
  pdl::begin();
  const int64_t r = blockIdx.x;
  const float* src = x + static_cast<int64_t>(rows[r]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) out[r * H + i] = src[i];
}

__global__ void copy_segments_kernel(const CopySeg* segs) {
  pdl::begin();
  const CopySeg c = segs[blockIdx.x];
  const bool wide = ((reinterpret_cast<uintptr_t>(c.dst) | reinterpret_cast<uintptr_t>(c.src) | c.bytes) & 15) == 0;
  if (wide) {
    const uint64_t n = c.bytes / 16;
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x)
      static_cast<float4*>(c.dst)[i] = static_cast<const float4*>(c.src)[i];
  } else {
    const uint64_t n = c.bytes / 4;
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) static_cast<float*>(c.dst)[i] = static_cast<const float*>(c.src)[i];
  }
}

// splitmix64 of (seed, index): independent of the launch shape.
__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float unit(uint64_t seed, int64_t i) {
  return static_cast<float>(mix(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
}
__global__ void fill_bf16_kernel(uint16_t* p, int64_t n, float scale, uint64_t seed) {
  pdl::begin();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const __nv_bfloat16 b = __float2bfloat16_rn((2.0f * unit(seed, i) - 1.0f) * scale);
    p[i] = *reinterpret_cast<const uint16_t*>(&b);
  }
}
__global__ void fill_f32_kernel(float* p, int64_t n, float lo, float hi, uint64_t seed) {
  pdl::begin();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = lo + (hi - lo) * unit(seed, i);
}
__global__ void fill_bytes_kernel(uint8_t* p, int64_t n, uint32_t lo, uint32_t span, uint64_t seed) {
  pdl::begin();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = static_cast<uint8_t>(lo + mix(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i)) % span);
}

unsigned fill_grid(int64_t n) { return static_cast<unsigned>(n / 256 + 1 < 65536 ? n / 256 + 1 : 65536); }

}  // namespace

cudaError_t embed_rows(const uint16_t* table, int64_t H, const int32_t* tokens, int n, float* out, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  (void)pdl::launch(embed_kernel, n, 256, 0, s, table, H, tokens, out);
  return cudaGetLastError();
}

cudaError_t embed_rows_shard(const uint16_t* table, int64_t H, const int32_t* tokens, int n, int64_t first, int64_t count,
                             int64_t stride, float* out, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (stride < H) return cudaErrorInvalidValue;
  (void)pdl::launch(embed_shard_kernel, n, 256, 0, s, table, H, tokens, first, count, stride, out);
  return cudaGetLastError();
}

cudaError_t map_ids(int32_t* ids, int64_t n, const int32_t* table, int64_t table_n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  (void)pdl::launch(map_ids_kernel, fill_grid(n), 256, 0, s, ids, n, table, table_n);
  return cudaGetLastError();
}

cudaError_t rmsnorm(const float* x, const float* w, int n, int dim, int stride, float eps, float* out, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (dim <= 0 || stride < dim) return cudaErrorInvalidValue;
  const int v = vec_norm_per_thread(dim, stride, {x, w, out});
  if (v == 0) (void)pdl::launch(rmsnorm_kernel, n, row_threads(dim), 0, s, x, w, dim, stride, eps, out);
  else if (v == 1) (void)pdl::launch(rmsnorm_vec_kernel<1>, n, vec_norm_threads(dim, 1), 0, s, x, w, dim, stride, eps, out);
  else if (v == 2) (void)pdl::launch(rmsnorm_vec_kernel<2>, n, vec_norm_threads(dim, 2), 0, s, x, w, dim, stride, eps, out);
  else (void)pdl::launch(rmsnorm_vec_kernel<4>, n, vec_norm_threads(dim, 4), 0, s, x, w, dim, stride, eps, out);
  return cudaGetLastError();
}

cudaError_t add_rmsnorm(float* y, const float* x, const float* w, int n, int dim, int stride, float eps, float* out,
                        cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (dim <= 0 || stride < dim) return cudaErrorInvalidValue;
  const int v = vec_norm_per_thread(dim, stride, {y, x, w, out});
  if (v == 0) (void)pdl::launch(add_rmsnorm_kernel, n, row_threads(dim), 0, s, y, x, w, dim, stride, eps, out);
  else if (v == 1) (void)pdl::launch(add_rmsnorm_vec_kernel<1>, n, vec_norm_threads(dim, 1), 0, s, y, x, w, dim, stride, eps, out);
  else if (v == 2) (void)pdl::launch(add_rmsnorm_vec_kernel<2>, n, vec_norm_threads(dim, 2), 0, s, y, x, w, dim, stride, eps, out);
  else (void)pdl::launch(add_rmsnorm_vec_kernel<4>, n, vec_norm_threads(dim, 4), 0, s, y, x, w, dim, stride, eps, out);
  return cudaGetLastError();
}

cudaError_t add_inplace(float* y, const float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  (void)pdl::launch(add_kernel, grid1d(n, 256), 256, 0, s, y, x, n);
  return cudaGetLastError();
}
cudaError_t sigmoid_mul(float* y, const float* g, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  (void)pdl::launch(sigmoid_mul_kernel, grid1d(n, 256), 256, 0, s, y, g, n);
  return cudaGetLastError();
}
cudaError_t glu(float* gate, const float* up, int64_t n, bool situ, float beta, float lbeta, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  (void)pdl::launch(glu_kernel, grid1d(n, 256), 256, 0, s, gate, up, n, situ, beta, lbeta);
  return cudaGetLastError();
}
cudaError_t to_bf16(const float* x, int64_t n, uint16_t* out, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  (void)pdl::launch(to_bf16_kernel, grid1d(n, 256), 256, 0, s, x, n, out);
  return cudaGetLastError();
}
cudaError_t to_bf16_split(const float* x, int64_t n, uint16_t* hi, uint16_t* lo, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  (void)pdl::launch(to_bf16_split_kernel, grid1d(n, 256), 256, 0, s, x, n, hi, lo);
  return cudaGetLastError();
}
cudaError_t attn_res_mix(const float* blocks, int64_t block_stride, int nb, const float* partial, const float* w, int n,
                         int H, float eps, float* out,
                         cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (nb < 0 || nb > 31) return cudaErrorInvalidValue;
  (void)pdl::launch(attn_res_kernel, n, row_threads(H), 0, s, ResSources{blocks, block_stride, partial, nb}, nb + 1, w, H, eps, out);
  return cudaGetLastError();
}
cudaError_t attn_res_mix_rmsnorm(const float* blocks, int64_t block_stride, int nb, const float* partial, const float* w,
                                 int n, int H, float eps,
                                 const float* norm_w, float* out, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (nb < 0 || nb > 31 || H > 12288) return cudaErrorInvalidValue;
  (void)pdl::launch(attn_res_norm_kernel, n, row_threads(H), static_cast<size_t>(H) * sizeof(float), s, ResSources{blocks, block_stride, partial, nb}, nb + 1, w, H, eps,
                                                                                      norm_w, out);
  return cudaGetLastError();
}
cudaError_t copy_segments(const CopySeg* segs, int n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  (void)pdl::launch(copy_segments_kernel, n, 256, 0, s, segs);
  return cudaGetLastError();
}

cudaError_t gather_rows(const float* x, const int32_t* rows, int R, int H, float* out, cudaStream_t s) {
  if (R <= 0) return cudaSuccess;
  (void)pdl::launch(gather_kernel, R, 256, 0, s, x, rows, H, out);
  return cudaGetLastError();
}
cudaError_t fill_uniform_bf16(uint16_t* p, int64_t n, float scale, uint64_t seed, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  (void)pdl::launch(fill_bf16_kernel, fill_grid(n), 256, 0, s, p, n, scale, seed);
  return cudaGetLastError();
}
cudaError_t fill_uniform_f32(float* p, int64_t n, float lo, float hi, uint64_t seed, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  (void)pdl::launch(fill_f32_kernel, fill_grid(n), 256, 0, s, p, n, lo, hi, seed);
  return cudaGetLastError();
}
cudaError_t fill_random_bytes(uint8_t* p, int64_t n, uint8_t lo, uint8_t hi, uint64_t seed, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (hi < lo) return cudaErrorInvalidValue;
  (void)pdl::launch(fill_bytes_kernel, fill_grid(n), 256, 0, s, p, n, lo, static_cast<uint32_t>(hi - lo) + 1u, seed);
  return cudaGetLastError();
}

}  // namespace k3::cuda

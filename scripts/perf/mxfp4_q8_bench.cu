// Stand-alone prototype of an MXFP4 x int8 (q8, one scale per 32 inputs) grouped GEMV on dp4a for decode-sized MoE
// batches (issue 18 item 2: MoE decode >= 70% of HBM at n = 1..64). Why: every MXFP4 decode kernel so far is
// issue-bound -- ~7.8 instructions a weight byte, most of them placing E2M1 nibbles as bf16 pairs (docs/perf/cuda.md
// sessions 4, 23, 52) -- and at K3's 896 experts / top-16 an expert sees 1.1 tokens on average up to n = 64, so the
// decode is a GEMV per expert. The CPU's avx512bf16 / amx tiers already run MXFP4 experts at decode on these numerics
// (backend/cpu/mxfp4_rowblocks.h: x as q8 blocks of 32, m = max |x|, q = nearest-even(x (127 / m)), d = m / 127; the int32
// dot of a row's block exact; acc += float(dot) (0.5 2^(e8m0 - 127) d)), llama.cpp's CUDA MXFP4 path likewise (q8_1).
// Here:
//   - the weights as stored (byte j of a 16-byte group: element 2j low nibble, 2j + 1 high), no load-time repack;
//   - a word of 8 E2M1 codes: 4 prmt lookups of a magnitude table (2x the values: 0 1 2 3 4 6 8 12) -- with the codes
//     as the selector a negative code gives 0 (prmt's sign-replicate bit), with the sign bits flipped the other way
//     round -- and 4 dp4a into a positive and a negative sum: ~11 integer instructions a 4-byte word, no select
//     (group_dot below; llama.cpp's 16-entry form takes 6 prmt and their masks a word);
//   - gate | up and the GLU fused, the hidden rows quantised to q8 in the same block (a block = 32 hidden rows), so down
//     reads int8 hidden rows; a warp 4 rows, 8 lanes a row (128 contiguous bytes a row a load), two chunks of a lane's
//     groups in flight (gate's before x is staged, each up chunk as soon as its registers are free);
//   - scales as "narrow" E8M0 (2 <= e <= 254: one shift, the 0.5 of the table folded in), as trained banks are.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a scripts/perf/mxfp4_q8_bench.cu -o mxfp4_q8_bench
//   mxfp4_q8_bench selftest       the decode arithmetic on the host (prmt / dp4a as the PTX ISA defines them)
//   mxfp4_q8_bench check          small banks against a double-precision host reference of the same numerics (rel of max
//                                 ~1e-6 expected; a wrong nibble table or token order fails by ~1), and against the
//                                 unquantised products (the q8 class: ~1e-2)
//   mxfp4_q8_bench time N [REPS]  K3's expert shapes (896 experts, top-16, gate|up 6144 x 3584, down 3584 x 3072) for N
//                                 tokens routed at random: us per stage and GB/s of the touched experts' bytes, for launch
//                                 bounds of 1, 2 and 3 blocks an SM and a mixed one (one-pair tiles at 2, the rest at 1)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

constexpr int kTopK = 16;
constexpr int kMaxT = 4;  // pairs (tokens) a tile: an expert with more is cut into several tiles

// PTX prmt in its generic mode: selector nibble bits 2..0 pick a byte of {b, a}, bit 3 set replicates that byte's
// sign bit instead -- 0x00 for the magnitude table below, whose bytes are all < 0x80.
__host__ __device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else  // the PTX ISA's definition, for the host self-test
  const uint64_t src = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t c = (sel >> (4 * i)) & 15u;
    uint32_t byte = static_cast<uint32_t>(src >> (8 * (c & 7u))) & 0xffu;
    if (c & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;
    d |= byte << (8 * i);
  }
  return d;
#endif
}

__host__ __device__ __forceinline__ int dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(a, b, c);
#else
  for (int i = 0; i < 4; ++i)
    c += static_cast<int>(static_cast<int8_t>(a >> (8 * i))) * static_cast<int>(static_cast<int8_t>(b >> (8 * i)));
  return c;
#endif
}

// The int32 dot of one 32-input group (16 bytes of weights: byte j = element 2j low nibble, 2j + 1 high) with 32 int8
// activations (two int4, natural order). An E2M1 code's magnitude times 2 (0 1 2 3 4 6 8 12) is one prmt lookup for 4
// codes at a time: with the codes as the selector, a positive code gives its magnitude and a negative one 0 (the sign
// bit is prmt's replicate bit); with the sign bits flipped, the other way round. So a word of 8 codes is 4 lookups
// and 4 dp4a into a positive and a negative sum, no select: ~11 integer instructions a 4-byte word.
__host__ __device__ __forceinline__ int group_dot(const uint4& w, const int4& x0, const int4& x1, uint32_t kLo) {
  constexpr uint32_t kHi = 0x0C080604u, kSign = 0x88888888u;
  int p = 0, n = 0;
  const uint32_t wd[4] = {w.x, w.y, w.z, w.w};
  const int xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t c = wd[i], f = c ^ kSign;
    p = dp4a(static_cast<int>(prmt(kLo, kHi, c)), xs[2 * i], p);              // elements 0..3 of the word
    n = dp4a(static_cast<int>(prmt(kLo, kHi, f)), xs[2 * i], n);
    p = dp4a(static_cast<int>(prmt(kLo, kHi, c >> 16)), xs[2 * i + 1], p);    // elements 4..7
    n = dp4a(static_cast<int>(prmt(kLo, kHi, f >> 16)), xs[2 * i + 1], n);
  }
  return p - n;
}

// 0.5 x 2^(e - 127) for a narrow E8M0 byte (2 <= e <= 254).
__device__ __forceinline__ float narrow_scale(uint32_t e) { return __uint_as_float((e - 1u) << 23); }

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");  // kept in program order: a chunk's loads go out where its registers are free
  return v;
}

struct Tiles {
  const int* expert;  // [tiles]
  const int* first;   // [tiles]: first index into pair_of
  const int* count;   // [tiles]: 1..kMaxT
  const int* pair_of;  // [pairs], by expert: the pair ids (pair = token * kTopK + j)
};

// One warp's block of 32 values (lane = value) to q8, the CPU tier's rule: m = max |v|, q = nearest-even(v (127 / m)),
// d = m / 127; a block with m < 2^-120 (or a NaN) gets q = 0, d = 0. Lane i writes q[i], lane 0 d.
__device__ __forceinline__ void quant_q8_warp(float v, int8_t* q, float* d) {
  const int lane = threadIdx.x & 31;
  float m = fabsf(v);
#pragma unroll
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const bool tiny = !(m >= 0x1p-120f);
  const float inv = tiny ? 0.f : __fdiv_rn(127.f, m);
  q[lane] = static_cast<int8_t>(tiny ? 0 : __float2int_rn(__fmul_rn(v, inv)));
  if (lane == 0) *d = tiny ? 0.f : __fdiv_rn(m, 127.f);
}

// x [N][K] fp32 -> q [N][K] int8 + d [N][K / 32]: one warp a block of 32.
__global__ void quant_q8_kernel(const float* x, int64_t blocks, int8_t* q, float* d) {
  const int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (b >= blocks) return;  // whole warps: blockDim is a multiple of 32
  quant_q8_warp(x[b * 32 + (threadIdx.x & 31)], q + b * 32, d + b);
}

__device__ __forceinline__ float glu(float g, float u) { return g / (1.f + __expf(-g)) * u; }

// C of a lane's groups of one row (g = l8 + 8 (j0 + j)): weights and scales, loaded before any product needs them.
template <int C>
struct Chunk {
  uint4 w[C];
  uint32_t s[C];
  __device__ __forceinline__ void load(const uint8_t* wrow, const uint8_t* srow, int l8, int j0) {
#pragma unroll
    for (int j = 0; j < C; ++j) w[j] = ld_stream(reinterpret_cast<const uint4*>(wrow) + l8 + 8 * (j0 + j));
#pragma unroll
    for (int j = 0; j < C; ++j) s[j] = __ldg(srow + l8 + 8 * (j0 + j));
  }
};

// The magnitude table's low word (0 1 2 3) in a register the compiler cannot rematerialise: prmt takes its first table
// word from a register, and without this the constant is moved in again before every lookup.
__device__ __forceinline__ uint32_t table_lo() {
  uint32_t r;  // threadIdx.x >> 10 is 0: a per-thread value, so the word sits in an ordinary register
  asm volatile("add.u32 %0, %1, 0x03020100;" : "=r"(r) : "r"(threadIdx.x >> 10));
  return r;
}

// The chunk's products for T tokens whose q8 rows sit in shared memory, into the lane's partial sums.
template <int C, int T>
__device__ __forceinline__ void accumulate(const Chunk<C>& L, int j0, int l8, const int8_t* sq, const float* sd, int K,
                                           float (&acc)[T], uint32_t lo) {
#pragma unroll
  for (int j = 0; j < C; ++j) {
    const int g = l8 + 8 * (j0 + j);
    const float ws = narrow_scale(L.s[j]);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const int4* xg = reinterpret_cast<const int4*>(sq + t * K + g * 32);
      const int dot = group_dot(L.w[j], xg[0], xg[1], lo);
      acc[t] = fmaf(static_cast<float>(dot), ws * sd[t * (K / 32) + g], acc[t]);
    }
    if (j & 1) asm volatile("" ::: "memory");  // x's shared-memory loads two groups ahead at most (registers)
  }
}

// The sums of a row's 8 lanes.
template <int T>
__device__ __forceinline__ void row_sum(float (&acc)[T]) {
#pragma unroll
  for (int t = 0; t < T; ++t) {
    acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], 4);
    acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], 2);
    acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], 1);
  }
}

// Stage the tile's T q8 rows (K int8 + K / 32 scales each) of src (by row id) in shared memory.
template <int T>
__device__ __forceinline__ void stage_rows(const int8_t* q, const float* d, const int* rows, int K, int8_t* sq,
                                           float* sd) {
  for (int t = 0; t < T; ++t) {
    const int4* src = reinterpret_cast<const int4*>(q + static_cast<int64_t>(rows[t]) * K);
    int4* dst = reinterpret_cast<int4*>(sq + t * K);
    for (int i = threadIdx.x; i < K / 16; i += blockDim.x) dst[i] = src[i];
    for (int i = threadIdx.x; i < K / 32; i += blockDim.x) sd[t * (K / 32) + i] = d[static_cast<int64_t>(rows[t]) * (K / 32) + i];
  }
}

// A kernel's start: a lane's first two chunks of its row (w, s) go out, then the tile's T q8 rows are staged; the
// block waits for them.
template <int C, int T>
__device__ __forceinline__ void load_and_stage(Chunk<C>& A, Chunk<C>& B, const uint8_t* w, const uint8_t* s, int l8,
                                               const int8_t* q, const float* d, const int* rows, int K, int8_t* sq,
                                               float* sd) {
  A.load(w, s, l8, 0);
  B.load(w, s, l8, C);
  stage_rows<T>(q, d, rows, K, sq, sd);
  __syncthreads();
}

struct GateUpArgs {
  const uint8_t* w;   // [E][2I][K / 2]: gate rows 0..I-1, up rows I..2I-1
  const uint8_t* ws;  // [E][2I][K / 32]
  const int8_t* xq;   // [N][K]
  const float* xd;    // [N][K / 32]
  Tiles tiles;
  int tile0, I, K;
  int8_t* hq;  // [pairs][I]
  float* hd;   // [pairs][I / 32]
};

// Grid (I / 32, tiles of T pairs), 256 threads: warp w, hidden rows h0 + 4 w + lane / 8, gate and up row each.
template <int GPL, int T, int MINB>
__global__ void __launch_bounds__(256, MINB) gateup_q8_kernel(GateUpArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int tile = a.tile0 + blockIdx.y;  // the tiles are sorted by pair count: each T launches its own range
  const int e = a.tiles.expert[tile];
  int pairs[T], toks[T];
  for (int t = 0; t < T; ++t) {
    pairs[t] = a.tiles.pair_of[a.tiles.first[tile] + t];
    toks[t] = pairs[t] / kTopK;
  }
  int8_t* sq = reinterpret_cast<int8_t*>(smem);
  float* sd = reinterpret_cast<float*>(smem + T * a.K);
  float* sh = sd + T * (a.K / 32);  // [T][32] hidden values of the block
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, l8 = lane & 7;
  const int hr = blockIdx.x * 32 + warp * 4 + (lane >> 3);
  const int64_t rb = a.K / 2, sb = a.K / 32;
  const uint8_t* wg = a.w + (static_cast<int64_t>(e) * 2 * a.I + hr) * rb;
  const uint8_t* wu = wg + static_cast<int64_t>(a.I) * rb;
  const uint8_t* sg = a.ws + (static_cast<int64_t>(e) * 2 * a.I + hr) * sb;
  const uint8_t* su = sg + static_cast<int64_t>(a.I) * sb;
  // Two chunks of a lane's groups in flight: the gate row's halves go out before x is staged, each up half as soon as
  // its registers are free.
  constexpr int C = GPL / 2;
  const uint32_t lo = table_lo();
  Chunk<C> A, B;
  load_and_stage<C, T>(A, B, wg, sg, l8, a.xq, a.xd, toks, a.K, sq, sd);
  float g[T], u[T];
  for (int t = 0; t < T; ++t) g[t] = u[t] = 0.f;
  accumulate<C, T>(A, 0, l8, sq, sd, a.K, g, lo);
  A.load(wu, su, l8, 0);
  accumulate<C, T>(B, C, l8, sq, sd, a.K, g, lo);
  B.load(wu, su, l8, C);
  accumulate<C, T>(A, 0, l8, sq, sd, a.K, u, lo);
  accumulate<C, T>(B, C, l8, sq, sd, a.K, u, lo);
  row_sum<T>(g);
  row_sum<T>(u);
  if (l8 == 0)
    for (int t = 0; t < T; ++t) sh[t * 32 + warp * 4 + (lane >> 3)] = glu(g[t], u[t]);
  __syncthreads();
  if (warp < T)  // warp t quantises token t's 32 hidden values
    quant_q8_warp(sh[warp * 32 + lane], a.hq + static_cast<int64_t>(pairs[warp]) * a.I + blockIdx.x * 32,
                  a.hd + static_cast<int64_t>(pairs[warp]) * (a.I / 32) + blockIdx.x);
}

struct DownArgs {
  const uint8_t* w;   // [E][R][I / 2]
  const uint8_t* ws;  // [E][R][I / 32]
  const int8_t* hq;   // [pairs][I]
  const float* hd;    // [pairs][I / 32]
  Tiles tiles;
  int tile0, R, I;
  float* y;  // [pairs][R]
};

// Grid (R / 32, tiles), 256 threads: warp w, rows r0 + 4 w + lane / 8.
template <int GPL, int T, int MINB>
__global__ void __launch_bounds__(256, MINB) down_q8_kernel(DownArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int tile = a.tile0 + blockIdx.y;
  const int e = a.tiles.expert[tile];
  int pairs[T];
  for (int t = 0; t < T; ++t) pairs[t] = a.tiles.pair_of[a.tiles.first[tile] + t];
  int8_t* sq = reinterpret_cast<int8_t*>(smem);
  float* sd = reinterpret_cast<float*>(smem + T * a.I);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, l8 = lane & 7;
  const int r = blockIdx.x * 32 + warp * 4 + (lane >> 3);
  const int64_t rb = a.I / 2, sb = a.I / 32;
  const uint8_t* w = a.w + (static_cast<int64_t>(e) * a.R + r) * rb;
  const uint8_t* s = a.ws + (static_cast<int64_t>(e) * a.R + r) * sb;
  constexpr int C = GPL / 2;
  const uint32_t lo = table_lo();
  Chunk<C> A, B;
  load_and_stage<C, T>(A, B, w, s, l8, a.hq, a.hd, pairs, a.I, sq, sd);
  float acc[T];
  for (int t = 0; t < T; ++t) acc[t] = 0.f;
  accumulate<C, T>(A, 0, l8, sq, sd, a.I, acc, lo);
  accumulate<C, T>(B, C, l8, sq, sd, a.I, acc, lo);
  row_sum<T>(acc);
  if (l8 == 0)
    for (int t = 0; t < T; ++t) a.y[static_cast<int64_t>(pairs[t]) * a.R + r] = acc[t];
}

// out [N][R] = sum_j p[n][j] y[n * 16 + j][:].
__global__ void combine_kernel(const float* y, const float* p, int N, int R, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(N) * R) return;
  const int n = static_cast<int>(i / R), r = static_cast<int>(i % R);
  float s = 0.f;
  for (int j = 0; j < kTopK; ++j) s = fmaf(p[n * kTopK + j], y[(static_cast<int64_t>(n) * kTopK + j) * R + r], s);
  out[i] = s;
}

// Deterministic fill: weights' bytes from a hash, scales in [lo, hi].
__global__ void fill_kernel(uint8_t* w, int64_t n, uint32_t seed, int lo, int span) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ static_cast<uint32_t>(i >> 32) * 0x85EBCA77u ^ seed;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    w[i] = span ? static_cast<uint8_t>(lo + h % span) : static_cast<uint8_t>(h >> 8);
  }
}

struct Problem {
  int E, I, K, N;  // experts, hidden (per half), model width (gate/up K, down rows), tokens
};

struct HostRouting {
  std::vector<int> expert, first, count, pair_of;
  int start[kMaxT + 2] = {};  // tiles of count T: [start[T], start[T + 1])
  std::vector<float> p;
  int distinct = 0, max_pairs = 0;
};

HostRouting route(const Problem& P, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int>> by(P.E);
  HostRouting h;
  h.p.resize(static_cast<size_t>(P.N) * kTopK);
  for (int n = 0; n < P.N; ++n) {
    std::vector<int> ids(P.E);
    for (int i = 0; i < P.E; ++i) ids[i] = i;
    for (int j = 0; j < kTopK; ++j) {
      const int k = j + static_cast<int>(rng() % (P.E - j));
      std::swap(ids[j], ids[k]);
      by[ids[j]].push_back(n * kTopK + j);
      h.p[n * kTopK + j] = 0.02f + 0.1f * static_cast<float>(rng() % 1000) / 1000.f;
    }
  }
  for (int e = 0; e < P.E; ++e) {
    if (by[e].empty()) continue;
    ++h.distinct;
    h.max_pairs = std::max(h.max_pairs, static_cast<int>(by[e].size()));
    for (size_t i = 0; i < by[e].size(); i += kMaxT) {
      h.expert.push_back(e);
      h.first.push_back(static_cast<int>(h.pair_of.size() + i));
      h.count.push_back(static_cast<int>(std::min<size_t>(kMaxT, by[e].size() - i)));
    }
    h.pair_of.insert(h.pair_of.end(), by[e].begin(), by[e].end());
  }
  std::vector<int> order(h.expert.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return h.count[a] < h.count[b]; });
  HostRouting s = h;
  for (size_t i = 0; i < order.size(); ++i) {
    s.expert[i] = h.expert[order[i]];
    s.first[i] = h.first[order[i]];
    s.count[i] = h.count[order[i]];
  }
  for (int T = 1; T <= kMaxT + 1; ++T)
    s.start[T] = static_cast<int>(std::lower_bound(s.count.begin(), s.count.end(), T) - s.count.begin());
  return s;
}

template <class V>
V* up(const std::vector<V>& v) {
  V* d = nullptr;
  ck(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(V)), "malloc");
  ck(cudaMemcpy(d, v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice), "h2d");
  return d;
}

struct Device {
  uint8_t *w1, *s1, *w2, *s2;
  float *x, *xd, *hd, *y, *out, *p;
  int8_t *xq, *hq;
  Tiles tiles;
  int ntiles;
};

template <int GPL, int T, int MINB>
void launch_gateup(const Problem& P, const Device& d, const HostRouting& h, cudaStream_t st) {
  const int n = h.start[T + 1] - h.start[T];
  if (n == 0) return;
  GateUpArgs a{d.w1, d.s1, d.xq, d.xd, d.tiles, h.start[T], P.I, P.K, d.hq, d.hd};
  const size_t sm = T * P.K + T * (P.K / 32) * 4 + T * 32 * 4;
  gateup_q8_kernel<GPL, T, MINB><<<dim3(P.I / 32, n), 256, sm, st>>>(a);
}
template <int GPL, int T, int MINB>
void launch_down(const Problem& P, const Device& d, const HostRouting& h, cudaStream_t st) {
  const int n = h.start[T + 1] - h.start[T];
  if (n == 0) return;
  DownArgs a{d.w2, d.s2, d.hq, d.hd, d.tiles, h.start[T], P.K, P.I, d.y};
  const size_t sm = T * P.I + T * (P.I / 32) * 4;
  down_q8_kernel<GPL, T, MINB><<<dim3(P.K / 32, n), 256, sm, st>>>(a);
}

// The three stages (the tiles of each pair count as their own launch).
template <int GPL1, int GPL2, int MINB, int MINBX = MINB>  // MINBX: blocks an SM for tiles of 2-4 pairs
void run_layer(const Problem& P, const Device& d, const HostRouting& h, cudaStream_t st, bool quant, bool gu, bool dn) {
  if (quant) {
    const int64_t blocks = static_cast<int64_t>(P.N) * P.K / 32;
    quant_q8_kernel<<<static_cast<unsigned>((blocks * 32 + 255) / 256), 256, 0, st>>>(d.x, blocks, d.xq, d.xd);
  }
  if (gu) {
    launch_gateup<GPL1, 1, MINB>(P, d, h, st);
    launch_gateup<GPL1, 2, MINBX>(P, d, h, st);
    launch_gateup<GPL1, 3, MINBX>(P, d, h, st);
    launch_gateup<GPL1, 4, MINBX>(P, d, h, st);
  }
  if (dn) {
    launch_down<GPL2, 1, MINB>(P, d, h, st);
    launch_down<GPL2, 2, MINBX>(P, d, h, st);
    launch_down<GPL2, 3, MINBX>(P, d, h, st);
    launch_down<GPL2, 4, MINBX>(P, d, h, st);
    const int64_t n = static_cast<int64_t>(P.N) * P.K;
    combine_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, st>>>(d.y, d.p, P.N, P.K, d.out);
  }
}

Device make_device(const Problem& P, const HostRouting& h, const std::vector<float>& x, uint32_t seed) {
  Device d{};
  const int64_t w1 = static_cast<int64_t>(P.E) * 2 * P.I * (P.K / 2), s1 = static_cast<int64_t>(P.E) * 2 * P.I * (P.K / 32);
  const int64_t w2 = static_cast<int64_t>(P.E) * P.K * (P.I / 2), s2 = static_cast<int64_t>(P.E) * P.K * (P.I / 32);
  ck(cudaMalloc(&d.w1, w1), "w1");
  ck(cudaMalloc(&d.s1, s1), "s1");
  ck(cudaMalloc(&d.w2, w2), "w2");
  ck(cudaMalloc(&d.s2, s2), "s2");
  fill_kernel<<<4096, 256>>>(d.w1, w1, seed, 0, 0);
  fill_kernel<<<4096, 256>>>(d.s1, s1, seed + 1, 117, 5);  // 2^-10 .. 2^-6: the QAT bank's range
  fill_kernel<<<4096, 256>>>(d.w2, w2, seed + 2, 0, 0);
  fill_kernel<<<4096, 256>>>(d.s2, s2, seed + 3, 117, 5);
  ck(cudaGetLastError(), "fill");
  d.x = up(x);
  d.p = up(h.p);
  const int64_t pairs = static_cast<int64_t>(P.N) * kTopK;
  ck(cudaMalloc(&d.xq, static_cast<size_t>(P.N) * P.K), "xq");
  ck(cudaMalloc(&d.xd, static_cast<size_t>(P.N) * P.K / 32 * 4), "xd");
  ck(cudaMalloc(&d.hq, pairs * P.I), "hq");
  ck(cudaMalloc(&d.hd, pairs * P.I / 32 * 4), "hd");
  ck(cudaMalloc(&d.y, pairs * P.K * 4), "y");
  ck(cudaMalloc(&d.out, static_cast<size_t>(P.N) * P.K * 4), "out");
  d.tiles = Tiles{up(h.expert), up(h.first), up(h.count), up(h.pair_of)};
  d.ntiles = static_cast<int>(h.expert.size());
  return d;
}

// --- host reference (double) ---------------------------------------------------------------------------------------
const double kE2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0., -0.5, -1, -1.5, -2, -3, -4, -6};

void q8_host(const float* x, int K, std::vector<int8_t>& q, std::vector<float>& d) {
  q.assign(K, 0);
  d.assign(K / 32, 0.f);
  for (int b = 0; b < K / 32; ++b) {
    float m = 0.f;
    for (int i = 0; i < 32; ++i) m = std::max(m, std::fabs(x[b * 32 + i]));
    if (!(m >= 0x1p-120f)) continue;
    const float inv = 127.f / m;
    for (int i = 0; i < 32; ++i) q[b * 32 + i] = static_cast<int8_t>(std::nearbyint(x[b * 32 + i] * inv));
    d[b] = m / 127.f;
  }
}

// One row (K inputs) against q8 x, as the kernel's numerics (exact int dots, scales in double) and unquantised.
void row_ref(const uint8_t* w, const uint8_t* s, int K, const std::vector<int8_t>& q, const std::vector<float>& d,
             const float* x, double& yq, double& yf) {
  yq = yf = 0.0;
  for (int g = 0; g < K / 32; ++g) {
    const double sc = std::ldexp(1.0, static_cast<int>(s[g]) - 127);
    int64_t dot = 0;
    for (int i = 0; i < 32; ++i) {
      const uint8_t b = w[g * 16 + i / 2];
      const int code = (i & 1) ? (b >> 4) : (b & 15);
      const double v = kE2m1[code];
      dot += static_cast<int64_t>(std::llround(2 * v)) * q[g * 32 + i];
      yf += v * sc * x[g * 32 + i];
    }
    yq += static_cast<double>(dot) * 0.5 * sc * d[g];
  }
}

// Host self-test of the decode arithmetic (prmt and dp4a as the PTX ISA defines them): group_dot against the E2M1
// table on random words and activations, every code in every position -- no GPU needed.
int selftest() {
  std::mt19937 rng(17);
  int64_t bad = 0, n = 0;
  for (int it = 0; it < 200000; ++it) {
    uint32_t wv[4];
    int8_t xv[32];
    for (auto& v : wv) v = static_cast<uint32_t>(rng());
    for (auto& v : xv) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    if (it < 16)
      for (auto& v : wv) v = 0x11111111u * static_cast<uint32_t>(it);  // each code in all 8 nibbles
    int64_t ref = 0;
    for (int i = 0; i < 32; ++i) {
      const uint8_t b = static_cast<uint8_t>(wv[i / 8] >> (8 * ((i % 8) / 2)));
      const int code = (i & 1) ? (b >> 4) : (b & 15);
      ref += std::llround(2 * kE2m1[code]) * xv[i];
    }
    int xw[8];
    std::memcpy(xw, xv, 32);
    const uint4 w{wv[0], wv[1], wv[2], wv[3]};
    const int4 x0{xw[0], xw[1], xw[2], xw[3]}, x1{xw[4], xw[5], xw[6], xw[7]};
    bad += group_dot(w, x0, x1, 0x03020100u) != ref;
    ++n;
  }
  std::printf("selftest: %lld of %lld group dots differ from the E2M1 table's\n", static_cast<long long>(bad),
              static_cast<long long>(n));
  return bad ? 1 : 0;
}

int check() {
  const Problem P{24, 512, 1024, 12};  // 12 tokens x 16 of 24 experts: tiles of 1..4 pairs; GPL 4 / 2
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(P.N) * P.K);
  for (auto& v : x) v = nd(rng);
  for (int i = 0; i < 32; ++i) x[64 + i] = 0.f;  // a zero block (q = 0, d = 0)
  const HostRouting h = route(P, 11);
  Device d = make_device(P, h, x, 1234);
  run_layer<4, 2, 1>(P, d, h, nullptr, true, true, true);
  ck(cudaDeviceSynchronize(), "run");
  const int64_t pairs = static_cast<int64_t>(P.N) * kTopK;
  std::vector<uint8_t> w1(static_cast<size_t>(P.E) * 2 * P.I * P.K / 2), s1(static_cast<size_t>(P.E) * 2 * P.I * P.K / 32),
      w2(static_cast<size_t>(P.E) * P.K * P.I / 2), s2(static_cast<size_t>(P.E) * P.K * P.I / 32);
  ck(cudaMemcpy(w1.data(), d.w1, w1.size(), cudaMemcpyDeviceToHost), "w1");
  ck(cudaMemcpy(s1.data(), d.s1, s1.size(), cudaMemcpyDeviceToHost), "s1");
  ck(cudaMemcpy(w2.data(), d.w2, w2.size(), cudaMemcpyDeviceToHost), "w2");
  ck(cudaMemcpy(s2.data(), d.s2, s2.size(), cudaMemcpyDeviceToHost), "s2");
  std::vector<float> y(pairs * P.K), out(static_cast<size_t>(P.N) * P.K), hd_gpu(pairs * P.I / 32);
  std::vector<int8_t> hq_gpu(pairs * P.I);
  ck(cudaMemcpy(y.data(), d.y, y.size() * 4, cudaMemcpyDeviceToHost), "y");
  ck(cudaMemcpy(out.data(), d.out, out.size() * 4, cudaMemcpyDeviceToHost), "out");
  ck(cudaMemcpy(hq_gpu.data(), d.hq, hq_gpu.size(), cudaMemcpyDeviceToHost), "hq");
  ck(cudaMemcpy(hd_gpu.data(), d.hd, hd_gpu.size() * 4, cudaMemcpyDeviceToHost), "hd");
  std::vector<int> pair_expert(pairs, -1);
  for (size_t t = 0; t < h.expert.size(); ++t)
    for (int i = 0; i < h.count[t]; ++i) pair_expert[h.pair_of[h.first[t] + i]] = h.expert[t];
  // h: the GPU's q8 hidden rows against the reference's (its g, u in double: a code may differ by one where h sits
  // on a rounding boundary); y: the GPU's down products of the GPU's own q8 hidden rows (exact int dots: ~1e-6);
  // the unquantised chain (x and h in fp32 through exact E2M1 products): the q8 class's distance.
  double err_hd = 0, err_q = 0, err_f = 0, mx = 0, err_out = 0, mx_out = 0;
  int64_t hq_off = 0, hq_far = 0;
  std::vector<double> outq(static_cast<size_t>(P.N) * P.K, 0.0);
  for (int64_t pr = 0; pr < pairs; ++pr) {
    const int n = static_cast<int>(pr / kTopK), e = pair_expert[pr];
    const float* xn = &x[static_cast<size_t>(n) * P.K];
    std::vector<int8_t> q;
    std::vector<float> dx;
    q8_host(xn, P.K, q, dx);
    std::vector<float> hq_in(P.I), hf(P.I);
    for (int r = 0; r < P.I; ++r) {
      double gq, gf, uq, uf;
      const size_t rg = static_cast<size_t>(e) * 2 * P.I + r, ru = rg + P.I;
      row_ref(&w1[rg * P.K / 2], &s1[rg * P.K / 32], P.K, q, dx, xn, gq, gf);
      row_ref(&w1[ru * P.K / 2], &s1[ru * P.K / 32], P.K, q, dx, xn, uq, uf);
      hq_in[r] = static_cast<float>(gq / (1.0 + std::exp(-gq)) * uq);
      hf[r] = static_cast<float>(gf / (1.0 + std::exp(-gf)) * uf);
    }
    std::vector<int8_t> hq;
    std::vector<float> hd;
    q8_host(hq_in.data(), P.I, hq, hd);
    const std::vector<int8_t> hq_g(hq_gpu.begin() + pr * P.I, hq_gpu.begin() + (pr + 1) * P.I);
    const std::vector<float> hd_g(hd_gpu.begin() + pr * P.I / 32, hd_gpu.begin() + (pr + 1) * P.I / 32);
    for (int i = 0; i < P.I; ++i) {
      const int dq = std::abs(hq_g[i] - hq[i]);
      hq_off += dq != 0;
      hq_far += dq > 1;
    }
    for (int b = 0; b < P.I / 32; ++b) err_hd = std::max(err_hd, static_cast<double>(std::fabs(hd_g[b] - hd[b]) / std::max(hd[b], 1e-30f)));
    for (int r = 0; r < P.K; ++r) {
      double yq, yf, unused;
      const size_t rr = static_cast<size_t>(e) * P.K + r;
      row_ref(&w2[rr * P.I / 2], &s2[rr * P.I / 32], P.I, hq_g, hd_g, hq_in.data(), yq, unused);
      row_ref(&w2[rr * P.I / 2], &s2[rr * P.I / 32], P.I, hq_g, hd_g, hf.data(), unused, yf);
      const double got = y[pr * P.K + r];
      err_q = std::max(err_q, std::fabs(got - yq));
      err_f = std::max(err_f, std::fabs(got - yf));
      mx = std::max(mx, std::fabs(yq));
      outq[static_cast<size_t>(n) * P.K + r] += static_cast<double>(h.p[pr]) * got;
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    err_out = std::max(err_out, std::fabs(out[i] - outq[i]));
    mx_out = std::max(mx_out, std::fabs(outq[i]));
  }
  int tiles_by[kMaxT + 1] = {};
  for (int c : h.count) ++tiles_by[c];
  std::printf("check: %d tiles (by pairs: 1:%d 2:%d 3:%d 4:%d); hidden q8 codes off by one %lld of %lld (by more %lld), "
              "scales rel %.2e; per pair y vs the q8 reference rel of max %.3e, vs the unquantised chain %.3e; combined "
              "%.3e\n",
              d.ntiles, tiles_by[1], tiles_by[2], tiles_by[3], tiles_by[4], static_cast<long long>(hq_off),
              static_cast<long long>(pairs * P.I), static_cast<long long>(hq_far), err_hd, err_q / mx, err_f / mx,
              err_out / mx_out);
  const bool ok = hq_far == 0 && hq_off * 1000 < pairs * P.I && err_hd < 1e-4 && err_q / mx < 1e-5 &&
                  err_out / mx_out < 1e-5 && err_f / mx < 0.1 && err_f / mx > 1e-4;
  std::printf("check %s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}

template <int MINB, int MINBX = MINB>
void time_variant(const Problem& P, const Device& d, const HostRouting& h, int reps) {
  const double expert_bytes = 3.0 * P.I * P.K * (0.5 + 1.0 / 32);
  const double gu_bytes = h.distinct * expert_bytes * 2 / 3, dn_bytes = h.distinct * expert_bytes / 3;
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "ev");
  ck(cudaEventCreate(&e1), "ev");
  auto timed = [&](bool q, bool g, bool dn) {
    run_layer<14, 12, MINB, MINBX>(P, d, h, nullptr, true, true, true);  // warm, and the later stages' inputs
    ck(cudaEventRecord(e0), "rec");
    for (int r = 0; r < reps; ++r) run_layer<14, 12, MINB, MINBX>(P, d, h, nullptr, q, g, dn);
    ck(cudaEventRecord(e1), "rec");
    ck(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    return 1e3 * ms / reps;
  };
  const double tq = timed(true, false, false), tg = timed(false, true, false), td = timed(false, false, true);
  const double tall = timed(true, true, true);
  ck(cudaGetLastError(), "time");
  int tiles_by[kMaxT + 1] = {};
  for (int c : h.count) ++tiles_by[c];
  std::printf("time n=%d minb=%d/%d: %d experts (most pairs %d; tiles 1:%d 2:%d 3:%d 4:%d); quant %.1f us; gate|up+glu "
              "%.1f us = %.0f GB/s; down+combine %.1f us = %.0f GB/s; layer %.1f us = %.0f GB/s of %.1f MB\n",
              P.N, MINB, MINBX, h.distinct, h.max_pairs, tiles_by[1], tiles_by[2], tiles_by[3], tiles_by[4], tq, tg,
              gu_bytes / tg / 1e3, td, dn_bytes / td / 1e3, tall, (gu_bytes + dn_bytes) / tall / 1e3,
              (gu_bytes + dn_bytes) / 1e6);
}

int time_run(int N, int reps) {
  const Problem P{896, 3072, 3584, N};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(N) * P.K);
  for (auto& v : x) v = nd(rng);
  const HostRouting h = route(P, 5);
  Device d = make_device(P, h, x, 99);
  ck(cudaDeviceSynchronize(), "fill");
  time_variant<1>(P, d, h, reps);
  time_variant<2>(P, d, h, reps);
  time_variant<3>(P, d, h, reps);
  time_variant<2, 1>(P, d, h, reps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "selftest") return selftest();
  if (argc >= 2 && std::string(argv[1]) == "check") return check();
  if (argc >= 3 && std::string(argv[1]) == "time") {
    const int n = std::atoi(argv[2]), reps = argc >= 4 ? std::atoi(argv[3]) : 20;
    if (n < 1 || n > 4096 || reps < 1 || reps > 10000) {
      std::fprintf(stderr, "time: N in 1..4096 and REPS in 1..10000 (got %s%s%s)\n", argv[2], argc >= 4 ? " " : "",
                   argc >= 4 ? argv[3] : "");
      return 2;
    }
    return time_run(n, reps);
  }
  std::fprintf(stderr, "usage: %s selftest | check | time N [REPS]\n", argv[0]);
  return 2;
}

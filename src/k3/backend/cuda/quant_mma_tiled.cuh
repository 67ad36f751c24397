// The tile-major form of the dense K-quant tensor-core GEMV (quant_mma.cuh's decoders and numerics over a copy of the
// matrix laid out for the kernel's lanes). Included by quant_gemv_mma.cu and scripts/perf/q6k_tiled_bench.cu.
//
// Why: the KSplit kernel reads the blocks as stored, so each lane gathers a few bytes of one of 8 rows per load: for
// Q6_K (210-byte blocks, 2-byte aligned: two aligned loads and a funnel shift per 4-byte field) 34 load instructions
// per lane and unit (16 rows x 128 columns), 7.4 sectors per request on the 163840 x 2304 head (call s31-1), which
// streams at ~1.5 TB/s (190-210 us for 310 MB); for Q4_K 16 loads per super-block, 8 rows each. Here a copy made once
// at load time stores, per m16 tile and step of columns, exactly the bytes each lane decodes, lane-interleaved, so a
// warp's loads are whole 512-byte runs (or one 16-byte field per row pair, shared by its 4 lanes). The decode is the
// KSplit decoder's own apply (the same values reach the same MMAs).
//
// Layouts (P::kRecBytes per (tile, step); tile t = rows 16 t .. 16 t + 15, rows past the matrix repeat its last row;
// the steps of a tile consecutive; lane L = 4 g + tq holds rows g and g + 8, as in KSplit):
//   Q6_K, step = unit = 128 columns (half a super-block), 1696 bytes for 16 x 105 stored (+1%):
//     [0, 512) lane L's ql[0..3] of row g; [512, 1024) of row g + 8; [1024, 1536) its qh[0..1] of row g, then g + 8;
//     [1536, 1664) per g: sc[0..1] of row g, then g + 8; [1664, 1696) per g: d of row g, d of row g + 8 (f16 bits).
//   Q4_K / Q5_K, step = super-block (4 units of 64 columns), 2304 / 2816 bytes (= stored):
//     [0, 256) per g: the 16-byte head (d, dmin, scales) of row g, then of row g + 8;
//     [256 + 512 j, + 512) unit j: lane L's 8 qs bytes of row g, then of row g + 8;
//     Q5_K [2304, 2816): lane L's 8 qh bytes of row g, then of row g + 8.
//
// Work split: a block's 8 warps cover TPB tiles (TPB = 1, 2, 4 or 8), 8 / TPB warps per tile taking its steps in turn
// (warp w of a tile: steps w, w + 8 / TPB, ...), their sums meeting in shared memory in a fixed tree. For Q6_K, TPB = 1
// is KSplit's split and tree with MT = 1: the same bits (tested). Each warp loads its next step before decoding the
// current one. The copy is written by tile_kernel once at upload and synchronised before any step, so, like the stored
// weights, it may be read before pdl::wait() (pdl.cuh's contract).
#pragma once
#include "k3/backend/cuda/quant_mma.cuh"

namespace k3::cuda::qmma {
namespace {

__device__ __forceinline__ uint4 ld_stream_u4(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

struct TiledQ6K {
  using Dec = MmaQ6K;
  static constexpr int kStepCols = 128;
  static constexpr int64_t kRecBytes = 1696;
  struct Rec {
    uint4 q0, q1, qh, sc;
    uint32_t d;
  };
  __device__ static Rec load(const uint8_t* rec, int lane, int g) {
    Rec r;
    r.q0 = ld_stream_u4(rec + 16 * lane);
    r.q1 = ld_stream_u4(rec + 512 + 16 * lane);
    r.qh = ld_stream_u4(rec + 1024 + 16 * lane);
    r.sc = __ldg(reinterpret_cast<const uint4*>(rec + 1536) + g);
    r.d = __ldg(reinterpret_cast<const uint32_t*>(rec + 1664) + g);
    return r;
  }
  template <int NT, bool SPLIT, class XV>
  __device__ static void apply(const Rec& t, int64_t step, const XV& xv, int tq, float (&acc)[1][NT][4]) {
    MmaQ6K::Raw r[1][2];
    r[0][0].ql[0] = t.q0.x, r[0][0].ql[1] = t.q0.y, r[0][0].ql[2] = t.q0.z, r[0][0].ql[3] = t.q0.w;
    r[0][1].ql[0] = t.q1.x, r[0][1].ql[1] = t.q1.y, r[0][1].ql[2] = t.q1.z, r[0][1].ql[3] = t.q1.w;
    r[0][0].qh[0] = t.qh.x, r[0][0].qh[1] = t.qh.y, r[0][1].qh[0] = t.qh.z, r[0][1].qh[1] = t.qh.w;
    r[0][0].sc[0] = t.sc.x, r[0][0].sc[1] = t.sc.y, r[0][1].sc[0] = t.sc.z, r[0][1].sc[1] = t.sc.w;
    r[0][0].d = f16_bits(t.d & 0xFFFF);
    r[0][1].d = f16_bits(t.d >> 16);
    MmaQ6K::apply<NT, 1, SPLIT>(r, step, xv, tq, acc);
  }
  // One warp writes record (t, step): each lane its fields as MmaQ6K::load reads them from rows a (g) and b (g + 8).
  __device__ static void write(const uint8_t* a, const uint8_t* b, int64_t step, int lane, int g, int tq, uint8_t* o) {
    const MmaQ6K::Raw r0 = MmaQ6K::load(a, step, tq), r1 = MmaQ6K::load(b, step, tq);
    reinterpret_cast<uint4*>(o)[lane] = make_uint4(r0.ql[0], r0.ql[1], r0.ql[2], r0.ql[3]);
    reinterpret_cast<uint4*>(o + 512)[lane] = make_uint4(r1.ql[0], r1.ql[1], r1.ql[2], r1.ql[3]);
    reinterpret_cast<uint4*>(o + 1024)[lane] = make_uint4(r0.qh[0], r0.qh[1], r1.qh[0], r1.qh[1]);
    if (tq != 0) return;
    reinterpret_cast<uint4*>(o + 1536)[g] = make_uint4(r0.sc[0], r0.sc[1], r1.sc[0], r1.sc[1]);
    const uint8_t* da = a + (step >> 1) * MmaQ6K::kBlockBytes + 208;
    const uint8_t* db = b + (step >> 1) * MmaQ6K::kBlockBytes + 208;
    reinterpret_cast<uint32_t*>(o + 1664)[g] = (da[0] | (da[1] << 8)) | (static_cast<uint32_t>(db[0] | (db[1] << 8)) << 16);
  }
};

template <bool kFifth>
struct TiledQ45 {
  using Dec = MmaQ45<kFifth>;
  static constexpr int kStepCols = 256;
  static constexpr int64_t kRecBytes = kFifth ? 2816 : 2304;
  struct Rec {
    uint4 h0, h1, q[4], qh;
  };
  __device__ static Rec load(const uint8_t* rec, int lane, int g) {
    Rec r;
    r.h0 = __ldg(reinterpret_cast<const uint4*>(rec) + 2 * g);
    r.h1 = __ldg(reinterpret_cast<const uint4*>(rec) + 2 * g + 1);
#pragma unroll
    for (int j = 0; j < 4; ++j) r.q[j] = ld_stream_u4(rec + 256 + 512 * j + 16 * lane);
    r.qh = kFifth ? ld_stream_u4(rec + 2304 + 16 * lane) : make_uint4(0, 0, 0, 0);
    return r;
  }
  template <int NT, bool SPLIT, class XV>
  __device__ static void apply(const Rec& t, int64_t step, const XV& xv, int tq, float (&acc)[1][NT][4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      typename Dec::Raw r[1][2];
      r[0][0].h = t.h0, r[0][1].h = t.h1;
      r[0][0].q = make_uint2(t.q[j].x, t.q[j].y), r[0][1].q = make_uint2(t.q[j].z, t.q[j].w);
      r[0][0].qh = make_uint2(t.qh.x, t.qh.y), r[0][1].qh = make_uint2(t.qh.z, t.qh.w);
      Dec::template apply<NT, 1, SPLIT>(r, 4 * step + j, xv, tq, acc);
    }
  }
  __device__ static void write(const uint8_t* a, const uint8_t* b, int64_t step, int lane, int g, int tq, uint8_t* o) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const typename Dec::Raw r0 = Dec::load(a, 4 * step + j, tq), r1 = Dec::load(b, 4 * step + j, tq);
      reinterpret_cast<uint4*>(o + 256 + 512 * j)[lane] = make_uint4(r0.q.x, r0.q.y, r1.q.x, r1.q.y);
      if (j == 0 && kFifth) reinterpret_cast<uint4*>(o + 2304)[lane] = make_uint4(r0.qh.x, r0.qh.y, r1.qh.x, r1.qh.y);
      if (j == 0 && tq == 0) {
        reinterpret_cast<uint4*>(o)[2 * g] = r0.h;
        reinterpret_cast<uint4*>(o)[2 * g + 1] = r1.h;
      }
    }
  }
};

template <class P>
inline int64_t tiled_bytes(int64_t rows, int64_t cols) { return (rows + 15) / 16 * (cols / P::kStepCols) * P::kRecBytes; }

// One warp per (tile, step).
template <class P>
__global__ void __launch_bounds__(256) tile_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int64_t steps,
                                                   int64_t tiles, uint8_t* __restrict__ out) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (item >= tiles * steps) return;
  const int64_t t = item / steps, step = item % steps;
  P::write(w + min(16 * t + g, rows - 1) * row_bytes, w + min(16 * t + g + 8, rows - 1) * row_bytes, step, lane, g, tq,
           out + item * P::kRecBytes);
}

// GROUPED: the launch's matrices from grp (w = their tiled copies; blocks [first_block[m], first_block[m + 1]) take matrix
// m), the tw / rows / y arguments unused.
template <class P, int NT, bool SPLIT, int TPB, bool GROUPED = false>
__global__ void __launch_bounds__(kWarps * 32) quant_mma_tiled_kernel(const uint8_t* tw, int64_t rows, int64_t steps,
                                                                       QuantMmaActs a, int64_t ldx, float* y,
                                                                       const __grid_constant__ GroupParam<GROUPED> grp) {
  static_assert(TPB == 1 || TPB == 2 || TPB == 4 || TPB == 8, "tiles per block");
  constexpr int kWpt = kWarps / TPB, R = NT * 4;
  __shared__ float red[kWarps / 2][R][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  const int sub = warp % kWpt;
  int64_t bx = blockIdx.x;
  if constexpr (GROUPED) group_member(grp, bx, tw, rows, y);
  const int64_t tile = bx * TPB + warp / kWpt, tiles = (rows + 15) / 16;
  const bool live = tile < tiles;
  const uint8_t* base = tw + (live ? tile : 0) * steps * P::kRecBytes;
  if (live && sub < steps) pdl::prefetch_l2(base + sub * P::kRecBytes, P::kRecBytes, lane, 32);  // its first record
  pdl::begin();
  Xv<NT, SPLIT, false> xv;
  xv.init(a, ldx, nullptr, 1, 0, a.n, g, tq);
  float acc[1][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[0][nt][0] = acc[0][nt][1] = acc[0][nt][2] = acc[0][nt][3] = 0.f;
  if (live && sub < steps) {
    typename P::Rec cur = P::load(base + sub * P::kRecBytes, lane, g);
#pragma unroll 1
    for (int64_t s = sub; s < steps; s += kWpt) {
      const int64_t sn = s + kWpt < steps ? s + kWpt : s;
      const typename P::Rec nxt = P::load(base + sn * P::kRecBytes, lane, g);
      P::template apply<NT, SPLIT>(cur, s, xv, tq, acc);
      cur = nxt;
    }
  }
  // The tile's kWpt warps' sums in reduce_warps' tree (sub += sub + h for h = kWpt / 2 .. 1).
  float* flat = &acc[0][0][0];
  const int set = warp / kWpt;  // the block's tile this warp works on
#pragma unroll
  for (int half = kWpt / 2; half >= 1; half >>= 1) {
    if (sub >= half && sub < 2 * half)
#pragma unroll
      for (int i = 0; i < R; ++i) red[set * (kWpt / 2) + sub - half][i][lane] = flat[i];
    __syncthreads();
    if (sub < half)
#pragma unroll
      for (int i = 0; i < R; ++i) flat[i] += red[set * (kWpt / 2) + sub][i][lane];
    __syncthreads();
  }
  if (sub != 0 || !live) return;
  store_tile<NT>(acc[0], y, rows, a.n, 16 * tile, g, tq);
}

template <class P>
cudaError_t make_tiled(const uint8_t* w, int64_t rows, int64_t cols, int64_t row_bytes, uint8_t* out, cudaStream_t s) {
  const int64_t steps = cols / P::kStepCols, tiles = (rows + 15) / 16, items = tiles * steps;
  if ((items + 7) / 8 > 0x7fffffff) return cudaErrorInvalidValue;
  tile_kernel<P><<<static_cast<unsigned>((items + 7) / 8), 256, 0, s>>>(w, rows, row_bytes, steps, tiles, out);
  return cudaGetLastError();
}

template <class P, int NT, bool SPLIT, int TPB>
cudaError_t launch_tiled(const uint8_t* tw, int64_t rows, int64_t cols, const QuantMmaActs& a, int64_t ldx, float* y, cudaStream_t s) {
  const int64_t blocks = ((rows + 15) / 16 + TPB - 1) / TPB;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return pdl::launch(quant_mma_tiled_kernel<P, NT, SPLIT, TPB>, static_cast<unsigned>(blocks), kWarps * 32, 0, s, tw, rows,
                     cols / P::kStepCols, a, ldx, y, NoGroup{});
}

// The group's matrices in one launch (g.w = their tiled copies; first_block filled here).
template <class P, int NT, bool SPLIT, int TPB>
cudaError_t launch_tiled_group(DenseGroup g, int64_t cols, const QuantMmaActs& a, int64_t ldx, cudaStream_t s) {
  int64_t blocks = 0;
  for (int m = 0; m < g.count; ++m) {
    g.first_block[m] = blocks;
    blocks += ((g.rows[m] + 15) / 16 + TPB - 1) / TPB;
  }
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  if (blocks == 0) return cudaSuccess;
  return pdl::launch(quant_mma_tiled_kernel<P, NT, SPLIT, TPB, true>, static_cast<unsigned>(blocks), kWarps * 32, 0, s,
                     static_cast<const uint8_t*>(nullptr), int64_t{0}, cols / P::kStepCols, a, ldx, static_cast<float*>(nullptr), g);
}

// The tiled policy of a KSplit decoder.
template <class Dec>
struct TiledOf;
template <>
struct TiledOf<MmaQ6K> {
  using type = TiledQ6K;
};
template <bool kFifth>
struct TiledOf<MmaQ45<kFifth>> {
  using type = TiledQ45<kFifth>;
};

}  // namespace
}  // namespace k3::cuda::qmma

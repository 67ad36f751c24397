// The tile-major form of the dense Q6_K tensor-core GEMV (quant_mma.cuh's decoder and numerics over a copy of the
// matrix laid out for the kernel's lanes). Included by quant_gemv_mma.cu and scripts/perf/q6k_tiled_bench.cu.
//
// Why: the KSplit kernel reads Q6_K as stored -- 210-byte blocks, 2-byte aligned -- so each lane gathers 4 bytes of
// one of 8 rows per load, two aligned loads and a funnel shift per field: 34 load instructions per lane and unit (16
// rows x 128 columns), 7.4 sectors per request on the 163840 x 2304 head (call s31-1), which streams at ~1.5 TB/s
// (190-210 us for 310 MB). Here a copy made once at load time stores, per m16 tile and unit, exactly the bytes each
// lane decodes, lane-interleaved: three coalesced 16-byte loads (ql of row g, ql of row g + 8, both rows' qh), one
// 16-byte load of the two rows' scales (shared by the 4 lanes of a row pair) and one 4-byte load of their d -- 5
// loads instead of 34. The decode is MmaQ6K::apply itself (the same values reach the same MMAs).
//
// Layout (kTiledUnitBytes per (tile, unit); tile t = rows 16 t .. 16 t + 15, rows past the matrix repeat its last
// row; the units of a tile consecutive):
//   [0, 512)     lane L's ql[0..3] of row 16 t + g          (g = L / 4, tq = L % 4: the KSplit lane's fields)
//   [512, 1024)  lane L's ql[0..3] of row 16 t + g + 8
//   [1024, 1536) lane L's qh[0..1] of row g, then of row g + 8
//   [1536, 1664) per g: sc[0..1] of row g, then of row g + 8  (16 bytes)
//   [1664, 1696) per g: d of row g, d of row g + 8            (f16 bits)
// 1696 bytes for 16 x 105 stored: +1%.
//
// Work split: a block's 8 warps cover TPB tiles (TPB = 1, 2, 4 or 8), 8 / TPB warps per tile taking its units in
// turn (warp w of a tile: units w, w + 8 / TPB, ...), their sums meeting in shared memory in a fixed tree. TPB = 1 is
// KSplit's split and tree with MT = 1: the same bits (tested). Each warp loads its next unit before decoding the
// current one.
#pragma once
#include "k3/backend/cuda/quant_mma.cuh"

namespace k3::cuda::qmma {
namespace {

constexpr int64_t kTiledUnitBytes = 1696;

// Bytes of the tiled copy of a rows x cols Q6_K matrix.
inline int64_t tiled_bytes(int64_t rows, int64_t cols) { return (rows + 15) / 16 * (cols / 128) * kTiledUnitBytes; }

// One warp per (tile, unit): the lane's fields read as the KSplit kernel reads them (MmaQ6K::load), written where the
// tiled kernel reads them.
__global__ void __launch_bounds__(256) q6k_tile_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes,
                                                        int64_t units, int64_t tiles, uint8_t* __restrict__ out) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (item >= tiles * units) return;
  const int64_t t = item / units, u = item % units;
  const MmaQ6K::Raw r0 = MmaQ6K::load(w + min(16 * t + g, rows - 1) * row_bytes, u, tq);
  const MmaQ6K::Raw r1 = MmaQ6K::load(w + min(16 * t + g + 8, rows - 1) * row_bytes, u, tq);
  uint8_t* o = out + item * kTiledUnitBytes;
  reinterpret_cast<uint4*>(o)[lane] = make_uint4(r0.ql[0], r0.ql[1], r0.ql[2], r0.ql[3]);
  reinterpret_cast<uint4*>(o + 512)[lane] = make_uint4(r1.ql[0], r1.ql[1], r1.ql[2], r1.ql[3]);
  reinterpret_cast<uint4*>(o + 1024)[lane] = make_uint4(r0.qh[0], r0.qh[1], r1.qh[0], r1.qh[1]);
  if (tq == 0) {
    reinterpret_cast<uint4*>(o + 1536)[g] = make_uint4(r0.sc[0], r0.sc[1], r1.sc[0], r1.sc[1]);
    const uint8_t* b = w + min(16 * t + g, rows - 1) * row_bytes + (u >> 1) * MmaQ6K::kBlockBytes + 208;
    const uint8_t* c = w + min(16 * t + g + 8, rows - 1) * row_bytes + (u >> 1) * MmaQ6K::kBlockBytes + 208;
    const uint32_t d0 = b[0] | (b[1] << 8), d1 = c[0] | (c[1] << 8);
    reinterpret_cast<uint32_t*>(o + 1664)[g] = d0 | (d1 << 16);
  }
}

// A lane's fields of one (tile, unit) record.
struct TiledRaw {
  uint4 q0, q1, qh, sc;
  uint32_t d;
};
__device__ __forceinline__ uint4 ld_stream_u4(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ TiledRaw tiled_load(const uint8_t* rec, int lane, int g) {
  TiledRaw r;
  r.q0 = ld_stream_u4(rec + 16 * lane);
  r.q1 = ld_stream_u4(rec + 512 + 16 * lane);
  r.qh = ld_stream_u4(rec + 1024 + 16 * lane);
  r.sc = __ldg(reinterpret_cast<const uint4*>(rec + 1536) + g);
  r.d = __ldg(reinterpret_cast<const uint32_t*>(rec + 1664) + g);
  return r;
}
// The KSplit kernel's Raw pair (rows g, g + 8) from a tiled record.
__device__ __forceinline__ void tiled_unpack(const TiledRaw& t, MmaQ6K::Raw (&r)[1][2]) {
  r[0][0].ql[0] = t.q0.x, r[0][0].ql[1] = t.q0.y, r[0][0].ql[2] = t.q0.z, r[0][0].ql[3] = t.q0.w;
  r[0][1].ql[0] = t.q1.x, r[0][1].ql[1] = t.q1.y, r[0][1].ql[2] = t.q1.z, r[0][1].ql[3] = t.q1.w;
  r[0][0].qh[0] = t.qh.x, r[0][0].qh[1] = t.qh.y, r[0][1].qh[0] = t.qh.z, r[0][1].qh[1] = t.qh.w;
  r[0][0].sc[0] = t.sc.x, r[0][0].sc[1] = t.sc.y, r[0][1].sc[0] = t.sc.z, r[0][1].sc[1] = t.sc.w;
  r[0][0].d = f16_bits(t.d & 0xFFFF);
  r[0][1].d = f16_bits(t.d >> 16);
}

template <int NT, bool SPLIT, int TPB>
__global__ void __launch_bounds__(kWarps * 32) quant_mma_tiled_kernel(const uint8_t* __restrict__ tw, int64_t rows, int64_t units,
                                                                       QuantMmaActs a, int64_t ldx, float* __restrict__ y) {
  static_assert(TPB == 1 || TPB == 2 || TPB == 4 || TPB == 8, "tiles per block");
  constexpr int kWpt = kWarps / TPB, R = NT * 4;
  __shared__ float red[kWarps / 2][R][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  const int sub = warp % kWpt;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * TPB + warp / kWpt, tiles = (rows + 15) / 16;
  const bool live = tile < tiles;
  const uint8_t* base = tw + (live ? tile : 0) * units * kTiledUnitBytes;
  if (live && sub < units) pdl::prefetch_l2(base + sub * kTiledUnitBytes, kTiledUnitBytes, lane, 32);  // its first record
  pdl::begin();
  Xv<NT, SPLIT, false> xv;
  xv.init(a, ldx, nullptr, 1, 0, a.n, g, tq);
  float acc[1][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[0][nt][0] = acc[0][nt][1] = acc[0][nt][2] = acc[0][nt][3] = 0.f;
  if (live && sub < units) {
    TiledRaw cur = tiled_load(base + sub * kTiledUnitBytes, lane, g);
#pragma unroll 1
    for (int64_t u = sub; u < units; u += kWpt) {
      const int64_t un = u + kWpt < units ? u + kWpt : u;
      const TiledRaw nxt = tiled_load(base + un * kTiledUnitBytes, lane, g);
      MmaQ6K::Raw r[1][2];
      tiled_unpack(cur, r);
      MmaQ6K::apply<NT, 1, SPLIT>(r, u, xv, tq, acc);
      cur = nxt;
    }
  }
  // The tile's kWpt warps' sums in reduce_warps' tree (sub += sub + h for h = kWpt / 2 .. 1).
  float* flat = &acc[0][0][0];
  const int grp = warp / kWpt;
#pragma unroll
  for (int half = kWpt / 2; half >= 1; half >>= 1) {
    if (sub >= half && sub < 2 * half)
#pragma unroll
      for (int i = 0; i < R; ++i) red[grp * (kWpt / 2) + sub - half][i][lane] = flat[i];
    __syncthreads();
    if (sub < half)
#pragma unroll
      for (int i = 0; i < R; ++i) flat[i] += red[grp * (kWpt / 2) + sub][i][lane];
    __syncthreads();
  }
  if (sub != 0 || !live) return;
  store_tile<NT>(acc[0], y, rows, a.n, 16 * tile, g, tq);
}

template <int NT, bool SPLIT, int TPB>
cudaError_t launch_tiled(const uint8_t* tw, int64_t rows, int64_t cols, const QuantMmaActs& a, int64_t ldx, float* y, cudaStream_t s) {
  const int64_t blocks = ((rows + 15) / 16 + TPB - 1) / TPB;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return pdl::launch(quant_mma_tiled_kernel<NT, SPLIT, TPB>, static_cast<unsigned>(blocks), kWarps * 32, 0, s, tw, rows,
                     cols / MmaQ6K::kUnitCols, a, ldx, y);
}

}  // namespace
}  // namespace k3::cuda::qmma

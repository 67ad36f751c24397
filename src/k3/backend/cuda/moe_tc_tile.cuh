// The tensor-core expert tile (moe_kernels.cu's header comment, "Tensor-core path"), shared by the two
// translation units that launch it: moe_kernels.cu (bf16 and MXFP4 experts) and quant_moe_tc.cu (GGUF block
// experts, one instantiation per format: kept out of moe_kernels.cu so the two compile in parallel).
// Device code in an anonymous namespace: each including .cu gets its own copies (no -rdc, no ODR clash).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "k3/backend/cuda/moe_glu.cuh"
#include "k3/backend/cuda/moe_kernels.h"
#include "k3/backend/cuda/mxfp4_decode.cuh"
#include "k3/backend/cuda/mxfp8_quant.h"
#include "k3/backend/cuda/quant_decode_bf16.cuh"
#include "k3/backend/cuda/quant_tables.h"
#include "k3/backend/cuda/pdl.cuh"

namespace k3::cuda {

// Kernel parameters of the expert tiles (SIMT and tensor-core), by value. Outside the anonymous namespace:
// launch_tc_gguf takes one across translation units.
struct TileArgs {
  const void* w0 = nullptr;  // gate (NMAT 2) or down (NMAT 1): [E][rows][cols] bf16, packed [E][rows][cols/2]
                             // MXFP4, or GGUF blocks [E][rows] of row_bytes
  const uint8_t* s0 = nullptr;  // MXFP4 scales [E][rows][cols/32]
  const void* w1 = nullptr;  // up (NMAT 2)
  const uint8_t* s1 = nullptr;
  int rows = 0, cols = 0;     // one expert matrix: output rows, input width
  const float* in = nullptr;  // GATHER: x [n][cols], row = pair / K; else hidden [P][cols] by slot
  const int32_t* sorted = nullptr;
  int K = 1;
  const int4* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  float* out = nullptr;  // [P][rows] by slot
  GluAct act = GluAct::SiLU;
  float beta = 1.f, lbeta = 1.f;
  int64_t row_bytes = 0;  // GGUF block experts: row_data_bytes(format, cols)
  int64_t mat_bytes = 0;  // GGUF block experts: bytes of one whole stack (w0's; w1's the same), E * rows * row_bytes
  IqTables T{};           // GGUF i-quant codebooks (quant_tables.h)
  // Host side only (the kernels ignore it): MoePrecision::Mxfp8's tile form. When > 0, the launchers round this many
  // rows of the gate+up launch's GLU outputs (out, [rows][I] by slot) to MXFP8 in place before down reads them.
  int64_t mxfp8_hidden_rows = 0;
};

// Between a launcher's gate+up and down launches (MoePrecision::Mxfp8's tile form; nothing when
// gate_up.mxfp8_hidden_rows is 0): the GLU outputs rounded to MXFP8 along each (token, expert) row, as the CPU backend
// rounds them. A plain launch after gate+up: the down launch after it waits for it (stream order, or its PDL wait).
inline cudaError_t round_hidden_mxfp8(const TileArgs& gate_up, cudaStream_t stream) {
  if (gate_up.mxfp8_hidden_rows <= 0) return cudaSuccess;
  return fake_quant_mxfp8_rows(gate_up.out, gate_up.out, gate_up.mxfp8_hidden_rows, gate_up.rows, stream);
}

// The gate+up launch's arguments, and the same turned into the down launch's (both paths share them).
inline TileArgs gate_up_args(const ExpertBank& w, int K, const float* x, GluAct act, float beta, float lbeta,
                             const int32_t* sorted, const int4* tiles, const int32_t* num_tiles, float* hidden) {
  TileArgs a;
  a.w0 = w.gate;
  a.s0 = w.gate_scales;
  a.w1 = w.up;
  a.s1 = w.up_scales;
  a.rows = w.I;
  a.cols = w.X;
  a.in = x;
  a.sorted = sorted;
  a.K = K;
  a.tiles = tiles;
  a.num_tiles = num_tiles;
  a.out = hidden;
  a.act = act;
  a.beta = beta;
  a.lbeta = lbeta;
  return a;
}
inline void to_down_args(TileArgs& a, const ExpertBank& w, const float* hidden, float* y) {
  a.w0 = w.down;
  a.s0 = w.down_scales;
  a.w1 = nullptr;
  a.s1 = nullptr;
  a.rows = w.X;
  a.cols = w.I;
  a.in = hidden;
  a.out = y;
}

namespace {

using moe_dev::glu;  // cpu::silu_glu / cpu::situ_glu (moe_glu.cuh)

// ------------------------------------------------------------------------------- tensor-core expert tiles

constexpr int kTcM = 64;        // pairs per tensor-core tile (plan tile size)
constexpr int kTcBRows = 128;   // weight rows staged per block: 64 gate + 64 up rows, or 128 down rows
constexpr int kTcK = 32;        // input columns per staged chunk (two k16 MMA steps)
constexpr int kTcLd = 40;       // shared row stride in bf16 (80 bytes: an ldmatrix's 8 row reads hit all 32 banks once)
constexpr int kTcThreads = 256; // 8 warps: 2 (M, 32 pairs each) x 4 (N)
// Measured on the H200 (docs/perf/cuda-moe.md): at 2 pairs per expert (Kimi-Linear n=64) the SIMT tiles
// are faster (0.98 vs 1.38 ms); at 8 (n=256) the tensor cores win (1.82 vs 2.66 ms); K3 at 4.6 pairs
// (n=256): 15.5 vs 23.0 ms. Hence 4.
constexpr int kTcMinPairsPerExpert = 4;

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// d += a (16x16 bf16, row) * b (16x8 bf16, col), fp32 accumulate.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Round-to-nearest bf16 of (x, y) packed (x in the low half), and the residuals (x - hi, y - hi) the same way.
__device__ __forceinline__ uint32_t bf16x2_rn(float x, float y, float& rx, float& ry) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  rx = x - __low2float(h);
  ry = y - __high2float(h);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t bf16x2_rn(float x, float y) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Upper halves of two fp32 (exactly bf16-representable) packed: x in the low half.
__device__ __forceinline__ uint32_t pack_hi16(float x, float y) {
  return __byte_perm(__float_as_uint(x), __float_as_uint(y), 0x7632);
}

// The 8 E2M1 values of w times 2^(s-127) (sc = e8m0_scale_x2p14(s)) as 4 packed bf16 pairs, element order.
// Exact: E2M1 values have 2 significant bits, so the fp32 product has none below bf16's mantissa.
__device__ __forceinline__ uint4 e2m1x8_to_bf16(uint32_t w, float sc) {
  float f[8];
  e2m1x8_to_float(w, sc, f);
  return make_uint4(pack_hi16(f[0], f[1]), pack_hi16(f[2], f[3]), pack_hi16(f[4], f[5]), pack_hi16(f[6], f[7]));
}

// Block = (tile of up to 64 pairs of one expert, N-tile). NMAT 2: out[slot][n0 + 0..63] = glu(gate . in, up . in),
// B rows 0..63 gate, 64..127 up; NMAT 1: out[slot][n0 + 0..127] = w0 . in. Warp (wm, wn): pairs wm*32 + 0..31
// (two m16 tiles), four n8 tiles: NMAT 2: gate rows wn*16 + 0..15 and the same up rows (GLU in registers);
// NMAT 1: rows wn*32 + 0..31. The K loop stages 32 columns at a time, double-buffered: the next chunk's global
// loads are issued into registers before the current chunk's MMAs and written to the other buffer after them.
// GGUF raw staging (expert_tc_kernel with a block format): the stored bytes of 256 columns of each of the
// block's 128 weight rows (a "stage": one super-block of the 256-element formats, 8 blocks of the 32-element
// ones) go to shared memory by cp.async a whole stage (8 chunks) ahead, and the chunks decode from there: the
// global latency overlaps 8 chunks of work instead of stalling every chunk (session 18: decoding straight
// from global memory ran the Kimi-Linear shape at 400 GB/s). A row's stage starts at any even byte, so each row
// slot holds its 16-byte-aligned superset (up to 14 bytes before it); the slot stride is an odd number of
// 16-byte units (rows start in different bank groups).
constexpr int kRawStageCols = 256;
template <WeightFormat F>
__host__ __device__ constexpr int raw_stage_bytes() {
  return kRawStageCols / weight_layout(F).block_elems * weight_layout(F).block_bytes;
}
template <WeightFormat F>
__host__ __device__ constexpr int raw_row_stride() {
  const int units = (raw_stage_bytes<F>() + 14 + 15) / 16;
  return 16 * (units % 2 == 0 ? units + 1 : units);
}
template <WeightFormat F>
__host__ __device__ constexpr int raw_smem_bytes() {
  return 2 * kTcBRows * raw_row_stride<F>();
}
extern __shared__ __align__(16) uint8_t moe_tc_raw[];  // [2 slots][kTcBRows][raw_row_stride] (dynamic)

// cp.async of 16 bytes, the part past `valid` (< 16 at the end of a stack) zero-filled.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem), "r"(valid) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// GGUF: stage st of every weight row of a block into slot st & 1 (rows past the matrix are not staged: their B
// pieces are zero). Bytes past the stage's end in the row are copied too (harmless), never past the stack. One
// cp.async group per call (empty past the row's end), so the waits count stages.
template <WeightFormat F, int NMAT>
__device__ __forceinline__ void raw_copy_stage(const TileArgs& a, int st, int e, int n0, int tid) {
  constexpr int kUnits = raw_row_stride<F>() / 16;
  const int rows = a.rows;
  const int64_t row_end = a.row_bytes, sb = static_cast<int64_t>(st) * raw_stage_bytes<F>();
  if (sb < row_end) {
    const int64_t se = row_end < sb + raw_stage_bytes<F>() ? row_end : sb + raw_stage_bytes<F>();
    for (int idx = tid; idx < kTcBRows * kUnits; idx += kTcThreads) {
      const int r = idx / kUnits, u = idx % kUnits;
      const int m = NMAT == 2 ? r / 64 : 0, rr = n0 + (NMAT == 2 ? r % 64 : r);
      if (rr >= rows) continue;
      const uint8_t* mat = static_cast<const uint8_t*>(m ? a.w1 : a.w0);
      const uint8_t* row = mat + (static_cast<int64_t>(e) * rows + rr) * a.row_bytes;
      const uint8_t* from = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(row + sb) & ~uintptr_t{15}) + 16 * u;
      if (from >= row + se) continue;  // past this row's stage
      const int64_t left = (mat + a.mat_bytes) - from;
      cp_async16(moe_tc_raw + ((st & 1) * kTcBRows + r) * raw_row_stride<F>() + 16 * u, from, left < 16 ? static_cast<int>(left) : 16);
    }
  }
  cp_async_commit();
}

// Where staged weight row r (of kTcBRows; NMAT 2: 64 gate then 64 up rows) starts reading at column c: bf16 and
// MXFP4 at the column (MXFP4: and its scale row in s_src), GGUF at the row's first block; null past the matrix.
template <WeightFormat F, int NMAT>
__device__ __forceinline__ const void* b_source(const TileArgs& a, int e, int n0, int r, int c, const uint8_t*& s_src) {
  const int m = NMAT == 2 ? r / 64 : 0, rr = n0 + (NMAT == 2 ? r % 64 : r);
  if (rr >= a.rows) return nullptr;
  const int64_t grow = static_cast<int64_t>(e) * a.rows + rr;
  if constexpr (F == WeightFormat::MXFP4) {
    s_src = (m ? a.s1 : a.s0) + grow * (a.cols / 32);
    return static_cast<const uint8_t*>(m ? a.w1 : a.w0) + grow * (a.cols / 2) + c / 2;
  } else if constexpr (is_gguf_block(F)) {
    return static_cast<const uint8_t*>(m ? a.w1 : a.w0) + grow * a.row_bytes;
  } else {
    return static_cast<const uint16_t*>(m ? a.w1 : a.w0) + grow * a.cols + c;
  }
}

// Columns k0 + c0 .. + 15 of weight row r of the block (its global row at `row`) from the raw stage in shared
// memory (raw_copy_stage), as 16 bf16 in two uint4.
template <WeightFormat F>
__device__ __forceinline__ void raw_decode16(uint4 (&rb)[2], const uint8_t* row, int r, int c0, int k0, const IqTables& T) {
  constexpr int kBB = weight_layout(F).block_bytes, kG = weight_layout(F).block_elems / 8;
  const int st = k0 / kRawStageCols;
  const uintptr_t g0 = reinterpret_cast<uintptr_t>(row) + static_cast<uintptr_t>(st) * raw_stage_bytes<F>();
  const uint8_t* base = moe_tc_raw + ((st & 1) * kTcBRows + r) * raw_row_stride<F>() + (g0 & 15);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int gi = (k0 % kRawStageCols + c0) / 8 + h;  // group of 8 in the stage
    rb[h] = qdev::decode8_bf16<F>(base + (gi / kG) * kBB, gi % kG, T);
  }
}

// A thread's two activation pieces (4 floats each) into the staged A buffer as bf16 (SPLIT: hi and lo halves).
template <bool SPLIT, int NS = SPLIT ? 2 : 1>
__device__ __forceinline__ void store_act(uint16_t (&sA)[NS][kTcM][kTcLd], const float4 (&ra)[2], const int (&a_row)[2],
                                          const int (&a_col)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float4 v = ra[i];
    if constexpr (SPLIT) {
      float r0, r1, r2, r3;
      const uint32_t h01 = bf16x2_rn(v.x, v.y, r0, r1), h23 = bf16x2_rn(v.z, v.w, r2, r3);
      *reinterpret_cast<uint2*>(&sA[0][a_row[i]][a_col[i]]) = make_uint2(h01, h23);
      *reinterpret_cast<uint2*>(&sA[NS - 1][a_row[i]][a_col[i]]) = make_uint2(bf16x2_rn(r0, r1), bf16x2_rn(r2, r3));
    } else {
      *reinterpret_cast<uint2*>(&sA[0][a_row[i]][a_col[i]]) = make_uint2(bf16x2_rn(v.x, v.y), bf16x2_rn(v.z, v.w));
    }
  }
}

// One 32-column chunk's MMAs of a warp from the staged buffers: B fragments of its four n8 tiles (rows nb0.., nb1..),
// A of its m16 tiles holding pairs (mt_n of 2), hi then lo (NS = 2).
template <int NS>
__device__ __forceinline__ void tc_chunk_mma(float (&acc)[2][4][4], const uint16_t (&sA)[NS][kTcM][kTcLd],
                                             const uint16_t (&sB)[kTcBRows][kTcLd], int mt_n, int a_lr, int a_lk, int b_lr,
                                             int b_lk, int nb0, int nb1) {
#pragma unroll
  for (int ks = 0; ks < kTcK / 16; ++ks) {
    uint32_t b[4][2];
    {
      uint32_t r[4];
      ldmatrix_x4(r, &sB[nb0 + b_lr][ks * 16 + b_lk]);
      b[0][0] = r[0];
      b[0][1] = r[1];
      b[1][0] = r[2];
      b[1][1] = r[3];
      ldmatrix_x4(r, &sB[nb1 + b_lr][ks * 16 + b_lk]);
      b[2][0] = r[0];
      b[2][1] = r[1];
      b[3][0] = r[2];
      b[3][1] = r[3];
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      if (mt < mt_n) {
#pragma unroll
        for (int s = 0; s < NS; ++s) {  // hi, then lo
          uint32_t af[4];
          ldmatrix_x4(af, &sA[s][a_lr + mt * 16][ks * 16 + a_lk]);
#pragma unroll
          for (int j = 0; j < 4; ++j) mma_bf16_16816(acc[mt][j], af, b[j][0], b[j][1]);
        }
      }
    }
  }
}

// The tile's outputs: out[slot][n] for the warp's pairs < cnt and rows < `rows`; gate+up applies the GLU.
// Accumulator layout: acc[mt][j][2h + c] = (pair wm*32 + mt*16 + lane/4 + 8h, column 2*(lane%4) + c of n8 tile j).
template <int NMAT>
__device__ __forceinline__ void tc_store_out(const TileArgs& a, const float (&acc)[2][4][4], int start, int cnt, int wm,
                                             int lane, int n0, int nb0) {
  const int g = lane >> 2, c2 = (lane & 3) * 2;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = wm * 32 + mt * 16 + g + 8 * h;
      if (m >= cnt) continue;
      float* orow = a.out + static_cast<int64_t>(start + m) * a.rows;
#pragma unroll
      for (int j = 0; j < (NMAT == 2 ? 2 : 4); ++j) {
        const int n = n0 + nb0 + j * 8 + c2;  // NMAT 1: nb0 + 8j covers wn*32 + 0..31
        if (n >= a.rows) continue;             // rows % 8 == 0: n + 1 < rows too
        float2 v;
        if constexpr (NMAT == 2) {
          v.x = glu(acc[mt][j][2 * h], acc[mt][j + 2][2 * h], a.act, a.beta, a.lbeta);
          v.y = glu(acc[mt][j][2 * h + 1], acc[mt][j + 2][2 * h + 1], a.act, a.beta, a.lbeta);
        } else {
          v.x = acc[mt][j][2 * h];
          v.y = acc[mt][j][2 * h + 1];
        }
        *reinterpret_cast<float2*>(orow + n) = v;
      }
    }
  }
}

// F: BF16, MXFP4, or a GGUF block format (quant_tables.h is_gguf_block: decoded to bf16 by qdev::decode8_bf16
// while staging; cols a multiple of the format's block, so a 32-column chunk never leaves a row).
//
// Staging assignments. A: 64 pairs x 8 float4 per chunk, two per thread (8 threads read one pair's 128
// bytes); pairs past cnt and columns past cols are zero. B bf16: 128 rows x 4 uint4, two per thread;
// B MXFP4: 128 rows x (16 packed bytes + 1 scale), half a row (8 bytes) per thread; GGUF: 16 columns
// (two groups of 8) per thread. Rows past `rows` and columns past cols are zero (never stored, but keep
// NaN out of the MMAs).
// ldmatrix row addresses. A (16x16, row): lanes 0-15 rows 0-15 at k 0, lanes 16-31 rows 0-15 at k 8 ->
// a0..a3 = (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15). B ([n][k], two n8 tiles): lanes
// 0-7 n 0-7 k 0, 8-15 n 0-7 k 8, 16-23 n 8-15 k 0, 24-31 n 8-15 k 8 -> (b0, b1) of n8 tile 0, then tile 1.
template <WeightFormat F, int NMAT, bool GATHER, bool SPLIT>
__global__ void __launch_bounds__(kTcThreads, 2) expert_tc_kernel(const TileArgs a) {
  pdl::begin();  // pdl-launched (pdl.cuh): nothing read before the predecessor completes
  constexpr bool MX = F == WeightFormat::MXFP4, Q = is_gguf_block(F), PACKED = MX || Q;
  constexpr int NS = SPLIT ? 2 : 1;
  __shared__ __align__(16) uint16_t sA[2][NS][kTcM][kTcLd];  // activations (hi, lo) bf16, [pair][k]
  __shared__ __align__(16) uint16_t sB[2][kTcBRows][kTcLd];  // weights bf16, [row][k]
  __shared__ int src_row[kTcM];
  const int tile = blockIdx.x;
  if (tile >= *a.num_tiles) return;  // whole block: grid sized from an upper bound
  const int4 td = a.tiles[tile];
  const int e = td.x, start = td.y, cnt = td.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;
  const int cols = a.cols;
  const int n0 = blockIdx.y * (kTcBRows / NMAT);
  if (tid < kTcM) src_row[tid] = tid < cnt ? (GATHER ? a.sorted[start + tid] / a.K : start + tid) : -1;
  __syncthreads();

  const float* a_src[2];
  int a_row[2], a_col[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int idx = tid + i * kTcThreads;
    a_row[i] = idx >> 3;
    a_col[i] = (idx & 7) * 4;
    const int sr = src_row[a_row[i]];
    a_src[i] = sr >= 0 ? a.in + static_cast<int64_t>(sr) * cols + a_col[i] : nullptr;
  }
  constexpr int NB = PACKED ? 1 : 2;  // B pieces per thread
  const void* b_src[NB];
  const uint8_t* s_src = nullptr;
  int b_row[NB], b_col[NB];
#pragma unroll
  for (int i = 0; i < NB; ++i) {
    const int idx = tid + i * kTcThreads;
    b_row[i] = PACKED ? idx >> 1 : idx >> 2;
    b_col[i] = PACKED ? (idx & 1) * 16 : (idx & 3) * 8;  // in elements
    b_src[i] = b_source<F, NMAT>(a, e, n0, b_row[i], b_col[i], s_src);
  }

  float4 ra[2];
  uint4 rb[2];
  [[maybe_unused]] uint32_t rs = 0;  // MXFP4: the chunk's scale byte
  auto load = [&](int k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
      ra[i] = a_src[i] && k0 + a_col[i] < cols ? __ldg(reinterpret_cast<const float4*>(a_src[i] + k0))
                                              : make_float4(0.f, 0.f, 0.f, 0.f);
    if constexpr (MX) {
      // cols % 32 == 0: a chunk is one whole scale group of every row.
      if (b_src[0]) {
        const uint2 q = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(b_src[0]) + k0 / 2));
        rb[0] = make_uint4(q.x, q.y, 0u, 0u);
        rs = __ldg(s_src + k0 / 32);
      } else {
        rb[0] = make_uint4(0u, 0u, 0u, 0u);
        rs = 127u;
      }
    } else if constexpr (Q) {
      if (b_src[0]) {  // from the raw stage in shared memory (raw_copy_stage)
        raw_decode16<F>(rb, static_cast<const uint8_t*>(b_src[0]), b_row[0], b_col[0], k0, a.T);
      } else {
        rb[0] = rb[1] = make_uint4(0u, 0u, 0u, 0u);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 2; ++i)
        rb[i] = b_src[i] && k0 + b_col[i] < cols
                    ? __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(b_src[i]) + k0))
                    : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  auto store = [&](int buf) {
    store_act<SPLIT>(sA[buf], ra, a_row, a_col);
    if constexpr (MX) {
      const float sc = e8m0_scale_x2p14(rs);
      *reinterpret_cast<uint4*>(&sB[buf][b_row[0]][b_col[0]]) = e2m1x8_to_bf16(rb[0].x, sc);
      *reinterpret_cast<uint4*>(&sB[buf][b_row[0]][b_col[0] + 8]) = e2m1x8_to_bf16(rb[0].y, sc);
    } else if constexpr (Q) {
      *reinterpret_cast<uint4*>(&sB[buf][b_row[0]][b_col[0]]) = rb[0];
      *reinterpret_cast<uint4*>(&sB[buf][b_row[0]][b_col[0] + 8]) = rb[1];
    } else {
#pragma unroll
      for (int i = 0; i < 2; ++i) *reinterpret_cast<uint4*>(&sB[buf][b_row[i]][b_col[i]]) = rb[i];
    }
  };

  float acc[2][4][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mt][j][q] = 0.f;

  // m16 tiles of this warp holding any pair (warp-uniform): warps past the tile's pairs only stage.
  const int mt_n = min(2, max(0, (cnt - wm * 32 + 15) >> 4));
  const int a_lr = wm * 32 + (lane & 15), a_lk = (lane >> 4) * 8;
  const int b_lr = ((lane >> 4) << 3) + (lane & 7), b_lk = ((lane >> 3) & 1) * 8;
  const int nb0 = NMAT == 2 ? wn * 16 : wn * 32, nb1 = NMAT == 2 ? 64 + wn * 16 : wn * 32 + 16;

  const int nk = (cols + kTcK - 1) / kTcK;
  auto raw_copy = [&](int st) {
    if constexpr (Q) raw_copy_stage<F, NMAT>(a, st, e, n0, tid);
  };
  constexpr int kStageChunks = kRawStageCols / kTcK;
  if constexpr (Q) {
    raw_copy(0);
    raw_copy(1);
    cp_async_wait<1>();  // stage 0 landed (this thread's copies); the barrier below makes them everyone's
    __syncthreads();
  }
  load(0);
  store(0);
  __syncthreads();
  for (int kc = 0; kc < nk; ++kc) {
    const int buf = kc & 1;
    if constexpr (Q) {
      // Before the first chunk of stage st: wait for it (issued a stage ago), then fill the slot stage st - 1
      // used (its last chunk was decoded in the previous iteration, before the barrier that ended it).
      if ((kc + 1) % kStageChunks == 0 && kc + 1 < nk) {
        cp_async_wait<0>();
        __syncthreads();
        raw_copy((kc + 1) / kStageChunks + 1);
      }
    }
    if (kc + 1 < nk) load((kc + 1) * kTcK);
    if (mt_n > 0) tc_chunk_mma<NS>(acc, sA[buf], sB[buf], mt_n, a_lr, a_lk, b_lr, b_lk, nb0, nb1);
    if (kc + 1 < nk) store(buf ^ 1);
    __syncthreads();
  }

  tc_store_out<NMAT>(a, acc, start, cnt, wm, lane, n0, nb0);
}



}  // namespace

// GGUF block experts (ExpertStack::format a GGUF block format, down in down_format where that is one too)
// through expert_tc_kernel: the blocks decoded to fp32 while staging (qdev::decode8, the CPU's values) and
// rounded to bf16 for the MMAs, activations rounded to bf16 (no hi / lo split: the weights' rounding, 2^-9
// relative, is already that of a bf16 activation). `a`: gate_up_args of the plan's tiles. Writes hidden and
// y by slot like launch_tc; the caller combines. quant_moe_tc.cu.
cudaError_t launch_tc_gguf(const ExpertBank& w, int n_tiles_bound, TileArgs a, float* y, cudaStream_t stream);

}  // namespace k3::cuda

// Routed-expert prefill tiles on warpgroup MMAs (wgmma, sm_90a): moe_prefill_wgmma.h.
//
// Why: the mma.sync tiles (moe_tc_tile.cuh) ran K3-width prefill's experts at 68 TFLOP/s useful (call s16-3:
// 64 ms of a 4096-token MoE layer), a quarter of what mma.sync itself allows: eight warps stall on one barrier
// per 32 columns, and every m16 slice of a 64-pair tile is issued even where the tile holds 9 pairs (K3 at 4096
// tokens has ~73 pairs per expert: tiles of 64 and 9).
//
// The product is taken transposed: D [64 weight rows x NN pairs] = W [64 x k] . X^T, so the weights are the
// wgmma A operand (M = 64) and the tile's pairs the N dimension, rounded up to 16 (NN = 16, 32, 48 or 64 by the
// tile's count: a 9-pair tile issues a quarter of a full one). Block = (tile, 128 output columns of gate+up, or
// 256 rows of down), 2 warpgroups, 2 blocks per SM. Warpgroup w: NMAT 2 gate rows n0 + 64 w .. + 63 and the
// same up rows (two accumulators, the GLU in registers: the accumulator layouts match); NMAT 1 rows
// n0 + 128 w .. + 127 as two m64 products. Per 64-column chunk (one 128-byte swizzle row of bf16):
//   every thread stages one of the 256 weight rows (MXFP4: 32 bytes + 2 scale bytes loaded into registers a
//   chunk ahead, decoded exactly to bf16 -- E2M1 times a power of two -- and stored; BF16: cp.async as stored)
//   and 16 activations of one pair (fp32 -> bf16, hi and lo halves with SPLIT), into the 128-byte swizzled
//   K-major layout (row r at 128 r, its 16-byte chunk c at (c ^ (r & 7)) * 16: mla_decode_wgmma.cu's);
//   the chunk's wgmmas are issued asynchronously, the next chunk's decode and stores run under them into the
//   other stage, then one wait and one barrier.
// Accumulator of warp q of a warpgroup, lane l: element 4 j + e = (weight row 16 q + l / 4 + 8 (e >> 1),
// pair 8 j + 2 (l % 4) + (e & 1)).
#include <cuda_bf16.h>

#include <cstdlib>
#include <cstring>

#include "k3/backend/cuda/moe_prefill_wgmma.h"
#include "k3/backend/cuda/moe_tc_tile.cuh"
#include "k3/backend/cuda/sm90a/moe_wg_common.cuh"
#include "k3/backend/cuda/sm90a/wgmma.cuh"

namespace k3::cuda::moe_wg {
namespace {

using namespace detail;

template <bool SPLIT>
constexpr int stage_bytes() {
  return kWBytes + (SPLIT ? 2 : 1) * kXBytes;
}
template <bool SPLIT, bool RS>
constexpr int smem_bytes() {  // RS's body: bf16 activations x 2 stages + one fp32 stage
  static_assert(2 * (SPLIT ? 2 : 1) * kXBytes + kThreads * 64 <= 2 * stage_bytes<SPLIT>(), "RS fits the shared-memory form's");
  return 1024 /* alignment slack */ + 2 * stage_bytes<SPLIT>();  // RS launches hold both bodies (tile())
}

extern __shared__ __align__(1024) uint8_t moe_wg_smem[];

// One tile's block, NN pairs' columns of the products issued (cnt <= NN).
template <bool MX, int NMAT, bool GATHER, bool SPLIT, int NN>
__device__ __forceinline__ void tile_body(const TileArgs& a, int e, int start, int cnt) {
  constexpr int NS = SPLIT ? 2 : 1;
  const int tid = threadIdx.x, wg = tid >> 7;
  const int rows = a.rows, cols = a.cols;
  const int n0 = blockIdx.y * (NMAT == 2 ? kRows / 2 : kRows);
  const uint32_t base = (static_cast<uint32_t>(__cvta_generic_to_shared(moe_wg_smem)) + 1023u) & ~1023u;
  auto sW = [&](int buf) { return base + buf * stage_bytes<SPLIT>(); };
  auto sX = [&](int buf, int h) { return base + buf * stage_bytes<SPLIT>() + kWBytes + h * kXBytes; };

  // This thread's staged weight row (tid) and its source.
  const int m = NMAT == 2 ? tid / 128 : 0;
  const int gr = n0 + (NMAT == 2 ? tid % 128 : tid);
  const bool wvalid = gr < rows;
  const int64_t grow = static_cast<int64_t>(e) * rows + (wvalid ? gr : 0);
  const uint8_t* wsrc = static_cast<const uint8_t*>(m ? a.w1 : a.w0) + grow * (MX ? cols / 2 : cols * 2);
  const uint8_t* ssrc = MX ? (m ? a.s1 : a.s0) + grow * (cols / 32) : nullptr;
  // This thread's activations: pair tid / 4, columns 16 (tid % 4) .. + 15 of each chunk.
  const int p = tid >> 2, xc = (tid & 3) * 16;
  const float* xsrc = nullptr;
  if (p < cnt) xsrc = a.in + static_cast<int64_t>(GATHER ? a.sorted[start + p] / a.K : start + p) * cols + xc;

  float4 rx[4];
  uint4 rw[2];
  uint32_t rs = 0;
  auto load = [&](int k0) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      rx[i] = xsrc && k0 + xc + 4 * i < cols ? __ldg(reinterpret_cast<const float4*>(xsrc + k0 + 4 * i))
                                             : make_float4(0.f, 0.f, 0.f, 0.f);
    if constexpr (MX) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        rw[h] = wvalid && k0 + 32 * h < cols ? __ldg(reinterpret_cast<const uint4*>(wsrc + (k0 + 32 * h) / 2))
                                             : make_uint4(0u, 0u, 0u, 0u);
      const uint32_t s0 = wvalid ? __ldg(ssrc + k0 / 32) : 127u;
      const uint32_t s1 = wvalid && k0 + 32 < cols ? __ldg(ssrc + k0 / 32 + 1) : 127u;
      rs = s0 | (s1 << 8);
    }
  };
  auto copy_w = [&](int buf, int k0) {  // BF16: the row's 8 chunks as stored
    if constexpr (!MX) {
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const bool v = wvalid && k0 + 8 * c < cols;
        cp_async16_or_zero(sW(buf) + swz(tid, c), v ? wsrc + 2 * (k0 + 8 * c) : wsrc, v);
      }
      cp_async_commit();
    }
  };
  auto store = [&](int buf) {
    const float* v = reinterpret_cast<const float*>(rx);
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // 8 activations -> one 16-byte chunk (hi; lo)
      const float* q = v + 8 * half;
      uint4 hi, lo;
      float r[8];
      hi.x = bf16x2_rn(q[0], q[1], r[0], r[1]);
      hi.y = bf16x2_rn(q[2], q[3], r[2], r[3]);
      hi.z = bf16x2_rn(q[4], q[5], r[4], r[5]);
      hi.w = bf16x2_rn(q[6], q[7], r[6], r[7]);
      const int c = (tid & 3) * 2 + half;
      st_shared16(sX(buf, 0) + swz(p, c), hi);
      if constexpr (SPLIT) {
        lo = make_uint4(bf16x2_rn(r[0], r[1]), bf16x2_rn(r[2], r[3]), bf16x2_rn(r[4], r[5]), bf16x2_rn(r[6], r[7]));
        st_shared16(sX(buf, NS - 1) + swz(p, c), lo);
      }
    }
    if constexpr (MX) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sc = e8m0_scale_x2p14((rs >> (8 * h)) & 0xffu);
        st_shared16(sW(buf) + swz(tid, 4 * h + 0), e2m1x8_to_bf16(rw[h].x, sc));
        st_shared16(sW(buf) + swz(tid, 4 * h + 1), e2m1x8_to_bf16(rw[h].y, sc));
        st_shared16(sW(buf) + swz(tid, 4 * h + 2), e2m1x8_to_bf16(rw[h].z, sc));
        st_shared16(sW(buf) + swz(tid, 4 * h + 3), e2m1x8_to_bf16(rw[h].w, sc));
      }
    }
  };

  float acc[2][NN / 2];
  zero_acc(acc);

  const int nk = (cols + kKc - 1) / kKc;
  load(0);
  copy_w(0, 0);
  store(0);
  cp_async_wait<0>();
  wgmma::fence_proxy_async();
  __syncthreads();
  for (int kc = 0; kc < nk; ++kc) {
    const int buf = kc & 1;
    const bool more = kc + 1 < nk;
    if (more) {
      load((kc + 1) * kKc);
      copy_w(buf ^ 1, (kc + 1) * kKc);
    }
    wgmma::fence_regs(acc[0]);
    wgmma::fence_regs(acc[1]);
    wgmma::fence();
#pragma unroll
    for (int s = 0; s < kKc / 16; ++s) {
#pragma unroll
      for (int mm = 0; mm < 2; ++mm) {
        const int arow = NMAT == 2 ? 128 * mm + 64 * wg : 128 * wg + 64 * mm;
        const uint64_t da = wgmma::make_desc(sW(buf) + arow * 128 + s * 32, 16, kSbo);
#pragma unroll
        for (int h = 0; h < NS; ++h) mma<NN>(acc[mm], da, wgmma::make_desc(sX(buf, h) + s * 32, 16, kSbo));
      }
    }
    wgmma::commit();
    if (more) store(buf ^ 1);
    cp_async_wait<0>();
    wgmma::fence_proxy_async();
    wgmma::wait<0>();
    wgmma::fence_regs(acc[0]);
    wgmma::fence_regs(acc[1]);
    __syncthreads();
  }

  store_out<NMAT, NN>(a, acc, n0, start, cnt);
}

// The register-A form (RS; MXFP4 only): the same block and pipeline, but each thread decodes its own A
// fragments straight from global memory into registers, so the weights never pass through shared memory
// (call s39-1's ncu of tile_body at K3's n = 2048: the L1 / shared pipe 76-82% busy, the tensor pipe 21%; the
// weight stores and the A operand reads were two thirds of its shared wavefronts). The k order inside each
// 64-column chunk is permuted so that a thread's fragments are 16 consecutive columns of its two rows (8 bytes of
// MXFP4, one E8M0 group): lane c of a quad holds, at k-step s, slots {2c, 2c+1} = columns 16c + 4s + {0, 1} and
// slots {2c+8, 2c+9} = columns 16c + 4s + {2, 3}. The activations are staged in that permuted order: a thread's
// float4 i (columns 16c + 4i .. + 3) goes to k-step i, its halves to the chunk's 16-byte groups 2i and 2i + 1 at
// byte 4c. Bank-conflict free: the 8 pairs of a warp land in 8 different swizzled groups.
template <int NMAT, bool GATHER, bool SPLIT, int NN>
__device__ __forceinline__ void tile_body_rs(const TileArgs& a, int e, int start, int cnt) {
  constexpr int NS = SPLIT ? 2 : 1;
  const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31;
  const int rows = a.rows, cols = a.cols;
  const int n0 = blockIdx.y * (NMAT == 2 ? kRows / 2 : kRows);
  const uint32_t base = (static_cast<uint32_t>(__cvta_generic_to_shared(moe_wg_smem)) + 1023u) & ~1023u;
  auto sX = [&](int buf, int h) { return base + (buf * NS + h) * kXBytes; };
  // The next chunk's fp32 activations, copied asynchronously under this chunk's wgmmas: float4 i of thread t at
  // (i * 256 + t) * 16 (each thread reads back only its own copies; consecutive lanes, conflict-free).
  const uint32_t sF = base + 2 * NS * kXBytes;

  // Weights: A tile mm of warpgroup wg, rows 16 wq + g and + 8 (h = 0, 1); this lane's 16 columns 16 c .. + 15.
  const int g = lane >> 2, c = lane & 3;
  // One byte offset for all four rows (kernel parameters hold the bases: no registers for four pointers).
  const int64_t wrow_bytes = cols / 2, srow_bytes = cols / 32;
  const int r0 = (NMAT == 2 ? n0 + 64 * wg : n0 + 128 * wg) + 16 * wq + g;  // NMAT 1: tile mm's rows 64 mm further
  const int64_t grow = static_cast<int64_t>(e) * rows + r0;
  const int64_t wofs = grow * wrow_bytes + 8 * c, sofs = grow * srow_bytes + (c >> 1);
  constexpr int kMmRows = NMAT == 2 ? 0 : 64;
  auto row_ok = [&](int mm, int h) { return r0 + kMmRows * mm + 8 * h < rows; };
  // Activations: pair tid / 4, columns 16 (tid % 4) .. + 15 of each chunk (the same quad index as c).
  const int p = tid >> 2, xq = tid & 3, xc = xq * 16;
  const float* xsrc = nullptr;
  if (p < cnt) xsrc = a.in + static_cast<int64_t>(GATHER ? a.sorted[start + p] / a.K : start + p) * cols + xc;

  uint2 rw[2][2];
  uint32_t rs = 0;  // the four rows' scale bytes
  auto copy_x = [&](int k0) {  // fp32 activations -> sF, zero-filled past cnt / cols
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool v = xsrc && k0 + xc + 4 * i < cols;
      cp_async16_or_zero(sF + (i * kThreads + tid) * 16, v ? xsrc + k0 + 4 * i : a.in, v);
    }
    cp_async_commit();
  };
  auto load = [&](int k0) {
    copy_x(k0);
    const bool cok = k0 + 16 * c < cols;  // cols % 32 == 0: the lane's 16 columns are all in or all out
    rs = 0;
#pragma unroll
    for (int mm = 0; mm < 2; ++mm)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool v = row_ok(mm, h) && cok;
        const int64_t dr = kMmRows * mm + 8 * h;  // rows past r0
        const uint8_t* wb = static_cast<const uint8_t*>(NMAT == 2 && mm ? a.w1 : a.w0);
        const uint8_t* sbase = NMAT == 2 && mm ? a.s1 : a.s0;
        rw[mm][h] = v ? __ldg(reinterpret_cast<const uint2*>(wb + wofs + dr * wrow_bytes + k0 / 2)) : make_uint2(0u, 0u);
        const uint32_t sb = v ? __ldg(sbase + sofs + dr * srow_bytes + k0 / 32) : 127u;
        rs |= sb << (8 * (2 * mm + h));
      }
  };
  uint32_t af[2][4][4];  // [mm][k-step][register]: register h = row h's slots 2c, 2c+1; 2 + h its slots 2c+8, 2c+9
  auto decode = [&]() {
#pragma unroll
    for (int mm = 0; mm < 2; ++mm) {
      const uint32_t sb[2] = {(rs >> (16 * mm)) & 0xffu, (rs >> (16 * mm + 8)) & 0xffu};
      decode_a_frags(af[mm], rw[mm], sb);
    }
  };
  auto store_x = [&](int buf) {  // this thread's copies (its own cp.async group done) -> bf16 (hi, lo), permuted
    cp_async_wait<0>();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float4 x;
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w) : "r"(sF + (i * kThreads + tid) * 16));
      float e0, e1, e2, e3;  // what the bf16 halves leave
      const uint32_t h01 = bf16x2_rn(x.x, x.y, e0, e1), h23 = bf16x2_rn(x.z, x.w, e2, e3);
      st_shared4(sX(buf, 0) + swz(p, 2 * i) + 4 * xq, h01);
      st_shared4(sX(buf, 0) + swz(p, 2 * i + 1) + 4 * xq, h23);
      if constexpr (SPLIT) {
        st_shared4(sX(buf, 1) + swz(p, 2 * i) + 4 * xq, bf16x2_rn(e0, e1));
        st_shared4(sX(buf, 1) + swz(p, 2 * i + 1) + 4 * xq, bf16x2_rn(e2, e3));
      }
    }
  };
  auto fence_af = [&]() {
    keep_frags(af[0]);
    keep_frags(af[1]);
  };

  float acc[2][NN / 2];
  zero_acc(acc);

  const int nk = (cols + kKc - 1) / kKc;
  load(0);
  store_x(0);
  decode();
  wgmma::fence_proxy_async();
  __syncthreads();
  for (int kc = 0; kc < nk; ++kc) {
    const int buf = kc & 1;
    const bool more = kc + 1 < nk;
    if (more) load((kc + 1) * kKc);
    wgmma::fence_regs(acc[0]);
    wgmma::fence_regs(acc[1]);
    fence_af();
    wgmma::fence();
#pragma unroll
    for (int st = 0; st < kKc / 16; ++st)
#pragma unroll
      for (int mm = 0; mm < 2; ++mm)
#pragma unroll
        for (int h = 0; h < NS; ++h) mma_rs<NN>(acc[mm], af[mm][st], wgmma::make_desc(sX(buf, h) + st * 32, 16, kSbo));
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_regs(acc[0]);
    wgmma::fence_regs(acc[1]);
    fence_af();
    if (more) {
      store_x(buf ^ 1);
      decode();
    }
    wgmma::fence_proxy_async();
    __syncthreads();
  }
  store_out<NMAT, NN>(a, acc, n0, start, cnt);
}

// RS takes the register-A body for tiles of up to 48 pairs only: at 64 its 64 accumulators + 32 A registers spill
// (call s39-3: 3.2 GB of local loads at n = 2048, slower than the shared-memory form at n = 4096, whose tiles are
// mostly full), so full tiles keep the shared-memory body in the same launch.
template <int NN, bool MX, int NMAT, bool GATHER, bool SPLIT, bool RS>
__device__ __forceinline__ void tile(const TileArgs& a, int4 td) {
  if constexpr (RS && NN < 64)
    tile_body_rs<NMAT, GATHER, SPLIT, NN>(a, td.x, td.y, td.z);
  else
    tile_body<MX, NMAT, GATHER, SPLIT, NN>(a, td.x, td.y, td.z);
}

template <bool MX, int NMAT, bool GATHER, bool SPLIT, bool RS>
__global__ void __launch_bounds__(kThreads, 2) expert_wg_kernel(const TileArgs a) {
  if (static_cast<int>(blockIdx.x) >= *a.num_tiles) return;  // whole block: grid sized from an upper bound
  const int4 td = a.tiles[blockIdx.x];
  if (td.z <= 16)
    tile<16, MX, NMAT, GATHER, SPLIT, RS>(a, td);
  else if (td.z <= 32)
    tile<32, MX, NMAT, GATHER, SPLIT, RS>(a, td);
  else if (td.z <= 48)
    tile<48, MX, NMAT, GATHER, SPLIT, RS>(a, td);
  else
    tile<64, MX, NMAT, GATHER, SPLIT, RS>(a, td);
}

template <bool MX, int NMAT, bool GATHER, bool SPLIT, bool RS>
cudaError_t launch_one(const TileArgs& a, dim3 grid, cudaStream_t stream) {
  static_assert(MX || !RS, "the register-A form decodes MXFP4 only");
  auto* k = &expert_wg_kernel<MX, NMAT, GATHER, SPLIT, RS>;
  constexpr int smem = smem_bytes<SPLIT, RS>();
  // Per call, not once: the attribute is per device (tensor-parallel ranks launch on several).
  const cudaError_t attr = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (attr != cudaSuccess) return attr;
  k<<<grid, kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

template <bool MX, bool SPLIT, bool RS>
cudaError_t launch_pair(const ExpertBank& w, int n_tiles_bound, TileArgs a, float* y, cudaStream_t stream) {
  const dim3 g1(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.I + kRows / 2 - 1) / (kRows / 2)));
  cudaError_t e = launch_one<MX, 2, true, SPLIT, RS>(a, g1, stream);
  if (e != cudaSuccess) return e;
  e = round_hidden_mxfp8(a, stream);
  if (e != cudaSuccess) return e;
  to_down_args(a, w, a.out, y);
  const dim3 g2(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.X + kRows - 1) / kRows));
  return launch_one<MX, 1, false, SPLIT, RS>(a, g2, stream);
}

bool device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
  return major == 9 && minor == 0;
}

}  // namespace

bool supports(const ExpertBank& w) {
  static const bool sm90 = device_is_sm90();
  if (!sm90 || w.X <= 0 || w.I <= 0) return false;
  if (w.format == WeightFormat::MXFP4) return w.X % 32 == 0 && w.I % 32 == 0;
  if (w.format == WeightFormat::BF16) return w.X % 8 == 0 && w.I % 8 == 0;
  return false;
}

cudaError_t launch(const ExpertBank& w, int n_tiles_bound, const TileArgs& gate_up, bool split, bool register_a,
                   float* y, cudaStream_t stream) {
  if (!supports(w) || n_tiles_bound <= 0) return cudaErrorInvalidValue;
  const bool mx = w.format == WeightFormat::MXFP4;
  if (register_a && !mx) return cudaErrorInvalidValue;
  if (mx && register_a)
    return split ? launch_pair<true, true, true>(w, n_tiles_bound, gate_up, y, stream)
                 : launch_pair<true, false, true>(w, n_tiles_bound, gate_up, y, stream);
  if (mx) return split ? launch_pair<true, true, false>(w, n_tiles_bound, gate_up, y, stream)
                       : launch_pair<true, false, false>(w, n_tiles_bound, gate_up, y, stream);
  return split ? launch_pair<false, true, false>(w, n_tiles_bound, gate_up, y, stream)
               : launch_pair<false, false, false>(w, n_tiles_bound, gate_up, y, stream);
}

bool register_a_by_env() {
  static const bool v = [] {
    const char* s = std::getenv("K3_MOE_WGMMA");
    return s != nullptr && std::strcmp(s, "rs") == 0;
  }();
  return v;
}

bool enabled_by_env() {
  static const bool v = [] {
    const char* s = std::getenv("K3_MOE_WGMMA");
    return s == nullptr || std::strcmp(s, "0") != 0;
  }();
  return v;
}

}  // namespace k3::cuda::moe_wg

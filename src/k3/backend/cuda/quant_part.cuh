// The v2 decode GEMV's decoders (quant_gemv.cu): a "part" is the 32 weights of one 256-column unit that
// lane i (0..7) of a row's 8-lane group owns, decoded from wide loads of the unit's bytes:
//   Q4_K / Q5_K  part i = qs bytes 16i..16i+15 (one 16-byte load; Q5_K: + 16 bytes of qh), the 16-byte
//                header (d, dmin, 12 scale bytes) loaded once per unit (the 8 lanes read the same bytes);
//   Q6_K         part i = ql bytes 16i.. (+ 16 bytes of qh), blocks of 210 bytes: 2-byte aligned loads
//                made of two aligned 16-byte loads and a byte shift (load16u);
//   IQ4_XS       part i = sub-block i (16 qs bytes, 8-aligned) + the 8-byte header;
//   Q8_0         a unit is 8 blocks (272 bytes), part i = block i: three aligned 16-byte loads and a shift.
// Exactness: every weight is the CPU's fp32 value (quant_decode.cuh's expressions), but the int -> float
// conversion of a quant goes through the exponent field instead of I2F (a quarter-rate conversion): the
// byte is placed under the exponent of 2^23 by one PRMT, and one fma then yields the rounded product:
//   byte q at bits 16..23 (q < 128): f = 2^16 (128 + q); fmaf(s 2^-16, f, -(128 + o) s) = round(s (q - o)),
// exact when s 2^-16 and (128 + o) s are exact floats, which holds for the scales below (f16 d times a
// small integer: at most 18 significant bits, times 128 + o with o in {0, 32}: 160 = 5 * 32 adds 3 bits).
// Q8_0's signed bytes are biased by 128 (xor 0x80) and sit at bits 8..15: f = 2^8 (2^15 + q + 128),
// fmaf(d 2^-8, f, -(2^15 + 128) d) = round(d q) (257 d has at most 20 significant bits). IQ4_XS's codebook
// values (-127..113, a 16-entry table in 4 registers, looked up by PRMT) are made exact by a subtraction
// (2^23 + v + 128) - (2^23 + 128) and then multiplied by dl as on the CPU (dl * 257 may need 25 bits).
// Non-finite scales (never written by a quantiser) may decode as NaN where the CPU has inf.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "k3/backend/cuda/quant_decode.cuh"

namespace k3::cuda::qpart {

using qdev::f16_bits;
using qdev::mul;

// 2^16 (128 + byte k of v), byte < 128; 2^8 (2^15 + byte k of v); 2^23 + byte k of v.
template <int k>
__device__ __forceinline__ float byte_at16(uint32_t v) {
  return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7044u | (k << 8)));
}
template <int k>
__device__ __forceinline__ float byte_at8(uint32_t v) {
  return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7404u | (k << 4)));
}
template <int k>
__device__ __forceinline__ float byte_at0(uint32_t v) {
  return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440u | k));
}

// Where the dot products read x. XGlobal: global memory through the read-only path. XSwizzled<A, B>: a copy in
// shared memory whose 16-byte groups are permuted within each 64 bytes -- the group index (address bits 4-5) XORed
// with address bits A and B -- so that the 8 lanes of one unit, which read 16 bytes each at the same j, hit 8
// distinct 4-bank groups (one shared-memory wavefront per 8 lanes). The copy's base is 1 KB aligned and a token's
// row a multiple of 1 KB, so the pointer's bits are the column's. Global x costs 16 L1 wavefronts per warp load
// instead of 4 (the 8 lanes of a unit span 4 lines): the one-token kernel's bound (session 32, ncu).
struct XGlobal {
  __device__ static float4 f4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
};
template <int A, int B>
struct XSwizzled {
  __device__ static uintptr_t at(uintptr_t a) { return a ^ ((((a >> A) & 1) | (((a >> B) & 1) << 1)) << 4); }
  __device__ static float4 f4(const float* p) { return *reinterpret_cast<const float4*>(at(reinterpret_cast<uintptr_t>(p))); }
};

// acc[t][slot] += w[j] x_t[j], j < 4, x_t = xp + t * cols (16-byte aligned): 4 accumulators per token,
// each a chain of 8 fmas per part (the error bound in quant_gemv.cu counts them).
template <int NT, class XL = XGlobal>
__device__ __forceinline__ void fma4(float (&acc)[NT][4], int slot, const float (&w)[4], const float* __restrict__ xp,
                                     int64_t cols) {
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float4 v = XL::f4(xp + t * cols);
    float s = acc[t][slot];
    s = fmaf(w[0], v.x, s);
    s = fmaf(w[1], v.y, s);
    s = fmaf(w[2], v.z, s);
    s = fmaf(w[3], v.w, s);
    acc[t][slot] = s;
  }
}

// w[j] = round(a 2^16 q_j + c) for the 4 bytes q_j (< 128) of v: the exact product rounded once (header
// comment); kMin: then the CPU's subtraction of the sub-block's min ml (Q4_K / Q5_K).
template <bool kMin>
__device__ __forceinline__ void scaled4(uint32_t v, float a, float c, float ml, float (&w)[4]) {
  w[0] = fmaf(a, byte_at16<0>(v), c);
  w[1] = fmaf(a, byte_at16<1>(v), c);
  w[2] = fmaf(a, byte_at16<2>(v), c);
  w[3] = fmaf(a, byte_at16<3>(v), c);
  if (kMin) {
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = __fsub_rn(w[j], ml);
  }
}

// Word j of the bytes U[0..N) shifted down by `off` bytes (off even, < 16), for j < M (U[j + off / 4 + 1]
// must exist where off % 4 == 2): selects by the bits of off / 4, then a 16-bit funnel shift. ~1.2 ops per
// output word and stage; no local memory (runtime indexing of a register array would spill).
template <int N, int M>
__device__ __forceinline__ void shift_words(const uint32_t (&U)[N], int off, uint32_t (&out)[M]) {
  const int k = off >> 2;
  const unsigned sh = 8u * (off & 2);
  uint32_t a[N], b[N];
#pragma unroll
  for (int j = 0; j < N; ++j) a[j] = (k & 4) && j + 4 < N ? U[j + 4] : U[j];
#pragma unroll
  for (int j = 0; j < N; ++j) b[j] = (k & 2) && j + 2 < N ? a[j + 2] : a[j];
#pragma unroll
  for (int j = 0; j < N; ++j) a[j] = (k & 1) && j + 1 < N ? b[j + 1] : b[j];
#pragma unroll
  for (int j = 0; j < M; ++j) out[j] = __funnelshift_r(a[j], a[j + 1 < N ? j + 1 : j], sh);
}

__device__ __forceinline__ void words_of(const uint4& v, uint32_t* w) { w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w; }

// 16 bytes at p (2-byte aligned) from the two aligned 16-byte chunks around them. Reads at most 14 bytes
// past p + 16: callers keep those inside the block.
__device__ __forceinline__ uint4 load16u(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint4* q = reinterpret_cast<const uint4*>(a & ~uintptr_t{15});
  uint32_t U[8], o[4];
  words_of(__ldg(q), U);
  words_of(__ldg(q + 1), U + 4);
  shift_words<8, 4>(U, static_cast<int>(a & 15), o);
  return make_uint4(o[0], o[1], o[2], o[3]);
}

struct NoCtx {};

// ---- Q4_K / Q5_K: lane i owns chunk c = i / 2 (sub-blocks 2c low nibbles, 2c + 1 high), positions
// l0 = 16 (i % 2) .. l0 + 15. The 8 scale / min pairs: quant::k4_scale_min for j = 2c, 2c + 1.
__device__ __forceinline__ void k4_pair(const uint4& h, int c, int (&sc)[2], int (&m)[2]) {
  const int e = 16 * (c & 1);
  const unsigned A = (h.y >> e) & 0xFFFF, B = (h.z >> e) & 0xFFFF, C = (h.w >> e) & 0xFFFF;
  if (c < 2) {
    sc[0] = A & 63, sc[1] = (A >> 8) & 63, m[0] = B & 63, m[1] = (B >> 8) & 63;
  } else {
    sc[0] = (C & 0xF) | (((A >> 6) & 3) << 4), sc[1] = ((C >> 8) & 0xF) | (((A >> 14) & 3) << 4);
    m[0] = ((C >> 4) & 0xF) | (((B >> 6) & 3) << 4), m[1] = ((C >> 12) & 0xF) | (((B >> 14) & 3) << 4);
  }
}

template <bool kFifth>
struct PartQ45 {
  static constexpr int kUnitBytes = kFifth ? 176 : 144, kAlign = 16;
  struct Raw {
    uint4 h, q, qh;
  };
  using Ctx = NoCtx;
  __device__ static Ctx context(const IqTables&) { return {}; }
  __device__ static bool valid(int64_t, int, int64_t) { return true; }
  __device__ static Raw load(const uint8_t* row, int64_t u, int i, int64_t) {
    const uint4* b = reinterpret_cast<const uint4*>(row + u * kUnitBytes);
    Raw r;
    r.h = __ldg(b);
    r.q = __ldg(b + (kFifth ? 3 : 1) + i);
    r.qh = kFifth ? __ldg(b + 1 + (i & 1)) : make_uint4(0, 0, 0, 0);
    return r;
  }
  using XShared = XSwizzled<8, 9>;  // lane i reads bytes 256 (i / 2) + 64 (i % 2) + 16 j (+ 128) of a unit's x
  template <int NT, class XL = XGlobal>
  __device__ static void dot(const Raw& r, const float* __restrict__ xu, int64_t cols, int i, const Ctx&, float (&acc)[NT][4]) {
    const int c = i >> 1, l0 = 16 * (i & 1);
    const float d = f16_bits(r.h.x & 0xFFFF), dmin = f16_bits(r.h.x >> 16);
    int sc[2], m[2];
    k4_pair(r.h, c, sc, m);
    float a[2], cc[2], ml[2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const float dl = mul(d, static_cast<float>(sc[s]));
      a[s] = mul(dl, 1.0f / 65536), cc[s] = mul(dl, -128.0f), ml[s] = mul(dmin, static_cast<float>(m[s]));
    }
    uint32_t q[4], qh[4];
    words_of(r.q, q);
    words_of(r.qh, qh);
    const float* x0 = xu + 64 * c + l0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t lo = q[j] & 0x0F0F0F0Fu, hi = (q[j] >> 4) & 0x0F0F0F0Fu;
      if (kFifth) {
        lo |= ((qh[j] >> (2 * c)) & 0x01010101u) << 4;
        hi |= ((qh[j] >> (2 * c + 1)) & 0x01010101u) << 4;
      }
      float w[4];
      scaled4<true>(lo, a[0], cc[0], ml[0], w);
      fma4<NT, XL>(acc, j, w, x0 + 4 * j, cols);
      scaled4<true>(hi, a[1], cc[1], ml[1], w);
      fma4<NT, XL>(acc, j, w, x0 + 32 + 4 * j, cols);
    }
  }
};

// ---- Q6_K: lane i: half h = i / 4, quarter k = (i / 2) % 2 (low nibbles) and k + 2 (high), positions
// p0 = 16 (i % 2) ..; ql bytes 16i.., qh bytes 128 + 32h + p0.., scales 8h + i % 2 + 2k (+ 4).
struct PartQ6K {
  static constexpr int kUnitBytes = 210, kAlign = 2;
  struct Raw {
    uint4 ql, qh;
    int sc0, sc1;
    unsigned d;
  };
  using Ctx = NoCtx;
  __device__ static Ctx context(const IqTables&) { return {}; }
  __device__ static bool valid(int64_t, int, int64_t) { return true; }
  __device__ static Raw load(const uint8_t* row, int64_t u, int i, int64_t) {
    const uint8_t* b = row + u * kUnitBytes;
    const int h = i >> 2, k = (i >> 1) & 1, p0 = 16 * (i & 1);
    Raw r;
    r.ql = load16u(b + 16 * i);
    r.qh = load16u(b + 128 + 32 * h + p0);
    const int si = 192 + 8 * h + (i & 1) + 2 * k;
    r.sc0 = static_cast<int8_t>(__ldg(b + si));
    r.sc1 = static_cast<int8_t>(__ldg(b + si + 4));
    r.d = __ldg(reinterpret_cast<const unsigned short*>(b + 208));
    return r;
  }
  using XShared = XSwizzled<7, 9>;  // lane i reads bytes 512 (i / 4) + 128 ((i / 2) % 2) + 64 (i % 2) + 16 j (+ 256)
  template <int NT, class XL = XGlobal>
  __device__ static void dot(const Raw& r, const float* __restrict__ xu, int64_t cols, int i, const Ctx&, float (&acc)[NT][4]) {
    const int h = i >> 2, k = (i >> 1) & 1, p0 = 16 * (i & 1);
    const float d = f16_bits(r.d);
    float a[2], cc[2];
    const int scs[2] = {r.sc0, r.sc1};
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const float dsc = mul(d, static_cast<float>(scs[s]));
      a[s] = mul(dsc, 1.0f / 65536), cc[s] = mul(dsc, -160.0f);  // round(dsc (q - 32)), o = 32
    }
    uint32_t ql[4], qh[4];
    words_of(r.ql, ql);
    words_of(r.qh, qh);
    const float* x0 = xu + 128 * h + 32 * k + p0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = (ql[j] & 0x0F0F0F0Fu) | (((qh[j] >> (2 * k)) & 0x03030303u) << 4);
      const uint32_t hi = ((ql[j] >> 4) & 0x0F0F0F0Fu) | (((qh[j] >> (2 * k + 4)) & 0x03030303u) << 4);
      float w[4];
      scaled4<false>(lo, a[0], cc[0], 0.0f, w);
      fma4<NT, XL>(acc, j, w, x0 + 4 * j, cols);
      scaled4<false>(hi, a[1], cc[1], 0.0f, w);
      fma4<NT, XL>(acc, j, w, x0 + 64 + 4 * j, cols);
    }
  }
};

// ---- IQ4_XS: lane i = sub-block i: qs bytes 8 + 16i.. (low nibble: element 32i + j, high: 32i + 16 + j).
struct IqCtx {
  uint32_t t[4];  // the IQ4_NL codebook biased by 128, 4 bytes a word
};

// The codebook bytes for the 8 nibbles of q: lo[j] for the low nibble of byte j, hi[j] for the high one
// (llama.cpp's get_int_from_table_16: __byte_perm reads 3 bits of each selector nibble, the fourth picks
// the table half).
__device__ __forceinline__ void lookup16(uint32_t q, const IqCtx& T, uint32_t& lo, uint32_t& hi) {
  const uint32_t sel = 0x32103210u | ((q & 0x88888888u) >> 1);
  uint32_t tmp[2];
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const uint32_t idx = q >> (16 * s);
    tmp[s] = __byte_perm(__byte_perm(T.t[0], T.t[1], idx), __byte_perm(T.t[2], T.t[3], idx), sel >> (16 * s));
  }
  lo = __byte_perm(tmp[0], tmp[1], 0x6420);
  hi = __byte_perm(tmp[0], tmp[1], 0x7531);
}

struct PartIQ4XS {
  static constexpr int kUnitBytes = 136, kAlign = 8;
  struct Raw {
    uint2 h, q0, q1;
  };
  using Ctx = IqCtx;
  __device__ static Ctx context(const IqTables& T) {
    Ctx c;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      uint32_t v = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) v |= static_cast<uint32_t>(static_cast<uint8_t>(__ldg(T.iq4nl + 4 * w + j) + 128)) << (8 * j);
      c.t[w] = v;
    }
    return c;
  }
  __device__ static bool valid(int64_t, int, int64_t) { return true; }
  __device__ static Raw load(const uint8_t* row, int64_t u, int i, int64_t) {
    const uint2* b = reinterpret_cast<const uint2*>(row + u * kUnitBytes);
    return Raw{__ldg(b), __ldg(b + 1 + 2 * i), __ldg(b + 2 + 2 * i)};
  }
  template <int NT>
  __device__ static void dot(const Raw& r, const float* __restrict__ xu, int64_t cols, int i, const Ctx& T, float (&acc)[NT][4]) {
    const float d = f16_bits(r.h.x & 0xFFFF);
    const unsigned scales_h = r.h.x >> 16, scales_l = r.h.y;
    const int ls = ((scales_l >> (4 * i)) & 0xF) | (((scales_h >> (2 * i)) & 3) << 4);  // byte i / 2, nibble i % 2
    const float dl = mul(d, static_cast<float>(ls - 32));
    const uint32_t q[4] = {r.q0.x, r.q0.y, r.q1.x, r.q1.y};
    const float* x0 = xu + 32 * i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t lo, hi;
      lookup16(q[j], T, lo, hi);
      float w[4];
      w[0] = mul(dl, __fsub_rn(byte_at0<0>(lo), 8388736.0f)), w[1] = mul(dl, __fsub_rn(byte_at0<1>(lo), 8388736.0f));
      w[2] = mul(dl, __fsub_rn(byte_at0<2>(lo), 8388736.0f)), w[3] = mul(dl, __fsub_rn(byte_at0<3>(lo), 8388736.0f));
      fma4<NT>(acc, j, w, x0 + 4 * j, cols);
      w[0] = mul(dl, __fsub_rn(byte_at0<0>(hi), 8388736.0f)), w[1] = mul(dl, __fsub_rn(byte_at0<1>(hi), 8388736.0f));
      w[2] = mul(dl, __fsub_rn(byte_at0<2>(hi), 8388736.0f)), w[3] = mul(dl, __fsub_rn(byte_at0<3>(hi), 8388736.0f));
      fma4<NT>(acc, j, w, x0 + 16 + 4 * j, cols);
    }
  }
};

// ---- Q8_0: a unit is blocks 8u .. 8u + 7 of the row; lane i takes block 8u + i (if it exists): the 48
// aligned bytes around its 34, shifted so that the quants are word aligned.
struct PartQ80 {
  static constexpr int kUnitBytes = 272, kAlign = 2;
  struct Raw {
    uint32_t q[8];
    unsigned d;
  };
  using Ctx = NoCtx;
  __device__ static Ctx context(const IqTables&) { return {}; }
  __device__ static bool valid(int64_t u, int i, int64_t cols) { return 8 * u + i < cols / 32; }
  __device__ static Raw load(const uint8_t* row, int64_t u, int i, int64_t cols) {
    const int64_t blk = valid(u, i, cols) ? 8 * u + i : cols / 32 - 1;  // a lane past the row reads its last block
    const uintptr_t a = reinterpret_cast<uintptr_t>(row + 34 * blk);
    const uint4* p = reinterpret_cast<const uint4*>(a & ~uintptr_t{15});
    uint32_t U[12];
    words_of(__ldg(p), U);
    words_of(__ldg(p + 1), U + 4);
    const int off = static_cast<int>(a & 15);
    if (blk + 1 < cols / 32) {
      words_of(__ldg(p + 2), U + 8);  // starts inside the block, ends at most 14 bytes past it: in the next block
    } else {
      // The row's last block may end its allocation: only its own bytes (off + 2 of the last chunk's 16).
      const uint16_t* h = reinterpret_cast<const uint16_t*>(p + 2);
#pragma unroll
      for (int k = 0; k < 4; ++k) U[8 + k] = 0;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (2 * k < off + 2) U[8 + k / 2] |= static_cast<uint32_t>(h[k]) << (16 * (k & 1));
    }
    Raw r;
    shift_words<12, 8>(U, off + 2, r.q);
    const uint32_t dw = (off & 8) ? ((off & 4) ? U[3] : U[2]) : ((off & 4) ? U[1] : U[0]);
    r.d = (dw >> (8 * (off & 2))) & 0xFFFFu;
    return r;
  }
  template <int NT>
  __device__ static void dot(const Raw& r, const float* __restrict__ xu, int64_t cols, int i, const Ctx&, float (&acc)[NT][4]) {
    const float d = f16_bits(r.d);
    const float a = mul(d, 1.0f / 256), c = mul(d, -32896.0f);  // 32896 = 2^15 + 128
    const float* x0 = xu + 32 * i;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t v = r.q[j] ^ 0x80808080u;
      const float w[4] = {fmaf(a, byte_at8<0>(v), c), fmaf(a, byte_at8<1>(v), c), fmaf(a, byte_at8<2>(v), c),
                          fmaf(a, byte_at8<3>(v), c)};
      fma4<NT>(acc, j & 3, w, x0 + 4 * j, cols);
    }
  }
};

template <WeightFormat F>
struct PartOf;
template <>
struct PartOf<WeightFormat::Q4_K> {
  using type = PartQ45<false>;
};
template <>
struct PartOf<WeightFormat::Q5_K> {
  using type = PartQ45<true>;
};
template <>
struct PartOf<WeightFormat::Q6_K> {
  using type = PartQ6K;
};
template <>
struct PartOf<WeightFormat::IQ4_XS> {
  using type = PartIQ4XS;
};
template <>
struct PartOf<WeightFormat::Q8_0> {
  using type = PartQ80;
};

// The formats with a v2 decoder; the others keep the warp-per-row kernel.
constexpr bool has_part(WeightFormat f) {
  return f == WeightFormat::Q4_K || f == WeightFormat::Q5_K || f == WeightFormat::Q6_K || f == WeightFormat::IQ4_XS ||
         f == WeightFormat::Q8_0;
}

}  // namespace k3::cuda::qpart

// The 16-row MXFP4 repack and its one-token product (mxfp4_rowblocks.h). Only the functions between
// K3_AVX512BF16_BEGIN/END are compiled for AVX-512 + VBMI + VNNI; the repack and the activation quantisation are plain
// code (an AVX2-only CPU never runs EVEX code: the caller checks mxfp4_rowblocks_cpu_ok()).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 intrinsic headers (as the tier's files)
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "k3/backend/cpu/mxfp4_rowblocks.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "k3/backend/cpu/cpu_features.h"
#include "k3/backend/cpu/cpu_isa.h"
#include "k3/backend/cpu/weight_simd512.h"
#include "k3/core/error.h"

namespace k3::cpu {

namespace {

constexpr int64_t kG = 32;  // an MXFP4 group

// The E2M1 code of element c of row r and the E8M0 scale of its group, in either MXFP4 layout.
struct Mxfp4Reader {
  const WeightMatrix& W;
  int code(int64_t r, int64_t c) const {
    const uint8_t* row = W.row_data(r);
    if (W.format == WeightFormat::MXFP4) {
      const uint8_t b = row[c / 2];
      return c % 2 ? b >> 4 : b & 15;
    }
    const uint8_t* blk = row + (c / kG) * 17;  // {e8m0, qs[16]}: element j low nibble of qs[j], j + 16 its high one
    const int64_t j = c % kG;
    return j < 16 ? blk[1 + j] & 15 : blk[1 + j - 16] >> 4;
  }
  uint8_t scale(int64_t r, int64_t g) const {
    return W.format == WeightFormat::MXFP4 ? W.row_scales(r)[g] : W.row_data(r)[g * 17];
  }
};

}  // namespace

bool mxfp4_rowblocks_supported(const WeightMatrix& W) {
  return (W.format == WeightFormat::MXFP4 || W.format == WeightFormat::MXFP4_GGML) && W.rows > 0 && W.rows % 16 == 0 &&
         W.cols > 0 && W.cols % kG == 0 && W.data != nullptr && (W.format != WeightFormat::MXFP4 || W.scales != nullptr);
}

Mxfp4RowBlocks mxfp4_rowblocks(const WeightMatrix& W) {
  if (!mxfp4_rowblocks_supported(W))
    throw Error("mxfp4_rowblocks: needs an MXFP4 matrix with rows a multiple of 16 and columns a multiple of 32 (got " +
                std::to_string(W.rows) + " x " + std::to_string(W.cols) + ")");
  const int64_t groups = W.cols / kG, blocks = W.rows / 16;
  Mxfp4RowBlocks m{W.rows, W.cols, std::vector<uint8_t>(static_cast<size_t>(blocks * groups * 256)),
                   std::vector<uint8_t>(static_cast<size_t>(blocks * groups * 16))};
  const Mxfp4Reader rd{W};
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* dst = m.quads.data() + (b * groups + g) * 256;
      for (int qd = 0; qd < 8; ++qd)
        for (int s = 0; s < 32; ++s) {
          const int64_t r = 16 * b + s / 4, c = g * kG + 4 * qd + s % 4;
          dst[32 * qd + s] = static_cast<uint8_t>(rd.code(r, c) | (rd.code(r + 8, c) << 4));
        }
      for (int r = 0; r < 16; ++r) m.scales[static_cast<size_t>((b * groups + g) * 16 + r)] = rd.scale(16 * b + r, g);
    }
  return m;
}

void mxfp4_rowblocks_quantise(const float* x, int64_t cols, Mxfp4GroupActs& a) {
  if (cols % kG != 0) throw Error("mxfp4_rowblocks_quantise: columns must be a multiple of 32");
  const int64_t groups = cols / kG;
  a.q.resize(static_cast<size_t>(cols));
  a.d.resize(static_cast<size_t>(groups));
  a.start.resize(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    const float* v = x + g * kG;
    float mx = 0.f;
    for (int64_t k = 0; k < kG; ++k) mx = std::max(mx, std::fabs(v[k]));  // NaN: std::max keeps mx, caught below
    bool finite = std::isfinite(mx);
    for (int64_t k = 0; k < kG; ++k) finite = finite && !std::isnan(v[k]);
    const float inv = finite && mx > 0.f ? 127.f / mx : 0.f;
    int32_t sum = 0;
    int8_t* q = a.q.data() + g * kG;
    for (int64_t k = 0; k < kG; ++k) {  // a non-finite group's q are 0 (never a NaN converted to an integer)
      q[k] = finite ? static_cast<int8_t>(std::clamp(std::nearbyint(v[k] * inv), -127.f, 127.f)) : int8_t{0};
      sum += q[k];
    }
    a.d[static_cast<size_t>(g)] = finite ? mx / 127.f : std::nanf("");
    a.start[static_cast<size_t>(g)] = -12 * sum;
  }
}

bool mxfp4_rowblocks_cpu_ok() {  // the avx512bf16 tier's features: the target its region is compiled for
  static const bool ok = isa_missing_features(detect_cpu_features(), CpuIsa::Avx512Bf16, false).empty();
  return ok;
}

K3_AVX512BF16_BEGIN
namespace {

// 0.5 x 2^(s - 127) for the 16 row scales of a group: (s - 1) << 23 as float bits for s in 2..254, the table (the
// exact denormals of s = 0, 1 and NaN for 255) otherwise.
__attribute__((always_inline)) inline __m512 half_scales(const uint8_t* s16) {
  const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s16)));
  const __mmask16 odd = _mm512_cmplt_epu32_mask(s, _mm512_set1_epi32(2)) | _mm512_cmpeq_epi32_mask(s, _mm512_set1_epi32(255));
  __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(s, _mm512_set1_epi32(1)), 23));
  if (odd) {
    alignas(64) float t[16];
    _mm512_store_ps(t, v);
    for (int r = 0; r < 16; ++r)
      if (odd >> r & 1) t[r] = simd512::kHalfE8m0[s16[r]];
    v = _mm512_load_ps(t);
  }
  return v;
}

void rowblocks_kernel(const Mxfp4RowBlocks& m, const Mxfp4GroupActs& a, int64_t b0, int64_t b1, float* y) {
  const int64_t groups = m.cols / kG;
  // the tier's decode: a quad's 32 bytes to 64 nibbles (simd512::nibble_halves_ctrl), each code to code + 12 (unsigned:
  // vpdpbusd's first operand; the start value cancels the 12s)
  const __m512i ctrl = simd512::nibble_halves_ctrl(), lut = _mm512_broadcast_i32x4(simd512::e2m1x2_plus12_table());
  for (int64_t b = b0; b < b1; ++b) {
    __m512 acc = _mm512_setzero_ps();
    const uint8_t* qb = m.quads.data() + b * groups * 256;
    const uint8_t* sb = m.scales.data() + b * groups * 16;
    for (int64_t g = 0; g < groups; ++g, qb += 256, sb += 16) {
      __m512i dot = _mm512_set1_epi32(a.start[static_cast<size_t>(g)]);
      const int32_t* xq = reinterpret_cast<const int32_t*>(a.q.data() + g * kG);
#pragma GCC unroll 8
      for (int qd = 0; qd < 8; ++qd) {
        const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + 32 * qd));
        const __m512i w = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(ctrl, _mm512_broadcast_i64x4(packed)), lut);
        int32_t quad;
        __builtin_memcpy(&quad, xq + qd, 4);
        dot = _mm512_dpbusd_epi32(dot, w, _mm512_set1_epi32(quad));
      }
      const __m512 sc = _mm512_mul_ps(half_scales(sb), _mm512_set1_ps(a.d[static_cast<size_t>(g)]));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc);
    }
    _mm512_storeu_ps(y + 16 * b, acc);
  }
}

}  // namespace
K3_AVX512BF16_END

void mxfp4_rowblocks_one_token(const Mxfp4RowBlocks& m, const Mxfp4GroupActs& a, int64_t b0, int64_t b1, float* y) {
  if (!mxfp4_rowblocks_cpu_ok()) throw Error("mxfp4_rowblocks_one_token: this CPU lacks the avx512bf16 tier's features");
  if (b0 < 0 || b1 > m.rows / 16 || b0 > b1) throw Error("mxfp4_rowblocks_one_token: row blocks out of range");
  if (static_cast<int64_t>(a.q.size()) != m.cols) throw Error("mxfp4_rowblocks_one_token: activations of another width");
  rowblocks_kernel(m, a, b0, b1, y);
}

}  // namespace k3::cpu

// The CPU backend's per-format row kernels and its one dispatch point on WeightFormat (row_kernels).
// AVX2+FMA, weights converted in registers; see weight_kernels.h for the contracts.
#include "k3/backend/cpu/weight_kernels.h"

#include "k3/backend/cpu/cpu_isa.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>

namespace k3::cpu {

namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline __m256 load_bf16x8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// One dot-product loop for every float format, templated over how 8 weights are loaded (`Load`, an
// AVX2 conversion) and how one is converted in the tail (`Scalar`): two 8-lane accumulators, 16 per
// step, then the same hsum and fma tail. Sharing the loop is what keeps the formats batch-invariant:
// a bf16/f16 row converted to fp32 and dotted with dot_f32 (matmul, n > 1) gives the same bits as
// its own dot (n == 1), because the operations and their order are the same.
// The scalar tail uses explicit fma: left to the compiler, `s += a * b` was contracted in some of the
// formerly separate functions and not in others, so a bf16/f16 row with cols % 16 != 0 gave different
// bits through the two paths (CpuKernels.Matmul*, issue 12).
template <class T, class Load, class Scalar>
inline float dot_loop(const T* w, const float* x, int64_t n, Load load8, Scalar to_f32) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(load8(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(load8(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
  }
  float s = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s = std::fma(to_f32(w[i]), x[i], s);
  return s;
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

}  // namespace

float dot_f32(const float* w, const float* x, int64_t n) {
  return dot_loop(w, x, n, [](const float* p) { return _mm256_loadu_ps(p); }, [](float v) { return v; });
}

namespace {

// Lambdas, not function pointers, so that the loads are inlined into the loop.
float dot_bf16(const uint16_t* w, const float* x, int64_t n) {
  return dot_loop(w, x, n, [](const uint16_t* p) { return load_bf16x8(p); }, [](uint16_t v) { return bf16_to_f32(v); });
}
float dot_f16(const uint16_t* w, const float* x, int64_t n) {
  return dot_loop(w, x, n, [](const uint16_t* p) { return load_f16x8(p); }, [](uint16_t v) { return f16_to_f32(v); });
}

// E2M1 values doubled, as int8, indexed by nibble: pshufb maps 16 nibbles at once.
const __m128i kE2M1x2 = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);

// Decodes one MXFP4 group (16 packed bytes = 32 weights, in order) into 4 vectors of 8 floats,
// without the scale and doubled (the caller multiplies by 0.5 * 2^(s-127)).
inline void decode_mxfp4_group(const uint8_t* p, __m256 out[4]) {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
  __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
  lo = _mm_shuffle_epi8(kE2M1x2, lo);
  hi = _mm_shuffle_epi8(kE2M1x2, hi);
  __m128i e0 = _mm_unpacklo_epi8(lo, hi);  // weights 0..15 (element 2i = low nibble of byte i)
  __m128i e1 = _mm_unpackhi_epi8(lo, hi);  // weights 16..31
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8)));
  out[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1));
  out[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8)));
}

float dot_mxfp4(const uint8_t* packed, const uint8_t* scales, const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  __m256 w[4];
  for (int64_t g = 0; g < n / kMxfp4Group; ++g) {
    decode_mxfp4_group(packed + g * 16, w);
    const float* xg = x + g * kMxfp4Group;
    __m256 s = _mm256_mul_ps(w[0], _mm256_loadu_ps(xg));
    s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xg + 8), s);
    s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xg + 16), s);
    s = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xg + 24), s);
    acc = _mm256_fmadd_ps(s, _mm256_set1_ps(0.5f * e8m0_to_f32(scales[g])), acc);
  }
  return hsum(acc);
}

// Several tokens against one MXFP4 row, each token with exactly dot_mxfp4's arithmetic (so results do
// not depend on how many tokens share the call); the row is decoded once per group for all of them.
void dot_mxfp4_multi(const uint8_t* packed, const uint8_t* scales, const float* x, int64_t ldx, int64_t nt,
                     int64_t n, float* out, int64_t ldo) {
  constexpr int kT = 4;
  __m256 w[4];
  for (int64_t t0 = 0; t0 < nt; t0 += kT) {
    const int m = static_cast<int>(std::min<int64_t>(kT, nt - t0));
    __m256 acc[kT] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t g = 0; g < n / kMxfp4Group; ++g) {
      decode_mxfp4_group(packed + g * 16, w);
      const __m256 sc = _mm256_set1_ps(0.5f * e8m0_to_f32(scales[g]));
      for (int j = 0; j < m; ++j) {
        const float* xg = x + (t0 + j) * ldx + g * kMxfp4Group;
        __m256 s = _mm256_mul_ps(w[0], _mm256_loadu_ps(xg));
        s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xg + 8), s);
        s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xg + 16), s);
        s = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xg + 24), s);
        acc[j] = _mm256_fmadd_ps(s, sc, acc[j]);
      }
    }
    for (int j = 0; j < m; ++j) out[(t0 + j) * ldo] = hsum(acc[j]);
  }
}


// ---- the row kernels of each format ----

float f32_dot(const WeightMatrix& W, int64_t r, const float* x) {
  return dot_f32(static_cast<const float*>(W.data) + r * W.cols, x, W.cols);
}
float bf16_dot(const WeightMatrix& W, int64_t r, const float* x) {
  return dot_bf16(static_cast<const uint16_t*>(W.data) + r * W.cols, x, W.cols);
}
float f16_dot(const WeightMatrix& W, int64_t r, const float* x) {
  return dot_f16(static_cast<const uint16_t*>(W.data) + r * W.cols, x, W.cols);
}
float mxfp4_dot(const WeightMatrix& W, int64_t r, const float* x) {
  return dot_mxfp4(W.row_data(r), W.row_scales(r), x, W.cols);
}

void f32_dequant(const WeightMatrix& W, int64_t r, float* out) {
  const float* p = static_cast<const float*>(W.data) + r * W.cols;
  for (int64_t i = 0; i < W.cols; ++i) out[i] = p[i];
}
void bf16_dequant(const WeightMatrix& W, int64_t r, float* out) {
  const uint16_t* p = static_cast<const uint16_t*>(W.data) + r * W.cols;
  for (int64_t i = 0; i < W.cols; ++i) out[i] = bf16_to_f32(p[i]);
}
void f16_dequant(const WeightMatrix& W, int64_t r, float* out) {
  const uint16_t* p = static_cast<const uint16_t*>(W.data) + r * W.cols;
  for (int64_t i = 0; i < W.cols; ++i) out[i] = f16_to_f32(p[i]);
}
void mxfp4_dequant(const WeightMatrix& W, int64_t r, float* out) {
  const uint8_t* p = W.row_data(r);
  const uint8_t* s = W.row_scales(r);
  __m256 w[4];
  for (int64_t g = 0; g < W.cols / kMxfp4Group; ++g) {
    decode_mxfp4_group(p + g * 16, w);
    __m256 sc = _mm256_set1_ps(0.5f * e8m0_to_f32(s[g]));
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + g * 32 + k * 8, _mm256_mul_ps(w[k], sc));
  }
}

void mxfp4_dot_multi(const WeightMatrix& W, int64_t r, const float* x, int64_t ldx, int64_t nt, float* out, int64_t ldo) {
  dot_mxfp4_multi(W.row_data(r), W.row_scales(r), x, ldx, nt, W.cols, out, ldo);
}

constexpr RowKernels kF32{f32_dot, f32_dequant, nullptr, true};
constexpr RowKernels kF16{f16_dot, f16_dequant, nullptr, false};
constexpr RowKernels kBF16{bf16_dot, bf16_dequant, nullptr, false};
constexpr RowKernels kMXFP4{mxfp4_dot, mxfp4_dequant, mxfp4_dot_multi, false};

// Kernel tables per CPU tier (cpu_isa.h), indexed by WeightFormat; only the AVX2 table exists so far.
using FormatTable = std::array<const RowKernels*, 4>;
constexpr FormatTable kAvx2Table{&kF32, &kF16, &kBF16, &kMXFP4};

const FormatTable* tier_table(CpuIsa isa) { return isa == CpuIsa::Avx2 ? &kAvx2Table : nullptr; }

}  // namespace

bool isa_has_kernels(CpuIsa isa) { return tier_table(isa) != nullptr; }

const RowKernels& row_kernels(WeightFormat f) {
  // The tier is chosen once per process (cpu_state: the CPU's best tier with kernels, or $K3_CPU_ISA).
  static const FormatTable& table = *tier_table(active_cpu_isa());
  const auto i = static_cast<size_t>(f);
  if (i < table.size() && table[i]) return *table[i];
  throw Error("CPU backend: weight format " + std::to_string(static_cast<int>(f)) + " has no kernels");
}

}  // namespace k3::cpu

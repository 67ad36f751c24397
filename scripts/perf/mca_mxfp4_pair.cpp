// The one-token MXFP4 (ggml layout) kernel's inner step -- one pair of 32-blocks for 4 rows side by side, as
// mxfp4_one_token_rows in src/k3/backend/cpu/weight_kernels_avx512bf16.cpp does it -- cut out for a static throughput
// estimate (this VM has no hardware counters; docs/perf/cpu.md, session 33):
//   g++ -O2 -std=c++17 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vbmi -mavx512vnni -S scripts/perf/mca_mxfp4_pair.cpp -o p.s
//   sed -n '/LLVM-MCA-BEGIN/,/LLVM-MCA-END/p' p.s > loop.s && llvm-mca -mcpu=icelake-server -iterations=200 loop.s
// Keep it in step with the kernel when that changes.
#include <immintrin.h>
#include <cstdint>
extern float kHalfE8m0[256];
static inline __m128i tbl() { return _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0); }
static inline void decode(const uint8_t* blocks, __m512i& w, __m512& wsc) {
  const __m512i src = _mm512_maskz_loadu_epi8((uint64_t{1} << 34) - 1, blocks);
  const __m512i gather = _mm512_set_epi64(0x211F1D1B19171513LL, 0x211F1D1B19171513LL, 0x100E0C0A08060402LL, 0x100E0C0A08060402LL,
                                          0x201E1C1A18161412LL, 0x201E1C1A18161412LL, 0x0F0D0B0907050301LL, 0x0F0D0B0907050301LL);
  const __m512i ctrl = _mm512_set_epi64(0x3C342C241C140C04LL, 0x3830282018100800LL, 0x3C342C241C140C04LL, 0x3830282018100800LL,
                                        0x3C342C241C140C04LL, 0x3830282018100800LL, 0x3C342C241C140C04LL, 0x3830282018100800LL);
  w = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(ctrl, _mm512_permutexvar_epi8(gather, src)), _mm512_broadcast_i32x4(tbl()));
  wsc = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(kHalfE8m0[blocks[0]]), _mm512_set1_ps(kHalfE8m0[blocks[17]]));
}
void body(const uint8_t* data, int64_t data_bytes, int64_t pairs, const __m512i* xs, const __m512i* corr, const uint8_t* xq, __m512* out) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t p = 0; p < pairs; ++p) {
    asm volatile("# LLVM-MCA-BEGIN pair");
    const __m512 xsc = _mm512_loadu_ps(reinterpret_cast<const float*>(xq + p * 128 + 64));
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      __m512i w; __m512 wsc;
      decode(data + i * data_bytes + 34 * p, w, wsc);
      const __m512i dp = _mm512_dpbusd_epi32(corr[p], w, xs[p]);
      acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dp), xsc), wsc, acc[i]);
    }
    asm volatile("# LLVM-MCA-END");
  }
  for (int i = 0; i < 4; ++i) out[i] = acc[i];
}

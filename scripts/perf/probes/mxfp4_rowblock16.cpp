// Probe (session 52, issue 15): how fast could the avx512bf16 tier's one-token MXFP4 product be with the weights
// repacked at load so that one vpdpbusd serves 16 rows, against today's form (mxfp4_one_token_rows: a pair of
// 32-groups of one row a vpdpbusd, the activations' scale per 4 values). Single file, no project code:
//   quad  -- today's inner loop, re-typed: per row and pair of groups, broadcast 32 bytes, vpmultishiftqb + vpermb to
//            64 unsigned weights (+12), vpdpbusd against the token's signed int8 (a scale per 4 values) with the
//            precomputed -12 x sum correction, cvt, times the activation scales, fma by the groups' E8M0 scales;
//            4 rows side by side.
//   rb16  -- rows in blocks of 16, each 32-column group stored as 8 quads of 32 bytes (a quad: 4 columns x 16 rows,
//            byte s = rows s/4 (low nibble) and s/4 + 8 (high), column s%4): the same vpmultishiftqb + vpermb gives 16
//            rows x 4 weights, one vpdpbusd with the quad's 4 activation bytes broadcast from memory adds them into 16
//            row lanes; per group: the int32 dot of 16 rows (the -12 x sum correction folded into the start), one cvt
//            and one fma by (row scales x the group's activation scale). The activations take ONE scale per 32 values
//            (llama.cpp's q8_0 class), not one per 4: a numerics change, so the probe also prints both errors.
// Prints per-thread GB/s of weights (in L2 and from DRAM) and max relative error against float64.
// Build: g++ -O3 -std=c++20 -mavx512f -mavx512bw -mavx512vl -mavx512vbmi -mavx512vnni -pthread mxfp4_rowblock16.cpp
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace {

constexpr int kG = 32;  // MXFP4 group
const float kE2M1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

struct Matrix {
  int rows, cols;
  std::vector<uint8_t> packed;  // [rows][cols / 2], element 2i = low nibble of byte i
  std::vector<uint8_t> scales;  // [rows][cols / 32]
  double w(int r, int c) const {
    const uint8_t b = packed[static_cast<size_t>(r) * cols / 2 + c / 2];
    const int code = c % 2 ? b >> 4 : b & 15;
    return kE2M1[code] * std::ldexp(1.0, scales[static_cast<size_t>(r) * cols / kG + c / kG] - 127);
  }
};

Matrix random_matrix(int rows, int cols, uint64_t seed) {
  Matrix m{rows, cols, std::vector<uint8_t>(static_cast<size_t>(rows) * cols / 2),
           std::vector<uint8_t>(static_cast<size_t>(rows) * cols / kG)};
  std::mt19937_64 g(seed);
  for (auto& b : m.packed) b = static_cast<uint8_t>(g());
  for (auto& s : m.scales) s = static_cast<uint8_t>(117 + g() % 5);  // 2^-10 .. 2^-6: QAT-like
  return m;
}

inline __m512i ctrl_lohi() {
  return _mm512_set_epi64(0x3C342C241C140C04LL, 0x3C342C241C140C04LL, 0x3C342C241C140C04LL, 0x3C342C241C140C04LL,
                          0x3830282018100800LL, 0x3830282018100800LL, 0x3830282018100800LL, 0x3830282018100800LL);
}
inline __m512i plus12_lut() {
  return _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
}

// ---- quad: today's form ----
struct QuadActs {
  std::vector<__m512i> xs, corr;  // per pair: 64 signed bytes in decode order, the -12 x lane-sum correction
  std::vector<__m512> xsc;        // per pair: 16 quad scales
};
QuadActs quad_acts(const std::vector<float>& x) {
  const int pairs = static_cast<int>(x.size()) / 64;
  QuadActs a;
  a.xs.resize(pairs), a.corr.resize(pairs), a.xsc.resize(pairs);
  for (int p = 0; p < pairs; ++p) {
    alignas(64) int8_t q[64];
    alignas(64) float d[16];
    // decode order: bytes 0-15 even elements of g0, 16-31 even of g1, 32-47 odd of g0, 48-63 odd of g1
    for (int lane = 0; lane < 16; ++lane) {
      float v[4], mx = 0;
      for (int j = 0; j < 4; ++j) {
        const int k = 4 * lane + j, half = k / 32, g = (k % 32) / 16, i = k % 16;
        v[j] = x[static_cast<size_t>(p) * 64 + g * 32 + 2 * i + half];
        mx = std::max(mx, std::fabs(v[j]));
      }
      d[lane] = mx / 127.f;
      for (int j = 0; j < 4; ++j) q[4 * lane + j] = static_cast<int8_t>(std::lround(d[lane] > 0 ? v[j] / d[lane] : 0));
    }
    a.xs[p] = _mm512_load_si512(q);
    a.corr[p] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(12), a.xs[p]));
    a.xsc[p] = _mm512_load_ps(d);
  }
  return a;
}
float kHalf[256];
void quad_rows(const Matrix& m, const QuadActs& a, int r0, int r1, float* y) {
  const int pairs = m.cols / 64, rb = m.cols / 2, sb = m.cols / kG;
  const __m512i ctrl = ctrl_lohi(), lut = plus12_lut();
  for (int r = r0; r < r1; r += 4) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int p = 0; p < pairs; ++p) {
      for (int i = 0; i < 4; ++i) {
        const uint8_t* pk = m.packed.data() + static_cast<size_t>(r + i) * rb + 32 * p;
        const uint8_t* sc = m.scales.data() + static_cast<size_t>(r + i) * sb + 2 * p;
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pk));
        const __m512i w = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(ctrl, _mm512_broadcast_i64x4(b)), lut);
        const __m512 wsc = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(kHalf[sc[0]]), _mm512_set1_ps(kHalf[sc[1]]));
        const __m512i dp = _mm512_dpbusd_epi32(a.corr[p], w, a.xs[p]);
        acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dp), a.xsc[p]), wsc, acc[i]);
      }
    }
    for (int i = 0; i < 4; ++i) y[r + i] = _mm512_reduce_add_ps(acc[i]);
  }
}

// ---- rb16: repacked ----
struct Rb16 {
  int rows, cols;
  std::vector<uint8_t> q;  // [rows / 16][groups][8 quads][32 bytes]
  std::vector<uint8_t> s;  // [rows / 16][groups][16 rows]
};
Rb16 repack(const Matrix& m) {
  const int groups = m.cols / kG, blocks = m.rows / 16;
  Rb16 o{m.rows, m.cols, std::vector<uint8_t>(static_cast<size_t>(blocks) * groups * 256),
         std::vector<uint8_t>(static_cast<size_t>(blocks) * groups * 16)};
  auto code = [&](int r, int c) {
    const uint8_t b = m.packed[static_cast<size_t>(r) * m.cols / 2 + c / 2];
    return c % 2 ? b >> 4 : b & 15;
  };
  for (int blk = 0; blk < blocks; ++blk)
    for (int g = 0; g < groups; ++g) {
      uint8_t* dst = o.q.data() + (static_cast<size_t>(blk) * groups + g) * 256;
      for (int qd = 0; qd < 8; ++qd)
        for (int s = 0; s < 32; ++s) {
          const int r = 16 * blk + s / 4, c = g * kG + 4 * qd + s % 4;
          dst[32 * qd + s] = static_cast<uint8_t>(code(r, c) | (code(r + 8, c) << 4));
        }
      for (int r = 0; r < 16; ++r)
        o.s[(static_cast<size_t>(blk) * groups + g) * 16 + r] = m.scales[static_cast<size_t>(16 * blk + r) * groups + g];
    }
  return o;
}
// x as int8 with one scale per `run` values (32: rb16's numerics; 4: today's): q, the scales d and 12 x sum(q) a run.
struct RunActs {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> c;
};
RunActs run_acts(const std::vector<float>& x, int run) {
  const size_t runs = x.size() / static_cast<size_t>(run);
  RunActs a{std::vector<int8_t>(x.size()), std::vector<float>(runs), std::vector<int32_t>(runs)};
  for (size_t k = 0; k < runs; ++k) {
    float mx = 0;
    for (int j = 0; j < run; ++j) mx = std::max(mx, std::fabs(x[k * run + j]));
    a.d[k] = mx / 127.f;
    int32_t s = 0;
    for (int j = 0; j < run; ++j) {
      const int8_t v = static_cast<int8_t>(std::lround(a.d[k] > 0 ? x[k * run + j] / a.d[k] : 0));
      a.q[k * run + j] = v;
      s += v;
    }
    a.c[k] = 12 * s;
  }
  return a;
}
// rb16 (PER_QUAD false): one activation scale per 32 values, the group's int32 dot over its 8 quads, one cvt a group.
// rb16q (PER_QUAD true): today's activation numerics (one scale per 4 values = per quad of a group, the 4 columns one
// vpdpbusd step takes): each quad's int32 row sums converted and scaled on their own -- the accuracy of today's form,
// 3 more vector ops a quad.
template <bool PER_QUAD>
void rb16_rows(const Rb16& m, const RunActs& a, int blk0, int blk1, float* y) {
  const int groups = m.cols / kG;
  const __m512i ctrl = ctrl_lohi(), lut = plus12_lut();
  for (int blk = blk0; blk < blk1; ++blk) {
    __m512 acc = _mm512_setzero_ps();
    const uint8_t* qb = m.q.data() + static_cast<size_t>(blk) * groups * 256;
    const uint8_t* sb = m.s.data() + static_cast<size_t>(blk) * groups * 16;
    for (int g = 0; g < groups; ++g, qb += 256, sb += 16) {
      // 2^(s - 127) as float bits (s in 1..254), times 0.5 (the doubled E2M1)
      const __m512 sw = _mm512_mul_ps(
          _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb))), 23)),
          _mm512_set1_ps(0.5f));
      const int32_t* xq = reinterpret_cast<const int32_t*>(a.q.data() + static_cast<size_t>(g) * kG);
      __m512i di = _mm512_set1_epi32(PER_QUAD ? 0 : -a.c[g]);
      __m512 gacc = _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int qd = 0; qd < 8; ++qd) {
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + 32 * qd));
        const __m512i w = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(ctrl, _mm512_broadcast_i64x4(b)), lut);
        if constexpr (PER_QUAD) {
          const __m512i d4 = _mm512_dpbusd_epi32(_mm512_set1_epi32(-a.c[8 * g + qd]), w, _mm512_set1_epi32(xq[qd]));
          gacc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d4), _mm512_set1_ps(a.d[8 * g + qd]), gacc);
        } else {
          di = _mm512_dpbusd_epi32(di, w, _mm512_set1_epi32(xq[qd]));
        }
      }
      acc = PER_QUAD ? _mm512_fmadd_ps(gacc, sw, acc)
                     : _mm512_fmadd_ps(_mm512_cvtepi32_ps(di), _mm512_mul_ps(sw, _mm512_set1_ps(a.d[g])), acc);
    }
    _mm512_storeu_ps(y + 16 * blk, acc);
  }
}

double max_rel(const std::vector<float>& y, const std::vector<double>& ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    md = std::max(md, std::fabs(y[i] - ref[i]));
    mr = std::max(mr, std::fabs(ref[i]));
  }
  return md / mr;
}

template <class F>
double best_seconds(int reps, F f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  for (int s = 0; s < 256; ++s) kHalf[s] = static_cast<float>(0.5 * std::ldexp(1.0, s - 127));
  const int cols = 2304;
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  std::mt19937_64 g(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(cols);
  for (auto& v : x) v = nd(g);
  const QuadActs qa = quad_acts(x);
  const RunActs ba = run_acts(x, kG), qsa = run_acts(x, 4);
  for (const int rows : {256, 32768}) {  // 0.3 MB (in L2) and 38 MB (past the L3 slice)
    const Matrix m = random_matrix(rows, cols, 11 + rows);
    const Rb16 rm = repack(m);
    std::vector<double> ref(rows);
    for (int r = 0; r < rows; ++r) {
      double s = 0;
      for (int c = 0; c < cols; ++c) s += m.w(r, c) * x[c];
      ref[r] = s;
    }
    std::vector<float> yq(rows), yb(rows), ybq(rows);
    auto run = [&](auto body) {
      std::vector<std::thread> th;
      for (int t = 0; t < threads; ++t) th.emplace_back([&, t] { body(t); });
      for (auto& h : th) h.join();
    };
    const int reps = rows <= 256 ? 2000 : 20;
    auto quad = [&] {
      run([&](int t) {
        const int per = rows / threads / 4 * 4;
        const int r0 = t * per, r1 = t + 1 == threads ? rows : r0 + per;
        for (int k = 0; k < (rows <= 256 ? 50 : 1); ++k) quad_rows(m, qa, r0, r1, yq.data());
      });
    };
    auto rb = [&] {
      run([&](int t) {
        const int blocks = rows / 16, per = blocks / threads;
        const int b0 = t * per, b1 = t + 1 == threads ? blocks : b0 + per;
        for (int k = 0; k < (rows <= 256 ? 50 : 1); ++k) rb16_rows<false>(rm, ba, b0, b1, yb.data());
      });
    };
    auto rbq = [&] {
      run([&](int t) {
        const int blocks = rows / 16, per = blocks / threads;
        const int b0 = t * per, b1 = t + 1 == threads ? blocks : b0 + per;
        for (int k = 0; k < (rows <= 256 ? 50 : 1); ++k) rb16_rows<true>(rm, qsa, b0, b1, ybq.data());
      });
    };
    const double bytes = static_cast<double>(rows) * (cols / 2 + cols / kG) * (rows <= 256 ? 50 : 1);
    for (int round = 0; round < 2; ++round) {
      const double tq = best_seconds(reps / 50 + 3, quad), tb = best_seconds(reps / 50 + 3, rb),
                   tbq = best_seconds(reps / 50 + 3, rbq);
      std::printf("rows %5d (%s) threads %d round %d: quad %6.2f GB/s  rb16 %6.2f GB/s (%.2fx)  rb16q %6.2f GB/s (%.2fx)  "
                  "max rel err vs float64: quad %.2e  rb16 %.2e  rb16q %.2e\n",
                  rows, rows <= 256 ? "in L2" : "DRAM", threads, round, bytes / tq / 1e9, bytes / tb / 1e9, tq / tb,
                  bytes / tbq / 1e9, tq / tbq, max_rel(yq, ref), max_rel(yb, ref), max_rel(ybq, ref));
    }
  }
  return 0;
}

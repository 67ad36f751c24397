// Direct tests of the CPU reference kernels (src/k3/backend/cpu/ops.h, attn_res_mix) against float64
// references written here from model-spec's formulas, with weight decoders of their own (not the
// project's bf16_to_f32 / kE2M1Values), on random inputs that are never zero, at odd sizes with
// unaligned tails. These kernels are the reference every CUDA kernel is checked against, so the loose
// end-to-end goldens are not enough (issue 12).
//
// ISA: the kernel tests run once per CPU tier with kernels (avx2: weight_kernels.cpp + weight_gemm.cpp;
// avx512: weight_kernels_avx512.cpp; avx512bf16: weight_kernels_avx512bf16.cpp, whose BF16 and MXFP4
// matmuls round the activations, so their bound adds activation_rounding_bound; avx2int8:
// weight_kernels_avx2int8.cpp, whose MXFP4 matmuls round them the same way), forced in-process (force_cpu_isa_for_testing); a tier the CPU
// lacks is skipped. Every code path is covered: matrix-vector (row_dot), the register-blocked
// multi-token kernels (avx2: 2x3 float tiles, 1x8 MXFP4 tiles; avx512: 2x6 and 1x12; and their row and
// token tails), single- and multi-threaded (the parallel_for thresholds), and the loop tails (avx2:
// scalar after 16-wide steps; avx512: one 16-step and a masked step after 32-wide steps).
//
// Tolerances (stated per test) are rigorous error bounds of fp32 arithmetic, not measured fits:
// a dot product of n terms accumulated in fp32 is within n * 2^-24 * sum |w_i x_i| of the exact value
// (recursive-summation bound, gamma_n; the 2x8-lane split only lowers it), so a missing or doubled term, a
// wrong nibble or scale, gives an error far above it.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "k3/backend/cpu/cpu_isa.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cpu/weight_kernels.h"
#include "k3/core/mxfp4_ggml.h"
#include "k3/core/weight.h"
#include "cpu_graph_ref.h"
#include "kernel_test_util.h"

namespace {

constexpr double kU = 1.0 / (1 << 24);  // fp32 unit roundoff (2^-24)

// Nonzero values: magnitudes log-uniform in [2^-6, 2^3], random sign.
std::vector<float> nonzero(size_t n, std::mt19937& rng, double scale = 1.0) {
  std::uniform_real_distribution<double> e(-6, 3);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>((rng() & 1 ? 1 : -1) * std::exp2(e(rng)) * scale);
  return v;
}

// --- independent weight decoders (float64) ---
double ref_bf16(uint16_t h) {
  const int s = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
  const double v = e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
  return s ? -v : v;
}
double ref_f16(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return s ? -v : v;
}
// FP4 E2M1 (model-spec 4): bit 3 sign, bits 0-2: exponent (2 bits, bias 1) and mantissa (1 bit).
double ref_e2m1(int nib) {
  const int e = (nib >> 1) & 3, m = nib & 1;
  const double v = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
  return nib & 8 ? -v : v;
}
double ref_e8m0(uint8_t s) { return std::ldexp(1.0, s - 127); }

// A stored weight matrix with its float64 values.
struct TestWeight {
  k3::WeightMatrix W;
  std::vector<uint8_t> bytes, scales;
  std::vector<double> ref;  // [rows][cols]
};

TestWeight make_weight(k3::WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng);

// ggml's MXFP4 block layout of an MXFP4 test weight: the same values (and float64 reference), the scale
// moved into 17-byte blocks and the nibbles reordered (core/mxfp4_ggml.h).
TestWeight to_ggml(const TestWeight& m) {
  TestWeight t = m;
  t.W.format = k3::WeightFormat::MXFP4_GGML;
  t.bytes.assign(static_cast<size_t>(m.W.rows * m.W.cols / 32 * 17), 0);
  k3::mxfp4_to_ggml_blocks(m.bytes.data(), m.scales.data(), m.W.rows * m.W.cols / 32, t.bytes.data());
  t.scales.clear();
  t.W.scales = nullptr;
  t.W.data = t.bytes.data();
  return t;
}

TestWeight make_weight(k3::WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng) {
  if (f == k3::WeightFormat::MXFP4_GGML) return to_ggml(make_weight(k3::WeightFormat::MXFP4, rows, cols, rng));
  TestWeight t;
  const bool mxfp4 = f == k3::WeightFormat::MXFP4;
  t.W.format = f;
  t.W.rows = rows;
  t.W.cols = cols;
  t.ref.resize(static_cast<size_t>(rows * cols));
  if (mxfp4) {
    t.bytes.resize(static_cast<size_t>(rows * cols / 2));
    t.scales.resize(static_cast<size_t>(rows * cols / 32));
    for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<uint8_t>(i < 256 ? i : rng());  // every byte
    std::uniform_int_distribution<int> sd(117, 137);
    for (auto& s : t.scales) s = static_cast<uint8_t>(sd(rng));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t b = t.bytes[static_cast<size_t>((r * cols + c) / 2)];
        const int nib = c % 2 == 0 ? b & 0xf : b >> 4;  // element 2i in the low nibble
        t.ref[static_cast<size_t>(r * cols + c)] = ref_e2m1(nib) * ref_e8m0(t.scales[static_cast<size_t>((r * cols + c) / 32)]);
      }
    t.W.scales = t.scales.data();
  } else {
    const auto vals = nonzero(static_cast<size_t>(rows * cols), rng);
    t.bytes.resize(vals.size() * static_cast<size_t>(k3::row_data_bytes(f, 1)));
    for (size_t i = 0; i < vals.size(); ++i) {
      if (f == k3::WeightFormat::F32) {
        std::memcpy(t.bytes.data() + 4 * i, &vals[i], 4);
        t.ref[i] = vals[i];
      } else {
        // random bit patterns of normal, finite values (exponent field away from 0 and max)
        uint16_t h;
        if (f == k3::WeightFormat::BF16) {
          h = static_cast<uint16_t>((rng() & 0x807f) | ((120 + rng() % 10) << 7));
          t.ref[i] = ref_bf16(h);
        } else {
          h = static_cast<uint16_t>((rng() & 0x83ff) | ((8 + rng() % 10) << 10));
          t.ref[i] = ref_f16(h);
        }
        std::memcpy(t.bytes.data() + 2 * i, &h, 2);
      }
    }
  }
  t.W.data = t.bytes.data();
  return t;
}

// The kernel tests below run once per CPU tier with kernels (cpu_isa.h), the tier forced in-process;
// a tier the CPU cannot run is skipped with the reason.
class CpuKernelsTier : public k3test::CpuTierTest {};
INSTANTIATE_TEST_SUITE_P(Tiers, CpuKernelsTier, k3test::kAllCpuTiers, k3test::cpu_tier_name);

// The avx512bf16 tier rounds the activations of BF16 and MXFP4 matmuls (weight_kernels_avx512bf16.cpp);
// every other (tier, format) pair computes exact fp32 products.
// So does the avx2int8 tier for MXFP4 (weight_kernels_avx2int8.cpp: the same int8 quads), not for BF16.
bool rounds_activations(k3::WeightFormat f) {
  const k3::cpu::CpuIsa tier = k3::cpu::active_tier_for_testing();
  const bool mxfp4 = f == k3::WeightFormat::MXFP4 || f == k3::WeightFormat::MXFP4_GGML;
  const bool bf16_tier = tier == k3::cpu::CpuIsa::Avx512Bf16 || tier == k3::cpu::CpuIsa::Amx;  // amx: AMX BF16, avx512bf16's MXFP4
  return (bf16_tier && (f == k3::WeightFormat::BF16 || mxfp4)) ||
         (tier == k3::cpu::CpuIsa::Avx2Int8 && mxfp4);
}

// Bound on |sum w (x' - x)| where x' are the activations as the active tier rounds them (0 when exact):
// - bf16 (round to nearest even, 8 significant bits, unit roundoff 2^-8): |x' - x| <= 2^-8 |x|;
// - int8 per quad (MXFP4; a quad: the 4 activations one vpdpbusd lane sums, elements 8j + {0,2,4,6} or
//   8j + {1,3,5,7}): d = max|x| / 127 over the quad rounded up, so d <= max|x| / 127 (1 + 2^-23) + 2^-149
//   (the last for denormal d), and |x' - x| = |q d - x| <= d/2 (1 + 2^-16) (x / d itself rounds once).
// w: the row's float64 weights, x: the token's activations, C values each.
double activation_rounding_bound(k3::WeightFormat f, const double* w, const float* x, int64_t C) {
  if (!rounds_activations(f)) return 0;
  double b = 0;
  if (f == k3::WeightFormat::BF16) {
    for (int64_t c = 0; c < C; ++c) b += std::ldexp(std::fabs(w[c] * x[c]), -8);
    return b;
  }
  for (int64_t q = 0; q < C / 4; ++q) {  // quad q: window q / 2 of 8, parity q % 2
    double amax = 0, sw = 0;
    for (int64_t c = q / 2 * 8 + q % 2; c < q / 2 * 8 + 8; c += 2) {
      amax = std::max(amax, std::fabs(double(x[c])));
      sw += std::fabs(w[c]);
    }
    const double d = amax / 127 * (1 + std::ldexp(1.0, -23)) + std::ldexp(1.0, -149);
    b += d / 2 * (1 + std::ldexp(1.0, -16)) * sw;
  }
  return b;
}

// y = x W^T against float64; error of each output within the fp32 dot bound (see the file comment) plus,
// in a tier that rounds activations, the rounding bound above (the fp32 bound then applies to the rounded
// products, whose magnitudes sum to at most sum|wx| + that bound).
void check_matmul(const TestWeight& t, int64_t n, std::mt19937& rng, k3test::Worst& worst) {
  const int64_t R = t.W.rows, C = t.W.cols;
  const auto x = nonzero(static_cast<size_t>(n * C), rng);
  std::vector<float> y(static_cast<size_t>(n * R), NAN);
  k3::cpu::matmul(t.W, x.data(), n, y.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < R; ++r) {
      double s = 0, sa = 0;
      for (int64_t c = 0; c < C; ++c) {
        const double p = t.ref[static_cast<size_t>(r * C + c)] * x[static_cast<size_t>(i * C + c)];
        s += p;
        sa += std::fabs(p);
      }
      const double q = activation_rounding_bound(t.W.format, &t.ref[static_cast<size_t>(r * C)], &x[static_cast<size_t>(i * C)], C);
      const double err = std::fabs(y[static_cast<size_t>(i * R + r)] - s), bound = (C + 2) * kU * (sa + q) + q;
      ASSERT_LE(err, bound) << "rows " << R << " cols " << C << " n " << n << " token " << i << " row " << r;
      worst.add(err / (kU * sa));
    }
  // Batch invariance: token i alone gives the same bits as inside the batch.
  for (int64_t i : {int64_t{0}, n - 1}) {
    std::vector<float> y1(static_cast<size_t>(R));
    k3::cpu::matmul(t.W, x.data() + i * C, 1, y1.data());
    for (int64_t r = 0; r < R; ++r) ASSERT_EQ(y1[static_cast<size_t>(r)], y[static_cast<size_t>(i * R + r)]) << "token " << i << " of " << n << " rows " << R << " cols " << C << " format " << k3::weight_format_name(t.W.format);
  }
}

void run_matmul_sweep(k3::WeightFormat f, const std::vector<int64_t>& cols_list, const char* what) {
  std::mt19937 rng(17);
  k3test::Worst worst(what);  // printed: max err / (2^-24 sum|wx|), to compare with the bound C+2
  for (int64_t cols : cols_list)
    for (int64_t rows : {1, 7, 33})
      for (int64_t n : {1, 2, 3, 5, 9}) check_matmul(make_weight(f, rows, cols, rng), n, rng, worst);
  // Large enough for the threaded paths (rows*cols > 32768, rows*cols*n > 65536) and for more than one
  // 64-token block.
  const int64_t wide = k3::is_block_format(f) ? 224 : 131;
  check_matmul(make_weight(f, 301, wide, rng), 1, rng, worst);
  check_matmul(make_weight(f, 301, wide, rng), 70, rng, worst);
}

// The two MXFP4 layouts (core/mxfp4_ggml.h): ggml_blocks_to_mxfp4 (SSE2, on the GGUF streaming path) inverts the
// scalar mxfp4_to_ggml_blocks and vice versa, on random bytes (every nibble value in every position), and element
// j of a ggml block lands where the HF layout keeps element j (checked on one block element by element).
TEST(Mxfp4Layouts, GgmlBlocksRoundTrip) {
  std::mt19937 rng(41);
  const int64_t B = 4099;
  std::vector<uint8_t> packed(B * 16), scales(B), ggml(B * 17), packed2(B * 16), scales2(B), ggml2(B * 17);
  for (auto& x : packed) x = static_cast<uint8_t>(rng());
  for (auto& x : scales) x = static_cast<uint8_t>(rng());
  k3::mxfp4_to_ggml_blocks(packed.data(), scales.data(), B, ggml.data());
  k3::ggml_blocks_to_mxfp4(ggml.data(), B, packed2.data(), scales2.data());
  EXPECT_EQ(packed2, packed);
  EXPECT_EQ(scales2, scales);
  for (auto& x : ggml) x = static_cast<uint8_t>(rng());
  k3::ggml_blocks_to_mxfp4(ggml.data(), B, packed2.data(), scales2.data());
  k3::mxfp4_to_ggml_blocks(packed2.data(), scales2.data(), B, ggml2.data());
  EXPECT_EQ(ggml2, ggml);
  for (int j = 0; j < 32; ++j) {  // element j: ggml low nibble of qs[j] (j < 16) / high of qs[j - 16]; HF: nibble j of the row
    const int g = j < 16 ? ggml[1 + j] & 0xf : ggml[1 + j - 16] >> 4;
    const int h = j % 2 == 0 ? packed2[j / 2] & 0xf : packed2[j / 2] >> 4;
    EXPECT_EQ(h, g) << "element " << j;
  }
}

TEST_P(CpuKernelsTier, MatmulF32) { run_matmul_sweep(k3::WeightFormat::F32, {1, 7, 15, 16, 17, 31, 33, 100, 257}, "matmul f32"); }
TEST_P(CpuKernelsTier, MatmulBf16) { run_matmul_sweep(k3::WeightFormat::BF16, {1, 7, 15, 16, 17, 31, 33, 100, 257}, "matmul bf16"); }
TEST_P(CpuKernelsTier, MatmulF16) { run_matmul_sweep(k3::WeightFormat::F16, {1, 7, 15, 16, 17, 31, 33, 100, 257}, "matmul f16"); }
TEST_P(CpuKernelsTier, MatmulMxfp4) { run_matmul_sweep(k3::WeightFormat::MXFP4, {32, 64, 96, 160, 544}, "matmul mxfp4"); }
TEST_P(CpuKernelsTier, MatmulMxfp4Ggml) {
  run_matmul_sweep(k3::WeightFormat::MXFP4_GGML, {32, 64, 96, 160, 544}, "matmul mxfp4_ggml");
}

// ggml's MXFP4 block and the HF layout holding the same values give the same bits through every path
// (dot, gemm tiles, dequant; in avx512bf16 the int8-activation path, pairs of blocks and a lone last one):
// what makes a GGUF's MXFP4 experts reproduce the HF checkpoint's logits.
TEST_P(CpuKernelsTier, Mxfp4GgmlSameBitsAsMxfp4) {
  std::mt19937 rng(53);
  for (int64_t cols : {32, 96, 544})
    for (int64_t n : {1, 3, 8, 13}) {
      const TestWeight hf = make_weight(k3::WeightFormat::MXFP4, 37, cols, rng);
      const TestWeight gg = to_ggml(hf);
      const auto x = nonzero(static_cast<size_t>(n * cols), rng);
      std::vector<float> a(static_cast<size_t>(n * 37), NAN), b(a.size(), NAN);
      k3::cpu::matmul(hf.W, x.data(), n, a.data());
      k3::cpu::matmul(gg.W, x.data(), n, b.data());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "cols " << cols << " n " << n;
      std::vector<float> da(static_cast<size_t>(cols)), db(da.size());
      for (int64_t r = 0; r < 37; ++r) {
        k3::cpu::dequant_row(hf.W, r, da.data());
        k3::cpu::dequant_row(gg.W, r, db.data());
        ASSERT_EQ(std::memcmp(da.data(), db.data(), da.size() * sizeof(float)), 0) << "dequant row " << r;
      }
    }
}

// Batch invariance of the register-blocked multi-token kernels (weight_gemm.cpp): every token's row of
// matmul(W, x, n) has the bytes of matmul(W, x_t, 1), for token counts that fill the tiles (3 tokens for
// float formats, 8 for MXFP4) exactly, partly and several times over, row counts that are not multiples
// of the 2-row tile nor of a cache block, and the threaded path (the 301-row, 100-token cases). Compared
// with memcmp, not ==, so a -0 / +0 or NaN-payload difference fails too.
void check_batch_invariance_shapes(k3::WeightFormat f, const std::vector<int64_t>& cols_list,
                                   const std::vector<int64_t>& rows_list, const std::vector<int64_t>& n_list) {
  std::mt19937 rng(23);
  for (int64_t cols : cols_list)
    for (int64_t rows : rows_list)
      for (int64_t n : n_list) {
        if (rows == 301 && n < 64) continue;  // keeps the test fast; small n is covered by the other rows
        const TestWeight t = make_weight(f, rows, cols, rng);
        const auto x = nonzero(static_cast<size_t>(n * cols), rng);
        std::vector<float> y(static_cast<size_t>(n * rows), NAN), y1(static_cast<size_t>(rows), NAN);
        k3::cpu::matmul(t.W, x.data(), n, y.data());
        for (int64_t i = 0; i < n; ++i) {
          k3::cpu::matmul(t.W, x.data() + i * cols, 1, y1.data());
          ASSERT_EQ(std::memcmp(y1.data(), y.data() + i * rows, static_cast<size_t>(rows) * sizeof(float)), 0)
              << k3::weight_format_name(f) << " rows " << rows << " cols " << cols << " token " << i << " of " << n;
        }
      }
}

void check_batch_invariance(k3::WeightFormat f, const std::vector<int64_t>& cols_list) {
  check_batch_invariance_shapes(f, cols_list, {1, 5, 37, 301}, {1, 2, 3, 5, 8, 17, 64, 100});
}

// matmul_batch (the MoE experts' one fork-join): every job's output has the bytes matmul gives it alone,
// for a mix of formats, token counts (1: the dot path, 3 and 9: gemm tiles) and row counts that do not
// divide into the blocks, with enough bytes that the pool runs it threaded.
TEST_P(CpuKernelsTier, MatmulBatchEqualsOneByOne) {
  std::mt19937 rng(29);
  std::vector<TestWeight> ws;
  std::vector<std::vector<float>> xs, ys, want;
  std::vector<k3::cpu::MatmulJob> jobs;
  const struct {
    k3::WeightFormat f;
    int64_t rows, cols, n;
  } shapes[] = {{k3::WeightFormat::MXFP4, 301, 256, 1}, {k3::WeightFormat::MXFP4, 77, 128, 3},
                {k3::WeightFormat::BF16, 203, 100, 1},  {k3::WeightFormat::BF16, 17, 64, 9},
                {k3::WeightFormat::F32, 130, 33, 1},    {k3::WeightFormat::F16, 40, 50, 3}};
  for (const auto& sh : shapes) {
    ws.push_back(make_weight(sh.f, sh.rows, sh.cols, rng));
    xs.push_back(nonzero(static_cast<size_t>(sh.n * sh.cols), rng));
    ys.emplace_back(static_cast<size_t>(sh.n * sh.rows), NAN);
    want.emplace_back(static_cast<size_t>(sh.n * sh.rows), NAN);
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    jobs.push_back({&ws[i].W, xs[i].data(), shapes[i].n, ys[i].data()});
    k3::cpu::matmul(ws[i].W, xs[i].data(), shapes[i].n, want[i].data());
  }
  for (int rep = 0; rep < 20; ++rep) {  // different thread interleavings
    for (auto& y : ys) std::fill(y.begin(), y.end(), NAN);
    k3::cpu::matmul_batch(jobs);
    for (size_t i = 0; i < ws.size(); ++i)
      ASSERT_EQ(std::memcmp(ys[i].data(), want[i].data(), ys[i].size() * sizeof(float)), 0)
          << "job " << i << " (" << k3::weight_format_name(shapes[i].f) << ") rep " << rep;
  }
  k3::cpu::matmul_batch({});  // nothing to do
}

// matmul_two_stage (the routed experts' one fork-join at decode): the gate/up jobs of each group, the group's
// GLU as soon as they are done, then its down job, all in one pool call -- every output with the bytes the
// staged matmuls give, over thread interleavings, groups of different sizes (one with no tokens: ready at once)
// and enough bytes that the pool runs it threaded.
TEST_P(CpuKernelsTier, MatmulTwoStageEqualsStagedMatmuls) {
  std::mt19937 rng(31);
  struct Group {
    TestWeight gate, up, down;
    int64_t n;
    std::vector<float> x, g, u, h, y, want;
  };
  const k3::WeightFormat fmts[] = {k3::WeightFormat::MXFP4, k3::WeightFormat::BF16, k3::WeightFormat::MXFP4,
                                   k3::WeightFormat::MXFP4, k3::WeightFormat::BF16};
  const int64_t ns[] = {1, 3, 0, 1, 2};
  const int64_t X = 256, I = 192;
  std::vector<Group> gs(5);
  for (size_t i = 0; i < gs.size(); ++i) {
    Group& G = gs[i];
    G.gate = make_weight(fmts[i], I, X, rng);
    G.up = make_weight(fmts[i], I, X, rng);
    G.down = make_weight(fmts[i], X, I, rng);
    G.n = ns[i];
    G.x = nonzero(static_cast<size_t>(std::max<int64_t>(G.n, 1) * X), rng);
    G.g.assign(static_cast<size_t>(G.n * I), NAN);
    G.u = G.g;
    G.h = G.g;
    G.y.assign(static_cast<size_t>(G.n * X), NAN);
    G.want = G.y;
    if (G.n == 0) continue;
    std::vector<float> g(G.g.size()), u(G.g.size()), h(G.g.size());
    k3::cpu::matmul(G.gate.W, G.x.data(), G.n, g.data());
    k3::cpu::matmul(G.up.W, G.x.data(), G.n, u.data());
    k3::cpu::silu_glu(g.data(), u.data(), G.n * I, h.data());
    k3::cpu::matmul(G.down.W, h.data(), G.n, G.want.data());
  }
  std::vector<k3::cpu::MatmulJob> first, second;
  std::vector<int> first_group, second_group;
  for (size_t i = 0; i < gs.size(); ++i) {
    Group& G = gs[i];
    first.push_back({&G.gate.W, G.x.data(), G.n, G.g.data()});
    first.push_back({&G.up.W, G.x.data(), G.n, G.u.data()});
    first_group.insert(first_group.end(), {static_cast<int>(i), static_cast<int>(i)});
    second.push_back({&G.down.W, G.h.data(), G.n, G.y.data()});
    second_group.push_back(static_cast<int>(i));
  }
  for (int rep = 0; rep < 20; ++rep) {  // different thread interleavings
    std::vector<std::atomic<int>> calls(gs.size());
    for (auto& G : gs) std::fill(G.y.begin(), G.y.end(), NAN);
    k3::cpu::matmul_two_stage(first, first_group, second, second_group, static_cast<int>(gs.size()), [&](int g) {
      Group& G = gs[static_cast<size_t>(g)];
      calls[static_cast<size_t>(g)].fetch_add(1);
      k3::cpu::silu_glu(G.g.data(), G.u.data(), G.n * I, G.h.data());
    });
    for (size_t i = 0; i < gs.size(); ++i) {
      EXPECT_EQ(calls[i].load(), 1) << "group " << i << " rep " << rep;
      if (gs[i].y.empty()) continue;  // a group without tokens (memcmp of null pointers is undefined even for 0 bytes)
      ASSERT_EQ(std::memcmp(gs[i].y.data(), gs[i].want.data(), gs[i].y.size() * sizeof(float)), 0)
          << "group " << i << " (" << k3::weight_format_name(fmts[i]) << ", n " << gs[i].n << ") rep " << rep;
    }
  }
}

// The one-token MXFP4 rows (avx512bf16 tier: mxfp4_one_token_rows, operands swapped on vpdpbusd, rows in groups of
// up to 4) must give the token tile's bits for every E8M0 scale byte, the denormal 0 and 1, the largest 254 and
// NaN's 255 included (written for session 40's in-vector scale conversion, since reverted; kept for any rewrite of
// the one-token scale path). Rows of 16 / 33 / 48 groups (one and two 8-pair blocks, a lone last group) in both
// layouts, every scale byte cycling through the edge values and random ones (row 6 only 0 / 1, whose result is then
// denormal scale products alone; row 7 only 253 / 254): each one-token row against the same token's row of a
// 3-token product (the tile, table scales), by bytes.
TEST_P(CpuKernelsTier, Mxfp4OneTokenEdgeScalesEqualTheTile) {
  std::mt19937 rng(71);
  const uint8_t edge[] = {0, 1, 2, 3, 126, 127, 128, 200, 253, 254};
  for (int64_t cols : {512, 1056, 1536})
    for (const bool ggml : {false, true}) {
      TestWeight hf = make_weight(k3::WeightFormat::MXFP4, 9, cols, rng);
      const size_t per_row = static_cast<size_t>(cols / 32);
      for (size_t i = 0; i < hf.scales.size(); ++i)
        hf.scales[i] = i % 3 == 2 ? static_cast<uint8_t>(110 + rng() % 30) : edge[(i / 3 * 2 + i % 3) % sizeof(edge)];
      for (size_t g = 0; g < per_row; ++g) {
        hf.scales[6 * per_row + g] = static_cast<uint8_t>(g % 2 ? 0 : 1);      // row 6: only denormal scales
        hf.scales[7 * per_row + g] = static_cast<uint8_t>(g % 2 ? 253 : 254);  // row 7: only the largest
      }
      hf.scales[8 * per_row + 5] = 255;  // row 8 only: NaN
      const TestWeight t = ggml ? to_ggml(hf) : hf;
      // activations scaled down so that scale 254's products stay finite in most rows
      const auto x = nonzero(static_cast<size_t>(3 * cols), rng, 1.0 / 1024);
      std::vector<float> y3(static_cast<size_t>(3 * 9), NAN), y1(9, NAN);
      k3::cpu::matmul(t.W, x.data(), 3, y3.data());
      for (int64_t tok = 0; tok < 3; ++tok) {
        k3::cpu::matmul(t.W, x.data() + tok * cols, 1, y1.data());
        for (int64_t r = 0; r < 9; ++r) {
          const float a = y1[static_cast<size_t>(r)], b = y3[static_cast<size_t>(tok * 9 + r)];
          if (std::isnan(a) || std::isnan(b))
            EXPECT_TRUE(std::isnan(a) && std::isnan(b)) << "cols " << cols << " ggml " << ggml << " token " << tok << " row " << r;
          else
            EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0)
                << a << " vs " << b << " cols " << cols << " ggml " << ggml << " token " << tok << " row " << r;
        }
      }
    }
}

TEST_P(CpuKernelsTier, MatmulBatchInvariantF32) { check_batch_invariance(k3::WeightFormat::F32, {7, 33, 50, 200}); }
TEST_P(CpuKernelsTier, MatmulBatchInvariantBf16) {
  check_batch_invariance(k3::WeightFormat::BF16, {7, 33, 50, 200});
  // n x cols past 65536: the tokens are converted (and, in the amx tier, their B tiles packed) over the pool
  check_batch_invariance_shapes(k3::WeightFormat::BF16, {1000}, {37}, {70, 100});
}
TEST_P(CpuKernelsTier, MatmulBatchInvariantF16) { check_batch_invariance(k3::WeightFormat::F16, {7, 33, 50, 200}); }
TEST_P(CpuKernelsTier, MatmulBatchInvariantMxfp4) { check_batch_invariance(k3::WeightFormat::MXFP4, {32, 160}); }
TEST_P(CpuKernelsTier, MatmulBatchInvariantMxfp4Ggml) { check_batch_invariance(k3::WeightFormat::MXFP4_GGML, {32, 160}); }

// Rows longer than one column block of the gemm (avx512: 1024 columns for float formats, 512 for MXFP4;
// the accumulators wait in memory between blocks): batch invariance and the float64 bound still hold,
// with a last block that ends in a tail (2100 = 2 x 1024 + 52: one 32-step and a masked 20; 1120 = 2 x 512
// + 96) and more rows than one state block (70 > 64).
TEST_P(CpuKernelsTier, MatmulLongRowsAcrossColumnBlocks) {
  for (auto f : {k3::WeightFormat::F32, k3::WeightFormat::BF16, k3::WeightFormat::F16, k3::WeightFormat::MXFP4})
    check_batch_invariance_shapes(f, {k3::is_block_format(f) ? int64_t{1120} : int64_t{2100}}, {5, 70}, {1, 7, 13, 64});
  std::mt19937 rng(43);
  k3test::Worst worst("matmul long rows");
  check_matmul(make_weight(k3::WeightFormat::BF16, 70, 2100, rng), 13, rng, worst);
  check_matmul(make_weight(k3::WeightFormat::MXFP4, 70, 1120, rng), 13, rng, worst);
}

// The three ways into a tier's kernels give the same bits: matmul (which a tier may run itself, converting
// the activations once: RowKernels::matmul), the per-row dot (row_dot) and the gemm over a row range.
TEST_P(CpuKernelsTier, DotGemmAndMatmulAgree) {
  std::mt19937 rng(41);
  for (auto f : {k3::WeightFormat::F32, k3::WeightFormat::BF16, k3::WeightFormat::F16, k3::WeightFormat::MXFP4,
                 k3::WeightFormat::MXFP4_GGML})
    for (int64_t cols : {32, 96, 544}) {
      const int64_t c = k3::is_block_format(f) ? cols : cols + 3, rows = 9, n = 14;
      const TestWeight t = make_weight(f, rows, c, rng);
      const auto x = nonzero(static_cast<size_t>(n * c), rng);
      std::vector<float> y(static_cast<size_t>(n * rows), NAN), yg(y.size(), NAN);
      k3::cpu::matmul(t.W, x.data(), n, y.data());
      const k3::cpu::RowKernels& k = k3::cpu::row_kernels(f);
      k.gemm(t.W, 2, 7, x.data(), n, yg.data());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t r = 0; r < rows; ++r) {
          const size_t at = static_cast<size_t>(i * rows + r);
          const float d = k3::cpu::row_dot(t.W, r, x.data() + i * c);
          ASSERT_EQ(std::memcmp(&d, &y[at], sizeof(float)), 0) << k3::weight_format_name(f) << " dot, token " << i << " row " << r;
          if (r >= 2 && r < 7) {
            ASSERT_EQ(std::memcmp(&yg[at], &y[at], sizeof(float)), 0) << k3::weight_format_name(f) << " gemm, token " << i << " row " << r;
          }
        }
    }
}

// A NaN activation makes every output of its token NaN and leaves the other tokens finite, in every tier
// (the avx512bf16 tier must not quantise it into a finite int8 value).
TEST_P(CpuKernelsTier, NanActivationGivesNan) {
  std::mt19937 rng(43);
  for (auto f : {k3::WeightFormat::BF16, k3::WeightFormat::MXFP4}) {
    const int64_t rows = 5, cols = 96, n = 3;
    const TestWeight t = make_weight(f, rows, cols, rng);
    auto x = nonzero(static_cast<size_t>(n * cols), rng);
    x[static_cast<size_t>(cols + 40)] = NAN;  // token 1, second block
    std::vector<float> y(static_cast<size_t>(n * rows));
    k3::cpu::matmul(t.W, x.data(), n, y.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < rows; ++r)
        EXPECT_EQ(std::isnan(y[static_cast<size_t>(i * rows + r)]), i == 1) << k3::weight_format_name(f) << " token " << i << " row " << r;
  }
}

// Every E2M1 code (incl. 0 and negative zero) at every position of a group, under the E8M0 edge scales:
// 0 (2^-127, an fp32 denormal), 1, 126, 127 (1.0), 128, 200, 254 (2^127). The activations are scaled so
// that the exact result stays finite in fp32; the kernel's doubled-value + 0.5*scale scheme must not
// overflow or flush where the exact result does not.
TEST_P(CpuKernelsTier, Mxfp4AllCodesAndEdgeScales) {
  std::mt19937 rng(5);
  for (int scale : {0, 1, 126, 127, 128, 200, 254}) {
    for (int code = 0; code < 16; ++code) {
      TestWeight t;
      t.W.format = k3::WeightFormat::MXFP4;
      t.W.rows = 1;
      t.W.cols = 32;
      t.bytes.assign(16, 0);
      // position p holds `code`; the others hold codes p+code mod 16, so every code meets every lane
      for (int p = 0; p < 32; ++p) {
        const int nib = (code + p) & 15;
        t.bytes[static_cast<size_t>(p / 2)] |= static_cast<uint8_t>(p % 2 ? nib << 4 : nib);
      }
      t.scales.assign(1, static_cast<uint8_t>(scale));
      t.W.data = t.bytes.data();
      t.W.scales = t.scales.data();
      // dequant_row: exact (every value is a small power-of-two multiple, representable in fp32)
      std::vector<float> row(32);
      k3::cpu::dequant_row(t.W, 0, row.data());
      for (int p = 0; p < 32; ++p) {
        const double want = ref_e2m1((code + p) & 15) * ref_e8m0(static_cast<uint8_t>(scale));
        if (std::fabs(want) > 3.4028234663852886e38)  // 2^127 x {2,3,4,6}: not an fp32 value, overflows
          ASSERT_EQ(static_cast<double>(row[static_cast<size_t>(p)]), want > 0 ? INFINITY : -INFINITY);
        else
          ASSERT_EQ(static_cast<double>(row[static_cast<size_t>(p)]), want) << "scale " << scale << " code " << ((code + p) & 15);
      }
      // the dot product, with x scaled so the sum stays in fp32 range: exact powers of two keep it exact
      const int xe = scale > 127 ? 127 - scale - 8 : 0;
      std::vector<float> x = nonzero(32, rng, std::ldexp(1.0, xe));
      double s = 0, sa = 0;
      for (int p = 0; p < 32; ++p) {
        const double w = ref_e2m1((code + p) & 15) * ref_e8m0(static_cast<uint8_t>(scale));
        s += w * x[static_cast<size_t>(p)];
        sa += std::fabs(w * x[static_cast<size_t>(p)]);
      }
      float y = NAN;
      k3::cpu::matmul(t.W, x.data(), 1, &y);
      // With scale 0 the products are fp32 denormals: allow their absolute granularity 2^-149 per term. The
      // avx512bf16 tier quantises x to int8 (here denormal x for the large scales): plus its rounding bound.
      std::vector<double> wref(32);
      for (int p = 0; p < 32; ++p) wref[static_cast<size_t>(p)] = ref_e2m1((code + p) & 15) * ref_e8m0(static_cast<uint8_t>(scale));
      const double q = activation_rounding_bound(k3::WeightFormat::MXFP4, wref.data(), x.data(), 32);
      EXPECT_LE(std::fabs(y - s), 34 * kU * (sa + q) + q + 32 * std::ldexp(1.0, -149)) << "scale " << scale << " code " << code;
    }
  }
}

// The largest products the int8 paths meet: every weight +-6 (the largest E2M1 magnitude, doubled 12 in
// the kernels) against activations that quantise to +-127 with the weight's sign, so every product is
// +12 x 127 (avx2int8's maddubs sums two into an int16: 3048, far from its saturation at 32767; an
// offset +128 byte would give 2 x 12 x 255 = 6120), and the same with the signs flipped in every other
// quad. The activations are representable (q d exact), so the result is within the fp32 dot bound.
TEST_P(CpuKernelsTier, Mxfp4LargestProducts) {
  std::mt19937 rng(7);
  for (int64_t cols : {32, 544})
    for (int64_t n : {1, 5}) {
      TestWeight t = make_weight(k3::WeightFormat::MXFP4, 3, cols, rng);
      for (int64_t r = 0; r < 3; ++r)
        for (int64_t c = 0; c < cols; c += 2) {  // element c: code 7 (+6) or 15 (-6) by c / 8 and the row
          auto code = [&](int64_t e) { return ((e / 8 + r) % 2) ? 15 : 7; };
          t.bytes[static_cast<size_t>((r * cols + c) / 2)] = static_cast<uint8_t>(code(c) | code(c + 1) << 4);
          for (int64_t e : {c, c + 1})
            t.ref[static_cast<size_t>(r * cols + e)] = ref_e2m1(code(e)) * ref_e8m0(t.scales[static_cast<size_t>((r * cols + e) / 32)]);
        }
      std::vector<float> x(static_cast<size_t>(n * cols));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < cols; ++c)  // sign of row 0's weight, flipped in every other quad for token i odd
          x[static_cast<size_t>(i * cols + c)] = static_cast<float>(((c / 8) % 2 ? -1 : 1) * (i % 2 && (c / 2) % 2 ? -1 : 1) * 127.0 / 64);
      std::vector<float> y(static_cast<size_t>(n * 3), NAN);
      k3::cpu::matmul(t.W, x.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t r = 0; r < 3; ++r) {
          double s = 0, sa = 0;
          for (int64_t c = 0; c < cols; ++c) {
            const double p = t.ref[static_cast<size_t>(r * cols + c)] * x[static_cast<size_t>(i * cols + c)];
            s += p;
            sa += std::fabs(p);
          }
          ASSERT_LE(std::fabs(y[static_cast<size_t>(i * 3 + r)] - s), (cols + 2) * kU * sa) << "cols " << cols << " token " << i << " row " << r;
        }
    }
}

// The int8 quads of the rounding tiers (avx2int8, avx512bf16: RowKernels::prepare of MXFP4) against their
// scalar definition, byte for byte: per pair of 32-blocks the even elements of g0, of g1, the odd of g0,
// of g1 (16 bytes each; avx512bf16 stores q + 128), then the 16 quads' scales; d = max|x| / 127 rounded up
// (computed here in double: a / 127 is never within a double ulp of a float it is not equal to), q =
// round-to-nearest-even of the fp32 quotient x / d. A quad with a NaN or an infinity has d = NaN (its q
// bytes do not matter); an all-zero quad has d = 0, q = 0; a missing g1 too. Random activations, plus
// denormals, exact multiples of 127 (d exact), zeros, NaN and infinities.
TEST(CpuKernels, Int8QuadActivationsMatchScalarDefinition) {
  int tiers_run = 0;
  for (k3::cpu::CpuIsa isa : {k3::cpu::CpuIsa::Avx2Int8, k3::cpu::CpuIsa::Avx512Bf16}) {
    if (!k3::cpu::isa_missing_features(k3::cpu::cpu_state().features, isa, false).empty()) continue;
    ++tiers_run;
    const uint8_t offset = isa == k3::cpu::CpuIsa::Avx512Bf16 ? 0x80 : 0;
    k3::cpu::force_cpu_isa_for_testing(isa);
    const k3::cpu::RowKernels& k = k3::cpu::row_kernels(k3::WeightFormat::MXFP4);
    std::mt19937 rng(61);
    for (int64_t cols : {32, 64, 96, 544}) {
      const int64_t n = 4;
      auto x = nonzero(static_cast<size_t>(n * cols), rng);
      x[1] = 1e-40f, x[3] = -3e-39f;                                        // denormals among normals
      for (int64_t j = 8; j < 16; j += 2) x[static_cast<size_t>(j)] = (j - 7) * -7e-41f;  // a denormal quad
      for (int64_t j = 0; j < 8; j += 2) x[static_cast<size_t>(cols + j)] = 0.f;  // token 1: an all-zero quad
      x[static_cast<size_t>(cols + 9)] = 127.f * 0.25f;                     // a d that divides exactly
      x[static_cast<size_t>(2 * cols + 5)] = NAN;
      x[static_cast<size_t>(3 * cols + cols - 1)] = -INFINITY;
      std::vector<uint8_t> act(static_cast<size_t>(k.act_bytes(cols, n)), 0xAA);
      k.prepare(x.data(), n, cols, act.data());
      const int64_t groups = cols / 32, pairs = (groups + 1) / 2, ld = pairs * 128;
      ASSERT_EQ(k.act_bytes(cols, n), n * ld);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t p = 0; p < pairs; ++p)
          for (int b = 0; b < 2; ++b)
            for (int par = 0; par < 2; ++par)
              for (int q = 0; q < 4; ++q) {
                const uint8_t* o = act.data() + t * ld + p * 128;
                float d;
                std::memcpy(&d, o + 64 + 4 * (8 * par + 4 * b + q), 4);
                const auto where = [&] { return ::testing::Message() << k3::cpu::isa_name(isa) << " cols " << cols << " token " << t << " pair " << p << " block " << b << " parity " << par << " quad " << q; };
                const int64_t g = 2 * p + b;
                const int64_t e0 = g * 32 + 8 * q + par;
                if (g >= groups) {
                  ASSERT_EQ(d, 0.f) << where();
                  for (int j = 0; j < 4; ++j) ASSERT_EQ(o[32 * par + 16 * b + 4 * q + j], offset) << where();
                  continue;
                }
                double a = 0;
                bool finite = true;
                for (int j = 0; j < 4; ++j) {
                  const float v = x[static_cast<size_t>(t * cols + e0 + 2 * j)];
                  finite = finite && std::isfinite(v);
                  a = std::max(a, std::fabs(double(v)));
                }
                if (!finite) {
                  ASSERT_TRUE(std::isnan(d)) << where();
                  continue;
                }
                float want = static_cast<float>(a / 127);
                if (double(want) < a / 127) want = std::nextafter(want, INFINITY);
                ASSERT_EQ(d, want) << where() << " max " << a;
                for (int j = 0; j < 4; ++j) {
                  const float v = x[static_cast<size_t>(t * cols + e0 + 2 * j)];
                  const int qv = want > 0 ? static_cast<int>(std::nearbyint(v / want)) : 0;
                  ASSERT_LE(std::abs(qv), 127);
                  ASSERT_EQ(o[32 * par + 16 * b + 4 * q + j], static_cast<uint8_t>(static_cast<uint8_t>(static_cast<int8_t>(qv)) ^ offset))
                      << where() << " element " << j;
                }
              }
    }
    k3::cpu::force_cpu_isa_for_testing(std::nullopt);
  }
  if (tiers_run == 0) GTEST_SKIP() << "this CPU runs no int8-activation tier";
}

TEST_P(CpuKernelsTier, DequantRowExact) {
  std::mt19937 rng(9);
  for (auto f : {k3::WeightFormat::F32, k3::WeightFormat::BF16, k3::WeightFormat::F16, k3::WeightFormat::MXFP4})
    for (int64_t cols : {32, 96, 352}) {
      const int64_t c = k3::is_block_format(f) ? cols : cols + 5;  // odd lengths where the layout allows
      auto t = make_weight(f, 3, c, rng);
      std::vector<float> row(static_cast<size_t>(c));
      for (int64_t r = 0; r < 3; ++r) {
        k3::cpu::dequant_row(t.W, r, row.data());
        for (int64_t i = 0; i < c; ++i)
          ASSERT_EQ(static_cast<double>(row[static_cast<size_t>(i)]), t.ref[static_cast<size_t>(r * c + i)])
              << k3::weight_format_name(f) << " row " << r << " col " << i;
      }
    }
}

// RMSNorm: out = x / sqrt(mean(x^2) + eps) * w. Per element: the sum of squares is in double; then one
// float sqrt, one division and two products, each within 2^-24 relative: |err| <= 8 * 2^-24 |ref|.
TEST(CpuKernels, RmsNorm) {
  std::mt19937 rng(3);
  k3test::Worst worst("rmsnorm (in units of 2^-24 |ref|)");
  for (int64_t dim : {1, 7, 33, 130, 257})
    for (float eps : {1e-5f, 1e-6f, 0.5f})
      for (int64_t n : {1, 3})
        for (int mode = 0; mode < 4; ++mode) {  // 0: weights; 1: none; 2: strided; 3: in place
          const int64_t stride = mode == 2 ? dim + 3 : dim;
          // small rows (mean x^2 ~ 1e-5) make eps matter, as in the model's MLA norms
          auto x = nonzero(static_cast<size_t>(n * stride), rng, n == 3 ? 1.0 / 512 : 1.0);
          auto w = nonzero(static_cast<size_t>(dim), rng);
          std::vector<float> out(x.size(), NAN);
          const float* wp = mode == 1 ? nullptr : w.data();
          std::vector<float> x0 = x;
          if (mode == 3) {
            k3::cpu::rmsnorm(x.data(), wp, n, dim, eps, x.data());
            out = x;
          } else {
            k3::cpu::rmsnorm(x.data(), wp, n, dim, eps, stride, out.data());
          }
          for (int64_t t = 0; t < n; ++t) {
            double ss = 0;
            for (int64_t i = 0; i < dim; ++i) ss += double(x0[static_cast<size_t>(t * stride + i)]) * x0[static_cast<size_t>(t * stride + i)];
            const double inv = 1.0 / std::sqrt(ss / dim + double(eps));
            for (int64_t i = 0; i < dim; ++i) {
              const double want = x0[static_cast<size_t>(t * stride + i)] * inv * (wp ? w[static_cast<size_t>(i)] : 1.0);
              const double err = std::fabs(out[static_cast<size_t>(t * stride + i)] - want);
              ASSERT_LE(err, 8 * kU * std::fabs(want)) << "dim " << dim << " eps " << eps << " mode " << mode;
              worst.add(err / (kU * std::fabs(want)));
            }
            if (mode == 2) {  // the gap between strided rows is untouched
              for (int64_t i = dim; i < stride && t + 1 < n; ++i) ASSERT_TRUE(std::isnan(out[static_cast<size_t>(t * stride + i)]));
            }
          }
        }
}

// GLUs. silu(g) u = g / (1 + e^-g) u: expf, one add, one division, one product: within 8 * 2^-24 of the
// exact value relative, plus the fp32 denormal floor where e^-g overflows (g < -88: exact ~1e-38).
// SiTU: beta tanh(g/beta) sigmoid(g) lb tanh(u/lb): two tanhf (glibc: <= 2 ulp), expf, 7 roundings:
// within 24 * 2^-24 relative.
TEST(CpuKernels, Glus) {
  std::mt19937 rng(4);
  auto g = nonzero(1001, rng, 8.0), u = nonzero(1001, rng, 8.0);
  g[0] = -95.f;  // e^-g overflows in fp32
  g[1] = 95.f;
  u[2] = 300.f;  // saturates the linear tanh
  auto ref_silu = [](double a, double b) { return a / (1 + std::exp(-a)) * b; };
  auto ref_situ = [](double a, double b, double be, double lb) {
    return be * std::tanh(a / be) / (1 + std::exp(-a)) * lb * std::tanh(b / lb);
  };
  std::vector<float> out(g.size());
  k3::cpu::silu_glu(g.data(), u.data(), static_cast<int64_t>(g.size()), out.data());
  for (size_t i = 0; i < g.size(); ++i) {
    const double want = ref_silu(g[i], u[i]);
    ASSERT_LE(std::fabs(out[i] - want), 8 * kU * std::fabs(want) + 1e-37) << "g " << g[i] << " u " << u[i];
  }
  for (auto [be, lb] : {std::pair{4.0f, 25.0f}, std::pair{1.0f, 3.0f}}) {
    k3::cpu::situ_glu(g.data(), u.data(), static_cast<int64_t>(g.size()), be, lb, out.data());
    for (size_t i = 0; i < g.size(); ++i) {
      const double want = ref_situ(g[i], u[i], be, lb);
      ASSERT_LE(std::fabs(out[i] - want), 24 * kU * std::fabs(want) + 1e-37) << "g " << g[i] << " u " << u[i] << " beta " << be;
    }
  }
  // out may alias gate (how the model calls them)
  auto g2 = g;
  k3::cpu::situ_glu(g2.data(), u.data(), static_cast<int64_t>(g2.size()), 4.f, 25.f, g2.data());
  k3::cpu::situ_glu(g.data(), u.data(), static_cast<int64_t>(g.size()), 4.f, 25.f, out.data());
  EXPECT_EQ(g2, out);
}

// Block Attention Residuals (model-spec 3.1): p = softmax_i(RMSNorm_noweight(v_i) . w), out = sum p_i v_i.
// Each score is O(sqrt(H)) and carries a relative error of a few 2^-24 (float rsqrt), which the softmax
// turns into a relative error of |score| * that in p: for H <= 257 and |score| <= ~16, below 4e-6 of
// max |out|; a wrong source, eps or missing normalisation is off by O(1).
TEST(CpuKernels, AttnResMix) {
  std::mt19937 rng(6);
  k3test::Worst worst("attn_res_mix");
  for (int64_t H : {1, 9, 37, 257})
    for (size_t m : {1u, 2u, 5u})
      for (int64_t n : {1, 3}) {
        std::vector<std::vector<float>> srcs;
        std::vector<const float*> ptrs;
        for (size_t i = 0; i < m; ++i) srcs.push_back(nonzero(static_cast<size_t>(n * H), rng, 1.0 + static_cast<double>(i)));
        for (auto& s : srcs) ptrs.push_back(s.data());
        k3::AttnResWeights w;
        w.w = nonzero(static_cast<size_t>(H), rng, 1.0 / std::sqrt(static_cast<double>(H)));
        const float eps = 1e-5f;
        std::vector<float> out(static_cast<size_t>(n * H), NAN);
        k3test::cpu_attn_res_mix(ptrs, w.w, n, H, eps, out.data());
        std::vector<double> want(out.size());
        for (int64_t t = 0; t < n; ++t) {
          std::vector<double> sc(m);
          double mx = -INFINITY;
          for (size_t i = 0; i < m; ++i) {
            const float* v = srcs[i].data() + t * H;
            double ss = 0, dot = 0;
            for (int64_t d = 0; d < H; ++d) ss += double(v[d]) * v[d];
            const double inv = 1.0 / std::sqrt(ss / H + eps);
            for (int64_t d = 0; d < H; ++d) dot += v[d] * inv * w.w[static_cast<size_t>(d)];
            sc[i] = dot;
            mx = std::max(mx, dot);
          }
          double sum = 0;
          for (auto& s : sc) sum += (s = std::exp(s - mx));
          for (int64_t d = 0; d < H; ++d) {
            double o = 0;
            for (size_t i = 0; i < m; ++i) o += sc[i] / sum * srcs[i][static_cast<size_t>(t * H + d)];
            want[static_cast<size_t>(t * H + d)] = o;
          }
        }
        const double e = k3test::rel_err(out, want);
        worst.add(e);
        ASSERT_LT(e, 4e-6) << "H " << H << " sources " << m << " n " << n;
      }
}

// The avx512 tier against the avx2 tier, same inputs: different lane counts sum in a different order,
// so the results are not bit-equal (at least one output must differ, else the forced tier did not run),
// but both are within the fp32 dot bound (C+2) u sum|wx| of the exact value, so within twice that of
// each other.
TEST(CpuKernels, Avx512CloseToAvx2) {
  const auto& cpu = k3::cpu::cpu_state();
  if (const std::string m = k3::cpu::isa_missing_features(cpu.features, k3::cpu::CpuIsa::Avx512, false); !m.empty())
    GTEST_SKIP() << "this CPU cannot run the avx512 tier (missing: " << m << ")";
  std::mt19937 rng(31);
  k3test::Worst worst("avx512 vs avx2 (in units of 2^-24 sum|wx|)");
  for (auto f : {k3::WeightFormat::F32, k3::WeightFormat::BF16, k3::WeightFormat::F16, k3::WeightFormat::MXFP4}) {
    const int64_t rows = 33, cols = k3::is_block_format(f) ? 544 : 257;
    const TestWeight t = make_weight(f, rows, cols, rng);
    for (int64_t n : {1, 9}) {
      const auto x = nonzero(static_cast<size_t>(n * cols), rng);
      std::vector<float> y2(static_cast<size_t>(n * rows)), y5(y2.size());
      k3::cpu::force_cpu_isa_for_testing(k3::cpu::CpuIsa::Avx2);
      k3::cpu::matmul(t.W, x.data(), n, y2.data());
      k3::cpu::force_cpu_isa_for_testing(k3::cpu::CpuIsa::Avx512);
      k3::cpu::matmul(t.W, x.data(), n, y5.data());
      k3::cpu::force_cpu_isa_for_testing(std::nullopt);
      EXPECT_NE(std::memcmp(y2.data(), y5.data(), y2.size() * sizeof(float)), 0) << k3::weight_format_name(f) << " n " << n;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t r = 0; r < rows; ++r) {
          double sa = 0;
          for (int64_t c = 0; c < cols; ++c)
            sa += std::fabs(t.ref[static_cast<size_t>(r * cols + c)] * x[static_cast<size_t>(i * cols + c)]);
          const size_t k = static_cast<size_t>(i * rows + r);
          const double diff = std::fabs(double(y5[k]) - double(y2[k]));
          ASSERT_LE(diff, 2 * (cols + 2) * kU * sa) << k3::weight_format_name(f) << " token " << i << " row " << r;
          worst.add(diff / (kU * sa));
        }
    }
  }
}

// A rounding tier's rounding is the only error it adds: on activations it represents exactly (bf16
// values; per quad of 4, integers -127..127 times a power of two with +-127 present) its BF16 and MXFP4
// matmuls are within the plain fp32 dot bound (C+2) u sum|wx| of float64, while on random activations they
// differ from the exact tier `exact` (else the tier would not be running).
void check_exact_on_representable(k3::cpu::CpuIsa exact, k3::cpu::CpuIsa rounding, std::vector<k3::WeightFormat> formats) {
  std::mt19937 rng(47);
  for (auto f : formats) {
    const int64_t rows = 33, cols = f == k3::WeightFormat::BF16 ? 257 : 544, n = 9;
    const TestWeight t = make_weight(f, rows, cols, rng);
    auto x = nonzero(static_cast<size_t>(n * cols), rng);
    std::vector<float> y5(static_cast<size_t>(n * rows)), yb(y5.size());
    k3::cpu::force_cpu_isa_for_testing(exact);
    k3::cpu::matmul(t.W, x.data(), n, y5.data());
    k3::cpu::force_cpu_isa_for_testing(rounding);
    k3::cpu::matmul(t.W, x.data(), n, yb.data());
    EXPECT_NE(std::memcmp(y5.data(), yb.data(), y5.size() * sizeof(float)), 0) << k3::weight_format_name(f);
    // Representable activations.
    if (f == k3::WeightFormat::BF16) {
      for (auto& v : x) {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        u &= 0xffff0000u;
        std::memcpy(&v, &u, 4);
      }
    } else {
      // every quad (elements 8j + {0,2,4,6}, 8j + {1,3,5,7}) holds a -127 or 127, so its scale is 2^ex
      std::uniform_int_distribution<int> k(-127, 127), e(-12, 4);
      for (int64_t b = 0; b < n * cols; b += 32) {
        const int ex = e(rng);
        for (int64_t j = 0; j < 32; ++j)
          x[static_cast<size_t>(b + j)] = static_cast<float>(std::ldexp(j % 8 < 2 ? (rng() & 1 ? 127 : -127) : k(rng), ex));
      }
    }
    k3::cpu::matmul(t.W, x.data(), n, yb.data());
    k3::cpu::force_cpu_isa_for_testing(std::nullopt);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0, sa = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double p = t.ref[static_cast<size_t>(r * cols + c)] * x[static_cast<size_t>(i * cols + c)];
          s += p;
          sa += std::fabs(p);
        }
        ASSERT_LE(std::fabs(yb[static_cast<size_t>(i * rows + r)] - s), (cols + 2) * kU * sa)
            << k3::weight_format_name(f) << " token " << i << " row " << r;
      }
  }
}

TEST(CpuKernels, Avx512Bf16ExactOnRepresentableActivations) {
  const auto& cpu = k3::cpu::cpu_state();
  if (const std::string m = k3::cpu::isa_missing_features(cpu.features, k3::cpu::CpuIsa::Avx512Bf16, false); !m.empty())
    GTEST_SKIP() << "this CPU cannot run the avx512bf16 tier (missing: " << m << ")";
  check_exact_on_representable(k3::cpu::CpuIsa::Avx512, k3::cpu::CpuIsa::Avx512Bf16, {k3::WeightFormat::BF16, k3::WeightFormat::MXFP4});
}

// The amx tier's BF16 matmul (AMX tiles) against avx512bf16's: both round the activations to bf16 the same way
// and both products are exact in fp32, so they differ only by the order of the fp32 sums: each within
// (C + 2) 2^-24 sum |w x'| of the exact sum of the rounded products, so within twice that of each other. Shapes
// around the tile edges (16 rows, 32 columns, 16 tokens), odd columns, one row, and rows split over threads.
// Skipped where the CPU (or its kernel) does not give AMX; the sweeps and the batch-invariance memcmps run it
// through CpuKernelsTier/amx as well.
TEST(CpuKernels, AmxBf16CloseToAvx512Bf16) {
  const auto& cpu = k3::cpu::cpu_state();
  if (const std::string m = k3::cpu::isa_missing_features(cpu.features, k3::cpu::CpuIsa::Amx, cpu.amx_status == "granted");
      !m.empty())
    GTEST_SKIP() << "this CPU cannot run the amx tier (missing: " << m << ")";
  std::mt19937 rng(41);
  int checked = 0;
  for (int64_t rows : {1, 17, 40, 301})
    for (int64_t cols : {2, 31, 64, 100, 1000})
      for (int64_t n : {1, 5, 16, 17, 37}) {
        const TestWeight t = make_weight(k3::WeightFormat::BF16, rows, cols, rng);
        const auto x = nonzero(static_cast<size_t>(n * cols), rng);
        std::vector<float> ya(static_cast<size_t>(n * rows), NAN), yb = ya;
        k3::cpu::force_cpu_isa_for_testing(k3::cpu::CpuIsa::Amx);
        k3::cpu::matmul(t.W, x.data(), n, ya.data());
        k3::cpu::force_cpu_isa_for_testing(k3::cpu::CpuIsa::Avx512Bf16);
        k3::cpu::matmul(t.W, x.data(), n, yb.data());
        k3::cpu::force_cpu_isa_for_testing(std::nullopt);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t r = 0; r < rows; ++r) {
            double sa = 0;
            for (int64_t c = 0; c < cols; ++c)
              sa += std::fabs(t.ref[static_cast<size_t>(r * cols + c)] * x[static_cast<size_t>(i * cols + c)]);
            const size_t o = static_cast<size_t>(i * rows + r);
            ASSERT_LE(std::fabs(double(ya[o]) - yb[o]), 2 * (cols + 2) * kU * sa * (1 + 1.0 / 256))
                << "rows " << rows << " cols " << cols << " n " << n << " token " << i << " row " << r;
            ++checked;
          }
      }
  EXPECT_GT(checked, 10000);
}

// The same for the avx2int8 tier (MXFP4 only: its BF16 is avx2's exact kernel, checked by the sweeps).
TEST(CpuKernels, Avx2Int8ExactOnRepresentableActivations) {
  const auto& cpu = k3::cpu::cpu_state();
  if (const std::string m = k3::cpu::isa_missing_features(cpu.features, k3::cpu::CpuIsa::Avx2Int8, false); !m.empty())
    GTEST_SKIP() << "this CPU cannot run the avx2int8 tier (missing: " << m << ")";
  check_exact_on_representable(k3::cpu::CpuIsa::Avx2, k3::cpu::CpuIsa::Avx2Int8,
                               {k3::WeightFormat::MXFP4, k3::WeightFormat::MXFP4_GGML});
}

}  // namespace

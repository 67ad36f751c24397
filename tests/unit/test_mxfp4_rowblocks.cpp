// The 16-row MXFP4 repack and its one-token product (backend/cpu/mxfp4_rowblocks.h) against float64: with the
// activations quantised the way the header states (re-derived here: one scale per block of values, round to nearest), the
// result must equal the float64 sum to fp32 rounding; against the unquantised x, within the quantisation's bound; the
// converted activations hold exactly those q and scales. Both MXFP4 layouts (HF and ggml's blocks) give the same
// repack; row ranges write only their rows; a NaN in x or an E8M0 255 gives NaN; bad shapes, ranges and jobs throw.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "k3/backend/cpu/mxfp4_rowblocks.h"
#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"

namespace {

using k3::WeightFormat;
using k3::WeightMatrix;

const double kE2M1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};

struct HfMxfp4 {
  int64_t rows, cols;
  std::vector<uint8_t> packed, scales;
  WeightMatrix view() const {
    WeightMatrix w;
    w.format = WeightFormat::MXFP4;
    w.data = packed.data();
    w.scales = scales.data();
    w.rows = rows;
    w.cols = cols;
    return w;
  }
  int code(int64_t r, int64_t c) const {
    const uint8_t b = packed[static_cast<size_t>(r * cols / 2 + c / 2)];
    return c % 2 ? b >> 4 : b & 15;
  }
  int scale(int64_t r, int64_t c) const { return scales[static_cast<size_t>(r * cols / 32 + c / 32)]; }
};

HfMxfp4 random_hf(int64_t rows, int64_t cols, uint64_t seed, int lo = 112, int span = 24) {
  HfMxfp4 m{rows, cols, std::vector<uint8_t>(static_cast<size_t>(rows * cols / 2)),
            std::vector<uint8_t>(static_cast<size_t>(rows * cols / 32))};
  std::mt19937_64 g(seed);
  for (auto& b : m.packed) b = static_cast<uint8_t>(g());
  for (auto& s : m.scales) s = static_cast<uint8_t>(lo + static_cast<int>(g() % static_cast<uint64_t>(span)));
  return m;
}

// ggml's block layout of the same values: {e8m0, qs[16]}, element j low nibble of qs[j], j + 16 its high nibble.
std::vector<uint8_t> to_ggml(const HfMxfp4& m) {
  std::vector<uint8_t> out(static_cast<size_t>(m.rows * m.cols / 32 * 17));
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t g = 0; g < m.cols / 32; ++g) {
      uint8_t* blk = out.data() + (r * (m.cols / 32) + g) * 17;
      blk[0] = static_cast<uint8_t>(m.scale(r, g * 32));
      for (int j = 0; j < 16; ++j)
        blk[1 + j] = static_cast<uint8_t>(m.code(r, g * 32 + j) | (m.code(r, g * 32 + j + 16) << 4));
    }
  return out;
}

std::vector<float> random_x(int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(g) * (g() % 7 == 0 ? 20.f : 1.f);  // some groups with an outlier
  return x;
}

// The header's quantisation, re-derived, with blocks of B = mxfp4_rowblocks_act_block() values (32 unless
// K3_MXFP4_RB_ACT_BLOCK says otherwise): m = max |x| a block, q = nearest-even of x x (127 / m), d = m / 127.
int act_block() { return k3::cpu::mxfp4_rowblocks_act_block(); }
void quantise(const std::vector<float>& x, std::vector<double>& xq, std::vector<double>& bound_d,
              std::vector<int>* qi = nullptr, std::vector<float>* df = nullptr) {
  const size_t B = static_cast<size_t>(act_block()), blocks = x.size() / B;
  xq.assign(x.size(), 0.0);
  bound_d.assign(blocks, 0.0);
  if (qi) qi->assign(x.size(), 0);
  if (df) df->assign(blocks, 0.f);
  for (size_t g = 0; g < blocks; ++g) {
    float mx = 0.f;
    for (size_t k = 0; k < B; ++k) mx = std::max(mx, std::fabs(x[g * B + k]));
    const float d = mx / 127.f, inv = mx >= 0x1p-120f ? 127.f / mx : 0.f;  // a tinier block: q = 0
    bound_d[g] = d;
    if (df) (*df)[g] = d;
    for (size_t k = 0; k < B; ++k) {
      const float q = std::nearbyint(x[g * B + k] * inv);
      xq[g * B + k] = static_cast<double>(q) * d;
      if (qi) (*qi)[g * B + k] = static_cast<int>(q);
    }
  }
}

bool cpu_ok() { return k3::cpu::mxfp4_rowblocks_cpu_ok(); }

// W's copy, and W with `tiled` pointing at it (what add_expert_decode_layouts makes).
struct Copied {
  std::vector<uint8_t> bytes;
  WeightMatrix W;
};
Copied copy_of(const WeightMatrix& W) {
  Copied c{std::vector<uint8_t>(static_cast<size_t>(k3::cpu::mxfp4_rowblocks_bytes(W))), W};
  k3::cpu::mxfp4_rowblocks_write(W, c.bytes.data());
  c.W.tiled = c.bytes.data();
  return c;
}

// One token's product of rows [r0, r1) through the copy (the converted activations made here).
std::vector<float> product(const Copied& c, const std::vector<float>& x, int64_t r0, int64_t r1) {
  std::vector<uint8_t> act(static_cast<size_t>(k3::cpu::mxfp4_rowblocks_act_bytes(c.W.cols)));
  k3::cpu::mxfp4_rowblocks_prepare(x.data(), 1, c.W.cols, act.data());
  std::vector<float> y(static_cast<size_t>(r1 - r0), std::nanf(""));
  k3::cpu::mxfp4_rowblocks_rows(c.W, r0, r1, act.data(), 1, y.data(), c.W.rows);
  return y;
}

TEST(Mxfp4RowBlocks, BothLayoutsRepackAlike) {
  const HfMxfp4 m = random_hf(48, 96, 1);
  const std::vector<uint8_t> gg = to_ggml(m);
  WeightMatrix wg;
  wg.format = WeightFormat::MXFP4_GGML;
  wg.data = gg.data();
  wg.rows = m.rows;
  wg.cols = m.cols;
  ASSERT_TRUE(k3::cpu::mxfp4_rowblocks_supported(m.view()));
  ASSERT_TRUE(k3::cpu::mxfp4_rowblocks_supported(wg));
  const Copied a = copy_of(m.view()), b = copy_of(wg);
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(static_cast<int64_t>(a.bytes.size()), m.view().bytes());  // the same bytes
  // The layout the header states: group g of block b at (b x 3 + g) x 272; quad q's byte s = rows s / 4 and s / 4 + 8
  // of column s % 4; then the 16 rows' scales.
  for (int64_t blk = 0; blk < 3; ++blk)
    for (int64_t g = 0; g < 3; ++g) {
      const uint8_t* grp = a.bytes.data() + (blk * 3 + g) * 272;
      for (int q = 0; q < 8; ++q)
        for (int s = 0; s < 32; ++s) {
          const int64_t r = 16 * blk + s / 4, c = 32 * g + 4 * q + s % 4;
          ASSERT_EQ(grp[32 * q + s] & 15, m.code(r, c)) << blk << " " << g << " " << q << " " << s;
          ASSERT_EQ(grp[32 * q + s] >> 4, m.code(r + 8, c)) << blk << " " << g << " " << q << " " << s;
        }
      for (int r = 0; r < 16; ++r) ASSERT_EQ(grp[256 + r], m.scale(16 * blk + r, 32 * g)) << blk << " " << g << " " << r;
    }
}

TEST(Mxfp4RowBlocks, ActivationsAreTheStatedQuantisation) {
  if (!cpu_ok()) GTEST_SKIP() << "this CPU lacks AVX2 + FMA";
  const int64_t cols = 2304;
  const std::vector<float> x = random_x(cols, 9);
  std::vector<double> xq, bd;
  std::vector<int> qi;
  std::vector<float> df;
  quantise(x, xq, bd, &qi, &df);
  std::vector<uint8_t> act(static_cast<size_t>(2 * k3::cpu::mxfp4_rowblocks_act_bytes(cols)));
  std::vector<float> two(x);
  two.insert(two.end(), x.rbegin(), x.rend());  // a second token: the first reversed
  k3::cpu::mxfp4_rowblocks_prepare(two.data(), 2, cols, act.data());
  const k3::cpu::Mxfp4GroupActs a = k3::cpu::mxfp4_rowblocks_acts(act.data(), cols);
  for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(a.q[c], qi[static_cast<size_t>(c)]) << c;
  ASSERT_EQ(a.block, act_block());
  for (int64_t g = 0; g < cols / act_block(); ++g) {
    ASSERT_EQ(std::memcmp(&a.d[g], &df[static_cast<size_t>(g)], 4), 0) << g;
    int sum = 0;
    for (int k = 0; k < act_block(); ++k) sum += qi[static_cast<size_t>(g * act_block() + k)];
    ASSERT_EQ(a.start[g], -12 * sum) << g;
  }
  const k3::cpu::Mxfp4GroupActs b =
      k3::cpu::mxfp4_rowblocks_acts(act.data() + k3::cpu::mxfp4_rowblocks_act_bytes(cols), cols);
  for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(b.q[c], qi[static_cast<size_t>(cols - 1 - c)]) << c;  // the same groups in reverse
}

// Extreme magnitudes: denormal and tiny blocks (127 / max overflows: q = 0, not -127 everywhere as vcvtps2dq of
// infinity and NaN gave), blocks at FLT_MAX, one huge value beside small ones -- the stated quantisation exactly.
TEST(Mxfp4RowBlocks, ActivationsAtExtremeMagnitudes) {
  if (!cpu_ok()) GTEST_SKIP() << "this CPU lacks AVX2 + FMA";
  const int64_t cols = 256;
  std::vector<float> x = random_x(cols, 61);
  for (int64_t c = 0; c < 32; ++c) x[static_cast<size_t>(c)] *= 1e-40f;   // denormals
  for (int64_t c = 32; c < 64; ++c) x[static_cast<size_t>(c)] = static_cast<float>(c - 48) * 1e-38f;  // max < 2^-120
  for (int64_t c = 64; c < 96; ++c) x[static_cast<size_t>(c)] = c % 2 ? 3.4e38f : -3.4e38f;
  x[100] = 1e30f;                                                          // beside values ~1
  std::vector<double> xq, bd;
  std::vector<int> qi;
  std::vector<float> df;
  quantise(x, xq, bd, &qi, &df);
  std::vector<uint8_t> act(static_cast<size_t>(k3::cpu::mxfp4_rowblocks_act_bytes(cols)));
  k3::cpu::mxfp4_rowblocks_prepare(x.data(), 1, cols, act.data());
  const k3::cpu::Mxfp4GroupActs a = k3::cpu::mxfp4_rowblocks_acts(act.data(), cols);
  for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(a.q[c], qi[static_cast<size_t>(c)]) << c;
  for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(a.q[c], 0) << c;
  for (int64_t c = 64; c < 96; ++c) ASSERT_EQ(a.q[c], c % 2 ? 127 : -127) << c;
  for (int64_t g = 0; g < cols / act_block(); ++g) ASSERT_TRUE(std::isfinite(a.d[g])) << g;
}

TEST(Mxfp4RowBlocks, OneTokenMatchesFloat64) {
  if (!cpu_ok()) GTEST_SKIP() << "this CPU lacks AVX2 + FMA";
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{16, 32}, {48, 96}, {256, 2304}}) {
    const HfMxfp4 m = random_hf(rows, cols, 7 + rows);
    const Copied cp = copy_of(m.view());
    const std::vector<float> x = random_x(cols, 3 + cols);
    std::vector<double> xq, d;
    quantise(x, xq, d);
    const std::vector<float> y = product(cp, x, 0, rows);
    double worst_q = 0, worst_x = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double sq = 0, sx = 0, mag = 0, qbound = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double w = kE2M1[m.code(r, c)] * std::ldexp(1.0, m.scale(r, c) - 127);
        sq += w * xq[static_cast<size_t>(c)];
        sx += w * x[static_cast<size_t>(c)];
        mag += std::fabs(w * xq[static_cast<size_t>(c)]);
        qbound += std::fabs(w) * d[static_cast<size_t>(c / act_block())] / 2;  // |x - xq| <= d / 2
      }
      ASSERT_TRUE(std::isfinite(y[static_cast<size_t>(r)])) << r;
      // Against the quantised x: the int32 dots are exact, so only fp32 rounding of the per-group products and the sum.
      const double eq = std::fabs(y[static_cast<size_t>(r)] - sq), tol_q = 1e-6 * mag + 1e-30;
      EXPECT_LE(eq, tol_q) << rows << "x" << cols << " row " << r;
      EXPECT_LE(std::fabs(y[static_cast<size_t>(r)] - sx), qbound * 1.0001 + tol_q) << rows << "x" << cols << " row " << r;
      worst_q = std::max(worst_q, eq / (mag + 1e-30));
      worst_x = std::max(worst_x, std::fabs(y[static_cast<size_t>(r)] - sx) / (qbound + 1e-30));
    }
    std::printf("[ mxfp4 rb16, blocks of %d ] %lldx%lld: vs quantised x %.2e of sum |w x|, vs x %.2f of the quantisation bound\n",
                act_block(), static_cast<long long>(rows), static_cast<long long>(cols), worst_q, worst_x);
  }
}

TEST(Mxfp4RowBlocks, RowRangeWritesOnlyItsRows) {
  if (!cpu_ok()) GTEST_SKIP() << "this CPU lacks AVX2 + FMA";
  const HfMxfp4 m = random_hf(64, 64, 21);
  const Copied cp = copy_of(m.view());
  const std::vector<float> x = random_x(64, 22);
  std::vector<uint8_t> act(static_cast<size_t>(k3::cpu::mxfp4_rowblocks_act_bytes(64)));
  k3::cpu::mxfp4_rowblocks_prepare(x.data(), 1, 64, act.data());
  std::vector<float> all(64), part(64, -7.f);
  k3::cpu::mxfp4_rowblocks_rows(cp.W, 0, 64, act.data(), 1, all.data(), 64);
  k3::cpu::mxfp4_rowblocks_rows(cp.W, 16, 48, act.data(), 1, part.data() + 16, 64);  // y indexed by r - r0
  for (int r = 0; r < 64; ++r) {
    if (r >= 16 && r < 48)
      EXPECT_EQ(std::memcmp(&part[static_cast<size_t>(r)], &all[static_cast<size_t>(r)], 4), 0) << r;  // the same bits
    else
      EXPECT_EQ(part[static_cast<size_t>(r)], -7.f) << r;
  }
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks_rows(cp.W, 0, 80, act.data(), 1, part.data(), 64), k3::Error);
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks_rows(cp.W, 32, 16, act.data(), 1, part.data(), 64), k3::Error);
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks_rows(cp.W, 8, 32, act.data(), 1, part.data(), 64), k3::Error);
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks_rows(cp.W, 0, 16, act.data(), 0, part.data(), 64), k3::Error);
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks_rows(cp.W, 0, 32, act.data(), 2, part.data(), 16), k3::Error);  // stride < rows
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks_rows(m.view(), 0, 16, act.data(), 1, part.data(), 64), k3::Error);  // no copy
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks_prepare(x.data(), 1, 40, act.data()), k3::Error);
}

// Batch invariance (docs/engine.md): 19 tokens in one call (tiles of 8, 8, 3) give each token the bits it gets alone,
// for a row range and through matmul_batch (one job of 19 tokens against 19 one-token jobs).
TEST(Mxfp4RowBlocks, TokensInABatchHaveTheirBitsAlone) {
  if (!cpu_ok()) GTEST_SKIP() << "this CPU lacks AVX2 + FMA";
  const int64_t rows = 48, cols = 160, n = 19;
  const HfMxfp4 m = random_hf(rows, cols, 51);
  const Copied cp = copy_of(m.view());
  const std::vector<float> x = random_x(n * cols, 52);
  const int64_t stride = k3::cpu::mxfp4_rowblocks_act_bytes(cols);
  std::vector<uint8_t> act(static_cast<size_t>(n * stride));
  k3::cpu::mxfp4_rowblocks_prepare(x.data(), n, cols, act.data());
  const int64_t ldy = 40;  // rows 16..47 of each token, a stride longer than them
  std::vector<float> batched(static_cast<size_t>(n * ldy), -7.f);
  k3::cpu::mxfp4_rowblocks_rows(cp.W, 16, 48, act.data(), n, batched.data(), ldy);
  std::vector<k3::cpu::MatmulJob> alone_jobs;
  std::vector<float> via_batch(static_cast<size_t>(n * rows)), via_alone(static_cast<size_t>(n * rows));
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<float> one(x.begin() + t * cols, x.begin() + (t + 1) * cols);
    const std::vector<float> y = product(cp, one, 16, 48);
    for (int64_t r = 0; r < 32; ++r)
      ASSERT_EQ(std::memcmp(&batched[static_cast<size_t>(t * ldy + r)], &y[static_cast<size_t>(r)], 4), 0) << t << " " << r;
    for (int64_t r = 32; r < ldy; ++r) ASSERT_EQ(batched[static_cast<size_t>(t * ldy + r)], -7.f) << t << " " << r;
    alone_jobs.push_back({&cp.W, x.data() + t * cols, 1, via_alone.data() + t * rows});
  }
  const k3::cpu::MatmulJob together{&cp.W, x.data(), n, via_batch.data()};
  k3::cpu::matmul_batch({&together, 1});
  k3::cpu::matmul_batch(alone_jobs);
  EXPECT_EQ(std::memcmp(via_batch.data(), via_alone.data(), via_batch.size() * 4), 0);
  for (int64_t t = 0; t < n; ++t)  // and they are the copy's products (not the stored rows' tier)
    EXPECT_EQ(std::memcmp(&via_batch[static_cast<size_t>(t * rows + 16)], &batched[static_cast<size_t>(t * ldy)], 32 * 4), 0) << t;
}

TEST(Mxfp4RowBlocks, NonFiniteInputsGiveNan) {
  if (!cpu_ok()) GTEST_SKIP() << "this CPU lacks AVX2 + FMA";
  HfMxfp4 m = random_hf(32, 64, 31);
  m.scales[static_cast<size_t>(5 * 2 + 1)] = 255;  // row 5, group 1: NaN
  m.scales[static_cast<size_t>(6 * 2)] = 0;        // row 6: the smallest scales (denormal 2^-128 x codes) stay finite
  m.scales[static_cast<size_t>(7 * 2)] = 1;
  const Copied cp = copy_of(m.view());
  std::vector<float> x = random_x(64, 32), y;
  y = product(cp, x, 0, 32);
  for (int r = 0; r < 32; ++r) EXPECT_EQ(std::isnan(y[static_cast<size_t>(r)]), r == 5) << r;
  x[40] = std::nanf("");
  y = product(cp, x, 0, 32);
  for (int r = 0; r < 32; ++r) EXPECT_TRUE(std::isnan(y[static_cast<size_t>(r)])) << r;
  x[40] = INFINITY;
  y = product(cp, x, 0, 32);
  for (int r = 0; r < 32; ++r) EXPECT_TRUE(std::isnan(y[static_cast<size_t>(r)])) << r;
}

// The two instruction-set forms (mxfp4_rowblocks_forms.h) give the same activation bytes and the same output bits: tokens
// 1..5 (the AVX2 form's tiles of 2 and the avx512bf16 form's of 8), row ranges, scales at every E8M0 extreme (0, 1: the
// denormals; 255: NaN), activations with zero, tiny, outlier and non-finite blocks. Where the CPU has only one form, that
// form is checked against float64 by the tests above.
TEST(Mxfp4RowBlocks, FormsAgreeBitForBit) {
  using k3::cpu::Mxfp4RowBlocksForm;
  if (!k3::cpu::mxfp4_rowblocks_form_ok(Mxfp4RowBlocksForm::Avx512Bf16)) GTEST_SKIP() << "this CPU has one form only";
  const int64_t rows = 64, cols = 320, n = 5;
  HfMxfp4 m = random_hf(rows, cols, 61, 100, 50);
  m.scales[3] = 0;
  m.scales[17] = 1;
  m.scales[40] = 255;
  m.scales[41] = 254;
  const Copied cp = copy_of(m.view());
  std::vector<float> x = random_x(n * cols, 62);
  for (int k = 0; k < 32; ++k) {
    x[static_cast<size_t>(32 + k)] = 0.f;                                   // token 0, block 1: zeros
    x[static_cast<size_t>(cols + 64 + k)] = 1e-38f * static_cast<float>(k);  // token 1, block 2: below 2^-120
  }
  x[static_cast<size_t>(2 * cols + 100)] = 3e38f;          // token 2: a huge value
  x[static_cast<size_t>(3 * cols + 7)] = std::nanf("");    // token 3: NaN
  x[static_cast<size_t>(4 * cols + 300)] = -INFINITY;      // token 4: -inf
  const int64_t stride = k3::cpu::mxfp4_rowblocks_act_bytes(cols);
  std::vector<uint8_t> a2(static_cast<size_t>(n * stride), 0), a5(a2);
  k3::cpu::mxfp4_rowblocks_prepare(x.data(), n, cols, a2.data(), Mxfp4RowBlocksForm::Avx2);
  k3::cpu::mxfp4_rowblocks_prepare(x.data(), n, cols, a5.data(), Mxfp4RowBlocksForm::Avx512Bf16);
  for (int64_t t = 0; t < n; ++t)  // the bytes each form writes (the stride's padding is neither's)
    EXPECT_EQ(std::memcmp(a2.data() + t * stride, a5.data() + t * stride, static_cast<size_t>(cols + cols / 32 * 8)), 0) << t;
  for (int64_t tokens = 1; tokens <= n; ++tokens)
    for (const auto& [r0, r1] : {std::pair<int64_t, int64_t>{0, rows}, {16, 48}}) {
      std::vector<float> y2(static_cast<size_t>(tokens * rows), -1.f), y5(y2);
      k3::cpu::mxfp4_rowblocks_rows(cp.W, r0, r1, a5.data(), tokens, y2.data(), rows, Mxfp4RowBlocksForm::Avx2);
      k3::cpu::mxfp4_rowblocks_rows(cp.W, r0, r1, a5.data(), tokens, y5.data(), rows, Mxfp4RowBlocksForm::Avx512Bf16);
      EXPECT_EQ(std::memcmp(y2.data(), y5.data(), y2.size() * 4), 0) << tokens << " tokens, rows " << r0 << ".." << r1;
      bool finite = false, nan = false;
      for (float v : y5) (std::isnan(v) ? nan : finite) = true;
      EXPECT_TRUE(finite);
      if (r0 == 0 || tokens >= 4) {
        EXPECT_TRUE(nan) << "row 4's NaN scale, token 3's NaN input";
      }
    }
}

TEST(Mxfp4RowBlocks, RefusesShapesAndJobsItCannotServe) {
  const HfMxfp4 m = random_hf(48, 96, 41);
  std::vector<uint8_t> out(static_cast<size_t>(m.view().bytes()));
  WeightMatrix w = m.view();
  w.rows = 40;  // not a multiple of 16
  EXPECT_FALSE(k3::cpu::mxfp4_rowblocks_supported(w));
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks_write(w, out.data()), k3::Error);
  w = m.view();
  w.cols = 80;  // not a multiple of 32
  EXPECT_FALSE(k3::cpu::mxfp4_rowblocks_supported(w));
  w = m.view();
  w.format = WeightFormat::BF16;
  EXPECT_FALSE(k3::cpu::mxfp4_rowblocks_supported(w));
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks_write(w, out.data()), k3::Error);
  // A job reads the copy at any token count, with the copy present, on the host.
  const Copied cp = copy_of(m.view());
  EXPECT_EQ(k3::cpu::mxfp4_rowblocks_job(cp.W, 1), cpu_ok());
  EXPECT_EQ(k3::cpu::mxfp4_rowblocks_job(cp.W, 40), cpu_ok());
  EXPECT_FALSE(k3::cpu::mxfp4_rowblocks_job(cp.W, 0));
  EXPECT_FALSE(k3::cpu::mxfp4_rowblocks_job(m.view(), 1));
  WeightMatrix dev = cp.W;
  dev.device = 0;
  EXPECT_FALSE(k3::cpu::mxfp4_rowblocks_job(dev, 1));
}

}  // namespace

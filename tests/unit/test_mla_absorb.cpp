// The absorbed MLA projections through kv_b (mla_absorb.h): against float64 on random inputs, the bf16-stored and
// fp32-stored kv_b giving the same bits, and each output's operations in the order the header states.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "k3/backend/cpu/mla_absorb.h"
#include "kernel_test_util.h"

namespace {

constexpr double kU = 1.0 / (1 << 24);

struct Dims {
  int64_t nh, dn, dv, kr, dr;
};

TEST(MlaAbsorb, Bf16AndF32StorageAgreeBitForBitAndMatchF64) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.f, 1.f);
  k3test::Worst worst("mla absorb / up-v (units of 2^-24 sum|w x|)");
  // K3's shapes, then ones that exercise every tail (64-column sweeps, 8-column steps, scalar columns).
  for (const Dims& D : {Dims{3, 128, 128, 512, 64}, Dims{2, 5, 3, 77, 4}, Dims{1, 9, 7, 8, 0}, Dims{2, 3, 2, 150, 2}}) {
    const int64_t rows = D.nh * (D.dn + D.dv);
    std::vector<uint16_t> b16(static_cast<size_t>(rows * D.kr));
    std::vector<float> f32(b16.size());
    for (size_t i = 0; i < b16.size(); ++i) {
      float v = nd(rng) * 0.05f;
      uint32_t u;
      std::memcpy(&u, &v, 4);
      b16[i] = static_cast<uint16_t>(u >> 16);
      u = static_cast<uint32_t>(b16[i]) << 16;
      std::memcpy(&f32[i], &u, 4);
    }
    k3::cpu::KvB kb{nullptr, b16.data(), D.dn, D.dv, D.kr}, kf{f32.data(), nullptr, D.dn, D.dv, D.kr};
    std::vector<float> q(static_cast<size_t>(D.dn + D.dr)), olat(static_cast<size_t>(D.kr));
    for (auto& v : q) v = nd(rng);
    for (auto& v : olat) v = nd(rng);
    for (int64_t h = 0; h < D.nh; ++h) {
      std::vector<float> a(static_cast<size_t>(D.kr + D.dr), NAN), b(a.size(), NAN);
      k3::cpu::mla_absorb_q_head(kb, h, D.dr, q.data(), a.data());
      k3::cpu::mla_absorb_q_head(kf, h, D.dr, q.data(), b.data());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "absorb h " << h << " kr " << D.kr;
      for (int64_t j = 0; j < D.kr; ++j) {
        double want = 0, mag = 0;
        for (int64_t d = 0; d < D.dn; ++d) {
          const double w = f32[static_cast<size_t>((h * (D.dn + D.dv) + d) * D.kr + j)];
          want += q[static_cast<size_t>(d)] * w;
          mag += std::fabs(q[static_cast<size_t>(d)] * w);
        }
        const double err = std::fabs(a[static_cast<size_t>(j)] - want);
        ASSERT_LE(err, (D.dn + 2) * kU * mag) << "absorb h " << h << " j " << j;
        if (mag > 0) worst.add(err / (kU * mag));
      }
      for (int64_t j = 0; j < D.dr; ++j) ASSERT_EQ(a[static_cast<size_t>(D.kr + j)], q[static_cast<size_t>(D.dn + j)]);

      std::vector<float> oa(static_cast<size_t>(D.dv), NAN), ob(oa.size(), NAN);
      k3::cpu::mla_up_v_head(kb, h, olat.data(), oa.data());
      k3::cpu::mla_up_v_head(kf, h, olat.data(), ob.data());
      ASSERT_EQ(std::memcmp(oa.data(), ob.data(), oa.size() * 4), 0) << "up_v h " << h << " kr " << D.kr;
      for (int64_t d = 0; d < D.dv; ++d) {
        double want = 0, mag = 0;
        for (int64_t j = 0; j < D.kr; ++j) {
          const double w = f32[static_cast<size_t>((h * (D.dn + D.dv) + D.dn + d) * D.kr + j)];
          want += w * olat[static_cast<size_t>(j)];
          mag += std::fabs(w * olat[static_cast<size_t>(j)]);
        }
        const double err = std::fabs(oa[static_cast<size_t>(d)] - want);
        ASSERT_LE(err, (D.kr + 2) * kU * mag) << "up_v h " << h << " d " << d;
        if (mag > 0) worst.add(err / (kU * mag));
      }
    }
  }
}

// The operations of each output in the order mla_absorb.h states, written out in scalar code (std::fma is exactly
// rounded like the vector FMA): the kernels must give these bits on every shape -- K3's, and ones with every tail
// (32- and 8-column steps, scalar columns, an 8-column step after the 16-column ones, rows not a multiple of 4).
float absorb_model(const std::vector<float>& w, int64_t row0, int64_t rows, int64_t kr, const std::vector<float>& q, int64_t j) {
  float a = 0.f;
  for (int64_t d = 0; d < rows; ++d) a = std::fma(q[static_cast<size_t>(d)], w[static_cast<size_t>((row0 + d) * kr + j)], a);
  return a;
}

float up_v_model(const float* w, const float* x, int64_t n) {
  float l[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) l[k] = std::fma(w[i + k], x[i + k], l[k]);
  if (i + 8 <= n) {
    for (int k = 0; k < 8; ++k) l[k] = std::fma(w[i + k], x[i + k], l[k]);
    i += 8;
  }
  float s[8], h[4];
  for (int k = 0; k < 8; ++k) s[k] = l[k] + l[k + 8];
  for (int k = 0; k < 4; ++k) h[k] = s[k] + s[k + 4];
  const float h0 = h[0] + h[2], h1 = h[1] + h[3];
  float r = h0 + h1;
  for (; i < n; ++i) r = std::fma(w[i], x[i], r);
  return r;
}

TEST(MlaAbsorb, EachOutputsOperationsInTheirStatedOrder) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const Dims& D : {Dims{2, 128, 128, 512, 64}, Dims{2, 5, 7, 77, 4}, Dims{1, 9, 3, 8, 0}, Dims{2, 3, 6, 150, 2},
                        Dims{1, 4, 5, 40, 1}, Dims{1, 2, 9, 24, 0}}) {
    const int64_t rows = D.nh * (D.dn + D.dv);
    std::vector<float> w(static_cast<size_t>(rows * D.kr));
    for (auto& v : w) v = nd(rng);
    const k3::cpu::KvB k{w.data(), nullptr, D.dn, D.dv, D.kr};
    std::vector<float> q(static_cast<size_t>(D.dn + D.dr)), olat(static_cast<size_t>(D.kr));
    for (auto& v : q) v = nd(rng);
    for (auto& v : olat) v = nd(rng);
    for (int64_t h = 0; h < D.nh; ++h) {
      std::vector<float> a(static_cast<size_t>(D.kr + D.dr), NAN), o(static_cast<size_t>(D.dv), NAN);
      k3::cpu::mla_absorb_q_head(k, h, D.dr, q.data(), a.data());
      for (int64_t j = 0; j < D.kr; ++j) {
        const float want = absorb_model(w, h * (D.dn + D.dv), D.dn, D.kr, q, j);
        ASSERT_EQ(std::memcmp(&a[static_cast<size_t>(j)], &want, 4), 0) << "absorb h " << h << " j " << j << " kr " << D.kr;
      }
      k3::cpu::mla_up_v_head(k, h, olat.data(), o.data());
      for (int64_t d = 0; d < D.dv; ++d) {
        const float want = up_v_model(w.data() + (h * (D.dn + D.dv) + D.dn + d) * D.kr, olat.data(), D.kr);
        ASSERT_EQ(std::memcmp(&o[static_cast<size_t>(d)], &want, 4), 0) << "up_v h " << h << " d " << d << " kr " << D.kr;
      }
    }
  }
}

}  // namespace

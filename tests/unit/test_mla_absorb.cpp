// The absorbed MLA projections through kv_b (mla_absorb.h): against float64 on random inputs, and the
// bf16-stored and fp32-stored kv_b giving the same bits.
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

}  // namespace

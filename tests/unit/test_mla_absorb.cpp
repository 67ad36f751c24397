// The absorbed MLA projections through kv_b (mla_absorb.h): against float64 on random inputs, the bf16-stored and
// fp32-stored kv_b giving the same bits, each output's operations in the order the header states, and a GGUF's
// quantised halves read as stored (on every CPU tier) against the fp32 copy of their decoded values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "k3/backend/cpu/mla_absorb.h"
#include "k3/quant/gguf_quant.h"
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

// A GGUF's kv_b halves quantised (attn_k_b: per head kr rows of dn values, kv_b's key rows transposed; attn_v_b: per
// head dv rows of kr), read as stored (KvB::k_b / v_b) beside the fp32 copy of their decoded values (what the loader
// rebuilds): each output is the stated 8-lane dot of its decoded row (dot8_model, bit for bit), within its float64
// bound, and near the fp32 copy's output; the rope part is copied. Pairs as llama-quantize writes them (Q4_K_M: Q5_0
// / Q4_K) and others; rows that cross the 16 KB decode pieces, ones that do not fill one, row counts not a multiple
// of the 8 computed together.
float dot8_model(const float* w, const float* x, int64_t n) {
  float l[8] = {};
  for (int64_t i = 0; i < n; i += 8)
    for (int k = 0; k < 8; ++k) l[k] = std::fma(w[i + k], x[i + k], l[k]);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

class MlaAbsorbStored : public k3test::CpuTierTest {};

TEST_P(MlaAbsorbStored, HalvesGiveTheirDecodedRowsDots) {
  using k3::WeightFormat;
  struct Case {
    Dims D;
    WeightFormat fk, fv;
  };
  std::mt19937 rng(29);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const Case& c : {Case{{2, 128, 128, 512, 64}, WeightFormat::Q5_0, WeightFormat::Q4_K},
                        Case{{3, 128, 64, 256, 8}, WeightFormat::Q8_0, WeightFormat::Q6_K},
                        Case{{2, 64, 32, 256, 0}, WeightFormat::IQ4_NL, WeightFormat::IQ4_XS},
                        Case{{1, 32, 50, 96, 4}, WeightFormat::Q4_0, WeightFormat::Q5_0},
                        Case{{2, 8192, 16, 32, 2}, WeightFormat::Q8_0, WeightFormat::Q8_0}}) {
    const Dims& D = c.D;
    const int64_t rows = D.nh * (D.dn + D.dv);
    std::vector<float> w(static_cast<size_t>(rows * D.kr));
    for (auto& v : w) v = nd(rng) * 0.05f;
    // The halves in GGUF's row order, quantised, then decoded back into the fp32 kv_b copy.
    std::vector<float> kh(static_cast<size_t>(D.nh * D.kr * D.dn)), vh(static_cast<size_t>(D.nh * D.dv * D.kr));
    for (int64_t h = 0; h < D.nh; ++h) {
      for (int64_t j = 0; j < D.kr; ++j)
        for (int64_t d = 0; d < D.dn; ++d)
          kh[static_cast<size_t>((h * D.kr + j) * D.dn + d)] = w[static_cast<size_t>((h * (D.dn + D.dv) + d) * D.kr + j)];
      std::copy_n(w.begin() + (h * (D.dn + D.dv) + D.dn) * D.kr, D.dv * D.kr, vh.begin() + h * D.dv * D.kr);
    }
    std::vector<uint8_t> kq(static_cast<size_t>(k3::row_data_bytes(c.fk, D.dn) * D.nh * D.kr)),
        vq(static_cast<size_t>(k3::row_data_bytes(c.fv, D.kr) * D.nh * D.dv));
    k3::quant::quantize_row(c.fk, kh.data(), static_cast<int64_t>(kh.size()), nullptr, kq.data());
    k3::quant::quantize_row(c.fv, vh.data(), static_cast<int64_t>(vh.size()), nullptr, vq.data());
    k3::quant::dequantize_row(c.fk, kq.data(), static_cast<int64_t>(kh.size()), kh.data());
    k3::quant::dequantize_row(c.fv, vq.data(), static_cast<int64_t>(vh.size()), vh.data());
    for (int64_t h = 0; h < D.nh; ++h) {
      for (int64_t j = 0; j < D.kr; ++j)
        for (int64_t d = 0; d < D.dn; ++d)
          w[static_cast<size_t>((h * (D.dn + D.dv) + d) * D.kr + j)] = kh[static_cast<size_t>((h * D.kr + j) * D.dn + d)];
      std::copy_n(vh.begin() + h * D.dv * D.kr, D.dv * D.kr, w.begin() + (h * (D.dn + D.dv) + D.dn) * D.kr);
    }
    const k3::WeightMatrix kb{c.fk, kq.data(), nullptr, D.nh * D.kr, D.dn}, vb{c.fv, vq.data(), nullptr, D.nh * D.dv, D.kr};
    k3::cpu::KvB stored{nullptr, nullptr, D.dn, D.dv, D.kr, &kb, &vb}, copy{w.data(), nullptr, D.dn, D.dv, D.kr};
    std::vector<float> q(static_cast<size_t>(D.dn + D.dr)), olat(static_cast<size_t>(D.kr));
    for (auto& v : q) v = nd(rng);
    for (auto& v : olat) v = nd(rng);
    const std::string what = std::string(k3::weight_format_name(c.fk)) + " / " + k3::weight_format_name(c.fv) + " dn " + std::to_string(D.dn);
    // out[i] against dot8_model of the decoded row i (rows at `rows`, n wide), float64, and the fp32 copy's output.
    const auto check = [&](const char* op, int64_t h, const float* out, const float* rows, int64_t count, int64_t n, const float* x,
                           const float* copy_out) {
      for (int64_t i = 0; i < count; ++i) {
        const float* row = rows + i * n;
        const float want = dot8_model(row, x, n);
        ASSERT_EQ(std::memcmp(&out[i], &want, 4), 0) << what << " " << op << " h " << h << " row " << i;
        double exact = 0, mag = 0;
        for (int64_t k = 0; k < n; ++k) exact += double(row[k]) * x[k], mag += std::fabs(double(row[k]) * x[k]);
        ASSERT_LE(std::fabs(out[i] - exact), (n + 2) * kU * mag) << what << " " << op << " h " << h << " row " << i;
        ASSERT_LE(std::fabs(out[i] - copy_out[i]), 2 * (n + 2) * kU * mag) << what << " " << op << " h " << h << " row " << i;
      }
    };
    for (int64_t h = 0; h < D.nh; ++h) {
      std::vector<float> a(static_cast<size_t>(D.kr + D.dr), NAN), ac(a.size(), NAN);
      k3::cpu::mla_absorb_q_head(stored, h, D.dr, q.data(), a.data());
      k3::cpu::mla_absorb_q_head(copy, h, D.dr, q.data(), ac.data());
      check("absorb", h, a.data(), kh.data() + h * D.kr * D.dn, D.kr, D.dn, q.data(), ac.data());
      for (int64_t j = 0; j < D.dr; ++j) ASSERT_EQ(a[static_cast<size_t>(D.kr + j)], q[static_cast<size_t>(D.dn + j)]);
      std::vector<float> o(static_cast<size_t>(D.dv), NAN), oc(o.size(), NAN);
      k3::cpu::mla_up_v_head(stored, h, olat.data(), o.data());
      k3::cpu::mla_up_v_head(copy, h, olat.data(), oc.data());
      check("up_v", h, o.data(), vh.data() + h * D.dv * D.kr, D.dv, D.kr, olat.data(), oc.data());
      // Three tokens through the head at once (the _n forms, stored and fp32 copy): each token the single call's bits.
      for (const k3::cpu::KvB* k : {&stored, &copy}) {
        std::vector<std::vector<float>> qs(3, q), ls(3, olat), qo(3, std::vector<float>(a.size(), NAN)), oo(3, std::vector<float>(o.size(), NAN));
        for (int t = 1; t < 3; ++t)
          for (auto* v : {&qs[t], &ls[t]})
            for (auto& x : *v) x = nd(rng);
        const float* qp[3] = {qs[0].data(), qs[1].data(), qs[2].data()};
        const float* lp[3] = {ls[0].data(), ls[1].data(), ls[2].data()};
        float* qop[3] = {qo[0].data(), qo[1].data(), qo[2].data()};
        float* oop[3] = {oo[0].data(), oo[1].data(), oo[2].data()};
        k3::cpu::mla_absorb_q_head_n(*k, h, D.dr, 3, qp, qop);
        k3::cpu::mla_up_v_head_n(*k, h, 3, lp, oop);
        for (int t = 0; t < 3; ++t) {
          std::vector<float> a1(a.size(), NAN), o1(o.size(), NAN);
          k3::cpu::mla_absorb_q_head(*k, h, D.dr, qp[t], a1.data());
          k3::cpu::mla_up_v_head(*k, h, lp[t], o1.data());
          ASSERT_EQ(std::memcmp(a1.data(), qo[t].data(), a1.size() * 4), 0) << what << " absorb_n h " << h << " token " << t;
          ASSERT_EQ(std::memcmp(o1.data(), oo[t].data(), o1.size() * 4), 0) << what << " up_v_n h " << h << " token " << t;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, MlaAbsorbStored, k3test::kAllCpuTiers, k3test::cpu_tier_name);

}  // namespace

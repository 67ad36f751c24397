// MLA latent rows in bf16 / fp8 (backend/cpu/mla_cache_rows.h, core/cache_dtype.h): encode / decode, the
// gather of the MHA prefill form, and the absorbed attention reading stored rows directly
// (mla_attention_latent_rows_typed) against fp32 rows. The error numbers are in docs/cache-dtypes.md.
#include <gtest/gtest.h>

#include "kernel_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "k3/backend/cpu/mla_attention.h"
#include "k3/backend/cpu/mla_cache_rows.h"

namespace {

using k3::CacheDType;
using Vec = std::vector<float>;

constexpr int kKr = 512, kDr = 64, kDc = kKr + kDr;  // K3's kv_lora_rank + qk_rope_dim

// Latent rows as the model writes them: c_kv = RMSNorm(x) * w (weights around 1 with a few large
// channels), k_pe unnormalised (larger, with outlier channels). Never zero.
Vec realistic_latents(int S, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  Vec w(kKr), pe_sd(kDr);
  for (auto& a : w) a = 0.5f + std::fabs(0.5f * nd(rng));
  for (int i = 0; i < 8; ++i) w[std::size_t(rng() % kKr)] *= 6.f;
  for (auto& a : pe_sd) a = 1.f + 2.f * std::fabs(nd(rng));
  for (int i = 0; i < 4; ++i) pe_sd[std::size_t(rng() % kDr)] *= 8.f;
  Vec lat(std::size_t(S) * kDc);
  for (int s = 0; s < S; ++s) {
    float* r = lat.data() + std::size_t(s) * kDc;
    double ss = 0;
    for (int i = 0; i < kKr; ++i) {
      r[i] = nd(rng) * (i % 37 == 0 ? 4.f : 1.f);
      ss += double(r[i]) * r[i];
    }
    const float inv = float(1.0 / std::sqrt(ss / kKr + 1e-6));
    for (int i = 0; i < kKr; ++i) r[i] *= inv * w[std::size_t(i)];
    for (int i = 0; i < kDr; ++i) r[kKr + i] = nd(rng) * pe_sd[std::size_t(i)];
  }
  return lat;
}

Vec randn(std::size_t n, std::mt19937& rng, float sd) {
  std::normal_distribution<float> nd(0.f, sd);
  Vec x(n);
  for (auto& a : x) a = nd(rng);
  return x;
}

// Stored rows of `dtype` in one buffer (a page), and their pointers.
struct StoredRows {
  std::vector<uint8_t> bytes;
  std::vector<const void*> ptrs;
  StoredRows(CacheDType dt, int S, int kr, int dr, const Vec& lat) {
    const auto rb = std::size_t(k3::mla_row_bytes(dt, kr, dr));
    bytes.assign(rb * S + 16, 0xCD);
    uint8_t* base = bytes.data() + (16 - reinterpret_cast<std::uintptr_t>(bytes.data()) % 16) % 16;
    std::vector<void*> w(S);
    for (int s = 0; s < S; ++s) w[std::size_t(s)] = base + rb * s;
    k3::cpu::mla_write_rows(dt, S, kr, dr, lat.data(), w.data());
    ptrs.assign(w.begin(), w.end());
  }
};

Vec attend_typed(CacheDType dt, int T, int P, int nh, const Vec& q, const StoredRows& rows) {
  Vec out(std::size_t(T) * nh * kKr);
  k3::cpu::mla_attention_latent_rows_typed(T, P, nh, kKr, kDr, q.data(), rows.ptrs.data(), dt,
                                           1.f / std::sqrt(192.f), out.data());
  return out;
}

TEST(MlaCacheRows, F32TypedIsTheFp32KernelBitForBit) {
  std::mt19937 rng(11);
  const int T = 3, P = 40, S = P + T, nh = 5;
  const Vec lat = randn(std::size_t(S) * kDc, rng, 1.f), q = randn(std::size_t(T) * nh * kDc, rng, 1.f);
  std::vector<const float*> rows(S);
  for (int s = 0; s < S; ++s) rows[std::size_t(s)] = lat.data() + std::size_t(s) * kDc;
  Vec old_out(std::size_t(T) * nh * kKr);
  k3::cpu::mla_attention_latent_rows(T, P, nh, kKr, kDr, q.data(), rows.data(), 1.f / std::sqrt(192.f), old_out.data());
  const StoredRows stored(CacheDType::F32, S, kKr, kDr, lat);
  const Vec typed = attend_typed(CacheDType::F32, T, P, nh, q, stored);
  EXPECT_EQ(std::memcmp(old_out.data(), typed.data(), old_out.size() * 4), 0);
}

TEST(MlaCacheRows, EncodeDecodeKeepsEachValueWithinTheFormatsRounding) {
  std::mt19937 rng(12);
  const int S = 64;
  const Vec lat = realistic_latents(S, rng);
  for (CacheDType dt : {CacheDType::F32, CacheDType::BF16, CacheDType::FP8_E4M3}) {
    const StoredRows stored(dt, S, kKr, kDr, lat);
    Vec back(lat.size());
    k3::cpu::mla_gather_rows(dt, S, kKr, kDr, stored.ptrs.data(), back.data());
    for (int s = 0; s < S; ++s) {
      float amax = 0;  // of c_kv: the fp8 scale's range
      for (int i = 0; i < kKr; ++i) amax = std::max(amax, std::fabs(lat[std::size_t(s) * kDc + i]));
      for (int i = 0; i < kDc; ++i) {
        const float x = lat[std::size_t(s) * kDc + i], y = back[std::size_t(s) * kDc + i];
        // half an ulp: 0 fp32, 2^-8 bf16 (also fp8 rows' k_pe), 2^-4 e4m3 plus its subnormal step at the scale
        const bool e4m3 = dt == CacheDType::FP8_E4M3 && i < kKr;
        const double tol = dt == CacheDType::F32 ? 0.0
                           : !e4m3               ? std::ldexp(std::fabs(x), -8)
                                                 : std::ldexp(std::fabs(x), -4) + amax / 448 * std::ldexp(1.0, -10);
        ASSERT_LE(std::fabs(double(x) - y), tol * 1.0001) << k3::cache_dtype_name(dt) << " row " << s << " i " << i << " x " << x << " y " << y;
      }
    }
  }
}

TEST(MlaCacheRows, Fp8RowIsCkvCodesThenKpeBf16ThenScale) {
  Vec lat(kDc);
  for (int i = 0; i < kDc; ++i) lat[std::size_t(i)] = 0.001f * float(i + 1) * (i % 2 ? -1.f : 1.f);
  lat[100] = -4.48f;  // max |c_kv| -> code 0xFE (-448), scale 0.01 (k_pe's larger values do not count)
  std::vector<uint8_t> row(std::size_t(k3::mla_row_bytes(CacheDType::FP8_E4M3, kKr, kDr)));
  ASSERT_EQ(row.size(), 644u);
  k3::cpu::mla_encode_row(CacheDType::FP8_E4M3, kKr, kDr, lat.data(), row.data());
  float scale;
  std::memcpy(&scale, row.data() + 640, 4);
  EXPECT_EQ(scale, 4.48f / 448.f);
  EXPECT_EQ(row[100], 0xFE);
  EXPECT_EQ(row[0], k3::f32_to_fp8_e4m3(0.001f / scale));
  uint16_t pe0;
  std::memcpy(&pe0, row.data() + 512, 2);
  EXPECT_EQ(pe0, k3::f32_to_bf16(lat[kKr]));
  // An all-zero c_kv stores scale 1 and zero codes (no 0/0).
  std::fill(lat.begin(), lat.begin() + kKr, 0.f);
  k3::cpu::mla_encode_row(CacheDType::FP8_E4M3, kKr, kDr, lat.data(), row.data());
  std::memcpy(&scale, row.data() + 640, 4);
  EXPECT_EQ(scale, 1.f);
  EXPECT_EQ(*std::max_element(row.begin(), row.begin() + kKr), 0);
}

// Reading stored rows in the inner loop == attention in fp32 over the decoded rows, to fp32 rounding.
TEST(MlaCacheRows, TypedAttentionEqualsFp32AttentionOverDecodedRows) {
  std::mt19937 rng(13);
  const int T = 4, P = 60, S = P + T, nh = 6;
  const Vec lat = realistic_latents(S, rng), q = randn(std::size_t(T) * nh * kDc, rng, 1.f);
  for (CacheDType dt : {CacheDType::BF16, CacheDType::FP8_E4M3}) {
    const StoredRows stored(dt, S, kKr, kDr, lat);
    Vec decoded(lat.size());
    k3::cpu::mla_gather_rows(dt, S, kKr, kDr, stored.ptrs.data(), decoded.data());
    const Vec want = attend_typed(CacheDType::F32, T, P, nh, q, StoredRows(CacheDType::F32, S, kKr, kDr, decoded));
    const Vec got = attend_typed(dt, T, P, nh, q, stored);
    EXPECT_LT(k3test::rel_err(got, want), 2e-6) << k3::cache_dtype_name(dt);
  }
}

// Batch invariance for a given dtype: T queries at once == each query alone (as decode steps), bit for bit,
// with a head count that is not a multiple of the kernel's head block.
TEST(MlaCacheRows, TypedAttentionDoesNotDependOnT) {
  std::mt19937 rng(17);
  const int T = 5, P = 30, S = P + T, nh = 13;
  const Vec lat = realistic_latents(S, rng), q = randn(std::size_t(T) * nh * kDc, rng, 1.f);
  for (CacheDType dt : {CacheDType::BF16, CacheDType::FP8_E4M3}) {
    const StoredRows stored(dt, S, kKr, kDr, lat);
    const Vec all = attend_typed(dt, T, P, nh, q, stored);
    for (int t = 0; t < T; ++t) {
      const Vec qt(q.begin() + std::ptrdiff_t(t) * nh * kDc, q.begin() + std::ptrdiff_t(t + 1) * nh * kDc);
      const Vec one = attend_typed(dt, 1, P + t, nh, qt, stored);
      EXPECT_EQ(std::memcmp(one.data(), all.data() + std::size_t(t) * nh * kKr, one.size() * 4), 0)
          << k3::cache_dtype_name(dt) << " t " << t;
    }
  }
}

double max_abs(const Vec& a) {
  double m = 0;
  for (float x : a) m = std::max(m, double(std::fabs(x)));
  return m;
}

// ||got - ref||_2 / ||ref||_2 and max |got - ref| / max |ref|.
struct Err {
  double rms, max;
};
Err errors(const Vec& got, const Vec& ref) {
  double d2 = 0, r2 = 0, md = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = double(got[i]) - ref[i];
    d2 += d * d;
    r2 += double(ref[i]) * ref[i];
    md = std::max(md, std::fabs(d));
  }
  return {std::sqrt(d2 / r2), md / max_abs(ref)};
}

// The error a cache dtype adds to the absorbed attention output vs fp32 rows (docs/cache-dtypes.md), on
// random rows and on realistic ones (RMS-normed c_kv, larger unnormalised k_pe), random q, 512 keys.
// Asserted (norm-wise): bf16 < 1e-2, fp8 < 5e-2.
TEST(MlaCacheRows, AttentionErrorOfBf16AndFp8RowsVsFp32) {
  const int T = 4, P = 508, S = P + T, nh = 8;
  for (int data = 0; data < 2; ++data) {
    std::mt19937 rng(14 + data);
    const Vec lat = data == 0 ? randn(std::size_t(S) * kDc, rng, 1.f) : realistic_latents(S, rng);
    const Vec q = randn(std::size_t(T) * nh * kDc, rng, 1.f);
    const Vec ref = attend_typed(CacheDType::F32, T, P, nh, q, StoredRows(CacheDType::F32, S, kKr, kDr, lat));
    for (CacheDType dt : {CacheDType::BF16, CacheDType::FP8_E4M3}) {
      const Err e = errors(attend_typed(dt, T, P, nh, q, StoredRows(dt, S, kKr, kDr, lat)), ref);
      std::printf("[ cache dtype ] %-9s %-8s rows: attention output rel err (norm) %.3g, max %.3g of max |out| %.3g\n",
                  data == 0 ? "random" : "realistic", k3::cache_dtype_name(dt), e.rms, e.max, max_abs(ref));
      EXPECT_LT(e.rms, dt == CacheDType::BF16 ? 1e-2 : 5e-2) << k3::cache_dtype_name(dt);
      EXPECT_GT(e.rms, 0.0);  // the rows really were rounded
    }
  }
}

// Why k_pe stays bf16 in fp8 rows: the same attention with all 576 values in e4m3 under one scale
// (13.5 KiB/token for K3 instead of 15.1) has about twice the error on realistic rows.
TEST(MlaCacheRows, Fp8KpeInBf16VsAllFp8) {
  const int T = 4, P = 508, S = P + T, nh = 8;
  std::mt19937 rng(21);
  const Vec lat = realistic_latents(S, rng), q = randn(std::size_t(T) * nh * kDc, rng, 1.f);
  const Vec ref = attend_typed(CacheDType::F32, T, P, nh, q, StoredRows(CacheDType::F32, S, kKr, kDr, lat));
  // All 576 values through e4m3 with one scale: encode as rows with no k_pe part.
  const StoredRows all(CacheDType::FP8_E4M3, S, kDc, 0, lat);
  Vec all_back(lat.size());
  k3::cpu::mla_gather_rows(CacheDType::FP8_E4M3, S, kDc, 0, all.ptrs.data(), all_back.data());
  const Err e_all = errors(attend_typed(CacheDType::F32, T, P, nh, q, StoredRows(CacheDType::F32, S, kKr, kDr, all_back)), ref);
  const Err e_ours = errors(attend_typed(CacheDType::FP8_E4M3, T, P, nh, q, StoredRows(CacheDType::FP8_E4M3, S, kKr, kDr, lat)), ref);
  std::printf("[ cache dtype ] fp8 realistic rows, attention rel err (norm / max): all-e4m3 %.3g / %.3g, "
              "k_pe bf16 %.3g / %.3g\n", e_all.rms, e_all.max, e_ours.rms, e_ours.max);
  EXPECT_LT(e_ours.rms, 0.75 * e_all.rms);
}

}  // namespace

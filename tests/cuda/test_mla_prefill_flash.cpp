// The fused MLA prefill attention (mla_prefill_flash.h) against a float64 causal softmax(Q K^T) V computed here
// from the same fp32 operands, on random inputs: heads 1 / 3, sequences from position 0 and after a cached past
// (the keys start before the queries), lengths that fill the 64-row query and key tiles exactly, partly and several
// times, a long past (3200 keys: most steps keep the running max, so O is not rescaled), rows beyond the written
// ones left untouched (poison kept), a flat and a peaked softmax. Error = max |gpu - ref| / max |ref| over the
// written rows. The kernel's products run on hi + lo bf16 halves (~2^-16 relative per
// operand): bars 1e-4 flat and 5e-4 peaked (scores ~10x larger: a score error d moves p by e^d). The latent floats
// beside the rope slots (which the kernel rewrites in place) must come back unchanged.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda_test_util.h"
#include "k3/backend/cuda/mla_prefill_flash.h"
#include "k3/core/dtype.h"

namespace {

constexpr int kDn = 128, kDr = 64, kDv = 128, kQk = kDn + kDr, kKrStride = 576, kKrOff = 512;

using k3cudatest::Dev;
using k3cudatest::have_gpu;
using k3cudatest::randn;

// float64 reference: rows [offset, offset + n) of out.
void reference(const std::vector<float>& q, const std::vector<float>& kv, const std::vector<float>& lat, int nh,
               int64_t offset, int64_t n, int64_t past, double scale, std::vector<double>& out) {
  const int64_t S = past + n;
  out.assign(static_cast<size_t>(n * nh * kDv), 0.0);
  std::vector<double> p(static_cast<size_t>(S));
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < nh; ++h) {
      const float* qr = &q[static_cast<size_t>(((offset + t) * nh + h) * kQk)];
      double mx = -INFINITY;
      const int64_t keys = past + t + 1;
      for (int64_t s = 0; s < keys; ++s) {
        const float* kr = &kv[static_cast<size_t>((s * nh + h) * (kDn + kDv))];
        const float* rr = &lat[static_cast<size_t>(s * kKrStride + kKrOff)];
        double a = 0;
        for (int d = 0; d < kDn; ++d) a += static_cast<double>(qr[d]) * kr[d];
        for (int d = 0; d < kDr; ++d) a += static_cast<double>(qr[kDn + d]) * rr[d];
        p[static_cast<size_t>(s)] = a * scale;
        mx = std::max(mx, a * scale);
      }
      double sum = 0;
      for (int64_t s = 0; s < keys; ++s) sum += (p[static_cast<size_t>(s)] = std::exp(p[static_cast<size_t>(s)] - mx));
      for (int64_t s = 0; s < keys; ++s) {
        const float* vr = &kv[static_cast<size_t>((s * nh + h) * (kDn + kDv) + kDn)];
        for (int d = 0; d < kDv; ++d) out[static_cast<size_t>((t * nh + h) * kDv + d)] += p[static_cast<size_t>(s)] / sum * vr[d];
      }
    }
}

// Each float rounded to the nearest bf16 (ties to even), kept as a float: the bf16 form's operands.
std::vector<float> round_bf16(std::vector<float> x) {
  for (float& f : x) f = k3::bf16_to_f32(k3::f32_to_bf16(f));
  return x;
}

struct Case {
  int nh;
  int64_t offset, n, past;
};

// One case's random operands (3 rows after the written ones, whose output must stay poison).
struct Operands {
  int64_t S = 0, rows = 0;
  std::vector<float> q, kv, lat;
  Operands(const Case& k, uint64_t& seed, float qscale)
      : S(k.past + k.n), rows(k.offset + k.n + 3),
        q(randn(static_cast<size_t>(rows * k.nh * kQk), ++seed, qscale)),
        kv(randn(static_cast<size_t>(S * k.nh * (kDn + kDv)), ++seed, 1.f)),
        lat(randn(static_cast<size_t>(S * kKrStride), ++seed, 1.f)) {}
};

constexpr float kPoison = 12345.f;

// The kernel on copies of the operands; the whole output buffer back, and whether the latents before the rope
// slots (which the split pass rewrites in place) came back unchanged.
std::vector<float> run_flash(const Case& k, const Operands& x, float scale, bool bf16, bool* latents_kept) {
  std::vector<float> poison(static_cast<size_t>(x.rows * k.nh * kDv), kPoison);
  Dev<float> dq(x.q), dkv(x.kv), dlat(x.lat), dout(poison);
  EXPECT_EQ(k3::cuda::mla_prefill_flash(dq.p, dkv.p, dlat.p + kKrOff, kKrStride, k.nh, kDn, kDr, kDv, k.offset, k.n,
                                        k.past, scale, dout.p, nullptr, bf16),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto lat_after = dlat.get();
  *latents_kept = true;
  for (int64_t s = 0; s < x.S; ++s)
    for (int i = 0; i < kKrOff; ++i)
      if (lat_after[static_cast<size_t>(s * kKrStride + i)] != x.lat[static_cast<size_t>(s * kKrStride + i)]) *latents_kept = false;
  return dout.get();
}

// max |got - ref| / max |ref| over the written rows, and whether every other row kept the poison.
double written_rel(const Case& k, const Operands& x, const std::vector<float>& got, const std::vector<double>& ref,
                   bool* poison_kept) {
  double md = 0, mr = 0;
  for (int64_t i = 0; i < k.n * k.nh * kDv; ++i) {
    const double g = got[static_cast<size_t>(k.offset * k.nh * kDv + i)], r = ref[static_cast<size_t>(i)];
    md = std::max(md, std::fabs(g - r));
    mr = std::max(mr, std::fabs(r));
  }
  *poison_kept = true;
  for (int64_t i = 0; i < x.rows * k.nh * kDv; ++i) {
    const bool written = i >= k.offset * k.nh * kDv && i < (k.offset + k.n) * k.nh * kDv;
    if (!written && got[static_cast<size_t>(i)] != kPoison) *poison_kept = false;
  }
  return md / std::max(mr, 1e-30);
}

TEST(CudaMlaPrefillFlash, MatchesFloat64Reference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 900;
  for (const Case k : {Case{1, 0, 64, 0}, Case{3, 0, 1, 0}, Case{3, 5, 70, 0}, Case{3, 2, 130, 37}, Case{1, 0, 200, 64},
                       Case{3, 1, 1, 100}, Case{1, 0, 700, 2500}})  // the last: ~50 key steps, the running max settled
    for (const float qscale : {0.2f, 2.0f}) {
      const Operands x(k, seed, qscale);
      const float scale = 1.0f / std::sqrt(static_cast<float>(kQk));
      bool latents_kept = false, poison_kept = false;
      const auto got = run_flash(k, x, scale, false, &latents_kept);
      std::vector<double> ref;
      reference(x.q, x.kv, x.lat, k.nh, k.offset, k.n, k.past, scale, ref);
      const double rel = written_rel(k, x, got, ref, &poison_kept);
      std::printf("[ mla ] flash prefill nh %d n %4lld past %3lld q x %.1f: rel %.2e\n", k.nh, static_cast<long long>(k.n),
                  static_cast<long long>(k.past), qscale, rel);
      EXPECT_LT(rel, qscale < 1.f ? 1e-4 : 5e-4) << "nh " << k.nh << " n " << k.n << " past " << k.past;
      EXPECT_TRUE(poison_kept) << "a row outside [offset, offset + n) was written";
      EXPECT_TRUE(latents_kept) << "the split pass wrote outside the rope slots";
    }
}

// The bf16 form (bf16_products, --gemm-precision bf16): against the same float64 reference on the operands rounded
// to bf16 as the kernel rounds them, so what is left is P's rounding to bf16 (2^-9 a weight, averaging out over the
// keys: ~2e-3 of the output's range) and fp32 accumulation -- bar 1e-2, where an indexing bug gives O(1). Its
// output must also differ from the hi / lo form's on the same inputs (else the form did not switch).
TEST(CudaMlaPrefillFlash, Bf16ProductsMatchRoundedReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 1900;
  for (const Case k : {Case{1, 0, 64, 0}, Case{3, 5, 70, 0}, Case{3, 2, 130, 37}, Case{3, 1, 1, 100}, Case{1, 0, 700, 2500}})
    for (const float qscale : {0.2f, 2.0f}) {
      const Operands x(k, seed, qscale);
      const float scale = 1.0f / std::sqrt(static_cast<float>(kQk));
      bool latents_kept = false, poison_kept = false, unused = false;
      const auto got = run_flash(k, x, scale, true, &latents_kept), x2 = run_flash(k, x, scale, false, &unused);
      std::vector<double> ref;
      reference(round_bf16(x.q), round_bf16(x.kv), round_bf16(x.lat), k.nh, k.offset, k.n, k.past, scale, ref);
      const double rel = written_rel(k, x, got, ref, &poison_kept);
      double dx = 0, mr = 0;
      for (int64_t i = 0; i < k.n * k.nh * kDv; ++i) {
        const size_t at = static_cast<size_t>(k.offset * k.nh * kDv + i);
        dx = std::max(dx, static_cast<double>(std::fabs(got[at] - x2[at])));
        mr = std::max(mr, std::fabs(ref[static_cast<size_t>(i)]));
      }
      std::printf("[ mla ] flash prefill bf16 nh %d n %4lld past %4lld q x %.1f: rel %.2e (vs hi/lo form %.2e)\n", k.nh,
                  static_cast<long long>(k.n), static_cast<long long>(k.past), qscale, rel, dx / std::max(mr, 1e-30));
      EXPECT_LT(rel, 1e-2) << "nh " << k.nh << " n " << k.n << " past " << k.past;
      EXPECT_GT(dx, 0.0) << "the bf16 form gave the hi / lo form's bits: it did not run";
      EXPECT_TRUE(poison_kept) << "a row outside [offset, offset + n) was written";
      EXPECT_TRUE(latents_kept) << "the split pass wrote outside the rope slots";
    }
}

TEST(CudaMlaPrefillFlash, RejectsUnsupportedShapes) {
  EXPECT_FALSE(k3::cuda::mla_prefill_flash_supports(128, 64, 64));
  EXPECT_EQ(k3::cuda::mla_prefill_flash(nullptr, nullptr, nullptr, 576, 1, 128, 32, 128, 0, 4, 0, 1.f, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::mla_prefill_flash(nullptr, nullptr, nullptr, 575, 1, 128, 64, 128, 0, 4, 0, 1.f, nullptr, nullptr),
            cudaErrorInvalidValue);  // rope rows must keep 16-byte alignment
  EXPECT_EQ(k3::cuda::mla_prefill_flash(nullptr, nullptr, nullptr, 576, 1, 128, 64, 128, 0, 0, 0, 1.f, nullptr, nullptr),
            cudaSuccess);  // nothing to do
}

}  // namespace

// MLA attention cores vs float64 references and the absorption identity (model-spec 3.3).
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
#include "k3/core/cache_dtype.h"

namespace {

using Vec = std::vector<float>;

Vec randn(std::size_t n, std::mt19937& rng, float sd) {
  std::normal_distribution<float> nd(0.f, sd);
  Vec x(n);
  for (auto& a : x) a = nd(rng);
  return x;
}

using k3test::rel_err;
using k3test::Worst;

// float64 causal attention with explicit q.k over [q_nope | q_pe] . [k_nope_h | k_pe].
std::vector<double> mha_ref(int T, int P, int nh, int dn, int dr, int dv, const Vec& q, const Vec& kn,
                            const Vec& kp, const Vec& v, double scale) {
  std::vector<double> out(std::size_t(T) * nh * dv, 0.0);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nh; ++h) {
      const int n = P + t + 1;
      std::vector<double> sc(n);
      for (int s = 0; s < n; ++s) {
        double a = 0;
        for (int d = 0; d < dn; ++d) a += double(q[(std::size_t(t) * nh + h) * (dn + dr) + d]) * kn[(std::size_t(s) * nh + h) * dn + d];
        for (int d = 0; d < dr; ++d) a += double(q[(std::size_t(t) * nh + h) * (dn + dr) + dn + d]) * kp[std::size_t(s) * dr + d];
        sc[s] = a * scale;
      }
      const double m = *std::max_element(sc.begin(), sc.end());
      double z = 0;
      for (auto& a : sc) z += (a = std::exp(a - m));
      for (int s = 0; s < n; ++s)
        for (int d = 0; d < dv; ++d) out[(std::size_t(t) * nh + h) * dv + d] += sc[s] / z * v[(std::size_t(s) * nh + h) * dv + d];
    }
  return out;
}

struct Shape {
  int T, P, nh, dn, dr, dv;
};

}  // namespace

TEST(Mla, MhaMatchesF64Reference) {
  Worst w("mla mha vs f64");
  std::mt19937 rng(11);
  const Shape shapes[] = {{1, 0, 1, 16, 8, 16},  {5, 0, 3, 16, 8, 24},   {1, 37, 4, 32, 16, 32},
                          {7, 20, 2, 128, 64, 128}, {64, 0, 3, 32, 16, 32}, {33, 100, 2, 128, 64, 128}};
  for (const auto& sh : shapes) {
    const int S = sh.P + sh.T;
    // scores of order several units so the softmax is not flat
    Vec q = randn(std::size_t(sh.T) * sh.nh * (sh.dn + sh.dr), rng, 1.f);
    Vec kn = randn(std::size_t(S) * sh.nh * sh.dn, rng, 1.f);
    Vec kp = randn(std::size_t(S) * sh.dr, rng, 1.f);
    Vec v = randn(std::size_t(S) * sh.nh * sh.dv, rng, 1.f);
    const float scale = 2.f / std::sqrt(float(sh.dn + sh.dr));
    Vec out(std::size_t(sh.T) * sh.nh * sh.dv);
    k3::cpu::mla_attention_mha(sh.T, sh.P, sh.nh, sh.dn, sh.dr, sh.dv, q.data(), kn.data(), kp.data(), v.data(), scale,
                               out.data());
    auto ref = mha_ref(sh.T, sh.P, sh.nh, sh.dn, sh.dr, sh.dv, q, kn, kp, v, scale);
    const double e = rel_err(out, ref);
    w.add(e);
    EXPECT_LT(e, 1e-5) << "T=" << sh.T << " P=" << sh.P << " nh=" << sh.nh << " dn=" << sh.dn;
    // must be able to fail: a future key changes nothing (causality) but a past key does
    if (sh.T > 1) {
      Vec v2 = v;
      for (int d = 0; d < sh.dv; ++d) v2[(std::size_t(S - 1) * sh.nh) * sh.dv + d] += 5.f;  // last key, head 0
      Vec o2(out.size());
      k3::cpu::mla_attention_mha(sh.T, sh.P, sh.nh, sh.dn, sh.dr, sh.dv, q.data(), kn.data(), kp.data(), v2.data(),
                                 scale, o2.data());
      for (std::size_t i = 0; i < std::size_t(sh.T - 1) * sh.nh * sh.dv; ++i) ASSERT_EQ(o2[i], out[i]);
      EXPECT_GT(rel_err(o2, ref), 1e-4);
    }
  }
}

TEST(Mla, AbsorbedLatentEqualsMha) {
  Worst w("mla latent (absorbed) vs mha");
  std::mt19937 rng(12);
  struct AShape {
    int T, P, nh, dn, dr, dv, kr;
  };
  const AShape shapes[] = {{1, 0, 1, 16, 8, 16, 32},     {1, 50, 3, 16, 8, 24, 48},  {4, 0, 2, 32, 16, 32, 64},
                           {6, 13, 3, 32, 16, 16, 64},   {1, 200, 2, 128, 64, 128, 512},
                           {17, 40, 2, 128, 64, 128, 512}};
  for (const auto& sh : shapes) {
    const int S = sh.P + sh.T, nh = sh.nh, dn = sh.dn, dr = sh.dr, dv = sh.dv, kr = sh.kr;
    Vec ckv = randn(std::size_t(S) * kr, rng, 1.f);      // like the RMS-normed latent
    Vec kpe = randn(std::size_t(S) * dr, rng, 1.f);
    Vec Wkv = randn(std::size_t(nh) * (dn + dv) * kr, rng, 1.f / std::sqrt(float(kr)));
    Vec q = randn(std::size_t(sh.T) * nh * (dn + dr), rng, 1.f);
    const float scale = 1.f / std::sqrt(float(dn + dr));
    auto Wrow = [&](int h, int r) { return Wkv.data() + (std::size_t(h) * (dn + dv) + r) * kr; };

    // MHA path: k_nope / v from the latent with kv_b
    Vec kn(std::size_t(S) * nh * dn), v(std::size_t(S) * nh * dv);
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < nh; ++h)
        for (int r = 0; r < dn + dv; ++r) {
          double a = 0;
          for (int c = 0; c < kr; ++c) a += double(Wrow(h, r)[c]) * ckv[std::size_t(s) * kr + c];
          if (r < dn) kn[(std::size_t(s) * nh + h) * dn + r] = float(a);
          else v[(std::size_t(s) * nh + h) * dv + r - dn] = float(a);
        }
    Vec o_mha(std::size_t(sh.T) * nh * dv);
    k3::cpu::mla_attention_mha(sh.T, sh.P, nh, dn, dr, dv, q.data(), kn.data(), kpe.data(), v.data(), scale,
                               o_mha.data());

    // absorbed path
    Vec qlat(std::size_t(sh.T) * nh * (kr + dr)), cache(std::size_t(S) * (kr + dr));
    for (int t = 0; t < sh.T; ++t)
      for (int h = 0; h < nh; ++h) {
        const float* qh = q.data() + (std::size_t(t) * nh + h) * (dn + dr);
        float* ql = qlat.data() + (std::size_t(t) * nh + h) * (kr + dr);
        for (int c = 0; c < kr; ++c) {
          double a = 0;
          for (int r = 0; r < dn; ++r) a += double(Wrow(h, r)[c]) * qh[r];
          ql[c] = float(a);
        }
        for (int d = 0; d < dr; ++d) ql[kr + d] = qh[dn + d];
      }
    for (int s = 0; s < S; ++s) {
      std::copy_n(ckv.data() + std::size_t(s) * kr, kr, cache.data() + std::size_t(s) * (kr + dr));
      std::copy_n(kpe.data() + std::size_t(s) * dr, dr, cache.data() + std::size_t(s) * (kr + dr) + kr);
    }
    Vec olat(std::size_t(sh.T) * nh * kr);
    k3::cpu::mla_attention_latent(sh.T, sh.P, nh, kr, dr, qlat.data(), cache.data(), scale, olat.data());
    std::vector<double> o_abs(o_mha.size());
    for (int t = 0; t < sh.T; ++t)
      for (int h = 0; h < nh; ++h)
        for (int d = 0; d < dv; ++d) {
          double a = 0;
          for (int c = 0; c < kr; ++c) a += double(Wrow(h, dn + d)[c]) * olat[(std::size_t(t) * nh + h) * kr + c];
          o_abs[(std::size_t(t) * nh + h) * dv + d] = a;
        }
    const double e = rel_err(o_mha, o_abs);
    w.add(e);
    EXPECT_LT(e, 1e-4) << "T=" << sh.T << " P=" << sh.P << " nh=" << nh << " kr=" << kr;

    // also check the latent kernel itself against a float64 softmax over the cache
    std::vector<double> lref(olat.size(), 0.0);
    for (int t = 0; t < sh.T; ++t)
      for (int h = 0; h < nh; ++h) {
        const int n = sh.P + t + 1;
        std::vector<double> sc(n);
        const float* ql = qlat.data() + (std::size_t(t) * nh + h) * (kr + dr);
        for (int s = 0; s < n; ++s) {
          double a = 0;
          for (int c = 0; c < kr + dr; ++c) a += double(ql[c]) * cache[std::size_t(s) * (kr + dr) + c];
          sc[s] = a * scale;
        }
        const double m = *std::max_element(sc.begin(), sc.end());
        double z = 0;
        for (auto& a : sc) z += (a = std::exp(a - m));
        for (int s = 0; s < n; ++s)
          for (int c = 0; c < kr; ++c)
            lref[(std::size_t(t) * nh + h) * kr + c] += sc[s] / z * cache[std::size_t(s) * (kr + dr) + c];
      }
    EXPECT_LT(rel_err(olat, lref), 1e-5);

    // must be able to fail: dropping the rope part of the query breaks the identity
    Vec qlat2 = qlat;
    for (int t = 0; t < sh.T; ++t)
      for (int h = 0; h < nh; ++h)
        for (int d = 0; d < dr; ++d) qlat2[(std::size_t(t) * nh + h) * (kr + dr) + kr + d] = 0.f;
    if (S > 1) {
      Vec olat2(olat.size());
      k3::cpu::mla_attention_latent(sh.T, sh.P, nh, kr, dr, qlat2.data(), cache.data(), scale, olat2.data());
      EXPECT_GT(rel_err(olat2, olat), 1e-3);
    }
  }
}

// The blocked MHA form (mla_mha.cpp: 16-query blocks, 4-query register tiles, keys shared by a tile) gives
// each (query, head) the same bits whatever T, the split of a prompt into chunks or the tile a query lands
// in, and the in-place kv_b layout gives the bits of the split one. Dims with tails (not multiples of 8)
// against float64 too.
TEST(Mla, MhaBlockedIsChunkInvariantAndKvLayoutAgrees) {
  std::mt19937 rng(13);
  const Shape shapes[] = {{37, 0, 3, 32, 16, 40}, {50, 9, 2, 20, 6, 44}, {21, 3, 1, 128, 64, 128}};
  for (const auto& sh : shapes) {
    const int S = sh.P + sh.T, nh = sh.nh, dn = sh.dn, dr = sh.dr, dv = sh.dv, dq = dn + dr;
    Vec q = randn(std::size_t(sh.T) * nh * dq, rng, 1.f);
    Vec kn = randn(std::size_t(S) * nh * dn, rng, 1.f), kp = randn(std::size_t(S) * dr, rng, 1.f);
    Vec v = randn(std::size_t(S) * nh * dv, rng, 1.f);
    const float scale = 2.f / std::sqrt(float(dq));
    Vec whole(std::size_t(sh.T) * nh * dv);
    k3::cpu::mla_attention_mha(sh.T, sh.P, nh, dn, dr, dv, q.data(), kn.data(), kp.data(), v.data(), scale, whole.data());
    EXPECT_LT(rel_err(whole, mha_ref(sh.T, sh.P, nh, dn, dr, dv, q, kn, kp, v, scale)), 1e-5) << "T=" << sh.T;
    // The same prompt in chunks of 1, 5 and 19 queries (each chunk's keys: everything before it).
    for (int chunk : {1, 5, 19}) {
      Vec parts(whole.size(), NAN);
      for (int t0 = 0; t0 < sh.T; t0 += chunk) {
        const int n = std::min(chunk, sh.T - t0);
        k3::cpu::mla_attention_mha(n, sh.P + t0, nh, dn, dr, dv, q.data() + std::size_t(t0) * nh * dq, kn.data(), kp.data(),
                                   v.data(), scale, parts.data() + std::size_t(t0) * nh * dv);
      }
      ASSERT_EQ(std::memcmp(parts.data(), whole.data(), whole.size() * sizeof(float)), 0) << "chunk " << chunk;
    }
    // kv_b's output layout [S][nh][dn | dv] and k_pe inside wider rows.
    const int pe_ld = dr + 5;
    Vec kv(std::size_t(S) * nh * (dn + dv)), kp_wide(std::size_t(S) * pe_ld, NAN);
    for (int s = 0; s < S; ++s) {
      for (int h = 0; h < nh; ++h) {
        std::copy_n(kn.data() + (std::size_t(s) * nh + h) * dn, dn, kv.data() + (std::size_t(s) * nh + h) * (dn + dv));
        std::copy_n(v.data() + (std::size_t(s) * nh + h) * dv, dv, kv.data() + (std::size_t(s) * nh + h) * (dn + dv) + dn);
      }
      std::copy_n(kp.data() + std::size_t(s) * dr, dr, kp_wide.data() + std::size_t(s) * pe_ld);
    }
    Vec in_place(whole.size(), NAN);
    k3::cpu::mla_attention_mha_kv(sh.T, sh.P, nh, dn, dr, dv, q.data(), kv.data(), kp_wide.data(), pe_ld, scale,
                                  in_place.data());
    ASSERT_EQ(std::memcmp(in_place.data(), whole.data(), whole.size() * sizeof(float)), 0);
  }
}

// mla_attention_latent_rows_heads (one token's head range on the calling thread: the CPU's fused absorbed pass)
// must give each (token, head) the bits the whole-call form gives it, for every row dtype, any head range
// (single heads, blocks, ranges crossing the 8-head block), and tokens at several causal lengths.
TEST(Mla, HeadRangeEqualsTheWholeCallBitwise) {
  std::mt19937 rng(41);
  const int T = 3, P = 37, nh = 12, kr = 64, dr = 16, dc = kr + dr, S = P + T;
  const Vec q = randn(std::size_t(T) * nh * dc, rng, 1.f), lat = randn(std::size_t(S) * dc, rng, 1.f);
  for (k3::CacheDType dt : {k3::CacheDType::F32, k3::CacheDType::BF16, k3::CacheDType::FP8_E4M3}) {
    const std::size_t rb = static_cast<std::size_t>(k3::mla_row_bytes(dt, kr, dr));
    std::vector<uint8_t> store(rb * S);
    std::vector<void*> wrows(S);
    for (int s = 0; s < S; ++s) wrows[s] = store.data() + rb * s;
    k3::cpu::mla_write_rows(dt, S, kr, dr, lat.data(), wrows.data());
    const std::vector<const void*> rows(wrows.begin(), wrows.end());
    Vec whole(std::size_t(T) * nh * kr, -3.f);
    k3::cpu::mla_attention_latent_rows_typed(T, P, nh, kr, dr, q.data(), rows.data(), dt, 0.11f, whole.data());
    for (const auto& [h0, hn] : std::vector<std::pair<int, int>>{{0, 1}, {5, 1}, {0, 8}, {3, 9}, {0, 12}, {11, 1}}) {
      Vec part(whole.size(), -3.f);
      std::vector<float> scratch;
      for (int t = 0; t < T; ++t)
        k3::cpu::mla_attention_latent_rows_heads(t, h0, hn, P, nh, kr, dr, q.data(), rows.data(), dt, 0.11f, part.data(), scratch);
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < nh; ++h) {
          const float* a = part.data() + (std::size_t(t) * nh + h) * kr;
          const float* b = whole.data() + (std::size_t(t) * nh + h) * kr;
          if (h >= h0 && h < h0 + hn)
            EXPECT_EQ(0, std::memcmp(a, b, kr * sizeof(float))) << k3::cache_dtype_name(dt) << " t " << t << " h " << h;
          else
            EXPECT_EQ(a[0], -3.f) << "head " << h << " outside the range was written";
        }
    }
    EXPECT_NE(whole[0], -3.f);
  }
}

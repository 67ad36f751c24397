// The cache dtypes end to end (--kv-cache-dtype, --mamba-ssm-cache-dtype) on the CPU backend: logits of
// the trained default model (models/k3-tiny) and the random tiny-k3 with bf16 / fp8 latent rows and a
// bf16 KDA state against the fp32 cache (error, KL, top-1 agreement), and the serving engine staying
// exact for a given dtype: batched = alone, prefix caching on = off.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>

#include "k3/core/error.h"
#include "k3/engine/batch_engine.h"
#include "k3/model/model.h"
#include "test_util.h"

using k3::CacheDType;

namespace {

struct Cmp {
  double rel = 0, mean_kl = 0, top1 = 0;
};

// Token-by-token (decode form: the serving engine's) logits of `n` tokens with the given cache dtypes.
std::vector<float> decode_logits(const std::string& dir, CacheDType kv, CacheDType ssm, int n) {
  auto m = k3::Model::load(k3test::source_path(dir), kv, ssm);
  const int64_t V = m->config().vocab_size;
  auto cache = m->new_cache();
  std::vector<float> all, logits;
  k3::ForwardOptions fo;
  fo.path = k3::AttnPath::Decode;
  for (int t = 0; t < n; ++t) {
    const int32_t tok = static_cast<int32_t>((t * 37 + 5) % (V - 300));
    m->forward(std::span<const int32_t>(&tok, 1), *cache, logits, fo);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

Cmp compare(const std::vector<float>& base, const std::vector<float>& x, int64_t V) {
  Cmp c;
  double dmax = 0, bmax = 0;
  const int64_t n = static_cast<int64_t>(base.size()) / V;
  for (int64_t t = 0; t < n; ++t) {
    const float* a = base.data() + t * V;
    const float* b = x.data() + t * V;
    double ma = -1e30, mb = -1e30;
    int64_t ia = 0, ib = 0;
    for (int64_t i = 0; i < V; ++i) {
      dmax = std::max(dmax, std::abs(double(a[i]) - b[i]));
      bmax = std::max(bmax, std::abs(double(a[i])));
      if (a[i] > ma) ma = a[i], ia = i;
      if (b[i] > mb) mb = b[i], ib = i;
    }
    double za = 0, zb = 0;
    for (int64_t i = 0; i < V; ++i) za += std::exp(a[i] - ma), zb += std::exp(b[i] - mb);
    double kl = 0;
    for (int64_t i = 0; i < V; ++i) {
      const double la = a[i] - ma - std::log(za), lb = b[i] - mb - std::log(zb);
      kl += std::exp(la) * (la - lb);
    }
    c.mean_kl += kl / double(n);
    c.top1 += (ia == ib) / double(n);
  }
  c.rel = dmax / bmax;
  return c;
}

}  // namespace

// Measured (120 decode steps of a synthetic token stream, harder than prose): bf16 rows rel 6.3e-2 / mean KL
// 1.9e-4 / top-1 99.2%; fp8 rows 0.12 / 5.3e-3 / 97.5%; bf16 KDA state 0.12 / 6.0e-3 / 95.8%; both 0.12 /
// 4.7e-3 / 97.5% (on Emma prose, docs/cache-dtypes.md: KL 4e-8 / 1.3e-3 / 2.4e-3). A wrong row layout,
// scale or a state not rounded back correctly is off by orders of magnitude (KL > 0.1, top-1 < 50%).
TEST(CacheDTypeModel, TrainedModelLogitsCloseToFp32Cache) {
  const std::string dir = "models/k3-tiny";
  const int n = 120;
  const auto base = decode_logits(dir, CacheDType::F32, CacheDType::F32, n);
  const int64_t V = static_cast<int64_t>(base.size()) / n;
  struct Case {
    CacheDType kv, ssm;
    double max_rel, max_kl, min_top1;
  } cases[] = {{CacheDType::BF16, CacheDType::F32, 0.2, 2e-3, 0.97},
               {CacheDType::FP8_E4M3, CacheDType::F32, 0.4, 2e-2, 0.93},
               {CacheDType::F32, CacheDType::BF16, 0.4, 2e-2, 0.9},
               {CacheDType::FP8_E4M3, CacheDType::BF16, 0.4, 2e-2, 0.9}};
  for (const Case& k : cases) {
    const Cmp c = compare(base, decode_logits(dir, k.kv, k.ssm, n), V);
    std::printf("[ cache dtype ] k3-tiny rows %s state %s: rel %.2e  mean KL %.2e  top-1 %.1f%%\n", k3::cache_dtype_name(k.kv),
                k3::cache_dtype_name(k.ssm), c.rel, c.mean_kl, 100 * c.top1);
    EXPECT_LT(c.rel, k.max_rel);
    EXPECT_LT(c.mean_kl, k.max_kl);
    EXPECT_GE(c.top1, k.min_top1);
  }
}

// The random tiny-k3 (KDA with a gate lower bound, LatentMoE, AttnRes) with bf16 rows: close to fp32.
TEST(CacheDTypeModel, RandomTinyK3Bf16RowsCloseToFp32) {
  const int n = 60;
  const auto base = decode_logits("tests/data/tiny-k3", CacheDType::F32, CacheDType::F32, n);
  const int64_t V = static_cast<int64_t>(base.size()) / n;
  const Cmp c = compare(base, decode_logits("tests/data/tiny-k3", CacheDType::BF16, CacheDType::F32, n), V);
  std::printf("[ cache dtype ] tiny-k3 bf16 rows: rel %.2e  mean KL %.2e  top-1 %.1f%%\n", c.rel, c.mean_kl, 100 * c.top1);
  EXPECT_LT(c.rel, 5e-2);
  EXPECT_GE(c.top1, 0.95);
}

TEST(CacheDTypeModel, CacheOfAnotherDtypeIsRejected) {
  auto m = k3::Model::load(k3test::source_path("models/k3-tiny"), CacheDType::BF16, CacheDType::F32);
  k3::SequenceState fp32(m->config());
  std::vector<float> logits;
  const int32_t tok = 5;
  EXPECT_THROW(m->forward(std::span<const int32_t>(&tok, 1), fp32, logits), k3::Error);
  auto ok = m->new_cache();
  EXPECT_NO_THROW(m->forward(std::span<const int32_t>(&tok, 1), *ok, logits));
}

// The hybrid cache's books under a random mix of operations: the incremental used-page count equals a
// full recount, prefix hits return exactly the checkpointed length, and releasing everything leaves
// nothing used.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "k3/cache/hybrid_cache.h"
#include "k3/core/error.h"
#include "k3/model/config.h"
#include "k3/plan/plan.h"
#include "test_util.h"

TEST(HybridCache, BooksStayConsistentUnderRandomOperations) {
  const k3::ModelConfig cfg = k3::load_model_config(k3test::source_path("tests/data/tiny-k3"));
  k3::cache::CacheOptions opt;
  opt.page_tokens = 4;
  opt.max_num_seqs = 6;
  opt.budget_bytes = 6 * 60000 + 40 * 4 * 3 * 40 * 4 + 200000;  // few slots, a few dozen pages
  k3::cache::HybridCache cache(cfg, opt);
  std::mt19937 rng(5);
  std::vector<std::unique_ptr<k3::cache::PagedSequence>> live;
  std::vector<std::vector<int32_t>> toks;
  int hits = 0;
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0 && static_cast<int64_t>(live.size()) < opt.max_num_seqs) {
      // A new sequence sharing a random prefix with an old one.
      auto s = std::make_unique<k3::cache::PagedSequence>(cache);
      if (!cache.acquire_slot(*s)) continue;
      std::vector<int32_t> t;
      if (!toks.empty() && rng() % 2) {
        const auto& o = toks[rng() % toks.size()];
        t.assign(o.begin(), o.begin() + static_cast<std::ptrdiff_t>(rng() % (o.size() + 1)));
      }
      for (int i = static_cast<int>(rng() % 12); i >= 0; --i) t.push_back(static_cast<int32_t>(rng() % 5));
      const int64_t hit = cache.match_prefix(*s, t);
      EXPECT_LE(hit, static_cast<int64_t>(t.size()) - 1);
      EXPECT_EQ(s->n_past(), hit);
      hits += hit > 0;
      live.push_back(std::move(s));
      toks.push_back(t);
    } else if (op == 1 && !live.empty()) {
      // Run some tokens of a live sequence: allocate, advance, commit, checkpoint.
      const size_t i = rng() % live.size();
      auto& s = *live[i];
      auto& t = toks[toks.size() - live.size() + i];
      const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(t.size()) - s.n_past());
      while (static_cast<int64_t>(t.size()) < s.n_past() + n) t.push_back(static_cast<int32_t>(rng() % 5));
      if (!cache.ensure_capacity(s, s.n_past() + n)) continue;
      s.advance(n);
      cache.commit_pages(s, t);
      if (rng() % 2) cache.save_checkpoint(s, t);
    } else if (op == 2 && !live.empty()) {
      const size_t i = rng() % live.size();
      cache.release(*live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      toks.erase(toks.end() - static_cast<std::ptrdiff_t>(live.size() + 1) + static_cast<std::ptrdiff_t>(i));
    }
    ASSERT_EQ(cache.stats().pages_used, cache.count_used_pages_slow()) << "step " << step;
  }
  for (auto& s : live) cache.release(*s);
  EXPECT_EQ(cache.stats().pages_used, 0);
  EXPECT_EQ(cache.count_used_pages_slow(), 0);
  EXPECT_EQ(cache.stats().slots_used, 0);
  EXPECT_GT(hits, 0);
}

// The automatic checkpoint interval: a state slot weighs about as much as the latent pages of the
// interval; at least 64 tokens, a page multiple. Kimi K3: 434 MB state, 55 KB of latents per token.
TEST(HybridCache, AutoCheckpointIntervalFollowsStateToLatentRatio) {
  k3::cache::CacheOptions opt;
  opt.page_tokens = 16;
  opt.max_num_seqs = 1;
  opt.budget_bytes = 64ll << 20;
  const k3::ModelConfig tiny = k3::load_model_config(k3test::source_path("tests/data/tiny-k3"));
  const k3::ModelConfig k3tiny = k3::load_model_config(k3test::source_path("models/k3-tiny"));
  const int64_t a = k3::cache::HybridCache(tiny, opt).auto_checkpoint_interval();
  const int64_t b = k3::cache::HybridCache(k3tiny, opt).auto_checkpoint_interval();
  for (int64_t v : {a, b}) {
    EXPECT_GE(v, 64);
    EXPECT_EQ(v % 16, 0);
  }
  // k3-tiny: (9 KDA layers x (2x64x64 state + 3 x 128 x 3 conv)) floats per slot over (3 MLA x 80) per token.
  const double slot = 9.0 * (2 * 64 * 64 + 3 * 128 * 3), per_token = 3.0 * 80;
  EXPECT_EQ(b, static_cast<int64_t>(std::ceil(std::ceil(slot / per_token) / 16.0) * 16));
  // Kimi K3 dimensions (slot 434 MB, 24 MLA layers x 576 latents): bounded by 65536, near 7.9k.
  opt.budget_bytes = 1ll << 30;
  const k3::ModelConfig big = k3::plan::load_preset("kimi-k3");
  const int64_t c = k3::cache::HybridCache(big, opt).auto_checkpoint_interval();
  EXPECT_GT(c, 7000);
  EXPECT_LT(c, 9000);
}

// Issue 11 (prefix-cache side channel): a cached prefix is reused only by sequences with the same salt
// (cache_salt / API key), for full pages and for checkpoints shorter than a page alike.
TEST(HybridCache, SaltPartitionsPrefixHits) {
  const k3::ModelConfig cfg = k3::load_model_config(k3test::source_path("tests/data/tiny-k3"));
  k3::cache::CacheOptions opt;
  opt.page_tokens = 4;
  opt.max_num_seqs = 4;
  opt.budget_bytes = 64ll << 20;
  k3::cache::HybridCache cache(cfg, opt);
  // Runs a sequence over `t` (as the engine would: match, compute, commit, checkpoint), returns its hit.
  auto run = [&](const std::string& salt, const std::vector<int32_t>& t) {
    k3::cache::PagedSequence s(cache);
    s.set_salt(k3::cache::cache_salt_id(salt));
    EXPECT_TRUE(cache.acquire_slot(s));
    const int64_t hit = cache.match_prefix(s, t);
    EXPECT_TRUE(cache.ensure_capacity(s, static_cast<int64_t>(t.size())));
    s.advance(static_cast<int64_t>(t.size()) - s.n_past());
    cache.commit_pages(s, t);
    cache.save_checkpoint(s, t);
    cache.release(s);
    return hit;
  };
  for (size_t len : {size_t{3}, size_t{22}}) {  // inside the first page; several pages + a partial one
    std::vector<int32_t> t(len);
    for (size_t i = 0; i < len; ++i) t[i] = static_cast<int32_t>(len * 7 + i);
    std::vector<int32_t> longer = t;
    longer.push_back(9);
    EXPECT_EQ(run("tenant-a", t), 0);
    EXPECT_EQ(run("tenant-b", longer), 0) << len;  // another salt: no hit
    EXPECT_EQ(run("", longer), 0) << len;          // nor the unsalted partition
    EXPECT_EQ(run("tenant-a", longer), static_cast<int64_t>(len)) << len;  // the same salt: a hit
    std::vector<int32_t> longest = longer;
    longest.push_back(3);
    EXPECT_EQ(run("", longest), static_cast<int64_t>(len) + 1) << len;  // each partition its own
  }
  EXPECT_EQ(k3::cache::cache_salt_id(""), 0u);
  EXPECT_NE(k3::cache::cache_salt_id("a"), k3::cache::cache_salt_id("b"));
}

// budget_for sizes exactly what the constructor lays out, for every cache dtype (pages and slots are
// rounded to 256-byte units: an fp8 page of the default model is not a multiple of 256 bytes, and `k3 run
// --kv-cache-dtype fp8` once got a cache one page short).
TEST(HybridCache, BudgetForHoldsTheTokensForEveryDtype) {
  const k3::ModelConfig cfg = k3::load_model_config(k3test::source_path("models/k3-tiny"));
  for (k3::CacheDType kv : {k3::CacheDType::F32, k3::CacheDType::BF16, k3::CacheDType::FP8_E4M3})
    for (k3::CacheDType ssm : {k3::CacheDType::F32, k3::CacheDType::BF16})
      for (int64_t tokens : {1, 16, 33, 1000}) {
        const k3::CacheSpec spec = k3::make_cache_spec(cfg, kv, ssm);
        k3::cache::CacheOptions opt;
        opt.page_tokens = 16;
        opt.max_num_seqs = 1;
        opt.prefix_caching = false;
        opt.budget_bytes = k3::cache::HybridCache::budget_for(spec, opt.page_tokens, 1, tokens);
        const k3::cache::HybridCache cache(spec, opt);
        EXPECT_GE(cache.max_tokens_per_sequence(), tokens)
            << k3::cache_dtype_name(kv) << " / " << k3::cache_dtype_name(ssm) << " " << tokens;
        EXPECT_EQ(cache.spec().mla_dtype, kv);
      }
}

// Issue 17: speculative decoding's rollback. The j-th snapshot becomes the sequence's state (the slots
// swap: the marker written into the snapshot is what kda_state reads after), n_past moves back, pages
// only the rejected rows needed return to the pool, committed pages are never touched, and releasing the
// sequence frees its snapshot slots too.
TEST(HybridCache, RestoreStateRollsBackStateAndPages) {
  const k3::ModelConfig cfg = k3::load_model_config(k3test::source_path("tests/data/tiny-k3"));
  k3::cache::CacheOptions opt;
  opt.page_tokens = 4;
  opt.max_num_seqs = 2;
  opt.prefix_caching = true;
  opt.state_snapshots = 3;
  opt.budget_bytes = 64ll << 20;
  k3::cache::HybridCache cache(cfg, opt);
  k3::cache::PagedSequence s(cache);
  ASSERT_TRUE(cache.acquire_slot(s));
  EXPECT_EQ(cache.stats().slots_used, 4);  // the state + 3 snapshots
  ASSERT_NE(s.kda_snapshot(0, 2).S, nullptr);
  EXPECT_EQ(s.kda_snapshot(0, 3).S, nullptr);
  std::vector<int32_t> toks(30);
  for (int i = 0; i < 30; ++i) toks[static_cast<size_t>(i)] = i % 7;
  ASSERT_TRUE(cache.ensure_capacity(s, 9));
  s.advance(9);
  cache.commit_pages(s, toks);  // pages 0-1 committed (tokens 0..7)
  // A verification of 1 pending + 5 drafts from position 9: rows 9..14, a 4th page.
  ASSERT_TRUE(cache.ensure_capacity(s, 15));
  EXPECT_EQ(s.block_table().size(), 4u);
  static_cast<float*>(s.kda_snapshot(0, 1).S)[0] = 42.0f;  // "the state after the pending token + 1 draft"
  s.kda_snapshot(0, 1).conv_q[0] = 7.0f;
  static_cast<float*>(s.kda_state(0).S)[0] = -1.0f;  // "the state after every draft"
  s.advance(6);
  // One draft accepted, the second rejected: back to position 11, the kept token makes 12 tokens.
  cache.restore_state(s, 1, 11, 12);
  EXPECT_EQ(s.n_past(), 11);
  EXPECT_EQ(static_cast<float*>(s.kda_state(0).S)[0], 42.0f);
  EXPECT_EQ(s.kda_state(0).conv_q[0], 7.0f);
  EXPECT_EQ(s.block_table().size(), 3u);  // 12 tokens: 3 pages; the 4th went back
  EXPECT_EQ(cache.stats().pages_used, cache.count_used_pages_slow());
  EXPECT_EQ(cache.stats().pages_used, 3);
  // Never behind a committed page.
  EXPECT_THROW(cache.restore_state(s, 0, 4, 5), k3::Error);
  EXPECT_THROW(cache.restore_state(s, 3, 11, 12), k3::Error);
  cache.release(s);
  EXPECT_EQ(cache.stats().slots_used, 0);
  EXPECT_EQ(cache.stats().pages_used, 0);
}

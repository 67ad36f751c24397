// Routed-expert residency bookkeeping (runtime/expert_residency.h): page-aligned prefetch ranges inside
// the mapping, hit counting by residency, the pinned hot set (budget, most-used first, follows a change
// of use, budget 0 pins nothing), results unchanged by the reordering, and the page-cache helpers.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>
#include <vector>

#include "golden_util.h"
#include "k3/core/error.h"
#include "k3/io/page_cache.h"
#include "k3/model/model.h"
#include "k3/runtime/expert_residency.h"
#include "k3/serve/metrics.h"
#include "test_util.h"

namespace {

using k3::ByteSpan;
using k3::ExpertPrefetch;
using k3::ExpertResidency;
using k3::ExpertResidencyOptions;

const size_t kPage = static_cast<size_t>(::sysconf(_SC_PAGESIZE));

// Anonymous memory standing in for a mapped checkpoint: untouched pages are not resident (mincore).
struct Region {
  uint8_t* p = nullptr;
  size_t size = 0;
  explicit Region(size_t pages) : size(pages * kPage) {
    p = static_cast<uint8_t*>(::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(p, MAP_FAILED);
  }
  ~Region() { ::munmap(p, size); }
  ByteSpan span() const { return {p, size}; }
  void touch(size_t first_page, size_t pages) {
    for (size_t i = 0; i < pages; ++i) p[(first_page + i) * kPage] = 1;
  }
};

// `n` experts of `pages` pages each, laid out one after another; expert e's ranges: two tensors (data
// and a small scales tail) as a checkpoint stores them, not page-aligned at the seams.
std::vector<std::vector<ByteSpan>> experts_in(const Region& r, int n, size_t pages) {
  std::vector<std::vector<ByteSpan>> ex;
  for (int e = 0; e < n; ++e) {
    const uint8_t* b = r.p + static_cast<size_t>(e) * pages * kPage;
    const size_t data = pages * kPage - 100;
    ex.push_back({{b, data}, {b + data, 100}});
  }
  return ex;
}

TEST(ExpertResidency, PageSpansAreAlignedMergedAndInsideTheRegion) {
  std::vector<uint8_t> buf(10 * kPage);
  const uint8_t* region = reinterpret_cast<const uint8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + kPage - 1) / kPage * kPage);
  const size_t region_size = 6 * kPage + 10;  // a file whose last page is partial
  // Two touching tensors (merged), one past the end (clipped), one wholly outside (dropped), an empty one.
  auto out = k3::page_spans({{region + 10, kPage}, {region + 10 + kPage, 50}, {region + 5 * kPage + 7, 4 * kPage},
                             {region + 20 * kPage, 100}, {region + 3 * kPage, 0}},
                            region, region_size, kPage);
  ASSERT_EQ(out.size(), 2u);
  for (const ByteSpan& s : out) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data) % kPage, 0u);
    EXPECT_EQ(s.size % kPage, 0u);
    EXPECT_GE(s.data, region);
    EXPECT_LE(s.data + s.size, region + (region_size + kPage - 1) / kPage * kPage);
  }
  EXPECT_EQ(out[0].data, region);
  EXPECT_EQ(out[0].size, 2 * kPage);
  EXPECT_EQ(out[1].data, region + 5 * kPage);
  EXPECT_EQ(out[1].size, 2 * kPage);  // clipped to the region's last (partial) page
}

TEST(ExpertResidency, CountsHitsByResidencyAndKeepsOrderWithoutPrefetch) {
  Region r(16);
  ExpertResidencyOptions o;
  o.prefetch = ExpertPrefetch::None;
  o.hot_budget_bytes = 0;
  ExpertResidency res(o, {r.span()});
  res.add_layer(r.p, experts_in(r, 4, 4));
  r.touch(0, 4);  // expert 0 resident
  r.touch(8, 2);  // expert 2 half resident: a miss
  std::vector<int64_t> ids{0, 1, 2};
  res.on_routed(r.p, ids);
  EXPECT_EQ(ids, (std::vector<int64_t>{0, 1, 2}));  // no prefetch: nothing to overlap, order kept
  auto s = res.stats();
  EXPECT_EQ(s.lookups, 3);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.needed_bytes, static_cast<int64_t>(12 * kPage));
  EXPECT_EQ(s.missing_bytes, static_cast<int64_t>(6 * kPage));
  EXPECT_EQ(s.prefetched_experts, 0);
  EXPECT_EQ(s.experts_total, 4);
  EXPECT_EQ(s.expert_bytes_total, static_cast<int64_t>(16 * kPage));
  std::vector<int64_t> other{1};
  res.on_routed(reinterpret_cast<const void*>(0x1234), other);  // an unknown layer: ignored
  EXPECT_EQ(res.stats().lookups, 3);
}

// trust_resident_steps: an expert found resident is not asked about again (mincore) for that many steps of its
// layer; after the window it is, and an eviction meanwhile shows up then. 0 asks at every use.
TEST(ExpertResidency, TrustedResidentExpertsAreRecheckedAfterTheWindow) {
  for (int64_t window : {int64_t{0}, int64_t{3}}) {
    Region r(16);
    ExpertResidencyOptions o;
    o.prefetch = ExpertPrefetch::None;
    o.hot_budget_bytes = 0;
    o.trust_resident_steps = window;
    ExpertResidency res(o, {r.span()});
    res.add_layer(r.p, experts_in(r, 4, 4));
    r.touch(0, 4);  // expert 0 resident
    std::vector<int64_t> ids{0};
    res.on_routed(r.p, ids);
    ASSERT_EQ(res.stats().hits, 1);
    ASSERT_EQ(::madvise(r.p, 4 * kPage, MADV_DONTNEED), 0);  // evicted: anonymous pages are dropped
    int64_t hits_in_window = 0;
    for (int64_t step = 1; step <= window; ++step) {
      const int64_t before = res.stats().hits;
      res.on_routed(r.p, ids);
      hits_in_window += res.stats().hits - before;
    }
    EXPECT_EQ(hits_in_window, window) << "window " << window;  // trusted: counted resident, no mincore
    const int64_t before = res.stats().hits;
    res.on_routed(r.p, ids);  // past the window: asked again, and the eviction is seen
    EXPECT_EQ(res.stats().hits - before, 0) << "window " << window;
  }
}

TEST(ExpertResidency, PrefetchOrdersResidentFirstAndReadersFaultTheRestIn) {
  Region r(32);
  ExpertResidencyOptions o;
  o.prefetch = ExpertPrefetch::Threads;
  o.hot_budget_bytes = 0;
  ExpertResidency res(o, {r.span()});
  res.add_layer(r.p, experts_in(r, 4, 8));
  r.touch(24, 8);  // expert 3 resident
  std::vector<int64_t> ids{1, 3};
  res.on_routed(r.p, ids);
  EXPECT_EQ(ids, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(res.stats().prefetched_experts, 1);
  // The readers populate expert 1 in the background: it becomes a hit without the caller touching it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int64_t hits = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<int64_t> again{1};
    const int64_t before = res.stats().hits;
    res.on_routed(r.p, again);
    hits = res.stats().hits - before;
    if (hits == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(hits, 1);
}

TEST(ExpertResidency, BudgetZeroPinsNothing) {
  Region r(16);
  ExpertResidencyOptions o;
  o.prefetch = ExpertPrefetch::None;
  o.hot_budget_bytes = 0;
  o.rebalance_every = 2;
  ExpertResidency res(o, {r.span()});
  res.add_layer(r.p, experts_in(r, 4, 4));
  r.touch(0, 16);
  for (int step = 0; step < 10; ++step) {
    std::vector<int64_t> ids{0, 1};
    res.on_routed(r.p, ids);
  }
  EXPECT_EQ(res.stats().hot_experts, 0);
  EXPECT_EQ(res.stats().hot_bytes, 0);
  EXPECT_FALSE(res.pinned(r.p, 0));
}

TEST(ExpertResidency, HotSetIsTheMostUsedWithinBudgetAndFollowsAChange) {
  Region r(16);
  ExpertResidencyOptions o;
  o.prefetch = ExpertPrefetch::None;
  o.hot_budget_bytes = static_cast<int64_t>(8 * kPage);  // two experts of four pages
  o.rebalance_every = 4;
  ExpertResidency res(o, {r.span()});
  res.add_layer(r.p, experts_in(r, 4, 4));
  r.touch(0, 16);
  auto run = [&](std::vector<int64_t> hot, int steps) {
    for (int step = 0; step < steps; ++step) {
      // (Built by reserve + insert: GCC 12 warned -Warray-bounds, falsely, on push_back to a copy of `hot`.)
      std::vector<int64_t> ids;
      ids.reserve(hot.size() + 1);
      ids.insert(ids.end(), hot.begin(), hot.end());
      if (step % 4 == 0) ids.push_back(hot[0] == 0 ? 3 : 0);  // a rarely used one, never pinned
      std::sort(ids.begin(), ids.end());
      res.on_routed(r.p, ids);
    }
  };
  run({0, 1}, 9);
  if (!res.stats().pinning) GTEST_SKIP() << "mlock refused here (no CAP_IPC_LOCK / small RLIMIT_MEMLOCK)";
  EXPECT_TRUE(res.pinned(r.p, 0));
  EXPECT_TRUE(res.pinned(r.p, 1));
  EXPECT_FALSE(res.pinned(r.p, 3));
  EXPECT_LE(res.stats().hot_bytes, o.hot_budget_bytes);
  run({1, 2}, 24);  // the use moves: 2 joins, 0 leaves; the budget still holds
  EXPECT_TRUE(res.pinned(r.p, 1));
  EXPECT_TRUE(res.pinned(r.p, 2));
  EXPECT_FALSE(res.pinned(r.p, 0));
  EXPECT_EQ(res.stats().hot_experts, 2);
  EXPECT_EQ(res.stats().hot_bytes, static_cast<int64_t>(8 * kPage));
}

TEST(ExpertResidency, ParsesPrefetchFlag) {
  EXPECT_EQ(k3::parse_expert_prefetch("threads"), ExpertPrefetch::Threads);
  EXPECT_EQ(k3::parse_expert_prefetch("madvise"), ExpertPrefetch::Madvise);
  EXPECT_EQ(k3::parse_expert_prefetch("none"), ExpertPrefetch::None);
  EXPECT_THROW(k3::parse_expert_prefetch("always"), k3::Error);
}

// The model with residency (prefetch, resident-first order) gives the logits it gives without it, and
// counts one lookup per layer, step and routed expert used.
TEST(ExpertResidency, ModelLogitsUnchangedAndUsesCounted) {
  const std::string dir = k3test::source_path("models/k3-tiny");
  ExpertResidencyOptions off;
  off.enabled = false;
  ExpertResidencyOptions on;
  on.prefetch = ExpertPrefetch::Threads;
  on.hot_budget_bytes = 1 << 20;
  on.rebalance_every = 2;
  auto a = k3::Model::load(dir, k3::CacheDType::F32, k3::CacheDType::F32, off);
  auto b = k3::Model::load(dir, k3::CacheDType::F32, k3::CacheDType::F32, on);
  EXPECT_FALSE(a->expert_cache_stats().has_value());
  const std::vector<int32_t> tokens{5, 17, 99, 3, 250, 7, 31, 64};
  EXPECT_EQ(k3test::prefill_all_logits(*a, tokens), k3test::prefill_all_logits(*b, tokens));
  EXPECT_EQ(k3test::decode_all_logits(*a, tokens).logits, k3test::decode_all_logits(*b, tokens).logits);
  const auto s = b->expert_cache_stats();
  ASSERT_TRUE(s.has_value());
  const auto& c = b->config();
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.is_moe_layer(l) ? 1 : 0;
  // decode: one token a step, top_k distinct experts per layer; prefill adds at least top_k per layer.
  EXPECT_GE(s->lookups, moe_layers * c.top_k * (static_cast<int64_t>(tokens.size()) + 1));
  EXPECT_LE(s->hits, s->lookups);
  EXPECT_GT(s->hits, 0);  // the tiny model stays in the page cache once read
  EXPECT_EQ(s->experts_total, moe_layers * c.num_experts);
}

TEST(ExpertResidency, MetricsExportTheCache) {
  k3::serve::Metrics m;
  k3::engine::EngineStats st;
  EXPECT_EQ(m.render(st).find("k3_expert_cache_hit_ratio"), std::string::npos);
  k3::ExpertCacheStats e;
  e.enabled = true;
  e.lookups = 8;
  e.hits = 6;
  e.disk.read_bytes = 4096;
  st.expert_cache = e;
  const std::string page = m.render(st);
  EXPECT_NE(page.find("k3_expert_cache_hit_ratio 0.75\n"), std::string::npos);
  EXPECT_NE(page.find("k3_expert_cache_lookups_total 8\n"), std::string::npos);
  EXPECT_NE(page.find("k3_process_disk_read_bytes_total 4096\n"), std::string::npos);
}

TEST(PageCache, EvictsAndMeasuresAFile) {
  k3test::TempDir d;
  const std::string f = d.str() + "/blob";
  {
    std::ofstream o(f, std::ios::binary);
    std::vector<char> chunk(1 << 20, 'x');
    for (int i = 0; i < 4; ++i) o.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
  }
  EXPECT_GE(k3::evict_file_pages(f), 0);
  EXPECT_LE(k3::resident_file_bytes(f), 4 << 20);
  const auto seq = k3::measure_disk_read(f, 4 << 20, 1 << 20, false);
  EXPECT_EQ(seq.bytes, 4 << 20);
  EXPECT_GT(seq.seconds, 0);
  const auto rnd = k3::measure_disk_read(f, 4 << 20, 1 << 20, true);
  EXPECT_EQ(rnd.bytes, 4 << 20);
  EXPECT_THROW(k3::measure_disk_read(f, 4 << 20, 1000, false), k3::Error);     // not a multiple of 4 KiB
  EXPECT_THROW(k3::measure_disk_read(f, 4 << 20, 8 << 20, false), k3::Error);  // smaller than a block
  EXPECT_THROW(k3::evict_file_pages(d.str() + "/missing"), k3::Error);
}

}  // namespace

#include "k3/bench/offline.h"

namespace {

// bench offline's I/O columns: the timed repetitions' expert uses are counted (and only theirs).
TEST(ExpertResidency, OfflineBenchCountsTheTimedRunsUses) {
  auto m = k3::Model::load(k3test::source_path("models/k3-tiny"));
  k3::bench::OfflineTest t{"tg4", false, 4, 0, 1};
  const auto r = k3::bench::run_offline_test(*m, t, 2, 1, /*fresh_tokens=*/true, /*warmup=*/false);
  ASSERT_EQ(r.seconds.size(), 2u);
  ASSERT_TRUE(r.io.have_experts);
  const auto& c = m->config();
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.is_moe_layer(l) ? 1 : 0;
  EXPECT_EQ(r.io.expert_lookups, 2 * 4 * moe_layers * c.top_k);  // 2 runs x 4 steps, top_k distinct per step
  EXPECT_EQ(m->expert_cache_stats()->lookups, r.io.expert_lookups);  // no warm-up counted
  EXPECT_GT(r.io.seconds, 0);
}

}  // namespace

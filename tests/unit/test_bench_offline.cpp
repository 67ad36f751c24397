// bench offline's depth context: every run starts from the same depth, whether the caches are copied (a second set
// fits) or rebuilt (it does not: the whole Kimi-Linear-48B at batch 256 on an H200).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "k3/bench/offline.h"
#include "k3/model/model.h"
#include "golden_util.h"

namespace {

// k3-tiny behind a runner that reports `available` bytes of memory and records what the timed decode steps see.
class RecordingRunner final : public k3::ModelRunner {
 public:
  RecordingRunner(const k3::ModelRunner& m, int64_t available) : m_(m), available_(available) {}
  const k3::ModelConfig& config() const override { return m_.config(); }
  const k3::CacheSpec& cache_spec() const override { return m_.cache_spec(); }
  std::string device_name() const override { return "recording"; }
  std::unique_ptr<k3::SequenceCache> new_cache() const override {
    ++new_caches;
    return m_.new_cache();
  }
  std::shared_ptr<k3::CacheMemory> cache_memory() const override { return m_.cache_memory(); }
  int64_t memory_available() const override { return available_; }
  void forward_batch(const std::vector<k3::BatchItem>& items, std::vector<float>& logits,
                     const k3::ForwardOptions& opt = {}) const override {
    if (opt.path == k3::AttnPath::Decode) {
      std::lock_guard lk(mu_);
      for (const auto& it : items) past.push_back(it.cache->n_past());
    }
    m_.forward_batch(items, logits, opt);
  }
  mutable std::atomic<int> new_caches{0};
  mutable std::vector<int64_t> past;  // n_past of each sequence at each decode step, in order

 private:
  const k3::ModelRunner& m_;
  int64_t available_;
  mutable std::mutex mu_;
};

void expect_each_run_starts_at_depth(const RecordingRunner& r, int64_t depth, int64_t n, int64_t batch, int runs) {
  ASSERT_EQ(r.past.size(), static_cast<size_t>(runs * n * batch));
  for (int run = 0; run < runs; ++run)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t b = 0; b < batch; ++b)
        EXPECT_EQ(r.past[static_cast<size_t>((run * n + i) * batch + b)], depth + i) << "run " << run << " step " << i;
}

TEST(BenchOffline, DepthCachesCopiedWhereASecondSetFits) {
  auto m = k3::Model::load(k3test::source_path("models/k3-tiny"));
  RecordingRunner r(*m, int64_t{1} << 50);
  k3::bench::OfflineTest t{"tg3", false, 3, 40, 2};
  const auto res = k3::bench::run_offline_test(r, t, 2, 7, false, /*warmup=*/true, nullptr, /*host_logits=*/true);
  EXPECT_EQ(res.seconds.size(), 2u);
  expect_each_run_starts_at_depth(r, 40, 3, 2, 3);  // warm-up + 2 timed runs
  EXPECT_EQ(r.new_caches.load(), 2);                 // built once; the runs take clones
}

TEST(BenchOffline, DepthCachesRebuiltWhereASecondSetDoesNotFit) {
  auto m = k3::Model::load(k3test::source_path("models/k3-tiny"));
  RecordingRunner r(*m, 0);
  k3::bench::OfflineTest t{"tg3", false, 3, 40, 2};
  const auto res = k3::bench::run_offline_test(r, t, 2, 7, false, /*warmup=*/true, nullptr, /*host_logits=*/true);
  EXPECT_EQ(res.seconds.size(), 2u);
  expect_each_run_starts_at_depth(r, 40, 3, 2, 3);
  EXPECT_EQ(r.new_caches.load(), 2 * 3);  // the first run takes the contexts built for the check, two more builds
}

}  // namespace

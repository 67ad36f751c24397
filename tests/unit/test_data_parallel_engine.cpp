// DataParallelEngine over fake replicas: least-loaded dispatch, prefix-hash tie-break, the in-flight books
// (final outputs, refusals, outputs delivered inside submit), cancel routing, summed stats, limits, shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "k3/core/error.h"
#include "k3/engine/data_parallel_engine.h"

using namespace k3::engine;

namespace {

// A replica that queues requests until the test finishes them; records what reached it.
class FakeEngine final : public Engine {
 public:
  bool refuse = false;          // submit throws k3::Error
  bool finish_at_once = false;  // the final output is delivered inside submit (an engine thread that is quick)
  EngineStats st;
  EngineLimits lim{100, 4, 1000};
  std::vector<std::string> submitted, cancelled;
  std::vector<bool> shutdowns;

  void submit(Request r, OutputCallback cb) override {
    if (refuse) throw k3::Error("refused by the fake");
    if (finish_at_once) {
      cb(final_output(r.id));
      std::lock_guard lk(mu_);
      submitted.push_back(r.id);
      return;
    }
    std::lock_guard lk(mu_);
    submitted.push_back(r.id);
    live_[r.id] = std::move(cb);
  }
  void cancel(const std::string& id) override {
    std::lock_guard lk(mu_);
    cancelled.push_back(id);
  }
  EngineStats stats() const override { return st; }
  EngineLimits limits() const override { return lim; }
  void shutdown(bool drain) override { shutdowns.push_back(drain); }

  // Delivers a non-final delta, then (finished) the final output of a live request.
  void deliver(const std::string& id, bool finished) {
    OutputCallback cb;
    {
      std::lock_guard lk(mu_);
      cb = live_.at(id);
      if (finished) live_.erase(id);
    }
    RequestOutput o = finished ? final_output(id) : RequestOutput{};
    o.request_id = id;
    cb(o);
  }
  // Delivers the final output of one live request, if there is one (an engine thread's step).
  bool finish_one() {
    std::string id;
    OutputCallback cb;
    {
      std::lock_guard lk(mu_);
      if (live_.empty()) return false;
      id = live_.begin()->first;
      cb = std::move(live_.begin()->second);
      live_.erase(live_.begin());
    }
    cb(final_output(id));
    return true;
  }

 private:
  static RequestOutput final_output(const std::string& id) {
    RequestOutput o;
    o.request_id = id;
    o.finished = true;
    o.finish_reason = "stop";
    return o;
  }
  mutable std::mutex mu_;
  std::map<std::string, OutputCallback> live_;
};

struct Fixture {
  std::vector<FakeEngine*> fakes;  // owned by dp
  std::unique_ptr<DataParallelEngine> dp;
  explicit Fixture(size_t n) {
    std::vector<std::unique_ptr<Engine>> r;
    for (size_t i = 0; i < n; ++i) {
      auto f = std::make_unique<FakeEngine>();
      fakes.push_back(f.get());
      r.push_back(std::move(f));
    }
    dp = std::make_unique<DataParallelEngine>(std::move(r));
  }
  // The replica that got request `id`.
  size_t where(const std::string& id) const {
    for (size_t i = 0; i < fakes.size(); ++i)
      for (const auto& s : fakes[i]->submitted)
        if (s == id) return i;
    return SIZE_MAX;
  }
};

Request request(const std::string& id, std::vector<int32_t> prompt, std::string salt = {}) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.cache_salt = std::move(salt);
  return r;
}

// 80 tokens: the first 64 from `head`, the rest from `tail` (beyond the affinity hash).
std::vector<int32_t> prompt(int head, int tail = 0) {
  std::vector<int32_t> p;
  for (int i = 0; i < 64; ++i) p.push_back(head * 1000 + i);
  for (int i = 0; i < 16; ++i) p.push_back(tail * 1000 + i);
  return p;
}

}  // namespace

TEST(DataParallelEngine, ZeroReplicasAreRefused) {
  EXPECT_THROW(DataParallelEngine(std::vector<std::unique_ptr<Engine>>{}), k3::Error);
  std::vector<std::unique_ptr<Engine>> one_null;
  one_null.push_back(nullptr);
  EXPECT_THROW(DataParallelEngine(std::move(one_null)), k3::Error);
}

TEST(DataParallelEngine, TheLeastLoadedReplicaGetsTheRequest) {
  Fixture f(3);
  int outputs = 0;
  auto count = [&outputs](const RequestOutput&) { ++outputs; };
  // Whatever the hashes say, six requests on three idle replicas end two on each.
  for (int i = 0; i < 6; ++i) f.dp->submit(request("r" + std::to_string(i), prompt(i)), count);
  EXPECT_EQ(f.dp->in_flight(), (std::vector<int64_t>{2, 2, 2}));
  // Replica 1's requests finish: the next two go there, even with the prefix of a request elsewhere.
  for (const auto& id : std::vector<std::string>(f.fakes[1]->submitted)) f.fakes[1]->deliver(id, true);
  EXPECT_EQ(f.dp->in_flight(), (std::vector<int64_t>{2, 0, 2}));
  const std::string on0 = f.fakes[0]->submitted[0];
  f.dp->submit(request("a", prompt(std::stoi(on0.substr(1)))), count);
  f.dp->submit(request("b", prompt(99)), count);
  EXPECT_EQ(f.where("a"), 1u);
  EXPECT_EQ(f.where("b"), 1u);
  EXPECT_EQ(f.dp->in_flight(), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(outputs, 2);  // the two final outputs reached the caller's callback
}

TEST(DataParallelEngine, EqualLoadSamePrefixSameReplica) {
  Fixture f(4);
  auto none = [](const RequestOutput&) {};
  // Idle replicas each time (every request finishes before the next): the prefix hash decides. Prompts
  // that differ only after the first 64 tokens meet on one replica, the one affinity() names.
  const size_t home = DataParallelEngine::affinity("", prompt(7), 4);
  for (int t = 0; t < 8; ++t) {
    const std::string id = "same" + std::to_string(t);
    f.dp->submit(request(id, prompt(7, t)), none);
    EXPECT_EQ(f.where(id), home) << id;
    f.fakes[home]->deliver(id, true);
  }
  // Different prefixes, and the same prefix under different salts, spread over the replicas.
  std::set<size_t> by_prefix, by_salt;
  for (int h = 0; h < 32; ++h) {
    // Built by appends: GCC 12's -Wrestrict misfires on "p" + std::to_string(h).
    std::string id = "p", sid = "s", salt = "salt";
    id += std::to_string(h);
    sid += std::to_string(h);
    salt += std::to_string(h);
    f.dp->submit(request(id, prompt(h)), none);
    by_prefix.insert(f.where(id));
    f.fakes[f.where(id)]->deliver(id, true);
    f.dp->submit(request(sid, prompt(7), salt), none);
    by_salt.insert(f.where(sid));
    EXPECT_EQ(f.where(sid), DataParallelEngine::affinity("salt" + std::to_string(h), prompt(7), 4));
    f.fakes[f.where(sid)]->deliver(sid, true);
  }
  EXPECT_GE(by_prefix.size(), 3u);
  EXPECT_GE(by_salt.size(), 3u);
  // Load beats affinity: with the home replica busy, the same prefix goes to an idle one.
  f.dp->submit(request("busy", prompt(7)), none);
  f.dp->submit(request("next", prompt(7)), none);
  EXPECT_EQ(f.where("busy"), home);
  EXPECT_NE(f.where("next"), home);
}

TEST(DataParallelEngine, InFlightDropsOnTheFinalOutputOnly) {
  Fixture f(2);
  std::vector<bool> seen;
  f.dp->submit(request("x", prompt(1)), [&seen](const RequestOutput& o) { seen.push_back(o.finished); });
  const size_t r = f.where("x");
  EXPECT_EQ(f.dp->in_flight()[r], 1);
  f.fakes[r]->deliver("x", false);
  EXPECT_EQ(f.dp->in_flight()[r], 1);
  f.fakes[r]->deliver("x", true);
  EXPECT_EQ(f.dp->in_flight(), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(seen, (std::vector<bool>{false, true}));
  // A final output delivered before submit returns (the replica's engine thread was quick).
  for (auto* e : f.fakes) e->finish_at_once = true;
  int finals = 0;
  for (int i = 0; i < 5; ++i)
    f.dp->submit(request("q" + std::to_string(i), prompt(i)), [&finals](const RequestOutput& o) { finals += o.finished; });
  EXPECT_EQ(finals, 5);
  EXPECT_EQ(f.dp->in_flight(), (std::vector<int64_t>{0, 0}));
}

TEST(DataParallelEngine, CancelReachesTheOwnerOnly) {
  Fixture f(3);
  auto none = [](const RequestOutput&) {};
  // One request on each replica (least loaded), each cancelled: every cancel reaches its owner alone.
  for (const char* id : {"a", "b", "c"}) f.dp->submit(request(id, prompt(id[0])), none);
  for (const char* id : {"a", "b", "c"}) f.dp->cancel(id);
  f.dp->cancel("unknown");
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(f.fakes[i]->submitted.size(), 1u);
    EXPECT_EQ(f.fakes[i]->cancelled, f.fakes[i]->submitted) << i;
  }
  // Once finished, its id is forgotten: a late cancel goes nowhere.
  const size_t ra = f.where("a");
  f.fakes[ra]->deliver("a", true);
  f.dp->cancel("a");
  EXPECT_EQ(f.fakes[ra]->cancelled.size(), 1u);
}

TEST(DataParallelEngine, ARefusingReplicaLeavesNoBooks) {
  Fixture f(2);
  auto none = [](const RequestOutput&) {};
  for (auto* e : f.fakes) e->refuse = true;
  EXPECT_THROW(f.dp->submit(request("x", prompt(1)), none), k3::Error);
  EXPECT_EQ(f.dp->in_flight(), (std::vector<int64_t>{0, 0}));
  f.dp->cancel("x");  // not remembered: reaches no replica
  for (auto* e : f.fakes) EXPECT_TRUE(e->cancelled.empty());
  // The same id is accepted once the replicas accept again, and booked once.
  for (auto* e : f.fakes) e->refuse = false;
  f.dp->submit(request("x", prompt(1)), none);
  const auto load = f.dp->in_flight();
  EXPECT_EQ(load[0] + load[1], 1);
}

TEST(DataParallelEngine, StatsAreSummed) {
  Fixture f(3);
  int64_t k = 1;
  for (auto* e : f.fakes) {
    EngineStats& s = e->st;
    for (int64_t* v : {&s.running, &s.waiting, &s.cache_bytes_total, &s.cache_bytes_used, &s.cache_pages_total,
                       &s.cache_pages_used, &s.cache_pages_cached, &s.cache_slots_total, &s.cache_slots_used,
                       &s.cache_checkpoints, &s.prefix_queries_tokens, &s.prefix_hit_tokens, &s.preemptions,
                       &s.prompt_tokens_total, &s.generation_tokens_total, &s.spec_num_drafts,
                       &s.spec_num_draft_tokens, &s.spec_num_accepted_tokens})
      *v = k++;
  }
  f.fakes[0]->st.num_speculative_tokens = 2;
  f.fakes[0]->st.spec_accepted_per_pos = {5, 3};
  f.fakes[2]->st.num_speculative_tokens = 3;
  f.fakes[2]->st.spec_accepted_per_pos = {1, 1, 1};
  k3::ExpertCacheStats e1, e2;
  e1.enabled = e2.enabled = true;
  e1.lookups = 10, e1.hits = 4, e1.hot_bytes = 100, e1.disk.read_bytes = 7, e1.experts_total = 32;
  e2.lookups = 30, e2.hits = 26, e2.hot_bytes = 50, e2.disk.read_bytes = 7, e2.experts_total = 32;
  f.fakes[0]->st.expert_cache = e1;
  f.fakes[2]->st.expert_cache = e2;  // replica 1 has none

  const EngineStats s = f.dp->stats();
  // Field j of replica i was set to 1 + 18 i + j: the sum is 3 (1 + j) + 18 (0 + 1 + 2).
  const std::vector<int64_t> summed = {
      s.running, s.waiting, s.cache_bytes_total, s.cache_bytes_used, s.cache_pages_total, s.cache_pages_used,
      s.cache_pages_cached, s.cache_slots_total, s.cache_slots_used, s.cache_checkpoints, s.prefix_queries_tokens,
      s.prefix_hit_tokens, s.preemptions, s.prompt_tokens_total, s.generation_tokens_total, s.spec_num_drafts,
      s.spec_num_draft_tokens, s.spec_num_accepted_tokens};
  for (int64_t j = 0; j < static_cast<int64_t>(summed.size()); ++j)
    EXPECT_EQ(summed[static_cast<size_t>(j)], 3 * (1 + j) + 18 * 3) << "field " << j;
  EXPECT_EQ(s.num_speculative_tokens, 3);
  EXPECT_EQ(s.spec_accepted_per_pos, (std::vector<int64_t>{6, 4, 1}));
  ASSERT_TRUE(s.expert_cache);
  EXPECT_EQ(s.expert_cache->lookups, 40);
  EXPECT_EQ(s.expert_cache->hits, 30);
  EXPECT_DOUBLE_EQ(s.expert_cache->hit_ratio(), 0.75);
  EXPECT_EQ(s.expert_cache->hot_bytes, 150);
  EXPECT_EQ(s.expert_cache->disk.read_bytes, 7);  // the process's counters: once, not per replica
  EXPECT_EQ(s.expert_cache->experts_total, 32);
}

TEST(DataParallelEngine, LimitsAreWhatEveryReplicaServes) {
  Fixture f(3);
  f.fakes[0]->lim = {4096, 8, 1000};
  f.fakes[1]->lim = {2048, 16, 1000};
  f.fakes[2]->lim = {8192, 4, 999};
  const EngineLimits l = f.dp->limits();
  EXPECT_EQ(l.max_model_len, 2048);
  EXPECT_EQ(l.max_num_seqs, 28);
  EXPECT_EQ(l.vocab_size, 999);
}

TEST(DataParallelEngine, ShutdownReachesEveryReplicaOnceAndStopsSubmits) {
  Fixture f(3);
  f.dp->shutdown(true);
  for (auto* e : f.fakes) EXPECT_EQ(e->shutdowns, std::vector<bool>{true});
  EXPECT_THROW(f.dp->submit(request("late", prompt(1)), [](const RequestOutput&) {}), k3::Error);
  for (auto* e : f.fakes) EXPECT_TRUE(e->submitted.empty());
  f.dp->shutdown(false);
  for (auto* e : f.fakes) EXPECT_EQ(e->shutdowns, (std::vector<bool>{true, false}));
}

// Submits from several threads while each replica's "engine thread" delivers final outputs: every request
// is answered once and the books end at zero (run under the tsan preset for the locking).
TEST(DataParallelEngine, ConcurrentSubmitsAndFinalOutputsBalance) {
  Fixture f(3);
  std::atomic<int> finals{0};
  std::atomic<bool> submitting{true};
  std::vector<std::thread> loops, clients;
  for (auto* e : f.fakes)
    loops.emplace_back([e, &submitting] {
      // `submitting` is read BEFORE the drain: once it reads false every submit has happened, so the drain that
      // follows sees them all. (Reading it after an empty drain lost a race on a loaded box: the clients could submit
      // and finish between the two reads, leaving 278 requests unanswered in a CI run of session 33.)
      for (;;) {
        const bool more = submitting.load();
        while (e->finish_one()) {
        }
        if (!more) break;
        std::this_thread::yield();
      }
    });
  for (int t = 0; t < 4; ++t)
    clients.emplace_back([&f, &finals, t] {
      for (int i = 0; i < 250; ++i)
        f.dp->submit(request(std::to_string(t) + "-" + std::to_string(i), prompt(i % 7)),
                     [&finals](const RequestOutput& o) { finals += o.finished; });
    });
  for (auto& c : clients) c.join();
  submitting = false;
  for (auto& l : loops) l.join();
  EXPECT_EQ(finals.load(), 1000);
  EXPECT_EQ(f.dp->in_flight(), (std::vector<int64_t>{0, 0, 0}));
  size_t total = 0;
  for (auto* e : f.fakes) total += e->submitted.size();
  EXPECT_EQ(total, 1000u);
}

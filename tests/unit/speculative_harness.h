// The engine-level harness of the speculative decoding tests (test_speculative.cpp,
// test_speculative_block_drafter.cpp): k3-tiny and its tokenizer, a collector of request outputs, engine
// options, runs of a request set with and without speculation, and the check that drafts were accepted and
// rejected mid-block.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "k3/engine/batch_engine.h"
#include "k3/model/model.h"
#include "k3/text/tokenizer.h"
#include "engine_test_request.h"
#include "output_collector.h"
#include "test_util.h"

namespace k3test::spec {

using namespace k3::engine;


struct Env {
  std::unique_ptr<k3::Model> model;
  std::unique_ptr<k3::text::Tokenizer> tok;
  explicit Env(const std::string& dir, const std::string& tok_dir) {
    model = k3::Model::load(dir);
    tok = std::make_unique<k3::text::Tokenizer>(k3::text::Tokenizer::load(tok_dir));
  }
};
inline Env& tiny() {
  static Env e(k3test::source_path("models/k3-tiny"), k3test::source_path("models/k3-tiny"));
  return e;
}

using Collector = k3test::OutputCollector;

using k3test::make_request;

inline std::vector<int32_t> encode(const std::string& s) {
  std::vector<int32_t> v{static_cast<int32_t>(tiny().model->config().bos_token_id)};
  auto t = tiny().tok->encode(s);
  v.insert(v.end(), t.begin(), t.end());
  return v;
}

inline BatchEngineOptions options(bool prefix, std::optional<SpeculativeConfig> spec, int64_t budget = 256ll << 20,
                           int64_t seqs = 16) {
  BatchEngineOptions o;
  o.cache.budget_bytes = budget;
  o.cache.prefix_caching = prefix;
  o.sched.max_num_seqs = seqs;
  o.sched.max_num_batched_tokens = 256;
  o.speculative = spec;
  return o;
}

using Rollback = SpeculativeConfig::Rollback;
inline constexpr Rollback kRollbacks[] = {Rollback::Snapshots, Rollback::Replay};

inline SpeculativeConfig ngram(int64_t k, Rollback rb, int64_t lo = 1, int64_t hi = 4) {
  SpeculativeConfig c;
  c.method = "ngram";
  c.num_speculative_tokens = k;
  c.prompt_lookup_min = lo;
  c.prompt_lookup_max = hi;
  c.rollback = rb;
  return c;
}

// Code-like text: repeated lines the model continues partly as before, partly not.
inline const char* kCode =
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n\ndef ";
inline const char* kProse =
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a "
    "wife. It is a truth universally acknowledged, that";

struct RunResult {
  std::map<std::string, std::vector<int32_t>> ids;
  EngineStats stats;
  k3::cache::CacheStats cache;
};

inline RunResult run(Env& env, const BatchEngineOptions& o, const std::vector<Request>& reqs) {
  BatchEngine eng(*env.model, *env.tok, o);
  Collector c;
  for (const Request& r : reqs) eng.submit(r, c.cb());
  c.wait(static_cast<int>(reqs.size()));
  eng.shutdown(true);  // the engine thread is done: its counters are final (a step's are added after its deliveries)
  return {c.ids, eng.stats(), eng.cache_stats()};
}

// The drafts must have been verified, some accepted and some rejected mid-block, for the test to mean
// anything: a block whose first draft was accepted and a later one rejected is what exercises the
// rollback to a state in the middle of the chunk.
inline void expect_mixed_acceptance(const EngineStats& st) {
  EXPECT_GT(st.spec_num_drafts, 0);
  EXPECT_GT(st.spec_num_accepted_tokens, 0);
  EXPECT_LT(st.spec_num_accepted_tokens, st.spec_num_draft_tokens);
  ASSERT_FALSE(st.spec_accepted_per_pos.empty());
  EXPECT_GT(st.spec_accepted_per_pos[0], st.spec_accepted_per_pos.back()) << "no block was cut after its first draft";
}

}  // namespace k3test::spec

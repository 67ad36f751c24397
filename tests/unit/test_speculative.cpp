// Speculative decoding (issue 17): the --speculative-config parser, the n-gram proposer, the sampler's
// look-ahead draws, and the engine's verification + exact KDA rollback: output with speculation on is
// token for token the output with it off -- greedy and seeded sampling, alone and batched, with prefix-cache
// hits and preemption -- on k3-tiny and on the two tiny checkpoints (random weights, where most drafts are
// rejected mid-block, so a draft token's update left in the KDA recurrent or conv state would show).
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <regex>

#include "k3/core/error.h"
#include "k3/engine/batch_engine.h"
#include "k3/engine/draft_model_proposer.h"
#include "k3/engine/ngram_proposer.h"
#include "k3/engine/sampler.h"
#include "k3/engine/speculative_config.h"
#include "k3/grammar/grammar_engine.h"
#include "k3/model/model.h"
#include "engine_test_request.h"
#include "speculative_harness.h"
#include "test_util.h"

using namespace k3::engine;
using namespace k3test::spec;

namespace {

// ---- the flag -----------------------------------------------------------------------------------

TEST(SpeculativeConfig, ParsesVllmSpelling) {
  EXPECT_FALSE(parse_speculative_config("").has_value());
  auto c = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->method, "ngram");
  EXPECT_EQ(c->num_speculative_tokens, 4);
  EXPECT_EQ(c->prompt_lookup_max, 3);
  EXPECT_EQ(c->prompt_lookup_min, 3);  // vLLM: the missing bound equals the given one
  c = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 2})");
  EXPECT_EQ(c->prompt_lookup_min, 5);
  EXPECT_EQ(c->prompt_lookup_max, 5);
  EXPECT_EQ(c->rollback, SpeculativeConfig::Rollback::Snapshots);
  EXPECT_EQ(c->state_slots(), 2);
  c = parse_speculative_config(R"({"method": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 4, "rollback": "replay"})");
  EXPECT_EQ(c->method, "ngram");
  EXPECT_EQ(c->rollback, SpeculativeConfig::Rollback::Replay);
  EXPECT_EQ(c->state_slots(), 1);
  EXPECT_EQ(c->prompt_lookup_min, 1);
  EXPECT_EQ(c->prompt_lookup_max, 4);
}

TEST(SpeculativeConfig, RejectsBadInputWithOneLine) {
  const char* bad[] = {
      "{", "[]", "4", R"({"num_speculative_tokens": 4})", R"({"method": 3, "num_speculative_tokens": 4})",
      R"({"method": "eagle", "num_speculative_tokens": 4})", R"({"method": "ngram"})",
      R"({"method": "ngram", "num_speculative_tokens": 0})", R"({"method": "ngram", "num_speculative_tokens": -1})",
      R"({"method": "ngram", "num_speculative_tokens": 33})", R"({"method": "ngram", "num_speculative_tokens": 1e3})",
      R"({"method": "ngram", "num_speculative_tokens": 18446744073709551615})",
      R"({"method": "ngram", "num_speculative_tokens": "4"})", R"({"method": "ngram", "num_speculative_tokens": 4, "model": "x"})",
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 2})",
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 0})",
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 65})",
      R"({"method": "ngram", "num_speculative_tokens": 4, "rollback": "undo"})",
      R"({"method": "ngram", "num_speculative_tokens": 4, "rollback": 1})"};
  for (const char* j : bad) {
    try {
      parse_speculative_config(j);
      ADD_FAILURE() << "accepted " << j;
    } catch (const k3::Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("--speculative-config: ", 0), 0u) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  }
}

// ---- the n-gram proposer --------------------------------------------------------------------------

TEST(NgramProposer, ProposesWhatFollowedTheLongestMostRecentMatch) {
  NgramProposer p(1, 3);
  std::vector<int32_t> out;
  // ... 1 2 3 [7 8 9] ... 2 3 [5 6] ... 1 2 3: the trigram "1 2 3" (longest) matched at 0..2 -> 7 8 9.
  p.propose_one(std::vector<int32_t>{1, 2, 3, 7, 8, 9, 2, 3, 5, 6, 1, 2, 3}, 3, out);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 8, 9}));
  p.propose_one(std::vector<int32_t>{1, 2, 3, 7, 8, 9, 2, 3, 5, 6, 1, 2, 3}, 2, out);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 8}));
  // Two equal-length matches: the most recent one wins.
  p.propose_one(std::vector<int32_t>{4, 5, 1, 4, 5, 2, 4, 5}, 1, out);
  EXPECT_EQ(out, (std::vector<int32_t>{2}));
  // Drafts stop at the end of the sequence (the match right before the suffix).
  p.propose_one(std::vector<int32_t>{9, 9, 9}, 4, out);
  EXPECT_EQ(out, (std::vector<int32_t>{9}));
  // No earlier occurrence, or a match shorter than prompt_lookup_min: nothing.
  p.propose_one(std::vector<int32_t>{1, 2, 3, 4}, 4, out);
  EXPECT_TRUE(out.empty());
  NgramProposer p2(2, 3);
  p2.propose_one(std::vector<int32_t>{1, 7, 3, 1}, 4, out);
  EXPECT_TRUE(out.empty());
  p2.propose_one(std::vector<int32_t>{5, 1, 7, 3, 5, 1}, 4, out);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 3, 5, 1}));
  p2.propose_one(std::vector<int32_t>{5, 1, 7, 3, 5, 1}, 0, out);
  EXPECT_TRUE(out.empty());
  p2.propose_one(std::vector<int32_t>{}, 4, out);
  EXPECT_TRUE(out.empty());
}

// ---- the sampler's look-ahead draws ----------------------------------------------------------------

TEST(SpeculativeSampler, LookAheadDrawsKeepTheStream) {
  SamplingParams sp;
  sp.temperature = 0.7f;
  sp.frequency_penalty = 0.5f;
  Sampler plain(sp, 99), spec(sp, 99);
  const std::vector<int32_t> prompt{1, 2}, gen{3};
  std::vector<double> want;
  for (int i = 0; i < 6; ++i) want.push_back(plain.next_row(prompt, gen, 16, 16).u);
  // Rows look at draws 0..2; two tokens are kept; the next rows start at draw 2.
  const std::vector<int32_t> drafts{4, 4};
  auto rows = spec.next_rows(prompt, gen, drafts, 16, 16);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].u, want[0]);
  EXPECT_EQ(rows[1].u, want[1]);
  EXPECT_EQ(rows[2].u, want[2]);
  // Penalties count the drafts before each row: row 2 has seen generated {3, 4, 4}.
  ASSERT_EQ(rows[2].counted_ids.size(), 2u);
  EXPECT_EQ(rows[2].counts[1], 2);
  EXPECT_EQ(rows[0].counted_ids.size(), 1u);
  spec.consume_draws(2);
  rows = spec.next_rows(prompt, gen, {}, 16, 16);
  EXPECT_EQ(rows[0].u, want[2]);
  spec.consume_draws(1);
  EXPECT_EQ(spec.next_row(prompt, gen, 16, 16).u, want[3]);
}

// The acceptance rule on one row pair, statistically: drafting d for the first token, keep d when the
// target's own draw picks it, else keep the draw; given d was kept, the second row's draw is the next
// token. The kept tokens must follow the target: chi-square of the first token against softmax(l0 / T)
// and of the second (after d) against softmax(l1 / T).
TEST(SpeculativeSampler, AcceptanceRuleFollowsTheTarget) {
  const std::vector<float> l0{1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -1.0f}, l1{-0.3f, 1.5f, 0.7f, 0.1f, -2.0f, 1.1f};
  const float T = 0.8f;
  const int32_t draft = 0;  // the target's 2nd most likely first token: accepted about a quarter of the time
  const int V = 6, N = 40000;
  auto probs = [&](const std::vector<float>& l) {
    std::vector<double> p(V);
    double z = 0;
    for (int i = 0; i < V; ++i) z += p[static_cast<size_t>(i)] = std::exp((l[static_cast<size_t>(i)] - 2.0) / T);
    for (double& x : p) x /= z;
    return p;
  };
  std::vector<int64_t> first(V, 0), second(V, 0);
  SamplingParams sp;
  sp.temperature = T;
  for (int n = 0; n < N; ++n) {
    Sampler s(sp, static_cast<uint64_t>(n) * 7919 + 1);
    const std::vector<int32_t> drafts{draft};
    auto rows = s.next_rows({}, {}, drafts, V, V);
    std::vector<float> a = l0, b = l1;
    const int32_t x0 = k3::sampling::sample_row(a, rows[0]).token;
    ++first[static_cast<size_t>(x0)];
    if (x0 == draft) ++second[static_cast<size_t>(k3::sampling::sample_row(b, rows[1]).token)];
  }
  auto chi2 = [&](const std::vector<int64_t>& got, const std::vector<double>& p) {
    int64_t total = 0;
    for (int64_t g : got) total += g;
    double x = 0;
    for (int i = 0; i < V; ++i) {
      const double e = p[static_cast<size_t>(i)] * static_cast<double>(total);
      x += (static_cast<double>(got[static_cast<size_t>(i)]) - e) * (static_cast<double>(got[static_cast<size_t>(i)]) - e) / e;
    }
    return x;
  };
  // 5 degrees of freedom: P(chi2 > 25.7) = 1e-4.
  EXPECT_LT(chi2(first, probs(l0)), 25.7);
  EXPECT_LT(chi2(second, probs(l1)), 25.7);
}

// ---- the engine (harness: speculative_harness.h) ---------------------------------------------------

TEST(SpeculativeEngine, GreedyAloneEqualsNoSpeculation) {
  for (const Rollback rb : kRollbacks)
  for (const char* text : {kCode, kProse}) {
    const std::vector<Request> reqs{make_request("t", encode(text), 80)};
    const RunResult off = run(tiny(), options(false, std::nullopt), reqs);
    const RunResult on = run(tiny(), options(false, ngram(4, rb)), reqs);
    ASSERT_EQ(off.ids.at("t").size(), 80u);
    EXPECT_EQ(on.ids.at("t"), off.ids.at("t")) << text;
    expect_mixed_acceptance(on.stats);
    EXPECT_EQ(on.stats.generation_tokens_total, 80);
    EXPECT_EQ(on.cache.pages_used, 0);
    EXPECT_EQ(on.cache.slots_used, 0);
  }
}

#ifdef K3_HAVE_GRAMMAR
// Structured outputs with speculation on: constrained sequences get no drafts (their rows carry the
// grammar's mask), so their output is the same with speculation on or off and matches the grammar; the
// unconstrained ones batched with them are still speculated, and equal their output without speculation.
TEST(SpeculativeEngine, ConstrainedSequencesAreNotSpeculated) {
  k3::grammar::GrammarEngine ge(*tiny().tok, tiny().model->config().vocab_size);
  k3::grammar::GrammarSpec spec{k3::grammar::GrammarSpec::Kind::Regex, "(def [a-z]{1,6}\\(a, b\\):\n){1,4}",
                                {static_cast<int32_t>(tiny().model->config().eos_token_id)}};
  const auto g = ge.compile(spec);
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) {
    Request r = make_request("g" + std::to_string(i), encode(i % 2 ? kCode : kProse), 48, i < 3 ? 0.f : 0.8f, 300 + i);
    if (i % 2 == 0) r.grammar = g;
    reqs.push_back(r);
  }
  const RunResult off = run(tiny(), options(false, std::nullopt), reqs);
  const RunResult on = run(tiny(), options(false, ngram(4, Rollback::Snapshots)), reqs);
  for (auto& [id, v] : off.ids) EXPECT_EQ(on.ids.at(id), v) << id;
  EXPECT_GT(on.stats.spec_num_accepted_tokens, 0);  // the unconstrained ones were speculated
  const std::regex re("(def [a-z]{1,6}\\(a, b\\):\n){1,4}");
  for (int i = 0; i < 6; i += 2) {
    const auto& ids = on.ids.at("g" + std::to_string(i));
    EXPECT_TRUE(std::regex_match(tiny().tok->decode(ids), re)) << tiny().tok->decode(ids);
  }
}
#endif

TEST(SpeculativeEngine, SeededSamplingEqualsNoSpeculation) {
  // The same draws pick the same tokens: seeded output is identical, penalties included.
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) {
    Request r = make_request("s" + std::to_string(i), encode(i % 2 ? kCode : kProse), 48, i < 3 ? 0.3f : 0.9f, 100 + i);
    if (i == 4) r.params.frequency_penalty = 0.4f;
    if (i == 5) r.params.top_p = 0.9f;
    reqs.push_back(r);
  }
  const RunResult off = run(tiny(), options(false, std::nullopt), reqs);
  for (const Rollback rb : kRollbacks) {
    const RunResult on = run(tiny(), options(false, ngram(3, rb)), reqs);
    for (auto& [id, v] : off.ids) EXPECT_EQ(on.ids.at(id), v) << id;
    EXPECT_GT(on.stats.spec_num_accepted_tokens, 0);
  }
}

TEST(SpeculativeEngine, BatchedWithPrefixHitsEqualsNoSpeculation) {
  // 12 requests at once: shared prefixes (prefix-cache hits), greedy and sampled, short and long.
  std::vector<Request> reqs;
  for (int i = 0; i < 12; ++i) {
    std::string p = std::string(i % 3 == 0 ? kProse : kCode) + (i >= 6 ? " add(" : "");
    reqs.push_back(make_request("b" + std::to_string(i), encode(p), 20 + 7 * i, i % 4 == 3 ? 0.8f : 0.f, 200 + i));
  }
  const RunResult off = run(tiny(), options(true, std::nullopt), reqs);
  for (const Rollback rb : kRollbacks) {
    const RunResult on = run(tiny(), options(true, ngram(4, rb)), reqs);
    for (auto& [id, v] : off.ids) EXPECT_EQ(on.ids.at(id), v) << id;
    expect_mixed_acceptance(on.stats);
    EXPECT_EQ(on.cache.pages_used, 0);
    EXPECT_EQ(on.cache.slots_used, 0);
  }
  // A follow-up turn over an earlier output hits the prefix cache: the pages and checkpoint written
  // with speculation must hold only accepted tokens' state.
  std::vector<Request> turn2;
  for (int i = 0; i < 4; ++i) {
    auto p = reqs[static_cast<size_t>(i)].prompt;
    const auto& out = off.ids.at("b" + std::to_string(i));
    p.insert(p.end(), out.begin(), out.end());
    turn2.push_back(make_request("f" + std::to_string(i), p, 24));
  }
  auto two_turns = [&](std::optional<SpeculativeConfig> spec) {
    BatchEngine eng(*tiny().model, *tiny().tok, options(true, spec));
    Collector c;
    for (const Request& r : reqs) eng.submit(r, c.cb());
    c.wait(static_cast<int>(reqs.size()));
    for (const Request& r : turn2) eng.submit(r, c.cb());
    c.wait(static_cast<int>(reqs.size() + turn2.size()));
    return std::pair{c.ids, c.cached};
  };
  const auto t_off = two_turns(std::nullopt), t_on = two_turns(ngram(4, Rollback::Snapshots));
  int64_t hits = 0;
  for (int i = 0; i < 4; ++i) {
    const std::string id = "f" + std::to_string(i);
    EXPECT_EQ(t_on.first.at(id), t_off.first.at(id)) << id;
    hits += t_on.second.at(id);
  }
  EXPECT_GT(hits, 0);
}

TEST(SpeculativeEngine, PreemptionEqualsNoSpeculation) {
  // A cache too small for 10 sequences of ~130 tokens at once: sequences are preempted mid-speculation.
  std::vector<Request> reqs;
  for (int i = 0; i < 10; ++i) reqs.push_back(make_request("p" + std::to_string(i), encode(i % 2 ? kCode : kProse), 90));
  const auto& spec = tiny().model->cache_spec();
  const RunResult off = run(tiny(), options(false, std::nullopt), reqs);
  for (const Rollback rb : kRollbacks) {
    // The state slots and one page per sequence, plus 40 pages: about a third of what all need at once.
    const int64_t small = k3::cache::HybridCache::budget_for(spec, 16, 10, 16, ngram(4, rb).state_slots()) +
                          40 * ((spec.page_bytes(16) + 255) / 256 * 256);
    const RunResult on = run(tiny(), options(false, ngram(4, rb), small, 10), reqs);
    EXPECT_GT(on.stats.preemptions, 0) << "the small cache should have forced preemption";
    for (auto& [id, v] : off.ids) EXPECT_EQ(on.ids.at(id), v) << id;
    EXPECT_GT(on.stats.spec_num_accepted_tokens, 0);
    EXPECT_EQ(on.cache.pages_used, 0);
    EXPECT_EQ(on.cache.slots_used, 0);
  }
}

// The tiny checkpoints (random weights): their continuations rarely repeat the prompt's pattern, so
// nearly every block is cut after a draft or two and the rollback runs all the time.
TEST(SpeculativeEngine, TinyCheckpointsEqualNoSpeculation) {
  for (const char* dir : {"tests/data/tiny-k3", "tests/data/tiny-kimi-linear"}) {
    Env env(k3test::source_path(dir), k3test::source_path("tests/data/tiny-tokenizer"));
    std::vector<Request> reqs;
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> prompt;
      for (int r = 0; r < 6; ++r)
        for (int t = 0; t < 5 + i; ++t) prompt.push_back(static_cast<int32_t>(10 + t * (i + 3)));
      reqs.push_back(make_request("k" + std::to_string(i), prompt, 40, i == 3 ? 1.0f : 0.f, 5));
    }
    const RunResult off = run(env, options(true, std::nullopt), reqs);
    for (const Rollback rb : kRollbacks) {
      const RunResult on = run(env, options(true, ngram(5, rb, 1, 3)), reqs);
      for (auto& [id, v] : off.ids) EXPECT_EQ(on.ids.at(id), v) << dir << " " << id;
      EXPECT_GT(on.stats.spec_num_drafts, 0) << dir;
      EXPECT_LT(on.stats.spec_num_accepted_tokens, on.stats.spec_num_draft_tokens) << dir;
    }
  }
}

// Logprobs come from each verification row's raw logits: the same values as without speculation, and
// stop strings / stop tokens inside an accepted block end the request where they would without it.
TEST(SpeculativeEngine, LogprobsAndStopsEqualNoSpeculation) {
  auto collect = [](std::optional<SpeculativeConfig> spec, Request r) {
    BatchEngine eng(*tiny().model, *tiny().tok, options(false, spec));
    std::vector<TokenLogprob> lps;
    std::string text, reason;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    eng.submit(r, [&](const RequestOutput& o) {
      std::lock_guard lk(mu);
      lps.insert(lps.end(), o.logprobs.begin(), o.logprobs.end());
      for (const auto& p : o.pieces) text += p.text;
      if (o.finished) {
        reason = o.finish_reason;
        done = true;
        cv.notify_all();
      }
    });
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return done; });
    return std::tuple{lps, text, reason};
  };
  Request r = make_request("l", encode(kCode), 60);
  r.top_logprobs = 3;
  const auto [off_lp, off_text, off_reason] = collect(std::nullopt, r);
  const auto [on_lp, on_text, on_reason] = collect(ngram(4, Rollback::Snapshots), r);
  ASSERT_EQ(on_lp.size(), off_lp.size());
  for (size_t i = 0; i < off_lp.size(); ++i) {
    EXPECT_EQ(on_lp[i].id, off_lp[i].id) << i;
    EXPECT_EQ(on_lp[i].logprob, off_lp[i].logprob) << i;
    EXPECT_EQ(on_lp[i].top, off_lp[i].top) << i;
  }
  EXPECT_EQ(on_text, off_text);
  // A stop string taken from the middle of the greedy output: the request ends at the same place.
  ASSERT_GT(off_text.size(), 40u);
  Request st = make_request("s", encode(kCode), 60);
  st.params.stop = {off_text.substr(30, 4)};
  const auto [a_lp, a_text, a_reason] = collect(std::nullopt, st);
  const auto [b_lp, b_text, b_reason] = collect(ngram(4, Rollback::Snapshots), st);
  EXPECT_EQ(a_reason, "stop");
  EXPECT_EQ(b_reason, "stop");
  EXPECT_EQ(b_text, a_text);
}

TEST(SpeculativeEngine, SaysWhenTheRunnerCannotRollBack) {
  struct NoSnapshots : k3::ModelRunner {
    const k3::ModelRunner& m;
    explicit NoSnapshots(const k3::ModelRunner& r) : m(r) {}
    const k3::ModelConfig& config() const override { return m.config(); }
    const k3::CacheSpec& cache_spec() const override { return m.cache_spec(); }
    std::string device_name() const override { return "test-device"; }
    std::unique_ptr<k3::SequenceCache> new_cache() const override { return m.new_cache(); }
    std::shared_ptr<k3::CacheMemory> cache_memory() const override { return m.cache_memory(); }
    int64_t memory_available() const override { return m.memory_available(); }
    void forward_batch(const std::vector<k3::BatchItem>& items, std::vector<float>& logits,
                       const k3::ForwardOptions& opt) const override {
      m.forward_batch(items, logits, opt);
    }
  } runner(*tiny().model);
  try {
    BatchEngine eng(runner, *tiny().tok, options(false, ngram(2, Rollback::Snapshots)));
    FAIL() << "expected an error";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("test-device"), std::string::npos) << e.what();
  }
}

// ---- the draft-model proposer ---------------------------------------------------------------------

TEST(SpeculativeConfig, DraftModelSpellings) {
  auto c = parse_speculative_config(R"({"model": "models/k3-tiny", "num_speculative_tokens": 3})");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->method, "draft_model");  // vLLM: a model and no method
  EXPECT_EQ(c->model, "models/k3-tiny");
  c = parse_speculative_config(R"({"method": "draft_model", "model": "d", "num_speculative_tokens": 2, "rollback": "replay"})");
  EXPECT_EQ(c->state_slots(), 1);
  for (const char* j : {R"({"method": "draft_model", "num_speculative_tokens": 2})",
                        R"({"method": "draft_model", "model": "", "num_speculative_tokens": 2})",
                        R"({"method": "draft_model", "model": 3, "num_speculative_tokens": 2})",
                        R"({"model": "d", "num_speculative_tokens": 2, "prompt_lookup_max": 3})",
                        R"({"model": "d"})"})
    EXPECT_THROW(parse_speculative_config(j), k3::Error) << j;
}

SpeculativeConfig draft_cfg(const std::string& dir, int64_t k, Rollback rb) {
  SpeculativeConfig c;
  c.method = "draft_model";
  c.model = dir;
  c.num_speculative_tokens = k;
  c.rollback = rb;
  return c;
}

// The proposer's own caches: a catch-up runs only the tokens added since the last call, and the drafts
// after it equal those of a fresh proposer given the whole sequence at once -- which fails if a guessed
// token's update stayed in the draft model's KDA recurrent or conv state, or a token was skipped or run twice.
TEST(DraftModelProposer, CatchUpEqualsAFreshStartAndRunsOnlyNewTokens) {
  Env env(k3test::source_path("tests/data/tiny-kimi-linear"), k3test::source_path("tests/data/tiny-tokenizer"));
  const auto& m = *env.model;
  DraftModelProposer p(m, m.config().vocab_size);
  std::vector<int32_t> a{5, 17, 301, 44, 9, 870, 12, 12, 3}, b{600, 2, 71};
  std::vector<int32_t> da, db;
  int key_a = 0, key_b = 0;
  DraftSlot slots[2] = {{a, &key_a, 4, &da}, {b, &key_b, 3, &db}};
  p.propose(slots);
  EXPECT_EQ(da.size(), 4u);
  EXPECT_EQ(db.size(), 3u);
  EXPECT_EQ(p.tokens_run(), static_cast<int64_t>(a.size() + b.size()));
  // Sequence a moves on by tokens unlike the guesses (a rejection); b is gone.
  const int64_t before = p.tokens_run();
  a.insert(a.end(), {da[0], static_cast<int32_t>((da[1] + 1) % 1024), 77});
  DraftSlot again[1] = {{a, &key_a, 4, &da}};
  p.propose(again);
  EXPECT_EQ(p.tokens_run() - before, 3);
  EXPECT_EQ(p.cached_sequences(), 1u);
  DraftModelProposer fresh(m, m.config().vocab_size);
  std::vector<int32_t> want;
  DraftSlot one[1] = {{a, &key_b, 4, &want}};
  fresh.propose(one);
  EXPECT_EQ(da, want);
  // The same key with other tokens (a later sequence): rebuilt from its tokens, same drafts as fresh.
  std::vector<int32_t> c{1, 2, 3, 4, 5}, dc, dc_fresh;
  DraftSlot reuse[1] = {{c, &key_a, 2, &dc}};
  p.propose(reuse);
  DraftModelProposer fresh2(m, m.config().vocab_size);
  DraftSlot reuse2[1] = {{c, &key_a, 2, &dc_fresh}};
  fresh2.propose(reuse2);
  EXPECT_EQ(dc, dc_fresh);
  EXPECT_THROW(DraftModelProposer(m, m.config().vocab_size + 1), k3::Error);
}

BatchEngineOptions with_draft(BatchEngineOptions o, const k3::ModelRunner& draft) {
  o.draft_model = &draft;
  return o;
}

// k3-tiny drafting for itself, greedy: every guess is the target's own choice, so all are accepted --
// batched, with prefix-cache hits and under preemption (where a sequence's draft cache is rebuilt from
// its tokens). One guess computed from a stale or polluted draft state would show as a rejection.
TEST(SpeculativeEngine, DraftModelSelfDraftAcceptsEveryGuess) {
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i)
    reqs.push_back(make_request("d" + std::to_string(i), encode(std::string(i % 2 ? kCode : kProse) + (i >= 3 ? " a" : "")), 40));
  const RunResult off = run(tiny(), options(true, std::nullopt), reqs);
  const auto& spec = tiny().model->cache_spec();
  for (const Rollback rb : kRollbacks) {
    const SpeculativeConfig cfg = draft_cfg("models/k3-tiny", 4, rb);
    const int64_t small = k3::cache::HybridCache::budget_for(spec, 16, 6, 16, cfg.state_slots()) +
                          8 * ((spec.page_bytes(16) + 255) / 256 * 256);
    for (const int64_t budget : {int64_t{256} << 20, small}) {
      const RunResult on = run(tiny(), with_draft(options(true, cfg, budget, 6), *tiny().model), reqs);
      for (auto& [id, v] : off.ids) EXPECT_EQ(on.ids.at(id), v) << id;
      EXPECT_GT(on.stats.spec_num_draft_tokens, 0);
      EXPECT_EQ(on.stats.spec_num_accepted_tokens, on.stats.spec_num_draft_tokens) << "budget " << budget;
      if (budget == small) {
        EXPECT_GT(on.stats.preemptions, 0) << "the small cache should have forced preemption";
      }
      EXPECT_EQ(on.cache.pages_used, 0);
      EXPECT_EQ(on.cache.slots_used, 0);
    }
  }
}

// A draft model that guesses badly (another random checkpoint, same tokenizer): most blocks are cut
// mid-way; greedy and seeded output still equal the output without speculation.
TEST(SpeculativeEngine, DraftModelThatMostlyMissesEqualsNoSpeculation) {
  Env target(k3test::source_path("tests/data/tiny-k3"), k3test::source_path("tests/data/tiny-tokenizer"));
  Env draft(k3test::source_path("tests/data/tiny-kimi-linear"), k3test::source_path("tests/data/tiny-tokenizer"));
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 12 + 3 * i; ++t) prompt.push_back(static_cast<int32_t>((37 * t + 11 * i) % 1000 + 3));
    reqs.push_back(make_request("m" + std::to_string(i), prompt, 30, i == 3 ? 0.9f : 0.f, 7));
  }
  const RunResult off = run(target, options(true, std::nullopt), reqs);
  for (const Rollback rb : kRollbacks) {
    const RunResult on = run(target, with_draft(options(true, draft_cfg("d", 3, rb)), *draft.model), reqs);
    for (auto& [id, v] : off.ids) EXPECT_EQ(on.ids.at(id), v) << id;
    EXPECT_GT(on.stats.spec_num_drafts, 0);
    EXPECT_LT(on.stats.spec_num_accepted_tokens, on.stats.spec_num_draft_tokens);
  }
}

}  // namespace

// Speculative decoding with the block drafter (method "block_drafter", docs/block-drafter.md): the flag's
// spellings and errors, the proposer (one drafter forward per call, drafts = the drafter's argmax, no drafts
// without taps), the engine's tap bookkeeping (a proposer that checks every ctx it is handed is the row that
// produced the sequence's last token, across accepted and rejected blocks, both rollbacks and preemption),
// and output with the drafter on == off token for token, greedy and seeded, alone and batched, with a random
// drafter and (test_drafter_golden.cpp) the Python golden drafter.
#include <gtest/gtest.h>

#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"
#include "k3/engine/block_drafter_proposer.h"
#include "k3/engine/ngram_proposer.h"
#include "drafter_test_util.h"
#include "speculative_harness.h"

using namespace k3::engine;
using namespace k3test::spec;

namespace {

TEST(SpeculativeConfig, BlockDrafterSpellings) {
  auto c = parse_speculative_config(R"({"method": "block_drafter", "model": "d", "num_speculative_tokens": 4})");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->method, "block_drafter");
  EXPECT_EQ(c->model, "d");
  EXPECT_EQ(describe(*c), "block_drafter k=4 drafter d rollback snapshots");
  c = parse_speculative_config(R"({"method": "dspark", "model": "d", "num_speculative_tokens": 7, "rollback": "replay"})");
  EXPECT_EQ(c->method, "block_drafter");  // the alias
  EXPECT_EQ(c->state_slots(), 1);
  for (const char* j : {R"({"method": "block_drafter", "num_speculative_tokens": 2})",
                        R"({"method": "dspark", "model": "", "num_speculative_tokens": 2})",
                        R"({"method": "block_drafter", "model": "d", "num_speculative_tokens": 2, "prompt_lookup_max": 3})",
                        R"({"method": "block_drafter", "model": "d", "num_speculative_tokens": 0})",
                        R"({"method": "block_drafter", "model": "d"})"}) {
    try {
      parse_speculative_config(j);
      ADD_FAILURE() << "accepted " << j;
    } catch (const k3::Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--speculative-config: ", 0), 0u) << e.what();
    }
  }
}

// A random drafter for k3-tiny, loaded over the CPU model's weights (one per test binary).
struct TinyDrafter {
  std::unique_ptr<k3test::RandomDrafter> files;
  std::unique_ptr<k3::drafter::BlockDrafter> drafter;
};
TinyDrafter& tiny_drafter() {
  static TinyDrafter d = [] {
    TinyDrafter t;
    t.files = k3test::write_random_drafter(tiny().model->config(), {}, 2024);
    const k3::Model& m = *tiny().model;
    t.drafter = k3::drafter::BlockDrafter::load(t.files->path(), m.config(), m.weights().embed, m.weights().lm_head);
    return t;
  }();
  return d;
}

TEST(BlockDrafterProposer, DraftsTheDrafterArgmaxInOneForward) {
  const auto& d = *tiny_drafter().drafter;
  const int64_t V = tiny().model->config().vocab_size, D = d.config().ctx_dim();
  BlockDrafterProposer p(d, 5, V);
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  std::vector<float> ctx(static_cast<size_t>(2 * D));
  for (float& x : ctx) x = u(rng);
  const std::vector<int32_t> a{5, 17, 301}, b{600, 2}, c{9};
  std::vector<int32_t> da, db, dc, dd{1, 2};
  int ka = 0, kb = 0, kc = 0, kd = 0;
  const DraftSlot slots[4] = {{a, &ka, 5, &da, std::span(ctx).first(size_t(D))},
                              {b, &kb, 2, &db, std::span(ctx).last(size_t(D))},
                              {c, &kc, 3, &dc},                                    // no taps: no drafts
                              {c, &kd, 0, &dd, std::span(ctx).first(size_t(D))}};  // none wanted: cleared
  p.propose(slots);
  EXPECT_EQ(p.forwards(), 1);
  std::vector<int32_t> want;
  d.draft(ctx, std::vector<int32_t>{a.back(), b.back()}, 5, want);
  EXPECT_EQ(da, std::vector<int32_t>(want.begin(), want.begin() + 5));
  EXPECT_EQ(db, std::vector<int32_t>(want.begin() + 5, want.begin() + 7));
  EXPECT_TRUE(dc.empty());
  EXPECT_TRUE(dd.empty());
  EXPECT_EQ(std::vector<int32_t>(p.tap_layers().begin(), p.tap_layers().end()), d.config().target_layer_ids);
  EXPECT_THROW(BlockDrafterProposer(d, d.config().block_size + 1, V), k3::Error);  // k > block_size
  EXPECT_THROW(BlockDrafterProposer(d, 2, V + 1), k3::Error);                      // another vocabulary
  SpeculativeConfig cfg;
  cfg.method = "block_drafter";
  cfg.num_speculative_tokens = 3;
  EXPECT_THROW(make_proposer(cfg, nullptr, V, nullptr), k3::Error);  // the drafter was not loaded
}

// Checks every ctx the engine hands out against its definition: the final-normed hidden state of the row
// whose logits produced the sequence's last token, so lm_head applied to it must rank that token first
// (greedy requests). Drafts come from prompt lookup, for blocks accepted and rejected mid-way.
class TapChecker final : public Proposer {
 public:
  explicit TapChecker(const k3::Model& m) : m_(m), ids_{static_cast<int32_t>(m.config().num_layers)} {
    const int64_t V = m.config().vocab_size, H = m.config().hidden_size;
    head_.resize(static_cast<size_t>(V * H));
    for (int64_t v = 0; v < V; ++v) k3::cpu::dequant_row(m.weights().lm_head, v, head_.data() + v * H);
  }
  void propose(std::span<const DraftSlot> batch) override {
    const int64_t V = m_.config().vocab_size, H = m_.config().hidden_size;
    for (const DraftSlot& s : batch) {
      if (s.ctx.size() != static_cast<size_t>(H)) {
        ++missing;
        continue;
      }
      std::vector<double> l(static_cast<size_t>(V));
      for (int64_t v = 0; v < V; ++v)
        for (int64_t d = 0; d < H; ++d) l[size_t(v)] += double(head_[size_t(v * H + d)]) * s.ctx[size_t(d)];
      const double top = *std::max_element(l.begin(), l.end());
      ++checked;
      if (l[size_t(s.tokens.back())] < top - 1e-3) ++wrong;  // (a rounding-level tie is no error)
    }
    ngram_.propose(batch);
  }
  std::span<const int32_t> tap_layers() const override { return ids_; }
  int64_t checked = 0, wrong = 0, missing = 0;

 private:
  const k3::Model& m_;
  std::vector<int32_t> ids_;
  std::vector<float> head_;
  NgramProposer ngram_{1, 4};
};

TEST(SpeculativeEngine, TapsAreTheRowThatProducedTheLastToken) {
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(make_request("t" + std::to_string(i), encode(i % 2 ? kCode : kProse), 30 + 9 * i));
  const RunResult off = run(tiny(), options(true, std::nullopt), reqs);
  const auto& spec = tiny().model->cache_spec();
  for (const Rollback rb : kRollbacks) {
    const SpeculativeConfig cfg = ngram(4, rb);
    const int64_t small = k3::cache::HybridCache::budget_for(spec, 16, 8, 16, cfg.state_slots()) +
                          12 * ((spec.page_bytes(16) + 255) / 256 * 256);
    for (const int64_t budget : {int64_t{256} << 20, small}) {
      TapChecker checker(*tiny().model);
      BatchEngineOptions o = options(budget != small, cfg, budget, 8);
      o.proposer = &checker;
      const RunResult on = run(tiny(), o, reqs);
      for (auto& [id, v] : off.ids) EXPECT_EQ(on.ids.at(id), v) << id;
      expect_mixed_acceptance(on.stats);
      if (budget == small) {
        EXPECT_GT(on.stats.preemptions, 0) << "the small cache should have forced preemption";
      }
      EXPECT_GT(checker.checked, 100);
      EXPECT_EQ(checker.wrong, 0) << "rollback " << int(rb) << " budget " << budget;
      EXPECT_EQ(checker.missing, 0);
    }
  }
}

BatchEngineOptions with_drafter(BatchEngineOptions o, const k3::drafter::BlockDrafter& d) {
  o.block_drafter = &d;
  return o;
}

SpeculativeConfig drafter_cfg(int64_t k, Rollback rb) {
  SpeculativeConfig c;
  c.method = "block_drafter";
  c.model = "random";
  c.num_speculative_tokens = k;
  c.rollback = rb;
  return c;
}

// Output with the drafter on equals output with it off: greedy and seeded, alone and batched (different
// prompt and output lengths, prefix-cache hits), both rollbacks. A random drafter's guesses are nearly all
// rejected at the first position: every verification rolls the state back past all its drafts.
TEST(SpeculativeEngine, BlockDrafterEqualsNoSpeculation) {
  const auto& d = *tiny_drafter().drafter;
  std::vector<Request> alone{make_request("a", encode(kCode), 40)}, batch;
  for (int i = 0; i < 6; ++i) {
    const std::string p = std::string(i % 2 ? kCode : kProse).substr(0, 40 + 25 * static_cast<size_t>(i));
    batch.push_back(make_request("b" + std::to_string(i), encode(p), 16 + 6 * i, i == 5 ? 0.8f : 0.f, 50 + i));
  }
  for (const auto* reqs : {&alone, &batch}) {
    const RunResult off = run(tiny(), options(true, std::nullopt), *reqs);
    for (const Rollback rb : kRollbacks) {
      const RunResult on = run(tiny(), with_drafter(options(true, drafter_cfg(5, rb)), d), *reqs);
      for (auto& [id, v] : off.ids) EXPECT_EQ(on.ids.at(id), v) << id;
      EXPECT_GT(on.stats.spec_num_drafts, 0);
      EXPECT_GT(on.stats.spec_num_draft_tokens, 3 * on.stats.spec_num_drafts);  // blocks of up to k = 5
      EXPECT_EQ(on.cache.pages_used, 0);
      EXPECT_EQ(on.cache.slots_used, 0);
    }
  }
}

// The Python side's golden drafter (tests/data/drafter-golden/drafter: random weights too, taps [2, 6, 10, 12]),
// loaded as the CLI does (the target's embedding and lm_head mapped from its files): on == off.
TEST(SpeculativeEngine, GoldenDrafterEqualsNoSpeculation) {
  const auto d = k3::drafter::BlockDrafter::load(k3test::source_path("tests/data/drafter-golden/drafter"),
                                                 k3test::source_path("models/k3-tiny"));
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(make_request("g" + std::to_string(i), encode(i % 2 ? kCode : kProse), 20 + 10 * i));
  const RunResult off = run(tiny(), options(false, std::nullopt), reqs);
  const RunResult on = run(tiny(), with_drafter(options(false, drafter_cfg(6, Rollback::Snapshots)), *d), reqs);
  for (auto& [id, v] : off.ids) EXPECT_EQ(on.ids.at(id), v) << id;
  EXPECT_GT(on.stats.spec_num_drafts, 0);
}

TEST(SpeculativeEngine, BlockDrafterStartUpErrors) {
  const auto& d = *tiny_drafter().drafter;
  // k above the drafter's block_size.
  EXPECT_THROW(BatchEngine(*tiny().model, *tiny().tok, with_drafter(options(false, drafter_cfg(9, Rollback::Snapshots)), d)),
               k3::Error);
  // A drafter made for another target (tiny-k3: another hidden size and vocabulary).
  Env other(k3test::source_path("tests/data/tiny-k3"), k3test::source_path("tests/data/tiny-tokenizer"));
  EXPECT_THROW(BatchEngine(*other.model, *other.tok, with_drafter(options(false, drafter_cfg(4, Rollback::Snapshots)), d)),
               k3::Error);
}

}  // namespace

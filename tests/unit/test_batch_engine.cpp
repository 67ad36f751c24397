// The continuous-batching engine on the trained default model: outputs are identical alone or batched,
// with prefix caching on or off, under preemption; nothing leaks; bad requests fail before queueing.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <cstdlib>
#include <cstring>
#include <random>

#include "k3/backend/cpu/mxfp4_rowblocks.h"
#include "k3/core/error.h"
#include "k3/engine/batch_engine.h"
#include "k3/model/model.h"
#include "engine_test_request.h"
#include "output_collector.h"
#include "test_util.h"

using namespace k3::engine;

namespace {

struct Env {
  std::unique_ptr<k3::Model> model;
  std::unique_ptr<k3::text::Tokenizer> tok;
  Env() {
    const std::string dir = k3test::source_path("models/k3-tiny");
    model = k3::Model::load(dir);
    tok = std::make_unique<k3::text::Tokenizer>(k3::text::Tokenizer::load(dir));
  }
};
Env& env() {
  static Env e;
  return e;
}

using Collector = k3test::OutputCollector;

using k3test::make_request;

std::vector<int32_t> encode(const std::string& s) {
  std::vector<int32_t> v{static_cast<int32_t>(env().model->config().bos_token_id)};
  auto t = env().tok->encode(s);
  v.insert(v.end(), t.begin(), t.end());
  return v;
}

BatchEngineOptions options(bool prefix, int64_t budget = 256ll << 20, int64_t seqs = 32) {
  BatchEngineOptions o;
  o.cache.budget_bytes = budget;
  o.cache.prefix_caching = prefix;
  o.sched.max_num_seqs = seqs;
  o.sched.max_num_batched_tokens = 256;
  return o;
}

const char* kTexts[] = {"It is a truth universally acknowledged", "def fibonacci(n):\n    ", "In the beginning God created",
                        "Emma Woodhouse, handsome, clever, and rich,", "import os\nimport sys\n\ndef main():",
                        "The family of Dashwood had long been settled in Sussex."};

}  // namespace

// A target request alone, then among 31 others of varied lengths and sampling settings: the same tokens.
static void expect_alone_equals_batched(const k3::Model& model) {
  // Alone.
  std::vector<int32_t> target = encode("It is a truth universally acknowledged, that a single man");
  std::vector<int32_t> alone;
  {
    BatchEngine eng(model, *env().tok, options(false));
    Collector c;
    eng.submit(make_request("t", target, 40), c.cb());
    c.wait(1);
    alone = c.ids["t"];
  }
  ASSERT_EQ(alone.size(), 40u);
  // With 31 others of varied lengths and sampling settings, submitted around it.
  BatchEngine eng(model, *env().tok, options(true));
  Collector c;
  std::mt19937 rng(3);
  for (int i = 0; i < 31; ++i) {
    std::string p = kTexts[i % 6];
    for (int r = 0; r < i % 4; ++r) p += " " + std::string(kTexts[(i + r) % 6]);
    eng.submit(make_request("o" + std::to_string(i), encode(p), 10 + static_cast<int>(rng() % 40), i % 3 ? 0.8f : 0.f, i), c.cb());
    if (i == 15) eng.submit(make_request("t", target, 40), c.cb());
  }
  c.wait(32);
  EXPECT_EQ(c.ids["t"], alone);
  EXPECT_EQ(c.reason["t"], "length");
  auto cs = eng.cache_stats();
  EXPECT_EQ(cs.pages_used, 0);
  EXPECT_EQ(cs.slots_used, 0);
  EXPECT_EQ(eng.stats().running, 0);
}

TEST(BatchEngine, AloneEqualsBatchedWith31Others) { expect_alone_equals_batched(*env().model); }

// The same with the CPU's copies of the MXFP4 routed experts (mxfp4_rowblocks.h; forced: the tests' exact tier would
// not make them), which every expert product then reads, one token or many.
TEST(BatchEngine, AloneEqualsBatchedWithExpertCopies) {
  if (!k3::cpu::mxfp4_rowblocks_cpu_ok()) GTEST_SKIP() << "this CPU lacks AVX2 + FMA";
  setenv("K3_CPU_MXFP4_ROWBLOCKS", "1", 1);
  auto model = k3::Model::load(k3test::source_path("models/k3-tiny"));
  model->add_decode_layouts();
  unsetenv("K3_CPU_MXFP4_ROWBLOCKS");
  ASSERT_NE(model->weights().layers.back().moe.experts.at(0).gate.tiled, nullptr);
  expect_alone_equals_batched(*model);
  // And the logits' bits: sequence A's decode steps alone and beside sequence B (their tokens share experts, so the
  // expert products run on two tokens at once).
  const int64_t V = model->config().vocab_size;
  auto a_alone = model->new_cache(), a_beside = model->new_cache(), b = model->new_cache();
  std::vector<float> alone_logits, pair_logits;
  for (int32_t t = 0; t < 12; ++t) {
    const int32_t ta = 100 + 37 * t, tb = 4000 - 53 * t;
    model->forward_batch({{std::span<const int32_t>(&ta, 1), a_alone.get()}}, alone_logits, {});
    model->forward_batch({{std::span<const int32_t>(&ta, 1), a_beside.get()}, {std::span<const int32_t>(&tb, 1), b.get()}},
                         pair_logits, {});
    ASSERT_EQ(alone_logits.size(), static_cast<size_t>(V));
    ASSERT_EQ(pair_logits.size(), static_cast<size_t>(2 * V));
    ASSERT_EQ(std::memcmp(alone_logits.data(), pair_logits.data(), static_cast<size_t>(V) * 4), 0) << "step " << t;
  }
}

TEST(BatchEngine, PrefixCachingOnAndOffGiveIdenticalOutputs) {
  // A randomized multi-turn workload: shared system prompts, branching conversations, prompts that
  // end mid-block. Each conversation's next prompt = previous prompt + previous output + new text.
  auto run = [](bool prefix, std::map<std::string, int64_t>* cached) {
    BatchEngine eng(*env().model, *env().tok, options(prefix));
    std::map<std::string, std::vector<int32_t>> out;
    std::mt19937 rng(11);
    std::vector<std::vector<int32_t>> convs;
    const auto sys = encode("You are a helpful assistant. Answer briefly.\n");
    for (int i = 0; i < 8; ++i) {
      auto p = sys;
      auto t = env().tok->encode(std::string(kTexts[i % 6]) + (i >= 6 ? " again" : ""));
      p.insert(p.end(), t.begin(), t.end());
      convs.push_back(p);
    }
    for (int turn = 0; turn < 3; ++turn) {
      Collector c;
      for (size_t i = 0; i < convs.size(); ++i)
        eng.submit(make_request("c" + std::to_string(i) + "t" + std::to_string(turn), convs[i], 8 + static_cast<int>(rng() % 12), 0.f), c.cb());
      c.wait(static_cast<int>(convs.size()));
      for (size_t i = 0; i < convs.size(); ++i) {
        const std::string id = "c" + std::to_string(i) + "t" + std::to_string(turn);
        out[id] = c.ids[id];
        if (cached) (*cached)[id] = c.cached[id];
        convs[i].insert(convs[i].end(), c.ids[id].begin(), c.ids[id].end());
        auto more = env().tok->encode(" and then" + std::string(i % 2 ? "?" : " more:"));
        convs[i].insert(convs[i].end(), more.begin(), more.begin() + static_cast<std::ptrdiff_t>(1 + rng() % more.size()));
      }
      // Branch: a copy of conversation 0 diverging here.
      auto branch = convs[0];
      branch.push_back(static_cast<int32_t>(100 + turn));
      convs.push_back(branch);
    }
    auto cs = eng.cache_stats();
    EXPECT_EQ(cs.pages_used, 0);
    EXPECT_EQ(cs.slots_used, 0);
    if (prefix) {
      EXPECT_GT(cs.prefix_hit_tokens, 0);
    }
    return out;
  };
  std::map<std::string, int64_t> cached;
  auto off = run(false, nullptr);
  auto on = run(true, &cached);
  ASSERT_EQ(off.size(), on.size());
  for (auto& [id, v] : off) EXPECT_EQ(on[id], v) << id;
  int64_t hits = 0;
  for (auto& [id, n] : cached) hits += n;
  EXPECT_GT(hits, 0);
}

// With fp8 latent rows and a bf16 KDA state (--kv-cache-dtype fp8 --mamba-ssm-cache-dtype bfloat16) the
// engine stays exact for that dtype: alone = batched with 15 others, prefix caching on = off (the bf16
// state is rounded after every token, so prompt chunking and checkpoint restarts change nothing).
TEST(BatchEngine, LowPrecisionCacheStaysExact) {
  static auto lowp = k3::Model::load(k3test::source_path("models/k3-tiny"), k3::CacheDType::FP8_E4M3, k3::CacheDType::BF16);
  const std::vector<int32_t> target = encode("It is a truth universally acknowledged, that a single man");
  auto run = [&](bool prefix, bool others) {
    BatchEngine eng(*lowp, *env().tok, options(prefix));
    Collector c;
    int n = 1;
    if (others)
      for (int i = 0; i < 15; ++i, ++n) {
        std::string p = kTexts[i % 6];
        for (int r = 0; r < i % 3; ++r) p += " " + std::string(kTexts[(i + r) % 6]);
        eng.submit(make_request("o" + std::to_string(i), encode(p), 6 + i, 0.f), c.cb());
      }
    eng.submit(make_request("t", target, 24), c.cb());
    // A second request sharing the target's prompt: a prefix hit when caching is on.
    auto longer = target;
    longer.push_back(42);
    eng.submit(make_request("u", longer, 12), c.cb());
    c.wait(n + 1);
    return std::pair{c.ids["t"], c.ids["u"]};
  };
  const auto alone = run(false, false);
  ASSERT_EQ(alone.first.size(), 24u);
  EXPECT_EQ(run(false, true), alone);
  EXPECT_EQ(run(true, true), alone);
  // The dtype matters (the test would pass trivially if the flags were ignored).
  BatchEngine eng32(*env().model, *env().tok, options(false));
  Collector c32;
  eng32.submit(make_request("t", target, 24), c32.cb());
  c32.wait(1);
  EXPECT_EQ(c32.ids["t"].size(), 24u);
  EXPECT_EQ(lowp->cache_spec().mla_dtype, k3::CacheDType::FP8_E4M3);
}

TEST(BatchEngine, PreemptionKeepsOutputsIdentical) {
  // A cache so small that 12 sequences of ~100 tokens cannot all run at once.
  auto run = [](int64_t budget) {
    BatchEngine eng(*env().model, *env().tok, options(false, budget, 12));
    Collector c;
    for (int i = 0; i < 12; ++i) eng.submit(make_request("p" + std::to_string(i), encode(kTexts[i % 6]), 80, 0.f), c.cb());
    c.wait(12);
    auto st = eng.stats();
    auto cs = eng.cache_stats();
    EXPECT_EQ(cs.pages_used, 0);
    EXPECT_EQ(cs.slots_used, 0);
    return std::make_pair(c.ids, st.preemptions);
  };
  auto big = run(256ll << 20);
  // 12 slots (~4 MB) plus ~40 pages: a few sequences' worth.
  k3::cache::CacheOptions probe;
  auto small = run(12 * 344064 + 40 * 18432 + 1000);
  EXPECT_GT(small.second, 0) << "the small cache should have forced preemption";
  EXPECT_EQ(big.first, small.first);
}

TEST(BatchEngine, RejectsWhatCanNeverFit) {
  BatchEngine eng(*env().model, *env().tok, options(true, 8ll << 20, 4));
  const int64_t max_len = eng.limits().max_model_len;
  std::vector<int32_t> huge(static_cast<size_t>(max_len + 5), 100);
  try {
    Collector c;
    eng.submit(make_request("h", huge, 4), c.cb());
    FAIL() << "expected an error";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(max_len)), std::string::npos) << e.what();
  }
  Collector c;
  EXPECT_THROW(eng.submit(make_request("v", {1, 99999}, 4), c.cb()), k3::Error);
  Request bad = make_request("b", {1, 2}, 4);
  bad.params.top_p = 2.f;
  EXPECT_THROW(eng.submit(bad, c.cb()), k3::Error);
}

TEST(BatchEngine, CancelFreesEverything) {
  BatchEngine eng(*env().model, *env().tok, options(true));
  Collector c;
  for (int i = 0; i < 8; ++i) eng.submit(make_request("x" + std::to_string(i), encode(kTexts[i % 6]), 2000), c.cb());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int i = 0; i < 8; ++i) eng.cancel("x" + std::to_string(i));
  c.wait(8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c.reason["x" + std::to_string(i)], "abort");
  auto cs = eng.cache_stats();
  EXPECT_EQ(cs.pages_used, 0);
  EXPECT_EQ(cs.slots_used, 0);
  EXPECT_EQ(eng.stats().running, 0);
  EXPECT_EQ(eng.stats().waiting, 0);
}

TEST(BatchEngine, SeededSamplingIsReproducible) {
  BatchEngine eng(*env().model, *env().tok, options(true));
  Collector c;
  eng.submit(make_request("a", encode(kTexts[0]), 30, 0.9f, 42), c.cb());
  eng.submit(make_request("b", encode(kTexts[0]), 30, 0.9f, 42), c.cb());
  eng.submit(make_request("c", encode(kTexts[0]), 30, 0.9f, 43), c.cb());
  c.wait(3);
  EXPECT_EQ(c.ids["a"], c.ids["b"]);
  EXPECT_NE(c.ids["a"], c.ids["c"]);
}

// Issue 11: max_model_len once defaulted to the whole cache (822,032 tokens for k3-tiny, trained for 4,096).
TEST(BatchEngine, MaxModelLenDefaultsToTheModelsLimit) {
  const int64_t model_max = env().model->config().max_position_embeddings;
  ASSERT_EQ(model_max, 4096);
  {
    BatchEngine eng(*env().model, *env().tok, options(true));  // the cache holds far more
    EXPECT_EQ(eng.limits().max_model_len, model_max);
    EXPECT_NE(eng.max_model_len_reason().find("max_position_embeddings"), std::string::npos);
  }
  {
    BatchEngine eng(*env().model, *env().tok, options(true, 8ll << 20, 4));  // the cache holds less
    const auto cs = eng.cache_stats();
    EXPECT_EQ(eng.limits().max_model_len, std::min(model_max, cs.pages_total * 16));
  }
  BatchEngineOptions o = options(true, 8ll << 20, 4);
  o.max_model_len = 1 << 30;  // more than the cache can hold for one sequence: refused, not silently lowered
  EXPECT_THROW(BatchEngine(*env().model, *env().tok, o), k3::Error);
  o.max_model_len = 8192;  // beyond the model's limit, within the cache's: allowed with a warning
  o.cache.budget_bytes = 256ll << 20;
  BatchEngine eng(*env().model, *env().tok, o);
  EXPECT_EQ(eng.limits().max_model_len, 8192);
  EXPECT_NE(eng.max_model_len_reason().find("WARNING"), std::string::npos);
}

// Issue 11 (prefix-cache side channel): requests with different cache_salt never share a prefix.
TEST(BatchEngine, CacheSaltIsolatesPrefixHits) {
  BatchEngine eng(*env().model, *env().tok, options(true));
  std::string text;
  for (int i = 0; i < 6; ++i) text += std::string(kTexts[i]) + " ";
  const std::vector<int32_t> prompt = encode(text);
  std::vector<int32_t> follow_up = prompt;  // a longer prompt starting with it: can hit its checkpoint
  follow_up.insert(follow_up.end(), prompt.begin() + 1, prompt.begin() + 9);
  Collector c;
  auto run = [&](const std::string& id, const std::string& salt) {
    Request r = make_request(id, id.back() == '1' ? prompt : follow_up, 2);
    r.cache_salt = salt;
    eng.submit(r, c.cb());
    c.wait(c.done + 1);
    return c.cached[id];
  };
  EXPECT_EQ(run("a1", "alice"), 0);
  EXPECT_EQ(run("b2", "bob"), 0);  // would hit alice's prompt-end checkpoint without the salt
  EXPECT_EQ(run("n2", ""), 0);
  EXPECT_GT(run("a2", "alice"), 0);
  EXPECT_EQ(c.ids["a2"], c.ids["b2"]);  // the salt changes what is shared, never the output
}

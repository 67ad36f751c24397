// Speculative decoding on the GPU (issue 17): the CUDA backend saves the KDA state (recurrent + conv tails)
// mid-step into the cache's snapshot slots (cuda_backend_kda.cpp, stage_kda_rounds), so the engine's
// rollback is exact there too.
//  - Snapshots: a 5-token verification step with snapshots after rows 1, 2, 3 against the states that
//    1-token decode steps from the same prefix leave, on all three tiny checkpoints (within the GEMM
//    rounding of a 1-row vs a 5-row projection); the final state too.
//  - Engine: greedy output with n-gram speculation on equals off, alone and batched with prefix-cache hits,
//    with both rollback methods; some drafts accepted and some rejected mid-block (else the test means
//    nothing).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "engine_test_request.h"
#include "k3/backend/cuda/cuda_model.h"
#include "k3/cache/hybrid_cache.h"
#include "k3/engine/batch_engine.h"
#include "k3/engine/speculative_config.h"
#include "k3/text/tokenizer.h"
#include "test_util.h"
#include "output_collector.h"

namespace {

using k3::engine::BatchEngine;
using k3::engine::BatchEngineOptions;
using k3::engine::Request;
using k3::engine::RequestOutput;
using k3::engine::SpeculativeConfig;

using k3cudatest::have_gpu;

std::vector<float> download(const void* p, size_t bytes) {
  std::vector<float> h(bytes / 4);
  if (cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) throw std::runtime_error("D2H");
  return h;
}

// Every KDA layer's state and conv tails of a view, downloaded.
std::vector<std::vector<float>> state_of(const k3::CacheSpec& spec, const k3::KdaStateView& v0,
                                         const std::function<k3::KdaStateView(int64_t)>& view) {
  (void)v0;
  std::vector<std::vector<float>> out;
  const size_t conv = static_cast<size_t>(spec.kda_conv_floats) * 4;
  for (int64_t l = 0; l < spec.kda_layers; ++l) {
    const k3::KdaStateView v = view(l);
    out.push_back(download(v.S, static_cast<size_t>(spec.kda_state_bytes())));
    for (const float* c : {v.conv_q, v.conv_k, v.conv_v}) out.push_back(download(c, conv));
  }
  return out;
}

class CudaSpeculative : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaSpeculative, SnapshotsEqualDecodeStepStates) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto m = k3::cuda::CudaModel::load(k3test::source_path(GetParam()));
  ASSERT_TRUE(m->supports_state_snapshots());
  const int64_t V = m->config().vocab_size;
  k3::cache::CacheOptions co;
  co.budget_bytes = 64ll << 20;
  co.max_num_seqs = 4;
  co.state_snapshots = 3;
  co.memory = m->cache_memory();
  k3::cache::HybridCache cache(m->cache_spec(), co);
  std::mt19937_64 rng(5);
  std::vector<int32_t> prefix(23), tail(5);
  for (auto& t : prefix) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
  for (auto& t : tail) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
  auto a = std::make_unique<k3::cache::PagedSequence>(cache), b = std::make_unique<k3::cache::PagedSequence>(cache);
  for (k3::cache::PagedSequence* s : {a.get(), b.get()}) {
    ASSERT_TRUE(cache.acquire_slot(*s));
    ASSERT_TRUE(cache.ensure_capacity(*s, 28));
  }
  std::vector<float> logits;
  m->forward(prefix, *a, logits);
  m->forward(prefix, *b, logits);
  // a: one verification step of 5 tokens, states saved after rows 1, 2, 3
  k3::BatchItem item{tail, a.get(), true};
  item.n_logit_rows = 5;
  item.snapshot_after = 1;
  item.n_snapshots = 3;
  std::vector<float> ver;
  m->forward_batch({item}, ver);
  const k3::CacheSpec& spec = m->cache_spec();
  // b: the same tokens one decode step at a time. The bound: a 5-row step's projections (the skinny
  // tensor-core kernel, x split into bf16 hi + lo) round differently from a 1-row step's (the fp32 GEMV),
  // ~1e-6 per projection, growing through the layers to ~5e-5 at tiny-k3's fifth; a snapshot of the wrong
  // row differs by a whole token's update (checked below to be > 1e-3).
  constexpr double kBound = 2e-4;
  std::vector<float> dec;
  std::vector<std::vector<std::vector<float>>> after;  // the states after 1, 2, 3 decode steps
  for (int j = 0; j < 5; ++j) {
    m->forward_batch({k3::BatchItem{std::span<const int32_t>(tail.data() + j, 1), b.get(), true}}, logits);
    dec.insert(dec.end(), logits.begin(), logits.end());
    if (j < 3) after.push_back(state_of(spec, {}, [&](int64_t l) { return b->kda_state(l); }));
  }
  for (int j = 0; j < 3; ++j) {
    const auto got = state_of(spec, {}, [&](int64_t l) { return a->kda_snapshot(l, j); });
    const auto& want = after[static_cast<size_t>(j)];
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_LT(k3cudatest::rel_err(got[i], want[i]), kBound) << GetParam() << " snapshot " << j << " part " << i;
    if (j < 2) {
      EXPECT_GT(k3cudatest::rel_err(got[0], after[static_cast<size_t>(j) + 1][0]), 1e-3) << "the test cannot tell rows apart";
    }
  }
  const auto fa = state_of(spec, {}, [&](int64_t l) { return a->kda_state(l); });
  const auto fb = state_of(spec, {}, [&](int64_t l) { return b->kda_state(l); });
  for (size_t i = 0; i < fa.size(); ++i) EXPECT_LT(k3cudatest::rel_err(fa[i], fb[i]), kBound) << "final state part " << i;
  ASSERT_EQ(ver.size(), dec.size());
  EXPECT_LT(k3cudatest::rel_err(ver, dec), 1e-4) << "verification logits vs decode steps";
}

INSTANTIATE_TEST_SUITE_P(Tiny, CudaSpeculative,
                         ::testing::Values("tests/data/tiny-k3", "tests/data/tiny-kimi-linear", "models/k3-tiny"),
                         [](const auto& info) {
                           std::string s = info.param.substr(info.param.rfind('/') + 1);
                           for (auto& ch : s) if (ch == '-') ch = '_';
                           return s;
                         });

using Collector = k3test::OutputCollector;

TEST(CudaSpeculativeEngine, GreedyEqualsNoSpeculation) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = k3test::source_path("models/k3-tiny");
  auto m = k3::cuda::CudaModel::load(dir);
  const auto tok = k3::text::Tokenizer::load(dir);
  auto encode = [&](const std::string& s) {
    std::vector<int32_t> v{static_cast<int32_t>(m->config().bos_token_id)};
    const auto t = tok.encode(s);
    v.insert(v.end(), t.begin(), t.end());
    return v;
  };
  const char* code =
      "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n\ndef ";
  const char* prose =
      "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a "
      "wife. It is a truth universally acknowledged, that";
  std::vector<Request> reqs{k3test::make_request("code", encode(code), 64), k3test::make_request("prose", encode(prose), 64),
                            k3test::make_request("code2", encode(std::string(code) + "div(a, b):\n"), 48)};
  auto run = [&](std::optional<SpeculativeConfig> spec, bool batched, k3::engine::EngineStats* stats) {
    BatchEngineOptions o;
    o.cache.budget_bytes = 256ll << 20;
    o.cache.prefix_caching = true;
    o.sched.max_num_seqs = 8;
    o.sched.max_num_batched_tokens = 256;
    o.speculative = spec;
    BatchEngine eng(*m, tok, o);
    Collector c;
    if (batched) {
      for (const Request& r : reqs) eng.submit(r, c.cb());
      c.wait(static_cast<int>(reqs.size()));
    } else {
      for (size_t i = 0; i < reqs.size(); ++i) {  // one after another: the later ones hit the prefix cache
        eng.submit(reqs[i], c.cb());
        c.wait(static_cast<int>(i + 1));
      }
    }
    eng.shutdown(true);
    if (stats) *stats = eng.stats();
    return c.ids;
  };
  for (const auto rb : {SpeculativeConfig::Rollback::Snapshots, SpeculativeConfig::Rollback::Replay})
    for (bool batched : {false, true}) {
      SpeculativeConfig sc;
      sc.method = "ngram";
      sc.num_speculative_tokens = 4;
      sc.prompt_lookup_min = 1;
      sc.prompt_lookup_max = 4;
      sc.rollback = rb;
      const auto off = run(std::nullopt, batched, nullptr);
      k3::engine::EngineStats st;
      const auto on = run(sc, batched, &st);
      for (const Request& r : reqs) {
        ASSERT_EQ(off.at(r.id).size(), static_cast<size_t>(r.params.max_tokens));
        EXPECT_EQ(on.at(r.id), off.at(r.id)) << r.id << (batched ? " batched" : " alone");
      }
      EXPECT_GT(st.spec_num_drafts, 0);
      EXPECT_GT(st.spec_num_accepted_tokens, 0);
      EXPECT_LT(st.spec_num_accepted_tokens, st.spec_num_draft_tokens) << "every draft accepted: no rollback ran";
      std::printf("[ spec ] cuda k3-tiny %s %s: %lld drafts, %lld of %lld draft tokens accepted\n",
                  rb == SpeculativeConfig::Rollback::Snapshots ? "snapshots" : "replay", batched ? "batched" : "alone",
                  static_cast<long long>(st.spec_num_drafts), static_cast<long long>(st.spec_num_accepted_tokens),
                  static_cast<long long>(st.spec_num_draft_tokens));
    }
}

}  // namespace
